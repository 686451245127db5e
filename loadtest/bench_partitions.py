"""Benchmark: appends to a file log set of 1 partition against 4 (docs/design.md §3).

Concurrent writers, one per partition (or ``--writers N``, writer *i* on partition *i* mod
P), append batches of ``--batch`` records of ``--size`` bytes, each awaiting its append
before the next (as the node's appender does). Each partition has its own ``flock`` and
group-commit sync stream; writers that share a partition share those (their appends go
together into one write and one sync). A run stops after ``--records`` records per writer
or ``--seconds``, whichever comes first.

    python -m batonmq.loadtest.bench_partitions                 # 1 vs 4 partitions
    python -m batonmq.loadtest.bench_partitions --stall         # and a stalled partition

``--stall``: on 4 partitions, a baseline for ``--seconds``, then as long again with
partition 1's writers' lock (its ``flock``, as a stopped broker would hold it) held by
this process: partition 1 appends nothing, the others keep their rate. Prints
records/s in all and per partition, and checks each partition's end offset against what
its writers appended. ``--json FILE`` writes the figures. Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from batonmq.cluster.log import LogSet, open_log_set
from batonmq.cluster.log.file import LOCK_FILE
from batonmq.cluster.log.file_set import partition_dir

__all__ = ["main", "run"]


async def _writers(
    logs: LogSet, args: argparse.Namespace, seconds: float, counts: list[int]
) -> list[float]:
    """Run the writers for at most ``seconds`` (or ``--records`` each); adds what each
    partition got to ``counts``; returns the seconds each partition's writers took (0 for
    a partition whose writers never finished: stalled)."""
    body = b"b" * args.size
    batch = [body] * args.batch
    stop_at = time.monotonic() + seconds

    writers = args.writers or logs.count

    took = [0.0] * logs.count
    started = time.perf_counter()

    async def writer(i: int) -> None:
        k = i % logs.count
        part = logs.partition(k)
        done = 0
        while done < args.records and time.monotonic() < stop_at:
            await part.append(batch)
            done += len(batch)
            counts[k] += len(batch)
        took[k] = max(took[k], time.perf_counter() - started)

    tasks = [asyncio.ensure_future(writer(i)) for i in range(writers)]
    # A stalled writer never returns from its append: the run ends after the deadline anyway.
    await asyncio.wait(tasks, timeout=seconds + 1.0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return took


def _figures(counts: list[int], took: list[float]) -> dict[str, Any]:
    """Records/s in all (over the time until the last writer that finished did) and per
    partition (over its own writers' time)."""
    elapsed = max(took)
    return {
        "records": sum(counts),
        "seconds": round(elapsed, 3),
        "records_per_s": round(sum(counts) / elapsed, 1) if elapsed else 0.0,
        "per_partition": [round(n / t, 1) if t else 0.0 for n, t in zip(counts, took)],
        "per_partition_records": list(counts),
    }


async def _check(logs: LogSet, appended: list[int]) -> bool:
    """Each partition holds exactly what its writers appended (dense from 0)."""
    ends = [await logs.partition(k).end_offset() for k in range(logs.count)]
    return ends == appended


async def _scaling(root: str, partitions: int, args: argparse.Namespace) -> dict[str, Any]:
    logs = await open_log_set(f"file:{root}", partitions=partitions)
    try:
        counts = [0] * partitions
        out = _figures(counts, await _writers(logs, args, args.seconds, counts))
        out["partitions"] = partitions
        out["writers"] = args.writers or partitions
        out["ok"] = await _check(logs, counts)
        return out
    finally:
        await logs.close()


async def _stalled(root: str, args: argparse.Namespace) -> dict[str, Any]:
    """4 partitions: a baseline, then with partition 1's lock held."""
    logs = await open_log_set(f"file:{root}", partitions=4)
    fd = -1
    try:
        before = [0] * 4
        base_s = await _writers(logs, args, args.seconds, before)
        fd = os.open(os.path.join(partition_dir(root, 1), LOCK_FILE), os.O_RDWR)
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)  # waits for a commit in flight
        during = [0] * 4
        stall_s = await _writers(logs, args, args.seconds, during)
        # The stalled partition's last append may wait still: let it finish, then count.
        os.close(fd)
        fd = -1
        appended = [b + d for b, d in zip(before, during)]
        ends = [await logs.partition(k).end_offset() for k in range(4)]
        # An append cancelled while it waited for the lock may still land after: at most
        # one batch per writer of the stalled partition.
        slack = args.batch * len(range(1, args.writers or 4, 4))
        ok = all(e == a for k, (e, a) in enumerate(zip(ends, appended)) if k != 1) and (
            appended[1] <= ends[1] <= appended[1] + slack
        )
        base, stall = _figures(before, base_s), _figures(during, stall_s)
        others = [k for k in range(4) if k != 1]
        kept = [
            stall["per_partition"][k] / base["per_partition"][k] if base["per_partition"][k] else 0.0
            for k in others
        ]
        return {
            "partitions": 4,
            "stalled_partition": 1,
            "baseline": base,
            "stalled": stall,
            "others_kept_rate": [round(x, 2) for x in kept],
            "ok": ok and during[1] == 0 and all(during[k] > 0 for k in others),
        }
    finally:
        if fd >= 0:
            os.close(fd)
        await logs.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every run the arguments ask for, in a fresh directory each."""
    base = args.dir or tempfile.mkdtemp(prefix="baton-bench-partitions-")
    results: dict[str, Any] = {
        "writers": args.writers or "one per partition", "batch": args.batch, "size": args.size, "runs": [],
    }
    try:
        for n, partitions in enumerate(args.partitions):
            results["runs"].append(await _scaling(os.path.join(base, f"scale-{n}"), partitions, args))
        if args.stall:
            results["stall"] = await _stalled(os.path.join(base, "stall"), args)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    results["ok"] = all(r["ok"] for r in results["runs"]) and results.get("stall", {"ok": True})["ok"]
    return results


def _show(results: dict[str, Any]) -> None:
    print(f"writers {results['writers']}, batches of {results['batch']} x {results['size']} bytes")
    for r in results["runs"]:
        per = " ".join(f"{x:.0f}" for x in r["per_partition"])
        print(f"{r['partitions']} partition(s), {r['writers']} writer(s): {r['records_per_s']:.0f} records/s"
              f" ({r['records']} in {r['seconds']:.2f}s); per partition: {per}"
              f"{'' if r['ok'] else '  CHECK FAILED'}")
    stall = results.get("stall")
    if stall:
        for name in ("baseline", "stalled"):
            r = stall[name]
            per = " ".join(f"{x:.0f}" for x in r["per_partition"])
            print(f"stall run, {name}: {r['records_per_s']:.0f} records/s; per partition: {per}")
        kept = ", ".join(f"{x:.0%}" for x in stall["others_kept_rate"])
        print(f"partition {stall['stalled_partition']} stalled: the others kept {kept} of their rate"
              f"{'' if stall['ok'] else '  CHECK FAILED'}")
    print("ok" if results["ok"] else "FAILED")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m batonmq.loadtest.bench_partitions",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--partitions", type=int, nargs="+", default=[1, 4], help="runs, by partition count (1 4)")
    p.add_argument("--writers", type=int, default=0,
                   help="concurrent writers (default: one per partition; 4 for the stall run)")
    p.add_argument("--batch", type=int, default=64, help="records per append (64)")
    p.add_argument("--size", type=int, default=256, help="bytes per record (256)")
    p.add_argument("--records", type=int, default=200_000, help="most records per writer (200000)")
    p.add_argument("--seconds", type=float, default=5.0, help="most seconds per run (5)")
    p.add_argument("--stall", action="store_true", help="also the stalled-partition run")
    p.add_argument("--dir", help="where the logs go (kept); default a temporary directory")
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    if min(args.partitions) < 1 or args.writers < 0 or args.batch < 1 or args.size < 0 or args.records < 1:
        p.error("--partitions, --writers, --batch and --records must be positive")
    if args.seconds <= 0:
        p.error("--seconds must be positive")
    results = asyncio.run(run(args))
    _show(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
