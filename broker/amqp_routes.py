"""Where an AMQP publish goes: exchanges and bindings, as far as Baton has them.

The one seam between the AMQP edge (broker/amqp_channel.py) and exchanges: every
exchange method and every publish's routing go through the functions here. Today
Baton has the default exchange only (``""``: the routing key names the queue, every
queue is bound to it by its name, as in RabbitMQ); any other exchange is unknown
(404 NOT_FOUND, the channel closes) and declaring one is refused with 540
NOT_IMPLEMENTED. Replicated exchanges and bindings replace these bodies, not their
callers.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from batonmq.broker.amqp_codec import ChannelError, ConnectionFault

__all__ = [
    "DEFAULT_EXCHANGE",
    "bind_queue",
    "dead_letter_queue",
    "declare_exchange",
    "delete_exchange",
    "route",
]

DEFAULT_EXCHANGE = ""


def _unknown(exchange: str) -> ChannelError:
    return ChannelError(
        404, f"no exchange '{exchange}' in vhost '/' (Baton has the default exchange only)"
    )


def route(queues: Container[str], exchange: str, routing_key: str) -> list[str]:
    """The queues a message published to ``exchange`` with ``routing_key`` goes to
    (none: unroutable), given the queues that exist.

    Raises:
        ChannelError: 404, no such exchange.
    """
    if exchange != DEFAULT_EXCHANGE:
        raise _unknown(exchange)
    return [routing_key] if routing_key in queues else []


def declare_exchange(exchange: str, kind: str, passive: bool, arguments: dict[str, Any]) -> None:
    """``Exchange.Declare``.

    Raises:
        ChannelError: 403 on the default exchange; 404 for a passive declare of
            another.
        ConnectionFault: 540, declaring an exchange (not built yet).
    """
    if exchange == DEFAULT_EXCHANGE or exchange.startswith("amq."):
        if passive and exchange == DEFAULT_EXCHANGE:
            return
        raise ChannelError(403, f"operation not permitted on the exchange '{exchange}'")
    if passive:
        raise _unknown(exchange)
    raise ConnectionFault(
        540, f"declaring exchanges is not supported yet ('{exchange}' of type '{kind}'):"
        " publish to the default exchange, with the queue's name as routing key",
        (40, 10),
    )


def delete_exchange(exchange: str) -> None:
    """``Exchange.Delete``.

    Raises:
        ChannelError: 403 on the default exchange, 404 on any other.
    """
    if exchange == DEFAULT_EXCHANGE:
        raise ChannelError(403, "operation not permitted on the default exchange")
    raise _unknown(exchange)


def bind_queue(queue: str, exchange: str, routing_key: str, bind: bool) -> None:
    """``Queue.Bind`` (``bind``) or ``Queue.Unbind`` of ``queue``.

    Raises:
        ChannelError: 403 on the default exchange (its bindings are implicit), 404 on
            any other.
    """
    if exchange == DEFAULT_EXCHANGE:
        raise ChannelError(
            403, f"operation not permitted on the default exchange (queue '{queue}')"
        )
    raise _unknown(exchange)


def dead_letter_queue(exchange: str, routing_key: str | None, queue: str) -> str:
    """The queue a queue's dead letters go to, from its ``x-dead-letter-exchange`` and
    ``x-dead-letter-routing-key``.

    Raises:
        ChannelError: 406: another exchange than the default one, or no routing key
            (the message's own key would name ``queue`` itself).
    """
    if exchange != DEFAULT_EXCHANGE:
        raise ChannelError(
            406, f"x-dead-letter-exchange '{exchange}' for queue '{queue}': dead letters go"
            " through the default exchange only (x-dead-letter-exchange ''), to the queue"
            " x-dead-letter-routing-key names",
        )
    if not routing_key:
        raise ChannelError(
            406, f"queue '{queue}': x-dead-letter-exchange '' needs x-dead-letter-routing-key"
            " (the dead-letter queue's name)",
        )
    return routing_key
