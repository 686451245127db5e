"""Where the ``baton`` client commands connect, and as whom: ``--broker``, ``BATON_BROKER``,
and named *contexts* kept in a file (``baton context add|use|list|show|remove``), as
``nats context`` keeps them (docs/admin.md, "Contexts").

A context names brokers, a user, a CA file, and where the password comes from: a file
(``--password-file``; its first line, read when used) or, only when asked for
(``--save-password``), the password itself in the contexts file, which is written
readable by its owner only. Precedence, for each of broker, user, CA and password: the
command line, then the environment (``BATON_BROKER``, ``BATON_USER``,
``BATON_PASSWORD``), then the context (``--context NAME``, ``BATON_CONTEXT`` or the one
in use), then the defaults (``127.0.0.1:5671``, guest).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path
from typing import Any

from batonmq.broker.config import DEFAULT_PORT
from batonmq.clients.addresses import parse_addresses
from batonmq.cluster.errors import InvalidArgument

__all__ = ["add_commands", "apply_context", "contexts_path", "DEFAULT_BROKER"]

DEFAULT_BROKER = f"127.0.0.1:{DEFAULT_PORT}"
_KEYS = ("broker", "user", "tls_ca", "password_file", "password")


def contexts_path() -> Path:
    """The contexts file: ``BATON_CONTEXTS`` if set, else
    ``$XDG_CONFIG_HOME/baton/contexts.json`` (``~/.config/baton/contexts.json``)."""
    given = os.environ.get("BATON_CONTEXTS")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "baton" / "contexts.json"


def _load() -> dict[str, Any]:
    path = contexts_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"current": None, "contexts": {}}
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("contexts"), dict):
            raise ValueError("no contexts table")
    except ValueError as exc:
        raise InvalidArgument(f"the contexts file {path} is damaged ({exc}): fix or remove it")
    return data


def _save(data: dict[str, Any]) -> None:
    path = contexts_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # Readable by its owner only: it may hold a password (--save-password).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def _named(data: dict[str, Any], name: str) -> dict[str, Any]:
    ctx = data["contexts"].get(name)
    if ctx is None:
        known = ", ".join(sorted(data["contexts"])) or "none yet: baton context add NAME ..."
        raise InvalidArgument(f"no context {name!r} (known: {known})")
    return dict(ctx)


def apply_context(args: argparse.Namespace) -> None:
    """Fill a client command's unset ``broker``, ``user`` and ``tls_ca`` from the
    environment and the context in use, and its ``context_password`` (the context's
    password, used when ``BATON_PASSWORD`` is not set, and only for the context's user).

    Raises:
        InvalidArgument: ``--context`` / ``BATON_CONTEXT`` names no context.
        InvalidArgument: the contexts file is damaged.
    """
    if not hasattr(args, "broker"):
        return  # not a client command (serve, dev, log ...)
    name = getattr(args, "context", None) or os.environ.get("BATON_CONTEXT") or None
    ctx: dict[str, Any] = {}
    if name is not None or contexts_path().exists():
        data = _load()
        name = name or data.get("current")
        if name:
            ctx = _named(data, name)
    if args.broker is None:
        args.broker = os.environ.get("BATON_BROKER") or ctx.get("broker") or DEFAULT_BROKER
    if args.user is None and not os.environ.get("BATON_USER"):
        args.user = ctx.get("user")
    if args.tls_ca is None:
        args.tls_ca = ctx.get("tls_ca")
    args.context_password = None
    if (args.user or os.environ.get("BATON_USER")) != ctx.get("user"):
        return  # another user than the context's: its password is not theirs
    if ctx.get("password_file"):
        try:
            with open(ctx["password_file"], encoding="utf-8") as f:
                args.context_password = f.readline().rstrip("\r\n")
        except OSError as exc:
            raise InvalidArgument(
                f"context {name!r}: cannot read its password file {ctx['password_file']}:"
                f" {exc.strerror or exc}"
            )
    elif ctx.get("password") is not None:
        args.context_password = ctx["password"]


def _add(args: argparse.Namespace) -> int:
    parse_addresses(args.context_broker)  # refuse a bad address now, not at first use
    if args.password_file and args.save_password:
        raise InvalidArgument("give --password-file or --save-password, not both")
    ctx: dict[str, Any] = {"broker": args.context_broker}
    if args.context_user:
        ctx["user"] = args.context_user
    if args.context_tls_ca:
        ctx["tls_ca"] = os.path.abspath(args.context_tls_ca)
    if args.password_file:
        ctx["password_file"] = os.path.abspath(args.password_file)
    if args.save_password:
        if not args.context_user:
            raise InvalidArgument("--save-password needs --user")
        password = os.environ.get("BATON_PASSWORD")
        if password is None:
            if not sys.stdin.isatty():
                raise InvalidArgument("set BATON_PASSWORD to save it (no terminal to ask on)")
            password = getpass.getpass(f"password of {args.context_user}: ")
        ctx["password"] = password
    data = _load()
    replaced = args.name in data["contexts"]
    data["contexts"][args.name] = ctx
    if args.use or data.get("current") is None:
        data["current"] = args.name
    _save(data)
    what = "replaced" if replaced else "added"
    using = " (in use)" if data["current"] == args.name else ""
    print(f"context {args.name} {what}{using}: {contexts_path()}", file=sys.stderr)
    return 0


def _use(args: argparse.Namespace) -> int:
    data = _load()
    _named(data, args.name)
    data["current"] = args.name
    _save(data)
    print(f"using context {args.name}", file=sys.stderr)
    return 0


def _shown(ctx: dict[str, Any]) -> dict[str, Any]:
    out = {k: ctx[k] for k in _KEYS if k in ctx and k != "password"}
    if "password" in ctx:
        out["password"] = "(saved)"
    return out


def _list(args: argparse.Namespace) -> int:
    data = _load()
    current = data.get("current")
    if args.json:
        print(json.dumps({
            "current": current,
            "contexts": {n: _shown(c) for n, c in sorted(data["contexts"].items())},
        }, indent=2))
        return 0
    if not data["contexts"]:
        print("no contexts (baton context add NAME --broker HOST:PORT ...)", file=sys.stderr)
        return 0
    for name, ctx in sorted(data["contexts"].items()):
        mark = "*" if name == current else " "
        user = ctx.get("user") or "guest"
        print(f"{mark} {name}\t{ctx.get('broker')}\t{user}")
    return 0


def _show(args: argparse.Namespace) -> int:
    data = _load()
    name = args.name or data.get("current")
    if not name:
        raise InvalidArgument("no context in use (baton context use NAME)")
    print(json.dumps({"name": name, **_shown(_named(data, name))}, indent=2))
    return 0


def _remove(args: argparse.Namespace) -> int:
    data = _load()
    _named(data, args.name)
    del data["contexts"][args.name]
    if data.get("current") == args.name:
        data["current"] = None
    _save(data)
    print(f"context {args.name} removed", file=sys.stderr)
    return 0


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``context`` to the ``baton`` parser's subcommands."""
    c = sub.add_parser("context", help="named brokers and logins, used by the client commands")
    cs = c.add_subparsers(dest="context_command", required=True)
    a = cs.add_parser("add", help="add (or replace) a context; the first one added is in use")
    a.add_argument("name")
    a.add_argument("--broker", dest="context_broker", required=True,
                   help="broker address(es), HOST:PORT[,HOST:PORT]")
    a.add_argument("--user", dest="context_user", default=None, help="log in as this user")
    a.add_argument("--tls-ca", dest="context_tls_ca", default=None, metavar="FILE",
                   help="connect by TLS, trusting the CAs in FILE")
    a.add_argument("--password-file", default=None, metavar="FILE",
                   help="the password is the first line of FILE (read when used)")
    a.add_argument("--save-password", action="store_true",
                   help="store the password (BATON_PASSWORD or asked) in the contexts file,"
                        " in clear, readable by you only")
    a.add_argument("--use", action="store_true", help="use it from now on")
    a.set_defaults(func=_add)
    u = cs.add_parser("use", help="use a context from now on")
    u.add_argument("name")
    u.set_defaults(func=_use)
    ls = cs.add_parser("list", help="list the contexts (* marks the one in use)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_list)
    sh = cs.add_parser("show", help="show a context (default: the one in use)")
    sh.add_argument("name", nargs="?")
    sh.set_defaults(func=_show)
    rm = cs.add_parser("remove", help="remove a context")
    rm.add_argument("name")
    rm.set_defaults(func=_remove)
