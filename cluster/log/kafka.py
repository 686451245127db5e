"""The Kafka backend: a log is one partition of a Kafka topic (docs/design.md §3).

A log set (:class:`KafkaLogSet`) is the whole topic: physical partition K is Kafka partition K,
always addressed by its number (never by Kafka's key partitioner), each with its own idempotent
producer; the partitions share one admin client and one consumer for offset queries. A log
opened on its own (:class:`KafkaLog`, ``open_log``) is partition 0 of the topic; a topic that
never grew has only that one. :meth:`KafkaLogSet.grow` adds Kafka partitions
(CreatePartitions); Kafka never removes one.

URL: ``kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?PARAMS]``. The topic is created if missing, with

* ``replication_factor=N`` (default 1): replicas of the partition. Use 3 in production.
* ``min_insync_replicas=N`` (default 1): replicas that must have an append before it is
  confirmed (the producer uses ``acks=all``). Use 2 with 3 replicas. At most replication_factor.
* ``request_timeout_ms=N`` (default 30000): how long one Kafka request (an append, an offset
  query, opening the log) may take before it fails with LogUnavailable. Longer than a leader
  fail-over in the Kafka cluster, short enough that a dead Kafka is reported, not waited on.

These only apply when the topic is created; an existing topic is used as it is (with the
partitions it has; partitions added later get the topic's replication). A created topic gets ``retention.ms=-1`` and ``retention.bytes=-1``:
the log is the brokers' state, so Kafka must never expire records by itself; Baton removes a
prefix with :meth:`KafkaLog.truncate_before` (Kafka's DeleteRecords) when it no longer needs it.

The URL may also say how to reach Kafka: TLS (``security_protocol=SSL``, ``ssl_cafile``) and
SASL (``security_protocol=SASL_SSL``, ``sasl_mechanism``, ``sasl_username``), for every aiokafka
client the log makes (the producer, the consumers, the admin client); the password comes from
a file or ``BATON_KAFKA_PASSWORD``, never the URL (:mod:`batonmq.cluster.log.kafka_url`). A
login that Kafka refuses, or a certificate that does not verify, fails the open (or the
append) with LogUnavailable saying so, not merely "unreachable".

How the contract maps onto Kafka:

* Offsets are Kafka offsets: dense, because only idempotent, non-transactional producers write
  the topic and it is never compacted. A gap is reported as LogCorrupt, never skipped.
* ``append`` is atomic because every append is carried by exactly one Kafka *record batch*,
  which the partition leader writes all or nothing; appends that wait while another is in
  flight are grouped into the next batch (group commit), each still contiguous. A batch larger
  than the topic's ``max.message.bytes`` is refused (InvalidArgument) instead of being split.
* The producer is idempotent (``enable_idempotence=True``, hence ``acks=all``): a batch the
  client resends after a lost answer is written once. One batch is in flight at a time, so
  order on the partition is the order of the returned offsets.
* An append that fails with LogUnavailable because Kafka did not answer in time has an
  *unknown* outcome: it may still become visible (unlike the file backend, where a failed
  append is never visible). Appliers drop the duplicates a retry can then produce
  (docs/design.md §3).
  After any failed append the producer is replaced, so its sequence numbers start afresh.
* Readers are consumers without a group (``assign`` + ``seek``); they commit nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerStoppedError, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.conn import create_conn
from aiokafka.errors import (
    CorruptRecordException,
    KafkaConnectionError,
    KafkaError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
    for_code,
)

from batonmq.cluster.errors import BatonError, InvalidArgument, LogCorrupt, LogTruncated, LogUnavailable
from batonmq.cluster.log.base import Log, LogSet, Record, check_count
from batonmq.cluster.log.kafka_url import KafkaURL, client_security, parse_kafka_url

__all__ = ["KafkaLog", "KafkaLogSet", "KafkaURL", "parse_kafka_url"]

_log = logging.getLogger(__name__)

#: Largest Kafka record batch (so the largest append) on a topic Baton creates: the topic's
#: ``max.message.bytes``. The producer's request size and the consumers' fetch sizes match it.
#: An existing topic with a smaller ``max.message.bytes`` lowers it.
MAX_BATCH_BYTES = 16 << 20
# Upper bounds of what Kafka's record batch format (v2) adds, so a batch's size is known before
# it is built: a 61-byte batch header, and per record at most 5 (length) + 1 (attributes) +
# 10 (timestamp delta) + 5 (offset delta) + 1 (null key) + 5 (value length) + 1 (no headers).
_BATCH_HEADER = 61
_RECORD_OVERHEAD = 28

_IDLE_PROBE = 5.0  # a reader that got nothing for this long checks that Kafka still answers
_CLOSE_GRACE = 5.0  # close() waits at most this long for an append in flight, and readers
_DIAGNOSE_SECONDS = 10.0  # at most this long to find out why Kafka could not be reached
_TOPIC_ALREADY_EXISTS = 36
_INVALID_PARTITIONS = 37  # CreatePartitions: e.g. the topic already has that many
_UNKNOWN_TOPIC, _NO_LEADER = 3, 5  # describe: not (yet) known, a partition without a leader
# CreateTopics errors that mean the URL asks for something this Kafka cannot do.
_BAD_REQUEST_CODES = {17, 37, 38, 39, 40, 42, 44}  # invalid topic/partitions/RF/assignment/config/request, policy

_client_ids = itertools.count(1)


def _batch_bound(records: Sequence[bytes]) -> int:
    """An upper bound of the Kafka record batch holding exactly ``records``."""
    return _BATCH_HEADER + sum(len(r) for r in records) + _RECORD_OVERHEAD * len(records)


# (records, size bound of their batch, the appending caller's future)
_Pending = tuple[list[bytes], int, "asyncio.Future[int]"]


def _tls_alert(exc: BaseException) -> bool:
    """Whether a connection aiokafka saw closed had been answered with a TLS alert record
    (type 21, version 3.x), which aiokafka read as the length of a Kafka response."""
    cause = exc.__cause__
    if not isinstance(cause, asyncio.IncompleteReadError) or cause.expected is None:
        return False
    return cause.expected >> 16 == 0x1503


def _fail(group: list[_Pending], exc: BaseException) -> None:
    for _, _, fut in group:
        if not fut.done():
            fut.set_exception(exc)


class KafkaLog(Log):
    """One partition of a Kafka topic; see the module docstring. Use :meth:`open`
    (partition 0), or :class:`KafkaLogSet` for the others.

    Args:
        partition: the Kafka partition this log appends to and reads.
        shared: the admin client and offsets consumer of the set this partition is in
            (the set stops them); None: this log makes its own and stops them at close.
    """

    def __init__(
        self,
        url: str,
        where: KafkaURL,
        security: dict[str, Any] | None = None,
        *,
        partition: int = 0,
        shared: tuple[Any, Any] | None = None,
    ) -> None:
        self.url = url
        self.partition = partition
        self._where = where
        # aiokafka's security options, the same for every client this log makes.
        self._security: dict[str, Any] = dict(security or {"security_protocol": "PLAINTEXT"})
        self._password_from = ""  # where the password came from, for the errors about a login
        self._tp = TopicPartition(where.topic, partition)
        self._timeout = where.request_timeout_ms / 1000
        self._max_batch = MAX_BATCH_BYTES
        self.max_record = self._max_batch - _BATCH_HEADER - _RECORD_OVERHEAD
        self._owns_clients = shared is None
        self._admin: Any = None if shared is None else shared[0]
        self._offsets: Any = None if shared is None else shared[1]  # no assignment: offset queries
        self._producer: Any = None  # started on first use; replaced after a failed append
        # Running read() generators: their consumer -> a future done when the generator ends.
        self._readers: dict[Any, asyncio.Future[None]] = {}
        self._yielded: set[Any] = set()  # consumers of readers now suspended at a yield
        self._known_end = 0  # the highest end offset this object has seen; readers drain to it at close
        self._drain_deadline = 0.0  # (monotonic) when readers stop draining after close
        self._queue: deque[_Pending] = deque()
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        self._closing: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(
        cls, url: str, *, password_file: str | None = None, environ: Mapping[str, str] | None = None
    ) -> KafkaLog:
        """Connect to Kafka, create the topic if it is missing, and start the producer.

        Args:
            url: ``kafka://HOST:PORT[,HOST:PORT]/TOPIC[?replication_factor=N&...]``.
            password_file: the file whose first line is the SASL password (with
                ``security_protocol=SASL_*``); not given: ``BATON_KAFKA_PASSWORD``.
            environ: where ``BATON_KAFKA_PASSWORD`` is looked up (default: the process's).

        Returns:
            The open log.

        Raises:
            InvalidArgument: a malformed URL, or a topic or setting Kafka refuses
                (e.g. a replication factor above the number of Kafka brokers); a password
                file that cannot be read, or SASL without a password; a CA file that
                cannot be used.
            LogUnavailable: Kafka is unreachable or does not answer in time, refuses the
                login, or presents a certificate that does not verify.
        """
        where = parse_kafka_url(url)
        security, password_from = client_security(where, password_file, environ)
        log = cls(url, where, security)
        log._password_from = password_from
        try:
            await log._connect()
        except BaseException:
            await log.close()
            raise
        return log

    @property
    def max_append_bytes(self) -> int:  # type: ignore[override]
        """The node cuts appends to this (its 64 bytes per record exceed Kafka's 28)."""
        return self._max_batch - _BATCH_HEADER

    @property
    def max_batch_bytes(self) -> int:
        """The largest append, in bytes of a Kafka record batch (see :func:`_batch_bound`)."""
        return self._max_batch

    # ---- appending ---------------------------------------------------------------------

    async def append(self, records: Sequence[bytes]) -> int:
        self._check_open()
        if not records:
            raise InvalidArgument("append needs at least one record")
        batch = [bytes(r) for r in records]  # no copy for bytes; freezes mutable buffers
        largest = max(map(len, batch))
        if largest > self.max_record:
            raise InvalidArgument(
                f"a record of {largest} bytes is larger than the log's max of {self.max_record} bytes"
            )
        bound = _batch_bound(batch)
        if bound > self._max_batch:
            raise InvalidArgument(
                f"an append of {len(batch)} records ({bound} bytes as a Kafka record batch) is "
                f"above the {self._max_batch} bytes Kafka accepts in one batch on topic "
                f"{self._where.topic!r} (max.message.bytes); append fewer records at a time"
            )
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((batch, bound, fut))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_loop())
        return await fut

    async def _write_loop(self) -> None:
        """The single writer: each turn sends everything queued so far as one record batch."""
        while self._queue and not self._closed:
            group: list[_Pending] = []
            size = _BATCH_HEADER
            while self._queue:
                records, bound, fut = self._queue[0]
                if fut.done():  # the caller was cancelled meanwhile
                    self._queue.popleft()
                    continue
                if group and size + bound - _BATCH_HEADER > self._max_batch:
                    break
                self._queue.popleft()
                group.append((records, bound, fut))
                size += bound - _BATCH_HEADER
            if not group:
                continue
            try:
                first = await self._send(group)
            except asyncio.CancelledError:  # close() gave up on the append in flight
                _fail(group, LogUnavailable(f"log {self.url} closed during the append; its outcome is unknown"))
                raise
            except Exception as exc:
                if not isinstance(exc, BatonError):  # a bug, or an error aiokafka should not raise
                    _log.exception("append to %s failed", self.url)
                    exc = LogUnavailable(f"append to {self.url} failed: {exc!r}")
                _fail(group, exc)
                continue
            for records, _, fut in group:
                if not fut.done():
                    fut.set_result(first)
                first += len(records)
            self._known_end = max(self._known_end, first)

    async def _send(self, group: list[_Pending]) -> int:
        """Append a group of batches as one Kafka record batch; returns its first offset."""
        producer = await self._producer_ready()
        batch = producer.create_batch()
        stamp = int(time.time() * 1000)
        for records, _, _ in group:
            for record in records:
                if batch.append(key=None, value=record, timestamp=stamp) is None:
                    # Cannot happen while _batch_bound is an upper bound; never send half.
                    raise LogUnavailable(f"append to {self.url}: batch size estimate was wrong")
        batch.close()
        try:
            async with self._guard("an append (which may still become visible)"):
                try:
                    # Always this partition by number: never Kafka's key partitioner.
                    delivered = await producer.send_batch(batch, self._tp.topic, partition=self._tp.partition)
                    meta = await delivered
                except KafkaError as exc:
                    if getattr(exc, "errno", None) in (10, 18):  # message/record list too large
                        raise InvalidArgument(
                            f"Kafka refused an append of {batch.size()} bytes to topic "
                            f"{self._tp.topic!r} as too large: {exc}"
                        ) from exc
                    raise
        except BaseException:
            # The idempotent producer's sequence numbers now disagree with the broker's
            # (or a batch of unknown fate is still queued in it): start afresh next time.
            self._producer = None
            await self._discard_producer(producer)
            raise
        offset = meta.offset
        if not isinstance(offset, int) or offset < 0:
            raise LogUnavailable(f"Kafka at {self._where.bootstrap} confirmed an append without its offset")
        return offset

    async def _producer_ready(self) -> Any:
        if self._producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self._where.bootstrap,
                client_id=f"baton-log-producer-{next(_client_ids)}",
                enable_idempotence=True,
                acks="all",
                max_batch_size=self._max_batch,  # the size create_batch() builders accept
                max_request_size=self._max_batch,
                linger_ms=0,
                request_timeout_ms=self._where.request_timeout_ms,
                **self._security,
            )
            try:
                async with self._guard("starting the producer"):
                    await producer.start()
            except BaseException:
                await self._discard_producer(producer)
                raise
            self._producer = producer
        return self._producer

    async def _discard_producer(self, producer: Any) -> None:
        """Stop a producer that may hold a batch Kafka never confirmed, without waiting for it.

        aiokafka's idempotent producer retries a batch until Kafka takes it, and its stop()
        waits for that: with Kafka gone, forever. So stop its sender task (which sends and
        retries), then close its connections; a batch not sent by then never is.
        """
        sender, client = getattr(producer, "_sender", None), getattr(producer, "client", None)
        if sender is None or client is None or not hasattr(producer, "_closed"):
            await self._quietly(producer.stop(), "stopping the producer")  # another aiokafka
            return
        producer._closed = True  # as stop() does first: later sends fail, and no "unclosed" warning
        await self._quietly(sender.close(), "stopping the producer's sender")
        await self._quietly(client.close(), "closing the producer's connections")

    async def _stop_consumer(self, consumer: Any) -> None:
        if not await self._quietly(consumer.stop(), "stopping a consumer"):
            # aiokafka 0.14's fetcher lets a CancelledError out of stop() when a fetch was
            # retrying a dead Kafka, before it closes the connections: close them here.
            client = getattr(consumer, "_client", None)
            if client is not None:
                await self._quietly(client.close(), "closing a consumer's connections")

    # ---- reading -----------------------------------------------------------------------

    async def read(self, start: int, *, max_batch: int = 1024) -> AsyncGenerator[list[Record], None]:
        if max_batch < 1:
            raise InvalidArgument("max_batch must be at least 1")
        if self._closed:
            return
        consumer = self._consumer()
        self._readers[consumer] = ended = asyncio.get_running_loop().create_future()
        try:
            async with self._guard("starting a reader"):
                await consumer.start()
            first, end = await self._bounds(consumer)
            if start < first:
                raise LogTruncated(f"offset {start} is below the log's start {first}")
            consumer.assign([self._tp])
            # Kafka cannot fetch beyond the end: start there and skip up to `start` instead.
            consumer.seek(self._tp, min(start, end))
            pos = start
            idle_since = time.monotonic()
            # Once the log is closed, a reader still hands out what was appended before (as far
            # as this object knows), then ends, like the other backends.
            while not self._closed or pos < self._known_end:
                fetched = await self._fetch(consumer, pos, max_batch)
                if fetched is None:
                    return
                batch = [(r.offset, r.value if r.value is not None else b"") for r in fetched if r.offset >= pos]
                if batch:
                    if batch[0][0] != pos or batch[-1][0] != pos + len(batch) - 1:
                        raise LogCorrupt(
                            f"offsets on Kafka topic {self._tp.topic!r} jump from {pos} to "
                            f"{batch[0][0]}: was it compacted, or written with transactions?"
                        )
                    pos += len(batch)
                    idle_since = time.monotonic()
                    self._yielded.add(consumer)
                    try:
                        yield batch
                    finally:
                        self._yielded.discard(consumer)
                elif not self._closed and time.monotonic() - idle_since >= _IDLE_PROBE * 0.9:
                    # Nothing new for a while: fine if Kafka answers, LogUnavailable if not
                    # (the fetcher itself retries a dead Kafka forever, quietly).
                    await self._bounds(consumer)
                    idle_since = time.monotonic()
        finally:
            self._readers.pop(consumer, None)
            await self._stop_consumer(consumer)
            if not ended.done():
                ended.set_result(None)

    async def _fetch(self, consumer: Any, pos: int, max_batch: int) -> list[Any] | None:
        """The next fetched records (possibly none); None when a closed log's reader should end."""
        if self._closed:  # draining: wait only until the deadline close() set
            wait = self._drain_deadline - time.monotonic()
            if wait <= 0:
                return None
            fetch = asyncio.ensure_future(
                consumer.getmany(self._tp, timeout_ms=int(wait * 1000), max_records=max_batch)
            )
            await asyncio.wait((fetch,))
        else:
            fetch = asyncio.ensure_future(
                consumer.getmany(self._tp, timeout_ms=int(_IDLE_PROBE * 1000), max_records=max_batch)
            )
            try:
                await asyncio.wait((fetch, self._closing), return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not fetch.done():
                    fetch.cancel()
            if not fetch.done() or fetch.cancelled():
                # Closed meanwhile (a cancelled task is done only once it has run again):
                # the caller decides whether to drain.
                return []
        try:
            fetched = fetch.result()
        except OffsetOutOfRangeError as exc:
            first, end = await self._bounds(consumer)
            if pos < first:
                raise LogTruncated(f"offset {pos} was truncated away (the log starts at {first})") from exc
            raise LogCorrupt(
                f"Kafka says offset {pos} of topic {self._tp.topic!r} is out of range [{first}, {end}]: "
                "was the topic deleted and created again?"
            ) from exc
        except (CorruptRecordException, RecordTooLargeError) as exc:
            raise LogCorrupt(f"Kafka topic {self._tp.topic!r} at offset {pos}: {exc}") from exc
        except ConsumerStoppedError as exc:
            if self._closed:
                return None
            raise LogUnavailable(f"the reader of {self.url} was stopped") from exc
        except KafkaError as exc:
            raise LogUnavailable(f"Kafka at {self._where.bootstrap}: reading failed: {exc}") from exc
        records: list[Any] = fetched.get(self._tp, [])
        if self._closed and not records:
            return None  # nothing came before the deadline
        return records

    def _consumer(self) -> Any:
        return AIOKafkaConsumer(
            bootstrap_servers=self._where.bootstrap,
            client_id=f"baton-log-consumer-{next(_client_ids)}",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",  # an offset out of range is an error, never a silent jump
            isolation_level="read_uncommitted",
            max_partition_fetch_bytes=self._max_batch,
            fetch_max_bytes=max(self._max_batch, 50 << 20),
            request_timeout_ms=self._where.request_timeout_ms,
            **self._security,
        )

    async def _bounds(self, consumer: Any) -> tuple[int, int]:
        """(log start offset, end offset) as ``consumer`` gets them from the partition leader."""
        async with self._guard("reading the log's offsets"):
            firsts = await consumer.beginning_offsets([self._tp])
            ends = await consumer.end_offsets([self._tp])
        end = int(ends[self._tp])
        self._known_end = max(self._known_end, end)
        return int(firsts[self._tp]), end

    # ---- offsets, retention, closing ---------------------------------------------------

    async def start_offset(self) -> int:
        self._check_open()
        return (await self._bounds(self._offsets))[0]

    async def end_offset(self) -> int:
        self._check_open()
        async with self._guard("reading the log's end offset"):
            ends = await self._offsets.end_offsets([self._tp])
        end = int(ends[self._tp])
        self._known_end = max(self._known_end, end)
        return end

    async def truncate_before(self, offset: int) -> None:
        self._check_open()
        if offset <= 0:
            return
        # DeleteRecords refuses offsets past the end; -1 would even mean "the end".
        before = min(offset, await self.end_offset())
        if before <= 0:
            return
        async with self._guard(f"deleting records before offset {before}"):
            await self._admin.delete_records(
                {self._tp: RecordsToDelete(before)}, timeout_ms=self._where.request_timeout_ms
            )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drain_deadline = time.monotonic() + _CLOSE_GRACE
        if not self._closing.done():
            self._closing.set_result(None)  # wakes readers: they hand out what is left, then end
        for _, _, fut in self._queue:
            if not fut.done():
                fut.set_exception(LogUnavailable(f"log {self.url} is closed"))
        self._queue.clear()
        writer, idle = self._writer, True
        if writer is not None and not writer.done():
            await asyncio.wait((writer,), timeout=_CLOSE_GRACE)  # an append in flight may finish
            if not writer.done():
                idle = False
                writer.cancel()
                await asyncio.wait((writer,))
        producer, self._producer = self._producer, None
        if producer is not None:
            # An idle producer holds no batch, so its stop() returns at once.
            if not idle or not await self._quietly(producer.stop(), "stopping the producer"):
                await self._discard_producer(producer)
        # Readers waiting for records drain and end by themselves, by the drain deadline; a
        # reader suspended at a yield may never be resumed, so it is not waited for.
        busy = [ended for consumer, ended in self._readers.items() if consumer not in self._yielded]
        if busy:
            await asyncio.wait(busy, timeout=max(0.0, self._drain_deadline - time.monotonic()))
        for consumer in list(self._readers):  # and the readers nobody iterates now
            await self._stop_consumer(consumer)
        if self._owns_clients:
            await self._close_clients()

    async def _close_clients(self) -> None:
        """Stop the offsets consumer and the admin client (a set's, or this log's own)."""
        if self._offsets is not None:
            await self._stop_consumer(self._offsets)
        if self._admin is not None:
            await self._quietly(self._admin.close(), "closing the admin client")

    # ---- connecting --------------------------------------------------------------------

    async def _connect(self, partitions: int = 1) -> int:
        """Connect, create the topic (with ``partitions``) if missing, check it; returns how
        many partitions the topic has."""
        where = self._where
        self._admin = AIOKafkaAdminClient(
            bootstrap_servers=where.bootstrap,
            client_id=f"baton-log-admin-{next(_client_ids)}",
            request_timeout_ms=where.request_timeout_ms,
            **self._security,
        )
        async with self._guard("connecting"):
            await self._admin.start()
        async with self._guard(f"creating topic {where.topic!r}"):
            created = await self._create_topic(partitions)
        if not created:
            async with self._guard(f"checking topic {where.topic!r}"):
                partitions = await self._check_topic()
        self._offsets = self._consumer()
        async with self._guard("starting a consumer"):
            await self._offsets.start()
        await self._producer_ready()
        return partitions

    async def _create_topic(self, partitions: int = 1) -> bool:
        """Create the topic with ``partitions`` partitions; False if it exists already."""
        where = self._where
        configs = {
            "max.message.bytes": str(MAX_BATCH_BYTES),
            "min.insync.replicas": str(where.min_insync_replicas),
            "retention.ms": "-1",  # Kafka never drops records by age or size; Baton truncates
            "retention.bytes": "-1",
            "cleanup.policy": "delete",  # never compact: offsets must stay dense
            "unclean.leader.election.enable": "false",  # never lose acknowledged appends
        }
        topic = NewTopic(where.topic, partitions, where.replication_factor, topic_configs=configs)
        response = await self._admin.create_topics([topic], timeout_ms=where.request_timeout_ms)
        for _name, code, *rest in response.topic_errors:
            if code == 0:
                _log.info(
                    "created Kafka topic %r (%d partition(s), replication factor %d, min ISR %d)",
                    where.topic, partitions, where.replication_factor, where.min_insync_replicas,
                )
                return True
            if code == _TOPIC_ALREADY_EXISTS:
                return False
            error = for_code(code)
            detail = rest[0] if rest and rest[0] else error.description
            kind = InvalidArgument if code in _BAD_REQUEST_CODES else LogUnavailable
            raise kind(
                f"Kafka at {where.bootstrap} refused to create topic {where.topic!r}: "
                f"{detail} ({error.__name__})"
            )
        raise LogUnavailable(f"Kafka at {where.bootstrap} did not say whether it created {where.topic!r}")

    async def _partition_count(self, least: int = 1) -> int:
        """How many partitions the topic has, once Kafka's metadata shows at least ``least``
        of them, each with a leader (a topic or partitions just created, maybe by another
        process, take a moment to appear). Bounded by the caller's :meth:`_guard`."""
        topic = self._where.topic
        while True:
            (described,) = await self._admin.describe_topics([topic])
            code = described["error_code"]
            parts = described["partitions"]
            if code not in (_UNKNOWN_TOPIC, _NO_LEADER) and len(parts) >= least and all(
                p["error_code"] != _NO_LEADER and p["leader"] >= 0 for p in parts
            ):
                break
            await asyncio.sleep(0.1)
        if code:
            error = for_code(code)
            raise LogUnavailable(f"Kafka cannot describe topic {topic!r}: {error.__name__}")
        return len(parts)

    async def _check_topic(self) -> int:
        """An existing topic must be usable as a log (not compacted); returns its partitions."""
        topic = self._where.topic
        partitions = await self._partition_count()
        (response,) = await self._admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        code, message, _type, _name, entries = response.resources[0][:5]
        if code:
            raise LogUnavailable(f"Kafka cannot describe the configuration of topic {topic!r}: {message}")
        config = {entry[0]: entry[1] for entry in entries}
        if "compact" in str(config.get("cleanup.policy", "")):
            raise InvalidArgument(
                f"Kafka topic {topic!r} is compacted (cleanup.policy={config['cleanup.policy']}); "
                "a Baton log must keep every record"
            )
        limit = str(config.get("max.message.bytes", ""))
        if limit.isdigit() and int(limit) < self._max_batch:
            self._max_batch = int(limit)
            self.max_record = max(1, self._max_batch - _BATCH_HEADER - _RECORD_OVERHEAD)
        if config.get("retention.ms") not in (None, "-1") or config.get("retention.bytes") not in (None, "-1"):
            _log.warning(
                "Kafka topic %r has retention.ms=%s retention.bytes=%s: Kafka may delete records "
                "that brokers still need; set both to -1",
                topic, config.get("retention.ms"), config.get("retention.bytes"),
            )
        return partitions

    # ---- helpers -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogUnavailable(f"log {self.url} is closed")

    @contextlib.asynccontextmanager
    async def _guard(self, what: str) -> AsyncIterator[None]:
        """Bound a Kafka call in time and turn what it raises into Baton's errors."""
        where = self._where.bootstrap
        try:
            async with asyncio.timeout(self._timeout):
                yield
        except BatonError:
            raise
        except TimeoutError as exc:
            raise LogUnavailable(f"Kafka at {where}: {what} got no answer within {self._timeout:g}s") from exc
        except KafkaConnectionError as exc:
            # aiokafka reports any failed bootstrap as "Unable to bootstrap", whether Kafka is
            # down or refused the login, the certificate or the protocol: find out which.
            why = await self._why_not_connected() if "bootstrap" in str(exc) else None
            if why is not None:
                raise LogUnavailable(f"{why} ({what})") from None
            raise LogUnavailable(f"Kafka at {where} unreachable ({what}): {exc}") from exc
        except SaslAuthenticationFailed as exc:
            raise LogUnavailable(f"{self._login_refused(where, exc)} ({what})") from None
        except (KafkaError, OSError) as exc:
            raise LogUnavailable(f"Kafka at {where}: {what} failed: {exc}") from exc

    async def _why_not_connected(self) -> str | None:
        """Why connecting to the bootstrap servers fails, if it is the login, TLS or the
        security protocol (None when they are merely unreachable, or answer now): one
        connection per server, as aiokafka makes them, within :data:`_DIAGNOSE_SECONDS` in all."""
        where = self._where
        protocol = f"security_protocol={where.security_protocol} in the log URL"
        try:
            async with asyncio.timeout(min(self._timeout, _DIAGNOSE_SECONDS)):
                for server in where.servers:
                    host, _, port = server.rpartition(":")
                    try:
                        conn = await create_conn(
                            host.strip("[]"), int(port), client_id="baton-log-check",
                            request_timeout_ms=where.request_timeout_ms, **self._security,
                        )
                    except SaslAuthenticationFailed as exc:
                        return self._login_refused(server, exc)
                    except UnsupportedSaslMechanismError:
                        return (
                            f"Kafka at {server} does not offer SASL mechanism {where.sasl_mechanism} "
                            "on that listener (sasl_mechanism in the log URL)"
                        )
                    except ssl.SSLCertVerificationError as exc:
                        trusted = f"ssl_cafile {where.ssl_cafile}" if where.ssl_cafile else "the system's CAs"
                        return (
                            f"the TLS certificate of Kafka at {server} does not verify against "
                            f"{trusted}: {exc.verify_message or exc}"
                        )
                    except ssl.SSLError as exc:
                        return (
                            f"the TLS handshake with Kafka at {server} failed ({exc.reason or exc}): "
                            f"does that listener speak TLS? ({protocol})"
                        )
                    except ConnectionResetError:
                        if where.tls:
                            return (
                                f"Kafka at {server} reset the connection during the TLS handshake: "
                                f"does that listener speak TLS? ({protocol})"
                            )
                        continue
                    except KafkaConnectionError as exc:
                        if not where.tls and _tls_alert(exc):
                            return (
                                f"Kafka at {server} answered in TLS: that listener expects TLS "
                                f"(security_protocol=SSL or SASL_SSL), not {where.security_protocol}"
                            )
                        continue
                    except (OSError, KafkaError, TimeoutError):
                        continue
                    conn.close()
                    return None
        except TimeoutError:
            pass
        return None

    def _login_refused(self, server: str, exc: BaseException) -> str:
        said = str(exc.args[0]) if exc.args else type(exc).__name__
        return (
            f"Kafka at {server} refused the login of {self._where.sasl_username!r} with "
            f"{self._where.sasl_mechanism}: {said}; check the password ({self._password_from}) "
            "and the user's credentials on Kafka"
        )

    async def _quietly(self, closing: Any, what: str) -> bool:
        """Await a stop/close call, bounded; failing is only logged. True if it completed."""
        try:
            async with asyncio.timeout(_CLOSE_GRACE):
                try:
                    await closing
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # we are being cancelled (or timed out): not aiokafka's leak
                    _log.debug("%s: %s let a CancelledError out", self.url, what)
                    return False
        except Exception as exc:
            _log.debug("%s: %s failed: %r", self.url, what, exc)
            return False
        return True


class KafkaLogSet(LogSet):
    """A Kafka topic as a log set: partition K is Kafka partition K (see the module
    docstring). Use :meth:`open`."""

    def __init__(self, url: str, first: KafkaLog) -> None:
        super().__init__(url)
        self._first = first

    @classmethod
    async def open(
        cls,
        url: str,
        partitions: int | None = None,
        *,
        password_file: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> KafkaLogSet:
        """Connect to Kafka and open the topic's partitions, creating the topic with
        ``partitions`` (default 1) if it is missing; an existing topic opens with the
        partitions it has.

        Args: and Raises: as :meth:`KafkaLog.open`; also InvalidArgument for ``partitions``
        out of range.
        """
        wanted = check_count(partitions if partitions is not None else 1)
        where = parse_kafka_url(url)
        security, password_from = client_security(where, password_file, environ)
        first = KafkaLog(url, where, security)
        first._owns_clients = False  # the set stops the shared clients, after every partition
        first._password_from = password_from
        logs = cls(url, first)
        try:
            count = await first._connect(wanted)
            await logs._open_to(count)
        except BaseException:
            await first.close()
            await first._close_clients()
            await logs.close()
            raise
        return logs

    async def _existing(self) -> int:
        first = self._first
        async with first._guard(f"describing topic {first._where.topic!r}"):
            return await first._partition_count()

    async def _create(self, count: int) -> None:
        first = self._first
        topic = first._where.topic
        async with first._guard(f"adding partitions to topic {topic!r}"):
            try:
                await first._admin.create_partitions(
                    {topic: NewPartitions(count)}, timeout_ms=first._where.request_timeout_ms
                )
                _log.info("Kafka topic %r grown to %d partitions", topic, count)
            except KafkaError as exc:
                # Another process grew it first (Kafka says the topic already has that many
                # or more); anything else is refused below if the topic is still short.
                if getattr(exc, "errno", None) != _INVALID_PARTITIONS:
                    raise
                have = await first._partition_count()
                if have < count:
                    raise InvalidArgument(
                        f"Kafka refused to grow topic {topic!r} from {have} to {count} partitions: {exc}"
                    ) from exc
            await first._partition_count(count)  # until the metadata shows them, with leaders

    async def _open_partition(self, k: int) -> Log:
        first = self._first
        if k == 0:
            return first
        log = KafkaLog(
            self.url, first._where, first._security, partition=k, shared=(first._admin, first._offsets)
        )
        log._password_from = first._password_from
        log._max_batch, log.max_record = first._max_batch, first.max_record
        return log

    async def _close_backend(self) -> None:
        await self._first._close_clients()
