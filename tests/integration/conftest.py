"""Real broker processes for integration tests: start, kill -9, SIGTERM, restart."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import uuid
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batonmq.broker.config import ready_address
from tests.helpers import eventually, eventually_sync, topology

REPO = Path(__file__).resolve().parents[2]

_OUTPUTS = itertools.count(1)  # one output file per BrokerProcess, also on one data dir



def partitions_under_test() -> int:
    """The data partitions the suite's brokers are given (``BATON_TEST_PARTITIONS``; 1:
    the log of one partition)."""
    return int(os.environ.get("BATON_TEST_PARTITIONS") or 1)


class BrokerProcess:
    """One ``baton serve`` process on 127.0.0.1, restartable on the same data dir and port.

    The first start listens on port 0 and learns the port the broker bound from its
    ready line (no free-port guess that another process could take first); every
    restart listens on that same port, so the broker keeps its address.
    """

    def __init__(
        self,
        data_dir: Path,
        log_url: str | None = None,
        node_id: str | None = None,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        baton: Path | None = None,
        module: str = "batonmq.broker",
    ) -> None:
        self.data_dir = data_dir
        # The build to run: this checkout's (None), or another build's ``baton``
        # executable (a rolling upgrade's older build, loadtest/builds.py).
        self.baton = baton
        self.module = module  # else run as ``python -m MODULE`` (e.g. a newer build's stand-in)
        self.env = dict(env or {})  # more environment variables (e.g. libfaketime's)
        self.log_url = log_url
        self.node_id = node_id
        self.extra = list(extra or [])
        self.port = 0  # known from the first start's ready line
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-{next(_OUTPUTS)}.out"

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT`` for clients (known once the broker has started)."""
        assert self.port, "the broker's address is known once it has started"
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        """Start ``baton serve`` and wait for its ready line (the port it bound).

        Raises:
            RuntimeError: the broker exited before it was ready.
            AssertionError: it did not get ready within ``timeout`` seconds.
        """
        self.wait_ready(*self.launch(), timeout=timeout)

    def wait_ready(
        self, marker: bytes, proc: subprocess.Popen[bytes], timeout: float = 20.0
    ) -> None:
        """Wait for the ready line of the start :meth:`launch` made (``marker``, ``proc``).

        Raises:
            RuntimeError: the broker exited before it was ready.
            AssertionError: it did not get ready within ``timeout`` seconds.
        """

        def ready() -> str | None:
            text = self.log_path.read_bytes().rsplit(marker, 1)[-1].decode(errors="replace")
            found = next(filter(None, map(ready_address, text.splitlines())), None)
            if found is None and proc.poll() is not None:
                raise RuntimeError(f"broker exited with {proc.returncode}:\n{self.output()}")
            return found

        address = eventually_sync(
            ready, f"the ready line of {self.data_dir.name}", timeout=timeout, context=self.output
        )
        assert address is not None
        port = int(address.rpartition(":")[2])
        assert self.port in (0, port), f"restarted on port {port}, not {self.port}"
        self.port = port

    def launch(self) -> tuple[bytes, subprocess.Popen[bytes]]:
        """Start ``baton serve`` without waiting for it (one that will be refused never
        gets ready); the marker its output starts after, and the process."""
        prefix = [str(self.baton)] if self.baton else [sys.executable, "-m", self.module]
        cmd = [
            *prefix, "--log-level", "INFO", "serve",
            "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data_dir),
        ]
        if self.log_url:
            cmd += ["--log", self.log_url]
        if self.node_id:
            cmd += ["--node-id", self.node_id]
        cmd += self.extra
        parts = os.environ.get("BATON_TEST_PARTITIONS")
        if parts and "--partitions" not in self.extra and self.baton is None:
            # The suite run on a log of several partitions (docs/design.md §16).
            cmd += ["--partitions", parts]
        env = {**os.environ, **self.env}
        self.starts += 1
        marker = f"== test: start {self.starts}\n".encode()
        with open(self.log_path, "ab") as out:
            out.write(marker)  # earlier starts' ready lines are above it
            out.flush()
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        return marker, self.proc

    def output_since(self, marker: bytes) -> str:
        """What the broker printed since ``marker`` (its last :meth:`launch`)."""
        return self.log_path.read_bytes().rsplit(marker, 1)[-1].decode(errors="replace")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-20000:]

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
        """Start the broker again on its data dir and port (after a kill or a stop)."""
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


def brokers_of(
    tmp_path: Path, log_url: str, count: int = 3, extra: list[str] | None = None
) -> list[BrokerProcess]:
    """``count`` brokers (node-1..) of one log, each with ``extra`` options; not started."""
    return [
        BrokerProcess(tmp_path / f"node-{i}", log_url=log_url, node_id=f"node-{i}", extra=extra)
        for i in range(1, count + 1)
    ]


def started(brokers: list[BrokerProcess]) -> Iterator[list[BrokerProcess]]:
    """A fixture's body: start ``brokers``, yield them, stop them all.

    The first one forms the cluster (it leads); the others are launched together once
    it is ready and join at once (each joiner waits a heartbeat or two for a live
    member: one after the other, each added ~1.5 s to the fixture).
    """
    try:
        if brokers:
            brokers[0].start()
        launched = [(b, b.launch()) for b in brokers[1:]]
        for b, (marker, proc) in launched:
            b.wait_ready(marker, proc)
        yield brokers
    finally:
        for b in brokers:
            b.stop()


def _start_cluster(tmp_path: Path, log_url: str) -> Iterator[list[BrokerProcess]]:
    yield from started(brokers_of(tmp_path, log_url))


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


@pytest.fixture
def six_grouped(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Six brokers (admin listeners on) on one file log of two data partitions, in
    replica groups of three: each broker in one group (docs/design.md §16)."""
    yield from started(brokers_of(
        tmp_path, f"file:{tmp_path / 'shared-log'}", 6,
        ["--partitions", "2", "--replicas", "3", "--admin-listen", "127.0.0.1:0"],
    ))


@pytest.fixture
def grouped(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Four brokers on one file log of two data partitions, in replica groups of two, a
    broker out of the view replaced after 3 s (docs/design.md §16, "Replica groups")."""
    yield from started(brokers_of(
        tmp_path, f"file:{tmp_path / 'shared-log'}", 4,
        ["--partitions", "2", "--replicas", "2", "--replace-after-ms", "3000"],
    ))


# -- replica groups: what a broker applies and stores (docs/design.md §16) ------------------


def groups_settled(t: dict[str, Any], partitions: int, size: int, live: int) -> bool:
    """Topology ``t`` shows ``partitions`` groups of ``size`` caught-up live replicas,
    no one joining, spread over ``min(partitions * size, live)`` brokers evenly (no
    broker with two more than another)."""
    groups = t.get("groups") or []
    if len(groups) != partitions or any(
        g["replicas"] is None or len(g["replicas"]) != size or g["joining"]
        or g["live_replicas"] != size for g in groups
    ):
        return False
    per: dict[str, int] = {}
    for g in groups:
        for n in g["replicas"]:
            per[n] = per.get(n, 0) + 1
    return max(per.values()) - min(per.values()) <= 1 and len(per) == min(partitions * size, live)


async def settled_groups(address: str, partitions: int, size: int, live: int) -> list[dict[str, Any]]:
    """The topology's ``groups`` rows once :func:`groups_settled`, as the broker at
    ``address`` applied them."""
    top = await eventually(lambda: topology(address), "the groups settled", timeout=60,
                           until=lambda t: groups_settled(t, partitions, size, live))
    return list(top["groups"])


def stored_partitions(data_dir: Path) -> list[int]:
    """The data partitions whose store (``store-pK``) is in a broker's data dir."""
    return sorted(int(p.name[len("store-p"):]) for p in data_dir.iterdir()
                  if p.name.startswith("store-p"))


async def applies_only_its_groups(b: BrokerProcess, groups: list[dict[str, Any]]) -> list[int]:
    """Wait until broker ``b`` applies (topology ``partitions``, each as a member) and
    stores exactly the data partitions whose group it is in; returns them."""
    mine = sorted(g["partition"] for g in groups if b.node_id in g["replicas"])
    top = await eventually(
        lambda: topology(b.address), f"{b.node_id} applying only {mine}", timeout=30,
        until=lambda t: [p["partition"] for p in t["partitions"]] == mine
        and t["status"] == "ok",
    )
    assert all(p["member"] for p in top["partitions"]), top["partitions"]
    assert stored_partitions(b.data_dir) == mine, (b.node_id, stored_partitions(b.data_dir), mine)
    return mine
