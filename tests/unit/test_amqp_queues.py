"""Queue.Declare arguments as Baton's queue options (broker/amqp_queues.py), and the
exchange seam (broker/amqp_routes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from batonmq.broker import amqp_routes as routes
from batonmq.broker.amqp_codec import ChannelError, ConnectionFault
from batonmq.broker.amqp_queues import error_code, queue_options
from batonmq.broker.session import declare_event
from batonmq.cluster.events import Bind, DeclareExchange
from batonmq.cluster.state import State
from batonmq.cluster.errors import (
    AccessRefused,
    InternalError,
    InvalidArgument,
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
        "durable": True, "delivery_limit": 6, "message_ttl_ms": 60000, "max_length": 100,
        "overflow": "drop-head", "dead_letter": "orders.dlq", "max_priority": 3,
        "single_active_consumer": True,
    }
    event = declare_event("orders", options)  # what the channel submits
    assert (event.delivery_limit, event.dead_letter, event.max_length) == (6, "orders.dlq", 100)
    assert queue_options("plain", {"x-queue-type": "classic"}, durable=False) == {"durable": False}


def test_values_rabbitmq_accepts_map_onto_the_closest_baton_option() -> None:
    """A stream is a Baton queue; a maximum priority above Baton's 9 is 9; a TTL of 0
    ("expire unless delivered at once") is Baton's shortest, 1 ms."""
    assert queue_options("s", {"x-queue-type": "stream"}, durable=True) == {"durable": True}
    assert queue_options("p", {"x-max-priority": 10}, durable=True)["max_priority"] == 9
    assert queue_options("p", {"x-max-priority": 255}, durable=True)["max_priority"] == 9
    assert queue_options("p", {"x-max-priority": 4}, durable=True)["max_priority"] == 4
    assert queue_options("t", {"x-message-ttl": 0}, durable=True)["message_ttl_ms"] == 1


def test_x_expires_is_the_queue_expiry_and_needs_its_flag() -> None:
    options = queue_options("celery.pidbox", {"x-expires": 10000}, durable=False)
    assert options == {"durable": False, "expires_ms": 10000}
    state = State()
    # Before the flag: refused (406 at the channel) with what to do.
    with pytest.raises(InvalidArgument, match="baton feature enable queue_expiry"):
        declare_event("celery.pidbox", options, state=state)
    state.features.enabled["queue_expiry"] = 0
    assert declare_event("celery.pidbox", options, state=state).expires_ms == 10000
    assert error_code(InvalidArgument("x")) == 406


@pytest.mark.parametrize(
    "arguments, says",
    [
        ({"x-max-priority": 256}, "must be 0..255"),
        ({"x-message-ttl": -1}, "is negative"),
        ({"x-queue-type": "weird"}, "unknown queue type 'weird'"),
        ({"x-expires": 0}, "'x-expires' for queue 'q': 0 is not positive"),
        ({"x-expires": 1.5}, "'x-expires' for queue 'q': must be an integer"),
        ({"x-max-length-bytes": 1000}, "'x-max-length-bytes'"),
        ({"x-delivery-limit": "5"}, "must be an integer"),
        ({"x-delivery-limit": -1}, "cannot be turned off"),
        ({"x-overflow": "reject-publish-dlx"}, "reject-publish-dlx"),
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


def test_the_exchange_seam_routes_by_the_replicated_exchanges() -> None:
    """AMQP routing reads the exchanges the broker applied: the default exchange by
    queue name, a declared one by its bindings; an unknown exchange is 404, an internal
    one 403; an unknown type is a 503 connection error; dead letters through the
    default exchange name a queue, through another exchange they are routed."""
    state = State()
    for q in ("q", "logs-1", "logs-2"):
        state.queues[q] = object()  # (routing asks only which queues exist)
    state.exchanges.declare("n/r", DeclareExchange("logs", "fanout"))
    state.exchanges.declare("n/r", DeclareExchange("hidden", "direct", internal=True))
    for q in ("logs-1", "logs-2"):
        state.exchanges.bind(Bind(q, "logs", ""), state.queues)
    assert routes.route(state, state.queues, "", "q", {}) == ["q"]
    assert routes.route(state, state.queues, "", "other", {}) == []
    assert sorted(routes.route(state, state.queues, "logs", "anything", {})) == ["logs-1", "logs-2"]
    assert routes.route(state, state.queues, "amq.direct", "q", {}) == []  # a built-in, nothing bound
    for exchange, code in (("nope", 404), ("hidden", 403)):
        with pytest.raises(ChannelError) as info:
            routes.route(state, state.queues, exchange, "q", {})
        assert info.value.code == code
    with pytest.raises(ConnectionFault) as fault:
        routes.check_exchange_type("x", "x-consistent-hash")
    assert fault.value.code == 503
    routes.check_exchange_type("x", "headers")
    assert routes.dead_letter_options("", "dlq", "q") == {"dead_letter": "dlq"}
    assert routes.dead_letter_options("dlx", None, "q") == {"dead_letter_exchange": "dlx"}
    assert routes.dead_letter_options("dlx", "k", "q") == {
        "dead_letter_exchange": "dlx", "dead_letter_routing_key": "k"}
    with pytest.raises(ChannelError) as info:
        routes.dead_letter_options("", None, "q")
    assert info.value.code == 406
