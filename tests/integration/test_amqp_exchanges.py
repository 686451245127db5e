"""Exchanges over AMQP, with pika against real ``baton serve --amqp-listen`` processes:
RabbitMQ's publish/subscribe (fanout), routing (direct) and topics tutorials, a headers
exchange, mandatory publishes that nothing routes, dead letters through an exchange, and
the errors RabbitMQ gives for exchange mistakes (docs/amqp.md). The tutorials run on one
broker, and on a 3-broker cluster where the exchanges are declared, bound and published
to on one broker and the queues read on another."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import AMQP, amqp_broker, connect  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration


@pytest.fixture(params=["one-broker", "cluster"])
def pub_sub(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """A channel to publish on and one to read with: on one broker, or on two brokers
    of a 3-broker cluster (what one declares, binds and publishes the other reads)."""
    n = 1 if request.param == "one-broker" else 3
    brokers = [
        BrokerProcess(tmp_path / f"node-{i}", log_url=f"file:{tmp_path / 'shared-log'}",
                      node_id=f"node-{i}", extra=AMQP)
        for i in range(1, n + 1)
    ]
    conns: list[Any] = []
    try:
        for b in brokers:
            b.start()
        conns = [connect(brokers[0]), connect(brokers[-1 if n == 1 else 1])]
        yield conns[0].channel(), conns[1].channel()
    finally:
        for c in conns:
            if c.is_open:
                c.close()
        for b in brokers:
            b.stop()


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


def declare(ch: Any, *queues: str) -> None:
    for q in queues:
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})


def test_publish_subscribe_over_a_fanout_exchange(pub_sub: tuple[Any, Any]) -> None:
    """Every queue bound to a fanout exchange gets every message, delivered with the
    exchange's name; a confirmed publish to two queues is one append."""
    ch, sub = pub_sub
    ch.exchange_declare("logs", exchange_type="fanout")
    queues = ["logs-a", "logs-b"]
    declare(ch, *queues)
    for q in queues:
        ch.queue_bind(q, "logs")
    ch.confirm_delivery()
    sent = [f"log-{i}".encode() for i in range(20)]
    for body in sent:
        ch.basic_publish("logs", "", body)
    for q in queues:
        got = drain(sub, q, len(sent))
        assert sorted(b for _, b in got) == sorted(sent)
        assert {(m.exchange, m.routing_key) for m, _ in got} == {("logs", "")}


def test_routing_over_a_direct_exchange_and_mandatory_returns(pub_sub: tuple[Any, Any]) -> None:
    ch, sub = pub_sub
    ch.exchange_declare("direct_logs", exchange_type="direct")
    errors, everything = "errors", "everything"
    declare(ch, errors, everything)
    ch.queue_bind(errors, "direct_logs", routing_key="error")
    for key in ("info", "error"):
        ch.queue_bind(everything, "direct_logs", routing_key=key)
    ch.confirm_delivery()
    ch.basic_publish("direct_logs", "error", b"disk full", mandatory=True)
    ch.basic_publish("direct_logs", "info", b"started", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):  # returned, then confirmed
        ch.basic_publish("direct_logs", "warning", b"nobody listens", mandatory=True)
    assert bodies(sub, errors, 1) == [b"disk full"]
    assert bodies(sub, everything, 2) == [b"disk full", b"started"]
    # Unbound, "info" reaches nobody any more.
    ch.queue_unbind(everything, "direct_logs", routing_key="info")
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("direct_logs", "info", b"again", mandatory=True)
    assert empty(sub, errors) and empty(sub, everything)


def test_topics_and_headers(pub_sub: tuple[Any, Any]) -> None:
    ch, sub = pub_sub
    ch.exchange_declare("topic_logs", exchange_type="topic")
    critical, kernel = "critical", "kernel"
    declare(ch, critical, kernel)
    ch.queue_bind(critical, "topic_logs", routing_key="*.critical")
    ch.queue_bind(kernel, "topic_logs", routing_key="kern.#")
    ch.confirm_delivery()
    for key in ("kern.critical", "kern.info", "app.critical", "kern"):
        ch.basic_publish("topic_logs", key, key.encode())
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("topic_logs", "app.info.x", b"no", mandatory=True)
    assert bodies(sub, critical, 2) == [b"app.critical", b"kern.critical"]
    assert bodies(sub, kernel, 3) == [b"kern", b"kern.critical", b"kern.info"]

    ch.exchange_declare("matching", exchange_type="headers")
    both, either = "both", "either"
    declare(ch, both, either)
    ch.queue_bind(both, "matching", arguments={"x-match": "all", "format": "pdf", "type": "report"})
    ch.queue_bind(either, "matching", arguments={"x-match": "any", "format": "pdf", "type": "log"})
    for name, headers in (("pdf-report", {"format": "pdf", "type": "report"}),
                          ("zip-log", {"format": "zip", "type": "log"}),
                          ("zip-report", {"format": "zip", "type": "report"})):
        ch.basic_publish("matching", "", name.encode(), pika.BasicProperties(headers=headers))
    assert bodies(sub, both, 1) == [b"pdf-report"]
    assert bodies(sub, either, 2) == [b"pdf-report", b"zip-log"]
    assert empty(sub, both)


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
