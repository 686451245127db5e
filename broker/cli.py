"""The ``baton`` command: serve a broker, and publish / consume / list queues by hand."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence

from batonmq.broker.config import DEFAULT_PORT, READY_PREFIX, BrokerConfig, parse_address
from batonmq.cluster.errors import BatonError

__all__ = ["main"]


def _properties(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"baton: --property needs KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _serve(args: argparse.Namespace) -> int:
    host, port = parse_address(args.listen)
    config = BrokerConfig(
        data_dir=args.data_dir,
        host=host,
        port=port,
        log_url=args.log,
        node_id=args.node_id,
        max_message=args.max_message,
        role=args.role,
        properties=_properties(args.property),
        heartbeat_ms=args.heartbeat_ms,
        suspect_beats=args.suspect_beats,
        time_slice_ms=args.time_slice_ms,
        checkpoint_ms=args.checkpoint_ms,
        join=args.join,
        update_max_rate=args.update_max_rate,
        services=list(args.service),
    )
    import uvloop

    return uvloop.run(_serve_async(config))


async def _serve_async(config: BrokerConfig) -> int:
    from batonmq.broker.server import Broker

    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Start-up (replaying the log) can take a while: a signal must still stop it.
    starting = asyncio.create_task(broker.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        print("baton: stopped during start-up", flush=True)
        await asyncio.gather(starting, return_exceptions=True)
        await broker.stop()
        return 0
    stopping.cancel()
    if starting.exception() is not None:
        exc = starting.exception()
        msg = exc.message if isinstance(exc, BatonError) else repr(exc)
        print(f"baton: cannot start: {msg}", file=sys.stderr)
        await broker.stop()
        return 2
    # One machine-readable line so scripts and tests know we are serving.
    print(f"{READY_PREFIX}{broker.address} node {broker.node.node_id}", flush=True)
    await stop.wait()
    print("baton: shutting down", flush=True)
    await broker.stop()
    return 0


def _publish(args: argparse.Namespace) -> int:
    from batonmq import clients

    bodies: list[bytes]
    if args.message:
        bodies = [m.encode() for m in args.message]
    else:
        bodies = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    headers = dict(h.split("=", 1) for h in args.header)
    with clients.sync.connect(args.broker) as conn:
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


def _consume(args: argparse.Namespace) -> int:
    from batonmq import clients
    from batonmq.cluster.errors import Timeout

    got = 0
    with clients.sync.connect(args.broker) as conn:
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
    print(f"consumed {got} message(s) from {args.queue}", file=sys.stderr)
    return 0


def _queues(args: argparse.Namespace) -> int:
    from batonmq import clients

    with clients.sync.connect(args.broker) as conn:
        rows = conn.list_queues()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'queue':30} {'ready':>10} {'acquired':>9} {'consumers':>9} {'enqueued':>10}")
    for r in rows:
        print(
            f"{r['queue']:30} {r['ready']:>10} {r['acquired']:>9} "
            f"{r.get('consumers', 0):>9} {r['enqueued']:>10}"
        )
    return 0


def _topology(args: argparse.Namespace) -> int:
    from batonmq import clients

    with clients.sync.connect(args.broker) as conn:
        topo = conn.topology()
    if args.json:
        print(json.dumps(topo, indent=2))
        return 0
    print(f"cluster {topo['cluster_id']}  view {topo['view']}"
          f"{'  (changing)' if topo['changing'] else ''}")
    for i in topo["instances"]:
        flags = ("leader " if i["leader"] else "") + ("(this broker)" if i["local"] else "")
        props = ",".join(f"{k}={v}" for k, v in sorted(i["properties"].items()))
        print(f"  {i['node_id']:16} {i['role']:8} {i['address']:22} {props:20} {flags}")
    print(f"this broker applied offset {topo['applied']}, digest {topo['digest'][:16]}")
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
        print("this broker is UNHEALTHY: it cannot read or write the log, or write its store"
              " (see its log)")
    if not topo.get("member", True):
        print("this broker is not a member of the established view (joining, or fenced)")
    return 0


def _services(args: argparse.Namespace) -> int:
    import dataclasses

    from batonmq import clients

    with clients.sync.connect(args.broker) as conn:
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
    from batonmq import clients

    with clients.sync.connect(args.broker) as conn:
        done = conn.handover(args.service, to=args.to, timeout=args.timeout)
    print(
        f"service {done.service}: {done.leader} leads now (token {done.token})"
        f"{f', after {done.previous}' if done.previous else ''}"
    )
    return 0


def _dev(args: argparse.Namespace) -> int:
    from batonmq.broker.dev import run_dev

    host, port = parse_address(args.listen)
    return run_dev(args.nodes, args.data_dir, host, port, [])


def _demo(args: argparse.Namespace) -> int:
    from batonmq.broker.demo import run_demo

    return run_demo(args.data_dir, args.count, args.size)


def _loadtest(args: argparse.Namespace) -> int:
    from batonmq.loadtest.__main__ import run_from_args

    return run_from_args(args)


def _import_entries(args: argparse.Namespace) -> int:
    from batonmq.clients.import_entries import run_from_args

    return run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="baton", description="Baton message broker")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run a broker")
    s.add_argument("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", help="HOST:PORT for clients")
    s.add_argument("--data-dir", required=True, help="the broker's own directory")
    s.add_argument("--log", default=None, help="log URL (default: file:<data-dir>/log)")
    s.add_argument("--node-id", default=None, help="persistent node id (default: generated)")
    s.add_argument("--max-message", type=int, default=8 * 1024 * 1024, help="bytes")
    s.add_argument("--role", choices=("voter", "observer"), default="voter",
                   help="observers replicate and serve clients, never vote or lead")
    s.add_argument("--property", action="append", default=[],
                   help="instance property KEY=VALUE for the topology, repeatable")
    s.add_argument("--heartbeat-ms", type=int, default=500)
    s.add_argument("--suspect-beats", type=int, default=6,
                   help="another member's beats without ours before we are suspected")
    s.add_argument("--time-slice-ms", type=int, default=200,
                   help="how long an owner keeps a queue other brokers want")
    s.add_argument("--checkpoint-ms", type=int, default=5000,
                   help="leader's checkpoint interval: digest check and log truncation (0: off)")
    s.add_argument("--join", choices=("auto", "update", "replay"), default="auto",
                   help="an empty data dir on a busy log: take the state from a live member"
                        " (auto/update) or replay the whole log (replay)")
    s.add_argument("--update-max-rate", type=int, default=0,
                   help="messages/s this broker streams to a joining broker at most (0: no cap)")
    s.add_argument("--service", action="append", default=[], metavar="NAME",
                   help="run this broker for leader of service NAME, repeatable")
    s.set_defaults(func=_serve)

    broker_help = "broker address(es), HOST:PORT[,HOST:PORT]"
    pub = sub.add_parser("publish", help="publish messages (arguments, or stdin lines)")
    pub.add_argument("queue")
    pub.add_argument("message", nargs="*")
    pub.add_argument("--broker", default=f"127.0.0.1:{DEFAULT_PORT}", help=broker_help)
    pub.add_argument("--header", action="append", default=[], help="KEY=VALUE, repeatable")
    pub.add_argument("--count", type=int, default=1, help="repeat a single message N times")
    pub.add_argument("--declare", action="store_true", help="declare the queue first")
    pub.add_argument(
        "--delay",
        type=float,
        default=0.0,
        help="seconds the queue holds the messages from consumers (delayed messages)",
    )
    pub.add_argument(
        "--priority", type=int, default=0, help="0..9, on a queue declared with max_priority"
    )
    pub.set_defaults(func=_publish)

    con = sub.add_parser("consume", help="print and ack messages")
    con.add_argument("queue")
    con.add_argument("--broker", default=f"127.0.0.1:{DEFAULT_PORT}", help=broker_help)
    con.add_argument("--count", type=int, default=0, help="stop after N (0: no limit)")
    con.add_argument("--timeout", type=float, default=5.0, help="stop after idle seconds (0: never)")
    con.add_argument("--prefetch", type=int, default=100)
    con.add_argument(
        "--no-ack", action="store_true", help='release ("not now": acquired count only) instead of ack'
    )
    con.add_argument(
        "--fail",
        action="store_true",
        help="release as a failed delivery (delivery count + 1, the delivery limit applies)",
    )
    con.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="position, delivery count, acquired count, headers too",
    )
    con.set_defaults(func=_consume)

    d = sub.add_parser("demo", help="start a broker, round-trip messages, stop it")
    d.add_argument("--data-dir", default=None, help="default: a new temporary directory")
    d.add_argument("--count", type=int, default=20_000)
    d.add_argument("--size", type=int, default=1024, help="body bytes")
    d.set_defaults(func=_demo)

    t = sub.add_parser("topology", help="show the cluster's view as a broker applied it")
    t.add_argument("--broker", default=f"127.0.0.1:{DEFAULT_PORT}", help=broker_help)
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=_topology)

    dv = sub.add_parser("dev", help="run a local cluster on one shared file: log")
    dv.add_argument("--nodes", type=int, default=3)
    dv.add_argument("--data-dir", default="./baton-dev", help="one sub-dir per broker")
    dv.add_argument("--listen", default=f"127.0.0.1:{DEFAULT_PORT}",
                    help="HOST:PORT of the first broker; the others take the next ports")
    dv.set_defaults(func=_dev)

    q = sub.add_parser("queues", help="list queues and their counters")
    q.add_argument("--broker", default=f"127.0.0.1:{DEFAULT_PORT}", help=broker_help)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_queues)

    sv = sub.add_parser("services", help="list services: leader, fencing token, candidates")
    sv.add_argument("--broker", default=f"127.0.0.1:{DEFAULT_PORT}", help=broker_help)
    sv.add_argument("--json", action="store_true")
    sv.add_argument("-v", "--verbose", action="store_true", help="list every candidate")
    sv.set_defaults(func=_services)

    ho = sub.add_parser("handover", help="ask a service's leader to hand over; wait for the next term")
    ho.add_argument("service")
    ho.add_argument("--to", default=None,
                    help="candidate key or node id to lead next (default: the next in line)")
    ho.add_argument("--broker", default=f"127.0.0.1:{DEFAULT_PORT}", help=broker_help)
    ho.add_argument("--timeout", type=float, default=30.0,
                    help="seconds to wait for the leader to finish its work")
    ho.set_defaults(func=_handover)

    from batonmq.loadtest.__main__ import add_arguments

    lt = sub.add_parser("loadtest", help="run a load test and check its history (docs/loadtest.md)")
    add_arguments(lt)
    lt.set_defaults(func=_loadtest)

    from batonmq.clients.import_entries import add_arguments as import_entries_arguments

    ie = sub.add_parser("import-entries", help="the Spark import-entries pipeline (docs/spark.md)")
    import_entries_arguments(ie)
    ie.set_defaults(func=_import_entries)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except BatonError as exc:
        print(f"baton: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
