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
memory holds up to :data:`KEY_MEMORY` keys and must cost little per key. A connection's
publishes applied in one event have consecutive counters, consecutive first positions
(a fixed step apart) and one expiry, so the entries are kept in log order as *blocks* of
such keys, each a few machine integers in parallel arrays (first sequence number, first
counter, first position, step, expiry, length) and a reference to the :class:`_Run` of
its queue and connection, where the key is looked up by blocks of counters; only the
digest hash is kept per key. A key not in the clients' form is a block of its own, its
string in a dict per queue. Per key (tracemalloc, 240,000 keys of two connections): 12
bytes when publishes arrive 5-30 to an event, 38 at 1-3, 80 when each is alone (67 for
every key when each was its own entry).
The node driver stores them as they come (:meth:`PublishKeys.take`), not with every batch.
"""

from __future__ import annotations

import re
import zlib
from array import array
from bisect import bisect_right
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
#: ``_bcounter`` of a block whose one entry's key is kept as a string.
_STR: Final = -1
#: A block's step between first positions is a signed 32-bit integer: a larger one
#: starts a new block.
_STEP: Final = 1 << 31


def _auto(key: str) -> tuple[int, int] | None:
    """(connection id, counter) of a key in the clients' form, else None."""
    if len(key) < 18 or key[16] != ":" or _AUTO.fullmatch(key) is None:
        return None
    return int(key[:16], 16), int(key[17:], 16)


def _auto_key(prefix: int, counter: int) -> str:
    """The key string of (connection id, counter): the inverse of :func:`_auto`."""
    return f"{prefix:016x}:{counter:x}"


class _Run:
    """The remembered client-form keys of one connection on one queue, as blocks of
    consecutive counters whose entries have consecutive sequence numbers (a connection's
    publishes, applied in order, make one block per event or longer): each block's first
    counter, its first entry's sequence number and its length, in increasing counter
    order from ``head`` (a forgotten prefix is cut off now and then). A connection's
    counters grow, so remembering extends the last block and forgetting (in log order)
    takes from the front; only a re-send that overtook an older publish, or a key
    remembered again, lands in the middle (splitting a block)."""

    __slots__ = ("qid", "prefix", "starts", "seqs", "lens", "head", "end", "next_seq")

    def __init__(self, qid: int, prefix: int) -> None:
        self.qid = qid
        self.prefix = prefix  # the connection id
        self.starts = array("q")
        self.seqs = array("q")
        self.lens = array("i")
        self.head = 0
        # The counter and sequence number that would continue the last block (-1: none).
        self.end = self.next_seq = -1

    def _retail(self) -> None:
        """Set ``end`` and ``next_seq`` from the last block after a change of it."""
        n = len(self.starts)
        if n > self.head:
            self.end = self.starts[n - 1] + self.lens[n - 1]
            self.next_seq = self.seqs[n - 1] + self.lens[n - 1]
        else:
            self.end = self.next_seq = -1

    def _block(self, counter: int) -> int:
        """The index of the block holding ``counter``, or -1."""
        starts = self.starts
        n = len(starts)
        if n == self.head or counter >= starts[n - 1] + self.lens[n - 1]:
            return -1
        i = bisect_right(starts, counter, self.head) - 1
        return i if i >= self.head and counter < starts[i] + self.lens[i] else -1

    def find(self, counter: int) -> int:
        """The sequence number of the newest entry of ``counter``, or -1."""
        i = self._block(counter)
        return -1 if i < 0 else self.seqs[i] + counter - self.starts[i]

    def put(self, counter: int, seq: int) -> None:
        if counter == self.end and seq == self.next_seq:
            self.lens[-1] += 1
            self.end = counter + 1
            self.next_seq = seq + 1
            return
        starts, seqs, lens = self.starts, self.seqs, self.lens
        n = len(starts)
        if n == self.head or counter >= starts[n - 1] + lens[n - 1]:
            starts.append(counter)
            seqs.append(seq)
            lens.append(1)
            self.end = counter + 1
            self.next_seq = seq + 1
            return
        i = self._block(counter)
        if i < 0:  # in a gap (or before the first block): a block of its own
            at = bisect_right(starts, counter, self.head)
            starts.insert(at, counter)
            seqs.insert(at, seq)
            lens.insert(at, 1)
            self._retail()
            return
        self._cut(i, counter)
        at = self._block(counter)  # now a block of one counter
        seqs[at] = seq
        self._retail()

    def _cut(self, i: int, counter: int) -> None:
        """Split block ``i`` so that ``counter`` is a block of its own."""
        starts, seqs, lens = self.starts, self.seqs, self.lens
        start, seq0, n = starts[i], seqs[i], lens[i]
        k = counter - start
        parts = [(start, seq0, k), (counter, seq0 + k, 1), (counter + 1, seq0 + k + 1, n - k - 1)]
        parts = [p for p in parts if p[2] > 0]
        starts[i : i + 1] = array("q", [p[0] for p in parts])
        seqs[i : i + 1] = array("q", [p[1] for p in parts])
        lens[i : i + 1] = array("i", [p[2] for p in parts])

    def drop(self, counter: int, seq: int) -> bool:
        """Forget ``counter`` if its newest entry is ``seq``. Returns: the run is empty."""
        i = self._block(counter)
        if i >= 0 and self.seqs[i] + counter - self.starts[i] == seq:
            starts, seqs, lens = self.starts, self.seqs, self.lens
            if counter == starts[i]:
                if lens[i] > 1:
                    starts[i] += 1
                    seqs[i] += 1
                    lens[i] -= 1
                elif i == self.head:
                    self.head = i + 1
                    if self.head >= _CUT and self.head * 2 >= len(starts):
                        del starts[: self.head], seqs[: self.head], lens[: self.head]
                        self.head = 0
                else:
                    del starts[i], seqs[i], lens[i]
            elif counter == starts[i] + lens[i] - 1:
                lens[i] -= 1
            else:
                self._cut(i, counter)
                at = self._block(counter)
                del starts[at], seqs[at], lens[at]
            self._retail()
        return self.head == len(self.starts)


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
        # entries in log order, as blocks (the oldest first, from ``_bhead``; the
        # forgotten prefix is cut off now and then), each in parallel arrays of machine
        # integers: its first entry's sequence number, first counter (or _STR: one entry
        # whose queue id and key are in ``_strs``), first position, the step from one
        # entry's first position to the next, expiry and length; and in a list, the
        # _Run of its queue and connection (None for _STR), which holds both ids. The
        # entries of a block have consecutive sequence numbers and counters, one queue,
        # one connection and one expiry: a connection's publishes in one event are one
        # block. Forgetting the oldest entry shrinks the head block from the front.
        self._bseq = array("q")
        self._bruns: list[_Run | None] = []
        self._bcounter = array("q")
        self._bfirst = array("q")
        self._bstep = array("i")
        self._bexpires = array("q")
        self._blen = array("i")
        self._bhead = 0
        # The newest block's continuation: (the next entry's sequence number and counter,
        # its connection id, queue id and expiry, its first position: None while the
        # block holds one entry), or None when the newest block cannot be continued.
        self._tail: tuple[int, int, int, int, int, int | None] | None = None
        # Each remembered entry's hash (for the digest sum), in log order from _ehead.
        self._hashes = array("Q")
        self._ehead = 0
        # seq -> (queue id, key), for keys not in the clients' form
        self._strs: dict[int, tuple[int, str]] = {}
        # The lookup: client-form keys per queue id and connection id; other keys per
        # queue id, key -> the sequence number of its newest entry.
        self._runs: dict[int, dict[int, _Run]] = {}
        self._by_q: dict[int, dict[str, int]] = {}
        self.total = 0  # keys ever remembered: the next key's sequence number
        self._new: list[KeyEntry] = []  # (seq, qid, key, first, expires) to store
        # The sum (mod 2**64) of every remembered entry's hash, kept as keys come and
        # go: the replica digest reads it instead of packing up to a million keys at
        # each checkpoint (the sequence numbers in the entries make it order-aware).
        self._sum = 0

    def __len__(self) -> int:
        """How many keys are remembered now."""
        return len(self._hashes) - self._ehead

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
        seq = run.find(auto[1])
        return seq if seq >= 0 else None

    def _at(self, seq: int) -> tuple[int, int]:
        """(first position, expires) of the remembered entry ``seq``."""
        bseq = self._bseq
        b = bisect_right(bseq, seq, self._bhead) - 1
        return self._bfirst[b] + (seq - bseq[b]) * self._bstep[b], self._bexpires[b]

    def lookup(self, qid: int, key: str) -> tuple[int, int] | None:
        """(first position, expires) of the newest ``key`` remembered for queue ``qid``."""
        seq = self._newest(qid, key)
        return None if seq is None else self._at(seq)

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
                            seq = at
                if seq is not None:
                    first, expires = self._at(seq)
                    if expires < 0 or expires > clock:
                        old = first
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
        """Add an entry at the end of the blocks and the lookup (``auto``: the key's
        :func:`_auto` if known, True to parse it here)."""
        h = _entry_hash(seq, qid, key, first, expires)
        self._sum = (self._sum + h) & _MASK
        self._hashes.append(h)
        if auto is True:
            auto = _auto(key)
        if not auto:
            self._strs[seq] = (qid, key)
            seqs = self._by_q.get(qid)
            if seqs is None:
                seqs = self._by_q[qid] = {}
            seqs[key] = seq
            self._start_block(seq, None, _STR, first, expires)
            self._tail = None
            return
        prefix, counter = auto
        runs = self._runs.get(qid)
        if runs is None:
            runs = self._runs[qid] = {}
        run = runs.get(prefix)
        if run is None:
            run = runs[prefix] = _Run(qid, prefix)
        run.put(counter, seq)
        # Extend the newest block if this entry continues it (its end kept in _tail;
        # None once that block is forgotten).
        tail = self._tail
        if (
            tail is not None
            and tail[0] == seq
            and tail[1] == counter
            and tail[2] == prefix
            and tail[3] == qid
            and tail[4] == expires
        ):
            b = len(self._bseq) - 1
            if tail[5] is None:
                step = first - self._bfirst[b]
                if -_STEP < step < _STEP:
                    self._bstep[b] = step
                    self._blen[b] = 2
                    self._tail = (seq + 1, counter + 1, prefix, qid, expires, first + step)
                    return
            elif tail[5] == first:
                self._blen[b] += 1
                self._tail = (seq + 1, counter + 1, prefix, qid, expires, first + self._bstep[b])
                return
        self._start_block(seq, run, counter, first, expires)
        self._tail = (seq + 1, counter + 1, prefix, qid, expires, None)

    def _start_block(self, seq: int, run: _Run | None, counter: int, first: int,
               expires: int) -> None:
        """Start a block of one entry."""
        self._bseq.append(seq)
        self._bruns.append(run)
        self._bcounter.append(counter)
        self._bfirst.append(first)
        self._bstep.append(0)
        self._bexpires.append(expires)
        self._blen.append(1)

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
        while len(self._hashes) - self._ehead > self.memory:
            self._pop()

    def _pop(self) -> None:
        """Forget the oldest key (unless the same key was remembered again since)."""
        b = self._bhead
        seq = self._bseq[b]
        e = self._ehead
        self._sum = (self._sum - self._hashes[e]) & _MASK
        self._ehead = e + 1
        if self._ehead >= _CUT and self._ehead * 2 >= len(self._hashes):
            del self._hashes[: self._ehead]  # amortised O(1) per key
            self._ehead = 0
        counter = self._bcounter[b]
        run = self._bruns[b]
        if run is None:
            qid, name = self._strs.pop(seq)
            seqs = self._by_q[qid]
            if seqs.get(name) == seq:
                del seqs[name]
                if not seqs:
                    del self._by_q[qid]
        elif run.drop(counter, seq):
            runs = self._runs[run.qid]
            del runs[run.prefix]
            if not runs:
                del self._runs[run.qid]
        n = self._blen[b]
        if n > 1:  # the head block loses its first entry
            self._bseq[b] = seq + 1
            self._bcounter[b] = counter + 1
            self._bfirst[b] += self._bstep[b]
            self._blen[b] = n - 1
            return
        self._bhead = b + 1
        if self._bhead == len(self._bseq):
            self._tail = None  # the newest block is gone
        if self._bhead >= _CUT and self._bhead * 2 >= len(self._bseq):
            n = self._bhead
            del self._bseq[:n], self._bruns[:n], self._bcounter[:n]
            del self._bfirst[:n], self._bstep[:n], self._bexpires[:n], self._blen[:n]
            self._bhead = 0

    def forget_expired(self, clock: int) -> None:
        """Forget the oldest keys, in log order, while their window has passed at
        ``clock`` (a key behind one with a longer window waits for it, but is no
        longer honoured: :meth:`split` checks each key's own time)."""
        expires = self._bexpires
        while self._bhead < len(expires) and 0 <= expires[self._bhead] <= clock:
            self._pop()

    def entries(self) -> list[KeyEntry]:
        """The remembered keys as (seq, qid, key, first position, expires), in log order."""
        h = self._bhead
        strs = self._strs
        out: list[KeyEntry] = []
        for seq, run, counter, first, step, expires, n in zip(
            self._bseq[h:], self._bruns[h:], self._bcounter[h:],
            self._bfirst[h:], self._bstep[h:], self._bexpires[h:], self._blen[h:],
        ):
            if run is None:
                qid, key = strs[seq]
                out.append((seq, qid, key, first, expires))
            else:
                qid, prefix = run.qid, run.prefix
                out.extend(
                    (seq + j, qid, _auto_key(prefix, counter + j), first + j * step, expires)
                    for j in range(n)
                )
        return out

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
