"""Publishes forwarded from one data partition to another (docs/design.md §16).

Pure: no I/O, no clock. A publish through an exchange whose queues are on several data
partitions is appended once, to one of them (its *home*), as a
:class:`~batonmq.cluster.events.FanOut`: the home enqueues it on its own queues and keeps
the rest as *outbound* entries, one per other partition, each with the next number of
that (home, target) pair. A forwarder (the home partition's leader) appends each entry to
its target, in number order, as a :class:`~batonmq.cluster.events.ForwardIn`, which the
target applies only if its number is the next it expects from that home (a lower one
was applied already: a duplicate; a higher one leaves a gap: refused until the lower
ones came), then appends :class:`~batonmq.cluster.events.ForwardDone` on the home, which
drops the entries through that number. A forwarder that dies between the steps leaves the
entries; the next one sends them again and the target takes each once. So a publish is
one record where it is confirmed, and reaches every partition completely or is retried
until it does.

Dead letters take the same path. On a data partition, a message dead-lettered to a queue
that is not on this partition, or through an exchange (whose bindings are on control),
leaves its queue in the apply that dead-letters it: its body moves in the store to this
partition's *dead-letter outbox* (queue id :data:`OUTBOX_QID`, position = its number)
and it is kept as an unrouted :class:`DeadLetter`. The partition's leader routes it as a
publish is routed at the edge (the dead-letter queue by the placement map; an exchange by
control's bindings) and appends :class:`~batonmq.cluster.events.RouteDeadLetter` here:
the first one applied decides, for every replica alike; it copies the message to the
queues on this partition and keeps an outbound entry (the body stays in the outbox) for
each other partition, forwarded as above. The outbox body goes when no entry needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from batonmq.cluster.effects import Effect, Removed
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import (
    FanOut, ForwardDone, ForwardIn, Origin, RouteDeadLetter, RoutedEnqueue,
)
from batonmq.cluster.results import Routed

from batonmq.cluster.queue_state import MAX_PRIORITY, QueueState, check_ttls

__all__ = [
    "Outbound", "DeadLetter", "Forwards", "ForwardGap", "apply_forward", "OUTBOX_QID",
    "OUTBOX_NAME",
]

#: The store's queue id of a data partition's dead letters in flight (their bodies, by
#: number); far above any queue's id (a log offset).
OUTBOX_QID = 1 << 62
#: Its name in a join update (not a valid queue name: never a queue's).
OUTBOX_NAME = "\x00dead-letter outbox"


class IndexView(Protocol):
    """What forwarding uses of a partition's queues (cluster/queues.py's QueueIndex)."""

    queues: dict[str, QueueState]

    def enqueue_routed(self, origin: Origin, ev: RoutedEnqueue, out: list[Effect]) -> Routed:
        ...

    def move_dead_letter(
        self, src_qid: int, src_pos: int, targets: list[QueueState], key: str | None,
        headers: dict[str, object], first: dict[str, object] | None, out: list[Effect],
        keep: bool = False,
    ) -> bool:
        ...


class ForwardGap(InvalidArgument):
    """A ForwardIn whose number is past the next one the target expects from its home."""


@dataclass(slots=True)
class Outbound:
    """One publish waiting to be forwarded: to ``queues`` on the target partition."""

    queues: tuple[str, ...]
    messages: tuple[tuple[bytes, dict[str, Any]], ...]
    keys: tuple[tuple[str, int], ...]
    exchange: str
    routing_key: str
    delay_ms: int
    not_before: int
    priority: int
    ts: int  # the publish's envelope time (when it was published)
    # A dead letter: its number in the outbox, where its body is (messages is empty);
    # -1: a publish, its messages inline.
    outbox: int = -1
    # The messages' own TTLs (flag message_ttl), as the FanOut had them; () if none has
    # one (a dead letter never: dead-lettering drops a message's own TTL).
    ttls: tuple[int | None, ...] = ()

    def snapshot(self) -> list[Any]:
        snap = [
            list(self.queues), [[b, h] for b, h in self.messages],
            [list(k) for k in self.keys], self.exchange, self.routing_key, self.delay_ms,
            self.not_before, self.priority, self.ts,
        ]
        # Trailing parts, each only when needed, so that an entry without them is as
        # builds before them write and read it: the outbox number (-1 for a publish with
        # ttls), then the ttls.
        if self.outbox >= 0 or self.ttls:
            snap.append(self.outbox)
        if self.ttls:
            snap.append(list(self.ttls))
        return snap

    @classmethod
    def restore(cls, snap: list[Any]) -> "Outbound":
        return cls(
            tuple(snap[0]), tuple((bytes(b), dict(h)) for b, h in snap[1]),
            tuple((str(k), int(n)) for k, n in snap[2]), snap[3], snap[4], snap[5], snap[6],
            snap[7], snap[8], int(snap[9]) if len(snap) > 9 else -1,
            tuple(snap[10]) if len(snap) > 10 else (),
        )


@dataclass(slots=True)
class DeadLetter:
    """A dead letter in the outbox, not routed yet: from ``queue`` to the queue
    ``dead_letter``, or through ``exchange`` with ``routing_key``."""

    queue: str
    dead_letter: str | None
    exchange: str | None
    routing_key: str

    def snapshot(self) -> list[Any]:
        return [self.queue, self.dead_letter, self.exchange, self.routing_key]

    @classmethod
    def restore(cls, snap: list[Any]) -> "DeadLetter":
        return cls(str(snap[0]), snap[1], snap[2], str(snap[3]))


class Forwards:
    """A data partition's outbound entries (by target and number) and, per home
    partition, the number of the next entry it expects."""

    __slots__ = ("outbound", "next_number", "expected", "unrouted", "next_dead", "refs")

    def __init__(self) -> None:
        self.outbound: dict[int, dict[int, Outbound]] = {}  # target -> number -> entry
        self.next_number: dict[int, int] = {}  # target -> the next entry's number
        self.expected: dict[int, int] = {}  # home -> the next number it takes from it
        self.unrouted: dict[int, DeadLetter] = {}  # outbox number -> dead letter
        self.next_dead = 0  # the next dead letter's number in the outbox
        self.refs: dict[int, int] = {}  # outbox number -> outbound entries with it (derived)

    def __bool__(self) -> bool:
        return bool(self.outbound or self.next_number or self.expected or self.next_dead)

    def add(self, target: int, entry: Outbound) -> int:
        """Keep ``entry`` for ``target``; returns its number."""
        n = self.next_number.get(target, 0)
        self.next_number[target] = n + 1
        self.outbound.setdefault(target, {})[n] = entry
        if entry.outbox >= 0:
            self.refs[entry.outbox] = self.refs.get(entry.outbox, 0) + 1
        return n

    def hold(self, letter: DeadLetter) -> int:
        """Keep a dead letter whose body goes to the outbox; returns its number there."""
        n = self.next_dead
        self.next_dead = n + 1
        self.unrouted[n] = letter
        return n

    def progress(self) -> dict[str, list[list[int]]]:
        """Where forwarding stands: ``to``: [target, its first entry not done (the next
        number if none), the next number]; ``from``: [home, the next number taken]."""
        to = []
        for t in sorted(self.next_number):
            nxt = self.next_number[t]
            to.append([t, min(self.outbound.get(t, {nxt: None})), nxt])
        return {"to": to, "from": sorted([h, n] for h, n in self.expected.items())}

    @property
    def pending_count(self) -> int:
        """Entries kept for other partitions, not forwarded yet (publishes and dead
        letters)."""
        return sum(len(e) for e in self.outbound.values())

    def in_outbox(self, n: int) -> bool:
        """Does dead letter ``n`` still need its body in the outbox?"""
        return n in self.unrouted or n in self.refs

    @property
    def in_flight(self) -> int:
        """Dead letters whose bodies are in the outbox (unrouted, or not forwarded to
        every partition yet)."""
        return len(self.unrouted) + len(self.refs)

    def done(self, target: int, through: int, freed: list[int] | None = None) -> int:
        """Drop ``target``'s entries numbered up to ``through``; returns how many.
        ``freed``: outbox numbers no entry needs any more are added to it."""
        entries = self.outbound.get(target)
        if not entries:
            return 0
        gone = [n for n in entries if n <= through]
        for n in gone:
            box = entries.pop(n).outbox
            if box >= 0:
                left = self.refs[box] - 1
                if left:
                    self.refs[box] = left
                else:
                    del self.refs[box]
                    if freed is not None:
                        freed.append(box)
        if not entries:
            del self.outbound[target]
        return len(gone)

    def take(self, home: int, number: int) -> bool:
        """Is entry ``number`` of ``home`` the next one to apply here? False: applied
        already (a duplicate).

        Raises:
            ForwardGap: an earlier one has not come yet.
        """
        want = self.expected.get(home, 0)
        if number < want:
            return False
        if number > want:
            raise ForwardGap(
                f"forwarded entry {number} of partition {home} is past the next one expected"
                f" from it ({want})"
            )
        self.expected[home] = want + 1
        return True

    def pending(self, target: int) -> list[tuple[int, Outbound]]:
        """``target``'s entries in number order."""
        return sorted(self.outbound.get(target, {}).items())

    def snapshot(self) -> list[Any]:
        """Canonical: [[target, next, [[number, entry], ...]], ...], [[home, expected], ...]
        and, once a dead letter went through the outbox, its next number and
        [[number, dead letter], ...] unrouted."""
        targets = sorted(set(self.outbound) | set(self.next_number))
        snap: list[Any] = [
            [
                [t, self.next_number.get(t, 0),
                 [[n, e.snapshot()] for n, e in sorted(self.outbound.get(t, {}).items())]]
                for t in targets
            ],
            sorted([h, n] for h, n in self.expected.items()),
        ]
        if self.next_dead:  # (unchanged until a dead letter crosses partitions)
            snap += [self.next_dead, [[n, d.snapshot()] for n, d in sorted(self.unrouted.items())]]
        return snap

    def restore(self, snap: list[Any] | None) -> None:
        self.outbound, self.next_number, self.expected = {}, {}, {}
        self.unrouted, self.next_dead, self.refs = {}, 0, {}
        if not snap:
            return
        for t, nxt, entries in snap[0]:
            self.next_number[t] = nxt
            if entries:
                self.outbound[t] = {n: Outbound.restore(e) for n, e in entries}
                for e in self.outbound[t].values():
                    if e.outbox >= 0:
                        self.refs[e.outbox] = self.refs.get(e.outbox, 0) + 1
        self.expected = {h: n for h, n in snap[1]}
        if len(snap) > 3:
            self.next_dead = int(snap[2])
            self.unrouted = {int(n): DeadLetter.restore(d) for n, d in snap[3]}


def apply_forward(
    forwards: Forwards,
    index: IndexView,
    ignore: Callable[[str, int], None],
    partition: int,
    origin: Origin,
    ev: FanOut | ForwardIn | ForwardDone | RouteDeadLetter,
    out: list[Effect],
) -> Routed | None:
    """Apply one forwarding event on data ``partition``'s state (its ``forwards`` and its
    queues' ``index``; ``ignore`` counts what is ignored).

    Raises:
        InvalidArgument: a malformed one; ForwardGap: an entry past the next expected.
    """
    if isinstance(ev, ForwardDone):
        freed: list[int] = []
        forwards.done(ev.target, ev.through, freed)
        if freed:  # dead letters now on every partition they go to
            out.append(Removed(OUTBOX_QID, freed))
        return None
    if isinstance(ev, RouteDeadLetter):
        _route_dead_letter(forwards, index, ignore, partition, origin, ev, out)
        return None
    # Checked before anything changes (an entry taken, or kept for another partition,
    # must be one its queues take); each queue's enqueue checks them again.
    if ev.delay_ms < 0 or ev.not_before < 0:
        raise InvalidArgument("a publish's delay and not_before must not be negative")
    if not 0 <= ev.priority <= MAX_PRIORITY:
        raise InvalidArgument(f"priority must be 0..{MAX_PRIORITY}")
    check_ttls(ev.ttls, len(ev.messages))
    # A forwarded message's own TTL counts from its ForwardIn's apply on the target, by
    # that partition's replicated clock, as at home from the FanOut's (design.md §16).
    local = RoutedEnqueue(
        ev.queues, ev.messages, ev.keys, ev.exchange, ev.routing_key, ev.delay_ms,
        ev.not_before, ev.priority, ev.ttls,
    )
    if isinstance(ev, ForwardIn):
        if ev.home < 1 or ev.home == partition or not ev.queues:
            raise InvalidArgument(f"ForwardIn from partition {ev.home} does not fit here")
        if not forwards.take(ev.home, ev.number):
            ignore("duplicate-forward", 1)
            return Routed([], [], [], [])
        done = index.enqueue_routed(origin, local, out)
        if done.full or done.missing:
            # Confirmed where it was published: what does not fit, or finds its queue
            # gone, is counted here.
            ignore("forward-dropped", len(done.full) + len(done.missing))
        return done
    targets = [t for t, _ in ev.forward]
    if (
        not ev.forward or len(set(targets)) != len(targets)
        or any(t < 1 or t == partition or not qs for t, qs in ev.forward)
    ):
        raise InvalidArgument("FanOut.forward must name other data partitions, each once")
    done = index.enqueue_routed(origin, local, out)
    remote: list[str] = []
    for target, queues in ev.forward:
        forwards.add(target, Outbound(
            queues, ev.messages, ev.keys, ev.exchange, ev.routing_key, ev.delay_ms,
            ev.not_before, ev.priority, origin.ts, ttls=ev.ttls,
        ))
        remote += queues
    # The other partitions' queues take it once forwarded: no position yet (-1).
    return Routed(
        done.queues + remote, done.positions + [-1] * len(remote), done.full, done.missing
    )


def _route_dead_letter(
    forwards: Forwards,
    index: IndexView,
    ignore: Callable[[str, int], None],
    partition: int,
    origin: Origin,
    ev: RouteDeadLetter,
    out: list[Effect],
) -> None:
    """The routes of outbox dead letter ``ev.number``: the first applied decides (a later
    one is a duplicate); copied to the queues here, kept for the other partitions."""
    targets = [t for t, _ in ev.forward]
    if (
        len(set(targets)) != len(targets)
        or any(t < 1 or t == partition or not qs for t, qs in ev.forward)
    ):
        raise InvalidArgument("RouteDeadLetter.forward must name other data partitions, each once")
    letter = forwards.unrouted.pop(ev.number, None)
    if letter is None:
        ignore("duplicate-route", 1)  # routed already (a forwarder's retry, or another's)
        return
    key = letter.routing_key
    for target, queues in ev.forward:
        forwards.add(target, Outbound(
            tuple(queues), (), (), letter.exchange or "", key, 0, 0, 0, origin.ts, ev.number,
        ))
    here = [
        index.queues[n] for n in dict.fromkeys(ev.local)
        if n != letter.queue and n in index.queues
    ]
    if len(here) < len(set(ev.local) - {letter.queue}):
        ignore("forward-dropped", len(set(ev.local) - {letter.queue}) - len(here))
    moved = index.move_dead_letter(
        OUTBOX_QID, ev.number, here, None if letter.exchange is None else key, {}, None, out,
        keep=ev.number in forwards.refs,
    )
    if not moved and ev.number not in forwards.refs:
        out.append(Removed(OUTBOX_QID, [ev.number]))  # routed nowhere: dropped
        if not ev.forward and not here:
            ignore("dead-letter-unrouted", 1)
