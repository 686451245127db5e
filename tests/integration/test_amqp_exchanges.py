"""Exchanges over AMQP, with pika against a real ``baton serve --amqp-listen``: RabbitMQ's
publish/subscribe (fanout), routing (direct) and topics tutorials, a headers exchange,
mandatory publishes that nothing routes, dead letters through an exchange, and the
errors RabbitMQ gives for exchange mistakes (docs/amqp.md)."""

from __future__ import annotations

import time
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import amqp_broker, connect  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration


def drain(ch: Any, queue: str, want: int, timeout: float = 10.0) -> list[tuple[Any, bytes]]:
    """Get (and ack) messages from ``queue`` until ``want`` came, or the time is up."""
    got: list[tuple[Any, bytes]] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.02)
            continue
        got.append((method, body))
    return got


def bodies(ch: Any, queue: str, want: int) -> list[bytes]:
    return sorted(b for _, b in drain(ch, queue, want))


def empty(ch: Any, queue: str) -> bool:
    return ch.queue_declare(queue, passive=True).method.message_count == 0


def test_publish_subscribe_over_a_fanout_exchange(amqp_broker: BrokerProcess) -> None:
    """Every queue bound to a fanout exchange gets every message, delivered with the
    exchange's name; a confirmed publish to two queues is one append."""
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.exchange_declare("logs", exchange_type="fanout")
    queues = [ch.queue_declare("", exclusive=True).method.queue for _ in range(2)]
    for q in queues:
        ch.queue_bind(q, "logs")
    ch.confirm_delivery()
    sent = [f"log-{i}".encode() for i in range(20)]
    for body in sent:
        ch.basic_publish("logs", "", body)
    for q in queues:
        got = drain(ch, q, len(sent))
        assert sorted(b for _, b in got) == sorted(sent)
        assert {(m.exchange, m.routing_key) for m, _ in got} == {("logs", "")}
    conn.close()


def test_routing_over_a_direct_exchange_and_mandatory_returns(amqp_broker: BrokerProcess) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.exchange_declare("direct_logs", exchange_type="direct")
    errors = ch.queue_declare("", exclusive=True).method.queue
    everything = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(errors, "direct_logs", routing_key="error")
    for key in ("info", "error"):
        ch.queue_bind(everything, "direct_logs", routing_key=key)
    ch.confirm_delivery()
    ch.basic_publish("direct_logs", "error", b"disk full", mandatory=True)
    ch.basic_publish("direct_logs", "info", b"started", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):  # returned, then confirmed
        ch.basic_publish("direct_logs", "warning", b"nobody listens", mandatory=True)
    assert bodies(ch, errors, 1) == [b"disk full"]
    assert bodies(ch, everything, 2) == [b"disk full", b"started"]
    # Unbound, "info" reaches nobody any more.
    ch.queue_unbind(everything, "direct_logs", routing_key="info")
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("direct_logs", "info", b"again", mandatory=True)
    assert empty(ch, errors) and empty(ch, everything)
    conn.close()


def test_topics_and_headers(amqp_broker: BrokerProcess) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.exchange_declare("topic_logs", exchange_type="topic")
    critical = ch.queue_declare("", exclusive=True).method.queue
    kernel = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(critical, "topic_logs", routing_key="*.critical")
    ch.queue_bind(kernel, "topic_logs", routing_key="kern.#")
    ch.confirm_delivery()
    for key in ("kern.critical", "kern.info", "app.critical", "kern"):
        ch.basic_publish("topic_logs", key, key.encode())
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("topic_logs", "app.info.x", b"no", mandatory=True)
    assert bodies(ch, critical, 2) == [b"app.critical", b"kern.critical"]
    assert bodies(ch, kernel, 3) == [b"kern", b"kern.critical", b"kern.info"]

    ch.exchange_declare("matching", exchange_type="headers")
    both = ch.queue_declare("", exclusive=True).method.queue
    either = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(both, "matching", arguments={"x-match": "all", "format": "pdf", "type": "report"})
    ch.queue_bind(either, "matching", arguments={"x-match": "any", "format": "pdf", "type": "log"})
    for name, headers in (("pdf-report", {"format": "pdf", "type": "report"}),
                          ("zip-log", {"format": "zip", "type": "log"}),
                          ("zip-report", {"format": "zip", "type": "report"})):
        ch.basic_publish("matching", "", name.encode(), pika.BasicProperties(headers=headers))
    assert bodies(ch, both, 1) == [b"pdf-report"]
    assert bodies(ch, either, 2) == [b"pdf-report", b"zip-log"]
    assert empty(ch, both)
    conn.close()


def test_dead_letters_go_through_an_exchange(amqp_broker: BrokerProcess) -> None:
    """A queue whose x-dead-letter-exchange is a fanout exchange: a message rejected
    past x-delivery-limit reaches every queue bound to it, with x-death headers."""
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.exchange_declare("dlx", exchange_type="fanout")
    for q in ("dead-1", "dead-2"):
        ch.queue_declare(q)
        ch.queue_bind(q, "dlx")
    ch.queue_declare("jobs", arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 0, "x-dead-letter-exchange": "dlx",
    })
    ch.basic_publish("", "jobs", b"poison", pika.BasicProperties(message_id="m-1"))
    method = None
    deadline = time.monotonic() + 10
    while method is None and time.monotonic() < deadline:
        method, _, _ = ch.basic_get("jobs")
    assert method is not None
    ch.basic_reject(method.delivery_tag, requeue=True)  # returned once: more than 0 times
    for q in ("dead-1", "dead-2"):
        got = drain(ch, q, 1)
        assert [b for _, b in got] == [b"poison"], q
    assert empty(ch, "jobs")
    conn.close()


def test_exchange_mistakes_get_rabbitmq_s_reply_codes(amqp_broker: BrokerProcess) -> None:
    conn = connect(amqp_broker)

    def closed_with(call: Any) -> int:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            call(ch)
        return int(info.value.reply_code)

    ch = conn.channel()
    ch.exchange_declare("orders", exchange_type="direct", durable=True)
    ch.exchange_declare("orders", exchange_type="direct", durable=True)  # the same: fine
    ch.exchange_declare("amq.topic", exchange_type="topic", passive=True)
    assert closed_with(lambda c: c.exchange_declare("orders", exchange_type="fanout")) == 406
    assert closed_with(lambda c: c.exchange_declare("amq.mine", exchange_type="direct")) == 403
    assert closed_with(lambda c: c.exchange_declare("nope", passive=True)) == 404
    assert closed_with(lambda c: (c.confirm_delivery(), c.basic_publish("nope", "k", b"x"))) == 404
    assert closed_with(lambda c: c.exchange_delete("amq.direct")) == 403
    assert closed_with(lambda c: c.queue_bind("missing-queue", "orders", "k")) == 404
    ch.exchange_delete("orders")
    ch.exchange_delete("orders")  # a missing exchange: DeleteOk, as RabbitMQ
    assert closed_with(lambda c: c.exchange_declare("orders", passive=True)) == 404
    # An unknown exchange type is a connection error (503), as in RabbitMQ.
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.channel().exchange_declare("x", exchange_type="x-consistent-hash")
    assert info.value.reply_code == 503
