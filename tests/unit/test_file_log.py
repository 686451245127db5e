"""What only the file backend has: torn tails, corruption, several processes, segments, disk errors."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

import pytest

from batonmq.cluster.errors import LogCorrupt, LogTruncated, LogUnavailable
from batonmq.cluster.log import Log, Record
from batonmq.cluster.log import file as file_mod
from batonmq.cluster.log import filecheck
from batonmq.cluster.log.file import FileLog
from tests import helpers
from tests.helpers import eventually, now

TIMEOUT = 30.0
ROOT = Path(__file__).resolve().parents[2]
HEADER = struct.Struct(">IQI")


async def collect(log: Log, start: int, count: int, *, into: list[Record] | None = None) -> list[Record]:
    """Read exactly ``count`` records from ``start``."""
    return await helpers.collect(log, start, count, timeout=TIMEOUT, into=into)


def segments(path: Path) -> list[Path]:
    return sorted(path.glob("*.seg"))


def frame(offset: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), offset, zlib.crc32(payload)) + payload


async def filled(path: Path, count: int, **kw: Any) -> FileLog:
    log = await FileLog.open(str(path), **kw)
    await log.append([f"r{i}".encode() for i in range(count)])
    return log


async def test_layout_and_record_format(tmp_path: Path) -> None:
    log = await filled(tmp_path, 2)
    await log.close()
    assert (tmp_path / "LOCK").exists()
    assert [p.name for p in segments(tmp_path)] == ["00000000000000000000.seg"]
    assert segments(tmp_path)[0].read_bytes() == frame(0, b"r0") + frame(1, b"r1")


@pytest.mark.parametrize(
    "torn",
    [
        pytest.param(HEADER.pack(100, 10, 0) + b"x" * 10, id="incomplete-record"),
        pytest.param(HEADER.pack(3, 10, 12345) + b"abc", id="bad-crc-last-record"),
        pytest.param(b"\x00\x00\x00", id="partial-header"),
        pytest.param(HEADER.pack(0xFFFFFFFF, 10, 0) + frame(11, b"rest"), id="batch-in-progress"),
    ],
)
async def test_torn_tail_is_cut_on_open(tmp_path: Path, torn: bytes) -> None:
    await (await filled(tmp_path, 10)).close()
    seg = segments(tmp_path)[0]
    good = seg.stat().st_size
    with seg.open("ab") as f:
        f.write(torn)
    log = await FileLog.open(str(tmp_path))
    try:
        assert seg.stat().st_size == good
        assert await log.end_offset() == 10
        assert await log.append([b"next"]) == 10
        got = await collect(log, 0, 11)
        assert got[9:] == [(9, b"r9"), (10, b"next")]
    finally:
        await log.close()


async def test_torn_tail_written_by_another_process_is_cut_by_next_append(tmp_path: Path) -> None:
    log = await filled(tmp_path, 3)
    try:
        with segments(tmp_path)[0].open("ab") as f:  # a crashed writer's half record
            f.write(HEADER.pack(50, 3, 0) + b"half")
        assert await log.append([b"after crash"]) == 3
        assert await collect(log, 2, 2) == [(2, b"r2"), (3, b"after crash")]
    finally:
        await log.close()


async def test_corruption_in_the_middle_fails_open(tmp_path: Path) -> None:
    await (await filled(tmp_path, 10)).close()
    seg = segments(tmp_path)[0]
    data = bytearray(seg.read_bytes())
    data[len(frame(0, b"r0")) * 3 + HEADER.size] ^= 0xFF  # a payload byte of record 3
    seg.write_bytes(bytes(data))
    with pytest.raises(LogCorrupt, match=r"00000000000000000000\.seg.*offset 3"):
        await FileLog.open(str(tmp_path))


async def test_reader_reports_corruption_in_an_older_segment(tmp_path: Path) -> None:
    log = await filled(tmp_path, 1, segment_bytes=64)
    try:
        for i in range(1, 20):
            await log.append([f"r{i}".encode()])
        first = segments(tmp_path)[0]
        data = bytearray(first.read_bytes())
        assert len(data) > 2 * len(frame(0, b"r0"))
        data[-1] ^= 0xFF  # the last record of a segment that is not the last one
        first.write_bytes(bytes(data))
        with pytest.raises(LogCorrupt, match="offset"):
            await collect(log, 0, 20)
    finally:
        await log.close()


async def test_segments_roll_and_truncate_before(tmp_path: Path) -> None:
    log = await FileLog.open(str(tmp_path), segment_bytes=1024)
    try:
        for i in range(50):
            await log.append([bytes([i]) * 100, bytes([i]) * 50])
        segs = segments(tmp_path)
        assert len(segs) > 5
        for seg in segs:  # each segment is named by the offset of its first record
            _, offset, _ = HEADER.unpack_from(seg.read_bytes())
            assert seg.name == f"{offset:020d}.seg"
        got = await collect(log, 0, 100)
        assert [r for _, r in got[::2]] == [bytes([i]) * 100 for i in range(50)]

        bases = [int(p.stem) for p in segs]
        await log.truncate_before(45)
        start = await log.start_offset()
        assert start == max(b for b in bases if b <= 45) > 0
        assert [int(p.stem) for p in segments(tmp_path)] == [b for b in bases if b >= start]
        assert await collect(log, start, 100 - start) == got[start:]
        with pytest.raises(LogTruncated):
            await collect(log, start - 1, 1)

        await log.truncate_before(10**9)  # never removes the last segment
        assert [int(p.stem) for p in segments(tmp_path)] == [bases[-1]]
        assert await log.start_offset() == bases[-1]
        assert await log.end_offset() == 100
        assert await log.append([b"more"]) == 100
    finally:
        await log.close()


async def test_reader_in_a_truncated_segment_gets_truncated(tmp_path: Path) -> None:
    log = await FileLog.open(str(tmp_path), segment_bytes=200)
    try:
        for i in range(30):
            await log.append([bytes(60)])
        reader = cast(AsyncGenerator[list[Record], None], log.read(0, max_batch=1))
        async with contextlib.aclosing(reader):
            assert await asyncio.wait_for(reader.__anext__(), TIMEOUT) == [(0, bytes(60))]
            await log.truncate_before(29)  # the reader still holds segment 0 open: it may finish it
            with pytest.raises(LogTruncated):
                async with asyncio.timeout(TIMEOUT):
                    async for _ in reader:
                        pass
    finally:
        await log.close()


async def test_a_writer_whose_segment_was_truncated_away_appends_to_the_last_one(tmp_path: Path) -> None:
    """A broker paused while the others rolled and truncated the log past its last
    segment: its next append goes to the live last segment, not to the deleted file
    it still has open."""
    paused = await FileLog.open(str(tmp_path), segment_bytes=200)
    other = await FileLog.open(str(tmp_path), segment_bytes=200)
    try:
        assert await paused.append([b"first"]) == 0
        for _ in range(30):
            await other.append([bytes(60)])
        await other.truncate_before(25)
        assert int(segments(tmp_path)[0].stem) > 0  # the paused writer's segment is gone
        assert await paused.append([b"after"]) == 31
        assert await other.end_offset() == 32
        assert (await collect(other, 31, 1)) == [(31, b"after")]
    finally:
        await paused.close()
        await other.close()


async def test_concurrent_appends_share_one_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = await FileLog.open(str(tmp_path))
    syncs = 0
    real = file_mod._datasync

    def counting(fd: int) -> None:
        nonlocal syncs
        syncs += 1
        real(fd)

    monkeypatch.setattr(file_mod, "_datasync", counting)
    try:
        firsts = await asyncio.wait_for(
            asyncio.gather(*(log.append([f"{i}a".encode(), f"{i}b".encode()]) for i in range(50))), TIMEOUT
        )
        assert sorted(firsts) == list(range(0, 100, 2))
        assert syncs <= 2, f"50 concurrent appends took {syncs} fsyncs"
        got = dict(await collect(log, 0, 100))
        for i, first in enumerate(firsts):
            assert (got[first], got[first + 1]) == (f"{i}a".encode(), f"{i}b".encode())
    finally:
        await log.close()


@pytest.mark.parametrize("failing", ["_pwrite_all"])
async def test_disk_error_fails_the_batch_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    log = await filled(tmp_path, 5)
    seg = segments(tmp_path)[0]
    size = seg.stat().st_size
    real_write = file_mod._pwrite_all

    def full_disk_write(fd: int, data: bytes, pos: int) -> None:
        real_write(fd, data[: len(data) // 2], pos)  # part of it lands, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    def failing_sync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    try:
        monkeypatch.setattr(file_mod, failing, full_disk_write if failing == "_pwrite_all" else failing_sync)
        with pytest.raises(LogUnavailable) as caught:
            await log.append([b"lost-%d" % i * 100 for i in range(20)])
        assert isinstance(caught.value.__cause__, OSError)
        monkeypatch.undo()
        assert seg.stat().st_size == size
        assert await log.end_offset() == 5
        assert await log.append([b"later"]) == 5
        got = await collect(log, 0, 6)
        assert got[-2:] == [(4, b"r4"), (5, b"later")]
        assert await log.end_offset() == 6
    finally:
        await log.close()


async def test_a_failed_sync_reports_an_unknown_outcome_and_cuts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fsync comes after the unlock (a stopped writer must not stall the others):
    by then readers may have seen the batch and others may have appended after it, so
    a failed sync cuts nothing; the append fails with its outcome unknown (the node
    retries, appliers drop the duplicates) and the log stays whole and appendable."""
    log = await filled(tmp_path, 5)

    def failing_sync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    try:
        monkeypatch.setattr(file_mod, "_datasync", failing_sync)
        with pytest.raises(LogUnavailable, match="outcome unknown") as caught:
            await log.append([b"maybe-%d" % i for i in range(20)])
        assert isinstance(caught.value.__cause__, OSError)
        monkeypatch.undo()
        assert await log.end_offset() == 25
        assert await log.append([b"later"]) == 25
        got = await collect(log, 0, 26)
        assert got[4:6] == [(4, b"r4"), (5, b"maybe-0")] and got[-1] == (25, b"later")
    finally:
        await log.close()


CHILD = """
import asyncio, sys
from batonmq.cluster.log import filecheck
from batonmq.cluster.log.file import FileLog
from tests import helpers
from tests.helpers import eventually, now

async def main(path, name, count, batch):
    log = await FileLog.open(path, segment_bytes=int(sys.argv[5]))
    sent = 0
    while sent < count:
        n = min(batch, count - sent)
        await log.append([f"{name}:{sent + i}".encode() for i in range(n)])
        sent += n
    await log.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""


def spawn(path: Path, name: str, count: int, batch: int, segment_bytes: int = 64 << 20) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    args = [sys.executable, "-c", CHILD, str(path), name, str(count), str(batch), str(segment_bytes)]
    return subprocess.Popen(args, env=env, cwd=ROOT, stderr=subprocess.PIPE)


async def wait_ok(proc: subprocess.Popen[bytes]) -> None:
    try:
        _, err = await asyncio.wait_for(asyncio.to_thread(proc.communicate), TIMEOUT)
    finally:
        stop(proc)
    assert proc.returncode == 0, err.decode()


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


async def test_two_processes_append_to_one_log(tmp_path: Path) -> None:
    await (await FileLog.open(str(tmp_path))).close()
    procs = [spawn(tmp_path, "A", 2000, 7, 16 << 10), spawn(tmp_path, "B", 2000, 3, 16 << 10)]
    try:
        for proc in procs:
            await wait_ok(proc)
    finally:
        for proc in procs:
            stop(proc)
    assert len(segments(tmp_path)) > 1  # they also rolled segments under each other
    log = await FileLog.open(str(tmp_path))
    try:
        assert await log.end_offset() == 4000
        got = await collect(log, 0, 4000)
        assert [o for o, _ in got] == list(range(4000))
        for name in "AB":
            mine = [r for _, r in got if r.startswith(f"{name}:".encode())]
            assert mine == [f"{name}:{i}".encode() for i in range(2000)]
    finally:
        await log.close()


@pytest.mark.parametrize("watched", [True, False], ids=["watched", "polling"])
async def test_reader_sees_appends_of_another_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watched: bool
) -> None:
    """Woken by the directory watch, or (where there is no inotify) polling."""
    if not watched:
        monkeypatch.setattr(file_mod, "INotify", None)
    log = await filled(tmp_path, 2, poll_interval=0.01)
    try:
        seen: list[Record] = []
        reader = asyncio.create_task(collect(log, 0, 52, into=seen))
        # Once it has read the two records there, it waits at the end of the log.
        await eventually(lambda: now(len(seen)), "the reader at the end", until=lambda n: n == 2)
        # (watched while a reader runs: test_a_log_no_one_reads_here_is_not_watched)
        assert (log._watch is not None) == (watched and sys.platform == "linux")
        await wait_ok(spawn(tmp_path, "other", 50, 10))
        got = await asyncio.wait_for(reader, TIMEOUT)
        assert got[:2] == [(0, b"r0"), (1, b"r1")]
        assert got[2:] == [(2 + i, f"other:{i}".encode()) for i in range(50)]
        assert await log.end_offset() == 52  # the end reflects the other process too
        assert await log.append([b"mine"]) == 52
    finally:
        await log.close()


async def test_a_reader_is_woken_by_another_process_append_without_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Linux the directory watch wakes a reader at the tail when another process
    appends: with a poll interval and a safety-net tick far longer than the test's
    patience, the records still arrive at once."""
    monkeypatch.setattr(file_mod, "_WATCHED_POLL", 600.0)
    log = await filled(tmp_path, 1, poll_interval=600)
    try:
        seen: list[Record] = []
        reader = asyncio.create_task(collect(log, 0, 4, into=seen))
        await eventually(lambda: now(len(seen)), "the reader at the end", until=lambda n: n == 1)
        if log._watch is None:
            reader.cancel()
            pytest.skip("no inotify here: readers poll")
        await wait_ok(spawn(tmp_path, "other", 3, 1))
        got = await asyncio.wait_for(reader, 10)
        assert got[1:] == [(1 + i, f"other:{i}".encode()) for i in range(3)]
    finally:
        await log.close()


async def test_a_watch_that_lost_events_wakes_the_readers_to_look_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More directory changes than the kernel queues for the watch while the loop is
    busy: the watch reports an overflow; the readers are woken all the same, and the
    one at the tail lists the directory again (as after any doubt) before it waits."""
    monkeypatch.setattr(file_mod, "_WATCHED_POLL", 600.0)
    monkeypatch.setattr(file_mod, "_RELIST_S", 600.0)
    queued = Path("/proc/sys/fs/inotify/max_queued_events")
    limit = int(queued.read_text()) if queued.exists() else 0
    if not 0 < limit <= 100_000:
        pytest.skip("no inotify here, or a queue too long to overflow in a test")
    listings = 0
    list_bases = file_mod._list_bases

    def counted(path: str) -> list[int]:
        nonlocal listings
        if sys._getframe(1).f_code.co_name == "_read_step":
            listings += 1
        return list_bases(path)

    monkeypatch.setattr(file_mod, "_list_bases", counted)
    log = await filled(tmp_path, 1, poll_interval=600)
    try:
        seen: list[Record] = []
        reader = asyncio.create_task(collect(log, 0, 2, into=seen))
        await eventually(lambda: now(len(seen)), "the reader at the end", until=lambda n: n == 1)
        assert log._watch is not None
        # Once it has listed the directory (at its first wait with nothing new) it
        # would not again for a long while (_RELIST_S).
        log._wake()
        before = await eventually(lambda: now(listings), "the reader listed once", until=lambda n: n == 1)
        # Writes to two files by turns (the kernel merges only an event equal to the
        # last one queued), while the loop is held: the events pile up unread.
        fds = [os.open(tmp_path / f"x{i}", os.O_WRONLY | os.O_CREAT, 0o600) for i in (0, 1)]
        try:
            for i in range(limit + 100):
                os.pwrite(fds[i % 2], b"x", 0)
        finally:
            for fd in fds:
                os.close(fd)
        await eventually(lambda: now(log._overflowed), "the watch saw its overflow")
        await eventually(lambda: now(listings), "the reader listed again", until=lambda n: n > before)
        assert await log.append([b"after"]) == 1
        assert await asyncio.wait_for(reader, 10) == [(0, b"r0"), (1, b"after")]
    finally:
        await log.close()


async def test_a_watched_reader_at_the_tail_does_not_look_for_a_next_segment_each_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the tail, woken by the directory watch, a reader looks for the next segment
    file only after the watch saw a segment made or removed, and it still follows the
    log into each new segment (a segment truncated away under a reader:
    test_reader_in_a_truncated_segment_gets_truncated)."""
    monkeypatch.setattr(file_mod, "_RELIST_S", 600.0)
    looks = 0
    exists = os.path.exists

    def counted(path: str) -> bool:
        nonlocal looks
        if sys._getframe(1).f_code.co_name == "_read_step":
            looks += 1
        return exists(path)

    monkeypatch.setattr(file_mod.os.path, "exists", counted)
    log = await filled(tmp_path, 1, segment_bytes=2000, poll_interval=600)
    writer = await FileLog.open(str(tmp_path), segment_bytes=2000)  # another broker's appends
    try:
        if log._watch_dir(asyncio.get_running_loop()) is False:
            pytest.skip("no inotify here: readers poll and look each time")
        seen: list[Record] = []
        reader = asyncio.create_task(collect(log, 0, 61, into=seen))
        await eventually(lambda: now(len(seen)), "the reader at the end", until=lambda n: n == 1)
        before = looks
        for i in range(20):  # 20 small appends, each read at the tail
            await writer.append([b"x" * 10])
            await eventually(lambda: now(len(seen)), "the append read", until=lambda n, i=i: n == i + 2)
        assert looks - before <= 2, f"{looks - before} looks for a next segment in 20 steps"
        # Appends that fill segments: the reader follows each new one.
        for _ in range(40):
            await writer.append([b"y" * 200])
        await asyncio.wait_for(reader, TIMEOUT)
        assert [off for off, _ in seen] == list(range(61))
        assert len(segments(tmp_path)) > 2
    finally:
        await writer.close()
        await log.close()


def inotify_instances() -> int:
    """This process's open inotify instances (Linux; 0 elsewhere)."""
    fds = Path("/proc/self/fd")
    if not fds.exists():
        return 0
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # (one closed meanwhile)
            count += os.readlink(fd) == "anon_inode:inotify"
    return count


async def test_a_log_no_one_reads_here_is_not_watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory watch is held while a reader runs and dropped when the last one
    ends: a broker that stopped applying a data partition (another group's now) keeps
    its log open for appends but is no longer woken by each append of the brokers
    that apply it. A new reader watches again and is woken by another writer."""
    monkeypatch.setattr(file_mod, "_WATCHED_POLL", 600.0)  # only the watch wakes a reader
    log = await filled(tmp_path, 1, poll_interval=600)
    writer = await FileLog.open(str(tmp_path))  # another broker's appends
    try:
        before = inotify_instances()
        for start in (0, 1):
            seen: list[Record] = []
            reader = asyncio.create_task(collect(log, start, 2, into=seen))
            await eventually(lambda: now(len(seen)), "the reader at the end", until=lambda n: n == 1)
            if inotify_instances() == before:
                pytest.skip("no inotify here: readers poll")
            assert inotify_instances() == before + 1
            await writer.append([f"w{start}".encode()])
            await asyncio.wait_for(reader, 10)
            await eventually(lambda: now(inotify_instances()), "the watch dropped with its reader",
                             until=lambda n: n == before)
        assert await collect(log, 0, 3) == [(0, b"r0"), (1, b"w0"), (2, b"w1")]
    finally:
        await writer.close()
        await log.close()


async def test_a_writer_stuck_in_its_sync_does_not_hold_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers on one log directory (two brokers): while one is stuck syncing (a
    process stopped at the wrong moment), the other still appends."""
    import threading

    stuck = await FileLog.open(str(tmp_path))
    other = await FileLog.open(str(tmp_path))
    release = threading.Event()
    syncing = threading.Event()  # the stuck writer is in its sync
    real = file_mod._datasync
    stuck_fds: set[int] = set()

    def sync(fd: int) -> None:
        if fd in stuck_fds:
            syncing.set()
            release.wait(TIMEOUT)
        real(fd)

    try:
        monkeypatch.setattr(file_mod, "_datasync", sync)
        await stuck.append([b"warm-up"])
        stuck_fds.add(stuck._tail.fd)  # from now on its syncs hang
        pending = asyncio.ensure_future(stuck.append([b"stuck"]))
        assert await asyncio.to_thread(syncing.wait, TIMEOUT), "the append never synced"
        assert not pending.done()
        assert await asyncio.wait_for(other.append([b"other"]), 5) == 2
        release.set()
        assert await asyncio.wait_for(pending, TIMEOUT) == 1
        assert await collect(other, 0, 3) == [(0, b"warm-up"), (1, b"stuck"), (2, b"other")]
    finally:
        release.set()
        await stuck.close()
        await other.close()


# --- baton log verify / repair (cluster/log/filecheck.py) -----------------------------------


def damage_at(path: Path, offset: int, how: str) -> int:
    """Damage the frame of ``offset`` in the only segment: a payload byte (``payload``) or
    its length field (``header``). Returns the frame's byte position."""
    seg = segments(path)[0]
    data = bytearray(seg.read_bytes())
    pos = 0
    for _ in range(offset):
        pos += HEADER.size + HEADER.unpack_from(data, pos)[0]
    if how == "payload":
        data[pos + HEADER.size] ^= 0xFF
    else:
        data[pos : pos + 4] = struct.pack(">I", 0x00ABCDEF)  # a length that fits no frame
    seg.write_bytes(bytes(data))
    return pos


async def read_all(path: Path, count: int) -> list[Record]:
    log = await FileLog.open(str(path))
    try:
        return await collect(log, 0, count)
    finally:
        await log.close()


@pytest.mark.parametrize("how", ["payload", "header"])
async def test_verify_finds_a_corrupt_record_and_repair_keeps_every_other_one_in_order(
    tmp_path: Path, how: str
) -> None:
    await (await filled(tmp_path, 10)).close()
    original = segments(tmp_path)[0].read_bytes()
    pos = damage_at(tmp_path, 4, how)
    damaged = segments(tmp_path)[0].read_bytes()
    assert damaged != original

    found = filecheck.scan(str(tmp_path))
    assert not found.ok
    assert [(d.segment, d.byte, d.offset, d.records, d.kind) for d in found.damage] == [
        ("00000000000000000000.seg", pos, 4, 1, "corrupt")
    ]
    assert found.records == 9 and found.end == 10

    done = filecheck.repair(str(tmp_path))
    assert (done.rewritten, done.placeholders) == (["00000000000000000000.seg"], 1)
    # The original bytes are kept, as they were, beside the log.
    assert (tmp_path / "damaged" / "00000000000000000000.seg").read_bytes() == damaged
    assert filecheck.scan(str(tmp_path)).ok
    got = await read_all(tmp_path, 10)
    # Every intact record, in order, at its offset; the unreadable one is an empty
    # placeholder (applied as a malformed record, the same on every replica).
    assert got == [(i, f"r{i}".encode() if i != 4 else b"") for i in range(10)]
    log = await FileLog.open(str(tmp_path))
    try:
        assert await log.append([b"after repair"]) == 10
    finally:
        await log.close()


async def test_repair_cuts_a_torn_tail_and_keeps_its_bytes(tmp_path: Path) -> None:
    await (await filled(tmp_path, 5)).close()
    seg = segments(tmp_path)[0]
    good = seg.read_bytes()
    seg.write_bytes(good + HEADER.pack(100, 5, 0) + b"half a record")
    found = filecheck.scan(str(tmp_path))
    assert found.ok  # a torn tail was never confirmed: the next append cuts it anyway
    assert [(d.kind, d.offset, d.records) for d in found.damage] == [("torn-tail", 5, 0)]
    done = filecheck.repair(str(tmp_path))
    assert done.rewritten == [seg.name] and done.placeholders == 0
    assert seg.read_bytes() == good
    assert (tmp_path / "damaged" / seg.name).read_bytes().startswith(good)
    assert await read_all(tmp_path, 5) == [(i, f"r{i}".encode()) for i in range(5)]


async def test_verify_takes_a_batch_being_written_for_the_tail(tmp_path: Path) -> None:
    await (await filled(tmp_path, 3)).close()
    seg = segments(tmp_path)[0]
    with seg.open("ab") as f:  # a writer between its two header writes
        f.write(HEADER.pack(0xFFFFFFFF, 3, 0) + b"r3" + frame(4, b"r4"))
    found = filecheck.scan(str(tmp_path))
    assert found.ok and [(d.kind, d.offset, d.records) for d in found.damage] == [
        ("torn-tail", 3, 0)
    ]


async def test_repair_of_a_bad_end_of_an_older_segment_fills_the_gap(tmp_path: Path) -> None:
    log = await filled(tmp_path, 1, segment_bytes=64)
    try:
        for i in range(1, 20):
            await log.append([f"r{i}".encode()])
    finally:
        await log.close()
    first = segments(tmp_path)[0]
    data = bytearray(first.read_bytes())
    records = 0
    pos = 0
    while pos < len(data):
        pos += HEADER.size + HEADER.unpack_from(data, pos)[0]
        records += 1
    data[-1] ^= 0xFF  # the last record of a segment that is not the last one
    first.write_bytes(bytes(data))
    found = filecheck.scan(str(tmp_path))
    # The bad frame is dropped, and the offset it held is missing before the next segment.
    assert [(d.kind, d.offset, d.records) for d in found.damage] == [
        ("trailing-garbage", records - 1, 0), ("gap", records - 1, 1)
    ]
    filecheck.repair(str(tmp_path))
    assert filecheck.scan(str(tmp_path)).ok
    got = await read_all(tmp_path, 20)
    assert got == [(i, f"r{i}".encode() if i != records - 1 else b"") for i in range(20)]


async def test_repair_refuses_while_a_broker_has_the_log_open(tmp_path: Path) -> None:
    log = await filled(tmp_path, 5)
    try:
        damage_at(tmp_path, 2, "payload")
        before = segments(tmp_path)[0].read_bytes()
        with pytest.raises(LogUnavailable, match="stop every broker"):
            filecheck.repair(str(tmp_path))
        assert segments(tmp_path)[0].read_bytes() == before  # untouched
        assert not (tmp_path / "damaged").exists()
        assert not filecheck.scan(str(tmp_path)).ok  # verify runs beside a broker
    finally:
        await log.close()
    assert filecheck.repair(str(tmp_path)).placeholders == 1  # closed: allowed


def test_baton_log_verify_and_repair_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from batonmq.broker.cli import main

    async def fill() -> None:
        await (await filled(tmp_path / "log", 8)).close()

    asyncio.run(fill())
    assert main(["log", "verify", "--data-dir", str(tmp_path)]) == 0
    assert "ok: every record is readable" in capsys.readouterr().out
    damage_at(tmp_path / "log", 3, "payload")
    assert main(["log", "verify", "--log", f"file:{tmp_path / 'log'}"]) == 1
    out = capsys.readouterr().out
    assert "BAD: 00000000000000000000.seg byte" in out and "offset 3 unreadable" in out
    assert main(["log", "repair", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "repaired 1 segment(s)" in out and "damaged" in out
    assert main(["log", "verify", "--data-dir", str(tmp_path)]) == 0
    assert main(["log", "verify", "--log", "kafka://h:1/t"]) == 1  # a clear error, no traceback
    assert "file: log" in capsys.readouterr().err


async def test_a_long_scan_reports_its_progress(tmp_path: Path) -> None:
    import io

    from batonmq.broker.logtool import _ProgressLine

    log = await filled(tmp_path, 1, segment_bytes=64)
    try:
        for i in range(1, 30):
            await log.append([f"r{i}".encode()])
    finally:
        await log.close()
    seen: list[tuple[int, int, int, int]] = []
    found = filecheck.scan(str(tmp_path), lambda *a: seen.append(a))
    n = len(segments(tmp_path))
    assert n > 3 and found.ok and found.records == 30
    assert [s[0] for s in seen] == list(range(1, n + 1))  # once per segment, in order
    assert seen[-1][2] == seen[-1][3] == sum(p.stat().st_size for p in segments(tmp_path))
    out = io.StringIO()
    line = _ProgressLine(out)
    line(n, n, 2 << 20, 2 << 20)
    line.end()
    assert f"\rscanning segment {n}/{n}, 2/2 MiB (100%)" in out.getvalue()
