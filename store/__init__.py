"""The broker's local durable state (DESIGN §9).

A store holds, per broker: message bodies by (queue id, position), the snapshots of
the replicated queue indexes, the applied log offset, small identity values, and the
outbox: publishes taken from clients that are not on the log yet (re-appended by the
next start if the broker dies first).
Everything one applied log batch changes is written in ONE atomic batch together
with that batch's last offset, so a crash leaves a consistent prefix and a restart
resumes right after the offset (the eventsourcing "tracking" pattern).

The store knows nothing of events; the cluster driver translates the state
machine's effects into :class:`Batch` calls. The backend is
:class:`batonmq.store.rocks.RocksStore` (rocksdict); tests use it too, in a temporary dir.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = ["Store", "Batch", "Loaded", "StoredMessage", "StoreReader"]


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
    """What a store holds at open: resume applying at ``applied + 1``."""

    applied: int = -1
    meta: list[Any] | None = None
    queues: dict[str, list[Any]] = field(default_factory=dict)
    keys: list[tuple[int, int, str, int]] = field(default_factory=list)  # publish keys


class Batch(abc.ABC):
    """Changes written atomically by :meth:`Store.commit`."""

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
        """Forget these messages."""

    @abc.abstractmethod
    def remove_range(self, qid: int, lo: int, hi: int) -> None:
        """Forget messages lo <= position < hi."""

    @abc.abstractmethod
    def move(
        self,
        src_qid: int,
        src_pos: int,
        dst_qid: int,
        dst_pos: int,
        headers: dict[str, Any],
        enqueued_at: int,
    ) -> bool:
        """Move a message to another queue, merging ``headers`` into its own.

        Returns False if the source message is not here (a joining broker that has
        not received it yet, DESIGN §8): nothing is written then."""

    @abc.abstractmethod
    def put_raw(self, qid: int, pos: int, raw: bytes) -> None:
        """Store one message in the store's own encoding (from :meth:`StoreReader.get_raw`
        of another broker's store: a join update)."""

    @abc.abstractmethod
    def drop_queue(self, qid: int) -> None:
        """Forget every message of a queue."""

    @abc.abstractmethod
    def put_queue(self, name: str, snapshot: list[Any] | None) -> None:
        """Save (or, with None, delete) a queue's index snapshot."""

    @abc.abstractmethod
    def put_meta(self, snapshot: list[Any]) -> None:
        """Save the non-queue replicated state."""

    @abc.abstractmethod
    def put_keys(self, entries: list[tuple[int, int, str, int]], forget: range) -> None:
        """Save publish idempotency keys ``(seq, qid, key, first position)``; forget the
        keys whose seq is in ``forget``."""


class StoreReader(abc.ABC):
    """A consistent, read-only view of a store's messages at one moment."""

    @abc.abstractmethod
    def get_raw(self, qid: int, pos: int) -> bytes | None:
        """The message at (qid, pos) in the store's own encoding, or None."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the view."""


def merge_headers(raw: bytes, headers: dict[str, Any], enqueued_at: int) -> bytes:
    """A stored message (store encoding) moved to another queue: ``headers`` merged
    into its own, enqueue time reset. The same rule as :meth:`Batch.move`."""
    _, publish_time, old, body = msgpack.unpackb(raw, raw=False)
    return msgpack.packb((enqueued_at, publish_time, {**old, **headers}, body), use_bin_type=True)


class Store(abc.ABC):
    """A broker's local store."""

    @abc.abstractmethod
    def load(self) -> Loaded:
        """Read the applied offset and every snapshot (at start-up)."""

    @abc.abstractmethod
    def batch(self) -> Batch:
        """A new, empty batch."""

    @abc.abstractmethod
    def commit(self, batch: Batch, applied: int) -> None:
        """Write ``batch`` and the applied offset atomically.

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
        """Messages at these positions (None where there is none)."""

    @abc.abstractmethod
    def scan(self, qid: int, start: int, limit: int) -> list[tuple[int, int]]:
        """Up to ``limit`` (position, enqueued_at) pairs from ``start`` on, in order."""

    @abc.abstractmethod
    def read_range(
        self, qid: int, start: int, end: int, limit: int, max_bytes: int
    ) -> list[tuple[int, StoredMessage]]:
        """The messages at positions ``start <= p < end``, in order: at most ``limit``
        of them, and stopping after the first that brings the total to ``max_bytes``."""

    @abc.abstractmethod
    def outbox_put(self, runtime: str, records: list[tuple[int, bytes]]) -> None:
        """Keep ``(origin seq, record)`` events of this runtime that are not on the log yet.

        Raises:
            StoreError: the write failed.
        """

    @abc.abstractmethod
    def outbox_remove(self, runtime: str, seqs: list[int]) -> None:
        """Forget outbox events once they are on the log.

        Raises:
            StoreError: the write failed.
        """

    @abc.abstractmethod
    def outbox_load(self) -> list[tuple[str, int, bytes]]:
        """Every kept outbox event as ``(runtime, seq, record)``, in seq order per runtime."""

    @abc.abstractmethod
    def get_ident(self, key: str) -> str | None:
        """A small identity value (node id, cluster id)."""

    @abc.abstractmethod
    def put_ident(self, key: str, value: str) -> None:
        """Set an identity value, durably (synced)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and close."""
