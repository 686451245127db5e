"""FastStream (``faststream[rabbit]``, on aio-pika) against a real Baton broker's AMQP
listener (docs/amqp.md "Frameworks"): a subscriber app run by ``faststream run`` (a real
process) and a publisher, with no setting made for Baton.

FastStream's RPC (``broker.request``) goes through RabbitMQ's direct reply-to
(``amq.rabbitmq.reply-to``), which FastStream's broker also declares (passively) when it
starts; a handler's return value is published to any message's ``reply_to``. A handler
that raises is nacked and requeued under ``AckPolicy.NACK_ON_ERROR``, and rejected under
FastStream's default policy (``REJECT_ON_ERROR``), which dead-letters it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import eventually_sync
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import amqp_broker, amqp_port  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

APP = '''
import os

from faststream import AckPolicy, FastStream
from faststream.rabbit import RabbitBroker, RabbitMessage, RabbitQueue

broker = RabbitBroker(os.environ["BATON_TEST_AMQP"])
app = FastStream(broker)
RUNS = os.environ["BATON_TEST_RUNS"]


def note(line):
    fd = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\\n").encode())
    finally:
        os.close(fd)


@broker.subscriber("fs-double")
async def double(n: int) -> int:
    return 2 * n


@broker.subscriber("fs-flaky", ack_policy=AckPolicy.NACK_ON_ERROR)
async def flaky(key: str, message: RabbitMessage) -> None:
    """Raises on its first two runs (nacked with requeue: it comes back), then not."""
    with open(RUNS) as f:
        tries = sum(1 for line in f if line.startswith(f"flaky {key} "))
    note(f"flaky {key} {tries + 1} {message.raw_message.redelivered}")
    if tries < 2:
        raise RuntimeError(f"flaky {key} fails its run {tries + 1} on purpose")


@broker.subscriber(RabbitQueue("fs-rejecting", arguments={
    "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "fs-dead"}))
async def rejecting(key: str) -> None:
    """Raises: rejected (FastStream's default policy), so dead-lettered to fs-dead."""
    note(f"rejecting {key}")
    raise RuntimeError("rejecting fails on purpose")


@broker.subscriber("fs-dead")
async def dead(key: str, message: RabbitMessage) -> None:
    note(f"dead {key} {message.headers.get('x-death-reason')}")
'''

CLIENT = '''
import asyncio
import json
import os

from faststream.rabbit import RabbitBroker, RabbitQueue


async def main():
    out = {}
    async with RabbitBroker(os.environ["BATON_TEST_AMQP"]) as br:
        # FastStream's RPC: through direct reply-to (amq.rabbitmq.reply-to).
        replies = []
        for n in range(20):
            reply = await br.request(n, "fs-double", timeout=10)
            replies.append(await reply.decode())
        out["rpc"] = replies
        # A reply_to queue of the publisher's own: the handler's return goes there.
        queue = await br.declare_queue(RabbitQueue("fs-replies"))
        await br.publish(50, "fs-double", reply_to="fs-replies")
        got = None
        for _ in range(100):
            got = await queue.get(no_ack=True, fail=False)
            if got is not None:
                break
            await asyncio.sleep(0.1)
        out["reply_to"] = None if got is None else json.loads(got.body)
        await br.publish("k1", "fs-flaky")
        await br.publish("r1", "fs-rejecting")
    print(json.dumps(out))


asyncio.run(main())
'''


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(90)
def test_faststream_rpc_requeue_and_reject(
    tmp_path: Path, amqp_broker: BrokerProcess  # noqa: F811 (the fixture)
) -> None:
    app_dir = tmp_path / "faststream-app"
    app_dir.mkdir()
    (app_dir / "app.py").write_text(APP)
    (app_dir / "client.py").write_text(CLIENT)
    runs = tmp_path / "runs.txt"
    runs.touch()  # (the flaky handler reads it first)
    url = f"amqp://guest:guest@127.0.0.1:{amqp_port(amqp_broker)}/"
    env = dict(os.environ, BATON_TEST_AMQP=url, BATON_TEST_RUNS=str(runs),
               PYTHONPATH=str(app_dir), NO_COLOR="1")
    log = tmp_path / "app.log"
    with log.open("wb") as out:
        app = subprocess.Popen([sys.executable, "-m", "faststream", "run", "app:app"],
                               cwd=app_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        eventually_sync(lambda: app.poll() is None
                        and "FastStream app started successfully" in log.read_text(),
                        "the app started", timeout=30, context=lambda: log.read_text()[-3000:])
        r = subprocess.run([sys.executable, "client.py"], cwd=app_dir, env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr + log.read_text()[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["rpc"] == [2 * n for n in range(20)], got
        assert got["reply_to"] == 100, got

        def kinds() -> set[str]:
            return {line[0] for line in _lines(runs) if line[0] != "flaky" or line[2] == "3"}

        eventually_sync(kinds, "the flaky handler's third run and the dead letter",
                        until=lambda k: {"flaky", "rejecting", "dead"} <= k, timeout=30,
                        context=lambda: runs.read_text() + log.read_text()[-3000:])
        lines = _lines(runs)
        # Nacked with requeue twice: it came back (redelivered) and then succeeded.
        assert [line[1:] for line in lines if line[0] == "flaky"] == [
            ["k1", "1", "False"], ["k1", "2", "True"], ["k1", "3", "True"]], lines
        # Rejected once (not requeued), and dead-lettered through x-dead-letter-*.
        assert [line for line in lines if line[0] in ("rejecting", "dead")] == [
            ["rejecting", "r1"], ["dead", "r1", "rejected"]], lines
        text = log.read_text()
        assert "flaky k1 fails its run 2" in text, text[-3000:]
        assert "NOT_FOUND" not in text and "PRECONDITION_FAILED" not in text, text[-3000:]
    finally:
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGTERM)
            try:
                app.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(app.pid, signal.SIGKILL)
                app.wait(5)
