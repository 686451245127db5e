"""The in-process log: the reference backend for the conformance suite and unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import ClassVar

from batonmq.cluster.errors import InvalidArgument, LogTruncated, LogUnavailable
from batonmq.cluster.log.base import Log, LogSet, Record, check_count

__all__ = ["MemoryLog", "MemoryLogSet"]


class MemoryLog(Log):
    """A list in memory. ``memory:NAME`` logs are shared by name within one process."""

    _named: ClassVar[dict[str, "MemoryLog"]] = {}

    def __init__(self, name: str = "") -> None:
        self.url = f"memory:{name}"
        self._records: list[bytes] = []
        self._start = 0  # offset of self._records[0]
        self._grew = asyncio.Condition()
        self._closed = False

    @classmethod
    def named(cls, name: str) -> "MemoryLog":
        """The process-wide log of this name (created on first use)."""
        log = cls._named.get(name)
        if log is None or log._closed:
            log = cls._named[name] = cls(name)
        return log

    @classmethod
    def exists(cls, name: str) -> bool:
        """Whether the process-wide log of this name is open now."""
        log = cls._named.get(name)
        return log is not None and not log._closed

    async def append(self, records: Sequence[bytes]) -> int:
        if self._closed:
            raise LogUnavailable(f"log {self.url} is closed")
        if not records:
            raise InvalidArgument("append needs at least one record")
        first = self._start + len(self._records)
        self._records.extend(bytes(r) for r in records)
        async with self._grew:
            self._grew.notify_all()
        return first

    async def read(self, start: int, *, max_batch: int = 1024) -> AsyncGenerator[list[Record], None]:
        pos = start
        while True:
            if pos < self._start:
                raise LogTruncated(f"offset {pos} is below the log's start {self._start}")
            end = self._start + len(self._records)
            if pos < end:
                stop = min(end, pos + max_batch)
                lo = pos - self._start
                batch = [(pos + i, r) for i, r in enumerate(self._records[lo : lo + stop - pos])]
                pos = stop
                yield batch
                continue
            if self._closed:
                return
            async with self._grew:
                await self._grew.wait_for(
                    lambda: self._closed or self._start + len(self._records) > pos
                )

    async def start_offset(self) -> int:
        return self._start

    async def end_offset(self) -> int:
        return self._start + len(self._records)

    async def truncate_before(self, offset: int) -> None:
        drop = min(max(0, offset - self._start), len(self._records))
        del self._records[:drop]
        self._start += drop

    async def close(self) -> None:
        self._closed = True
        async with self._grew:
            self._grew.notify_all()


class MemoryLogSet(LogSet):
    """Partitions in memory. ``memory:NAME`` sets are shared by name within one process:
    partition 0 is the very log ``open_log("memory:NAME")`` returns, partition K the
    process-wide :class:`MemoryLog` named ``NAME#partition=K``; ``memory:`` is a fresh set.

    Appends to a memory log never wait (there is no lock and no disk), so one
    partition cannot stall another's.
    """

    #: How many partitions each named set has (shared by name, like the logs).
    _counts: ClassVar[dict[str, int]] = {}

    def __init__(self, name: str, partitions: int = 1) -> None:
        super().__init__(f"memory:{name}")
        self._name = name
        self._fresh = partitions  # partitions of an unnamed set (not shared)

    @classmethod
    async def open(cls, name: str, partitions: int | None = None) -> "MemoryLogSet":
        """The set of this name (created with ``partitions``, default 1, if it is new).

        Raises:
            InvalidArgument: ``partitions`` out of range.
        """
        wanted = check_count(partitions if partitions is not None else 1)
        logs = cls(name, wanted)
        if name and name not in cls._counts:
            # A log open_log opened (and that is open still) is a set of one partition.
            cls._counts[name] = 1 if MemoryLog.exists(name) else wanted
        await logs.refresh()
        return logs

    async def _existing(self) -> int:
        return self._counts[self._name] if self._name else self._fresh

    async def _create(self, count: int) -> None:
        if self._name:
            self._counts[self._name] = max(self._counts[self._name], count)
        else:
            self._fresh = max(self._fresh, count)

    async def _open_partition(self, k: int) -> Log:
        if not self._name:
            return MemoryLog()
        return MemoryLog.named(self._name if k == 0 else f"{self._name}#partition={k}")
