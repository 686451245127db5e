"""The publish-key memory: idempotent publishes, in log order. Pure: no I/O, no clock.

A publish may carry idempotency keys (:attr:`batonmq.cluster.events.Enqueue.keys`, one
per span of its messages). The state remembers each keyed span applied, with the first
position it got, for its queue's dedupe window (``dedupe_window_ms``, 2 minutes by
default, as JetStream's duplicate window) of the replicated clock; a span re-sent with a
key still remembered is not enqueued again, and is answered with its original position.
Keys are forgotten in log order once their window has passed, and, as a bound on memory,
when more than :data:`KEY_MEMORY` are remembered, so every replica forgets the same ones.

The keys are kept in log order in parallel arrays of machine integers plus a list of the
key strings, and a dict per queue for the lookup (about half the memory of tuples); the
node driver stores them key by key as they come (:meth:`PublishKeys.take`), not with
every batch.
"""

from __future__ import annotations

import zlib
from array import array
from typing import Any, Final

from batonmq.cluster.events import DEFAULT_DEDUPE_WINDOW_MS, Enqueue

__all__ = ["KEY_MEMORY", "DEDUPE_WINDOW_MS", "KeyEntry", "Messages", "PublishKeys"]

#: The most publish idempotency keys the state remembers, cluster-wide (the oldest is
#: forgotten first, even inside its window): a bound on memory.
KEY_MEMORY: Final = 1_000_000
#: A queue's default dedupe window: a re-sent publish is deduplicated if its first copy
#: was applied less than this long ago (replicated clock).
DEDUPE_WINDOW_MS: Final = DEFAULT_DEDUPE_WINDOW_MS
#: ``expires`` of a key kept until it is pushed out (keys stored before the window).
_NEVER: Final = -1
_MASK: Final = (1 << 64) - 1
#: Forgotten entries kept at the front of the arrays before they are cut off.
_CUT: Final = 4096


def _entry_hash(seq: int, qid: int, key: str, first: int, expires: int) -> int:
    """A 64-bit hash of one remembered key, the same on every replica and process (C
    checksums: cheap enough to keep up with every keyed publish)."""
    data = f"{seq}:{qid}:{first}:{expires}:{len(key)}:{key}".encode()
    return (zlib.crc32(data) << 32) | zlib.adler32(data)

#: One remembered key: (sequence number, queue id, key, first position, expires: the
#: replicated time in ms from which it is forgotten, or -1 for never).
KeyEntry = tuple[int, int, str, int, int]
#: An Enqueue's messages: (body, headers) pairs.
Messages = tuple[tuple[bytes, dict[str, Any]], ...]


class PublishKeys:
    """The remembered publish keys: (qid, key) -> the first position the publish got.

    Args:
        memory: how many keys to remember (0: none, publishes are never deduplicated).
    """

    def __init__(self, memory: int = KEY_MEMORY) -> None:
        self.memory = memory
        # Up to a million keys at a time, so each costs as little as it can: per
        # queue id, key -> the sequence number of its newest entry; the entries
        # themselves in log order, as machine integers in arrays (the oldest first,
        # from ``_head``; the forgotten prefix is cut off now and then) and the key
        # strings in a list.
        self._by_q: dict[int, dict[str, int]] = {}
        self._qids = array("q")
        self._firsts = array("q")
        self._expires = array("q")
        self._names: list[str] = []
        self._head = 0  # index of the oldest remembered entry in the arrays
        self.total = 0  # keys ever remembered: the next key's sequence number
        self._new: list[KeyEntry] = []  # (seq, qid, key, first) to store
        # The sum (mod 2**64) of every remembered entry's hash, kept as keys come and
        # go: the replica digest reads it instead of packing up to a million keys at
        # each checkpoint (the sequence numbers in the entries make it order-aware).
        # None: not known (after a restore), summed from :meth:`entries` when asked.
        self._sum: int | None = 0

    def __len__(self) -> int:
        """How many keys are remembered now."""
        return len(self._firsts) - self._head

    def _index(self, seq: int) -> int:
        # The remembered entries are the last len(self) sequence numbers below total.
        return seq - self.total + len(self._firsts)

    def lookup(self, qid: int, key: str) -> tuple[int, int] | None:
        """(first position, expires) of the newest ``key`` remembered for queue ``qid``."""
        seqs = self._by_q.get(qid)
        seq = seqs.get(key) if seqs is not None else None
        if seq is None:
            return None
        i = self._index(seq)
        return self._firsts[i], self._expires[i]

    @property
    def known(self) -> dict[tuple[int, str], tuple[int, int]]:
        """(qid, key) -> (first, expires) of each remembered key, in log order (a copy,
        for tests and tools: O(keys))."""
        out: dict[tuple[int, str], tuple[int, int]] = {}
        for seq, qid, key, first, expires in self.entries():
            if self._by_q[qid].get(key) == seq:
                out[(qid, key)] = (first, expires)
        return out

    def split(
        self, qid: int, next_pos: int, ev: Enqueue, clock: int = 0
    ) -> tuple[Messages, list[int], list[tuple[str, int]], int]:
        """Split an Enqueue's key spans into re-sent ones (already applied to queue
        ``qid``, whose next position is ``next_pos``, and remembered at ``clock``) and
        new ones.

        Returns:
            (the new spans' messages, each span's first position, the new keyed spans
            with their positions, how many spans were re-sent). Changes nothing.
        """
        seqs = self._by_q.get(qid)
        firsts, expiries, total_len = self._firsts, self._expires, len(self._firsts) - self.total
        starts: list[int] = []
        fresh: list[tuple[str, int]] = []
        here: dict[str, int] = {}  # a key twice in one event: the second is a re-send
        keep: list[tuple[int, int]] = []  # (start, end) slices of ev.messages to enqueue
        nxt = next_pos
        i = dups = 0
        for key, count in ev.keys:
            old: int | None = None
            if key:
                seq = seqs.get(key) if seqs is not None else None
                if seq is not None:
                    expires = expiries[seq + total_len]
                    if expires < 0 or expires > clock:
                        old = firsts[seq + total_len]
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

    def remember(self, qid: int, key: str, first: int, expires: int = _NEVER) -> None:
        """Remember a keyed publish until ``expires`` (replicated ms; -1: never);
        forget the oldest past ``memory`` (log order)."""
        seq = self.total
        seqs = self._by_q.get(qid)
        if seqs is None:
            seqs = self._by_q[qid] = {}
        seqs[key] = seq
        if self._sum is not None:
            self._sum = (self._sum + _entry_hash(seq, qid, key, first, expires)) & _MASK
        self._qids.append(qid)
        self._names.append(key)
        self._firsts.append(first)
        self._expires.append(expires)
        self._new.append((seq, qid, key, first, expires))
        self.total += 1
        while len(self._firsts) - self._head > self.memory:
            self._pop()

    def _pop(self) -> None:
        """Forget the oldest key (unless the same key was remembered again since)."""
        i = self._head
        seq = self.total - len(self._firsts) + i
        qid, name = self._qids[i], self._names[i]
        if self._sum is not None:
            self._sum = (
                self._sum - _entry_hash(seq, qid, name, self._firsts[i], self._expires[i])
            ) & _MASK
        seqs = self._by_q[qid]
        if seqs.get(name) == seq:
            del seqs[name]
            if not seqs:
                del self._by_q[qid]
        self._names[i] = ""  # the string goes now, its slot with the next cut
        self._head = i + 1
        if self._head >= _CUT and self._head * 2 >= len(self._firsts):
            # Cut the forgotten prefix off (amortised O(1) per key).
            n = self._head
            del self._qids[:n], self._firsts[:n], self._expires[:n], self._names[:n]
            self._head = 0

    def forget_expired(self, clock: int) -> None:
        """Forget the oldest keys, in log order, while their window has passed at
        ``clock`` (a key behind one with a longer window waits for it, but is no
        longer honoured: :meth:`split` checks each key's own time)."""
        expires = self._expires
        while self._head < len(expires) and 0 <= expires[self._head] <= clock:
            self._pop()

    def entries(self) -> list[KeyEntry]:
        """The remembered keys as (seq, qid, key, first position), in log order."""
        h = self._head
        low = self.total - len(self._firsts) + h
        return [
            (low + i, qid, key, first, expires)
            for i, (qid, key, first, expires) in enumerate(
                zip(self._qids[h:], self._names[h:], self._firsts[h:], self._expires[h:])
            )
        ]

    def restore(self, entries: list[KeyEntry]) -> None:
        """Restore the memory from :meth:`entries` (``total`` is restored with the meta
        snapshot). Nothing is new to store afterwards."""
        entries = sorted(entries)[-self.memory :] if self.memory > 0 else []
        self._qids = array("q", (e[1] for e in entries))
        self._names = [e[2] for e in entries]
        self._firsts = array("q", (e[3] for e in entries))
        self._expires = array("q", (e[4] for e in entries))
        self._head = 0
        self._by_q = {}
        for seq, qid, key, _, _ in entries:
            self._by_q.setdefault(qid, {})[key] = seq
        self._sum = None  # ``total`` comes with the meta snapshot: summed when asked
        self._new = []

    def install(self, entries: list[KeyEntry]) -> None:
        """Restore the memory from another replica's :meth:`entries`, all of them new
        to this replica's store."""
        self.restore(entries)
        self._new = list(entries)

    def floor(self) -> int:
        """The sequence number of the oldest key still remembered."""
        return self.total - len(self)

    def take(self) -> tuple[list[KeyEntry], int]:
        """Keys remembered since the last call, and the sequence number below which keys
        are forgotten."""
        new, self._new = self._new, []
        return new, self.floor()

    def digest_part(self) -> list[int]:
        """What the replica digest takes of the keys, O(1): how many were ever
        remembered, how many are remembered now, and the sum of their entries' hashes
        (each with its sequence number, so the log order counts too)."""
        if self._sum is None:
            self._sum = sum(_entry_hash(*e) for e in self.entries()) & _MASK
        return [self.total, len(self), self._sum]
