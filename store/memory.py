"""The in-process store: the reference backend for the store's contract suite and the
node's unit tests.

Plain dicts, no I/O. It keeps what :class:`batonmq.store.rocks.RocksStore` keeps, in the
same encodings: a message is the same msgpack record (so ``size``, ``max_bytes`` and
:meth:`StoreReader.get_raw` mean the same on both, and a record read from one is put into
the other), and snapshots and keys are packed when saved and unpacked by :meth:`load`
(a tuple saved comes back a list, as from the disk).

A broker's restart is :meth:`MemoryStore.reopen`: after :meth:`MemoryStore.close`, a new
store on everything committed, like opening the same database directory again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from batonmq.cluster.errors import StoreError
from batonmq.store import Batch, Loaded, Store, StoredMessage, StoreReader, merge_headers

__all__ = ["MemoryStore"]

Messages = dict[int, dict[int, bytes]]  # qid -> position -> the message's record


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def _message(raw: bytes) -> StoredMessage:
    enqueued_at, publish_time, headers, body = msgpack.unpackb(raw, raw=False)
    return StoredMessage(body, headers, publish_time, enqueued_at, len(raw))


@dataclass(slots=True)
class _Contents:
    """What one store holds; it outlives the :class:`MemoryStore` that closes (a restart)."""

    messages: Messages = field(default_factory=dict)
    queues: dict[str, bytes] = field(default_factory=dict)  # name -> packed snapshot
    meta: bytes | None = None  # packed snapshot
    exchanges: bytes | None = None  # packed snapshot
    applied: int = -1
    keys: dict[int, bytes] = field(default_factory=dict)  # seq -> packed [qid, key, first, expires]
    idents: dict[str, str] = field(default_factory=dict)
    outbox: dict[str, dict[int, bytes]] = field(default_factory=dict)  # runtime -> seq -> record
    in_use: bool = True  # an open MemoryStore works on these contents

    def put_message(self, qid: int, pos: int, raw: bytes) -> None:
        self.messages.setdefault(qid, {})[pos] = raw

    def delete_messages(self, qid: int, keep: Callable[[int], bool]) -> None:
        """Forget the messages of ``qid`` whose position ``keep`` refuses."""
        queue = self.messages.get(qid)
        if queue is None:
            return
        for pos in [p for p in queue if not keep(p)]:
            del queue[pos]
        if not queue:
            del self.messages[qid]


Op = Callable[[_Contents], None]


class _MemoryBatch(Batch):
    """Changes recorded as operations, replayed in order on the contents at commit.

    ``pending`` holds the messages this batch wrote or removed so far (None: removed),
    so that :meth:`move` sees the batch's own earlier changes over the committed ones.
    """

    __slots__ = ("ops", "pending", "_committed")

    def __init__(self, committed: _Contents) -> None:
        self.ops: list[Op] = []
        self.pending: dict[tuple[int, int], bytes | None] = {}
        self._committed = committed

    def _get(self, qid: int, pos: int) -> bytes | None:
        key = (qid, pos)
        if key in self.pending:
            return self.pending[key]
        return self._committed.messages.get(qid, {}).get(pos)

    def _forget(self, qid: int, inside: Callable[[int], bool]) -> None:
        """Mark every message of ``qid`` at a position ``inside`` says as removed."""
        positions = {p for (q, p) in self.pending if q == qid}
        positions.update(self._committed.messages.get(qid, {}))
        for pos in positions:
            if inside(pos):
                self.pending[qid, pos] = None

    def _put(self, qid: int, pos: int, raw: bytes) -> None:
        self.pending[qid, pos] = raw
        self.ops.append(lambda c: c.put_message(qid, pos, raw))

    def put_messages(
        self,
        qid: int,
        first: int,
        messages: tuple[tuple[bytes, dict[str, Any]], ...],
        enqueued_at: int,
        publish_time: int,
    ) -> None:
        for i, (body, headers) in enumerate(messages):
            self._put(qid, first + i, _pack((enqueued_at, publish_time, headers, body)))

    def remove(self, qid: int, positions: list[int]) -> None:
        gone = frozenset(positions)
        for pos in gone:
            self.pending[qid, pos] = None
        self.ops.append(lambda c: c.delete_messages(qid, lambda p: p not in gone))

    def remove_range(self, qid: int, lo: int, hi: int) -> None:
        self._forget(qid, lambda p: lo <= p < hi)
        self.ops.append(lambda c: c.delete_messages(qid, lambda p: not lo <= p < hi))

    def move(
        self,
        src_qid: int,
        src_pos: int,
        dst_qid: int,
        dst_pos: int,
        headers: dict[str, Any],
        enqueued_at: int,
        keep: bool = False,
        defaults: dict[str, Any] | None = None,
    ) -> bool:
        raw = self._get(src_qid, src_pos)
        if not keep:
            self.remove(src_qid, [src_pos])
        if raw is None:
            return False
        self._put(dst_qid, dst_pos, merge_headers(raw, headers, enqueued_at, defaults))
        return True

    def put_raw(self, qid: int, pos: int, raw: bytes) -> None:
        self._put(qid, pos, bytes(raw))

    def drop_queue(self, qid: int) -> None:
        self._forget(qid, lambda p: True)
        self.ops.append(lambda c: c.delete_messages(qid, lambda p: False))

    def put_queue(self, name: str, snapshot: list[Any] | None) -> None:
        packed = None if snapshot is None else _pack(snapshot)

        def put(c: _Contents) -> None:
            if packed is None:
                c.queues.pop(name, None)
            else:
                c.queues[name] = packed

        self.ops.append(put)

    def put_meta(self, snapshot: list[Any]) -> None:
        packed = _pack(snapshot)

        def put(c: _Contents) -> None:
            c.meta = packed

        self.ops.append(put)

    def put_exchanges(self, snapshot: list[Any]) -> None:
        packed = _pack(snapshot)

        def put(c: _Contents) -> None:
            c.exchanges = packed

        self.ops.append(put)

    def put_keys(self, entries: list[tuple[int, int, str, int, int]], forget: range) -> None:
        packed = [
            (seq, _pack([qid, key, first, expires])) for seq, qid, key, first, expires in entries
        ]

        def put(c: _Contents) -> None:
            c.keys.update(packed)
            for seq in forget:
                c.keys.pop(seq, None)

        self.ops.append(put)


class _MemoryReader(StoreReader):
    """A copy of the messages as they were when the reader was taken."""

    __slots__ = ("_messages",)

    def __init__(self, messages: Messages) -> None:
        self._messages: Messages | None = {qid: dict(q) for qid, q in messages.items()}

    def get_raw(self, qid: int, pos: int) -> bytes | None:
        if self._messages is None:
            raise StoreError("this store reader is closed")
        return self._messages.get(qid, {}).get(pos)

    def close(self) -> None:
        self._messages = None


class MemoryStore(Store):
    """A store in this process's memory, empty at first.

    After :meth:`close`, :meth:`reopen` gives a store on what this one committed (a
    broker's restart in a test). Every call on a closed store raises StoreError.
    """

    def __init__(self) -> None:
        self._contents = _Contents()
        self._closed = False

    def reopen(self) -> "MemoryStore":
        """A new store on everything this one committed, as if the broker restarted.

        Raises:
            StoreError: this store is still open (one broker at a time, like a locked
                data dir), or another store reopened on the same contents is.
        """
        if self._contents.in_use:
            raise StoreError("cannot reopen a memory store that is still open")
        again = MemoryStore()
        again._contents = self._contents
        self._contents.in_use = True
        return again

    def _open(self) -> _Contents:
        if self._closed:
            raise StoreError("the store is closed")
        return self._contents

    def load(self) -> Loaded:
        c = self._open()
        out = Loaded(applied=c.applied)
        if c.meta is not None:
            out.meta = _unpack(c.meta)
        if c.exchanges is not None:
            out.exchanges = _unpack(c.exchanges)
        out.queues = {name: _unpack(snap) for name, snap in sorted(c.queues.items())}
        for seq in sorted(c.keys):
            qid, name, first, expires = _unpack(c.keys[seq])
            out.keys.append((seq, qid, name, first, expires))
        return out

    def batch(self) -> Batch:
        return _MemoryBatch(self._contents)

    def commit(self, batch: Batch, applied: int) -> None:
        assert isinstance(batch, _MemoryBatch)
        c = self._open()
        for op in batch.ops:
            op(c)
        c.applied = applied

    def reader(self) -> StoreReader:
        return _MemoryReader(self._open().messages)

    def reset(self) -> None:
        c = self._open()
        c.messages.clear()
        c.queues.clear()
        c.keys.clear()
        c.meta = None
        c.exchanges = None
        c.applied = -1

    def get_messages(self, qid: int, positions: list[int]) -> list[StoredMessage | None]:
        queue = self._open().messages.get(qid, {})
        out: list[StoredMessage | None] = []
        for pos in positions:
            raw = queue.get(pos)
            out.append(None if raw is None else _message(raw))
        return out

    def scan(self, qid: int, start: int, limit: int) -> list[tuple[int, int]]:
        queue = self._open().messages.get(qid, {})
        out: list[tuple[int, int]] = []
        for pos in sorted(p for p in queue if p >= start):
            if len(out) >= limit:
                break
            out.append((pos, _message(queue[pos]).enqueued_at))
        return out

    def read_range(
        self, qid: int, start: int, end: int, limit: int, max_bytes: int
    ) -> list[tuple[int, StoredMessage]]:
        queue = self._open().messages.get(qid, {})
        out: list[tuple[int, StoredMessage]] = []
        size = 0
        for pos in sorted(p for p in queue if start <= p < end):
            if len(out) >= limit or size >= max_bytes:
                break
            message = _message(queue[pos])
            out.append((pos, message))
            size += message.size
        return out

    def outbox_put(self, runtime: str, records: list[tuple[int, bytes]]) -> None:
        outbox = self._open().outbox
        if records:
            outbox.setdefault(runtime, {}).update((seq, bytes(record)) for seq, record in records)

    def outbox_remove(self, runtime: str, seqs: list[int]) -> None:
        outbox = self._open().outbox
        kept = outbox.get(runtime, {})
        for seq in seqs:
            kept.pop(seq, None)
        if not kept:
            outbox.pop(runtime, None)

    def outbox_load(self) -> list[tuple[str, int, bytes]]:
        outbox = self._open().outbox
        return [
            (runtime, seq, outbox[runtime][seq])
            for runtime in sorted(outbox)
            for seq in sorted(outbox[runtime])
        ]

    def get_ident(self, key: str) -> str | None:
        return self._open().idents.get(key)

    def put_ident(self, key: str, value: str) -> None:
        self._open().idents[key] = value

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._contents.in_use = False
