"""The publish-key memory: idempotent publishes, in log order. Pure: no I/O, no clock.

A publish may carry idempotency keys (:attr:`batonmq.cluster.events.Enqueue.keys`, one
per span of its messages). The state remembers, cluster-wide, the last
:data:`KEY_MEMORY` keyed spans applied, each with the first position it got; a span
re-sent with a key still remembered is not enqueued again, and is answered with its
original position. The oldest key is forgotten first, in log order, so every replica
forgets the same ones.

The keys are kept as three parallel deques (cheap to snapshot and digest) plus a dict
for the lookup; the node driver stores them key by key as they come
(:meth:`PublishKeys.take`), not with every batch.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

from batonmq.cluster.events import Enqueue

__all__ = ["KEY_MEMORY", "KeyEntry", "Messages", "PublishKeys"]

#: How many publish idempotency keys the state remembers, cluster-wide, in log order
#: (the oldest is forgotten first). A client's re-sent publish is deduplicated if
#: its first copy is among the last KEY_MEMORY keyed publishes applied.
KEY_MEMORY: Final = 100_000

#: One remembered key: (sequence number, queue id, key, first position).
KeyEntry = tuple[int, int, str, int]
#: An Enqueue's messages: (body, headers) pairs.
Messages = tuple[tuple[bytes, dict[str, Any]], ...]


class PublishKeys:
    """The remembered publish keys: (qid, key) -> the first position the publish got.

    Args:
        memory: how many keys to remember (0: none, publishes are never deduplicated).
    """

    def __init__(self, memory: int = KEY_MEMORY) -> None:
        self.memory = memory
        self.known: dict[tuple[int, str], int] = {}
        # The same keys in log order (three parallel deques) so that the oldest is
        # forgotten first.
        self._qids: deque[int] = deque()
        self._names: deque[str] = deque()
        self._firsts: deque[int] = deque()
        self.total = 0  # keys ever remembered: the next key's sequence number
        self._new: list[KeyEntry] = []  # (seq, qid, key, first) to store

    def split(
        self, qid: int, next_pos: int, ev: Enqueue
    ) -> tuple[Messages, list[int], list[tuple[str, int]], int]:
        """Split an Enqueue's key spans into re-sent ones (already applied to queue
        ``qid``, whose next position is ``next_pos``) and new ones.

        Returns:
            (the new spans' messages, each span's first position, the new keyed spans
            with their positions, how many spans were re-sent). Changes nothing.
        """
        known = self.known
        starts: list[int] = []
        fresh: list[tuple[str, int]] = []
        here: dict[str, int] = {}  # a key twice in one event: the second is a re-send
        keep: list[tuple[int, int]] = []  # (start, end) slices of ev.messages to enqueue
        nxt = next_pos
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
            return ev.messages, starts, fresh, 0
        if len(keep) == 1:
            return ev.messages[keep[0][0] : keep[0][1]], starts, fresh, dups
        return tuple(m for a, b in keep for m in ev.messages[a:b]), starts, fresh, dups

    def remember(self, qid: int, key: str, first: int) -> None:
        """Remember a keyed publish; forget the oldest past ``memory`` (log order)."""
        self.known[(qid, key)] = first
        self._qids.append(qid)
        self._names.append(key)
        self._firsts.append(first)
        self._new.append((self.total, qid, key, first))
        self.total += 1
        while len(self._firsts) > self.memory:
            self._firsts.popleft()
            del self.known[(self._qids.popleft(), self._names.popleft())]

    def entries(self) -> list[KeyEntry]:
        """The remembered keys as (seq, qid, key, first position), in log order."""
        low = self.total - len(self._firsts)
        return [
            (low + i, qid, key, first)
            for i, (qid, key, first) in enumerate(zip(self._qids, self._names, self._firsts))
        ]

    def restore(self, entries: list[KeyEntry]) -> None:
        """Restore the memory from :meth:`entries` (``total`` is restored with the meta
        snapshot). Nothing is new to store afterwards."""
        entries = sorted(entries)[-self.memory :] if self.memory > 0 else []
        self._qids = deque(e[1] for e in entries)
        self._names = deque(e[2] for e in entries)
        self._firsts = deque(e[3] for e in entries)
        self.known = {(qid, key): first for _, qid, key, first in entries}
        self._new = []

    def install(self, entries: list[KeyEntry]) -> None:
        """Restore the memory from another replica's :meth:`entries`, all of them new
        to this replica's store."""
        self.restore(entries)
        self._new = list(entries)

    def floor(self) -> int:
        """The sequence number of the oldest key still remembered."""
        return self.total - len(self._firsts)

    def take(self) -> tuple[list[KeyEntry], int]:
        """Keys remembered since the last call, and the sequence number below which keys
        are forgotten."""
        new, self._new = self._new, []
        return new, self.floor()

    def digest_part(self) -> list[list[Any]]:
        """The keys in log order (the order decides what is forgotten first), canonical."""
        return [list(self._qids), list(self._names), list(self._firsts)]
