"""What a peer link carries (broker/peers.py, docs/design.md §16): a forwarded event in
the log's record codec and back, every result type through a Submitted frame and back,
errors rebuilt as their own class; and the peer proof (cluster/member_proof.py), which
verifies only for a member of the view with the key its Join recorded, and is no join
update's proof."""

from __future__ import annotations

import msgpack
import pytest

from batonmq.broker.peers import (
    FORWARDABLE,
    NotSent,
    Peer,
    decode_event,
    decode_result,
    encode_event,
    encode_result,
    kind_of,
)
from batonmq.clients import wire
from batonmq.cluster.errors import AccessRefused, NotReplica, ProtocolError, for_code
from batonmq.cluster.events import (
    Accept,
    AcceptThrough,
    DeclareQueue,
    DeleteQueue,
    Enqueue,
    FanOut,
    ForwardIn,
    Interest,
    PurgeQueue,
    Reserve,
    RoutedEnqueue,
)
from batonmq.cluster.member_proof import PEER, UPDATE, MemberKey, check, check_peer, new_nonce
from batonmq.cluster.results import RESULT_TYPES, Enqueued
from tests.unit.test_results import SAMPLES as RESULT_SAMPLES

__all__: list[str] = []

EVENTS = [
    DeclareQueue("q", durable=True, max_length=10, dead_letter="dlq", user="alice",
                 expires_ms=60_000),
    DeclareQueue("plain"),
    DeleteQueue("q"),
    PurgeQueue("q"),
    Enqueue("q", ((b"a", {"k": 1}), (b"\x00b", {})), (("c0ffee:1", 1), ("c0ffee:2", 1)),
            0, 0, 3, (None, 5_000)),
    Enqueue("q", ((b"x", {}),)),
    RoutedEnqueue(("q1", "q2"), ((b"m", {}),), (("k", 1),), "amq.topic", "a.b"),
    FanOut(("q1",), ((b"m", {}),), (("k", 1),), "x", "rk", 0, 0, 0, ((2, ("q2",)),)),
    ForwardIn(1, 7, ("q2",), ((b"m", {}),), (("k", 1),), "x", "rk"),
    Reserve("q", "spark", "svc", 4),
    AcceptThrough("q", 10, "spark", "svc", 4),
]


def _through_msgpack(value: object) -> object:
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False)


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_a_forwarded_event_decodes_to_the_same_event(event: object) -> None:
    assert isinstance(event, FORWARDABLE)
    data = encode_event(event)
    frame = wire.Submit(5, 2, data)
    codec = wire.FrameCodec()
    codec.receive_data(codec.send(frame))
    got = codec.next_frame()
    assert isinstance(got, wire.Submit)
    assert decode_event(got.event) == event


def test_every_result_type_round_trips_through_a_submitted_frame() -> None:
    kinds = {type(r) for r, _ in RESULT_SAMPLES}
    assert kinds == set(RESULT_TYPES)
    for result, _ in RESULT_SAMPLES:
        raw = _through_msgpack(encode_result(result))
        assert decode_result(raw) == result
        assert type(decode_result(raw)) is type(result)
    assert decode_result(_through_msgpack(encode_result(None))) is None


@pytest.mark.parametrize(
    "raw, match",
    [
        (["Nope", {}], "unknown result type 'Nope'"),
        ([1, {}], "unknown result type 1"),
        ("Enqueued", r"must be \[type, map\]"),
        (["Enqueued", {"count": 1}], "has no 'first_position'"),
        (["Enqueued", {"first_position": "4", "count": 1}], "'first_position' of type str"),
    ],
)
def test_a_malformed_result_is_a_protocol_error(raw: object, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_result(raw)


def test_a_result_keeps_its_optional_fields() -> None:
    assert decode_result(encode_result(Enqueued(4, 2, [4, 1]))) == Enqueued(4, 2, [4, 1])
    assert decode_result(encode_result(Enqueued(4, 2))) == Enqueued(4, 2, None)


def test_not_replica_travels_as_its_own_class() -> None:
    err = for_code(NotReplica.code, "broker b does not replicate data partition 2")
    assert type(err) is NotReplica and err.retriable


def test_kinds_and_what_is_not_forwarded() -> None:
    assert [kind_of(e) for e in EVENTS] == [
        "declare", "declare", "other", "other", "publish", "publish", "publish", "publish",
        "publish", "other", "other",
    ]
    # A consumer's events name this broker's runtime and consumers: never forwarded.
    assert not isinstance(Interest("q", True), FORWARDABLE)
    assert not isinstance(Accept("q", "n/r/c1", (1,)), FORWARDABLE)


def test_the_peer_proof_verifies_for_a_member_with_its_recorded_key() -> None:
    key, nonce = MemberKey(), new_nonce()
    proof = key.prove(nonce, "server", PEER)
    keys = {"n2/r2": key.public}
    check_peer(keys, {"n2/r2"}, ("n2/r2", nonce), "n2/r2", proof, "server")
    with pytest.raises(AccessRefused, match="not a member of the cluster's view"):
        check_peer(keys, {"n1/r1"}, ("n2/r2", nonce), "n2/r2", proof, "server")
    with pytest.raises(AccessRefused, match="no member key"):
        check_peer({}, {"n2/r2"}, ("n2/r2", nonce), "n2/r2", proof, "server")
    with pytest.raises(AccessRefused, match="its Hello said"):
        check_peer(keys, {"n3/r3"}, ("n2/r2", nonce), "n3/r3", proof, "server")
    with pytest.raises(AccessRefused, match="does not verify"):  # another server's
        check_peer(keys, {"n2/r2"}, ("n2/r2", nonce), "n2/r2", proof, "other")
    with pytest.raises(AccessRefused, match="does not verify"):  # another key
        check_peer({"n2/r2": MemberKey().public}, {"n2/r2"}, ("n2/r2", nonce), "n2/r2",
                   proof, "server")


def test_a_peer_proof_is_no_join_update_proof_and_the_other_way_round() -> None:
    key, nonce = MemberKey(), new_nonce()
    keys = {"n2/r2": key.public}
    with pytest.raises(AccessRefused, match="does not verify"):
        check(keys, ("n2/r2", nonce), "n2/r2", key.prove(nonce, "server", PEER), "server")
    with pytest.raises(AccessRefused, match="does not verify"):
        check_peer(keys, {"n2/r2"}, ("n2/r2", nonce), "n2/r2",
                   key.prove(nonce, "server", UPDATE), "server")
    check(keys, ("n2/r2", nonce), "n2/r2", key.prove(nonce, "server"), "server")


class _ClosedWriter:
    def __init__(self, closing: bool) -> None:
        self.closing = closing

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")


class _StaleLink:
    """A peer link whose peer went before its reader noticed."""

    def __init__(self, closing: bool) -> None:
        self.writer = _ClosedWriter(closing)
        self.codec = wire.FrameCodec()

    def send(self, frame: wire.Frame) -> None:
        self.writer.write(self.codec.send(frame))


@pytest.mark.parametrize("closing", [True, False])
async def test_a_request_on_a_link_just_closed_is_not_sent_so_another_replica_is_tried(
    closing: bool,
) -> None:
    peer = Peer("127.0.0.1:1", None)  # type: ignore[arg-type]
    peer._link = _StaleLink(closing)  # type: ignore[assignment]
    with pytest.raises(NotSent, match="peer link to 127.0.0.1:1 is closed"):
        await peer.submit(1, b"\x90")
    assert not peer._pending
