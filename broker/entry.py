"""The ``baton`` command's entry point: loads the command line, which loads much of
Baton, inside the handler of Ctrl-C, so that an interrupt at any moment ends the command
with exit code 130 and no traceback."""

from __future__ import annotations

__all__ = ["main"]


def main() -> int:
    """Run ``baton`` (:func:`batonmq.broker.cli.main`); 130 when interrupted."""
    try:
        from batonmq.broker.cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:
        return 130
