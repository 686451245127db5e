"""The log set's conformance suite (docs/design.md §3): physical partitions 0..count-1,
each a complete log, that only grow. Every backend passes all of it.

A backend is one subclass of :class:`LogSetContract` saying how to open the set at a
place (``url``), whether it outlives ``close`` (``persistent``), whether other processes
can open it (``shared_across_processes``) and how to stall one partition's appends
(``stall``) where that means something.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import pytest

from batonmq.cluster.errors import InvalidArgument, LogUnavailable
from batonmq.cluster.log import MAX_PARTITIONS, LogSet, open_log, open_log_set
from batonmq.cluster.log.file import LOCK_FILE
from batonmq.cluster.log.file_set import partition_dir
from tests.contract.test_log import TIMEOUT, collect, dense, kafka_topic
from tests.kafka_fixture import REPO

# Run in another process: open the set at argv[1] and grow it one partition at a time up
# to argv[2], appending to each partition it learns of; prints the count it ends with.
_GROWER = """
import asyncio, json, sys
from batonmq.cluster.log import open_log_set

async def main():
    url, upto, who = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    logs = await open_log_set(url)
    try:
        for count in range(2, upto + 1):
            await logs.grow(count)
        for k in range(logs.count):
            await logs.partition(k).append([f"{who}:{k}".encode()])
        print(json.dumps(logs.count))
    finally:
        await logs.close()

asyncio.run(main())
"""


async def grow_in_another_process(url: str, upto: int, who: str) -> subprocess.Popen[str]:
    """Start a process growing the set at ``url`` (see ``_GROWER``)."""
    return subprocess.Popen(
        [sys.executable, "-c", _GROWER, url, str(upto), who],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


class LogSetContract:
    """The behaviour every log set backend must have. Subclasses provide ``url``."""

    persistent: ClassVar[bool] = False
    shared_across_processes: ClassVar[bool] = False

    def url(self, where: Path) -> str:
        """The URL of the set living at ``where``."""
        raise NotImplementedError

    async def open(self, where: Path, partitions: int | None = None) -> LogSet:
        return await open_log_set(self.url(where), partitions=partitions)

    @contextlib.asynccontextmanager
    async def stall(self, where: Path, k: int) -> AsyncIterator[None]:
        """Keep appends to partition ``k`` of the set at ``where`` from completing."""
        pytest.skip(self.no_stall)
        yield

    no_stall = "no way to stall one partition"

    @pytest.fixture
    async def sets(self) -> AsyncIterator[list[LogSet]]:
        """Sets opened by a test: closed after it."""
        opened: list[LogSet] = []
        yield opened
        for logs in opened:
            await logs.close()

    async def opened(self, sets: list[LogSet], where: Path, partitions: int | None = None) -> LogSet:
        logs = await self.open(where, partitions)
        sets.append(logs)
        return logs

    async def test_a_new_set_has_the_partitions_asked_for_each_empty(
        self, tmp_path: Path, sets: list[LogSet]
    ) -> None:
        logs = await self.opened(sets, tmp_path, 4)
        assert logs.count == 4
        for k in range(4):
            part = logs.partition(k)
            assert part.partition == k
            assert (await part.start_offset(), await part.end_offset()) == (0, 0)
        assert len({id(logs.partition(k)) for k in range(4)}) == 4

    async def test_by_default_a_set_has_one_partition_which_open_log_opens(
        self, tmp_path: Path, sets: list[LogSet]
    ) -> None:
        logs = await self.opened(sets, tmp_path)
        assert logs.count == 1
        assert await logs.partition(0).append([b"zero"]) == 0
        alone = await open_log(self.url(tmp_path))
        try:
            assert alone.url == logs.partition(0).url == logs.url
            assert dense(await collect(alone, 0, 1), 0) == [b"zero"]
            assert await alone.append([b"one"]) == 1
            assert dense(await collect(logs.partition(0), 0, 2), 0) == [b"zero", b"one"]
        finally:
            if alone is not logs.partition(0):  # memory:NAME: the very same log
                await alone.close()

    async def test_partitions_are_independent(self, tmp_path: Path, sets: list[LogSet]) -> None:
        logs = await self.opened(sets, tmp_path, 3)
        for k in (2, 0, 1):  # offsets of each start at 0, whatever was appended elsewhere
            assert await logs.partition(k).append([f"{k}-a".encode(), f"{k}-b".encode()]) == 0
        assert await logs.partition(1).append([b"1-c"]) == 2
        assert dense(await collect(logs.partition(0), 0, 2), 0) == [b"0-a", b"0-b"]
        assert dense(await collect(logs.partition(1), 0, 3), 0) == [b"1-a", b"1-b", b"1-c"]
        assert dense(await collect(logs.partition(2), 0, 2), 0) == [b"2-a", b"2-b"]
        assert [await logs.partition(k).end_offset() for k in range(3)] == [2, 3, 2]
        # Nothing more arrives at a partition's end from the others' appends.
        reader = asyncio.create_task(collect(logs.partition(2), 2, 1))
        await logs.partition(0).append([b"0-c"])
        await logs.partition(1).append([b"1-d"])
        await logs.partition(2).append([b"2-c"])
        assert await asyncio.wait_for(reader, TIMEOUT) == [(2, b"2-c")]

    async def test_grow_adds_partitions_and_keeps_the_records_of_the_old_ones(
        self, tmp_path: Path, sets: list[LogSet]
    ) -> None:
        logs = await self.opened(sets, tmp_path, 2)
        await logs.partition(0).append([b"p0"])
        await logs.partition(1).append([b"p1", b"p1'"])
        reader = asyncio.create_task(collect(logs.partition(1), 0, 3))  # tails across the growth
        assert await logs.grow(5) == 5 and logs.count == 5
        assert dense(await collect(logs.partition(0), 0, 1), 0) == [b"p0"]
        assert [await logs.partition(k).end_offset() for k in range(5)] == [1, 2, 0, 0, 0]
        assert await logs.partition(4).append([b"p4"]) == 0
        assert await logs.partition(1).append([b"p1''"]) == 2
        assert dense(await asyncio.wait_for(reader, TIMEOUT), 0) == [b"p1", b"p1'", b"p1''"]
        assert dense(await collect(logs.partition(4), 0, 1), 0) == [b"p4"]
        # Never removes, and growing to what is there already changes nothing.
        assert await logs.grow(3) == 5
        assert await logs.grow(5) == 5
        assert await logs.partition(4).end_offset() == 1

    async def test_reopen_gives_the_same_partitions_and_records(self, tmp_path: Path) -> None:
        if not self.persistent:
            pytest.skip("this backend keeps nothing after close")
        logs = await self.open(tmp_path, 2)
        await logs.grow(3)
        for k in range(3):
            await logs.partition(k).append([f"r{k}".encode()] * (k + 1))
        await logs.close()
        for asked in (None, 1, 7):  # an existing set opens as it is, whatever is asked
            logs = await self.open(tmp_path, asked)
            try:
                assert logs.count == 3
                for k in range(3):
                    assert dense(await collect(logs.partition(k), 0, k + 1), 0) == [f"r{k}".encode()] * (k + 1)
                    assert await logs.partition(k).end_offset() == k + 1
            finally:
                await logs.close()

    async def test_a_partition_out_of_range_is_a_clear_invalid_argument(
        self, tmp_path: Path, sets: list[LogSet]
    ) -> None:
        logs = await self.opened(sets, tmp_path, 3)
        for k in (3, 7, -1):
            with pytest.raises(InvalidArgument, match=rf"has 3 partition\(s\), 0\.\.2; there is no partition {k}"):
                logs.partition(k)
        for count in (0, -1, MAX_PARTITIONS + 1):
            with pytest.raises(InvalidArgument, match=rf"1\.\.{MAX_PARTITIONS} partitions"):
                await logs.grow(count)
        with pytest.raises(InvalidArgument, match="partitions"):
            await self.open(tmp_path / "other", 0)
        assert logs.count == 3

    async def test_a_closed_set_closes_its_partitions(self, tmp_path: Path) -> None:
        logs = await self.open(tmp_path, 2)
        part = logs.partition(1)
        await logs.close()
        with pytest.raises(LogUnavailable):
            await part.append([b"x"])
        with pytest.raises(LogUnavailable):
            logs.partition(0)
        with pytest.raises(LogUnavailable):
            await logs.grow(3)

    async def test_another_openers_growth_is_seen_on_refresh(
        self, tmp_path: Path, sets: list[LogSet]
    ) -> None:
        first = await self.opened(sets, tmp_path, 2)
        second = await self.opened(sets, tmp_path)
        assert second.count == 2
        assert await second.grow(4) == 4
        assert first.count == 2  # an object learns of growth when it asks
        assert await first.refresh() == 4
        await second.partition(3).append([b"from second"])
        assert dense(await collect(first.partition(3), 0, 1), 0) == [b"from second"]

    async def test_concurrent_growers_end_with_one_dense_set(
        self, tmp_path: Path, sets: list[LogSet]
    ) -> None:
        mine = await self.opened(sets, tmp_path)
        url = self.url(tmp_path)
        if self.shared_across_processes:
            procs = [await grow_in_another_process(url, upto, who) for upto, who in ((6, "a"), (5, "b"))]
            mine_grows = asyncio.create_task(self._grow_stepwise(mine, 4))
            outs = [await asyncio.to_thread(p.communicate, timeout=TIMEOUT * 3) for p in procs]
            await asyncio.wait_for(mine_grows, TIMEOUT)
            appended: dict[str, int] = {}  # who -> how many partitions it appended to
            for who, proc, (out, err) in zip("ab", procs, outs):
                assert proc.returncode == 0, err
                appended[who] = json.loads(out)
            assert appended["a"] == 6 and appended["b"] >= 5  # each sees at least what it grew to
        else:  # one process: two openers, each with its own view
            other = await self.opened(sets, tmp_path)
            await asyncio.wait_for(
                asyncio.gather(self._grow_stepwise(mine, 6), self._grow_stepwise(other, 5)), TIMEOUT
            )
            appended = {}
            for who, logs in (("a", mine), ("b", other)):
                appended[who] = logs.count
                for k in range(logs.count):
                    await logs.partition(k).append([f"{who}:{k}".encode()])
        assert await mine.refresh() == 6
        again = await self.opened(sets, tmp_path)
        assert again.count == 6
        for k in range(6):
            got = {r for _, r in await collect(again.partition(k), 0, sum(k < n for n in appended.values()))}
            assert got == {f"{who}:{k}".encode() for who, n in appended.items() if k < n}

    @staticmethod
    async def _grow_stepwise(logs: LogSet, upto: int) -> None:
        for count in range(2, upto + 1):
            await logs.grow(count)

    async def test_appends_to_a_partition_go_on_while_another_is_stalled(
        self, tmp_path: Path, sets: list[LogSet]
    ) -> None:
        logs = await self.opened(sets, tmp_path, 3)
        async with self.stall(tmp_path, 1):
            stuck = asyncio.create_task(logs.partition(1).append([b"waits"]))
            for i in range(20):  # each completes while partition 1's append waits
                assert await asyncio.wait_for(logs.partition(2).append([f"r{i}".encode()]), TIMEOUT) == i
                assert await asyncio.wait_for(logs.partition(0).append([f"r{i}".encode()]), TIMEOUT) == i
            assert not stuck.done()
        assert await asyncio.wait_for(stuck, TIMEOUT) == 0


class TestMemoryLogSet(LogSetContract):
    no_stall = "a memory log's append never waits (no lock, no disk): no partition can stall"

    def url(self, where: Path) -> str:
        return f"memory:set-{where.name}"

    async def test_partition_0_is_the_very_log_open_log_returns(self, tmp_path: Path, sets: list[LogSet]) -> None:
        logs = await self.opened(sets, tmp_path, 2)
        assert logs.partition(0) is await open_log(self.url(tmp_path))
        assert logs.partition(1).url == f"{self.url(tmp_path)}#partition=1"

    async def test_a_log_open_log_opened_is_a_set_of_one(self, tmp_path: Path, sets: list[LogSet]) -> None:
        alone = await open_log(self.url(tmp_path))
        await alone.append([b"before sets"])
        logs = await self.opened(sets, tmp_path, 3)  # exists: opens as it is
        assert logs.count == 1 and logs.partition(0) is alone


class TestFileLogSet(LogSetContract):
    persistent = True
    shared_across_processes = True

    def url(self, where: Path) -> str:
        return f"file:{where / 'log'}"

    @contextlib.asynccontextmanager
    async def stall(self, where: Path, k: int) -> AsyncIterator[None]:
        """Another process holds partition ``k``'s writers' lock (its ``flock``)."""
        lock = os.path.join(partition_dir(str(where / "log"), k), LOCK_FILE)
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import fcntl, os, sys\n"
             "fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "fcntl.flock(fd, fcntl.LOCK_EX)\n"
             "print('held', flush=True)\n"
             "sys.stdin.read()\n", lock],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert holder.stdin is not None and holder.stdout is not None
        try:
            assert await asyncio.to_thread(holder.stdout.readline) == "held\n"
            fd = os.open(lock, os.O_RDWR)  # the lock is really held: another taker is refused
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
            yield
        finally:
            holder.stdin.close()
            await asyncio.to_thread(holder.wait, TIMEOUT)
            holder.stdout.close()


class TestKafkaLogSet(LogSetContract):
    """On a real Kafka (tests/kafka_fixture.py): the set is one topic."""

    persistent = True
    shared_across_processes = True
    no_stall = (
        "one partition of the test's single Kafka broker cannot be stalled apart from the"
        " others (they share the broker); what the set owns per partition, its producer and"
        " writer, is checked by test_each_partition_has_its_own_producer"
    )
    bootstrap = ""

    @pytest.fixture(autouse=True)
    def _kafka(self, kafka_bootstrap: str) -> None:
        self.bootstrap = kafka_bootstrap

    def url(self, where: Path) -> str:
        return f"kafka://{self.bootstrap}/{kafka_topic(where)}"

    async def test_a_set_of_5_is_a_topic_of_5_partitions(self, tmp_path: Path, sets: list[LogSet]) -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        logs = await self.opened(sets, tmp_path, 5)
        for k in range(5):
            await logs.partition(k).append([f"to {k}".encode()] * (k + 1))
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            (described,) = await admin.describe_topics([kafka_topic(tmp_path)])
            assert sorted(p["partition"] for p in described["partitions"]) == [0, 1, 2, 3, 4]
            await logs.grow(7)
            (described,) = await admin.describe_topics([kafka_topic(tmp_path)])
            assert len(described["partitions"]) == 7
        finally:
            await admin.close()
        # Each record is in the Kafka partition of its number, never where a key would hash it.
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        try:
            for k in range(5):
                tp = TopicPartition(kafka_topic(tmp_path), k)
                assert (await consumer.end_offsets([tp]))[tp] == k + 1
        finally:
            await consumer.stop()

    async def test_each_partition_has_its_own_producer(self, tmp_path: Path, sets: list[LogSet]) -> None:
        from batonmq.cluster.log.kafka import KafkaLog

        logs = await self.opened(sets, tmp_path, 3)
        await asyncio.gather(*(logs.partition(k).append([b"x"]) for k in range(3)))
        parts = [logs.partition(k) for k in range(3)]
        assert all(isinstance(p, KafkaLog) for p in parts)
        # (A look inside, which only a test may take: the producers are private.)
        producers = {id(p._producer) for p in parts}  # type: ignore[attr-defined]
        assert len(producers) == 3 and None not in {p._producer for p in parts}  # type: ignore[attr-defined]
        # ... and one topic (admin client, offsets consumer) for them all.
        assert len({id(p._topic) for p in parts}) == 1  # type: ignore[attr-defined]
