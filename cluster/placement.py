"""The placement map: which data partition each queue is on (docs/design.md §16).

Pure: no I/O, no clock. Kept by the control partition's state and changed only by
:class:`~batonmq.cluster.events.PlaceQueues` in log order, so every replica places
alike. A name keeps its partition for the life of the cluster (a queue declared again
under a name returns to the partition the name had): placement never races with a
deletion on a data partition, at the price of one small entry per queue name ever
placed.

The cluster's count of data partitions is first the log's (every broker opens the
log with it); :class:`~batonmq.cluster.events.GrowPartitions` records a higher one in
log order (docs/design.md §16, "Growing N"), and placement chooses among that many
from then on, whatever count an appender says (one that has not applied the growth yet
says fewer; one started on a log grown further than recorded, more).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batonmq.cluster.errors import InvalidArgument, QueueExists
from batonmq.cluster.events import GrowPartitions, PlaceQueues
from batonmq.cluster.results import PartitionsGrown, Placed
from batonmq.cluster.queues import MAX_QUEUE_NAME

__all__ = ["Placement", "MAX_PARTITIONS"]

#: The most data partitions a cluster may have (the log layer's own cap is higher).
MAX_PARTITIONS = 1024


class Placement:
    """Queue name -> data partition (1..N), with each partition's count of names, and the
    count of data partitions recorded by growing (0: never grown, the log's count)."""

    __slots__ = ("placed", "counts", "partitions")

    def __init__(self) -> None:
        self.placed: dict[str, int] = {}
        self.counts: dict[int, int] = {}
        self.partitions = 0

    def __bool__(self) -> bool:
        """Whether there is anything to snapshot: a name placed, or a count recorded."""
        return bool(self.placed) or self.partitions > 0

    def __contains__(self, name: object) -> bool:
        return name in self.placed

    def __len__(self) -> int:
        return len(self.placed)

    def get(self, name: str) -> int | None:
        """The partition ``name`` is on, or None if it was never placed."""
        return self.placed.get(name)

    def apply_event(
        self, ev: PlaceQueues | GrowPartitions, ignore: Callable[[str], None] | None = None
    ) -> Placed | PartitionsGrown:
        """Apply a placement event (the control partition's state calls this, with its
        count of ignored events: a GrowPartitions not above the count is ``not-grown``).

        Raises:
            InvalidArgument: as :meth:`place` and :meth:`grow` say.
            QueueExists: as :meth:`place` says.
        """
        if isinstance(ev, GrowPartitions):
            try:
                return self.grow(ev)
            except InvalidArgument:
                if ignore is not None and 2 <= ev.count <= self.partitions:
                    ignore("not-grown")
                raise
        return Placed(self.place(ev))

    def grow(self, ev: GrowPartitions) -> PartitionsGrown:
        """Record that the cluster has ``ev.count`` data partitions from now on.

        Raises:
            InvalidArgument: a count out of range, or not above the one recorded
                (shrinking is not possible).
        """
        if not 2 <= ev.count <= MAX_PARTITIONS:
            raise InvalidArgument(
                f"a grown cluster has 2 to {MAX_PARTITIONS} data partitions, not {ev.count}"
            )
        before = self.partitions
        if ev.count <= before:
            raise InvalidArgument(
                f"this cluster has {before} data partitions: a partition cannot be removed,"
                f" so it cannot go to {ev.count}"
            )
        self.partitions = ev.count
        return PartitionsGrown(ev.count, before)

    def place(self, ev: PlaceQueues) -> int:
        """Apply ``ev``; returns the partition its queues are on. The partitions to
        choose from are the count recorded by growing, else (never grown) ``ev.count``.

        Raises:
            InvalidArgument: a bad count, partition or name; queues that must go
                together are already on different partitions.
            QueueExists: the first queue is on another partition than the one asked.
        """
        if not 1 <= ev.count <= MAX_PARTITIONS:
            raise InvalidArgument(f"a cluster has 1 to {MAX_PARTITIONS} data partitions, not {ev.count}")
        count = self.partitions or ev.count
        if not 0 <= ev.partition <= count:
            raise InvalidArgument(
                f"partition {ev.partition} does not exist: this cluster's data partitions are"
                f" 1 to {count}"
            )
        if not ev.queues:
            raise InvalidArgument("PlaceQueues needs at least one queue")
        for name in ev.queues:
            if not name or len(name) > MAX_QUEUE_NAME or not name.isprintable():
                raise InvalidArgument(
                    f"queue name must be 1..{MAX_QUEUE_NAME} printable characters"
                )
        have = {name: self.placed[name] for name in ev.queues if name in self.placed}
        where = set(have.values())
        if len(where) > 1:
            listed = ", ".join(f"{n!r} on partition {k}" for n, k in sorted(have.items()))
            raise InvalidArgument(
                f"these queues must be on one partition (a queue and its dead-letter queue)"
                f" but are not: {listed}"
            )
        first = ev.queues[0]
        if where:
            k = where.pop()
            if ev.partition and ev.partition != k and first in have:
                raise QueueExists(f"queue {first!r} is on partition {k}, not {ev.partition}")
            if ev.partition and ev.partition != k:
                raise InvalidArgument(
                    f"queue {first!r} cannot go to partition {ev.partition}: its dead-letter"
                    f" queue is on partition {k}"
                )
        else:
            k = ev.partition or self.emptiest(count)
        for name in ev.queues:
            if name not in self.placed:
                self.placed[name] = k
                self.counts[k] = self.counts.get(k, 0) + 1
        return k

    def emptiest(self, count: int) -> int:
        """The data partition of ``1..count`` with the fewest names (ties: the lowest)."""
        return min(range(1, count + 1), key=lambda k: (self.counts.get(k, 0), k))

    def snapshot(self) -> list[Any]:
        """Canonical: ``[[name, partition], ...]`` by name; once grown,
        ``[[[name, partition], ...], count]`` (a cluster never grown keeps the first
        form, and so its digest)."""
        pairs = [[name, self.placed[name]] for name in sorted(self.placed)]
        return [pairs, self.partitions] if self.partitions else pairs

    def restore(self, snap: list[Any] | None) -> None:
        """Restore from :meth:`snapshot` (None: nothing placed, never grown)."""
        pairs: list[Any] = list(snap or ())
        self.partitions = 0
        if len(pairs) == 2 and type(pairs[1]) is int:  # the grown form
            pairs, self.partitions = pairs[0], pairs[1]
        self.placed = {str(n): int(k) for n, k in pairs}
        self.counts = {}
        for k in self.placed.values():
            self.counts[k] = self.counts.get(k, 0) + 1
