"""The cluster's topology as a client sees it, and the listener events (docs/design.md §7).

Pure: no I/O, no clock. :class:`Topology` is one snapshot of the ``topology``
command's answer; :class:`TopologyTracker` turns a sequence of snapshots (with the
caller's notion of "now") into :class:`TopologyEvent` s — INIT, CHANGING, CHANGED
and PROPERTIES_CHANGED, as in the Sling discovery API — coalesced over a minimum
event delay. :meth:`batonmq.clients.Connection.watch_topology` is the asyncio driver that
polls the broker and feeds the tracker.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batonmq.cluster.errors import ProtocolError

__all__ = ["Instance", "Topology", "TopologyEventType", "TopologyEvent", "TopologyTracker"]


@dataclass(frozen=True, slots=True)
class Instance:
    """One member of the view: a broker runtime."""

    node_id: str
    runtime: str
    role: str  # "voter" or "observer"
    address: str
    leader: bool
    local: bool  # the broker that answered the topology command
    properties: Mapping[str, Any]

    @property
    def key(self) -> str:
        """``"node_id/runtime"``: the member's identity in the view."""
        return f"{self.node_id}/{self.runtime}"

    def compared(self) -> tuple[Any, ...]:
        """What a PROPERTIES_CHANGED event compares: role, address, leadership and
        properties. ``local`` is left out: it names the answering broker, which
        changes when the client fails over, not the cluster."""
        return (self.role, self.address, self.leader, dict(self.properties))


@dataclass(frozen=True, slots=True)
class Topology:
    """One snapshot of the cluster: the established view and its members.

    Attributes:
        cluster_id: the cluster's persistent id.
        view: the established view's sequence number.
        changing: True while a new view is being agreed.
        leader: the leader's ``"node_id/runtime"`` (or None).
        instances: the members in the cluster's stable order.
    """

    cluster_id: str
    view: int
    changing: bool
    leader: str | None
    instances: tuple[Instance, ...]

    @classmethod
    def from_mapping(cls, result: Mapping[str, Any]) -> Topology:
        """Build from the ``topology`` command's result (:meth:`Connection.topology`).

        Raises:
            ProtocolError: the mapping lacks a field or has one of the wrong type.
        """
        try:
            instances = tuple(
                Instance(
                    str(i["node_id"]),
                    str(i["runtime"]),
                    str(i["role"]),
                    str(i["address"]),
                    bool(i["leader"]),
                    bool(i["local"]),
                    dict(i.get("properties") or {}),
                )
                for i in result["instances"]
            )
            leader = result.get("leader")
            return cls(
                str(result["cluster_id"]),
                int(result["view"]),
                bool(result.get("changing", False)),
                None if leader is None else str(leader),
                instances,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed topology result: {exc!r}") from exc

    @property
    def members(self) -> tuple[str, ...]:
        """The members' ``"node_id/runtime"`` keys, in view order."""
        return tuple(i.key for i in self.instances)

    @property
    def local(self) -> Instance | None:
        """The instance that answered, if it is a member."""
        for i in self.instances:
            if i.local:
                return i
        return None


class TopologyEventType(enum.Enum):
    """What happened to the topology (docs/design.md §7)."""

    INIT = "init"  # the first snapshot
    CHANGING = "changing"  # a view change is under way
    CHANGED = "changed"  # a new view (other number or members), or a change settled
    PROPERTIES_CHANGED = "properties_changed"  # same members, an instance's properties


@dataclass(frozen=True, slots=True)
class TopologyEvent:
    """One listener event: its type, the topology reported before (None for INIT)
    and the topology now."""

    type: TopologyEventType
    old: Topology | None
    new: Topology


def classify(old: Topology, new: Topology) -> TopologyEventType | None:
    """The event that takes a listener from ``old`` to ``new``, or None if nothing
    it cares about differs."""
    if new.view != old.view or new.cluster_id != old.cluster_id or new.members != old.members:
        return TopologyEventType.CHANGED
    if new.changing and not old.changing:
        return TopologyEventType.CHANGING
    if old.changing and not new.changing:
        return TopologyEventType.CHANGED  # the change settled without a new view
    if new.leader != old.leader or any(
        a.compared() != b.compared() for a, b in zip(old.instances, new.instances)
    ):
        return TopologyEventType.PROPERTIES_CHANGED
    return None


class TopologyTracker:
    """Snapshots in, events out, coalesced over ``min_event_delay`` seconds.

    The first snapshot gives INIT. Later, a snapshot that differs from the last
    *reported* one gives one event — unless less than ``min_event_delay`` passed
    since the last event: then it is held, and the next snapshot after the delay is
    compared with the last reported one instead, so a burst of changes (CHANGING
    then CHANGED, several property updates) reaches the listener as one event.
    A change that reverts within the delay is not reported at all.

    Args:
        min_event_delay: seconds between two events, at least.
    """

    __slots__ = ("min_event_delay", "_reported", "_last_event")

    def __init__(self, min_event_delay: float = 0.2) -> None:
        if min_event_delay < 0:
            raise ValueError("min_event_delay must be >= 0")
        self.min_event_delay = min_event_delay
        self._reported: Topology | None = None
        self._last_event = 0.0

    @property
    def current(self) -> Topology | None:
        """The topology the last event reported (None before INIT)."""
        return self._reported

    def observe(self, topology: Topology, now: float) -> list[TopologyEvent]:
        """Feed one snapshot taken at ``now`` (any monotonic clock, in seconds).

        Returns:
            The events to deliver now: zero or one.
        """
        old = self._reported
        if old is None:
            self._reported, self._last_event = topology, now
            return [TopologyEvent(TopologyEventType.INIT, None, topology)]
        kind = classify(old, topology)
        if kind is None or now - self._last_event < self.min_event_delay:
            return []
        self._reported, self._last_event = topology, now
        return [TopologyEvent(kind, old, topology)]
