"""The broker's local durable state (docs/design.md §9).

A store holds, per broker: message bodies by (queue id, position), the snapshots of
the replicated queue indexes, the applied log offset, small identity values, and the
outbox: publishes taken from clients that are not on the log yet (re-appended by the
next start if the broker dies first).
Everything one applied log batch changes is written in ONE atomic batch together
with that batch's last offset, so a crash leaves a consistent prefix and a restart
resumes right after the offset (the eventsourcing "tracking" pattern).

The store knows nothing of events; the cluster driver translates the state
machine's effects into :class:`Batch` calls.

Backends subclass :class:`Store`, and each passes tests/contract/test_store.py:
:class:`batonmq.store.rocks.RocksStore` (rocksdict) is the broker's;
:class:`batonmq.store.memory.MemoryStore` (plain dicts) is the reference, and the one the
node's unit tests use. This module imports neither (and no rocksdict): a backend imports
it, so importing the interface stays cheap and re-exporting a backend here would be a cycle.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = ["Store", "Batch", "Loaded", "StoredMessage", "StoreReader", "merge_headers"]


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message as the store returns it."""

    body: bytes
    headers: dict[str, Any]
    publish_time: int
    enqueued_at: int
    size: int  # bytes of the stored record: body, headers and a few more


@dataclass(slots=True)
class Loaded:
    """What a store holds at open: resume applying at ``applied + 1``.

    Snapshots come back as msgpack returns them (a tuple saved is a list loaded).
    """

    #: The offset of the last commit; -1 if none (a new or reset store).
    applied: int = -1
    #: The last :meth:`Batch.put_meta` snapshot; None if none.
    meta: list[Any] | None = None
    #: The last :meth:`Batch.put_exchanges` snapshot; None if none.
    exchanges: list[Any] | None = None
    #: The last :meth:`Batch.put_queue` snapshot of each queue, by name.
    queues: dict[str, list[Any]] = field(default_factory=dict)
    #: The kept publish keys ``(seq, qid, key, first position, expires)``, in seq order
    #: (``expires``: the replicated time, ms, the key is forgotten at; -1: never).
    keys: list[tuple[int, int, str, int, int]] = field(default_factory=list)


class Batch(abc.ABC):
    """Changes written atomically by :meth:`Store.commit`.

    Nothing of a batch is visible (to reads, readers, :meth:`Store.load`) before its
    commit; its changes then take effect in the order they were made. A batch that is
    never committed changes nothing. Commit a batch once, to the store that made it.
    A write to a position that holds a message replaces it.
    """

    @abc.abstractmethod
    def put_messages(
        self,
        qid: int,
        first: int,
        messages: tuple[tuple[bytes, dict[str, Any]], ...],
        enqueued_at: int,
        publish_time: int,
    ) -> None:
        """Store messages at positions first, first+1, ..."""

    @abc.abstractmethod
    def remove(self, qid: int, positions: list[int]) -> None:
        """Forget these messages (positions without one are ignored)."""

    @abc.abstractmethod
    def remove_range(self, qid: int, lo: int, hi: int) -> None:
        """Forget the messages at ``lo <= position < hi`` of queue ``qid``."""

    @abc.abstractmethod
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
        """Move a message to another queue, merging ``headers`` into its own.

        The source is read as this batch's puts, removes and moves so far leave it: a
        message put earlier in the same batch is found, one removed or moved away is
        not. (A source that :meth:`remove_range` or :meth:`drop_queue` removed earlier in
        the same batch is not covered: ``RocksStore`` still finds it if it was committed
        before.) The moved message keeps its body and publish time; its headers
        are its own updated with ``headers``; its enqueue time is ``enqueued_at``.

        With ``keep`` the source stays where it is: a copy (a dead letter routed to
        several queues, docs/events.md). ``defaults`` are headers set only where the
        message has none of that name (RabbitMQ's ``x-first-death-*``).

        Returns False if the source message is not here (a joining broker that has
        not received it yet, docs/design.md §8): nothing changes then."""

    @abc.abstractmethod
    def put_raw(self, qid: int, pos: int, raw: bytes) -> None:
        """Store one message in the store's own encoding (from :meth:`StoreReader.get_raw`
        of another broker's store: a join update)."""

    @abc.abstractmethod
    def drop_queue(self, qid: int) -> None:
        """Forget every message of queue ``qid``."""

    @abc.abstractmethod
    def put_queue(self, name: str, snapshot: list[Any] | None) -> None:
        """Save (or, with None, delete) a queue's index snapshot."""

    @abc.abstractmethod
    def put_meta(self, snapshot: list[Any]) -> None:
        """Save the non-queue replicated state."""

    @abc.abstractmethod
    def put_exchanges(self, snapshot: list[Any]) -> None:
        """Save the exchanges and their bindings (written when they change, not with
        every batch as the meta snapshot is)."""

    @abc.abstractmethod
    def put_keys(self, entries: list[tuple[int, int, str, int, int]], forget: range) -> None:
        """Save publish idempotency keys ``(seq, qid, key, first position, expires)``, then forget
        the keys whose seq is in ``forget`` (a seq in both is forgotten). Keys are forgotten
        in seq order: ``forget`` starts where the previous call's ended, so a store may
        forget every key below ``forget.stop``."""


class StoreReader(abc.ABC):
    """A consistent, read-only view of a store's messages at one moment: commits made
    after it was taken are unseen. Close it before its store."""

    @abc.abstractmethod
    def get_raw(self, qid: int, pos: int) -> bytes | None:
        """The message at (qid, pos) in the store's own encoding, or None."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the view; it must not be used afterwards."""


def merge_headers(
    raw: bytes, headers: dict[str, Any], enqueued_at: int,
    defaults: dict[str, Any] | None = None,
) -> bytes:
    """A stored message (store encoding) moved to another queue: ``headers`` merged
    into its own, ``defaults`` where it has none, enqueue time reset. The same rule as
    :meth:`Batch.move`."""
    _, publish_time, old, body = msgpack.unpackb(raw, raw=False)
    merged = {**defaults, **old, **headers} if defaults else {**old, **headers}
    return msgpack.packb((enqueued_at, publish_time, merged, body), use_bin_type=True)


class Store(abc.ABC):
    """A broker's local store. Every backend passes tests/contract/test_store.py.

    What was committed outlives :meth:`close`: the store opened again on the same place
    (the same directory for ``RocksStore``, :meth:`MemoryStore.reopen
    <batonmq.store.memory.MemoryStore.reopen>`) loads and reads it. After :meth:`close`,
    writes (:meth:`commit`, :meth:`reset`, the outbox, :meth:`put_ident`) raise
    StoreError, and reads and :meth:`reader` raise as well (StoreError, or the
    backend's own error: reading a closed store is a bug of the caller).
    """

    @abc.abstractmethod
    def load(self) -> Loaded:
        """Read the applied offset and every snapshot (at start-up): what the commits
        so far saved, since the last :meth:`reset`."""

    @abc.abstractmethod
    def batch(self) -> Batch:
        """A new, empty batch."""

    @abc.abstractmethod
    def commit(self, batch: Batch, applied: int) -> None:
        """Write ``batch`` and the applied offset atomically: once it returns, reads,
        new readers and :meth:`load` see all of it.

        Raises:
            StoreError: the write failed (e.g. disk full); nothing of it is visible.
        """

    @abc.abstractmethod
    def reader(self) -> StoreReader:
        """A consistent view of the messages as they are now (later writes unseen)."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget the replicated state (messages, indexes, keys, applied offset),
        keeping the identity and the outbox: for a broker that rejoins as new.

        Raises:
            StoreError: the write failed.
        """

    @abc.abstractmethod
    def get_messages(self, qid: int, positions: list[int]) -> list[StoredMessage | None]:
        """The messages of queue ``qid`` at ``positions``: one entry per position, in
        the order given, None where there is none."""

    @abc.abstractmethod
    def scan(self, qid: int, start: int, limit: int) -> list[tuple[int, int]]:
        """``(position, enqueued_at)`` of the messages of queue ``qid`` at positions
        ``>= start``, in position order (positions without a message are skipped):
        the first ``limit`` of them (none if ``limit <= 0``)."""

    @abc.abstractmethod
    def read_range(
        self, qid: int, start: int, end: int, limit: int, max_bytes: int
    ) -> list[tuple[int, StoredMessage]]:
        """The messages of queue ``qid`` at positions ``start <= p < end``, in position
        order (positions without a message are skipped).

        At most ``limit`` of them; and the read stops after the first message that
        brings the sum of their :attr:`StoredMessage.size` to ``max_bytes`` or more, so
        a message larger than ``max_bytes`` still comes (alone, if first). Empty if
        ``end <= start``, ``limit <= 0`` or ``max_bytes <= 0``."""

    @abc.abstractmethod
    def outbox_put(self, runtime: str, records: list[tuple[int, bytes]]) -> None:
        """Keep ``(origin seq, record)`` events of this runtime that are not on the log
        yet (written at once, outside any batch; a kept seq is replaced).

        Raises:
            StoreError: the write failed.
        """

    @abc.abstractmethod
    def outbox_remove(self, runtime: str, seqs: list[int]) -> None:
        """Forget outbox events once they are on the log (seqs not kept are ignored).

        Raises:
            StoreError: the write failed.
        """

    @abc.abstractmethod
    def outbox_load(self) -> list[tuple[str, int, bytes]]:
        """Every kept outbox event as ``(runtime, seq, record)``, grouped by runtime, in
        seq order per runtime. :meth:`reset` keeps them."""

    @abc.abstractmethod
    def get_ident(self, key: str) -> str | None:
        """A small identity value (node id, cluster id); None if never set."""

    @abc.abstractmethod
    def put_ident(self, key: str, value: str) -> None:
        """Set an identity value, durably (synced)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and close; call it once, after closing the store's readers (a backend
        may hold its files while a reader lives)."""
