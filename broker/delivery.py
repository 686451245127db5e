"""Consumers, credit and delivery: turning ready messages into Deliver frames.

A consumer's credit is ``prefetch`` minus the messages it holds (delivered, not yet
settled) minus what an acquire in flight may bring. When a queue has ready
messages and one of this broker's consumers of it has credit, the broker appends
``Acquire(queue, consumer, n)``; the applier picks the positions, and only when
that acquire is applied here (the :class:`Acquired` effect) are the messages read
from the store and delivered (guarantee 2). Consumers of one queue are served
round-robin.

A late acquire: when an acquire took longer than half the suspicion time between its
submission and its application here, this broker may have been paused or cut off in
between, and the others may have dropped it from the view meanwhile, giving those
messages to another consumer — a drop that is further on in the log than the acquire.
Its messages are then delivered only once this broker has applied the log up to where
it ends now, and only those still held by the consumer (the rest went back with the
view change); without that, a broker resumed after a pause handed out messages another
consumer had already accepted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from batonmq.broker.peers import elsewhere
from batonmq.broker.reply import Replier
from batonmq.cluster.errors import BatonError, QueueNotFound
from batonmq.clients.wire import Expired
from batonmq.cluster.events import (
    Acquire,
    Expire,
    ExpireQueue,
    Handoff,
    Interest,
    Release,
    ReleaseAll,
)
from batonmq.cluster.node import Node
from batonmq.cluster.queue_state import QueueState
from batonmq.cluster.update import wait_applied
from batonmq.cluster.results import Counted, Owner, Settled
from batonmq.cluster.effects import (
    Acquired,
    Effect,
    MembersChanged,
    OwnerChanged,
    QueueGone,
    ReadyMore,
)

__all__ = ["Consumer", "Delivery", "RELEASE_PAUSE"]

#: Seconds a consumer is offered nothing after it released the last messages it held:
#: a consumer that releases and then leaves (its Cancel follows within a moment) must
#: not be handed them straight back, raising their acquired count for nothing. One that
#: still holds others goes on at once (a busy consumer releasing poison messages must
#: not slow down).
RELEASE_PAUSE = 0.1

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
        "counters",
        "sent",
        "paused_until",
        "timeout",
        "deadlines",
        "asked_at",
        "catching_up",
        "counted",
        "exclusive",
    )

    def __init__(
        self,
        tag: int,
        cid: str,
        queue: str,
        prefetch: int,
        session: Replier,
        counters: bool = False,
        timeout: float = 0.0,
    ) -> None:
        self.tag = tag
        self.cid = cid  # replicated consumer id: "node/runtime/n"
        self.queue = queue
        self.prefetch = prefetch
        self.session = session
        # Delivered, not yet settled: position -> how many messages were sent to
        # this consumer before it (tells a cancel which ones the client had received).
        self.held: dict[int, int] = {}
        self.sent = 0  # messages sent to this consumer so far
        self.counters = counters  # deliver the acquired count too (Subscribe option)
        self.paused_until = 0.0  # after a release (monotonic; 0: not paused)
        # Ack timeout (s; 0: none) and, with one, each held message's deadline
        # (monotonic): this broker releases what passes it as a failed delivery.
        self.timeout = timeout
        self.deadlines: dict[int, float] = {}
        self.settling = 0  # positions in an ack/release/reject not yet applied
        self.acquiring = 0  # count asked for by the acquire in flight (0: none)
        self.asked_at = 0.0  # when that acquire was submitted (monotonic)
        self.catching_up = False  # a late acquire waits for the log (module doc)
        self.closed = False
        self.refill = max(1, prefetch // 2)  # acquire once this much credit is free
        # AMQP's view of consumers on this broker (docs/amqp.md): whether it counts as
        # a consumer (not a channel's Basic.Get helper, not cancelled) for the
        # consumer count, Queue.Delete's if-unused and an exclusive Basic.Consume; and
        # whether it was started exclusive (no other consumer may join it).
        self.counted = True
        self.exclusive = False

    def settled_positions(self, positions: list[int]) -> None:
        """These held messages were settled: they have no deadline any more."""
        if self.timeout:
            for p in positions:
                self.deadlines.pop(p, None)

    def touch(self, positions: list[int]) -> tuple[int, list[int]]:
        """The application still works on these: their ack timeout starts again.

        Returns:
            How many it holds, and the positions it does not.
        """
        held = [p for p in positions if p in self.held]
        if self.timeout:
            deadline = time.monotonic() + self.timeout
            for p in held:
                self.deadlines[p] = deadline
        return len(held), [p for p in positions if p not in self.held]

    @property
    def credit(self) -> int:
        # Messages being settled are not counted: the client has let go of them,
        # and counting them would cost a second log round trip per refill (the
        # next Acquire can ride in the same append as the Accept).
        return self.prefetch - len(self.held) - self.acquiring


class Delivery:
    """All consumers of this broker; reacts to applied effects."""

    def __init__(self, node: Node, chunk_bytes: int, time_slice_ms: int = 200) -> None:
        self.node = node
        self._chunk_bytes = chunk_bytes
        self._next = 0
        self.by_queue: dict[str, list[Consumer]] = {}
        self.by_cid: dict[str, Consumer] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._time_slice = time_slice_ms / 1000
        self._interest: set[str] = set()  # queues we declared interest in
        self._owned_since: dict[str, float] = {}  # queues we own -> since (monotonic)
        self._handing_off: set[str] = set()  # handoff appended, not applied yet
        self._deferred: set[str] = set()  # wanted while locked by a join update
        self._timed: set[Consumer] = set()  # consumers with an ack timeout
        # ExpireQueue appended and not seen applied: queue -> (its used_at then, when).
        self._expiring: dict[str, tuple[int, float]] = {}
        self._expiring_own: set[str] = set()  # queues with an Expire of their heads in flight
        # An acquire applied later than this after its submission is late (module doc).
        self._late_after = node.heartbeat_ms * node.state.membership.suspect_beats / 2000
        self.on_fenced: Callable[[], None] | None = None
        node.on_unlocked = self.unlocked

    # -- consumers -------------------------------------------------------------------

    def add(
        self,
        queue: str,
        prefetch: int,
        session: Replier,
        tag: int,
        counters: bool = False,
        ack_timeout_ms: int | None = None,
    ) -> Consumer:
        """Register a consumer and start delivering to it (``counters``: with each
        message's acquired count; ``ack_timeout_ms``: its ack timeout, else the queue's).

        Raises:
            QueueNotFound: no such queue (in the state applied here).
            NotReplica: the queue's data partition is applied by other brokers only.
        """
        q = self.node.queues.get(queue)
        if q is None:
            # Replica groups: its partition's replicas serve it (consumers are not
            # relayed between brokers, docs/design.md §16).
            raise elsewhere(self.node, queue) or QueueNotFound(f"queue {queue!r} does not exist")
        self._next += 1
        cid = f"{self.node.node_id}/{self.node.runtime_id}/{self._next}"
        timeout_ms = ack_timeout_ms if ack_timeout_ms is not None else q.ack_timeout_ms
        c = Consumer(tag, cid, queue, prefetch, session, counters, (timeout_ms or 0) / 1000)
        if c.timeout:
            self._timed.add(c)
        self.by_queue.setdefault(queue, []).append(c)
        self.by_cid[cid] = c
        self._want(queue, True)
        self.pump(queue)
        return c

    def _want(self, queue: str, on: bool) -> None:
        """Declare (or withdraw) this broker's interest in a queue (docs/design.md §6)."""
        if on == (queue in self._interest):
            return
        if on:
            self._interest.add(queue)
            if self.node.locked(queue):
                # Still being updated here (docs/design.md §8): no interest, hence never
                # the owner, until every message of it is in this store.
                self._deferred.add(queue)
                return
        else:
            self._interest.discard(queue)
            if queue in self._deferred:
                self._deferred.discard(queue)
                return  # its interest was never appended
        if queue in self.node.queues:
            self.node.submit(Interest(queue, on)).add_done_callback(_quiet)

    def unlocked(self, queue: str) -> None:
        """The join update of ``queue`` finished here: consumers waiting for it start."""
        if queue in self._deferred:
            self._deferred.discard(queue)
            if queue in self._interest and queue in self.node.queues:
                self.node.submit(Interest(queue, True)).add_done_callback(_quiet)

    def consumers_of(self, queue: str) -> list[Consumer]:
        """The consumers of ``queue`` on this broker that count as consumers (AMQP's
        consumer count: not a channel's Basic.Get helper, not cancelled)."""
        return [c for c in self.by_queue.get(queue, ()) if c.counted and not c.closed]

    def remove(
        self, c: Consumer, unread: list[int] | None = None, received: int = -1
    ) -> asyncio.Future[Settled] | None:
        """Stop a consumer; everything it holds goes back to the queue. Only the
        messages the application had count as a failed delivery: not those in
        ``unread`` (still in the client's buffer), nor, when the client says how many
        it ``received``, those sent after them (still on their way), nor those
        acquired and not sent yet (docs/events.md, the two counters).

        Args:
            c: the consumer.
            unread: a cancel's positions never handed to the application; None for
                a lost connection (every message sent counts as failed).
            received: a cancel's count of messages received (-1: not told).

        Returns the ReleaseAll's completion, or None if the queue is gone.
        """
        if c.closed:
            return None
        c.closed = True
        self._timed.discard(c)
        self.by_cid.pop(c.cid, None)
        peers = self.by_queue.get(c.queue)
        if peers is not None and c in peers:
            peers.remove(c)
            if not peers:
                del self.by_queue[c.queue]
                self._want(c.queue, False)
        if c.queue not in self.node.queues:
            return None
        skip = {p for p in unread or () if type(p) is int}
        failed = tuple(
            sorted(
                p
                for p, seq in c.held.items()
                if p not in skip and (received < 0 or seq < received)
            )
        )
        fut = self.node.submit(ReleaseAll(c.queue, c.cid, (), failed))
        fut.add_done_callback(_quiet)
        return fut

    # -- reacting to the log -------------------------------------------------------------

    def on_effects(self, effects: list[Effect]) -> None:
        """Called by the node after every applied (and stored) batch."""
        wake: set[str] = set()
        for e in effects:
            match e:
                case Acquired():
                    self._deliver(e)
                case ReadyMore():
                    if e.queue in self.by_queue:
                        wake.add(e.queue)
                case OwnerChanged():
                    self._handing_off.discard(e.queue)
                    if e.owner == self.node.key:
                        self._owned_since[e.queue] = time.monotonic()
                        wake.add(e.queue)
                    else:
                        self._owned_since.pop(e.queue, None)
                case MembersChanged():
                    if not e.properties:
                        log.info(
                            "%sview %d established: %d member(s)%s",
                            f"partition {e.partition}: " if e.partition else "",
                            e.view_seq, len(e.members),
                            f"; left it: {', '.join(e.removed)}" if e.removed else "",
                        )
                    if self.node.key in e.removed and not self.node.leaving:
                        self._fenced()
                case QueueGone():
                    if e.declarer_left is not None:
                        log.info(
                            "non-durable queue %r deleted: %s, which declared it, left the view",
                            e.queue, e.declarer_left,
                        )
                    self.cancel_all(e.queue, QueueNotFound(f"queue {e.queue!r} was deleted"))
        for q in wake:
            self.pump(q)

    def cancel_all(self, queue: str, why: BatonError) -> None:
        """End every consumer of ``queue`` here, telling each client ``why`` (the queue
        was deleted, or its partition is no longer applied here)."""
        self._interest.discard(queue)
        self._deferred.discard(queue)
        self._owned_since.pop(queue, None)
        for c in list(self.by_queue.get(queue, ())):
            c.closed = True
            self._timed.discard(c)
            self.by_cid.pop(c.cid, None)
            c.session.consumer_cancelled(c.tag, why)
        self.by_queue.pop(queue, None)

    def _fenced(self) -> None:
        """The view dropped this runtime (paused, partitioned): what its consumers
        held was released at that log position and may be with others now. Close
        every client session so the applications stop; the node rejoins by itself."""
        log.error("this broker was dropped from the cluster's view: closing client sessions")
        self._interest.clear()
        self._deferred.clear()
        self._owned_since.clear()
        self._handing_off.clear()
        if self.on_fenced is not None:
            self.on_fenced()

    def _deliver(self, e: Acquired) -> None:
        c = self.by_cid.get(e.consumer)
        if c is None or c.closed:
            if e.consumer.startswith(f"{self.node.node_id}/{self.node.runtime_id}/"):
                # Acquired for one of ours that has gone since: give it all back;
                # never sent, so not a failed delivery.
                self.node.submit(ReleaseAll(e.queue, e.consumer, (), ())).add_done_callback(
                    _quiet
                )
            return
        if time.monotonic() - c.asked_at > self._late_after:
            c.catching_up = True
            asyncio.get_running_loop().create_task(self._deliver_when_current(e, c))
            return
        self._send(e, c)

    async def _deliver_when_current(self, e: Acquired, c: Consumer) -> None:
        """Deliver a late acquire's messages once this broker has applied the log up to
        its end as it is now, those the consumer still holds then (module doc). On a log
        of several partitions, the queue's own partition (docs/design.md §16): its
        view fences its acquires."""
        node = self.node.part(e.queue)
        end = None
        try:
            end = await node.log.end_offset()
            await wait_applied(node, end - 1)
        except (BatonError, TimeoutError) as exc:
            log.warning("a late acquire for %s waits for the log: %s", c.cid, exc)
        finally:
            c.catching_up = False
        q = node.queues.get(e.queue)
        if c.closed or q is None or q.qid != e.qid:
            return
        keep = [i for i, p in enumerate(e.positions) if q.acquired.get(p) == e.consumer]
        if (
            not node.state.membership.is_member(node.key)
            or end is None
            or node.state.applied < end - 1
        ):
            # Dropped from the view (what it held goes back with the view change), or
            # still behind: give them back rather than hand out what may be stale.
            mine = tuple(e.positions[i] for i in keep)
            if mine and node.state.membership.is_member(node.key):
                node.submit(Release(e.queue, e.consumer, mine, failed=False)).add_done_callback(
                    _quiet
                )
            return
        if len(keep) < len(e.positions):
            log.warning(
                "a late acquire for %s: %d of its %d messages went to others meanwhile"
                " (this broker was paused or cut off); delivering the rest",
                c.cid, len(e.positions) - len(keep), len(e.positions),
            )
        if keep:
            self._send(
                Acquired(
                    e.queue, e.qid, e.consumer,
                    [e.positions[i] for i in keep], [e.counts[i] for i in keep],
                    [e.acquired[i] for i in keep],
                ),
                c,
            )
        self.pump(c.queue)

    def _send(self, e: Acquired, c: Consumer) -> None:
        """Read the acquired messages from the store and send them to the consumer."""
        messages = self.node.part(e.queue).store.get_messages(e.qid, e.positions)
        out: list[list[Any]] = []
        size = 0
        held, sent, counters = c.held, c.sent, c.counters
        deadlines = c.deadlines if c.timeout else None
        deadline = time.monotonic() + c.timeout
        for pos, count, acquired, m in zip(e.positions, e.counts, e.acquired, messages):
            if m is None:  # cannot happen unless the store lost data; never deliver junk
                log.error("queue %s position %d acquired but not in the store", e.queue, pos)
                continue
            held[pos] = sent
            sent += 1
            if deadlines is not None:
                deadlines[pos] = deadline
            if counters:
                out.append([pos, count, m.body, m.headers, m.publish_time, acquired])
            else:
                out.append([pos, count, m.body, m.headers, m.publish_time])
            size += m.size + 16
            if size >= self._chunk_bytes:
                c.session.deliver(c.tag, out)
                out, size = [], 0
        c.sent = sent
        if out:
            c.session.deliver(c.tag, out)

    def pump(self, queue: str) -> None:
        """Ask for as many messages as this queue's consumers have credit for."""
        consumers = self.by_queue.get(queue)
        q = self.node.queues.get(queue)
        if not consumers or q is None:
            return
        if q.owner != self.node.key or queue in self._handing_off:
            return  # only the owner acquires (guarantee 2)
        if q.reserved_by is not None:
            return  # a range reader has the queue; Reserve(None) wakes us (ReadyMore)
        ready = q.ready
        if q.delayed:
            # Delayed releases whose time has come by this broker's clock: an Acquire
            # appended now carries that time, so applying it makes them ready.
            due = q.next_due()
            if due is not None and due <= time.time() * 1000:
                ready += len(q.delayed)
        budget = ready - sum(c.acquiring for c in consumers)
        if budget <= 0:
            return
        if q.single_active_consumer:
            # Only the first consumer still here (subscription order) gets messages.
            active = next((c for c in consumers if not c.closed), None)
            serve = [active] if active is not None else []
        else:
            # Round-robin: start after the consumer served first last time.
            consumers.append(consumers.pop(0))
            serve = consumers
        for c in serve:
            if budget <= 0:
                break
            if c.acquiring or c.closed or c.session.paused or c.catching_up:
                continue
            if c.paused_until:
                if c.paused_until > time.monotonic():
                    continue
                c.paused_until = 0.0
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
            c.asked_at = time.monotonic()
            budget -= n
            self.node.submit(Acquire(queue, c.cid, n)).add_done_callback(
                _after_acquire(self, c)
            )

    def settled(self, c: Consumer) -> None:
        """Credit came back to ``c`` (its settle was applied)."""
        if not c.closed:
            self.pump(c.queue)

    def released(self, c: Consumer) -> None:
        """``c`` released messages: if it holds nothing else now, offer it nothing for
        :data:`RELEASE_PAUSE` seconds, then look again."""
        if c.held:
            return
        c.paused_until = time.monotonic() + RELEASE_PAUSE
        asyncio.get_running_loop().call_later(RELEASE_PAUSE, self._resume, c)

    def _resume(self, c: Consumer) -> None:
        # (The loop's timer may fire a little before paused_until by time.monotonic().)
        c.paused_until = 0.0
        self.settled(c)

    # -- TTL -------------------------------------------------------------------------------

    def start(self, expiry_interval: float) -> None:
        self._tasks = [
            asyncio.create_task(self._expiry_loop(expiry_interval), name="baton-expiry"),
            asyncio.create_task(self._slice_loop(), name="baton-slices"),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass

    async def _slice_loop(self) -> None:
        """Hand owned queues on when another broker wants them and our slice is over,
        or at once when none of our consumers can take more. A queue whose consumers
        are all here is never handed off (docs/design.md §6)."""
        while True:
            await asyncio.sleep(min(0.05, self._time_slice / 4))
            now = time.monotonic()
            now_ms = time.time() * 1000
            me = self.node.key
            for c in list(self._timed):
                self._time_out(c, now)
            for name, since in list(self._owned_since.items()):
                q = self.node.queues.get(name)
                if q is None or q.owner != me or name in self._handing_off:
                    continue
                if q.delayed:
                    due = q.next_due()
                    if due is not None and due <= now_ms:
                        self.pump(name)  # a delayed release is due (by our clock)
                if not any(m != me for m in q.interested) or q.single_active_consumer:
                    continue  # (a single active consumer keeps its queue)
                local = self.by_queue.get(name, ())
                starving = not any(c.credit > 0 and not c.closed for c in local)
                if starving or now - since >= self._time_slice:
                    # Stop acquiring now (when we append); the next owner starts
                    # when it applies the handoff.
                    self.hand_off(name)

    def hand_off(self, name: str) -> None:
        """Stop acquiring for ``name`` and append its Handoff; the next owner starts
        when it applies it."""
        self._handing_off.add(name)
        self.node.submit(Handoff(name)).add_done_callback(
            lambda fut: self.handoff_done(name, fut)
        )

    def handoff_done(self, name: str, fut: asyncio.Future[Owner]) -> None:
        """A Handoff of ours was applied (or failed). When the owner did not change (the
        other interested brokers left between our append and its apply, or it failed),
        no OwnerChanged comes: deliver again instead of waiting for one forever."""
        _quiet(fut)
        if name not in self._handing_off:
            return  # OwnerChanged (or a fence) already settled it
        failed = fut.cancelled() or fut.exception() is not None
        if not failed and fut.result().owner != self.node.key:
            return  # a new owner: its OwnerChanged clears the mark
        self._handing_off.discard(name)
        q = self.node.queues.get(name)
        if q is not None and q.owner == self.node.key:
            self._owned_since[name] = time.monotonic()  # a new slice
            self.pump(name)

    def _time_out(self, c: Consumer, now: float) -> None:
        """Release ``c``'s messages past their ack timeout as a failed delivery, and tell
        its client; its connection and other consumers go on."""
        expired = [p for p, d in c.deadlines.items() if d <= now]
        if not expired or c.closed:
            return
        expired.sort()
        for p in expired:
            del c.deadlines[p]
            c.held.pop(p, None)
        log.info("consumer %s of %s: %d message(s) passed the ack timeout", c.cid, c.queue,
                 len(expired))
        event = Release(c.queue, c.cid, tuple(expired), True, 0, True)
        self.node.submit(event).add_done_callback(_quiet)
        c.session.send(Expired(c.tag, expired))
        self.pump(c.queue)

    async def _expiry_loop(self, interval: float) -> None:
        """Append Expire for queues whose oldest ready messages passed their TTL.

        The store has each message's enqueue time (the replicated clock at apply,
        non-decreasing along positions), so the expired ones are a prefix.
        """
        while True:
            await asyncio.sleep(interval)
            now = self.node.clock()  # not time.time(): a clock step must not expire early
            me = self.node.key
            leader = self.node.state.membership.leader()
            if self._expiring:  # (forget the queues that went)
                queues = self.node.queues
                for name in [n for n in self._expiring if n not in queues]:
                    del self._expiring[name]
            for q in list(self.node.queues.values()):
                if q.expires_ms is not None:
                    self._expire_queue(q, now, me, leader)
                if q.ttls:
                    self._expire_own(q, now, me, leader)
                if q.message_ttl_ms is None or q.ready == 0 or self.node.locked(q.name):
                    continue
                if q.reserved_by is not None:
                    continue  # (TTL waits while a range reader has the queue)
                if q.owner != me and not (q.owner is None and leader == me):
                    continue  # one broker per queue appends Expire
                head = q.head  # (the lowest ready position, priority queues too)
                through = -1
                delayed = q.delayed
                for pos, enqueued_at in self.node.part(q.name).store.scan(q.qid, head, 10_000):
                    if enqueued_at + q.message_ttl_ms > now:
                        break
                    if pos not in delayed:  # (they do not expire while they wait)
                        through = pos
                if through >= head:
                    self.node.submit(Expire(q.name, through)).add_done_callback(_quiet)

    def _expire_own(self, q: QueueState, now: int, me: str, leader: str | None) -> None:
        """Append Expire when the message at the head of ``q`` passed its own TTL by this
        broker's clock (flag message_ttl): its ``through`` is below the head, so the
        queue's TTL expires nothing by it, and applying it takes the head messages past
        their own TTL by the replicated clock (cluster/queues.py), so that they are
        dead-lettered without waiting for a consumer. The queue's owner appends it, else
        the leader."""
        if q.owner != me and not (q.owner is None and leader == me):
            return
        if q.reserved_by is not None or self.node.locked(q.name) or q.name in self._expiring_own:
            return
        head = q.peek()
        if head is None or not q.outlived(head, now):
            return
        self._expiring_own.add(q.name)

        def done(fut: asyncio.Future[Counted]) -> None:
            self._expiring_own.discard(q.name)
            _quiet(fut)

        self.node.submit(Expire(q.name, head - 1)).add_done_callback(done)

    def _expire_queue(self, q: QueueState, now: int, me: str, leader: str | None) -> None:
        """Append ExpireQueue for ``q`` once it was unused for its ``expires_ms`` by this
        broker's clock: the queue's owner does, else (no broker has consumers) the
        leader. The state machine checks again in log order (cluster/state.py), so an
        append that comes late, or twice, deletes nothing it should not."""
        if q.owner != me and not (q.owner is None and leader == me):
            return
        if not q.unused_past_expiry(now) or self.node.locked(q.name):
            return
        sent = self._expiring.get(q.name)
        mono = time.monotonic()
        if sent is not None and sent[0] == q.used_at and mono - sent[1] < _EXPIRE_AGAIN:
            return  # appended already, not applied yet
        self._expiring[q.name] = (q.used_at, mono)
        self.node.submit(ExpireQueue(q.name)).add_done_callback(_quiet)


#: Seconds before an ExpireQueue that was appended, and whose queue is still there
#: unused, is appended again (the first may have been lost with its broker's log append).
_EXPIRE_AGAIN = 5.0


def _after_acquire(d: Delivery, c: Consumer) -> Callable[[asyncio.Future[Counted]], None]:
    def done(fut: asyncio.Future[Counted]) -> None:
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
