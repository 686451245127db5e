"""Service leadership in the pure core (cluster/services.py driven by cluster/state.py):
elections, resign, handover, fencing tokens, drops at view changes, snapshots."""

from __future__ import annotations

import msgpack
import pytest

from batonmq.cluster.errors import Fenced, InvalidArgument
from batonmq.cluster import codec
from batonmq.cluster.codec import MalformedEvent
from batonmq.cluster.events import Candidate, Handover, Heartbeat, Origin, Resign
from batonmq.cluster.results import Candidacy, HandoverAsked
from batonmq.cluster.services import Services, check_candidate, host_of
from batonmq.cluster.effects import Completed, HandoverRequested, LeaderChanged
from batonmq.cluster.state import State
from tests.unit.test_membership import Cluster

A, B, C = "a/1", "b/1", "c/1"


def three() -> Cluster:
    c = Cluster()
    c.beat(A)
    c.beat(B)
    c.beat(C)
    assert c.state.membership.members == [A, B, C]
    return c


def changes(c: Cluster, service: str = "svc") -> list[LeaderChanged]:
    return [e for e in c.effects if isinstance(e, LeaderChanged) and e.service == service]


def leader(c: Cluster, service: str = "svc") -> tuple[str | None, int | None]:
    s = c.state.services.get(service)
    if s is None:
        return None, None
    return s.leader, s.token


def test_first_candidate_leads_with_its_offset_as_token() -> None:
    c = three()
    done = c.apply(A, Candidate("svc", f"{A}/s1"))
    first = c.offset
    assert done.error is None and isinstance(done.result, Candidacy)
    assert done.result.leader == f"{A}/s1" and done.result.token == first
    c.apply(B, Candidate("svc", f"{B}/s1"))
    c.apply(B, Candidate("svc", f"{A}/s1".replace(A, B)))  # the same again: no change
    assert leader(c) == (f"{A}/s1", first)
    assert c.state.services.get("svc").candidates == [f"{A}/s1", f"{B}/s1"]  # type: ignore[union-attr]
    assert changes(c) == [LeaderChanged("svc", f"{A}/s1", first, None)]


def test_resign_of_a_waiting_candidate_changes_nothing() -> None:
    c = three()
    c.apply(A, Candidate("svc", A))
    token = c.offset
    c.apply(B, Candidate("svc", B))
    done = c.apply(B, Resign("svc", B))
    assert isinstance(done.result, Candidacy) and done.result.was_candidate is True
    assert leader(c) == (A, token)
    again = c.apply(B, Resign("svc", B))
    assert again.error is None and isinstance(again.result, Candidacy)
    assert again.result.was_candidate is False
    assert len(changes(c)) == 1


def test_leader_resigns_next_in_log_order_gets_a_larger_token() -> None:
    c = three()
    c.apply(A, Candidate("svc", f"{A}/s1"))
    t1 = c.offset
    c.apply(C, Candidate("svc", f"{C}/s7"))
    c.apply(B, Candidate("svc", f"{B}/s2"))
    c.apply(A, Resign("svc", f"{A}/s1"))
    t2 = c.offset
    assert leader(c) == (f"{C}/s7", t2) and t2 > t1
    c.apply(C, Resign("svc", f"{C}/s7"))
    t3 = c.offset
    assert leader(c) == (f"{B}/s2", t3) and t3 > t2
    c.apply(B, Resign("svc", f"{B}/s2"))
    assert c.state.services.get("svc") is None  # no candidates: forgotten
    tokens = [e.token for e in changes(c) if e.leader is not None]
    assert tokens == [t1, t2, t3]
    assert changes(c)[-1].leader is None and changes(c)[-1].previous == f"{B}/s2"
    # A later term still gets a larger token: tokens are log offsets.
    c.apply(A, Candidate("svc", A))
    assert leader(c) == (A, c.offset) and c.offset > t3


def test_services_are_independent() -> None:
    c = three()
    c.apply(A, Candidate("one", A))
    c.apply(B, Candidate("two", B))
    c.apply(B, Candidate("one", B))
    assert leader(c, "one")[0] == A and leader(c, "two")[0] == B
    c.apply(A, Resign("one", A))
    assert leader(c, "one")[0] == B and leader(c, "two")[0] == B


def test_a_broker_acts_only_for_itself_and_its_sessions() -> None:
    c = three()
    for bad in (B, f"{B}/s1", "a/2/s1", f"{A}/s1/x", f"{A}/", "a"):
        done = c.apply(A, Candidate("svc", bad))
        assert isinstance(done.error, InvalidArgument), bad
    assert c.state.ignored["not-own-candidate"] == 6
    assert c.state.services.get("svc") is None
    for bad_name in ("", "x" * 256, "tab\there"):
        done = c.apply(A, Candidate(bad_name, A))
        assert isinstance(done.error, InvalidArgument)
    # Resign is checked the same way: B cannot resign A's session.
    c.apply(A, Candidate("svc", f"{A}/s1"))
    assert isinstance(c.apply(B, Resign("svc", f"{A}/s1")).error, InvalidArgument)
    assert leader(c)[0] == f"{A}/s1"


def test_non_members_are_fenced() -> None:
    c = three()
    done = c.apply("z/9", Candidate("svc", "z/9"))
    assert isinstance(done.error, Fenced)
    assert c.state.services.get("svc") is None


def test_view_change_drops_the_dead_brokers_candidates() -> None:
    c = three()
    c.apply(B, Candidate("svc", f"{B}/s1"))
    t1 = c.offset
    c.apply(B, Candidate("svc", B))
    c.apply(A, Candidate("svc", f"{A}/s3"))
    c.apply(C, Candidate("svc", f"{C}/s1"))
    for _ in range(6):  # B is killed: A and C keep beating
        c.beat(A, C)
    assert c.state.membership.members == [A, C]
    s = c.state.services.get("svc")
    assert s is not None and s.candidates == [f"{A}/s3", f"{C}/s1"]
    assert s.leader == f"{A}/s3" and s.token > t1
    last = changes(c)[-1]
    assert last == LeaderChanged("svc", f"{A}/s3", s.token, f"{B}/s1")


def test_one_term_per_service_when_several_brokers_leave_at_once() -> None:
    c = three()
    c.apply(A, Candidate("svc", A))
    c.apply(B, Candidate("svc", B))
    c.apply(C, Candidate("svc", C))
    before = len(changes(c))
    # A and B go in one view change (both suspected by C's beats).
    for _ in range(6):
        c.apply(C, Heartbeat("voter", "", {}))
    c.duties()
    assert c.state.membership.members == [C]
    new = changes(c)[before:]
    assert len(new) == 1 and new[0].leader == C and new[0].previous == A
    assert leader(c) == (C, new[0].token)


def test_view_change_with_no_live_candidate_leaves_no_leader() -> None:
    c = three()
    c.apply(B, Candidate("svc", f"{B}/s1"))
    for _ in range(6):
        c.beat(A, C)
    assert c.state.services.get("svc") is None
    assert changes(c)[-1].leader is None


def test_handover_waits_for_the_leader_to_resign() -> None:
    c = three()
    c.apply(A, Candidate("svc", f"{A}/s1"))
    t1 = c.offset
    c.apply(B, Candidate("svc", f"{B}/s1"))
    done = c.apply(C, Handover("svc"))
    assert done.result == HandoverAsked(service="svc", leader=f"{A}/s1", token=t1, to=None)
    req = [e for e in c.effects if isinstance(e, HandoverRequested)]
    assert req == [HandoverRequested("svc", f"{A}/s1", t1, None)]
    s = c.state.services.get("svc")
    assert s is not None and s.leader == f"{A}/s1" and s.handover
    assert s.describe()["handover_requested"] is True
    # Nothing moves until the leader resigns (its running work is done).
    c.apply(B, Candidate("svc", f"{B}/s2"))
    assert leader(c) == (f"{A}/s1", t1)
    c.apply(A, Resign("svc", f"{A}/s1"))
    assert leader(c) == (f"{B}/s1", c.offset)
    assert not s.handover


def test_handover_to_a_named_candidate_or_node() -> None:
    c = three()
    c.apply(A, Candidate("svc", f"{A}/s1"))
    c.apply(B, Candidate("svc", f"{B}/s1"))
    c.apply(C, Candidate("svc", f"{C}/s4"))
    done = c.apply(B, Handover("svc", "c"))  # a node id names its first candidate
    assert isinstance(done.result, HandoverAsked) and done.result.to == f"{C}/s4"
    c.apply(A, Resign("svc", f"{A}/s1"))
    assert leader(c)[0] == f"{C}/s4"
    # Named by full key; if the target is gone when the leader resigns, the first one leads.
    c.apply(A, Handover("svc", f"{B}/s1"))
    c.apply(B, Resign("svc", f"{B}/s1"))
    c.apply(A, Candidate("svc", f"{A}/s2"))
    c.apply(C, Resign("svc", f"{C}/s4"))
    assert leader(c)[0] == f"{A}/s2"


def test_handover_errors() -> None:
    c = three()
    assert isinstance(c.apply(A, Handover("nope")).error, InvalidArgument)
    c.apply(A, Candidate("svc", A))
    err = c.apply(A, Handover("svc")).error
    assert isinstance(err, InvalidArgument) and "nobody to hand over to" in err.message
    c.apply(B, Candidate("svc", B))
    assert isinstance(c.apply(A, Handover("svc", "c")).error, InvalidArgument)
    assert isinstance(c.apply(A, Handover("svc", A)).error, InvalidArgument)  # leads already
    assert c.apply(A, Handover("svc", "b")).error is None


def test_leader_dies_during_handover_target_wins() -> None:
    c = three()
    c.apply(A, Candidate("svc", A))
    c.apply(B, Candidate("svc", B))
    c.apply(C, Candidate("svc", C))
    c.apply(B, Handover("svc", C))
    for _ in range(6):
        c.beat(B, C)
    s = c.state.services.get("svc")
    assert s is not None and s.leader == C and not s.handover and s.handover_to is None


def test_snapshot_restore_and_digest() -> None:
    c = three()
    c.apply(A, Candidate("svc", f"{A}/s1"))
    c.apply(B, Candidate("svc", f"{B}/s1"))
    c.apply(B, Candidate("other", B))
    c.apply(C, Handover("svc", "b"))
    snap = msgpack.unpackb(msgpack.packb(c.state.meta_snapshot()), raw=False)
    r = State()
    r.restore_meta(snap)
    assert r.services.snapshot() == c.state.services.snapshot()
    assert r.digest() == c.state.digest()
    assert r.services.get("svc").handover_to == f"{B}/s1"  # type: ignore[union-attr]
    # The service state is part of the digest.
    before = c.state.digest()
    c.apply(A, Resign("svc", f"{A}/s1"))
    assert c.state.digest() != before


def test_meta_snapshot_from_before_services_restores_empty() -> None:
    c = three()
    old = c.state.meta_snapshot()[:6]
    r = State()
    r.restore_meta(old)
    assert r.services.services == {}


def test_events_round_trip_through_the_codec() -> None:
    o = Origin("a", "1", 5, 1000)
    for ev in (Candidate("svc", "a/1/s1"), Resign("svc", "a/1"), Handover("svc", ""),
               Handover("svc", "b")):
        assert codec.decode(codec.encode(o, ev)) == (o, ev)
    bad = msgpack.packb(["a", "1", 5, 1000, Candidate.OP, "svc", 7])
    with pytest.raises(MalformedEvent):
        codec.decode(bad)
    with pytest.raises(MalformedEvent):
        codec.decode(msgpack.packb(["a", "1", 5, 1000, Handover.OP, "svc", None]))


def test_helpers() -> None:
    assert host_of("a/1/s3") == "a/1" and host_of("a/1") == "a/1"
    check_candidate("a/1", "svc", "a/1/s3")
    with pytest.raises(InvalidArgument):
        check_candidate("a/1", "svc", "a/10/s3")
    s = Services()
    g = s.candidate("x", "a/1", 10)
    assert g is not None and g.token == 10 and g.leader == "a/1"
    assert s.describe() == [{
        "service": "x", "leader": "a/1", "token": 10, "terms": 1, "candidates": ["a/1"],
        "handover_requested": False, "handover_to": None,
    }]


def test_completions_carry_the_term() -> None:
    c = three()
    done = c.apply(A, Candidate("svc", f"{A}/s1"))
    assert isinstance(done, Completed) and isinstance(done.result, Candidacy)
    assert done.result.candidate == f"{A}/s1"
    done = c.apply(B, Candidate("svc", f"{B}/s1"))
    assert isinstance(done.result, Candidacy) and done.result.leader == f"{A}/s1"
