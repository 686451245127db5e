"""The file log as a set of physical partitions (docs/design.md §3).

Partition 0 is the log directory PATH itself (:mod:`batonmq.cluster.log.file`: an existing
log is a set of one partition, unchanged); partition K >= 1 is ``PATH/partition-K``, a log
directory of its own (its segments, ``LOCK``, ``HOLD``), so each partition has its own
writers' lock, writer thread and group-commit sync: appends to different partitions never
wait for each other.

Growing (:meth:`FileLogSet.grow`, in any process) holds ``flock`` on ``PATH/GROW``. A
partition is built whole under a temporary name (``partition-K.new-<pid>-<random>``, with
its first segment, synced) and renamed into place, so a crash half-way leaves only that
temporary directory, which the set ignores and the next grower removes. Partitions are made
in order, so the set is always dense: a ``partition-K`` missing between others (removed by
hand) is LogCorrupt. A new set makes partition 0's first segment last: until then the set
counts as new, so a creation that crashed is done again by the next opener.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Iterator
from typing import Any

from batonmq.cluster.errors import LogCorrupt
from batonmq.cluster.log.base import Log, LogSet, check_count
from batonmq.cluster.log.file import FileLog, _guard, _list_bases, _seg_name, _sync_dir

__all__ = ["FileLogSet", "GROW_FILE", "partition_dir", "partition_dirs"]

#: The lock file (in partition 0's directory) that growers of a log set hold.
GROW_FILE = "GROW"
_PARTITION = "partition-"  # partition K >= 1 lives in <log dir>/partition-K
_BUILDING = ".new-"  # partition-K.new-<pid>-<random>: being built; renamed when complete



def partition_dir(root: str, k: int) -> str:
    """The directory of physical partition ``k`` of the file log set at ``root``."""
    return root if k == 0 else os.path.join(root, f"{_PARTITION}{k}")


def partition_dirs(root: str) -> list[str]:
    """The directories of every partition of the file log set at ``root``, partition 0
    (``root`` itself) first.

    Raises:
        LogCorrupt: partition directories are not dense (one is missing between others).
        OSError: ``root`` cannot be listed.
    """
    found: set[int] = set()
    for entry in os.scandir(root):
        name = entry.name
        if name.startswith(_PARTITION) and name[len(_PARTITION):].isdigit() and entry.is_dir():
            found.add(int(name[len(_PARTITION):]))
    count = 1
    while count in found:
        count += 1
    stray = sorted(k for k in found if k >= count)
    if stray:
        raise LogCorrupt(
            f"file log set {root}: partition directory {_PARTITION}{count} is missing but"
            f" {', '.join(f'{_PARTITION}{k}' for k in stray)} exist; partitions must be dense"
            " (was one removed by hand?)"
        )
    return [partition_dir(root, k) for k in range(count)]


@contextlib.contextmanager
def _growing(root: str) -> Iterator[None]:
    """Hold the set's ``GROW`` lock (every process that adds partitions takes it)."""
    fd = os.open(os.path.join(root, GROW_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock


def _build_partition(root: str, k: int) -> None:
    """Create partition ``k`` whole or not at all: it is built under a temporary name
    (with its first segment) and renamed into place, so a crash half-way leaves only a
    ``partition-K.new-*`` directory, which the set ignores and the next grower removes."""
    tmp = os.path.join(root, f"{_PARTITION}{k}{_BUILDING}{os.getpid()}-{os.urandom(4).hex()}")
    os.mkdir(tmp, 0o700)
    os.close(os.open(os.path.join(tmp, _seg_name(0)), os.O_WRONLY | os.O_CREAT, 0o600))
    _sync_dir(tmp)
    os.rename(tmp, partition_dir(root, k))
    _sync_dir(root)


def _clear_builds(root: str) -> None:
    """Remove partitions a crashed grower left half built (the caller holds GROW)."""
    for entry in os.scandir(root):
        if entry.name.startswith(_PARTITION) and _BUILDING in entry.name and entry.is_dir():
            for name in os.listdir(entry.path):
                os.unlink(os.path.join(entry.path, name))
            os.rmdir(entry.path)


def _grow_dirs(root: str, count: int, only_if_new: bool = False) -> None:
    """Give the set at ``root`` at least ``count`` partitions, under its GROW lock.

    ``only_if_new``: only if the set is new (partition 0 has no segment yet: a log that
    was ever opened has one). Partition 0's first segment is made last, so a set whose
    creation crashed is still new to the next opener."""
    os.makedirs(root, mode=0o700, exist_ok=True)
    if only_if_new and _list_bases(root):
        return  # a set that exists stays so: no lock (and no GROW file in a log that never grew)
    with _growing(root):
        _clear_builds(root)
        if only_if_new and _list_bases(root):
            return
        have = len(partition_dirs(root))
        for k in range(have, count):
            _build_partition(root, k)
        if not _list_bases(root):
            os.close(os.open(os.path.join(root, _seg_name(0)), os.O_WRONLY | os.O_CREAT, 0o600))
            _sync_dir(root)


class FileLogSet(LogSet):
    """Partitions of a file log (see the module docstring), each a :class:`FileLog`.
    Use :meth:`open`."""

    def __init__(self, path: str, options: dict[str, Any]) -> None:
        super().__init__(f"file:{path}")
        self._dir = path
        self._options = options

    @classmethod
    async def open(cls, path: str, partitions: int | None = None, **options: Any) -> FileLogSet:
        """Open the set at ``path``, creating it with ``partitions`` (default 1) if new.

        An existing set opens with the partitions it has, whatever ``partitions`` says.

        Args:
            path: partition 0's directory.
            partitions: how many partitions a new set gets.
            options: passed to every partition's :meth:`FileLog.open` (``segment_bytes``...).

        Raises:
            InvalidArgument: ``partitions`` or an option out of range.
            LogUnavailable: the directories cannot be created or opened.
            LogCorrupt: a partition is missing between others, or damaged.
        """
        wanted = check_count(partitions if partitions is not None else 1)
        logs = cls(path, options)
        try:
            await asyncio.to_thread(_guard, logs.url, _grow_dirs, path, wanted, True)
            await logs.refresh()
        except BaseException:
            await logs.close()
            raise
        return logs

    async def _existing(self) -> int:
        return len(await asyncio.to_thread(_guard, self.url, partition_dirs, self._dir))

    async def _create(self, count: int) -> None:
        await asyncio.to_thread(_guard, self.url, _grow_dirs, self._dir, count)

    async def _open_partition(self, k: int) -> Log:
        return await FileLog.open(partition_dir(self._dir, k), **self._options)
