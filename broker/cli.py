"""The ``baton`` command: global options, the subcommands (from ``cli_serve``,
``cli_client``, ``cli_ops``, ``cli_users``, ``cli_features``, ``cli_exchanges``,
``cli_policies`` and ``cli_partitions``), and how an error ends
the command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn, cast

from batonmq.broker import (
    cli_client,
    cli_context,
    cli_exchanges,
    cli_features,
    cli_ops,
    cli_partitions,
    cli_policies,
    cli_serve,
    cli_users,
    logs,
)
from batonmq.broker.config import LOG_FORMATS, LOG_LEVELS, package_version
from batonmq.cluster.errors import BatonError

__all__ = ["main"]


def _loadtest(args: argparse.Namespace) -> int:
    from batonmq.loadtest.__main__ import run_from_args

    return run_from_args(args)


def _import_entries(args: argparse.Namespace) -> int:
    from batonmq.clients.import_entries import run_from_args

    return run_from_args(args)


#: The optional dependencies a command may need, by top-level module: the extra that
#: installs each (pyproject.toml).
_EXTRAS = {
    "pyspark": "spark", "pyarrow": "spark", "pandas": "spark",
    "nats": "loadtest", "matplotlib": "loadtest", "aio_pika": "loadtest",
    "atheris": "fuzz",
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose mistakes end the command with one line on stderr
    (not the usage block): what is wrong, and where to look."""

    _intermixing = False

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        """A command's options and arguments may come in any order (``publish work
        --count 3 x``): a parser without subcommands of its own parses intermixed."""
        if self._subparsers is not None or self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls back in here
        try:
            return self.parse_known_intermixed_args(args, namespace)
        except TypeError:  # a parser argparse cannot intermix (a REMAINDER argument)
            return super().parse_known_args(args, namespace)
        finally:
            self._intermixing = False


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations at the top: "serve --log URL" must not look like an
    # ambiguous "--log-level" / "--log-format" to this parser.
    p = _Parser(prog="baton", description="Baton message broker", allow_abbrev=False)
    p.add_argument("--version", action="version", version=f"baton {package_version()}")
    p.add_argument("--log-level", default=None, type=str.upper, choices=LOG_LEVELS,
                   help="least level logged (default INFO)")
    p.add_argument("--log-format", default=None, choices=LOG_FORMATS,
                   help="text lines, or json: one object per line (default text)")
    p.add_argument("--tls-ca", default=None, metavar="FILE",
                   help="connect to the broker by TLS, trusting the CAs in FILE (PEM;"
                        " docs/security.md)")
    p.add_argument("--user", default=None, metavar="NAME",
                   help="log in to the broker as NAME (or BATON_USER; its password from"
                        " BATON_PASSWORD or the terminal; default guest: docs/security.md)")
    p.add_argument("--context", default=None, metavar="NAME",
                   help="the client commands use this context's brokers and login (or"
                        " BATON_CONTEXT; default: the one in use, see baton context)")
    # The subcommands' parsers are _Parsers too (add_subparsers uses the parent's class).
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        p.add_subparsers(dest="command", required=True),
    )
    cli_serve.add_commands(sub)
    cli_client.add_commands(sub)
    cli_ops.add_commands(sub)
    cli_users.add_commands(sub)
    cli_features.add_commands(sub)
    cli_context.add_commands(sub)
    cli_exchanges.add_commands(sub)
    cli_policies.add_commands(sub)
    cli_partitions.add_commands(sub)

    from batonmq.loadtest.__main__ import add_arguments

    lt = sub.add_parser("loadtest", help="run a load test and check its history (docs/loadtest.md)")
    add_arguments(lt)
    lt.set_defaults(func=_loadtest)

    from batonmq.clients.import_entries import add_arguments as import_entries_arguments

    ie = sub.add_parser("import-entries", help="the Spark import-entries pipeline (docs/spark.md)")
    import_entries_arguments(ie)
    ie.set_defaults(func=_import_entries)

    from batonmq.broker import logtool

    lg = sub.add_parser("log", help="verify or repair a file: log (docs/operations.md)")
    logtool.add_arguments(lg)
    lg.set_defaults(func=logtool.run_from_args)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``baton`` command.

    Returns:
        The exit code: 0, 1 when the command failed (one line on stderr says why),
        2 for a usage or configuration mistake, 130 when interrupted.
    """
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest:
        if getattr(args, "command", None) != "dev":
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        args.serve_args = rest  # baton dev passes serve's settings on to each broker
    logs.setup(args.log_level or "INFO", args.log_format or "text")
    try:
        cli_context.apply_context(args)
        return int(args.func(args))
    except BatonError as exc:
        print(f"baton: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:  # a missing or unreadable file named on the command line
        print(f"baton: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:
        module = (exc.name or "").partition(".")[0]
        extra = _EXTRAS.get(module)
        if extra is None:
            raise  # not an optional dependency: a broken install, shown as it is
        print(
            f"baton: this command needs {module}, which is not installed:"
            f" pip install 'batonmq[{extra}]'",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
