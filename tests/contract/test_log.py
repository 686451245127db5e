"""The ordered log's conformance suite (DESIGN §3, §12): every backend passes all of it.

Adding a backend is one subclass of :class:`LogContract` that says how to open a fresh
log at a place (``make``) and whether its records outlive ``close`` (``persistent``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import ClassVar, cast

import pytest

from clients.errors import InvalidArgument, LogTruncated, LogUnavailable
from cluster.log import Log, Record, open_log
from cluster.log.file import FileLog
from cluster.log.memory import MemoryLog

TIMEOUT = 20.0


async def collect(log: Log, start: int, count: int, *, max_batch: int = 1024) -> list[Record]:
    """Read exactly ``count`` records from ``start`` (failing the test if they don't come)."""

    async def run() -> list[Record]:
        got: list[Record] = []
        reader = cast(AsyncGenerator[list[Record], None], log.read(start, max_batch=max_batch))
        async with contextlib.aclosing(reader):
            async for batch in reader:
                assert batch, "read yielded an empty batch"
                assert len(batch) <= max_batch
                got.extend(batch)
                if len(got) >= count:
                    break
        assert len(got) == count, f"read {len(got)} records, expected exactly {count}"
        return got

    return await asyncio.wait_for(run(), TIMEOUT)


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
        await asyncio.sleep(0.05)  # the reader is now waiting at the end
        assert not reader.done()
        await log.append([b"new-1"])
        await log.append([b"new-2", b"new-3"])
        assert dense(await asyncio.wait_for(reader, TIMEOUT), 1) == [b"new-1", b"new-2", b"new-3"]

    async def test_read_beyond_end_waits_for_that_offset(self, log: Log) -> None:
        reader = asyncio.create_task(collect(log, 2, 1))
        await asyncio.sleep(0.02)
        await log.append([b"zero", b"one"])
        await asyncio.sleep(0.02)
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
                    await asyncio.sleep(0)

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

        async def read_all() -> list[Record]:
            got: list[Record] = []
            async for batch in log.read(0):
                got.extend(batch)
            return got

        reader = asyncio.create_task(read_all())
        await asyncio.sleep(0.05)
        await log.close()
        assert await asyncio.wait_for(reader, TIMEOUT) == [(0, b"x")]

    async def test_cancelled_reader_leaves_the_log_usable(self, log: Log) -> None:
        await log.append([b"a"])
        reader = asyncio.create_task(collect(log, 0, 5))
        await asyncio.sleep(0.05)  # it has read one record and now waits at the end
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert await log.append([b"b"]) == 1
        assert dense(await collect(log, 0, 2), 0) == [b"a", b"b"]

    async def test_empty_batch_is_invalid(self, log: Log) -> None:
        with pytest.raises(InvalidArgument):
            await log.append([])
        assert await log.end_offset() == 0


class TestMemoryLog(LogContract):
    async def make(self, where: Path) -> Log:
        return MemoryLog()


class TestFileLog(LogContract):
    persistent = True

    async def make(self, where: Path) -> Log:
        return await open_log(f"file:{where / 'log'}")


class TestFileLogSmallSegments(LogContract):
    """Segments of 4 KiB, so every test above also crosses segment boundaries."""

    persistent = True

    async def make(self, where: Path) -> Log:
        return await FileLog.open(str(where / "log"), segment_bytes=4096)
