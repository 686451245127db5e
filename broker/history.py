"""A message's life, read back from the log (docs/admin.md, "Message history").

A message's position, and which messages an ``Acquire`` took, are decided when the log
is applied, not written in the events (docs/design.md §4). So the history is rebuilt by
applying the log from its first record to a scratch :class:`~batonmq.cluster.state.State`
(pure: no store, no effects kept) and watching the one message after every record:
enqueued, acquired, released, accepted, dead-lettered, expired, purged. Each step carries
the log offset and the replicated time (the event's envelope time).

That costs O(log size) and runs on the broker's event loop, in slices of at most a few
milliseconds (:data:`SLICE_SECONDS`), so the broker goes on serving meanwhile. It is
bounded by ``max_records`` (default :data:`MAX_HISTORY_RECORDS`), and answers
``complete: false`` with a note when it stops there, or when the log no longer starts at
offset 0 (retention removed the beginning, so positions cannot be rebuilt; then only the
settlements that name the position are listed, unchecked).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

from batonmq.cluster.codec import decode
from batonmq.cluster.effects import Effect, Moved
from batonmq.cluster.errors import BatonError, InvalidArgument, QueueNotFound
from batonmq.cluster.events import (
    Accept,
    AcceptThrough,
    AnyEvent,
    DeleteQueue,
    Enqueue,
    Expire,
    ExpireQueue,
    Origin,
    PurgeQueue,
    Reject,
    Release,
    ReleaseAll,
    RoutedEnqueue,
)
from batonmq.cluster.log import Log
from batonmq.cluster.node import Node
from batonmq.cluster.queues import QueueState
from batonmq.cluster.results import MessageHistory
from batonmq.cluster.state import State

__all__ = ["MAX_HISTORY_RECORDS", "message_history"]

#: The most log records one history request reads (each applied to a scratch state).
MAX_HISTORY_RECORDS = 2_000_000
#: The longest stretch, in seconds, a history request keeps the event loop before it
#: lets the broker serve (a record with a big publish batch costs ~1 ms to apply).
SLICE_SECONDS = 0.005

# (where, consumer, delivery count: failed deliveries, acquired count: earlier hand-outs)
_Status = tuple[str, str | None, int, int]
_ABSENT: _Status = ("absent", None, 0, 0)
_ONE_AT_A_TIME: weakref.WeakKeyDictionary[Node, asyncio.Lock] = weakref.WeakKeyDictionary()
_ASKED = {Accept: "accept asked", Release: "release asked", Reject: "reject asked"}


def _status(q: QueueState | None, pos: int) -> _Status:
    if q is None or pos >= q.next_pos:
        return _ABSENT
    holder = q.acquired.get(pos)
    count, acquired = q.counts.get(pos, 0), q.acq_counts.get(pos, 0)
    if holder is not None:
        return ("acquired", holder, count, acquired)
    if (
        pos >= q.cursor or pos in q.returned or pos in q.delayed
        or (q.max_priority and q.holds(pos))  # a priority queue keeps its ready in a heap
    ):
        return ("ready", None, count, acquired)  # ready, or delayed until its time
    return ("gone", None, count, acquired)


def _step(
    offset: int, origin: Origin, event: AnyEvent, before: _Status, after: _Status,
    first_before: int, position: int, moves: list[Moved], queues: dict[int, str],
) -> dict[str, Any]:
    """Describe the move ``before`` -> ``after`` that ``event`` caused."""
    step: dict[str, Any] = {
        "offset": offset,
        "time_ms": origin.ts,
        "node": origin.node,
        "runtime": origin.runtime,
        "event": type(event).__name__,
    }
    was, now = before[0], after[0]
    if was == "absent" and now in ("ready", "acquired", "gone"):
        step["what"] = "enqueued"
        if isinstance(event, RoutedEnqueue):
            step.update(exchange=event.exchange, routing_key=event.routing_key)
        if isinstance(event, (Enqueue, RoutedEnqueue)):
            index = position - first_before
            seen = 0
            for key, n in event.keys:
                if seen <= index < seen + n:
                    step["publish_key"] = key
                    break
                seen += n
            if now == "gone":
                step["note"] = "pushed out at once (overflow drop-head)"
        return step
    if now == "acquired":
        # The n-th hand-out, and the failed deliveries before it (docs/events.md).
        step.update(what="acquired", consumer=after[1], acquisition=after[3] + 1,
                    delivery_count=after[2])
        return step
    if was == "acquired" and now == "ready":
        step.update(what="released", consumer=before[1], delivery_count=after[2],
                    failed=after[2] > before[2])
        if not isinstance(event, (Release, ReleaseAll)):
            step["note"] = "its consumer's broker left the view"
        return step
    # Gone, from ready or acquired.
    if before[1] is not None:
        step["consumer"] = before[1]
    match event:
        case Accept():
            step["what"] = "accepted"
        case AcceptThrough():
            step["what"] = "accepted"
            step["note"] = "committed by the range reader"
        case Reject():
            step["what"] = "dead-lettered"
            step["reason"] = "rejected"
        case Release() | ReleaseAll():
            step["what"] = "dead-lettered"
            step["reason"] = "delivery limit"
        case Expire():
            step["what"] = "dead-lettered"
            step["reason"] = "expired (TTL)"
        case PurgeQueue():
            step["what"] = "purged"
        case DeleteQueue():
            step["what"] = "deleted with its queue"
        case ExpireQueue():
            step["what"] = "deleted with its queue"
            step["reason"] = "the queue expired (unused for its expires)"
        case Enqueue() | RoutedEnqueue():
            step["what"] = "dead-lettered"
            step["reason"] = "overflow (drop-head)"
        case _:
            step["what"] = "dead-lettered" if before[0] == "acquired" else "removed"
            step["reason"] = "delivery limit, after its consumer's broker left the view"
    if step["what"] == "dead-lettered":
        if moves:
            # Through an exchange it may have gone to several queues: copies, then the
            # move (the last).
            moved = moves[-1]
            step["to_queue"] = queues.get(moved.dst_qid, str(moved.dst_qid))
            step["to_position"] = moved.dst_pos
            if len(moves) > 1:
                step["copies"] = [
                    [queues.get(m.dst_qid, str(m.dst_qid)), m.dst_pos] for m in moves[:-1]
                ]
        else:
            step["note"] = (
                "dropped: no dead-letter queue (or it is missing or full), or its"
                " exchange routed it nowhere"
            )
    return step


async def message_history(
    node: Node, queue: str, position: int, *, max_records: int | None = None
) -> MessageHistory:
    """The life of message ``(queue, position)`` as the log tells it.

    Args:
        node: this broker's replica: its log, and its state for the queue's identity.
        queue: the queue's name (its current incarnation if it exists, else the last one
            the log declared).
        position: the message's position.
        max_records: the most log records to read (default MAX_HISTORY_RECORDS).

    Returns:
        The steps in log order, the message's state at the end of the scan
        (``ready``, ``acquired``, ``gone``, ``absent``: never enqueued), and whether the
        history is complete.

    Raises:
        InvalidArgument: a negative position or bound.
        QueueNotFound: the queue exists neither now nor on the log.
        LogUnavailable: the log cannot be read.
    """
    limit = MAX_HISTORY_RECORDS if max_records is None else max_records
    if position < 0 or limit < 1:
        raise InvalidArgument("position must be >= 0 and max_records >= 1")
    # One history at a time per broker: each costs a replay of the log.
    lock = _ONE_AT_A_TIME.setdefault(node, asyncio.Lock())
    async with lock:
        # The queue's events are on its data partition's log (docs/design.md §16).
        return await _history(node.part(queue), queue, position, limit)


async def _records(
    log: Log, start: int, stop: int
) -> AsyncIterator[tuple[int, tuple[Origin, AnyEvent] | None]]:
    """The decodable records of ``log`` from ``start`` up to ``stop`` (exclusive), giving
    the loop back every :data:`SLICE_SECONDS` so the broker goes on serving meanwhile.
    A record that does not decode is passed over here (the caller counts what it reads
    by the offsets): it comes as None."""
    if stop <= start:
        return
    pause_at = time.perf_counter() + SLICE_SECONDS
    async with contextlib.aclosing(log.read(start)) as reader:
        async for batch in reader:
            for offset, record in batch:
                if offset >= stop:
                    return
                if time.perf_counter() > pause_at:
                    await asyncio.sleep(0)
                    pause_at = time.perf_counter() + SLICE_SECONDS
                try:
                    decoded = decode(record)
                except BatonError:
                    yield offset, None
                    continue
                yield offset, decoded
            if batch[-1][0] >= stop - 1:
                return


async def _history(node: Node, queue: str, position: int, limit: int) -> MessageHistory:
    log = node.log
    start = await log.start_offset()
    end = await log.end_offset()
    live = node.queues.get(queue)
    target = live.qid if live is not None else None
    if start > 0:
        return await _settlements_only(node, queue, position, start, end, limit, target)
    scratch = State(node.state.membership.suspect_beats)
    steps: list[dict[str, Any]] = []
    status = _ABSENT
    qid: int | None = None  # the incarnation of the queue followed
    names: dict[int, str] = {}
    scanned = 0
    stop = min(end, limit)
    async for offset, decoded in _records(log, 0, stop):
        scanned += 1
        if decoded is None:
            scratch.skip_malformed(offset)
            continue
        origin, event = decoded
        q = scratch.queues.get(queue)
        before_next = q.next_pos if q is not None else 0
        out: list[Effect] = []
        scratch.apply(offset, origin, event, out)
        q = scratch.queues.get(queue)
        if q is not None:
            if target is not None and q.qid != target:
                q = None  # another incarnation than the one that exists now
            elif q.qid != qid:
                qid, status, steps = q.qid, _ABSENT, []
        if qid is None:
            continue
        if q is not None:
            after = _status(q, position)
        elif status[0] in ("ready", "acquired"):
            after = ("gone", None, status[2], status[3])  # the queue went with it
        else:
            after = status
        if after != status:
            moves = [
                e for e in out
                if isinstance(e, Moved) and e.src_qid == qid and e.src_pos == position
            ]
            if moves:
                names = {x.qid: x.name for x in scratch.queues.values()}
            steps.append(
                _step(offset, origin, event, status, after, before_next, position,
                      moves, names)
            )
            status = after
    seen_queue = qid is not None
    if not seen_queue and live is None:
        raise QueueNotFound(f"queue {queue!r} does not exist and the log never declared it")
    complete = stop >= end
    note = "" if complete else (
        f"stopped after {scanned} records (max_records); the log holds {end - start}"
    )
    return MessageHistory(
        queue, position, start, end, scanned, complete, status[0], note, steps
    )


async def _settlements_only(
    node: Node, queue: str, position: int, start: int, end: int, limit: int, target: int | None
) -> MessageHistory:
    """The log no longer starts at 0: list the settlements that name the position."""
    steps: list[dict[str, Any]] = []
    scanned = 0
    stop = min(end, start + limit)
    async for offset, decoded in _records(node.log, start, stop):
        scanned += 1
        if decoded is None:
            continue
        origin, event = decoded
        if (
            isinstance(event, (Accept, Release, Reject))
            and event.queue == queue
            and position in event.positions
        ):
            steps.append(
                {
                    "offset": offset,
                    "time_ms": origin.ts,
                    "node": origin.node,
                    "runtime": origin.runtime,
                    "event": type(event).__name__,
                    "what": _ASKED[type(event)],
                    "consumer": event.consumer,
                    "note": "unchecked: the consumer may not have held it then",
                }
            )
    live = node.queues.get(queue)
    if live is None and target is None:
        raise QueueNotFound(f"queue {queue!r} does not exist")
    now = _status(live, position)[0]
    return MessageHistory(
        queue, position, start, end, scanned, False, now,
        f"the log starts at offset {start}: retention removed its beginning, so where the"
        " message was enqueued and which acquires took it cannot be rebuilt; listed are the"
        " settlements that name its position",
        steps,
    )
