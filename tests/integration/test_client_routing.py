"""The native client routes each queue's commands to a replica of its data partition
(docs/client.md "Routing"; docs/design.md §16, "Clients route to replicas"): four real
brokers on a file log of two data partitions with groups of two, a client given ONE
broker's address — outside one of the partitions' groups — declares, publishes,
consumes and reads stats on both partitions; a replica it uses is killed -9 and it
goes on (nothing lost, checked by bodies); the blocking client does the same; a
cluster without groups opens no other connection."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from batonmq import clients
from batonmq.clients import sync
from tests.helpers import eventually, topology
from tests.integration.conftest import BrokerProcess, brokers_of, started
from tests.integration.test_admin import TOOL_HEADERS
from tests.integration.test_forwarding import _forwarded

pytestmark = pytest.mark.integration


@pytest.fixture
def grouped(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Four brokers, two data partitions, groups of two, replaced after 3 s out."""
    yield from started(brokers_of(
        tmp_path, f"file:{tmp_path / 'shared-log'}", 4,
        ["--partitions", "2", "--replicas", "2", "--replace-after-ms", "3000",
         "--admin-listen", "127.0.0.1:0"],
    ))


def _settled(t: dict[str, Any]) -> bool:
    """Both groups of two caught-up live replicas, and each broker in one group."""
    groups = t.get("groups") or []
    if len(groups) != 2 or any(
        g["replicas"] is None or len(g["replicas"]) != 2 or g["joining"]
        or g["live_replicas"] != 2 or len(g["addresses"]) != 2 for g in groups
    ):
        return False
    return len({n for g in groups for n in g["replicas"]}) == 4


async def _groups(address: str) -> list[dict[str, Any]]:
    top = await eventually(lambda: topology(address), "the groups settled", timeout=60,
                           until=_settled)
    return sorted(top["groups"], key=lambda g: g["partition"])


async def _forwards(brokers: list[BrokerProcess]) -> dict[str, float]:
    """Every broker's forwarding counters, summed (broker/peers.py)."""
    total: dict[str, float] = {"errors": 0.0}
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=10), headers=TOOL_HEADERS
    ) as http:
        for b in brokers:
            for kind, n in (await _forwarded(http, b)).items():
                total[kind] = total.get(kind, 0.0) + n
    return total


async def _drain(consumer: clients.Consumer, want: set[bytes], seen: set[bytes]) -> None:
    """Take and ack messages until every body of ``want`` was seen."""
    while not want <= seen:
        batch = await consumer.get_many(100, timeout=20)
        assert batch, f"{len(want - seen)} of {len(want)} bodies never came"
        seen.update(m.body for m in batch)
        await consumer.ack_many(batch)


async def test_one_address_reaches_both_partitions_and_survives_a_killed_replica(
    grouped: list[BrokerProcess],
) -> None:
    groups = await _groups(grouped[0].address)
    by_node = {b.node_id: b for b in grouped}
    # The client knows one broker only: a replica of partition 2, not of partition 1.
    entry = by_node[groups[1]["replicas"][0]]
    assert entry.node_id not in groups[0]["replicas"]
    async with await clients.connect(entry.address, timeout=5) as conn:
        for k in (1, 2):
            q = f"q{k}"
            await conn.declare_queue(q, partition=k)
            await conn.publish_batch(q, [b"%s-a%03d" % (q.encode(), i) for i in range(50)])
            for i in range(50):
                await conn.publish(q, b"%s-b%03d" % (q.encode(), i))
            stats = await conn.queue_stats(q)
            assert (stats["partition"], stats["ready"]) == (k, 100), stats
        # A queue placed by the cluster, wherever it lands.
        await conn.declare_queue("auto")
        declared = await _forwards(grouped)
        assert set(declared) <= {"errors", "kind=declare"}, declared
        await conn.publish(q, b"one more")
        assert (await conn.queue_stats("auto"))["ready"] == 0
        # Partition 1's commands went to a replica of partition 1, opened on the way.
        assert set(conn.replica_connections) <= set(groups[0]["addresses"])
        assert conn.replica_connections, "no connection to partition 1's replicas"
        for k in (1, 2):
            q = f"q{k}"
            want = {b"%s-%s%03d" % (q.encode(), s, i) for s in (b"a", b"b") for i in range(50)}
            if k == 2:
                want.add(b"one more")
            seen: set[bytes] = set()
            async with conn.consume(q, prefetch=40) as consumer:
                await _drain(consumer, want, seen)
            assert seen == want
            assert (await conn.queue_stats(q))["ready"] == 0
        # Once the queues were declared (a new queue is declared through the broker the
        # client knows, which places it, and forwards it when outside its group), nothing
        # went through a broker's forwarding: every command reached a replica.
        assert await _forwards(grouped) == declared

        # Kill -9 the replica of partition 1 the client uses; publishing and consuming
        # go on through the other one.
        (used,) = conn.replica_connections
        victim = next(b for b in grouped if b.address == used)
        published: set[bytes] = set()
        seen = set()
        async with conn.consume("q1", prefetch=20) as consumer:
            for i in range(100):
                body = b"before-%03d" % i
                await conn.publish("q1", body)
                published.add(body)
            await _drain(consumer, {b"before-000"}, seen)

            async def publish_one(body: bytes) -> None:
                await conn.publish("q1", body)
                published.add(body)

            # Publishes in flight to the replica when it dies: it is stopped first, so
            # that none is answered, then killed; they are sent again to the other.
            await asyncio.to_thread(victim.pause)
            publishing = asyncio.gather(*(publish_one(b"after-%03d" % i) for i in range(300)))
            await asyncio.to_thread(victim.kill9)
            await publishing
            await _drain(consumer, published, seen)
        assert seen == published
        assert victim.address not in conn.replica_connections
        assert not conn.closed


def test_the_blocking_client_routes_too(grouped: list[BrokerProcess]) -> None:
    groups = asyncio.run(_groups(grouped[0].address))
    by_node = {b.node_id: b for b in grouped}
    entry = by_node[groups[1]["replicas"][0]]
    with sync.connect(entry.address, timeout=5) as conn:
        conn.declare_queue("s1", partition=1)
        bodies = {b"s%02d" % i for i in range(30)}
        for body in sorted(bodies):
            conn.publish("s1", body)
        assert conn.queue_stats("s1")["ready"] == 30
        assert set(conn.replica_connections) <= set(groups[0]["addresses"])
        assert conn.replica_connections
        seen: set[bytes] = set()
        with conn.consume("s1", prefetch=10) as consumer:
            for msg in consumer.iter(timeout=10):
                seen.add(msg.body)
                msg.ack()
                if seen == bodies:
                    break
        assert seen == bodies


@pytest.fixture
def ungrouped(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Two brokers, two data partitions, no group size: each applies both."""
    yield from started(brokers_of(
        tmp_path, f"file:{tmp_path / 'shared-log'}", 2, ["--partitions", "2"]
    ))


async def test_a_cluster_without_groups_opens_no_other_connection(
    ungrouped: list[BrokerProcess],
) -> None:
    async with await clients.connect(ungrouped[1].address, timeout=5) as conn:
        for k in (1, 2):
            await conn.declare_queue(f"f{k}", partition=k)
            await conn.publish(f"f{k}", b"x")
            assert (await conn.queue_stats(f"f{k}"))["ready"] == 1
            async with conn.consume(f"f{k}") as consumer:
                msg = await consumer.get(timeout=10)
                assert msg is not None and msg.body == b"x"
                await msg.ack()
        assert conn.replica_connections == []


async def test_a_range_reader_reads_exactly_once_while_its_partition_moves(
    grouped: list[BrokerProcess],
) -> None:
    groups = await _groups(grouped[0].address)
    by_node = {b.node_id: b for b in grouped}
    first, second = (by_node[n] for n in groups[0]["replicas"])
    entry = by_node[groups[1]["replicas"][0]]  # outside partition 1's group
    bodies = [b"r%04d" % i for i in range(600)]
    read: list[bytes] = []
    position = 0

    async def read_some(conn: clients.Connection, upto: int) -> None:
        nonlocal position
        while position < upto:
            messages, nxt = await conn.read_range("ranged", position, min(upto, position + 40))
            read.extend(m[1] for m in messages)
            assert await conn.accept_through("ranged", nxt, "reader") == len(messages)
            position = nxt

    async with await clients.connect(entry.address, timeout=5) as conn:
        await conn.declare_queue("ranged", partition=1)
        await conn.publish_batch("ranged", bodies)
        await conn.reserve("ranged", "reader")
        await read_some(conn, 200)
        (used,) = conn.replica_connections
        # The replica the reader uses is killed: it goes on through the other, and the
        # partition moves: the planner replaces the killed one by another broker.
        victim, survivor = (first, second) if used == first.address else (second, first)
        await asyncio.to_thread(victim.kill9)
        await read_some(conn, 300)
        top = await eventually(
            lambda: topology(entry.address), "partition 1 moved off the killed broker",
            timeout=60, until=lambda t: any(
                g["partition"] == 1 and g["replicas"] is not None
                and victim.node_id not in g["replicas"] and len(g["replicas"]) == 2
                and not g["joining"] and g["live_replicas"] == 2 for g in t["groups"]),
        )
        newcomer = by_node[next(n for g in top["groups"] if g["partition"] == 1
                                for n in g["replicas"] if n != survivor.node_id)]
        await read_some(conn, 400)
        # Now only the broker the partition moved to is left of its group.
        await asyncio.to_thread(survivor.kill9)
        await read_some(conn, len(bodies))
        assert newcomer.address in conn.replica_connections or newcomer is entry
        assert read == bodies  # each once, in order
        stats = await conn.queue_stats("ranged")
        assert (stats["ready"], stats["reserved_by"]) == (0, "reader"), stats


async def test_a_consumer_follows_its_queue_when_its_broker_leaves_the_group(
    grouped: list[BrokerProcess],
) -> None:
    groups = await _groups(grouped[0].address)
    by_node = {b.node_id: b for b in grouped}
    entry = by_node[groups[1]["replicas"][0]]  # outside partition 1's group
    async with await clients.connect(entry.address, timeout=5) as conn:
        await conn.declare_queue("moving", partition=1)
        first = {b"m%03d" % i for i in range(100)}
        await conn.publish_batch("moving", sorted(first))
        seen: set[bytes] = set()
        async with conn.consume("moving", prefetch=10) as consumer:
            await _drain(consumer, {b"m000"}, seen)
            (used,) = conn.replica_connections
            leaver = next(b for b in grouped if b.address == used)
            # Stopped for longer than the replace delay: the partition moves to another
            # broker; back, the leaver is in no group of 1 and cancels its consumers
            # ("served by other brokers now"): this one subscribes again elsewhere.
            await asyncio.to_thread(leaver.pause)
            try:
                await eventually(
                    lambda: topology(entry.address), "partition 1 moved off the paused broker",
                    timeout=60, until=lambda t: any(
                        g["partition"] == 1 and g["replicas"] is not None
                        and leaver.node_id not in g["replicas"] and not g["joining"]
                        and g["live_replicas"] == 2 for g in t["groups"]),
                )
            finally:
                await asyncio.to_thread(leaver.resume)
            second = {b"n%03d" % i for i in range(100)}
            await conn.publish_batch("moving", sorted(second))
            await _drain(consumer, first | second, seen)
        assert seen == first | second
        assert (await conn.queue_stats("moving"))["ready"] == 0


@pytest.fixture
def three_then_four(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Four brokers of two data partitions, groups of two; only three started."""
    brokers = brokers_of(
        tmp_path, f"file:{tmp_path / 'shared-log'}", 4,
        ["--partitions", "2", "--replicas", "2", "--replace-after-ms", "3000"],
    )
    try:
        for b in brokers[:3]:
            b.start()
        yield brokers
    finally:
        for b in brokers:
            b.stop()


def _held(t: dict[str, Any], node: str) -> list[int]:
    return [g["partition"] for g in t.get("groups") or []
            if g["replicas"] is not None and node in g["replicas"] + g["joining"]]


async def test_consumers_follow_a_partition_the_planner_moves_to_a_new_broker(
    three_then_four: list[BrokerProcess],
) -> None:
    brokers = three_then_four
    # Three brokers, two groups of two: one broker holds both partitions.
    top = await eventually(
        lambda: topology(brokers[0].address), "the groups settled", timeout=60,
        until=lambda t: len(t.get("groups") or []) == 2 and all(
            g["replicas"] is not None and len(g["replicas"]) == 2 and not g["joining"]
            and g["live_replicas"] == 2 for g in t["groups"]),
    )
    both = next(b for b in brokers[:3] if _held(top, b.node_id) == [1, 2])
    # The client is connected to it: both queues are served over that one connection.
    async with await clients.connect(both.address, timeout=5) as conn:
        want: dict[str, set[bytes]] = {}
        seen: dict[str, set[bytes]] = {}
        consumers = {}
        for k in (1, 2):
            q = f"c{k}"
            await conn.declare_queue(q, partition=k)
            want[q] = {b"%s-%03d" % (q.encode(), i) for i in range(50)}
            await conn.publish_batch(q, sorted(want[q]))
            seen[q] = set()
            consumers[q] = await conn.consume(q, prefetch=10).__aenter__()
            await _drain(consumers[q], {b"%s-000" % q.encode()}, seen[q])
        assert conn.replica_connections == []
        # A fourth broker: the planner moves one partition off the broker holding two;
        # that broker cancels its consumers of the moved partition's queue ("served by
        # other brokers now"), which subscribe again on a current replica.
        await asyncio.to_thread(brokers[3].start)
        await eventually(
            lambda: topology(both.address), "a partition moved off the broker holding two",
            timeout=60, until=lambda t: len(_held(t, both.node_id)) == 1 and all(
                not g["joining"] and not g["leaving"] and g["live_replicas"] == 2
                for g in t["groups"]),
        )
        for k in (1, 2):
            q = f"c{k}"
            more = {b"%s-late-%03d" % (q.encode(), i) for i in range(50)}
            await conn.publish_batch(q, sorted(more))
            want[q] |= more
            await _drain(consumers[q], want[q], seen[q])
            assert seen[q] == want[q]
            await consumers[q].__aexit__(None, None, None)
        assert len(conn.replica_connections) == 1
