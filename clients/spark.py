"""A PySpark streaming data source for Baton queues (docs/design.md §11, docs/spark.md).

Register it, then read a queue as a stream::

    from batonmq.clients import spark as baton_spark

    baton_spark.register(spark)
    df = (spark.readStream.format("baton")
          .option("brokers", "127.0.0.1:5671,127.0.0.1:5672")
          .option("queue", "import-entries")
          .load())

Rows: ``position`` (long), ``body`` (binary), ``headers`` (map<string,string>) and
``publish_time`` (timestamp). Offsets are queue positions, ``{"position": p}``: an
offset means "every message below p was handed to Spark"; a micro-batch from offset a
to b reads positions ``a <= p < b`` with ReadRange (without acquiring), and Spark's
``commit(b)`` — once the sink has committed the batch — becomes AcceptThrough(b),
which removes those messages from the queue. With a checkpoint location and an
exactly-once sink (the Parquet file sink, Delta) each message lands in the table once,
across driver crashes, query restarts and the loss of the broker the source used: the
queue keeps every message above the last commit, any broker answers a range the same,
and commits are cumulative and idempotent.

The source reserves the queue for its ``holder`` (option, default ``spark:<queue>``)
so that consumers do not take messages from under it (docs/protocol.md, "Range
readers"). Several runs of one pipeline (restarts, a standby taking over) use the same
holder; a second pipeline on the same queue is refused with QueueReserved.

Where the calls run (PySpark's Python data source, pyspark.sql.datasource): ``initialOffset``,
``latestOffset``, ``partitions`` and ``commit`` in one long-lived Python process per
query run; ``read`` in executor Python workers, on a pickled copy of the reader — it
opens its own connection. An exception in a driver-side call ends the query, so
transient broker errors are retried here, failing over across ``brokers``.

Options (strings, as Spark passes them):
    brokers: ``HOST:PORT[,HOST:PORT...]`` (required).
    queue: the queue to read (required).
    holder: the reservation's holder name (default ``spark:<queue>``).
    maxEntriesPerTrigger: at most this many positions per micro-batch (default 100000).
    numPartitions: split a micro-batch into this many read tasks (default 2).
    timeout: seconds a call may keep retrying before the query fails (default 60).
    service, token: fence the source's Reserve and AcceptThrough calls by a leadership
        term (the service's name and the term's fencing token, as ``Term`` has them):
        once another term of the service has started, they are refused (StaleToken)
        and the query fails, so a driver that was paused while a standby took over
        cannot commit late (docs/spark.md, "Fencing"). Default: not fenced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from batonmq.clients import client as _aio
from batonmq.clients.addresses import parse_addresses, split_url
from batonmq.clients import sync as _sync
from batonmq.cluster.errors import BatonError, InvalidArgument

__all__ = ["SCHEMA", "BatonDataSource", "BatonStreamReader", "RangePartition", "register"]

log = logging.getLogger("baton.spark")

#: The rows the source produces.
SCHEMA: Final = (
    "position LONG, body BINARY, headers MAP<STRING, STRING>, publish_time TIMESTAMP"
)
_ARROW_SCHEMA: Final = pa.schema(
    [
        ("position", pa.int64()),
        ("body", pa.binary()),
        ("headers", pa.map_(pa.string(), pa.string())),
        ("publish_time", pa.timestamp("us", tz="UTC")),
    ]
)
#: Messages per ReadRange (the broker's cap is 10 000).
_READ_LIMIT: Final = 10_000
#: A partition smaller than this is not split further.
_MIN_SPLIT: Final = 1_000

_T = TypeVar("_T")
_Number = TypeVar("_Number", int, float)


def register(spark: SparkSession) -> None:
    """Register the ``baton`` format with ``spark`` (``spark.readStream.format("baton")``).

    The package must be importable by Spark's Python workers: install it in the
    environment the workers use (``pip install batonmq[spark]``).
    """
    spark.dataSource.register(BatonDataSource)


@dataclass(frozen=True, slots=True)
class _Options:
    brokers: str
    queue: str
    holder: str
    max_per_trigger: int
    partitions: int
    timeout: float
    service: str = ""  # with token: the leadership term that fences commits
    token: int = -1


def _options(options: Any) -> _Options:
    """Validate the options (a case-insensitive map with lowercased keys: keep it)."""

    def get(name: str, default: str | None = None) -> str:
        value = options.get(name.lower(), options.get(name, default))
        if value is None:
            raise InvalidArgument(f"the baton source needs the option {name!r}")
        return str(value)

    def positive(name: str, default: str, kind: Callable[[str], _Number]) -> _Number:
        text = get(name, default)
        try:
            value = kind(text)
        except ValueError:
            raise InvalidArgument(f"option {name!r} must be a number, got {text!r}") from None
        if not value > 0:
            raise InvalidArgument(f"option {name!r} must be positive, got {text!r}")
        return value

    brokers = get("brokers")
    parse_addresses(split_url(brokers)[0])  # fails early, with a clear error
    queue = get("queue")
    service = get("service", "")
    token_text = get("token", "-1" if not service else "")
    try:
        token = int(token_text)
    except ValueError:
        raise InvalidArgument(f"option 'token' must be an integer, got {token_text!r}") from None
    if bool(service) != (token >= 0) or token < -1:
        raise InvalidArgument(
            "options 'service' and 'token' go together: a service name and its term's"
            " fencing token (>= 0)"
        )
    return _Options(
        brokers=brokers,
        queue=queue,
        holder=get("holder", f"spark:{queue}"),
        max_per_trigger=positive("maxEntriesPerTrigger", "100000", int),
        partitions=positive("numPartitions", "2", int),
        timeout=positive("timeout", "60", float),
        service=service,
        token=token,
    )


class BatonDataSource(DataSource):
    """The ``baton`` streaming format (see the module docs for the options)."""

    @classmethod
    def name(cls) -> str:
        return "baton"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return BatonStreamReader(self.options)


@dataclass
class RangePartition(InputPartition):
    """Positions ``start <= p < end`` of the queue: one read task."""

    start: int
    end: int


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, BatonError) and exc.retriable


class BatonStreamReader(DataSourceStreamReader):
    """Reads a queue by position ranges; see the module docs."""

    def __init__(self, options: Any) -> None:
        self.opts = _options(options)
        self._conn: _sync.SyncConnection | None = None  # driver side only; not pickled
        self._drained = False  # the reservation is ours and no consumer holds a message

    def __getstate__(self) -> dict[str, Any]:
        # read() runs on a pickled copy in an executor: no connection (it has a thread).
        state = dict(self.__dict__)
        state["_conn"] = None
        return state

    # -- driver side ---------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[_sync.SyncConnection], _T]) -> _T:
        """Run ``fn`` on the driver's connection, retrying transient errors (reconnecting
        and failing over across the brokers) for up to ``timeout`` seconds."""
        deadline = time.monotonic() + self.opts.timeout
        delay = 0.1
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = _sync.connect(
                        self.opts.brokers,
                        client_name=f"baton-spark:{self.opts.holder}",
                        timeout=min(10.0, self.opts.timeout),
                        failover=True,
                        failover_timeout=self.opts.timeout,
                    )
                return fn(self._conn)
            except BatonError as exc:
                if not _retriable(exc) or time.monotonic() + delay > deadline:
                    raise
                log.warning("%s on queue %r failed, retrying: %s", what, self.opts.queue, exc)
                self._close()
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _reserve(self, conn: _sync.SyncConnection) -> dict[str, Any]:
        o = self.opts
        return conn.reserve(o.queue, o.holder, service=o.service, token=o.token)

    def _drain(self) -> dict[str, Any]:
        """Reserve the queue and wait until consumers settled what they took before.

        Raises:
            QueueReserved: another reader has the queue.
            BatonError: consumers still hold messages after ``timeout`` seconds.
        """
        deadline = time.monotonic() + self.opts.timeout
        while True:
            result = self._call("reserve", self._reserve)
            if result["acquired"] == 0:
                self._drained = True
                return result
            if time.monotonic() > deadline:
                raise BatonError(
                    f"queue {self.opts.queue!r} is reserved for {self.opts.holder!r}, but"
                    f" consumers still hold {result['acquired']} of its messages after"
                    f" {self.opts.timeout:g}s; stop them (their messages go back to the"
                    " queue) and start the query again"
                )
            log.info(
                "waiting for consumers to settle %d messages of %r", result["acquired"],
                self.opts.queue,
            )
            time.sleep(0.2)

    def initialOffset(self) -> dict[str, int]:
        """A new query starts at the queue's lowest ready position."""
        return {"position": int(self._drain()["head"])}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, int]:
        """The queue's tail, at most ``maxEntriesPerTrigger`` (or Spark's read limit)
        past ``start``. (Spark 4.0/4.1 call it without arguments, 4.2+ with both.)"""
        stats = self._call("queue_stats", lambda c: c.queue_stats(self.opts.queue))
        if not self._drained or stats.get("reserved_by") != self.opts.holder:
            if self._drained:
                log.warning(
                    "queue %r: reservation for %r was ended (now %r); reserving again",
                    self.opts.queue, self.opts.holder, stats.get("reserved_by"),
                )
            self._drained = False
            stats = self._drain()
        tail = int(stats["next_position"])
        begin = int(start["position"]) if start else self._last_end(tail)
        end = max(tail, begin)  # a lagging broker after a failover must not go back
        cap = self.opts.max_per_trigger
        if limit is not None:
            max_rows = getattr(limit, "max_rows", getattr(limit, "maxRows", None))
            if isinstance(max_rows, int):
                cap = max_rows
            elif type(limit).__name__ == "ReadAllAvailable":
                cap = end - begin
        end = min(end, begin + cap)
        self._latest = end
        return {"position": end}

    def _last_end(self, tail: int) -> int:
        # Without ``start`` (Spark 4.0/4.1) the batch starts where the last one ended.
        return getattr(self, "_latest", None) or tail

    def getDefaultReadLimit(self) -> Any:
        """At most ``maxEntriesPerTrigger`` positions per micro-batch (Spark 4.2+)."""
        from pyspark.sql.streaming.datasource import ReadMaxRows

        return ReadMaxRows(self.opts.max_per_trigger)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[RangePartition]:
        """Split ``start <= p < end`` into up to ``numPartitions`` read tasks."""
        a, b = int(start["position"]), int(end["position"])
        if b <= a:
            return []
        n = max(1, min(self.opts.partitions, (b - a) // _MIN_SPLIT))
        step = -(-(b - a) // n)
        return [RangePartition(lo, min(lo + step, b)) for lo in range(a, b, step)]

    def commit(self, end: dict[str, Any]) -> None:
        """The sink committed everything below ``end``: accept it (AcceptThrough)."""
        through = int(end["position"])
        o = self.opts
        n = self._call(
            "accept_through",
            lambda c: c.accept_through(
                o.queue, through, o.holder, service=o.service, token=o.token
            ),
        )
        log.debug("queue %r: accepted %d messages below %d", self.opts.queue, n, through)

    def stop(self) -> None:
        """Close the driver's connection (the reservation stays, for the next run)."""
        self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except BatonError:
                pass

    # -- executor side -------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Fetch the partition's positions from any broker, as Arrow record batches."""
        assert isinstance(partition, RangePartition)
        loop = asyncio.new_event_loop()
        try:
            yield from _read(loop, self.opts, partition.start, partition.end)
        finally:
            loop.close()


def _read(
    loop: asyncio.AbstractEventLoop, opts: _Options, start: int, end: int
) -> Iterator[pa.RecordBatch]:
    conn: _aio.Connection | None = None
    deadline = time.monotonic() + opts.timeout
    delay = 0.1
    position = start
    try:
        while position < end:
            try:
                if conn is None or conn.closed:
                    conn = loop.run_until_complete(
                        _aio.connect(
                            opts.brokers,
                            client_name=f"baton-spark-read:{opts.holder}",
                            timeout=min(10.0, opts.timeout),
                            failover=True,
                            failover_timeout=opts.timeout,
                        )
                    )
                messages, position = loop.run_until_complete(
                    conn.read_range(opts.queue, position, end, limit=_READ_LIMIT)
                )
            except BatonError as exc:
                if not _retriable(exc) or time.monotonic() + delay > deadline:
                    raise
                log.warning("read of %r at %d failed, retrying: %s", opts.queue, position, exc)
                if conn is not None:
                    loop.run_until_complete(conn.close())
                    # A lagging broker (Timeout): start with another one next time.
                    opts = _rotate(opts)
                conn = None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if messages:
                yield _to_arrow(messages)
    finally:
        if conn is not None:
            loop.run_until_complete(conn.close())


def _rotate(opts: _Options) -> _Options:
    """The same options with the broker list rotated by one (in a
    ``baton://USER:PASSWORD@...`` form, the hosts after the ``@``)."""
    prefix, hosts = "", opts.brokers
    if "://" in hosts:
        scheme, _, rest = hosts.partition("://")
        userinfo, at, hosts = rest.rstrip("/").rpartition("@")
        prefix = f"{scheme}://{userinfo}{at}"
    parts = [p for p in hosts.split(",") if p.strip()]
    if len(parts) < 2:
        return opts
    return dataclasses.replace(opts, brokers=prefix + ",".join(parts[1:] + parts[:1]))


def _header_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return json.dumps(value, default=str)


def _to_arrow(messages: list[list[Any]]) -> pa.RecordBatch:
    """ReadRange's ``[position, body, headers, publish_time_ms]`` lists as one batch."""
    positions = [m[0] for m in messages]
    bodies = [m[1] for m in messages]
    headers = [
        [(k, _header_text(v)) for k, v in m[2].items()] if m[2] else [] for m in messages
    ]
    times = [m[3] * 1000 for m in messages]  # ms -> µs
    return pa.RecordBatch.from_arrays(
        [
            pa.array(positions, pa.int64()),
            pa.array(bodies, pa.binary()),
            pa.array(headers, pa.map_(pa.string(), pa.string())),
            pa.array(times, pa.timestamp("us", tz="UTC")),
        ],
        schema=_ARROW_SCHEMA,
    )
