"""``baton exchange list|declare|delete`` and ``baton binding list|add|remove``: the
exchanges and bindings of docs/design.md §14 on the command line (``baton publish
--exchange`` publishes through one). ``baton binding add DESTINATION --from-exchange
SOURCE`` binds an exchange to an exchange (flag ``exchange_bindings``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from batonmq.broker.cli_ops import BROKER_HELP, open_broker
from batonmq.cluster.errors import InvalidArgument

__all__ = ["add_commands", "key_values"]

_TYPES = ("direct", "fanout", "topic", "headers")


def key_values(items: list[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` strings as a dict.

    Raises:
        InvalidArgument: an item without ``=`` or with an empty key.
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"{flag} needs KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _name(exchange: str) -> str:
    return exchange or '""'  # the default exchange


def _exchange_list(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        rows = conn.list_exchanges()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'exchange':30} {'type':8} {'durable':>7} {'bindings':>8}  flags")
    for r in rows:
        flags = ",".join(f for f in ("auto_delete", "internal") if r.get(f))
        n = len(r["bindings"]) + len(r.get("exchange_bindings", ()))
        print(f"{_name(r['exchange']):30} {r['type']:8} {str(r['durable']).lower():>7}"
              f" {n:>8}  {flags}")
    return 0


def _exchange_declare(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        created = conn.declare_exchange(
            args.name, args.type, durable=not args.transient, auto_delete=args.auto_delete,
            internal=args.internal, arguments=key_values(args.arg, "--arg"),
        )
    print(f"exchange {args.name} {'declared' if created else 'exists'}", file=sys.stderr)
    return 0


def _exchange_delete(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        gone = conn.delete_exchange(args.name, if_unused=args.if_unused)
    print(f"exchange {args.name} deleted with {gone} binding(s)", file=sys.stderr)
    return 0


def _binding_list(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        rows = conn.list_exchanges()
    out: list[dict[str, Any]] = []
    for r in rows:
        if args.exchange is not None and r["exchange"] != args.exchange:
            continue
        out += [{"exchange": r["exchange"], **b} for b in r["bindings"]
                if args.queue is None or b["queue"] == args.queue]
        if args.queue is None:  # (an exchange binding's destination is an exchange)
            out += [{"exchange": r["exchange"], **b} for b in r.get("exchange_bindings", ())]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{'exchange':24} {'queue (or -> exchange)':24} {'routing key':24} arguments")
    for b in out:
        arguments = json.dumps(b["arguments"]) if b["arguments"] else ""
        to = b["queue"] if "queue" in b else f"-> {b['destination']}"
        print(f"{_name(b['exchange']):24} {to:24} {b['routing_key']:24} {arguments}")
    return 0


def _binding_change(args: argparse.Namespace) -> int:
    unbind = args.binding_command == "remove"
    source = args.from_exchange
    if (source is None) == (args.exchange is None):
        raise InvalidArgument(
            "name the exchange to bind to: QUEUE EXCHANGE, or DESTINATION --from-exchange"
            " SOURCE (an exchange to an exchange), not both"
        )
    arguments = key_values(args.arg, "--arg")
    with open_broker(args) as conn:
        if source is not None:
            changed = conn.bind_exchange(args.queue, source, args.routing_key, arguments,
                                         unbind=unbind)
        else:
            changed = conn.bind_queue(args.queue, args.exchange, args.routing_key, arguments,
                                      unbind=unbind)
    what = ("removed" if changed else "was not there") if unbind else (
        "added" if changed else "exists")
    frm = source if source is not None else args.exchange
    to = f"exchange {args.queue}" if source is not None else args.queue
    print(f"binding {frm} -> {to} ({args.routing_key!r}) {what}", file=sys.stderr)
    return 0


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``exchange`` and ``binding`` to the ``baton`` parser's subcommands."""
    e = sub.add_parser("exchange", help="list, declare, delete exchanges")
    es = e.add_subparsers(dest="exchange_command", required=True)
    ls = es.add_parser("list", help="the exchanges you have a right on (built-ins too)")
    ls.add_argument("--json", action="store_true", help="with settings and bindings")
    ls.add_argument("--broker", default=None, help=BROKER_HELP)
    ls.set_defaults(func=_exchange_list)
    d = es.add_parser("declare", help="create an exchange, or check it exists with these settings")
    d.add_argument("name")
    d.add_argument("--type", required=True, choices=_TYPES)
    d.add_argument("--transient", action="store_true", help="not durable")
    d.add_argument("--auto-delete", action="store_true",
                   help="deleted when its last binding goes")
    d.add_argument("--internal", action="store_true",
                   help="no direct publishes (only dead letters routed through it)")
    d.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                   help="an exchange argument, repeatable")
    d.add_argument("--broker", default=None, help=BROKER_HELP)
    d.set_defaults(func=_exchange_declare)
    dl = es.add_parser("delete", help="delete an exchange and its bindings")
    dl.add_argument("name")
    dl.add_argument("--if-unused", action="store_true", help="only if it has no bindings")
    dl.add_argument("--broker", default=None, help=BROKER_HELP)
    dl.set_defaults(func=_exchange_delete)

    b = sub.add_parser("binding", help="list, add, remove bindings (to queues, or exchanges)")
    bs = b.add_subparsers(dest="binding_command", required=True)
    bl = bs.add_parser("list", help="bindings, of one exchange or queue if given")
    bl.add_argument("--exchange", default=None)
    bl.add_argument("--queue", default=None)
    bl.add_argument("--json", action="store_true")
    bl.add_argument("--broker", default=None, help=BROKER_HELP)
    bl.set_defaults(func=_binding_list)
    for name, what in (("add", "bind a queue (or, --from-exchange, an exchange) to an exchange"),
                       ("remove", "remove a queue's (or an exchange's) binding")):
        c = bs.add_parser(name, help=what)
        c.add_argument("queue", metavar="QUEUE",
                       help="the queue bound; with --from-exchange the destination exchange")
        c.add_argument("exchange", nargs="?", default=None, metavar="EXCHANGE",
                       help="the exchange it is bound to")
        c.add_argument("--from-exchange", default=None, metavar="SOURCE",
                       help="bind exchange QUEUE to exchange SOURCE instead: what SOURCE routes"
                            " by the binding goes on to it (flag exchange_bindings)")
        c.add_argument("--routing-key", default="", metavar="KEY",
                       help="the binding key (a topic pattern for a topic exchange)")
        c.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                       help="a headers exchange's match argument (x-match=all|any ...), repeatable")
        c.add_argument("--broker", default=None, help=BROKER_HELP)
        c.set_defaults(func=_binding_change)
