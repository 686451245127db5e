"""Replica groups: which brokers apply each data partition (docs/design.md §16,
"Replica groups").

Pure: no I/O, no clock. Kept by the control partition's state (flag ``replica_groups``)
and changed only by its events, in log order, so every broker agrees on every group:

* :class:`~batonmq.cluster.events.AssignReplicas` — a partition never assigned gets its
  group, caught up at once;
* :class:`~batonmq.cluster.events.AddReplica` — a broker joins a group (catching up),
  perhaps *instead* of one that leaves when it is ready (a move);
* :class:`~batonmq.cluster.events.ReplicaReady` — a joining broker is caught up;
* :class:`~batonmq.cluster.events.RemoveReplica` — a broker leaves a group at once;
* :class:`~batonmq.cluster.events.SetReplication` — the group size the cluster wants.

What each does to a group is :mod:`batonmq.cluster.assignment`'s (:func:`apply_step`,
:func:`ready`), the same code its planner and the placement simulator run. Groups name
brokers by persistent node id, so a broker that restarts is still in its groups.
"""

from __future__ import annotations

from typing import Any

from batonmq.cluster.assignment import Group, Step, apply_step, ready
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import (
    AddReplica,
    AssignReplicas,
    RemoveReplica,
    ReplicaReady,
    SetReplication,
)
from batonmq.cluster.results import GroupChanged, ReplicationSet

__all__ = ["ReplicaGroups", "DEFAULT_REPLICAS", "MAX_REPLICAS", "GroupEvent"]

#: The largest group size a cluster may set.
MAX_REPLICAS = 15
#: The group size of a cluster that set none: 3 (capped by the members there are, so a
#: cluster of 1 to 3 brokers has every broker in every group), as NATS JetStream and
#: RabbitMQ quorum queues default to; ``--replicas R`` sets another. It is code, not
#: recorded: a setting of 0 on control means "this default" on every broker.
DEFAULT_REPLICAS = 3
#: The largest partition number a group may name (placement's own cap).
_MAX_PARTITION = 1024

GroupEvent = AssignReplicas | AddReplica | ReplicaReady | RemoveReplica | SetReplication


class ReplicaGroups:
    """Data partition -> its group, and the cluster's replication setting (0: the
    default, :data:`DEFAULT_REPLICAS`)."""

    __slots__ = ("groups", "setting")

    def __init__(self) -> None:
        self.groups: dict[int, Group] = {}
        self.setting = 0

    def __bool__(self) -> bool:
        """Whether there is anything to snapshot."""
        return bool(self.groups) or self.setting > 0

    @property
    def replicas(self) -> int:
        """The group size the cluster wants (before capping by its members)."""
        return self.setting or DEFAULT_REPLICAS

    def of(self, node: str) -> set[int]:
        """The partitions ``node`` applies: those whose group it is in, or joining."""
        return {k for k, g in self.groups.items() if node in g.replicas or node in g.joining}

    def apply(self, ev: GroupEvent, ignore: Any) -> GroupChanged | ReplicationSet | None:
        """Apply one group event; one that changes nothing is ignored (``ignore`` names
        why: another broker's copy of it came first).

        Raises:
            InvalidArgument: a partition or group size out of range, an empty group.
        """
        if isinstance(ev, SetReplication):
            if not 1 <= ev.replicas <= MAX_REPLICAS:
                raise InvalidArgument(
                    f"a replica group has 1 to {MAX_REPLICAS} brokers, not {ev.replicas}"
                )
            before = self.setting
            if ev.initial and before:
                ignore("replication-set")
                return None
            self.setting = ev.replicas
            return ReplicationSet(ev.replicas, before)
        k = ev.partition
        if not 1 <= k <= _MAX_PARTITION:
            raise InvalidArgument(f"data partition {k} does not exist")
        group = self.groups.get(k)
        if isinstance(ev, AssignReplicas):
            if not ev.nodes or len(set(ev.nodes)) != len(ev.nodes) or "" in ev.nodes:
                raise InvalidArgument("a replica group names one broker or more, once each")
            if group is not None:
                ignore("assigned")  # (the first assignment of a partition counts)
                return None
            self.groups = apply_step(self.groups, Step("assign", k, tuple(ev.nodes)))
        elif group is None:
            ignore("unassigned")
            return None
        elif isinstance(ev, AddReplica):
            if not ev.node or ev.node in group.replicas or ev.node in group.joining:
                ignore("in-group")
                return None
            if ev.instead is not None and (
                ev.instead not in group.replicas or ev.instead in group.leaving
            ):
                ignore("not-leaving")
                return None
            self.groups = apply_step(self.groups, Step("add", k, (ev.node,), ev.instead))
        elif isinstance(ev, ReplicaReady):
            if ev.node not in group.joining:
                ignore("not-joining")
                return None
            self.groups = ready(self.groups, k, ev.node)
        else:
            if ev.node not in group.replicas and ev.node not in group.joining:
                ignore("not-in-group")
                return None
            self.groups = apply_step(self.groups, Step("remove", k, (ev.node,)))
        g = self.groups[k]
        return GroupChanged(k, list(g.replicas), list(g.joining), list(g.leaving))

    # -- snapshot ------------------------------------------------------------------------

    def snapshot(self) -> list[Any]:
        return [
            self.setting,
            [[k, list(g.replicas), list(g.joining), list(g.leaving)]
             for k, g in sorted(self.groups.items())],
        ]

    def restore(self, snap: list[Any] | None) -> None:
        self.setting = 0 if snap is None else int(snap[0])
        self.groups = {} if snap is None else {
            int(k): Group(tuple(r), tuple(j), tuple(lv)) for k, r, j, lv in snap[1]
        }
