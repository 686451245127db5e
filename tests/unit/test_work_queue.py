"""Work-queue semantics in the pure state machine: the two counters, delayed messages and
the retry policy (docs/events.md, "The two counters", "Delayed messages and retries"),
and the codec reading records written before their fields existed."""

from __future__ import annotations

from typing import Any, TypeVar, cast

import msgpack
import pytest

from batonmq.cluster import codec
from batonmq.cluster.codec import MalformedEvent
from batonmq.cluster.effects import Acquired, Completed, Effect
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import (
    Acquire,
    Handoff,
    DeclareQueue,
    Enqueue,
    Event,
    Expire,
    Heartbeat,
    Interest,
    Origin,
    Propose,
    PurgeQueue,
    Release,
    ReleaseAll,
    Vote,
)
from batonmq.cluster.queues import QueueState
from batonmq.cluster.results import Owner
from batonmq.cluster.state import State

R = TypeVar("R")

CONSUMER = "n1/r1/1"


class Log:
    """Records applied through the codec to a State; ``ts`` is the envelope time (ms)
    of the next record (each record moves it on by ``step``)."""

    def __init__(self, **queue: Any) -> None:
        self.state = State()
        self.seq = 0
        self.ts = 1000
        self.apply(Heartbeat("voter", "", {}))
        self.apply(Propose(1, ("n1/r1",), "c"))
        self.apply(Vote(1, True))
        self.apply(DeclareQueue("dlq"))
        self.apply(DeclareQueue("q", dead_letter="dlq", **queue))
        self.apply(Interest("q", True))

    @property
    def q(self) -> QueueState:
        return self.state.queues["q"]

    def apply(self, ev: Event[Any], at: int | None = None) -> tuple[Completed, list[Effect]]:
        self.seq += 1
        self.ts = self.ts + 1 if at is None else at
        record = codec.encode(Origin("n1", "r1", self.seq, self.ts), ev)
        origin, decoded = codec.decode(record)
        assert decoded == ev
        out: list[Effect] = []
        self.state.apply(self.seq, origin, decoded, out)
        done = [e for e in out if isinstance(e, Completed)]
        assert len(done) == 1
        return done[0], out

    def ok(self, ev: Event[R], at: int | None = None) -> R:
        done, _ = self.apply(ev, at)
        assert done.error is None, done.error
        return cast(R, done.result)

    def take(self, n: int, at: int | None = None) -> list[tuple[int, int, int]]:
        """Acquire up to ``n`` at time ``at``: (position, delivery count, acquired count)."""
        _, out = self.apply(Acquire("q", CONSUMER, n), at)
        got = [e for e in out if isinstance(e, Acquired)]
        if not got:
            return []
        return list(zip(got[0].positions, got[0].counts, got[0].acquired))


# --- the two counters ------------------------------------------------------------------------


def test_not_now_raises_the_acquired_count_and_failed_the_delivery_count() -> None:
    log = Log(delivery_limit=2)
    log.ok(Enqueue("q", ((b"m", {}),)))
    assert log.take(1) == [(0, 0, 0)]
    log.ok(Release("q", CONSUMER, (0,), False))
    assert log.take(1) == [(0, 0, 1)]
    log.ok(Release("q", CONSUMER, (0,), True))
    assert log.take(1) == [(0, 1, 2)]
    log.ok(Release("q", CONSUMER, (0,), False))  # "not now" never dead-letters
    assert log.take(1) == [(0, 1, 3)]
    log.ok(Release("q", CONSUMER, (0,), True))  # the second failure: limit 2
    assert 0 not in log.q.counts and not log.q.holds(0)
    assert (log.q.acquisitions, log.q.failed_deliveries, log.q.given_back) == (4, 2, 2)
    assert log.state.queues["dlq"].ready == 1


def test_release_all_counts_only_the_named_failures() -> None:
    log = Log()
    log.ok(Enqueue("q", tuple((b"m", {}) for _ in range(4))))
    log.take(4)
    log.ok(ReleaseAll("q", CONSUMER, (), (1, 3)))
    assert log.q.counts == {1: 1, 3: 1}
    assert log.q.acq_counts == {0: 1, 1: 1, 2: 1, 3: 1}
    assert (log.q.failed_deliveries, log.q.given_back, log.q.ready) == (2, 2, 4)


# --- records from before the fields --------------------------------------------------------


def _record(op: int, *fields: Any) -> bytes:
    return cast(bytes, msgpack.packb(["n1", "r1", 1, 5, op, *fields], use_bin_type=True))


def test_old_records_keep_their_meaning() -> None:
    _, release = codec.decode(_record(Release.OP, "q", CONSUMER, [1, 2]))
    assert release == Release("q", CONSUMER, (1, 2), failed=True, delay_ms=0)
    _, release_all = codec.decode(_record(ReleaseAll.OP, "q", CONSUMER, [2]))
    assert release_all == ReleaseAll("q", CONSUMER, (2,), None)
    _, enqueue = codec.decode(_record(Enqueue.OP, "q", [[b"b", {}]], [["k", 1]]))
    assert enqueue == Enqueue("q", ((b"b", {}),), (("k", 1),), 0, 0)
    _, declare = codec.decode(_record(DeclareQueue.OP, "q", True, None, "drop-head", 3, None, None))
    assert declare == DeclareQueue("q", True, None, "drop-head", 3)
    assert declare.retry == "" and declare.retry_max_ms is None


@pytest.mark.parametrize(
    "fields",
    [
        (Release.OP, "q", CONSUMER, [1], 1),  # failed must be a bool
        (Release.OP, "q", CONSUMER, [1], True, "5"),
        (ReleaseAll.OP, "q", CONSUMER, [], [-1]),
        (Enqueue.OP, "q", [[b"b", {}]], [], True),
    ],
)
def test_bad_new_fields_are_malformed(fields: tuple[Any, ...]) -> None:
    with pytest.raises(MalformedEvent):
        codec.decode(_record(*fields))


def test_old_snapshots_restore() -> None:
    log = Log()
    log.ok(Enqueue("q", ((b"m", {}),)))
    snap = log.q.snapshot()
    old = snap[:14]
    old[2] = old[2][:6]  # six settings, no counters, no delayed messages
    q = QueueState.restore(old)
    assert (q.retry, q.retry_max_ms, q.delayed, q.acquisitions, q.ready) == ("", None, {}, 0, 1)


# --- delays -------------------------------------------------------------------------------


def test_a_delayed_release_is_ready_exactly_at_its_time() -> None:
    log = Log()
    log.ok(Enqueue("q", ((b"m", {}),)))
    log.take(1, at=2000)
    log.ok(Release("q", CONSUMER, (0,), False, 500), at=2000)
    assert (log.q.ready, log.q.delayed) == (0, {0: 2500})
    assert log.take(1, at=2499) == []
    assert log.take(1, at=2500) == [(0, 0, 1)]


def test_a_delayed_publish_keeps_its_position_among_ready_ones() -> None:
    log = Log()
    log.ok(Enqueue("q", ((b"a", {}),)), at=2000)
    log.ok(Enqueue("q", ((b"b", {}), (b"c", {})), (), 100), at=2000)
    log.ok(Enqueue("q", ((b"d", {}),)), at=2000)
    assert (log.q.ready, log.q.length) == (2, 4)
    assert [p for p, _, _ in log.take(10, at=2050)] == [0, 3]
    assert log.q.ready == 0 and log.q.delayed == {1: 2100, 2: 2100}
    assert [p for p, _, _ in log.take(10, at=2100)] == [1, 2]


def test_not_before_and_delay_take_the_later_time() -> None:
    log = Log()
    log.ok(Enqueue("q", ((b"a", {}),), (), 10, 5000), at=2000)
    assert log.q.delayed == {0: 5000}
    log.ok(Enqueue("q", ((b"b", {}),), (), 0, 1500), at=2000)  # already past: ready
    assert log.q.delayed == {0: 5000} and log.q.ready == 1


def test_expiry_passes_delayed_messages_by_and_purge_drops_them() -> None:
    log = Log(message_ttl_ms=1)
    log.ok(Enqueue("q", ((b"a", {}),)), at=2000)
    log.ok(Enqueue("q", ((b"b", {}),), (), 1000), at=2000)
    log.ok(Enqueue("q", ((b"c", {}),)), at=2000)
    log.ok(Expire("q", 2), at=2001)
    assert log.q.expired == 2 and log.q.delayed == {1: 3000} and log.q.length == 1
    restored = QueueState.restore(log.q.snapshot())
    assert (restored.ready, restored.length, restored.delayed_ahead) == (0, 1, 0)
    assert log.ok(PurgeQueue("q")).purged == 1
    assert log.q.length == 0 and log.q.delayed == {}


def test_negative_delays_are_refused_before_any_change() -> None:
    log = Log()
    done, _ = log.apply(Enqueue("q", ((b"a", {}),), (), -1))
    assert isinstance(done.error, InvalidArgument) and log.q.next_pos == 0
    log.ok(Enqueue("q", ((b"a", {}),)))
    log.take(1)
    done, _ = log.apply(Release("q", CONSUMER, (0,), True, -5))
    assert isinstance(done.error, InvalidArgument) and log.q.acquired == {0: CONSUMER}


@pytest.mark.parametrize(
    "policy,waits",
    [
        ("fixed", [100, 100, 100]),
        ("linear", [100, 200, 250]),
        ("exponential", [100, 200, 250]),  # capped by retry_max_ms
    ],
)
def test_the_retry_policy_delays_failed_deliveries(policy: str, waits: list[int]) -> None:
    log = Log(delivery_limit=10, retry=policy, retry_delay_ms=100, retry_max_ms=250)
    log.ok(Enqueue("q", ((b"m", {}),)))
    now = 2000
    for wait in waits:
        log.take(1, at=now)
        log.ok(Release("q", CONSUMER, (0,), True), at=now)
        assert log.q.delayed == {0: now + wait}
        assert log.take(1, at=now + wait - 1) == []
        now += wait
    log.take(1, at=now)
    log.ok(Release("q", CONSUMER, (0,), False), at=now)  # "not now": no policy delay
    assert log.q.delayed == {} and log.q.ready == 1


@pytest.mark.parametrize(
    "settings",
    [
        {"retry": "sometimes", "retry_delay_ms": 10},
        {"retry": "fixed"},
        {"retry": "fixed", "retry_delay_ms": 10, "retry_max_ms": 5},
        {"retry_delay_ms": 10},
    ],
)
def test_bad_retry_settings_are_refused(settings: dict[str, Any]) -> None:
    log = Log()
    done, _ = log.apply(DeclareQueue("r", **settings))
    assert isinstance(done.error, InvalidArgument) and "r" not in log.state.queues


# --- priorities ----------------------------------------------------------------------------


def test_a_priority_queue_offers_higher_priorities_first_in_position_order() -> None:
    log = Log(max_priority=5)
    log.ok(Enqueue("q", ((b"a", {}), (b"b", {}))))  # priority 0
    log.ok(Enqueue("q", ((b"c", {}),), (), 0, 0, 9))  # capped at 5
    log.ok(Enqueue("q", ((b"d", {}), (b"e", {})), (), 0, 0, 3))
    assert log.q.prio == {2: 5, 3: 3, 4: 3} and log.q.ready == 5
    assert [p for p, _, _ in log.take(2)] == [2, 3]
    # Released, a message keeps its priority: 2 (5) goes before 4 (3), 3 before 0.
    log.ok(Release("q", CONSUMER, (2, 3), False))
    assert [p for p, _, _ in log.take(5)] == [2, 3, 4, 0, 1]
    assert log.q.ready == 0 and log.q.head == log.q.next_pos


def test_priority_queue_snapshots_expiry_and_purge() -> None:
    log = Log(max_priority=3, message_ttl_ms=1)
    log.ok(Enqueue("q", ((b"a", {}),)))
    log.ok(Enqueue("q", ((b"b", {}),), (), 0, 0, 2))
    log.ok(Enqueue("q", ((b"c", {}),), (), 0, 0, 1))
    restored = QueueState.restore(log.q.snapshot())
    assert restored.snapshot() == log.q.snapshot() and restored.take_ready(3) == [1, 2, 0]
    assert log.q.head == 0
    log.ok(Expire("q", 1))
    assert log.q.expired == 2 and log.q.ready == 1 and log.q.prio == {2: 1}
    assert log.ok(PurgeQueue("q")).purged == 1
    assert log.q.ready == 0 and log.q.prio == {}


def test_priority_is_ignored_on_other_queues_and_checked() -> None:
    log = Log()
    log.ok(Enqueue("q", ((b"a", {}),), (), 0, 0, 7))
    assert log.q.prio == {} and log.q.ready == 1
    done, _ = log.apply(Enqueue("q", ((b"a", {}),), (), 0, 0, 10))
    assert isinstance(done.error, InvalidArgument)
    done, _ = log.apply(DeclareQueue("r", max_priority=10))
    assert isinstance(done.error, InvalidArgument)


# --- single active consumer ------------------------------------------------------------------


def test_a_single_active_consumer_queue_stays_and_passes_on_in_interest_order() -> None:
    state = State()
    seqs: dict[str, int] = {}
    members = ("n1/r1", "n2/r2", "n3/r3")

    def apply(who: str, ev: Event[Any]) -> Completed:
        seqs[who] = seqs.get(who, 0) + 1
        node, runtime = who.split("/")
        out: list[Effect] = []
        state.apply(sum(seqs.values()), Origin(node, runtime, seqs[who], 1000), ev, out)
        return next(e for e in out if isinstance(e, Completed))

    for m in members:
        apply(m, Heartbeat("voter", "", {}))
    apply("n1/r1", Propose(1, members, "c"))
    for m in members:
        apply(m, Vote(1, True))
    assert apply("n1/r1", DeclareQueue("q", single_active_consumer=True)).error is None
    for m in ("n2/r2", "n3/r3", "n1/r1"):  # interest in this order: n2 owns it
        apply(m, Interest("q", True))
    q = state.queues["q"]
    assert q.owner == "n2/r2" and q.stats()["single_active_consumer"] is True
    assert apply("n2/r2", Handoff("q")).result == Owner("n2/r2")  # no time slices
    apply("n2/r2", Interest("q", False))
    assert q.owner == "n3/r3"  # next in interest order (view order would give n1)


# --- the dedupe window ---------------------------------------------------------------------


def test_a_publish_key_is_remembered_for_its_queues_window() -> None:
    log = Log(dedupe_window_ms=1000)
    first = log.ok(Enqueue("q", ((b"a", {}),), (("k", 1),)), at=5000)
    again = log.ok(Enqueue("q", ((b"a", {}),), (("k", 1),)), at=5999)
    assert (first.first_position, again.first_position, log.q.next_pos) == (0, 0, 1)
    later = log.ok(Enqueue("q", ((b"a", {}),), (("k", 1),)), at=6000)  # the window passed
    assert later.first_position == 1 and log.q.next_pos == 2
    assert log.state.keys == {(log.q.qid, "k"): (1, 7000)}  # the old entry is forgotten
    # Replicas restored from the keys agree (the times are part of the digest).
    restored = State()
    restored.restore_meta(log.state.meta_snapshot())
    restored.restore_keys(log.state.key_entries())
    for name, q in log.state.queues.items():
        restored.queues[name] = QueueState.restore(q.snapshot())
    assert restored.digest() == log.state.digest()


def test_a_zero_window_never_deduplicates_and_windows_are_per_queue() -> None:
    log = Log(dedupe_window_ms=0)
    log.ok(DeclareQueue("long", dedupe_window_ms=10_000))
    log.ok(Enqueue("q", ((b"a", {}),), (("k", 1),)), at=5000)
    log.ok(Enqueue("q", ((b"a", {}),), (("k", 1),)), at=5001)
    assert log.q.next_pos == 2 and log.state.keys == {}
    log.ok(Enqueue("long", ((b"a", {}),), (("k", 1),)), at=5000)
    log.ok(Enqueue("long", ((b"a", {}),), (("k", 1),)), at=14_999)
    assert log.state.queues["long"].next_pos == 1
    done, _ = log.apply(DeclareQueue("bad", dedupe_window_ms=-1))
    assert isinstance(done.error, InvalidArgument)
