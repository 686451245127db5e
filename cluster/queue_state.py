"""One queue's replicated index (docs/design.md §2, §5; docs/events.md, "Messages").
Pure: no I/O, no clock.

:class:`QueueState` is the data the message transitions of cluster/queues.py change:
positions, who holds what, the two counters of redelivered messages, the delayed ones,
the queue's settings and counters, and its canonical snapshot.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import DEFAULT_DEDUPE_WINDOW_MS, OVERFLOW_POLICIES, DeclareQueue
from batonmq.cluster.exchanges import check_exchange_name

#: The longest queue name.
MAX_QUEUE_NAME: Final = 255

__all__ = [
    "QueueState", "WORK_SETTINGS", "POLICY_FIELDS", "RETRY_POLICIES", "MAX_PRIORITY",
    "MAX_QUEUE_NAME", "SETTING_NAMES", "validate_declare", "kept_ttls", "check_ttls",
    "IMMEDIATE_MS", "MAX_TTL_MS", "Ledger",
]

#: The work-queue settings of DeclareQueue after the first six (docs/events.md), in the
#: order they are compared and snapshotted; each is a QueueState field of that name.
WORK_SETTINGS: Final = (
    "retry",
    "retry_delay_ms",
    "retry_max_ms",
    "ack_timeout_ms",
    "max_priority",
    "single_active_consumer",
    "dedupe_window_ms",
    "dead_letter_exchange",
    "dead_letter_routing_key",
)
#: The settings a policy may change (cluster/policies.py): a queue's attributes of these
#: names hold its *effective* values; :attr:`QueueState.declared` keeps the declared ones
#: while a policy applies.
POLICY_FIELDS: Final = (
    "max_length",
    "overflow",
    "delivery_limit",
    "dead_letter",
    "dead_letter_exchange",
    "dead_letter_routing_key",
    "message_ttl_ms",
    "retry",
    "retry_delay_ms",
    "retry_max_ms",
)
#: A message published with a TTL of 0 ("deliver now or drop", AMQP's expiration "0")
#: is handed out only by an acquire applied within this many ms of the replicated clock
#: after its publish (the time its queue's owner takes to see it and acquire it).
IMMEDIATE_MS: Final = 200
#: The longest own TTL a message may have, ms (as RabbitMQ's, 2^32 - 1).
MAX_TTL_MS: Final = 2**32 - 1
#: The highest message priority a queue may allow.
MAX_PRIORITY: Final = 9
#: How the delay before a retry grows with the delivery count n (1 after one failure):
#: fixed: d; linear: d * n; exponential: d * 2 ** (n - 1); all capped at retry_max_ms.
RETRY_POLICIES: Final = ("fixed", "linear", "exponential")


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
    retry: str = ""  # the retry policy ("": none; RETRY_POLICIES)
    retry_delay_ms: int = 0
    retry_max_ms: int | None = None
    ack_timeout_ms: int | None = None  # consumers' default ack timeout (the brokers keep it)
    # A priority queue (max_priority > 0) keeps no never-delivered range: every ready
    # message is in prio_heap as (-priority, position), so the highest priority goes
    # first and, within one, the lowest position; prio holds the priority (> 0) of each
    # message still in the queue.
    max_priority: int = 0
    # One consumer at a time gets the queue's messages: the first consumer (in
    # subscription order) of its owner, which keeps the queue while it has one; then
    # the first interested broker, in the order interest was applied (docs/events.md).
    single_active_consumer: bool = False
    dedupe_window_ms: int = DEFAULT_DEDUPE_WINDOW_MS  # publish keys are remembered this long
    # Dead letters routed through an exchange (cluster/exchanges.py) with this routing
    # key, or (None) each with the key it was published with: then ``rkeys`` keeps
    # those keys as runs, (first position, key), ascending; a plain Enqueue's key is
    # the queue's name (the default exchange's routing).
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    rkeys: list[tuple[int, str]] = field(default_factory=list)
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
    timed_out: int = 0  # failed deliveries that were an ack timeout
    # Counted since this replica began applying (not replicated state: not in the
    # snapshot or the digest); the admin listener's metrics read them (docs/admin.md).
    delivered: int = field(default=0, compare=False)
    released: int = field(default=0, compare=False)
    rejected: int = field(default=0, compare=False)
    # Delayed messages (published with a delay, or released with one): position ->
    # the replicated time (ms) it is ready (again), and a heap of (time, position)
    # (stale entries are skipped). A delayed publish may lie in the never-delivered
    # range: ``delayed_ahead`` counts those (at or above ``cursor``); derived, so not
    # part of the snapshot.
    delayed: dict[int, int] = field(default_factory=dict)
    delay_heap: list[tuple[int, int]] = field(default_factory=list)
    delayed_ahead: int = 0
    prio: dict[int, int] = field(default_factory=dict)
    prio_heap: list[tuple[int, int]] = field(default_factory=list)
    # A message's own TTL (flag message_ttl): position -> the replicated time (ms) after
    # which it is expired, for the messages still in the queue that have one. Kept as a
    # trailing part of the snapshot only while not empty.
    ttls: dict[int, int] = field(default_factory=dict)
    # The headers of such messages when the queue dead-letters through a headers
    # exchange (the index has no headers otherwise; that exchange routes by them), kept
    # until they leave; a trailing snapshot part only while not empty.
    dl_headers: dict[int, dict[str, Any]] = field(default_factory=dict)
    # The user that declared it (flag user_limits: it counts against the user's
    # max_queues); None for a queue declared before the flag, or by the broker itself.
    user: str | None = None
    # Queue expiry (flag queue_expiry): deleted once unused for this long (None: never),
    # and when it was last used, by the replicated clock: declared (again), an acquire,
    # a broker's consumer interest coming or going (docs/events.md "Queue expiry").
    # Kept only for a queue that expires, so other queues' snapshots stay as they were.
    expires_ms: int | None = None
    used_at: int = 0
    # The policy that applies (flag policies, cluster/policies.py), and the declared
    # values of POLICY_FIELDS while one does (the attributes then hold the effective
    # ones). Derived from the replicated policies, so not part of the snapshot: it
    # keeps the declared settings, and a restore applies the policies again.
    policy: str | None = None
    declared: dict[str, Any] | None = None

    @property
    def head(self) -> int:
        """The lowest ready position (``next_pos`` if none is ready)."""
        if self.prio_heap:  # (a priority queue: its heap is in priority order)
            return min(p for _, p in self.prio_heap)
        return self.returned[0] if self.returned else self.cursor

    @property
    def ready(self) -> int:
        return (
            self.next_pos - self.cursor + len(self.returned) + len(self.prio_heap)
            - self.delayed_ahead
        )

    @property
    def length(self) -> int:
        """Messages counted against max_length: ready + acquired + delayed."""
        return self.ready + len(self.acquired) + len(self.delayed)

    def next_due(self) -> int | None:
        """When the earliest delayed message is ready again (ms), or None."""
        heap, delayed = self.delay_heap, self.delayed
        while heap and delayed.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # stale: the message left the queue meanwhile
        return heap[0][0] if heap else None

    def wake(self, clock: int) -> int:
        """Delayed messages whose time has come (by the replicated ``clock``) are ready
        again; returns how many."""
        n = 0
        heap, delayed = self.delay_heap, self.delayed
        while heap and heap[0][0] <= clock:
            due, p = heapq.heappop(heap)
            if delayed.get(p) == due:
                del delayed[p]
                if p >= self.cursor:
                    self.delayed_ahead -= 1  # ready where it is, in the fresh range
                else:
                    self.make_ready(p)
                n += 1
        return n

    def make_ready(self, pos: int) -> None:
        """The message at ``pos`` (below the cursor, not acquired) is ready again."""
        if self.max_priority:
            heapq.heappush(self.prio_heap, (-self.prio.get(pos, 0), pos))
        else:
            heapq.heappush(self.returned, pos)

    def take_prio(self, below: int) -> list[int]:
        """Remove and return the ready positions ``< below`` of a priority queue,
        ascending."""
        gone = sorted(p for _, p in self.prio_heap if p < below)
        if gone:
            cut = set(gone)
            self.prio_heap = [e for e in self.prio_heap if e[1] not in cut]
            heapq.heapify(self.prio_heap)
        return gone

    def ready_set(self) -> set[int]:
        """The released positions, and a priority queue's ready ones, as a set (for
        :meth:`holds` over many positions)."""
        out = set(self.returned)
        if self.prio_heap:
            out.update(p for _, p in self.prio_heap)
        return out

    def delay(self, pos: int, due: int) -> None:
        """The message at ``pos`` (not ready, not acquired) is ready at ``due`` (ms)."""
        self.delayed[pos] = due
        heapq.heappush(self.delay_heap, (due, pos))
        if pos >= self.cursor:
            self.delayed_ahead += 1

    @property
    def tracks_keys(self) -> bool:
        """Whether the messages' routing keys are kept (:attr:`rkeys`)."""
        return self.dead_letter_exchange is not None and self.dead_letter_routing_key is None

    def note_key(self, pos: int, key: str) -> None:
        """Messages from ``pos`` on (the newest) were published with routing ``key``.
        Runs wholly below every message still in the queue are forgotten now and then."""
        runs = self.rkeys
        if runs and runs[-1][1] == key:
            return
        runs.append((pos, key))
        if len(runs) > 32:
            low = min(
                self.head,
                min(self.acquired, default=self.next_pos),
                min(self.delayed, default=self.next_pos),
            )
            i = bisect.bisect_right(runs, (low, "\U0010ffff")) - 1  # the run holding low
            if i > 0:
                del runs[:i]

    def key_of(self, pos: int) -> str:
        """The routing key the message at ``pos`` was published with (the queue's name
        where none is known)."""
        i = bisect.bisect_right(self.rkeys, (pos, "\U0010ffff")) - 1
        return self.rkeys[i][1] if i >= 0 else self.name

    def declared_settings(self) -> dict[str, Any]:
        """The declared values of :data:`POLICY_FIELDS` (a policy may have changed the
        attributes)."""
        if self.declared is not None:
            return dict(self.declared)
        return {name: getattr(self, name) for name in POLICY_FIELDS}

    def settings(self) -> tuple[Any, ...]:
        """The settings as declared (what a declare again is compared with, and what the
        snapshot keeps), whatever a policy made of them."""
        d = self.declared or {}

        def get(name: str) -> Any:
            return d[name] if name in d else getattr(self, name)

        return (
            self.durable,
            get("max_length"),
            get("overflow"),
            get("delivery_limit"),
            get("dead_letter"),
            get("message_ttl_ms"),
        ) + tuple(get(name) for name in WORK_SETTINGS)

    def unused_past_expiry(self, clock: int) -> bool:
        """Whether the queue expires at replicated time ``clock``: it has an
        ``expires_ms`` and was unused that long (no broker's consumer interest, no range
        reader, no acquire or declare since ``used_at``)."""
        return (
            self.expires_ms is not None
            and not self.interested
            and self.reserved_by is None
            and clock - self.used_at >= self.expires_ms
        )

    def retry_delay(self, count: int) -> int:
        """The retry policy's delay (ms) before a message that failed ``count`` times
        is ready again (0: no policy)."""
        if not self.retry:
            return 0
        d = self.retry_delay_ms
        if self.retry == "linear":
            d *= count
        elif self.retry == "exponential":
            d <<= min(count - 1, 40)
        return d if self.retry_max_ms is None else min(d, self.retry_max_ms)

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
            "retry": self.retry or None,
            "retry_delay_ms": self.retry_delay_ms,
            "retry_max_ms": self.retry_max_ms,
            "ack_timeout_ms": self.ack_timeout_ms,
            "max_priority": self.max_priority or None,
            "single_active_consumer": self.single_active_consumer,
            "dedupe_window_ms": self.dedupe_window_ms,
            "dead_letter_exchange": self.dead_letter_exchange,
            "dead_letter_routing_key": self.dead_letter_routing_key,
            "expires_ms": self.expires_ms,
            "used_at": self.used_at if self.expires_ms is not None else None,
            "timed_out": self.timed_out,
            "owner": self.owner,
            "interested": list(self.interested),
            "reserved_by": self.reserved_by,
            "head": self.head,
            "delayed": len(self.delayed),
            "policy": self.policy,
        }

    def forget(self, positions: list[int] | tuple[int, ...]) -> None:
        """Drop the counters (and own TTLs) of messages that left the queue."""
        counts, acq, prio, ttls = self.counts, self.acq_counts, self.prio, self.ttls
        for p in positions:
            counts.pop(p, None)
            acq.pop(p, None)
            if prio:
                prio.pop(p, None)
            if ttls:
                ttls.pop(p, None)
                self.dl_headers.pop(p, None)

    # -- a message's own TTL (flag message_ttl; docs/events.md "A message's own TTL") ------

    def set_ttls(self, first: int, ttls: Sequence[int | None], clock: int) -> None:
        """The messages enqueued from position ``first`` on at replicated time ``clock``
        have these own TTLs (ms; None: none; 0: :data:`IMMEDIATE_MS`)."""
        for i, t in enumerate(ttls):
            if t is not None:
                self.ttls[first + i] = clock + (t or IMMEDIATE_MS)

    def outlived(self, pos: int, clock: int) -> bool:
        """Whether the message at ``pos`` outlived its own TTL at replicated ``clock``."""
        t = self.ttls.get(pos)
        return t is not None and clock > t

    def peek(self) -> int | None:
        """The position :meth:`take_ready` would take next (None: nothing is ready)."""
        if self.max_priority:
            return self.prio_heap[0][1] if self.prio_heap else None
        if self.returned:
            return self.returned[0]
        p = self.cursor
        while p < self.next_pos and p in self.delayed:
            p += 1
        return p if p < self.next_pos else None

    def expired_heads(self, clock: int) -> list[int]:
        """Take the messages at the head of the queue whose own TTL ran out by
        ``clock``, up to the first one that has not (as RabbitMQ expires them at the
        head only); returns their positions."""
        out: list[int] = []
        while self.ttls:
            p = self.peek()
            if p is None or not self.outlived(p, clock):
                break
            out.extend(self.take_ready(1))
        return out

    def take_live(self, count: int, clock: int, expire: Callable[[int], None]) -> list[int]:
        """:meth:`take_ready`, where a message whose own TTL ran out by ``clock`` is
        passed to ``expire`` as it reaches the head instead of being handed out."""
        out: list[int] = []
        while len(out) < count:
            taken = self.take_ready(count - len(out))
            if not taken:
                break
            for p in taken:
                if self.outlived(p, clock):
                    expire(p)
                else:
                    out.append(p)
        return out

    def drop_ttls(self, low: int, high: int) -> None:
        """Forget the own TTLs of positions ``low <= p < high`` (a fresh range gone)."""
        for p in [p for p in self.ttls if low <= p < high]:
            del self.ttls[p]
            self.dl_headers.pop(p, None)

    def keep_headers(
        self, first: int, ttls: Sequence[int | None], messages: Sequence[tuple[bytes, dict[str, Any]]]
    ) -> None:
        """Keep the headers of the messages from ``first`` on that have an own TTL (the
        queue dead-letters through a headers exchange: it routes by them), without the
        AMQP edge's fixed properties (a headers exchange matches the headers table)."""
        for i, (t, (_, headers)) in enumerate(zip(ttls, messages)):
            if t is not None:
                self.dl_headers[first + i] = {
                    k: v for k, v in headers.items() if k != "amqp-properties"}

    def take_delayed(self, below: int) -> list[int]:
        """Remove and return the delayed positions ``< below``, ascending."""
        gone = sorted(p for p in self.delayed if p < below)
        for p in gone:
            del self.delayed[p]
            if p >= self.cursor:
                self.delayed_ahead -= 1
        return gone

    def holds(self, pos: int, returned: set[int] | None = None) -> bool:
        """Is the message at ``pos`` still in the queue (ready or acquired)?
        ``returned``: :meth:`ready_set`, when asking for many positions."""
        if self.cursor <= pos < self.next_pos or pos in self.acquired or pos in self.delayed:
            return True
        return pos in (returned if returned is not None else self.ready_set())

    def live_desc(self) -> tuple[range, list[int]]:
        """Every position still in the queue, back to front: the never-delivered
        range ``[cursor, next_pos)`` descending, then the acquired and released ones
        (all below the cursor) descending. O(acquired + released), not O(length)."""
        below = sorted(
            self.ready_set()
            | self.acquired.keys()
            | {p for p in self.delayed if p < self.cursor},
            reverse=True,
        )
        return range(self.next_pos - 1, self.cursor - 1, -1), below

    def take_ready(self, count: int) -> list[int]:
        """Remove and return up to ``count`` ready positions, lowest first (guarantee 7)."""
        out: list[int] = []
        if self.max_priority:
            heap = self.prio_heap
            while heap and len(out) < count:
                out.append(heapq.heappop(heap)[1])
            return out
        returned = self.returned
        while returned and len(out) < count:
            out.append(heapq.heappop(returned))
        if self.delayed_ahead:
            self._take_fresh_around_delayed(count, out)
            return out
        k = min(count - len(out), self.next_pos - self.cursor)
        if k > 0:
            out.extend(range(self.cursor, self.cursor + k))
            self.cursor += k
        return out

    def _take_fresh_around_delayed(self, count: int, out: list[int]) -> None:
        """take_ready's fresh part when delayed publishes lie in the fresh range: the
        cursor passes them by (they stay delayed, below the cursor now)."""
        delayed = self.delayed
        p = self.cursor
        while len(out) < count and p < self.next_pos:
            if p in delayed:
                self.delayed_ahead -= 1
            else:
                out.append(p)
            p += 1
        self.cursor = p

    def skip_to(self, pos: int) -> list[int]:
        """Move the cursor up to ``pos`` (at most ``next_pos``); returns the fresh
        positions passed that are not delayed (the delayed ones stay delayed)."""
        end = min(pos, self.next_pos)
        if end <= self.cursor:
            return []
        if not self.delayed_ahead:
            passed = list(range(self.cursor, end))
        else:
            passed = []
            for p in range(self.cursor, end):
                if p in self.delayed:
                    self.delayed_ahead -= 1
                else:
                    passed.append(p)
        self.cursor = end
        return passed

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
            [self.acquisitions, self.failed_deliveries, self.given_back, self.timed_out],
            sorted(self.delayed.items()),
            [sorted(self.prio.items()), sorted(p for _, p in self.prio_heap)],
            [list(r) for r in self.rkeys],
        ] + self._flagged_parts()

    def _flagged_parts(self) -> list[Any]:
        """The snapshot's trailing parts of flagged settings, each only when set, so a
        queue without them has the snapshot (and digest) of builds before the flags
        (docs/design.md §15): [user] (user_limits), [user, expires_ms, used_at]
        (queue_expiry), then the messages' own TTLs (message_ttl) while any has one."""
        if self.ttls:
            parts = [self.user, self.expires_ms, self.used_at, sorted(self.ttls.items())]
            return parts + [sorted(self.dl_headers.items())] if self.dl_headers else parts
        if self.expires_ms is not None:
            return [self.user, self.expires_ms, self.used_at]
        return [self.user] if self.user is not None else []

    @classmethod
    def restore(cls, snap: list[Any]) -> "QueueState":
        (name, qid, settings, declared_by, next_pos, cursor, returned, acquired, counts, crc, st,
         owner, interested) = snap[:13]
        durable, max_length, overflow, delivery_limit, dead_letter, ttl = settings[:6]
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
        for name, value in zip(WORK_SETTINGS, settings[6:]):  # absent in older snapshots
            setattr(q, name, value)
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
            q.acquisitions, q.failed_deliveries, q.given_back = snap[15][:3]
            q.timed_out = snap[15][3] if len(snap[15]) > 3 else 0
        if len(snap) > 16:  # absent in snapshots from before delayed releases
            q.delayed = {p: t for p, t in snap[16]}
            q.delay_heap = sorted((t, p) for p, t in snap[16])
            q.delayed_ahead = sum(1 for p in q.delayed if p >= q.cursor)
        if len(snap) > 17:  # absent in snapshots from before priorities
            prio, ready = snap[17]
            q.prio = {p: n for p, n in prio}
            q.prio_heap = sorted((-q.prio.get(p, 0), p) for p in ready)
        if len(snap) > 18:  # absent in snapshots from before dead-letter exchanges
            q.rkeys = [(p, k) for p, k in snap[18]]
        if len(snap) > 19:  # only a queue a user declared under the flag user_limits
            q.user = snap[19]
        if len(snap) > 21:  # only a queue that expires (flag queue_expiry)
            q.expires_ms, q.used_at = snap[20], snap[21]
        if len(snap) > 22:  # only while messages have their own TTL (flag message_ttl)
            q.ttls = {p: t for p, t in snap[22]}
        if len(snap) > 23:  # ... and their headers, for a headers dead-letter exchange
            q.dl_headers = {p: h for p, h in snap[23]}
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


def check_ttls(ttls: Sequence[int | None], n: int) -> None:
    """A publish's own TTLs (flag message_ttl): none, or one per message of its ``n``,
    each 0..:data:`MAX_TTL_MS` or None.

    Raises:
        InvalidArgument: they are not.
    """
    if ttls and (len(ttls) != n or any(t is not None and not 0 <= t <= MAX_TTL_MS for t in ttls)):
        raise InvalidArgument(f"a message's own TTL must be 0..{MAX_TTL_MS} ms, one each")


def kept_ttls(
    keys: Sequence[tuple[str, int]], ttls: Sequence[int | None], starts: Sequence[int], first: int
) -> list[int | None]:
    """The own TTLs of an Enqueue's messages that are enqueued now (a re-sent key span is
    not): a span is new where its start is the next free position from ``first``."""
    out: list[int | None] = []
    i, nxt = 0, first
    for (_key, count), start in zip(keys, starts):
        if start == nxt:
            out.extend(ttls[i : i + count])
            nxt += count
        i += count
    return out


#: The names of a queue's settings, in the order of :meth:`QueueState.settings`.
SETTING_NAMES: Final = (
    "durable", "max_length", "overflow", "delivery_limit", "dead_letter", "message_ttl_ms",
) + WORK_SETTINGS


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
    if ev.expires_ms is not None and ev.expires_ms < 1:
        raise InvalidArgument("expires must be positive (or None: the queue never expires)")
    if ev.dead_letter is not None and (ev.dead_letter == ev.queue or not ev.dead_letter):
        raise InvalidArgument("a queue cannot be its own dead-letter queue")
    if ev.dead_letter_exchange is not None:
        if ev.dead_letter is not None:
            raise InvalidArgument("a queue dead-letters to a queue or through an exchange, not both")
        if ev.dead_letter_exchange:  # "" is the default exchange
            check_exchange_name(ev.dead_letter_exchange)
    elif ev.dead_letter_routing_key is not None:
        raise InvalidArgument("dead_letter_routing_key needs a dead_letter_exchange")
    if ev.retry:
        if ev.retry not in RETRY_POLICIES:
            raise InvalidArgument(f"retry must be one of {', '.join(RETRY_POLICIES)}")
        if ev.retry_delay_ms < 1:
            raise InvalidArgument("retry_delay_ms must be at least 1 with a retry policy")
        if ev.retry_max_ms is not None and ev.retry_max_ms < ev.retry_delay_ms:
            raise InvalidArgument("retry_max_ms must be at least retry_delay_ms")
    elif ev.retry_delay_ms or ev.retry_max_ms is not None:
        raise InvalidArgument("retry_delay_ms and retry_max_ms need a retry policy")
    if ev.ack_timeout_ms is not None and ev.ack_timeout_ms < 1:
        raise InvalidArgument("ack_timeout_ms must be positive (or None)")
    if ev.dedupe_window_ms < 0:
        raise InvalidArgument("dedupe_window_ms must not be negative (0: no deduplication)")
    if not 0 <= ev.max_priority <= MAX_PRIORITY:
        raise InvalidArgument(f"max_priority must be 0..{MAX_PRIORITY} (0: not a priority queue)")
