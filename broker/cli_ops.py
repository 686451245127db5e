"""The operator's ``baton`` commands on a running broker: ``baton health`` (is this broker
ready?), ``baton queue declare|delete|purge|peek``, and looking inside it without
touching anything: ``baton connections`` and ``baton message history`` (docs/admin.md)."""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import os
import ssl
import sys
import time
from typing import TYPE_CHECKING, Any

from batonmq.cluster.errors import InvalidArgument

if TYPE_CHECKING:
    from batonmq.clients.sync import SyncConnection

__all__ = ["BROKER_HELP", "add_commands", "login_of", "not_ready", "open_broker", "tls_of"]

BROKER_HELP = (
    "broker address(es), HOST:PORT[,HOST:PORT] or a bare PORT on this host; tried in turn"
    " (default: BATON_BROKER, the context in use, or 127.0.0.1:5671)"
)


def tls_of(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context of the global ``--tls-ca FILE`` (None: plaintext).

    Raises:
        InvalidArgument: the file cannot be read or holds no certificate.
    """
    ca = getattr(args, "tls_ca", None)
    if ca is None:
        return None
    from batonmq.clients.tls import client_context

    return client_context(ca)


def login_of(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The user and password a command logs in with: the global ``--user`` (or
    ``BATON_USER``, or the context's user), its password from ``BATON_PASSWORD``, the
    context's password, or asked on the terminal.
    No user named: (None, None), the client's default: guest/guest (docs/security.md).

    Raises:
        InvalidArgument: a user without a password, and no terminal to ask on.
    """
    user = getattr(args, "user", None) or os.environ.get("BATON_USER") or None
    password = os.environ.get("BATON_PASSWORD")
    if password is None:
        password = getattr(args, "context_password", None)  # the context's (cli_context)
    if user is None:
        return (None, None) if password is None else ("guest", password)
    if password is None:
        if not sys.stdin.isatty():
            raise InvalidArgument(
                f"user {user!r} needs a password: set BATON_PASSWORD (no terminal to ask on)"
            )
        password = getpass.getpass(f"password of {user}: ")
    return user, password


def open_broker(args: argparse.Namespace) -> SyncConnection:
    """A blocking connection to ``args.broker`` with the command's TLS and login."""
    from batonmq import clients

    user, password = login_of(args)
    return clients.sync.connect(args.broker, ssl=tls_of(args), username=user, password=password)


def group_warnings(topo: dict[str, Any]) -> list[str]:
    """The replica groups (``topo``'s ``groups``) with fewer than a majority of their
    replicas live: the cluster's problem, not the answering broker's (it stays ready)."""
    out = []
    for g in topo.get("groups") or []:
        replicas, live = g.get("replicas"), g.get("live_replicas")
        if isinstance(replicas, list) and replicas and isinstance(live, int) \
                and live < len(replicas) // 2 + 1:
            out.append(f"data partition {g.get('partition')} has {live} of {len(replicas)}"
                       f" replicas live ({','.join(map(str, replicas))}), fewer than a"
                       " majority: its queues wait until enough are back")
    return out


def not_ready(topo: dict[str, Any]) -> str | None:
    """Why the broker that answered ``topo`` (its Topology answer) is not ready, or None.

    Ready means: a member of the established view, healthy (it reads and applies the
    log and writes its store), not taking in a join update, and caught up: its applied
    log is within the suspicion time of the wall clock (every member heartbeats, so a
    replica that keeps up is about one beat behind).
    """
    if not topo.get("member", False):
        return "not a member of the established view (joining, or dropped from it)"
    if not topo.get("healthy", False):
        why = topo.get("status") or "it cannot read or apply the log, or write its store"
        return f"unhealthy: {why} (see its log)"
    join = topo.get("join")
    if join and join.get("state") == "updating":
        return f"joining: still taking in the cluster's state ({join.get('progress', '')})"
    behind, limit = topo.get("behind_ms"), topo.get("suspect_ms")
    if isinstance(behind, int) and isinstance(limit, int) and behind > limit:
        return f"not caught up: its applied log is {behind} ms behind (more than {limit} ms)"
    return None


def _health(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        topo = conn.topology()
    why = not_ready(topo)
    who = f"broker {topo.get('node_id')} at {args.broker}"
    if why is None:
        print(f"{who} is ready: member of view {topo['view']}, applied offset {topo['applied']}")
        for line in group_warnings(topo):
            print(f"warning: {line}")
        return 0
    print(f"{who} is not ready: {why}")
    return 1


def _queue_declare(args: argparse.Namespace) -> int:
    from batonmq import clients
    from batonmq.cluster.errors import QueueNotFound

    with open_broker(args) as conn:
        made_dlq = False
        if args.dead_letter and args.dead_letter != args.queue:
            # A dead-letter queue that does not exist is declared first (default settings,
            # the queue's durability): dead letters to a missing queue would be dropped.
            try:
                conn.queue_stats(args.dead_letter)
            except QueueNotFound:
                made_dlq = bool(
                    conn.declare_queue(
                        args.dead_letter, durable=not args.transient, partition=args.partition
                    ).get("created")
                )
        result = conn.declare_queue(
            args.queue,
            durable=not args.transient,
            max_length=args.max_length,
            overflow=args.overflow,
            delivery_limit=args.delivery_limit,
            dead_letter=args.dead_letter,
            message_ttl=args.message_ttl,
            retry=(
                None if args.retry is None
                else clients.Retry(args.retry, args.retry_delay, args.retry_max)
            ),
            ack_timeout=args.ack_timeout,
            max_priority=args.max_priority,
            single_active_consumer=args.single_active_consumer,
            partition=args.partition,
            dedupe_window=args.dedupe_window,
            expires=args.expires,
        )
    if args.json:
        print(json.dumps(result))
    else:
        if made_dlq:
            print(f"queue {args.dead_letter} declared (its dead-letter queue)")
        print(f"queue {args.queue} {'declared' if result.get('created') else 'exists'}")
    return 0


def _queue_delete(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        dropped = conn.delete_queue(args.queue)
    print(f"queue {args.queue} deleted with {dropped} message(s)")
    return 0


def _queue_purge(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        dropped = conn.purge_queue(args.queue)
    print(f"queue {args.queue} purged: {dropped} ready message(s) dropped")
    return 0


def _queue_peek(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        peeked = conn.peek(args.queue, args.count)
    if args.json:
        rows = [
            {"position": p, "delivery_count": n, "body": body.decode(errors="replace"),
             "headers": headers, "publish_time_ms": t}
            for p, n, body, headers, t in peeked.messages
        ]
        print(json.dumps(rows, indent=2, default=repr))
        return 0
    for p, n, body, headers, _ in peeked.messages:
        print(f"{p}\t{n}\t{json.dumps(headers, default=repr)}\t{body.decode(errors='replace')}")
    print(f"{len(peeked.messages)} ready message(s) of {args.queue} (not acquired)",
          file=sys.stderr)
    return 0


def _connections(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        rows = conn.connections()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    # The asking connection is listed too: it is one of the broker's clients.
    print(f"{'connection':22} {'client':24} {'user':16} {'in flight':>9}  consumers")
    for r in rows:
        print(f"{r['id']:22} {r['client_name'][:24]:24} {r.get('user', '')[:16]:16}"
              f" {r['in_flight']:>9}  {len(r['consumers'])}")
        for c in r["consumers"]:
            print(f"    {c['consumer_id']}  queue {c['queue']}  prefetch {c['prefetch']}"
                  f"  held {c['held']}")
    return 0


def _message_history(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        conn.timeout = max(conn.timeout or 0, args.timeout)
        h = conn.message_history(args.queue, args.position, args.max_records)
    if args.json:
        print(json.dumps(dataclasses.asdict(h), indent=2))
        return 0
    print(f"message {h.queue}/{h.position}: {h.state} (log offsets {h.log_start}..{h.log_end - 1},"
          f" {h.scanned} read)")
    for step in h.steps:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(step["time_ms"] / 1000))
        extra = "  ".join(
            f"{k}={v}" for k, v in step.items()
            if k not in ("offset", "time_ms", "node", "runtime", "event", "what")
        )
        print(f"  @{step['offset']:<10} {when}.{step['time_ms'] % 1000:03d}Z  {step['node']:16}"
              f" {step['what']:14} {extra}")
    if not h.steps:
        print("  (the log read says nothing of it)")
    if h.note:
        print(f"note: {h.note}")
    return 0 if h.complete else 3


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``health``, ``queue``, ``connections`` and ``message`` to the ``baton``
    parser's subcommands."""
    h = sub.add_parser(
        "health",
        help="exit 0 if a broker is ready (member, healthy, caught up), 1 and why if not",
    )
    h.add_argument("--broker", default=None, help=BROKER_HELP)
    h.set_defaults(func=_health)

    q = sub.add_parser("queue", help="declare, delete, purge or peek at a queue")
    qs = q.add_subparsers(dest="queue_command", required=True)
    d = qs.add_parser("declare", help="create a queue, or check it exists with these settings")
    d.add_argument("queue")
    d.add_argument("--transient", action="store_true",
                   help="not durable: deleted when the broker that declared it leaves the view")
    d.add_argument("--max-length", type=int, default=None, help="cap on ready messages")
    d.add_argument("--overflow", choices=("reject-publish", "drop-head"), default="reject-publish",
                   help="at --max-length: refuse publishes, or drop the oldest ready message")
    d.add_argument("--delivery-limit", type=int, default=20,
                   help="deliveries before a released message is dead-lettered or dropped")
    d.add_argument("--dead-letter", default=None, metavar="QUEUE",
                   help="queue for rejected and over-limit messages")
    d.add_argument("--message-ttl", type=float, default=None, metavar="SECONDS",
                   help="how long a message may wait before it expires")
    d.add_argument("--retry", choices=("fixed", "linear", "exponential"), default=None,
                   help="retry policy of failed deliveries: the wait grows so with the"
                        " delivery count (default: ready again at once)")
    d.add_argument("--retry-delay", type=float, default=1.0, metavar="SECONDS",
                   help="the retry policy's delay (default 1)")
    d.add_argument("--retry-max", type=float, default=None, metavar="SECONDS",
                   help="the retry policy's longest wait (default: no cap)")
    d.add_argument("--ack-timeout", type=float, default=None, metavar="SECONDS",
                   help="a held message unsettled this long goes back as a failed delivery")
    d.add_argument("--max-priority", type=int, default=None, metavar="N",
                   help="1..9: a priority queue (publish --priority)")
    d.add_argument("--single-active-consumer", action="store_true",
                   help="one consumer at a time gets every message; the next takes over")
    d.add_argument("--dedupe-window", type=float, default=None, metavar="SECONDS",
                   help="how long a publish key is remembered (default 120; 0: never)")
    d.add_argument("--partition", type=int, default=None, metavar="K",
                   help="the data partition a new queue goes on, on a cluster of several"
                        " (default: the one with the fewest queues)")
    d.add_argument("--expires", type=float, default=None, metavar="SECONDS",
                   help="delete the queue once unused this long: no consumers, no get, not"
                        " declared again (AMQP x-expires; needs the flag queue_expiry)")
    d.add_argument("--json", action="store_true", help="print the broker's answer as JSON")
    d.set_defaults(func=_queue_declare)
    for name, func, what in (
        ("delete", _queue_delete, "delete a queue and its messages"),
        ("purge", _queue_purge, "drop a queue's ready messages"),
    ):
        c = qs.add_parser(name, help=what)
        c.add_argument("queue")
        c.add_argument("--broker", default=None, help=BROKER_HELP)
        c.set_defaults(func=func)
    d.add_argument("--broker", default=None, help=BROKER_HELP)
    pk = qs.add_parser("peek", help="show ready messages without acquiring them")
    pk.add_argument("queue")
    pk.add_argument("--count", type=int, default=10, help="how many (1..1000)")
    pk.add_argument("--broker", default=None, help=BROKER_HELP)
    pk.add_argument("--json", action="store_true")
    pk.set_defaults(func=_queue_peek)

    cn = sub.add_parser("connections", help="list a broker's client connections and consumers")
    cn.add_argument("--broker", default=None, help=BROKER_HELP)
    cn.add_argument("--json", action="store_true")
    cn.set_defaults(func=_connections)

    mp = sub.add_parser("message", help="one message: its history from the log")
    msub = mp.add_subparsers(dest="message_command", required=True)
    mh = msub.add_parser("history", help="when and where a message was enqueued, acquired,"
                                         " released, accepted or dead-lettered")
    mh.add_argument("queue")
    mh.add_argument("position", type=int)
    mh.add_argument("--broker", default=None, help=BROKER_HELP)
    mh.add_argument("--max-records", type=int, default=0,
                    help="read at most this many log records (0: the broker's bound)")
    mh.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for it")
    mh.add_argument("--json", action="store_true")
    mh.set_defaults(func=_message_history)
