"""AMQP 0-9-1 framing, sans-IO: bytes in, frames out (docs/amqp.md).

:class:`AmqpCodec` is fed the bytes read from a client (:meth:`~AmqpCodec.receive_data`)
and hands back what they hold, one item at a time (:meth:`~AmqpCodec.next_event`):
the protocol header, a method on a channel, a whole published message (the
``Basic.Publish`` method, its content header and its body frames put together), a
heartbeat. It does no I/O and keeps no clock, like the native codec
(``clients/wire.py``), so it is unit-tested and fuzzed on its own
(loadtest/fuzz.py). The methods and the content header are decoded and encoded by
``pamqp`` (the codec aio-pika's aiormq uses); this module does the framing around
it: sizes, frame ends, content assembly per channel, and the errors a broker
answers with.

A framing error raises :class:`FrameError` with its AMQP reply code (501
FRAME_ERROR, 502 SYNTAX_ERROR, 503 COMMAND_INVALID, 505 UNEXPECTED_FRAME): the
connection is then closed with that code, nothing after it is read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from pamqp import base, commands, header
from pamqp import encode as pamqp_encode

__all__ = [
    "AmqpCodec",
    "BodyStart",
    "ChannelError",
    "ConnectionFault",
    "Content",
    "FrameError",
    "Heartbeat",
    "HEARTBEAT",
    "Method",
    "Oversized",
    "PROTOCOL_HEADER",
    "ProtocolHeader",
    "REPLY_NAMES",
    "content_frames",
    "declare_ok",
    "deliver_frames",
    "method_frame",
    "reply_text",
]

#: What a 0-9-1 client sends first, and what a broker answers a wrong header with.
PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
#: A frame's bytes besides its payload: type, channel, size, and the end octet.
FRAME_OVERHEAD: Final = 8
HEARTBEAT: Final = struct.pack(">BHIB", FRAME_HEARTBEAT, 0, 0, FRAME_END)

_HEAD = struct.Struct(">BHI")
_INDEX = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class ProtocolHeader:
    """The client's protocol header: ``ok`` False when it is not AMQP 0-9-1 (the broker
    then answers with its own header and closes, as the spec says)."""

    ok: bool


@dataclass(frozen=True, slots=True)
class Method:
    """A method frame that carries no content."""

    channel: int
    method: base.Frame


@dataclass(frozen=True, slots=True)
class Content:
    """A published message, whole: ``Basic.Publish``, its properties and its body."""

    channel: int
    method: commands.Basic.Publish
    properties: commands.Basic.Properties
    body: bytes


@dataclass(frozen=True, slots=True)
class BodyStart:
    """A publish's content header announced a body of ``size`` bytes (1..limit) that is
    still to come: the broker checks the publish (rights, its body buffer) before any
    of it is held (docs/amqp.md "Limits"). Its :class:`Content` follows once whole."""

    channel: int
    method: commands.Basic.Publish
    properties: commands.Basic.Properties
    size: int


@dataclass(frozen=True, slots=True)
class Oversized:
    """A publish whose content header announces a body above the limit: its body
    frames are skipped as they come, and the broker refuses the message."""

    channel: int
    method: commands.Basic.Publish
    size: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A heartbeat frame (channel 0)."""


Event = ProtocolHeader | Method | BodyStart | Content | Oversized | Heartbeat


class _Partial:
    """One channel's message being assembled."""

    __slots__ = ("method", "properties", "size", "parts", "got", "skip", "dropped")

    def __init__(self, method: commands.Basic.Publish) -> None:
        self.method = method
        self.properties: commands.Basic.Properties | None = None  # None: header to come
        self.size = 0
        self.parts: list[bytes] = []
        self.got = 0
        self.skip = False  # oversized or refused: the body frames are dropped
        self.dropped = False  # forgotten (see AmqpCodec.forget)


class AmqpCodec:
    """The frames of one client connection.

    Args:
        frame_max: the largest frame accepted, its 8 bytes of framing included (the
            broker's ``Connection.Tune`` offer; lowered by :meth:`tune`).
        max_body: the largest message body accepted (``max_message``).
    """

    def __init__(self, frame_max: int, max_body: int) -> None:
        self.frame_max = frame_max
        self.max_body = max_body
        self._buf = bytearray()
        self._greeted = False  # the protocol header is read
        self._content: dict[int, _Partial] = {}
        self._dropping = False  # drop_content() was called

    @property
    def buffered(self) -> int:
        """Bytes received and not yet made into an event."""
        return len(self._buf)

    def tune(self, frame_max: int) -> None:
        """The frame size the client settled on (``Connection.TuneOk``; 0: no limit of
        its own, the broker's stays)."""
        if frame_max:
            self.frame_max = min(self.frame_max, frame_max)

    def receive_data(self, data: bytes) -> None:
        self._buf += data

    def assembling(self, channel: int) -> bool:
        """Whether a message's content is still to come on ``channel``."""
        return channel in self._content

    def drop_content(self) -> None:
        """Hold no more message content: every message half read, and every one that
        starts from now, is dropped as its frames come (the connection is closing)."""
        self._dropping = True
        for channel in list(self._content):
            self.forget(channel)

    def forget(self, channel: int) -> None:
        """Drop a message half read on ``channel`` (the channel closed, or the message
        was refused at its header): what was held of its body goes, and the body frames
        still to come are skipped as they arrive (a client sends them before it reads
        the Channel.Close); a method frame on the channel ends the skipping."""
        partial = self._content.get(channel)
        if partial is None:
            return
        partial.parts = []
        partial.skip = True
        partial.dropped = True
        if partial.properties is not None and partial.got >= partial.size:
            del self._content[channel]

    def next_event(self) -> Event | None:
        """The next event of the bytes received, or None until more bytes come.

        Raises:
            FrameError: the bytes break the framing (the connection must close).
        """
        while True:
            buf = self._buf
            if not self._greeted:
                if buf[: len(PROTOCOL_HEADER)] != PROTOCOL_HEADER[: len(buf)]:
                    return ProtocolHeader(False)  # wrong at once: no need to wait for 8
                if len(buf) < len(PROTOCOL_HEADER):
                    return None
                del buf[: len(PROTOCOL_HEADER)]
                self._greeted = True
                return ProtocolHeader(True)
            if len(buf) < _HEAD.size:
                return None
            kind, channel, size = _HEAD.unpack_from(buf)
            if size + FRAME_OVERHEAD > self.frame_max:
                raise FrameError(
                    501, f"frame of {size + FRAME_OVERHEAD} bytes is above frame_max {self.frame_max}"
                )
            end = _HEAD.size + size
            if len(buf) <= end:
                return None
            if buf[end] != FRAME_END:
                raise FrameError(501, "frame does not end with the frame-end octet")
            payload = bytes(buf[_HEAD.size : end])
            del buf[: end + 1]
            event = self._frame(kind, channel, payload)
            if event is not None:
                return event

    def _frame(self, kind: int, channel: int, payload: bytes) -> Event | None:
        if kind == FRAME_METHOD:
            dropped = self._content.get(channel)
            if dropped is not None and dropped.dropped:
                del self._content[channel]  # the client gave up the message it was sending
            if channel in self._content:
                raise FrameError(505, f"a method frame on channel {channel} while its message's content is still to come")
            method = _method(payload)
            if isinstance(method, commands.Basic.Publish):
                started = self._content[channel] = _Partial(method)
                if self._dropping:
                    started.skip = started.dropped = True
                return None
            return Method(channel, method)
        if kind == FRAME_HEADER:
            partial = self._content.get(channel)
            if partial is None or partial.properties is not None:
                raise FrameError(505, f"a content header on channel {channel} where none is expected")
            ch = header.ContentHeader()
            try:
                ch.unmarshal(payload)
            except Exception as exc:  # noqa: BLE001 - pamqp's decoder on a client's bytes
                raise FrameError(502, f"malformed content header: {exc}") from None
            if ch.class_id != commands.Basic.frame_id:
                raise FrameError(505, f"a content header of class {ch.class_id}, not Basic")
            partial.properties = ch.properties
            partial.size = ch.body_size
            if partial.dropped:
                if partial.size == 0:
                    del self._content[channel]
                return None
            if ch.body_size > self.max_body:
                partial.skip = True  # (above max_body, so at least one body frame comes)
                return Oversized(channel, partial.method, ch.body_size)
            if partial.size:
                return BodyStart(channel, partial.method, ch.properties, partial.size)
            return self._complete(channel, partial)
        if kind == FRAME_BODY:
            partial = self._content.get(channel)
            if partial is None or partial.properties is None:
                raise FrameError(505, f"a content body on channel {channel} where none is expected")
            partial.got += len(payload)
            if partial.got > partial.size:
                raise FrameError(501, f"content body of more than the {partial.size} bytes announced")
            if partial.skip:
                if partial.got == partial.size:
                    del self._content[channel]
                return None
            partial.parts.append(payload)
            return self._complete(channel, partial)
        if kind == FRAME_HEARTBEAT:
            if channel != 0:
                raise FrameError(501, "a heartbeat frame on a channel other than 0")
            return Heartbeat()
        raise FrameError(501, f"unknown frame type {kind}")

    def _complete(self, channel: int, partial: _Partial) -> Content | None:
        if partial.got < partial.size:
            return None
        del self._content[channel]
        assert partial.properties is not None
        return Content(channel, partial.method, partial.properties, b"".join(partial.parts))


def _publish(payload: bytes) -> commands.Basic.Publish:
    """``Basic.Publish``, read directly (the hot path: pamqp's generic reading cost a
    fifth of a publish): ticket, exchange, routing key, mandatory and immediate."""
    try:
        pos = _INDEX.size + 2  # (the deprecated ticket)
        names = []
        for _ in range(2):
            n = payload[pos]
            end = pos + 1 + n
            if end > len(payload):
                raise IndexError
            names.append(payload[pos + 1 : end].decode("utf-8"))
            pos = end
        bits = payload[pos]
    except (IndexError, UnicodeDecodeError):
        raise FrameError(502, "malformed Basic.Publish") from None
    method = commands.Basic.Publish()
    method.exchange, method.routing_key = names
    method.mandatory = bool(bits & 1)
    method.immediate = bool(bits & 2)
    return method


def _method(payload: bytes) -> base.Frame:
    if len(payload) < _INDEX.size:
        raise FrameError(502, "method frame too short")
    (index,) = _INDEX.unpack_from(payload)
    if index == commands.Basic.Publish.index:
        return _publish(payload)
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise FrameError(503, f"unknown method (class {index >> 16}, method {index & 0xFFFF})")
    method: base.Frame = cls()
    try:
        method.unmarshal(payload[_INDEX.size :])
    except Exception as exc:  # noqa: BLE001 - pamqp's decoder on a client's bytes
        raise FrameError(502, f"malformed {method.name}: {exc!r}") from None
    return method


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return b"".join((_HEAD.pack(kind, channel, len(payload)), payload, b"\xce"))


def method_frame(channel: int, method: base.Frame) -> bytes:
    """One method frame's bytes.

    Raises:
        ValueError: pamqp refuses a value (a name it finds invalid, a string too long).
    """
    return _frame(FRAME_METHOD, channel, _INDEX.pack(method.index) + method.marshal())


def declare_ok(channel: int, queue: str, message_count: int, consumer_count: int) -> bytes:
    """``Queue.DeclareOk``'s frame. pamqp checks queue names against a pattern narrower
    than RabbitMQ's (and Baton's), in this method's constructor too: it is written here
    so that any declared name can be told."""
    body = (
        pamqp_encode.short_string(queue)
        + pamqp_encode.long_int(message_count)
        + pamqp_encode.long_int(consumer_count)
    )
    return _frame(FRAME_METHOD, channel, _INDEX.pack(commands.Queue.DeclareOk.index) + body)


def content_frames(
    channel: int,
    method: base.Frame,
    properties: commands.Basic.Properties,
    body: bytes,
    frame_max: int,
) -> bytes:
    """A method with content (``Basic.Deliver``, ``GetOk``, ``Return``): the method
    frame, the content header and the body in frames of at most ``frame_max`` bytes.

    Raises:
        ValueError: pamqp refuses a value.
    """
    content = header.ContentHeader(0, len(body), properties)
    parts = [method_frame(channel, method), _frame(FRAME_HEADER, channel, content.marshal())]
    step = frame_max - FRAME_OVERHEAD
    for i in range(0, len(body), step):
        parts.append(_frame(FRAME_BODY, channel, body[i : i + step]))
    return b"".join(parts)


class ConnectionFault(Exception):
    """The connection closes with ``code`` (``Connection.Close``): 501 to 505, 530, 540,
    541. ``method`` is the class and method id of the method that caused it (0, 0: none)."""

    def __init__(self, code: int, text: str, method: tuple[int, int] = (0, 0)) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.method = method


class ChannelError(Exception):
    """The channel closes with ``code`` (``Channel.Close``): 403, 404, 405, 406."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


#: The reply texts of the codes, as they start a Close's reply text.
REPLY_NAMES: Final = {
    200: "OK",
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    320: "CONNECTION_FORCED",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}


def reply_text(code: int, text: str) -> str:
    """A Close's reply text as RabbitMQ writes it (``NOT_FOUND - no queue 'q'``), cut
    to a short string's 255 bytes."""
    full = f"{REPLY_NAMES.get(code, str(code))} - {text}"
    data = full.encode("utf-8")
    if len(data) <= 255:
        return full
    return data[:255].decode("utf-8", "ignore")


class FrameError(ConnectionFault):
    """The bytes break the framing: the connection closes with ``code``."""


_DELIVER: Final = struct.Struct(">I")
_CONTENT_HEAD: Final = struct.Struct(">HHQ")


def _shortstr(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > 255:
        raise ValueError("a short string is at most 255 bytes")
    return bytes((len(data),)) + data


def deliver_frames(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    routing_key: str,
    properties: bytes,
    body: bytes,
    frame_max: int,
    exchange: str = "",
) -> bytes:
    """A ``Basic.Deliver`` with its content, written directly (delivery's hot path):
    ``properties`` are the content header's flags and values (broker/amqp_message.py
    ``properties_bytes``).

    Raises:
        ValueError: a tag or key longer than a short string.
    """
    method = b"".join((
        _DELIVER.pack(commands.Basic.Deliver.index),
        _shortstr(consumer_tag),
        struct.pack(">QB", delivery_tag, 1 if redelivered else 0),
        _shortstr(exchange),
        _shortstr(routing_key),
    ))
    parts = [
        _frame(FRAME_METHOD, channel, method),
        _frame(FRAME_HEADER, channel,
               _CONTENT_HEAD.pack(commands.Basic.frame_id, 0, len(body)) + properties),
    ]
    step = frame_max - FRAME_OVERHEAD
    for i in range(0, len(body), step):
        parts.append(_frame(FRAME_BODY, channel, body[i : i + step]))
    return b"".join(parts)
