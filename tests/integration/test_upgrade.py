"""A rolling upgrade under load, on the file log and on Kafka.

Three brokers of the previous build (commit :data:`PREVIOUS`, built once into a cached
venv by ``loadtest/builds.py``) run the load-test harness's workload: confirmed
publishes, consumers that accept in batches, and three candidates taking turns as the
leader of a service. Meanwhile each broker in turn is stopped cleanly and started on
this build on its data dir (``upgrade`` three times), then every feature flag is enabled
through a broker (``enable-features``), all under load. The history checker must find
nothing lost, nothing delivered again after an accept, order kept, one service leader
at a time with growing fencing tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from batonmq import clients
from batonmq.loadtest.builds import BuildError, NoHistory, resolve_build
from tests.integration.conftest import REPO, BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The previous build: the commit the rolling-upgrade harness was written against.
PREVIOUS = "8c400b8"

#: Seconds of publishing; the faults come at 6, 12, 18 s (upgrade x3) and 24 s (enable-features,
#: load still running while the flags are enabled).
DURATION = 32


@pytest.fixture(scope="module")
def previous_build() -> Path:
    """The previous build's ``baton``; built on first use (seconds with pip's cache, a few
    minutes without)."""
    try:
        return resolve_build(PREVIOUS)
    except NoHistory as exc:
        # A checkout without the history (an sdist, a shallow clone) has nothing to
        # build the previous version from.
        pytest.skip(f"the previous build cannot be made here: {exc.message}")
    except BuildError as exc:
        pytest.fail(f"building {PREVIOUS} failed: {exc.message}", pytrace=False)


def rolling_upgrade(tmp_path: Path, log_url: str | None) -> tuple[subprocess.CompletedProcess[str],
                                                                  dict[str, Any]]:
    report = tmp_path / "report"
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, "-m", "batonmq.loadtest",
         "--preset", "latency", "--rate", "1000", "--duration", str(DURATION),
         "--brokers", "3", "--leaders", "3", "--old-build", PREVIOUS,
         "--faults", "upgrade,upgrade,upgrade,enable-features@at:6,12,18,24",
         *(["--log", log_url] if log_url else []),
         "--report", str(report), "--json", str(out), "--quiet"],
        capture_output=True, text=True, env=dict(os.environ), cwd=REPO, timeout=300,
    )
    assert out.exists(), done.stdout + done.stderr
    return done, json.loads(out.read_text())


@pytest.mark.timeout(420)  # the first test may build the previous version first
@pytest.mark.parametrize("log", ["file", "kafka"])
def test_rolling_upgrade_then_enabling_the_feature_flags_under_load_keeps_every_guarantee(
    request: pytest.FixtureRequest, tmp_path: Path, previous_build: Path, log: str
) -> None:
    log_url = None
    if log == "kafka":
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        log_url = f"kafka://{bootstrap}/baton-upgrade-{uuid.uuid4().hex[:10]}"
    done, result = rolling_upgrade(tmp_path, log_url)
    context = done.stdout[-3000:] + done.stderr[-3000:]

    # The checker: nothing lost, no double delivery, nothing redelivered after an
    # accept, order kept, one leader at a time, and nothing left on the queues.
    counts = result["checker"]["counts"]
    assert all(v == 0 for v in counts.values()), (counts, result["checker"].get("examples"))
    metrics, stats = result["metrics"], result["checker"]["stats"]
    assert metrics["confirmed"] >= 0.9 * 1000 * DURATION, metrics["confirmed"]
    assert metrics["accepted"] >= 0.9 * metrics["confirmed"], metrics  # by the workers
    assert stats["terms"] >= DURATION // 2, stats  # a term a second, in turn

    # Each broker in turn went from the previous build to this one, cleanly.
    faults = metrics["faults"]
    ends = [f for f in faults if f["phase"] == "end" and f["kind"] == "upgrade"]
    assert [f["detail"].split()[0] for f in ends] == ["node=node-1", "node=node-2",
                                                      "node=node-3"], faults
    assert [f["detail"].split()[2:] for f in ends] == [
        ["exit=0", "old_left=2"], ["exit=0", "old_left=1"], ["exit=0", "old_left=0"]], faults
    servers = Path(result["run_dir"]) / "servers"
    for n in (1, 2, 3):
        starts = [line for line in (servers / f"node-{n}.out").read_text().splitlines()
                  if line.startswith("== harness: start")]
        assert starts == [
            f"== harness: start 1 of node-{n} (old build: {previous_build})",
            f"== harness: start 2 of node-{n} (new build: {sys.executable} -m batonmq.broker)",
        ], starts

    # Then every feature flag was enabled, all of them newly, while the producers still
    # published; every broker listed them enabled before the fault ended.
    assert not metrics.get("fault_errors"), (metrics.get("fault_errors"), context)
    enabled = [f for f in faults if f["kind"] == "enable-features" and f["phase"] == "end"]
    assert len(enabled) == 1 and enabled[0]["t"] < DURATION, faults
    detail = dict(item.split("=", 1) for item in enabled[0]["detail"].split())
    assert detail["enabled"] == detail["features"] != "-", enabled
    # Among them the log's partitions: a cluster of one log stays one (its queues on data
    # partition 1), nothing written differently (docs/operations.md "Partitions").
    assert "partitions" in detail["enabled"].split(","), enabled
    assert done.returncode == 0, context


async def test_a_cluster_of_the_previous_build_keeps_its_one_log_and_its_queues_on_partition_1(
    tmp_path: Path, previous_build: Path
) -> None:
    """A cluster made by the previous build upgrades in place and enables every flag, the
    partitions one among them: its log stays one partition (a --partitions asked of an
    existing log is said and not applied), its queues are on data partition 1 with their
    messages, and so is a queue declared after (docs/operations.md "Partitions")."""
    url = f"file:{tmp_path / 'log'}"
    old = BrokerProcess(tmp_path / "node-1", log_url=url, node_id="node-1", baton=previous_build)
    old.start()
    try:
        async with await clients.connect(old.address) as conn:
            await conn.declare_queue("kept")
            await conn.publish_batch("kept", [b"one", b"two"])
    finally:
        assert old.terminate() == 0
    new = BrokerProcess(tmp_path / "node-1", log_url=url, node_id="node-1",
                        extra=["--partitions", "4"])
    new.port = old.port
    new.start()
    try:
        assert "--partitions 4" in new.output(), new.output()  # said, not applied
        async with await clients.connect(new.address) as conn:
            enabled = await conn.enable_features()
            assert "partitions" in enabled, enabled
            await conn.declare_queue("after")
            for name, ready in (("kept", 2), ("after", 0)):
                stats = await conn.queue_stats(name)
                assert stats["partition"] == 1 and stats["ready"] == ready, stats
            top = await conn.topology()
            assert "partitions" not in top, top  # one log: no data partition rows
    finally:
        new.stop()
