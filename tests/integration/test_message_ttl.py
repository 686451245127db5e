"""A message's own TTL against a real ``baton serve`` process (docs/amqp.md "Message
TTL", docs/events.md "A message's own TTL"): AMQP's ``expiration`` and the native
client's ``ttl``. A message past its TTL is dead-lettered (or dropped) at the head of
the queue, not handed out; an AMQP consumer of the dead letters reads RabbitMQ's
``x-death``."""

from __future__ import annotations

import asyncio
import time

import pika
import pika.exceptions
import pytest

from batonmq import clients
from tests.helpers import eventually
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import amqp_broker, connect, queue_stats

pytestmark = pytest.mark.integration

__all__ = ["amqp_broker"]  # the fixture, imported for these tests


def test_an_expired_message_is_dead_lettered_with_x_death(amqp_broker: BrokerProcess) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("dlx", "direct")
    ch.queue_declare("dead")
    ch.queue_bind("dead", "dlx", "dead")
    ch.queue_declare("work", arguments={
        "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead",
    })
    start = time.monotonic()
    ch.basic_publish("", "work", b"late", pika.BasicProperties(
        expiration="300", content_type="text/plain", headers={"foo": "bar"}))
    ch.basic_publish("", "work", b"keeps", pika.BasicProperties(expiration="60000"))
    ch.basic_publish("", "work", b"plain")
    # No consumer: the head message goes to the dead letters once its TTL ran out.
    got: list[tuple[pika.spec.BasicProperties, bytes]] = []

    def on_dead(c: object, m: object, props: pika.spec.BasicProperties, body: bytes) -> None:
        got.append((props, body))

    ch.basic_consume("dead", on_dead, auto_ack=True)
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert got, "the expired message was not dead-lettered"
    assert time.monotonic() - start >= 0.3
    props, body = got[0]
    assert body == b"late" and props.expiration is None  # (it does not expire again)
    assert props.content_type == "text/plain" and props.headers["foo"] == "bar"
    (death,) = props.headers["x-death"]
    assert death["reason"] == "expired" and death["queue"] == "work"
    assert death["original-expiration"] == "300" and death["count"] == 1
    assert death["exchange"] == "" and death["routing-keys"] == ["work"]
    assert props.headers["x-first-death-reason"] == "expired"
    assert props.headers["x-last-death-queue"] == "work"
    # The others wait: one with a long TTL, one without.
    method, _, kept = ch.basic_get("work", auto_ack=True)
    assert kept == b"keeps"
    assert ch.basic_get("work", auto_ack=True)[2] == b"plain"
    assert queue_stats(amqp_broker, "work")["expired"] == 1
    # A bad expiration closes the channel with 406, as RabbitMQ does.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish("", "work", b"x", pika.BasicProperties(expiration="soon"))
    assert info.value.reply_code == 406 and "expiration" in info.value.reply_text
    conn.close()


def test_a_get_does_not_hand_out_an_expired_message(amqp_broker: BrokerProcess) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("gets")
    ch.basic_publish("", "gets", b"short", pika.BasicProperties(expiration="1"))
    ch.basic_publish("", "gets", b"long", pika.BasicProperties(expiration="60000"))
    time.sleep(0.05)  # (past the 1 ms: the get's acquire is applied later by the clock)
    assert ch.basic_get("gets", auto_ack=True)[2] == b"long"
    conn.close()


async def _native(b: BrokerProcess) -> None:
    async with await clients.connect(b.address) as conn:
        await conn.declare_queue("nt", dead_letter="nt.dead")
        await conn.declare_queue("nt.dead")
        await conn.publish("nt", b"brief", ttl=0.2)
        await conn.publish("nt", b"stays", ttl=60)

        async def dead() -> int:
            return int((await conn.queue_stats("nt.dead"))["ready"])

        await eventually(dead, "the native message with a ttl dead-lettered", timeout=10)
        async with conn.consume("nt.dead") as consumer:
            m = await asyncio.wait_for(consumer.__anext__(), 10)
            assert m.body == b"brief" and m.headers["x-death-reason"] == "expired"
            await m.ack()
        assert (await conn.queue_stats("nt"))["ready"] == 1
        with pytest.raises(clients.InvalidArgument):
            await conn.publish("nt", b"x", ttl=-1)


def test_the_native_client_publishes_with_a_ttl(amqp_broker: BrokerProcess) -> None:
    asyncio.run(asyncio.wait_for(_native(amqp_broker), 60))
