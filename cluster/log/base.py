"""The ordered log's interface: what every backend implements and what the node reads.

The backends (:mod:`batonmq.cluster.log.memory`, ``file``, ``kafka``) subclass
:class:`Log`; :func:`batonmq.cluster.log.open_log` picks one by URL. This module imports
no backend, so a backend and the registry never import each other.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Final

__all__ = ["Log", "Record", "UNOPENED"]

#: One log entry as a reader sees it: (offset, record bytes).
Record = tuple[int, bytes]

#: What a sealed log (batonmq.cluster.log.sealed) yields for a record it cannot open:
#: not msgpack (``\xc1`` is the byte msgpack never uses), so it never decodes as an
#: event; the applier counts it ignored as ``unopened`` and moves past its offset.
UNOPENED: Final = b"\xc1baton:unopened"


class Log(abc.ABC):
    """The ordered log's interface. Every backend passes tests/contract/test_log.py."""

    url: str
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
