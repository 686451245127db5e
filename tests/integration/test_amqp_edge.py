"""What RabbitMQ's clients expect at the AMQP edge, as RabbitMQ 3.x answers it: a
channel's order, ``if-unused``, unbinding what is gone, an oversized publish, dead-letter
routing keys, exclusive consumers, reserved names, ``Basic.Qos`` on running consumers,
the argument values RabbitMQ accepts and ``Connection.UpdateSecret`` (docs/amqp.md).
Each is driven by pika or aio-pika against a real ``baton serve --amqp-listen``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import aio_pika.exceptions
import pika
import pika.exceptions
import pytest

from tests.helpers import eventually_sync
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import AMQP, amqp_port, connect
from tests.integration.test_amqp_aio import amqp_cluster  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

#: A small max_message, so that an oversized publish is cheap to send.
_MAX = 64 * 1024


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("edge") / "broker", extra=AMQP,
                      env={"BATON_MAX_MESSAGE": str(_MAX)})
    b.start()
    try:
        yield b
    finally:
        b.stop()


def url(b: BrokerProcess) -> str:
    return f"amqp://guest:guest@127.0.0.1:{amqp_port(b)}/"


def _get(ch: Any, queue: str, timeout: float = 5.0, auto_ack: bool = False
         ) -> tuple[Any, Any, bytes]:
    """A Basic.Get that must find a message (polled: a get may race the publish)."""
    deadline = time.monotonic() + timeout
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            return method, props, body
        assert time.monotonic() < deadline, f"nothing to get from {queue}"
        time.sleep(0.05)


# -- 1. a channel's order ------------------------------------------------------------------


def test_a_get_sees_the_same_channels_requeue_at_once(broker: BrokerProcess) -> None:
    """Basic.Get right after the channel's own Nack/Reject with requeue finds the message
    every time (AMQP orders a channel's methods; RabbitMQ: never empty)."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("order-requeue")
    ch.confirm_delivery()
    ch.basic_publish("", "order-requeue", b"m")
    empty = 0
    method, _, _ = _get(ch, "order-requeue")
    for i in range(20):
        if i % 2:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_reject(method.delivery_tag, requeue=True)
        again, _, body = ch.basic_get("order-requeue")
        if again is None:
            empty += 1
            again, _, body = _get(ch, "order-requeue")
        assert body == b"m"
        method = again
    conn.close()
    assert empty == 0, f"Basic.Get after a requeue on the same channel was empty {empty} of 20"


def test_a_closed_channels_messages_are_back_when_its_close_ok_comes(
    broker: BrokerProcess,
) -> None:
    """A channel closed while its consumer holds messages: Close-Ok comes once they are
    back on the queue, so a Basic.Get on a new channel finds them (RabbitMQ requeues
    before it answers; pika's TestCloseChannelFromBasicConsumeCallback)."""
    conn = connect(broker)
    empty = 0
    for i in range(10):
        ch = conn.channel()
        ch.confirm_delivery()
        queue = f"close-requeue-{i}"
        ch.queue_declare(queue)
        ch.basic_publish("", queue, b"one")
        ch.basic_publish("", queue, b"two")
        ch.basic_consume(queue, lambda c, m, p, b: c.close(), auto_ack=False)
        ch.start_consuming()
        assert ch.is_closed
        again = conn.channel()
        if again.basic_get(queue)[2] != b"one":
            empty += 1
        again.close()
    conn.close()
    assert empty == 0, f"a Basic.Get after the close missed the messages {empty} of 10 times"


def test_a_channel_the_broker_closes_gives_back_its_messages_first(
    broker: BrokerProcess,
) -> None:
    """The broker closes a channel (403: a publish to an internal exchange) whose
    consumer holds a message: when Channel.Close reaches the client, the message is back
    on the queue (aio-pika's test_consumer_process_preserves_publish_error)."""
    conn = connect(broker)
    admin = conn.channel()
    admin.exchange_declare("internal-x", "direct", internal=True)
    missed = 0
    for i in range(10):
        queue = f"server-close-{i}"
        admin.queue_declare(queue)
        admin.confirm_delivery()
        admin.basic_publish("", queue, b"held")
        ch = conn.channel()
        got: list[bytes] = []
        ch.basic_consume(queue, lambda c, m, p, b: got.append(b), auto_ack=False)
        while not got:
            conn.process_data_events(time_limit=0.05)
        reasons: list[Exception] = []
        ch._impl.add_on_close_callback(lambda c, reason: reasons.append(reason))
        ch.basic_publish("internal-x", "k", b"refused")
        deadline = time.monotonic() + 10
        while not reasons and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert isinstance(reasons[0], pika.exceptions.ChannelClosedByBroker)
        assert reasons[0].reply_code == 403
        if admin.basic_get(queue, auto_ack=True)[2] != b"held":
            missed += 1
    conn.close()
    assert missed == 0, f"a Basic.Get after the broker's close missed the message {missed} of 10"


def test_a_get_sees_the_same_channels_unconfirmed_publish(broker: BrokerProcess) -> None:
    """A publish without confirms, then a Basic.Get on the same channel: the message is
    there (the get goes after the publish through the log)."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("order-publish")
    empty = 0
    for i in range(20):
        ch.basic_publish("", "order-publish", f"m{i}".encode())
        method, _, body = ch.basic_get("order-publish", auto_ack=True)
        if method is None:
            empty += 1
            method, _, body = _get(ch, "order-publish", auto_ack=True)
        assert body == f"m{i}".encode()
    conn.close()
    assert empty == 0, f"Basic.Get after a publish on the same channel was empty {empty} of 20"


def test_a_channels_order_holds_on_a_broker_that_does_not_own_the_queue(
    amqp_cluster: list[BrokerProcess],  # noqa: F811 (the fixture)
) -> None:
    """On a 3-broker cluster, through a broker other than the one that declared the
    queue: a publish without confirms then a get, and a requeue then a get, on one
    channel, find the message every time."""
    owner = connect(amqp_cluster[0])
    owner.channel().queue_declare("order-cluster", durable=True)
    owner.close()
    conn = connect(amqp_cluster[1])
    eventually_sync(lambda: _declared(conn, "order-cluster"), "the queue applied on broker 2")
    ch = conn.channel()
    empty = 0
    for i in range(10):
        ch.basic_publish("", "order-cluster", f"c{i}".encode())
        method, _, body = ch.basic_get("order-cluster")
        if method is None:
            empty += 1
            method, _, body = _get(ch, "order-cluster")
        assert body == f"c{i}".encode()
        ch.basic_nack(method.delivery_tag, requeue=True)
        again, _, body = ch.basic_get("order-cluster", auto_ack=True)
        if again is None:
            empty += 1
            _get(ch, "order-cluster", auto_ack=True)
    conn.close()
    assert empty == 0, f"a Basic.Get missed the channel's own earlier method {empty} of 20"


def _declared(conn: Any, queue: str) -> bool:
    try:
        conn.channel().queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False


async def test_aio_pika_nack_then_get(broker: BrokerProcess) -> None:
    """aio-pika's test_message_nack: nack with requeue, get again at once."""
    conn = await aio_pika.connect(url(broker))
    async with conn:
        ch = await conn.channel()
        q = await ch.declare_queue("order-aio", auto_delete=True)
        for i in range(10):
            await ch.default_exchange.publish(aio_pika.Message(f"b{i}".encode()), "order-aio")
            msg = await q.get(timeout=5)
            assert msg.body == f"b{i}".encode()
            await msg.nack(requeue=True)
            again = await q.get(timeout=5, fail=False)
            assert again is not None and again.body == f"b{i}".encode(), f"round {i}: empty"
            await again.ack()


# -- 2. if-unused ----------------------------------------------------------------------------


def test_if_unused_means_no_consumers(broker: BrokerProcess) -> None:
    """RabbitMQ's if-unused is "no consumers": a message held by a Basic.Get, or acked just
    before, does not keep the queue."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("unused-get")
    ch.confirm_delivery()
    ch.basic_publish("", "unused-get", b"x")
    method, _, _ = _get(ch, "unused-get")  # held, not acked
    ch.queue_delete("unused-get", if_unused=True)
    ch.queue_declare("unused-ack")
    ch.basic_publish("", "unused-ack", b"x")
    method, _, _ = _get(ch, "unused-ack")
    ch.basic_ack(method.delivery_tag)
    ch.queue_delete("unused-ack", if_unused=True)
    assert ch.queue_declare("unused-ack", passive=False).method.message_count == 0
    # A consumer does keep it.
    ch.queue_declare("unused-consumed")
    ch.basic_consume("unused-consumed", lambda *a: None)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_delete("unused-consumed", if_unused=True)
    assert err.value.reply_code == 406
    conn.close()


def test_if_empty_means_no_ready_message(broker: BrokerProcess) -> None:
    """RabbitMQ's if-empty is "no ready message": a message held unacked by a Basic.Get
    does not keep the queue (aio-pika deletes its test queues with if-empty after a get);
    a ready one does."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("empty-get")
    ch.confirm_delivery()
    ch.basic_publish("", "empty-get", b"x")
    _get(ch, "empty-get")  # held, not acked
    ch.queue_delete("empty-get", if_empty=True)
    ch.queue_declare("empty-ready")
    ch.basic_publish("", "empty-ready", b"x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_delete("empty-ready", if_empty=True)
    assert err.value.reply_code == 406
    conn.close()


# -- 3. unbinding what is gone ------------------------------------------------------------


def test_unbind_of_what_is_gone_is_unbind_ok(broker: BrokerProcess) -> None:
    """As RabbitMQ 3.x: an unbind of a missing exchange, a missing binding or a missing
    queue answers Unbind-Ok (aio-pika's RPC closes this way)."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("unbind-q")
    ch.exchange_declare("unbind-x", "direct", auto_delete=True)
    ch.queue_bind("unbind-q", "unbind-x", "k")
    ch.queue_unbind("unbind-q", "unbind-x", "k")
    ch.queue_unbind("unbind-q", "unbind-x", "k")  # the binding is gone
    ch.queue_unbind("unbind-q", "no-such-exchange", "k")  # the exchange is gone
    ch.queue_unbind("no-such-queue", "unbind-x", "k")  # the queue is gone
    assert ch.is_open
    conn.close()


# -- 4. an oversized publish ----------------------------------------------------------------


def test_an_oversized_publish_closes_its_channel_only(broker: BrokerProcess) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("big")
    ch.basic_publish("", "big", b"x" * (_MAX * 3))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare("big", passive=True)
    assert err.value.reply_code == 406
    ch2 = conn.channel()
    ch2.confirm_delivery()
    ch2.basic_publish("", "big", b"small")
    assert _get(ch2, "big", timeout=5)[2] == b"small"
    conn.close()


async def test_an_oversized_publish_with_aio_pika(broker: BrokerProcess) -> None:
    """aio-pika's own way: the channel closes, the connection lives, another channel
    publishes."""
    conn = await aio_pika.connect(url(broker))
    async with conn:
        ch = await conn.channel()
        await ch.declare_queue("big-aio")
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await ch.default_exchange.publish(aio_pika.Message(b"y" * (_MAX * 4)), "big-aio")
            await ch.declare_queue("big-aio", passive=True)
        ch2 = await conn.channel()
        await ch2.default_exchange.publish(aio_pika.Message(b"small"), "big-aio")
        q = await ch2.declare_queue("big-aio", passive=True)
        msg = await _aio_get(q)
        assert msg.body == b"small"
        assert not conn.is_closed


async def _aio_get(q: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        msg = await q.get(timeout=timeout, fail=False)
        if msg is not None:
            return msg
        assert time.monotonic() < deadline, f"nothing to get from {q.name}"
        await asyncio.sleep(0.05)


# -- 5. dead letters' routing keys ------------------------------------------------------------


def _dead_letter(ch: Any, source: str) -> None:
    ch.basic_publish("", source, b"dead")
    method, _, _ = _get(ch, source)
    ch.basic_reject(method.delivery_tag, requeue=False)


def test_dead_letters_carry_rabbitmqs_routing_key(broker: BrokerProcess) -> None:
    """As RabbitMQ: a dead letter is delivered from the dead-letter exchange with
    x-dead-letter-routing-key if set, else with the key it was published with."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    # A direct exchange and a dead-letter routing key.
    ch.exchange_declare("dl-x", "direct")
    ch.queue_declare("dl-dst")
    ch.queue_bind("dl-dst", "dl-x", "dl-rk")
    ch.queue_declare("dl-src", arguments={"x-dead-letter-exchange": "dl-x",
                                          "x-dead-letter-routing-key": "dl-rk"})
    _dead_letter(ch, "dl-src")
    method, _, body = _get(ch, "dl-dst", auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"dead", "dl-x", "dl-rk")
    # A fanout exchange without one: the key the message was published with.
    ch.exchange_declare("dl-fan", "fanout")
    ch.queue_declare("dl-fan-dst")
    ch.queue_bind("dl-fan-dst", "dl-fan", "")
    ch.queue_declare("dl-src2", arguments={"x-dead-letter-exchange": "dl-fan"})
    _dead_letter(ch, "dl-src2")
    method, _, body = _get(ch, "dl-fan-dst", auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"dead", "dl-fan", "dl-src2")
    # The default exchange: the routing key names the dead-letter queue.
    ch.queue_declare("dl-q3")
    ch.queue_declare("dl-src3", arguments={"x-dead-letter-exchange": "",
                                           "x-dead-letter-routing-key": "dl-q3"})
    _dead_letter(ch, "dl-src3")
    method, _, body = _get(ch, "dl-q3", auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"dead", "", "dl-q3")
    conn.close()


# -- 6. exclusive consumers -------------------------------------------------------------------


def test_an_exclusive_consumer_is_the_queues_only_one(broker: BrokerProcess) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("excl")
    tag = ch.basic_consume("excl", lambda *a: None, exclusive=True)
    other = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        other.basic_consume("excl", lambda *a: None)
    assert err.value.reply_code == 403
    assert "queue 'excl' in vhost '/' in exclusive use" in err.value.reply_text
    # And an exclusive consume on a queue that has a consumer.
    ch.queue_declare("excl-2")
    ch.basic_consume("excl-2", lambda *a: None)
    third = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        third.basic_consume("excl-2", lambda *a: None, exclusive=True)
    assert err.value.reply_code == 403
    # Once the exclusive consumer is cancelled, another may consume.
    ch.basic_cancel(tag)
    conn.channel().basic_consume("excl", lambda *a: None)
    conn.close()


# -- 7. reserved names ---------------------------------------------------------------------


def test_queue_names_with_the_amq_prefix_are_reserved(broker: BrokerProcess) -> None:
    conn = connect(broker)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare("amq.mine")
    assert err.value.reply_code == 403
    assert "queue name 'amq.mine' contains reserved prefix 'amq.*'" in err.value.reply_text
    ch = conn.channel()
    name = ch.queue_declare("", exclusive=True).method.queue  # the server's own name
    assert name.startswith("amq.gen-")
    assert ch.queue_declare(name, passive=True).method.queue == name
    conn.close()


# -- 8. Basic.Qos on running consumers ------------------------------------------------------


def test_a_global_qos_raises_the_running_consumers_prefetch(broker: BrokerProcess) -> None:
    """kombu (Celery, on classic queues) raises its running consumer's prefetch with a
    global Basic.Qos: applied at once, as RabbitMQ 3.x's per-channel limit."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("qos-raise")
    for i in range(6):
        ch.basic_publish("", "qos-raise", f"q{i}".encode())
    ch.basic_qos(prefetch_count=1, global_qos=True)
    got: list[bytes] = []
    ch.basic_consume("qos-raise", lambda c, m, p, body: got.append(body))
    eventually_sync(lambda: conn.process_data_events(0.05) or len(got) >= 1, "the first")
    assert len(got) == 1
    ch.basic_qos(prefetch_count=3, global_qos=True)
    eventually_sync(lambda: conn.process_data_events(0.05) or len(got) >= 3,
                    "three held at once after the raise")
    conn.process_data_events(0.3)
    assert len(got) == 3, got  # (and no more than the new limit)
    conn.close()


def test_a_per_consumer_qos_applies_to_the_running_consumers(broker: BrokerProcess) -> None:
    """kombu sends a per-consumer Basic.Qos (global false) to a broker that is not
    RabbitMQ, and raises it for each ETA task its running consumer holds: the new
    prefetch takes effect at once, raised and lowered."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("qos-consumer")
    for i in range(8):
        ch.basic_publish("", "qos-consumer", f"q{i}".encode())
    ch.basic_qos(prefetch_count=1)
    got: list[int] = []
    ch.basic_consume("qos-consumer", lambda c, m, p, body: got.append(m.delivery_tag))
    eventually_sync(lambda: conn.process_data_events(0.05) or len(got) >= 1, "the first")
    conn.process_data_events(0.3)
    assert len(got) == 1
    ch.basic_qos(prefetch_count=3)
    eventually_sync(lambda: conn.process_data_events(0.05) or len(got) >= 3,
                    "three held at once after the raise")
    conn.process_data_events(0.3)
    assert len(got) == 3, got  # (and no more than the new limit)
    ch.basic_qos(prefetch_count=1)  # lowered: nothing more until it holds less than 1
    ch.basic_ack(got[0])
    conn.process_data_events(0.5)
    assert len(got) == 3
    ch.basic_ack(got[-1], multiple=True)
    eventually_sync(lambda: conn.process_data_events(0.05) or len(got) >= 4, "one more")
    conn.process_data_events(0.3)
    assert len(got) == 4, got
    conn.close()


# -- 9, 10. values RabbitMQ accepts --------------------------------------------------------


def test_priorities_above_nine_are_baton_s_top(broker: BrokerProcess) -> None:
    """x-max-priority 10 or 255 is accepted (Baton's top is 9); a message's priority
    above 9 counts as 9, so it still goes first."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("prio-255", arguments={"x-max-priority": 255})
    ch.queue_declare("prio-10", arguments={"x-max-priority": 10})
    ch.queue_declare("prio-10", arguments={"x-max-priority": 10})  # declared again: the same
    ch.basic_publish("", "prio-255", b"low", pika.BasicProperties(priority=1))
    ch.basic_publish("", "prio-255", b"high", pika.BasicProperties(priority=200))
    assert _get(ch, "prio-255", auto_ack=True)[2] == b"high"
    assert _get(ch, "prio-255", auto_ack=True)[2] == b"low"
    conn.close()


def test_a_message_ttl_of_zero_expires_what_no_consumer_takes(broker: BrokerProcess) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("ttl-0-dlq")
    ch.queue_declare("ttl-0", arguments={"x-message-ttl": 0, "x-dead-letter-exchange": "",
                                         "x-dead-letter-routing-key": "ttl-0-dlq"})
    ch.basic_publish("", "ttl-0", b"gone")
    assert _get(ch, "ttl-0-dlq", auto_ack=True)[2] == b"gone"
    assert ch.queue_declare("ttl-0", passive=True).method.message_count == 0
    conn.close()


def test_queue_types_rabbitmq_has(broker: BrokerProcess) -> None:
    conn = connect(broker)
    ch = conn.channel()
    for kind in ("quorum", "classic", "stream"):
        ch.queue_declare(f"type-{kind}", durable=True, arguments={"x-queue-type": kind})
    ch.basic_qos(prefetch_count=10)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_consume("type-stream", lambda *a: None,
                         arguments={"x-stream-offset": "first"})
    assert err.value.reply_code == 406 and "not streams" in err.value.reply_text
    conn.close()


def test_update_secret_is_answered(broker: BrokerProcess) -> None:
    """pika's update_secret (RabbitMQ's OAuth 2 token refresh): Update-Secret-Ok, the
    connection goes on as its user."""
    conn = connect(broker)
    conn.update_secret("new-token", "token refresh")
    ch = conn.channel()
    ch.queue_declare("after-secret")
    assert conn.is_open
    conn.close()
