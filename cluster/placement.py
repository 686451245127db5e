"""The placement map: which data partition each queue is on (docs/design.md §16).

Pure: no I/O, no clock. Kept by the control partition's state and changed only by
:class:`~batonmq.cluster.events.PlaceQueues` in log order, so every replica places
alike. A name keeps its partition for the life of the cluster (a queue declared again
under a name returns to the partition the name had): placement never races with a
deletion on a data partition, at the price of one small entry per queue name ever
placed.

It also counts a user's queues for ``max_queues`` (flag ``user_limits``), as the state
of a log of one does from its queues: there they are spread over the data partitions,
so the control partition keeps which user each queue counts for (``claims``): a
declare of a new queue for a user places it with the user (refused past the limit, in
control's log order), and a deletion on the data partition releases it
(:class:`~batonmq.cluster.events.ReleaseQueue`).

The cluster's count of data partitions is recorded by
:class:`~batonmq.cluster.events.GrowPartitions` in log order: the log's count, which every
broker appends when it sees it unrecorded (a new cluster; a growth whose broker died
before recording it), and each growth's (docs/design.md §16, "Growing N"). Placement
chooses among that many, whatever count an appender says (one that has not applied the
growth yet says fewer; one started on a log grown further than recorded, more); before
any is recorded, among the count the ``PlaceQueues`` says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batonmq.cluster.errors import InvalidArgument, QueueExists
from batonmq.cluster.events import GrowPartitions, PlaceQueues, ReleaseQueue
from batonmq.cluster.queues import MAX_QUEUE_NAME
from batonmq.cluster.results import PartitionsGrown, Placed
from batonmq.cluster.users import Users, check_queue_count

__all__ = ["Placement", "MAX_PARTITIONS"]

#: The most data partitions a cluster may have (the log layer's own cap is higher).
MAX_PARTITIONS = 1024


class Placement:
    """Queue name -> data partition (1..N), with each partition's count of names, the
    user each counts for, and the count of data partitions recorded by growing (0: never
    grown, the log's count)."""

    __slots__ = ("placed", "counts", "claims", "partitions")

    def __init__(self) -> None:
        self.placed: dict[str, int] = {}
        self.counts: dict[int, int] = {}
        self.claims: dict[str, str] = {}  # queue -> the user it counts for (max_queues)
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

    def apply(
        self, ev: PlaceQueues | ReleaseQueue | GrowPartitions, users: Users,
        ignore: Callable[[str], None],
    ) -> Placed | PartitionsGrown | None:
        """Apply a placement, a user's queue released, or a grown count (one not above
        the count is ignored as ``not-grown``).

        Raises:
            as :meth:`place` and :meth:`grow`; LimitExceeded: the user has its
            max_queues already.
        """
        if isinstance(ev, GrowPartitions):
            try:
                return self.grow(ev)
            except InvalidArgument:
                if 2 <= ev.count <= self.partitions:
                    ignore("not-grown")
                raise
        if isinstance(ev, ReleaseQueue):
            if ev.user is not None and self.claims.get(ev.queue) == ev.user:
                del self.claims[ev.queue]
            return None
        k = self.place(ev, users, ignore)
        return Placed(k)

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

    def place(
        self, ev: PlaceQueues, users: Users | None = None,
        ignore: Callable[[str], None] = lambda reason: None,
    ) -> int:
        """Apply ``ev``; returns the partition its queues are on. The partitions to
        choose from are the count recorded by growing, else (never grown) ``ev.count``.

        The queues not placed yet go where the first one is; if it is not placed, to the
        partition asked, else where another of them is (a queue goes with its dead-letter
        queue: dead letters then stay on their partition), else to the emptiest.

        Raises:
            InvalidArgument: a bad count, partition or name.
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
        first = ev.queues[0]
        if ev.user is not None and self.claims.get(first) != ev.user:
            # A new queue of the user: within its max_queues (before any change).
            check_queue_count(users or Users(), ev.user, self.claims.values(), ignore)
        have = {name: self.placed[name] for name in ev.queues if name in self.placed}
        if first in have:
            k = have[first]
            if ev.partition and ev.partition != k:
                raise QueueExists(f"queue {first!r} is on partition {k}, not {ev.partition}")
        elif ev.partition:
            # (its dead-letter queue may be on another: dead letters are forwarded)
            k = ev.partition
        elif have:
            k = min(have.values())  # with its dead-letter queue: cheaper
        else:
            k = self.emptiest(count)
        for name in ev.queues:
            if name not in self.placed:
                self.placed[name] = k
                self.counts[k] = self.counts.get(k, 0) + 1
        if ev.user is not None:
            self.claims[first] = ev.user
        return k

    def emptiest(self, count: int) -> int:
        """The data partition of ``1..count`` with the fewest names (ties: the lowest)."""
        return min(range(1, count + 1), key=lambda k: (self.counts.get(k, 0), k))

    def snapshot(self) -> list[Any]:
        """Canonical: ``[[name, partition], ...]`` by name, ``[name, partition, user]``
        for a queue that counts for a user; once grown, ``[[entries...], count]`` (a
        cluster never grown keeps the first form, and so its digest)."""
        claims = self.claims
        entries = [
            [name, self.placed[name], claims[name]] if name in claims
            else [name, self.placed[name]]
            for name in sorted(self.placed)
        ]
        return [entries, self.partitions] if self.partitions else entries

    def restore(self, snap: list[Any] | None) -> None:
        """Restore from :meth:`snapshot` (None: nothing placed, never grown)."""
        entries: list[Any] = list(snap or ())
        self.partitions = 0
        if len(entries) == 2 and type(entries[1]) is int:  # the grown form
            entries, self.partitions = entries[0], entries[1]
        self.placed = {str(e[0]): int(e[1]) for e in entries}
        self.claims = {str(e[0]): str(e[2]) for e in entries if len(e) > 2}
        self.counts = {}
        for k in self.placed.values():
            self.counts[k] = self.counts.get(k, 0) + 1
