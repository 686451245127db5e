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
partitions it has; partitions added later get the topic's replication and settings). A
created topic gets ``retention.ms=-1`` and ``retention.bytes=-1``:
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
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer, ConsumerStoppedError, TopicPartition
from aiokafka.admin import RecordsToDelete
from aiokafka.errors import CorruptRecordException, KafkaError, OffsetOutOfRangeError, RecordTooLargeError

from batonmq.cluster.errors import BatonError, InvalidArgument, LogCorrupt, LogTruncated, LogUnavailable
from batonmq.cluster.log.base import Log, LogSet, Record, check_count
from batonmq.cluster.log.kafka_topic import (
    BATCH_HEADER as _BATCH_HEADER,
    CLOSE_GRACE as _CLOSE_GRACE,
    MAX_BATCH_BYTES,
    RECORD_OVERHEAD as _RECORD_OVERHEAD,
    KafkaTopic,
    client_ids as _client_ids,
)
from batonmq.cluster.log.kafka_url import KafkaURL, client_security, parse_kafka_url

__all__ = ["KafkaLog", "KafkaLogSet", "KafkaTopic", "KafkaURL", "MAX_BATCH_BYTES", "parse_kafka_url"]

_log = logging.getLogger(__name__)

_IDLE_PROBE = 5.0  # a reader that got nothing for this long checks that Kafka still answers


def _batch_bound(records: Sequence[bytes]) -> int:
    """An upper bound of the Kafka record batch holding exactly ``records``."""
    return _BATCH_HEADER + sum(len(r) for r in records) + _RECORD_OVERHEAD * len(records)


# (records, size bound of their batch, the appending caller's future)
_Pending = tuple[list[bytes], int, "asyncio.Future[int]"]


def _fail(group: list[_Pending], exc: BaseException) -> None:
    for _, _, fut in group:
        if not fut.done():
            fut.set_exception(exc)


class KafkaLog(Log):
    """One partition of a Kafka topic; see the module docstring. Use :meth:`open`
    (partition 0), or :class:`KafkaLogSet` for them all.

    Args:
        topic: the connected topic, and the clients this partition shares with the others.
        partition: the Kafka partition this log appends to and reads.
        owns_topic: this log closes ``topic``'s clients when it closes (a lone log); in a
            set, the set does, after every partition.
    """

    def __init__(self, topic: KafkaTopic, partition: int = 0, *, owns_topic: bool = False) -> None:
        self.url = topic.url
        self.partition = partition
        self._topic = topic
        self._owns_topic = owns_topic
        self._where = topic.where
        self._tp = TopicPartition(topic.where.topic, partition)
        self._max_batch = topic.max_batch  # the topic's max.message.bytes may have lowered it
        self.max_record = max(1, self._max_batch - _BATCH_HEADER - _RECORD_OVERHEAD)
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
        """Connect to Kafka, create the topic if it is missing (with one partition), and
        start the producer of its partition 0.

        Args:
            url: ``kafka://HOST:PORT[,HOST:PORT]/TOPIC[?replication_factor=N&...]``.
            password_file: the file whose first line is the SASL password (with
                ``security_protocol=SASL_*``); not given: ``BATON_KAFKA_PASSWORD``.
            environ: where ``BATON_KAFKA_PASSWORD`` is looked up (default: the process's).

        Returns:
            The open log.

        Raises:
            InvalidArgument: a malformed URL, or a topic or setting Kafka refuses
                (e.g. a replication factor above the number of Kafka brokers), or a
                compacted topic; a password file that cannot be read, or SASL without a
                password; a CA file that cannot be used.
            LogUnavailable: Kafka is unreachable or does not answer in time, refuses the
                login, or presents a certificate that does not verify.
        """
        topic = await _connected(url, 1, password_file, environ)
        log = cls(topic, 0, owns_topic=True)
        try:
            await log.start()
        except BaseException:
            await log.close()
            raise
        return log

    async def start(self) -> None:
        """Start the producer now rather than at the first append (opening a lone log
        does, so that a broker learns at start that it can write).

        Raises:
            LogUnavailable: Kafka does not take the producer.
        """
        await self._producer_ready()

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
            async with self._topic.guard("an append (which may still become visible)"):
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
                **self._topic.security,
            )
            try:
                async with self._topic.guard("starting the producer"):
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
            await self._topic.quietly(producer.stop(), "stopping the producer")  # another aiokafka
            return
        producer._closed = True  # as stop() does first: later sends fail, and no "unclosed" warning
        await self._topic.quietly(sender.close(), "stopping the producer's sender")
        await self._topic.quietly(client.close(), "closing the producer's connections")

    # ---- reading -----------------------------------------------------------------------

    async def read(self, start: int, *, max_batch: int = 1024) -> AsyncGenerator[list[Record], None]:
        if max_batch < 1:
            raise InvalidArgument("max_batch must be at least 1")
        if self._closed:
            return
        consumer = self._topic.consumer()
        self._readers[consumer] = ended = asyncio.get_running_loop().create_future()
        try:
            async with self._topic.guard("starting a reader"):
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
            await self._topic.stop_consumer(consumer)
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

    async def _bounds(self, consumer: Any) -> tuple[int, int]:
        """(log start offset, end offset) as ``consumer`` gets them from the partition leader."""
        async with self._topic.guard("reading the log's offsets"):
            firsts = await consumer.beginning_offsets([self._tp])
            ends = await consumer.end_offsets([self._tp])
        end = int(ends[self._tp])
        self._known_end = max(self._known_end, end)
        return int(firsts[self._tp]), end

    # ---- offsets, retention, closing ---------------------------------------------------

    async def start_offset(self) -> int:
        self._check_open()
        return (await self._bounds(self._topic.offsets))[0]

    async def end_offset(self) -> int:
        self._check_open()
        async with self._topic.guard("reading the log's end offset"):
            ends = await self._topic.offsets.end_offsets([self._tp])
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
        async with self._topic.guard(f"deleting records before offset {before}"):
            await self._topic.admin.delete_records(
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
            if not idle or not await self._topic.quietly(producer.stop(), "stopping the producer"):
                await self._discard_producer(producer)
        # Readers waiting for records drain and end by themselves, by the drain deadline; a
        # reader suspended at a yield may never be resumed, so it is not waited for.
        busy = [ended for consumer, ended in self._readers.items() if consumer not in self._yielded]
        if busy:
            await asyncio.wait(busy, timeout=max(0.0, self._drain_deadline - time.monotonic()))
        for consumer in list(self._readers):  # and the readers nobody iterates now
            await self._topic.stop_consumer(consumer)
        if self._owns_topic:
            await self._topic.close()

    # ---- helpers -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogUnavailable(f"log {self.url} is closed")



async def _connected(
    url: str, partitions: int, password_file: str | None, environ: Mapping[str, str] | None
) -> KafkaTopic:
    """The topic of ``url``, connected (and created with ``partitions`` if missing)."""
    where = parse_kafka_url(url)
    security, password_from = client_security(where, password_file, environ)
    topic = KafkaTopic(url, where, security, password_from)
    try:
        await topic.connect(partitions)
    except BaseException:
        await topic.close()
        raise
    return topic


class KafkaLogSet(LogSet):
    """A Kafka topic as a log set: partition K is Kafka partition K (see the module
    docstring). Use :meth:`open`."""

    def __init__(self, topic: KafkaTopic) -> None:
        super().__init__(topic.url)
        self._topic = topic

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
        partitions it has. Producers start at each partition's first append.

        Args:
            url, password_file, environ: as for :meth:`KafkaLog.open`.
            partitions: how many partitions a new topic gets.

        Raises:
            InvalidArgument, LogUnavailable: as :meth:`KafkaLog.open`; InvalidArgument also
                for ``partitions`` out of range.
        """
        wanted = check_count(partitions if partitions is not None else 1)
        logs = cls(await _connected(url, wanted, password_file, environ))
        try:
            await logs.refresh()
        except BaseException:
            await logs.close()
            raise
        return logs

    async def _existing(self) -> int:
        async with self._topic.guard(f"describing topic {self._topic.where.topic!r}"):
            return await self._topic.partition_count()

    async def _create(self, count: int) -> None:
        async with self._topic.guard(f"adding partitions to topic {self._topic.where.topic!r}"):
            await self._topic.grow(count, self.count)

    async def _open_partition(self, k: int) -> Log:
        return KafkaLog(self._topic, k)

    async def _close_backend(self) -> None:
        await self._topic.close()
