"""Queue.Declare arguments as Baton's queue options (broker/amqp_queues.py), and the
exchange seam (broker/amqp_routes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from batonmq.broker import amqp_routes as routes
from batonmq.broker.amqp_codec import ChannelError, ConnectionFault
from batonmq.broker.amqp_queues import error_code, queue_options
from batonmq.broker.session import declare_event
from batonmq.cluster.errors import (
    AccessRefused,
    InternalError,
    LogUnavailable,
    QueueExists,
    QueueFull,
    QueueNotFound,
)


def test_quorum_queue_arguments_map_onto_baton_options() -> None:
    options = queue_options("orders", {
        "x-queue-type": "quorum", "x-delivery-limit": 5, "x-message-ttl": 60000,
        "x-max-length": 100, "x-overflow": "drop-head", "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "orders.dlq", "x-max-priority": 3,
        "x-single-active-consumer": True, "x-queue-leader-locator": "balanced",
    }, durable=True)
    assert options == {
        "durable": True, "delivery_limit": 5, "message_ttl_ms": 60000, "max_length": 100,
        "overflow": "drop-head", "dead_letter": "orders.dlq", "max_priority": 3,
        "single_active_consumer": True,
    }
    event = declare_event("orders", options)  # what the channel submits
    assert (event.delivery_limit, event.dead_letter, event.max_length) == (5, "orders.dlq", 100)
    assert queue_options("plain", {"x-queue-type": "classic"}, durable=False) == {"durable": False}


@pytest.mark.parametrize(
    "arguments, says",
    [
        ({"x-queue-type": "stream"}, "stream queues are not supported"),
        ({"x-queue-type": "weird"}, "unknown queue type 'weird'"),
        ({"x-expires": 1000}, "'x-expires'"),
        ({"x-max-length-bytes": 1000}, "'x-max-length-bytes'"),
        ({"x-delivery-limit": "5"}, "must be an integer"),
        ({"x-overflow": "reject-publish-dlx"}, "reject-publish-dlx"),
        ({"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "q"}, "default exchange only"),
        ({"x-dead-letter-exchange": ""}, "needs x-dead-letter-routing-key"),
    ],
)
def test_arguments_baton_does_not_have_are_refused_with_406(arguments: dict[str, Any],
                                                           says: str) -> None:
    with pytest.raises(ChannelError) as info:
        queue_options("q", arguments, durable=True)
    assert info.value.code == 406 and says in info.value.text


def test_error_codes() -> None:
    assert error_code(QueueNotFound("x")) == 404
    assert error_code(AccessRefused("x")) == 403
    assert error_code(QueueExists("x")) == 406
    assert error_code(QueueFull("x")) == 406
    assert error_code(LogUnavailable("x")) == 541
    assert error_code(InternalError("x")) == 541


def test_the_exchange_seam_knows_the_default_exchange_only() -> None:
    assert routes.route({"q"}, "", "q") == ["q"]
    assert routes.route({"q"}, "", "other") == []
    with pytest.raises(ChannelError) as info:
        routes.route({"q"}, "amq.direct", "q")
    assert info.value.code == 404
    routes.declare_exchange("", "direct", passive=True, arguments={})
    with pytest.raises(ChannelError) as info:
        routes.declare_exchange("amq.fanout", "fanout", passive=False, arguments={})
    assert info.value.code == 403
    with pytest.raises(ChannelError) as info:
        routes.declare_exchange("logs", "fanout", passive=True, arguments={})
    assert info.value.code == 404
    with pytest.raises(ConnectionFault) as fault:
        routes.declare_exchange("logs", "fanout", passive=False, arguments={})
    assert fault.value.code == 540
    with pytest.raises(ChannelError) as info:
        routes.bind_queue("q", "", "q", bind=True)
    assert info.value.code == 403
    with pytest.raises(ChannelError) as info:
        routes.delete_exchange("logs")
    assert info.value.code == 404
