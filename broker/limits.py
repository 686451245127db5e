"""What a client's command may hold, checked before it goes to the log.

The replicated state checks its events when they are applied (cluster/queues.py), but
by then the event is on the log of every broker: an invalid command must be refused
here, at the session, so that it never grows the log (docs/security.md). Every check
raises :class:`~batonmq.cluster.errors.InvalidArgument` with one clear line.

:func:`check_event` is the one place that knows what each event carries from the
client: a new event, or a new field of one, gets its check there.
"""

from __future__ import annotations

from typing import Any, Final

from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import (
    Bind,
    BindExchange,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    Enqueue,
    Event,
    RoutedEnqueue,
    Unbind,
    UnbindExchange,
)

__all__ = [
    "MAX_HEADER_DEPTH",
    "MAX_KEY_BYTES",
    "MAX_NAME_BYTES",
    "check_event",
    "check_headers",
    "check_key",
    "check_name",
]

#: Longest queue (and dead-letter queue, and exchange) name, in UTF-8 bytes.
MAX_NAME_BYTES: Final = 255
#: Longest publish idempotency key (and routing key, as AMQP's shortstr), in UTF-8 bytes.
MAX_KEY_BYTES: Final = 255
#: Deepest nesting of maps and arrays inside a message's headers (the headers map
#: itself is level 1).
MAX_HEADER_DEPTH: Final = 32


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def check_name(what: str, name: str) -> None:
    """Refuse an empty or overlong queue name.

    Args:
        what: how the error names it ("queue name", "dead-letter queue name").

    Raises:
        InvalidArgument: empty, or above :data:`MAX_NAME_BYTES` bytes.
    """
    if not name:
        raise InvalidArgument(f"{what} must not be empty")
    size = _size(name)
    if size > MAX_NAME_BYTES:
        raise InvalidArgument(f"{what} of {size} bytes is above the maximum of {MAX_NAME_BYTES}")


def check_key(key: str, what: str = "publish key") -> None:
    """Refuse an overlong publish idempotency key ("" is no key), or routing key.

    Raises:
        InvalidArgument: above :data:`MAX_KEY_BYTES` bytes.
    """
    size = _size(key)
    if size > MAX_KEY_BYTES:
        raise InvalidArgument(
            f"{what} of {size} bytes is above the maximum of {MAX_KEY_BYTES}"
        )


def check_headers(headers: dict[str, Any]) -> None:
    """Refuse headers nested deeper than :data:`MAX_HEADER_DEPTH`.

    The walk is iterative: the decoder accepts nesting deeper than Python's recursion
    limit, so a recursive check (or encoder) would fail on it with a RecursionError.

    Raises:
        InvalidArgument: nested too deep.
    """
    stack: list[tuple[Any, int]] = [(headers, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_HEADER_DEPTH:
            raise InvalidArgument(
                f"headers are nested more than {MAX_HEADER_DEPTH} levels deep"
            )
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, (dict, list)))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value if isinstance(v, (dict, list)))


def check_event(event: Event[Any]) -> None:
    """Check what a client put into an event before it is submitted to the log.

    Raises:
        InvalidArgument: a name, key or headers above the limits.
    """
    match event:
        case Enqueue():
            check_name("queue name", event.queue)
            for key, _ in event.keys:
                check_key(key)
            for _, headers in event.messages:
                check_headers(headers)
        case RoutedEnqueue():
            if not event.queues or not event.messages:
                # (such a record would not decode: its command would never complete)
                raise InvalidArgument("a routed publish needs a queue and a message")
            for queue in event.queues:
                check_name("queue name", queue)
            check_key(event.routing_key, "routing key")
            for key, _ in event.keys:
                check_key(key)
            for _, headers in event.messages:
                check_headers(headers)
        case DeclareQueue():
            check_name("queue name", event.queue)
            if event.dead_letter is not None:
                check_name("dead-letter queue name", event.dead_letter)
            if event.dead_letter_exchange:
                check_name("dead-letter exchange name", event.dead_letter_exchange)
            if event.dead_letter_routing_key is not None:
                check_key(event.dead_letter_routing_key, "dead-letter routing key")
        case DeclareExchange() | DeleteExchange():
            check_name("exchange name", event.exchange)
            if isinstance(event, DeclareExchange):
                check_headers(event.arguments)
        case Bind() | Unbind():
            check_name("queue name", event.queue)
            check_name("exchange name", event.exchange)
            check_key(event.routing_key, "routing key")
            check_headers(event.arguments)
        case BindExchange() | UnbindExchange():
            check_name("exchange name", event.destination)
            check_name("exchange name", event.source)
            check_key(event.routing_key, "routing key")
            check_headers(event.arguments)
        case _:
            name = getattr(event, "queue", None)
            if isinstance(name, str):
                check_name("queue name", name)
