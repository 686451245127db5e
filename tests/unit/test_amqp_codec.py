"""The AMQP 0-9-1 framing (broker/amqp_codec.py) and the properties kept as headers
(broker/amqp_message.py), without a socket."""

from __future__ import annotations

import datetime
import decimal
import struct

import pytest
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.body import ContentBody

from batonmq.broker.amqp_codec import (
    HEARTBEAT,
    PROTOCOL_HEADER,
    AmqpCodec,
    Content,
    FrameError,
    Heartbeat,
    Method,
    BodyStart,
    Oversized,
    ProtocolHeader,
    content_frames,
    declare_ok,
    deliver_frames,
    method_frame,
    reply_text,
)
from batonmq.broker.amqp_message import PROPERTIES_KEY, properties_bytes, to_headers, to_properties


def events(codec: AmqpCodec) -> list[object]:
    out = []
    while (e := codec.next_event()) is not None:
        out.append(e)
    return out


def greeted(frame_max: int = 131072, max_body: int = 1 << 20) -> AmqpCodec:
    codec = AmqpCodec(frame_max, max_body)
    codec.receive_data(PROTOCOL_HEADER)
    assert events(codec) == [ProtocolHeader(True)]
    return codec


def publish_bytes(channel: int, body: bytes, frame_max: int = 4096, **props: object) -> bytes:
    """A publish as a client writes it, by pamqp's own marshalling."""
    method = commands.Basic.Publish(exchange="", routing_key="q")
    parts = [
        pamqp_frame.marshal(method, channel),
        pamqp_frame.marshal(
            pamqp_header.ContentHeader(0, len(body), commands.Basic.Properties(**props)),  # type: ignore[arg-type]
            channel,
        ),
    ]
    step = frame_max - 8
    for i in range(0, len(body), step):
        parts.append(pamqp_frame.marshal(ContentBody(body[i : i + step]), channel))
    return b"".join(parts)


def test_protocol_header_right_and_wrong() -> None:
    codec = AmqpCodec(131072, 1024)
    codec.receive_data(b"AMQP\x00\x00")
    assert codec.next_event() is None  # a right prefix waits for the rest
    codec.receive_data(b"\x09\x01")
    assert codec.next_event() == ProtocolHeader(True)
    for wrong in (b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x0a", b"GET / HTTP/1.1\r\n", b"\x16\x03"):
        codec = AmqpCodec(131072, 1024)
        codec.receive_data(wrong)
        assert codec.next_event() == ProtocolHeader(False), wrong


def test_method_frames_in_any_chunking() -> None:
    data = (
        pamqp_frame.marshal(commands.Channel.Open(), 1)
        + pamqp_frame.marshal(commands.Queue.Declare(queue="jobs", durable=True,
                                                      arguments={"x-delivery-limit": 3}), 1)
        + HEARTBEAT
    )
    for size in (1, 3, len(data)):
        codec = greeted()
        got: list[object] = []
        for i in range(0, len(data), size):
            codec.receive_data(data[i : i + size])
            got += events(codec)
        assert [type(e) for e in got] == [Method, Method, Heartbeat]
        declare = got[1]
        assert isinstance(declare, Method) and declare.channel == 1
        assert isinstance(declare.method, commands.Queue.Declare)
        assert declare.method.queue == "jobs" and declare.method.arguments == {"x-delivery-limit": 3}


def test_publish_is_put_together_across_frames_and_channels() -> None:
    body = bytes(range(256)) * 40  # 10 KiB: three body frames of 4 KiB
    one = publish_bytes(1, body, correlation_id="c1", headers={"h": 1})
    two = publish_bytes(2, b"small", reply_to="r")
    codec = greeted()
    # Channel 2's whole publish between channel 1's method and its content.
    first_method = len(pamqp_frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), 1))
    codec.receive_data(one[:first_method] + two + one[first_method:])
    got = events(codec)
    # Each body is announced at its header, before any of it is held.
    assert [type(e) for e in got] == [BodyStart, Content, BodyStart, Content]
    assert [(e.channel, e.size) for e in got if isinstance(e, BodyStart)] == [(2, 5), (1, len(body))]
    small, big = got[1], got[3]
    assert isinstance(small, Content) and small.channel == 2 and small.body == b"small"
    assert small.properties.reply_to == "r"
    assert isinstance(big, Content) and big.channel == 1 and big.body == body
    assert big.properties.correlation_id == "c1" and big.properties.headers == {"h": 1}
    assert not codec.assembling(1) and not codec.assembling(2)


def test_empty_body_is_complete_at_its_header() -> None:
    codec = greeted()
    codec.receive_data(publish_bytes(3, b""))
    (content,) = events(codec)
    assert isinstance(content, Content) and content.body == b""


def test_oversized_body_is_skipped_and_reported() -> None:
    codec = greeted(max_body=100)
    codec.receive_data(publish_bytes(1, b"x" * 5000) + publish_bytes(1, b"fits"))
    got = events(codec)
    assert [type(e) for e in got] == [Oversized, BodyStart, Content]
    assert isinstance(got[0], Oversized) and got[0].size == 5000
    assert isinstance(got[2], Content) and got[2].body == b"fits"


def test_a_forgotten_body_is_dropped_as_it_comes() -> None:
    """A publish refused at its header (or its channel closed): the body frames the
    client still sends are skipped, nothing of them is held, and the channel's next
    publish is read as usual."""
    codec = greeted()
    whole = publish_bytes(1, b"x" * 10_000)
    header_end = whole.index(b"\xce", whole.index(b"\xce") + 1) + 1  # after the header frame
    codec.receive_data(whole[:header_end])
    (start,) = events(codec)
    assert isinstance(start, BodyStart) and start.size == 10_000
    codec.forget(1)
    codec.receive_data(whole[header_end:] + publish_bytes(1, b"next"))
    got = events(codec)
    assert [type(e) for e in got] == [BodyStart, Content]
    assert isinstance(got[1], Content) and got[1].body == b"next"


def test_drop_content_holds_no_body_any_more() -> None:
    codec = greeted()
    data = publish_bytes(1, b"a" * 9000) + publish_bytes(2, b"b" * 9000)
    codec.drop_content()
    codec.receive_data(data)
    assert events(codec) == []
    assert not codec.assembling(1) and not codec.assembling(2)


@pytest.mark.parametrize(
    "data, code",
    [
        (struct.pack(">BHI", 1, 1, 200000) + b"x", 501),  # above frame_max
        (struct.pack(">BHI", 1, 1, 4) + b"\x00\x0a\x00\x0a" + b"\x00", 501),  # bad frame end
        (struct.pack(">BHI", 9, 0, 0) + b"\xce", 501),  # unknown frame type
        (struct.pack(">BHI", 8, 1, 0) + b"\xce", 501),  # heartbeat on a channel
        (struct.pack(">BHI", 1, 1, 4) + b"\x00\x63\x00\x01" + b"\xce", 503),  # unknown method
        (struct.pack(">BHI", 1, 1, 5) + b"\x00\x32\x00\x0a\x05" + b"\xce", 502),  # truncated
        (struct.pack(">BHI", 3, 1, 2) + b"ab" + b"\xce", 505),  # body without publish
    ],
)
def test_framing_errors_carry_their_code(data: bytes, code: int) -> None:
    codec = greeted()
    codec.receive_data(data)
    with pytest.raises(FrameError) as info:
        events(codec)
    assert info.value.code == code


def test_method_inside_content_is_unexpected() -> None:
    codec = greeted()
    method = pamqp_frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), 1)
    codec.receive_data(method + pamqp_frame.marshal(commands.Basic.Qos(), 1))
    with pytest.raises(FrameError) as info:
        events(codec)
    assert info.value.code == 505


def test_frame_max_is_lowered_by_tune() -> None:
    codec = greeted()
    codec.tune(4096)
    codec.receive_data(publish_bytes(1, b"y" * 8000, frame_max=8192))
    with pytest.raises(FrameError) as info:
        events(codec)
    assert info.value.code == 501


def test_encoded_frames_decode_with_pamqp() -> None:
    body = b"z" * 10_000
    props = commands.Basic.Properties(content_type="text/plain", headers={"x-delivery-count": 2})
    data = content_frames(5, commands.Basic.Deliver("ctag", 7, True, "", "q"), props, body, 4096)
    out = []
    while data:
        used, channel, frame = pamqp_frame.unmarshal(data)
        data = data[used:]
        assert channel == 5
        out.append(frame)
    assert isinstance(out[0], commands.Basic.Deliver) and out[0].delivery_tag == 7
    assert isinstance(out[1], pamqp_header.ContentHeader) and out[1].body_size == len(body)
    assert out[1].properties.headers == {"x-delivery-count": 2}
    assert b"".join(f.value for f in out[2:]) == body
    assert all(len(f.value) <= 4096 - 8 for f in out[2:])
    # DeclareOk tells any queue name, also one pamqp's own check refuses.
    _, _, ok = pamqp_frame.unmarshal(declare_ok(1, "q", 3, 1))
    assert isinstance(ok, commands.Queue.DeclareOk)
    assert (ok.queue, ok.message_count, ok.consumer_count) == ("q", 3, 1)
    _, _, ok = pamqp_frame.unmarshal(declare_ok(1, "que ü", 0, 0))
    assert isinstance(ok, commands.Queue.DeclareOk) and ok.queue == "que ü"
    _, _, qos = pamqp_frame.unmarshal(method_frame(2, commands.Basic.QosOk()))
    assert isinstance(qos, commands.Basic.QosOk)


def test_reply_text_is_a_short_string() -> None:
    assert reply_text(404, "no queue 'q'") == "NOT_FOUND - no queue 'q'"
    assert len(reply_text(406, "é" * 400).encode()) <= 255


def test_properties_round_trip_through_baton_headers() -> None:
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    props = commands.Basic.Properties(
        content_type="application/json", content_encoding="gzip", delivery_mode=2, priority=5,
        correlation_id="abc", reply_to="replies", expiration="60000", message_id="m-1",
        timestamp=when, message_type="order", user_id="guest", app_id="shop",
        headers={"tenant": "t1", "n": 7, "nested": {"list": [1, "two", True]},
                 "price": decimal.Decimal("1.50"), "at": when},
    )
    headers = to_headers(props)
    # Application headers are plain headers a Baton consumer reads as they are.
    assert headers["tenant"] == "t1" and headers["nested"] == {"list": [1, "two", True]}
    assert headers["price"] == "1.50" and headers["at"] == int(when.timestamp())
    assert headers[PROPERTIES_KEY]["correlation_id"] == "abc"
    back = to_properties(headers, {"x-delivery-count": 1})
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
                 "reply_to", "expiration", "message_id", "timestamp", "message_type", "user_id",
                 "app_id"):
        assert getattr(back, name) == getattr(props, name), name
    assert back.headers is not None
    assert back.headers["tenant"] == "t1" and back.headers["x-delivery-count"] == 1
    assert PROPERTIES_KEY not in back.headers


def test_a_native_message_has_its_headers_as_the_table() -> None:
    props = to_properties({"k": b"bytes", 3: "int key", "big": 1 << 64}, {})
    assert props.headers == {"k": b"bytes", "3": "int key", "big": str(1 << 64)}
    assert props.correlation_id is None
    assert to_headers(commands.Basic.Properties()) == {}


def test_delivered_headers_keep_doubles_and_binary() -> None:
    """The broker writes header tables itself: pamqp would write a double as a float
    (losing digits, or failing) and cannot write bytes."""
    headers = {"big": 1e300, "pi": 3.141592653589793, "raw": b"\x00\xff", "n": 1 << 40,
               "neg": -5, "none": None, "deep": {"l": [1.5, b"x", "s", False]}}
    props = to_properties(headers, {"x-delivery-count": 2})
    data = content_frames(1, commands.Basic.Deliver("t", 1, False, "", "q"), props, b"", 4096)
    used, _, _ = pamqp_frame.unmarshal(data)
    _, _, content = pamqp_frame.unmarshal(data[used:])
    assert isinstance(content, pamqp_header.ContentHeader)
    table = content.properties.headers
    assert table is not None
    assert table["big"] == 1e300 and table["pi"] == 3.141592653589793
    assert bytes(table["raw"]) == b"\x00\xff" and table["n"] == 1 << 40 and table["neg"] == -5
    assert table["none"] is None and table["x-delivery-count"] == 2
    deep = table["deep"]
    assert isinstance(deep, dict) and deep["l"][0] == 1.5 and bytes(deep["l"][1]) == b"x"
    assert deep["l"][2:] == ["s", False]


@pytest.mark.parametrize(
    "headers, extra",
    [
        ({}, {}),
        ({"app": "x", "raw": b"\x01", "f": 2.5}, {"x-delivery-count": 3, "x-acquired-count": 4}),
        ({PROPERTIES_KEY: {"content_type": "text/plain", "delivery_mode": 2, "priority": 7,
                           "correlation_id": "c", "reply_to": "r", "expiration": "100",
                           "message_id": "m", "timestamp": 1767323045, "message_type": "t",
                           "user_id": "u", "app_id": "a"}, "h": [1, None]}, {}),
        ({PROPERTIES_KEY: {"delivery_mode": 300, "content_type": 5, "timestamp": -1}}, {}),
    ],
)
def test_direct_delivery_frames_match_pamqps_reading(headers: dict[str, object],
                                                      extra: dict[str, object]) -> None:
    """The hot path's Deliver and content header, read back by pamqp, say what
    to_properties says (and what pamqp would have written)."""
    body = b"b" * 9000
    data = deliver_frames(3, "ctag-1", 42, True, "que ü", properties_bytes(headers, extra),
                          body, 4096)
    used, channel, method = pamqp_frame.unmarshal(data)
    assert channel == 3 and isinstance(method, commands.Basic.Deliver)
    assert (method.consumer_tag, method.delivery_tag, method.redelivered, method.exchange,
            method.routing_key) == ("ctag-1", 42, True, "", "que ü")
    data = data[used:]
    used, _, content = pamqp_frame.unmarshal(data)
    assert isinstance(content, pamqp_header.ContentHeader) and content.body_size == len(body)
    expected = to_properties(headers, extra)  # type: ignore[arg-type]
    for name in ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                 "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                 "message_type", "user_id", "app_id"):
        got = getattr(content.properties, name)
        want = getattr(expected, name)
        if name == "headers" and want is not None:
            assert got is not None
            got = {k: bytes(v) if isinstance(v, bytearray) else v for k, v in got.items()}
        assert got == want, name
    data = data[used:]
    chunks = []
    while data:
        used, _, frame = pamqp_frame.unmarshal(data)
        data = data[used:]
        chunks.append(frame.value)
    assert b"".join(chunks) == body


@pytest.mark.parametrize(
    "exchange, key, mandatory, immediate",
    [("", "q", False, False), ("ex", "rk.ü", True, False), ("", "", False, True),
     ("e" * 127, "k" * 255, True, True)],
)
def test_publish_is_read_as_pamqp_reads_it(exchange: str, key: str, mandatory: bool,
                                           immediate: bool) -> None:
    method = commands.Basic.Publish(exchange="", routing_key=key, mandatory=mandatory,
                                    immediate=immediate)
    method.exchange = exchange  # (past pamqp's own name check)
    data = pamqp_frame.marshal(method, 1) + pamqp_frame.marshal(
        pamqp_header.ContentHeader(0, 0, commands.Basic.Properties()), 1)
    _, _, theirs = pamqp_frame.unmarshal(data)
    codec = greeted()
    codec.receive_data(data)
    (content,) = events(codec)
    assert isinstance(content, Content) and isinstance(theirs, commands.Basic.Publish)
    for name in ("exchange", "routing_key", "mandatory", "immediate"):
        assert getattr(content.method, name) == getattr(theirs, name), name


def test_a_truncated_publish_is_a_syntax_error() -> None:
    whole = pamqp_frame.marshal(commands.Basic.Publish(exchange="", routing_key="queue"), 1)
    payload = whole[7:-1]
    for cut in (5, 7, len(payload) - 1):
        codec = greeted()
        codec.receive_data(struct.pack(">BHI", 1, 1, cut) + payload[:cut] + b"\xce")
        with pytest.raises(FrameError) as info:
            events(codec)
        assert info.value.code == 502
