"""What only the file log set has: its layout on disk (partition 0 is the log directory, partition K
is ``partition-K/``), growth that a crash cannot leave half done, and ``baton log verify`` /
``repair`` over every partition (docs/design.md §3, docs/operations.md)."""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

import pytest

from batonmq.cluster.errors import LogCorrupt, LogUnavailable
from batonmq.cluster.log import open_log, open_log_set
from batonmq.cluster.log import filecheck
from batonmq.cluster.log.file import FileLog
from tests.unit.test_file_log import collect, damage_at, frame, segments


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


async def test_an_existing_log_is_partition_0_of_a_set_of_one_with_nothing_changed(tmp_path: Path) -> None:
    log = await open_log(f"file:{tmp_path}")
    await log.append([b"a", b"b"])
    await log.close()
    before = listing(tmp_path)
    logs = await open_log_set(f"file:{tmp_path}", partitions=4)  # exists: opens as it is
    try:
        assert logs.count == 1
        assert [r for _, r in await collect(logs.partition(0), 0, 2)] == [b"a", b"b"]
    finally:
        await logs.close()
    assert listing(tmp_path) == before


async def test_layout_each_partition_is_a_log_directory_of_its_own(tmp_path: Path) -> None:
    logs = await open_log_set(f"file:{tmp_path}", partitions=3)
    try:
        await logs.partition(0).append([b"zero"])
        await logs.partition(2).append([b"two"])
    finally:
        await logs.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["partition-1", "partition-2"]
    assert segments(tmp_path)[0].read_bytes() == frame(0, b"zero")
    assert segments(tmp_path / "partition-2")[0].read_bytes() == frame(0, b"two")
    assert segments(tmp_path / "partition-1")[0].read_bytes() == b""
    for part in ("partition-1", "partition-2"):
        assert {"LOCK", "HOLD"} <= {p.name for p in (tmp_path / part).iterdir()}
        assert (tmp_path / part).stat().st_mode & 0o077 == 0  # owner only, like the log
    # Each partition is a log on its own, too.
    alone = await FileLog.open(str(tmp_path / "partition-2"))
    try:
        assert [r for _, r in await collect(alone, 0, 1)] == [b"two"]
    finally:
        await alone.close()


async def test_a_growth_that_crashed_half_way_leaves_a_set_that_opens_rightly(tmp_path: Path) -> None:
    logs = await open_log_set(f"file:{tmp_path}", partitions=2)
    await logs.close()
    # A grower died while it built partition 2: its directory never got the final name.
    half = tmp_path / "partition-2.new-4242-0badcafe"
    half.mkdir()
    (half / "00000000000000000000.seg").write_bytes(b"")
    logs = await open_log_set(f"file:{tmp_path}")
    try:
        assert logs.count == 2
        assert await logs.grow(3) == 3
        assert not half.exists()  # the next grower cleared it
        assert await logs.partition(2).append([b"x"]) == 0
    finally:
        await logs.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["partition-1", "partition-2"]


async def test_a_creation_that_crashed_before_partition_0_is_still_a_new_set(tmp_path: Path) -> None:
    # Partition 0's first segment is made last: a set without it was never opened.
    (tmp_path / "partition-1").mkdir()
    (tmp_path / "partition-1" / "00000000000000000000.seg").write_bytes(b"")
    logs = await open_log_set(f"file:{tmp_path}", partitions=3)
    try:
        assert logs.count == 3
    finally:
        await logs.close()


async def test_a_partition_missing_between_others_is_corruption(tmp_path: Path) -> None:
    await (await open_log_set(f"file:{tmp_path}", partitions=4)).close()
    (tmp_path / "partition-2" / "00000000000000000000.seg").unlink()
    for name in os.listdir(tmp_path / "partition-2"):
        os.unlink(tmp_path / "partition-2" / name)
    (tmp_path / "partition-2").rmdir()
    with pytest.raises(LogCorrupt, match="partition-2 is missing but partition-3 exist"):
        await open_log_set(f"file:{tmp_path}")


async def test_partition_0_truncation_and_readers_leave_the_partition_directories_alone(tmp_path: Path) -> None:
    logs = await open_log_set(f"file:{tmp_path}?segment_bytes=64", partitions=2)
    try:
        zero, one = logs.partition(0), logs.partition(1)
        await one.append([b"kept"])
        reader = asyncio.create_task(collect(zero, 0, 21))  # tails partition 0 across the growth
        for i in range(10):
            await zero.append([f"r{i}".encode() * 10])
        await logs.grow(4)  # new directories in partition 0's (watched) directory
        for i in range(10, 21):
            await zero.append([f"r{i}".encode() * 10])
        assert [r for _, r in await asyncio.wait_for(reader, 30)][-1] == b"r20" * 10
        await zero.truncate_before(15)
        assert await zero.start_offset() > 0
        assert [p.name for p in sorted(tmp_path.iterdir()) if p.is_dir()] == [
            "partition-1", "partition-2", "partition-3"
        ]
        assert [r for _, r in await collect(one, 0, 1)] == [b"kept"]
        assert await zero.end_offset() == 21
    finally:
        await logs.close()


async def test_verify_and_repair_cover_every_partition_and_name_the_damaged_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from batonmq.broker.cli import main

    logs = await open_log_set(f"file:{tmp_path / 'log'}", partitions=3)
    try:
        for k in range(3):
            await logs.partition(k).append([f"p{k}-{i}".encode() for i in range(8)])
    finally:
        await logs.close()
    damage_at(tmp_path / "log" / "partition-2", 3, "payload")
    # Repair holds every partition before it changes any: one open partition stops it all.
    damage_at(tmp_path / "log", 5, "payload")
    damaged = segments(tmp_path / "log")[0].read_bytes()
    held = os.open(tmp_path / "log" / "partition-2" / "HOLD", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_SH)  # as an open FileLog of partition 2 holds it
    try:
        with pytest.raises(LogUnavailable, match="partition-2 is open in a running broker"):
            filecheck.repair_set(str(tmp_path / "log"))
    finally:
        os.close(held)
    assert segments(tmp_path / "log")[0].read_bytes() == damaged
    assert filecheck.repair(str(tmp_path / "log")).placeholders == 1  # partition 0 alone
    reports = filecheck.scan_set(str(tmp_path / "log"))
    assert [r.ok for r in reports] == [True, True, False]

    assert await asyncio.to_thread(main, ["log", "verify", "--data-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"partition 2: {tmp_path / 'log' / 'partition-2'}: 1 segments, 7 valid records" in out
    assert "BAD: partition 2: 00000000000000000000.seg byte" in out and "offset 3 unreadable" in out
    assert "DAMAGED: 1 unreadable record(s) in partition(s) 2" in out
    assert "BAD: partition 0" not in out and "BAD: partition 1" not in out

    assert await asyncio.to_thread(main, ["log", "repair", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "partition 2: repaired 1 segment(s)" in out
    assert str(tmp_path / "log" / "partition-2" / "damaged") in out
    assert await asyncio.to_thread(main, ["log", "verify", "--data-dir", str(tmp_path)]) == 0
    assert "ok: every record is readable" in capsys.readouterr().out
    assert not (tmp_path / "log" / "partition-1" / "damaged").exists()  # sound: untouched
