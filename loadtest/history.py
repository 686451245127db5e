"""The operation history a load-test run writes, and reads back for the checker.

Every worker process writes one file ``<actor>.hist`` into the run directory: a stream
of msgpack arrays, one per operation, through one buffered file and one reused Packer
(a few µs per record, so the client stays the thing being measured, not the recorder).

File layout::

    ["baton-history", 1, actor, mono_ns, wall_ns]   # header: the clock anchor
    [kind, mono_ns, actor, queue, msg, position, count, info]   # one per operation

``mono_ns`` is ``time.monotonic_ns()``: on Linux CLOCK_MONOTONIC is one clock for every
process of the machine, so records of different workers merge into one order. The wall
time of a record is derived from the anchor of its file (``wall = anchor_wall + mono -
anchor_mono``) instead of being stored per record.

Message ids are ``"<producer>:<seq>"`` and lead every body (``id|flag|padding``) so that a
delivery names its message without a header; see :func:`make_body` / :func:`parse_body`.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

__all__ = [
    "OpKind",
    "Op",
    "HistoryWriter",
    "read_history",
    "load_run",
    "write_ops",
    "make_body",
    "parse_body",
    "FLAG_NORMAL",
    "FLAG_RELEASE",
    "FLAG_REJECT",
]

_MAGIC = "baton-history"
_VERSION = 1
SUFFIX = ".hist"


class OpKind(enum.IntEnum):
    """What a record says happened. The int values are the on-disk op codes."""

    #: A producer sent a publish (``msg``, ``queue``).
    PUBLISH_INVOKE = 1
    #: The broker confirmed it at ``position``.
    PUBLISH_OK = 2
    #: The publish failed or its outcome is unknown (``info``: the error).
    PUBLISH_FAIL = 3
    #: A consumer (``actor``) took ``msg`` at ``position`` with delivery ``count``.
    DELIVER = 4
    #: The consumer asked to accept it.
    ACK_INVOKE = 5
    #: The broker confirmed the accept: it must never come back (docs/design.md §5.3).
    ACK_OK = 6
    #: The accept failed or its outcome is unknown: the hold ended either way.
    ACK_FAIL = 7
    #: The consumer gave it back (delivery count goes up).
    RELEASE = 8
    #: The consumer rejected it (dead-lettered or dropped).
    REJECT = 9
    #: The consumer's connection was lost (or failed over): its holds are gone.
    CONSUMER_LOST = 10
    #: The consumer was cancelled cleanly: its unsettled messages were released.
    CONSUMER_END = 11
    #: Queue settings (``info``: ``"delivery_limit=N,dead_letter=Q"``), from the runner.
    QUEUE = 12
    #: End-of-run queue counters after the drain (``count``: ready + acquired).
    FINAL = 13
    #: A fault (``msg``: its kind, e.g. ``kill9``; ``count``: 0 when it starts, 1 when
    #: it is over; ``info``: ``node=... address=...``), from the fault injector.
    FAULT = 14
    #: A worker's connection is now to the broker at ``info`` (at connect and after each
    #: failover), so that a fault of that broker ends its consumers' holds.
    CONNECTED = 15
    #: A candidate (``actor``) leads service ``queue`` with fencing token ``count``
    #: (``info``: its candidate key), from now on.
    LEAD = 16
    #: That candidate no longer acts as the service's leader (``info``: ``resigned``,
    #: ``lost`` or ``done``), recorded before it resigns.
    LEAD_END = 17


#: Op codes to kinds (a dict lookup; calling ``OpKind(code)`` costs ~1.5 µs a record).
_KINDS = {k.value: k for k in OpKind}


@dataclass(slots=True)
class Op:
    """One operation of the history; not changed once read. (Not a frozen dataclass: a
    run's history holds millions, and a frozen one takes twice as long to make.)

    Attributes:
        kind: what happened.
        t: ``time.monotonic_ns()`` when it was recorded (same clock in every process).
        actor: producer or consumer id (``"p1"``, ``"c2.0"``, ``"drain"``, ``"runner"``).
        queue: the queue's name ("" if none).
        msg: the message id ("" if none).
        position: the message's position in ``queue`` (-1 if unknown).
        count: the delivery count of a delivery; ready+acquired for FINAL; else -1.
        info: free text (error, settings).
        wall: wall-clock ns since the epoch, from the file's clock anchor.
    """

    kind: OpKind
    t: int
    actor: str
    queue: str = ""
    msg: str = ""
    position: int = -1
    count: int = -1
    info: str = ""
    wall: int = 0


class HistoryWriter:
    """Appends records to one actor's history file (not thread-safe; one per process).

    Args:
        path: the file to create (``<run dir>/<actor>.hist``).
        actor: the default actor of the records.
    """

    def __init__(self, path: str | os.PathLike[str], actor: str) -> None:
        self.actor = actor
        self._file: BinaryIO = open(path, "wb", buffering=1 << 20)
        self._packer = msgpack.Packer()
        self._file.write(
            self._packer.pack([_MAGIC, _VERSION, actor, time.monotonic_ns(), time.time_ns()])
        )

    def record(
        self,
        kind: OpKind,
        queue: str = "",
        msg: str = "",
        position: int = -1,
        count: int = -1,
        info: str = "",
        *,
        t: int | None = None,
        actor: str | None = None,
    ) -> None:
        """Append one record (``t`` defaults to now)."""
        self._file.write(
            self._packer.pack(
                [
                    int(kind),
                    time.monotonic_ns() if t is None else t,
                    self.actor if actor is None else actor,
                    queue,
                    msg,
                    position,
                    count,
                    info,
                ]
            )
        )

    def flush(self) -> None:
        """Push buffered records to the OS (survives this process being killed after)."""
        self._file.flush()

    def close(self) -> None:
        """Flush and close the file."""
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_history(path: str | os.PathLike[str]) -> Iterator[Op]:
    """Yield the records of one history file in file order.

    A truncated last record (a worker killed mid-write) is ignored.

    Raises:
        ValueError: the file is not a history file.
    """
    with open(path, "rb") as f:
        unpacker = msgpack.Unpacker(f, raw=False, use_list=True)
        try:
            header: Any = next(unpacker)
        except StopIteration:
            return
        if not (isinstance(header, list) and len(header) == 5 and header[0] == _MAGIC):
            raise ValueError(f"{path}: not a baton history file")
        anchor_mono, anchor_wall = int(header[3]), int(header[4])
        shift = anchor_wall - anchor_mono
        kinds = _KINDS
        try:
            for kind, t, actor, queue, msg, position, count, info in unpacker:
                yield Op(kinds[kind], t, actor, queue, msg, position, count, info, t + shift)
        except (msgpack.OutOfData, ValueError, KeyError):  # torn tail
            return


def load_run(run_dir: str | os.PathLike[str]) -> list[Op]:
    """Every record of every ``*.hist`` file of a run, merged in time order.

    Ties keep file order (files sorted by name), so one actor's records keep their order.
    """
    ops: list[Op] = []
    for path in sorted(Path(run_dir).glob(f"*{SUFFIX}")):
        ops.extend(read_history(path))
    ops.sort(key=lambda op: op.t)  # stable
    return ops


def write_ops(path: str | os.PathLike[str], ops: Iterable[Op], actor: str = "injected") -> None:
    """Write ready-made records to a history file (tests, corrupted histories)."""
    with HistoryWriter(path, actor) as w:
        for op in ops:
            w.record(
                op.kind, op.queue, op.msg, op.position, op.count, op.info, t=op.t, actor=op.actor
            )


FLAG_NORMAL = ord("n")
FLAG_RELEASE = ord("r")  # poison: always released (must end in the dead-letter queue)
FLAG_REJECT = ord("j")  # poison: rejected at once


def make_body(msg_id: bytes, flag: int, size: int) -> bytes:
    """``msg_id|flag|`` padded with ``x`` to ``size`` bytes (longer if the id needs it)."""
    head = msg_id + b"|" + bytes((flag,)) + b"|"
    return head + b"x" * (size - len(head)) if size > len(head) else head


def parse_body(body: bytes) -> tuple[str, int]:
    """The message id and flag of a body made by :func:`make_body` (``("", 0)`` if not)."""
    cut = body.find(b"|")
    if cut <= 0 or len(body) < cut + 2:
        return "", 0
    return body[:cut].decode("ascii", "replace"), body[cut + 1]
