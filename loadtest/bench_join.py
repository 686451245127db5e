"""Benchmark: a broker joining a busy cluster (docs/design.md §8).

Two brokers on one embedded file log hold ``--depth`` messages in ``--queues``
queues, after ``--history`` more were published and consumed (a long log history
that a joiner must *not* replay). While a producer (one message per publish, with
confirms) and consumers (acks) run on the two, a third broker with an empty data dir
starts. Reported per depth:

* join: seconds from starting the process to "every queue served here", and the
  update's own duration and size (from the joiner's topology);
* confirm latency of the producer (p50/p99/max, ms) before the join and during it;
* that the joiner's state digest equals the others' at a checkpoint, and that a
  consumer on the joiner gets messages.

    python -m batonmq.loadtest.bench_join --depth 20000 --depth 200000 --queues 50

Everything runs on 127.0.0.1 and stops by itself; exit status 1 if a check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from batonmq import clients
from batonmq.broker.config import ready_address
from batonmq.loadtest.hist import exact_percentile


class _Broker:
    """One ``baton serve`` on 127.0.0.1:0; its address comes from its ready line."""

    def __init__(self, root: str, name: str, log_url: str) -> None:
        self.dir = os.path.join(root, name)
        self.address = ""  # known once the broker has printed its ready line
        self.out = open(os.path.join(root, f"{name}.out"), "wb")
        self.cmd = [
            sys.executable, "-m", "batonmq.broker", "serve",
            "--data-dir", self.dir, "--log", log_url, "--node-id", name,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [*self.cmd, "--listen", "127.0.0.1:0"]
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT)

    def serving(self) -> bool:
        """Whether the broker has printed its ready line (which sets ``address``).

        Raises:
            RuntimeError: the broker exited.
        """
        if not self.address:
            with open(self.out.name, errors="replace") as f:
                self.address = next(filter(None, map(ready_address, f)), "")
        assert self.proc is not None
        if not self.address and self.proc.poll() is not None:
            raise RuntimeError(f"broker exited: see {self.out.name}")
        return bool(self.address)

    async def ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.serving():
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"broker {self.dir} not ready in {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.out.close()


async def _fill(
    address: str, queues: list[str], per_queue: int, size: int, history: bool, batch: int = 1000
) -> None:
    """Publish ``per_queue`` messages to each queue (``batch`` per log record); with
    ``history``, consume them again."""
    body = b"h" * size
    async with await clients.connect(address) as conn:
        for q in queues:
            pending = []
            for start in range(0, per_queue, batch):
                pending.append(conn.publish_batch(q, [body] * min(batch, per_queue - start)))
                if len(pending) >= 64:
                    await asyncio.gather(*pending)
                    pending = []
            await asyncio.gather(*pending)
        if history:
            for q in queues:
                async with conn.consume(q, prefetch=2000) as consumer:
                    left = per_queue
                    while left > 0:
                        got = await consumer.get_many(min(left, 2000), timeout=10)
                        if not got:
                            raise RuntimeError(f"history of {q} not drained")
                        await consumer.ack_many(got, confirm=True)
                        left -= len(got)


class _Load:
    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (time, confirm latency s)
        self.stop = asyncio.Event()
        self.consumed = 0

    async def produce(self, address: str, queues: list[str], rate: float) -> None:
        body = b"p" * 256
        async with await clients.connect(address) as conn:
            n = 0
            start = time.monotonic()
            while not self.stop.is_set():
                t0 = time.monotonic()
                await conn.publish(queues[n % len(queues)], body)
                self.samples.append((t0, time.monotonic() - t0))
                n += 1
                ahead = n / rate - (time.monotonic() - start)
                if ahead > 0:
                    await asyncio.sleep(ahead)

    async def consume(self, address: str, queue: str) -> None:
        async with await clients.connect(address) as conn:
            async with conn.consume(queue, prefetch=100) as consumer:
                while not self.stop.is_set():
                    batch = await consumer.get_many(100, timeout=0.2)
                    if batch:
                        await consumer.ack_many(batch)
                        self.consumed += len(batch)

    def window(self, t0: float, t1: float) -> dict[str, float]:
        lat = sorted(lat for t, lat in self.samples if t0 <= t < t1)
        return {
            "confirms": len(lat),
            "p50_ms": round(exact_percentile(lat, 0.50) * 1000, 2),
            "p99_ms": round(exact_percentile(lat, 0.99) * 1000, 2),
            "max_ms": round(max(lat, default=float("nan")) * 1000, 2),
        }


async def _digests_agree(addresses: list[str], timeout: float = 60) -> bool:
    """All brokers verified the leader's digest at a checkpoint after now, no mismatch."""
    async def top(a: str) -> dict[str, Any]:
        async with await clients.connect(a) as conn:
            return await conn.topology()

    base = {a: (await top(a))["applied"] for a in addresses}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tops = {a: await top(a) for a in addresses}
        if any(t["digest_mismatches"] for t in tops.values()):
            return False
        if all((t["checkpoint"] or {}).get("verified", -1) > base[a] for a, t in tops.items()):
            return True
        await asyncio.sleep(0.2)
    return False


async def run_depth(depth: int, args: argparse.Namespace) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="baton-bench-join-")
    log_url = f"file:{os.path.join(root, 'log')}"
    queues = [f"q{i:03d}" for i in range(args.queues)]
    nodes = [_Broker(root, f"node-{i}", log_url) for i in (1, 2, 3)]
    for b in nodes:
        b.cmd += ["--update-max-rate", str(args.update_max_rate)]
    result: dict[str, Any] = {"depth": depth, "queues": args.queues, "history": args.history}
    try:
        for b in nodes[:2]:
            b.start()
            await b.ready()
        a, b2 = nodes[0].address, nodes[1].address
        async with await clients.connect(a) as conn:
            for q in queues + ["live"]:
                await conn.declare_queue(q)
        t = time.monotonic()
        if args.history:
            await _fill(a, queues, args.history // len(queues), args.size, history=True,
                        batch=args.history_batch)
        await _fill(a, queues, depth // len(queues), args.size, history=False)
        result["fill_s"] = round(time.monotonic() - t, 1)
        async with await clients.connect(a) as conn:
            result["log_records"] = (await conn.topology())["applied"] + 1
        print(f"depth {depth}: filled in {result['fill_s']}s, log has"
              f" {result['log_records']} records", file=sys.stderr)

        load = _Load()
        tasks = [
            asyncio.create_task(load.produce(a, ["live"], args.rate / 2)),
            asyncio.create_task(load.produce(b2, ["live"], args.rate / 2)),
            asyncio.create_task(load.consume(b2, "live")),
        ]
        await asyncio.sleep(args.before)
        t_join = time.monotonic()
        nodes[2].start()
        report = None
        while report is None and time.monotonic() - t_join < 600:
            await asyncio.sleep(0.05)
            if not nodes[2].serving():
                continue
            try:
                async with await clients.connect(nodes[2].address, timeout=1) as conn:
                    top = await conn.topology()
                j = top.get("join")
                if j is not None and "seconds" in j:
                    report = j
                elif j is not None:
                    print(f"  joining: {j.get('progress')}", file=sys.stderr)
            except clients.BatonError:
                pass
        t_done = time.monotonic()
        result["join_s"] = round(t_done - t_join, 2)
        result["update"] = report
        await asyncio.sleep(args.after)
        load.stop.set()
        await asyncio.gather(*tasks)
        result["latency_before"] = load.window(t_join - args.before, t_join)
        result["latency_during"] = load.window(t_join, t_done)
        result["latency_after"] = load.window(t_done, t_done + args.after)
        result["digests_agree"] = await _digests_agree([b.address for b in nodes])
        async with await clients.connect(nodes[2].address) as conn:
            async with conn.consume(queues[0], prefetch=100) as consumer:
                got = await consumer.get_many(100, timeout=10)
                await consumer.ack_many(got, confirm=True)
        result["joiner_delivers"] = len(got) == 100
        return result
    finally:
        for b in nodes:
            b.stop()
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depth", type=int, action="append", help="messages queued at the join (repeatable)")
    p.add_argument("--queues", type=int, default=50)
    p.add_argument("--size", type=int, default=512, help="body bytes of the queued messages")
    p.add_argument("--history", type=int, default=200_000,
                   help="messages published and consumed before (log history)")
    p.add_argument("--history-batch", type=int, default=10,
                   help="history messages per publish (per log record)")
    p.add_argument("--update-max-rate", type=int, default=0,
                   help="the members' --update-max-rate (0: no cap)")
    p.add_argument("--rate", type=float, default=400, help="publishes/s during the test")
    p.add_argument("--before", type=float, default=8.0, help="seconds of load before the join")
    p.add_argument("--after", type=float, default=3.0, help="seconds of load after the join")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    depths = args.depth or [20_000, 200_000]
    results = []
    for d in depths:
        results.append(asyncio.run(run_depth(d, args)))
    print(f"{'depth':>8} {'log recs':>9} {'join s':>7} {'update s':>9} "
          f"{'p99 before':>11} {'p99 during':>11} {'max during':>11} digest  joiner delivers")
    ok = True
    for r in results:
        u = r["update"] or {}
        print(f"{r['depth']:>8} {r['log_records']:>9} {r['join_s']:>7} {u.get('seconds', '-'):>9} "
              f"{r['latency_before']['p99_ms']:>9}ms {r['latency_during']['p99_ms']:>9}ms "
              f"{r['latency_during']['max_ms']:>9}ms {'equal' if r['digests_agree'] else 'DIFFER'}"
              f"   {r['joiner_delivers']}")
        ok = ok and r["digests_agree"] and r["joiner_delivers"] and r["update"] is not None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
