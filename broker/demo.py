"""``baton demo``: start a broker on the embedded file log, round-trip messages, stop.

The README's first command. It runs a real ``baton serve`` process (so what you
see is what you would deploy), publishes with confirms, consumes with acks,
checks that every message came back exactly once, prints the figures, and stops
the broker it started.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time

from batonmq import clients
from batonmq.broker.config import ready_address

__all__ = ["run_demo"]


def _progress(label: str, done: int, total: int, started: float) -> None:
    """A live counter on a terminal; four plain lines otherwise (logs, CI)."""
    rate = done / max(time.monotonic() - started, 1e-9)
    text = f"  {label}: {done:>7}/{total} ({rate:,.0f} msg/s)"
    if sys.stdout.isatty():
        sys.stdout.write("\r" + text)
        sys.stdout.flush()
    elif done * 4 // total != (done - 1) * 4 // total or done == total:
        print(text)


async def _round_trip(address: str, count: int, size: int) -> None:
    body = b"x" * size
    async with await clients.connect(address) as conn:
        await conn.declare_queue("demo")
        await conn.purge_queue("demo")
        print(f"connected to {address} (broker node {conn.node_id})")

        started = time.monotonic()
        batch = 500
        for i in range(0, count, batch):
            n = min(batch, count - i)
            await conn.publish_batch("demo", [(body, {"i": i + k}) for k in range(n)])
            _progress("published (confirmed)", i + n, count, started)
        pub_s = time.monotonic() - started
        if sys.stdout.isatty():
            print()
        stats = await conn.queue_stats("demo")
        print(f"  queue 'demo': ready={stats['ready']} acquired={stats['acquired']}")

        seen: set[int] = set()
        started = time.monotonic()
        async with conn.consume("demo", prefetch=1000) as consumer:
            while len(seen) < count:
                msgs = await asyncio.wait_for(consumer.get_many(1000), 30)
                await consumer.ack_many(msgs)
                seen.update(int(m.headers["i"]) for m in msgs)
                _progress("consumed (acked)     ", len(seen), count, started)
        con_s = time.monotonic() - started
        if sys.stdout.isatty():
            print()
        stats = await conn.queue_stats("demo")
        ok = seen == set(range(count)) and stats["ready"] == 0 and stats["acquired"] == 0
        print(
            f"  {count} x {size} B: publish {count / pub_s:,.0f} msg/s, "
            f"consume+ack {count / con_s:,.0f} msg/s; every message once: {ok}"
        )
        if not ok:
            raise SystemExit("demo failed: messages missing or left over")


def run_demo(data_dir: str | None, count: int, size: int) -> int:
    """Run the demo; returns the process exit status."""
    data_dir = data_dir or tempfile.mkdtemp(prefix="baton-demo-")
    listen = "127.0.0.1:0"  # any free port: the ready line says which one
    cmd = [sys.executable, "-m", "batonmq.broker", "serve", "--listen", listen, "--data-dir", data_dir]
    print(f"starting: baton serve --listen {listen} --data-dir {data_dir}")
    print(f"          (log: file:{os.path.join(data_dir, 'log')}, the embedded default)")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        address = None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            address = ready_address(line)
            if address is not None:
                print(f"  {line}")
                break
            if time.monotonic() > deadline:
                break
        if address is None:
            what = "did not get ready in 30s" if proc.poll() is None else "exited before it was ready"
            print(f"the broker {what}", file=sys.stderr)
            return 1
        import uvloop

        uvloop.run(_round_trip(address, count, size))
        return 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        print(f"broker stopped (exit {proc.returncode}); its data stays in {data_dir}")
