"""Consumers, credit and delivery: turning ready messages into Deliver frames.

A consumer's credit is ``prefetch`` minus the messages it holds (delivered, not yet
settled) minus what an acquire in flight may bring. When a queue has ready
messages and one of this broker's consumers of it has credit, the broker appends
``Acquire(queue, consumer, n)``; the applier picks the positions, and only when
that acquire is applied here (the :class:`Acquired` effect) are the messages read
from the store and delivered (guarantee 2). Consumers of one queue are served
round-robin.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clients.errors import BatonError, QueueNotFound
from cluster.events import Acquire, Expire, ReleaseAll
from cluster.node import Node
from cluster.state import Acquired, Effect, QueueGone, ReadyMore

if TYPE_CHECKING:
    from broker.session import Session

__all__ = ["Consumer", "Delivery"]

log = logging.getLogger("baton.delivery")


class Consumer:
    """One subscription of one session."""

    __slots__ = (
        "tag",
        "cid",
        "queue",
        "prefetch",
        "session",
        "held",
        "settling",
        "acquiring",
        "closed",
        "refill",
    )

    def __init__(self, tag: int, cid: str, queue: str, prefetch: int, session: "Session") -> None:
        self.tag = tag
        self.cid = cid  # replicated consumer id: "node/runtime/n"
        self.queue = queue
        self.prefetch = prefetch
        self.session = session
        self.held: set[int] = set()  # delivered, not yet settled
        self.settling = 0  # positions in an ack/release/reject not yet applied
        self.acquiring = 0  # count asked for by the acquire in flight (0: none)
        self.closed = False
        self.refill = max(1, prefetch // 2)  # acquire once this much credit is free

    @property
    def credit(self) -> int:
        # Messages being settled are not counted: the client has let go of them,
        # and counting them would cost a second log round trip per refill (the
        # next Acquire can ride in the same append as the Accept).
        return self.prefetch - len(self.held) - self.acquiring


class Delivery:
    """All consumers of this broker; reacts to applied effects."""

    def __init__(self, node: Node, chunk_bytes: int) -> None:
        self.node = node
        self._chunk_bytes = chunk_bytes
        self._next = 0
        self.by_queue: dict[str, list[Consumer]] = {}
        self.by_cid: dict[str, Consumer] = {}
        self._expiry_task: asyncio.Task[None] | None = None

    # -- consumers -------------------------------------------------------------------

    def add(self, queue: str, prefetch: int, session: "Session", tag: int) -> Consumer:
        """Register a consumer and start delivering to it.

        Raises:
            QueueNotFound: no such queue (in the state applied here).
        """
        if queue not in self.node.state.queues:
            raise QueueNotFound(f"queue {queue!r} does not exist")
        self._next += 1
        cid = f"{self.node.node_id}/{self.node.runtime_id}/{self._next}"
        c = Consumer(tag, cid, queue, prefetch, session)
        self.by_queue.setdefault(queue, []).append(c)
        self.by_cid[cid] = c
        self.pump(queue)
        return c

    def remove(
        self, c: Consumer, unread: list[int] | None = None
    ) -> asyncio.Future[dict[str, Any]] | None:
        """Stop a consumer; everything it holds goes back to the queue (those in
        ``unread``, never handed to the application, without a delivery attempt).

        Returns the ReleaseAll's completion, or None if the queue is gone.
        """
        if c.closed:
            return None
        c.closed = True
        self.by_cid.pop(c.cid, None)
        peers = self.by_queue.get(c.queue)
        if peers is not None and c in peers:
            peers.remove(c)
            if not peers:
                del self.by_queue[c.queue]
        if c.queue not in self.node.state.queues:
            return None
        positions = tuple(p for p in unread or () if type(p) is int and p in c.held)
        fut = self.node.submit(ReleaseAll(c.queue, c.cid, positions))
        fut.add_done_callback(_quiet)
        return fut

    # -- reacting to the log -------------------------------------------------------------

    def on_effects(self, effects: list[Effect]) -> None:
        """Called by the node after every applied (and stored) batch."""
        wake: set[str] = set()
        for e in effects:
            t = type(e)
            if t is Acquired:
                assert isinstance(e, Acquired)
                self._deliver(e)
            elif t is ReadyMore:
                assert isinstance(e, ReadyMore)
                if e.queue in self.by_queue:
                    wake.add(e.queue)
            elif t is QueueGone:
                assert isinstance(e, QueueGone)
                for c in list(self.by_queue.get(e.queue, ())):
                    c.closed = True
                    self.by_cid.pop(c.cid, None)
                    c.session.consumer_cancelled(c, QueueNotFound(f"queue {e.queue!r} was deleted"))
                self.by_queue.pop(e.queue, None)
        for q in wake:
            self.pump(q)

    def _deliver(self, e: Acquired) -> None:
        c = self.by_cid.get(e.consumer)
        if c is None or c.closed:
            if e.consumer.startswith(f"{self.node.node_id}/{self.node.runtime_id}/"):
                # Acquired for one of ours that has gone since: give it all back.
                self.node.submit(ReleaseAll(e.queue, e.consumer)).add_done_callback(_quiet)
            return
        messages = self.node.store.get_messages(e.qid, e.positions)
        out: list[list[Any]] = []
        size = 0
        for pos, count, m in zip(e.positions, e.counts, messages):
            if m is None:  # cannot happen unless the store lost data; never deliver junk
                log.error("queue %s position %d acquired but not in the store", e.queue, pos)
                continue
            c.held.add(pos)
            out.append([pos, count, m.body, m.headers, m.publish_time])
            size += m.size + 16
            if size >= self._chunk_bytes:
                c.session.deliver(c, out)
                out, size = [], 0
        if out:
            c.session.deliver(c, out)

    def pump(self, queue: str) -> None:
        """Ask for as many messages as this queue's consumers have credit for."""
        consumers = self.by_queue.get(queue)
        q = self.node.state.queues.get(queue)
        if not consumers or q is None:
            return
        budget = q.ready - sum(c.acquiring for c in consumers)
        if budget <= 0:
            return
        # Round-robin: start after the consumer served first last time.
        consumers.append(consumers.pop(0))
        for c in consumers:
            if budget <= 0:
                break
            if c.acquiring or c.closed or c.session.paused:
                continue
            credit = c.credit
            n = min(credit, budget)
            if n <= 0:
                continue
            # Refill in batches (as AMQP 1.0 credit refresh does): a busy consumer
            # waits until half its prefetch is free, so one acquire (one log round
            # trip) brings many messages instead of one per ack.
            if credit < c.refill <= budget and len(c.held) > 0:
                continue
            c.acquiring = n
            budget -= n
            self.node.submit(Acquire(queue, c.cid, n)).add_done_callback(
                _after_acquire(self, c)
            )

    def settled(self, c: Consumer) -> None:
        """Credit came back to ``c`` (its settle was applied)."""
        if not c.closed:
            self.pump(c.queue)

    # -- TTL -------------------------------------------------------------------------------

    def start_expiry(self, interval: float) -> None:
        self._expiry_task = asyncio.create_task(self._expiry_loop(interval), name="baton-expiry")

    async def stop(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
            try:
                await self._expiry_task
            except asyncio.CancelledError:
                pass

    async def _expiry_loop(self, interval: float) -> None:
        """Append Expire for queues whose oldest ready messages passed their TTL.

        The store has each message's enqueue time (the replicated clock at apply,
        non-decreasing along positions), so the expired ones are a prefix.
        """
        while True:
            await asyncio.sleep(interval)
            now = int(time.time() * 1000)
            for q in list(self.node.state.queues.values()):
                if q.message_ttl_ms is None or q.ready == 0:
                    continue
                head = min(q.returned[0] if q.returned else q.cursor, q.cursor)
                through = -1
                for pos, enqueued_at in self.node.store.scan(q.qid, head, 10_000):
                    if enqueued_at + q.message_ttl_ms > now:
                        break
                    through = pos
                if through >= head:
                    self.node.submit(Expire(q.name, through)).add_done_callback(_quiet)


def _after_acquire(d: Delivery, c: Consumer) -> Callable[[asyncio.Future[dict[str, Any]]], None]:
    def done(fut: asyncio.Future[dict[str, Any]]) -> None:
        c.acquiring = 0
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None and not isinstance(exc, QueueNotFound):
            log.warning("acquire for %s failed: %s", c.cid, exc)
        if not c.closed:
            # Always look again: a ReadyMore applied while this acquire was in
            # flight skipped this consumer.
            d.pump(c.queue)

    return done


def _quiet(fut: asyncio.Future[Any]) -> None:
    """Consume a fire-and-forget future's outcome (log unexpected failures)."""
    if fut.cancelled():
        return
    exc = fut.exception()
    if exc is not None and not isinstance(exc, BatonError):
        log.error("background command failed: %r", exc)
