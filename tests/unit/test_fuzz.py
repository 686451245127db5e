"""A short run of each fuzz target (loadtest/fuzz.py, docs/fuzzing.md): the seeds pass
by themselves, and ~10^4 atheris inputs per target find no crash."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from batonmq.loadtest.fuzz import TARGETS, seeds


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_seeds_pass_their_target(target: str) -> None:
    found = seeds(target)
    assert len(found) >= 5
    for data in found:
        TARGETS[target](data)


#: Inputs per short run: 10,000, fewer where one input costs milliseconds (a whole AMQP
#: session or handshake per input); the long runs are docs/fuzzing.md's.
_SHORT_RUNS = {"amqp-session": 2000, "handshake": 4000}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_short_fuzz_run_finds_no_crash(target: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    runs = _SHORT_RUNS.get(target, 10_000)
    r = subprocess.run(
        [sys.executable, "-m", "batonmq.loadtest.fuzz", target, "--runs", str(runs),
         "--corpus", str(tmp_path)],
        capture_output=True, text=True, timeout=110,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"Done {runs} runs" in r.stderr
