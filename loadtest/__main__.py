"""``python -m loadtest`` (also ``baton loadtest``): run a preset, check it, report it.

    python -m loadtest --preset throughput --duration 15 --brokers 3
    python -m loadtest --check RUN_DIR     # re-check a kept run directory (--report)

Exit status: 0 if the checker found no violation, 1 if it did, 2 on a usage or start-up
error. See docs/loadtest.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main", "add_arguments", "run_from_args"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the load-test options to a parser (shared with ``baton loadtest``)."""
    from loadtest.workloads import PRESETS

    p.add_argument("--preset", choices=sorted(PRESETS), default="throughput")
    p.add_argument("--duration", type=float, default=15.0, help="seconds of publishing")
    p.add_argument("--brokers", type=int, default=3, help="brokers to start (default 3)")
    p.add_argument("--brokers-at", default=None,
                   help="HOST:PORT,... of running brokers: start none")
    p.add_argument("--log", default=None, help="log URL for the started brokers "
                   "(default: a shared file: log in the run dir)")
    p.add_argument("--json", default=None, help="write the results as JSON to this file")
    p.add_argument("--report", default=None,
                   help="keep the run dir (histories, broker output, result.json) here")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--messages", type=int, default=None, help="stop publishing after N")
    p.add_argument("--producers", type=int, default=None, help="producer processes")
    p.add_argument("--consumers", type=int, default=None, help="consumer processes")
    p.add_argument("--size", type=int, default=None, help="body bytes")
    p.add_argument("--rate", type=float, default=None, help="target publish msg/s in all")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--check", default=None, metavar="RUN_DIR",
                   help="do not run: check and measure the histories in RUN_DIR")


def run_from_args(args: argparse.Namespace) -> int:
    """Run (or ``--check``) as the parsed options say; returns the exit status."""
    from loadtest.runner import RunConfig, analyse_dir, format_report, run, save
    from loadtest.workloads import get_preset

    if args.check:
        result = analyse_dir(args.check)
        print(format_report(result))
        if args.json:
            save(result, args.json, keep_dir=True)
        return 0 if result.ok else 1
    if args.duration <= 0 or args.brokers < 1:
        print("loadtest: --duration and --brokers must be positive", file=sys.stderr)
        return 2
    workload = get_preset(
        args.preset,
        max_messages=args.messages,
        producers=args.producers,
        consumers=args.consumers,
        size=args.size,
        rate=args.rate,
    )
    config = RunConfig(
        workload=workload,
        duration=args.duration,
        brokers=args.brokers,
        log_url=args.log,
        brokers_at=tuple(a for a in (args.brokers_at or "").split(",") if a),
        report_dir=args.report,
        seed=args.seed,
        progress=not args.quiet,
    )
    try:
        result = run(config)
    except RuntimeError as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        return 2
    print(format_report(result))
    save(result, args.json, keep_dir=bool(args.report))
    if not result.ok:
        print(f"histories kept in {result.run_dir}", file=sys.stderr)
    return 0 if result.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    p = argparse.ArgumentParser(
        prog="python -m loadtest",
        description="Baton load test: run a workload, check the guarantees, report figures.",
    )
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
