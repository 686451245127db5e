"""``baton policy set|list|clear``: the cluster's policies on the command line, as
``rabbitmqctl set_policy`` (docs/operations.md "Policies")."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from batonmq.broker.cli_ops import BROKER_HELP, open_broker
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.policies import APPLY_TO, check_definition, make_policy

__all__ = ["add_commands"]


def _definition(text: str) -> dict[str, Any]:
    """``--definition``'s JSON object, checked here so that a mistake costs no round trip.

    Raises:
        InvalidArgument: not JSON, not an object, or a bad key or value.
    """
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"--definition is not JSON: {exc}") from exc
    return dict(check_definition(raw))


def _policy_set(args: argparse.Namespace) -> int:
    definition = _definition(args.definition)
    make_policy(args.name, args.pattern, args.apply_to, definition, args.priority)
    with open_broker(args) as conn:
        done = conn.set_policy(args.name, args.pattern, definition, priority=args.priority,
                               apply_to=args.apply_to)
    print(f"policy {args.name} {'added' if done.changed else 'replaced'};"
          f" {done.queues} queue(s) have a policy now", file=sys.stderr)
    return 0


def _policy_clear(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        done = conn.clear_policy(args.name)
    print(f"policy {args.name} cleared; {done.queues} queue(s) have a policy now",
          file=sys.stderr)
    return 0


def _policy_list(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        rows = conn.list_policies()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'name':20} {'pattern':24} {'apply to':8} {'priority':>8}  definition")
    for r in rows:
        print(f"{r['name']:20} {r['pattern']:24} {r['apply_to']:8} {r['priority']:>8}"
              f"  {json.dumps(r['definition'], sort_keys=True)}")
    return 0


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``policy`` to the ``baton`` parser's subcommands."""
    p = sub.add_parser("policy", help="set, list, clear policies: settings for the queues"
                                      " whose names match a pattern (admin; flag policies)")
    ps = p.add_subparsers(dest="policy_command", required=True)
    s = ps.add_parser("set", help="add or replace a policy")
    s.add_argument("name")
    s.add_argument("--pattern", required=True,
                   help="a regular expression searched in queue names (e.g. '^jobs\\.')")
    s.add_argument("--definition", required=True, metavar="JSON",
                   help="a JSON object of max-length, overflow, message-ttl, delivery-limit,"
                        " dead-letter, dead-letter-exchange, dead-letter-routing-key, retry")
    s.add_argument("--apply-to", default="queues", choices=APPLY_TO)
    s.add_argument("--priority", type=int, default=0,
                   help="of the policies matching a queue, the highest applies (default 0)")
    s.add_argument("--broker", default=None, help=BROKER_HELP)
    s.set_defaults(func=_policy_set)
    ls = ps.add_parser("list", help="every policy")
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--broker", default=None, help=BROKER_HELP)
    ls.set_defaults(func=_policy_list)
    c = ps.add_parser("clear", help="remove a policy: its queues go back to their own settings")
    c.add_argument("name")
    c.add_argument("--broker", default=None, help=BROKER_HELP)
    c.set_defaults(func=_policy_clear)
