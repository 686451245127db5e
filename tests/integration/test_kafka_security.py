"""Brokers on a secured Kafka log: real ``baton serve`` processes on the test Kafka's SASL_SSL
listener (TLS from a throw-away CA, SCRAM-SHA-512 or PLAIN), the password from a file or the
environment and never on a command line, in ``--print-config`` or in the broker's output; a
wrong password or a mistake in the URL stops ``baton serve`` with one line.

The listener comes from the ``kafka_sasl`` fixture (tests/kafka_fixture.py): skipped, saying
why, only when no SASL_SSL listener is known (failed instead when ``CI=true``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from batonmq import clients
from tests.helpers import drain, eventually, topology
from tests.integration.conftest import REPO, BrokerProcess
from tests.kafka_fixture import SaslKafka

pytestmark = pytest.mark.integration

#: A line the broker's logging wrote (not what ``baton`` says about a mistake).
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")


def _serve(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``baton serve ARGS`` to its end, its output captured (no BATON_KAFKA_PASSWORD but ``env``'s)."""
    base = {k: v for k, v in os.environ.items() if k != "BATON_KAFKA_PASSWORD"}
    return subprocess.run(
        [sys.executable, "-m", "batonmq.broker", "serve", *args],
        capture_output=True, text=True, env={**base, **(env or {})}, cwd=REPO, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _cmdline(proc: subprocess.Popen[bytes] | None) -> str:
    assert proc is not None
    return Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


async def test_brokers_on_a_sasl_ssl_kafka_log_serve_publishes_and_consumes(
    kafka_sasl: SaslKafka, tmp_path: Path
) -> None:
    """Two brokers on one topic: node-1 logs in with SCRAM-SHA-512 and a password file,
    node-2 with PLAIN and BATON_KAFKA_PASSWORD; what one takes in, the other hands out."""
    topic = f"baton-sasl-{uuid.uuid4().hex[:10]}"
    password = kafka_sasl.password
    n1 = BrokerProcess(tmp_path / "node-1", log_url=kafka_sasl.url(topic, "SCRAM-SHA-512"), node_id="node-1",
                       extra=["--kafka-password-file", kafka_sasl.password_file])
    n2 = BrokerProcess(tmp_path / "node-2", log_url=kafka_sasl.url(topic, "PLAIN"), node_id="node-2",
                       env={"BATON_KAFKA_PASSWORD": password})
    try:
        n1.start(timeout=60)
        n2.start(timeout=60)
        for b in (n1, n2):
            assert password not in _cmdline(b.proc)
        await eventually(lambda: topology(n1.address), "both brokers in node-1's view", timeout=30,
                         until=lambda top: [i["node_id"] for i in top["instances"]] == ["node-1", "node-2"])
        async with await clients.connect(n1.address) as conn:
            await conn.declare_queue("secured")
            await conn.publish_batch("secured", [b"%d" % i for i in range(300)])
        got = await drain(n2.address, "secured", count=300)
        assert sorted(int(m.body) for m in got) == list(range(300))
    finally:
        n1.stop()
        n2.stop()
    for b in (n1, n2):
        output = b.log_path.read_text(errors="replace")
        assert password not in output and "Traceback" not in output
        assert "security_protocol=SASL_SSL" in output  # the log URL is shown, without a secret


def test_print_config_shows_the_password_file_never_the_password(kafka_sasl: SaslKafka, tmp_path: Path) -> None:
    url = kafka_sasl.url("baton-shown")
    by_file = _serve("--data-dir", str(tmp_path / "d"), "--log", url,
                     "--kafka-password-file", kafka_sasl.password_file, "--print-config")
    by_env = _serve("--data-dir", str(tmp_path / "d"), "--log", url, "--print-config",
                    env={"BATON_KAFKA_PASSWORD": kafka_sasl.password})
    assert (by_file.returncode, by_env.returncode) == (0, 0), (by_file.stderr, by_env.stderr)
    assert f'kafka_password_file = "{kafka_sasl.password_file}"  # flag --kafka-password-file' in by_file.stdout
    assert "# kafka_password_file is not set" in by_env.stdout
    for r in (by_file, by_env):
        assert f'log_url = "{url}"' in r.stdout
        assert kafka_sasl.password not in r.stdout + r.stderr


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_a_wrong_kafka_password_stops_baton_serve_with_one_line(
    kafka_sasl: SaslKafka, tmp_path: Path, mechanism: str
) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-" + kafka_sasl.password + "\n")
    url = kafka_sasl.url(f"baton-wrong-{uuid.uuid4().hex[:10]}", mechanism)
    r = _serve("--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0", "--log", url,
               "--kafka-password-file", str(wrong))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    told = [line for line in r.stderr.splitlines() if not LOG_LINE.match(line)]
    assert len(told) == 1 and told[0].startswith(
        f"baton: cannot start: Kafka at {kafka_sasl.bootstrap} refused the login of "
        f"{kafka_sasl.user!r} with {mechanism}: "
    ), r.stderr
    assert f"check the password (kafka_password_file {wrong})" in told[0]


KAFKA = "kafka://127.0.0.1:1/t?security_protocol=SASL_SSL&sasl_username=baton"
MISTAKES = [
    (["--log", KAFKA + "&sasl_mechanism=PLAIN", "--kafka-password-file", "{tmp}/missing"],
     "baton: cannot start: cannot read kafka_password_file {tmp}/missing: No such file or directory"),
    (["--log", KAFKA + "&sasl_mechanism=PLAIN"],
     "but no password is given: give it by --kafka-password-file FILE (kafka_password_file) or BATON_KAFKA_PASSWORD"),
    (["--log", KAFKA + "&sasl_mechanism=SCRAM-SHA-1"], "unknown sasl_mechanism 'SCRAM-SHA-1'"),
    (["--log", KAFKA.replace("SASL_SSL", "SASL_PLAINTEXT") + "&sasl_mechanism=PLAIN"],
     "would send the Kafka password in clear: use SASL_SSL (or SCRAM), or add allow_plaintext_password=true"),
    (["--log", KAFKA + "&sasl_mechanism=PLAIN&password=x"], "may not carry a password"),
    (["--log", "file:{tmp}/log", "--kafka-password-file", "{tmp}/pw"], "kafka_password_file is set but the log"),
]


@pytest.mark.parametrize(("args", "says"), MISTAKES, ids=[str(i) for i in range(len(MISTAKES))])
def test_a_kafka_security_mistake_is_one_line(args: list[str], says: str, tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("pw\n")
    r = _serve("--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
               *[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    told = [line for line in r.stderr.splitlines() if not LOG_LINE.match(line)]
    assert len(told) == 1 and told[0].startswith("baton: cannot start: "), r.stderr
    assert says.format(tmp=tmp_path) in told[0], told
