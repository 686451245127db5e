"""A message's own TTL in the replicated state (docs/events.md "A message's own TTL"):
decided by the replicated clock in log order, at the head of the queue, behind the flag
``message_ttl``, and invisible (records, snapshots, digests) while no message has one.
Also the AMQP edge's side: the ``expiration`` property read, and ``x-death`` written."""

from __future__ import annotations

import datetime

import pytest

from batonmq.broker.amqp_codec import ChannelError
from batonmq.broker.amqp_message import PROPERTIES_KEY
from batonmq.broker.amqp_ttl import message_ttl, with_x_death
from batonmq.cluster.codec import MalformedEvent, decode, encode
from batonmq.cluster.effects import Acquired, Moved, Removed
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import (
    Acquire,
    Bind,
    DeclareExchange,
    DeclareQueue,
    Enqueue,
    Expire,
    Interest,
    Origin,
    RoutedEnqueue,
)
from batonmq.cluster.features import Features
from batonmq.cluster.queue_state import IMMEDIATE_MS, QueueState, kept_ttls
from batonmq.cluster.results import Counted, Enqueued
from tests.unit.test_membership import Cluster
from tests.unit.test_queue_expiry import _at
from tests.unit.test_users import _cluster


def _flagged() -> tuple[Cluster, str, str]:
    c, a, b = _cluster()
    # What an applied EnableFeatures(("message_ttl",)) leaves (tests/unit/test_features.py
    # covers how a flag gets enabled).
    c.state.features.enabled["message_ttl"] = c.state.applied
    return c, a, b


def _msgs(n: int) -> tuple[tuple[bytes, dict[str, object]], ...]:
    return tuple((b"m%d" % i, {}) for i in range(n))


def test_an_enqueue_without_ttls_is_the_record_older_builds_write() -> None:
    origin = Origin("n", "r", 1, 0)
    for plain in (Enqueue("q", _msgs(2), (), 0, 0, 0), RoutedEnqueue(("a", "b"), _msgs(1))):
        # (the fields before ttls, as 0.3.0 writes them: ttls left out)
        assert encode(origin, plain) == encode(origin, plain.__class__(
            *(getattr(plain, f) for f in plain.__slots__ if f != "ttls")))
        assert decode(encode(origin, plain))[1] == plain
    own = Enqueue("q", _msgs(2), ttls=(500, None))
    assert len(encode(origin, own)) > len(encode(origin, Enqueue("q", _msgs(2))))
    assert decode(encode(origin, own))[1] == own
    routed = RoutedEnqueue(("a",), _msgs(1), ttls=(0,))
    assert decode(encode(origin, routed))[1] == routed


@pytest.mark.parametrize("ttls", [(1,), (1, 2, 3), (-1, 2), ("5", 1), 7])
def test_bad_ttls_in_a_record_are_malformed(ttls: object) -> None:
    import msgpack

    good = msgpack.unpackb(encode(Origin("n", "r", 1, 0), Enqueue("q", _msgs(2), ttls=(1, 2))))
    good[-1] = list(ttls) if isinstance(ttls, tuple) else ttls
    with pytest.raises(MalformedEvent):
        decode(msgpack.packb(good))


def test_without_the_flag_a_ttl_is_refused_and_nothing_changes() -> None:
    c, a, _ = _cluster()
    _at(c, a, DeclareQueue("q"), 10000)
    before = c.state.queues["q"].snapshot()
    for ev in (Enqueue("q", _msgs(1), ttls=(5,)), RoutedEnqueue(("q",), _msgs(1), ttls=(5,))):
        refused = _at(c, a, ev, 10001)
        assert isinstance(refused.error, InvalidArgument) and "message_ttl" in str(refused.error)
    assert c.state.queues["q"].snapshot() == before
    # A queue whose messages have no own TTL keeps the snapshot of builds before the flag.
    c2, a2, _ = _flagged()
    _at(c2, a2, DeclareQueue("q"), 10000)
    _at(c2, a2, Enqueue("q", _msgs(2)), 10001)
    assert len(c2.state.queues["q"].snapshot()) == 19


def test_a_message_past_its_ttl_is_expired_as_it_reaches_the_head() -> None:
    c, a, _ = _flagged()
    _at(c, a, DeclareQueue("q", dead_letter="dlq"), 10000)
    _at(c, a, DeclareQueue("dlq"), 10000)
    done = _at(c, a, Enqueue("q", _msgs(3), ttls=(100, None, 50)), 10000)
    assert done.result == Enqueued(0, 3)
    q = c.state.queues["q"]
    assert q.ttls == {0: 10100, 2: 10050}
    assert len(q.snapshot()) == 23  # (the trailing part: the messages' expiry times)
    assert QueueState.restore(q.snapshot()).snapshot() == q.snapshot()
    _at(c, a, Interest("q", True), 10000)
    # At 10100 nothing has expired yet (expired once the clock is past the time).
    c.effects.clear()
    got = _at(c, a, Acquire("q", f"{a}/1", 1), 10100)
    assert got.result == Counted(1)
    assert [e.positions for e in c.effects if isinstance(e, Acquired)] == [[0]]
    # At 10060, by the replicated clock (10100: it never goes back), position 2 is past
    # its TTL: an acquire of two gets position 1 and dead-letters 2 as it reaches it.
    c.effects.clear()
    got = _at(c, a, Acquire("q", f"{a}/1", 2), 10060)
    assert got.result == Counted(1)
    assert [e.positions for e in c.effects if isinstance(e, Acquired)] == [[1]]
    moved = [e for e in c.effects if isinstance(e, Moved)]
    assert [(m.src_pos, m.headers["x-death-reason"]) for m in moved] == [(2, "expired")]
    assert q.expired == 1 and q.ttls == {0: 10100}
    assert c.state.queues["dlq"].ready == 1
    assert not c.state.queues["dlq"].ttls  # a dead letter does not expire again


def test_expire_takes_the_head_messages_past_their_ttl_only() -> None:
    c, a, _ = _flagged()
    _at(c, a, DeclareQueue("q"), 10000)
    # Head: TTL 10, then 1000 (blocks), then 10 behind it (waits, as in RabbitMQ).
    _at(c, a, Enqueue("q", _msgs(3), ttls=(10, 1000, 10)), 10000)
    q = c.state.queues["q"]
    c.effects.clear()
    # A broker's Expire below the head: nothing by the queue TTL, the head by its own.
    early = _at(c, a, Expire("q", -1), 10010)
    assert early.result == Counted(0) and q.ready == 3
    done = _at(c, a, Expire("q", -1), 10011)
    assert done.result == Counted(1) and q.ready == 2 and q.expired == 1
    assert [e.positions for e in c.effects if isinstance(e, Removed)] == [[0]]
    assert _at(c, a, Expire("q", -1), 10500).result == Counted(0)  # 1 blocks 2
    assert _at(c, a, Expire("q", -1), 11001).result == Counted(2)
    assert not q.ttls and len(q.snapshot()) == 19  # none left: the old snapshot again


def test_ttl_zero_is_deliver_now_or_drop() -> None:
    c, a, _ = _flagged()
    _at(c, a, DeclareQueue("q"), 10000)
    _at(c, a, Interest("q", True), 10000)
    _at(c, a, Enqueue("q", _msgs(2), ttls=(0, 0)), 10000)
    assert c.state.queues["q"].ttls == {0: 10000 + IMMEDIATE_MS, 1: 10000 + IMMEDIATE_MS}
    assert _at(c, a, Acquire("q", f"{a}/1", 1), 10000 + IMMEDIATE_MS).result == Counted(1)
    assert _at(c, a, Acquire("q", f"{a}/1", 1), 10001 + IMMEDIATE_MS).result == Counted(0)
    assert c.state.queues["q"].expired == 1


def test_a_resent_publish_keeps_the_ttls_of_the_new_spans_only() -> None:
    c, a, _ = _flagged()
    _at(c, a, DeclareQueue("q"), 10000)
    _at(c, a, Enqueue("q", _msgs(1), (("k1", 1),), ttls=(7,)), 10000)
    # k1 again (a re-send, not enqueued), then k2 of two messages.
    done = _at(c, a, Enqueue("q", _msgs(3), (("k1", 1), ("k2", 2)), ttls=(7, None, 30)), 10002)
    assert done.result == Enqueued(1, 2, [0, 1])
    assert c.state.queues["q"].ttls == {0: 10007, 2: 10032}
    assert kept_ttls((("a", 1), ("b", 2), ("a", 1)), (1, 2, 3, 4), [5, 6, 5], 6) == [2, 3]


def test_a_state_refuses_ttls_out_of_range() -> None:
    c, a, _ = _flagged()
    _at(c, a, DeclareQueue("q"), 10000)
    for ttls in ((2**32,), (1, 2)):
        bad = _at(c, a, Enqueue("q", _msgs(1), ttls=ttls), 10000)
        assert isinstance(bad.error, InvalidArgument)
    assert c.state.queues["q"].next_pos == 0


# -- the AMQP edge -------------------------------------------------------------------


class _State:
    def __init__(self, *flags: str) -> None:
        self.features = Features()
        for f in flags:
            self.features.enabled[f] = 0


def test_expiration_is_read_only_once_the_flag_is_on() -> None:
    on, off = _State("message_ttl"), _State()
    assert message_ttl("1500", off) is None  # kept, not enforced
    assert message_ttl("junk", off) is None
    assert message_ttl(None, on) is None and message_ttl("", on) is None
    assert message_ttl("1500", on) == 1500 and message_ttl("0", on) == 0
    for bad in ("-1", "1.5", "junk", str(2**32)):
        with pytest.raises(ChannelError) as err:
            message_ttl(bad, on)
        assert err.value.code == 406 and "expiration" in err.value.text


def test_a_dead_letter_carries_rabbitmqs_x_death() -> None:
    plain = {"a": 1}
    assert with_x_death(plain, 0) is plain
    headers = {
        "foo": "bar",
        "x-death-reason": "expired",
        "x-death-queue": "work",
        "x-death-exchange": "dlx",
        "x-death-routing-key": "k",
        PROPERTIES_KEY: {"expiration": "500", "content_type": "text/plain",
                         "exchange": "jobs", "routing_key": "work.1"},
    }
    out = with_x_death(headers, 1_700_000_000_123)
    (death,) = out["x-death"]
    assert death == {
        "count": 1, "reason": "expired", "queue": "work",
        "time": datetime.datetime.fromtimestamp(1_700_000_000, tz=datetime.UTC),
        "exchange": "jobs", "routing-keys": ["work.1"], "original-expiration": "500",
    }
    assert "expiration" not in out[PROPERTIES_KEY]  # it would expire again
    assert out[PROPERTIES_KEY]["content_type"] == "text/plain"
    assert headers[PROPERTIES_KEY]["expiration"] == "500"  # (a copy: the stored one stays)
    assert (out["x-first-death-reason"], out["x-first-death-queue"],
            out["x-first-death-exchange"]) == ("expired", "work", "jobs")
    assert (out["x-last-death-reason"], out["x-last-death-queue"]) == ("expired", "work")
    # Died again elsewhere: the latest first, then the first one.
    again = with_x_death({**headers, "x-death-reason": "delivery-limit", "x-death-queue": "dlq",
                          "x-first-death-reason": "expired", "x-first-death-queue": "work"}, 0)
    assert [(d["reason"], d["queue"]) for d in again["x-death"]] == [
        ("delivery_limit", "dlq"), ("expired", "work")]
    assert again["x-first-death-reason"] == "expired"
    assert again["x-last-death-reason"] == "delivery_limit"


def test_an_expired_message_is_routed_by_its_headers_through_a_headers_exchange() -> None:
    """aio-pika's RPC: a call with a TTL dead-letters through a headers exchange bound on
    its From header, to the caller's reply queue (the index keeps such messages' headers,
    with their TTL, until they leave)."""
    c, a, _ = _flagged()
    _at(c, a, DeclareExchange("rpc.dlx", "headers"), 10000)
    _at(c, a, DeclareQueue("reply"), 10000)
    _at(c, a, DeclareQueue("other"), 10000)
    _at(c, a, Bind("reply", "rpc.dlx", "", {"From": "reply", "x-match": "any"}), 10000)
    _at(c, a, Bind("other", "rpc.dlx", "", {"From": "other", "x-match": "any"}), 10000)
    _at(c, a, DeclareQueue("calls", dead_letter_exchange="rpc.dlx"), 10000)
    call = (b"call", {"From": "reply", "amqp-properties": {"expiration": "5"}})
    _at(c, a, Enqueue("calls", (call, (b"plain", {"From": "other"})), ttls=(5, None)), 10000)
    q = c.state.queues["calls"]
    assert q.dl_headers == {0: {"From": "reply"}}  # (only the one with a TTL)
    assert len(q.snapshot()) == 24
    assert QueueState.restore(q.snapshot()).snapshot() == q.snapshot()
    assert _at(c, a, Expire("calls", -1), 10006).result == Counted(1)
    assert c.state.queues["reply"].ready == 1 and c.state.queues["other"].ready == 0
    assert not q.dl_headers and not q.ttls and len(q.snapshot()) == 19
