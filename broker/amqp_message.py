"""An AMQP message's properties as Baton message headers, and back (docs/amqp.md).

A Baton message is a body and a map of headers (msgpack values). An AMQP 0-9-1 message
has a body, a table of application headers and thirteen fixed properties. Stored in
Baton:

* the application headers are the message's headers, key for key, so a Baton-native
  consumer reads them as it reads any header;
* the fixed properties that are set go under one header, :data:`PROPERTIES_KEY`
  (``"amqp-properties"``), a map keyed by the property's AMQP name (``content_type``,
  ``correlation_id``, ``reply_to``, ``delivery_mode``, ``timestamp`` in seconds, ...).

An AMQP consumer gets both back as they were sent, whatever broker of the cluster took
the publish. Values msgpack has no type for are converted once, when published: a
decimal becomes its text and a timestamp inside the headers table its seconds.
Delivery adds ``x-delivery-count`` and ``x-acquired-count`` to the headers table when
they are above 0, as RabbitMQ's quorum queues do.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from typing import Any, Final

from pamqp import commands

__all__ = [
    "PROPERTIES_KEY",
    "PROPERTY_NAMES",
    "Properties",
    "encode_table",
    "properties_bytes",
    "route_of",
    "to_headers",
    "to_properties",
]

#: The Baton header that holds an AMQP message's fixed properties.
PROPERTIES_KEY: Final = "amqp-properties"
#: The fixed properties kept (AMQP's ``type`` is pamqp's ``message_type``; cluster-id
#: is deprecated and dropped).
PROPERTY_NAMES: Final = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "message_type",
    "user_id",
    "app_id",
)
_INT64: Final = 1 << 63
#: Where the exchange and routing key of a publish to another exchange than the default
#: one are kept, beside the fixed properties (not properties themselves).
ROUTE_EXCHANGE: Final = "exchange"
ROUTE_KEY: Final = "routing_key"


def _to_baton(value: Any) -> Any:
    """An AMQP field value as a msgpack one."""
    if isinstance(value, dict):
        return {str(k): _to_baton(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_baton(v) for v in value]
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    return value


def _to_amqp(value: Any) -> Any:
    """A msgpack value as an AMQP field value (keys are strings; integers beyond 64
    bits signed, which a field table cannot hold, as text)."""
    if isinstance(value, dict):
        return {str(k): _to_amqp(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_amqp(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -_INT64 <= value < _INT64:
        return str(value)
    return value


def _short(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")[:255]
    return bytes((len(data),)) + data


def _field(value: Any) -> bytes:
    """One field value, typed as RabbitMQ writes them (doubles as ``d``, integers as
    ``I`` or ``l``, binary as ``x``)."""
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        if -(1 << 31) <= value < 1 << 31:
            return b"I" + struct.pack(">i", value)
        if -_INT64 <= value < _INT64:
            return b"l" + struct.pack(">q", value)
        return _field(str(value))
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        return b"S" + struct.pack(">I", len(data)) + data
    if isinstance(value, (bytes, bytearray)):
        return b"x" + struct.pack(">I", len(value)) + bytes(value)
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, list):
        items = b"".join(_field(v) for v in value)
        return b"A" + struct.pack(">I", len(items)) + items
    if isinstance(value, datetime.datetime):
        return b"T" + struct.pack(">Q", max(0, int(value.timestamp())))
    if value is None:
        return b"V"
    return _field(str(value))


def encode_table(table: dict[str, Any]) -> bytes:
    """A field table's bytes (with its length). Written here rather than by pamqp,
    which writes every float as a single-precision ``f`` (a double a client sent would
    lose digits, or fail to encode) and has no form for ``bytes``."""
    body = b"".join(_short(str(k)) + _field(v) for k, v in table.items())
    return struct.pack(">I", len(body)) + body


class Properties(commands.Basic.Properties):
    """``Basic.Properties`` whose headers table is written by :func:`encode_table`."""

    def encode_property(self, name: str, value: Any) -> bytes:
        if name == "headers" and isinstance(value, dict):
            return encode_table(value)
        return super().encode_property(name, value)


def to_headers(
    properties: commands.Basic.Properties, exchange: str = "", routing_key: str = ""
) -> dict[str, Any]:
    """The Baton headers that keep a published message's properties, and, when it was
    published to another exchange than the default one, that exchange and its routing
    key (for its deliveries' ``Basic.Deliver``)."""
    headers: dict[str, Any] = {}
    table = properties.headers
    if table:
        headers.update((str(k), _to_baton(v)) for k, v in table.items())
    fixed: dict[str, Any] = {}
    for name in PROPERTY_NAMES:
        value = getattr(properties, name)
        if value is None or value == "":
            continue
        fixed[name] = _to_baton(value)
    if exchange:
        fixed[ROUTE_EXCHANGE] = exchange
        fixed[ROUTE_KEY] = routing_key
    if fixed:
        headers[PROPERTIES_KEY] = fixed
    else:
        headers.pop(PROPERTIES_KEY, None)  # (never a client's header of that name)
    return headers


def route_of(headers: dict[str, Any], queue: str) -> tuple[str, str]:
    """The exchange and routing key a stored message is delivered with: those it was
    published to, as :func:`to_headers` kept them; else the default exchange and the
    queue's name (a publish to the default exchange, or by a Baton client).

    A dead letter is delivered as RabbitMQ delivers it: from the dead-letter exchange,
    with ``x-dead-letter-routing-key`` or else the key it was published with (the
    state wrote both as ``x-death-exchange`` and ``x-death-routing-key`` when it
    routed it); from a dead-letter queue named through the default exchange, with
    that queue's name (the ``x-dead-letter-routing-key``)."""
    died_in = headers.get("x-death-queue")
    if isinstance(died_in, str):
        exchange = headers.get("x-death-exchange")
        key = headers.get("x-death-routing-key")
        # (x-last-death-queue is written only by a death through an exchange: if it
        # is not the latest death's queue, that one went to a queue by name)
        if (isinstance(exchange, str) and isinstance(key, str)
                and headers.get("x-last-death-queue") == died_in):
            return exchange, key
        return "", queue
    fixed = headers.get(PROPERTIES_KEY)
    if isinstance(fixed, dict):
        exchange = fixed.get(ROUTE_EXCHANGE)
        key = fixed.get(ROUTE_KEY)
        if isinstance(exchange, str) and isinstance(key, str):
            return exchange, key
    return "", queue


def to_properties(headers: dict[str, Any], extra: dict[str, Any]) -> Properties:
    """The properties a delivered message is sent with: what :func:`to_headers` kept,
    and ``extra`` (the delivery's counters) in its headers table. A message a Baton
    client published has no fixed properties: its headers are the table."""
    table: dict[str, Any] = {}
    fixed: Any = None
    for k, v in headers.items():
        if k == PROPERTIES_KEY:
            fixed = v
        else:
            table[str(k)] = _to_amqp(v)
    table.update(extra)
    props = Properties(headers=table or None)
    if isinstance(fixed, dict):
        for name in PROPERTY_NAMES:
            value = fixed.get(name)
            if value is None:
                continue
            if name == "timestamp":
                if isinstance(value, int) and 0 <= value < 253402300800:  # (year 9999)
                    props.timestamp = datetime.datetime.fromtimestamp(value, tz=datetime.UTC)
            elif name in ("delivery_mode", "priority"):
                if isinstance(value, int) and 0 <= value <= 255:
                    setattr(props, name, value)
            elif isinstance(value, str) and len(value.encode()) <= 255:
                setattr(props, name, value)
    return props


# The property flags of a content header, in the order the properties are written
# (AMQP 0-9-1, Basic class); headers are third.
_FLAGS: Final = (
    ("content_type", 1 << 15, "s"),
    ("content_encoding", 1 << 14, "s"),
    ("headers", 1 << 13, "F"),
    ("delivery_mode", 1 << 12, "o"),
    ("priority", 1 << 11, "o"),
    ("correlation_id", 1 << 10, "s"),
    ("reply_to", 1 << 9, "s"),
    ("expiration", 1 << 8, "s"),
    ("message_id", 1 << 7, "s"),
    ("timestamp", 1 << 6, "T"),
    ("message_type", 1 << 5, "s"),
    ("user_id", 1 << 4, "s"),
    ("app_id", 1 << 3, "s"),
)


def properties_bytes(headers: dict[str, Any], extra: dict[str, Any]) -> bytes:
    """The property flags and values of a delivered message's content header: the same
    properties as :func:`to_properties`, written directly (delivery's hot path; pamqp's
    generic marshalling cost more than the rest of a delivery)."""
    table: dict[str, Any] = {}
    fixed: Any = None
    for k, v in headers.items():
        if k == PROPERTIES_KEY:
            fixed = v
        else:
            table[str(k)] = _to_amqp(v)
    table.update(extra)
    if not isinstance(fixed, dict):
        fixed = {}
    flags = 0
    parts: list[bytes] = []
    for name, bit, kind in _FLAGS:
        if kind == "F":
            if table:
                flags |= bit
                parts.append(encode_table(table))
            continue
        value = fixed.get(name)
        if value is None:
            continue
        if kind == "s":
            if not isinstance(value, str) or not value:
                continue
            data = value.encode("utf-8", "surrogatepass")
            if len(data) > 255:
                continue
            parts.append(bytes((len(data),)) + data)
        elif kind == "o":
            if type(value) is not int or not 0 <= value <= 255:
                continue
            parts.append(bytes((value,)))
        else:  # a timestamp, seconds
            if type(value) is not int or not 0 <= value < 253402300800:
                continue
            parts.append(struct.pack(">Q", value))
        flags |= bit
    return struct.pack(">H", flags) + b"".join(parts)
