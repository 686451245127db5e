"""Verifying and repairing the file log's segments (``baton log verify`` / ``baton log repair``).

The file log (``cluster/log/file.py``) cuts a torn tail by itself, but a bad record
*followed by valid ones* is corruption: a reader stops there (``LogCorrupt``) rather than
skip a record that may be a confirmed publish, so every broker on the log stops applying
at that offset (docs/operations.md, "A corrupt record in the file log").

:func:`scan` walks every segment and reports each damaged span (:class:`Damage`): where it
is (segment, byte), the log offsets it makes unreadable, and what kind it is. After a bad
frame it finds the next valid one by its header (the offset it must carry, a plausible
length, a matching CRC), so damage to a header loses no more than the frames it hit.

:func:`repair` keeps everything that can be kept. Each damaged segment is rewritten with
its valid frames as they are, and a *placeholder* (a valid frame with an empty payload)
at each unreadable offset, so offsets stay dense and every broker's applied offset still
means what it meant; applying a placeholder fails to decode, which every replica counts
as ``malformed`` and skips, the same way (docs/events.md). A torn tail of the last segment
is cut, as the next append would. The original file is first hard-linked into
``<log dir>/damaged/`` (its bytes are never deleted without that backup), and the
rewritten file replaces it atomically. Repair refuses while any process has the log open:
every :class:`~batonmq.cluster.log.file.FileLog` holds a shared ``flock`` on ``HOLD`` for
as long as it is open, and repair needs it exclusively.

A log set (``cluster/log/file_set.py``, :class:`~batonmq.cluster.log.file_set.FileLogSet`) keeps
partition K >= 1 in ``<log dir>/partition-K``, a log directory of its own: :func:`scan_set`
and :func:`repair_set` check and mend every partition (repair holds every partition
against the brokers before it changes any).

No asyncio: the CLI runs these directly (they read whole segments; a tool, not a hot path).
"""

from __future__ import annotations

import fcntl
import os
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from batonmq.cluster.errors import InvalidArgument, LogUnavailable
from batonmq.cluster.log.file import (
    HOLD_FILE,
    LOCK_FILE,
    _HDR,
    _HEADER,
    _INVALID,
    _MAX_FRAME,
    _PENDING,
    _SHORT,
    _list_bases,
    _parse,
    _seg_name,
    _sync_dir,
)
from batonmq.cluster.log.file_set import partition_dirs

__all__ = [
    "Damage", "ScanReport", "RepairReport", "scan", "repair", "scan_set", "repair_set",
    "set_partitions", "file_log_path", "BACKUP_DIR",
]

#: Where repair keeps the original bytes of every segment it rewrites.
BACKUP_DIR = "damaged"

#: The kinds of damage.
CORRUPT = "corrupt"  # bad bytes with valid records after them (in this segment)
TORN_TAIL = "torn-tail"  # the last segment ends with an incomplete or bad frame: cut on append
TRAILING = "trailing-garbage"  # a non-last segment ends with bad bytes; the next one goes on
GAP = "gap"  # offsets missing between a segment's last valid record and the next segment
OVERLAP = "overlap"  # a segment starts below the previous one's end

#: Progress callback: (segments done, segments, bytes done, bytes in all).
Progress = Callable[[int, int, int, int], None]


@dataclass(frozen=True, slots=True)
class Damage:
    """One damaged span of a segment.

    Attributes:
        segment: the segment's file name.
        byte: where the damage starts in it.
        length: how many bytes are damaged.
        offset: the first log offset the damage makes unreadable (or that would come
            next, for damage that hides no record).
        records: how many log offsets are unreadable because of it (0: none is, e.g. a
            torn tail, which was never confirmed).
        kind: ``corrupt``, ``torn-tail``, ``trailing-garbage``, ``gap`` or ``overlap``.
    """

    segment: str
    byte: int
    length: int
    offset: int
    records: int
    kind: str

    @property
    def harmful(self) -> bool:
        """Whether brokers stop at it (everything but a torn tail of the last segment,
        which the next append cuts)."""
        return self.kind != TORN_TAIL

    def text(self) -> str:
        """One line for an operator."""
        what = (
            f"offsets {self.offset}..{self.offset + self.records - 1} unreadable"
            if self.records > 1 else
            f"offset {self.offset} unreadable" if self.records == 1 else
            f"no record lost (next offset {self.offset})"
        )
        return f"{self.segment} byte {self.byte}: {self.kind}, {self.length} bytes, {what}"


@dataclass(slots=True)
class ScanReport:
    """What :func:`scan` found.

    Attributes:
        path: the log's directory.
        segments: how many segment files.
        records: valid records.
        bytes: bytes scanned.
        start: the first segment's base offset (the log's start).
        end: the offset after the last valid record.
        damage: every damaged span, in log order.
    """

    path: str
    segments: int = 0
    records: int = 0
    bytes: int = 0
    start: int = 0
    end: int = 0
    damage: list[Damage] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True if nothing but a torn tail (cut by the next append) was found."""
        return not any(d.harmful for d in self.damage)


@dataclass(slots=True)
class RepairReport:
    """What :func:`repair` did.

    Attributes:
        scan: the scan it repaired from.
        rewritten: segment file names rewritten (their originals are in ``backup``).
        placeholders: unreadable offsets now held by placeholder records.
        cut_bytes: bytes of damage dropped (kept in the backups).
        backup: the directory holding the originals ("" if nothing was changed).
    """

    scan: ScanReport
    rewritten: list[str] = field(default_factory=list)
    placeholders: int = 0
    cut_bytes: int = 0
    backup: str = ""


def file_log_path(url: str) -> str:
    """The directory of a ``file:`` log URL.

    Raises:
        InvalidArgument: not a ``file:`` URL (verify and repair work on the file log only;
            Kafka keeps its own checksums and replicas).
    """
    scheme, sep, rest = url.partition(":")
    if scheme != "file" or not sep or not rest:
        raise InvalidArgument(
            f"{url!r} is not a file: log URL: verify and repair work on the embedded file log"
            " only (file:PATH; Kafka checks and replicates its own records)"
        )
    return rest.partition("?")[0]


# --- scanning ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Frame:
    """A valid frame of a segment: where it is and its offset."""

    pos: int
    stop: int
    offset: int


def _valid_at(buf: bytes, pos: int, low: int, high: int) -> int | None:
    """The offset of a valid frame at ``pos`` carrying an offset in [low, high), or None."""
    if len(buf) - pos < _HDR:
        return None
    length, off, crc = _HEADER.unpack_from(buf, pos)
    if not low <= off < high or length > _MAX_FRAME or pos + _HDR + length > len(buf):
        return None
    if zlib.crc32(memoryview(buf)[pos + _HDR : pos + _HDR + length]) != crc:
        return None
    return int(off)


def _resync(buf: bytes, pos: int, expected: int) -> tuple[int, int] | None:
    """The next valid frame at or after ``pos`` whose offset is ``expected`` or later
    (within 2**24 of it): (byte position, offset), or None.

    A frame header carries its offset as 8 big-endian bytes after the length, so the
    search looks for the offset's high bytes with ``find`` (C speed) and checks each
    hit fully (offset range, length, CRC).
    """
    high = expected + (1 << 24)
    best: tuple[int, int] | None = None
    for base in (expected, high - 1):  # the high bytes change at most once in the range
        prefix = _HEADER.pack(0, base, 0)[4:9]
        at = pos + 4
        while True:
            hit = buf.find(prefix, at)
            if hit < 0 or (best is not None and hit - 4 >= best[0]):
                break
            off = _valid_at(buf, hit - 4, expected, high)
            if off is not None:
                best = (hit - 4, off)
                break
            at = hit + 1
    return best


def _walk(buf: bytes, base: int, name: str, last: bool) -> tuple[list[_Frame], list[Damage], int]:
    """Every valid frame and damaged span of one segment, and the offset after its last
    valid frame."""
    frames: list[_Frame] = []
    damage: list[Damage] = []
    pos, nxt, size = 0, base, len(buf)
    while pos < size:
        at, after, n, status, _need = _parse(buf, pos, nxt, 1 << 62, None, 0)
        # _parse checked these frames; note where each is (headers only, cheap).
        p, o = pos, nxt
        while p < at:
            length = _HEADER.unpack_from(buf, p)[0]
            frames.append(_Frame(p, p + _HDR + length, o))
            p, o = p + _HDR + length, o + 1
        pos, nxt = at, after
        if pos >= size or status not in (_INVALID, _SHORT):
            break
        if last and size - pos >= _HDR and _HEADER.unpack_from(buf, pos)[0] == _PENDING:
            # A batch being written now (its first header is written last), or one whose
            # writer died: the log treats both as the tail, and the next append cuts it.
            damage.append(Damage(name, pos, size - pos, nxt, 0, TORN_TAIL))
            break
        found = _resync(buf, pos + 1, nxt)
        if found is None:
            damage.append(Damage(name, pos, size - pos, nxt, 0, TORN_TAIL if last else TRAILING))
            break
        to, off = found
        damage.append(Damage(name, pos, to - pos, nxt, off - nxt, CORRUPT))
        pos, nxt = to, off
    return frames, damage, nxt


@contextmanager
def _mapped(path: str) -> Iterator[bytes]:
    """A segment's bytes (read whole: a segment is 64 MiB by default; a tool, not a hot
    path)."""
    with open(path, "rb") as f:
        yield f.read()


def _segments(path: str) -> list[int]:
    if not os.path.isdir(path):
        raise LogUnavailable(f"no file log at {path} (not a directory)")
    try:
        return _list_bases(path)
    except OSError as exc:
        raise LogUnavailable(f"cannot list the file log at {path}: {exc}") from exc


def scan(path: str, progress: Progress | None = None) -> ScanReport:
    """Check every record of the file log in directory ``path``.

    Safe while brokers run (it only reads); a batch being written at the end then shows
    as a torn tail, which is not harmful.

    Args:
        path: the log's directory.
        progress: called after each segment, and every 64 MiB within one.

    Returns:
        The report; ``report.ok`` is False if some record is unreadable.

    Raises:
        LogUnavailable: the directory or a segment cannot be read.
    """
    report = ScanReport(path)
    bases = _segments(path)
    report.segments = len(bases)
    sizes = []
    for b in bases:
        try:
            sizes.append(os.path.getsize(os.path.join(path, _seg_name(b))))
        except OSError:
            sizes.append(0)  # truncated away meanwhile
    total = sum(sizes)
    report.start = bases[0] if bases else 0
    nxt = report.start
    done = 0
    for i, base in enumerate(bases):
        name = _seg_name(base)
        if i > 0 and base != nxt:
            prev = _seg_name(bases[i - 1])
            if base > nxt:
                report.damage.append(Damage(prev, sizes[i - 1], 0, nxt, base - nxt, GAP))
            else:
                report.damage.append(Damage(name, 0, 0, base, 0, OVERLAP))
        try:
            with _mapped(os.path.join(path, name)) as buf:
                frames, damage, nxt = _walk(buf, base, name, i == len(bases) - 1)
        except FileNotFoundError:
            continue  # truncated away by retention while we scanned: nothing to check
        except OSError as exc:
            raise LogUnavailable(f"cannot read {os.path.join(path, name)}: {exc}") from exc
        report.records += len(frames)
        report.damage.extend(damage)
        done += sizes[i]
        if progress is not None:
            progress(i + 1, len(bases), done, total)
    report.bytes = done
    report.end = nxt
    return report


# --- repairing -----------------------------------------------------------------------------


@contextmanager
def _exclusive(path: str) -> Iterator[None]:
    """Hold the log against every broker: HOLD exclusively (no FileLog is open) and the
    writers' LOCK.

    Raises:
        LogUnavailable: some process has the log open.
    """
    fds = []
    try:
        for name in (HOLD_FILE, LOCK_FILE):
            fd = os.open(os.path.join(path, name), os.O_RDWR | os.O_CREAT, 0o644)
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LogUnavailable(
                    f"the file log at {path} is open in a running broker (or another tool):"
                    " stop every broker on it, then run the repair again"
                ) from None
        yield
    finally:
        for fd in fds:
            os.close(fd)  # closing drops the lock


def _placeholder(offset: int) -> bytes:
    """A valid frame with an empty payload: it holds an unreadable offset's place."""
    return _HEADER.pack(0, offset, zlib.crc32(b""))


def _rewrite(path: str, name: str, frames: list[_Frame], holes: list[tuple[int, int]],
             buf: bytes) -> bytes:
    """The segment's new bytes: its valid frames, and placeholders for ``holes``
    (offset, count), in offset order."""
    items: list[tuple[int, bytes]] = [(f.offset, bytes(buf[f.pos : f.stop])) for f in frames]
    for first, count in holes:
        items.extend((o, _placeholder(o)) for o in range(first, first + count))
    items.sort(key=lambda item: item[0])
    return b"".join(data for _, data in items)


def _replace(path: str, name: str, data: bytes, backup: str) -> None:
    """Keep the original in ``backup`` (a hard link: its bytes stay), then put ``data``
    in its place atomically."""
    seg = os.path.join(path, name)
    os.makedirs(backup, exist_ok=True)
    kept = os.path.join(backup, name)
    if os.path.exists(kept):
        kept += f".{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.{os.getpid()}"
    os.link(seg, kept)
    _sync_dir(backup)
    tmp = seg + ".repair"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, seg)
    _sync_dir(path)


def repair(path: str, progress: Progress | None = None) -> RepairReport:
    """Repair the file log in directory ``path`` (see the module docstring).

    Args:
        path: the log's directory.
        progress: passed to the scan.

    Returns:
        What was done; ``report.rewritten`` is empty if there was nothing to repair.

    Raises:
        LogUnavailable: a broker has the log open, or the disk fails (what was replaced
            until then is consistent: each segment is replaced atomically).
    """
    _segments(path)
    with _exclusive(path):
        return _repair_held(path, progress)


def _repair_held(path: str, progress: Progress | None) -> RepairReport:
    """:func:`repair`, the caller holding the log against every broker."""
    found = scan(path, progress)
    out = RepairReport(found)
    if not found.damage:
        return out
    backup = os.path.join(path, BACKUP_DIR)
    by_segment: dict[str, list[Damage]] = {}
    for d in found.damage:
        if d.kind != OVERLAP:  # nothing to rewrite: reported only
            by_segment.setdefault(d.segment, []).append(d)
    bases = {_seg_name(b): b for b in _list_bases(path)}
    names = sorted(bases)
    try:
        for name, damage in by_segment.items():
            last = name == names[-1]
            with _mapped(os.path.join(path, name)) as buf:
                frames, _, _ = _walk(buf, bases[name], name, last)
                holes = [(d.offset, d.records) for d in damage if d.records]
                data = _rewrite(path, name, frames, holes, buf)
            _replace(path, name, data, backup)
            out.rewritten.append(name)
            out.placeholders += sum(n for _, n in holes)
            out.cut_bytes += sum(d.length for d in damage)
    except OSError as exc:
        raise LogUnavailable(f"repair of {path} failed: {exc}") from exc
    out.backup = backup if out.rewritten else ""
    return out


# --- every partition of a set --------------------------------------------------------------


def set_partitions(root: str) -> list[str]:
    """The directories of every partition of the file log set at ``root`` (partition 0,
    ``root`` itself, first).

    Raises:
        LogUnavailable: ``root`` is not a log directory or cannot be listed.
        LogCorrupt: a partition directory is missing between others.
    """
    _segments(root)
    try:
        return partition_dirs(root)
    except OSError as exc:
        raise LogUnavailable(f"cannot list the file log at {root}: {exc}") from exc


def scan_set(root: str, progress: Progress | None = None) -> list[ScanReport]:
    """:func:`scan` every partition of the set at ``root``; reports in partition order."""
    return [scan(path, progress) for path in set_partitions(root)]


def repair_set(root: str, progress: Progress | None = None) -> list[RepairReport]:
    """:func:`repair` every partition of the set at ``root``, in partition order.

    Every partition is held against the brokers (as :func:`repair` holds one) before any
    is changed, so a broker that has any partition open stops the whole repair.

    Raises:
        LogUnavailable: a broker has a partition open, or the disk fails.
    """
    paths = set_partitions(root)
    for path in paths:
        _segments(path)
    with ExitStack() as held:
        for path in paths:
            held.enter_context(_exclusive(path))
        return [_repair_held(path, progress) for path in paths]
