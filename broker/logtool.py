"""``baton log verify`` and ``baton log repair``: the file log's checker and its mender.

The work is in :mod:`batonmq.cluster.log.filecheck`; this module is the command line:
which log (``--log URL`` or a broker's ``--data-dir``), the report, the exit status, and
a progress line on stderr while a long scan runs in a terminal (docs/operations.md,
"A corrupt record in the file log"). Both work on every partition of a log set
(``partition-K/`` beside partition 0's segments); with more than one partition each
line says which partition it is about.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TextIO

from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.log.filecheck import (
    Progress,
    RepairReport,
    ScanReport,
    file_log_path,
    repair_set,
    scan_set,
)

__all__ = ["add_arguments", "run_from_args"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``baton log`` subcommands."""
    sub = p.add_subparsers(dest="log_command", required=True)
    for name, text in (
        ("verify", "check every record of a file: log (every partition); exit 1 if any is unreadable"),
        ("repair", "rewrite damaged segments of every partition, keeping every readable record"
                   " (brokers stopped)"),
    ):
        c = sub.add_parser(name, help=text)
        which = c.add_mutually_exclusive_group(required=True)
        which.add_argument("--log", help="log URL, file:PATH")
        which.add_argument("--data-dir", help="a broker's data dir (its log is file:DIR/log)")
        c.add_argument("--no-progress", action="store_true",
                       help="no progress line, even in a terminal")


def _path(args: argparse.Namespace) -> str:
    url = args.log or f"file:{os.path.join(args.data_dir, 'log')}"
    path = file_log_path(url)
    if not os.path.isdir(path):
        raise InvalidArgument(f"no file log at {path}")
    return path


class _ProgressLine:
    """One line on a terminal, rewritten at most 10 times a second (no dependency for
    a single status line)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.last = 0.0
        self.shown = False

    def __call__(self, done: int, segments: int, done_bytes: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < 0.1 and done < segments:
            return
        self.last = now
        pct = 100.0 * done_bytes / total if total else 100.0
        self.out.write(f"\rscanning segment {done}/{segments}, {done_bytes >> 20}/{total >> 20}"
                       f" MiB ({pct:.0f}%)\x1b[K")
        self.out.flush()
        self.shown = True

    def end(self) -> None:
        if self.shown:
            self.out.write("\r\x1b[K")
            self.out.flush()


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``baton log verify|repair``.

    Returns:
        0: the log is sound (verify), or it was repaired or had nothing to repair;
        1: verify found unreadable records.

    Raises:
        InvalidArgument: not a file: log, or no log there.
        LogUnavailable: the log cannot be read, or (repair) a broker has it open.
    """
    path = _path(args)
    line = None if args.no_progress or not sys.stderr.isatty() else _ProgressLine(sys.stderr)
    progress: Progress | None = line
    repaired: list[RepairReport] = []
    try:
        if args.log_command == "verify":
            scans = scan_set(path, progress)
        else:
            repaired = repair_set(path, progress)
            scans = [done.scan for done in repaired]
    finally:
        if line is not None:
            line.end()
    several = len(scans) > 1

    def where(k: int) -> str:
        return f"partition {k}: " if several else ""

    for k, found in enumerate(scans):
        print(f"{where(k)}{found.path}: {found.segments} segments, {found.records} valid records,"
              f" offsets {found.start}..{found.end - 1}, {found.bytes} bytes")
        for d in found.damage:
            print(f"  {'BAD' if d.harmful else 'note'}: {where(k)}{d.text()}")
    if args.log_command == "verify":
        return _verdict(scans)
    if not any(done.rewritten for done in repaired):
        print("nothing to repair")
        return 0
    for k, done in enumerate(repaired):
        if done.rewritten:
            print(f"{where(k)}repaired {len(done.rewritten)} segment(s): {', '.join(done.rewritten)};"
                  f" {done.placeholders} unreadable offset(s) now hold placeholders (applied as"
                  f" malformed records), {done.cut_bytes} damaged bytes dropped."
                  f" The originals are kept in {done.backup}.")
    return 0


def _verdict(scans: list[ScanReport]) -> int:
    """Print verify's verdict; its exit status."""
    bad = [k for k, found in enumerate(scans) if not found.ok]
    if not bad:
        torn = any(found.damage for found in scans)
        tail = " (a torn tail: the next append cuts it)" if torn else ""
        print(f"ok: every record is readable{tail}")
        return 0
    lost = sum(d.records for found in scans for d in found.damage if d.harmful)
    which = f" in partition(s) {', '.join(map(str, bad))}" if len(scans) > 1 else ""
    print(f"DAMAGED: {lost} unreadable record(s){which}; brokers stop applying at the first."
          " Stop every broker on this log and run `baton log repair`.")
    return 1
