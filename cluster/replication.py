"""One broker's part in replica groups (docs/design.md §16, "Replica groups").

With the flag ``replica_groups`` on a split log, each data partition is applied by the
brokers of its group only (cluster/groups.py, on control). A broker:

* applies (opens, through :class:`~batonmq.cluster.growth.Growth`) the partitions whose
  group it is in or joining, and every partition that has no group yet (a partition is
  applied by every broker until its first assignment, as before groups);
* closes a partition whose group it left: its node leaves the partition's view and
  stops, and its store is deleted (it left only once a joining broker was caught up:
  the handover);
* says :class:`~batonmq.cluster.events.ReplicaReady` on control for a partition it was
  joining once its node is a member of the partition's view (caught up by the join
  update of that partition alone);
* as the control partition's leader, plans (:func:`batonmq.cluster.assignment.plan`,
  once a second) and appends what the plan says: a group for each partition that has
  none, a broker added where one is missing, a broker out of the view for longer than
  ``replace_after`` seconds replaced (a restart within it moves nothing), a group larger
  than the setting trimmed, and moves that even out the partitions per broker.

Not pure: it drives nodes and stores. The decisions are the planner's (pure) and the
events' (applied in control's log order), so every broker agrees on every group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from batonmq.cluster.appender import ignore_outcome
from batonmq.cluster.assignment import Group, Step, effective_r, plan
from batonmq.cluster.errors import PARTITION_CLOSED, BatonError
from batonmq.cluster.events import (
    AddReplica,
    AssignReplicas,
    Event,
    RemoveReplica,
    ReplicaReady,
    SetReplication,
)
from batonmq.cluster.node import Node
from batonmq.cluster.state import State

__all__ = ["Replication", "Replicated", "REPLACE_AFTER"]


class _Opener(Protocol):
    def check(self) -> None: ...


class Replicated(Protocol):
    """What :class:`Replication` needs of the broker's control node
    (:class:`~batonmq.cluster.partitioned.Partitioned`)."""

    node_id: str
    key: str
    state: State
    data: dict[int, Node]
    joined: asyncio.Event
    closed_seqs: dict[int, int]

    @property
    def count(self) -> int: ...

    @property
    def growth(self) -> _Opener: ...

    def submit(self, event: Event[Any]) -> "asyncio.Future[Any]": ...

log = logging.getLogger("baton.node")

#: Seconds a broker may be out of the view before its groups replace it (default).
REPLACE_AFTER = 30.0


class Replication:
    """What one broker applies of the data partitions, and its planning as leader.

    Args:
        owner: the broker's control node.
        replicas: the group size this broker was started with (``--replicas``; 0: none
            given), recorded on a cluster that has none yet.
        replace_after: seconds out of the view before a broker's groups replace it.
    """

    def __init__(
        self, owner: Replicated, replicas: int = 0, replace_after: float = REPLACE_AFTER
    ) -> None:
        self._owner = owner
        self.replicas = replicas
        self.replace_after = replace_after
        self._missing_since: dict[str, float] = {}  # node id -> when first seen out of view
        #: Data partitions being closed here (not opened again meanwhile).
        self.closing: set[int] = set()
        self._ready_sent: dict[int, float] = {}  # partition -> when ReplicaReady was sent
        self._planning: asyncio.Future[None] | None = None  # the plan under way (leader)
        #: Called with a data partition's number once this broker stopped applying it.
        self.on_closed: Callable[[int], None] | None = None
        #: Deletes a closed partition's store (set by the broker).
        self.drop_store: Callable[[int], None] | None = None

    # -- what this broker applies --------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether groups decide what this broker applies (the flag is on)."""
        return "replica_groups" in self._owner.state.features.enabled

    def wanted(self) -> set[int]:
        """The data partitions this broker should apply: every one without a group, and
        those whose group it is in (or joining)."""
        owner = self._owner
        every = set(range(1, owner.count + 1))
        if not self.active:
            return every
        groups = owner.state.groups.groups
        me = owner.node_id
        return {k for k in every if k not in groups or me in groups[k].replicas
                or me in groups[k].joining}

    def group(self, k: int) -> Group | None:
        return self._owner.state.groups.groups.get(k) if self.active else None

    def addresses(self, k: int) -> list[str]:
        """Client addresses of the live brokers that serve data partition ``k`` (its
        group's caught-up replicas, in group order), as control's view says."""
        owner = self._owner
        g = self.group(k)
        ms = owner.state.membership
        by_node: dict[str, str] = {}
        for key in ms.members:
            m = ms.known.get(key)
            if m is not None and m.address and not ms.suspected(key):
                by_node.setdefault(m.node, m.address)
        nodes = g.replicas if g is not None else tuple(by_node)
        return [by_node[n] for n in nodes if n in by_node]

    def live_replicas(self, k: int) -> tuple[int, int]:
        """(live caught-up replicas, group size) of data partition ``k`` as control's
        view says (the group size is the group's, else every member's)."""
        g = self.group(k)
        live = self.live_nodes()
        if g is None:
            return len(live), len(live)
        return sum(1 for n in g.replicas if n in live), len(g.replicas)

    def under_replicated(self) -> list[int]:
        """The data partitions whose live caught-up replicas are fewer than the group
        size the planner wants (``min(R, live members)``), as control's view says."""
        if not self.active:
            return []
        live = self.live_nodes()
        want = effective_r(self._owner.state.groups.replicas, live)
        groups = self._owner.state.groups.groups
        return [k for k in range(1, self._owner.count + 1) if k in groups
                and sum(1 for n in groups[k].replicas if n in live) < want]

    def short_of_majority(self) -> list[tuple[int, int, int]]:
        """(partition, live caught-up replicas, group size) of each data partition with
        fewer than a majority of its group's replicas live (a partition's view needs a
        majority to change: docs/operations.md "Replica groups")."""
        out = []
        for k in range(1, self._owner.count + 1):
            live, size = self.live_replicas(k)
            if self.group(k) is not None and live < size // 2 + 1:
                out.append((k, live, size))
        return out

    def live_nodes(self) -> list[str]:
        """Node ids of the live members of control's view, in view order."""
        ms = self._owner.state.membership
        nodes: list[str] = []
        for key in ms.members:
            m = ms.known.get(key)
            if m is not None and not ms.suspected(key) and m.node not in nodes:
                nodes.append(m.node)
        return nodes

    def pending(self) -> list[int]:
        """The data partitions this broker is to serve and does not yet: those whose
        group it is joining, and those the planner (run here on control's state as
        applied, as the leader runs it) would give it to repair a group (not a move)."""
        owner = self._owner
        if not self.active:
            return []
        groups = owner.state.groups
        me = owner.node_id
        todo = {k for k, g in groups.groups.items() if me in g.joining}
        members = self.live_nodes()
        if me in members:
            for s in plan(owner.count, groups.replicas, members, groups.groups):
                if me in s.nodes and (s.kind == "assign" or s.kind == "add" and not s.instead):
                    todo.add(s.partition)
        return sorted(todo)

    async def settle(self, timeout: float) -> None:
        """At start: wait (at most ``timeout`` s) until this broker serves what it is
        to serve (:meth:`pending`), so that a broker is ready once it is a replica of
        the partitions a new cluster or a repair gives it."""
        deadline = time.monotonic() + timeout
        while (todo := self.pending()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if todo:
            log.warning("node %s: still catching up with data partition(s) %s: serving"
                        " meanwhile what it has", self._owner.key, ", ".join(map(str, todo)))

    # -- after each applied control batch, and once a second ------------------------------

    def check(self) -> None:
        """Close what this broker no longer applies; open what it should (Growth)."""
        owner = self._owner
        if not self.active:
            return
        wanted = self.wanted()
        for k in sorted(set(owner.data) - wanted - self.closing):
            self.closing.add(k)
            asyncio.ensure_future(self._close(k))
        owner.growth.check()
        if owner.joined.is_set():
            # At once rather than at the next tick: a broker caught up says so, and the
            # leader plans what a view or group change calls for.
            self._say_ready()
            if owner.state.membership.leader() == owner.key and self._planning is None:
                self._planning = asyncio.ensure_future(self._plan_once())

    async def tick(self) -> None:
        """Once a second: say ReplicaReady where caught up; plan, if leading control."""
        owner = self._owner
        if not self.active or not owner.joined.is_set():
            return
        self._say_ready()
        if self.replicas and not owner.state.groups.setting:
            owner.submit(SetReplication(self.replicas, initial=True)).add_done_callback(
                ignore_outcome
            )
        if owner.state.membership.leader() == owner.key:
            if self._planning is None:
                self._planning = asyncio.ensure_future(self._plan_once())
                await self._planning
        else:
            self._missing_since.clear()

    async def _plan_once(self) -> None:
        """One plan at a time: its steps are applied before the next plan reads them."""
        try:
            await self._plan()
        except Exception:  # a bug: said with its traceback, never a crash
            log.exception("node %s: planning replica groups failed", self._owner.key)
        finally:
            self._planning = None

    def _say_ready(self) -> None:
        owner = self._owner
        now = time.monotonic()
        for k, node in list(owner.data.items()):
            g = self.group(k)
            if g is None or owner.node_id not in g.joining or not node.joined.is_set():
                self._ready_sent.pop(k, None)
                continue
            if now - self._ready_sent.get(k, 0.0) < 5.0:
                continue  # (sent: wait for it to be applied)
            self._ready_sent[k] = now
            log.info("node %s: caught up with data partition %d: a replica now", owner.key, k)
            owner.submit(ReplicaReady(k, owner.node_id)).add_done_callback(ignore_outcome)

    async def _plan(self) -> None:
        owner = self._owner
        groups = owner.state.groups
        members = self.live_nodes()
        if not members or owner.count < 1:
            return
        now = time.monotonic()
        grouped = {n for g in groups.groups.values() for n in (*g.replicas, *g.joining)}
        for n in grouped - set(members):
            self._missing_since.setdefault(n, now)
        for n in list(self._missing_since):
            if n in members or n not in grouped:
                del self._missing_since[n]
        gone = {n for n, t in self._missing_since.items() if now - t >= self.replace_after}
        steps = plan(owner.count, groups.replicas, members, groups.groups, frozenset(gone))
        if not steps:
            return
        results = await asyncio.gather(
            *(owner.submit(_event(s)) for s in steps), return_exceptions=True
        )
        for step, r in zip(steps, results):
            if isinstance(r, BaseException):
                log.warning("node %s: replica group step %s refused: %s", owner.key, step, r)
            else:
                log.info("node %s: replica groups: %s %s on data partition %d%s", owner.key,
                         step.kind, ", ".join(step.nodes), step.partition,
                         f" instead of {step.instead}" if step.instead else "")
        want = effective_r(groups.replicas, members)
        for k, g in groups.groups.items():
            if not any(n in members for n in g.replicas):
                log.error("data partition %d has no live replica (of %s): it is unavailable"
                          " until one is back", k, ", ".join(g.replicas))
            elif len(g.replicas) < want and not g.joining:
                log.warning("data partition %d has %d of %d replicas", k, len(g.replicas), want)

    async def _close(self, k: int) -> None:
        """Stop applying data partition ``k`` here, and delete its data."""
        owner = self._owner
        try:
            node = owner.data.pop(k, None)
            if node is None:
                return
            log.info("node %s: no longer in data partition %d's group: leaving it and"
                     " deleting its data here", owner.key, k)
            try:
                await node.leave()
            except BatonError as exc:
                log.warning("partition %d: leaving its view failed (%s): stopping anyway",
                            k, exc)
            await node.stop(why=f"data partition {k} {PARTITION_CLOSED}")
            owner.closed_seqs[k] = node.appender.seq  # (if it is given the partition again)
            if self.on_closed is not None:
                self.on_closed(k)
            if self.drop_store is not None:
                self.drop_store(k)
        except Exception:  # a bug: said with its traceback, never a crash
            log.exception("node %s: closing data partition %d failed", owner.key, k)
        finally:
            self.closing.discard(k)


def _event(step: Step) -> Event[Any]:
    """The control event that makes ``step`` so."""
    if step.kind == "assign":
        return AssignReplicas(step.partition, step.nodes)
    if step.kind == "add":
        return AddReplica(step.partition, step.nodes[0], step.instead)
    return RemoveReplica(step.partition, step.nodes[0])
