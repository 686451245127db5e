"""RabbitMQ's PerfTest (the Java load tool, fetched from Maven Central by ``.ci/perftest``)
against three Baton brokers' AMQP listeners: publishers with confirms, consumers with
multiple acks, a quorum queue through PerfTest's own direct exchange - without an error."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.integration.conftest import REPO, BrokerProcess
from tests.integration.test_amqp import amqp_port
from tests.integration.test_amqp_aio import amqp_cluster  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PERFTEST = REPO / ".ci" / "perftest"


def _perftest_or_skip() -> None:
    """Fetch PerfTest (once; CI fetches it up front). Without java or mvn outside CI the
    test is skipped: it needs the JVM tool itself, nothing can stand in for it."""
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    why = f"PerfTest needs {' and '.join(missing)}" if missing else ""
    if not missing:
        done = subprocess.run([str(PERFTEST), "fetch"], capture_output=True, text=True,
                              timeout=600)
        why = "" if done.returncode == 0 else f".ci/perftest fetch failed: {done.stderr[-1000:]}"
    if why:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why}: CI installs it, so this may not skip", pytrace=False)
        pytest.skip(why)


@pytest.mark.timeout(300)
def test_perftest_runs_against_three_brokers_with_confirms_and_multi_acks(
    amqp_cluster: list[BrokerProcess],
) -> None:
    _perftest_or_skip()
    uris = ",".join(f"amqp://guest:guest@127.0.0.1:{amqp_port(b)}" for b in amqp_cluster)
    done = subprocess.run(
        [str(PERFTEST), "run", "--uris", uris, "--producers", "2", "--consumers", "2",
         "--queue", "perf-test", "--quorum-queue", "--confirm", "100",
         "--multi-ack-every", "10", "--qos", "100", "--size", "1000", "--time", "12",
         "--id", "baton"],
        capture_output=True, text=True, timeout=240,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert not re.search(r"exception|error", out, re.IGNORECASE), out[-4000:]
    sent = re.search(r"sending rate avg: (\d+) msg/s", out)
    received = re.search(r"receiving rate avg: (\d+) msg/s", out)
    assert sent and received, out[-4000:]
    assert int(sent.group(1)) > 0 and int(received.group(1)) > 0, out[-2000:]
    # Every second's line: publishes confirmed, none nacked or returned.
    seconds = re.findall(r"sent: (\d+) msg/s, confirmed: (\d+) msg/s, nacked: (\d+) msg/s", out)
    assert seconds and sum(int(c) for _, c, _ in seconds) > 0, out[-2000:]
    assert all(n == "0" for _, _, n in seconds), out[-2000:]
