"""``baton serve``, ``baton dev`` and ``baton demo``: the commands that run brokers."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from batonmq.broker.config import DEFAULT_PORT, READY_PREFIX, BrokerConfig, parse_address
from batonmq.cluster.errors import BatonError

__all__ = ["add_commands"]


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


def _dev(args: argparse.Namespace) -> int:
    from batonmq.broker.dev import run_dev

    host, port = parse_address(args.listen)
    return run_dev(args.nodes, args.data_dir, host, port, [])


def _demo(args: argparse.Namespace) -> int:
    from batonmq.broker.demo import run_demo

    return run_demo(args.data_dir, args.count, args.size)


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``serve``, ``dev`` and ``demo`` to the ``baton`` parser's subcommands."""
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

    dv = sub.add_parser("dev", help="run a local cluster on one shared file: log")
    dv.add_argument("--nodes", type=int, default=3)
    dv.add_argument("--data-dir", default="./baton-dev", help="one sub-dir per broker")
    dv.add_argument("--listen", default=f"127.0.0.1:{DEFAULT_PORT}",
                    help="HOST:PORT of the first broker; the others take the next ports")
    dv.set_defaults(func=_dev)

    d = sub.add_parser("demo", help="start a broker, round-trip messages, stop it")
    d.add_argument("--data-dir", default=None, help="default: a new temporary directory")
    d.add_argument("--count", type=int, default=20_000)
    d.add_argument("--size", type=int, default=1024, help="body bytes")
    d.set_defaults(func=_demo)
