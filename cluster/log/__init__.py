"""The ordered log: one interface, several backends (DESIGN §3).

A log is a sequence of opaque records (bytes) at dense integer offsets starting
at 0. Appends are durable when they return. Readers tail: :meth:`Log.read` yields
batches of ``(offset, record)`` forever, waiting for new records at the end.

Backends are chosen by URL with :func:`open_log`:

=================  ==========================================================
``memory:``        in-process, fresh; ``memory:NAME`` shares one log by name
                   within the process (several broker objects in one test)
``file:PATH``      segment files in directory PATH, shared by processes on
                   one host (appends under ``flock``, group-commit ``fsync``);
                   ``file:PATH?segment_bytes=N`` sets the segment size
                   (default 64 MiB): retention deletes whole segments
``kafka://...``    ``kafka://HOST:PORT[,HOST:PORT]/TOPIC[?PARAMS]``: partition 0
                   of a single-partition Kafka topic via aiokafka, created if
                   missing; idempotent producer, ``acks=all``. PARAMS
                   ``replication_factor=N`` and ``min_insync_replicas=N`` (both
                   default 1) apply when the topic is created;
                   ``request_timeout_ms=N`` (default 30000) bounds every Kafka
                   request (details in ``batonmq.cluster.log.kafka``)
=================  ==========================================================

What a record means (an encoded event) is not the log's business; duplicate
suppression by (origin node, runtime id, origin sequence) happens where records
are applied (``batonmq.cluster.state``), because only there is it deterministic.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence

from batonmq.clients.errors import InvalidArgument

__all__ = ["Log", "Record", "open_log"]

#: One log entry as a reader sees it: (offset, record bytes).
Record = tuple[int, bytes]


class Log(abc.ABC):
    """The ordered log's interface. Every backend passes tests/contract/test_log.py."""

    url: str
    #: The largest record this backend accepts, bytes.
    max_record: int = 64 << 20
    #: The largest append this backend accepts, bytes of records plus 64 per record.
    max_append_bytes: int = 1 << 30

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
    def read(self, start: int, *, max_batch: int = 1024) -> AsyncIterator[list[Record]]:
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


async def open_log(url: str) -> Log:
    """Open the log a URL names.

    Args:
        url: ``memory:``, ``memory:NAME``, ``file:PATH`` or
            ``kafka://HOST:PORT[,HOST:PORT]/TOPIC[?replication_factor=N&min_insync_replicas=N]``.

    Returns:
        An open log.

    Raises:
        InvalidArgument: unknown scheme or malformed URL.
        LogUnavailable: the log exists but cannot be opened.
    """
    scheme, sep, rest = url.partition(":")
    if not sep:
        raise InvalidArgument(f"log URL {url!r} has no scheme (memory:, file:PATH, kafka://HOST:PORT/TOPIC)")
    if scheme == "memory":
        from batonmq.cluster.log.memory import MemoryLog

        return MemoryLog.named(rest) if rest else MemoryLog()
    if scheme == "file":
        if not rest:
            raise InvalidArgument("file: log URL needs a path, e.g. file:/var/lib/baton/log")
        from batonmq.cluster.log.file import FileLog

        path, _, query = rest.partition("?")
        options: dict[str, int] = {}
        for item in filter(None, query.split("&")):
            name, _, value = item.partition("=")
            if name != "segment_bytes" or not value.isdigit() or int(value) < 1:
                raise InvalidArgument(
                    f"bad file: log URL option {item!r} (known: segment_bytes=N, N > 0)"
                )
            options[name] = int(value)
        return await FileLog.open(path, **options)
    if scheme == "kafka":
        from batonmq.cluster.log.kafka import KafkaLog

        return await KafkaLog.open(url)
    raise InvalidArgument(
        f"unknown log scheme {scheme!r} in {url!r} (memory:, file:PATH, kafka://HOST:PORT/TOPIC)"
    )
