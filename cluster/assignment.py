"""Replica groups: which brokers apply, store and serve each data partition (docs/design.md
§16, "Replica groups: the planner").

Pure: no I/O, no clock, no randomness, and deterministic (nothing iterates a set or a
dict whose order could differ between processes: nodes are ordered by the members' order,
partitions by number). The control partition's leader calls :func:`plan` with what it
applied and records the steps on control as events; the placement simulator
(``python -m batonmq.loadtest.sim_placement``) runs the same code on virtual clusters.
:func:`apply_step` and :func:`ready` define what a step and a caught-up joining node do to
the groups, for the simulator and the state table alike.

A node is *live* when it is in ``members`` (live in control's view, eligible), *gone*
when it is in ``gone`` (out of the view past the replace delay), and *down* otherwise: a
node of a group that is neither is kept, so that a restart moves no data. R_eff is
``min(r, len(members))`` (at least 1). A node *holds* a partition when it is one of the
group's replicas or joining nodes and not leaving: what it will hold once the moves in
flight finish, so that a move counts at once for both ends and is never planned twice.

The rules, in priority order (each one sees the steps of those before it):

1. *Assign.* A partition of ``1..count`` with no group (a new cluster, a grown one) is
   assigned R_eff members at once, ready (its partition is empty, or every member applied
   it until then), best first: fewest partitions held, then lowest ``load``, then member
   order.
2. *Replace the gone.* A node of a group that is in ``gone`` is removed, joining or
   replica. A down node is kept. A partition whose every replica is gone is still
   cleaned up; :func:`orphans` names those (no caught-up copy is left to copy from; the
   caller reports them).
3. *Repair.* A group that holds fewer than R_eff nodes (down ones count) gets ``add``s,
   one per missing node, on the best members not in it (the order of rule 1). Repair is
   not bounded by ``max_moves``.
4. *Trim.* A group with no joining node that has more than R_eff live holders (R lowered,
   a repair done) loses the replica on the most loaded live node (ties: the last in member
   order); down nodes are not counted, so a broker briefly out of the view (R_eff lower
   while it is) loses nothing. It always keeps R_eff >= 1 live replicas.
5. *Rebalance.* While two live members differ by more than one partition held and fewer
   than ``max_moves`` moves are in flight (groups with a leaving replica), the least loaded
   member joins a partition of the most loaded one that it lacks (``add`` with
   ``instead``: the most loaded leaves once it is ready). Only a group with nothing joining
   or leaving moves, so a partition has at most one move at a time.

Applying the steps and making the joining nodes ready, then planning again, converges: a
steady cluster plans nothing (tests/unit/test_assignment.py, tests/property/).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Literal

from batonmq.cluster.errors import InvalidArgument

__all__ = [
    "Group",
    "Step",
    "effective_r",
    "holders",
    "plan",
    "rebalance",
    "move",
    "apply_step",
    "ready",
    "orphans",
]


@dataclass(frozen=True, slots=True)
class Group:
    """A data partition's replica group, by persistent node id."""

    replicas: tuple[str, ...]  # caught up: apply, store and serve the partition
    joining: tuple[str, ...] = ()  # assigned, catching up (a join update of that partition)
    leaving: tuple[str, ...] = ()  # replicas that leave once every joining one is ready
    # (a subset of replicas; a move = join one + leave one)


@dataclass(frozen=True, slots=True)
class Step:
    """One change of one partition's group, as the leader records it."""

    kind: Literal["assign", "add", "remove"]
    partition: int
    nodes: tuple[str, ...]  # assign: the whole new group (ready at once); add/remove: one node
    instead: str | None = None  # add: the replica that leaves when this one is ready


def effective_r(r: int, members: Sequence[str]) -> int:
    """The replication a cluster can have: ``min(r, len(members))``, at least 1."""
    return max(1, min(r, len(members)))


def holders(group: Group) -> tuple[str, ...]:
    """The nodes that hold ``group``'s partition once its moves finish: replicas and
    joining nodes, without the leaving ones."""
    return tuple(n for n in group.replicas + group.joining if n not in group.leaving)


# --- what a step and a ready node do --------------------------------------------------


def _stepped(group: Group | None, step: Step) -> Group:
    """``group`` after ``step`` (see :func:`apply_step`)."""
    p = step.partition
    if step.kind == "assign":
        if not step.nodes or len(set(step.nodes)) != len(step.nodes):
            raise InvalidArgument(f"an assign of partition {p} needs distinct nodes, got {list(step.nodes)}")
        return Group(tuple(step.nodes))
    if len(step.nodes) != 1:
        raise InvalidArgument(f"an {step.kind} of partition {p} names one node, got {list(step.nodes)}")
    if group is None:
        raise InvalidArgument(f"partition {p} has no replica group yet")
    node = step.nodes[0]
    if step.kind == "add":
        if node in group.replicas or node in group.joining:
            raise InvalidArgument(f"{node} is already in partition {p}'s group")
        leaving = group.leaving
        if step.instead is not None:
            if step.instead not in group.replicas or step.instead in group.leaving:
                raise InvalidArgument(
                    f"{step.instead} is not a replica of partition {p} that could leave"
                )
            leaving += (step.instead,)
        return Group(group.replicas, group.joining + (node,), leaving)
    if step.kind == "remove":
        if node not in group.replicas and node not in group.joining:
            raise InvalidArgument(f"{node} is not in partition {p}'s group")
        joining = tuple(n for n in group.joining if n != node)
        leaving = tuple(n for n in group.leaving if n != node)
        # A move whose joining node is removed is cancelled: its leaving replica stays.
        leaving = leaving[: len(joining)]
        return Group(tuple(n for n in group.replicas if n != node), joining, leaving)
    raise InvalidArgument(f"unknown step kind {step.kind!r}")


def apply_step(groups: Mapping[int, Group], step: Step) -> dict[int, Group]:
    """The groups after ``step``: ``assign`` sets the whole group, ready; ``add`` makes a
    node join (and, with ``instead``, that replica leaving); ``remove`` drops a node
    wherever it is (a move whose joining node is dropped is cancelled: the leaving replica
    stays).

    Args:
        groups: partition -> group; not changed.
        step: one step of :func:`plan`, :func:`move` or :func:`rebalance`.

    Returns:
        A new mapping.

    Raises:
        InvalidArgument: the step does not fit the group (a node already in it, a node to
            remove that is not, a partition with no group).
    """
    out = dict(groups)
    out[step.partition] = _stepped(groups.get(step.partition), step)
    return out


def ready(groups: Mapping[int, Group], partition: int, node: str) -> dict[int, Group]:
    """The groups once the joining ``node`` of ``partition`` is caught up: it becomes a
    replica, and when no joining node remains every leaving replica leaves.

    Raises:
        InvalidArgument: ``node`` is not joining ``partition``.
    """
    group = groups.get(partition)
    if group is None or node not in group.joining:
        raise InvalidArgument(f"{node} is not joining partition {partition}")
    joining = tuple(n for n in group.joining if n != node)
    replicas = group.replicas + (node,)
    leaving = group.leaving
    if not joining:
        replicas = tuple(n for n in replicas if n not in leaving)
        leaving = ()
    out = dict(groups)
    out[partition] = Group(replicas, joining, leaving)
    return out


def orphans(groups: Mapping[int, Group], gone: AbstractSet[str]) -> tuple[int, ...]:
    """The partitions none of whose replicas is outside ``gone``: rule 2 removes them all,
    and no caught-up copy is left for a joining node to copy from (the caller reports them:
    their data is on the log only, and lost past its retention)."""
    return tuple(
        p for p in sorted(groups) if not any(n not in gone for n in groups[p].replicas)
    )


# --- the planner ------------------------------------------------------------------------


class _Planner:
    """One call's working copy of the groups and of how many partitions each node holds,
    kept up to date as steps are planned."""

    def __init__(
        self, count: int, r: int, members: Sequence[str], groups: Mapping[int, Group],
        gone: AbstractSet[str], load: Mapping[str, float] | None,
    ) -> None:
        self.count = count
        self.gone = gone
        live = [m for m in dict.fromkeys(members) if m not in gone]
        self.order = {m: i for i, m in enumerate(live)}
        self.members = tuple(live)
        self.r = effective_r(r, self.members)
        self.load = load or {}
        self.groups = dict(groups)
        self.held: dict[str, int] = {m: 0 for m in self.members}
        for group in self.groups.values():
            for n in holders(group):
                self.held[n] = self.held.get(n, 0) + 1
        self.steps: list[Step] = []
        # Every partition acted on: 1..count and any group beyond (none, normally).
        self.partitions = sorted(set(range(1, count + 1)) | set(self.groups))

    def take(self, step: Step) -> None:
        old = self.groups.get(step.partition)
        new = _stepped(old, step)
        for n in holders(old) if old is not None else ():
            self.held[n] -= 1
        for n in holders(new):
            self.held[n] = self.held.get(n, 0) + 1
        self.groups[step.partition] = new
        self.steps.append(step)

    def _rank(self, node: str) -> tuple[int, float, int]:
        """Least loaded first: fewest held, lowest load, member order."""
        return (self.held.get(node, 0), self.load.get(node, 0.0), self.order[node])

    def best(self, exclude: Sequence[str]) -> str | None:
        """The least loaded member not in ``exclude``."""
        found = [m for m in self.members if m not in exclude]
        return min(found, key=self._rank) if found else None

    # rule 1
    def assign(self) -> None:
        if not self.members:
            return
        for p in range(1, self.count + 1):
            if p in self.groups:
                continue
            chosen: list[str] = []
            for _ in range(self.r):
                node = self.best(chosen)
                assert node is not None  # r <= len(members)
                chosen.append(node)
                self.held[node] += 1  # counted as chosen, so a group spreads
            for node in chosen:
                self.held[node] -= 1
            self.take(Step("assign", p, tuple(chosen)))

    # rule 2
    def replace_gone(self) -> None:
        for p in self.partitions:
            group = self.groups.get(p)
            if group is None:
                continue
            for n in group.replicas + group.joining:
                if n in self.gone:
                    self.take(Step("remove", p, (n,)))

    # rule 3
    def repair(self) -> None:
        for p in self.partitions:
            group = self.groups.get(p)
            if group is None:
                continue
            for _ in range(self.r - len(holders(group))):
                node = self.best(group.replicas + group.joining)
                if node is None:
                    break
                self.take(Step("add", p, (node,)))
                group = self.groups[p]

    # rule 4
    def trim(self) -> None:
        for p in self.partitions:
            group = self.groups.get(p)
            if group is None or group.joining:
                continue
            while True:
                live = [n for n in group.replicas if n in self.order and n not in group.leaving]
                if len(live) <= self.r:
                    break
                node = max(live, key=self._rank)
                self.take(Step("remove", p, (node,)))
                group = self.groups[p]

    # rule 5
    def rebalance(self, max_moves: int | None) -> None:
        limit = max(1, len(self.members) // 2) if max_moves is None else max_moves
        in_flight = sum(1 for g in self.groups.values() if g.leaving)
        while in_flight < limit:
            step = self._one_move()
            if step is None:
                return
            self.take(step)
            in_flight += 1

    def _one_move(self) -> Step | None:
        ranked = sorted(self.members, key=self._rank)
        for source in reversed(ranked):  # most loaded first
            if self.held[source] - self.held[ranked[0]] <= 1:
                return None  # balanced: no member holds 2 more than another
            movable = [
                p for p in self.partitions
                if (g := self.groups.get(p)) is not None and not g.joining and not g.leaving
                and source in g.replicas and len(holders(g)) >= self.r
            ]
            for target in ranked:
                if self.held[source] - self.held[target] <= 1:
                    break
                for p in movable:
                    if target not in self.groups[p].replicas:
                        return Step("add", p, (target,), instead=source)
        return None


def plan(
    count: int,
    r: int,
    members: Sequence[str],
    groups: Mapping[int, Group],
    gone: AbstractSet[str] = frozenset(),
    load: Mapping[str, float] | None = None,
    max_moves: int | None = None,
) -> list[Step]:
    """What the control leader records next: the steps of rules 1-5 (module docstring).

    Args:
        count: the data partitions, 1..count.
        r: the cluster's replication setting.
        members: the eligible node ids, live in control's view, in a stable order (a node
            also in ``gone`` is taken as gone).
        groups: the current groups; a partition missing here was never assigned.
        gone: nodes out of the view past the replace delay: replaced.
        load: an optional tie-break per node (lower first).
        max_moves: rebalancing moves in flight at once (None: ``max(1, members // 2)``);
            repair is not bounded.

    Returns:
        The steps in order; each fits the groups as changed by those before it
        (:func:`apply_step`). Empty on a steady cluster.
    """
    planner = _Planner(count, r, members, groups, gone, load)
    planner.assign()
    planner.replace_gone()
    planner.repair()
    planner.trim()
    planner.rebalance(max_moves)
    return planner.steps


def rebalance(
    count: int,
    r: int,
    members: Sequence[str],
    groups: Mapping[int, Group],
    gone: AbstractSet[str] = frozenset(),
    load: Mapping[str, float] | None = None,
    max_moves: int | None = None,
) -> list[Step]:
    """Rule 5 alone (an operator's rebalance): the moves :func:`plan` would start, with
    the same arguments, without assigning, replacing, repairing or trimming."""
    planner = _Planner(count, r, members, groups, gone, load)
    planner.rebalance(max_moves)
    return planner.steps


def move(
    groups: Mapping[int, Group], partition: int, source: str, target: str,
    members: Sequence[str] | None = None,
) -> Step:
    """The step of an operator's move (``baton partition move P --from A --to B``): the
    target joins, the source leaves once it is ready.

    Args:
        groups: the current groups.
        partition: the data partition to move.
        source: a replica of it, not already leaving.
        target: a node not in its group.
        members: when given, the live members: the target must be one.

    Raises:
        InvalidArgument: the move does not fit (said in one sentence).
    """
    group = groups.get(partition)
    if group is None:
        raise InvalidArgument(f"partition {partition} has no replica group yet")
    if group.leaving:
        joining = ", ".join(group.joining)
        raise InvalidArgument(
            f"partition {partition} has a move in flight ({joining} joining); "
            "move it again once that one is ready"
        )
    if source not in group.replicas:
        raise InvalidArgument(
            f"{source} is not a replica of partition {partition} "
            f"(its replicas: {', '.join(group.replicas) or 'none'})"
        )
    if target == source or target in group.replicas or target in group.joining:
        raise InvalidArgument(f"{target} is already in partition {partition}'s group")
    if members is not None and target not in members:
        raise InvalidArgument(f"{target} is not a live member of the cluster")
    return Step("add", partition, (target,), instead=source)
