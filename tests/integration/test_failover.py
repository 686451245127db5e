"""Client failover on a real three-broker cluster (one shared file: log): kill -9 of the
broker a client is connected to while it publishes or consumes; and the topology
listener seeing a broker go."""

from __future__ import annotations

import asyncio

import pytest

from batonmq import clients
from batonmq.cluster.errors import BatonError, NotAcquired
from batonmq.clients.topology import TopologyEvent, TopologyEventType
from tests.helpers import equal_digests, eventually, now
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration


def connected_to(conn: clients.Connection, cluster: list[BrokerProcess]) -> BrokerProcess:
    return next(b for b in cluster if b.address == conn.address)


async def test_publishes_are_enqueued_exactly_once_across_a_kill9(
    cluster: list[BrokerProcess],
) -> None:
    total, workers = 3000, 8
    conn = await clients.connect([b.address for b in cluster], timeout=5, failover_timeout=30)
    await conn.declare_queue("fo")
    victim = connected_to(conn, cluster)
    confirmed: dict[bytes, int] = {}
    failed: dict[bytes, BaseException] = {}

    async def publisher(w: int) -> None:
        for i in range(w, total, workers):
            body = b"m%05d" % i
            try:
                confirmed[body] = await asyncio.wait_for(conn.publish("fo", body), 60)
            except (BatonError, TimeoutError) as exc:
                failed[body] = exc

    async def killer() -> None:
        await eventually(lambda: now(len(confirmed)), f"{total // 5} publishes confirmed",
                         timeout=60, until=lambda n: n >= total // 5, interval=0.005)
        await asyncio.to_thread(victim.kill9)

    async with asyncio.timeout(90):
        await asyncio.gather(*(publisher(w) for w in range(workers)), killer())
    assert len(confirmed) + len(failed) == total  # every call returned or raised
    assert conn.failovers == 1 and conn.address != victim.address
    assert not any(isinstance(e, TimeoutError) for e in failed.values()), failed
    # Failover re-sent the unconfirmed publishes: none should have failed.
    assert not failed, {k: repr(v) for k, v in list(failed.items())[:5]}

    stats = await conn.queue_stats("fo")
    assert stats["ready"] == len(confirmed) == total, stats
    survivors = [b for b in cluster if b is not victim]
    await equal_digests(survivors)

    seen: dict[bytes, int] = {}
    async with conn.consume("fo", prefetch=500) as consumer:
        while len(seen) < stats["ready"]:
            batch = await consumer.get_many(500, timeout=20)
            assert batch, f"only {len(seen)} of {stats['ready']} messages came"
            for msg in batch:
                assert msg.body not in seen, f"{msg.body!r} enqueued twice"
                seen[msg.body] = msg.position
            await consumer.ack_many(batch)
    for body, position in confirmed.items():
        assert seen.get(body) == position, body  # the confirm named the real position
    await conn.close()


async def test_a_consumer_keeps_receiving_after_its_broker_is_killed(
    cluster: list[BrokerProcess],
) -> None:
    total = 200
    addresses = [b.address for b in cluster]
    conn = await clients.connect(addresses, timeout=5)
    victim = connected_to(conn, cluster)
    others = [a for a in addresses if a != victim.address]
    pub = await clients.connect(others, timeout=5)
    await pub.declare_queue("work")
    await pub.publish_batch("work", [b"w%03d" % i for i in range(total)])
    await conn.declare_queue("work")  # applied on its broker too once this returns

    acked: set[bytes] = set()
    async with conn.consume("work", prefetch=20) as consumer:
        held = None
        async with asyncio.timeout(60):
            async for msg in consumer:
                if held is None:
                    held = msg  # keep one unsettled across the failover
                    continue
                await msg.ack(confirm=True)
                acked.add(msg.body)
                if len(acked) == 50:
                    break
        assert held is not None
        await asyncio.to_thread(victim.kill9)

        async def failed_over() -> bool:
            return conn.failovers >= 1

        await eventually(failed_over, "the consumer's connection failed over", timeout=30)
        with pytest.raises(NotAcquired, match="failed over"):
            await held.ack()
        assert not held.settled
        async with asyncio.timeout(60):
            async for msg in consumer:  # re-subscribed on another broker
                if msg.body not in acked:
                    try:
                        await msg.ack(confirm=True)
                    except NotAcquired:
                        continue  # delivered just before a release; it comes again
                    acked.add(msg.body)
                if len(acked) == total:
                    break
    assert acked == {b"w%03d" % i for i in range(total)}
    stats = await pub.queue_stats("work")
    assert (stats["ready"], stats["acquired"]) == (0, 0), stats
    await conn.close()
    await pub.close()


async def test_topology_listener_sees_a_broker_leave(cluster: list[BrokerProcess]) -> None:
    conn = await clients.connect([b.address for b in cluster], timeout=5)
    events: list[TopologyEvent] = []
    watch = conn.watch_topology(events.append, interval=0.1, min_event_delay=0.2)

    async def got(kind: TopologyEventType, members: int) -> bool:
        return any(e.type is kind and len(e.new.instances) == members for e in events)

    await eventually(lambda: got(TopologyEventType.INIT, 3), "INIT with three brokers", timeout=10)
    assert events[0].type is TopologyEventType.INIT and events[0].old is None
    init = events[0].new
    assert init.leader in init.members and sum(i.local for i in init.instances) == 1
    victim = next(b for b in cluster if b.address != conn.address)
    await asyncio.to_thread(victim.kill9)
    await eventually(lambda: got(TopologyEventType.CHANGED, 2), "CHANGED to two brokers", timeout=40)
    changed = next(e for e in events if e.type is TopologyEventType.CHANGED)
    assert changed.old is not None and changed.new.view > changed.old.view
    assert victim.address not in {i.address for i in changed.new.instances}
    assert [e.type for e in events].count(TopologyEventType.INIT) == 1
    await watch.aclose()
    assert not watch.running
    await conn.close()


async def test_keepalive_fails_over_from_a_broker_that_stopped_answering(
    cluster: list[BrokerProcess],
) -> None:
    # A paused broker keeps the TCP connection open and answers nothing: only the
    # client's keepalive can tell. An unanswered Ping makes it fail over.
    conn = await clients.connect([b.address for b in cluster], timeout=5, keepalive=0.5)
    victim = connected_to(conn, cluster)
    await conn.declare_queue("ka")
    victim.pause()
    try:
        await eventually(lambda: now(conn.failovers), "failed over from the paused broker",
                         timeout=30, until=lambda n: n >= 1)
        assert conn.address != victim.address and not conn.closed
        async with asyncio.timeout(30):
            await conn.publish("ka", b"after")
        assert (await conn.queue_stats("ka"))["ready"] == 1
    finally:
        victim.resume()
    await conn.close()
