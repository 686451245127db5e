"""The ``baton`` command line (``python -m batonmq.broker``) run as subprocesses."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batonmq import clients
from tests.helpers import topology
from tests.integration.conftest import REPO, BrokerProcess

pytestmark = pytest.mark.integration


def baton(
    *args: str,
    timeout: float = 20.0,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m batonmq.broker ARGS`` (with ``env`` added to the environment)
    and capture its output."""
    env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "batonmq.broker", *args],
        input=None if stdin is None else stdin.decode(),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def _queues(address: str) -> dict[str, dict[str, Any]]:
    r = baton("queues", "--broker", address, "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert isinstance(rows, list)
    return {row["queue"]: row for row in rows}


def test_publish_queues_consume(broker: BrokerProcess) -> None:
    addr = broker.address
    r = baton("publish", "--broker", addr, "--declare", "q", "a", "b", "c")
    assert r.returncode == 0, r.stderr
    assert "published 3 message(s) to q" in r.stderr

    q = _queues(addr)["q"]
    assert (q["ready"], q["acquired"], q["enqueued"]) == (3, 0, 3)

    r = baton("consume", "q", "--broker", addr, "--count", "3", "-v")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    fields = [line.split("\t") for line in lines]
    assert [f[4] for f in fields] == ["a", "b", "c"]
    assert [int(f[0]) for f in fields] == [0, 1, 2]  # positions
    assert [int(f[1]) for f in fields] == [0, 0, 0]  # delivery counts
    assert [int(f[2]) for f in fields] == [0, 0, 0]  # acquired counts
    assert [json.loads(f[3]) for f in fields] == [{}, {}, {}]
    assert "consumed 3 message(s) from q" in r.stderr

    q = _queues(addr)["q"]
    assert (q["ready"], q["acquired"], q["accepted"]) == (0, 0, 3)


def test_publish_headers_stdin_and_table(broker: BrokerProcess) -> None:
    addr = broker.address
    r = baton(
        "publish", "--broker", addr, "--declare", "--header", "k=v", "--header", "n=1=2", "h",
        stdin=b"line one\nline two\n",
    )
    assert r.returncode == 0, r.stderr
    r = baton("publish", "--broker", addr, "h", "rep", "--count", "2")
    assert r.returncode == 0, r.stderr
    r = baton("queues", "--broker", addr)
    assert r.returncode == 0, r.stderr
    header, row = r.stdout.splitlines()
    assert header.split() == ["queue", "ready", "acquired", "consumers", "enqueued", "policy"]
    assert row.split() == ["h", "4", "0", "0", "4"]
    # --no-ack releases "not now": the message stays, with a raised acquired count;
    # --fail releases it as a failed delivery: its delivery count goes up too.
    r = baton("consume", "h", "--broker", addr, "--count", "1", "-v", "--no-ack")
    assert r.returncode == 0, r.stderr
    pos, count, acquired, headers, body = r.stdout.rstrip("\n").split("\t")
    assert (pos, count, acquired, json.loads(headers), body) == (
        "0", "0", "0", {"k": "v", "n": "1=2"}, "line one"
    )
    r = baton("consume", "h", "--broker", addr, "--count", "1", "-v", "--fail")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\t")[:3] == ["0", "0", "1"]
    r = baton("consume", "h", "--broker", addr, "--timeout", "0.5", "-v")
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert [row[4] for row in rows] == ["line one", "line two", "rep", "rep"]
    assert rows[0][1:3] == ["1", "2"]  # one failed delivery, two hand-outs before
    q = _queues(addr)["h"]
    # (The first consumer prefetched all four; cancelling it released the other three too.)
    assert (q["ready"], q["acquired"], q["accepted"]) == (0, 0, 4)
    assert q["redelivered"] >= 1


def test_consume_missing_queue_fails_cleanly(broker: BrokerProcess) -> None:
    r = baton("consume", "nope", "--broker", broker.address, "--timeout", "1")
    assert r.returncode != 0
    assert "nope" in r.stderr and "does not exist" in r.stderr
    assert "Traceback" not in r.stderr
    r = baton("publish", "--broker", broker.address, "nope", "x")
    assert r.returncode != 0
    assert "does not exist" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("listen", ["nonsense:abc", "127.0.0.1:99999", "127.0.0.1:"])
def test_serve_bad_listen_address(tmp_path: Path, listen: str) -> None:
    r = baton("serve", "--listen", listen, "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 2  # a configuration mistake (docs/operations.md)
    assert "baton ready" not in r.stdout
    assert "bad address" in r.stderr and repr(listen) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_serve_listen_address_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = "127.0.0.1:%d" % taken.getsockname()[1]
        r = baton("serve", "--listen", addr, "--data-dir", str(tmp_path / "d"))
        assert r.returncode == 2
        assert "baton ready" not in r.stdout
        assert "Traceback" not in r.stderr, r.stderr
        assert "cannot start" in r.stderr and "in use" in r.stderr
        # The reason is the last word (no "broker stopped" after it), and the data dir
        # that start made is gone again; one that existed stays.
        assert "broker stopped" not in r.stdout + r.stderr
        assert not (tmp_path / "d").exists()
        (tmp_path / "kept").mkdir()
        r = baton("serve", "--listen", addr, "--data-dir", str(tmp_path / "kept"))
        assert r.returncode == 2
        assert (tmp_path / "kept").is_dir()


def test_client_commands_without_broker_fail_cleanly() -> None:
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))  # held but not listening: connections are refused
        addr = "127.0.0.1:%d" % bound.getsockname()[1]
        for args in (
            ("publish", "--broker", addr, "q", "x"),
            ("consume", "q", "--broker", addr, "--timeout", "1"),
            ("queues", "--broker", addr),
        ):
            r = baton(*args)
            assert r.returncode != 0, args
            assert addr in r.stderr, r.stderr
            assert "could not connect" in r.stderr
            assert "Traceback" not in r.stderr
            assert r.stdout == ""


async def test_serve_on_port_0_reports_and_advertises_the_port_it_got(tmp_path: Path) -> None:
    """``--listen 127.0.0.1:0``: the ready line names the port the broker bound, a
    client connects there, and the cluster's topology lists that address; a restart
    on that port keeps it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "batonmq.broker", "serve", "--listen", "127.0.0.1:0",
         "--data-dir", str(tmp_path / "d"), "--node-id", "zero"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)).decode()
        assert line.startswith("baton ready: listening on 127.0.0.1:"), line
        addr = line.split()[4]
        port = int(addr.rpartition(":")[2])
        assert port != 0, line
        async with await clients.connect(addr, timeout=5) as conn:
            assert conn.node_id == "zero"
            await conn.declare_queue("q")
            assert await conn.publish("q", b"x") == 0
        top = await topology(addr)
        assert [(i["node_id"], i["address"]) for i in top["instances"]] == [("zero", addr)]
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
        assert proc.stdout is not None
        proc.stdout.close()
    # The test harness's brokers start the same way and restart on the port they got.
    b = BrokerProcess(tmp_path / "b", node_id="b")
    try:
        b.start()
        first = b.address
        assert b.port != 0
        assert [i["address"] for i in (await topology(first))["instances"]] == [first]
        assert b.terminate() == 0
        b.restart()
        assert b.address == first
        assert [i["address"] for i in (await topology(first))["instances"]] == [first]
    finally:
        b.stop()


async def test_serve_advertises_the_address_it_is_told(tmp_path: Path) -> None:
    """``--advertise localhost``: the ready line and the topology carry that host with
    the bound port (what peers use for a join update and clients for failover), and a
    client reaches the broker there."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "batonmq.broker", "serve", "--listen", "127.0.0.1:0",
         "--advertise", "localhost", "--data-dir", str(tmp_path / "d"), "--node-id", "adv"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)).decode()
        assert line.startswith("baton ready: listening on localhost:"), line
        addr = line.split()[4]
        assert int(addr.rpartition(":")[2]) != 0, line
        top = await topology(addr)
        assert [(i["node_id"], i["address"]) for i in top["instances"]] == [("adv", addr)]
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
        assert proc.stdout is not None
        proc.stdout.close()


def test_publish_with_a_delay(broker: BrokerProcess) -> None:
    addr = broker.address
    r = baton("publish", "--broker", addr, "--declare", "--delay", "60", "later", "x")
    assert r.returncode == 0, r.stderr
    q = _queues(addr)["later"]
    assert (q["ready"], q["delayed"], q["enqueued"]) == (0, 1, 1)
    r = baton("consume", "later", "--broker", addr, "--timeout", "0.5")
    assert r.returncode == 0 and r.stdout == "", r.stdout  # held: nothing to consume yet
    r = baton("publish", "--broker", addr, "later", "x", "--priority", "12")
    assert r.returncode == 1 and "priority must be" in r.stderr, r.stderr
