"""Benchmark: what Kafka itself gives at a modest rate, and what Baton's Kafka log adds.

Appends 1 KiB records at a fixed rate to a fresh topic and reads them back from another
client, measuring per record:

* ``append``: from the call until the append is acknowledged (``acks=all``);
* ``visible``: from the call until a reader that waits for new data has it.

Two layers, one after the other in the same run, on the same Kafka:

* ``raw``: aiokafka alone: an idempotent producer (``acks=all``, ``linger_ms=0``, one
  ``send_and_wait`` per record) and a consumer whose fetch waits for new data;
* ``log``: Baton's :class:`~batonmq.cluster.log.KafkaLog` (``append`` of one record,
  ``read`` from the start), the path every broker's appends and applies take.

    python -m batonmq.loadtest.bench_kafka_floor --bootstrap 127.0.0.1:9092 --rate 2000

Needs a running Kafka (``.ci/kafka start DIR`` prints its address). Prints p50 / p90 /
p99 / max per layer and measure, in milliseconds, and with ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from batonmq.loadtest.hist import exact_percentile

__all__ = ["main"]

_SIZE = 1024


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    s = sorted(values)
    ms = {f"p{round(q * 100)}": round(exact_percentile(s, q) * 1000, 3) for q in (0.5, 0.9, 0.99)}
    return {"n": len(s), **ms, "max": round(s[-1] * 1000, 3)}


async def _paced(
    rate: float, count: int, send: Callable[[int, bytes], Awaitable[None]],
    sent_at: dict[int, float], acked: list[float],
) -> None:
    """Call ``send`` for ``count`` records at ``rate`` per second, each in its own task
    (so a slow acknowledgement does not hold the next record back), then wait for all."""
    start = time.perf_counter()
    tasks = []

    async def one(i: int) -> None:
        body = i.to_bytes(8, "big") + bytes(_SIZE - 8)
        t0 = sent_at[i] = time.perf_counter()
        await send(i, body)
        acked.append(time.perf_counter() - t0)

    for i in range(count):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)


async def _raw(bootstrap: str, rate: float, count: int) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"bench-floor-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=0,
    )
    await producer.start()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        await producer.send_and_wait(topic, b"warm-up", partition=0)
        await consumer.start()
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 1)
        sent_at: dict[int, float] = {}
        acked: list[float] = []
        visible: list[float] = []

        async def read() -> None:
            while len(visible) < count:
                got = await consumer.getmany(tp, timeout_ms=1000)
                now = time.perf_counter()
                for r in got.get(tp, []):
                    visible.append(now - sent_at[int.from_bytes(r.value[:8], "big")])

        reader = asyncio.ensure_future(read())

        async def send(i: int, body: bytes) -> None:
            await producer.send_and_wait(topic, body, partition=0)

        await _paced(rate, count, send, sent_at, acked)
        await asyncio.wait_for(reader, 30)
    finally:
        await consumer.stop()
        await producer.stop()
    return {"append": _percentiles(acked), "visible": _percentiles(visible)}


async def _log(bootstrap: str, rate: float, count: int) -> dict[str, Any]:
    from batonmq.cluster.log import open_log

    topic = f"bench-floor-{uuid.uuid4().hex[:8]}"
    log = await open_log(f"kafka://{bootstrap}/{topic}")
    sent_at: dict[int, float] = {}
    acked: list[float] = []
    visible: list[float] = []
    try:
        async def read() -> None:
            async for batch in log.read(0):
                now = time.perf_counter()
                for _, value in batch:
                    visible.append(now - sent_at[int.from_bytes(value[:8], "big")])
                if len(visible) >= count:
                    return

        reader = asyncio.ensure_future(read())

        async def send(i: int, body: bytes) -> None:
            await log.append([body])

        await _paced(rate, count, send, sent_at, acked)
        await asyncio.wait_for(reader, 30)
    finally:
        await log.close()
    return {"append": _percentiles(acked), "visible": _percentiles(visible)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m batonmq.loadtest.bench_kafka_floor",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", required=True, help="HOST:PORT of a running Kafka")
    p.add_argument("--rate", type=float, default=2000.0, help="records per second (2000)")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds per layer (10)")
    p.add_argument("--layer", action="append", choices=("raw", "log"),
                   help="layer to measure; repeat (default: both)")
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    count = int(args.rate * args.seconds)
    if count < 1:
        p.error("--rate times --seconds must be at least one record")
    runs = {"raw": _raw, "log": _log}
    out: dict[str, Any] = {"rate": args.rate, "records": count, "size": _SIZE}
    for layer in args.layer or ["raw", "log"]:
        print(f"{layer}: {count} records of {_SIZE} bytes at {args.rate:g}/s ...", flush=True)
        try:
            out[layer] = figures = asyncio.run(runs[layer](args.bootstrap, args.rate, count))
        except Exception as exc:  # Kafka unreachable, a topic not made, records not read back
            p.exit(1, f"{p.prog}: the {layer} layer failed: {type(exc).__name__}: {exc}\n")
        for what, f in figures.items():
            print(f"  {what:8} p50 {f.get('p50', 0):8.2f}  p90 {f.get('p90', 0):8.2f}  "
                  f"p99 {f.get('p99', 0):8.2f}  max {f.get('max', 0):8.2f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
