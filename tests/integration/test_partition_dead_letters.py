"""Dead letters across data partitions (docs/design.md §16), real brokers on a log of a
control partition and four data partitions: a queue whose dead-letter queue is on another
partition, for every reason that dead-letters (a reject, TTL expiry, max-length
overflow, the delivery limit), a dead-letter exchange whose routes fan out over several
partitions, and a policy's dead-letter settings; each dead letter reaches its queues
once, with its x-death headers, and the replicas agree."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from batonmq import clients
from tests.helpers import drain, equal_digests, eventually, topology, wait_stats
from tests.integration.conftest import BrokerProcess, brokers_of, started

pytestmark = pytest.mark.integration

N = 4


def parted_brokers(tmp_path: Path, count: int) -> list[BrokerProcess]:
    return brokers_of(tmp_path, f"file:{tmp_path / 'shared-log'}", count,
                      ["--partitions", str(N)])


@pytest.fixture
def two(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Two brokers on one file: a log of 1 + 4 partitions."""
    yield from started(parted_brokers(tmp_path, 2))


async def in_flight_settled(address: str) -> None:
    """Every data partition, as ``address`` applies it, has nothing left to forward."""

    async def rows() -> list[dict[str, object]]:
        return list((await topology(address))["partitions"])

    await eventually(
        rows, "no dead letter or publish in flight",
        until=lambda rs: all(
            r["dead_letters_in_flight"] == 0 and r["forwards_pending"] == 0 for r in rs
        ),
    )


async def test_every_reason_dead_letters_into_a_queue_on_another_partition(
    two: list[BrokerProcess],
) -> None:
    conn = await clients.connect(two[0].address, timeout=5)
    await conn.declare_queue("dlq", partition=1)
    for name, kw in [
        ("rej", {}),
        ("ttl", {"message_ttl": 0.2}),
        ("cap", {"max_length": 2, "overflow": "drop-head"}),
        ("lim", {"delivery_limit": 1}),
    ]:
        await conn.declare_queue(name, dead_letter="dlq", partition=2, **kw)
        assert (await conn.queue_stats(name))["partition"] == 2
    assert (await conn.queue_stats("dlq"))["partition"] == 1
    await conn.publish("rej", b"rejected")
    await conn.publish("lim", b"limit")
    for body in (b"cap0", b"cap1", b"cap2"):  # cap0 is dropped from the head
        await conn.publish("cap", body)
    await conn.publish("ttl", b"expired")
    for name in ("rej", "lim"):
        async with conn.consume(name) as consumer:
            msg = await consumer.get(timeout=10)
            assert msg is not None
            if name == "rej":
                await msg.reject(confirm=True)
            else:
                await msg.release(failed=True, confirm=True)
    got = await drain(two[1].address, "dlq", count=4)
    by_body = {m.body: m.headers for m in got}
    assert sorted(by_body) == [b"cap0", b"expired", b"limit", b"rejected"]
    assert by_body[b"rejected"]["x-death-reason"] == "rejected"
    assert by_body[b"rejected"]["x-death-queue"] == "rej"
    assert by_body[b"expired"]["x-death-reason"] == "expired"
    assert by_body[b"cap0"]["x-death-reason"] == "maxlen"
    assert by_body[b"limit"]["x-death-reason"] == "delivery-limit"
    for name in ("rej", "lim", "cap", "ttl"):
        stats = await conn.queue_stats(name)
        assert stats["ready"] == (2 if name == "cap" else 0), stats
    await in_flight_settled(two[0].address)
    assert await drain(two[0].address, "dlq", idle=0.5) == []  # nothing twice
    await equal_digests(two)
    await conn.close()


async def test_a_dead_letter_exchange_fans_out_over_partitions_and_a_policy_sets_one(
    two: list[BrokerProcess],
) -> None:
    conn = await clients.connect(two[0].address, timeout=5)
    await conn.declare_exchange("dlx", "fanout")
    targets = [f"d{k}" for k in range(1, N + 1)]
    for k, name in enumerate(targets, 1):
        await conn.declare_queue(name, partition=k)
        await conn.bind_queue(name, "dlx")
    await conn.declare_queue("src", dead_letter_exchange="dlx", partition=2)
    await conn.bind_queue("src", "dlx")  # bound too: never dead-lettered back into itself
    for i in range(3):
        await conn.publish("src", b"x%d" % i)
    async with conn.consume("src") as consumer:
        batch = await consumer.get_many(3, timeout=10)
        assert len(batch) == 3
        await consumer.reject_many(batch, confirm=True)
    for name in targets:
        got = await drain(two[1].address, name, count=3)
        assert sorted(m.body for m in got) == [b"x0", b"x1", b"x2"], name
        assert {m.headers["x-death-exchange"] for m in got} == {"dlx"}
        assert {m.headers["x-first-death-queue"] for m in got} == {"src"}
    await wait_stats(conn, "src", ready=0)
    # A policy's dead-letter queue, on another partition than the queues it covers.
    await conn.declare_queue("pol-dlq", partition=4)
    await conn.declare_queue("pol-q", partition=3)
    await conn.set_policy("dl", "^pol-q$", {"dead-letter": "pol-dlq"})
    await eventually(
        lambda: conn.queue_stats("pol-q"), "the policy on pol-q",
        until=lambda st: st.get("dead_letter") == "pol-dlq",
    )
    await conn.publish("pol-q", b"by-policy")
    async with conn.consume("pol-q") as consumer:
        msg = await consumer.get(timeout=10)
        assert msg is not None
        await msg.reject(confirm=True)
    got = await drain(two[1].address, "pol-dlq", count=1)
    assert got[0].body == b"by-policy" and got[0].headers["x-death-queue"] == "pol-q"
    await in_flight_settled(two[1].address)
    for name in [*targets, "pol-dlq"]:
        assert await drain(two[0].address, name, idle=0.3) == []  # each once
    await equal_digests(two)
    await conn.close()
