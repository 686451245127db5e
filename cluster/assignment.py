"""STUB (replaced by the planner branch): replica groups' pure planner."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Literal

from batonmq.cluster.errors import InvalidArgument

__all__ = ["Group", "Step", "effective_r", "plan", "apply_step", "ready", "move"]


@dataclass(frozen=True, slots=True)
class Group:
    replicas: tuple[str, ...]
    joining: tuple[str, ...] = ()
    leaving: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    kind: Literal["assign", "add", "remove"]
    partition: int
    nodes: tuple[str, ...]
    instead: str | None = None


def effective_r(r: int, members: Sequence[str]) -> int:
    return max(1, min(r, len(members)))


def _counts(members: Sequence[str], groups: Mapping[int, Group]) -> dict[str, int]:
    counts = {m: 0 for m in members}
    for g in groups.values():
        for n in (*g.replicas, *g.joining):
            if n in counts:
                counts[n] += 1
    return counts


def plan(
    count: int, r: int, members: Sequence[str], groups: Mapping[int, Group],
    gone: AbstractSet[str] = frozenset(), load: Mapping[str, float] | None = None,
    max_moves: int | None = None,
) -> list[Step]:
    if not members:
        return []
    down = {n for g in groups.values() for n in (*g.replicas, *g.joining)
            if n not in members and n not in gone}
    want = effective_r(r, [*members, *sorted(down)])
    order = {m: i for i, m in enumerate(members)}
    work = dict(groups)
    steps: list[Step] = []

    def best(exclude: tuple[str, ...]) -> str | None:
        counts = _counts(members, work)
        free = [m for m in members if m not in exclude]
        return min(free, key=lambda m: (counts[m], order[m])) if free else None

    for k in range(1, count + 1):
        g = work.get(k)
        if g is None:
            chosen: list[str] = []
            for _ in range(want):
                m = best(tuple(chosen))
                if m is None:
                    break
                chosen.append(m)
                work[k] = Group(tuple(chosen))
            steps.append(Step("assign", k, tuple(chosen)))
            continue
        for n in (*g.replicas, *g.joining):
            if n in gone:
                steps.append(Step("remove", k, (n,)))
                g = apply_step(work, steps[-1])[k]
                work[k] = g
        have = len(g.replicas) + len(g.joining)
        while have < want:
            m = best((*g.replicas, *g.joining))
            if m is None:
                break
            steps.append(Step("add", k, (m,)))
            g = apply_step(work, steps[-1])[k]
            work[k] = g
            have += 1
        if not g.joining and len(g.replicas) > want:
            counts = _counts(members, work)
            victim = max(g.replicas, key=lambda n: (counts.get(n, 0), order.get(n, -1)))
            steps.append(Step("remove", k, (victim,)))
            work[k] = apply_step(work, steps[-1])[k]
    return steps


def apply_step(groups: Mapping[int, Group], step: Step) -> dict[int, Group]:
    out = dict(groups)
    g = out.get(step.partition, Group(()))
    if step.kind == "assign":
        out[step.partition] = Group(step.nodes)
    elif step.kind == "add":
        n = step.nodes[0]
        leaving = g.leaving + ((step.instead,) if step.instead else ())
        out[step.partition] = replace(g, joining=g.joining + (n,), leaving=leaving)
    else:
        n = step.nodes[0]
        out[step.partition] = Group(
            tuple(x for x in g.replicas if x != n), tuple(x for x in g.joining if x != n),
            tuple(x for x in g.leaving if x != n),
        )
    return out


def ready(groups: Mapping[int, Group], partition: int, node: str) -> dict[int, Group]:
    out = dict(groups)
    g = out[partition]
    if node not in g.joining:
        return out
    joining = tuple(x for x in g.joining if x != node)
    replicas = g.replicas + (node,)
    leaving = g.leaving
    if not joining:
        replicas = tuple(x for x in replicas if x not in leaving)
        leaving = ()
    out[partition] = Group(replicas, joining, leaving)
    return out


def move(groups: Mapping[int, Group], partition: int, source: str, target: str) -> Step:
    g = groups.get(partition)
    if g is None or source not in g.replicas:
        raise InvalidArgument(f"{source} is not a replica of partition {partition}")
    if target in g.replicas or target in g.joining:
        raise InvalidArgument(f"{target} is in partition {partition}'s group already")
    if g.joining:
        raise InvalidArgument(f"partition {partition} is moving already")
    return Step("add", partition, (target,), source)
