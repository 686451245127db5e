"""Dramatiq against a real Baton broker's AMQP listener (docs/amqp.md "Frameworks"): a
real ``dramatiq`` worker process with Dramatiq's RabbitMQ broker and no setting made for
Baton. Tasks run once each; a task that fails is retried through Dramatiq's delay queue
(``default.DQ``) and then succeeds; a task that fails for good is dead-lettered into
``default.XQ`` through the ``x-dead-letter-*`` arguments Dramatiq declares its queues
with; a delayed message runs after its delay.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from tests.helpers import eventually_sync
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import amqp_broker, amqp_port  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

TASKS = 200

APP = '''
import os
import time

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

dramatiq.set_broker(RabbitmqBroker(url=os.environ["BATON_TEST_AMQP"]))
RUNS = os.environ["BATON_TEST_RUNS"]


def note(line):
    """One line in the runs file, in one append (the worker's threads interleave by lines)."""
    fd = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\\n").encode())
    finally:
        os.close(fd)


@dramatiq.actor
def record(n):
    note(f"record {n}")


@dramatiq.actor(max_retries=3, min_backoff=200, max_backoff=400)
def flaky(key):
    """Fails its first two runs (counted in the runs file), then succeeds."""
    with open(RUNS) as f:
        tries = sum(1 for line in f if line.startswith(f"flaky {key} "))
    note(f"flaky {key} {tries + 1} {time.time()}")
    if tries < 2:
        raise RuntimeError(f"flaky {key} fails its run {tries + 1} on purpose")


@dramatiq.actor(max_retries=0)
def doomed(key):
    note(f"doomed {key}")
    raise RuntimeError("doomed fails on purpose")


@dramatiq.actor
def later(key):
    note(f"later {key} {time.time()}")
'''

CLIENT = '''
import json
import sys
import time

from app import doomed, flaky, later, record

for n in range(int(sys.argv[1])):
    record.send(n)
flaky.send("k1")
doomed.send("d1")
sent = time.time()
later.send_with_options(args=("l1",), delay=2000)
print(json.dumps({"later_sent": sent}))
'''


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _queue_depth(port: int, queue: str) -> int:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ok = conn.channel().queue_declare(queue, passive=True)
        return int(ok.method.message_count)
    finally:
        conn.close()


@pytest.mark.timeout(90)
def test_a_dramatiq_worker_runs_retries_dead_letters_and_delays(
    tmp_path: Path, amqp_broker: BrokerProcess  # noqa: F811 (the fixture)
) -> None:
    app_dir = tmp_path / "dramatiq-app"
    app_dir.mkdir()
    (app_dir / "app.py").write_text(APP)
    (app_dir / "client.py").write_text(CLIENT)
    runs = tmp_path / "runs.txt"
    port = amqp_port(amqp_broker)
    env = dict(os.environ, BATON_TEST_AMQP=f"amqp://guest:guest@127.0.0.1:{port}/",
               BATON_TEST_RUNS=str(runs), PYTHONPATH=str(app_dir))
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "app", "--processes", "1", "--threads", "4"],
            cwd=app_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        eventually_sync(lambda: worker.poll() is None
                        and "Worker process is ready for action." in log.read_text(),
                        "the worker ready", timeout=30, context=lambda: log.read_text()[-3000:])
        r = subprocess.run([sys.executable, "client.py", str(TASKS)], cwd=app_dir, env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        later_sent = json.loads(r.stdout.strip().splitlines()[-1])["later_sent"]

        def done() -> bool:
            kinds = collections.Counter(line[0] for line in _lines(runs))
            return (kinds["record"] >= TASKS and kinds["flaky"] >= 3 and kinds["later"] >= 1
                    and kinds["doomed"] >= 1)

        eventually_sync(done, "every task ran", timeout=45,
                        context=lambda: runs.read_text()[-2000:] + log.read_text()[-3000:])
        lines = _lines(runs)
        records = collections.Counter(int(line[1]) for line in lines if line[0] == "record")
        assert records == collections.Counter(range(TASKS)), records  # each once
        # Retried twice through default.DQ (backoff 200-400 ms), then it succeeded.
        tries = [(int(line[2]), float(line[3])) for line in lines if line[0] == "flaky"]
        assert [n for n, _ in tries] == [1, 2, 3], tries
        assert all(b - a >= 0.2 for (_, a), (_, b) in zip(tries, tries[1:])), tries
        (ran_at,) = [float(line[2]) for line in lines if line[0] == "later"]
        assert ran_at - later_sent >= 2.0, (later_sent, ran_at)
        # The doomed task ran once and is in the dead-letter queue (x-dead-letter-*).
        assert [line for line in lines if line[0] == "doomed"] == [["doomed", "d1"]]
        eventually_sync(lambda: _queue_depth(port, "default.XQ"), "a message in default.XQ",
                        until=lambda n: n == 1)
        assert _queue_depth(port, "default") == 0 and _queue_depth(port, "default.DQ") == 0
        text = log.read_text()
        assert "Retrying message" in text and "flaky k1 fails its run 2" in text, text[-3000:]
        assert "PRECONDITION_FAILED" not in text and "NOT_IMPLEMENTED" not in text, text[-3000:]
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(5)
