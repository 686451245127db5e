"""The file backend: segment files in one directory, shared by the processes of one host.

Layout of directory PATH:

* ``<base offset, 20 digits>.seg`` — segments; the name is the offset of the segment's
  first record, so a reader finds an offset's segment from a directory listing alone.
* ``LOCK`` — every writer (in any process) holds ``flock(LOCK_EX)`` on it while it writes
  an append batch, so batches never interleave and offsets stay dense; the fsync that
  makes the batch durable comes after the unlock (a stopped writer must not stall the
  others for longer than a write).
* Readers never lock: a reader at the end of the log waits until the directory changes
  (an inotify watch on Linux, which sees every process's writes, held only while a
  reader runs in this process; elsewhere it polls),
  then reads on with one ``pread``; it lists the directory only now and then (to notice
  truncation or damage), never on every step.
* ``partition-K/``, ``GROW`` — the other partitions of the log set this directory is
  partition 0 of, and their growers' lock (``cluster/log/file_set.py``). A log lists only
  ``*.seg`` names, so it neither reads nor deletes them.
* ``HOLD`` — every open :class:`FileLog` holds ``flock(LOCK_SH)`` on it until it closes
  (the kernel drops it when a process dies), so that ``baton log repair``
  (``cluster/log/filecheck.py``), which takes it exclusively, never rewrites a segment
  under a running broker; a log opened while a repair runs waits for it.

A segment is a run of frames: header ``>IQI`` = (payload length, offset, crc32(payload)),
then the payload. Carrying the offset in each frame lets a scan tell a stale or foreign
frame from the one it expects without any index.

A batch is written in two steps: first with its first header's length set to
``_PENDING`` (an impossible length), then the real header. Until the second step no
frame of the batch is reachable, so readers (which never lock) cannot see half a batch,
and a process killed mid-write leaves a tail that is recognisably torn. Writers cut a
torn tail (incomplete frame, pending marker, or a bad last frame) before appending; a
bad frame *followed by a valid one* is corruption and is reported, never skipped:
``baton log verify`` finds it and ``baton log repair`` replaces it by a placeholder.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import errno
import fcntl
import logging
import os
import struct
import time
import zlib
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from batonmq.cluster.errors import InvalidArgument, LogCorrupt, LogTruncated, LogUnavailable
from batonmq.cluster.log.base import Log, Record

__all__ = ["FileLog", "LOCK_FILE", "HOLD_FILE"]

#: The writers' lock file, and the file every open log holds a shared lock on.
LOCK_FILE = "LOCK"
HOLD_FILE = "HOLD"

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

_HEADER = struct.Struct(">IQI")
_HDR = _HEADER.size
_PENDING = 0xFFFFFFFF  # first header's length while its batch is still being written
_PENDING_MARK = _PENDING.to_bytes(4, "big")
_MAX_FRAME = 1 << 30  # larger lengths are garbage; keeps a bad header from causing a huge read
_SUFFIX = ".seg"
_CHUNK = 1 << 20  # read size: one pread per ~1 MiB, never a syscall per record
_GROUP_BYTES = 16 << 20  # one group commit takes queued batches up to about this size
_CONFIRM = 3  # polls in a row a reader must see an anomaly before calling it corruption
_RELIST_S = 1.0  # a reader at the tail lists the directory (truncation, damage) at most this often
_WATCHED_POLL = 0.1  # a reader woken by the directory watch still looks this often (a safety net)

# _parse / _Cursor.advance outcomes
_LIMIT, _SHORT, _INVALID, _END = range(4)
# reader step outcomes
_MORE, _TAIL, _SUSPECT = range(3)

_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


def _pwrite_all(fd: int, data: bytes, pos: int) -> None:
    """Write all of ``data`` at ``pos`` (pwrite may write less). Tests replace this to fill the disk."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        if n <= 0:
            raise OSError(errno.ENOSPC, "short write")
        view, pos = view[n:], pos + n


# inotify(7) (Linux; the inotify_simple package): the kernel tells a log's readers when
# any process writes to, creates or removes a file in its directory, so that they need
# not poll it. Elsewhere, or when the kernel refuses another instance, readers poll.
try:
    from inotify_simple import INotify, flags as _in
except ImportError:  # pragma: no cover - a platform without it
    INotify = None

_WATCH_MASK = (_in.MODIFY | _in.MOVED_TO | _in.CREATE | _in.DELETE) if INotify is not None else 0
# Events that change which segments exist (a lost event may have been one).
_ENTRY_CHANGES = (_in.MOVED_TO | _in.CREATE | _in.DELETE | _in.Q_OVERFLOW) if INotify is not None else 0


def _inotify(path: str) -> INotify | None:
    """A non-blocking inotify instance watching directory ``path``; None if there is none."""
    if INotify is None:
        return None
    try:
        watch = INotify(nonblocking=True)
    except (OSError, AttributeError) as exc:  # AttributeError: a libc without inotify
        _log.info("%s: no inotify instance (%s): readers poll", path, exc)
        return None
    try:
        watch.add_watch(path, _WATCH_MASK)
    except OSError as exc:
        _log.info("%s: cannot watch (%s): readers poll", path, exc)
        watch.close()
        return None
    return watch


def _seg_name(base: int) -> str:
    return f"{base:020d}{_SUFFIX}"


def _list_bases(path: str) -> list[int]:
    names = (n[: -len(_SUFFIX)] for n in os.listdir(path) if n.endswith(_SUFFIX))
    return sorted(int(n) for n in names if n.isdigit())


def _sync_dir(path: str) -> None:
    """Make a created or removed directory entry durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parse(
    buf: bytes, at: int, offset: int, limit: int, out: list[Record] | None, skip_below: int
) -> tuple[int, int, int, int, int]:
    """Walk valid frames in ``buf`` from byte ``at``, expecting ``offset`` first.

    Records at or above ``skip_below`` go to ``out`` (or are only checked when ``out`` is
    None); below it only headers are checked. Stops after ``limit`` counted records.
    Returns (byte position, next offset, records counted, outcome, bytes the frame at the
    position needs when the outcome is _SHORT).
    """
    end = len(buf)
    view = memoryview(buf)
    unpack = _HEADER.unpack_from
    crc32 = zlib.crc32
    n = 0
    while n < limit:
        if end - at < _HDR:
            return at, offset, n, _SHORT, _HDR
        length, off, crc = unpack(buf, at)
        if off != offset or length > _MAX_FRAME:
            return at, offset, n, _INVALID, 0
        stop = at + _HDR + length
        if stop > end:
            return at, offset, n, _SHORT, _HDR + length
        if offset >= skip_below:
            if out is None:
                if crc32(view[at + _HDR : stop]) != crc:
                    return at, offset, n, _INVALID, 0
            else:
                payload = buf[at + _HDR : stop]
                if crc32(payload) != crc:
                    return at, offset, n, _INVALID, 0
                out.append((offset, payload))
            n += 1
        at, offset = stop, offset + 1
    return at, offset, n, _LIMIT, 0


class _Cursor:
    """A position (byte and offset) in one open segment file, reading ahead in chunks."""

    def __init__(self, fd: int, base: int) -> None:
        self.fd, self.base, self.pos, self.next = fd, base, 0, base
        self.buf, self.buf_pos = b"", 0
        self.listed = 0.0  # when a reader last listed the directory at this cursor's end
        # The log's count of segment entries made or removed (FileLog._entries) when a
        # reader last found no segment after this one; -1: not looked since the switch.
        self.entries = -1

    def advance(self, limit: int, out: list[Record] | None, skip_below: int = 0) -> int:
        """Parse forward; returns _LIMIT, _INVALID (bad frame at pos) or _END (no whole frame left)."""
        got, fresh = 0, False
        while True:
            at, self.next, n, status, need = _parse(
                self.buf, self.pos - self.buf_pos, self.next, limit - got, out, skip_below
            )
            self.pos, got = self.buf_pos + at, got + n
            if status == _LIMIT or (status == _INVALID and fresh):
                return status
            # Out of buffered bytes, or a bad frame in a buffer read earlier: the file may
            # have changed since (a batch finished, a torn tail was cut), so read it again.
            need = max(need, _HDR)
            self.buf, self.buf_pos = os.pread(self.fd, max(_CHUNK, need), self.pos), self.pos
            fresh = True
            if len(self.buf) < need:
                return _END

    def seek(self, pos: int, offset: int) -> None:
        """Move to a known frame boundary, dropping read-ahead."""
        self.pos, self.next, self.buf, self.buf_pos = pos, offset, b"", pos

    def switch(self, fd: int, base: int) -> None:
        """Move to the start of another segment (closing this one's file)."""
        self.close()
        self.fd, self.base = fd, base
        self.entries = -1
        self.seek(0, base)

    def followed_by_valid(self) -> bool:
        """Whether the bad frame at pos is followed by the next valid record (corruption, not a torn tail)."""
        head = os.pread(self.fd, _HDR, self.pos)
        if len(head) < _HDR:
            return False
        length = _HEADER.unpack(head)[0]
        if length > _MAX_FRAME:
            return False
        probe = _Cursor(self.fd, self.next + 1)
        probe.pos = self.pos + _HDR + length
        return probe.advance(1, None) == _LIMIT

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class FileLog(Log):
    """Segment files in one directory; see the module docstring for the format and protocol."""

    def __init__(self, path: str, segment_bytes: int, max_record: int, poll_interval: float) -> None:
        self.url = f"file:{path}"
        self._dir = path
        self._segment_bytes = segment_bytes
        self._max_record = max_record
        self.max_record = max_record
        self._poll = poll_interval
        # Writer side: touched only by jobs on this one-thread executor, so never concurrently.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="baton-filelog")
        self._lock_fd = -1
        self._hold_fd = -1
        self._tail = _Cursor(-1, -1)  # the last segment; pos/next = end of its valid prefix
        # Event-loop side.
        self._queue: deque[tuple[Sequence[bytes], asyncio.Future[int]]] = deque()
        self._writer: asyncio.Task[None] | None = None
        self._grown = asyncio.Event()  # replaced on every commit; set wakes local readers
        self._closed = False
        # The directory watch (inotify) that wakes readers on any process's append,
        # and the loop it is on; _unwatchable: there is none to be had, readers poll.
        self._watch: INotify | None = None
        self._unwatchable = False
        self._watch_loop: asyncio.AbstractEventLoop | None = None
        self._tick: asyncio.TimerHandle | None = None
        # Readers running now: the watch lives only while there is one, so that a log
        # this process no longer reads (a data partition of other brokers' groups, still
        # open for appends) is not woken by every append of the brokers that do.
        self._readers = 0
        # When the watch last lost events (its queue overflowed): readers list the
        # directory afresh on their next step, as after any doubt.
        self._overflowed = 0.0
        # Segment files the watch saw made, renamed in or removed (and overflows): a
        # reader on the watch's loop that found no next segment since this last moved
        # need not look again (no exists() or fstat() per step at the tail).
        self._entries = 0

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        segment_bytes: int = 64 << 20,
        max_record: int = 64 << 20,
        poll_interval: float = 0.005,
    ) -> FileLog:
        """Open (creating if needed) the log in directory ``path`` and repair a torn tail.

        Raises:
            InvalidArgument: a setting out of range.
            LogUnavailable: the directory cannot be created or opened.
            LogCorrupt: the last segment is damaged other than at its tail.
        """
        if segment_bytes < 1 or not 0 < max_record <= _MAX_FRAME or poll_interval <= 0:
            raise InvalidArgument("segment_bytes, max_record and poll_interval must be positive")
        log = cls(path, segment_bytes, max_record, poll_interval)
        try:
            await log._call(log._open_files)
        except BaseException:
            await log.close()
            raise
        return log

    # ---- event-loop side -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogUnavailable(f"log {self.url} is closed")

    async def append(self, records: Sequence[bytes]) -> int:
        self._check_open()
        if not records:
            raise InvalidArgument("append needs at least one record")
        records = [bytes(r) for r in records]  # no copy for bytes; freezes mutable buffers
        if any(len(r) > self._max_record for r in records):
            raise InvalidArgument(f"a record is larger than the log's max of {self._max_record} bytes")
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((records, fut))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_loop())
        return await fut

    async def _write_loop(self) -> None:
        """The single writer: each turn commits everything queued so far with one fsync."""
        while self._queue and not self._closed:
            group: list[tuple[Sequence[bytes], asyncio.Future[int]]] = []
            size = 0
            while self._queue and (not group or size < _GROUP_BYTES):
                records, fut = self._queue.popleft()
                if not fut.done():  # the caller may have been cancelled meanwhile
                    group.append((records, fut))
                    size += sum(map(len, records))
            if not group:
                continue
            try:
                firsts = await self._call(self._commit, [records for records, _ in group])
            except Exception as exc:
                for _, fut in group:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), first in zip(group, firsts):
                if not fut.done():
                    fut.set_result(first)
            if self._watch is None:
                # Watched, the readers were woken by the batch's write already (before
                # its sync); a wake now would only make them look again for nothing.
                self._wake()

    def _wake(self) -> None:
        event, self._grown = self._grown, asyncio.Event()
        event.set()

    def _watch_dir(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Start watching the directory for the readers (once); False: they must poll."""
        if self._watch is not None:
            return self._watch_loop is loop
        if self._unwatchable or self._closed:
            return False
        watch = _inotify(self._dir)
        if watch is None:
            self._unwatchable = True
            return False
        loop.add_reader(watch.fileno(), self._watched)
        self._watch, self._watch_loop = watch, loop
        self._tick = loop.call_later(_WATCHED_POLL, self._safety_tick)
        return True

    def _safety_tick(self) -> None:
        """Readers look again now and then even when watched (a safety net)."""
        if self._watch is not None and self._watch_loop is not None:
            self._tick = self._watch_loop.call_later(_WATCHED_POLL, self._safety_tick)
        self._wake()

    def _watched(self) -> None:
        """The directory changed: drop the events (which file does not matter) and wake
        the readers; each reads on from where it is, to whatever end it finds."""
        if self._watch is None:
            return
        try:
            events = self._watch.read(timeout=0)
        except OSError as exc:  # not expected: the readers poll from now on
            _log.warning("%s: directory watch failed, readers poll: %s", self._dir, exc)
            self._unwatch()
            self._unwatchable = True
            events = []
        if any(e.mask & _ENTRY_CHANGES for e in events):
            self._entries += 1  # before the wake: a woken reader looks at the directory
        if any(e.mask & _in.Q_OVERFLOW for e in events):
            # Events were lost (which ones does not matter: a wake is a wake), but the
            # readers also list the directory again rather than trust their last look.
            _log.info("%s: the directory watch overflowed; readers look afresh", self._dir)
            self._overflowed = time.monotonic()
        self._wake()

    def _unwatch(self) -> None:
        watch, loop = self._watch, self._watch_loop
        if watch is None:
            return
        self._watch, self._watch_loop = None, None
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(watch.fileno())
        watch.close()

    async def _call(self, fn: Callable[..., _T], *args: object) -> _T:
        """Run a writer-side job on the log's thread, turning OSError into LogUnavailable."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, _guard, self.url, fn, *args)

    async def read(self, start: int, *, max_batch: int = 1024) -> AsyncGenerator[list[Record], None]:
        if max_batch < 1:
            raise InvalidArgument("max_batch must be at least 1")
        loop = asyncio.get_running_loop()
        self._readers += 1
        # At the tail (woken by an append, a few records in the page cache) a step is a
        # pread and a stat: it runs right here, saving two thread hops per batch. A
        # reader catching up (full batches) steps on a thread, so that reading a cold
        # log from disk does not hold up the event loop.
        try:
            self._watch_dir(loop)
            cursor = await loop.run_in_executor(None, _guard, self.url, self._seek, start)
        except BaseException:
            self._reader_gone()
            raise
        step: asyncio.Future[tuple[list[Record], int]] | None = None
        suspect = 0
        behind = True
        try:
            while not self._closed:
                grown = self._grown
                # Woken by this loop's watch, a reader may trust it to tell of new and
                # removed segments; on another loop it polls, and looks each time.
                watched = self._watch is not None and self._watch_loop is loop
                if behind:
                    step = loop.run_in_executor(
                        None, _guard, self.url, self._read_step, cursor, max_batch, start, watched
                    )
                    batch, status = await asyncio.shield(step)
                    step = None
                else:
                    batch, status = _guard(self.url, self._read_step, cursor, max_batch, start, watched)
                behind = len(batch) >= max_batch
                if batch:
                    suspect = 0
                    yield batch
                elif status == _SUSPECT:
                    suspect += 1
                    if suspect >= _CONFIRM:
                        raise LogCorrupt(
                            f"{os.path.join(self._dir, _seg_name(cursor.base))}: no valid record at "
                            f"offset {cursor.next} (byte {cursor.pos}) although later records exist;"
                            " run `baton log verify`, and `baton log repair` with every broker"
                            " stopped"
                        )
                    await asyncio.sleep(self._poll)
                    continue
                if not batch and status == _MORE:
                    await asyncio.sleep(0)  # a step on the loop must not spin it
                if status == _TAIL:
                    suspect = 0
                    if self._watch is not None and self._watch_loop is loop:
                        # Woken by the directory watch (any process's append), or by its
                        # safety-net tick: no timer of its own per wait.
                        await grown.wait()
                    else:  # this process's own commits wake it; other appends are polled
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(self._poll):
                                await grown.wait()
        finally:
            if step is not None and not step.done():  # cancelled mid-read: close once the thread is done
                step.add_done_callback(lambda f: _close_after(f, cursor))
            else:
                cursor.close()
            self._reader_gone()

    def _reader_gone(self) -> None:
        """A reader ended: with none left, stop watching the directory (on the watch's
        loop); the next reader watches it again."""
        self._readers -= 1
        loop = self._watch_loop
        if self._readers > 0 or loop is None:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # (a generator finalised outside any loop)
            running = None
        if running is loop:
            self._unwatch()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._unwatch_unread)

    def _unwatch_unread(self) -> None:
        if self._readers == 0:
            self._unwatch()

    async def start_offset(self) -> int:
        self._check_open()
        bases = await self._call(_list_bases, self._dir)
        return bases[0] if bases else 0

    async def end_offset(self) -> int:
        self._check_open()
        return await self._call(self._end_offset)

    async def truncate_before(self, offset: int) -> None:
        self._check_open()
        await self._call(self._truncate_before, offset)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._unwatch()
        self._wake()
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)  # lets a commit in flight finish
        for _, fut in self._queue:
            if not fut.done():
                fut.set_exception(LogUnavailable(f"log {self.url} is closed"))
        self._queue.clear()
        with contextlib.suppress(LogUnavailable):
            await self._call(self._close_files)
        self._executor.shutdown(wait=False)

    # ---- writer thread ---------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _open_files(self) -> None:
        # Owner only (0700 dir, 0600 files): the segments hold message bodies.
        os.makedirs(self._dir, mode=0o700, exist_ok=True)
        self._hold_fd = os.open(os.path.join(self._dir, HOLD_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._hold_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            _log.warning("%s: a log repair is running; waiting for it to finish", self._dir)
            fcntl.flock(self._hold_fd, fcntl.LOCK_SH)
        self._lock_fd = os.open(os.path.join(self._dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        with self._locked():
            self._sync_tail(repair=True)

    def _close_files(self) -> None:
        self._tail.close()
        for fd in (self._lock_fd, self._hold_fd):
            if fd >= 0:
                os.close(fd)  # closing the HOLD file drops its shared lock
        self._lock_fd = self._hold_fd = -1

    def _sync_tail(self, *, repair: bool) -> None:
        """Bring the cached end up to the true end, which other processes may have moved.

        With ``repair`` (caller holds the flock) a torn tail is cut off and damage before
        the end raises LogCorrupt; without it the scan just stops at the first bad frame.
        """
        tail = self._tail
        if tail.fd >= 0 and self._tail_is_last(tail):
            return
        bases = _list_bases(self._dir)
        if not bases:
            if not repair:
                return
            first = max(tail.next, 0)  # a fresh log, or (oddly) every segment deleted
            os.close(os.open(self._path(first), os.O_WRONLY | os.O_CREAT, 0o600))
            _sync_dir(self._dir)
            bases = _list_bases(self._dir)
        if bases[-1] != tail.base:  # first call, or another process rolled a segment
            tail.switch(os.open(self._path(bases[-1]), os.O_RDWR), bases[-1])
        size = os.fstat(tail.fd).st_size
        if size < tail.pos:  # someone rolled a failed batch back under us: rescan
            tail.seek(0, tail.base)
        if size == tail.pos:
            return
        tail.seek(tail.pos, tail.next)  # the bytes past our end are new: read them afresh
        status = tail.advance(1 << 62, None)
        if status == _LIMIT or tail.pos == size or not repair:
            return
        if status == _INVALID and tail.followed_by_valid():
            raise LogCorrupt(
                f"{self._path(tail.base)}: bad record at offset {tail.next} (byte {tail.pos});"
                " run `baton log verify`, and `baton log repair` with every broker stopped"
            )
        _log.warning("%s: cutting torn tail of %d bytes at offset %d", self._path(tail.base), size - tail.pos, tail.next)
        os.ftruncate(tail.fd, tail.pos)
        _datasync(tail.fd)
        tail.seek(tail.pos, tail.next)

    def _tail_is_last(self, tail: _Cursor) -> bool:
        """The cheap check before every commit: scan what other processes appended to
        the cached last segment; True if it ends cleanly and no segment follows it.

        A segment is only ever followed by one named after the offset its valid records
        end at (writers roll under the flock, after a repaired tail), and truncation
        removes segments oldest first, so while this one is still linked one ``stat``
        of that name answers what a directory listing would. Anything else (a segment
        truncated away under a paused broker, a rolled segment, a torn or damaged tail,
        a file that shrank) is left to the full check.
        """
        st = os.fstat(tail.fd)
        size = st.st_size
        if size < tail.pos or st.st_nlink == 0:
            return False
        if size > tail.pos:
            tail.seek(tail.pos, tail.next)
            if tail.advance(1 << 62, None) != _END or tail.pos != size:
                return False
        return not os.path.exists(self._path(tail.next))

    def _commit(self, batches: list[Sequence[bytes]]) -> list[int]:
        """Write a group of batches as one: flock, find the end, write, unlock, fsync.

        The fsync runs after the unlock: a writer process that is stopped (SIGSTOP, a
        debugger) or slow to sync must not hold every other broker's appends, and the
        lock is only held for the writes themselves. Durability is unchanged: this
        call returns after the data is synced, and the records were visible to readers
        (the page cache) from the header write on, lock or not.
        """
        with self._locked():
            self._sync_tail(repair=True)
            tail = self._tail
            if tail.pos >= self._segment_bytes:
                fd = os.open(self._path(tail.next), os.O_RDWR | os.O_CREAT, 0o600)
                _sync_dir(self._dir)
                tail.switch(fd, tail.next)
            pack, crc32 = _HEADER.pack, zlib.crc32
            parts: list[bytes] = []
            firsts: list[int] = []
            offset = tail.next
            for records in batches:
                firsts.append(offset)
                for r in records:
                    parts += (pack(len(r), offset, crc32(r)), r)
                    offset += 1
            header, parts[0] = parts[0], pack(_PENDING, tail.next, 0)
            data = b"".join(parts)
            try:
                _pwrite_all(tail.fd, data, tail.pos)
                _pwrite_all(tail.fd, header, tail.pos)
            except OSError as exc:
                try:
                    os.ftruncate(tail.fd, tail.pos)
                    _datasync(tail.fd)
                except OSError:
                    tail.seek(0, tail.base)  # unsure what is on disk: rescan next time
                raise LogUnavailable(f"append to {self._path(tail.base)} failed: {exc}") from exc
            tail.seek(tail.pos + len(data), offset)
            fd, path = tail.fd, self._path(tail.base)
        # Only this thread writes or switches this process's tail: fd stays open.
        observe, started = self.sync_observer, time.perf_counter()
        try:
            _datasync(fd)
        except OSError as exc:
            # Others may have appended after us: nothing can be cut. Readers may have
            # seen the records; the caller treats the outcome as unknown and retries
            # (appliers drop the duplicates, docs/design.md §3).
            tail.seek(0, tail.base)
            raise LogUnavailable(f"sync of {path} failed, append outcome unknown: {exc}") from exc
        if observe is not None:
            observe(time.perf_counter() - started)
        return firsts

    def _end_offset(self) -> int:
        self._sync_tail(repair=False)  # readers don't lock; neither does this
        return self._tail.next

    def _truncate_before(self, offset: int) -> None:
        with self._locked():
            bases = _list_bases(self._dir)
            removed = False
            for base, following in zip(bases, bases[1:]):  # never the last segment
                if following > offset:
                    break
                os.unlink(self._path(base))
                removed = True
            if removed:
                _sync_dir(self._dir)

    # ---- reader threads (default executor; each reader owns its file descriptor) -----

    def _seek(self, start: int) -> _Cursor:
        bases = _list_bases(self._dir)
        if not bases or start < bases[0]:
            raise LogTruncated(f"offset {start} is below the log's start {bases[0] if bases else 0}")
        base = bases[bisect.bisect_right(bases, start) - 1]
        try:
            return _Cursor(os.open(self._path(base), os.O_RDONLY), base)
        except FileNotFoundError:
            raise LogTruncated(f"offset {start} was truncated away while opening") from None

    def _read_step(
        self, cursor: _Cursor, max_batch: int, start: int, watched: bool = False
    ) -> tuple[list[Record], int]:
        """Read up to ``max_batch`` records and say what follows them: _MORE (read on),
        _TAIL (the end of the log for now: wait) or, with no records, _SUSPECT (worry).

        ``watched``: the directory watch wakes this reader and counts segment entries
        made or removed; while that count stays where it was when this cursor last found
        no next segment, there is none still, and its own segment is still there."""
        out: list[Record] = []
        status = cursor.advance(max_batch, out, start)
        if status == _LIMIT:
            return out, _MORE
        at = cursor.pos - cursor.buf_pos
        if status == _INVALID and cursor.buf[at : at + 4] == _PENDING_MARK:
            # A batch being written (or torn by a dead writer, which the next one cuts):
            # its second write comes soon; damage behind it shows in the periodic listing.
            pending = True
        else:
            pending = False
            if status == _INVALID and not out and cursor.followed_by_valid():
                return out, _SUSPECT
            # No whole record left here: the end of the log or a full segment. (An
            # empty segment's next offset is its own base: that is no other segment.)
            entries = self._entries  # read before looking: a change after it shows next time
            if cursor.next != cursor.base and not (watched and cursor.entries == entries):
                nxt = self._path(cursor.next)
                if os.path.exists(nxt):
                    try:
                        cursor.switch(os.open(nxt, os.O_RDONLY), cursor.next)
                    except FileNotFoundError:
                        raise LogTruncated(f"offset {cursor.next} was truncated away") from None
                    return out, _MORE
                cursor.entries = entries
        # Nothing after the last record, or a batch being written.
        quiet = pending or (status == _END and at == len(cursor.buf))
        listed_lately = cursor.listed > max(time.monotonic() - _RELIST_S, self._overflowed)
        unchanged = watched and cursor.entries == self._entries  # no segment made or removed
        if out or (quiet and listed_lately and (unchanged or os.fstat(cursor.fd).st_nlink)):
            # A clean end of a segment still in the directory, listed lately: nothing
            # else to learn from a listing (truncation removes a segment first).
            return out, _TAIL
        cursor.listed = time.monotonic()
        bases = _list_bases(self._dir)
        if bases and bases[0] > cursor.next:
            raise LogTruncated(f"offset {cursor.next} was truncated away")
        return out, _SUSPECT if bases and bases[-1] > cursor.next else _TAIL

    def _path(self, base: int) -> str:
        return os.path.join(self._dir, _seg_name(base))


def _close_after(step: asyncio.Future[tuple[list[Record], int]], cursor: _Cursor) -> None:
    if not step.cancelled():
        step.exception()  # retrieved, so an abandoned read's error isn't reported as unhandled
    cursor.close()


def _guard(url: str, fn: Callable[..., _T], *args: object) -> _T:
    """Run ``fn`` in a worker thread; disk errors leave as LogUnavailable, never as bare OSError."""
    try:
        return fn(*args)
    except OSError as exc:
        raise LogUnavailable(f"log {url}: {exc}") from exc

