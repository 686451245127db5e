"""A ``Queue.Declare``'s arguments as Baton's queue options, and Baton's errors as AMQP
reply codes (docs/amqp.md)."""

from __future__ import annotations

from typing import Any

from batonmq.broker import amqp_routes as routes
from batonmq.broker.amqp_codec import ChannelError
from batonmq.cluster.errors import (
    AccessRefused,
    BatonError,
    ExchangeNotFound,
    InvalidArgument,
    LimitExceeded,
    MessageTooLarge,
    PreconditionFailed,
    QueueExists,
    QueueFull,
    QueueNotFound,
    UnknownConsumer,
)
from batonmq.cluster.queue_state import MAX_PRIORITY

__all__ = ["error_code", "queue_options", "refusal_text"]

#: Every Baton queue is replicated, quorum-like; "stream" is accepted as such a queue
#: (not an append-only log: a consumed message leaves it; Basic.Consume's
#: x-stream-offset is refused), so that applications that declare one start
#: (docs/amqp.md).
_QUEUE_TYPES = ("quorum", "classic", "stream")
#: RabbitMQ queue arguments Baton has no equivalent of: refused, not ignored.
_REFUSED_ARGUMENTS = ("x-max-length-bytes",)


def error_code(exc: BatonError) -> int:
    """The AMQP reply code of a Baton error a channel method met."""
    match exc:
        case QueueNotFound() | ExchangeNotFound():
            return 404
        case AccessRefused():
            return 403
        case PreconditionFailed() | InvalidArgument() | QueueFull() | MessageTooLarge() | LimitExceeded() | UnknownConsumer():
            return 406
    return 541


#: A queue setting's AMQP argument, and its value as that argument has it (None: the
#: setting has no argument of its own; its Baton name is given).
_AMQP_ARGUMENTS: dict[str, tuple[str, Any]] = {
    "durable": ("durable", lambda v: v),
    "max_length": ("x-max-length", lambda v: v),
    "overflow": ("x-overflow", lambda v: v),
    # x-delivery-limit N is delivery_limit N + 1 (queue_options)
    "delivery_limit": ("x-delivery-limit", lambda v: None if v is None else v - 1),
    "message_ttl_ms": ("x-message-ttl", lambda v: v),
    "expires_ms": ("x-expires", lambda v: v),
    "max_priority": ("x-max-priority", lambda v: v),
    "single_active_consumer": ("x-single-active-consumer", lambda v: v),
    "dead_letter_exchange": ("x-dead-letter-exchange", lambda v: v),
    "dead_letter_routing_key": ("x-dead-letter-routing-key", lambda v: v),
}


def refusal_text(exc: BatonError, queue: str | None = None) -> str:
    """A Baton error's text as an AMQP client reads it: a queue that exists with other
    settings as RabbitMQ says it (``inequivalent arg 'x-max-length' for queue 'q' in
    vhost '/': received 10 but current is none``), naming the first that differs."""
    if isinstance(exc, QueueExists) and exc.differing and queue is not None:
        name, have, want = exc.differing[0]
        arg, shown = _AMQP_ARGUMENTS.get(name, (name, lambda v: v))

        def text(v: Any) -> str:
            v = shown(v)
            return "none" if v is None else repr(v)

        return (
            f"inequivalent arg '{arg}' for queue '{queue}' in vhost '/': received"
            f" {text(want)} but current is {text(have)}"
        )
    return exc.message


def queue_options(queue: str, arguments: dict[str, Any], durable: bool) -> dict[str, Any]:
    """Baton's declare options for a ``Queue.Declare``'s arguments (docs/amqp.md).

    Raises:
        ChannelError: 406, an argument Baton does not have, or a bad value.
    """
    options: dict[str, Any] = {"durable": bool(durable)}

    def number(key: str) -> int:
        value = arguments[key]
        if type(value) is not int:
            raise ChannelError(406, f"invalid arg '{key}' for queue '{queue}': must be an integer")
        return value

    kind = arguments.get("x-queue-type")
    if kind is not None and kind not in _QUEUE_TYPES:
        raise ChannelError(
            406, f"invalid arg 'x-queue-type' for queue '{queue}': unknown queue type '{kind}'"
        )
    for key in _REFUSED_ARGUMENTS:
        if key in arguments:
            raise ChannelError(406, f"arg '{key}' for queue '{queue}' is not supported by Baton")
    if "x-delivery-limit" in arguments:
        # RabbitMQ dead-letters a message returned *more* than x-delivery-limit times;
        # Baton when its failures reach delivery_limit: one more gives the same count.
        limit = number("x-delivery-limit")
        if limit < 0:
            raise ChannelError(
                406, f"invalid arg 'x-delivery-limit' for queue '{queue}': Baton's queues"
                " always have a delivery limit (it cannot be turned off)"
            )
        options["delivery_limit"] = limit + 1
    if "x-message-ttl" in arguments:
        ttl = number("x-message-ttl")
        if ttl < 0:
            raise ChannelError(
                406, f"invalid arg 'x-message-ttl' for queue '{queue}': {ttl} is negative"
            )
        # RabbitMQ's 0 is "expire unless delivered at once". Baton's TTL is a periodic
        # check through the log (expiry_interval), so its closest is 1 ms: a message a
        # waiting consumer does not take before the next check expires (docs/amqp.md).
        options["message_ttl_ms"] = max(ttl, 1)
    if "x-expires" in arguments:
        # The queue is deleted once unused this long (needs the flag queue_expiry:
        # declare_event says so); RabbitMQ refuses 0 and negative values alike.
        expires = number("x-expires")
        if expires < 1:
            raise ChannelError(
                406, f"invalid arg 'x-expires' for queue '{queue}': {expires} is not positive"
            )
        options["expires_ms"] = expires
    if "x-max-length" in arguments:
        options["max_length"] = number("x-max-length")
    if "x-max-priority" in arguments:
        # RabbitMQ allows 1..255 (0: none); Baton's queues have 0..9: a larger maximum
        # is Baton's, and a message's priority above it counts as the top one.
        top = number("x-max-priority")
        if not 0 <= top <= 255:
            raise ChannelError(
                406, f"invalid arg 'x-max-priority' for queue '{queue}': must be 0..255"
            )
        options["max_priority"] = min(top, MAX_PRIORITY)
    overflow = arguments.get("x-overflow")
    if overflow is not None:
        if overflow not in ("reject-publish", "drop-head"):
            raise ChannelError(
                406, f"invalid arg 'x-overflow' for queue '{queue}': {overflow!r} (Baton has"
                " reject-publish and drop-head)"
            )
        options["overflow"] = overflow
    sac = arguments.get("x-single-active-consumer")
    if sac is not None:
        options["single_active_consumer"] = bool(sac)
    if "x-dead-letter-exchange" in arguments:
        options.update(routes.dead_letter_options(
            arguments["x-dead-letter-exchange"], arguments.get("x-dead-letter-routing-key"), queue
        ))
    return options
