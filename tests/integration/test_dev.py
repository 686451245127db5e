"""``baton dev``: the local cluster a new user tries failover with, run as they would."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import eventually_sync
from tests.integration.conftest import REPO
from tests.integration.test_cli import baton

pytestmark = pytest.mark.integration


class Dev:
    """A running ``baton dev`` and its output so far."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.out_path = tmp_path / "dev.out"
        self._out = open(self.out_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "batonmq.broker", "dev", "--listen", "127.0.0.1:0",
             "--data-dir", str(tmp_path / "dev"), *args],
            stdin=subprocess.PIPE, stdout=self._out, stderr=subprocess.STDOUT, cwd=REPO,
        )

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"baton dev exited {self.proc.returncode}:\n{self.output()}")
            return re.search(pattern, self.output(), re.M)

        match = eventually_sync(found, f"{pattern!r} in baton dev's output", timeout=timeout,
                                context=self.output)
        assert match is not None
        return match

    def pid_and_address(self, node: str) -> tuple[int, str]:
        m = self.wait_for(rf"^  {node} (\S+) pid (\d+).* ready$")
        return int(m.group(2)), m.group(1)

    def stop(self) -> int:
        """Ctrl-C, as a user stops it; its exit code (a second call returns it again)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(60)
        self._out.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        return code


@pytest.fixture
def dev_factory(tmp_path: Path) -> Iterator[list[Dev]]:
    made: list[Dev] = []
    yield made
    for d in made:
        d.stop()


def _kill9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def test_a_killed_broker_leaves_the_others_running_and_restarts(
    tmp_path: Path, dev_factory: list[Dev]
) -> None:
    dev = Dev(tmp_path, "--nodes", "3", "--restart", "--property", "zone=lab")
    dev_factory.append(dev)
    dev.wait_for("^Ctrl-C stops them all")
    pids = {n: dev.pid_and_address(n) for n in ("node-1", "node-2", "node-3")}
    everyone = ",".join(a for _, a in pids.values())
    # A serve setting given to dev reaches every broker.
    topo = json.loads(baton("topology", "--json", "--broker", pids["node-1"][1]).stdout)
    assert {i["properties"].get("zone") for i in topo["instances"]} == {"lab"}

    _kill9(pids["node-2"][0])
    dev.wait_for(r"^node-2 \(\S+\) exited \(killed by SIGKILL\); 2 of 3 running; restarting it")
    r = baton("publish", "--declare", "q", "m", "--broker", pids["node-1"][1])
    assert r.returncode == 0, r.stderr  # the others still serve
    m = dev.wait_for(r"^  node-2 (\S+) pid (\d+).* restarted$")
    assert m.group(1) == pids["node-2"][1]  # the same address again
    assert int(m.group(2)) != pids["node-2"][0]
    r = baton("queues", "--json", "--broker", pids["node-2"][1])
    assert r.returncode == 0, r.stderr
    assert dev.stop() == 0
    assert "all brokers stopped" in dev.output()


def test_enter_restarts_a_killed_broker(tmp_path: Path, dev_factory: list[Dev]) -> None:
    dev = Dev(tmp_path, "--nodes", "2", "--amqp-listen", "127.0.0.1:0")
    dev_factory.append(dev)
    dev.wait_for("^Ctrl-C stops them all")
    pid, address = dev.pid_and_address("node-1")
    assert re.search(r"^  node-1 .*\(AMQP 127\.0\.0\.1:\d+\) ready$", dev.output(), re.M)
    _kill9(pid)
    dev.wait_for(r"^node-1 \(\S+\) exited .*; 1 of 2 running; press Enter to restart it")
    assert "restarted" not in dev.output()
    assert dev.proc.stdin is not None
    dev.proc.stdin.write(b"\n")
    dev.proc.stdin.flush()
    m = dev.wait_for(r"^  node-1 (\S+) pid \d+.* restarted$")
    assert m.group(1) == address


def test_a_taken_port_shows_the_brokers_own_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = baton("dev", "--nodes", "2", "--listen", f"127.0.0.1:{port}",
                  "--data-dir", str(tmp_path / "d"), timeout=90)
    assert r.returncode == 1
    assert "node-1 did not start (exit code 2)" in r.stderr, r.stderr
    assert "address already in use" in r.stderr


def test_settings_dev_sets_itself_are_refused(tmp_path: Path) -> None:
    r = baton("dev", "--data-dir", str(tmp_path / "d"), "--log-url", "memory:")
    assert r.returncode == 2
    assert "--log-url is set by baton dev itself" in r.stderr
    r = baton("queues", "--no-such-flag")
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr
