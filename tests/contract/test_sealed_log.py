"""The sealed log (batonmq.cluster.log.sealed) passes the log contract around the
memory and the file backends (also on a data partition of a sealed log set), keeps what
it seals unreadable to the backend, and binds a record to its partition."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from batonmq.cluster.errors import LogUnavailable
from batonmq.cluster.log import UNOPENED, Log, LogSet, open_log, open_log_set
from batonmq.cluster.log.file import FileLog
from batonmq.cluster.log.memory import MemoryLog
from batonmq.cluster.log.sealed import KeyFile, SealedLog, SealedLogSet
from tests.contract.test_log import LogContract, OnDataPartition, collect, kafka_topic


def key_file(where: Path, secret: bytes = b"k" * 32, key_id: str = "k1") -> str:
    """A key file in ``where`` (kept when it exists: a reopened log finds the same keys)."""
    path = where / "keys.toml"
    if not path.exists():
        path.write_text(
            f'[[key]]\nid = "{key_id}"\nsecret = "{base64.b64encode(secret).decode()}"\n'
        )
    return str(path)


class TestSealedMemoryLog(LogContract):
    async def make(self, where: Path) -> Log:
        return SealedLog(MemoryLog(), KeyFile(key_file(where)))


class TestSealedFileLog(LogContract):
    persistent = True

    async def make(self, where: Path) -> Log:
        return SealedLog(await open_log(f"file:{where / 'log'}"), KeyFile(key_file(where)))


class TestSealedFileLogSmallSegments(LogContract):
    persistent = True

    async def make(self, where: Path) -> Log:
        inner = await FileLog.open(str(where / "log"), segment_bytes=4096)
        return SealedLog(inner, KeyFile(key_file(where)))


class TestSealedFileLogDataPartition(OnDataPartition, LogContract):
    persistent = True

    async def open_set(self, where: Path) -> LogSet:
        inner = await open_log_set(f"file:{where / 'log'}", partitions=self.PARTITIONS)
        return await SealedLogSet.wrap(inner, KeyFile(key_file(where)))


class TestSealedKafkaLog(LogContract):
    """Around a topic on a real Kafka broker (skipped where there is none)."""

    persistent = True
    bootstrap = ""

    @pytest.fixture(autouse=True)
    def _kafka(self, kafka_bootstrap: str) -> None:
        self.bootstrap = kafka_bootstrap

    async def make(self, where: Path) -> Log:
        inner = await open_log(f"kafka://{self.bootstrap}/{kafka_topic(where)}")
        return SealedLog(inner, KeyFile(key_file(where)))


async def test_segments_hold_no_plain_record(tmp_path: Path) -> None:
    log = SealedLog(await open_log(f"file:{tmp_path / 'log'}"), KeyFile(key_file(tmp_path)))
    body = b"a-very-recognisable-message-body"
    await log.append([body] * 10)
    await log.close()
    segments = list((tmp_path / "log").iterdir())
    assert segments
    for seg in segments:
        assert body not in seg.read_bytes()
        # Owner only: a log's files and directory are not readable by others.
        assert seg.stat().st_mode & 0o077 == 0
    assert (tmp_path / "log").stat().st_mode & 0o077 == 0


async def test_a_sealed_record_does_not_open_in_another_partition(tmp_path: Path) -> None:
    inner = await open_log_set("memory:", partitions=3)
    logs = await SealedLogSet.wrap(inner, KeyFile(key_file(tmp_path)))
    try:
        assert [logs.partition(k).partition for k in range(3)] == [0, 1, 2]
        for k in range(3):
            await logs.partition(k).append([f"for partition {k}".encode()])
        raw = {k: (await collect(inner.partition(k), 0, 1))[0][1] for k in range(3)}
        # Replayed raw into another partition, through the inner (unsealed) log: unopened.
        await inner.partition(1).append([raw[2]])
        await inner.partition(1).append([raw[0]])
        await inner.partition(0).append([raw[1]])
        # ... into its own partition it opens (duplicates are the applier's business).
        await inner.partition(2).append([raw[2]])
        assert [r for _, r in await collect(logs.partition(1), 0, 3)] == [b"for partition 1", UNOPENED, UNOPENED]
        assert [r for _, r in await collect(logs.partition(0), 0, 2)] == [b"for partition 0", UNOPENED]
        assert [r for _, r in await collect(logs.partition(2), 0, 2)] == [b"for partition 2"] * 2
        assert logs.partition(1).unopened == 2  # type: ignore[attr-defined]
        # The grown partitions are sealed with their own number as well.
        await logs.grow(4)
        await logs.partition(3).append([b"for partition 3"])
        await inner.partition(2).append([(await collect(inner.partition(3), 0, 1))[0][1]])
        assert (await collect(logs.partition(2), 2, 1))[0][1] == UNOPENED
    finally:
        await logs.close()
    with pytest.raises(LogUnavailable):
        inner.partition(0)  # the sealed set closed the inner one


async def test_partition_0_is_sealed_as_before_log_sets(tmp_path: Path) -> None:
    """Partition 0's associated data is what a lone sealed log's always was: salt, the
    context (the directory's name), the key id; records written before log sets open."""
    secret = b"s" * 32
    logs = await SealedLogSet.wrap(
        await open_log_set(f"file:{tmp_path / 'baton-log'}", partitions=2),
        KeyFile(key_file(tmp_path, secret, "old-key")),
    )
    try:
        await logs.partition(0).append([b"body-0"])
        await logs.partition(1).append([b"body-1"])
        raw0 = (await collect(logs.partition(0).inner, 0, 1))[0][1]  # type: ignore[attr-defined]
        raw1 = (await collect(logs.partition(1).inner, 0, 1))[0][1]  # type: ignore[attr-defined]
    finally:
        await logs.close()
    cipher = AESGCM(
        HKDF(algorithm=hashes.SHA256(), length=32, salt=b"baton-log-seal-v1", info=b"old-key").derive(secret)
    )
    head = len(b"\xc1S") + 2 + len(b"old-key")
    aad = b"baton-log-seal-v1\x00baton-log\x00old-key"
    assert cipher.decrypt(raw0[head : head + 12], raw0[head + 12 :], aad) == b"body-0"
    assert cipher.decrypt(raw1[head : head + 12], raw1[head + 12 :], aad + b"\x00partition=1") == b"body-1"
    # ... and the lone sealed log (today's brokers) opens partition 0's records.
    alone = SealedLog(await open_log(f"file:{tmp_path / 'baton-log'}"), KeyFile(key_file(tmp_path)))
    try:
        assert [r for _, r in await collect(alone, 0, 1)] == [b"body-0"]
    finally:
        await alone.close()
