"""Range readers in the pure state machine (docs/design.md §11): Reserve keeps consumers, TTL
and drop-head away from a queue; AcceptThrough accepts every ready message below a
position, only for the holder, cumulatively and idempotently; replicas agree."""

from __future__ import annotations

from typing import Any, TypeVar, cast

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batonmq.cluster.errors import InvalidArgument, QueueFull, QueueReserved, StaleToken
from batonmq.cluster import codec
from batonmq.cluster.codec import MalformedEvent
from batonmq.cluster.events import (
    AcceptThrough,
    Acquire,
    Candidate,
    DeclareQueue,
    Enqueue,
    Event,
    Expire,
    Heartbeat,
    Interest,
    Origin,
    Propose,
    Release,
    Reserve,
    Resign,
    Vote,
)
from batonmq.cluster.results import AcceptedThrough, Counted, Reserved
from batonmq.cluster.effects import Acquired, Completed, Effect, ReadyMore, Removed, RemovedRange
from batonmq.cluster.queues import MessageState, QueueState, TRANSITIONS
from batonmq.cluster.state import State

R = TypeVar("R")

__all__: list[str] = []

MEMBER = "n1/r1"
CONSUMER = "n1/r1/1"


class Log:
    """Records applied through the codec to any number of replicas."""

    def __init__(self, *replicas: State, **queue: Any) -> None:
        self.replicas = list(replicas)
        self.seq = 0
        self.offset = -1
        self.apply(Heartbeat("voter", "", {}))
        self.apply(Propose(1, (MEMBER,), "c"))
        self.apply(Vote(1, True))
        self.apply(DeclareQueue("q", **queue))
        self.apply(Interest("q", True))  # n1 owns q: its acquires count

    def apply(self, ev: Event) -> tuple[Completed, list[Effect]]:
        self.seq += 1
        self.offset += 1
        record = codec.encode(Origin("n1", "r1", self.seq, 1000 + self.seq), ev)
        origin, decoded = codec.decode(record)
        assert decoded == ev
        outs = []
        for state in self.replicas:
            out: list[Effect] = []
            state.apply(self.offset, origin, decoded, out)
            outs.append(out)
        done = [e for e in outs[0] if isinstance(e, Completed)]
        assert len(done) == 1
        return done[0], outs[0]

    def ok(self, ev: Event[R]) -> R:
        done, _ = self.apply(ev)
        assert done.error is None, done.error
        assert done.result is not None
        return cast(R, done.result)

    def publish(self, n: int) -> None:
        self.ok(Enqueue("q", tuple((b"m%d" % i, {}) for i in range(n))))


def test_a_reserved_queue_gives_consumers_nothing_until_released() -> None:
    s = State()
    log = Log(s)
    log.publish(5)
    assert log.ok(Reserve("q", "spark")) == Reserved(
        reserved_by="spark", acquired=0, head=0, next_position=5,
    )
    done, out = log.apply(Acquire("q", CONSUMER, 3))
    assert done.result == Counted(0)
    assert not any(isinstance(e, Acquired) for e in out)
    assert s.ignored["reserved"] == 1
    done, out = log.apply(Reserve("q", None))
    assert isinstance(done.result, Reserved) and done.result.reserved_by is None
    assert ReadyMore("q") in out  # wakes the consumers
    assert log.ok(Acquire("q", CONSUMER, 3)) == Counted(3)


def test_reserve_is_idempotent_for_the_holder_and_refused_for_another() -> None:
    s = State()
    log = Log(s)
    log.ok(Reserve("q", "a"))
    log.ok(Reserve("q", "a"))
    done, _ = log.apply(Reserve("q", "b"))
    assert isinstance(done.error, QueueReserved)
    assert s.queues["q"].reserved_by == "a"
    done, _ = log.apply(Reserve("q", ""))
    assert done.error is not None and done.error.code == 5  # InvalidArgument


def test_reserve_reports_messages_consumers_took_before() -> None:
    log = Log(State())
    log.publish(4)
    log.ok(Acquire("q", CONSUMER, 2))
    assert log.ok(Reserve("q", "r")).acquired == 2
    log.ok(Release("q", CONSUMER, (0, 1)))
    result = log.ok(Reserve("q", "r"))
    assert (result.acquired, result.head) == (0, 0)


def test_accept_through_is_cumulative_idempotent_and_clamped() -> None:
    a, b = State(), State()
    log = Log(a, b)
    log.publish(10)
    log.ok(Reserve("q", "r"))
    done, out = log.apply(AcceptThrough("q", 4, "r"))
    assert done.result == AcceptedThrough(count=4, head=4)
    assert RemovedRange(a.queues["q"].qid, 0, 4) in out
    assert log.ok(AcceptThrough("q", 4, "r")).count == 0  # a repeat
    assert log.ok(AcceptThrough("q", 2, "r")).count == 0  # an older commit
    assert log.ok(AcceptThrough("q", 99, "r")) == AcceptedThrough(6, 10)  # clamped to the tail
    q = a.queues["q"]
    assert (q.ready, q.accepted, q.cursor, q.next_pos) == (0, 10, 10, 10)
    log.publish(2)  # later messages are not accepted by the earlier commit
    assert a.queues["q"].ready == 2
    assert a.digest() == b.digest()


def test_accept_through_takes_released_messages_and_leaves_acquired_ones() -> None:
    s = State()
    log = Log(s)
    log.publish(6)
    log.ok(Acquire("q", CONSUMER, 3))  # 0, 1, 2 with the consumer
    log.ok(Release("q", CONSUMER, (1,)))  # 1 is ready again, with a delivery count
    log.ok(Reserve("q", "r"))
    done, out = log.apply(AcceptThrough("q", 5, "r"))
    assert done.result == AcceptedThrough(count=3, head=5)  # 1, 3, 4
    qid = s.queues["q"].qid
    assert Removed(qid, [1]) in out and RemovedRange(qid, 3, 5) in out
    q = s.queues["q"]
    assert sorted(q.acquired) == [0, 2] and 1 not in q.counts
    assert q.ready == 1


def test_only_the_holder_accepts_through() -> None:
    s = State()
    log = Log(s)
    log.publish(3)
    done, _ = log.apply(AcceptThrough("q", 3, "r"))  # not reserved at all
    assert isinstance(done.error, QueueReserved)
    log.ok(Reserve("q", "r"))
    done, _ = log.apply(AcceptThrough("q", 3, "someone-else"))
    assert isinstance(done.error, QueueReserved)
    assert s.queues["q"].ready == 3 and s.ignored["not-holder"] == 2


def test_no_expiry_and_no_drop_head_under_a_reader() -> None:
    s = State()
    log = Log(s, max_length=3, overflow="drop-head", message_ttl_ms=10)
    log.publish(3)
    log.ok(Reserve("q", "r"))
    assert log.ok(Expire("q", 2)) == Counted(0)
    done, _ = log.apply(Enqueue("q", ((b"x", {}),)))
    assert isinstance(done.error, QueueFull)
    assert s.queues["q"].ready == 3
    log.ok(Reserve("q", None))
    assert log.ok(Expire("q", 0)) == Counted(1)


def test_the_reservation_survives_a_snapshot_and_is_in_the_digest() -> None:
    a, b = State(), State()
    log = Log(a, b)
    digest = a.digest()
    log.ok(Reserve("q", "r"))
    assert a.digest() != digest and a.digest() == b.digest()
    snap = msgpack.unpackb(msgpack.packb(a.queues["q"].snapshot()), strict_map_key=False)
    assert QueueState.restore(snap).reserved_by == "r"
    assert QueueState.restore(snap[:13]).reserved_by is None  # a snapshot from before


def test_codec_checks_the_new_events() -> None:
    origin = Origin("n", "r", 1, 1)
    for ev in (Reserve("q", None), Reserve("q", "h"), AcceptThrough("q", 7, "h")):
        assert codec.decode(codec.encode(origin, ev))[1] == ev
    bad = msgpack.packb(["n", "r", 1, 1, AcceptThrough.OP, "q", "7", "h"])
    with pytest.raises(MalformedEvent):
        codec.decode(bad)
    bad = msgpack.packb(["n", "r", 1, 1, Reserve.OP, "q", 5])
    with pytest.raises(MalformedEvent):
        codec.decode(bad)


def test_transitions_table_has_the_accept_through_edge() -> None:
    assert TRANSITIONS[(MessageState.READY, "accept-through")] is MessageState.ACCEPTED


# --- fencing range commits by a leadership term (docs/spark.md, "Fencing") ------------------


def test_a_commit_with_the_token_of_an_older_term_is_refused_and_counted() -> None:
    s = State()
    log = Log(s)
    log.publish(10)
    first = log.ok(Candidate("import-entries", MEMBER + "/s1"))
    log.ok(Candidate("import-entries", MEMBER + "/s2"))  # the standby
    old = first.token
    assert old is not None
    log.ok(Reserve("q", "spark:q", "import-entries", old))
    assert log.ok(AcceptThrough("q", 3, "spark:q", "import-entries", old)).count == 3
    # The leader goes (resigned, handed over, or its broker left); the standby leads.
    after = log.ok(Resign("import-entries", MEMBER + "/s1"))
    new = after.token
    assert new is not None and new > old
    done, out = log.apply(AcceptThrough("q", 8, "spark:q", "import-entries", old))
    assert isinstance(done.error, StaleToken) and done.error.code == 19
    assert f"token is {new}" in done.error.message
    assert not any(isinstance(e, (Removed, RemovedRange)) for e in out)
    assert s.ignored["stale-token"] == 1
    assert s.queues["q"].head == 3  # nothing more was accepted
    done, _ = log.apply(Reserve("q", "spark:q", "import-entries", old))
    assert isinstance(done.error, StaleToken) and s.ignored["stale-token"] == 2
    # The new term commits; so does a reader without leadership (unfenced, as before).
    assert log.ok(AcceptThrough("q", 8, "spark:q", "import-entries", new)).count == 5
    assert log.ok(AcceptThrough("q", 9, "spark:q")).count == 1
    # With no leader at all, every token is stale.
    log.ok(Resign("import-entries", MEMBER + "/s2"))
    done, _ = log.apply(AcceptThrough("q", 10, "spark:q", "import-entries", new))
    assert isinstance(done.error, StaleToken) and "no leader" in done.error.message


def test_a_fencing_token_needs_its_service() -> None:
    log = Log(State())
    done, _ = log.apply(AcceptThrough("q", 1, "spark:q", "", 5))
    assert isinstance(done.error, InvalidArgument)


def test_records_without_the_fencing_fields_decode_as_unfenced() -> None:
    # An older broker's records: [node, runtime, seq, ts, op, queue, through, holder].
    old = msgpack.packb(["n1", "r1", 1, 5, AcceptThrough.OP, "q", 4, "spark:q"])
    assert codec.decode(old)[1] == AcceptThrough("q", 4, "spark:q", "", -1)
    bad = msgpack.packb(["n1", "r1", 1, 5, AcceptThrough.OP, "q", 4, "spark:q", "svc", "7"])
    with pytest.raises(MalformedEvent):
        codec.decode(bad)


@given(st.lists(st.tuples(st.sampled_from(["lead", "resign", "commit"]), st.integers(0, 3),
                          st.integers(-1, 40)), max_size=40))
@settings(max_examples=150, deadline=None)
def test_only_the_current_terms_token_commits(steps: list[tuple[str, int, int]]) -> None:
    """Against a model of the terms: a fenced commit is applied iff its token is the
    current term's, and the queue accepts exactly through the highest applied commit."""
    s = State()
    log = Log(s)
    log.publish(40)
    log.ok(Reserve("q", "spark:q"))
    candidates: list[str] = []  # the model: candidates in log order, the first leads
    token: int | None = None
    issued: list[int] = []
    accepted_through, refused = 0, 0
    for what, who, n in steps:
        session = f"{MEMBER}/s{who}"
        if what == "lead":
            log.apply(Candidate("svc", session))
            if session not in candidates:
                candidates.append(session)
                if len(candidates) == 1:
                    token = log.offset
                    issued.append(token)
        elif what == "resign":
            log.apply(Resign("svc", session))
            if session in candidates:
                led = candidates[0] == session
                candidates.remove(session)
                if led:
                    token = log.offset if candidates else None
                    if token is not None:
                        issued.append(token)
        else:
            # A token of some term (current or stale), or one never issued.
            t = issued[n % len(issued)] if issued and n >= 0 else max(n, 0) + 1000
            done, _ = log.apply(AcceptThrough("q", n + 1, "spark:q", "svc", t))
            if t == token:
                assert done.error is None, done.error
                accepted_through = max(accepted_through, min(n + 1, 40))  # 40 published
            else:
                assert isinstance(done.error, StaleToken), (t, token, done.error)
                refused += 1
    assert s.queues["q"].head == accepted_through
    assert s.ignored.get("stale-token", 0) == refused
