"""The ordered log's interface: what every backend implements and what the node reads.

The backends (:mod:`batonmq.cluster.log.memory`, ``file``, ``kafka``) subclass
:class:`Log`, and :class:`LogSet` for a set of physical partitions (each a :class:`Log`);
:func:`batonmq.cluster.log.open_log` and :func:`~batonmq.cluster.log.open_log_set` pick one
by URL. This module imports no backend, so a backend and the registry never import each other.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Final

from batonmq.cluster.errors import InvalidArgument, LogUnavailable

__all__ = ["Log", "LogSet", "MAX_PARTITIONS", "Record", "UNOPENED", "check_count", "partition_url"]

#: The most physical partitions a log set may have (a bound on resources, not a format limit).
MAX_PARTITIONS: Final = 256

#: One log entry as a reader sees it: (offset, record bytes).
Record = tuple[int, bytes]

#: What a sealed log (batonmq.cluster.log.sealed) yields for a record it cannot open:
#: not msgpack (``\xc1`` is the byte msgpack never uses), so it never decodes as an
#: event; the applier counts it ignored as ``unopened`` and moves past its offset.
UNOPENED: Final = b"\xc1baton:unopened"


class Log(abc.ABC):
    """The ordered log's interface. Every backend passes tests/contract/test_log.py."""

    url: str
    #: Which physical partition of its :class:`LogSet` this log is; 0 for a log opened on its
    #: own (:func:`~batonmq.cluster.log.open_log`), which is partition 0 of its set.
    partition: int = 0
    #: The largest record this backend accepts, bytes.
    max_record: int = 64 << 20
    #: The largest append this backend accepts, bytes of records plus 64 per record.
    max_append_bytes: int = 1 << 30
    #: Told the seconds each sync to disk took, once per group commit (not per record),
    #: by the backends that sync themselves (the file log); the broker's metrics set it.
    #: A backend may call it from its writer thread.
    sync_observer: Callable[[float], None] | None = None

    @abc.abstractmethod
    async def append(self, records: Sequence[bytes]) -> int:
        """Append records in order, atomically as one batch; durable on return.

        Concurrent calls are grouped into one write + one sync where the backend
        can (group commit).

        Args:
            records: one or more records; each at most the backend's max record size.

        Returns:
            The offset of the first record; the others follow densely.

        Raises:
            LogUnavailable: the log cannot be written (disk full, closed, broker down).
                Nothing of the batch is visible to readers then.
            InvalidArgument: empty batch or a record too large.
        """

    @abc.abstractmethod
    def read(self, start: int, *, max_batch: int = 1024) -> AsyncGenerator[list[Record], None]:
        """Yield batches of records from offset ``start`` on, waiting at the end.

        The iterator never ends on its own; stop consuming it (or close the log)
        to stop. Each yielded batch is non-empty, in offset order, and at most
        ``max_batch`` records.

        Raises:
            LogTruncated: ``start`` is below :meth:`start_offset`.
            LogCorrupt: a record in the middle of the log fails its checksum.
        """

    @abc.abstractmethod
    async def start_offset(self) -> int:
        """The lowest offset still on the log (0 until truncated)."""

    @abc.abstractmethod
    async def end_offset(self) -> int:
        """The offset the next appended record will get."""

    @abc.abstractmethod
    async def truncate_before(self, offset: int) -> None:
        """Allow removal of records below ``offset`` (retention).

        Backends may keep some of them (a file backend deletes whole segments
        only); :meth:`start_offset` tells what is really left.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Release resources. Pending appends fail with LogUnavailable; readers stop."""


def partition_url(url: str, partition: int) -> str:
    """The URL a set's partition reports as its :attr:`Log.url`: the set's own for
    partition 0 (so a log opened with ``open_log`` reads the same), ``URL#partition=K``
    otherwise. For messages and metrics only: it is not a URL to open."""
    return url if partition == 0 else f"{url}#partition={partition}"


class LogSet(abc.ABC):
    """Physical partitions 0..count-1 of one log, each a complete :class:`Log`
    (dense offsets from 0 of its own, atomic durable appends, tailing reads, retention).

    Partitions only ever grow: :meth:`grow` adds partitions and never removes one.
    Partition 0 of a set is the log :func:`~batonmq.cluster.log.open_log` opens at
    the same URL, so an existing log is a set of one partition with nothing changed.
    What a partition carries (control or queue events) is not the log's business.

    The set owns its partitions: :meth:`close` closes them all. A backend subclasses
    it with :meth:`_existing`, :meth:`_create` and :meth:`_open_partition`; the set
    opens every partition when it learns of it, so :meth:`partition` needs no I/O.
    Every backend passes tests/contract/test_log_set.py.
    """

    url: str

    def __init__(self, url: str) -> None:
        self.url = url
        self._logs: list[Log] = []
        self._changing = asyncio.Lock()  # one grow or refresh at a time in this process
        self._closed = False

    @property
    def count(self) -> int:
        """How many physical partitions this object knows of (see :meth:`refresh`)."""
        return len(self._logs)

    def partition(self, k: int) -> Log:
        """Physical partition ``k``, open.

        Raises:
            InvalidArgument: ``k`` is not in 0..count-1.
            LogUnavailable: the set is closed.
        """
        self._check_open()
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(self._logs):
            raise InvalidArgument(
                f"log set {self.url} has {len(self._logs)} partition(s), 0..{len(self._logs) - 1};"
                f" there is no partition {k!r} (grow the set first)"
            )
        return self._logs[k]

    async def grow(self, count: int) -> int:
        """Make the set have at least ``count`` partitions; never removes one.

        Idempotent, and safe against other processes growing the same set at once:
        they all end with the same dense set of partitions. A set that already has
        ``count`` or more is left as it is (and this object learns of them).

        Args:
            count: the least number of partitions wanted, 1..:data:`MAX_PARTITIONS`.

        Returns:
            The set's count now (more than ``count`` if another process grew it further).

        Raises:
            InvalidArgument: ``count`` out of range.
            LogUnavailable: the backend cannot be changed or read.
        """
        check_count(count)
        async with self._changing:
            self._check_open()
            if count > len(self._logs):
                await self._create(count)
            await self._open_to(await self._existing())
        return len(self._logs)

    async def refresh(self) -> int:
        """Learn of partitions another process added; returns the count now.

        Raises:
            LogUnavailable: the backend cannot be read.
        """
        async with self._changing:
            self._check_open()
            await self._open_to(await self._existing())
        return len(self._logs)

    async def close(self) -> None:
        """Close every partition (pending appends fail with LogUnavailable; readers stop)."""
        if self._closed:
            return
        self._closed = True
        async with self._changing:
            logs, self._logs = self._logs, []
            await asyncio.gather(*(log.close() for log in logs), return_exceptions=True)
            await self._close_backend()

    async def _open_to(self, count: int) -> None:
        """Open partitions up to ``count`` (those this object has stay as they are)."""
        for k in range(len(self._logs), count):
            log = await self._open_partition(k)
            log.partition = k
            log.url = partition_url(self.url, k)
            self._logs.append(log)

    def _check_open(self) -> None:
        if self._closed:
            raise LogUnavailable(f"log set {self.url} is closed")

    @abc.abstractmethod
    async def _existing(self) -> int:
        """How many partitions the backend has now (dense from 0)."""

    @abc.abstractmethod
    async def _create(self, count: int) -> None:
        """Make the backend have at least ``count`` partitions (idempotent, safe across processes)."""

    @abc.abstractmethod
    async def _open_partition(self, k: int) -> Log:
        """Open existing partition ``k``."""

    async def _close_backend(self) -> None:
        """Release what the partitions share (after they are closed)."""


def check_count(count: object) -> int:
    """``count`` as a partition count.

    Raises:
        InvalidArgument: not an integer in 1..:data:`MAX_PARTITIONS`.
    """
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PARTITIONS:
        raise InvalidArgument(f"a log set has 1..{MAX_PARTITIONS} partitions, not {count!r}")
    return count
