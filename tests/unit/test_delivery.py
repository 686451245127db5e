"""The broker's delivery on real nodes (file log, reference store): ownership hand-offs.

Two nodes share one file log in this process; the client sessions are recorders (the
Replier protocol's delivery side), since what is checked is what the owner delivers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from batonmq.broker.delivery import Delivery
from batonmq.cluster.events import DeclareQueue, Enqueue, Interest
from batonmq.cluster.log import open_log
from batonmq.cluster.node import Node
from batonmq.store.memory import MemoryStore
from tests.unit.test_node import eventually


class Recorder:
    """A client session that reads everything: the delivered bodies, in order."""

    candidate = ""
    closed = False
    paused = False

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def send(self, frame: Any) -> None:
        pass

    def deliver(self, tag: int, messages: list[list[Any]]) -> None:
        self.bodies.extend(m[2] for m in messages)

    def consumer_cancelled(self, tag: int, exc: Exception) -> None:
        raise AssertionError(f"consumer cancelled: {exc}")


async def _node(name: str, url: str) -> Node:
    node = Node(name, await open_log(url), MemoryStore())
    await node.start()
    return node


async def _stop(*nodes: Node) -> None:
    for n in nodes:
        await n.leave()
        await n.stop()
        await n.log.close()
        n.store.close()


async def _caught_up(*nodes: Node) -> None:
    end = await nodes[0].log.end_offset()
    await eventually(lambda: all(n.state.applied >= end - 1 for n in nodes), "caught up")


async def test_a_handoff_that_finds_no_one_else_interested_leaves_the_owner_delivering(
    tmp_path: Path,
) -> None:
    # The owner's slice ends while another broker is interested, so it appends a
    # Handoff; that broker's consumers leave before the Handoff applies. The Handoff
    # then changes nothing (no OwnerChanged): the owner must deliver again, not wait
    # forever for an ownership change that never comes.
    url = f"file:{tmp_path / 'log'}"
    a, b = await _node("a", url), await _node("b", url)
    delivery = Delivery(a, chunk_bytes=1 << 16, time_slice_ms=60_000)
    a.listener = delivery.on_effects
    try:
        await a.submit(DeclareQueue("q"))
        session = Recorder()
        delivery.add("q", prefetch=100, session=session, tag=1)  # type: ignore[arg-type]
        await b.submit(Interest("q", True))
        await b.submit(Interest("q", False))  # gone again before the Handoff is applied
        await _caught_up(a, b)
        assert a.state.queues["q"].owner == a.key
        delivery.hand_off("q")  # what the slice loop does when the slice is over
        await _caught_up(a, b)
        await eventually(lambda: "q" not in delivery._handing_off, "the handoff settled")
        assert a.state.queues["q"].owner == a.key
        await a.submit(Enqueue("q", ((b"after", {}),)))
        await eventually(lambda: session.bodies == [b"after"], "delivered after the handoff")
    finally:
        await _stop(a, b)


async def test_a_late_acquire_delivers_only_what_the_consumer_still_holds_once_current(
    tmp_path: Path,
) -> None:
    # An acquire applied long after it was asked for (the broker was paused or cut off
    # meanwhile) waits until the broker has applied the log to its end, then delivers
    # only the messages the consumer still holds: what went back to the queue (here:
    # settled by the consumer since, as a view change that dropped the broker would)
    # is not handed out again.
    from batonmq.cluster.effects import Acquired
    from batonmq.cluster.events import Accept

    url = f"file:{tmp_path / 'log'}"
    a = await _node("a", url)
    delivery = Delivery(a, chunk_bytes=1 << 16, time_slice_ms=60_000)
    delivery._late_after = -1.0  # every acquire is late
    a.listener = delivery.on_effects
    try:
        await a.submit(DeclareQueue("q"))
        await a.submit(Enqueue("q", ((b"m0", {}), (b"m1", {}), (b"m2", {}))))
        session = Recorder()
        c = delivery.add("q", prefetch=100, session=session, tag=1)  # type: ignore[arg-type]
        await eventually(lambda: session.bodies == [b"m0", b"m1", b"m2"], "delivered once current")
        q = a.state.queues["q"]
        assert [q.acquired.get(p) for p in (0, 1, 2)] == [c.cid] * 3
        await a.submit(Accept("q", c.cid, (0, 2)))  # 0 and 2 are no longer c's
        stale = Acquired("q", q.qid, c.cid, [0, 1, 2], [0, 0, 0], [0, 0, 0])
        session.bodies.clear()
        await delivery._deliver_when_current(stale, c)
        assert session.bodies == [b"m1"]
        assert not c.catching_up
    finally:
        await a.leave()
        await a.stop()
        await a.log.close()
        a.store.close()


async def test_a_broker_that_leaves_is_not_fenced_when_the_view_drops_it(
    tmp_path: Path, caplog: Any,
) -> None:
    # A clean stop leaves the view (Leave); the view that drops the broker can be applied
    # before its node stops. That is no fencing: nothing to close, no ERROR in the log.
    url = f"file:{tmp_path / 'log'}"
    a, b = await _node("a", url), await _node("b", url)
    delivery = Delivery(a, chunk_bytes=1 << 16, time_slice_ms=60_000)
    a.listener = delivery.on_effects
    fenced: list[bool] = []
    delivery.on_fenced = lambda: fenced.append(True)
    try:
        await _caught_up(a, b)
        await eventually(lambda: a.key in b.state.membership.member_set, "a in b's view")
        await a.leave()
        await eventually(lambda: a.key not in a.state.membership.member_set,
                         "a applied the view without it")
        assert fenced == []
        assert "dropped from the cluster's view" not in caplog.text
    finally:
        await _stop(a, b)
