"""``baton user add|delete|list|passwd|limits|tags`` and ``baton permissions set``: the users of a
cluster and their rights, managed by an admin over a broker (docs/security.md)."""

from __future__ import annotations

import argparse
import getpass
import json
import sys

from batonmq.broker.cli_ops import BROKER_HELP, open_broker
from batonmq.cluster.errors import InvalidArgument

__all__ = ["add_commands", "read_new_password"]


def read_new_password(args: argparse.Namespace, name: str) -> str:
    """The new password of user ``name``: the first line of stdin with
    ``--password-stdin``, else asked twice on the terminal.

    Raises:
        InvalidArgument: empty, the two entries differ, or no terminal and no
            ``--password-stdin``.
    """
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        password = getpass.getpass(f"new password of {name}: ")
        if getpass.getpass("again: ") != password:
            raise InvalidArgument("the two passwords differ")
    else:
        raise InvalidArgument("give the password on stdin with --password-stdin (no terminal to ask on)")
    if not password:
        raise InvalidArgument("the password is empty")
    return password


def _user_add(args: argparse.Namespace) -> int:
    password = read_new_password(args, args.name)
    with open_broker(args) as conn:
        names = {u["name"] for u in conn.list_users()}
        if args.name in names:
            raise InvalidArgument(f"user {args.name!r} exists (baton user passwd changes its password)")
        conn.put_user(args.name, password, admin=args.admin)
    rights = "an admin" if args.admin else "no rights yet: baton permissions set"
    print(f"user {args.name} added ({rights})")
    return 0


def _user_passwd(args: argparse.Namespace) -> int:
    password = read_new_password(args, args.name)
    with open_broker(args) as conn:
        users = {u["name"]: u for u in conn.list_users()}
        if args.name not in users:
            raise InvalidArgument(f"no user {args.name!r} (baton user add creates one)")
        conn.put_user(args.name, password, admin=bool(users[args.name]["admin"]))
    print(f"password of {args.name} changed")
    return 0


def _user_delete(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        existed = conn.delete_user(args.name)
    if not existed:
        raise InvalidArgument(f"no user {args.name!r}")
    print(f"user {args.name} deleted")
    return 0


def _user_list(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        users = conn.list_users()
    if args.json:
        print(json.dumps(users, indent=2))
        return 0
    print(f"{'user':<20} {'admin':<6} {'configure':<16} {'write':<16} {'read':<16}"
          f" {'lead':<16} {'tags':<11} limits")
    for u in users:
        limits = u.get("limits") or {}
        shown = ", ".join(
            f"{k} {'none' if v == -1 else v}" for k, v in sorted(limits.items())
        ) or ("-" if u["admin"] else "default")
        print(f"{u['name']:<20} {'yes' if u['admin'] else 'no':<6} {u['configure'] or '-':<16}"
              f" {u['write'] or '-':<16} {u['read'] or '-':<16} {u['lead'] or '-':<16}"
              f" {','.join(u.get('tags') or []) or '-':<11} {shown}")
    return 0


def _limit_value(text: str) -> int | None:
    """A limit given on the command line: N, ``none`` (no limit: -1) or ``default``."""
    if text == "none":
        return -1
    if text == "default":
        return None
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"a limit is a number, none or default, not {text!r}") from None
    if value < 0:
        raise InvalidArgument(f"a limit is 0 or more (none: no limit), not {value}")
    return value


def _user_limits(args: argparse.Namespace) -> int:
    given = {k: getattr(args, k) for k in ("max_queues", "max_connections", "max_consumers")}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        raise InvalidArgument("give at least one of --max-queues, --max-connections, --max-consumers")
    if args.default == bool(args.name):
        raise InvalidArgument("name a user, or give --default (the default of non-admin users)")
    values = {k: _limit_value(v) for k, v in given.items()}
    name = "" if args.default else args.name
    with open_broker(args) as conn:
        conn.set_user_limits(
            name, **{k: v for k, v in values.items() if v is not None},
            reset=tuple(k for k, v in values.items() if v is None),
        )
    shown = ", ".join(f"{k} {v}" for k, v in given.items())
    print(f"limits of {'non-admin users (default)' if args.default else args.name}: {shown}")
    return 0


def _user_tags(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        conn.set_user_tags(args.name, args.tags)
    print(f"tags of {args.name}: {', '.join(args.tags) or 'none'}")
    return 0


def _permissions_set(args: argparse.Namespace) -> int:
    given = {"configure": args.configure, "write": args.write, "read": args.read,
             "lead": args.lead}
    if all(v is None for v in given.values()):
        raise InvalidArgument("give at least one of --configure, --write, --read, --lead")
    with open_broker(args) as conn:
        conn.set_permissions(args.user_name, **given)
    shown = ", ".join(f"{k} {v!r}" for k, v in given.items() if v is not None)
    print(f"rights of {args.user_name}: {shown}")
    return 0


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``user`` and ``permissions`` to the ``baton`` parser's subcommands."""
    u = sub.add_parser("user", help="add, delete, list users or change a password (admin)")
    us = u.add_subparsers(dest="user_command", required=True)
    for name, func, what in (
        ("add", _user_add, "add a user (its password from stdin or the terminal)"),
        ("passwd", _user_passwd, "change a user's password"),
    ):
        c = us.add_parser(name, help=what)
        c.add_argument("name")
        c.add_argument("--password-stdin", action="store_true",
                       help="read the new password from the first line of stdin")
        if name == "add":
            c.add_argument("--admin", action="store_true",
                           help="an admin: every right, and manages users")
        c.add_argument("--broker", default=None, help=BROKER_HELP)
        c.set_defaults(func=func)
    d = us.add_parser("delete", help="delete a user (not the last admin)")
    d.add_argument("name")
    d.add_argument("--broker", default=None, help=BROKER_HELP)
    d.set_defaults(func=_user_delete)
    ls = us.add_parser("list", help="list users and their rights")
    ls.add_argument("--broker", default=None, help=BROKER_HELP)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_user_list)

    lim = us.add_parser("limits", help="set a user's limits, or with --default those of every"
                                       " non-admin user without its own (flag user_limits)")
    lim.add_argument("name", nargs="?", default="")
    lim.add_argument("--default", action="store_true",
                     help="the cluster's default for non-admin users (1,000 queues unless set)")
    for flag, what in (("--max-queues", "queues the user declared, cluster-wide"),
                       ("--max-connections", "connections open on each broker"),
                       ("--max-consumers", "consumers on each broker")):
        lim.add_argument(flag, metavar="N", help=f"{what}: a number, none (no limit) or default")
    lim.add_argument("--broker", default=None, help=BROKER_HELP)
    lim.set_defaults(func=_user_limits)
    tg = us.add_parser("tags", help="set a user's tags, all of them (monitoring: the admin"
                                    " listener's /metrics and statistics; flag user_limits)")
    tg.add_argument("name")
    tg.add_argument("tags", nargs="*", help="monitoring, or none to clear them")
    tg.add_argument("--broker", default=None, help=BROKER_HELP)
    tg.set_defaults(func=_user_tags)

    p = sub.add_parser("permissions", help="set a user's rights (admin)")
    ps = p.add_subparsers(dest="permissions_command", required=True)
    s = ps.add_parser("set", help="regular expressions over whole queue (lead: service) names;"
                                  " '' grants nothing; rights not given stay")
    s.add_argument("user_name", metavar="USER")
    s.add_argument("--configure", metavar="RE", help="declare, delete, purge these queues")
    s.add_argument("--write", metavar="RE", help="publish to these queues")
    s.add_argument("--read", metavar="RE", help="consume, get, peek, range-read these queues")
    s.add_argument("--lead", metavar="RE", help="run for and hand over these services")
    s.add_argument("--broker", default=None, help=BROKER_HELP)
    s.set_defaults(func=_permissions_set)
