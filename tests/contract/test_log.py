"""The ordered log's conformance suite (docs/design.md §3, §12): every backend passes all of it.

Adding a backend is one subclass of :class:`LogContract` that says how to open a fresh
log at a place (``make``) and whether its records outlive ``close`` (``persistent``).
Each backend also passes it on a data partition of a multi-partition log set
(:class:`OnDataPartition`): a partition is a complete log on its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import pytest

from batonmq.cluster.errors import InvalidArgument, LogTruncated, LogUnavailable
from batonmq.cluster.log import Log, LogSet, Record, open_log, open_log_set
from batonmq.cluster.log.file import FileLog
from batonmq.cluster.log.kafka import KafkaLog, KafkaURL, parse_kafka_url
from batonmq.cluster.log.memory import MemoryLog
from batonmq.loadtest.certs import make_certs
from tests import helpers
from tests.helpers import eventually, now
from tests.kafka_fixture import SaslKafka, start_kafka, stop_kafka

TIMEOUT = 20.0


async def collect(
    log: Log, start: int, count: int, *, max_batch: int = 1024, into: list[Record] | None = None
) -> list[Record]:
    """Read exactly ``count`` records from ``start`` (failing the test if they don't come)."""
    return await helpers.collect(log, start, count, max_batch=max_batch, timeout=TIMEOUT, into=into)


def dense(records: list[Record], start: int) -> list[bytes]:
    """The payloads, after checking the offsets run densely from ``start``."""
    assert [o for o, _ in records] == list(range(start, start + len(records)))
    return [r for _, r in records]


class LogContract:
    """The behaviour every backend must have. Subclasses provide ``make``."""

    persistent: ClassVar[bool] = False

    async def make(self, where: Path) -> Log:
        """Open the log living at ``where`` (a fresh one the first time)."""
        raise NotImplementedError

    @pytest.fixture
    async def log(self, tmp_path: Path) -> AsyncIterator[Log]:
        opened = await self.make(tmp_path)
        yield opened
        await opened.close()

    async def test_empty_log_offsets(self, log: Log) -> None:
        assert await log.start_offset() == 0
        assert await log.end_offset() == 0

    async def test_append_returns_dense_first_offsets(self, log: Log) -> None:
        assert await log.append([b"a", b"b", b"c"]) == 0
        assert await log.append([b"d"]) == 3
        assert await log.append([b"e", b"f"]) == 4
        assert await log.end_offset() == 6
        assert await log.start_offset() == 0

    async def test_read_from_start(self, log: Log) -> None:
        payloads = [f"record-{i}".encode() for i in range(300)] + [b"", b"\x00\xff" * 10]
        await log.append(payloads[:100])
        await log.append(payloads[100:])
        assert dense(await collect(log, 0, len(payloads)), 0) == payloads

    async def test_read_from_middle(self, log: Log) -> None:
        for i in range(10):
            await log.append([f"{i}-{j}".encode() for j in range(10)])
        got = dense(await collect(log, 37, 63), 37)
        assert got[0] == b"3-7" and got[-1] == b"9-9"

    async def test_read_respects_max_batch(self, log: Log) -> None:
        await log.append([bytes([i]) for i in range(100)])
        got = await collect(log, 5, 95, max_batch=7)  # collect checks each batch's size
        assert dense(got, 5) == [bytes([i]) for i in range(5, 100)]

    async def test_read_from_end_tails_new_appends(self, log: Log) -> None:
        await log.append([b"old"])
        reader = asyncio.create_task(collect(log, 1, 3))
        # Time passes with the reader at the end: it must keep waiting, not return.
        await asyncio.sleep(0.05)
        assert not reader.done()
        await log.append([b"new-1"])
        await log.append([b"new-2", b"new-3"])
        assert dense(await asyncio.wait_for(reader, TIMEOUT), 1) == [b"new-1", b"new-2", b"new-3"]

    async def test_read_beyond_end_waits_for_that_offset(self, log: Log) -> None:
        reader = asyncio.create_task(collect(log, 2, 1))
        await asyncio.sleep(0.02)  # time passes with nothing to read (not a wait for something)
        await log.append([b"zero", b"one"])
        await asyncio.sleep(0.02)  # ... and with offsets below 2 only: it must keep waiting
        assert not reader.done()
        await log.append([b"two"])
        assert await asyncio.wait_for(reader, TIMEOUT) == [(2, b"two")]

    async def test_two_readers_see_the_same_records(self, log: Log) -> None:
        readers = [asyncio.create_task(collect(log, 0, 50)) for _ in range(2)]
        for i in range(5):
            await log.append([f"{i}.{j}".encode() for j in range(10)])
        first, second = await asyncio.wait_for(asyncio.gather(*readers), TIMEOUT)
        assert first == second and len(first) == 50

    async def test_concurrent_appends_are_atomic_and_ordered(self, log: Log) -> None:
        rng = random.Random(7)
        tasks, appends = 20, 15
        firsts: dict[tuple[int, int], tuple[int, int]] = {}  # (task, append) -> (first, size)

        async def writer(t: int) -> None:
            for a in range(appends):
                size = rng.randint(1, 12)
                batch = [f"{t}:{a}:{i}".encode() for i in range(size)]
                firsts[t, a] = (await log.append(batch), size)
                if rng.random() < 0.3:
                    await asyncio.sleep(0)  # interleaving the writers, not a wait

        await asyncio.wait_for(asyncio.gather(*(writer(t) for t in range(tasks))), TIMEOUT)
        total = sum(size for _, size in firsts.values())
        assert await log.end_offset() == total
        got = dense(await collect(log, 0, total), 0)
        assert len(set(got)) == total  # every record exactly once
        for (t, a), (first, size) in firsts.items():  # each batch where its first offset says
            assert got[first : first + size] == [f"{t}:{a}:{i}".encode() for i in range(size)]
        for t in range(tasks):  # each task's batches in the order it appended them
            mine = [first for (tt, _), (first, _) in sorted(firsts.items()) if tt == t]
            assert mine == sorted(mine)

    async def test_large_records(self, log: Log) -> None:
        big = [bytes([i]) * (1 << 20) for i in range(3)]
        rng = random.Random(1)
        noisy = rng.randbytes(1 << 20)
        assert await log.append([b"small", big[0]]) == 0
        assert await log.append([big[1], noisy, big[2], b"tail"]) == 2
        assert dense(await collect(log, 0, 6), 0) == [b"small", big[0], big[1], noisy, big[2], b"tail"]

    async def test_truncate_before(self, log: Log) -> None:
        for i in range(20):
            await log.append([f"{i}-{j}".encode() * 20 for j in range(10)])
        await log.truncate_before(120)
        start = await log.start_offset()
        assert 0 <= start <= 120  # backends may keep more than asked (whole segments)
        assert await log.end_offset() == 200
        got = dense(await collect(log, start, 200 - start), start)
        assert got[-1] == b"19-9" * 20
        if start > 0:
            with pytest.raises(LogTruncated):
                await collect(log, start - 1, 1)
        assert await log.append([b"after"]) == 200

    async def test_read_below_start_raises_truncated(self, log: Log) -> None:
        with pytest.raises(LogTruncated):
            await collect(log, -1, 1)

    async def test_records_survive_reopen(self, tmp_path: Path) -> None:
        if not self.persistent:
            pytest.skip("this backend keeps nothing after close")
        log = await self.make(tmp_path)
        await log.append([b"one", b"two"])
        await log.append([b"three"])
        await log.close()
        log = await self.make(tmp_path)
        try:
            assert await log.end_offset() == 3
            assert await log.append([b"four"]) == 3
            assert dense(await collect(log, 0, 4), 0) == [b"one", b"two", b"three", b"four"]
        finally:
            await log.close()

    async def test_append_after_close_raises_unavailable(self, tmp_path: Path) -> None:
        log = await self.make(tmp_path)
        await log.append([b"x"])
        await log.close()
        with pytest.raises(LogUnavailable):
            await log.append([b"y"])

    async def test_close_stops_a_tailing_reader(self, tmp_path: Path) -> None:
        log = await self.make(tmp_path)
        await log.append([b"x"])

        got: list[Record] = []

        async def read_all() -> list[Record]:
            async for batch in log.read(0):
                got.extend(batch)
            return got

        reader = asyncio.create_task(read_all())
        await eventually(lambda: now(len(got)), "the reader to read the record", until=lambda n: n == 1)
        await log.close()  # with the reader waiting at the end
        assert await asyncio.wait_for(reader, TIMEOUT) == [(0, b"x")]

    async def test_cancelled_reader_leaves_the_log_usable(self, log: Log) -> None:
        await log.append([b"a"])
        seen: list[Record] = []
        reader = asyncio.create_task(collect(log, 0, 5, into=seen))
        await eventually(lambda: now(len(seen)), "the reader to read the record", until=lambda n: n == 1)
        reader.cancel()  # it has read one record and waits at the end
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert await log.append([b"b"]) == 1
        assert dense(await collect(log, 0, 2), 0) == [b"a", b"b"]

    async def test_empty_batch_is_invalid(self, log: Log) -> None:
        with pytest.raises(InvalidArgument):
            await log.append([])
        assert await log.end_offset() == 0


class OnDataPartition:
    """Mixed into a :class:`LogContract` subclass: ``make`` opens a log set of
    :attr:`PARTITIONS` at the place (``open_set``) and gives partition :attr:`PARTITION`,
    so the whole contract runs on a data partition. The sets are closed after each test."""

    PARTITIONS: ClassVar[int] = 3
    PARTITION: ClassVar[int] = 2
    _sets: list[LogSet]

    async def open_set(self, where: Path) -> LogSet:
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    async def _close_sets(self) -> AsyncIterator[None]:
        self._sets = []
        yield  # torn down after the log fixture, which closes only the partition
        for opened in self._sets:
            await opened.close()

    async def make(self, where: Path) -> Log:
        opened = await self.open_set(where)
        self._sets.append(opened)
        assert opened.count == self.PARTITIONS
        log = opened.partition(self.PARTITION)
        assert log.partition == self.PARTITION
        return log


class TestMemoryLog(LogContract):
    async def make(self, where: Path) -> Log:
        return MemoryLog()


class TestMemoryLogDataPartition(OnDataPartition, LogContract):
    async def open_set(self, where: Path) -> LogSet:
        return await open_log_set("memory:", partitions=self.PARTITIONS)


class TestFileLog(LogContract):
    persistent = True

    async def make(self, where: Path) -> Log:
        return await open_log(f"file:{where / 'log'}")


class TestFileLogSmallSegments(LogContract):
    """Segments of 4 KiB, so every test above also crosses segment boundaries."""

    persistent = True

    async def make(self, where: Path) -> Log:
        return await FileLog.open(str(where / "log"), segment_bytes=4096)


class TestFileLogDataPartition(OnDataPartition, LogContract):
    """In ``partition-2/`` beside partition 0's segments, with 4 KiB segments."""

    persistent = True

    async def open_set(self, where: Path) -> LogSet:
        return await open_log_set(f"file:{where / 'log'}?segment_bytes=4096", partitions=self.PARTITIONS)


# ---- Kafka -------------------------------------------------------------------------------

_RUN = uuid.uuid4().hex[:8]  # topics of one run never meet those of an earlier one on a kept Kafka


def kafka_topic(where: Path) -> str:
    """One fresh topic per test (per ``where``): the same name when a test reopens its log."""
    return f"baton-test-{_RUN}-{hashlib.sha1(str(where).encode()).hexdigest()[:16]}"


class TestKafkaLog(LogContract):
    """The conformance suite on a real Kafka broker (tests/kafka_fixture.py says which)."""

    persistent = True
    bootstrap = ""

    @pytest.fixture(autouse=True)
    def _kafka(self, kafka_bootstrap: str) -> None:
        self.bootstrap = kafka_bootstrap

    async def make(self, where: Path) -> Log:
        return await open_log(f"kafka://{self.bootstrap}/{kafka_topic(where)}")

    async def test_too_large_appends_are_refused_whole(self, log: Log) -> None:
        assert isinstance(log, KafkaLog)
        limit = log.max_batch_bytes
        mib = 1 << 20
        with pytest.raises(InvalidArgument, match="max.message.bytes"):  # each record fits, the batch not
            await log.append([b"x" * mib] * (limit // mib + 1))
        with pytest.raises(InvalidArgument):  # one record above the limit
            await log.append([b"ok", b"y" * (log.max_record + 1)])
        assert await log.end_offset() == 0  # nothing of either is visible
        near = [bytes([i]) * (limit // 4 - 1024) for i in range(4)]  # just below the limit: one batch
        assert await log.append(near) == 0
        assert await log.append([b"after"]) == 4
        assert [r for _, r in await collect(log, 0, 5)] == [*near, b"after"]

    async def test_concurrent_large_appends_are_split_into_batches_whole(self, log: Log) -> None:
        assert isinstance(log, KafkaLog)
        third = log.max_batch_bytes // 3 - 1024  # two fit in one Kafka batch, three do not
        batches = [[bytes([i]) * third, bytes([i])] for i in range(5)]
        firsts = await asyncio.wait_for(asyncio.gather(*(log.append(b) for b in batches)), TIMEOUT)
        assert sorted(firsts) == list(range(0, 10, 2))
        got = dense(await collect(log, 0, 10), 0)
        for first, batch in zip(firsts, batches):
            assert got[first : first + 2] == batch

    async def test_a_topic_of_several_partitions_opens_as_its_partition_0(self, tmp_path: Path) -> None:
        from aiokafka import AIOKafkaProducer
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        topic = kafka_topic(tmp_path)
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 3, 1)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"in-1", partition=1)
            await producer.send_and_wait(topic, b"in-0", partition=0)
        finally:
            await producer.stop()
        log = await open_log(f"kafka://{self.bootstrap}/{topic}")
        try:
            assert log.partition == 0
            assert await log.end_offset() == 1
            assert await log.append([b"mine"]) == 1
            assert dense(await collect(log, 0, 2), 0) == [b"in-0", b"mine"]
        finally:
            await log.close()

    async def test_replication_factor_above_the_brokers_is_invalid(self, tmp_path: Path) -> None:
        with pytest.raises(InvalidArgument, match="(?i)replication"):
            await open_log(f"kafka://{self.bootstrap}/{kafka_topic(tmp_path)}?replication_factor=7")


class TestKafkaLogDataPartition(OnDataPartition, LogContract):
    """Kafka partition 2 of a topic of 3 partitions."""

    persistent = True
    bootstrap = ""

    @pytest.fixture(autouse=True)
    def _kafka(self, kafka_bootstrap: str) -> None:
        self.bootstrap = kafka_bootstrap

    async def open_set(self, where: Path) -> LogSet:
        return await open_log_set(f"kafka://{self.bootstrap}/{kafka_topic(where)}", partitions=self.PARTITIONS)


class TestKafkaSaslLog(LogContract):
    """The conformance suite over TLS and SASL (SCRAM-SHA-512): every aiokafka client the log
    makes (producer, readers, offsets, the admin client's topic creation and DeleteRecords)
    logs in on the test Kafka's SASL_SSL listener."""

    persistent = True
    sasl: SaslKafka

    @pytest.fixture(autouse=True)
    def _kafka(self, kafka_sasl: SaslKafka) -> None:
        self.sasl = kafka_sasl

    async def make(self, where: Path) -> Log:
        return await open_log(self.sasl.url(kafka_topic(where)), kafka_password_file=self.sasl.password_file)


async def test_kafka_log_over_sasl_plain_with_the_password_from_the_environment(
    kafka_sasl: SaslKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PLAIN (over TLS), the password in BATON_KAFKA_PASSWORD; then SCRAM reads the same topic."""
    monkeypatch.setenv("BATON_KAFKA_PASSWORD", kafka_sasl.password)
    topic = kafka_topic(tmp_path)
    log = await open_log(kafka_sasl.url(topic, "PLAIN"))
    try:
        assert await log.append([b"a", b"b"]) == 0
        assert await log.append([b"c"]) == 2
        assert dense(await collect(log, 0, 3), 0) == [b"a", b"b", b"c"]
        await log.truncate_before(1)
        await eventually(log.start_offset, "the truncation", until=lambda first: first == 1)
    finally:
        await log.close()
    monkeypatch.delenv("BATON_KAFKA_PASSWORD")
    again = await open_log(kafka_sasl.url(topic, "SCRAM-SHA-512"), kafka_password_file=kafka_sasl.password_file)
    try:
        assert dense(await collect(again, 1, 2), 1) == [b"b", b"c"]
    finally:
        await again.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
async def test_a_wrong_kafka_password_is_one_clear_error(
    kafka_sasl: SaslKafka, tmp_path: Path, mechanism: str
) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-" + kafka_sasl.password + "\n")
    url = kafka_sasl.url(kafka_topic(tmp_path), mechanism) + "&request_timeout_ms=5000"
    started = time.monotonic()
    with pytest.raises(LogUnavailable) as caught:
        await asyncio.wait_for(open_log(url, kafka_password_file=str(wrong)), TIMEOUT)
    message = caught.value.message
    assert message.startswith(f"Kafka at {kafka_sasl.bootstrap} refused the login of "
                              f"{kafka_sasl.user!r} with {mechanism}: "), message
    assert f"kafka_password_file {wrong}" in message and "\n" not in message
    assert kafka_sasl.password not in message
    assert time.monotonic() - started < 10  # told, not retried until a timeout


async def test_a_kafka_certificate_from_another_ca_is_refused(kafka_sasl: SaslKafka, tmp_path: Path) -> None:
    other = make_certs(tmp_path, "other")
    url = kafka_sasl.url(kafka_topic(tmp_path)).replace(kafka_sasl.ca, str(other.ca))
    with pytest.raises(LogUnavailable, match=rf"TLS certificate of Kafka at .* does not verify against ssl_cafile {other.ca}"):
        await asyncio.wait_for(open_log(url, kafka_password_file=kafka_sasl.password_file), TIMEOUT)


async def test_plaintext_to_a_tls_listener_says_it_expects_tls(kafka_sasl: SaslKafka, tmp_path: Path) -> None:
    url = f"kafka://{kafka_sasl.bootstrap}/{kafka_topic(tmp_path)}?request_timeout_ms=5000"
    with pytest.raises(LogUnavailable, match="answered in TLS: that listener expects TLS .*not PLAINTEXT"):
        await asyncio.wait_for(open_log(url), TIMEOUT)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("kafka://127.0.0.1:9092/baton", KafkaURL(("127.0.0.1:9092",), "baton")),
        (
            "kafka://k1:9092,k2:9093/baton.log_1?replication_factor=3&min_insync_replicas=2",
            KafkaURL(("k1:9092", "k2:9093"), "baton.log_1", 3, 2),
        ),
        ("kafka://[::1]:9092/t?request_timeout_ms=5000", KafkaURL(("[::1]:9092",), "t", request_timeout_ms=5000)),
        (
            "kafka://k1:9093/t?security_protocol=SASL_SSL&sasl_mechanism=SCRAM-SHA-512"
            "&sasl_username=baton&ssl_cafile=/etc/baton/kafka-ca.pem",
            KafkaURL(("k1:9093",), "t", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                     sasl_username="baton", ssl_cafile="/etc/baton/kafka-ca.pem"),
        ),
        (
            "kafka://k1:9093/t?security_protocol=ssl&ssl_cafile=/a%2Bb/c%20d%26e.pem",
            KafkaURL(("k1:9093",), "t", security_protocol="SSL", ssl_cafile="/a+b/c d&e.pem"),
        ),
        (
            "kafka://k1:9092/t?security_protocol=SASL_PLAINTEXT&sasl_mechanism=scram-sha-256&sasl_username=u",
            KafkaURL(("k1:9092",), "t", security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                     sasl_username="u"),
        ),
        (
            "kafka://k1:9092/t?security_protocol=SASL_PLAINTEXT&sasl_mechanism=PLAIN&sasl_username=u"
            "&allow_plaintext_password=true",
            KafkaURL(("k1:9092",), "t", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                     sasl_username="u", allow_plaintext_password=True),
        ),
    ],
)
def test_kafka_url_parsing(url: str, expected: KafkaURL) -> None:
    parsed = parse_kafka_url(url)
    assert parsed == expected
    assert parse_kafka_url(str(parsed)) == parsed


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("kafka://127.0.0.1:9092", "names no topic"),
        ("kafka://127.0.0.1:9092/", "names no topic"),
        ("kafka:///t", "is not HOST:PORT"),
        ("kafka://127.0.0.1/t", "is not HOST:PORT"),
        ("kafka://127.0.0.1:x/t", "no valid port"),
        ("kafka://127.0.0.1:70000/t", "no valid port"),
        ("kafka://a:1,/t", "is not HOST:PORT"),
        ("kafka://a:1/t/u", "not a valid Kafka topic name"),
        ("kafka://a:1/t?replication_factor=0", "positive integer"),
        ("kafka://a:1/t?replication_factor=two", "positive integer"),
        ("kafka://a:1/t?replicas=3", "unknown parameter"),
        ("kafka://a:1/t?replication_factor=1&replication_factor=2", "given twice"),
        ("kafka://a:1/t?replication_factor=1&min_insync_replicas=2", "above"),
        ("kafka://a:1/t?request_timeout_ms=10", "at least 1000"),
        ("kafka://a:1/t?flag", "malformed query"),
        ("kafka://user@a:1/t", "user"),
        ("kafka://user:secret@a:1/t", "may not have a USER"),
        ("kafka:a:1/t", "not a Kafka log URL"),
        ("kafka://a:1/t?security_protocol=TLS", "unknown security_protocol 'TLS'"),
        ("kafka://a:1/t?security_protocol=SASL_SSL&sasl_mechanism=SCRAM-SHA-1&sasl_username=u",
         r"unknown sasl_mechanism 'SCRAM-SHA-1' .*\(known: SCRAM-SHA-512, SCRAM-SHA-256, PLAIN\)"),
        ("kafka://a:1/t?security_protocol=SASL_SSL&sasl_mechanism=GSSAPI&sasl_username=u", "unknown sasl_mechanism"),
        ("kafka://a:1/t?security_protocol=SASL_SSL&sasl_username=u", "SASL_SSL needs sasl_mechanism"),
        ("kafka://a:1/t?security_protocol=SASL_SSL&sasl_mechanism=PLAIN", "needs sasl_username"),
        ("kafka://a:1/t?security_protocol=SASL_SSL&sasl_mechanism=PLAIN&sasl_username=", "sasl_username is empty"),
        ("kafka://a:1/t?sasl_mechanism=PLAIN&sasl_username=u", "sasl_mechanism needs security_protocol=SASL_SSL"),
        ("kafka://a:1/t?security_protocol=SSL&sasl_username=u", "sasl_username needs security_protocol=SASL_SSL"),
        ("kafka://a:1/t?ssl_cafile=/ca.pem", "ssl_cafile needs security_protocol=SSL or SASL_SSL"),
        ("kafka://a:1/t?security_protocol=SASL_PLAINTEXT&sasl_mechanism=PLAIN&sasl_username=u",
         "would send the Kafka password in clear.*allow_plaintext_password=true"),
        ("kafka://a:1/t?security_protocol=SASL_SSL&sasl_mechanism=PLAIN&sasl_username=u&allow_plaintext_password=true",
         "allow_plaintext_password is only for"),
        ("kafka://a:1/t?security_protocol=SASL_PLAINTEXT&sasl_mechanism=PLAIN&sasl_username=u"
         "&allow_plaintext_password=yes", "must be true or false"),
        ("kafka://a:1/t?security_protocol=SASL_SSL&sasl_mechanism=PLAIN&sasl_username=u&password=pw",
         "may not carry a password.*--kafka-password-file FILE.*BATON_KAFKA_PASSWORD"),
        ("kafka://a:1/t?sasl_password=pw", "may not carry a password"),
    ],
)
def test_bad_kafka_urls_are_invalid(url: str, complaint: str) -> None:
    with pytest.raises(InvalidArgument, match=complaint):
        parse_kafka_url(url)


async def test_unreachable_kafka_is_unavailable_promptly() -> None:
    started = time.monotonic()
    with pytest.raises(LogUnavailable, match="127.0.0.1:1 unreachable"):
        await asyncio.wait_for(open_log("kafka://127.0.0.1:1/baton?request_timeout_ms=3000"), TIMEOUT)
    assert time.monotonic() - started < 10


@pytest.mark.slow
async def test_kafka_down_is_unavailable_and_back_is_usable(tmp_path: Path) -> None:
    """A Kafka of its own, stopped and restarted under an open log: errors are prompt, never hangs."""
    bootstrap = await asyncio.to_thread(start_kafka, tmp_path / "kafka")
    log = await open_log(f"kafka://{bootstrap}/down-and-back?request_timeout_ms=3000")
    try:
        assert await log.append([b"before"]) == 0
        seen: list[Record] = []
        reader = asyncio.create_task(collect(log, 0, 2, into=seen))  # one record, then Kafka dies
        await eventually(lambda: now(len(seen)), "the reader to read the record", until=lambda n: n == 1)
        await asyncio.to_thread(stop_kafka, tmp_path / "kafka")
        started = time.monotonic()
        with pytest.raises(LogUnavailable, match="Kafka at"):
            await asyncio.wait_for(log.append([b"lost?"]), TIMEOUT)
        with pytest.raises(LogUnavailable, match="Kafka at"):
            await asyncio.wait_for(log.end_offset(), TIMEOUT)
        with pytest.raises(LogUnavailable, match="Kafka at"):  # the idle reader notices, too
            await asyncio.wait_for(reader, TIMEOUT)
        assert time.monotonic() - started < TIMEOUT
        assert await asyncio.to_thread(start_kafka, tmp_path / "kafka") == bootstrap  # same data, same port
        # The append that failed had an unknown outcome: it may or may not be on the log.
        end = await asyncio.wait_for(log.end_offset(), TIMEOUT)
        assert end in (1, 2)
        assert await asyncio.wait_for(log.append([b"after"]), TIMEOUT) == end
        got = [r for _, r in await collect(log, 0, end + 1)]
        assert got[0] == b"before" and got[-1] == b"after"
    finally:
        await asyncio.wait_for(log.close(), TIMEOUT)
        await asyncio.to_thread(stop_kafka, tmp_path / "kafka")
