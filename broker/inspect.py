"""Looking without touching: peek at a queue's ready messages, list this broker's
client connections and consumers (docs/admin.md).

Both read only what this broker holds: the replicated state it has applied and its
store. Neither appends to the log nor changes any count, so they are safe on a busy
broker. The native protocol (``Peek``, ``Connections``, broker/session.py) and the
admin HTTP listener (broker/admin.py) answer with the same functions.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from batonmq.broker.delivery import Consumer
from batonmq.cluster.errors import InvalidArgument, QueueNotFound
from batonmq.cluster.node import Node
from batonmq.cluster.results import ConnectionList, Peeked

__all__ = ["MAX_PEEK", "ConnectionView", "peek", "list_connections"]

#: Most messages one peek returns.
MAX_PEEK = 1000


class ConnectionView(Protocol):
    """What the listing reads of a client session (broker/session.py's ``Session``)."""

    @property
    def peer(self) -> str:
        """The client's ``HOST:PORT``: the connection's id while it is open."""
        ...

    @property
    def client_name(self) -> str:
        """The name the client gave in Hello."""
        ...

    @property
    def user(self) -> str:
        """The user the client logged in as ("" for a joining broker's link)."""
        ...

    @property
    def consumers(self) -> Mapping[int, Consumer]:
        """The session's consumers by tag."""
        ...

    @property
    def in_flight(self) -> int:
        """Commands read and not answered yet."""
        ...

    @property
    def paused(self) -> bool:
        """True while the client does not read (delivery waits)."""
        ...


def peek(node: Node, queue: str, count: int) -> Peeked:
    """The first ``count`` ready messages of ``queue``, in delivery order, not acquired.

    Args:
        node: this broker's replica (its applied state and store).
        queue: the queue's name.
        count: how many, 1..MAX_PEEK.

    Returns:
        ``[position, delivery_count, body, headers, publish_time]`` per message, lowest
        position first (the order a consumer would get them, docs/design.md §5.7); a
        message whose body this broker's store does not have yet (a join still brings
        it) is left out.

    Raises:
        QueueNotFound: no such queue.
        InvalidArgument: ``count`` out of 1..MAX_PEEK.
    """
    if type(count) is not int or not 1 <= count <= MAX_PEEK:
        raise InvalidArgument(f"peek count must be 1..{MAX_PEEK}")
    q = node.queues.get(queue)
    if q is None:
        raise QueueNotFound(f"queue {queue!r} does not exist")
    # Released positions (all below the cursor) come first, then the never-delivered run.
    positions = heapq.nsmallest(count, q.returned)
    fresh = min(count - len(positions), q.next_pos - q.cursor)
    positions.extend(range(q.cursor, q.cursor + fresh))
    stored = node.part(queue).store.get_messages(q.qid, positions) if positions else []
    rows: list[list[Any]] = []
    for p, m in zip(positions, stored):
        if m is not None:
            rows.append([p, q.counts.get(p, 0), m.body, m.headers, m.publish_time])
    return Peeked(queue, rows)


def list_connections(sessions: Iterable[ConnectionView]) -> ConnectionList:
    """This broker's client connections and their consumers, by peer address."""
    out: list[dict[str, Any]] = []
    for s in sorted(sessions, key=lambda s: s.peer):
        out.append(
            {
                "id": s.peer,
                "peer": s.peer,
                "client_name": s.client_name,
                "user": s.user,
                "in_flight": s.in_flight,
                "paused": s.paused,
                "consumers": [
                    {
                        "tag": c.tag,
                        "consumer_id": c.cid,
                        "queue": c.queue,
                        "prefetch": c.prefetch,
                        "held": len(c.held),
                        "credit": c.credit,
                    }
                    for _, c in sorted(s.consumers.items())
                ],
            }
        )
    return ConnectionList(out)
