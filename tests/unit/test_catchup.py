"""The joiner's side of an update (cluster/update.py) on the reference store: messages
the log dead-letters before their body arrives, and what is locked meanwhile."""

from __future__ import annotations

import asyncio

import msgpack

from batonmq.cluster.events import Accept, Acquire, DeclareQueue, Enqueue, Event, Interest, Origin, Reject
from batonmq.cluster.log.memory import MemoryLog
from batonmq.cluster.node import Node
from batonmq.cluster.effects import Effect
from batonmq.cluster.state import State
from batonmq.cluster.update import Catchup
from batonmq.store.memory import MemoryStore
from tests.helpers import eventually, now
from tests.unit.test_join_events import _cluster


class _Feed:
    """Events of member n1/r1 applied to several states at the same offsets."""

    def __init__(self, state: State, offset: int) -> None:
        self.states = [state]
        self.offset = offset
        self.seq = 10

    def apply(self, ev: Event) -> list[list[Effect]]:
        self.seq += 1
        outs = []
        for s in self.states:
            out: list[Effect] = []
            s.apply(self.offset, Origin("n1", "r1", self.seq, 5), ev, out)
            outs.append(out)
        self.offset += 1
        return outs


def _raw(body: bytes) -> bytes:  # the store's encoding: [enqueued_at, publish_time, headers, body]
    return msgpack.packb((5, 5, {"k": 1}, body), use_bin_type=True)


async def test_waiting_moves_resolve_when_the_body_arrives() -> None:
    donor, offset = _cluster()
    feed = _Feed(donor, offset)
    feed.apply(DeclareQueue("dlq"))
    feed.apply(DeclareQueue("q", dead_letter="dlq"))
    feed.apply(Enqueue("q", ((b"a", {}), (b"b", {}), (b"c", {}))))
    feed.apply(Interest("q", True))

    node = Node("n3", MemoryLog(), MemoryStore())
    catchup = Catchup(node)
    node.catchup = catchup
    await node.install(donor.applied, donor.full_snapshot())
    catchup.pending = {name: q.qid for name, q in node.state.queues.items()}
    q, dlq = node.state.queues["q"], node.state.queues["dlq"]
    assert node.locked("q") and node.locked("dlq")

    feed.states.append(node.state)
    for ev in (Acquire("q", "n1/r1/1", 2), Reject("q", "n1/r1/1", (1,)), Accept("q", "n1/r1/1", (0,))):
        out = feed.apply(ev)[1]
        async with node.apply_lock:
            await node.applier.persist(out, feed.offset - 1)
    # Position 1 of q was dead-lettered to dlq position 0 before its body came.
    assert catchup.dst_pending == {(dlq.qid, 0): (q.qid, 1)}
    catchup.pending.pop("dlq")
    assert node.locked("dlq")  # done, but a message moved into it is still awaited

    # The member streams q back to front as it was at the capture: 2, 1, 0.
    async with node.apply_lock:
        catchup._take(q.qid, [[2, _raw(b"c")], [1, _raw(b"b")], [0, _raw(b"a")]])
    got = node.store.get_messages(q.qid, [0, 1, 2]) + node.store.get_messages(dlq.qid, [0])
    assert got[0] is None and got[1] is None  # accepted; dead-lettered: not in q
    assert got[2] is not None and got[2].body == b"c"
    moved = got[3]
    assert moved is not None and moved.body == b"b"
    assert moved.headers["x-death-reason"] == "rejected" and moved.headers["k"] == 1
    assert not catchup.dst_pending and not node.locked("dlq")


async def test_a_joiner_whose_join_key_was_forgotten_appends_its_join_again() -> None:
    """The view dropped the joiner before its update was done, which forgot its join key:
    before it asks another member for the rest it puts its Join on the log again, with
    the same key, or no member would serve it (cluster/member_proof.py)."""
    node = Node("n1", MemoryLog(), MemoryStore(), heartbeat_ms=50)
    await node.start()
    catchup = Catchup(node)
    catchup.pending = {"q": 0}  # a queue whose messages are still to come
    task = asyncio.create_task(catchup.run())
    try:
        # It formed the cluster alone (no Join, no key): what a dropped joiner finds.
        await eventually(
            lambda: now(node.state.membership.join_keys.get(node.key)),
            "the joiner's key recorded again",
            until=lambda k: k == node.join_key.public,
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await node.stop()


async def test_a_dead_letter_routed_through_an_exchange_before_its_body_arrived() -> None:
    from batonmq.cluster.events import Bind, DeclareExchange

    donor, offset = _cluster()
    feed = _Feed(donor, offset)
    feed.apply(DeclareExchange("dlx", "fanout"))
    for name in ("d1", "d2"):
        feed.apply(DeclareQueue(name))
        feed.apply(Bind(name, "dlx"))
    feed.apply(DeclareQueue("q", dead_letter_exchange="dlx"))
    feed.apply(Enqueue("q", ((b"a", {}),)))
    feed.apply(Interest("q", True))

    node = Node("n3", MemoryLog(), MemoryStore())
    catchup = Catchup(node)
    node.catchup = catchup
    await node.install(donor.applied, donor.full_snapshot())
    catchup.pending = {name: q.qid for name, q in node.state.queues.items()}
    feed.states.append(node.state)
    for ev in (Acquire("q", "n1/r1/1", 1), Reject("q", "n1/r1/1", (0,))):
        out = feed.apply(ev)[1]
        async with node.apply_lock:
            await node.applier.persist(out, feed.offset - 1)
    q, d1, d2 = (node.state.queues[n] for n in ("q", "d1", "d2"))
    assert set(catchup.dst_pending) == {(d1.qid, 0), (d2.qid, 0)}
    async with node.apply_lock:
        catchup._take(q.qid, [[0, _raw(b"a")]])
    # Both copies written once the body came, with the first death's headers.
    for m in node.store.get_messages(d1.qid, [0]) + node.store.get_messages(d2.qid, [0]):
        assert m is not None and m.body == b"a" and m.headers["k"] == 1
        assert m.headers["x-first-death-queue"] == "q" and m.headers["x-death-exchange"] == "dlx"
    assert node.store.get_messages(q.qid, [0]) == [None]
    assert not catchup.dst_pending


async def test_dead_letters_in_flight_to_another_partition_reach_a_joiner() -> None:
    """A data partition's dead letters for queues elsewhere wait in its outbox until
    forwarded; a joiner of the partition gets their bodies in its update (so that it
    can forward them if it comes to lead), and one dead-lettered after the capture
    waits for its body as a move does."""
    from batonmq.cluster.forwarding import OUTBOX_NAME, OUTBOX_QID
    from batonmq.cluster.update import capture, update_frames
    from batonmq.clients import wire

    from tests.unit.test_placement import _flagged

    flagged = _flagged()  # (a split log's partitions have the flag partitions on)
    state, offset = flagged.state, flagged.offset + 1
    donor = Node("n1", MemoryLog(), MemoryStore())
    await donor.install(state.applied, state.full_snapshot())
    joiner = Node("n3", MemoryLog(), MemoryStore())
    for n in (donor, joiner):
        n.state.data_partition = 1
        n.state.index.away = n.state.forwards
    feed = _Feed(donor.state, offset)

    async def apply(*events: Event) -> None:
        for ev in events:
            outs = feed.apply(ev)
            for n, out in zip((donor, joiner)[: len(outs)], outs):
                async with n.apply_lock:
                    await n.applier.persist(out, feed.offset - 1)

    await apply(
        DeclareQueue("q", dead_letter="elsewhere"),
        Enqueue("q", ((b"a", {}), (b"b", {}), (b"c", {}))),
        Interest("q", True), Acquire("q", "n1/r1/1", 3), Reject("q", "n1/r1/1", (0,)),
    )
    assert donor.store.get_messages(OUTBOX_QID, [0])[0] is not None
    cap = await capture(donor, donor.state.applied, None, True)
    frames = [f async for f in update_frames(cap, 1, live=donor.state.queues.get)]
    cap.close()
    catchup = Catchup(joiner)
    joiner.catchup = catchup
    await joiner.install(donor.state.applied, donor.state.full_snapshot())
    catchup.pending = {name: q.qid for name, q in joiner.state.queues.items()}
    catchup.pending[OUTBOX_NAME] = OUTBOX_QID
    feed.states.append(joiner.state)
    await apply(Reject("q", "n1/r1/1", (1,)))  # after the capture: its body comes with q's
    assert catchup.dst_pending == {(OUTBOX_QID, 1): (joiner.state.queues["q"].qid, 1)}
    async with joiner.apply_lock:
        for f in frames:
            if isinstance(f, wire.UpdateFront):
                catchup._take(f.qid, f.entries)
    assert [f.queue for f in frames if isinstance(f, wire.UpdateQueue)] == ["q", OUTBOX_NAME]
    boxed = joiner.store.get_messages(OUTBOX_QID, [0, 1])
    assert [m.body if m else None for m in boxed] == [b"a", b"b"]
    assert boxed[0] is not None and boxed[0].headers["x-death-reason"] == "rejected"
    assert not catchup.dst_pending
