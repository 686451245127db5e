"""The ``baton`` command: global options, the subcommands (from ``cli_serve`` and
``cli_client``), and how an error ends the command."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from batonmq.broker import cli_client, cli_serve
from batonmq.cluster.errors import BatonError

__all__ = ["main"]


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
    cli_serve.add_commands(sub)
    cli_client.add_commands(sub)

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
