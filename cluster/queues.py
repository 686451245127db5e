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
"""

from __future__ import annotations

import enum
import heapq
import zlib
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from batonmq.cluster.effects import (
    Acquired,
    Effect,
    Moved,
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
    OVERFLOW_POLICIES,
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
)
from batonmq.cluster.keys import PublishKeys
from batonmq.cluster.results import (
    AcceptedThrough,
    Counted,
    Declared,
    Deleted,
    Enqueued,
    Purged,
    Reserved,
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

MAX_QUEUE_NAME: Final = 255


class MessageState(enum.Enum):
    """Where a message is in its life. Terminal states are not kept: the message is gone."""

    READY = "ready"
    ACQUIRED = "acquired"
    ACCEPTED = "accepted"
    DEAD_LETTERED = "dead-lettered"
    DROPPED = "dropped"


#: (state, operation) -> next state. "release" is a failed delivery given back (its
#: delivery count goes up); "release*" one that reaches the delivery limit; "return"
#: gives a message back without a failure (a "not now" release, or a message the
#: client never handed to the application when its consumer left): only its acquired
#: count goes up. "drop-head" is overflow pushing out the oldest ready message.
#: DEAD_LETTERED becomes DROPPED when the queue has no (existing) dead-letter queue.
TRANSITIONS: Final[dict[tuple[MessageState | None, str], MessageState]] = {
    (None, "enqueue"): MessageState.READY,
    (MessageState.READY, "acquire"): MessageState.ACQUIRED,
    (MessageState.ACQUIRED, "accept"): MessageState.ACCEPTED,
    (MessageState.ACQUIRED, "release"): MessageState.READY,
    (MessageState.ACQUIRED, "return"): MessageState.READY,
    (MessageState.ACQUIRED, "release*"): MessageState.DEAD_LETTERED,
    (MessageState.ACQUIRED, "reject"): MessageState.DEAD_LETTERED,
    (MessageState.READY, "expire"): MessageState.DEAD_LETTERED,
    (MessageState.READY, "drop-head"): MessageState.DEAD_LETTERED,
    (MessageState.READY, "purge"): MessageState.DROPPED,
    # The holder of a queue's reservation committed a position range (docs/design.md §11).
    (MessageState.READY, "accept-through"): MessageState.ACCEPTED,
}


@dataclass(slots=True)
class QueueState:
    """One queue's replicated index. Positions ``cursor <= p < next_pos`` are ready
    and never yet delivered; ``returned`` holds released (ready again) positions,
    all below ``cursor``; ``acquired`` maps held positions to their consumer.

    The two counters of a message (docs/events.md, "The two counters"): ``counts``
    holds its delivery count, the failed deliveries so far (the delivery limit
    applies to it), and ``acq_counts`` its acquired count, the hand-outs to a
    consumer that ended so far; both only for messages that have one above 0, so a
    message delivered once and accepted never has an entry."""

    name: str
    qid: int
    durable: bool
    max_length: int | None
    overflow: str
    delivery_limit: int
    dead_letter: str | None
    message_ttl_ms: int | None
    declared_by: str  # the member ("node/runtime") that declared it
    next_pos: int = 0
    cursor: int = 0
    returned: list[int] = field(default_factory=list)  # a heap
    acquired: dict[int, str] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    acq_counts: dict[int, int] = field(default_factory=dict)
    body_crc: int = 0
    enqueued: int = 0
    accepted: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    dropped: int = 0
    expired: int = 0
    purged: int = 0
    owner: str | None = None  # the member that may acquire (docs/design.md §6)
    interested: list[str] = field(default_factory=list)  # members with consumers
    reserved_by: str | None = None  # the range reader that has the queue (Reserve)
    acquisitions: int = 0  # messages handed to consumers (every hand-out)
    failed_deliveries: int = 0  # failed releases, rejects, and held messages of a lost consumer
    given_back: int = 0  # messages given back without a failure (the "return" move)

    @property
    def head(self) -> int:
        """The lowest ready position (``next_pos`` if none is ready)."""
        return self.returned[0] if self.returned else self.cursor

    @property
    def ready(self) -> int:
        return self.next_pos - self.cursor + len(self.returned)

    @property
    def length(self) -> int:
        """Messages counted against max_length: ready + acquired."""
        return self.ready + len(self.acquired)

    def settings(self) -> tuple[Any, ...]:
        return (
            self.durable,
            self.max_length,
            self.overflow,
            self.delivery_limit,
            self.dead_letter,
            self.message_ttl_ms,
        )

    def stats(self) -> dict[str, Any]:
        """Counters for queue_stats (all replicated, equal on every broker)."""
        return {
            "queue": self.name,
            "ready": self.ready,
            "acquired": len(self.acquired),
            "next_position": self.next_pos,
            "enqueued": self.enqueued,
            "accepted": self.accepted,
            "redelivered": self.redelivered,
            "acquisitions": self.acquisitions,
            "failed_deliveries": self.failed_deliveries,
            "given_back": self.given_back,
            "dead_lettered": self.dead_lettered,
            "dropped": self.dropped,
            "expired": self.expired,
            "purged": self.purged,
            "durable": self.durable,
            "max_length": self.max_length,
            "overflow": self.overflow,
            "delivery_limit": self.delivery_limit,
            "dead_letter": self.dead_letter,
            "message_ttl_ms": self.message_ttl_ms,
            "owner": self.owner,
            "interested": list(self.interested),
            "reserved_by": self.reserved_by,
            "head": self.head,
        }

    def forget(self, positions: list[int] | tuple[int, ...]) -> None:
        """Drop the counters of messages that left the queue."""
        counts, acq = self.counts, self.acq_counts
        for p in positions:
            counts.pop(p, None)
            acq.pop(p, None)

    def holds(self, pos: int, returned: set[int] | None = None) -> bool:
        """Is the message at ``pos`` still in the queue (ready or acquired)?
        ``returned``: ``set(self.returned)``, when asking for many positions."""
        if self.cursor <= pos < self.next_pos or pos in self.acquired:
            return True
        return pos in (returned if returned is not None else self.returned)

    def live_desc(self) -> tuple[range, list[int]]:
        """Every position still in the queue, back to front: the never-delivered
        range ``[cursor, next_pos)`` descending, then the acquired and released ones
        (all below the cursor) descending. O(acquired + released), not O(length)."""
        below = sorted(set(self.returned) | self.acquired.keys(), reverse=True)
        return range(self.next_pos - 1, self.cursor - 1, -1), below

    def take_ready(self, count: int) -> list[int]:
        """Remove and return up to ``count`` ready positions, lowest first (guarantee 7)."""
        out: list[int] = []
        returned = self.returned
        while returned and len(out) < count:
            out.append(heapq.heappop(returned))
        k = min(count - len(out), self.next_pos - self.cursor)
        if k > 0:
            out.extend(range(self.cursor, self.cursor + k))
            self.cursor += k
        return out

    def snapshot(self) -> list[Any]:
        """Canonical, msgpack-able form: equal states give equal snapshots."""
        return [
            self.name,
            self.qid,
            list(self.settings()),
            self.declared_by,
            self.next_pos,
            self.cursor,
            sorted(self.returned),
            sorted(self.acquired.items()),
            sorted(self.counts.items()),
            self.body_crc,
            [
                self.enqueued,
                self.accepted,
                self.redelivered,
                self.dead_lettered,
                self.dropped,
                self.expired,
                self.purged,
            ],
            self.owner,
            list(self.interested),
            self.reserved_by,
            sorted(self.acq_counts.items()),
            [self.acquisitions, self.failed_deliveries, self.given_back],
        ]

    @classmethod
    def restore(cls, snap: list[Any]) -> "QueueState":
        (name, qid, settings, declared_by, next_pos, cursor, returned, acquired, counts, crc, st,
         owner, interested) = snap[:13]
        durable, max_length, overflow, delivery_limit, dead_letter, ttl = settings
        q = cls(
            name,
            qid,
            durable=durable,
            max_length=max_length,
            overflow=overflow,
            delivery_limit=delivery_limit,
            dead_letter=dead_letter,
            message_ttl_ms=ttl,
            declared_by=declared_by,
        )
        q.next_pos, q.cursor = next_pos, cursor
        q.returned = list(returned)  # sorted, hence a valid heap
        q.acquired = {p: c for p, c in acquired}
        q.counts = {p: c for p, c in counts}
        q.body_crc = crc
        (q.enqueued, q.accepted, q.redelivered, q.dead_lettered, q.dropped, q.expired, q.purged) = st
        q.owner, q.interested = owner, list(interested)
        q.reserved_by = snap[13] if len(snap) > 13 else None  # absent in older snapshots
        if len(snap) > 15:  # absent in snapshots from before the two counters
            q.acq_counts = {p: c for p, c in snap[14]}
            q.acquisitions, q.failed_deliveries, q.given_back = snap[15]
        return q



class Ledger(Protocol):
    """What the transitions read and count on the replicated state around them
    (:class:`batonmq.cluster.state.State` is one)."""

    @property
    def clock(self) -> int:
        """The largest envelope time applied, ms: dead-lettered and stored messages'
        enqueue time."""
        ...

    @property
    def applied(self) -> int:
        """The log offset being applied: a new queue's id."""
        ...

    def ignore(self, reason: str, n: int = 1) -> None:
        """Count ``n`` events (or parts of one) ignored, deterministically, for ``reason``."""
        ...


class QueueIndex:
    """Every queue's index, changed only by the message transitions below.

    Args:
        ledger: the replicated state around the queues (clock, offset, ignore counts).
        keys: the publish-key memory that deduplicates re-sent publishes.
    """

    def __init__(self, ledger: Ledger, keys: PublishKeys) -> None:
        self.ledger = ledger
        self.keys = keys
        self.queues: dict[str, QueueState] = {}
        self.dirty: set[str] = set()  # queues changed since the last take_dirty()

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
        )
        q = self.queues.get(ev.queue)
        if q is not None:
            if q.settings() != settings:
                raise QueueExists(
                    f"queue {ev.queue!r} exists with other settings: {q.stats()}"
                )
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
        )
        self.dirty.add(ev.queue)
        return Declared(created=True)

    def delete(self, name: str, out: list[Effect]) -> Deleted:
        """Delete queue ``name`` with its messages; its consumers end."""
        q = self.queue(name)
        del self.queues[name]
        out.append(QueueGone(name, q.qid))
        return Deleted(deleted=q.length)

    def purge(self, ev: PurgeQueue, out: list[Effect]) -> Purged:
        """Drop every ready message of the queue (acquired ones stay)."""
        q = self.queue(ev.queue)
        returned = sorted(q.returned)
        n = len(returned) + q.next_pos - q.cursor
        if q.cursor < q.next_pos:
            out.append(RemovedRange(q.qid, q.cursor, q.next_pos))
            q.cursor = q.next_pos
        if returned:
            out.append(Removed(q.qid, returned))
            q.forget(returned)
            q.returned = []
        q.purged += n
        return Purged(purged=n)

    # -- messages -----------------------------------------------------------------

    def enqueue(self, origin: Origin, ev: Enqueue, out: list[Effect]) -> Enqueued:
        """Publish messages at the back of the queue (re-sent keyed spans are not enqueued
        again: they are answered with their original positions).

        Raises:
            QueueFull: they do not fit and the overflow policy refuses them.
        """
        q = self.queue(ev.queue)
        messages = ev.messages
        starts: list[int] | None = None  # each key span's first position
        fresh: list[tuple[str, int]] = []  # keyed spans enqueued now: remember them
        if ev.keys and self.keys.memory > 0:
            messages, starts, fresh, dups = self.keys.split(q.qid, q.next_pos, ev)
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
        q.next_pos += n
        q.enqueued += n
        crc = q.body_crc
        for body, _headers in messages:
            crc = zlib.crc32(body, crc)
        q.body_crc = crc
        out.append(Stored(q.qid, first, messages, self.ledger.clock, origin.ts))
        out.append(ReadyMore(q.name))
        if starts is None:
            return Enqueued(first, n)
        for key, pos in fresh:
            self.keys.remember(q.qid, key, pos)
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
        if ev.count <= 0:
            return Counted(0)
        if q.reserved_by is not None:
            # A range reader has the queue: consumers get nothing (docs/design.md §11).
            self.ledger.ignore("reserved")
            return Counted(0)
        positions = q.take_ready(ev.count)
        if positions:
            acquired, counts, acq, consumer = q.acquired, q.counts, q.acq_counts, ev.consumer
            for p in positions:
                acquired[p] = consumer
            n = len(positions)
            q.acquisitions += n
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
            if q.counts or q.acq_counts:
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
    ) -> Settled:
        """``consumer`` gives held messages back. A failed delivery (``failed``) raises
        their delivery count: ready again, or dead-lettered at the delivery limit. A
        "not now" (not ``failed``) raises their acquired count only."""
        q = self.queue(name)
        held, other = self._held(q, consumer, positions)
        if not failed:
            self._give_back(q, held, out)
            return Settled(len(held), other)
        back = 0
        counts, acq = q.counts, q.acq_counts
        for p in held:
            c = counts.get(p, 0) + 1
            if c >= q.delivery_limit:  # at most delivery_limit failures (guarantee 5)
                self._dead_letter(q, p, "delivery-limit", out, was_acquired=True)
            else:
                counts[p] = c
                acq[p] = acq.get(p, 0) + 1
                heapq.heappush(q.returned, p)
                back += 1
        q.failed_deliveries += len(held)
        q.redelivered += back
        if back:
            out.append(ReadyMore(q.name))
        return Settled(len(held), other)

    def _give_back(self, q: QueueState, positions: list[int], out: list[Effect]) -> None:
        """Held messages (no longer in ``q.acquired``) go back without a failure: only
        their acquired count goes up (the "return" transition)."""
        if not positions:
            return
        acq = q.acq_counts
        for p in positions:
            acq[p] = acq.get(p, 0) + 1
            heapq.heappush(q.returned, p)
        q.given_back += len(positions)
        out.append(ReadyMore(q.name))

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
        k = min(ev.through + 1, q.next_pos) - q.cursor
        if k > 0:
            gone.extend(range(q.cursor, q.cursor + k))
            q.cursor += k
        q.expired += len(gone)
        if q.dead_letter is not None and q.dead_letter in self.queues:
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
        if back:
            q.forget(back)
            out.append(Removed(q.qid, back))
            n += len(back)
        if through > q.cursor:
            # Fresh positions never acquired: one range delete. (No message in
            # cursor..next_pos is acquired or has a delivery count.)
            out.append(RemovedRange(q.qid, q.cursor, through))
            n += through - q.cursor
            q.cursor = through
        q.accepted += n
        return AcceptedThrough(count=n, head=q.head)

    def _dead_letter(
        self,
        q: QueueState,
        pos: int,
        reason: str,
        out: list[Effect],
        count: bool = True,
        was_acquired: bool = False,
    ) -> None:
        """Move one message (no longer ready nor acquired) to q's DLQ, or drop it.

        ``x-death-delivery-count`` is its failed deliveries: the failed releases so
        far, plus the delivery it was acquired for if that one failed now (a reject,
        the release at the limit); ``x-death-acquired-count`` its hand-outs.
        """
        delivered = q.counts.pop(pos, 0) + (1 if was_acquired else 0)
        handed = q.acq_counts.pop(pos, 0) + (1 if was_acquired else 0)
        dlq = self.queues.get(q.dead_letter) if q.dead_letter is not None else None
        if (
            dlq is not None
            and dlq.max_length is not None
            and dlq.length >= dlq.max_length
            and dlq.overflow == "drop-head"
            and dlq.ready > 0
        ):
            # A full drop-head DLQ makes room as it would for a publish; its oldest
            # ready message is dropped (not dead-lettered on: DLQ chains may cycle).
            for head in dlq.take_ready(1):
                dlq.forget((head,))
                dlq.dropped += 1
                out.append(Removed(dlq.qid, [head]))
            self.dirty.add(dlq.name)
        if dlq is not None and (dlq.max_length is None or dlq.length < dlq.max_length):
            dst = dlq.next_pos
            dlq.next_pos += 1
            dlq.enqueued += 1
            self.dirty.add(dlq.name)
            headers = {
                "x-death-reason": reason,
                "x-death-queue": q.name,
                "x-death-position": pos,
                "x-death-delivery-count": delivered,
                "x-death-acquired-count": handed,
            }
            out.append(Moved(q.qid, pos, dlq.qid, dst, headers, self.ledger.clock))
            out.append(ReadyMore(dlq.name))
            if count:
                q.dead_lettered += 1
        else:
            out.append(Removed(q.qid, [pos]))
            if count:
                q.dropped += 1


def validate_declare(ev: DeclareQueue) -> None:
    """Raises InvalidArgument if a DeclareQueue's settings are not valid."""
    if not ev.queue or len(ev.queue) > MAX_QUEUE_NAME:
        raise InvalidArgument(f"queue name must be 1..{MAX_QUEUE_NAME} characters")
    if not ev.queue.isprintable():
        raise InvalidArgument("queue name must be printable")
    if ev.overflow not in OVERFLOW_POLICIES:
        raise InvalidArgument(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}")
    if ev.delivery_limit < 1:
        raise InvalidArgument("delivery_limit must be at least 1")
    if ev.max_length is not None and ev.max_length < 1:
        raise InvalidArgument("max_length must be at least 1 (or None for no limit)")
    if ev.message_ttl_ms is not None and ev.message_ttl_ms < 1:
        raise InvalidArgument("message_ttl must be positive (or None)")
    if ev.dead_letter is not None and (ev.dead_letter == ev.queue or not ev.dead_letter):
        raise InvalidArgument("a queue cannot be its own dead-letter queue")
