"""The rocksdict store: one database per broker, raw bytes keys and values.

Keys:
  ``m`` + qid (8 bytes BE) + position (8 bytes BE) -> msgpack [enqueued_at, publish_time, headers, body]
  ``q`` + queue name (utf-8)                        -> msgpack queue-index snapshot
  ``s``                                              -> msgpack meta snapshot
  ``x``                                              -> msgpack exchanges snapshot (with their bindings)
  ``a``                                              -> applied offset (8 bytes BE, signed)
  ``i`` + key                                        -> identity value (utf-8)
  ``j`` + seq (8 bytes BE)                           -> msgpack [[seq, qid, key, first position, expires], ...]:
                                                        a block of publish keys, keyed by its last seq
  ``f``                                              -> seq (8 bytes BE): publish keys below it are forgotten
  ``k`` + seq (8 bytes BE)                           -> msgpack [qid, key, first position, expires]: one
                                                        publish key, as older brokers stored them (read only)
  ``o`` + runtime (utf-8) + ``/`` + seq (8 bytes BE)   -> an outbox event's log record

Fixed-width big-endian qid/position keys sort in position order, so a queue's
messages are one contiguous key range (range deletes, ordered scans).

Writes are not fsynced: the ordered log is the durable record, and a crash that
loses the tail of rocksdb's WAL loses the offset with it (same write batch), so
the broker replays those records from the log.

Publish keys come at the rate of publishes and are forgotten in order: each commit
stores its new keys as one block record and moves the floor record, instead of a put and
a delete per key (at 20,000 publishes a second those cost more than the messages). Blocks
wholly below the floor are deleted by a range delete every :data:`_KEY_BLOCK` keys;
:meth:`RocksStore.load` skips the keys below the floor in a block that is partly past.

Damage: the database opens with RocksDB's paranoid checks, and :meth:`RocksStore.open_checked`
reads every block once (verifying its checksum) before the broker uses the store; a
corruption found then, or by any later read, is :class:`StoreCorrupt`. Iterations check
the iterator's status at the end: RocksDB ends an iteration early, silently, on a
damaged block, which would otherwise look like fewer keys.
"""

from __future__ import annotations

import gc
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
from rocksdict import BlockBasedOptions, Cache, Options, Rdict, RdictIter, ReadOptions, WriteBatch, WriteOptions

from batonmq.cluster.errors import StoreCorrupt, StoreError
from batonmq.store import Batch, Loaded, Store, StoredMessage, StoreReader

log = logging.getLogger(__name__)

__all__ = ["RocksStore", "CheckedOpen"]


def _failure(what: str, exc: Exception) -> StoreError:
    """StoreCorrupt for RocksDB's Corruption status (checksums, sizes), else StoreError."""
    if "Corruption" in str(exc):
        return StoreCorrupt(f"{what}: {exc}")
    return StoreError(f"{what}: {exc}")


def _finished(it: RdictIter, what: str) -> None:
    """Raise if an iteration ended on an error rather than at the end of its keys."""
    try:
        it.status()
    except Exception as exc:  # rocksdict raises a plain Exception with RocksDB's status
        raise _failure(what, exc) from exc


@dataclass(frozen=True, slots=True)
class CheckedOpen:
    """What :meth:`RocksStore.open_checked` found.

    Attributes:
        store: the store to use (a fresh, empty one if the old one was damaged).
        damaged: where the damaged store was moved (None: it was whole).
        reason: the corruption found (empty when whole).
        node_id: the node id read from the damaged store, if it could be read
            through RocksDB's checksums (None: not recoverable).
    """

    store: "RocksStore"
    damaged: str | None = None
    reason: str = ""
    node_id: str | None = None

_QP = struct.Struct(">QQ")
_OFF = struct.Struct(">q")
_SEQ = struct.Struct(">Q")
_APPLIED = b"a"
_META = b"s"
_EXCHANGES = b"x"
_KEY_FLOOR = b"f"
#: The most publish keys in one block record; blocks below the floor are range-deleted
#: once the floor has moved this many keys past the last such delete.
_KEY_BLOCK = 4096
#: RocksDB's memtable (write buffer) and block cache sizes: see RocksStore.
_MEMTABLE_BYTES = 4 << 20
_BLOCK_CACHE_BYTES = 4 << 20


def _mkey(qid: int, pos: int) -> bytes:
    return b"m" + _QP.pack(qid, pos)


def _qprefix(qid: int) -> bytes:
    """The key prefix of every message of queue ``qid``."""
    return _mkey(qid, 0)[:9]


class _RocksBatch(Batch):
    """A write batch of one store: ``packer`` encodes its values, ``get`` reads the
    store's database (a move's source that this batch has not written)."""

    __slots__ = ("wb", "pending", "_get", "_packer")

    def __init__(self, packer: msgpack.Packer, get: Callable[[bytes], bytes | None]) -> None:
        self.wb = WriteBatch(raw_mode=True)
        self._get = get
        # Values put in this batch, so a move of a message enqueued in the same
        # batch finds it before it reaches the database.
        self.pending: dict[bytes, bytes | None] = {}
        self._packer = packer

    def put_messages(
        self,
        qid: int,
        first: int,
        messages: tuple[tuple[bytes, dict[str, Any]], ...],
        enqueued_at: int,
        publish_time: int,
    ) -> None:
        pack, put, pending = self._packer.pack, self.wb.put, self.pending
        pos = first
        for body, headers in messages:
            key = b"m" + _QP.pack(qid, pos)
            value = pack((enqueued_at, publish_time, headers, body))
            put(key, value)
            pending[key] = value
            pos += 1

    def remove(self, qid: int, positions: list[int]) -> None:
        delete, pending = self.wb.delete, self.pending
        for p in positions:
            key = b"m" + _QP.pack(qid, p)
            delete(key)
            pending[key] = None

    def remove_range(self, qid: int, lo: int, hi: int) -> None:
        self.wb.delete_range(_mkey(qid, lo), _mkey(qid, hi))
        prefix = _qprefix(qid)
        for key in [k for k in self.pending if k[:9] == prefix]:
            (_, pos) = _QP.unpack(key[1:])
            if lo <= pos < hi:
                self.pending[key] = None

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
        src = _mkey(src_qid, src_pos)
        raw = self.pending[src] if src in self.pending else self._get(src)
        if not keep:
            self.remove(src_qid, [src_pos])
        if raw is None:
            return False  # not here (yet): a joining broker's update brings it
        _, publish_time, old_headers, body = msgpack.unpackb(raw, raw=False)
        merged = {**defaults, **old_headers, **headers} if defaults else {**old_headers, **headers}
        dst = _mkey(dst_qid, dst_pos)
        value = self._packer.pack((enqueued_at, publish_time, merged, body))
        self.wb.put(dst, value)
        self.pending[dst] = value
        return True

    def put_raw(self, qid: int, pos: int, raw: bytes) -> None:
        key = _mkey(qid, pos)
        self.wb.put(key, raw)
        self.pending[key] = raw

    def drop_queue(self, qid: int) -> None:
        self.wb.delete_range(_mkey(qid, 0), _mkey(qid + 1, 0))
        prefix = _qprefix(qid)
        for key in [k for k in self.pending if k[:9] == prefix]:
            self.pending[key] = None

    def put_queue(self, name: str, snapshot: list[Any] | None) -> None:
        key = b"q" + name.encode()
        if snapshot is None:
            self.wb.delete(key)
        else:
            self.wb.put(key, self._packer.pack(snapshot))

    def put_keys(self, entries: list[tuple[int, int, str, int, int]], forget: range) -> None:
        # One record per block of keys, keyed by its last seq (see the module's doc).
        pack = self._packer.pack
        for i in range(0, len(entries), _KEY_BLOCK):
            block = entries[i : i + _KEY_BLOCK]
            self.wb.put(b"j" + _SEQ.pack(max(e[0] for e in block)), pack(block))
        if forget:
            floor = forget.stop
            self.wb.put(_KEY_FLOOR, _SEQ.pack(floor))
            if forget.start // _KEY_BLOCK != floor // _KEY_BLOCK or len(forget) >= _KEY_BLOCK:
                # Blocks whose last key is below the floor, and keys older brokers
                # stored one by one.
                self.wb.delete_range(b"j", b"j" + _SEQ.pack(floor))
                self.wb.delete_range(b"k", b"k" + _SEQ.pack(floor))

    def put_meta(self, snapshot: list[Any]) -> None:
        self.wb.put(_META, self._packer.pack(snapshot))

    def put_exchanges(self, snapshot: list[Any]) -> None:
        self.wb.put(_EXCHANGES, self._packer.pack(snapshot))


class _RocksReader(StoreReader):
    """Point reads on a rocksdb snapshot. (rocksdict 0.3.29 snapshots answer point
    reads consistently but their iterators see later writes: never iterate one.)"""

    __slots__ = ("_snap",)

    def __init__(self, db: Rdict) -> None:
        self._snap: Any = db.snapshot()

    def get_raw(self, qid: int, pos: int) -> bytes | None:
        try:
            return bytes(self._snap[_mkey(qid, pos)])
        except KeyError:
            return None
        except Exception as exc:
            # rocksdict 0.3.29's Snapshot has no get() and raises a plain Exception
            # (not KeyError) for a missing key.
            if str(exc) == "key not found":
                return None
            raise

    def close(self) -> None:
        self._snap = None


class RocksStore(Store):
    """A rocksdict database in ``path`` (created if missing).

    Raises:
        StoreError: the database cannot be opened (e.g. locked by another process).
    """

    def __init__(self, path: str) -> None:
        os.makedirs(path, mode=0o700, exist_ok=True)  # owner only: it holds message bodies
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        # Check what RocksDB reads at open (the manifest, the files' sizes) and stop on
        # damage instead of going on without it.
        opts.set_paranoid_checks(True)
        # Memory: RocksDB's defaults (a 64 MiB memtable, of which two may be held, and a
        # block cache that held 24 MiB after a load test) are sized for a database that
        # is the process's main job, and were half of a busy broker's RSS. The store takes small batches (what the
        # log applied) and reads back recent bodies, mostly still in the memtable or the
        # page cache: 4 MiB of each cost no throughput the load test could tell from
        # noise (docs/performance.md "Memory").
        opts.set_write_buffer_size(_MEMTABLE_BYTES)
        opts.set_max_write_buffer_number(2)
        self._cache = Cache(_BLOCK_CACHE_BYTES)  # (RocksDB needs it to outlive the db)
        table = BlockBasedOptions()
        table.set_block_cache(self._cache)
        opts.set_block_based_table_factory(table)
        try:
            self._db = Rdict(path, opts)
        except Exception as exc:  # rocksdict raises plain Exception subclasses
            hint = " (is another broker using this data dir?)" if "lock" in str(exc).lower() else ""
            raise _failure(f"cannot open store at {path}{hint}", exc) from exc
        self._packer = msgpack.Packer(use_bin_type=True)
        self._wo = WriteOptions()
        self._wo.sync = False
        self._sync = WriteOptions()
        self._sync.sync = True
        self.path = path

    @classmethod
    def open_checked(cls, path: str) -> CheckedOpen:
        """Open the store at ``path`` and read all of it once; if it is damaged, move it
        aside to ``<path>.damaged-<UTC time>`` (kept for a post-mortem) and open a fresh,
        empty store there instead, which makes the broker join as a new one.

        Returns:
            The store to use and what was found (:class:`CheckedOpen`).

        Raises:
            StoreError: the store cannot be opened for another reason (e.g. locked).
        """
        node_id: str | None = None
        close_failed = False
        try:
            store = cls(path)
        except StoreCorrupt as exc:
            reason = exc.message
        else:
            try:
                try:
                    node_id = store.get_ident("node_id")
                except StoreCorrupt:
                    node_id = None  # its own block is damaged: not recoverable
                store.verify()
                return CheckedOpen(store)
            except StoreCorrupt as exc:
                reason = exc.message
                try:
                    store.close(flush=False)
                except Exception as close_exc:  # damage can fail the close too: set it aside
                    log.warning("closing the damaged store at %s failed: %s", path, str(close_exc))
                    close_failed = True
        if close_failed:
            # The database may still be open, holding RocksDB's lock on this path:
            # drop the references so it is released before a fresh store opens here.
            del store
            gc.collect()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        damaged = f"{path}.damaged-{stamp}"
        n = 1
        while os.path.exists(damaged):
            n += 1
            damaged = f"{path}.damaged-{stamp}-{n}"
        os.rename(path, damaged)
        return CheckedOpen(cls(path), damaged, reason, node_id)

    def verify(self) -> int:
        """Read every key and value once, verifying every block's checksum.

        Returns:
            How many keys were read.

        Raises:
            StoreCorrupt: a block failed its checksum (or another corruption status).
            StoreError: another read failure.
        """
        ro = ReadOptions()
        ro.set_verify_checksums(True)
        # One pass over everything: keep the block cache for real reads (rocksdict's
        # stub lacks the argument the binding takes).
        ro.fill_cache(False)  # type: ignore[call-arg]
        it = self._db.iter(ro)
        n = 0
        try:
            it.seek_to_first()
            while it.valid():
                it.value()
                n += 1
                it.next()
        except Exception as exc:
            raise _failure(f"store check of {self.path}", exc) from exc
        _finished(it, f"store check of {self.path}")
        return n

    def load(self) -> Loaded:
        out = Loaded()
        raw = self._db.get(_APPLIED)
        if raw is not None:
            (out.applied,) = _OFF.unpack(raw)
        meta = self._db.get(_META)
        if meta is not None:
            out.meta = msgpack.unpackb(meta, raw=False, strict_map_key=False)
        exchanges = self._db.get(_EXCHANGES)
        if exchanges is not None:
            out.exchanges = msgpack.unpackb(exchanges, raw=False, strict_map_key=False)
        for key, value in self._prefixed(b"q"):
            out.queues[key[1:].decode()] = msgpack.unpackb(value, raw=False, strict_map_key=False)
        raw = self._db.get(_KEY_FLOOR)
        floor = _SEQ.unpack(raw)[0] if raw is not None else 0
        keys = out.keys
        for key, value in self._prefixed(b"k"):  # as older brokers stored them
            seq = _SEQ.unpack(key[1:])[0]
            if seq >= floor:
                item = msgpack.unpackb(value, raw=False)
                # Keys stored before the time window have no expiry (-1): kept until pushed out.
                expires = item[3] if len(item) > 3 else -1
                keys.append((seq, item[0], item[1], item[2], expires))
        for _, value in self._prefixed(b"j"):
            for seq, qid, name, first, expires in msgpack.unpackb(value, raw=False):
                if seq >= floor:
                    keys.append((seq, qid, name, first, expires))
        if any(keys[i][0] >= keys[i + 1][0] for i in range(len(keys) - 1)):
            # Blocks are in seq order, and older brokers' keys come before them; only
            # an odd history (a key stored twice) needs this: the last one stored wins.
            out.keys = sorted({e[0]: e for e in keys}.values())
        return out

    def batch(self) -> Batch:
        return _RocksBatch(self._packer, self._db.get)

    def commit(self, batch: Batch, applied: int) -> None:
        assert isinstance(batch, _RocksBatch)
        batch.wb.put(_APPLIED, _OFF.pack(applied))
        try:
            self._db.write(batch.wb, self._wo)
        except Exception as exc:
            raise StoreError(f"store write failed: {exc}") from exc

    def reader(self) -> StoreReader:
        return _RocksReader(self._db)

    def reset(self) -> None:
        wb = WriteBatch(raw_mode=True)
        for prefix in (b"m", b"q", b"k", b"j"):
            wb.delete_range(prefix, bytes([prefix[0] + 1]))
        wb.delete(_KEY_FLOOR)
        wb.delete(_META)
        wb.delete(_EXCHANGES)
        wb.delete(_APPLIED)
        self._write(wb)

    def get_messages(self, qid: int, positions: list[int]) -> list[StoredMessage | None]:
        if not positions:
            return []
        raws: list[bytes | None] = self._db.get([_mkey(qid, p) for p in positions]) or []
        out: list[StoredMessage | None] = []
        unpackb = msgpack.unpackb
        for raw in raws:
            if raw is None:
                out.append(None)
                continue
            enq, pub, headers, body = unpackb(raw, raw=False)
            out.append(StoredMessage(body, headers, pub, enq, len(raw)))
        return out

    def scan(self, qid: int, start: int, limit: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        it = self._db.iter()
        it.seek(_mkey(qid, start))
        end = _mkey(qid + 1, 0)
        while it.valid() and len(out) < limit:
            key = it.key()
            if key >= end:
                break
            _, pos = _QP.unpack(key[1:])
            # The enqueue time is the first msgpack item; read just that.
            unpacker = msgpack.Unpacker(raw=False)
            unpacker.feed(it.value()[:16])
            unpacker.read_array_header()
            out.append((pos, unpacker.unpack()))
            it.next()
        _finished(it, "store scan")
        return out

    def read_range(
        self, qid: int, start: int, end: int, limit: int, max_bytes: int
    ) -> list[tuple[int, StoredMessage]]:
        out: list[tuple[int, StoredMessage]] = []
        if end <= start or limit <= 0:
            return out
        it = self._db.iter()
        it.seek(_mkey(qid, start))
        stop = _mkey(qid, end)
        unpackb, unpack_key = msgpack.unpackb, _QP.unpack
        size = 0
        while it.valid() and len(out) < limit and size < max_bytes:
            key = it.key()
            if key >= stop:
                break
            raw = it.value()
            enq, pub, headers, body = unpackb(raw, raw=False)
            out.append((unpack_key(key[1:])[1], StoredMessage(body, headers, pub, enq, len(raw))))
            size += len(raw)
            it.next()
        _finished(it, "store read")
        return out

    def outbox_put(self, runtime: str, records: list[tuple[int, bytes]]) -> None:
        wb = WriteBatch(raw_mode=True)
        prefix = b"o" + runtime.encode() + b"/"
        for seq, record in records:
            wb.put(prefix + _SEQ.pack(seq), record)
        self._write(wb)

    def outbox_remove(self, runtime: str, seqs: list[int]) -> None:
        wb = WriteBatch(raw_mode=True)
        prefix = b"o" + runtime.encode() + b"/"
        for seq in seqs:
            wb.delete(prefix + _SEQ.pack(seq))
        self._write(wb)

    def outbox_load(self) -> list[tuple[str, int, bytes]]:
        out: list[tuple[str, int, bytes]] = []
        for key, value in self._prefixed(b"o"):
            # The seq is the fixed-width tail (its bytes may contain "/").
            runtime, seq = key[1 : -_SEQ.size - 1], key[-_SEQ.size :]
            out.append((runtime.decode(errors="replace"), _SEQ.unpack(seq)[0], value))
        return out

    def _prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with ``prefix``, in key order."""
        it = self._db.iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            yield key, bytes(it.value())
            it.next()
        _finished(it, "store read")

    def _write(self, wb: WriteBatch) -> None:
        try:
            self._db.write(wb, self._wo)
        except Exception as exc:
            raise StoreError(f"store write failed: {exc}") from exc

    def get_ident(self, key: str) -> str | None:
        try:
            raw = self._db.get(b"i" + key.encode())
        except Exception as exc:  # rocksdict: a plain Exception with RocksDB's status
            raise _failure("store read", exc) from exc
        return None if raw is None else bytes(raw).decode()

    def put_ident(self, key: str, value: str) -> None:
        wb = WriteBatch(raw_mode=True)
        wb.put(b"i" + key.encode(), value.encode())
        try:
            self._db.write(wb, self._sync)
        except Exception as exc:
            raise StoreError(f"store write failed: {exc}") from exc

    def memory(self) -> dict[str, int]:
        """RocksDB's own memory in bytes: ``memtables``, ``block_cache`` (in use),
        ``block_cache_capacity`` and ``table_readers`` (indexes and filters)."""
        props = {
            "memtables": "rocksdb.size-all-mem-tables",
            "block_cache": "rocksdb.block-cache-usage",
            "block_cache_capacity": "rocksdb.block-cache-capacity",
            "table_readers": "rocksdb.estimate-table-readers-mem",
        }
        return {k: int(self._db.property_int_value(p) or 0) for k, p in props.items()}

    def close(self, flush: bool = True) -> None:
        """Close the database (``flush``: write the memtable to files first)."""
        try:
            if flush:
                self._db.flush()
        finally:
            self._db.close()
