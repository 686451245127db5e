"""Real broker processes for integration tests: start, kill -9, SIGTERM, restart."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import uuid
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BrokerProcess:
    """One ``baton serve`` process on 127.0.0.1, restartable on the same data dir and port."""

    def __init__(
        self,
        data_dir: Path,
        log_url: str | None = None,
        node_id: str | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.log_url = log_url
        self.node_id = node_id
        self.extra = list(extra or [])
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-{self.port}.out"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        cmd = [
            sys.executable, "-m", "batonmq.broker", "--log-level", "INFO", "serve",
            "--listen", self.address, "--data-dir", str(self.data_dir),
        ]
        if self.log_url:
            cmd += ["--log", self.log_url]
        if self.node_id:
            cmd += ["--node-id", self.node_id]
        cmd += self.extra
        env = dict(os.environ)
        out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.output()}")
            if b"baton ready" in self.log_path.read_bytes().split(b"baton: shutting down")[-1]:
                return
            time.sleep(0.05)
        raise RuntimeError(f"broker did not get ready in {timeout}s:\n{self.output()}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(20)

    def restart(self) -> None:
        # The ready line of the previous run is still in the output file.
        with open(self.log_path, "ab") as f:
            f.write(b"\nbaton: shutting down (restart by test)\n")
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused broker cannot stop
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A started broker on the embedded default log (file: in its data dir)."""
    b = BrokerProcess(tmp_path / "broker")
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _start_cluster(tmp_path: Path, log_url: str) -> Iterator[list[BrokerProcess]]:
    brokers = [
        BrokerProcess(tmp_path / f"node-{i}", log_url=log_url, node_id=f"node-{i}")
        for i in (1, 2, 3)
    ]
    try:
        for b in brokers:
            b.start()
        yield brokers
    finally:
        for b in brokers:
            b.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Three brokers (node-1..3) on one shared file: log, started in order."""
    yield from _start_cluster(tmp_path, f"file:{tmp_path / 'shared-log'}")


@pytest.fixture(params=["file", "kafka"])
def any_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Three brokers on one log: a shared file: log, then a topic on the test Kafka."""
    if request.param == "kafka":
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        url = f"kafka://{bootstrap}/baton-cluster-{uuid.uuid4().hex[:10]}"
    else:
        url = f"file:{tmp_path / 'shared-log'}"
    yield from _start_cluster(tmp_path, url)
