"""The ordered log: one interface, several backends (docs/design.md §3).

A log is a sequence of opaque records (bytes) at dense integer offsets starting
at 0. Appends are durable when they return. Readers tail: :meth:`Log.read` yields
batches of ``(offset, record)`` forever, waiting for new records at the end.

A log set (:class:`LogSet`, :func:`open_log_set`) is physical partitions 0..count-1 of one
URL, each such a log, that only grow (:meth:`LogSet.grow`); partition 0 is the log
:func:`open_log` opens, so every existing log is a set of one partition.

Backends are chosen by URL with :func:`open_log` and :func:`open_log_set`:

=================  ==========================================================
``memory:``        in-process, fresh; ``memory:NAME`` shares one log by name
                   within the process (several broker objects in one test).
                   Set: partition K >= 1 is the shared log ``NAME#partition=K``
``file:PATH``      segment files in directory PATH, shared by processes on
                   one host (appends under ``flock``, group-commit ``fsync``);
                   ``file:PATH?segment_bytes=N`` sets the segment size
                   (default 64 MiB): retention deletes whole segments.
                   Set: partition K >= 1 is directory ``PATH/partition-K``,
                   with its own lock and syncs; growers lock ``PATH/GROW``
``kafka://...``    ``kafka://HOST:PORT[,HOST:PORT]/TOPIC[?PARAMS]``: partition 0
                   of a Kafka topic via aiokafka, created (with one partition,
                   or ``partitions`` for a set) if missing; idempotent
                   producer, ``acks=all``. Set: partition K is Kafka partition
                   K, by number, with a producer of its own; growing is
                   CreatePartitions. PARAMS
                   ``replication_factor=N`` and ``min_insync_replicas=N`` (both
                   default 1) apply when the topic is created;
                   ``request_timeout_ms=N`` (default 30000) bounds every Kafka
                   request; ``security_protocol``, ``ssl_cafile``,
                   ``sasl_mechanism``, ``sasl_username`` secure the connection
                   (TLS, SASL), the password coming from a file or
                   ``BATON_KAFKA_PASSWORD``, never the URL (details in
                   ``batonmq.cluster.log.kafka``)
=================  ==========================================================

What a record means (an encoded event) is not the log's business; duplicate
suppression by (origin node, runtime id, origin sequence) happens where records
are applied (``batonmq.cluster.state``), because only there is it deterministic.
"""

from __future__ import annotations

from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.log.base import MAX_PARTITIONS, UNOPENED, Log, LogSet, Record, check_count

__all__ = ["Log", "LogSet", "MAX_PARTITIONS", "Record", "UNOPENED", "open_log", "open_log_set"]

_SCHEMES = "memory:, file:PATH, kafka://HOST:PORT/TOPIC"


def _file_options(url: str, rest: str) -> tuple[str, dict[str, int]]:
    """The path and options of a ``file:`` URL's remainder."""
    if not rest:
        raise InvalidArgument("file: log URL needs a path, e.g. file:/var/lib/baton/log")
    path, _, query = rest.partition("?")
    options: dict[str, int] = {}
    for item in filter(None, query.split("&")):
        name, _, value = item.partition("=")
        if name != "segment_bytes" or not value.isdigit() or int(value) < 1:
            raise InvalidArgument(
                f"bad file: log URL option {item!r} (known: segment_bytes=N, N > 0)"
            )
        options[name] = int(value)
    return path, options


def _scheme(url: str, kafka_password_file: str | None) -> tuple[str, str]:
    scheme, sep, rest = url.partition(":")
    if kafka_password_file and scheme != "kafka":
        raise InvalidArgument(f"kafka_password_file is set but the log {url!r} is not on Kafka")
    if not sep:
        raise InvalidArgument(f"log URL {url!r} has no scheme ({_SCHEMES})")
    if scheme not in ("memory", "file", "kafka"):
        raise InvalidArgument(f"unknown log scheme {scheme!r} in {url!r} ({_SCHEMES})")
    return scheme, rest


async def open_log(url: str, *, kafka_password_file: str | None = None) -> Log:
    """Open the log a URL names: partition 0 of the log set there (:func:`open_log_set`),
    which is the whole log of a set that never grew.

    Args:
        url: ``memory:``, ``memory:NAME``, ``file:PATH`` or
            ``kafka://HOST:PORT[,HOST:PORT]/TOPIC[?replication_factor=N&min_insync_replicas=N]``.
        kafka_password_file: a Kafka log's SASL password is the first line of this file
            (not given: the variable ``BATON_KAFKA_PASSWORD``). Only for a ``kafka://`` URL.

    Returns:
        An open log.

    Raises:
        InvalidArgument: unknown scheme or malformed URL.
        LogUnavailable: the log exists but cannot be opened.
    """
    scheme, rest = _scheme(url, kafka_password_file)
    if scheme == "memory":
        from batonmq.cluster.log.memory import MemoryLog

        return MemoryLog.named(rest) if rest else MemoryLog()
    if scheme == "file":
        from batonmq.cluster.log.file import FileLog

        path, options = _file_options(url, rest)
        return await FileLog.open(path, **options)
    from batonmq.cluster.log.kafka import KafkaLog

    return await KafkaLog.open(url, password_file=kafka_password_file)


async def open_log_set(
    url: str, *, partitions: int | None = None, kafka_password_file: str | None = None
) -> LogSet:
    """Open the set of physical partitions a URL names (docs/design.md §3).

    ``partitions`` only matters when the set is new: a set that exists opens with the
    partitions it has, more or fewer (how many a cluster uses is the cluster's setting,
    not the log's); a set only grows by :meth:`LogSet.grow`. Partition 0 is the log
    :func:`open_log` opens at the same URL, so every existing log is a set of one.

    Args:
        url: as for :func:`open_log`.
        partitions: how many partitions a new set gets (default 1), 1..MAX_PARTITIONS.
        kafka_password_file: as for :func:`open_log`.

    Returns:
        The open set; :attr:`LogSet.count` says how many partitions it has.

    Raises:
        InvalidArgument: unknown scheme, malformed URL, or ``partitions`` out of range.
        LogUnavailable: the set exists but cannot be opened.
        LogCorrupt: the set's partitions are not dense (a file log partition removed by hand).
    """
    scheme, rest = _scheme(url, kafka_password_file)
    if partitions is not None:
        check_count(partitions)
    if scheme == "memory":
        from batonmq.cluster.log.memory import MemoryLogSet

        return await MemoryLogSet.open(rest, partitions)
    if scheme == "file":
        from batonmq.cluster.log.file_set import FileLogSet

        path, options = _file_options(url, rest)
        return await FileLogSet.open(path, partitions, **options)
    from batonmq.cluster.log.kafka import KafkaLogSet

    return await KafkaLogSet.open(url, partitions, password_file=kafka_password_file)
