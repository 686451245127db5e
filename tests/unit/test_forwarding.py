"""Publishes forwarded between data partitions (cluster/forwarding.py, docs/design.md
§16): a FanOut kept on its home partition, each entry taken once by its target in number
order, dropped at home by ForwardDone. Two states stand for two partitions."""

from __future__ import annotations

from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import DeclareQueue, FanOut, ForwardDone, ForwardIn
from batonmq.cluster.forwarding import ForwardGap
from batonmq.cluster.snapshot import digest
from batonmq.cluster.state import State
from tests.unit.test_placement import _flagged

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
