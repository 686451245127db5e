"""Celery on a 3-broker Baton cluster, given the three brokers' URLs (kombu's failover:
``amqp://a;amqp://b;amqp://c``), while the broker its worker and its producer are
connected to is killed -9 mid-run (docs/amqp.md "Frameworks").

Nothing is set for Baton: Celery's defaults and the ``rpc://`` backend. The producer
publishes with confirms (kombu's ``confirm_publish``, as on RabbitMQ: without them a
publish in flight when a broker dies may be lost, and the producer would not know).
Tasks are acked early (Celery's default, not ``acks_late``): the broker dies, not the
worker, so a task the worker took still runs; a task whose ack the dead broker never
applied runs again from the next broker. The test checks every task ran at least once
and prints how many ran twice.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import eventually_sync
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import amqp_port
from tests.integration.test_amqp_aio import amqp_cluster  # noqa: F401 (a fixture)
from tests.integration.test_celery import _stop, _worker

pytestmark = pytest.mark.integration

TASKS = 300

APP = '''
import os
import time

from celery import Celery

app = Celery("app", broker=os.environ["BATON_TEST_AMQP"], backend="rpc://")


@app.task(bind=True)
def record(self, n):
    """One line per run (the task and whether its message came redelivered), written
    in one append (runs of several processes interleave by whole lines)."""
    again = int(bool(self.request.delivery_info.get("redelivered")))
    fd = os.open(os.environ["BATON_TEST_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{n} {again}\\n".encode())
    finally:
        os.close(fd)
    time.sleep(0.05)
'''

PRODUCER = '''
import json
import sys
import time

from app import app, record

# Publisher confirms: a publish returns once the broker has it on its log; one cut off
# by a lost connection is published again (kombu's retry) on the next broker.
app.conf.broker_transport_options = {"confirm_publish": True}
total = int(sys.argv[1])
with app.connection_for_write() as conn:
    conn.ensure_connection(max_retries=3)
    first = conn.as_uri()
    for i in range(total):
        record.apply_async((i,), connection=conn, retry=True, retry_policy={
            "max_retries": 20, "interval_start": 0, "interval_step": 0.5,
            "interval_max": 1})
        print(i, flush=True)
        time.sleep(0.02)
    print(json.dumps({"first": first, "last": conn.as_uri()}), flush=True)
'''

#: The worker's log line when it connects (at start and after each reconnection).
CONNECTED = re.compile(r"Connected to amqp://[^@]*@127\.0\.0\.1:(\d+)//")


def _connected_ports(log: Path) -> list[int]:
    return [int(p) for p in CONNECTED.findall(log.read_text(errors="replace"))]


def _lines(path: Path) -> list[list[int]]:
    text = path.read_text() if path.exists() else ""
    return [[int(f) for f in line.split()] for line in text.splitlines() if line]


def _runs(path: Path) -> collections.Counter[int]:
    return collections.Counter(n for n, _ in _lines(path))


@pytest.mark.timeout(120)
def test_celery_fails_over_to_another_broker_when_its_broker_is_killed(
    tmp_path: Path, amqp_cluster: list[BrokerProcess]  # noqa: F811 (the fixture)
) -> None:
    app_dir = tmp_path / "celery-app"
    app_dir.mkdir()
    (app_dir / "app.py").write_text(APP)
    (app_dir / "producer.py").write_text(PRODUCER)
    runs = tmp_path / "runs.txt"
    ports = {amqp_port(b): b for b in amqp_cluster}
    urls = ";".join(f"amqp://guest:guest@127.0.0.1:{p}//" for p in ports)
    env = dict(os.environ, BATON_TEST_AMQP=urls, BATON_TEST_RUNS=str(runs),
               PYTHONPATH=str(app_dir))
    log = tmp_path / "worker.log"
    out = tmp_path / "producer.out"
    worker = _worker(app_dir, env, log, concurrency=2)
    producer: subprocess.Popen[bytes] | None = None
    try:
        (port,) = _connected_ports(log)
        with out.open("wb") as f:
            producer = subprocess.Popen([sys.executable, "producer.py", str(TASKS)],
                                        cwd=app_dir, env=env, stdout=f,
                                        stderr=subprocess.STDOUT)
        # Mid-run: the worker has run a third of the tasks, the producer still sends.
        eventually_sync(lambda: sum(_runs(runs).values()) >= TASKS // 3,
                        "a third of the tasks ran", timeout=30,
                        context=lambda: log.read_text()[-3000:] + out.read_text()[-2000:])
        assert producer.poll() is None, out.read_text()[-3000:]
        ports[port].kill9()
        producer.wait(timeout=60)
        assert producer.returncode == 0, out.read_text()[-3000:]
        ends = json.loads(out.read_text().strip().splitlines()[-1])
        assert ends["first"].endswith(f":{port}//"), ends
        assert not ends["last"].endswith(f":{port}//"), ends  # the producer failed over
        eventually_sync(lambda: set(_runs(runs)) == set(range(TASKS)), "every task ran",
                        timeout=45,
                        context=lambda: f"missing {sorted(set(range(TASKS)) - set(_runs(runs)))}"
                        + log.read_text()[-3000:])
        # The worker failed over too (a reconnection to another broker).
        later = _connected_ports(log)[1:]
        assert later and all(p != port for p in later), later
        twice = sorted(n for n, c in _runs(runs).items() if c > 1)
        redelivered = sum(again for _, again in _lines(runs))
        print(f"celery kill -9: {TASKS} tasks, all ran; {len(twice)} ran more than once "
              f"({sum(_runs(runs).values())} runs, {redelivered} of a redelivered message);"
              f" worker reconnected to {later}; the runs of those that ran twice (task,"
              f" redelivered): {[line for line in _lines(runs) if line[0] in twice]}")
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
            producer.wait(5)
        _stop(worker)
