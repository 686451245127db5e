"""``baton serve``, ``baton dev`` and ``baton demo``: the commands that run brokers."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from batonmq.broker import logs, settings
from batonmq.broker.memory import return_freed_memory
from batonmq.broker.config import (
    ADMIN_READY_PREFIX,
    AMQP_READY_PREFIX,
    DEFAULT_PORT,
    READY_PREFIX,
    BrokerConfig,
    parse_address,
)
from batonmq.cluster.errors import BatonError, InvalidArgument

__all__ = ["add_commands"]


def _serve(args: argparse.Namespace) -> int:
    env = os.environ
    try:
        flags = settings.flag_values(args)
        # The global --log-level / --log-format (before "serve") count as flags too.
        for name in ("log_level", "log_format"):
            if name not in flags and getattr(args, name, None) is not None:
                flags[name] = getattr(args, name)
        config, sources = settings.load(flags, env, settings.config_path(args, env))
    except InvalidArgument as exc:
        print(f"baton: {exc.message}", file=sys.stderr)
        return 2
    if args.print_config:
        sys.stdout.write(settings.to_toml(config, sources))
        return 0
    logs.setup(config.log_level, config.log_format)
    import uvloop

    return uvloop.run(_serve_async(config))


async def _serve_async(config: BrokerConfig) -> int:
    from batonmq.broker.server import Broker

    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # SIGHUP reads the log key file again (it is polled too: docs/log-sealing.md).
    loop.add_signal_handler(signal.SIGHUP, broker.reload_log_keys)
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
        if isinstance(exc, BatonError):
            msg = exc.message
        elif isinstance(exc, OSError):  # e.g. a data dir that cannot be made
            msg = f"{exc.filename or config.data_dir}: {exc.strerror or exc}"
        else:
            msg = repr(exc)
        print(f"baton: cannot start: {msg}", file=sys.stderr)
        await broker.stop()
        broker.remove_created_data_dir()
        return 2
    if broker.admin_address:  # before the ready line: whoever waits for that has both
        print(f"{ADMIN_READY_PREFIX}{broker.admin_address}", flush=True)
    if broker.amqp_address:
        print(f"{AMQP_READY_PREFIX}{broker.amqp_address}", flush=True)
    # One machine-readable line so scripts and tests know we are serving.
    print(f"{READY_PREFIX}{broker.address} node {broker.node.node_id}", flush=True)
    trimming = asyncio.create_task(return_freed_memory(), name="baton-malloc-trim")
    await stop.wait()
    trimming.cancel()
    print("baton: shutting down", flush=True)
    await broker.stop()
    return 0


def _dev(args: argparse.Namespace) -> int:
    from batonmq.broker.dev import run_dev

    listen = parse_address(args.listen)
    amqp = parse_address(args.amqp_listen) if args.amqp_listen else None
    admin = parse_address(args.admin_listen) if args.admin_listen else None
    if args.admin and admin is None:
        admin = (listen[0], 0)  # each broker's console on a free port
    return run_dev(
        args.nodes, args.data_dir, listen, list(getattr(args, "serve_args", [])),
        amqp=amqp, admin=admin, restart=args.restart,
    )


def _demo(args: argparse.Namespace) -> int:
    from batonmq.broker.demo import run_demo

    return run_demo(args.data_dir, args.count, args.size)


def _positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``serve``, ``dev`` and ``demo`` to the ``baton`` parser's subcommands."""
    s = sub.add_parser(
        "serve",
        help="run a broker",
        description="Run a broker. Every option can also be set by a BATON_* environment"
        " variable or a key of a TOML --config file; a flag wins over the environment,"
        " which wins over the file (docs/configuration.md).",
    )
    s.add_argument("--config", default=None, metavar="FILE.toml",
                   help=f"read options from this TOML file (env {settings.CONFIG_ENV})")
    s.add_argument("--print-config", action="store_true",
                   help="print the effective configuration as TOML and exit")
    s.add_argument("--listen", default=None, metavar="HOST:PORT",
                   help="--host and --port at once (default 127.0.0.1:%d)" % DEFAULT_PORT)
    settings.add_flags(s)
    s.set_defaults(func=_serve)

    dv = sub.add_parser(
        "dev", help="run a local cluster on one shared file: log",
        description="Run a local cluster on one shared file: log. Any other baton serve"
        " setting given (e.g. --heartbeat-ms 200) is passed to every broker. A broker that"
        " exits is reported and the others keep running; Enter (or --restart) restarts it.",
    )
    dv.add_argument("--nodes", type=int, default=3)
    dv.add_argument("--data-dir", default="./baton-dev", help="one sub-dir per broker")
    dv.add_argument("--listen", default=f"127.0.0.1:{DEFAULT_PORT}",
                    help="HOST:PORT of the first broker; the others take the next ports"
                         " (port 0: each a free one)")
    dv.add_argument("--amqp-listen", default=None, metavar="HOST:PORT",
                    help="AMQP 0-9-1 listeners too, from this port on")
    dv.add_argument("--admin-listen", default=None, metavar="HOST:PORT",
                    help="admin HTTP listeners (metrics, API, console) too, from this port on")
    dv.add_argument("--admin", action="store_true",
                    help="each broker serves its admin listener and console on a free port"
                         " (printed, with the login: guest / guest); --admin-listen sets the"
                         " ports")
    dv.add_argument("--restart", action="store_true",
                    help="restart a broker that exits, at once (default: on Enter)")
    dv.set_defaults(func=_dev)

    d = sub.add_parser("demo", help="start a broker, round-trip messages, stop it")
    d.add_argument("--data-dir", default=None, help="default: a new temporary directory")
    d.add_argument("--count", type=_positive, default=20_000)
    d.add_argument("--size", type=_positive, default=1024, help="body bytes")
    d.set_defaults(func=_demo)
