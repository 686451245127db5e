"""The CPU-per-message benchmark (``python -m batonmq.loadtest.bench_efficiency``), briefly, on
real brokers: one figure per configuration, in all and per broker and client process, positive
and within what a message can plausibly cost; the checker's verdict with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from batonmq.loadtest import bench_efficiency
from tests.integration.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_the_efficiency_benchmark_prints_cpu_per_message_of_brokers_and_clients(
    tmp_path: Path,
) -> None:
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "-m", "batonmq.loadtest.bench_efficiency", "--brokers", "1,2",
         "--rate", "300", "--duration", "6", "--warmup", "2", "--json", str(out)],
        capture_output=True, text=True, cwd=REPO, env=dict(os.environ), timeout=220,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    assert figures["ok"] is True
    one, two = figures["runs"]
    assert (one["brokers"], two["brokers"]) == (1, 2)
    for run in (one, two):
        assert run["checker_ok"] is True and run["lost"] == 0 and run["double_delivery"] == 0
        # The rate asked for was reached (a modest one), and every message was consumed.
        assert 270 <= run["confirmed_msgs_per_s"] <= 330, run
        assert run["consumed_msgs_per_s"] > 0 and not run["short_of_rate"]
        assert len(run["per_broker_us_per_msg"]) == run["brokers"]
        assert sorted(run["per_client_us_per_msg"]) == ["c1", "c2", "p1", "p2"]
        # A message costs a broker more than 10 µs of CPU (Python, a log, a store) and less
        # than 50 ms (a 2-core machine at 300 msg/s cannot spend more than ~6.7 ms).
        assert 10 < run["broker_us_per_msg"] < 50_000, run
        assert all(0 < v < 50_000 for v in run["per_broker_us_per_msg"].values()), run
        assert 1 < run["client_us_per_msg"] < 50_000, run
        assert all(v > 0 for v in run["per_client_us_per_msg"].values()), run
        # The sum is the sum of its parts, and the cores agree with the figure.
        assert sum(run["per_broker_us_per_msg"].values()) == pytest.approx(
            run["broker_us_per_msg"], rel=0.01, abs=1)
        assert run["broker_cores"] / run["confirmed_msgs_per_s"] * 1e6 == pytest.approx(
            run["broker_us_per_msg"], rel=0.02)
    # Every broker of the cluster applies every message: two cost more than one.
    assert two["broker_us_per_msg"] > one["broker_us_per_msg"]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("1 broker(s), 1 partition(s): ")
    assert any(line.startswith("2 broker(s), 1 partition(s): ") for line in lines)
    assert sum("broker CPU" in line and "µs/msg" in line for line in lines) == 2
    assert sum("client CPU" in line for line in lines) == 2
    assert sum("checker OK" in line for line in lines) == 2
    assert lines[-1] == "ok"


@pytest.mark.parametrize(("args", "says"), [
    (["--brokers", "0"], "broker counts must be 1..9"),
    (["--brokers", "one"], "not a list of broker counts"),
    (["--rate", "-5"], "must be positive"),
    (["--duration", "3", "--warmup", "5"], "--warmup"),
])
def test_the_efficiency_benchmark_refuses_nonsense(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_efficiency.main(args)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
