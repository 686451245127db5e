"""The replicated state machine: queues applied from the ordered log (DESIGN §2, §4, §5).

``State.apply(offset, origin, event, out)`` is deterministic: no I/O, no clock, no
randomness. Every broker that applies the same log prefix holds the same state and
the same :meth:`State.digest`. Time enters only through the events' envelopes
(``State.clock`` is the largest envelope time seen, in log order).

What the state keeps in memory is an *index*, not the messages: for each queue, the
next position, the cursor below which every message has been handed out at least
once, the heap of released positions, who holds each acquired message, and the
delivery counts of redelivered ones. A queue of two million fresh messages costs a
few integers here; the bodies live in the store, written from the effects that
``apply`` emits (:class:`Stored`, :class:`Removed`, :class:`Moved`, ...).

This file owns every message transition; :data:`TRANSITIONS` is the table the
docs' state diagram is generated from, and the property tests check the code
against it.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from batonmq.cluster.errors import (
    BatonError,
    Fenced,
    InvalidArgument,
    NotOwner,
    QueueExists,
    QueueFull,
    QueueNotFound,
    QueueReserved,
)
from batonmq.cluster.events import (
    MEMBERSHIP_EVENTS,
    OVERFLOW_POLICIES,
    Accept,
    AcceptThrough,
    Acquire,
    Checkpoint,
    Candidate,
    DeclareQueue,
    DeleteQueue,
    Enqueue,
    Event,
    Expire,
    Handoff,
    Handover,
    Heartbeat,
    Interest,
    Join,
    Leave,
    Origin,
    Propose,
    PurgeQueue,
    Reject,
    Release,
    ReleaseAll,
    Reserve,
    Resign,
    Vote,
)
from batonmq.cluster.membership import VOTER, Membership
from batonmq.cluster.services import Grant, Services, check_candidate

__all__ = [
    "MessageState",
    "TRANSITIONS",
    "State",
    "QueueState",
    "Effect",
    "Completed",
    "Stored",
    "Removed",
    "RemovedRange",
    "Moved",
    "Acquired",
    "ReadyMore",
    "QueueGone",
    "OwnerChanged",
    "MembersChanged",
    "CheckpointApplied",
    "LeaderChanged",
    "HandoverRequested",
    "MAX_QUEUE_NAME",
    "KEY_MEMORY",
]

MAX_QUEUE_NAME: Final = 255
#: How many publish idempotency keys the state remembers, cluster-wide, in log order
#: (the oldest is forgotten first). A client's re-sent publish is deduplicated if
#: its first copy is among the last KEY_MEMORY keyed publishes applied.
KEY_MEMORY: Final = 100_000


class MessageState(enum.Enum):
    """Where a message is in its life. Terminal states are not kept: the message is gone."""

    READY = "ready"
    ACQUIRED = "acquired"
    ACCEPTED = "accepted"
    DEAD_LETTERED = "dead-lettered"
    DROPPED = "dropped"


#: (state, operation) -> next state. "release*" is a release that reaches the
#: delivery limit; "drop" is drop-head overflow, purge or expiry. DEAD_LETTERED
#: becomes DROPPED when the queue has no (existing) dead-letter queue.
TRANSITIONS: Final[dict[tuple[MessageState | None, str], MessageState]] = {
    (None, "enqueue"): MessageState.READY,
    (MessageState.READY, "acquire"): MessageState.ACQUIRED,
    (MessageState.ACQUIRED, "accept"): MessageState.ACCEPTED,
    (MessageState.ACQUIRED, "release"): MessageState.READY,
    (MessageState.ACQUIRED, "release*"): MessageState.DEAD_LETTERED,
    (MessageState.ACQUIRED, "reject"): MessageState.DEAD_LETTERED,
    (MessageState.READY, "expire"): MessageState.DEAD_LETTERED,
    (MessageState.READY, "drop-head"): MessageState.DEAD_LETTERED,
    (MessageState.READY, "purge"): MessageState.DROPPED,
    # The holder of a queue's reservation committed a position range (DESIGN §11).
    (MessageState.READY, "accept-through"): MessageState.ACCEPTED,
}


# --- effects -------------------------------------------------------------------------


class Effect:
    """Base of what ``apply`` asks the edges (store, broker) to do."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Completed(Effect):
    """The event (node, runtime, seq) was applied: its command's completion."""

    node: str
    runtime: str
    seq: int
    result: dict[str, Any] | None
    error: BatonError | None = None


@dataclass(frozen=True, slots=True)
class Stored(Effect):
    """Store new messages at positions ``first ..`` of queue ``qid``."""

    qid: int
    first: int
    messages: tuple[tuple[bytes, dict[str, Any]], ...]
    enqueued_at: int
    publish_time: int


@dataclass(frozen=True, slots=True)
class Removed(Effect):
    """Forget these messages of queue ``qid``."""

    qid: int
    positions: list[int]


@dataclass(frozen=True, slots=True)
class RemovedRange(Effect):
    """Forget messages ``lo <= position < hi`` of queue ``qid``."""

    qid: int
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class Moved(Effect):
    """Move a message to another queue (dead-lettering), adding ``headers``."""

    src_qid: int
    src_pos: int
    dst_qid: int
    dst_pos: int
    headers: dict[str, Any]
    enqueued_at: int


@dataclass(frozen=True, slots=True)
class Acquired(Effect):
    """``consumer`` now holds these messages; ``counts[i]`` is positions[i]'s delivery count."""

    queue: str
    qid: int
    consumer: str
    positions: list[int]
    counts: list[int]


@dataclass(frozen=True, slots=True)
class ReadyMore(Effect):
    """The queue's ready count went up (enqueue or release): consumers may get more."""

    queue: str


@dataclass(frozen=True, slots=True)
class QueueGone(Effect):
    """The queue was deleted; its consumers end."""

    queue: str
    qid: int


@dataclass(frozen=True, slots=True)
class OwnerChanged(Effect):
    """``queue`` has a new owner (a member key, or None)."""

    queue: str
    owner: str | None


@dataclass(frozen=True, slots=True)
class MembersChanged(Effect):
    """A view was established (``removed`` left it), or a member's properties changed."""

    view_seq: int
    members: list[str]
    removed: list[str]
    properties: bool = False


@dataclass(frozen=True, slots=True)
class CheckpointApplied(Effect):
    """A checkpoint was applied at ``offset``; ``digest`` is this replica's state digest
    there. ``expected`` is the leader's digest at ``prev_offset`` and ``mine`` this
    replica's own (None where this replica has none: it joined later)."""

    offset: int
    digest: str
    prev_offset: int
    expected: str
    mine: str | None


@dataclass(frozen=True, slots=True)
class LeaderChanged(Effect):
    """Service ``service`` has a new term: ``leader`` (None: nobody leads now) with
    fencing ``token`` (the granting event's log offset); ``previous`` led before."""

    service: str
    leader: str | None
    token: int
    previous: str | None


@dataclass(frozen=True, slots=True)
class HandoverRequested(Effect):
    """An admin asked ``leader`` (term ``token``) to hand ``service`` over when its
    running work is done; ``to`` is the candidate named to lead next, if any."""

    service: str
    leader: str
    token: int
    to: str | None


# --- queues --------------------------------------------------------------------------


@dataclass(slots=True)
class QueueState:
    """One queue's replicated index. Positions ``cursor <= p < next_pos`` are ready
    and never yet delivered; ``returned`` holds released (ready again) positions,
    all below ``cursor``; ``acquired`` maps held positions to their consumer."""

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
    body_crc: int = 0
    enqueued: int = 0
    accepted: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    dropped: int = 0
    expired: int = 0
    purged: int = 0
    owner: str | None = None  # the member that may acquire (DESIGN §6)
    interested: list[str] = field(default_factory=list)  # members with consumers
    reserved_by: str | None = None  # the range reader that has the queue (Reserve)

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
        return q


# --- the state machine ---------------------------------------------------------------


class State:
    """All replicated state of one cluster, advanced only by :meth:`apply`."""

    def __init__(self, suspect_beats: int = 6, key_memory: int = KEY_MEMORY) -> None:
        self.queues: dict[str, QueueState] = {}
        # Publish idempotency keys (Enqueue.keys): (qid, key) -> the first position
        # the publish got, plus the same keys in log order (three parallel deques,
        # cheap to snapshot) so that the oldest is forgotten first.
        self.key_memory = key_memory
        self.keys: dict[tuple[int, str], int] = {}
        self._key_qids: deque[int] = deque()
        self._key_names: deque[str] = deque()
        self._key_firsts: deque[int] = deque()
        self._key_total = 0  # keys ever remembered: the next key's sequence number
        self._keys_new: list[tuple[int, int, str, int]] = []  # (seq, qid, key, first) to store
        self.membership = Membership(suspect_beats)
        self.services = Services()  # service leadership (cluster/services.py)
        self.clock = 0  # largest envelope time applied, ms
        self.applied = -1  # offset of the last applied record
        self.last_seq: dict[str, int] = {}  # "node/runtime" -> last applied origin seq
        self.ignored: dict[str, int] = {}  # reason -> count of deterministically ignored events
        self.dirty: set[str] = set()  # queues changed since the last take_dirty()
        self._meta_dirty = True
        # The last two checkpoints applied: (offset, this replica's digest there).
        self.checkpoints: list[tuple[int, str]] = []

    # -- driving ------------------------------------------------------------------

    def apply(self, offset: int, origin: Origin, event: Event, out: list[Effect]) -> None:
        """Apply one event at log ``offset``, appending its effects to ``out``."""
        self.applied = offset
        self._meta_dirty = True
        key = f"{origin.node}/{origin.runtime}"
        last = self.last_seq.get(key, -1)
        if origin.seq <= last:
            self._ignore("duplicate")  # a retried append: applied once (DESIGN §3)
            return
        self.last_seq[key] = origin.seq
        if origin.ts > self.clock:
            self.clock = origin.ts
        try:
            if type(event) in MEMBERSHIP_EVENTS:
                result = self._membership_event(key, origin, event, out)
            elif key not in self.membership.member_set:
                # Fencing (DESIGN §4): only members of the established view act.
                self._ignore("fenced")
                raise Fenced(f"{key} is not in the established view {self.membership.view_seq}")
            else:
                result = self._dispatch(key, origin, event, out)
        except BatonError as exc:
            out.append(Completed(origin.node, origin.runtime, origin.seq, None, exc))
            return
        out.append(Completed(origin.node, origin.runtime, origin.seq, result))

    def skip_malformed(self, offset: int) -> None:
        """Count a record that could not be decoded (the same on every replica)."""
        self.applied = offset
        self._meta_dirty = True
        self._ignore("malformed")

    def _ignore(self, reason: str, n: int = 1) -> None:
        self.ignored[reason] = self.ignored.get(reason, 0) + n

    def _dispatch(self, key: str, origin: Origin, ev: Event, out: list[Effect]) -> dict[str, Any]:
        # Ordered by frequency on the hot path.
        t = type(ev)
        if t is Enqueue:
            return self._enqueue(origin, ev, out)  # type: ignore[arg-type]
        if t is Acquire:
            return self._acquire(key, ev, out)  # type: ignore[arg-type]
        if t in (Accept, Release, Reject, ReleaseAll):
            # Only a consumer's own broker settles its messages.
            if not ev.consumer.startswith(key + "/"):  # type: ignore[attr-defined]
                self._ignore("not-own-consumer")
                raise InvalidArgument(f"{key} cannot settle for consumer {ev.consumer}")  # type: ignore[attr-defined]
            if t is Accept:
                return self._accept(ev, out)  # type: ignore[arg-type]
            if t is Release:
                return self._release(ev.queue, ev.consumer, ev.positions, out)  # type: ignore[attr-defined]
            if t is Reject:
                return self._reject(ev, out)  # type: ignore[arg-type]
            return self._release_all(ev, out)  # type: ignore[arg-type]
        if t is Expire:
            return self._expire(ev, out)  # type: ignore[arg-type]
        if t is AcceptThrough:
            return self._accept_through(ev, out)  # type: ignore[arg-type]
        if t is Reserve:
            return self._reserve(ev, out)  # type: ignore[arg-type]
        if t is Interest:
            return self._interest(key, ev, out)  # type: ignore[arg-type]
        if t is Handoff:
            return self._handoff(key, ev, out)  # type: ignore[arg-type]
        if t is DeclareQueue:
            return self._declare(key, ev)  # type: ignore[arg-type]
        if t is DeleteQueue:
            return self._delete(ev.queue, out)  # type: ignore[attr-defined]
        if t is PurgeQueue:
            return self._purge(ev, out)  # type: ignore[arg-type]
        if t is Checkpoint:
            return self._checkpoint(key, ev, out)  # type: ignore[arg-type]
        if t is Candidate or t is Resign or t is Handover:
            return self._service_event(key, ev, out)
        raise InvalidArgument(f"event {t.__name__} is not applicable")

    def _queue(self, name: str) -> QueueState:
        q = self.queues.get(name)
        if q is None:
            raise QueueNotFound(f"queue {name!r} does not exist")
        self.dirty.add(name)
        return q

    # -- wiring -------------------------------------------------------------------

    def _declare(self, key: str, ev: DeclareQueue) -> dict[str, Any]:
        _validate_declare(ev)
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
            return {"created": False}
        self.queues[ev.queue] = QueueState(
            ev.queue,
            self.applied,
            durable=ev.durable,
            max_length=ev.max_length,
            overflow=ev.overflow,
            delivery_limit=ev.delivery_limit,
            dead_letter=ev.dead_letter,
            message_ttl_ms=ev.message_ttl_ms,
            declared_by=key,
        )
        self.dirty.add(ev.queue)
        return {"created": True}

    def _delete(self, name: str, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(name)
        del self.queues[name]
        out.append(QueueGone(name, q.qid))
        return {"deleted": q.length}

    def _purge(self, ev: PurgeQueue, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(ev.queue)
        returned = sorted(q.returned)
        n = len(returned) + q.next_pos - q.cursor
        if q.cursor < q.next_pos:
            out.append(RemovedRange(q.qid, q.cursor, q.next_pos))
            q.cursor = q.next_pos
        if returned:
            out.append(Removed(q.qid, returned))
            for p in returned:
                q.counts.pop(p, None)
            q.returned = []
        q.purged += n
        return {"purged": n}

    # -- messages -----------------------------------------------------------------

    def _enqueue(self, origin: Origin, ev: Enqueue, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(ev.queue)
        messages = ev.messages
        starts: list[int] | None = None  # each key span's first position
        fresh: list[tuple[str, int]] = []  # keyed spans enqueued now: remember them
        if ev.keys and self.key_memory > 0:
            messages, starts, fresh = self._dedupe(q, ev)
            if not messages:  # every span was applied before: a re-sent publish
                return {
                    "first_position": starts[0],
                    "count": len(ev.messages),
                    "positions": starts,
                }
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
        out.append(Stored(q.qid, first, messages, self.clock, origin.ts))
        out.append(ReadyMore(q.name))
        if starts is None:
            return {"first_position": first, "count": n}
        for key, pos in fresh:
            self._remember(q.qid, key, pos)
        return {"first_position": first, "count": n, "positions": starts}

    def _dedupe(
        self, q: QueueState, ev: Enqueue
    ) -> tuple[tuple[tuple[bytes, dict[str, Any]], ...], list[int], list[tuple[str, int]]]:
        """Split an Enqueue's key spans into re-sent ones (already applied to ``q``)
        and new ones: (the new spans' messages, each span's first position, the new
        keyed spans with their positions). Changes nothing."""
        known = self.keys
        qid = q.qid
        starts: list[int] = []
        fresh: list[tuple[str, int]] = []
        here: dict[str, int] = {}  # a key twice in one event: the second is a re-send
        keep: list[tuple[int, int]] = []  # (start, end) slices of ev.messages to enqueue
        nxt = q.next_pos
        i = dups = 0
        for key, count in ev.keys:
            old: int | None = None
            if key:
                old = known.get((qid, key))
                if old is None:
                    old = here.get(key)
            if old is not None:
                starts.append(old)
                dups += 1
            else:
                starts.append(nxt)
                if key:
                    here[key] = nxt
                    fresh.append((key, nxt))
                nxt += count
                if keep and keep[-1][1] == i:
                    keep[-1] = (keep[-1][0], i + count)
                else:
                    keep.append((i, i + count))
            i += count
        if not dups:
            return ev.messages, starts, fresh
        self._ignore("duplicate-publish", dups)
        if len(keep) == 1:
            return ev.messages[keep[0][0] : keep[0][1]], starts, fresh
        return tuple(m for a, b in keep for m in ev.messages[a:b]), starts, fresh

    def _remember(self, qid: int, key: str, first: int) -> None:
        """Remember a keyed publish; forget the oldest past ``key_memory`` (log order)."""
        self.keys[(qid, key)] = first
        self._key_qids.append(qid)
        self._key_names.append(key)
        self._key_firsts.append(first)
        self._keys_new.append((self._key_total, qid, key, first))
        self._key_total += 1
        while len(self._key_firsts) > self.key_memory:
            self._key_firsts.popleft()
            del self.keys[(self._key_qids.popleft(), self._key_names.popleft())]

    def _acquire(self, key: str, ev: Acquire, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(ev.queue)
        if q.owner != key or not ev.consumer.startswith(key + "/"):
            # Guarantee 2: only the owner at this log position acquires, for itself.
            self._ignore("not-owner")
            raise NotOwner(f"{key} does not own queue {q.name!r} (owner: {q.owner})")
        if ev.count <= 0:
            return {"count": 0}
        if q.reserved_by is not None:
            # A range reader has the queue: consumers get nothing (DESIGN §11).
            self._ignore("reserved")
            return {"count": 0}
        positions = q.take_ready(ev.count)
        if positions:
            acquired, counts, consumer = q.acquired, q.counts, ev.consumer
            for p in positions:
                acquired[p] = consumer
            out.append(
                Acquired(q.name, q.qid, consumer, positions, [counts.get(p, 0) for p in positions])
            )
        return {"count": len(positions)}

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
            self._ignore("not-acquired", len(other))
        return held, other

    def _accept(self, ev: Accept, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(ev.queue)
        held, other = self._held(q, ev.consumer, ev.positions)
        if held:
            counts = q.counts
            if counts:
                for p in held:
                    counts.pop(p, None)
            q.accepted += len(held)
            out.append(Removed(q.qid, held))
        return {"count": len(held), "not_acquired": other}

    def _release(
        self, name: str, consumer: str, positions: tuple[int, ...] | list[int], out: list[Effect]
    ) -> dict[str, Any]:
        q = self._queue(name)
        held, other = self._held(q, consumer, positions)
        back = 0
        for p in held:
            c = q.counts.get(p, 0) + 1
            if c >= q.delivery_limit:  # at most delivery_limit deliveries (guarantee 5)
                self._dead_letter(q, p, "delivery-limit", out, was_acquired=True)
            else:
                q.counts[p] = c
                heapq.heappush(q.returned, p)
                back += 1
        q.redelivered += back
        if back:
            out.append(ReadyMore(q.name))
        return {"count": len(held), "not_acquired": other}

    def _release_all(self, ev: ReleaseAll, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(ev.queue)
        unread = set(ev.unread)
        held = sorted(p for p, c in q.acquired.items() if c == ev.consumer)
        back = [p for p in held if p in unread]
        for p in back:  # never handed to the application: no delivery attempt
            del q.acquired[p]
            heapq.heappush(q.returned, p)
        if back:
            out.append(ReadyMore(q.name))
        done = self._release(ev.queue, ev.consumer, [p for p in held if p not in unread], out)
        return {"count": done["count"] + len(back), "not_acquired": []}

    def _reject(self, ev: Reject, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(ev.queue)
        held, other = self._held(q, ev.consumer, ev.positions)
        for p in held:
            self._dead_letter(q, p, "rejected", out, was_acquired=True)
        return {"count": len(held), "not_acquired": other}

    def _expire(self, ev: Expire, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(ev.queue)
        if q.reserved_by is not None:
            # TTL waits while a range reader has the queue: a position it may read
            # (or re-read after a crash) must not vanish under it.
            self._ignore("reserved")
            return {"count": 0}
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
            for p in gone:
                q.counts.pop(p, None)
            out.append(Removed(q.qid, gone))
        return {"count": len(gone)}

    # -- range readers (DESIGN §11) -------------------------------------------------------

    def _reserve(self, ev: Reserve, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(ev.queue)
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
        return {
            "reserved_by": q.reserved_by,
            "acquired": len(q.acquired),
            "head": q.head,
            "next_position": q.next_pos,
        }

    def _accept_through(self, ev: AcceptThrough, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(ev.queue)
        if q.reserved_by != ev.holder:
            # Fencing of range readers: only the holder commits, in log order.
            self._ignore("not-holder")
            raise QueueReserved(
                f"queue {q.name!r} is reserved by {q.reserved_by!r}, not {ev.holder!r}"
            )
        through = min(ev.through, q.next_pos)
        n = 0
        back: list[int] = []
        while q.returned and q.returned[0] < through:
            back.append(heapq.heappop(q.returned))
        if back:
            for p in back:
                q.counts.pop(p, None)
            out.append(Removed(q.qid, back))
            n += len(back)
        if through > q.cursor:
            # Fresh positions never acquired: one range delete. (No message in
            # cursor..next_pos is acquired or has a delivery count.)
            out.append(RemovedRange(q.qid, q.cursor, through))
            n += through - q.cursor
            q.cursor = through
        q.accepted += n
        return {"count": n, "head": q.head}

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

        ``x-death-delivery-count`` is how many times it was delivered: the releases
        so far, plus the delivery it was acquired for if it was.
        """
        delivered = q.counts.pop(pos, 0) + (1 if was_acquired else 0)
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
                dlq.counts.pop(head, None)
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
            }
            out.append(Moved(q.qid, pos, dlq.qid, dst, headers, self.clock))
            out.append(ReadyMore(dlq.name))
            if count:
                q.dead_lettered += 1
        else:
            out.append(Removed(q.qid, [pos]))
            if count:
                q.dropped += 1

    # -- ownership (DESIGN §6) ---------------------------------------------------------

    def _next_interested(self, q: QueueState, after: str | None) -> str | None:
        """The next interested member after ``after`` in view order (cyclic), not it."""
        order = [m for m in self.membership.members if m in q.interested and m != after]
        if not order:
            return None
        if after in self.membership.members:
            pos = self.membership.members.index(after)
            later = [m for m in order if self.membership.members.index(m) > pos]
            if later:
                return later[0]
        return order[0]

    def _set_owner(self, q: QueueState, owner: str | None, out: list[Effect]) -> None:
        if q.owner != owner:
            q.owner = owner
            out.append(OwnerChanged(q.name, owner))

    def _interest(self, key: str, ev: Interest, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(ev.queue)
        if ev.on:
            if key not in q.interested:
                q.interested.append(key)
            if q.owner is None:
                self._set_owner(q, key, out)
        else:
            if key in q.interested:
                q.interested.remove(key)
            if q.owner == key:
                self._set_owner(q, self._next_interested(q, key), out)
        return {"owner": q.owner}

    def _handoff(self, key: str, ev: Handoff, out: list[Effect]) -> dict[str, Any]:
        q = self._queue(ev.queue)
        if q.owner != key:
            self._ignore("not-owner")
            raise NotOwner(f"{key} does not own queue {q.name!r}")
        to = ev.to if ev.to in q.interested and ev.to != key else self._next_interested(q, key)
        if to is not None:
            self._set_owner(q, to, out)
        return {"owner": q.owner}

    # -- service leadership (DESIGN §7, cluster/services.py) ----------------------------

    def _service_event(self, key: str, ev: Event, out: list[Effect]) -> dict[str, Any]:
        services = self.services
        if type(ev) is Handover:
            assert isinstance(ev, Handover)
            leader, token, to = services.handover(ev.service, ev.to, self.applied)
            out.append(HandoverRequested(ev.service, leader, token, to))
            return {"service": ev.service, "leader": leader, "token": token, "to": to}
        assert isinstance(ev, (Candidate, Resign))
        try:
            check_candidate(key, ev.service, ev.candidate)
        except InvalidArgument:
            self._ignore("not-own-candidate")  # a broker acts only for its own sessions
            raise
        if type(ev) is Candidate:
            grant = services.candidate(ev.service, ev.candidate, self.applied)
            was = True
        else:
            was, grant = services.resign(ev.service, ev.candidate, self.applied)
        if grant is not None:
            self._granted(grant, out)
        s = services.get(ev.service)
        return {
            "service": ev.service,
            "candidate": ev.candidate,
            "was_candidate": was,
            "leader": None if s is None else s.leader,
            "token": None if s is None or s.leader is None else s.token,
        }

    def _granted(self, g: Grant, out: list[Effect]) -> None:
        out.append(LeaderChanged(g.service, g.leader, g.token, g.previous))

    # -- membership (DESIGN §7) ---------------------------------------------------------

    def _membership_event(
        self, key: str, origin: Origin, ev: Event, out: list[Effect]
    ) -> dict[str, Any]:
        ms = self.membership
        if type(ev) is Heartbeat:
            assert isinstance(ev, Heartbeat)
            if ev.role not in (VOTER, "observer"):
                raise InvalidArgument(f"unknown role {ev.role!r}")
            if ms.heartbeat(
                key, origin.node, origin.runtime, ev.role, ev.address, ev.properties, ev.hold
            ):
                out.append(MembersChanged(ms.view_seq, list(ms.members), [], properties=True))
            return {}
        if type(ev) is Leave:
            ms.leave(key)
            return {}
        if type(ev) is Join:
            return {}  # a marker: the update is captured at or after it (DESIGN §8)
        if type(ev) is Propose:
            assert isinstance(ev, Propose)
            why = ms.propose(key, ev.view_seq, list(ev.members), ev.cluster_id)
            if why is not None:
                self._ignore("bad-proposal")
                raise InvalidArgument(why)
            return {}
        assert isinstance(ev, Vote)
        established = ms.vote(key, ev.view_seq, ev.yes)
        if established is not None:
            members, removed = established
            for gone in removed:
                self._drop_member(gone, out)
            out.append(MembersChanged(ms.view_seq, members, removed))
        return {}

    def _drop_member(self, key: str, out: list[Effect]) -> None:
        """A runtime left the view: what its consumers held goes back (guarantee 6),
        its queues pass on, and the non-durable queues it declared are deleted."""
        prefix = key + "/"
        for name in sorted(self.queues):
            q = self.queues[name]
            if not q.durable and q.declared_by == key:
                self._delete(name, out)
                continue
            by_consumer: dict[str, list[int]] = {}
            for p, c in q.acquired.items():
                if c.startswith(prefix):
                    by_consumer.setdefault(c, []).append(p)
            for consumer in sorted(by_consumer):
                self._release(name, consumer, sorted(by_consumer[consumer]), out)
            if key in q.interested:
                q.interested.remove(key)
                self.dirty.add(name)
            if q.owner == key:
                self._set_owner(q, self._next_interested(q, key), out)
                self.dirty.add(name)
        # Its broker-level and session candidacies go; a service it led gets a new
        # term at this log position (DESIGN §7).
        for grant in self.services.drop_member(key, self.applied, self.membership.member_set):
            self._granted(grant, out)

    # -- checkpoints (DESIGN §8) ------------------------------------------------------

    def _checkpoint(self, key: str, ev: Checkpoint, out: list[Effect]) -> dict[str, Any]:
        if key != self.membership.leader():
            self._ignore("not-leader")
            raise InvalidArgument(f"{key} is not the leader; only the leader checkpoints")
        mine = next((d for o, d in self.checkpoints if o == ev.prev_offset), None)
        # The digest of the state with this event applied (its seq counted, the
        # earlier checkpoints in it), before this checkpoint is recorded.
        digest = self.digest()
        self.checkpoints = (self.checkpoints + [(self.applied, digest)])[-2:]
        out.append(CheckpointApplied(self.applied, digest, ev.prev_offset, ev.prev_digest, mine))
        return {"offset": self.applied, "digest": digest}

    # -- persistence and digests ----------------------------------------------------

    def meta_snapshot(self) -> list[Any]:
        """The non-queue part of the state, canonical."""
        return [
            self.applied,
            self.clock,
            sorted(self.last_seq.items()),
            sorted(self.ignored.items()),
            self.membership.snapshot(),
            # How many publish keys were ever remembered; the keys themselves are
            # stored one by one as they come (take_keys), not with every batch.
            self._key_total,
            self.services.snapshot(),
            [list(c) for c in self.checkpoints],
        ]

    def restore_meta(self, snap: list[Any]) -> None:
        self.applied, self.clock = snap[0], snap[1]
        self.last_seq = {k: v for k, v in snap[2]}
        self.ignored = {k: v for k, v in snap[3]}
        self.membership.restore(snap[4])
        self._key_total = snap[5]
        # Snapshots written before service leadership have no services entry.
        self.services.restore(snap[6] if len(snap) > 6 else [])
        self.checkpoints = [(o, d) for o, d in snap[7]] if len(snap) > 7 else []

    def full_snapshot(self) -> list[Any]:
        """Everything replicated, for a joining broker (DESIGN §8): the meta snapshot,
        the publish keys and every queue's index (not the messages)."""
        return [
            self.meta_snapshot(),
            [list(e) for e in self.key_entries()],
            [self.queues[name].snapshot() for name in sorted(self.queues)],
        ]

    def install(self, snap: list[Any]) -> None:
        """Replace this (empty) state by a :meth:`full_snapshot` taken elsewhere.
        Everything is marked dirty, so the next take_dirty()/take_keys() write it all."""
        meta, keys, queues = snap
        self.restore_meta(meta)
        entries = [(e[0], e[1], e[2], e[3]) for e in keys]
        self.restore_keys(entries)
        self._keys_new = list(entries)
        self.queues = {}
        for qsnap in queues:
            q = QueueState.restore(qsnap)
            self.queues[q.name] = q
        self.dirty = set(self.queues)
        self._meta_dirty = True

    def key_entries(self) -> list[tuple[int, int, str, int]]:
        """The remembered publish keys as (seq, qid, key, first position), in log order."""
        low = self._key_total - len(self._key_firsts)
        return [
            (low + i, qid, key, first)
            for i, (qid, key, first) in enumerate(
                zip(self._key_qids, self._key_names, self._key_firsts)
            )
        ]

    def restore_keys(self, entries: list[tuple[int, int, str, int]]) -> None:
        """Restore the key memory from :meth:`key_entries` (after :meth:`restore_meta`)."""
        entries = sorted(entries)[-self.key_memory :] if self.key_memory > 0 else []
        self._key_qids = deque(e[1] for e in entries)
        self._key_names = deque(e[2] for e in entries)
        self._key_firsts = deque(e[3] for e in entries)
        self.keys = {(qid, key): first for _, qid, key, first in entries}
        self._keys_new = []

    def keys_floor(self) -> int:
        """The sequence number of the oldest publish key still remembered."""
        return self._key_total - len(self._key_firsts)

    def take_keys(self) -> tuple[list[tuple[int, int, str, int]], int]:
        """Keys remembered since the last call, and the sequence number below which keys
        are forgotten. The driver stores them with the batch's offset."""
        new, self._keys_new = self._keys_new, []
        return new, self.keys_floor()

    def take_dirty(self) -> tuple[list[Any] | None, dict[str, list[Any] | None]]:
        """Snapshots of what changed since the last call: (meta or None, {queue: snap or None
        if deleted}). The driver writes them with the batch's offset."""
        meta = self.meta_snapshot() if self._meta_dirty else None
        queues = {
            name: (self.queues[name].snapshot() if name in self.queues else None)
            for name in self.dirty
        }
        self.dirty = set()
        self._meta_dirty = False
        return meta, queues

    def digest(self) -> str:
        """SHA-256 over the whole replicated state (hex); equal on replicas of one prefix."""
        h = hashlib.sha256()
        packer = msgpack.Packer(use_bin_type=True)
        h.update(packer.pack(self.meta_snapshot()))
        # Publish keys in log order (the order decides what is forgotten first).
        h.update(packer.pack([list(self._key_qids), list(self._key_names), list(self._key_firsts)]))
        for name in sorted(self.queues):
            h.update(packer.pack(self.queues[name].snapshot()))
        return h.hexdigest()


def _validate_declare(ev: DeclareQueue) -> None:
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
