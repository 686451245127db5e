"""Celery against a real Baton broker's AMQP listener, out of the box (docs/amqp.md
"Frameworks"): a real ``celery -A app worker`` process with Celery's defaults (remote
control, gossip and mingle on; no setting made for Baton) and the ``rpc://`` result
backend. Tasks run and their results come back, ``celery inspect ping`` answers, and a
task retried with a countdown runs again.

Its reply queues are declared with ``x-expires`` (the flag ``queue_expiry``) and kombu
raises a running consumer's prefetch for ETA tasks (``Basic.Qos`` on running consumers).
The countdown runs on Celery's default, classic queues, and on quorum queues with a topic
default exchange, where Celery's native delayed delivery routes it through a chain of
exchange-to-exchange bindings and dead-letter exchanges by its routing key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import eventually_sync
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import AMQP, amqp_port

pytestmark = pytest.mark.integration

APP = '''
import os

from celery import Celery

app = Celery("app", broker=os.environ["BATON_TEST_AMQP"], backend="rpc://")


@app.task
def add(x, y):
    return x + y


@app.task(bind=True, max_retries=3)
def flaky(self, key):
    """Fails the first time (a mark on disk), is retried after a countdown of 1 s."""
    mark = os.path.join(os.environ["BATON_TEST_MARKS"], key)
    if not os.path.exists(mark):
        open(mark, "w").close()
        raise self.retry(countdown=1)
    return "retried"
'''

CLIENT = '''
import json
import time

from app import add, app, flaky

out = {}
start = time.monotonic()
out["one"] = add.delay(2, 3).get(timeout=20)
out["many"] = [r.get(timeout=20) for r in [add.delay(i, i) for i in range(20)]]
t = time.monotonic()
out["retried"] = flaky.delay("k1").get(timeout=20)
out["retry_took"] = time.monotonic() - t
t = time.monotonic()
out["eta"] = add.apply_async((20, 22), countdown=2).get(timeout=20)
out["eta_took"] = time.monotonic() - t
# More ETA tasks than the worker's prefetch (4 x 2): it holds them all by raising its
# running consumer's prefetch (Basic.Qos), so a task sent after them runs at once.
etas = [add.apply_async((i, 0), countdown=4) for i in range(12)]
t = time.monotonic()
out["prompt"] = add.delay(1, 1).get(timeout=20)
out["prompt_took"] = time.monotonic() - t
out["etas"] = [r.get(timeout=20) for r in etas]
out["ping"] = app.control.inspect(timeout=5).ping()
print(json.dumps(out))
'''


@pytest.fixture
def celery_dir(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The Celery app's folder and the environment its processes run with."""
    app_dir = tmp_path / "celery-app"
    (app_dir / "marks").mkdir(parents=True)
    (app_dir / "app.py").write_text(APP)
    (app_dir / "client.py").write_text(CLIENT)
    env = dict(os.environ, BATON_TEST_MARKS=str(app_dir / "marks"), PYTHONPATH=str(app_dir))
    yield app_dir, env


def _worker(
    app_dir: Path, env: dict[str, str], log: Path, concurrency: int
) -> subprocess.Popen[bytes]:
    """Start ``celery -A app worker`` (its own process group) and wait until it is ready
    (it connected, mingled and consumes)."""
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "app", "worker", "--loglevel=INFO",
             f"--concurrency={concurrency}", "--hostname=w1@%h"],
            cwd=app_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        eventually_sync(
            lambda: worker.poll() is None
            and "w1@" in log.read_text() and " ready." in log.read_text(),
            "the worker ready (it connected, mingled and consumes)", timeout=30,
            context=lambda: log.read_text()[-3000:],
        )
    except BaseException:
        _stop(worker)
        raise
    return worker


def _client(app_dir: Path, env: dict[str, str], log: Path) -> Any:
    """Run the app's ``client.py`` to its end; what it printed last, as JSON."""
    r = subprocess.run([sys.executable, "client.py"], cwd=app_dir, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr + log.read_text()[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the worker we started (its own process group: the pool's children too)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # warm shutdown
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@pytest.mark.timeout(90)
def test_a_celery_worker_with_defaults_runs_tasks_and_answers_ping(
    tmp_path: Path, celery_dir: tuple[Path, dict[str, str]]
) -> None:
    app_dir, env = celery_dir
    b = BrokerProcess(tmp_path / "broker", extra=AMQP)
    b.start()
    worker: subprocess.Popen[bytes] | None = None
    log = tmp_path / "worker.log"
    try:
        env["BATON_TEST_AMQP"] = f"amqp://guest:guest@127.0.0.1:{amqp_port(b)}//"
        worker = _worker(app_dir, env, log, concurrency=2)
        got = _client(app_dir, env, log)
        assert got["one"] == 5 and got["many"] == [2 * i for i in range(20)]
        assert got["retried"] == "retried" and got["retry_took"] >= 1.0
        assert got["eta"] == 42 and got["eta_took"] >= 2.0
        assert got["prompt"] == 2 and got["prompt_took"] < 3.0, got
        assert got["etas"] == list(range(12))
        (name,) = got["ping"]
        assert name.startswith("w1@") and got["ping"][name] == {"ok": "pong"}
        # The command line's remote control: its reply queue expires (x-expires) too.
        ping = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "app", "inspect", "ping", "--timeout", "5"],
            cwd=app_dir, env=env, capture_output=True, text=True, timeout=60,
        )
        assert ping.returncode == 0 and "pong" in ping.stdout, ping.stdout + ping.stderr
        text = log.read_text()
        assert "Traceback" not in text and "PRECONDITION_FAILED" not in text, text[-3000:]
        assert "Task app.flaky" in text and "retry: Retry in 1s" in text, text[-3000:]
    finally:
        if worker is not None:
            _stop(worker)
        b.stop()


QUORUM = '''
import os

from celery import Celery

app = Celery("app", broker=os.environ["BATON_TEST_AMQP"], backend="rpc://")
app.conf.task_default_queue_type = "quorum"
app.conf.task_default_exchange_type = "topic"


@app.task
def add(x, y):
    return x + y
'''

QUORUM_CLIENT = '''
import json
import time

from app import add

t = time.monotonic()
r = add.apply_async((20, 22), countdown=2)
print(json.dumps({"eta": r.get(timeout=30), "took": time.monotonic() - t}))
'''


@pytest.mark.timeout(90)
def test_a_countdown_task_runs_on_quorum_queues_with_a_topic_exchange(
    tmp_path: Path, celery_dir: tuple[Path, dict[str, str]]
) -> None:
    """Celery's native delayed delivery (quorum queues): the task waits in the
    celery_delayed_* queues, whose messages expire into the next level's exchange and
    on, by the routing key they were published with, until the task's own queue."""
    app_dir, env = celery_dir
    (app_dir / "app.py").write_text(QUORUM)
    (app_dir / "client.py").write_text(QUORUM_CLIENT)
    b = BrokerProcess(tmp_path / "broker", extra=AMQP)
    b.start()
    worker: subprocess.Popen[bytes] | None = None
    log = tmp_path / "worker.log"
    try:
        env["BATON_TEST_AMQP"] = f"amqp://guest:guest@127.0.0.1:{amqp_port(b)}//"
        worker = _worker(app_dir, env, log, concurrency=1)
        got = _client(app_dir, env, log)
        assert got["eta"] == 42 and got["took"] >= 2.0, got
        text = log.read_text()
        assert "Failed to setup delayed delivery" not in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    finally:
        if worker is not None:
            _stop(worker)
        b.stop()
