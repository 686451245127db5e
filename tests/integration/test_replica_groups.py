"""Replica groups (docs/design.md §16): four real brokers on a file log of two data
partitions with groups of two — each broker applies control and only its partitions,
stores only them, shows its groups in the topology and metrics; a replica killed -9
is replaced after the replace delay, by a broker that catches up by the partition's
update, and nothing is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from batonmq import clients
from batonmq.clients import wire
from tests.helpers import eventually, topology, wait_stats
from tests.integration.conftest import BrokerProcess
from tests.integration.test_bad_clients import RawClient

pytestmark = pytest.mark.integration


def _settled(t: dict[str, Any], live: int) -> bool:
    """Every group of two caught-up live replicas, no one joining, and the partitions
    spread one per broker over ``live`` brokers."""
    groups = t.get("groups") or []
    if len(groups) != 2 or any(
        g["replicas"] is None or len(g["replicas"]) != 2 or g["joining"]
        or g["live_replicas"] != 2 for g in groups
    ):
        return False
    per: dict[str, int] = {}
    for g in groups:
        for n in g["replicas"]:
            per[n] = per.get(n, 0) + 1
    return max(per.values()) - min(per.values()) <= 1 and len(per) == min(4, live)


async def _groups(address: str, live: int = 4) -> list[dict[str, Any]]:
    top = await eventually(lambda: topology(address), "the groups settled", timeout=60,
                           until=lambda t: _settled(t, live))
    return list(top["groups"])


async def test_each_broker_applies_and_stores_only_its_partitions(
    grouped: list[BrokerProcess], tmp_path: Path
) -> None:
    groups = await _groups(grouped[0].address)
    by_node = {b.node_id: b for b in grouped}
    for b in grouped:
        mine = sorted(g["partition"] for g in groups if b.node_id in g["replicas"])
        top = await eventually(
            lambda: topology(b.address), f"{b.node_id} applying only {mine}", timeout=30,
            until=lambda t: [p["partition"] for p in t["partitions"]] == mine
            and t["status"] == "ok",
        )
        assert all(p["member"] for p in top["partitions"]), top["partitions"]
        stores = sorted(int(p.name[len("store-p"):]) for p in (tmp_path / b.node_id).iterdir()
                        if p.name.startswith("store-p"))
        assert stores == mine, (b.node_id, stores, mine)
    # A queue on each partition, used through one of its replicas.
    for g in groups:
        k = g["partition"]
        replica = by_node[g["replicas"][0]]
        async with await clients.connect(replica.address, timeout=5) as conn:
            await conn.declare_queue(f"q{k}", partition=k)
            await conn.publish_batch(f"q{k}", [b"m%d" % i for i in range(50)])
            await wait_stats(conn, f"q{k}", ready=50)
        # A broker outside the group does not apply it: it forwards to the group
        # (broker/peers.py, tests/integration/test_forwarding.py).
        outside = next(b for b in grouped if b.node_id not in g["replicas"])
        raw = await asyncio.to_thread(RawClient, outside.address)
        try:
            raw.send(wire.Publish(raw.next_corr(), f"q{k}", b"through the broker outside", {}))
            reply = await asyncio.to_thread(raw.read)
        finally:
            raw.sock.close()
        assert isinstance(reply, wire.Ok) and reply.result == {"position": 50}, reply
        # The native client given that broker's address routes to a replica instead
        # (docs/client.md "Routing").
        async with await clients.connect(outside.address, timeout=5) as conn:
            assert await conn.publish(f"q{k}", b"through a broker outside the group") == 51
            assert conn.replica_connections


async def test_a_killed_replica_is_replaced_and_nothing_is_lost(
    grouped: list[BrokerProcess], tmp_path: Path
) -> None:
    groups = await _groups(grouped[0].address)
    by_node = {b.node_id: b for b in grouped}
    g = groups[0]
    k = g["partition"]
    victim, survivor = by_node[g["replicas"][0]], by_node[g["replicas"][1]]
    async with await clients.connect(survivor.address, timeout=5) as conn:
        await conn.declare_queue("kept", partition=k)
        await conn.publish_batch("kept", [b"k%03d" % i for i in range(200)])
        await wait_stats(conn, "kept", ready=200)
    await asyncio.to_thread(victim.kill9)
    others = [b for b in grouped if b is not victim]
    top = await eventually(
        lambda: topology(survivor.address), f"partition {k} replaced its killed replica",
        timeout=60,
        until=lambda t: any(
            x["partition"] == k and x["replicas"] is not None
            and victim.node_id not in x["replicas"] and len(x["replicas"]) == 2
            and not x["joining"] and x["live_replicas"] == 2 for x in t["groups"]
        ),
    )
    new = next(x for x in top["groups"] if x["partition"] == k)
    newcomer = by_node[next(n for n in new["replicas"] if n != survivor.node_id)]
    assert newcomer in others
    async with await clients.connect(newcomer.address, timeout=5) as conn:
        await wait_stats(conn, "kept", timeout=30, ready=200)
        seen: set[bytes] = set()
        async with conn.consume("kept", prefetch=100) as consumer:
            while len(seen) < 200:
                batch = await consumer.get_many(100, timeout=10)
                assert batch, f"{len(seen)} of 200"
                seen.update(m.body for m in batch)
                await consumer.ack_many(batch)
        assert seen == {b"k%03d" % i for i in range(200)}
    # The killed broker comes back: it is in no group of k any more, so it deletes k's
    # data at start (the planner may give it a partition again later, to even them out).
    await asyncio.to_thread(victim.restart)
    since_restart = victim.output().rsplit("== test: start 2", 1)[-1]
    assert f"data partition {k}'s store deleted" in since_restart
    groups = await _groups(victim.address)
    mine = sorted(x["partition"] for x in groups if victim.node_id in x["replicas"])
    await eventually(
        lambda: topology(victim.address), f"the restarted broker applying {mine}",
        timeout=60, until=lambda t: t["status"] == "ok"
        and [p["partition"] for p in t["partitions"]] == mine,
    )
    stores = sorted(int(p.name[len("store-p"):]) for p in (tmp_path / victim.node_id).iterdir()
                    if p.name.startswith("store-p"))
    assert stores == mine
