"""The replica-group planner (cluster/assignment.py, docs/design.md §16 "Replica groups:
the planner"): pure, each rule on a small cluster, and the helpers that define what a
step and a ready node change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

import pytest

from batonmq.cluster.assignment import (
    Group,
    Step,
    apply_step,
    effective_r,
    holders,
    move,
    orphans,
    plan,
    ready,
    rebalance,
)
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.groups import MAX_REPLICAS, ReplicaGroups

M4 = ("a", "b", "c", "d")


def held(groups: Mapping[int, Group], members: Sequence[str]) -> dict[str, int]:
    """Partitions each member holds (replicas and joining, not leaving)."""
    counts = {m: 0 for m in members}
    for g in groups.values():
        for n in holders(g):
            if n in counts:
                counts[n] += 1
    return counts


def all_ready(groups: Mapping[int, Group], up: AbstractSet[str] | None = None) -> dict[int, Group]:
    """Every joining node made ready (only those in ``up``, when given)."""
    out = dict(groups)
    for p in sorted(out):
        for n in out[p].joining:
            if up is None or n in up:
                out = ready(out, p, n)
    return out


def settle(
    count: int, r: int, members: Sequence[str], groups: Mapping[int, Group],
    gone: AbstractSet[str] = frozenset(), max_moves: int | None = None, rounds: int = 2000,
) -> tuple[dict[int, Group], int]:
    """Make the live joining nodes ready, plan, apply, again, until the planner plans nothing.

    Returns:
        The steady groups and the number of steps taken.
    """
    out, taken = dict(groups), 0
    for _ in range(rounds):
        out = all_ready(out, set(members))
        steps = plan(count, r, members, out, gone, max_moves=max_moves)
        if not steps:
            return out, taken
        for step in steps:
            out = apply_step(out, step)
        taken += len(steps)
    raise AssertionError(f"no steady state after {rounds} rounds")


# --- rule 1: assign ---------------------------------------------------------------------


def test_effective_r_is_capped_by_the_members_and_at_least_one() -> None:
    assert effective_r(3, M4) == 3
    assert effective_r(3, ("a", "b")) == 2
    assert effective_r(3, ()) == 1
    assert effective_r(0, M4) == 1


def test_a_cluster_that_set_no_size_gets_groups_of_three() -> None:
    # No setting recorded (0): the default, 3, read the same on every broker (it is code).
    groups = ReplicaGroups()
    assert groups.setting == 0 and groups.replicas == 3 and MAX_REPLICAS == 15
    # 1 to 3 brokers: every broker in every group, as before groups.
    for members in (("a",), ("a", "b"), ("a", "b", "c")):
        steps = plan(4, groups.replicas, members, {})
        assert all(sorted(s.nodes) == sorted(members) for s in steps), (members, steps)
    # 4 or more (observers count as members): groups of 3, not every broker.
    five = ("a", "b", "c", "d", "e")
    steps = plan(5, groups.replicas, five, {})
    assert [len(s.nodes) for s in steps] == [3] * 5
    # A setting recorded still wins over the default.
    groups.setting = 5
    assert [len(s.nodes) for s in plan(2, groups.replicas, five, {})] == [5, 5]


def test_a_new_cluster_is_assigned_balanced_and_ready_at_once() -> None:
    steps = plan(8, 3, M4, {})
    assert [s.kind for s in steps] == ["assign"] * 8
    # Fewest held first, then member order: the groups go round the members.
    assert [s.nodes for s in steps[:3]] == [("a", "b", "c"), ("d", "a", "b"), ("c", "d", "a")]
    groups: dict[int, Group] = {}
    for s in steps:
        groups = apply_step(groups, s)
    assert all(not g.joining and len(set(g.replicas)) == 3 for g in groups.values())
    assert held(groups, M4) == {"a": 6, "b": 6, "c": 6, "d": 6}
    assert plan(8, 3, M4, groups) == []


def test_a_grown_cluster_assigns_only_its_new_partitions_to_the_least_loaded() -> None:
    groups = {1: Group(("a", "b", "c")), 2: Group(("a", "b", "d"))}
    steps = plan(3, 3, M4, groups)
    assert steps == [Step("assign", 3, ("c", "d", "a"))]


def test_load_breaks_a_tie_of_counts() -> None:
    steps = plan(1, 2, M4, {}, load={"a": 5.0, "b": 0.5, "c": 0.1, "d": 9.0})
    assert steps == [Step("assign", 1, ("c", "b"))]


def test_fewer_members_than_r_assign_every_member_and_none_assigns_nothing() -> None:
    assert plan(1, 3, ("a", "b"), {}) == [Step("assign", 1, ("a", "b"))]
    assert plan(2, 3, (), {}) == []


# --- rule 2: gone and down ----------------------------------------------------------------


def test_a_down_node_is_kept_and_a_restart_moves_nothing() -> None:
    groups, _ = settle(8, 3, M4, {})
    without_d = ("a", "b", "c")  # d out of the view, not gone yet
    assert plan(8, 3, without_d, groups) == []
    assert plan(8, 3, M4, groups) == []  # back: nothing moves


def test_a_gone_node_is_removed_and_replaced_on_the_least_loaded_member() -> None:
    groups = {1: Group(("a", "b", "c")), 2: Group(("a", "b", "d")), 3: Group(("c", "d", "e"))}
    steps = plan(3, 3, ("a", "b", "c", "e"), groups, gone={"d"})
    assert steps[:4] == [
        Step("remove", 2, ("d",)),
        Step("remove", 3, ("d",)),
        Step("add", 2, ("e",)),  # e holds 1, the fewest
        Step("add", 3, ("a",)),  # then a, b, e hold 2: a first in member order
    ]
    assert all(s.kind == "add" and s.instead is not None for s in steps[4:])


def test_a_gone_joining_node_is_removed_and_its_move_cancelled() -> None:
    groups = {1: Group(("a", "b", "c"), joining=("d",), leaving=("c",))}
    steps = plan(1, 3, ("a", "b", "c", "e"), groups, gone={"d"}, max_moves=0)
    assert steps == [Step("remove", 1, ("d",))]
    after = apply_step(groups, steps[0])
    assert after[1] == Group(("a", "b", "c"))  # c stays: the move is off


def test_every_replica_gone_is_still_removed_and_named_an_orphan() -> None:
    groups = {1: Group(("a", "b")), 2: Group(("a", "c"))}
    gone = {"a", "b"}
    assert orphans(groups, gone) == (1,)
    steps = plan(2, 2, ("c", "d"), groups, gone)
    assert steps[:3] == [Step("remove", 1, ("a",)), Step("remove", 1, ("b",)), Step("remove", 2, ("a",))]
    assert [s for s in steps if s.partition == 1 and s.kind == "add"] == [
        Step("add", 1, ("d",)), Step("add", 1, ("c",))
    ]


# --- rules 3 and 4: repair and trim ------------------------------------------------------


def test_r_raised_repairs_every_group_without_a_bound() -> None:
    groups, _ = settle(6, 2, M4, {})
    steps = plan(6, 3, M4, groups, max_moves=1)
    assert [s.kind for s in steps] == ["add"] * 6
    assert all(s.instead is None for s in steps)


def test_r_lowered_trims_the_most_loaded_last_in_member_order_once_nothing_joins() -> None:
    groups = {1: Group(("a", "b", "c")), 2: Group(("a", "b", "d"))}
    # a and b hold 2: b is the last of the most loaded; then a holds the most.
    assert plan(2, 2, M4, groups) == [Step("remove", 1, ("b",)), Step("remove", 2, ("a",))]
    joining = {1: Group(("a", "b"), joining=("c",))}
    assert plan(1, 2, M4, joining, max_moves=0) == []  # waits for c


def test_a_node_briefly_out_of_the_view_loses_nothing_when_r_eff_drops() -> None:
    groups = {1: Group(("a", "b", "c"))}
    assert plan(1, 3, ("a", "b"), groups) == []  # R_eff 2, c down: kept


# --- rule 5: rebalance ------------------------------------------------------------------


def test_a_join_moves_partitions_to_the_new_member_bounded_and_one_per_partition() -> None:
    groups, _ = settle(8, 3, M4, {})
    members = M4 + ("e",)
    steps = plan(8, 3, members, groups, max_moves=2)
    assert len(steps) == 2
    assert all(s.kind == "add" and s.nodes == ("e",) and s.instead is not None for s in steps)
    assert len({s.partition for s in steps}) == 2
    moved = groups
    for s in steps:
        moved = apply_step(moved, s)
    # Two moves in flight: nothing more until one is ready.
    assert plan(8, 3, members, moved, max_moves=2) == []
    steady, _ = settle(8, 3, members, groups, max_moves=2)
    counts = held(steady, members)
    assert max(counts.values()) - min(counts.values()) <= 1


def test_the_default_bound_is_half_the_members() -> None:
    groups, _ = settle(40, 3, M4, {})
    members = M4 + ("e", "f", "g", "h")
    assert len(plan(40, 3, members, groups)) == 4


def test_rebalance_alone_neither_assigns_nor_repairs() -> None:
    groups = {1: Group(("a",)), 2: Group(("a",)), 3: Group(("a",))}
    assert rebalance(4, 1, ("a", "b"), groups) == [Step("add", 1, ("b",), instead="a")]
    assert plan(4, 1, ("a", "b"), groups)[0] == Step("assign", 4, ("b",))
    # Under-replicated groups are repaired by plan, never moved by a rebalance.
    assert rebalance(4, 2, ("a", "b"), groups) == []
    assert [s.kind for s in plan(4, 2, ("a", "b"), groups)] == ["assign", "add", "add", "add"]


# --- the helpers --------------------------------------------------------------------------


def test_a_move_finishes_when_its_joining_node_is_ready() -> None:
    groups = {1: Group(("a", "b", "c"))}
    groups = apply_step(groups, Step("add", 1, ("d",), instead="a"))
    assert groups[1] == Group(("a", "b", "c"), ("d",), ("a",))
    assert holders(groups[1]) == ("b", "c", "d")
    assert ready(groups, 1, "d")[1] == Group(("b", "c", "d"))


def test_leaving_waits_for_every_joining_node() -> None:
    groups = {1: Group(("a", "b"), ("c", "d"), ("a",))}
    one = ready(groups, 1, "c")
    assert one[1] == Group(("a", "b", "c"), ("d",), ("a",))
    assert ready(one, 1, "d")[1] == Group(("b", "c", "d"))


def test_helpers_return_new_mappings() -> None:
    groups = {1: Group(("a",))}
    apply_step(groups, Step("add", 1, ("b",)))
    assert groups == {1: Group(("a",))}


@pytest.mark.parametrize(
    ("groups", "step", "says"),
    [
        ({}, Step("add", 1, ("a",)), "partition 1 has no replica group yet"),
        ({1: Group(("a",))}, Step("add", 1, ("a",)), "a is already in partition 1's group"),
        ({1: Group(("a",))}, Step("add", 1, ("b",), instead="z"), "z is not a replica of partition 1"),
        ({1: Group(("a",))}, Step("remove", 1, ("b",)), "b is not in partition 1's group"),
        ({}, Step("assign", 1, ("a", "a")), "needs distinct nodes"),
        ({1: Group(("a",))}, Step("add", 1, ("b", "c")), "names one node"),
    ],
)
def test_a_step_that_does_not_fit_is_refused(
    groups: dict[int, Group], step: Step, says: str
) -> None:
    with pytest.raises(InvalidArgument, match=says):
        apply_step(groups, step)


def test_ready_of_a_node_not_joining_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="b is not joining partition 1"):
        ready({1: Group(("a",))}, 1, "b")


# --- the operator's move ------------------------------------------------------------------


def test_move_makes_the_target_join_instead_of_the_source() -> None:
    groups = {3: Group(("a", "b", "c"))}
    assert move(groups, 3, "b", "d", members=M4) == Step("add", 3, ("d",), instead="b")


@pytest.mark.parametrize(
    ("partition", "source", "target", "says"),
    [
        (9, "a", "d", "partition 9 has no replica group yet"),
        (1, "d", "e", r"d is not a replica of partition 1 \(its replicas: a, b, c\)"),
        (1, "a", "b", "b is already in partition 1's group"),
        (1, "a", "a", "a is already in partition 1's group"),
        (1, "a", "z", "z is not a live member of the cluster"),
        (2, "a", "e", r"partition 2 has a move in flight \(d joining\)"),
    ],
)
def test_a_move_that_does_not_fit_says_why(partition: int, source: str, target: str, says: str) -> None:
    groups = {1: Group(("a", "b", "c")), 2: Group(("a", "b", "c"), ("d",), ("c",))}
    with pytest.raises(InvalidArgument, match=says):
        move(groups, partition, source, target, members=M4 + ("e",))


# --- determinism ------------------------------------------------------------------------

_PLAN_IN_A_CHILD = """
import json, sys
from batonmq.cluster.assignment import Group, plan
groups = {p: Group(tuple(f"n{(p * 7 + k) % 13}" for k in range(3))) for p in range(1, 40)}
members = [f"n{i}" for i in range(16) if i != 4]
steps = plan(45, 3, members, groups, gone={"n4", "n9"}, load={"n2": 1.0})
json.dump([[s.kind, s.partition, list(s.nodes), s.instead] for s in steps], sys.stdout)
"""


def test_the_same_input_plans_the_same_steps_in_any_process() -> None:
    # Set and dict orders of strings change with the hash seed: the plan must not.
    runs = [
        subprocess.run(
            [sys.executable, "-c", _PLAN_IN_A_CHILD], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed}, timeout=60,
        ).stdout
        for seed in ("1", "2", "3")
    ]
    assert runs[0] == runs[1] == runs[2] and json.loads(runs[0])


def test_the_order_of_the_groups_mapping_does_not_matter() -> None:
    groups = {p: Group(tuple(f"n{(p * 5 + k) % 9}" for k in range(3))) for p in range(1, 30)}
    members = [f"n{i}" for i in range(11)]
    backwards = dict(reversed(list(groups.items())))
    assert plan(30, 3, members, groups, gone={"n3"}) == plan(30, 3, members, backwards, gone={"n3"})
