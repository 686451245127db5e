"""Queue settings and management against a real ``baton serve`` process.

max_length with both overflow policies, message TTL, purge, delete, declare
idempotence and validation, several consumers with prefetch, stats / list_queues.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batonmq import clients
from tests.helpers import drain, wait_stats
from tests.integration.conftest import BrokerProcess
from tests.integration.test_guarantees import next_msg

pytestmark = pytest.mark.integration


async def _no_more(consumer: clients.Consumer, wait: float = 0.4) -> None:
    """Assert that nothing more is delivered to ``consumer`` within ``wait`` seconds."""
    extra = await consumer.get(timeout=wait)
    assert extra is None, f"unexpected delivery {extra!r}"


# --- max_length --------------------------------------------------------------------------


async def test_max_length_reject_publish(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("capped", max_length=3)  # reject-publish is the default
        assert await conn.publish_batch("capped", [b"m0", b"m1"]) == [0, 1]
        assert await conn.publish("capped", b"m2") == 2
        with pytest.raises(clients.QueueFull):
            await conn.publish("capped", b"m3")
        stats = await conn.queue_stats("capped")
        assert (stats["ready"], stats["enqueued"], stats["next_position"]) == (3, 3, 3)
        assert (stats["max_length"], stats["overflow"]) == (3, "reject-publish")

        # Room for one: a batch of two is refused as a whole, nothing of it is enqueued.
        async with conn.consume("capped", prefetch=1) as consumer:
            msg = await next_msg(consumer)
            assert (msg.position, msg.body) == (0, b"m0")
            await msg.ack(confirm=True)
            assert (await conn.queue_stats("capped"))["accepted"] == 1
        stats = await wait_stats(conn, "capped", acquired=0)
        assert stats["ready"] == 2
        with pytest.raises(clients.QueueFull):
            await conn.publish_batch("capped", [b"x1", b"x2"])
        stats = await conn.queue_stats("capped")
        assert (stats["ready"], stats["enqueued"], stats["next_position"]) == (2, 3, 3)
        # One still fits, then the queue is full again.
        assert await conn.publish_batch("capped", [b"m3"]) == [3]
        with pytest.raises(clients.QueueFull):
            await conn.publish("capped", b"m4")
        rest = await drain(broker.address, "capped", idle=0.5)
        assert [m.body for m in rest] == [b"m1", b"m2", b"m3"]


async def test_max_length_drop_head_dead_letters_oldest(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("head.dlq")
        await conn.declare_queue("head", max_length=3, overflow="drop-head", dead_letter="head.dlq")
        await conn.publish_batch("head", [b"m0", b"m1", b"m2"])
        assert await conn.publish("head", b"m3") == 3  # m0 makes room
        assert await conn.publish_batch("head", [b"m4", b"m5"]) == [4, 5]  # m1, m2 go
        stats = await conn.queue_stats("head")
        assert (stats["ready"], stats["enqueued"], stats["dead_lettered"]) == (3, 6, 3)
        assert (await conn.queue_stats("head.dlq"))["ready"] == 3
        # A batch larger than max_length can never fit, even by dropping.
        with pytest.raises(clients.QueueFull):
            await conn.publish_batch("head", [b"y%d" % i for i in range(4)])
        assert (await conn.queue_stats("head"))["enqueued"] == 6

    kept = await drain(broker.address, "head", idle=0.5)
    assert [(m.position, m.body) for m in kept] == [(3, b"m3"), (4, b"m4"), (5, b"m5")]
    assert all(m.delivery_count == 0 for m in kept)
    dead = await drain(broker.address, "head.dlq", idle=0.5)
    assert [m.body for m in dead] == [b"m0", b"m1", b"m2"]
    for i, m in enumerate(dead):
        assert m.headers["x-death-reason"] == "maxlen"
        assert m.headers["x-death-queue"] == "head"
        assert m.headers["x-death-position"] == i


async def test_max_length_drop_head_without_dlq_just_drops(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("head2", max_length=2, overflow="drop-head")
        await conn.publish_batch("head2", [b"a", b"b"])
        await conn.publish("head2", b"c")
        stats = await conn.queue_stats("head2")
        assert (stats["ready"], stats["dropped"], stats["dead_lettered"]) == (2, 1, 0)
    kept = await drain(broker.address, "head2", idle=0.5)
    assert [m.body for m in kept] == [b"b", b"c"]


# --- TTL ------------------------------------------------------------------------------------


async def test_message_ttl_expires_and_dead_letters(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("ttl.dlq")
        await conn.declare_queue("ttl", message_ttl=0.3, dead_letter="ttl.dlq")
        await conn.declare_queue("ttl.plain", message_ttl=0.3)
        assert (await conn.queue_stats("ttl"))["message_ttl_ms"] == 300
        await conn.publish_batch("ttl", [b"t0", b"t1", b"t2"])
        await conn.publish_batch("ttl.plain", [b"p0", b"p1"])
        assert (await conn.queue_stats("ttl"))["ready"] == 3  # not yet expired
        stats = await wait_stats(conn, "ttl", expired=3)
        assert (stats["ready"], stats["acquired"], stats["accepted"]) == (0, 0, 0)
        stats = await wait_stats(conn, "ttl.plain", expired=2)
        assert stats["ready"] == 0
        # The DLQ has no TTL: the expired messages wait there.
        dstats = await conn.queue_stats("ttl.dlq")
        assert (dstats["ready"], dstats["expired"]) == (3, 0)
    dead = await drain(broker.address, "ttl.dlq", idle=0.5)
    assert [m.body for m in dead] == [b"t0", b"t1", b"t2"]
    assert [m.headers["x-death-position"] for m in dead] == [0, 1, 2]
    assert all(m.headers["x-death-reason"] == "expired" for m in dead)
    assert all(m.headers["x-death-queue"] == "ttl" for m in dead)
    assert await drain(broker.address, "ttl.plain", idle=0.3) == []


async def test_message_consumed_before_ttl_is_delivered_normally(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("fast", message_ttl=0.3)
        async with conn.consume("fast", prefetch=10) as consumer:
            await conn.publish("fast", b"quick", headers={"h": 1})
            msg = await next_msg(consumer, timeout=5)
            assert (msg.body, msg.headers, msg.delivery_count) == (b"quick", {"h": 1}, 0)
            # Held by the consumer past its TTL: acquired messages do not expire. (Time
            # passing is the point here, not a wait for something.)
            await asyncio.sleep(0.7)
            await msg.ack(confirm=True)
            stats = await conn.queue_stats("fast")
            assert (stats["accepted"], stats["expired"], stats["ready"]) == (1, 0, 0), stats
        # A message published while nobody consumes it expires.
        await conn.publish("fast", b"late")
        stats = await wait_stats(conn, "fast", expired=1)
        assert (stats["ready"], stats["accepted"]) == (0, 1)


# --- purge, delete, declare -----------------------------------------------------------------


async def test_purge_keeps_acquired_messages(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("p")
        await conn.publish_batch("p", [b"%d" % i for i in range(10)])
        async with conn.consume("p", prefetch=3) as consumer:
            held = [await next_msg(consumer) for _ in range(3)]
            await wait_stats(conn, "p", acquired=3)
            assert await conn.purge_queue("p") == 7
            stats = await conn.queue_stats("p")
            assert (stats["ready"], stats["acquired"], stats["purged"]) == (0, 3, 7)
            for m in held:
                await m.ack(confirm=True)  # still held by this consumer after the purge
            stats = await conn.queue_stats("p")
            assert (stats["accepted"], stats["acquired"], stats["ready"]) == (3, 0, 0)
            await _no_more(consumer, 0.3)
        assert await conn.purge_queue("p") == 0
        with pytest.raises(clients.QueueNotFound):
            await conn.purge_queue("no-such-queue")


async def test_delete_queue_ends_its_consumers(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("doomed")
        await conn.declare_queue("other")
        await conn.publish_batch("doomed", [b"a", b"b", b"c", b"d"])
        async with await clients.connect(broker.address) as conn2:
            consumer = conn2.consume("doomed", prefetch=2)
            await consumer.start()
            assert (await next_msg(consumer)).body == b"a"
            assert await conn.delete_queue("doomed") == 4
            with pytest.raises(clients.QueueNotFound):
                while True:  # a buffered message may come first; then the error
                    await next_msg(consumer, timeout=5)
            with pytest.raises(clients.QueueNotFound):
                await conn2.publish("doomed", b"x")
            with pytest.raises(clients.QueueNotFound):
                await conn.queue_stats("doomed")
            with pytest.raises(clients.QueueNotFound):
                await conn.delete_queue("doomed")
            assert await consumer.cancel() == 0
            # The connection itself is fine.
            assert await conn2.publish("other", b"y") == 0
        names = [q["queue"] for q in await conn.list_queues()]
        assert names == ["other"]
        # Re-declaring gives a new, empty queue.
        assert (await conn.declare_queue("doomed"))["created"] is True
        stats = await conn.queue_stats("doomed")
        assert (stats["ready"], stats["enqueued"], stats["next_position"]) == (0, 0, 0)


async def test_declare_is_idempotent_and_checks_settings(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        settings: dict[str, Any] = dict(
            max_length=10, overflow="drop-head", delivery_limit=4, message_ttl=2.5
        )
        assert await conn.declare_queue("d", **settings) == {"created": True}
        assert await conn.declare_queue("d", **settings) == {"created": False}
        for change in (
            {"max_length": 11},
            {"overflow": "reject-publish"},
            {"delivery_limit": 5},
            {"message_ttl": 2.0},
            {"durable": False},
            {"dead_letter": "d.dlq"},
        ):
            with pytest.raises(clients.QueueExists):
                await conn.declare_queue("d", **{**settings, **change})
        stats = await conn.queue_stats("d")
        assert (stats["max_length"], stats["overflow"], stats["delivery_limit"]) == (10, "drop-head", 4)
        assert stats["message_ttl_ms"] == 2500 and stats["dead_letter"] is None


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("q", {"delivery_limit": 0}),
        ("q", {"delivery_limit": -1}),
        ("q", {"overflow": "nonsense"}),
        ("q", {"dead_letter": "q"}),
        ("q", {"max_length": 0}),
        ("q", {"message_ttl": 0}),
        ("", {}),
    ],
)
async def test_invalid_declare_settings(broker: BrokerProcess, name: str, kwargs: dict[str, Any]) -> None:
    async with await clients.connect(broker.address) as conn:
        with pytest.raises(clients.InvalidArgument):
            await conn.declare_queue(name, **kwargs)
        assert await conn.list_queues() == []
        # The connection survives the error.
        assert (await conn.declare_queue("ok"))["created"] is True


# --- several consumers, prefetch --------------------------------------------------------------


async def test_competing_consumers_share_disjointly(broker: BrokerProcess) -> None:
    n = 90
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("shared")
        conns = [await clients.connect(broker.address) for _ in range(3)]
        try:
            consumers = [c.consume("shared", prefetch=4) for c in conns]
            for consumer in consumers:
                await consumer.start()
            assert (await conn.queue_stats("shared"))["consumers"] == 3
            await conn.publish_batch("shared", [b"w%d" % i for i in range(n)])
            got: list[list[clients.Message]] = [[], [], []]
            done = asyncio.Event()

            async def work(k: int) -> None:
                while not done.is_set():
                    msg = await consumers[k].get(timeout=0.2)
                    if msg is None:
                        continue
                    got[k].append(msg)
                    await asyncio.sleep(0.005)  # pacing: some work, so the others get a turn
                    await msg.ack(confirm=True)
                    if sum(map(len, got)) == n:
                        done.set()

            tasks = [asyncio.create_task(work(k)) for k in range(3)]
            await asyncio.wait_for(done.wait(), 15)
            await asyncio.wait_for(asyncio.gather(*tasks), 5)
            for consumer in consumers:
                await _no_more(consumer, 0.2)
                await consumer.cancel()
        finally:
            for c in conns:
                await c.close()
        positions = [[m.position for m in share] for share in got]
        flat = [p for share in positions for p in share]
        assert sorted(flat) == list(range(n)), "a message was lost or delivered twice"
        assert all(share for share in positions), f"a consumer got nothing: {list(map(len, got))}"
        for share in got:  # each consumer sees its share in queue order
            assert [m.position for m in share] == sorted(m.position for m in share)
            assert all(m.delivery_count == 0 for m in share)
            assert all(m.body == b"w%d" % m.position for m in share)
        stats = await conn.queue_stats("shared")
        assert (stats["ready"], stats["acquired"], stats["accepted"], stats["redelivered"]) == (0, 0, n, 0)


async def test_prefetch_limits_unsettled_messages(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("pf")
        await conn.publish_batch("pf", [b"%d" % i for i in range(20)])
        async with await clients.connect(broker.address) as c2:
            async with conn.consume("pf", prefetch=3) as a, c2.consume("pf", prefetch=5) as b:
                held_a = [await next_msg(a) for _ in range(3)]
                held_b = [await next_msg(b) for _ in range(5)]
                await _no_more(a)
                await _no_more(b, 0.1)
                stats = await conn.queue_stats("pf")
                assert (stats["acquired"], stats["ready"]) == (8, 12)
                assert not {m.position for m in held_a} & {m.position for m in held_b}
                # Settling one gives exactly one more.
                await held_a[0].ack(confirm=True)
                held_a = held_a[1:] + [await next_msg(a)]
                await _no_more(a)
                stats = await conn.queue_stats("pf")
                assert (stats["acquired"], stats["ready"], stats["accepted"]) == (8, 11, 1)
                await a.ack_many(held_a, confirm=True)
                await b.ack_many(held_b, confirm=True)
                more_a = [await next_msg(a) for _ in range(3)]
                more_b = [await next_msg(b) for _ in range(5)]
                await _no_more(a, 0.2)
                stats = await conn.queue_stats("pf")
                assert (stats["acquired"], stats["ready"], stats["accepted"]) == (8, 3, 9)
                assert len({m.position for m in more_a + more_b}) == 8
            # Cancelling released what the consumers held.
            stats = await wait_stats(conn, "pf", acquired=0)
            assert (stats["ready"], stats["redelivered"]) == (11, 8)


# --- stats -------------------------------------------------------------------------------------


async def test_stats_and_list_queues(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        assert await conn.list_queues() == []
        await conn.declare_queue("s.b", max_length=100, delivery_limit=3, dead_letter="s.a")
        await conn.declare_queue("s.a", durable=False, message_ttl=60)
        await conn.publish_batch("s.b", [b"1", b"2", b"3", b"4"])
        await conn.publish("s.a", b"x")
        async with conn.consume("s.b", prefetch=3) as consumer:
            msgs = [await next_msg(consumer) for _ in range(3)]
            await msgs[0].ack(confirm=True)
            await msgs[1].release(failed=True, confirm=True)  # back (count 1)
            await msgs[2].reject(confirm=True)  # to s.a
            stats = await wait_stats(conn, "s.b", acquired=2)
            assert stats["consumers"] == 1
            # The one broker owns the queue while its consumer is there (docs/design.md §6).
            owner = stats.pop("owner")
            assert owner is not None and owner.startswith(conn.node_id + "/")
            assert stats.pop("interested") == [owner]
            assert stats.pop("updating") is False  # no join update under way here
            assert stats.pop("partition") == 1  # a log of one partition: data partition 1
            # Not reserved by a range reader; its lowest ready position (docs/protocol.md).
            assert stats.pop("reserved_by") is None
            assert stats.pop("head") == 4
            assert stats == {
                "queue": "s.b",
                "ready": 0,
                "acquired": 2,
                "next_position": 4,
                "enqueued": 4,
                "accepted": 1,
                "redelivered": 1,
                "acquisitions": 5,  # 3, then 1 again and 3
                "failed_deliveries": 2,  # the failed release and the reject
                "given_back": 0,
                "dead_lettered": 1,
                "dropped": 0,
                "expired": 0,
                "purged": 0,
                "durable": True,
                "max_length": 100,
                "overflow": "reject-publish",
                "delivery_limit": 3,
                "dead_letter": "s.a",
                "message_ttl_ms": None,
                "retry": None,
                "retry_delay_ms": 0,
                "retry_max_ms": None,
                "ack_timeout_ms": None,
                "max_priority": None,
                "single_active_consumer": False,
                "dedupe_window_ms": 120000,
                "dead_letter_exchange": None,
                "dead_letter_routing_key": None,
                "expires_ms": None,  # (it never expires: no last use kept)
                "used_at": None,
                "timed_out": 0,
                "delayed": 0,
                "policy": None,
                "consumers": 1,
            }
        listed = await conn.list_queues()
        assert [q["queue"] for q in listed] == ["s.a", "s.b"]  # sorted by name
        by_name = {q["queue"]: q for q in listed}
        assert by_name["s.b"]["consumers"] == 0
        assert by_name["s.b"]["ready"] == 2 and by_name["s.b"]["acquired"] == 0
        a = by_name["s.a"]
        assert (a["ready"], a["enqueued"], a["durable"], a["message_ttl_ms"]) == (2, 2, False, 60000)
        assert a == await conn.queue_stats("s.a")
        with pytest.raises(clients.QueueNotFound):
            await conn.queue_stats("s.c")
