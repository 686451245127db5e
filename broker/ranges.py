"""Range reads (docs/design.md §11): the ``ReadRange`` frame, answered from this broker's store.

A range reader holds a queue (``Reserve``) and reads its messages by position,
from whichever broker it is connected to; :func:`read_range` answers once this
broker has applied the queue up to the end of the range asked for. With replica
groups, a read that waits while this broker leaves the queue's group (a partition
move, docs/design.md §16) is answered ``NotReplica`` at once, naming the current
replicas, so that the reader's client routes it there (clients/routing.py).
"""

from __future__ import annotations

import asyncio
from typing import Final

from batonmq.broker.peers import elsewhere
from batonmq.clients import wire
from batonmq.cluster.errors import InvalidArgument, QueueNotFound, Timeout
from batonmq.cluster.node import Node
from batonmq.cluster.results import RangeRead

__all__ = ["MAX_READ_RANGE", "READ_RANGE_WAIT", "read_range"]

#: Most messages one ReadRange answers with (the reader continues from "next").
MAX_READ_RANGE = 10_000
#: How long a ReadRange waits for this broker to apply the queue up to its end.
READ_RANGE_WAIT = 10.0
#: Seconds between looks at whether this broker still applies the queue while a read
#: waits (a partition closed here applies nothing more, so nothing else wakes it).
_STILL_HERE_EVERY: Final = 0.25


def read_range(node: Node, f: wire.ReadRange, max_frame: int) -> asyncio.Future[RangeRead]:
    """Start reading the range ``f`` asks for.

    Args:
        node: this broker's node (its state and store).
        f: the ReadRange frame.
        max_frame: the connection's largest frame; the answer stays below half of it.

    Returns:
        The answer, once read: ``[position, body, headers, publish_time]`` per
        message and the position to read on from. It fails with
        QueueNotFound, or Timeout when this broker has not applied the queue up to
        ``f.end`` within READ_RANGE_WAIT seconds, or NotReplica when this broker left
        the queue's replica group meanwhile.

    Raises:
        InvalidArgument: the range or the limit is out of bounds.
    """
    if f.start < 0 or f.end < f.start:
        raise InvalidArgument("ReadRange needs 0 <= start <= end")
    if not 1 <= f.limit <= MAX_READ_RANGE:
        raise InvalidArgument(f"ReadRange limit must be 1..{MAX_READ_RANGE}")
    return asyncio.ensure_future(_read_range_applied(node, f, max_frame))


async def _read_range_applied(node: Node, f: wire.ReadRange, max_frame: int) -> RangeRead:
    """Read once this broker has applied every enqueue below ``f.end``: then the
    answer is the same on every broker (a reserved queue loses positions only by
    AcceptThrough, below the reader's range), whichever one a reader fails over to."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READ_RANGE_WAIT
    broker, node = node, node.part(f.queue)  # its data partition's (docs/design.md §16)
    while True:
        q = node.queues.get(f.queue)
        if q is None:
            raise QueueNotFound(f"queue {f.queue!r} does not exist")
        if q.next_pos >= f.end and node.healthy:
            break
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise Timeout(
                f"this broker has applied queue {f.queue!r} up to position {q.next_pos},"
                f" not {f.end}, after {READ_RANGE_WAIT:g}s; try another broker"
            )
        try:
            async with asyncio.timeout(min(remaining, _STILL_HERE_EVERY)):
                await node.applied_event.wait()
        except TimeoutError:
            pass
        if broker.part(f.queue) is not node:
            # This broker left the queue's replica group meanwhile (its store is being
            # deleted): the reader asks a current replica, without waiting for Timeout.
            raise elsewhere(broker, f.queue, "ask") or QueueNotFound(
                f"queue {f.queue!r} does not exist")
    max_bytes = max_frame // 2
    rows = node.store.read_range(q.qid, f.start, f.end, f.limit, max_bytes)
    size = sum(m.size for _, m in rows)
    cut = bool(rows) and (len(rows) >= f.limit or size >= max_bytes)
    return RangeRead(
        messages=[[p, m.body, m.headers, m.publish_time] for p, m in rows],
        next=rows[-1][0] + 1 if cut else f.end,
    )
