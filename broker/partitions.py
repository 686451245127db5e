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

Replica groups (docs/operations.md "Replica groups"): the broker side of ``baton
partitions move``, ``rebalance`` and ``replicas``. Each checks the request against
control's groups and live members as applied here (the planner's own code,
cluster/assignment.py) and appends AddReplica or SetReplication to control; the rest is
the groups' own machinery (a joining broker catches up, says ReplicaReady, the leaving
one deletes its copy; the leader's planner adds or trims to the group size).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from batonmq.cluster.assignment import move, rebalance
from batonmq.cluster.errors import BatonError, InvalidArgument, LogUnavailable
from batonmq.cluster.events import AddReplica, GrowPartitions, SetReplication
from batonmq.cluster.groups import MAX_REPLICAS
from batonmq.cluster.log.base import MAX_PARTITIONS
from batonmq.cluster.node import Node
from batonmq.cluster.partitioned import Partitioned
from batonmq.cluster.results import GroupChanged, PartitionsGrown, Rebalanced, ReplicationSet

__all__ = [
    "grow_partitions",
    "move_partition",
    "rebalance_partitions",
    "set_replicas",
    "MAX_DATA_PARTITIONS",
]

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


async def grow_partitions(node: Node, count: Any, wait: float = 8.0) -> PartitionsGrown:
    """Grow the cluster to ``count`` data partitions (an admin's command).

    Args:
        node: this broker's node.
        count: the data partitions the cluster is to have (more than it has; as many:
            nothing changes).
        wait: how long to wait for this broker to open the new partitions (below the
            command line's 10 s for an answer); one given to a replica group without
            this broker is not waited for.

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
        # Opened here, or given to a replica group without this broker (then it is not
        # opened here at all: no use waiting for it).
        while k not in node.data and k in node.wanted() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if k in node.data:
            started.append(k)
    return PartitionsGrown(count, before, started)


# --- replica groups: the operator's moves (docs/operations.md "Replica groups") --------


def _grouped(node: Node) -> Partitioned:
    """``node`` as a split cluster's control node whose partitions have replica groups.

    Raises:
        InvalidArgument: a log of one partition, the flag ``replica_groups`` off, or no
            group recorded yet.
    """
    if not isinstance(node, Partitioned):
        raise InvalidArgument(
            "this cluster's log is one partition (started without --partitions N > 1):"
            " it has no replica groups"
        )
    if not node.replication.active:
        raise InvalidArgument(
            "this cluster has no replica groups: enable the feature flag replica_groups"
            " with 'baton feature enable replica_groups'"
        )
    return node


def _partition(node: Partitioned, partition: Any) -> int:
    if type(partition) is not int or not 1 <= partition <= node.count:
        raise InvalidArgument(
            f"data partition {partition!r} does not exist (this cluster has 1 to {node.count})"
        )
    return partition


async def move_partition(node: Node, partition: Any, source: Any, target: Any) -> GroupChanged:
    """Move data partition ``partition``'s replica from broker ``source`` to ``target``
    (node ids; an admin's command): ``target`` joins the group and catches up, then
    ``source`` leaves it and deletes its copy (cluster/replication.py).

    Returns:
        The group as the move left it (``target`` joining, ``source`` leaving).

    Raises:
        InvalidArgument: no groups, an unknown partition, ``source`` not one of its
            replicas, ``target`` in its group already or not a live member, a move in
            flight (:func:`batonmq.cluster.assignment.move`), or the group changed
            meanwhile.
    """
    control = _grouped(node)
    k = _partition(control, partition)
    for what, name in (("source", source), ("target", target)):
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"the {what} broker is a node id, not {name!r}")
    groups = control.state.groups.groups
    step = move(groups, k, source, target, control.replication.live_nodes())
    changed = await control.submit(AddReplica(k, target, step.instead))
    if changed is None:  # (ignored: the group changed between the check and the append)
        raise InvalidArgument(
            f"partition {k}'s group changed meanwhile: see 'baton partitions list' and"
            " ask again"
        )
    assert isinstance(changed, GroupChanged)
    return changed


async def rebalance_partitions(node: Node, dry_run: Any) -> Rebalanced:
    """The moves that even out the partitions each live broker holds (the planner's rule
    5, bounded as it bounds them), appended unless ``dry_run``.

    Returns:
        Each move as ``{"partition", "to", "from"}``, and whether they were appended
        (those refused meanwhile are left out).

    Raises:
        InvalidArgument: no groups, or ``dry_run`` not a boolean.
    """
    control = _grouped(node)
    if not isinstance(dry_run, bool):
        raise InvalidArgument(f"dry_run is true or false, not {dry_run!r}")
    groups = control.state.groups
    steps = rebalance(control.count, groups.replicas, control.replication.live_nodes(),
                      groups.groups)
    moves = [{"partition": s.partition, "to": s.nodes[0], "from": s.instead} for s in steps]
    if dry_run or not steps:
        return Rebalanced(moves, False)
    results = await asyncio.gather(
        *(control.submit(AddReplica(s.partition, s.nodes[0], s.instead)) for s in steps),
        return_exceptions=True,
    )
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, BatonError):
            raise r
    done = [m for m, r in zip(moves, results) if isinstance(r, GroupChanged)]
    return Rebalanced(done, True)


async def set_replicas(node: Node, replicas: Any) -> ReplicationSet:
    """Set the group size the cluster wants (an admin's command): the control leader's
    planner then adds replicas to smaller groups or trims larger ones.

    Raises:
        InvalidArgument: no groups, or ``replicas`` not an integer from 1 to
            :data:`~batonmq.cluster.groups.MAX_REPLICAS`.
    """
    if type(replicas) is not int or not 1 <= replicas <= MAX_REPLICAS:
        raise InvalidArgument(
            f"a replica group has 1 to {MAX_REPLICAS} brokers, not {replicas!r}"
        )
    control = _grouped(node)
    result = await control.submit(SetReplication(replicas))
    assert isinstance(result, ReplicationSet)
    return result
