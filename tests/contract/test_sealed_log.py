"""The sealed log (batonmq.cluster.log.sealed) passes the log contract around the
memory and the file backends, and keeps what it seals unreadable to the backend."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from batonmq.cluster.log import Log, open_log
from batonmq.cluster.log.file import FileLog
from batonmq.cluster.log.memory import MemoryLog
from batonmq.cluster.log.sealed import KeyFile, SealedLog
from tests.contract.test_log import LogContract, kafka_topic


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
