"""Publishes forwarded between data partitions (cluster/forwarding.py, docs/design.md
§16): a FanOut kept on its home partition, each entry taken once by its target in number
order, dropped at home by ForwardDone. Two states stand for two partitions."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest

from batonmq.cluster.codec import MalformedEvent, decode, encode
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import (
    DeclareQueue, EnableFeatures, FanOut, ForwardDone, ForwardIn, Heartbeat, Origin,
)
from batonmq.cluster.features import FEATURES
from batonmq.cluster.forwarding import ForwardGap, Outbound
from batonmq.cluster.snapshot import digest
from batonmq.cluster.state import State
from tests.unit.test_membership import Cluster
from tests.unit.test_placement import _flagged
from tests.unit.test_queue_expiry import _at as _applied_at

A = "n1/r1"
MSG = ((b"hello", {"h": 1}),)


def _partition(k: int, *queues: str):  # type: ignore[no-untyped-def]
    c = _flagged()
    c.state.data_partition = k
    for q in queues:
        assert c.apply(A, DeclareQueue(q)).error is None
    return c


def _fan_out(home, n: int = 1):  # type: ignore[no-untyped-def]
    done = home.apply(A, FanOut(("a",), ((b"m%d" % n, {}),), (), "x", "", 0, 0, 0,
                                ((2, ("b", "c")),)))
    assert done.error is None, done.error
    return done.result


def _entry_in(target, home, n: int):  # type: ignore[no-untyped-def]
    (number, e), *_ = [(m, e) for m, e in home.state.forwards.pending(2) if m == n]
    return target.apply(A, ForwardIn(1, number, e.queues, e.messages, e.keys, e.exchange,
                                      e.routing_key, e.delay_ms, e.not_before, e.priority))


def test_a_fan_out_is_enqueued_at_home_and_kept_for_the_other_partition() -> None:
    home = _partition(1, "a")
    routed = _fan_out(home)
    assert routed.queues == ["a", "b", "c"] and routed.positions == [0, -1, -1]
    assert home.state.queues["a"].ready == 1
    (number, entry), = home.state.forwards.pending(2)
    assert number == 0 and entry.queues == ("b", "c") and entry.messages == ((b"m1", {}),)


def test_each_entry_is_taken_once_and_in_order_then_dropped_at_home() -> None:
    home, target = _partition(1, "a"), _partition(2, "b", "c")
    for n in range(3):
        _fan_out(home, n)
    # A gap (entry 1 before entry 0) is refused and changes nothing.
    gap = _entry_in(target, home, 1)
    assert isinstance(gap.error, ForwardGap) and target.state.queues["b"].ready == 0
    assert _entry_in(target, home, 0).error is None
    # Sent again (a forwarder died before ForwardDone): a duplicate, not enqueued again.
    again = _entry_in(target, home, 0)
    assert again.error is None and again.result.queues == []
    assert target.state.ignored.get("duplicate-forward") == 1
    assert _entry_in(target, home, 1).error is None
    assert [target.state.queues[q].ready for q in ("b", "c")] == [2, 2]
    assert home.apply(A, ForwardDone(2, 1)).error is None
    assert [n for n, _ in home.state.forwards.pending(2)] == [2]
    assert _entry_in(target, home, 2).error is None
    assert home.apply(A, ForwardDone(2, 2)).error is None
    assert home.state.forwards.pending(2) == [] and not home.state.forwards.outbound
    assert [target.state.queues[q].ready for q in ("b", "c")] == [3, 3]


def test_pending_entries_are_replicated_state_and_reach_a_joiner() -> None:
    home = _partition(1, "a")
    _fan_out(home)
    restored = State()
    restored.restore_meta(home.state.meta_snapshot())
    assert restored.forwards.snapshot() == home.state.forwards.snapshot()
    joined = State()
    joined.install(home.state.full_snapshot())
    assert joined.forwards.pending(2) == home.state.forwards.pending(2)
    assert digest(joined) == digest(home.state)
    target = _partition(2, "b", "c")
    assert _entry_in(target, home, 0).error is None
    t2 = State()
    t2.install(target.state.full_snapshot())
    assert t2.forwards.expected == {1: 1}  # a joiner of the target knows what it took


def test_bad_forwards_are_refused() -> None:
    home = _partition(1, "a")
    for forward in ((), ((1, ("b",)),), ((2, ("b",)), (2, ("c",))), ((0, ("b",)),), ((2, ()),)):
        done = home.apply(A, FanOut(("a",), MSG, (), "x", "", 0, 0, 0, forward))
        assert isinstance(done.error, InvalidArgument), forward
    assert not home.state.forwards.outbound and home.state.queues["a"].ready == 0
    done = home.apply(A, ForwardIn(1, 0, ("a",), MSG))
    assert isinstance(done.error, InvalidArgument)  # from itself


# -- a message's own TTL (flag message_ttl) carried by FanOut and ForwardIn ------------


def _at(c, ev, ts: int):  # type: ignore[no-untyped-def]
    """Apply ``ev`` with envelope time ``ts`` (the replicated clock)."""
    return _applied_at(c, A, ev, ts)


def test_fan_out_and_forward_in_without_ttls_are_the_records_older_builds_write() -> None:
    origin = Origin("n", "r", 1, 0)
    fan = FanOut(("a",), MSG, (), "x", "", 0, 0, 0, ((2, ("b",)),))
    fwd = ForwardIn(1, 0, ("b",), MSG, (), "x")
    for plain in (fan, fwd):
        # (the fields before ttls, as the builds before it write them)
        assert encode(origin, plain) == encode(origin, plain.__class__(
            *(getattr(plain, f) for f in plain.__slots__ if f != "ttls")))
        assert len(msgpack.unpackb(encode(origin, plain))) == 5 + len(plain.__slots__) - 1
        assert decode(encode(origin, plain))[1] == plain
    for own in (replace(fan, messages=MSG * 2, ttls=(500, None)), replace(fwd, ttls=(0,))):
        assert decode(encode(origin, own))[1] == own


@pytest.mark.parametrize("ttls", [[1, 2], [-1], ["5"], 7])
@pytest.mark.parametrize("ev", [
    FanOut(("a",), MSG, (), "x", "", 0, 0, 0, ((2, ("b",)),), (1,)),
    ForwardIn(1, 0, ("b",), MSG, ttls=(1,)),
])
def test_bad_ttls_in_a_fan_out_or_forward_in_record_are_malformed(
    ev: FanOut | ForwardIn, ttls: object
) -> None:
    good = msgpack.unpackb(encode(Origin("n", "r", 1, 0), ev))
    good[-1] = ttls
    with pytest.raises(MalformedEvent):
        decode(msgpack.packb(good))


def test_without_the_flag_ttls_are_refused_and_nothing_changes() -> None:
    c = Cluster()
    c.apply(A, Heartbeat("voter", "addr", {"features": sorted(FEATURES)}))
    c.duties()
    flags = tuple(f for f in FEATURES if f != "message_ttl")
    assert c.apply(A, EnableFeatures(flags)).error is None
    c.state.data_partition = 1
    assert c.apply(A, DeclareQueue("a")).error is None
    before = digest(c.state)
    for ev in (FanOut(("a",), MSG, (), "x", "", 0, 0, 0, ((2, ("b",)),), (5,)),
               ForwardIn(2, 0, ("a",), MSG, ttls=(5,))):
        refused = c.apply(A, ev)
        assert isinstance(refused.error, InvalidArgument), ev
        assert "message_ttl" in str(refused.error)
    assert not c.state.forwards and c.state.queues["a"].ready == 0
    # Without ttls they are taken as before the flag.
    assert c.apply(A, FanOut(("a",), MSG, (), "x", "", 0, 0, 0, ((2, ("b",)),))).error is None
    assert c.state.queues["a"].ready == 1 and digest(c.state) != before


def test_each_message_keeps_its_ttl_at_home_and_where_it_is_forwarded() -> None:
    home, target = _partition(1, "a"), _partition(2, "b", "c")
    two = ((b"brief", {}), (b"plain", {}))
    done = _at(home, FanOut(("a",), two, (), "x", "", 0, 0, 0, ((2, ("b", "c")),),
                            (100, None)), 10_000)
    assert done.error is None, done.error
    # At home: from the FanOut's apply, by the home's replicated clock.
    assert home.state.queues["a"].ttls == {0: 10_100}
    (number, entry), = home.state.forwards.pending(2)
    assert entry.ttls == (100, None)
    # Kept with the entry: in the stored state and in a joiner's.
    restored = State()
    restored.restore_meta(home.state.meta_snapshot())
    assert restored.forwards.pending(2) == home.state.forwards.pending(2)
    joined = State()
    joined.install(home.state.full_snapshot())
    assert joined.forwards.pending(2)[0][1].ttls == (100, None)
    assert digest(joined) == digest(home.state)
    # On the target: from the ForwardIn's apply, by the target's replicated clock.
    got = _at(target, ForwardIn(1, number, entry.queues, entry.messages, entry.keys,
                                entry.exchange, entry.routing_key, entry.delay_ms,
                                entry.not_before, entry.priority, entry.ttls), 25_000)
    assert got.error is None, got.error
    assert [target.state.queues[q].ttls for q in ("b", "c")] == [{0: 25_100}] * 2
    assert [target.state.queues[q].ready for q in ("b", "c")] == [2, 2]


def test_an_entry_without_ttls_is_stored_as_before_and_old_entries_still_read() -> None:
    plain = Outbound(("b",), MSG, (), "x", "", 0, 0, 0, 7)
    dead = Outbound(("b",), (), (), "x", "", 0, 0, 0, 7, 3)
    own = Outbound(("b",), MSG, (), "x", "", 0, 0, 0, 7, ttls=(5,))
    assert len(plain.snapshot()) == 9 and len(dead.snapshot()) == 10  # (as before)
    assert own.snapshot()[9:] == [-1, [5]]
    for e in (plain, dead, own):
        assert Outbound.restore(msgpack.unpackb(msgpack.packb(e.snapshot()))) == e


def test_bad_ttls_or_priority_are_refused_before_an_entry_is_taken_or_kept() -> None:
    home, target = _partition(1), _partition(2, "b")  # (no queue at home: none checks)
    for bad in ((5, 6), (2**32,)):
        done = home.apply(A, FanOut(("a",), MSG, (), "x", "", 0, 0, 0, ((2, ("b",)),), bad))
        assert isinstance(done.error, InvalidArgument), bad
        done = target.apply(A, ForwardIn(1, 0, ("b",), MSG, ttls=bad))
        assert isinstance(done.error, InvalidArgument), bad
    done = target.apply(A, ForwardIn(1, 0, ("b",), MSG, priority=10))
    assert isinstance(done.error, InvalidArgument)
    assert not home.state.forwards and not target.state.forwards.expected
    assert target.state.queues["b"].ready == 0
