"""Benchmark: the log's size under a steady load (docs/design.md §8, retention).

Starts ``--brokers`` brokers on one embedded file log (``--segment-mb`` segments),
runs a steady publish/consume load (``--rate`` messages/s of ``--size`` bytes, acked)
for ``--minutes``, and samples the log directory's size every ``--every`` seconds.
The leader checkpoints every ``--checkpoint-ms`` and truncates whole segments below
the checkpoint six back once every broker applied past it, so the size
levels off instead of growing with what went through.

    python -m batonmq.loadtest.bench_retention --minutes 5

Prints the samples and a verdict: the largest size in the last third of the run
is compared with the largest in the middle third (it must not be larger by more
than one segment), and with the bytes written. Exit status 1 if it kept growing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from batonmq import clients
from batonmq.loadtest.bench_join import _Broker


def _log_size(path: str) -> tuple[int, int]:
    """(bytes, segments) of a file log directory."""
    size = n = 0
    for e in os.scandir(path):
        if e.name.endswith(".seg"):
            try:  # truncation may delete it between the listing and the stat
                size += e.stat().st_size
                n += 1
            except FileNotFoundError:
                pass
    return size, n


async def _produce(address: str, rate: float, size: int, stop: asyncio.Event, sent: list[int]) -> None:
    body = b"r" * size
    batch = max(1, int(rate / 50))  # 50 publishes/s of `batch` messages
    async with await clients.connect(address) as conn:
        start = time.monotonic()
        n = 0
        while not stop.is_set():
            await conn.publish_batch("steady", [body] * batch)
            n += batch
            sent[0] = n
            ahead = n / rate - (time.monotonic() - start)
            if ahead > 0:
                await asyncio.sleep(ahead)


async def _consume(address: str, stop: asyncio.Event, got: list[int]) -> None:
    async with await clients.connect(address) as conn:
        async with conn.consume("steady", prefetch=1000) as consumer:
            while not stop.is_set():
                batch = await consumer.get_many(1000, timeout=0.2)
                if batch:
                    await consumer.ack_many(batch)
                    got[0] += len(batch)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="baton-bench-retention-")
    log_dir = os.path.join(root, "log")
    url = f"file:{log_dir}?segment_bytes={args.segment_mb << 20}"
    nodes = [_Broker(root, f"node-{i}", url) for i in range(1, args.brokers + 1)]
    for b in nodes:
        b.cmd += ["--checkpoint-ms", str(args.checkpoint_ms)]
    samples: list[dict[str, Any]] = []
    try:
        for b in nodes:
            b.start()
            await b.ready()
        async with await clients.connect(nodes[0].address) as conn:
            await conn.declare_queue("steady")
        await asyncio.sleep(1)
        stop = asyncio.Event()
        sent, got = [0], [0]
        tasks = [
            asyncio.create_task(_produce(nodes[0].address, args.rate, args.size, stop, sent)),
            asyncio.create_task(_consume(nodes[-1].address, stop, got)),
        ]
        start = time.monotonic()
        end = start + args.minutes * 60
        while time.monotonic() < end:
            await asyncio.sleep(args.every)
            size, segs = _log_size(log_dir)
            s = {
                "t": round(time.monotonic() - start, 1),
                "log_mb": round(size / 2**20, 1),
                "segments": segs,
                "sent": sent[0],
                "consumed": got[0],
                "written_mb": round(sent[0] * args.size / 2**20, 1),
            }
            samples.append(s)
            print(f"t={s['t']:>6}s log={s['log_mb']:>7} MiB in {segs:>3} segments;"
                  f" {s['sent']} sent ({s['written_mb']} MiB), {s['consumed']} consumed",
                  file=sys.stderr, flush=True)
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        for b in nodes:
            b.stop()
        shutil.rmtree(root, ignore_errors=True)
    third = max(1, len(samples) // 3)
    middle = max(s["log_mb"] for s in samples[third : 2 * third] or samples)
    last = max(s["log_mb"] for s in samples[2 * third :] or samples)
    bounded = last <= middle + args.segment_mb
    return {
        "samples": samples,
        "max_middle_third_mb": middle,
        "max_last_third_mb": last,
        "written_mb": samples[-1]["written_mb"] if samples else 0,
        "bounded": bounded,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=5)
    p.add_argument("--brokers", type=int, default=3)
    p.add_argument("--rate", type=float, default=3000, help="messages/s")
    p.add_argument("--size", type=int, default=1024, help="body bytes")
    p.add_argument("--segment-mb", type=int, default=8)
    p.add_argument("--checkpoint-ms", type=int, default=5000)
    p.add_argument("--every", type=float, default=10, help="seconds between samples")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    r = asyncio.run(run(args))
    print(f"written {r['written_mb']} MiB; log size max {r['max_middle_third_mb']} MiB in the"
          f" middle third, {r['max_last_third_mb']} MiB in the last third:"
          f" {'bounded' if r['bounded'] else 'STILL GROWING'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    return 0 if r["bounded"] else 1


if __name__ == "__main__":
    sys.exit(main())
