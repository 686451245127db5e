"""Operating replica groups (docs/operations.md "Replica groups"): ``baton partitions
move``, ``rebalance`` and ``replicas`` on real brokers of a file log of two data
partitions — a move completes (the target applies the partition, the source deletes its
copy, every message is still there), a fifth broker gets partitions, a group size of 1
then 2 trims and adds replicas; each mistake is refused in one sentence. A group short of
a majority of live replicas is a warning in /readyz and ``baton health`` (the broker stays
ready) and counts in ``baton_partitions_under_replicated``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batonmq import clients
from batonmq.cluster.errors import InvalidArgument
from tests.helpers import eventually, topology, wait_stats
from tests.integration.conftest import BrokerProcess, brokers_of, started
from tests.integration.test_admin import ADMIN, TOOL_HEADERS, admin_of, get_json
from tests.integration.test_cli import baton

pytestmark = pytest.mark.integration


def _steady(t: dict[str, Any], size: int) -> bool:
    """Every group of ``size`` caught-up live replicas, nothing joining or leaving, and
    the view's brokers holding within one partition of each other (the planner's
    rebalancing done: it moves nothing more)."""
    groups = t.get("groups") or []
    if len(groups) != 2 or not all(
        g["replicas"] is not None and len(g["replicas"]) == size and not g["joining"]
        and not g["leaving"] and g["live_replicas"] == size for g in groups
    ):
        return False
    held = [sum(i["node_id"] in g["replicas"] for g in groups) for i in t["instances"]]
    return max(held) - min(held) <= 1


async def _groups(address: str, size: int = 2) -> dict[int, dict[str, Any]]:
    top = await eventually(lambda: topology(address), f"groups of {size} settled",
                           timeout=60, until=lambda t: _steady(t, size))
    return {g["partition"]: g for g in top["groups"]}


async def _fill(address: str, queue: str, k: int, n: int) -> None:
    async with await clients.connect(address, timeout=5) as conn:
        await conn.declare_queue(queue, partition=k)
        await conn.publish_batch(queue, [b"%s-%04d" % (queue.encode(), i) for i in range(n)])
        await wait_stats(conn, queue, ready=n)


async def _drain(address: str, queue: str, n: int) -> set[bytes]:
    async with await clients.connect(address, timeout=5) as conn:
        await wait_stats(conn, queue, timeout=30, ready=n)
        seen: set[bytes] = set()
        async with conn.consume(queue, prefetch=100) as consumer:
            while len(seen) < n:
                batch = await consumer.get_many(100, timeout=10)
                assert batch, f"{len(seen)} of {n}"
                seen.update(m.body for m in batch)
                await consumer.ack_many(batch)
        return seen


def _stores(b: BrokerProcess) -> list[int]:
    return sorted(int(p.name[len("store-p"):]) for p in b.data_dir.iterdir()
                  if p.name.startswith("store-p"))


@pytest.fixture
def fifth(tmp_path: Path, grouped: list[BrokerProcess]) -> Iterator[BrokerProcess]:
    """A fifth broker of ``grouped``'s cluster, not started."""
    b = BrokerProcess(tmp_path / "node-5", log_url=f"file:{tmp_path / 'shared-log'}",
                      node_id="node-5", extra=grouped[0].extra)
    try:
        yield b
    finally:
        b.stop()


async def test_a_move_completes_and_keeps_every_message(
    grouped: list[BrokerProcess], fifth: BrokerProcess
) -> None:
    # The target is a fifth broker, which holds nothing: the move leaves the partitions
    # balanced (1 or 0 per broker), so the leader's planner has nothing to move back.
    await asyncio.to_thread(fifth.start)
    groups = await _groups(grouped[0].address)
    by_node = {b.node_id: b for b in grouped}
    source = by_node[groups[1]["replicas"][0]]
    target = fifth
    await _fill(source.address, "moved", 1, 300)
    assert 1 in _stores(source) and _stores(target) == []

    r = await asyncio.to_thread(
        baton, "partitions", "move", "1", "--from", source.node_id, "--to", target.node_id,
        "--wait", "--timeout", "90", "--broker", grouped[0].address, timeout=120,
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"{target.node_id} joins its group and catches up" in r.stderr
    assert "data partition 1 moved: its replicas are" in r.stderr, r.stderr

    top = await topology(grouped[0].address)
    g1 = next(g for g in top["groups"] if g["partition"] == 1)
    assert target.node_id in g1["replicas"] and source.node_id not in g1["replicas"]
    await eventually(lambda: topology(target.address), "the target applying partition 1",
                     timeout=30, until=lambda t: 1 in [p["partition"] for p in t["partitions"]])
    await eventually(lambda: topology(source.address), "the source without partition 1",
                     timeout=30,
                     until=lambda t: 1 not in [p["partition"] for p in t["partitions"]])
    await eventually(lambda: asyncio.to_thread(_stores, source), "store-p1 deleted",
                     timeout=30, until=lambda s: 1 not in s)
    assert 1 in _stores(target)
    seen = await _drain(target.address, "moved", 300)
    assert seen == {b"moved-%04d" % i for i in range(300)}


async def test_moves_that_do_not_fit_are_refused_in_one_sentence(
    grouped: list[BrokerProcess],
) -> None:
    groups = await _groups(grouped[0].address)
    g = groups[2]
    inside, other = g["replicas"]
    outside = next(b.node_id for b in grouped if b.node_id not in g["replicas"])
    async with await clients.connect(grouped[0].address, timeout=5) as conn:
        with pytest.raises(InvalidArgument, match="data partition 7 does not exist"):
            await conn.move_partition(7, inside, outside)
        with pytest.raises(InvalidArgument, match=f"{outside} is not a replica of partition 2"):
            await conn.move_partition(2, outside, inside)
        with pytest.raises(InvalidArgument, match=f"{other} is already in partition 2's group"):
            await conn.move_partition(2, inside, other)
        with pytest.raises(InvalidArgument, match="node-9 is not a live member"):
            await conn.move_partition(2, inside, "node-9")
        with pytest.raises(InvalidArgument, match="a replica group has 1 to 15 brokers"):
            await conn.set_replicas(16)
        moving = await conn.move_partition(2, inside, outside)
        assert moving.joining == [outside] and moving.leaving == [inside]
        with pytest.raises(InvalidArgument, match="partition 2 has a move in flight"):
            await conn.move_partition(2, other, inside)
    # The same mistake through the command line: one line, no traceback.
    r = await asyncio.to_thread(
        baton, "partitions", "move", "2", "--from", outside, "--to", "node-9",
        "--broker", grouped[1].address,
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "is not a live member" in r.stderr or "has a move in flight" in r.stderr or (
        "is not a replica of partition 2" in r.stderr), r.stderr


async def test_rebalance_gives_a_fifth_broker_partitions(
    grouped: list[BrokerProcess], fifth: BrokerProcess
) -> None:
    groups = await _groups(grouped[0].address)
    dry = await asyncio.to_thread(
        baton, "partitions", "rebalance", "--dry-run", "--broker", grouped[0].address)
    assert dry.returncode == 0 and "nothing to move" in dry.stderr, (dry.stdout, dry.stderr)
    replica = next(b for b in grouped if b.node_id == groups[1]["replicas"][0])
    await _fill(replica.address, "kept", 1, 100)  # (through a broker that applies it)
    # Four partitions more: eight replicas over four brokers, then a fifth joins.
    r = await asyncio.to_thread(
        baton, "partitions", "add", "--count", "4", "--broker", grouped[0].address)
    assert r.returncode == 0, r.stderr
    await asyncio.to_thread(fifth.start)
    r = await asyncio.to_thread(
        baton, "partitions", "rebalance", "--broker", grouped[0].address)
    assert r.returncode == 0, (r.stdout, r.stderr)
    # Its moves (or none: the leader's planner may have started them first).
    for line in r.stdout.splitlines():
        assert line.startswith("moving data partition "), r.stdout

    def balanced(t: dict[str, Any]) -> bool:
        gs = t.get("groups") or []
        if len(gs) != 4 or any(g["joining"] or g["leaving"] or g["replicas"] is None
                               or len(g["replicas"]) != 2 for g in gs):
            return False
        held = {f"node-{i}": 0 for i in range(1, 6)}
        for g in gs:
            for n in g["replicas"]:
                held[n] += 1
        return max(held.values()) - min(held.values()) <= 1

    top = await eventually(lambda: topology(fifth.address), "five brokers balanced",
                           timeout=90, until=balanced)
    mine = sorted(g["partition"] for g in top["groups"] if "node-5" in g["replicas"])
    assert mine
    await eventually(lambda: asyncio.to_thread(_stores, fifth), "node-5's stores",
                     timeout=30, until=lambda s: s == mine)
    dry = await asyncio.to_thread(
        baton, "partitions", "rebalance", "--dry-run", "--broker", fifth.address)
    assert dry.returncode == 0 and "nothing to move" in dry.stderr, dry.stderr
    holder = next(g for g in top["groups"] if g["partition"] == 1)
    address = next(b.address for b in [*grouped, fifth]
                   if b.node_id == holder["replicas"][0])
    assert await _drain(address, "kept", 100) == {b"kept-%04d" % i for i in range(100)}


async def test_replicas_one_then_two(grouped: list[BrokerProcess]) -> None:
    groups = await _groups(grouped[0].address)
    replica = next(b for b in grouped if b.node_id == groups[2]["replicas"][0])
    await _fill(replica.address, "q", 2, 120)
    r = await asyncio.to_thread(baton, "partitions", "replicas", "1",
                                "--broker", grouped[0].address)
    assert r.returncode == 0, r.stderr
    assert "replica groups of 1 broker(s) (were 2)" in r.stderr, r.stderr
    ones = await _groups(grouped[0].address, 1)
    for b in grouped:
        mine = sorted(k for k, g in ones.items() if b.node_id in g["replicas"])
        await eventually(lambda: asyncio.to_thread(_stores, b), f"{b.node_id}'s stores",
                         timeout=30, until=lambda s: s == mine)
    listed = await asyncio.to_thread(baton, "partitions", "list",
                                     "--broker", grouped[0].address)
    assert "(1/1 live)" in listed.stdout, listed.stdout
    r = await asyncio.to_thread(baton, "partitions", "replicas", "2",
                                "--broker", grouped[1].address)
    assert r.returncode == 0 and "(were 1)" in r.stderr, r.stderr
    twos = await _groups(grouped[0].address, 2)
    by_node = {b.node_id: b for b in grouped}
    for n in twos[2]["replicas"]:
        seen = set()
        async with await clients.connect(by_node[n].address, timeout=5) as conn:
            stats = await wait_stats(conn, "q", timeout=30, ready=120)
            seen.add(stats["ready"])
        assert seen == {120}
    newest = next(n for n in twos[2]["replicas"] if n not in ones[2]["replicas"])
    assert await _drain(by_node[newest].address, "q", 120) == {
        b"q-%04d" % i for i in range(120)
    }


@pytest.fixture
def kept_three(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Three brokers with admin listeners, 2 data partitions, groups of 2; a broker out
    of the view is not replaced for 10 minutes."""
    yield from started(brokers_of(
        tmp_path, f"file:{tmp_path / 'shared-log'}", 3,
        [*ADMIN, "--partitions", "2", "--replicas", "2", "--replace-after-ms", "600000"],
    ))


async def test_a_group_short_of_a_majority_is_warned_and_the_broker_stays_ready(
    kept_three: list[BrokerProcess],
) -> None:
    nodes = [b.node_id for b in kept_three]

    def spread(t: dict[str, Any]) -> bool:
        if not _steady(t, 2):
            return False
        held = [sum(n in g["replicas"] for g in t["groups"]) for n in nodes]
        return max(held) - min(held) <= 1

    top = await eventually(lambda: topology(kept_three[0].address), "groups spread",
                           timeout=60, until=spread)
    groups = {g["partition"]: g for g in top["groups"]}
    by_node = {b.node_id: b for b in kept_three}
    # The broker in both groups watches; one of the others goes: its group has 1 of 2.
    watcher = by_node[next(n for n in nodes if all(n in g["replicas"] for g in groups.values()))]
    victim = by_node[groups[1]["replicas"][0] if groups[1]["replicas"][0] != watcher.node_id
                     else groups[1]["replicas"][1]]
    short = next(k for k, g in groups.items() if victim.node_id in g["replicas"])
    fine = 3 - short
    base = admin_of(watcher)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10),
                                     headers=TOOL_HEADERS) as http:
        _, ready = await get_json(http, base + "/readyz")
        assert ready["warnings"] == [], ready
        text = await (await http.get(base + "/metrics")).text()
        assert _gauge(text, "baton_partitions_under_replicated") == 0
        await asyncio.to_thread(victim.kill9)

        async def probe() -> tuple[int, Any]:
            return await get_json(http, base + "/readyz")

        status, ready = await eventually(
            probe, "/readyz warning of the short group", timeout=60,
            until=lambda r: any(f"data partition {short}:" in w for w in r[1]["warnings"]))
        assert ready["warnings"] == [
            f"data partition {short}: 1 of 2 replicas live, fewer than a majority"], ready
        assert not any(f"data partition {fine}:" in w for w in ready["warnings"])
        await eventually(probe, "the watcher ready", timeout=30,
                         until=lambda r: r[0] == 200 and r[1]["ready"])
        text = await (await http.get(base + "/metrics")).text()
        assert _gauge(text, "baton_partitions_under_replicated") == 1
    r = await asyncio.to_thread(baton, "health", "--broker", watcher.address)
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert "is ready" in lines[0], lines
    assert lines[1:] == [
        f"warning: data partition {short} has 1 of 2 replicas live"
        f" ({','.join(groups[short]['replicas'])}), fewer than a majority: its queues"
        " wait until enough are back"], lines


def _gauge(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return float(family.samples[0].value)
    raise AssertionError(f"no metric {name}")
