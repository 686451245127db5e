"""The load-test harness end to end: a short run on 3 brokers is clean, a corrupted history fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from loadtest.history import OpKind, load_run, write_ops
from tests.integration.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def loadtest(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "loadtest", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


@pytest.mark.timeout(180)
def test_throughput_run_on_three_brokers_is_clean_and_a_corrupted_history_fails(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    out = tmp_path / "result.json"
    done = loadtest(
        "--preset", "throughput", "--duration", "10", "--brokers", "3",
        "--report", str(run_dir), "--json", str(out),
        timeout=150,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["ok"] is True
    assert all(v == 0 for k, v in result["checker"]["counts"].items()), result["checker"]
    metrics = result["metrics"]
    assert metrics["confirmed"] > 0 and metrics["confirmed_msgs_per_s"] > 0
    assert metrics["accepted"] > 0 and metrics["consume_msgs_per_s"] > 0
    assert metrics["confirm_latency_ms"]["p50"] > 0
    assert metrics["e2e_latency_ms"]["p99"] > 0
    assert "confirmed" in done.stderr  # the live progress lines
    assert "checker: OK" in done.stdout

    # The kept histories check clean on their own ...
    again = loadtest("--check", str(run_dir), timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr

    # ... until a second consumer gets a message while the first one still holds it.
    ops = load_run(run_dir)
    held = next(op for op in ops if op.kind == OpKind.DELIVER and op.actor != "drain")
    twin = replace(held, t=held.t + 1, actor="intruder/" + held.queue)
    write_ops(run_dir / "zz-injected.hist", [twin])
    bad = loadtest("--check", str(run_dir), timeout=60)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "checker: FAILED" in bad.stdout
    assert "double_delivery=1" in bad.stdout
