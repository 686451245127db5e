"""Growing N: the broker side of ``baton partitions add --count M`` (docs/operations.md
"Growing N", docs/design.md §16).

The broker asked checks the request against the state it applied, makes the log have
the new partitions (Kafka: CreatePartitions on the topic; a file log: new
``partition-K/`` directories), and only then appends
:class:`~batonmq.cluster.events.GrowPartitions` to the control partition: a count is
never recorded that the log does not have. Every broker opens the new partitions when
it applies that event (cluster/growth.py); this one answers once it applies them
itself (or after a bounded wait, saying which it applies). Existing queues stay where
they are; placement puts new ones on the emptiest partitions, which are the new ones.
"""

from __future__ import annotations

import time
from typing import Any

from batonmq.cluster.errors import BatonError, InvalidArgument, LogUnavailable
from batonmq.cluster.events import GrowPartitions
from batonmq.cluster.log.base import MAX_PARTITIONS
from batonmq.cluster.node import Node
from batonmq.cluster.partitioned import Partitioned
from batonmq.cluster.results import PartitionsGrown

__all__ = ["grow_partitions", "MAX_DATA_PARTITIONS"]

#: The most data partitions a cluster may grow to (a control partition more on the log).
MAX_DATA_PARTITIONS = MAX_PARTITIONS - 1


def check_growth(node: Node, count: Any) -> int:
    """The data partitions the cluster had (``node``'s count), if growing to ``count``
    is possible.

    Raises:
        InvalidArgument: ``node`` is not a split cluster's, the flag ``partitions`` is
            off, ``count`` is not an integer, is too large, or is lower than the
            cluster's (shrinking is not possible).
    """
    if type(count) is not int or not 2 <= count <= MAX_DATA_PARTITIONS:
        raise InvalidArgument(
            f"the count of data partitions is an integer from 2 to {MAX_DATA_PARTITIONS},"
            f" not {count!r}"
        )
    if "partitions" not in node.state.features.enabled:
        raise InvalidArgument(
            "growing N needs the feature flag partitions: enable it with"
            " 'baton feature enable partitions'"
        )
    if not isinstance(node, Partitioned):
        raise InvalidArgument(
            "this cluster's log is one partition (started without --partitions N > 1):"
            " growing N is for a cluster of a control partition and data partitions;"
            " a log of one partition cannot be split"
        )
    if count < node.count:
        raise InvalidArgument(
            f"shrinking is not possible: this cluster has {node.count} data partitions and"
            f" a partition cannot be removed (its queues live there); ask for more than"
            f" {node.count}"
        )
    return node.count


async def grow_partitions(node: Node, count: Any, wait: float = 30.0) -> PartitionsGrown:
    """Grow the cluster to ``count`` data partitions (an admin's command).

    Args:
        node: this broker's node.
        count: the data partitions the cluster is to have (more than it has; as many:
            nothing changes).
        wait: how long to wait for this broker to open the new partitions.

    Returns:
        The count now and before, and which new partitions this broker applies already.

    Raises:
        InvalidArgument: as :func:`check_growth`, or the log refused to grow (Kafka).
        LogUnavailable: the log cannot be grown or the event appended.
    """
    before = check_growth(node, count)
    assert isinstance(node, Partitioned)
    if count == before:
        return PartitionsGrown(before, before, [])
    await node.logs.grow(count + 1)
    try:
        await node.submit(GrowPartitions(count))
    except BatonError as exc:
        if node.count >= count:  # another operator's command grew it as far first
            pass
        else:
            raise LogUnavailable(
                f"the log has {count} data partitions now, but recording them on the"
                f" control partition failed ({exc.message}): run the command again"
            ) from exc
    started = []
    deadline = time.monotonic() + wait
    for k in range(before + 1, count + 1):
        try:
            await node.growth.started(k, max(0.1, deadline - time.monotonic()))
        except LogUnavailable:
            break
        started.append(k)
    return PartitionsGrown(count, before, started)
