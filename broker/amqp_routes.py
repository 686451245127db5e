"""Where an AMQP publish goes: exchanges and bindings, for the AMQP edge.

The one seam between the AMQP edge (broker/amqp_channel.py) and Baton's replicated
exchanges (cluster/exchanges.py, broker/exchanges.py): every exchange method and every
publish's routing go through the functions here, which turn the exchange layer's
answers and errors into AMQP's (reply codes, and the RabbitMQ habits an AMQP client
expects: deleting a missing exchange or unbinding a missing binding is not an error).

A publish is routed on the broker that received it, from the state it has applied;
one routed to several queues is one atomic append (``RoutedEnqueue``).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from batonmq.broker.amqp_codec import ChannelError, ConnectionFault
from batonmq.cluster.errors import ExchangeNotFound
from batonmq.cluster.exchanges import DEFAULT_EXCHANGE
from batonmq.cluster.routing import EXCHANGE_TYPES
from batonmq.cluster.state import State

__all__ = [
    "DEFAULT_EXCHANGE",
    "check_exchange_type",
    "dead_letter_options",
    "not_found",
    "route",
]


def not_found(exchange: str) -> ChannelError:
    """The 404 of an exchange that does not exist."""
    return ChannelError(404, f"no exchange '{exchange}' in vhost '/'")


def route(
    state: State, queues: Container[str], exchange: str, routing_key: str,
    headers: Mapping[str, Any],
) -> list[str]:
    """The queues a message published to ``exchange`` with ``routing_key`` (and, for a
    headers exchange, ``headers``) goes to, by the state applied here (none:
    unroutable); ``queues``: the queues that exist here (of every partition).

    Raises:
        ChannelError: 404, no such exchange; 403, an internal exchange.
    """
    if exchange != DEFAULT_EXCHANGE:
        ex = state.exchanges.get(exchange)
        if ex is None:
            raise not_found(exchange)
        if ex.internal:
            raise ChannelError(
                403, f"cannot publish to internal exchange '{exchange}' in vhost '/'"
            )
    try:
        return state.exchanges.route(exchange, routing_key, headers, queues)
    except ExchangeNotFound:
        raise not_found(exchange) from None


def check_exchange_type(exchange: str, kind: str) -> None:
    """An ``Exchange.Declare``'s type, before anything else (as RabbitMQ: an unknown
    type is a connection error).

    Raises:
        ConnectionFault: 503 COMMAND_INVALID, a type Baton does not have.
    """
    if kind not in EXCHANGE_TYPES:
        raise ConnectionFault(
            503, f"invalid exchange type '{kind}' for exchange '{exchange}' (Baton has"
            f" {', '.join(EXCHANGE_TYPES)})",
            (40, 10),
        )


def dead_letter_options(exchange: Any, routing_key: Any, queue: str) -> dict[str, Any]:
    """Baton's declare options for a queue's ``x-dead-letter-exchange`` and
    ``x-dead-letter-routing-key``.

    The default exchange with a routing key names the dead-letter queue (Baton's
    ``dead_letter``); any other exchange routes dead letters through its bindings when
    they die, by ``routing_key`` or else the key each message was published with.

    Raises:
        ChannelError: 406, values that are not strings, or the default exchange without
            a routing key (each message's own key would name ``queue`` itself).
    """
    if not isinstance(exchange, str) or not (routing_key is None or isinstance(routing_key, str)):
        raise ChannelError(406, f"invalid dead-letter arguments for queue '{queue}'")
    if exchange != DEFAULT_EXCHANGE:
        options: dict[str, Any] = {"dead_letter_exchange": exchange}
        if routing_key is not None:
            options["dead_letter_routing_key"] = routing_key
        return options
    if not routing_key:
        raise ChannelError(
            406, f"queue '{queue}': x-dead-letter-exchange '' needs x-dead-letter-routing-key"
            " (the dead-letter queue's name)",
        )
    return {"dead_letter": routing_key}
