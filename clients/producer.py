"""The publishing side of a connection: Publish, PublishBatch and idempotency keys.

Every publish carries an idempotency key: by default a random id of the connection
and a counter (docs/client.md), so that a publish re-sent after a failover is
enqueued once. :class:`Producer` depends on its connection only through
:class:`ProducerChannel`; :class:`~batonmq.clients.client.Connection` documents the calls.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final, Protocol

from batonmq.cluster.errors import InvalidArgument, MessageTooLarge
from batonmq.cluster.results import Enqueued, Published, Routed
from batonmq.clients.results import consume_result
from batonmq.clients.wire import (
    MAX_BATCH_MESSAGES,
    MAX_FRAME_ELEMENTS,
    Frame,
    Publish,
    PublishBatch,
    PublishTo,
    frame_elements,
    read_result,
)

# The values of one batch frame's messages at most: the broker's bound, less room for
# the frame's other fields (its options).
_BATCH_ELEMENTS = MAX_FRAME_ELEMENTS - 1024

__all__ = ["ProducerChannel", "Producer", "publish_options"]

_EMPTY_HEADERS: Final[dict[str, Any]] = {}
#: The options of a publish that uses none of the work-queue features (never mutated).
NO_OPTIONS: Final[dict[str, Any]] = {}


def publish_options(
    delay: float | None = None,
    not_before: float | datetime | None = None,
    priority: int | None = None,
    ttl: float | None = None,
) -> dict[str, Any]:
    """The Publish frame's options for these arguments (see :meth:`Connection.publish`).

    Raises:
        InvalidArgument: a negative delay, time or ttl, a priority outside 0..9, or a
            value of the wrong type.
    """
    if delay is None and not_before is None and not priority and ttl is None:
        return NO_OPTIONS
    options: dict[str, Any] = {}
    if ttl is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl < 0:
            raise InvalidArgument(f"ttl must be a non-negative number of seconds, got {ttl!r}")
        options["ttl_ms"] = int(ttl * 1000)
    if priority:
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
            raise InvalidArgument(f"priority must be an int 0..9, got {priority!r}")
        options["priority"] = priority
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
            raise InvalidArgument(f"delay must be a non-negative number of seconds, got {delay!r}")
        options["delay_ms"] = int(delay * 1000)
    if not_before is not None:
        if isinstance(not_before, datetime):
            if not_before.tzinfo is None:
                raise InvalidArgument("not_before must be an aware datetime (with a tzinfo)")
            stamp = not_before.timestamp()
        elif isinstance(not_before, bool) or not isinstance(not_before, (int, float)):
            raise InvalidArgument(f"not_before must be a datetime or epoch seconds, got {not_before!r}")
        else:
            stamp = float(not_before)
        if stamp < 0:
            raise InvalidArgument("not_before must not be before the epoch")
        options["not_before"] = int(stamp * 1000)
    return options


class ProducerChannel(Protocol):
    """What a :class:`Producer` needs of its connection (``conn.Channel`` implements it)."""

    @property
    def max_frame(self) -> int:
        """The largest frame the broker accepts, in bytes."""
        ...

    @property
    def max_message(self) -> int:
        """The largest message body the broker accepts, in bytes."""
        ...

    @property
    def writable(self) -> asyncio.Event:
        """Set while the transport takes writes (flow control)."""
        ...

    async def wait_writable(self) -> None:
        """Wait while the transport's buffer is above its high-water mark."""
        ...

    def next_corr(self) -> int:
        """The next correlation id."""
        ...

    def encode(self, frame: Frame) -> bytes:
        """Encode a frame for this connection."""
        ...

    def send_encoded(
        self, corr: int, data: bytes, retry: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """Write an encoded command; return the future its Ok/Error settles."""
        ...

    def request(
        self, frame: Frame, corr: int, retry: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """Write a command frame; return the future its Ok/Error settles."""
        ...


class Producer:
    """Publishes on one connection (see :meth:`Connection.publish` and
    :meth:`Connection.publish_batch` for the calls' contract)."""

    __slots__ = ("_channel", "_key_prefix", "_key_seq")

    def __init__(self, channel: ProducerChannel) -> None:
        self._channel = channel
        # Idempotency keys: a random id per connection and a counter (docs/client.md).
        self._key_prefix = secrets.token_hex(8) + ":"
        self._key_seq = 0

    def new_key(self) -> str:
        """A fresh idempotency key of this connection (a routed publish keeps it when
        it is sent again to another replica)."""
        self._key_seq += 1
        return f"{self._key_prefix}{self._key_seq:x}"

    async def publish(
        self,
        queue: str,
        body: bytes | bytearray | memoryview,
        headers: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        options: dict[str, Any] = NO_OPTIONS,
    ) -> int:
        """Publish one message and wait until the broker confirms it (``options``: from
        :func:`publish_options`).

        Returns:
            The message's position in the queue.

        Raises:
            See :meth:`Connection.publish`.
        """
        channel = self._channel
        data = _body(body)
        if len(data) > channel.max_message:
            raise MessageTooLarge(
                f"body of {len(data)} bytes is above the broker's maximum of {channel.max_message}"
            )
        hdrs = _headers(headers)
        key = self.new_key() if idempotency_key is None else _key(idempotency_key)
        if not channel.writable.is_set():
            await channel.wait_writable()
        corr = channel.next_corr()
        result = await channel.request(
            Publish(corr, queue, data, hdrs, key, options), corr, retry=True
        )
        return read_result(Published, result).position

    async def publish_to(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | bytearray | memoryview,
        headers: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        options: dict[str, Any] = NO_OPTIONS,
    ) -> Routed:
        """Publish one message through an exchange (see :meth:`Connection.publish_to`)."""
        channel = self._channel
        data = _body(body)
        if len(data) > channel.max_message:
            raise MessageTooLarge(
                f"body of {len(data)} bytes is above the broker's maximum of {channel.max_message}"
            )
        hdrs = _headers(headers)
        key = self.new_key() if idempotency_key is None else _key(idempotency_key)
        if not channel.writable.is_set():
            await channel.wait_writable()
        corr = channel.next_corr()
        result = await channel.request(
            PublishTo(corr, exchange, routing_key, data, hdrs, key, options), corr, retry=True
        )
        return read_result(Routed, result)

    async def publish_batch(
        self,
        queue: str,
        messages: Iterable[bytes | bytearray | memoryview | tuple[bytes, Mapping[str, Any]]],
        *,
        idempotency_key: str | None = None,
        options: dict[str, Any] = NO_OPTIONS,
    ) -> list[int]:
        """Publish many messages in as few PublishBatch frames as fit, and wait until
        all are confirmed (``options``: from :func:`publish_options`).

        Returns:
            The positions of the messages, in order.

        Raises:
            See :meth:`Connection.publish_batch`.
        """
        channel = self._channel
        limit = max(1, channel.max_frame // 2)
        max_message = channel.max_message
        chunks: list[list[list[Any]]] = []
        chunk: list[list[Any]] = []
        size = elements = 0
        for item in messages:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise InvalidArgument("a batch item must be a body or a (body, headers) pair")
                data, hdrs = _body(item[0]), _headers(item[1])
            else:
                data, hdrs = _body(item), _EMPTY_HEADERS
            if len(data) > max_message:
                raise MessageTooLarge(
                    f"body of {len(data)} bytes is above the broker's maximum of {max_message}"
                )
            cost = len(data) + (16 + 64 * len(hdrs) if hdrs else 8)
            # The broker refuses a frame of more messages or msgpack values than
            # these while it decodes it (docs/protocol.md "Limits").
            values = 3 + (frame_elements(hdrs) if hdrs else 0)
            if chunk and (
                size + cost > limit
                or len(chunk) >= MAX_BATCH_MESSAGES
                or elements + values > _BATCH_ELEMENTS
            ):
                chunks.append(chunk)
                chunk, size, elements = [], 0, 0
            chunk.append([data, hdrs])
            size += cost
            elements += values
        if chunk:
            chunks.append(chunk)
        if not chunks:
            return []
        # Encode every frame first, so that a bad header fails before anything is sent.
        base = None if idempotency_key is None else _key(idempotency_key)
        encoded: list[tuple[int, bytes]] = []
        for i, part in enumerate(chunks):
            corr = channel.next_corr()
            if base is None:
                key = self.new_key()
            else:
                key = base if len(chunks) == 1 else f"{base}#{i}"
            encoded.append((corr, channel.encode(PublishBatch(corr, queue, part, key, options))))
        futures: list[asyncio.Future[dict[str, Any]]] = []
        try:
            for corr, data in encoded:
                if not channel.writable.is_set():
                    await channel.wait_writable()
                futures.append(channel.send_encoded(corr, data, retry=True))
        finally:
            if len(futures) < len(encoded):
                for fut in futures:  # we will not await them: keep their errors quiet
                    fut.add_done_callback(consume_result)
        results = await asyncio.gather(*futures, return_exceptions=True)
        positions: list[int] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            batch = read_result(Enqueued, result)
            first = batch.first_position
            positions.extend(range(first, first + batch.count))
        return positions



def _body(body: object) -> bytes:
    if type(body) is bytes:
        return body
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise InvalidArgument(f"message body must be bytes, got {type(body).__name__}")


def _headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    if headers is None:
        return _EMPTY_HEADERS
    if type(headers) is dict:
        return headers
    if isinstance(headers, Mapping):
        return dict(headers)
    raise InvalidArgument(f"headers must be a mapping, got {type(headers).__name__}")


def _key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidArgument("idempotency_key must be a non-empty str")
    return key
