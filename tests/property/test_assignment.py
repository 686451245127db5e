"""The replica-group planner under random clusters (hypothesis; cluster/assignment.py).

A rule-based machine joins, kills (down), expires (gone) and restarts brokers, grows the
partitions, changes R, lets the leader plan and lets joining nodes catch up one by one.
At every plan: the same input plans the same steps, every step fits, a remove the
planner chose never takes a group's last live replica and never touches a down node.
At the end the down brokers are replaced and the leader plans until it plans nothing:
then every partition has R_eff ready replicas on live brokers and the members hold
within one partition of each other. Two more properties: a new cluster is assigned
balanced, and any consistent state, however odd, converges.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from batonmq.cluster.assignment import Group, apply_step, effective_r, holders, plan, ready
from tests.unit.test_assignment import held, settle

MAX_NODES = 10
MAX_COUNT = 24


class Cluster(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state: dict[str, str] = {}  # node -> up | down | gone, in join order
        for _ in range(3):
            self._join()
        self.count = 6
        self.r = 3
        self.groups: dict[int, Group] = {}

    def _join(self) -> None:
        self.state[f"n{len(self.state):02d}"] = "up"

    def _with(self, status: str) -> list[str]:
        return [n for n, s in self.state.items() if s == status]

    @property
    def members(self) -> list[str]:
        return self._with("up")

    @property
    def gone(self) -> frozenset[str]:
        return frozenset(self._with("gone"))

    @precondition(lambda self: len(self.state) < MAX_NODES)
    @rule()
    def join(self) -> None:
        self._join()

    @precondition(lambda self: len(self.members) > 1)
    @rule(i=st.integers(0, MAX_NODES))
    def kill(self, i: int) -> None:
        up = self.members
        self.state[up[i % len(up)]] = "down"

    @precondition(lambda self: bool(self._with("down")))
    @rule(i=st.integers(0, MAX_NODES), back=st.booleans())
    def down_ends(self, i: int, back: bool) -> None:
        down = self._with("down")
        self.state[down[i % len(down)]] = "up" if back else "gone"

    @precondition(lambda self: self.count < MAX_COUNT)
    @rule(more=st.integers(1, 6))
    def grow(self, more: int) -> None:
        self.count = min(MAX_COUNT, self.count + more)

    @rule(r=st.integers(1, 4))
    def set_r(self, r: int) -> None:
        self.r = r

    @rule(max_moves=st.sampled_from([None, 1, 3]))
    def lead(self, max_moves: int | None) -> None:
        members, gone = self.members, self.gone
        steps = plan(self.count, self.r, members, self.groups, gone, max_moves=max_moves)
        backwards = dict(reversed(list(self.groups.items())))
        assert plan(self.count, self.r, list(members), backwards, set(gone), max_moves=max_moves) == steps
        up = set(members)
        for step in steps:
            before = self.groups.get(step.partition)
            self.groups = apply_step(self.groups, step)
            if step.kind != "remove" or step.nodes[0] in gone:
                continue
            node = step.nodes[0]
            assert node in up, f"the planner removed {node}, which is down: a restart would move data"
            assert before is not None and any(n in up for n in before.replicas)
            after = self.groups[step.partition]
            assert any(n in up for n in after.replicas), f"{step} took the last live replica"

    @rule(i=st.integers(0, 10_000))
    def catch_up(self, i: int) -> None:
        pending = [
            (p, n) for p, g in sorted(self.groups.items()) for n in g.joining if self.state[n] == "up"
        ]
        if pending:
            p, n = pending[i % len(pending)]
            self.groups = ready(self.groups, p, n)

    def teardown(self) -> None:
        for n in self._with("down"):
            self.state[n] = "gone"
        members = self.members
        steady, _ = settle(self.count, self.r, members, self.groups, self.gone)
        r_eff = effective_r(self.r, members)
        for p in range(1, self.count + 1):
            g = steady[p]
            assert not g.joining and not g.leaving, (p, g)
            assert len(g.replicas) == r_eff and set(g.replicas) <= set(members), (p, g)
        counts = held(steady, members)
        assert max(counts.values()) - min(counts.values()) <= 1, counts


TestCluster = Cluster.TestCase
TestCluster.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 25), r=st.integers(1, 5), count=st.integers(0, 120))
def test_a_new_cluster_is_assigned_balanced(n: int, r: int, count: int) -> None:
    members = [f"m{i}" for i in range(n)]
    steps = plan(count, r, members, {})
    assert [s.partition for s in steps] == list(range(1, count + 1))
    groups: dict[int, Group] = {}
    for s in steps:
        assert s.kind == "assign" and len(set(s.nodes)) == len(s.nodes) == effective_r(r, members)
        groups = apply_step(groups, s)
    counts = held(groups, members)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert plan(count, r, members, groups) == []


@st.composite
def odd_states(draw: st.DrawFn) -> tuple[list[str], frozenset[str], dict[int, Group], int, int]:
    """Members, gone, and consistent groups over members, gone and down nodes."""
    pool = [f"n{i}" for i in range(draw(st.integers(2, 9)))]
    status = {n: draw(st.sampled_from(["up", "up", "up", "down", "gone"])) for n in pool}
    if "up" not in status.values():
        status[pool[0]] = "up"
    count = draw(st.integers(1, 15))
    groups: dict[int, Group] = {}
    for p in range(1, count + 1):
        if draw(st.booleans()) and p > 1:
            continue  # never assigned
        nodes = draw(st.permutations(pool))
        k = draw(st.integers(0, len(nodes)))
        j = draw(st.integers(0, min(2, len(nodes) - k)))
        replicas, joining = tuple(nodes[:k]), tuple(nodes[k:k + j])
        leaving = tuple(replicas[: draw(st.integers(0, min(len(joining), len(replicas))))])
        groups[p] = Group(replicas, joining, leaving)
    members = [n for n in pool if status[n] == "up"]
    gone = frozenset(n for n in pool if status[n] == "gone")
    return members, gone, groups, count, draw(st.integers(1, 4))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=odd_states())
def test_any_consistent_state_converges(state: tuple[list[str], frozenset[str], dict[int, Group], int, int]) -> None:
    members, gone, groups, count, r = state
    steady, _ = settle(count, r, members, groups, gone)
    r_eff = effective_r(r, members)
    for p in range(1, count + 1):
        g = steady[p]
        assert not set(g.replicas + g.joining) & gone, (p, g)
        # Leaving replicas serve until nothing is joining: with a joiner that is down (not
        # gone), a move waits, and its leaving replicas keep the group at R.
        assert len(holders(g)) >= r_eff or len(set(g.replicas + g.joining)) >= r_eff, (p, g)
        if not g.joining:
            assert len([n for n in g.replicas if n in members]) <= r_eff, (p, g)
