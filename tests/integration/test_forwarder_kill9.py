"""The two-step forwarding between data partitions under kill -9 (docs/design.md §16),
real brokers on a log of a control partition and four data partitions: (a) a publish
through an exchange fanned out over the four partitions and (b) dead letters of a queue
routed through a dead-letter exchange to queues on all four partitions, each while the
forwarding broker (the leader of the source partition) is killed -9 mid-stream.
Afterwards every message is in every target queue exactly once: the contents are
compared, not counted.

A round kills the forwarder while messages stream, then restarts it; rounds go on until
the survivors' counters show that a kill fell between the two steps (an entry applied
on its target but not yet dropped at home, sent again by the next forwarder: counted
``duplicate-forward``, or a dead letter routed twice: ``duplicate-route``). So each run
exercises the deduplication, and a forwarder that skipped it (or forwarded before it
recorded) would leave a duplicate or a gap that the contents show.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from batonmq import clients
from tests.helpers import eventually, equal_digests, topology
from tests.integration.conftest import BrokerProcess, started
from tests.integration.test_partition_dead_letters import N, parted_brokers

# (Up to ROUNDS kill rounds of ~14 s each: more than the suite's 120 s default.)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PER_ROUND = 150
#: Kills tried until one falls between the two steps (each round ~14 s; two CI runs took
#: all four of an earlier bound).
ROUNDS = 8


@pytest.fixture
def three(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    yield from started(parted_brokers(tmp_path, 3))


async def _leader_of(brokers: list[BrokerProcess], partition: int) -> BrokerProcess:
    """The broker leading data ``partition`` in an established view, by a live broker."""
    by_node = {b.node_id: b for b in brokers}

    async def leader() -> str | None:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                row = (await topology(b.address))["partitions"][partition - 1]
                lead: str | None = row["leader"]
                return lead
        return None

    key = await eventually(leader, f"a leader of partition {partition}", timeout=40)
    assert key is not None
    return by_node[key.split("/")[0]]


async def _counted(address: str, reasons: tuple[str, ...]) -> int:
    rows = (await topology(address))["partitions"]
    return sum(row["ignored"].get(r, 0) for row in rows for r in reasons)


async def _all_members(b: BrokerProcess) -> None:
    await eventually(
        lambda: topology(b.address), f"{b.node_id} a member of every partition", timeout=40,
        until=lambda t: t["member"] and all(r["member"] for r in t["partitions"]),
    )


async def _ready(address: str, name: str) -> int:
    async with await clients.connect(address, timeout=5) as c:
        n: int = (await c.queue_stats(name))["ready"]
        return n


async def _contents(address: str, name: str) -> list[bytes]:
    """Every message of ``name`` (acked): until none comes for a second."""
    seen: list[bytes] = []
    async with await clients.connect(address, timeout=5) as c:
        async with c.consume(name, prefetch=500) as consumer:
            while True:
                batch = await consumer.get_many(500, timeout=1.0)  # (1 s quiet: all came)
                if not batch:
                    break
                seen += [m.body for m in batch]
                await consumer.ack_many(batch, confirm=True)
    return seen


async def _settled(address: str) -> None:
    """Nothing left to forward on any data partition, as ``address`` applied it."""
    await eventually(
        lambda: topology(address), "every forward and dead letter delivered", timeout=60,
        until=lambda t: all(
            r["forwards_pending"] == 0 and r["dead_letters_in_flight"] == 0
            for r in t["partitions"]
        ),
    )


async def _between_steps(address: str) -> bool:
    """Has a target taken an entry of partition 1 that partition 1 still keeps (applied
    there, ForwardDone not yet), as ``address`` applied both?"""
    rows = (await topology(address))["partitions"]
    first = {t: f for t, f, _ in rows[0]["forwarding"]["to"]}
    return any(
        home == 1 and taken > first.get(row["partition"], taken)
        for row in rows[1:] for home, taken in row["forwarding"]["from"]
    )


async def _kill_between_steps(forwarder: BrokerProcess, survivor: str) -> None:
    """Kill ``forwarder`` -9, at a moment when it is stopped between the two steps if
    one is caught within some tries (else at the last one: still mid-stream)."""
    for _ in range(60):
        await asyncio.to_thread(forwarder.pause)
        # (Paced on purpose: the survivor applies what the stopped one appended.)
        await asyncio.sleep(0.15)
        if await _between_steps(survivor):
            break
        await asyncio.to_thread(forwarder.resume)
        await asyncio.sleep(0.05)  # (paced: it forwards a little more)
    else:
        await asyncio.to_thread(forwarder.pause)
    await asyncio.to_thread(forwarder.kill9)


async def _rounds(
    brokers: list[BrokerProcess],
    targets: list[str],
    stream: Callable[[str, list[bytes]], Awaitable[None]],
    reasons: tuple[str, ...],
) -> None:
    """Kill partition 1's forwarder -9 mid-stream, round after round, until a kill fell
    between the two steps; after each, every target holds that round's messages
    exactly once."""
    for r in range(ROUNDS):
        forwarder = await _leader_of(brokers, 1)
        survivor = next(b for b in brokers if b is not forwarder)
        bodies = [b"r%d-%04d" % (r, i) for i in range(PER_ROUND)]
        streaming = asyncio.ensure_future(stream(survivor.address, bodies))
        try:
            # Forwarding under way: the last partition's queue is taking this round's.
            await eventually(
                lambda: _ready(survivor.address, targets[-1]), "forwarding under way",
                timeout=30, until=lambda n: n >= PER_ROUND // 5, interval=0.01,
            )
            await _kill_between_steps(forwarder, survivor.address)
            await streaming
        finally:
            streaming.cancel()
        await _settled(survivor.address)
        for name in targets:
            got = await _contents(survivor.address, name)
            assert sorted(got) == bodies, (
                f"round {r}, {name}: {len(got)} of {len(bodies)};"
                f" missing {sorted(set(bodies) - set(got))[:5]},"
                f" twice {sorted(b for b in set(got) if got.count(b) > 1)[:5]}"
            )
        fell_between = await _counted(survivor.address, reasons)
        await asyncio.to_thread(forwarder.restart)
        await _all_members(forwarder)
        if fell_between:
            break
    else:
        raise AssertionError(f"in {ROUNDS} kills none fell between the two steps ({reasons})")
    await equal_digests(brokers)


async def test_a_fan_out_reaches_every_partition_once_with_its_forwarder_killed_mid_stream(
    three: list[BrokerProcess],
) -> None:
    names = [f"f{k}" for k in range(1, N + 1)]
    async with await clients.connect(three[0].address, timeout=5) as conn:
        await conn.declare_exchange("fan", "fanout")
        for k, name in enumerate(names, 1):
            await conn.declare_queue(name, partition=k)
            await conn.bind_queue(name, "fan")

    async def publish(address: str, bodies: list[bytes]) -> None:
        async with await clients.connect(address, timeout=5) as c:
            for i in range(0, len(bodies), 10):  # ten publishers at a time
                done = await asyncio.gather(*(c.publish_to("fan", "", b) for b in bodies[i:i + 10]))
                assert all(sorted(d.queues) == names for d in done), done

    await _rounds(three, names, publish, ("duplicate-forward",))


async def test_dead_letters_reach_every_partition_once_with_their_forwarder_killed_mid_stream(
    three: list[BrokerProcess],
) -> None:
    names = [f"d{k}" for k in range(1, N + 1)]
    async with await clients.connect(three[0].address, timeout=5) as conn:
        await conn.declare_exchange("dlx", "fanout")
        for k, name in enumerate(names, 1):
            await conn.declare_queue(name, partition=k)
            await conn.bind_queue(name, "dlx")
        # On partition 1 with d1: its dead letters go to d1 here and to d2..d4 forwarded.
        await conn.declare_queue("src", partition=1, dead_letter_exchange="dlx")

    async def reject(address: str, bodies: list[bytes]) -> None:
        async with await clients.connect(address, timeout=5) as c:
            await c.publish_batch("src", bodies)
            left = len(bodies)
            async with c.consume("src", prefetch=20) as consumer:
                while left:
                    batch = await consumer.get_many(10, timeout=30)
                    assert batch, f"{left} of {len(bodies)} not delivered"
                    await consumer.reject_many(batch, confirm=True)
                    left -= len(batch)

    await _rounds(three, names, reject, ("duplicate-forward", "duplicate-route"))
