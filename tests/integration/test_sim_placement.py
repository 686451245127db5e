"""The placement simulator (``python -m batonmq.loadtest.sim_placement``) run as the
operator runs it: the real planner on 30 brokers, 300 partitions and 20 random events
ends balanced and fully replicated, in well under a minute; a small cluster too; the
plot is a PNG. The checks can fail: a planner that never rebalances, or never repairs,
fails them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import pytest

from batonmq.cluster import assignment
from batonmq.cluster.assignment import Group, Step
from batonmq.loadtest import sim_placement
from tests.integration.conftest import REPO

pytestmark = [pytest.mark.integration]


def sim(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batonmq.loadtest.sim_placement", *args],
        capture_output=True, text=True, env=dict(os.environ), cwd=REPO, timeout=timeout,
    )


def check_balanced_and_back(figures: dict[str, Any], replicas: int) -> None:
    assert figures["converged"] is True and figures["ok"] is True, figures
    assert figures["max_over_mean"] <= 1.2, figures
    assert figures["max_per_broker"] / figures["mean_per_broker"] <= 1.2
    assert figures["max_per_broker"] - figures["min_per_broker"] <= 1  # the planner's rule 5
    assert all(e["full_after"] is not None for e in figures["events"])
    assert figures["quiet_restart_copies"] == 0
    assert figures["options"]["replicas"] == replicas


def test_thirty_brokers_three_hundred_partitions_twenty_events(tmp_path: Path) -> None:
    png = tmp_path / "placement.png"
    started = time.monotonic()
    done = sim("--brokers", "30", "--partitions", "300", "--replicas", "3", "--events", "20",
               "--plot", str(png), "--json")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert took < 60, f"the simulation took {took:.1f}s"
    figures = json.loads(done.stdout)
    check_balanced_and_back(figures, 3)
    events = figures["events"]
    assert len(events) == 20 and {e["kind"] for e in events} >= {"join", "kill"}
    # Joins and replacements copy data; the planner's copies add up.
    assert figures["copied"] == sum(e["copied"] for e in events) > 0
    assert any(e["kind"] == "join" and e["copied"] > 0 for e in events)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_small_cluster_prints_its_table_and_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = sim("--brokers", "3", "--partitions", "12", "--events", "8", "--seed", "7",
               "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    # 12 partitions on a handful of brokers cannot be finer than one partition apart.
    assert figures["converged"] is True and figures["ok"] is True
    assert figures["max_per_broker"] - figures["mean_per_broker"] < 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith("3 brokers, 12 partitions, R=3, 8 events (seed 7")
    rows = [line.split() for line in lines[2:10]]
    assert [(r[1], r[2]) for r in rows] == [(e["kind"], e["broker"]) for e in figures["events"]]
    assert "every partition back at R=3 ready replicas: yes" in done.stdout
    assert "partitions per broker at the end: max" in done.stdout


def test_the_same_seed_simulates_the_same_run() -> None:
    first, second = (sim("--brokers", "8", "--partitions", "40", "--events", "6", "--seed", "3",
                         "--json") for _ in range(2))
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--brokers", "2"], "--brokers must be 3 to 100"),
        (["--partitions", "1001"], "--partitions must be 1 to 1000"),
        (["--replicas", "5", "--brokers", "4"], "--replicas must be 1 to --brokers"),
        (["--bandwidth", "0"], "--size and --bandwidth must be positive"),
    ],
)
def test_options_out_of_range_are_one_clear_line(args: list[str], says: str) -> None:
    done = sim(*args)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr


def _without(kind: str) -> Callable[..., list[Step]]:
    """The real planner, minus its rebalancing moves or its repairs."""
    real = assignment.plan

    def plan(
        count: int, r: int, members: Sequence[str], groups: Mapping[int, Group],
        gone: AbstractSet[str] = frozenset(), load: Mapping[str, float] | None = None,
        max_moves: int | None = None,
    ) -> list[Step]:
        steps = real(count, r, members, groups, gone, load, max_moves)
        if kind == "moves":
            return [s for s in steps if s.instead is None]
        return [s for s in steps if s.kind != "add"]

    return plan


def test_a_planner_that_never_rebalances_fails_the_balance_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_placement, "plan", _without("moves"))
    out = sim_placement.simulate(sim_placement.Options(brokers=30, partitions=300, events=20))
    assert out.max_over_mean > 1.2 and out.max_per_broker - out.min_per_broker > 1


def test_a_planner_that_never_repairs_does_not_converge_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sim_placement, "plan", _without("adds"))
    assert sim_placement.main(["--brokers", "6", "--partitions", "30", "--events", "6"]) == 1
    assert "every partition back at R=3 ready replicas: NO" in capsys.readouterr().out
