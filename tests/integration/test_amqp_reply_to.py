"""Direct reply-to (RabbitMQ's ``amq.rabbitmq.reply-to``, docs/amqp.md) through real
brokers, with pika: the pseudo-queue declared passively, consumed without acks, named as
a publish's ``reply_to``; a reply published to the name the replier sees comes back to
that channel, from another broker of the cluster and from a user with no right on it;
and what RabbitMQ refuses is refused. (FastStream's RPC is built on it:
tests/integration/test_faststream.py.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import commands, frame

from batonmq import clients
from batonmq.cluster.errors import AccessRefused
from tests.helpers import eventually, eventually_sync
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import AMQP, amqp_broker, amqp_port  # noqa: F401 (a fixture)
from tests.integration.test_amqp_aio import amqp_cluster  # noqa: F401 (a fixture)
from tests.integration.test_hostile_frames import RawAmqp

pytestmark = pytest.mark.integration

REPLY_TO = "amq.rabbitmq.reply-to"


def _connect(b: BrokerProcess, user: str = "guest", password: str = "guest"
             ) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", amqp_port(b), credentials=pika.PlainCredentials(user, password)))


def _add_users(b: BrokerProcess) -> None:
    """The queue ``rpc``; users ``alice``, who may only write to it, and ``bob``, who may
    only read and write it."""
    async def add() -> None:
        async with await clients.connect(b.address) as guest:
            await guest.declare_queue("rpc")
            await guest.put_user("alice", "alice-pw")
            await guest.set_permissions("alice", configure="^$", write="^rpc$", read="^$")
            await guest.put_user("bob", "bob-pw")
            await guest.set_permissions("bob", configure="^$", write="^rpc$", read="^rpc$")
    asyncio.run(add())


def _rights_changed(b: BrokerProcess) -> None:
    """alice's rights set again (the same): her connections look at their consumers."""
    async def again() -> None:
        async with await clients.connect(b.address) as guest:
            await guest.set_permissions("alice", configure="^$", write="^rpc$", read="^$")
    asyncio.run(again())


@pytest.mark.timeout(60)
def test_a_reply_comes_back_from_another_broker_between_users_without_rights_on_it(
    amqp_cluster: list[BrokerProcess],  # noqa: F811 (the fixture)
) -> None:
    first, second = amqp_cluster[0], amqp_cluster[1]
    _add_users(first)
    requester = _connect(first, "alice", "alice-pw")
    # bob's login reaches the second broker through the log.
    replier = eventually_sync(lambda: _connect(second, "bob", "bob-pw"), "bob's login",
                              ignore=(pika.exceptions.AMQPConnectionError,))
    try:
        ch = requester.channel()
        ok = ch.queue_declare(REPLY_TO, passive=True)  # always there, empty (as RabbitMQ)
        assert (ok.method.queue, ok.method.message_count, ok.method.consumer_count) == (
            REPLY_TO, 0, 0)
        replies: list[tuple[str, str | None, bytes, bool]] = []
        ch.basic_consume(REPLY_TO, lambda _c, m, p, body: replies.append(
            (m.routing_key, p.correlation_id, body, m.redelivered)), auto_ack=True)
        ch.confirm_delivery()
        for n in range(3):
            ch.basic_publish("", "rpc", str(n).encode(),
                             pika.BasicProperties(reply_to=REPLY_TO, correlation_id=f"c{n}"))
        # alice has no right on her reply queue, and needs none: a change of her rights
        # leaves her reply consumer alone (consumers she may no longer read end).
        _rights_changed(first)

        rch = replier.channel()
        names = set()
        for _ in range(3):
            got = eventually_sync(lambda: rch.basic_get("rpc"), "a request on the second broker",
                                  until=lambda g: g[0] is not None)
            method, props, body = got
            assert props.reply_to.startswith(REPLY_TO + "."), props.reply_to
            names.add(props.reply_to)
            # bob has no right on the reply queue: its random name is the right to reply.
            rch.basic_publish("", props.reply_to, b"re:" + body,
                              pika.BasicProperties(correlation_id=props.correlation_id))
            rch.basic_ack(method.delivery_tag)
        assert len(names) == 1  # one reply queue for the channel's consumer
        (name,) = names
        deadline = time.monotonic() + 15
        while len(replies) < 3 and time.monotonic() < deadline:
            requester.process_data_events(0.1)
        assert replies == [(name, f"c{n}", f"re:{n}".encode(), False) for n in range(3)]
    finally:
        replier.close()
        requester.close()


@pytest.mark.timeout(60)
def test_what_rabbitmq_refuses_about_direct_reply_to_is_refused(
    amqp_broker: BrokerProcess,  # noqa: F811 (the fixture)
) -> None:
    conn = _connect(amqp_broker)
    try:
        # A reply consumer must not ack.
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)
        assert err.value.reply_code == 406 and "cannot acknowledge" in err.value.reply_text
        # A publish naming it as its reply_to needs the channel's reply consumer.
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("rpc")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_publish("", "rpc", b"x", pika.BasicProperties(reply_to=REPLY_TO))
        assert err.value.reply_code == 406
        assert "fast reply consumer does not exist" in err.value.reply_text
        # One reply consumer per channel.
        ch = conn.channel()
        ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True, consumer_tag="r1")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True, consumer_tag="r2")
        assert err.value.reply_code == 406 and "already set" in err.value.reply_text
        # Cancelled: its queue goes (auto-delete), and reply_to is refused again.
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True, consumer_tag="r3")
        ch.basic_publish("", "rpc", b"x", pika.BasicProperties(reply_to=REPLY_TO))
        _method, props, _body = ch.basic_get("rpc", auto_ack=True)
        name = props.reply_to
        assert name.startswith(REPLY_TO + ".")
        ch.basic_cancel("r3")

        def gone() -> bool:
            probe = conn.channel()
            try:
                probe.queue_declare(name, passive=True)
            except pika.exceptions.ChannelClosedByBroker as exc:
                return exc.reply_code == 404
            probe.close()
            return False

        eventually_sync(gone, "the reply queue deleted with its consumer")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_publish("", "rpc", b"x", pika.BasicProperties(reply_to=REPLY_TO))
        assert err.value.reply_code == 406
    finally:
        conn.close()

    async def native() -> None:
        # Publishes to a reply queue need no write right: no other client makes one.
        async with await clients.connect(amqp_broker.address) as guest:
            with pytest.raises(AccessRefused, match="reserved for AMQP's direct reply-to"):
                await guest.declare_queue(REPLY_TO + ".mine")
    asyncio.run(native())


@pytest.mark.timeout(60)
def test_a_reply_consumer_beyond_the_limits_makes_no_queue(tmp_path: Path) -> None:
    """The consumer limits are checked before the reply queue is declared: a client
    refused again and again leaves no queue behind."""
    b = BrokerProcess(tmp_path / "limits", extra=AMQP + ["--max-consumers", "1"])
    b.start()
    try:
        conn = _connect(b)
        conn.channel().basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
        for _ in range(5):
            ch = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
                ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
            assert err.value.reply_code == 406 and "max_consumers" in err.value.reply_text

        async def reply_queues() -> list[str]:
            async with await clients.connect(b.address) as guest:
                return [q["queue"] for q in await guest.list_queues()
                        if q["queue"].startswith(REPLY_TO)]

        assert len(asyncio.run(reply_queues())) == 1
        conn.close()
        eventually_sync(lambda: asyncio.run(reply_queues()), "the reply queue gone with its"
                        " connection", until=lambda names: names == [])
    finally:
        b.stop()


@pytest.mark.timeout(60)
async def test_a_reply_queue_whose_channel_closed_before_it_was_made_goes(
    amqp_broker: BrokerProcess,  # noqa: F811 (the fixture)
) -> None:
    """A channel closed right after its Basic.Consume of the pseudo-queue (one write:
    the broker reads both at once), before the queue made for it is applied: the queue
    goes all the same, while its connection stays."""
    raw = RawAmqp(f"127.0.0.1:{amqp_port(amqp_broker)}", "guest", "guest")
    try:
        for number in (1, 2, 3):
            raw.open_channel(number)
            assert isinstance(raw.read()[1], commands.Channel.OpenOk)
            raw.sock.sendall(
                frame.marshal(commands.Basic.Consume(queue=REPLY_TO, no_ack=True), number)
                + frame.marshal(commands.Channel.Close(200, "bye", 0, 0), number))
            while not isinstance(raw.read()[1], commands.Channel.CloseOk):
                pass  # (Consume-Ok, or nothing, comes first)

        async def reply_queues() -> list[str]:
            async with await clients.connect(amqp_broker.address) as guest:
                return [q["queue"] for q in await guest.list_queues()
                        if q["queue"].startswith(REPLY_TO)]

        await eventually(reply_queues, "the reply queues gone", until=lambda n: n == [])
    finally:
        raw.close()
