"""Unit tests of the sans-IO frame codec (clients/wire.py): no event loop, no sockets."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batonmq.clients import errors, wire
from batonmq.clients.wire import (
    FRAME_TYPES,
    NEED_DATA,
    Frame,
    FrameCodec,
)
from tests.helpers import decode_frames

__all__: list[str] = []

# One realistic instance of every frame type. test_samples_cover_every_frame_type keeps
# this table in step with FRAME_TYPES.
SAMPLES: dict[type[Frame], Frame] = {
    wire.Hello: wire.Hello(1, wire.PROTOCOL_VERSION, "baton-python"),
    wire.HelloOk: wire.HelloOk(1, wire.PROTOCOL_VERSION, "baton/0.1.0", "node-a", 1 << 24, 1 << 20),
    wire.AuthChallenge: wire.AuthChallenge(1, {"message": b"r=abc,s=c2FsdA==,i=16384"}),
    wire.AuthResponse: wire.AuthResponse(1, {"message": b"c=biws,r=abc,p=cHJvb2Y="}),
    wire.PutUser: wire.PutUser(3, "alice", {"salt": b"s" * 16, "cost": 16384,
                                           "stored_key": b"k" * 32, "server_key": b"v" * 32}, False),
    wire.DeleteUser: wire.DeleteUser(4, "alice"),
    wire.ListUsers: wire.ListUsers(5),
    wire.ListFeatures: wire.ListFeatures(7),
    wire.EnableFeatures: wire.EnableFeatures(8, ["versioned_formats"]),
    wire.SetRights: wire.SetRights(6, "alice", {"read": "jobs\\..*", "write": ""}),
    wire.SetUserLimits: wire.SetUserLimits(6, "alice", {"max_queues": 10, "max_consumers": None}),
    wire.SetUserTags: wire.SetUserTags(6, "alice", ["monitoring"]),
    wire.ListPolicies: wire.ListPolicies(9),
    wire.SetPolicy: wire.SetPolicy(9, "jobs", "^jobs\\.", "queues",
                                   {"max-length": 1000, "retry": {"policy": "fixed", "delay": 50}}, 1),
    wire.ClearPolicy: wire.ClearPolicy(9, "jobs"),
    wire.GrowPartitions: wire.GrowPartitions(9, 4),
    wire.MovePartition: wire.MovePartition(9, 2, "node-1", "node-3"),
    wire.RebalancePartitions: wire.RebalancePartitions(9, True),
    wire.SetReplicas: wire.SetReplicas(9, 3),
    wire.Locate: wire.Locate(9, "orders"),
    wire.Ok: wire.Ok(7, {"position": 42, "nested": {"a": [1, 2.5, None, True]}}),
    wire.Error: wire.Error(0, errors.ShuttingDown.code, "bye"),
    wire.Ping: wire.Ping(3),
    wire.DeclareQueue: wire.DeclareQueue(
        4,
        "orders",
        {
            "durable": True,
            "max_length": None,
            "overflow": "reject-publish",
            "delivery_limit": 5,
            "dead_letter": "orders.dlq",
            "message_ttl_ms": 1500,
        },
    ),
    wire.DeleteQueue: wire.DeleteQueue(5, "orders"),
    wire.PurgeQueue: wire.PurgeQueue(6, "orders"),
    wire.QueueStats: wire.QueueStats(7, "orders"),
    wire.ListQueues: wire.ListQueues(8),
    wire.DeclareExchange: wire.DeclareExchange(
        8, "logs", "headers", {"durable": False, "arguments": {"alternate-exchange": "ae"}}
    ),
    wire.DeleteExchange: wire.DeleteExchange(8, "logs", True),
    wire.ListExchanges: wire.ListExchanges(8),
    wire.Bind: wire.Bind(8, "orders", "amq.match", "", {"x-match": "any", "a": None}),
    wire.Unbind: wire.Unbind(8, "orders", "amq.topic", "a.#"),
    wire.BindExchange: wire.BindExchange(8, "audit", "orders", "#", {}),
    wire.UnbindExchange: wire.UnbindExchange(8, "audit", "amq.match", "", {"x-match": "all"}),
    wire.PublishTo: wire.PublishTo(8, "amq.topic", "a.b", b"body", {"k": 1}, "c0ffee:3", {"priority": 2}),
    wire.Publish: wire.Publish(9, "orders", b"\x00\xffbody", {"k": "v", "n": 1}, "c0ffee:1"),
    wire.PublishBatch: wire.PublishBatch(
        10, "orders", [[b"a", {}], [b"b", {"k": "v"}]], "c0ffee:2"
    ),
    wire.Subscribe: wire.Subscribe(11, "orders", 100),
    wire.Deliver: wire.Deliver(
        3, [[0, 0, b"a", {}, 1_700_000_000_000], [1, 2, b"b", {"k": "v"}, 1_700_000_000_001]]
    ),
    wire.Ack: wire.Ack(12, 3, [0, 1, 2]),
    wire.Release: wire.Release(13, 3, [4]),
    wire.Reject: wire.Reject(14, 3, []),
    wire.Cancel: wire.Cancel(15, 3, [7, 8]),
    wire.Topology: wire.Topology(16),
    wire.Peek: wire.Peek(25, "q", 10),
    wire.Connections: wire.Connections(26),
    wire.MessageHistory: wire.MessageHistory(27, "q", 4, 1000),
    wire.UpdateRequest: wire.UpdateRequest(17, 42, ["q1", "q2"], True, "n3/r3", b"\x01" * 64),
    wire.UpdateState: wire.UpdateState(18, 41, [[0, 1], [], []]),
    wire.UpdateQueue: wire.UpdateQueue(19, "q1", 7, 1000),
    wire.UpdateFront: wire.UpdateFront(20, 7, [[999, b"\x94\x01\x02\x80\xc4\x01x"]]),
    wire.UpdateDone: wire.UpdateDone(21, "q1", 7),
    wire.ReadRange: wire.ReadRange(17, "import-entries", 100, 200, 10_000),
    wire.Reserve: wire.Reserve(18, "import-entries", "spark:import-entries"),
    wire.AcceptThrough: wire.AcceptThrough(19, "import-entries", 200, "spark:import-entries"),
    wire.Lead: wire.Lead(17, "import-entries"),
    wire.Resign: wire.Resign(18, "import-entries"),
    wire.LeaderEvent: wire.LeaderEvent("import-entries", "granted", 1234, "n1/abc/s1"),
    wire.Services: wire.Services(19),
    wire.Handover: wire.Handover(20, "import-entries", "n2", 30_000),
    wire.ConsumerCancelled: wire.ConsumerCancelled(3, errors.QueueNotFound.code, "queue deleted"),
    wire.Expired: wire.Expired(3, [4, 9]),
    wire.Touch: wire.Touch(21, 3, [4]),
    wire.PeerProof: wire.PeerProof(2, "n2/r2", b"\x07" * 64),
    wire.Submit: wire.Submit(3, 2, b"\x96\xa0\xa0\x00\x00\x0a\xa1q"),
    wire.Submitted: wire.Submitted(3, ["Enqueued", {"first_position": 4, "count": 1}]),
}


def _encode_raw(items: Any) -> bytes:
    """A length-prefixed frame with an arbitrary msgpack payload (bypasses the encoder)."""
    payload = msgpack.packb(items, use_bin_type=True)
    return struct.pack(">I", len(payload)) + payload


def test_samples_cover_every_frame_type() -> None:
    assert set(SAMPLES) == set(FRAME_TYPES.values())
    assert len(FRAME_TYPES) == len({cls.OP for cls in FRAME_TYPES.values()})


@pytest.mark.parametrize("frame", list(SAMPLES.values()), ids=lambda f: type(f).__name__)
def test_round_trip(frame: Frame) -> None:
    codec = FrameCodec()
    data = codec.send(frame)
    assert struct.unpack(">I", data[:4])[0] == len(data) - 4
    codec.receive_data(data)
    decoded = codec.next_frame()
    assert decoded == frame
    assert type(decoded) is type(frame)
    assert codec.next_frame() is NEED_DATA
    assert codec.buffered == 0


@pytest.mark.parametrize("frame", list(SAMPLES.values()), ids=lambda f: type(f).__name__)
def test_byte_at_a_time(frame: Frame) -> None:
    codec = FrameCodec()
    data = codec.send(frame)
    for i, byte in enumerate(data):
        assert codec.next_frame() is NEED_DATA
        codec.receive_data(bytes([byte]))
        assert codec.buffered == i + 1
    assert codec.next_frame() == frame
    assert codec.next_frame() is NEED_DATA


def test_many_frames_in_one_chunk() -> None:
    codec = FrameCodec()
    frames = list(SAMPLES.values()) * 3
    chunk = b"".join(codec.send(f) for f in frames)
    codec.receive_data(chunk)
    assert decode_frames(codec) == frames
    assert codec.buffered == 0


def test_chunk_ending_mid_frame_keeps_the_tail() -> None:
    codec = FrameCodec()
    first, second = SAMPLES[wire.Publish], SAMPLES[wire.Deliver]
    data = codec.send(first) + codec.send(second)
    cut = len(codec.send(first)) + 3  # inside the second frame's length prefix
    codec.receive_data(data[:cut])
    assert decode_frames(codec) == [first]
    assert codec.buffered == 3
    codec.receive_data(data[cut:])
    assert decode_frames(codec) == [second]


def test_bytearray_and_memoryview_bodies_decode_as_bytes() -> None:
    codec = FrameCodec()
    for body in (bytearray(b"abc"), memoryview(b"abc")):
        codec.receive_data(codec.send(wire.Publish(1, "q", body, {})))  # type: ignore[arg-type]
        frame = codec.next_frame()
        assert isinstance(frame, wire.Publish)
        assert frame.body == b"abc" and type(frame.body) is bytes


def test_oversized_length_prefix_raises_before_the_body_arrives() -> None:
    codec = FrameCodec(max_frame=1024)
    codec.receive_data(struct.pack(">I", 1025))  # only the prefix: no body at all
    with pytest.raises(errors.FrameTooLarge):
        codec.next_frame()


def test_length_prefix_at_the_limit_waits_for_the_body() -> None:
    codec = FrameCodec(max_frame=1024)
    codec.receive_data(struct.pack(">I", 1024) + b"\x00" * 10)
    assert codec.next_frame() is NEED_DATA


def test_frame_too_large_is_a_protocol_error_with_its_code() -> None:
    assert issubclass(errors.FrameTooLarge, errors.ProtocolError)
    assert isinstance(errors.for_code(errors.FrameTooLarge.code, "x"), errors.FrameTooLarge)


def test_send_refuses_a_frame_above_max_frame() -> None:
    codec = FrameCodec(max_frame=100)
    with pytest.raises(errors.FrameTooLarge):
        codec.send(wire.Publish(1, "q", b"x" * 200, {}))
    # A frame that fits is still fine afterwards (the packer was not left dirty).
    codec.receive_data(codec.send(wire.Ping(2)))
    assert codec.next_frame() == wire.Ping(2)


def test_partial_prefix_needs_data() -> None:
    codec = FrameCodec()
    assert codec.next_frame() is NEED_DATA
    codec.receive_data(b"\x00\x00")
    assert codec.next_frame() is NEED_DATA


def test_unknown_op_code_raises_unknown_command() -> None:
    codec = FrameCodec()
    codec.receive_data(_encode_raw([250, 1, 2]))
    with pytest.raises(errors.UnknownCommand):
        codec.next_frame()


@pytest.mark.parametrize(
    "items",
    [
        [wire.Ping.OP],  # too few fields
        [wire.Ping.OP, 1, 2],  # too many
        [wire.Ack.OP, 1, 2],  # positions missing
        [wire.Ping.OP, "1"],  # str where int
        [wire.Ping.OP, 1.0],  # float where int
        [wire.Ping.OP, True],  # bool is not an int on the wire
        [wire.Ping.OP, None],
        [wire.Publish.OP, 1, "q", "body as str", {}],  # str where bytes
        [wire.Publish.OP, 1, "q", b"b", []],  # list where dict
        [wire.Publish.OP, 1, b"q", b"b", {}],  # bytes where str
        [wire.Ok.OP, 1, [1, 2]],
        [wire.Ack.OP, 1, 2, {"0": 1}],  # dict where list
        [wire.Deliver.OP, 1, "not a list"],
        [wire.Hello.OP, 1, 1, 7],
    ],
)
def test_wrong_field_types_or_arity_raise_protocol_error(items: list[Any]) -> None:
    codec = FrameCodec()
    codec.receive_data(_encode_raw(items))
    with pytest.raises(errors.ProtocolError) as info:
        codec.next_frame()
    assert not isinstance(info.value, errors.UnknownCommand)


def test_publish_frames_without_the_idempotency_key_still_decode() -> None:
    """Frames of a client from before idempotency keys: the key is "" (none)."""
    codec = FrameCodec()
    codec.receive_data(_encode_raw([wire.Publish.OP, 1, "q", b"b", {}]))
    codec.receive_data(_encode_raw([wire.PublishBatch.OP, 2, "q", [[b"a", {}]]]))
    assert codec.next_frame() == wire.Publish(1, "q", b"b", {})
    assert codec.next_frame() == wire.PublishBatch(2, "q", [[b"a", {}]], "")
    codec.receive_data(_encode_raw([wire.Publish.OP, 1, "q", b"b", {}, 7]))  # int key
    with pytest.raises(errors.ProtocolError):
        codec.next_frame()
    codec.receive_data(_encode_raw([wire.Publish.OP, 1, "q", b"b", {}, "k", "x"]))  # too many
    with pytest.raises(errors.ProtocolError):
        codec.next_frame()


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # empty payload
        b"\xc1",  # never-used msgpack byte
        msgpack.packb({"op": 1}),  # a map, not an array
        msgpack.packb([]),  # empty array
        msgpack.packb(["1", 1]),  # op-code not an int
        msgpack.packb([5, 1]) + b"\x00",  # trailing bytes after the array
        b"\x92\xa3\xff\xfe\xfd\x01",  # invalid utf-8 in a str
        msgpack.packb([3, 1, {1: "int key"}]),  # non-str map key
    ],
)
def test_malformed_payload_raises_protocol_error(payload: bytes) -> None:
    codec = FrameCodec()
    codec.receive_data(struct.pack(">I", len(payload)) + payload)
    with pytest.raises(errors.ProtocolError):
        codec.next_frame()


def test_errors_round_trip_through_an_error_frame() -> None:
    codec = FrameCodec()
    original = errors.QueueFull("queue 'q' is full")
    codec.receive_data(codec.send(wire.Error(9, original.code, original.message)))
    frame = codec.next_frame()
    assert isinstance(frame, wire.Error)
    rebuilt = errors.for_code(frame.code, frame.message)
    assert type(rebuilt) is errors.QueueFull and rebuilt.message == original.message


# --- property tests --------------------------------------------------------------------


def _drain_or_protocol_error(codec: FrameCodec) -> None:
    """Take every frame; only ProtocolError subclasses may escape (and end the stream)."""
    with contextlib.suppress(errors.ProtocolError):
        decode_frames(codec)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_fuzz_arbitrary_bytes_only_raise_protocol_errors(chunks: list[bytes]) -> None:
    codec = FrameCodec(max_frame=4096)
    for chunk in chunks:
        codec.receive_data(chunk)
        _drain_or_protocol_error(codec)


_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_msgpack_values = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(
    op=st.one_of(st.sampled_from(sorted(FRAME_TYPES)), st.integers(-5, 300)),
    fields=st.lists(_msgpack_values, max_size=6),
)
def test_fuzz_well_formed_msgpack_with_wrong_shapes(op: int, fields: list[Any]) -> None:
    """Valid msgpack arrays with any op-code and any fields: a frame or a ProtocolError."""
    codec = FrameCodec()
    codec.receive_data(_encode_raw([op, *fields]))
    try:
        frame = codec.next_frame()
    except errors.ProtocolError:
        return
    assert isinstance(frame, FRAME_TYPES[op])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(list(SAMPLES.values())), min_size=1, max_size=10),
    st.data(),
)
def test_any_split_of_a_frame_stream_decodes_the_same(
    frames: list[Frame], data: st.DataObject
) -> None:
    codec = FrameCodec()
    stream = b"".join(codec.send(f) for f in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    got: list[Frame] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        codec.receive_data(stream[start:cut])
        start = cut
        got.extend(decode_frames(codec))
    assert got == frames


@settings(max_examples=200, deadline=None)
@given(
    corr=st.integers(0, 2**63 - 1),
    queue=st.text(max_size=20),
    body=st.binary(max_size=256),
    headers=st.dictionaries(st.text(max_size=8), _msgpack_values, max_size=4),
)
def test_publish_round_trips_any_body_and_headers(
    corr: int, queue: str, body: bytes, headers: dict[str, Any]
) -> None:
    codec = FrameCodec()
    frame = wire.Publish(corr, queue, body, headers)
    codec.receive_data(codec.send(frame))
    assert codec.next_frame() == frame


# --- decode limits (docs/security.md "Bad input harms no one else") ------------------------

_LIMITS = wire.DecodeLimits.for_broker(max_headers=65536, max_positions=100_000)


def test_a_decode_bomb_is_refused_at_its_array_header() -> None:
    """30 million empty arrays in a PublishBatch: refused before any is allocated."""
    n = 30_000_000
    payload = b"\x94\x15\x07\xa5app.a\xdd" + struct.pack(">I", n) + b"\x90" * n
    with pytest.raises(errors.ProtocolError, match="PublishBatch.*max_array_len"):
        wire.decode_payload(payload, _LIMITS)
    # Without limits (a client reading its broker) the same bytes would decode.
    small = b"\x94\x15\x07\xa5app.a\xdd" + struct.pack(">I", 3) + b"\x90" * 3
    assert wire.decode_payload(small) == wire.PublishBatch(7, "app.a", [[], [], []])


def test_a_batch_of_more_than_max_batch_messages_is_refused() -> None:
    frame = wire.PublishBatch(1, "q", [[b"", {}]] * (wire.MAX_BATCH_MESSAGES + 1))
    payload = FrameCodec(64 << 20).send(frame)[4:]
    with pytest.raises(errors.ProtocolError, match="PublishBatch of 32769 messages"):
        wire.decode_payload(payload, _LIMITS)
    fits = wire.PublishBatch(1, "q", [[b"", {}]] * wire.MAX_BATCH_MESSAGES)
    assert wire.decode_payload(FrameCodec(64 << 20).send(fits)[4:], _LIMITS) == fits


def test_values_are_counted_at_any_depth() -> None:
    """Many small arrays, each within max_array: the total count refuses the frame."""
    inner = [[]] * 60_000
    too_many = wire.Publish(1, "q", b"", {"a": [inner] * 9})  # 540 000 values
    payload = FrameCodec(64 << 20).send(too_many)[4:]
    with pytest.raises(errors.ProtocolError, match="more than 524288 values"):
        wire.decode_payload(payload, _LIMITS)
    fits = wire.Publish(1, "q", b"", {"a": [inner] * 8})
    assert wire.decode_payload(FrameCodec(64 << 20).send(fits)[4:], _LIMITS) == fits


def test_positions_may_be_as_many_as_a_connection_holds_unsettled() -> None:
    codec = FrameCodec(limits=_LIMITS)
    ack = wire.Ack(1, 2, list(range(100_000)))
    codec.receive_data(codec.send(ack))
    assert codec.next_frame() == ack
    codec.receive_data(codec.send(wire.Ack(1, 2, list(range(100_001)))))
    with pytest.raises(errors.ProtocolError, match="max_array_len"):
        codec.next_frame()
    # Another frame's list may not be that long.
    codec.receive_data(codec.send(wire.Publish(1, "q", b"", {"h": list(range(70_000))})))
    with pytest.raises(errors.ProtocolError, match="max_array_len"):
        codec.next_frame()


def test_a_large_payload_is_handed_out_without_a_copy_and_the_rest_kept() -> None:
    codec = FrameCodec()
    big = wire.Publish(1, "q", b"x" * 100_000, {})
    codec.receive_data(codec.send(big) + codec.send(wire.Ping(2))[:3])
    payload = codec.next_payload()
    assert isinstance(payload, memoryview) and codec.decode(payload) == big
    assert codec.buffered == 3 and codec.next_payload() is wire.NEED_DATA
    codec.receive_data(codec.send(wire.Ping(2))[3:])
    assert codec.next_frame() == wire.Ping(2)


def test_many_large_payloads_read_at_once_come_out_in_order() -> None:
    codec = FrameCodec()
    frames = [wire.Publish(i, "q", bytes([i]) * 70_000, {}) for i in range(1, 5)]
    codec.receive_data(b"".join(codec.send(f) for f in frames))
    got = []
    while not isinstance(payload := codec.next_payload(), type(wire.NEED_DATA)):
        got.append(codec.decode(payload))
    assert got == frames and codec.buffered == 0
