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

import pytest

from batonmq import clients
from batonmq.clients import sync
from tests.helpers import eventually, topology
from tests.integration.conftest import BrokerProcess, brokers_of, started

pytestmark = pytest.mark.integration


@pytest.fixture
def grouped(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Four brokers, two data partitions, groups of two, replaced after 3 s out."""
    yield from started(brokers_of(
        tmp_path, f"file:{tmp_path / 'shared-log'}", 4,
        ["--partitions", "2", "--replicas", "2", "--replace-after-ms", "3000"],
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
            await asyncio.to_thread(victim.kill9)
            for i in range(200):
                body = b"after-%03d" % i
                await conn.publish("q1", body)
                published.add(body)
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
