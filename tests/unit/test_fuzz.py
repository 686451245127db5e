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


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_short_fuzz_run_finds_no_crash(target: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    r = subprocess.run(
        [sys.executable, "-m", "batonmq.loadtest.fuzz", target, "--runs", "10000",
         "--corpus", str(tmp_path)],
        capture_output=True, text=True, timeout=110,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Done 10000 runs" in r.stderr
