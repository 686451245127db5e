"""The ``baton`` commands that are clients of a broker: publish, consume, queues,
topology, services, handover (each connects to the broker's client port)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from batonmq.broker.cli_exchanges import key_values
from batonmq.broker.cli_ops import BROKER_HELP, open_broker
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.features import ANNOUNCE

__all__ = ["add_commands"]


def _publish(args: argparse.Namespace) -> int:
    messages = list(args.message)
    if args.exchange is not None:
        # Through an exchange: every argument is a message (no queue is named).
        messages = ([args.queue] if args.queue is not None else []) + messages
        if args.declare:
            raise InvalidArgument("--declare declares a queue: not with --exchange")
    elif args.queue is None:
        raise InvalidArgument("name the queue to publish to (or give --exchange)")
    elif args.routing_key is not None:
        raise InvalidArgument("--routing-key goes with --exchange")
    bodies: list[bytes]
    if messages:
        bodies = [m.encode() for m in messages]
    else:
        bodies = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    headers = key_values(args.header, "--header")
    if args.exchange is not None:
        return _publish_to(args, bodies, headers)
    with open_broker(args) as conn:
        if args.declare:
            conn.declare_queue(args.queue)
        if args.count > 1 and len(bodies) == 1:
            bodies = bodies * args.count
        positions = conn.publish_batch(
            args.queue,
            [(b, headers) for b in bodies],
            delay=args.delay or None,
            priority=args.priority or None,
        )
    print(f"published {len(positions)} message(s) to {args.queue}", file=sys.stderr)
    return 0


def _publish_to(args: argparse.Namespace, bodies: list[bytes], headers: dict[str, str]) -> int:
    """``publish --exchange``: each message routed by the broker (docs/design.md §14)."""
    if args.count > 1 and len(bodies) == 1:
        bodies = bodies * args.count
    reached: dict[str, int] = {}
    unrouted = 0
    with open_broker(args) as conn:
        for body in bodies:
            routed = conn.publish_to(
                args.exchange, args.routing_key or "", body, headers,
                delay=args.delay or None, priority=args.priority or None,
            )
            if not routed.queues:
                unrouted += 1
            for q in routed.queues:
                reached[q] = reached.get(q, 0) + 1
            if routed.full:
                print(f"queue(s) full, message refused there: {', '.join(routed.full)}",
                      file=sys.stderr)
    where = ", ".join(f"{q} ({n})" for q, n in sorted(reached.items())) or "no queue"
    name = args.exchange or '""'  # the default exchange
    print(f"published {len(bodies)} message(s) through exchange {name}:"
          f" reached {where}" + (f"; {unrouted} reached no queue" if unrouted else ""),
          file=sys.stderr)
    return 0


def _consume(args: argparse.Namespace) -> int:
    from batonmq.cluster.errors import Timeout

    got = 0
    with open_broker(args) as conn:
        # Take no more than will be printed: the rest would only sit in a buffer.
        prefetch = min(args.prefetch, args.count) if args.count else args.prefetch
        with conn.consume(args.queue, prefetch=prefetch) as consumer:
            deadline = time.monotonic() + args.timeout if args.timeout else None
            while args.count == 0 or got < args.count:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                try:
                    msg = consumer.next(timeout=left)
                except Timeout:
                    break
                line = msg.body.decode(errors="replace")
                if args.verbose:
                    line = (
                        f"{msg.position}\t{msg.delivery_count}\t{msg.acquired_count}\t"
                        f"{json.dumps(msg.headers)}\t{line}"
                    )
                print(line, flush=True)
                if args.fail:
                    msg.release(failed=True)
                elif args.no_ack:
                    msg.release()
                else:
                    msg.ack()
                got += 1
    if args.fail:
        done = "released as failed"
    elif args.no_ack:
        done = "released"
    else:
        done = "consumed"
    print(f"{done} {got} message(s) from {args.queue}", file=sys.stderr)
    return 0


def _queues(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        rows = conn.list_queues()
        topo = conn.topology()
    note = _count_cluster_consumers(args, rows, topo)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'queue':30} {'ready':>10} {'acquired':>9} {'consumers':>9} {'enqueued':>10}  policy")
    for r in rows:
        consumers = r["consumers_cluster"]
        if consumers is None:
            consumers = r.get("consumers", 0)
        print(
            f"{r['queue']:30} {r['ready']:>10} {r['acquired']:>9} "
            f"{consumers:>9} {r['enqueued']:>10}  {r.get('policy') or ''}".rstrip()
        )
    if note:
        print(note, file=sys.stderr)
    return 0


def _count_cluster_consumers(
    args: argparse.Namespace, rows: list[dict[str, Any]], topo: dict[str, Any]
) -> str | None:
    """Set each row's ``consumers_cluster``: its consumers on every member of the view
    (a broker counts only its own), asked of each member in turn; None when that cannot
    be known: the members' addresses are shown to admins only, or a member did not
    answer. Returns a note saying why, then."""
    from batonmq import clients
    from batonmq.broker.cli_ops import login_of, tls_of
    from batonmq.cluster.errors import BatonError

    totals = {r["queue"]: r.get("consumers", 0) for r in rows}
    others = [i for i in topo.get("instances", []) if not i.get("local")]
    note = None
    if any(not i.get("address") for i in others):
        note = ("consumers: counted on the broker asked only (the other brokers' addresses"
                " are shown to admins)")
    else:
        user, password = login_of(args)
        missed = []
        for member in others:
            try:
                with clients.sync.connect(member["address"], ssl=tls_of(args), username=user,
                                          password=password, timeout=5.0) as conn:
                    for r in conn.list_queues():
                        if r["queue"] in totals:
                            totals[r["queue"]] += r.get("consumers", 0)
            except BatonError as exc:
                missed.append(f"{member['node_id']} ({exc.message})")
        if missed:
            note = f"consumers: counted on the broker asked only; no answer from {', '.join(missed)}"
    for r in rows:
        r["consumers_cluster"] = None if note else totals[r["queue"]]
    return note


def _topology(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        topo = conn.topology()
    # Exit 1 when the broker asked is not a member of the view or is unhealthy (the
    # report still shows what it knows; ``baton health`` asks for more).
    status = 0 if topo.get("member", False) and topo.get("healthy", False) else 1
    if args.json:
        print(json.dumps(topo, indent=2))
        return status
    print(f"cluster {topo['cluster_id']}  view {topo['view']}"
          f"{'  (changing)' if topo['changing'] else ''}")
    for i in topo["instances"]:
        flags = (
            _silence(i)
            + ("leader " if i["leader"] else "")
            + ("(this broker)" if i["local"] else "")
        )
        print(f"  {i['node_id']:16} {i['role']:8} {i['address']:22}"
              f" {_announced(i):9} {_properties(i['properties']):20} {flags}")
    print(f"this broker applied offset {topo['applied']}, digest {topo['digest'][:16]}")
    rows = topo.get("partitions")
    if rows is not None:  # a log of several partitions (docs/operations.md "Partitions")
        opened = ", ".join(str(r["partition"]) for r in rows)
        print(f"data partitions {topo.get('partition_count', len(rows))}, open here:"
              f" {opened or 'none'}")
        groups = {g["partition"]: g for g in topo.get("groups") or []}
        here = {r["partition"]: r for r in rows}
        for k in sorted({*here, *groups}):
            g = groups.get(k, {})
            who = (f", replicas {','.join(g['replicas'])} ({g.get('live_replicas')} live)"
                   if isinstance(g.get("replicas"), list) else "")
            r = here.get(k)
            if r is None:
                print(f"  partition {k}: not applied here{who}")
                continue
            lag = "unknown" if r.get("lag") is None else r["lag"]
            print(f"  partition {k}: applied {r['applied']}, lag {lag},"
                  f" {r['queues']} queues{'' if r['healthy'] else ', UNHEALTHY'}{who}")
    join = topo.get("join")
    if join and join.get("state") == "updating":
        print(f"this broker is joining: {join['progress']} (those queues wait here)")
    elif join:
        print(f"this broker joined by an update: {join['queues']} queues,"
              f" {join['messages']} messages in {join['seconds']}s")
    cp = topo.get("checkpoint")
    if cp:
        print(f"last checkpoint at offset {cp['offset']}"
              + (f", digest verified at {cp['verified']}" if "verified" in cp else ""))
    if topo.get("log_truncated_before"):
        print(f"as leader, this broker truncated the log: it starts at {topo['log_truncated_before']}")
    if topo.get("digest_mismatches"):
        print(f"REPLICA DIVERGED: {topo['digest_mismatches']} checkpoint digest(s) differ from"
              " the leader's: this replica's state is wrong (see its log)")
    if not topo.get("healthy", True):
        why = topo.get("status") or "it cannot read or write the log, or write its store"
        print(f"this broker is UNHEALTHY: {why} (see its log)")
    if not topo.get("member", True):
        print("this broker is not a member of the established view (joining, or fenced)")
    return status


def _silence(instance: dict[str, Any]) -> str:
    """``SUSPECTED`` for a member silent past its beats (the next view drops it), ``silent
    N beats`` for one that missed two or more (a member that beats misses none or one)."""
    if instance.get("suspected"):
        return "SUSPECTED "
    beats = instance.get("silent_beats", 0)
    return f"silent {beats} beats " if beats >= 2 else ""


def _announced(instance: dict[str, Any]) -> str:
    """How many feature flags a member's build announces (``baton feature list`` names
    them): "no flags" for a build from before feature flags. A broker of this version
    lists them apart from the properties; one of 0.1.0 shows them among the properties."""
    names = instance.get("features", instance["properties"].get(ANNOUNCE))
    if not isinstance(names, list):
        return "no flags"
    return f"{len(names)} flag" + ("" if len(names) == 1 else "s")


def _properties(properties: dict[str, Any]) -> str:
    """A member's own properties (``--property``), without the flags it announces."""
    return ",".join(f"{k}={v}" for k, v in sorted(properties.items()) if k != ANNOUNCE)


def _services(args: argparse.Namespace) -> int:
    import dataclasses


    with open_broker(args) as conn:
        rows = conn.services()
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return 0
    if not rows:
        print("no services (nobody runs for leader of any service)")
        return 0
    print(f"{'service':24} {'leader':36} {'token':>10} {'terms':>6}  candidates")
    for r in rows:
        note = "  (handover requested" + (f" to {r.handover_to})" if r.handover_to else ")")
        print(
            f"{r.service:24} {r.leader or '-':36} {'-' if r.token is None else r.token:>10}"
            f" {r.terms:>6}  {len(r.candidates)}{note if r.handover_requested else ''}"
        )
        if args.verbose:
            for c in r.candidates:
                print(f"    {c}{'  (leader)' if c == r.leader else ''}")
    return 0


def _handover(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        done = conn.handover(args.service, to=args.to, timeout=args.timeout)
    print(
        f"service {done.service}: {done.leader} leads now (token {done.token})"
        f"{f', after {done.previous}' if done.previous else ''}"
    )
    return 0


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add the client commands to the ``baton`` parser's subcommands."""
    pub = sub.add_parser(
        "publish", help="publish messages (arguments, or stdin lines)",
        usage="baton publish [options] QUEUE [MESSAGE ...]\n"
              "       baton publish --exchange X [--routing-key K] [options] [MESSAGE ...]",
    )
    pub.add_argument("queue", nargs="?", help="the queue (not with --exchange)")
    pub.add_argument("message", nargs="*")
    pub.add_argument("--exchange", default=None, metavar="X",
                     help='publish through this exchange ("" the default one), routed by'
                          " the broker")
    pub.add_argument("--routing-key", default=None, metavar="K",
                     help="the routing key, with --exchange")
    pub.add_argument("--broker", default=None, help=BROKER_HELP)
    pub.add_argument("--header", action="append", default=[], help="KEY=VALUE, repeatable")
    pub.add_argument("--count", type=int, default=1, help="repeat a single message N times")
    pub.add_argument("--declare", action="store_true", help="declare the queue first")
    pub.add_argument("--delay", type=float, default=0.0,
                     help="seconds the queue holds the messages from consumers (delayed messages)")
    pub.add_argument("--priority", type=int, default=0,
                     help="0..9, on a queue declared with max_priority")
    pub.set_defaults(func=_publish)

    con = sub.add_parser("consume", help="print and ack messages")
    con.add_argument("queue")
    con.add_argument("--broker", default=None, help=BROKER_HELP)
    con.add_argument("--count", type=int, default=0, help="stop after N (0: no limit)")
    con.add_argument("--timeout", type=float, default=5.0, help="stop after idle seconds (0: never)")
    con.add_argument("--prefetch", type=int, default=100)
    con.add_argument("--no-ack", action="store_true",
                     help='release ("not now": acquired count only) instead of ack')
    con.add_argument("--fail", action="store_true",
                     help="release as a failed delivery (delivery count + 1, the delivery limit"
                          " applies)")
    con.add_argument("-v", "--verbose", action="store_true",
                     help="position, delivery count, acquired count, headers too")
    con.set_defaults(func=_consume)

    t = sub.add_parser("topology", help="show the cluster's view as a broker applied it")
    t.add_argument("--broker", default=None, help=BROKER_HELP)
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=_topology)

    q = sub.add_parser("queues", help="list queues and their counters (--json: with their"
                                      " effective settings and the policy that gave them)")
    q.add_argument("--broker", default=None, help=BROKER_HELP)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_queues)

    sv = sub.add_parser("services", help="list services: leader, fencing token, candidates")
    sv.add_argument("--broker", default=None, help=BROKER_HELP)
    sv.add_argument("--json", action="store_true")
    sv.add_argument("-v", "--verbose", action="store_true", help="list every candidate")
    sv.set_defaults(func=_services)

    ho = sub.add_parser("handover", help="ask a service's leader to hand over; wait for the next term")
    ho.add_argument("service")
    ho.add_argument("--to", default=None,
                    help="candidate key or node id to lead next (default: the next in line)")
    ho.add_argument("--broker", default=None, help=BROKER_HELP)
    ho.add_argument("--timeout", type=float, default=30.0,
                    help="seconds to wait for the leader to finish its work")
    ho.set_defaults(func=_handover)
