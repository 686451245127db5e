"""Queue expiry against real ``baton serve`` processes (docs/amqp.md "Queue arguments",
docs/events.md "Queue expiry"): AMQP's ``x-expires``, the native client's ``expires`` and
``baton queue declare --expires``. A queue unused that long goes; consumers (on any
broker of the cluster) and declaring it again keep it; every replica deletes it at the
same log position."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pika
import pika.exceptions
import pytest

from batonmq import clients
from tests.helpers import equal_digests, eventually, eventually_sync
from tests.integration.conftest import BrokerProcess
from tests.integration.test_admin import admin_broker, admin_of, get_json, http
from tests.integration.test_amqp import amqp_broker, connect, queue_stats
from tests.integration.test_cli import baton

pytestmark = pytest.mark.integration

__all__ = ["admin_broker", "amqp_broker", "http"]  # the fixtures, imported for these tests


def _exists(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> bool:
    """Whether ``queue`` exists, by a passive declare (a 404 closes the channel)."""
    try:
        ch.queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return False


def test_an_unused_x_expires_queue_goes_after_its_time_and_not_before(
    amqp_broker: BrokerProcess,
) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.confirm_delivery()
    start = time.monotonic()
    ch.queue_declare("reply.celery.pidbox", arguments={"x-expires": 800})
    ch.basic_publish("", "reply.celery.pidbox", b"not a use")  # publishing is no use
    stats = queue_stats(amqp_broker, "reply.celery.pidbox")
    assert stats["expires_ms"] == 800 and stats["used_at"] is not None
    # The same arguments again: the same queue (and a use); others: 406 as RabbitMQ.
    ch.queue_declare("reply.celery.pidbox", arguments={"x-expires": 800})
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("reply.celery.pidbox", arguments={"x-expires": 900})
    assert info.value.reply_code == 406
    assert "inequivalent arg 'x-expires'" in info.value.reply_text
    probe = [conn.channel()]

    def gone() -> bool:
        if not probe[0].is_open:  # (a passive declare of a missing queue closed it)
            probe[0] = conn.channel()
        return not _exists(probe[0], "reply.celery.pidbox")

    eventually_sync(gone, "the unused queue deleted", timeout=10)
    assert time.monotonic() - start >= 0.8
    conn.close()


def test_consumers_and_declares_keep_a_queue_and_its_time_counts_from_the_last(
    amqp_broker: BrokerProcess,
) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.queue_declare("kept", arguments={"x-expires": 400})
    tag = ch.basic_consume("kept", lambda c, m, p, b: None, auto_ack=True)
    # A consumer holds it, however long it is unused otherwise.
    conn.process_data_events(time_limit=1.5)
    assert queue_stats(amqp_broker, "kept")["interested"]
    ch.basic_cancel(tag)
    left = time.monotonic()
    eventually_sync(
        lambda: conn.process_data_events(0.05) or not _exists(ch, "kept"),
        "the queue deleted once its consumer left", timeout=10,
    )
    assert time.monotonic() - left >= 0.4
    # Declared again and again, it stays (each declare is a use).
    ch = conn.channel()
    ch.queue_declare("redeclared", arguments={"x-expires": 500})
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        ch.queue_declare("redeclared", arguments={"x-expires": 500})
        conn.process_data_events(time_limit=0.1)
    assert _exists(ch, "redeclared")
    conn.close()


def test_the_native_client_and_the_cli_set_expiry(broker: BrokerProcess) -> None:
    r = baton("queue", "declare", "cli-expiring", "--expires", "0.5", "--broker", broker.address)
    assert r.returncode == 0 and "declared" in r.stdout, r.stderr

    async def run() -> None:
        async with await clients.connect(broker.address) as conn:
            assert (await conn.queue_stats("cli-expiring"))["expires_ms"] == 500
            await conn.declare_queue("native-expiring", expires=0.3)
            await conn.publish("native-expiring", b"x")
            await conn.declare_queue("forever")
            assert (await conn.queue_stats("forever"))["expires_ms"] is None

            async def names() -> set[str]:
                return {q["queue"] for q in await conn.list_queues()}

            await eventually(names, "both expiring queues gone", timeout=10,
                             until=lambda n: not n & {"cli-expiring", "native-expiring"})
            assert "forever" in await names()

    asyncio.run(run())


async def test_the_admin_api_declares_an_expiring_queue(
    admin_broker: BrokerProcess, http: aiohttp.ClientSession
) -> None:
    base = admin_of(admin_broker)
    async with http.put(f"{base}/api/queues/temp", json={"expires_ms": 300}) as r:
        assert r.status == 200 and await r.json() == {"created": True}
    async with http.put(f"{base}/api/queues/bad", json={"expires_ms": 0}) as r:
        assert r.status == 400 and "expires" in (await r.json())["error"]["message"]
    status, body = await get_json(http, f"{base}/api/queues/temp")
    assert status == 200 and body["expires_ms"] == 300
    await eventually(lambda: get_json(http, f"{base}/api/queues/temp"), "the queue expired",
                     until=lambda got: got[0] == 404, timeout=10)


async def test_in_a_cluster_a_consumer_on_any_broker_keeps_it_and_all_delete_it_alike(
    tmp_path: Path,
) -> None:
    log_url = f"file:{tmp_path / 'log'}"
    brokers = [BrokerProcess(tmp_path / f"n{i}", log_url, f"n{i}") for i in (1, 2)]
    try:
        for b in brokers:
            b.start()
        n1, n2 = brokers
        async with await clients.connect(n1.address) as c1, \
                await clients.connect(n2.address) as c2:
            await c1.declare_queue("shared", expires=0.6)
            await c1.publish("shared", b"m")
            async with c2.consume("shared", prefetch=1) as consumer:
                msg = await consumer.get(timeout=10)  # not on the declaring broker
                assert msg is not None and msg.body == b"m"
                await msg.ack()
                await asyncio.sleep(1.5)  # (unused but for the consumer, past its expiry)
                for c in (c1, c2):
                    assert (await c.queue_stats("shared"))["interested"]

            async def gone(c: clients.Connection) -> bool:
                return "shared" not in {q["queue"] for q in await c.list_queues()}

            for c in (c1, c2):
                await eventually(lambda: gone(c), "the queue gone on both brokers", timeout=10)
        await equal_digests(brokers)
        for b in brokers:
            assert "REPLICA DIVERGED" not in b.log_path.read_text()
    finally:
        for b in brokers:
            b.stop()
