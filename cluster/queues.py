"""Queues and the life cycle of their messages (docs/design.md §2, §5, §11).
Pure: no I/O, no clock.

Each queue's replicated state is an *index*, not its messages (:class:`QueueState`):
the next position, the cursor below which every message was handed out at least once,
the heap of released positions, who holds each acquired message and the delivery
counts of redelivered ones. A queue of two million fresh messages costs a few integers;
the bodies live in the store, written from the effects the transitions emit
(:class:`~batonmq.cluster.effects.Stored`, :class:`~batonmq.cluster.effects.Removed`,
:class:`~batonmq.cluster.effects.Moved`, ...).

:class:`QueueIndex` holds every queue and owns every message transition: publish,
acquire, accept, release, reject, expiry, overflow, purge, dead-lettering and the
range readers' commits. :data:`TRANSITIONS` is the table of those moves; the docs'
state diagram is generated from it, and the property test's model
(``tests/property/test_state_machine.py``) moves its messages only by it, so the
code, the table and the model must agree.

Ownership, membership and service leadership are not here: the facade
:class:`batonmq.cluster.state.State` dispatches to this index and keeps those.

The index's data type, :class:`~batonmq.cluster.queue_state.QueueState`, lives in
cluster/queue_state.py (re-exported here).
"""

from __future__ import annotations

import enum
import heapq
import zlib
from typing import Final

from batonmq.cluster.effects import (
    Acquired,
    Effect,
    QueueGone,
    ReadyMore,
    Removed,
    RemovedRange,
    Stored,
)
from batonmq.cluster.errors import (
    InvalidArgument,
    NotOwner,
    QueueExists,
    QueueFull,
    QueueNotFound,
    QueueReserved,
)
from batonmq.cluster.events import (
    Accept,
    AcceptThrough,
    Acquire,
    DeclareQueue,
    Enqueue,
    Expire,
    Origin,
    PurgeQueue,
    Reject,
    ReleaseAll,
    Reserve,
    RoutedEnqueue,
)
from batonmq.cluster.dead_letters import DeadLettering
from batonmq.cluster.exchanges import Exchanges
from batonmq.cluster.forwarding import Forwards
from batonmq.cluster.keys import Fresh, PublishKeys
from batonmq.cluster.queue_state import (
    MAX_PRIORITY,
    Ledger,
    MAX_QUEUE_NAME,
    check_ttls,
    kept_ttls,
    SETTING_NAMES,
    WORK_SETTINGS,
    QueueState,
    validate_declare,
)
from batonmq.cluster.results import (
    AcceptedThrough,
    Counted,
    Declared,
    Deleted,
    Enqueued,
    Purged,
    Reserved,
    Routed,
    Settled,
)

__all__ = [
    "MAX_QUEUE_NAME",
    "MessageState",
    "TRANSITIONS",
    "QueueState",
    "Ledger",
    "QueueIndex",
    "validate_declare",
]



class MessageState(enum.Enum):
    """Where a message is in its life. Terminal states are not kept: the message is gone."""

    READY = "ready"
    DELAYED = "delayed"
    ACQUIRED = "acquired"
    ACCEPTED = "accepted"
    DEAD_LETTERED = "dead-lettered"
    DROPPED = "dropped"


#: (state, operation) -> next state. "release" is a failed delivery given back (its
#: delivery count goes up); "release*" one that reaches the delivery limit; "return"
#: gives a message back without a failure (a "not now" release, or a message the
#: client never handed to the application when its consumer left): only its acquired
#: count goes up. "drop-head" is overflow pushing out the oldest ready message.
#: DELAYED messages are invisible to consumers until their time (a publish with a
#: delay, or "delay": a release of either flavour with one); "wake" is the replicated
#: clock passing that time.
#: DEAD_LETTERED becomes DROPPED when the queue has no (existing) dead-letter queue.
TRANSITIONS: Final[dict[tuple[MessageState | None, str], MessageState]] = {
    (None, "enqueue"): MessageState.READY,
    (None, "enqueue-delayed"): MessageState.DELAYED,
    (MessageState.DELAYED, "wake"): MessageState.READY,
    (MessageState.READY, "acquire"): MessageState.ACQUIRED,
    (MessageState.ACQUIRED, "accept"): MessageState.ACCEPTED,
    (MessageState.ACQUIRED, "release"): MessageState.READY,
    (MessageState.ACQUIRED, "return"): MessageState.READY,
    (MessageState.ACQUIRED, "delay"): MessageState.DELAYED,
    (MessageState.ACQUIRED, "release*"): MessageState.DEAD_LETTERED,
    (MessageState.ACQUIRED, "reject"): MessageState.DEAD_LETTERED,
    (MessageState.READY, "expire"): MessageState.DEAD_LETTERED,
    (MessageState.READY, "drop-head"): MessageState.DEAD_LETTERED,
    (MessageState.READY, "purge"): MessageState.DROPPED,
    (MessageState.DELAYED, "purge"): MessageState.DROPPED,
    # The holder of a queue's reservation committed a position range (docs/design.md §11).
    (MessageState.READY, "accept-through"): MessageState.ACCEPTED,
    (MessageState.DELAYED, "accept-through"): MessageState.ACCEPTED,
}


class QueueIndex(DeadLettering):
    """Every queue's index, changed only by the message transitions below.

    Args:
        ledger: the replicated state around the queues (clock, offset, ignore counts).
        keys: the publish-key memory that deduplicates re-sent publishes.
        exchanges: the exchanges dead letters are routed through.
    """

    def __init__(
        self, ledger: Ledger, keys: PublishKeys, exchanges: Exchanges | None = None
    ) -> None:
        self.ledger = ledger
        self.keys = keys
        self.exchanges = exchanges if exchanges is not None else Exchanges()
        self.queues: dict[str, QueueState] = {}
        self.dirty: set[str] = set()  # queues changed since the last take_dirty()
        # On a data partition of a split log: where dead letters for elsewhere wait
        # (cluster/forwarding.py); None on a log of one.
        self.away: Forwards | None = None

    def queue(self, name: str) -> QueueState:
        """The queue ``name``, marked changed (dirty).

        Raises:
            QueueNotFound: there is no such queue.
        """
        q = self.queues.get(name)
        if q is None:
            raise QueueNotFound(f"queue {name!r} does not exist")
        self.dirty.add(name)
        return q

    # -- wiring -------------------------------------------------------------------

    def declare(self, key: str, ev: DeclareQueue) -> Declared:
        """Create a queue (``key`` declares it), or confirm one with the same settings.

        Raises:
            InvalidArgument: bad settings.
            QueueExists: the queue exists with other settings.
        """
        validate_declare(ev)
        settings = (
            ev.durable,
            ev.max_length,
            ev.overflow,
            ev.delivery_limit,
            ev.dead_letter,
            ev.message_ttl_ms,
        ) + tuple(getattr(ev, name) for name in WORK_SETTINGS)
        q = self.queues.get(ev.queue)
        if q is not None:
            current = q.settings()
            if current != settings or q.expires_ms != ev.expires_ms:
                differing = [
                    (name, have, want)
                    for name, have, want in zip(
                        SETTING_NAMES + ("expires_ms",),
                        current + (q.expires_ms,),
                        settings + (ev.expires_ms,),
                    )
                    if have != want
                ]
                said = "; ".join(f"{n} is {h!r}, not {w!r}" for n, h, w in differing)
                raise QueueExists(
                    f"queue {ev.queue!r} exists with other settings: {said}", differing
                )
            if q.expires_ms is not None:
                q.used_at = self.ledger.clock  # declaring it again is a use (x-expires)
                self.dirty.add(ev.queue)
            return Declared(created=False)
        self.queues[ev.queue] = QueueState(
            ev.queue,
            self.ledger.applied,
            durable=ev.durable,
            max_length=ev.max_length,
            overflow=ev.overflow,
            delivery_limit=ev.delivery_limit,
            dead_letter=ev.dead_letter,
            message_ttl_ms=ev.message_ttl_ms,
            declared_by=key,
            user=ev.user,
            expires_ms=ev.expires_ms,
            used_at=self.ledger.clock if ev.expires_ms is not None else 0,
            **{name: getattr(ev, name) for name in WORK_SETTINGS},
        )
        self.dirty.add(ev.queue)
        return Declared(created=True)

    def delete(self, name: str, out: list[Effect], declarer_left: str | None = None) -> Deleted:
        """Delete queue ``name`` with its messages; its consumers end (``declarer_left``:
        deleted because that runtime, its declarer, left the view)."""
        q = self.queue(name)
        del self.queues[name]
        out.append(QueueGone(name, q.qid, declarer_left))
        return Deleted(deleted=q.length)

    def purge(self, ev: PurgeQueue, out: list[Effect]) -> Purged:
        """Drop every ready message of the queue (acquired ones stay)."""
        q = self.queue(ev.queue)
        # Delayed ones go too: below the cursor one by one, in the fresh range with it.
        returned = sorted(q.returned + q.take_delayed(q.cursor) + q.take_prio(q.next_pos))
        q.take_delayed(q.next_pos)
        n = len(returned) + q.next_pos - q.cursor
        if q.cursor < q.next_pos:
            if q.ttls:
                q.drop_ttls(q.cursor, q.next_pos)
            out.append(RemovedRange(q.qid, q.cursor, q.next_pos))
            q.cursor = q.next_pos
        if returned:
            out.append(Removed(q.qid, returned))
            q.forget(returned)
            q.returned = []
        q.purged += n
        return Purged(purged=n)

    # -- messages -----------------------------------------------------------------

    def enqueue_routed(self, origin: Origin, ev: RoutedEnqueue, out: list[Effect]) -> Routed:
        """Publish the same messages on each of ``ev.queues`` (a queue named twice takes
        them once): each as its own Enqueue would, but a deleted queue is skipped
        (``missing``) and a full one refuses them alone (``full``).

        Raises:
            InvalidArgument: a negative delay or a bad priority (before any change).
        """
        if ev.delay_ms < 0 or ev.not_before < 0:
            raise InvalidArgument("a publish's delay and not_before must not be negative")
        if not 0 <= ev.priority <= MAX_PRIORITY:
            raise InvalidArgument(f"priority must be 0..{MAX_PRIORITY}")
        queues: list[str] = []
        positions: list[int] = []
        full: list[str] = []
        missing: list[str] = []
        for name in dict.fromkeys(ev.queues):
            if name not in self.queues:
                missing.append(name)
                continue
            one = Enqueue(name, ev.messages, ev.keys, ev.delay_ms, ev.not_before, ev.priority,
                          ev.ttls)
            try:
                done = self.enqueue(origin, one, out, ev.routing_key)
            except QueueFull:
                full.append(name)
                continue
            queues.append(name)
            positions.append(done.positions[0] if done.positions else done.first_position)
        return Routed(queues=queues, positions=positions, full=full, missing=missing)

    def enqueue(
        self, origin: Origin, ev: Enqueue, out: list[Effect], routing_key: str | None = None
    ) -> Enqueued:
        """Publish messages at the back of the queue (re-sent keyed spans are not enqueued
        again: they are answered with their original positions). ``routing_key``: the
        key they were routed with (None: the queue's name, the default exchange's).

        Raises:
            QueueFull: they do not fit and the overflow policy refuses them.
        """
        if ev.delay_ms < 0 or ev.not_before < 0:
            raise InvalidArgument("a publish's delay and not_before must not be negative")
        if not 0 <= ev.priority <= MAX_PRIORITY:
            raise InvalidArgument(f"priority must be 0..{MAX_PRIORITY}")
        check_ttls(ev.ttls, len(ev.messages))
        q = self.queue(ev.queue)
        messages = ev.messages
        starts: list[int] | None = None  # each key span's first position
        fresh: list[Fresh] = []  # keyed spans enqueued now: remember them
        keys = self.keys
        if ev.keys and keys.memory > 0 and q.dedupe_window_ms > 0:
            clock = self.ledger.clock
            keys.forget_expired(clock)
            messages, starts, fresh, dups = keys.split(q.qid, q.next_pos, ev, clock)
            if dups:
                self.ledger.ignore("duplicate-publish", dups)
            if not messages:  # every span was applied before: a re-sent publish
                return Enqueued(starts[0], len(ev.messages), starts)
        n = len(messages)
        if q.max_length is not None and q.length + n > q.max_length:
            excess = q.length + n - q.max_length
            if (
                q.overflow == "reject-publish"
                or n > q.max_length
                or excess > q.ready
                # No drop-head under a range reader: positions must not vanish (§11).
                or q.reserved_by is not None
            ):
                raise QueueFull(
                    f"queue {q.name!r} holds {q.length} of max_length {q.max_length};"
                    f" {n} more do not fit (overflow={q.overflow})"
                )
            for p in q.take_ready(excess):  # drop-head: oldest ready messages go
                self._dead_letter(q, p, "maxlen", out)
        first = q.next_pos
        if q.tracks_keys:
            q.note_key(first, q.name if routing_key is None else routing_key)
        if ev.ttls:  # (flag message_ttl: state.py refuses them before)
            own = (ev.ttls if starts is None or len(messages) == len(ev.messages)
                   else kept_ttls(ev.keys, ev.ttls, starts, first))
            q.set_ttls(first, own, self.ledger.clock)
            dlx = (None if q.dead_letter_exchange is None
                   else self.exchanges.get(q.dead_letter_exchange))
            if dlx is not None and dlx.type == "headers":
                q.keep_headers(first, own, messages)  # (it routes their dead letters)
        q.next_pos += n
        q.enqueued += n
        due = 0
        if ev.delay_ms or ev.not_before:
            # Held until the replicated clock passes its time (docs/events.md).
            clock = self.ledger.clock
            due = max(clock + ev.delay_ms, ev.not_before)
            if due <= clock:
                due = 0
        if q.max_priority:
            # A priority queue has no never-delivered range (queue_state.py).
            q.cursor = q.next_pos
            priority = min(ev.priority, q.max_priority)
            for p in range(first, first + n):
                if priority:
                    q.prio[p] = priority
                if due:
                    q.delay(p, due)
                else:
                    heapq.heappush(q.prio_heap, (-priority, p))
        elif due:
            for p in range(first, first + n):
                q.delay(p, due)
        crc = q.body_crc
        for body, _headers in messages:
            crc = zlib.crc32(body, crc)
        q.body_crc = crc
        out.append(Stored(q.qid, first, messages, self.ledger.clock, origin.ts))
        out.append(ReadyMore(q.name))
        if starts is None:
            return Enqueued(first, n)
        expires = self.ledger.clock + q.dedupe_window_ms
        for key, pos, parsed in fresh:
            self.keys.remember(q.qid, key, pos, expires, parsed)
        return Enqueued(first, n, starts)

    def acquire(self, key: str, ev: Acquire, out: list[Effect]) -> Counted:
        """The owner ``key`` hands up to ``ev.count`` ready messages, lowest first, to a
        consumer of its own.

        Raises:
            NotOwner: ``key`` does not own the queue (or the consumer is not its own).
        """
        q = self.queue(ev.queue)
        if q.owner != key or not ev.consumer.startswith(key + "/"):
            # Guarantee 2: only the owner at this log position acquires, for itself.
            self.ledger.ignore("not-owner")
            raise NotOwner(f"{key} does not own queue {q.name!r} (owner: {q.owner})")
        if q.expires_ms is not None:
            q.used_at = self.ledger.clock  # (queue expiry: a get or a consumer's acquire)
        if ev.count <= 0:
            return Counted(0)
        if q.reserved_by is not None:
            # A range reader has the queue: consumers get nothing (docs/design.md §11).
            self.ledger.ignore("reserved")
            return Counted(0)
        if q.delayed:
            q.wake(self.ledger.clock)  # the acquire's own time counts (docs/events.md)
        if q.ttls:  # a message past its own TTL is expired as it reaches the head
            positions = q.take_live(ev.count, self.ledger.clock,
                                    lambda p: self._expire_one(q, p, out))
        else:
            positions = q.take_ready(ev.count)
        if positions:
            acquired, counts, acq, consumer = q.acquired, q.counts, q.acq_counts, ev.consumer
            for p in positions:
                acquired[p] = consumer
            n = len(positions)
            q.acquisitions += n
            q.delivered += n
            # Fresh messages have neither counter: no per-message lookups for them.
            out.append(
                Acquired(
                    q.name,
                    q.qid,
                    consumer,
                    positions,
                    [counts.get(p, 0) for p in positions] if counts else [0] * n,
                    [acq.get(p, 0) for p in positions] if acq else [0] * n,
                )
            )
        return Counted(len(positions))

    def _held(self, q: QueueState, consumer: str, positions: tuple[int, ...] | list[int]) -> tuple[list[int], list[int]]:
        """Split positions into those ``consumer`` holds and the rest (ignored, counted)."""
        held: list[int] = []
        other: list[int] = []
        acquired = q.acquired
        for p in positions:
            if acquired.get(p) == consumer:
                del acquired[p]
                held.append(p)
            else:
                other.append(p)
        if other:
            self.ledger.ignore("not-acquired", len(other))
        return held, other

    def accept(self, ev: Accept, out: list[Effect]) -> Settled:
        """The consumer is done with messages it holds: they leave the queue."""
        q = self.queue(ev.queue)
        held, other = self._held(q, ev.consumer, ev.positions)
        if held:
            if q.counts or q.acq_counts or q.prio or q.ttls:
                q.forget(held)
            q.accepted += len(held)
            out.append(Removed(q.qid, held))
        return Settled(len(held), other)

    def release(
        self,
        name: str,
        consumer: str,
        positions: tuple[int, ...] | list[int],
        out: list[Effect],
        failed: bool = True,
        delay_ms: int = 0,
        timed_out: bool = False,
    ) -> Settled:
        """``consumer`` gives held messages back. A failed delivery (``failed``) raises
        their delivery count: ready again, or dead-lettered at the delivery limit. A
        "not now" (not ``failed``) raises their acquired count only. With ``delay_ms``
        they are ready again only that long after the replicated clock's now.

        Raises:
            InvalidArgument: a negative delay.
        """
        if delay_ms < 0:
            raise InvalidArgument("a release's delay must not be negative")
        q = self.queue(name)
        held, other = self._held(q, consumer, positions)
        q.released += len(held)
        if not failed:
            self._give_back(q, held, out, delay_ms)
            return Settled(len(held), other)
        back: list[int] = []
        counts, acq = q.counts, q.acq_counts
        for p in held:
            c = counts.get(p, 0) + 1
            if c >= q.delivery_limit:  # at most delivery_limit failures (guarantee 5)
                self._dead_letter(q, p, "delivery-limit", out, was_acquired=True)
            elif q.retry and not delay_ms:
                # The queue's retry policy: back after a delay that grows with the
                # failures (an explicit delay wins).
                counts[p] = c
                acq[p] = acq.get(p, 0) + 1
                q.delay(p, self.ledger.clock + q.retry_delay(c))
                q.redelivered += 1
            else:
                counts[p] = c
                acq[p] = acq.get(p, 0) + 1
                back.append(p)
        q.failed_deliveries += len(held)
        if timed_out:
            q.timed_out += len(held)
        q.redelivered += len(back)
        self._back(q, back, out, delay_ms)
        return Settled(len(held), other)

    def _back(self, q: QueueState, positions: list[int], out: list[Effect], delay_ms: int) -> None:
        """Positions go back to ready, or to the delayed ones until clock + ``delay_ms``."""
        if not positions:
            return
        if delay_ms > 0:
            due = self.ledger.clock + delay_ms
            for p in positions:
                q.delay(p, due)
            return
        for p in positions:
            q.make_ready(p)
        out.append(ReadyMore(q.name))

    def _give_back(
        self, q: QueueState, positions: list[int], out: list[Effect], delay_ms: int = 0
    ) -> None:
        """Held messages (no longer in ``q.acquired``) go back without a failure: only
        their acquired count goes up (the "return" transition)."""
        if not positions:
            return
        acq = q.acq_counts
        for p in positions:
            acq[p] = acq.get(p, 0) + 1
        q.given_back += len(positions)
        self._back(q, positions, out, delay_ms)

    def release_all(self, ev: ReleaseAll, out: list[Effect]) -> Settled:
        """A consumer ends: everything it holds goes back. Only those whose delivery
        failed count one (``ev.failed``; without it, all but ``ev.unread``): the
        others were never handed to the application."""
        q = self.queue(ev.queue)
        held = sorted(p for p, c in q.acquired.items() if c == ev.consumer)
        if ev.failed is None:
            unread = set(ev.unread)
            failed = [p for p in held if p not in unread]
        else:
            named = set(ev.failed)
            failed = [p for p in held if p in named]
        failing = set(failed)
        back = [p for p in held if p not in failing]
        for p in back:  # never handed to the application: no delivery attempt
            del q.acquired[p]
        self._give_back(q, back, out)
        done = self.release(ev.queue, ev.consumer, failed, out)
        return Settled(done.count + len(back), [])

    def reject(self, ev: Reject, out: list[Effect]) -> Settled:
        """The consumer refuses messages it holds: they are dead-lettered."""
        q = self.queue(ev.queue)
        held, other = self._held(q, ev.consumer, ev.positions)
        q.rejected += len(held)
        q.failed_deliveries += len(held)
        for p in held:
            self._dead_letter(q, p, "rejected", out, was_acquired=True)
        return Settled(len(held), other)

    def expire(self, ev: Expire, out: list[Effect]) -> Counted:
        """Ready messages up to position ``ev.through`` outlived the queue's TTL."""
        q = self.queue(ev.queue)
        if q.reserved_by is not None:
            # TTL waits while a range reader has the queue: a position it may read
            # (or re-read after a crash) must not vanish under it.
            self.ledger.ignore("reserved")
            return Counted(0)
        gone: list[int] = []
        while q.returned and q.returned[0] <= ev.through:
            gone.append(heapq.heappop(q.returned))
        # Delayed messages do not expire while they wait (they stay delayed).
        gone.extend(q.skip_to(ev.through + 1))
        if q.prio_heap:
            gone.extend(q.take_prio(ev.through + 1))
        if q.ttls:  # and those at the head past their own TTL (flag message_ttl)
            gone.extend(q.expired_heads(self.ledger.clock))
        q.expired += len(gone)
        if (
            q.dead_letter is not None and (q.dead_letter in self.queues or self.away is not None)
        ) or q.dead_letter_exchange is not None:
            for p in gone:
                self._dead_letter(q, p, "expired", out, count=False)
        elif gone:
            q.forget(gone)
            out.append(Removed(q.qid, gone))
        return Counted(len(gone))

    # -- range readers (docs/design.md §11) -------------------------------------------------------

    def reserve(self, ev: Reserve, out: list[Effect]) -> Reserved:
        """A range reader takes the queue (``ev.holder``) or lets it go (None).

        Raises:
            InvalidArgument: a bad holder name.
            QueueReserved: another holder has the queue.
        """
        q = self.queue(ev.queue)
        holder = ev.holder
        if holder is None:
            was, q.reserved_by = q.reserved_by, None
            if was is not None and q.ready:
                out.append(ReadyMore(q.name))  # the consumers may acquire again
        else:
            if not holder or len(holder) > MAX_QUEUE_NAME or not holder.isprintable():
                raise InvalidArgument(f"holder must be 1..{MAX_QUEUE_NAME} printable characters")
            if q.reserved_by is not None and q.reserved_by != holder:
                raise QueueReserved(
                    f"queue {q.name!r} is reserved by {q.reserved_by!r}, not {holder!r}"
                )
            q.reserved_by = holder
        # "acquired": messages consumers took before the reservation; a reader waits
        # until they are settled before it reads (they could come back below its range).
        return Reserved(
            reserved_by=q.reserved_by,
            acquired=len(q.acquired),
            head=q.head,
            next_position=q.next_pos,
        )

    def accept_through(self, ev: AcceptThrough, out: list[Effect]) -> AcceptedThrough:
        """The reservation's holder commits every ready position below ``ev.through``.

        Raises:
            QueueReserved: ``ev.holder`` does not hold the queue.
        """
        q = self.queue(ev.queue)
        if q.reserved_by != ev.holder:
            # Fencing of range readers: only the holder commits, in log order.
            self.ledger.ignore("not-holder")
            raise QueueReserved(
                f"queue {q.name!r} is reserved by {q.reserved_by!r}, not {ev.holder!r}"
            )
        through = min(ev.through, q.next_pos)
        n = 0
        back: list[int] = []
        while q.returned and q.returned[0] < through:
            back.append(heapq.heappop(q.returned))
        if q.delayed:
            # Delayed ones are committed too: the reader read them. Those below the
            # cursor one by one; those in the fresh range go with the range below.
            back.extend(q.take_delayed(min(through, q.cursor)))
            q.take_delayed(through)
        if q.prio_heap:
            back.extend(q.take_prio(through))
        if back:
            q.forget(back)
            out.append(Removed(q.qid, back))
            n += len(back)
        if through > q.cursor:
            # Fresh positions never acquired: one range delete. (No message in
            # cursor..next_pos is acquired or has a delivery count.)
            if q.ttls:
                q.drop_ttls(q.cursor, through)
            out.append(RemovedRange(q.qid, q.cursor, through))
            n += through - q.cursor
            q.cursor = through
        q.accepted += n
        return AcceptedThrough(count=n, head=q.head)
