"""The publish-key memory: idempotent publishes, in log order. Pure: no I/O, no clock.

A publish may carry idempotency keys (:attr:`batonmq.cluster.events.Enqueue.keys`, one
per span of its messages). The state remembers each keyed span applied, with the first
position it got, for its queue's dedupe window (``dedupe_window_ms``, 2 minutes by
default, as JetStream's duplicate window) of the replicated clock; a span re-sent with a
key still remembered is not enqueued again, and is answered with its original position.
Keys are forgotten in log order once their window has passed, and, as a bound on memory,
when more than :data:`KEY_MEMORY` are remembered, so every replica forgets the same ones.

Every client publish carries a key (a connection's random id and a counter,
``<16 hex digits>:<hex counter>``, see ``clients/producer.py``), so at saturation the
memory holds up to :data:`KEY_MEMORY` keys and must cost little per key. The entries are
kept in log order in parallel arrays of machine integers (queue id, first position,
expiry, the entry's digest hash); a key in the clients' form is kept as two integers
(connection id, counter), found through a sorted array of counters per queue and
connection (:class:`_Run`), so it costs no Python object at all; any other key is kept as
its string in a dict per queue. About 64 bytes per key against 220 for strings in dicts.
The node driver stores them as they come (:meth:`PublishKeys.take`), not with every batch.
"""

from __future__ import annotations

import re
import zlib
from array import array
from bisect import bisect_left
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
#: A key in the form the clients make (a connection's 64-bit random id in 16 hex digits, a
#: colon, a counter in hex without leading zeros, at most 15 digits so it fits a signed
#: 64-bit array): kept as two integers. ``fullmatch`` only: the string is exactly what
#: formatting the two integers back gives.
_AUTO: Final = re.compile(r"[0-9a-f]{16}:[1-9a-f][0-9a-f]{0,14}")
#: ``_counters`` of an entry whose key is kept as a string.
_STR: Final = -1


def _auto(key: str) -> tuple[int, int] | None:
    """(connection id, counter) of a key in the clients' form, else None."""
    if len(key) < 18 or key[16] != ":" or _AUTO.fullmatch(key) is None:
        return None
    return int(key[:16], 16), int(key[17:], 16)


def _auto_key(prefix: int, counter: int) -> str:
    """The key string of (connection id, counter): the inverse of :func:`_auto`."""
    return f"{prefix:016x}:{counter:x}"


class _Run:
    """The remembered client-form keys of one connection on one queue: their counters in
    increasing order from ``head`` (a forgotten prefix is cut off now and then), with each
    one's entry sequence number. A connection's counters grow, so remembering appends and
    forgetting (in log order) takes from the front; only a re-send that overtook an older
    publish lands in the middle."""

    __slots__ = ("counters", "seqs", "head")

    def __init__(self) -> None:
        self.counters = array("q")
        self.seqs = array("q")
        self.head = 0

    def find(self, counter: int) -> int:
        """The index of ``counter``, or -1."""
        counters = self.counters
        n = len(counters)
        if n == self.head or counter > counters[n - 1]:
            return -1
        i = bisect_left(counters, counter, self.head)
        return i if counters[i] == counter else -1

    def put(self, counter: int, seq: int) -> None:
        counters = self.counters
        n = len(counters)
        if n == self.head or counter > counters[n - 1]:
            counters.append(counter)
            self.seqs.append(seq)
            return
        i = bisect_left(counters, counter, self.head)
        if counters[i] == counter:
            self.seqs[i] = seq
        else:
            counters.insert(i, counter)
            self.seqs.insert(i, seq)

    def drop(self, counter: int, seq: int) -> bool:
        """Forget ``counter`` if its newest entry is ``seq``. Returns: the run is empty."""
        i = self.find(counter)
        if i >= 0 and self.seqs[i] == seq:
            if i == self.head:
                self.head = i + 1
                if self.head >= _CUT and self.head * 2 >= len(self.counters):
                    del self.counters[: self.head], self.seqs[: self.head]
                    self.head = 0
            else:
                del self.counters[i], self.seqs[i]
        return self.head == len(self.counters)


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
#: A key in the clients' form as (connection id, counter), None for any other key.
Parsed = tuple[int, int] | None
#: A keyed span enqueued now: (key, first position, the key parsed).
Fresh = tuple[str, int, Parsed]


class PublishKeys:
    """The remembered publish keys: (qid, key) -> the first position the publish got.

    Args:
        memory: how many keys to remember (0: none, publishes are never deduplicated).
    """

    def __init__(self, memory: int = KEY_MEMORY) -> None:
        self.memory = memory
        # Up to a million keys at a time, so each costs as little as it can. The
        # entries in log order, as machine integers in parallel arrays (the oldest
        # first, from ``_head``; the forgotten prefix is cut off now and then): queue
        # id, first position, expiry, the entry's hash (for the digest sum), and the
        # key as (connection id, counter), or counter _STR with the string in _strs.
        self._qids = array("q")
        self._firsts = array("q")
        self._expires = array("q")
        self._hashes = array("Q")
        self._prefixes = array("Q")
        self._counters = array("q")
        self._strs: dict[int, str] = {}  # seq -> key, for keys not in the clients' form
        # The lookup: client-form keys per queue id and connection id; other keys per
        # queue id, key -> the sequence number of its newest entry.
        self._runs: dict[int, dict[int, _Run]] = {}
        self._by_q: dict[int, dict[str, int]] = {}
        self._head = 0  # index of the oldest remembered entry in the arrays
        self.total = 0  # keys ever remembered: the next key's sequence number
        self._new: list[KeyEntry] = []  # (seq, qid, key, first, expires) to store
        # The sum (mod 2**64) of every remembered entry's hash, kept as keys come and
        # go: the replica digest reads it instead of packing up to a million keys at
        # each checkpoint (the sequence numbers in the entries make it order-aware).
        self._sum = 0

    def __len__(self) -> int:
        """How many keys are remembered now."""
        return len(self._firsts) - self._head

    def _newest(self, qid: int, key: str) -> int | None:
        """The sequence number of the newest remembered entry of ``key`` on ``qid``."""
        auto = _auto(key)
        if auto is None:
            seqs = self._by_q.get(qid)
            return seqs.get(key) if seqs is not None else None
        runs = self._runs.get(qid)
        run = runs.get(auto[0]) if runs is not None else None
        if run is None:
            return None
        i = run.find(auto[1])
        return run.seqs[i] if i >= 0 else None

    def lookup(self, qid: int, key: str) -> tuple[int, int] | None:
        """(first position, expires) of the newest ``key`` remembered for queue ``qid``."""
        seq = self._newest(qid, key)
        if seq is None:
            return None
        i = seq - self.total + len(self._firsts)
        return self._firsts[i], self._expires[i]

    @property
    def known(self) -> dict[tuple[int, str], tuple[int, int]]:
        """(qid, key) -> (first, expires) of each remembered key, in log order (a copy,
        for tests and tools: O(keys))."""
        out: dict[tuple[int, str], tuple[int, int]] = {}
        for seq, qid, key, first, expires in self.entries():
            if self._newest(qid, key) == seq:
                out[(qid, key)] = (first, expires)
        return out

    def split(
        self, qid: int, next_pos: int, ev: Enqueue, clock: int = 0
    ) -> tuple[Messages, list[int], list[Fresh], int]:
        """Split an Enqueue's key spans into re-sent ones (already applied to queue
        ``qid``, whose next position is ``next_pos``, and remembered at ``clock``) and
        new ones.

        Returns:
            (the new spans' messages, each span's first position, the new keyed spans
            with their positions (and the key's parsed form, for :meth:`remember`), how
            many spans were re-sent). Changes nothing.
        """
        seqs = self._by_q.get(qid)
        runs = self._runs.get(qid)
        firsts, expiries, total_len = self._firsts, self._expires, len(self._firsts) - self.total
        starts: list[int] = []
        fresh: list[Fresh] = []
        here: dict[str, int] = {}  # a key twice in one event: the second is a re-send
        keep: list[tuple[int, int]] = []  # (start, end) slices of ev.messages to enqueue
        nxt = next_pos
        i = dups = 0
        for key, count in ev.keys:
            old: int | None = None
            auto = None
            if key:
                seq: int | None = None
                auto = _auto(key)
                if auto is None:
                    if seqs is not None:
                        seq = seqs.get(key)
                elif runs is not None:
                    run = runs.get(auto[0])
                    if run is not None:
                        at = run.find(auto[1])
                        if at >= 0:
                            seq = run.seqs[at]
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
                    fresh.append((key, nxt, auto))
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

    def _append(
        self, seq: int, qid: int, key: str, first: int, expires: int, auto: Parsed | bool = True
    ) -> None:
        """Add an entry at the end of the arrays and the lookup (``auto``: the key's
        :func:`_auto` if known, True to parse it here)."""
        h = _entry_hash(seq, qid, key, first, expires)
        self._sum = (self._sum + h) & _MASK
        if auto is True:
            auto = _auto(key)
        if not auto:
            self._strs[seq] = key
            seqs = self._by_q.get(qid)
            if seqs is None:
                seqs = self._by_q[qid] = {}
            seqs[key] = seq
            self._prefixes.append(0)
            self._counters.append(_STR)
        else:
            runs = self._runs.get(qid)
            if runs is None:
                runs = self._runs[qid] = {}
            run = runs.get(auto[0])
            if run is None:
                run = runs[auto[0]] = _Run()
            run.put(auto[1], seq)
            self._prefixes.append(auto[0])
            self._counters.append(auto[1])
        self._qids.append(qid)
        self._firsts.append(first)
        self._expires.append(expires)
        self._hashes.append(h)

    def remember(
        self, qid: int, key: str, first: int, expires: int = _NEVER, auto: Parsed | bool = True
    ) -> None:
        """Remember a keyed publish until ``expires`` (replicated ms; -1: never);
        forget the oldest past ``memory`` (log order). ``auto``: the key's parsed form
        from :meth:`split`'s fresh spans, to parse it only once."""
        seq = self.total
        self._append(seq, qid, key, first, expires, auto)
        self._new.append((seq, qid, key, first, expires))
        self.total += 1
        while len(self._firsts) - self._head > self.memory:
            self._pop()

    def _pop(self) -> None:
        """Forget the oldest key (unless the same key was remembered again since)."""
        i = self._head
        seq = self.total - len(self._firsts) + i
        qid = self._qids[i]
        self._sum = (self._sum - self._hashes[i]) & _MASK
        counter = self._counters[i]
        if counter == _STR:
            name = self._strs.pop(seq)
            seqs = self._by_q[qid]
            if seqs.get(name) == seq:
                del seqs[name]
                if not seqs:
                    del self._by_q[qid]
        else:
            runs = self._runs[qid]
            prefix = self._prefixes[i]
            if runs[prefix].drop(counter, seq):
                del runs[prefix]
                if not runs:
                    del self._runs[qid]
        self._head = i + 1
        if self._head >= _CUT and self._head * 2 >= len(self._firsts):
            # Cut the forgotten prefix off (amortised O(1) per key).
            n = self._head
            del self._qids[:n], self._firsts[:n], self._expires[:n], self._hashes[:n]
            del self._prefixes[:n], self._counters[:n]
            self._head = 0

    def forget_expired(self, clock: int) -> None:
        """Forget the oldest keys, in log order, while their window has passed at
        ``clock`` (a key behind one with a longer window waits for it, but is no
        longer honoured: :meth:`split` checks each key's own time)."""
        expires = self._expires
        while self._head < len(expires) and 0 <= expires[self._head] <= clock:
            self._pop()

    def entries(self) -> list[KeyEntry]:
        """The remembered keys as (seq, qid, key, first position, expires), in log order."""
        h = self._head
        low = self.total - len(self._firsts) + h
        strs = self._strs
        return [
            (
                low + i,
                qid,
                strs[low + i] if counter == _STR else _auto_key(prefix, counter),
                first,
                expires,
            )
            for i, (qid, prefix, counter, first, expires) in enumerate(
                zip(
                    self._qids[h:], self._prefixes[h:], self._counters[h:],
                    self._firsts[h:], self._expires[h:],
                )
            )
        ]

    def restore(self, entries: list[KeyEntry]) -> None:
        """Restore the memory from :meth:`entries` (``total`` is restored with the meta
        snapshot). Nothing is new to store afterwards."""
        entries = sorted(entries)[-self.memory :] if self.memory > 0 else []
        total = self.total
        self.__init__(self.memory)  # type: ignore[misc]
        self.total = total
        for entry in entries:
            self._append(*entry)

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
        return [self.total, len(self), self._sum]
