"""The operator's ``baton`` commands against real brokers: ``--version``, ``health`` and
``topology`` exit codes, ``queue declare|purge|delete``, ``serve --config`` and
``--print-config``, JSON logs, and one line (no traceback) for every ordinary mistake."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from batonmq import clients
from batonmq.broker.config import ready_address
from batonmq.cluster.features import FEATURES
from tests.helpers import eventually_sync
from tests.integration.conftest import REPO, BrokerProcess
from tests.integration.test_cli import baton

pytestmark = pytest.mark.integration

#: A text log line (logging's default time format); anything else on stderr is for people.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")


def test_version() -> None:
    r = baton("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"baton {version('batonmq')}"


def test_the_broker_tells_clients_the_installed_version(broker: BrokerProcess) -> None:
    with clients.sync.connect(broker.address) as conn:
        assert conn.server == f"baton/{version('batonmq')}"


def test_queue_declare_takes_the_work_queue_settings(broker: BrokerProcess) -> None:
    r = baton("queue", "declare", "work", "--broker", broker.address, "--retry", "exponential",
              "--retry-delay", "0.5", "--retry-max", "30", "--ack-timeout", "20",
              "--max-priority", "5", "--single-active-consumer", "--dedupe-window", "60")
    assert (r.returncode, r.stdout) == (0, "queue work declared\n"), r.stderr
    with clients.sync.connect(broker.address) as conn:
        stats = conn.queue_stats("work")
    assert (stats["retry"], stats["retry_delay_ms"], stats["retry_max_ms"]) == (
        "exponential", 500, 30_000)
    assert (stats["ack_timeout_ms"], stats["max_priority"]) == (20_000, 5)
    assert stats["single_active_consumer"] is True and stats["dedupe_window_ms"] == 60_000


def test_queue_declare_purge_delete_round_trip(broker: BrokerProcess) -> None:
    addr = broker.address
    r = baton("queue", "declare", "jobs", "--broker", addr, "--max-length", "10",
              "--overflow", "drop-head", "--delivery-limit", "3", "--message-ttl", "60")
    assert (r.returncode, r.stdout) == (0, "queue jobs declared\n"), r.stderr
    r = baton("queue", "declare", "jobs", "--broker", addr, "--max-length", "10",
              "--overflow", "drop-head", "--delivery-limit", "3", "--message-ttl", "60")
    assert (r.returncode, r.stdout) == (0, "queue jobs exists\n"), r.stderr
    # Other settings for the same queue: refused, one line.
    r = baton("queue", "declare", "jobs", "--broker", addr)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    with clients.sync.connect(addr) as conn:
        conn.publish_batch("jobs", [b"%d" % i for i in range(8)])
        conn.publish_batch("jobs", [b"%d" % i for i in range(8, 12)])
        assert conn.queue_stats("jobs")["ready"] == 10  # max_length with drop-head
    r = baton("queue", "purge", "jobs", "--broker", addr)
    assert (r.returncode, r.stdout) == (0, "queue jobs purged: 10 ready message(s) dropped\n")
    with clients.sync.connect(addr) as conn:
        assert conn.queue_stats("jobs")["ready"] == 0
        conn.publish("jobs", b"left")
    r = baton("queue", "delete", "jobs", "--broker", addr)
    assert (r.returncode, r.stdout) == (0, "queue jobs deleted with 1 message(s)\n"), r.stderr
    r = baton("queues", "--broker", addr, "--json")
    assert json.loads(r.stdout) == []


def test_health_and_topology_of_a_ready_broker(broker: BrokerProcess) -> None:
    r = baton("health", "--broker", broker.address)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("broker ") and " is ready: member of view " in r.stdout
    r = baton("topology", "--broker", broker.address, "--json")
    assert r.returncode == 0, r.stderr
    topo = json.loads(r.stdout)
    assert topo["member"] and topo["healthy"]
    assert 0 <= topo["behind_ms"] <= topo["suspect_ms"] == 3000


def test_health_and_topology_of_a_stopped_broker(broker: BrokerProcess) -> None:
    addr = broker.address
    broker.stop()
    for command in ("health", "topology"):
        r = baton(command, "--broker", addr)
        assert r.returncode == 1, r.stdout
        assert r.stderr.splitlines() == [r.stderr.strip()] and addr in r.stderr
        assert "could not connect" in r.stderr and "Traceback" not in r.stderr


def test_health_of_a_broker_taking_in_a_join_update(tmp_path: Path) -> None:
    """A joining broker serves (and is a member) while the update streams its queues'
    messages: not ready until it has them all, then ready."""
    log_url = f"file:{tmp_path / 'shared-log'}"
    # The donor streams 400 messages/s: 3000 messages keep the joiner updating ~7 s.
    donor = BrokerProcess(tmp_path / "donor", log_url=log_url, node_id="donor",
                          extra=["--update-max-rate", "400"])
    joiner = BrokerProcess(tmp_path / "joiner", log_url=log_url, node_id="joiner")
    try:
        donor.start()
        with clients.sync.connect(donor.address) as conn:
            conn.declare_queue("backlog")
            for start in range(0, 3000, 500):
                conn.publish_batch("backlog", [b"m%d" % i for i in range(start, start + 500)])
        joiner.start(timeout=60)
        r = baton("health", "--broker", joiner.address)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "is not ready: joining: still taking in the cluster's state" in r.stdout
        # The topology answers (it is a healthy member meanwhile).
        assert baton("topology", "--broker", joiner.address).returncode == 0
        assert baton("health", "--broker", donor.address).returncode == 0

        def health() -> int:
            return baton("health", "--broker", joiner.address).returncode

        eventually_sync(health, "the joiner is ready", timeout=60, until=lambda rc: rc == 0)
    finally:
        joiner.stop()
        donor.stop()


def test_serve_from_a_config_file_and_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "baton.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "d"}"\nnode_id = "from-file"\nheartbeat_ms = 300\n'
        'role = "voter"\n[properties]\nzone = "file"\n'
    )
    env = {"BATON_CONFIG": str(config), "BATON_PROPERTIES": "zone=env,rack=r1",
           "BATON_LOG_LEVEL": "WARNING"}
    r = baton("serve", "--print-config", "--heartbeat-ms", "250", env=env)
    assert r.returncode == 0, r.stderr
    printed = tomllib.loads(r.stdout)
    assert (printed["node_id"], printed["heartbeat_ms"], printed["properties"]) == (
        "from-file", 250, {"zone": "env", "rack": "r1"})
    assert "heartbeat_ms = 250  # flag --heartbeat-ms" in r.stdout
    # The broker started that way runs with those settings.
    proc = subprocess.Popen(
        [sys.executable, "-m", "batonmq.broker", "serve", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=_env(env),
    )
    try:
        addr = _ready(proc)
        with clients.sync.connect(addr) as conn:
            (me,) = conn.topology()["instances"]
        # Its properties, and apart from them the feature flags its build announces
        # (cluster/features.py).
        assert (me["node_id"], me["properties"], me["features"]) == (
            "from-file", {"zone": "env", "rack": "r1"}, sorted(FEATURES))
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert b" INFO " not in err  # BATON_LOG_LEVEL=WARNING


def test_serve_log_format_json(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "batonmq.broker", "--log-format", "json", "serve",
         "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d"), "--node-id", "jsonnode"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    )
    try:
        addr = _ready(proc)  # the machine-readable ready line stays on stdout, not JSON
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    lines = [json.loads(line) for line in err.decode().splitlines()]
    assert len(lines) >= 3, err
    for line in lines:
        assert {"time", "level", "node", "runtime", "logger", "message"} <= set(line)
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", line["time"])
    named = [line for line in lines if line["node"] is not None]
    assert named and {line["node"] for line in named} == {"jsonnode"}
    assert len({line["runtime"] for line in named}) == 1
    assert any("listening on" in line["message"] for line in lines)
    assert lines[-1]["message"] == "broker stopped"
    assert any(addr in line["message"] for line in lines)
    assert out.decode() == "baton: shutting down\n"  # no log line on stdout


def _env(extra: dict[str, str]) -> dict[str, str]:
    import os

    return {**os.environ, **extra}


def _ready(proc: subprocess.Popen[bytes]) -> str:
    """The address from a started ``baton serve``'s ready line (its first stdout line)."""
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    addr = ready_address(line)
    assert addr is not None, line
    return addr


# --- every ordinary mistake: one line, no traceback, a non-zero exit ----------------------


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One broker for the mistakes that need one (the address)."""
    b = BrokerProcess(tmp_path_factory.mktemp("mistakes") / "broker")
    b.start()
    try:
        with clients.sync.connect(b.address) as conn:
            conn.declare_queue("strict", max_length=5)
        yield b.address
    finally:
        b.stop()


@pytest.fixture(scope="module")
def refused() -> Iterator[str]:
    """An address held but not listening: connections to it are refused."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield "127.0.0.1:%d" % bound.getsockname()[1]


MISTAKES = [
    # (arguments, what the one line says); {refused} {running} {tmp} are filled in.
    (["--log-level", "LOUD", "queues"], "invalid choice: 'LOUD'"),
    (["--log-format", "xml", "queues"], "invalid choice: 'xml'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["publish", "--broker", "{refused}", "--header", "novalue", "q", "x"],
     "--header needs KEY=VALUE, got 'novalue'"),
    (["publish", "q", "x", "--count", "two"], "invalid int value: 'two'"),
    (["publish", "--broker", "{refused}", "q", "x"], "could not connect"),
    (["consume", "q", "--broker", "{refused}"], "could not connect"),
    (["consume", "q", "--prefetch", "x"], "invalid int value: 'x'"),
    (["queues", "--broker", "nonsense:abc"], "bad address 'nonsense:abc'"),
    (["queues", "--broker", "127.0.0.1:99999"], "port out of range"),
    (["queues", "--broker", "{refused}"], "could not connect"),
    (["topology", "--broker", "{refused}"], "could not connect"),
    (["health", "--broker", "{refused}"], "could not connect"),
    (["health", "--broker", "nonsense"], "could not connect to any broker: nonsense:5671"),
    (["services", "--broker", "{refused}"], "could not connect"),
    (["handover", "svc", "--broker", "{refused}"], "could not connect"),
    (["queue", "declare", "q", "--broker", "{refused}"], "could not connect"),
    (["queue", "declare", "q", "--max-length", "many"], "invalid int value: 'many'"),
    (["queue", "declare", "q", "--overflow", "spill"], "invalid choice: 'spill'"),
    (["queue", "declare", "q", "--retry", "sometimes"], "invalid choice: 'sometimes'"),
    (["queue", "declare", "pq", "--max-priority", "12", "--broker", "{running}"], "priority"),
    (["queue", "declare", "q", "--expires", "soon"], "invalid float value: 'soon'"),
    (["queue", "declare", "xq", "--expires", "-1", "--broker", "{running}"],
     "expires must be positive"),
    (["queue", "frobnicate", "q"], "invalid choice: 'frobnicate'"),
    (["queue", "purge"], "the following arguments are required: queue"),
    (["queue", "peek", "nope", "--broker", "{running}"], "queue 'nope' does not exist"),
    (["queue", "peek", "q", "--count", "0", "--broker", "{running}"], "count"),
    (["connections", "--broker", "{refused}"], "could not connect"),
    (["message", "history", "q", "first", "--broker", "{running}"], "invalid int value: 'first'"),
    (["message", "history", "nope", "0", "--broker", "{running}"], "'nope'"),
    (["serve", "--data-dir", "{tmp}/d", "--admin-listen", "x:y"], "bad address 'x:y'"),
    (["queue", "purge", "nope", "--broker", "{running}"], "queue 'nope' does not exist"),
    (["queue", "delete", "nope", "--broker", "{running}"], "queue 'nope' does not exist"),
    (["queue", "declare", "strict", "--broker", "{running}"], "strict"),
    (["queue", "declare", "bad", "--delivery-limit", "-1", "--broker", "{running}"], "delivery"),
    (["consume", "nope", "--broker", "{running}", "--timeout", "1"], "does not exist"),
    (["publish", "--broker", "{running}", "nope", "x"], "does not exist"),
    (["serve"], "data_dir is not set"),
    (["serve", "--data-dir", "{tmp}/d", "--listen", "x:y"], "--listen: bad address 'x:y'"),
    (["serve", "--data-dir", "{tmp}/d", "--listen", "0.0.0.0:0"],
     "advertise = (not set) (default): must be set when listening on all interfaces"),
    (["serve", "--data-dir", "{tmp}/d", "--listen", "0.0.0.0:0", "--advertise", "::"],
     "advertise = \"::\" (flag --advertise): must be an address others can reach"),
    (["serve", "--data-dir", "{tmp}/d", "--max-prefetch", "0"],
     "max_prefetch = 0 (flag --max-prefetch): must be at least 1"),
    (["serve", "--data-dir", "{tmp}/d", "--heartbeat-ms", "fast"],
     "flag --heartbeat-ms must be a whole number, got 'fast'"),
    (["serve", "--data-dir", "{tmp}/d", "--role", "king"], "role = \"king\""),
    (["serve", "--config", "{tmp}/missing.toml"], "cannot read config file {tmp}/missing.toml"),
    (["serve", "--config", "{tmp}/bad.toml"], "config file {tmp}/bad.toml: unknown key 'colour'"),
    (["serve", "--data-dir", "{tmp}/afile/d", "--listen", "127.0.0.1:0"],
     "cannot start: {tmp}/afile/d: Not a directory"),
    (["serve", "--data-dir", "{tmp}/d", "--log", "bogus:x", "--listen", "127.0.0.1:0"],
     "unknown log scheme 'bogus'"),
    (["--tls-ca", "{tmp}/missing-ca.pem", "queues", "--broker", "{running}"],
     "TLS CA file {tmp}/missing-ca.pem: no such file"),
    (["--tls-ca", "{tmp}/bad.toml", "topology", "--broker", "{running}"], "cannot be used"),
    (["--tls-ca", "{tmp}/afile", "health", "--broker", "{running}"], "TLS CA file"),
    (["serve", "--data-dir", "{tmp}/d", "--listen", "127.0.0.1:0", "--tls-cert", "{tmp}/c.pem"],
     "tls_cert and tls_key are set together"),
    (["serve", "--data-dir", "{tmp}/d", "--listen", "127.0.0.1:0", "--tls-cert", "{tmp}/c.pem",
      "--tls-key", "{tmp}/k.pem"], "TLS certificate {tmp}/c.pem: no such file"),
    (["serve", "--data-dir", "{tmp}/d", "--listen", "127.0.0.1:0", "--tls-verify-clients"],
     "need tls_cert and tls_key"),
    (["serve", "--data-dir", "{tmp}/d", "--tls-verify-clients", "--hello-timeout", "0"],
     "hello_timeout = 0.0"),
    (["serve", "--data-dir", "{tmp}/d", "--log-key-file", "{tmp}/nokeys"],
     "cannot read log key file {tmp}/nokeys"),
    (["serve", "--data-dir", "{tmp}/d", "--log-key-file", "{tmp}/afile"],
     "needs at least one [[key]]"),
    (["serve", "--data-dir", "{tmp}/d", "--log-key-file", "{tmp}/bad.toml"],
     "unknown key(s) ['colour', 'data_dir']"),
    (["dev", "--nodes", "0"], "--nodes must be at least 1"),
    (["dev", "--data-dir", "{tmp}/d", "--node-id", "x"], "--node-id is set by baton dev itself"),
    (["context", "use", "nope"], "no context 'nope'"),
    (["exchange", "declare", "x", "--type", "nope"], "invalid choice: 'nope'"),
    (["exchange", "delete", "nope", "--broker", "{running}"], "exchange 'nope' does not exist"),
    (["binding", "add", "q", "amq.topic", "--arg", "x", "--broker", "{running}"],
     "--arg needs KEY=VALUE, got 'x'"),
    (["binding", "add", "d", "amq.topic", "--from-exchange", "s", "--broker", "{running}"],
     "QUEUE EXCHANGE, or DESTINATION --from-exchange SOURCE"),
    (["binding", "add", "nope", "--from-exchange", "amq.topic", "--broker", "{running}"],
     "exchange 'nope' does not exist"),
    (["publish", "--routing-key", "k", "q", "m", "--broker", "{running}"],
     "--routing-key goes with --exchange"),
    (["context", "add", "c", "--broker", "a:b"], "bad address 'a:b'"),
    (["log", "verify", "--log", "file:{tmp}/no-log"], "no-log"),
    (["demo", "--count", "0"], "must be at least 1, got 0"),
    (["loadtest", "--preset", "nope"], "invalid choice: 'nope'"),
    (["loadtest", "--check", "{tmp}/no-run"], "No such file or directory"),
    (["import-entries", "generate", "--brokers", "{refused}", "--count", "5"], "could not connect"),
    (["user", "delete", "nobody", "--broker", "{running}"], "no user 'nobody'"),
    (["user", "passwd", "nobody", "--password-stdin", "--broker", "{running}"],
     "the password is empty"),
    (["user", "list", "--broker", "{refused}"], "could not connect"),
    (["permissions", "set", "guest", "--broker", "{running}"],
     "give at least one of --configure, --write, --read, --lead"),
    (["permissions", "set", "guest", "--read", "(", "--broker", "{running}"],
     "is not a regular expression"),
    (["permissions", "set", "nobody", "--read", ".*", "--broker", "{running}"], "no user 'nobody'"),
    (["--user", "nobody", "queues", "--broker", "{running}"], "user 'nobody' needs a password"),
    (["feature", "list", "--broker", "{refused}"], "could not connect"),
    (["feature", "enable", "--broker", "{running}"],
     "name the feature flag(s) to enable, or give --all (not both)"),
    (["feature", "enable", "x", "--all", "--broker", "{running}"], "(not both)"),
    (["feature", "enable", "no_such_flag", "--broker", "{running}"],
     "unknown feature flag(s) no_such_flag; this broker's build knows versioned_formats"),
    (["feature", "frobnicate"], "invalid choice: 'frobnicate'"),
    (["policy", "set", "p", "--pattern", "(", "--definition", '{{"max-length": 1}}',
      "--broker", "{running}"], "bad policy pattern '('"),
    (["policy", "set", "p", "--pattern", "(a+)+", "--definition", '{{"max-length": 1}}',
      "--broker", "{running}"], "nests a repetition inside another"),
    (["policy", "set", "p", "--pattern", "x", "--definition", '{{"max-lenght": 1}}',
      "--broker", "{running}"], "unknown policy key 'max-lenght'"),
    (["policy", "set", "p", "--pattern", "x", "--definition", "{{max-length: 1}}",
      "--broker", "{running}"], "--definition is not JSON"),
    (["policy", "set", "p", "--pattern", "x", "--definition", '{{"message-ttl": "1m"}}',
      "--broker", "{running}"], "'message-ttl' must be an integer"),
    (["policy", "clear", "nope", "--broker", "{running}"], "no policy 'nope'"),
    (["policy", "list", "--broker", "{refused}"], "could not connect"),
    (["partitions", "add", "--count", "1", "--broker", "{running}"],
     "the count of data partitions is an integer from 2 to 255, not 1"),
    (["partitions", "add", "--count", "x"], "argument --count: invalid int value: 'x'"),
    (["partitions", "add", "--broker", "{running}"], "the following arguments are required: --count"),
    (["partitions", "list", "--broker", "{refused}"], "could not connect"),
    (["partitions", "frobnicate"], "invalid choice: 'frobnicate'"),
    (["partitions", "move", "1", "--from", "a", "--to", "b", "--broker", "{running}"],
     "this cluster's log is one partition"),
    (["partitions", "move", "x", "--from", "a", "--to", "b"],
     "argument P: invalid int value: 'x'"),
    (["partitions", "move", "1", "--from", "a"], "the following arguments are required: --to"),
    (["partitions", "move", "1", "--from", "a", "--to", "b", "--wait", "--timeout", "0",
      "--broker", "{running}"], "--timeout is a number of seconds above 0, not 0"),
    (["partitions", "rebalance", "--broker", "{running}"],
     "this cluster's log is one partition"),
    (["partitions", "rebalance", "--broker", "{refused}"], "could not connect"),
    (["partitions", "replicas", "0", "--broker", "{running}"],
     "a replica group has 1 to 15 brokers, not 0"),
    (["partitions", "replicas", "2", "--broker", "{running}"],
     "this cluster's log is one partition"),
    (["partitions", "replicas", "two"], "argument R: invalid int value: 'two'"),
]


@pytest.mark.parametrize(("argv", "says"), MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_an_ordinary_mistake_is_one_line(
    argv: list[str], says: str, running: str, refused: str, tmp_path: Path,
) -> None:
    (tmp_path / "afile").write_text("")
    (tmp_path / "bad.toml").write_text('data_dir = "d"\ncolour = "blue"\n')
    fill = {"refused": refused, "running": running, "tmp": str(tmp_path)}
    r = baton(*[a.format(**fill) for a in argv], timeout=60, stdin=b"")
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    told = [line for line in r.stderr.splitlines() if not LOG_LINE.match(line)]
    assert len(told) == 1, r.stderr
    assert told[0].startswith("baton"), told
    assert says.format(**fill) in told[0], told


def test_the_mistakes_table_covers_every_command() -> None:
    from batonmq.broker.cli import build_parser

    usage = build_parser().format_usage()
    (found,) = [g for g in re.findall(r"\{([a-z,-]+)\}", usage) if "serve" in g.split(",")]
    commands = set(found.split(","))
    tried = {argv[0] if not argv[0].startswith("--") else argv[-1] for argv, _ in MISTAKES}
    assert commands - tried == set(), f"no mistake tried for {sorted(commands - tried)}"

