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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batonmq.cluster.effects import Effect
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import FanOut, ForwardDone, ForwardIn, Origin, RoutedEnqueue
from batonmq.cluster.results import Routed

if TYPE_CHECKING:
    from batonmq.cluster.queues import QueueIndex

__all__ = ["Outbound", "Forwards", "ForwardGap", "apply_forward"]


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

    def snapshot(self) -> list[Any]:
        return [
            list(self.queues), [[b, h] for b, h in self.messages],
            [list(k) for k in self.keys], self.exchange, self.routing_key, self.delay_ms,
            self.not_before, self.priority, self.ts,
        ]

    @classmethod
    def restore(cls, snap: list[Any]) -> "Outbound":
        return cls(
            tuple(snap[0]), tuple((bytes(b), dict(h)) for b, h in snap[1]),
            tuple((str(k), int(n)) for k, n in snap[2]), snap[3], snap[4], snap[5], snap[6],
            snap[7], snap[8],
        )


class Forwards:
    """A data partition's outbound entries (by target and number) and, per home
    partition, the number of the next entry it expects."""

    __slots__ = ("outbound", "next_number", "expected")

    def __init__(self) -> None:
        self.outbound: dict[int, dict[int, Outbound]] = {}  # target -> number -> entry
        self.next_number: dict[int, int] = {}  # target -> the next entry's number
        self.expected: dict[int, int] = {}  # home -> the next number it takes from it

    def __bool__(self) -> bool:
        return bool(self.outbound or self.next_number or self.expected)

    def add(self, target: int, entry: Outbound) -> int:
        """Keep ``entry`` for ``target``; returns its number."""
        n = self.next_number.get(target, 0)
        self.next_number[target] = n + 1
        self.outbound.setdefault(target, {})[n] = entry
        return n

    def done(self, target: int, through: int) -> int:
        """Drop ``target``'s entries numbered up to ``through``; returns how many."""
        entries = self.outbound.get(target)
        if not entries:
            return 0
        gone = [n for n in entries if n <= through]
        for n in gone:
            del entries[n]
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
        """Canonical: [[target, next, [[number, entry], ...]], ...], [[home, expected], ...]."""
        targets = sorted(set(self.outbound) | set(self.next_number))
        return [
            [
                [t, self.next_number.get(t, 0),
                 [[n, e.snapshot()] for n, e in sorted(self.outbound.get(t, {}).items())]]
                for t in targets
            ],
            sorted([h, n] for h, n in self.expected.items()),
        ]

    def restore(self, snap: list[Any] | None) -> None:
        self.outbound, self.next_number, self.expected = {}, {}, {}
        if not snap:
            return
        for t, nxt, entries in snap[0]:
            self.next_number[t] = nxt
            if entries:
                self.outbound[t] = {n: Outbound.restore(e) for n, e in entries}
        self.expected = {h: n for h, n in snap[1]}


def apply_forward(
    forwards: Forwards,
    index: "QueueIndex",
    ignore: Callable[[str, int], None],
    partition: int,
    origin: Origin,
    ev: FanOut | ForwardIn | ForwardDone,
    out: list[Effect],
) -> Routed | None:
    """Apply one forwarding event on data ``partition``'s state (its ``forwards`` and its
    queues' ``index``; ``ignore`` counts what is ignored).

    Raises:
        InvalidArgument: a malformed one; ForwardGap: an entry past the next expected.
    """
    if isinstance(ev, ForwardDone):
        forwards.done(ev.target, ev.through)
        return None
    if ev.delay_ms < 0 or ev.not_before < 0:
        raise InvalidArgument("a publish's delay and not_before must not be negative")
    local = RoutedEnqueue(
        ev.queues, ev.messages, ev.keys, ev.exchange, ev.routing_key, ev.delay_ms,
        ev.not_before, ev.priority,
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
            ev.not_before, ev.priority, origin.ts,
        ))
        remote += queues
    # The other partitions' queues take it once forwarded: no position yet (-1).
    return Routed(
        done.queues + remote, done.positions + [-1] * len(remote), done.full, done.missing
    )
