"""Replica groups (docs/design.md §16): four real brokers on a file log of two data
partitions with groups of two — each broker applies control and only its partitions,
stores only them, shows its groups in the topology and metrics; a replica killed -9
is replaced after the replace delay, by a broker that catches up by the partition's
update, and nothing is lost. Six brokers in groups of three (the load test's layout):
each applies, stores and shows in its metrics only its group's partition."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rocksdict import AccessType, Options, Rdict

from batonmq import clients
from batonmq.clients import wire
from tests.helpers import eventually, topology, wait_stats
from tests.integration.conftest import (
    BrokerProcess,
    applies_only_its_groups,
    settled_groups,
    stored_partitions,
)
from tests.integration.test_admin import TOOL_HEADERS, admin_of
from tests.integration.test_bad_clients import RawClient

pytestmark = pytest.mark.integration


async def _groups(address: str, live: int = 4) -> list[dict[str, Any]]:
    return await settled_groups(address, partitions=2, size=2, live=live)


async def test_each_broker_applies_and_stores_only_its_partitions(
    grouped: list[BrokerProcess], tmp_path: Path
) -> None:
    groups = await _groups(grouped[0].address)
    by_node = {b.node_id: b for b in grouped}
    for b in grouped:
        await applies_only_its_groups(b, groups)
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
    assert stored_partitions(victim.data_dir) == mine


def _bodies(store: Path, prefix: bytes) -> int:
    """Messages in the store at ``store`` (read-only, beside its running broker) whose
    body starts with ``prefix``: its ``m`` rows (store/rocks.py) unpacked."""
    db = Rdict(str(store), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        return sum(1 for key, value in db.items(from_key=b"m")
                   if key[:1] == b"m" and msgpack.unpackb(value)[3].startswith(prefix))
    finally:
        db.close()


async def _metrics(b: BrokerProcess) -> dict[str, Any]:
    async with aiohttp.ClientSession(headers=TOOL_HEADERS) as http:
        async with http.get(f"{admin_of(b)}/metrics") as r:
            text = await r.text()
    return {f.name: f for f in text_string_to_metric_families(text)}


async def test_six_brokers_apply_control_and_only_their_groups_partitions(
    six_grouped: list[BrokerProcess],
) -> None:
    """The load test's acceptance layout without the load (6 brokers, N = 2, R = 3):
    every broker applies control and exactly the data partitions of its group — by its
    metrics, its topology and its data dir —, exactly three brokers apply each
    partition, and a queue's messages are stored by its group's brokers only."""
    groups = await settled_groups(six_grouped[0].address, partitions=2, size=3, live=6)
    by_node = {b.node_id: b for b in six_grouped}
    for g in groups:
        k = g["partition"]
        async with await clients.connect(by_node[g["replicas"][0]].address, timeout=5) as conn:
            await conn.declare_queue(f"six-q{k}", partition=k)
            await conn.publish_batch(f"six-q{k}", [b"six-p%d-%03d" % (k, i) for i in range(150)])
            await wait_stats(conn, f"six-q{k}", ready=150)
    appliers: dict[int, list[str]] = {1: [], 2: []}
    for b in six_grouped:
        mine = await applies_only_its_groups(b, groups)
        families = await _metrics(b)
        assert families["baton_member"].samples[0].value == 1, b.node_id  # control's view
        assert families["baton_applied_offset"].samples[0].value > 0, b.node_id
        here = {int(s.labels["partition"]): s.value
                for s in families["baton_partition_applied_here"].samples}
        assert here == {k: (1 if k in mine else 0) for k in (1, 2)}, (b.node_id, here, mine)
        for k in mine:
            appliers[k].append(b.node_id)
    assert {k: sorted(v) for k, v in appliers.items()} == {
        g["partition"]: sorted(g["replicas"]) for g in groups
    }
    assert all(len(v) == 3 for v in appliers.values()), appliers
    # Each replica stores all of its partition's queue, and no store holds the other's.
    for b in six_grouped:
        for k in stored_partitions(b.data_dir):
            store = b.data_dir / f"store-p{k}"
            await eventually(lambda: asyncio.to_thread(_bodies, store, b"six-p%d-" % k),
                             f"{b.node_id} storing partition {k}'s messages", timeout=30,
                             until=lambda n: n == 150)
            assert await asyncio.to_thread(_bodies, store, b"six-p%d-" % (3 - k)) == 0
        assert await asyncio.to_thread(_bodies, b.data_dir / "store", b"six-p") == 0
