"""Memory benchmark: a deep queue must not live in the broker's Python heap.

Starts a real ``baton serve`` (embedded file log), publishes N messages of S bytes
into one queue with confirms, and samples the broker's RSS (``/proc/PID/status``)
as the queue grows; then restarts the broker on the same data dir and samples the
RSS after recovery. The goal: 2,000,000 x 1 KiB must not need 2 GB of
heap — the state machine keeps an index (a few integers per queue for fresh
messages), the bodies stay in rocksdict and the log.

    python -m batonmq.loadtest.bench_memory --messages 2000000 --size 1024
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from batonmq import clients
from batonmq.broker.config import ready_address


def _rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) in MiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _start(data_dir: str, listen: str = "127.0.0.1:0") -> tuple[subprocess.Popen[bytes], str]:
    """Start a broker; returns it and the address from its ready line (the port it got)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "batonmq.broker", "--log-level", "WARNING", "serve",
         "--listen", listen, "--data-dir", data_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    for raw in proc.stdout:
        address = ready_address(raw.decode(errors="replace"))
        if address is not None:
            return proc, address
    raise SystemExit("broker did not start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)


async def _fill(address: str, pid: int, messages: int, size: int, samples: list[dict[str, float]]) -> float:
    body = os.urandom(size)
    batch = 1000
    async with await clients.connect(address) as conn:
        await conn.declare_queue("deep")
        started = time.monotonic()
        next_sample = 0
        in_flight: set[asyncio.Task[list[int]]] = set()
        sent = 0
        while sent < messages:
            while len(in_flight) < 4 and sent < messages:
                n = min(batch, messages - sent)
                in_flight.add(asyncio.ensure_future(conn.publish_batch("deep", [body] * n)))
                sent += n
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
            if sent >= next_sample:
                rss, peak = _rss_mb(pid)
                elapsed = time.monotonic() - started
                samples.append({"messages": sent, "rss_mb": rss, "peak_mb": peak, "s": elapsed})
                print(f"  {sent:>9} messages  rss {rss:7.1f} MiB  peak {peak:7.1f} MiB"
                      f"  {sent / elapsed:,.0f} msg/s", flush=True)
                next_sample += max(messages // 20, 1)
        await asyncio.gather(*in_flight)
        stats = await conn.queue_stats("deep")
        assert stats["ready"] == messages, stats
        return time.monotonic() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=2_000_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="baton-bench-mem-")
    print(f"broker data dir {data_dir}; {args.messages} x {args.size} B into one queue")
    proc, address = _start(data_dir)
    samples: list[dict[str, float]] = []
    try:
        import uvloop

        seconds = uvloop.run(_fill(address, proc.pid, args.messages, args.size, samples))
        filled_rss, filled_peak = _rss_mb(proc.pid)
    finally:
        _stop(proc)
    proc, _ = _start(data_dir, address)
    try:
        time.sleep(1)
        restart_rss, _ = _rss_mb(proc.pid)
    finally:
        _stop(proc)
    result = {
        "messages": args.messages,
        "size": args.size,
        "publish_seconds": seconds,
        "publish_msgs_per_s": args.messages / seconds,
        "rss_mb_full": filled_rss,
        "peak_rss_mb": filled_peak,
        "rss_mb_after_restart": restart_rss,
        "samples": samples,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
