"""Command results (cluster/results.py) through the Ok frame (clients/wire.py).

Every result type goes through the frame codec and back to an equal value; its Ok map
is pinned here key by key (the wire format of docs/protocol.md must not change when a
field is renamed); a map with a field missing or of the wrong type is refused with a
ProtocolError that names the field. Each event names the result type the state
machine answers it with, and the state machine does answer with that type.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, get_args

import pytest

from batonmq.clients import wire
from batonmq.clients.wire import FrameCodec, read_result, result_map
from batonmq.cluster.errors import ProtocolError
from batonmq.cluster.features import FEATURES
from batonmq.cluster.events import (
    EnableFeatures,
    FanOut,
    FenceTerm,
    ForwardDone,
    ForwardIn,
    GrowPartitions,
    SetReplication,
    AssignReplicas,
    AddReplica,
    ReplicaReady,
    RemoveReplica,
    PlaceQueues,
    ReleaseQueue,
    RouteDeadLetter,
    ClearPolicy,
    SetPolicy,
    EVENT_TYPES,
    Accept,
    AcceptThrough,
    Bind,
    DeclareExchange,
    DeleteExchange,
    RoutedEnqueue,
    Unbind,
    Acquire,
    Candidate,
    Checkpoint,
    DeclareQueue,
    DeleteQueue,
    Enqueue,
    Event,
    Expire,
    ExpireQueue,
    Handoff,
    Handover,
    Heartbeat,
    Interest,
    Join,
    Leave,
    Propose,
    PurgeQueue,
    Reject,
    Release,
    ReleaseAll,
    Reserve,
    Resign,
    Vote,
    PutUser,
    DeleteUser,
    SetRights,
    SetUserLimits,
    BindExchange,
    UnbindExchange,
    SetUserTags,
)
from batonmq.cluster.results import (
    FeatureList,
    Placed,
    PartitionsGrown,
    GroupChanged,
    ReplicationSet,
    Rebalanced,
    FeaturesEnabled,
    RESULT_TYPES,
    AcceptedThrough,
    Bound,
    ExchangeDeleted,
    ExchangeList,
    Routed,
    Cancelled,
    Candidacy,
    Checkpointed,
    Counted,
    Declared,
    Deleted,
    Enqueued,
    HandedOver,
    HandoverAsked,
    LeadStatus,
    Owner,
    Published,
    Purged,
    QueueList,
    RangeRead,
    Reserved,
    Resigned,
    Result,
    ServiceList,
    Settled,
    Subscribed,
    UpdateSent,
    Peeked,
    ConnectionList,
    MessageHistory,
    UserChanged,
    UserList,
    PolicyChanged,
    PolicyList,
)
from batonmq.cluster.users import GUEST_COST, GUEST_SALT, GUEST_SERVER_KEY, GUEST_STORED_KEY
from tests.unit.test_membership import Cluster

__all__: list[str] = []

# One value of every result type and the Ok map it travels as.
SAMPLES: list[tuple[Result, dict[str, Any]]] = [
    (Declared(created=True), {"created": True}),
    (Deleted(deleted=3), {"deleted": 3}),
    (Purged(purged=0), {"purged": 0}),
    (Bound(changed=False), {"changed": False}),
    (ExchangeDeleted(bindings=2), {"bindings": 2}),
    (ExchangeList([{"exchange": "x", "bindings": []}]), {"exchanges": [{"exchange": "x", "bindings": []}]}),
    (
        Routed(queues=["a", "b"], positions=[0, 7], full=["c"], missing=[]),
        {"queues": ["a", "b"], "positions": [0, 7], "full": ["c"], "missing": []},
    ),
    (UserChanged(changed=True), {"changed": True}),
    (PolicyChanged(changed=True, queues=3), {"changed": True, "queues": 3}),
    (PolicyList([{"name": "jobs", "pattern": "^jobs", "apply_to": "queues",
                  "definition": {"max-length": 5}, "priority": 0}]),
     {"policies": [{"name": "jobs", "pattern": "^jobs", "apply_to": "queues",
                    "definition": {"max-length": 5}, "priority": 0}]}),
    (FeaturesEnabled(enabled=["versioned_formats"], format=2), {"enabled": ["versioned_formats"], "format": 2}),
    (
        FeatureList([{"name": "versioned_formats", "state": "enabled"}], 2),
        {"features": [{"name": "versioned_formats", "state": "enabled"}], "format": 2},
    ),
    (UserList([{"name": "alice", "admin": False}]), {"users": [{"name": "alice", "admin": False}]}),
    (Enqueued(7, 2), {"first_position": 7, "count": 2}),
    (Enqueued(7, 2, [7, 3]), {"first_position": 7, "count": 2, "positions": [7, 3]}),
    (Counted(count=4), {"count": 4}),
    (Settled(2, [9]), {"count": 2, "not_acquired": [9]}),
    (Owner(owner=None), {"owner": None}),
    (Owner(owner="n1/r1"), {"owner": "n1/r1"}),
    (
        Reserved(reserved_by="spark", acquired=1, head=4, next_position=10),
        {"reserved_by": "spark", "acquired": 1, "head": 4, "next_position": 10},
    ),
    (
        Reserved(reserved_by=None, acquired=0, head=0, next_position=0),
        {"reserved_by": None, "acquired": 0, "head": 0, "next_position": 0},
    ),
    (AcceptedThrough(count=5, head=5), {"count": 5, "head": 5}),
    (
        Candidacy("svc", "n1/r1/s1", True, "n1/r1/s1", 42),
        {"service": "svc", "candidate": "n1/r1/s1", "was_candidate": True,
         "leader": "n1/r1/s1", "token": 42},
    ),
    (
        Candidacy("svc", "n1/r1/s1", False, None, None),
        {"service": "svc", "candidate": "n1/r1/s1", "was_candidate": False,
         "leader": None, "token": None},
    ),
    (
        HandoverAsked("svc", "n1/r1/s1", 42, None),
        {"service": "svc", "leader": "n1/r1/s1", "token": 42, "to": None},
    ),
    (Checkpointed(offset=99, digest="ab12"), {"offset": 99, "digest": "ab12"}),
    (Placed(partition=3), {"partition": 3}),
    (PartitionsGrown(4, 2, [3, 4]), {"count": 4, "before": 2, "started": [3, 4]}),
    (PartitionsGrown(4, 0), {"count": 4, "before": 0}),
    (GroupChanged(2, ["a", "b"], ["c"], ["a"]),
     {"partition": 2, "replicas": ["a", "b"], "joining": ["c"], "leaving": ["a"]}),
    (ReplicationSet(3, 0), {"replicas": 3, "before": 0}),
    (Rebalanced([{"partition": 1, "to": "b", "from": "a"}], True),
     {"moves": [{"partition": 1, "to": "b", "from": "a"}], "applied": True}),
    (Published(position=12), {"position": 12}),
    (Subscribed(consumer=1), {"consumer": 1}),
    (Cancelled(released=3), {"released": 3}),
    (QueueList([{"queue": "q", "ready": 1}]), {"queues": [{"queue": "q", "ready": 1}]}),
    (
        LeadStatus("svc", "n1/r1/s1", "n2/r1/s1", 7),
        {"service": "svc", "candidate": "n1/r1/s1", "leader": "n2/r1/s1", "token": 7},
    ),
    (
        LeadStatus("svc", "n1/r1/s1", None, None),
        {"service": "svc", "candidate": "n1/r1/s1", "leader": None, "token": None},
    ),
    (Resigned(was_candidate=False), {"was_candidate": False}),
    (ServiceList([{"service": "svc"}]), {"services": [{"service": "svc"}]}),
    (
        HandedOver("svc", "n2/r1/s1", 50, "n1/r1/s1"),
        {"service": "svc", "leader": "n2/r1/s1", "token": 50, "previous": "n1/r1/s1"},
    ),
    (
        RangeRead([[4, b"body", {"k": "v"}, 1_700_000_000_000]], 5),
        {"messages": [[4, b"body", {"k": "v"}, 1_700_000_000_000]], "next": 5},
    ),
    (UpdateSent(applied=10, queues=2, messages=30), {"applied": 10, "queues": 2, "messages": 30}),
    (
        Peeked("q", [[3, 1, b"body", {"k": "v"}, 1_700_000_000_000]]),
        {"queue": "q", "messages": [[3, 1, b"body", {"k": "v"}, 1_700_000_000_000]]},
    ),
    (
        ConnectionList([{"id": "127.0.0.1:5000", "consumers": []}]),
        {"connections": [{"id": "127.0.0.1:5000", "consumers": []}]},
    ),
    (
        MessageHistory("q", 4, 0, 20, 20, True, "gone", "", [{"offset": 7, "what": "enqueued"}]),
        {"queue": "q", "position": 4, "log_start": 0, "log_end": 20, "scanned": 20,
         "complete": True, "state": "gone", "note": "",
         "steps": [{"offset": 7, "what": "enqueued"}]},
    ),
]


def test_samples_cover_every_result_type() -> None:
    assert {type(r) for r, _ in SAMPLES} == set(RESULT_TYPES)


@pytest.mark.parametrize(("result", "expected"), SAMPLES, ids=lambda v: type(v).__name__)
def test_round_trip_through_an_ok_frame(result: Result, expected: dict[str, Any]) -> None:
    assert result_map(result) == expected
    codec = FrameCodec()
    codec.receive_data(codec.send(wire.ok(17, result)))
    frame = codec.next_frame()
    assert isinstance(frame, wire.Ok) and frame.corr == 17
    assert frame.result == expected
    back = read_result(type(result), frame.result)
    assert back == result and type(back) is type(result)


def _required(kind: type[Result]) -> list[str]:
    """The fields of ``kind`` that a map may not leave out (all but default-None ones)."""
    return [f.name for f in fields(kind) if f.default is not None]


@pytest.mark.parametrize(("result", "expected"), SAMPLES, ids=lambda v: type(v).__name__)
def test_a_missing_field_is_a_protocol_error_naming_it(
    result: Result, expected: dict[str, Any]
) -> None:
    kind = type(result)
    assert _required(kind)
    for name in _required(kind):
        bad = {k: v for k, v in expected.items() if k != name}
        with pytest.raises(ProtocolError, match=f"{kind.__name__} result has no '{name}'"):
            read_result(kind, bad)


@pytest.mark.parametrize(("result", "expected"), SAMPLES, ids=lambda v: type(v).__name__)
def test_a_mistyped_field_is_a_protocol_error_naming_it(
    result: Result, expected: dict[str, Any]
) -> None:
    kind = type(result)
    for name in (f.name for f in fields(kind)):
        bad = {**expected, name: 1.5}  # no result field is a float
        with pytest.raises(ProtocolError, match=f"{kind.__name__} result has '{name}' of type float"):
            read_result(kind, bad)


def test_what_the_type_checks_look_at() -> None:
    with pytest.raises(ProtocolError, match="'deleted' of type bool, not int"):
        read_result(Deleted, {"deleted": True})  # a bool is not a count
    with pytest.raises(ProtocolError, match="'not_acquired' of type list, not list"):
        read_result(Settled, {"count": 1, "not_acquired": ["7"]})
    with pytest.raises(ProtocolError, match="'owner' of type int"):
        read_result(Owner, {"owner": 3})
    with pytest.raises(ProtocolError, match="'queues' of type list"):
        read_result(QueueList, {"queues": [["q"]]})
    # Left out while None: a default-None field may be missing (or nil); others may not.
    assert read_result(Enqueued, {"first_position": 1, "count": 1, "positions": None}) == (
        Enqueued(1, 1)
    )
    with pytest.raises(ProtocolError, match="Owner result has no 'owner'"):
        read_result(Owner, {})
    # Fields the client does not know are ignored (a newer broker may add some).
    assert read_result(Published, {"position": 3, "extra": "x"}) == Published(3)


def _answers(event_class: type[Event[Any]]) -> Any:
    """The result type an event class names: ``class DeleteQueue(Event[Deleted])``."""
    (base,) = getattr(event_class, "__orig_bases__")
    (answer,) = get_args(base)
    return None if answer is type(None) else answer


def test_every_event_names_a_result_type() -> None:
    for cls in EVENT_TYPES.values():
        answer = _answers(cls)
        assert answer is None or answer in RESULT_TYPES, cls


def test_the_state_machine_answers_each_event_with_its_named_type() -> None:
    a, b = "a/1", "b/1"
    c = Cluster()
    c.beat(a)
    c.beat(b)
    consumer = f"{a}/1"
    applied: dict[type[Any], Any] = {}

    def apply(who: str, ev: Event[Any]) -> None:
        done = c.apply(who, ev)
        assert done.error is None, (ev, done.error)
        answer = _answers(type(ev))
        if answer is None:
            assert done.result is None, (ev, done.result)
        else:
            assert type(done.result) is answer, (ev, done.result)
        applied[type(ev)] = done.result

    apply(a, DeclareQueue("q"))
    apply(a, DeclareQueue("gone"))
    apply(a, DeleteQueue("gone"))
    apply(a, Enqueue("q", tuple((b"%d" % i, {}) for i in range(8)), (("k", 8),)))
    apply(a, Interest("q", True))
    apply(a, Acquire("q", consumer, 4))
    apply(a, Accept("q", consumer, (0,)))
    apply(a, Release("q", consumer, (1,)))
    apply(a, Reject("q", consumer, (2,)))
    apply(a, ReleaseAll("q", consumer))
    apply(a, Expire("q", 0))
    apply(a, Handoff("q"))
    apply(a, Reserve("q", "reader"))
    apply(a, AcceptThrough("q", 2, "reader"))
    apply(a, Reserve("q", None))
    apply(a, PurgeQueue("q"))
    apply(a, DeclareExchange("x", "fanout"))
    apply(a, Bind("q", "x"))
    apply(a, RoutedEnqueue(("q",), ((b"r", {}),)))
    apply(a, Unbind("q", "x"))
    apply(a, DeleteExchange("x"))
    apply(a, Candidate("svc", f"{a}/s1"))
    apply(b, Candidate("svc", f"{b}/s1"))
    apply(b, Handover("svc"))
    apply(a, Resign("svc", f"{a}/s1"))
    apply(a, Checkpoint())
    apply(a, Heartbeat("voter", "addr", {}))
    flags = {"features": sorted(FEATURES)}
    apply(a, Heartbeat("voter", "addr", flags))
    apply(b, Heartbeat("voter", "addr", flags))
    apply(a, EnableFeatures(tuple(FEATURES)))
    creds = (GUEST_SALT, GUEST_COST, GUEST_STORED_KEY, GUEST_SERVER_KEY)
    apply(a, PutUser("alice", *creds, False))
    apply(a, SetRights("alice", (("read", "q.*"),)))
    apply(a, SetUserLimits("alice", (("max_queues", 3),)))
    apply(a, PlaceQueues(("a1",), 0, 4, "alice"))
    apply(a, ReleaseQueue("a1", "alice"))
    apply(a, SetUserTags("alice", ("monitoring",)))
    apply(a, DeclareExchange("x", "fanout"))
    apply(a, BindExchange("x", "amq.fanout"))
    apply(a, UnbindExchange("x", "amq.fanout"))
    apply(a, DeleteUser("alice"))
    apply(a, PlaceQueues(("p1",), 0, 4))
    apply(a, GrowPartitions(6))
    apply(a, SetReplication(2))
    apply(a, AssignReplicas(1, ("n1", "n2")))
    apply(a, AddReplica(1, "n3", "n1"))
    apply(a, ReplicaReady(1, "n3"))
    apply(a, RemoveReplica(1, "n2"))
    apply(a, FenceTerm("svc", 99))
    c.state.data_partition = 1  # (as on a data partition of a split log)
    apply(a, FanOut(("q",), ((b"f", {}),), (), "x", "", 0, 0, 0, ((2, ("r",)),)))
    apply(a, ForwardIn(2, 0, ("q",), ((b"g", {}),)))
    apply(a, ForwardDone(2, 0))
    apply(a, RouteDeadLetter(0))
    c.state.data_partition = 0
    apply(a, DeclareQueue("brief", expires_ms=1))
    apply(a, ExpireQueue("brief"))  # (one envelope ms later: unused for its 1 ms)
    apply(a, SetPolicy("p", "^q", "queues", (("max-length", 5),), 1))
    apply(a, ClearPolicy("p"))
    apply(b, Join("addr"))
    apply(b, Leave())
    # Propose and Vote are applied by Cluster.beat (the view changes above).
    assert set(applied) == set(EVENT_TYPES.values()) - {Propose, Vote}
