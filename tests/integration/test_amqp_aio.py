"""The AMQP 0-9-1 listener driven by aio-pika (the asyncio client RabbitMQ's users and
Baton's load-test harness use), on one broker and across a 3-broker cluster with a
kill -9 (docs/amqp.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import aio_pika.exceptions
import pytest

from batonmq import clients
from tests.helpers import eventually
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import AMQP, amqp_port

pytestmark = pytest.mark.integration


def url(b: BrokerProcess, user: str = "guest", password: str = "guest") -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{amqp_port(b)}/"


@pytest.fixture
def amqp_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", extra=AMQP)
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def amqp_cluster(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    brokers = [
        BrokerProcess(tmp_path / f"node-{i}", log_url=f"file:{tmp_path / 'shared-log'}",
                      node_id=f"node-{i}", extra=AMQP)
        for i in (1, 2, 3)
    ]
    try:
        for b in brokers:
            b.start()
        yield brokers
    finally:
        for b in brokers:
            b.stop()


async def test_work_queue_confirms_and_properties_end_to_end(amqp_broker: BrokerProcess) -> None:
    """aio-pika publishes with confirms; an aio-pika worker and a Baton-native consumer
    both see the AMQP properties."""
    conn = await aio_pika.connect(url(amqp_broker))
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("jobs", durable=True, arguments={"x-queue-type": "quorum"})
        confirms = [
            ch.default_exchange.publish(
                aio_pika.Message(f"job-{i}".encode(), correlation_id=f"c-{i}",
                                 content_type="text/plain", headers={"n": i},
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key="jobs",
            )
            for i in range(100)
        ]
        await asyncio.gather(*confirms)  # every one acked by the broker
        worker = await conn.channel()
        await worker.set_qos(prefetch_count=10)
        queue = await worker.get_queue("jobs")
        got: dict[str, tuple[bytes, int]] = {}
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    assert message.content_type == "text/plain"
                    assert message.headers is not None
                    got[message.correlation_id or ""] = (message.body, int(message.headers["n"]))  # type: ignore[call-overload]
                if len(got) == 100:
                    break
        assert got == {f"c-{i}": (f"job-{i}".encode(), i) for i in range(100)}
        # One more, read by the Baton client: the properties are headers there.
        await ch.default_exchange.publish(
            aio_pika.Message(b"native", correlation_id="for-baton", reply_to="replies",
                             headers={"tenant": "t1"}),
            routing_key="jobs",
        )
    async with await clients.connect(amqp_broker.address) as native:
        async with native.consume("jobs", prefetch=1) as consumer:
            message = await asyncio.wait_for(consumer.__anext__(), 10)
            assert message.body == b"native"
            assert message.headers["tenant"] == "t1"
            props = message.headers["amqp-properties"]
            assert (props["correlation_id"], props["reply_to"]) == ("for-baton", "replies")
            await message.ack()


async def test_rpc_round_trip(amqp_broker: BrokerProcess) -> None:
    conn = await aio_pika.connect(url(amqp_broker))
    async with conn:
        server_ch = await conn.channel()
        requests = await server_ch.declare_queue("rpc")

        async def serve(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                assert message.reply_to
                await server_ch.default_exchange.publish(
                    aio_pika.Message(message.body.upper(), correlation_id=message.correlation_id),
                    routing_key=message.reply_to,
                )

        await requests.consume(serve)
        client_ch = await conn.channel()
        replies = await client_ch.declare_queue(exclusive=True)
        answers: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await replies.consume(answers.put, no_ack=True)
        await client_ch.default_exchange.publish(
            aio_pika.Message(b"ping", correlation_id="r-1", reply_to=replies.name),
            routing_key="rpc",
        )
        answer = await asyncio.wait_for(answers.get(), 10)
        assert (answer.body, answer.correlation_id) == (b"PING", "r-1")


async def test_bad_password_and_unsupported_methods(amqp_broker: BrokerProcess) -> None:
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(url(amqp_broker, password="wrong"))
    conn = await aio_pika.connect(url(amqp_broker))
    ch = await conn.channel()
    with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
        await ch.declare_queue("missing", passive=True)
    ch = await conn.channel(publisher_confirms=False)
    raw = await ch.get_underlay_channel()
    with pytest.raises(aio_pika.exceptions.AMQPConnectionError) as info:
        await raw.basic_recover(requeue=False)
    assert "540" in str(info.value) or "NOT_IMPLEMENTED" in str(info.value)
    await conn.close()
    assert "Traceback" not in amqp_broker.output()


async def test_confirmed_publishes_survive_a_kill_9_of_the_publishers_broker(
    amqp_cluster: list[BrokerProcess],
) -> None:
    """Publish with confirms through node-1, kill -9 it, go on through node-3; a worker
    on node-2 gets every confirmed message."""
    b1, b2, b3 = amqp_cluster
    setup = await aio_pika.connect(url(b2))
    async with setup:
        ch = await setup.channel()
        await ch.declare_queue("orders", durable=True, arguments={"x-queue-type": "quorum"})
    confirmed: set[bytes] = set()

    async def publish(b: BrokerProcess, bodies: list[bytes]) -> None:
        conn = await aio_pika.connect(url(b))
        ch = await conn.channel(publisher_confirms=True)
        for body in bodies:
            await ch.default_exchange.publish(aio_pika.Message(body), routing_key="orders")
            confirmed.add(body)
        await conn.close()

    await publish(b1, [f"o-{i}".encode() for i in range(50)])
    b1.kill9()
    await publish(b3, [f"o-{i}".encode() for i in range(50, 100)])
    received: set[bytes] = set()
    conn = await aio_pika.connect(url(b2))
    async with conn:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=20)
        queue = await ch.get_queue("orders")

        async def take() -> None:
            async with queue.iterator() as messages:
                async for message in messages:
                    await message.ack()
                    received.add(message.body)
                    if confirmed <= received:
                        return

        await asyncio.wait_for(take(), 60)
    assert confirmed <= received and len(confirmed) == 100

    async def drained() -> bool:
        async with await clients.connect(b3.address) as native:
            s = await native.queue_stats("orders")
            return s["ready"] == 0 and s["acquired"] == 0

    await eventually(drained, "the queue drained")


async def test_a_kill_9_of_the_consumers_broker_gives_its_messages_to_another(
    amqp_cluster: list[BrokerProcess],
) -> None:
    """A worker on node-1 holds messages unacked when node-1 is killed -9; a worker on
    node-2 gets them, redelivered, their failed delivery counted."""
    b1, b2, _ = amqp_cluster
    conn = await aio_pika.connect(url(b2))
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("held", durable=True, arguments={"x-queue-type": "quorum"})
        for i in range(5):
            await ch.default_exchange.publish(aio_pika.Message(f"h-{i}".encode()),
                                              routing_key="held")
    doomed = await aio_pika.connect(url(b1))
    dch = await doomed.channel()
    await dch.set_qos(prefetch_count=10)
    held: list[aio_pika.abc.AbstractIncomingMessage] = []
    await (await dch.get_queue("held")).consume(held.append)

    async def all_held() -> bool:
        return len(held) == 5

    await eventually(all_held, "node-1's worker holds every message")
    b1.kill9()
    conn = await aio_pika.connect(url(b2))
    async with conn:
        ch = await conn.channel()
        queue = await ch.get_queue("held")
        got: dict[bytes, tuple[bool, Any]] = {}

        async def take() -> None:
            async with queue.iterator() as messages:
                async for message in messages:
                    got[message.body] = (message.redelivered, message.headers)
                    await message.ack()
                    if len(got) == 5:
                        return

        await asyncio.wait_for(take(), 60)
    assert sorted(got) == [f"h-{i}".encode() for i in range(5)]
    assert all(redelivered and headers["x-delivery-count"] == 1
               for redelivered, headers in got.values())
