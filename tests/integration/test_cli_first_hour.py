"""The ``baton`` command as a new user meets it, run as they would: arguments in any
order, a wrong port told apart (HTTP, AMQP), a bare port, a list of brokers,
``BATON_BROKER``, named contexts (``baton context``), a dead member in the topology, and
no traceback for an interrupt or a missing extra."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from batonmq.broker.config import admin_ready_address, amqp_ready_address
from tests.helpers import eventually_sync
from tests.integration.conftest import REPO, BrokerProcess
from tests.integration.test_cli import _queues, baton

pytestmark = pytest.mark.integration


@pytest.fixture
def contexts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A contexts file of this test's own (the user's is never read)."""
    path = tmp_path / "contexts.json"
    monkeypatch.setenv("BATON_CONTEXTS", str(path))
    return path


@pytest.fixture
def listeners(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker with its AMQP and admin listeners on too."""
    b = BrokerProcess(
        tmp_path / "b", extra=["--amqp-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]
    )
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _port_of(b: BrokerProcess, ready: object) -> int:
    found = [a for a in map(ready, b.output().splitlines()) if a is not None]  # type: ignore[operator]
    assert found, b.output()
    return int(str(found[-1]).rpartition(":")[2])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_arguments_may_follow_options(broker: BrokerProcess, contexts: Path) -> None:
    addr = broker.address
    for args in (
        ["publish", "work", "--count", "3", "x", "--broker", addr, "--declare"],
        ["publish", "--declare", "work2", "--broker", addr, "m1", "m2"],
        ["publish", "work3", "a", "--header", "k=v", "b", "--declare", "--broker", addr],
    ):
        r = baton(*args)
        assert r.returncode == 0, (args, r.stderr)
    q = _queues(addr)
    assert (q["work"]["ready"], q["work2"]["ready"], q["work3"]["ready"]) == (3, 2, 2)
    r = baton("consume", "work3", "--count", "2", "-v", "--broker", addr)
    assert r.returncode == 0, r.stderr
    lines = [line.split("\t") for line in r.stdout.splitlines()]
    assert [(json.loads(f[3]), f[4]) for f in lines] == [({"k": "v"}, "a"), ({"k": "v"}, "b")]
    # What is still wrong is still refused, in one line.
    r = baton("publish", "work", "x", "--no-such-option", "--broker", addr)
    assert r.returncode == 2
    assert "unrecognized arguments: --no-such-option" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_wrong_port_is_named(listeners: BrokerProcess, contexts: Path) -> None:
    admin = _port_of(listeners, admin_ready_address)
    amqp = _port_of(listeners, amqp_ready_address)
    r = baton("queues", "--broker", f"127.0.0.1:{admin}")
    assert r.returncode == 1
    assert "this port speaks HTTP (the admin listener" in r.stderr, r.stderr
    assert "frame of" not in r.stderr
    r = baton("queues", "--broker", f"127.0.0.1:{amqp}")
    assert r.returncode == 1
    assert "this port speaks AMQP 0-9-1" in r.stderr, r.stderr

    # pika at the native port hears an AMQP answer that says where to go, not silence,
    # and the broker says so in its log.
    params = pika.ConnectionParameters(
        "127.0.0.1", listeners.port, connection_attempts=1, socket_timeout=5
    )
    with pytest.raises(pika.exceptions.AMQPConnectionError) as caught:
        pika.BlockingConnection(params)
    assert "connect to the port of its --amqp-listen" in repr(caught.value), repr(caught.value)
    eventually_sync(
        lambda: "an AMQP 0-9-1 client (the --amqp-listen port is for those)" in listeners.output(),
        "the broker's line about the AMQP client",
    )
    # A browser (or curl) at the native port gets an HTTP answer that says where to go.
    with socket.create_connection(("127.0.0.1", listeners.port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400 "), reply
    assert b"--admin-listen" in reply
    # The broker still serves its own clients.
    assert baton("queues", "--broker", listeners.address).returncode == 0


def test_bare_port_list_and_environment(broker: BrokerProcess, contexts: Path) -> None:
    r = baton("publish", "q", "m", "--declare", "--broker", str(broker.port))
    assert r.returncode == 0, r.stderr
    # A list: the first broker is down, the next one answers.
    dead = f"127.0.0.1:{_free_port()}"
    r = baton("queues", "--json", "--broker", f"{dead},{broker.address}")
    assert r.returncode == 0, r.stderr
    assert [q["queue"] for q in json.loads(r.stdout)] == ["q"]
    # BATON_BROKER when --broker is not given; --broker wins over it.
    r = baton("queues", "--json", env={"BATON_BROKER": broker.address})
    assert r.returncode == 0, r.stderr
    r = baton("queues", "--json", "--broker", dead, env={"BATON_BROKER": broker.address})
    assert r.returncode == 1


def test_contexts(broker: BrokerProcess, contexts: Path, tmp_path: Path) -> None:
    dead = f"127.0.0.1:{_free_port()}"
    r = baton("context", "add", "local", "--broker", broker.address)
    assert r.returncode == 0, r.stderr
    assert "(in use)" in r.stderr  # the first one added
    assert stat.S_IMODE(os.stat(contexts).st_mode) == 0o600
    r = baton("context", "add", "other", "--broker", dead)
    assert r.returncode == 0, r.stderr
    r = baton("context", "list")
    assert r.stdout.splitlines() == [f"* local\t{broker.address}\tguest", f"  other\t{dead}\tguest"]

    r = baton("publish", "--declare", "viactx", "m")  # no --broker: the context in use
    assert r.returncode == 0, r.stderr
    assert "viactx" in _queues(broker.address)
    r = baton("--context", "other", "queues")
    assert r.returncode == 1  # other's broker is down
    r = baton("context", "use", "other")
    assert r.returncode == 0
    assert baton("queues").returncode == 1
    assert baton("queues", env={"BATON_CONTEXT": "local"}).returncode == 0
    assert baton("queues", env={"BATON_BROKER": broker.address}).returncode == 0

    r = baton("--context", "nope", "queues")
    assert r.returncode == 1
    assert "no context 'nope' (known: local, other)" in r.stderr

    # A password from a file is named, not stored; a saved one only when asked, and
    # never shown.
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    r = baton("context", "add", "fromfile", "--broker", dead, "--user", "u",
              "--password-file", str(pw))
    assert r.returncode == 0, r.stderr
    assert "s3cret" not in contexts.read_text()
    r = baton("context", "add", "saved", "--broker", dead, "--user", "u", "--save-password",
              env={"BATON_PASSWORD": "hunter2"})
    assert r.returncode == 0, r.stderr
    assert "hunter2" in contexts.read_text()
    # The saved password is the context's user's: another user named is not given it.
    r = baton("--context", "saved", "--user", "other", "queues", stdin=b"")
    assert r.returncode == 1 and "user 'other' needs a password" in r.stderr, r.stderr
    r = baton("context", "show", "saved")
    assert json.loads(r.stdout)["password"] == "(saved)"
    assert "hunter2" not in r.stdout
    r = baton("context", "remove", "other")
    assert r.returncode == 0
    r = baton("context", "list", "--json")
    listed = json.loads(r.stdout)
    assert listed["current"] is None and sorted(listed["contexts"]) == ["fromfile", "local", "saved"]

    contexts.write_text("{not json")
    r = baton("queues", "--broker", broker.address)
    assert r.returncode == 1
    assert "contexts file" in r.stderr and "damaged" in r.stderr


def test_topology_shows_a_dead_member_and_survivors_say_what_changed(
    cluster: list[BrokerProcess], contexts: Path
) -> None:
    from batonmq import clients

    n1, n2, n3 = cluster
    with clients.sync.connect(n3.address) as conn:
        conn.declare_queue("scratch", durable=False)  # goes with its declarer
    eventually_sync(
        lambda: "scratch" in _queues(n1.address), "n1 applied the declare of scratch"
    )
    n3.kill9()

    def n3_row() -> str | None:
        r = baton("topology", "--broker", n1.address)
        row = next((line for line in r.stdout.splitlines() if "node-3" in line), None)
        return row if row is not None and ("silent" in row or "SUSPECTED" in row) else None

    # Shown silent (then suspected) until the next view drops it: never as a normal voter
    # for long. (The view may drop it before a poll sees "SUSPECTED".)
    eventually_sync(n3_row, "node-3 shown silent by baton topology", timeout=20)
    r = baton("topology", "--json", "--broker", n2.address)
    rows = {i["node_id"]: i for i in json.loads(r.stdout)["instances"]}
    assert rows["node-2"]["suspected"] is False and "silent_beats" in rows["node-2"]
    eventually_sync(
        lambda: "left it: node-3/" in n1.output() or None,
        "node-1's INFO line about the view without node-3", timeout=20,
    )
    # On a split log the queue's data partition drops node-3 in its own view, a moment
    # after control's.
    eventually_sync(
        lambda: "non-durable queue 'scratch' deleted: node-3/" in n1.output() or None,
        "node-1's line about scratch deleted with node-3", timeout=20, context=n1.output,
    )
    assert "scratch" not in _queues(n1.address)


def test_consume_says_what_it_did(broker: BrokerProcess, contexts: Path) -> None:
    addr = broker.address
    assert baton("publish", "--declare", "q", "a", "b", "--broker", addr).returncode == 0
    r = baton("consume", "q", "--count", "1", "--fail", "--broker", addr)
    assert "released as failed 1 message(s) from q" in r.stderr, r.stderr
    r = baton("consume", "q", "--count", "1", "--no-ack", "--broker", addr)
    assert "released 1 message(s) from q" in r.stderr, r.stderr


def test_a_missing_extra_is_named_not_a_traceback(tmp_path: Path, contexts: Path) -> None:
    # As on an install without the spark extra: importing pyspark fails.
    r = subprocess.run(
        [sys.executable, "-c",
         "import sys; sys.modules['pyspark'] = None; from batonmq.broker.entry import main;"
         " sys.exit(main())",
         "import-entries", "run", "--brokers", "127.0.0.1:1", "--table", str(tmp_path / "t"),
         "--checkpoint", str(tmp_path / "c")],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "needs pyspark, which is not installed: pip install 'batonmq[spark]'" in r.stderr


@pytest.mark.parametrize("after", [0.05, 0.15, 0.3, 0.6, 1.0])
def test_ctrl_c_at_any_moment_is_quiet(after: float, contexts: Path) -> None:
    # A broker that never answers: the command is still starting, or waiting for it.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        proc = subprocess.Popen(
            [sys.executable, "-m", "batonmq.broker", "queues", "--broker",
             f"127.0.0.1:{silent.getsockname()[1]}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        )
        try:
            proc.wait(after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    # 130 once Python handles Ctrl-C (-2: interrupted before the interpreter did).
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, err)
    assert "Traceback" not in err, err


def test_queue_declare_makes_a_missing_dead_letter_queue(
    broker: BrokerProcess, contexts: Path
) -> None:
    addr = broker.address
    r = baton("queue", "declare", "jobs", "--max-length", "1000", "--dead-letter", "jobs.dlq",
              "--broker", addr)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "queue jobs.dlq declared (its dead-letter queue)", "queue jobs declared"]
    queues = _queues(addr)
    assert queues["jobs.dlq"]["durable"] is True  # (not dropped on the floor)
    assert baton("publish", "jobs", "bad", "--broker", addr).returncode == 0
    from batonmq import clients

    with clients.sync.connect(addr) as conn:
        with conn.consume("jobs", prefetch=1) as consumer:
            consumer.next(timeout=10).reject()
        eventually_sync(
            lambda: conn.queue_stats("jobs.dlq")["ready"] == 1, "the reject in jobs.dlq"
        )
    # A transient queue's is transient; one that exists is left as it is.
    r = baton("queue", "declare", "t", "--transient", "--dead-letter", "t.dlq", "--broker", addr)
    assert r.returncode == 0, r.stderr
    assert _queues(addr)["t.dlq"]["durable"] is False
    r = baton("queue", "declare", "u", "--dead-letter", "jobs", "--broker", addr)
    assert r.stdout.splitlines() == ["queue u declared"], r.stdout
    assert _queues(addr)["jobs"]["max_length"] == 1000


def test_exchanges_and_bindings_on_the_command_line(broker: BrokerProcess, contexts: Path) -> None:
    addr = broker.address
    ok = lambda *args: baton(*args, "--broker", addr)  # noqa: E731
    for q in ("eu", "all"):
        assert ok("queue", "declare", q).returncode == 0
    r = ok("exchange", "declare", "orders", "--type", "topic")
    assert r.returncode == 0 and "exchange orders declared" in r.stderr, r.stderr
    assert ok("binding", "add", "eu", "orders", "--routing-key", "eu.*").returncode == 0
    assert ok("binding", "add", "all", "orders", "--routing-key", "#").returncode == 0

    r = ok("publish", "--exchange", "orders", "--routing-key", "eu.paris", "m1", "m2")
    assert r.returncode == 0, r.stderr
    assert "reached all (2), eu (2)" in r.stderr, r.stderr
    r = ok("publish", "--exchange", "orders", "--routing-key", "us.nyc", "m3")
    assert "reached all (1)" in r.stderr, r.stderr
    q = _queues(addr)
    assert (q["eu"]["ready"], q["all"]["ready"]) == (2, 3)

    r = ok("exchange", "list", "--json")
    by_name = {e["exchange"]: e for e in json.loads(r.stdout)}
    assert by_name["orders"]["type"] == "topic" and len(by_name["orders"]["bindings"]) == 2
    r = ok("exchange", "list")
    assert any(line.split()[:2] == ["orders", "topic"] for line in r.stdout.splitlines())
    r = ok("binding", "list", "--exchange", "orders", "--json")
    assert sorted((b["queue"], b["routing_key"]) for b in json.loads(r.stdout)) == [
        ("all", "#"), ("eu", "eu.*")]

    r = ok("binding", "remove", "eu", "orders", "--routing-key", "eu.*")
    assert r.returncode == 0 and "removed" in r.stderr
    r = ok("exchange", "delete", "orders", "--if-unused")
    assert r.returncode == 1  # "all" is still bound
    r = ok("exchange", "delete", "orders")
    assert r.returncode == 0 and "with 1 binding(s)" in r.stderr, r.stderr
    r = ok("publish", "--exchange", "orders", "x")
    assert r.returncode == 1 and "orders" in r.stderr
    r = ok("publish", "--declare", "--exchange", "", "x")
    assert r.returncode == 1 and "not with --exchange" in r.stderr


def test_a_queue_that_exists_with_other_settings_names_them(
    listeners: BrokerProcess, contexts: Path
) -> None:
    addr = listeners.address
    assert baton("queue", "declare", "q", "--max-length", "10", "--broker", addr).returncode == 0
    r = baton("queue", "declare", "q", "--max-length", "20", "--delivery-limit", "5",
              "--broker", addr)
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "baton: queue 'q' exists with other settings: max_length is 10, not 20;"
        " delivery_limit is 20, not 5"
    ), r.stderr
    params = pika.ConnectionParameters("127.0.0.1", _port_of(listeners, amqp_ready_address))
    with pika.BlockingConnection(params) as conn:
        channel = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.queue_declare("q", durable=True, arguments={"x-max-length": 20})
    assert caught.value.reply_code == 406
    assert caught.value.reply_text == (
        "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/':"
        " received 20 but current is 10"
    )


def test_queues_counts_the_consumers_of_the_whole_cluster(
    cluster: list[BrokerProcess], contexts: Path
) -> None:
    from batonmq import clients

    n1, n2, n3 = cluster
    with clients.sync.connect(n3.address) as c3, clients.sync.connect(n1.address) as c1:
        c3.declare_queue("shared")
        with c3.consume("shared"), c3.consume("shared"), c1.consume("shared"):
            eventually_sync(
                lambda: _queues(n2.address)["shared"]["consumers_cluster"] == 3,
                "3 consumers counted from node-2, which has none",
            )
            row = _queues(n2.address)["shared"]
            assert row["consumers"] == 0  # (node-2's own)
            r = baton("queues", "--broker", n2.address)
            line = next(x for x in r.stdout.splitlines() if x.startswith("shared"))
            assert line.split()[3] == "3", r.stdout
