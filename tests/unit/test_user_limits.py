"""Per-user limits and tags in the replicated state (docs/security.md "Per-user limits"):
decided in log order, behind the flag ``user_limits``, and invisible (records, snapshots,
digests) in a cluster that never set one."""

from __future__ import annotations

from batonmq.cluster.codec import decode, encode
from batonmq.cluster.errors import InvalidArgument, LimitExceeded
from batonmq.cluster.events import (
    DeclareQueue,
    DeleteQueue,
    Origin,
    PutUser,
    SetUserLimits,
    SetUserTags,
)
from batonmq.cluster.results import Declared
from batonmq.cluster.state import State
from batonmq.cluster.users import DEFAULT_LIMITS, User
from tests.unit.test_membership import Cluster
from tests.unit.test_users import _cluster, _creds


def _flagged() -> tuple[Cluster, str]:
    c, a, _ = _cluster()
    # What an applied EnableFeatures(("user_limits",)) leaves (tests/unit/test_features.py
    # covers how a flag gets enabled).
    c.state.features.enabled["user_limits"] = c.state.applied
    c.apply(a, PutUser("alice", *_creds("pw"), False))
    c.apply(a, PutUser("root", *_creds("pw"), True))
    return c, a


def test_a_declare_without_a_user_is_the_record_older_builds_write() -> None:
    origin = Origin("n", "r", 1, 0)
    plain = encode(origin, DeclareQueue("q"))
    # No trailing field: the record a build before user limits writes and reads.
    assert decode(plain)[1] == DeclareQueue("q") and len(plain) == len(encode(
        origin, DeclareQueue("q", user=None)))
    named = encode(origin, DeclareQueue("q", user="alice"))
    assert len(named) > len(plain) and decode(named)[1] == DeclareQueue("q", user="alice")
    assert decode(encode(origin, SetUserLimits("alice", (("max_queues", 3),
                                                         ("max_consumers", None)))))[1] \
        == SetUserLimits("alice", (("max_queues", 3), ("max_consumers", None)))
    assert decode(encode(origin, SetUserTags("alice", ("monitoring",))))[1] \
        == SetUserTags("alice", ("monitoring",))


def test_without_the_flag_nothing_is_limited_or_stored() -> None:
    c, a, _ = _cluster()
    plain, _, _ = _cluster()
    creds = _creds("pw")
    for cl in (c, plain):
        cl.apply(a, PutUser("alice", *creds, False))
    for i in range(3):
        assert c.apply(a, DeclareQueue(f"q{i}", user="alice")).error is None
        plain.apply(a, DeclareQueue(f"q{i}"))
    assert all(q.user is None for q in c.state.queues.values())
    # The same state as a cluster of a build before the limits: the same digest.
    assert c.state.digest() == plain.state.digest()
    alice = c.state.users.get("alice")
    assert alice is not None and len(alice.snapshot()) == 10
    refused = c.apply(a, SetUserLimits("alice", (("max_queues", 1),)))
    assert isinstance(refused.error, InvalidArgument) and "user_limits" in str(refused.error)
    assert isinstance(c.apply(a, SetUserTags("alice", ("monitoring",))).error, InvalidArgument)
    assert c.state.users.get("alice") == alice


def test_a_users_queues_are_counted_in_log_order_against_its_limit() -> None:
    c, a = _flagged()
    users = c.state.users
    assert users.limit("alice", "max_queues") == DEFAULT_LIMITS["max_queues"]  # non-admin
    assert users.limit("root", "max_queues") is None  # admins: no limit unless set
    assert c.apply(a, SetUserLimits("", (("max_queues", 2),))).error is None  # the default
    for name in ("a1", "a2"):
        assert c.apply(a, DeclareQueue(name, user="alice")).result == Declared(created=True)
    over = c.apply(a, DeclareQueue("a3", user="alice"))
    assert isinstance(over.error, LimitExceeded) and "max_queues 2" in str(over.error)
    assert "a3" not in c.state.queues and c.state.ignored["user-limit"] == 1
    # Declaring one it has is no new queue; an admin and queues of others are not counted.
    assert c.apply(a, DeclareQueue("a1", user="alice")).result == Declared(created=False)
    for i in range(5):
        assert c.apply(a, DeclareQueue(f"r{i}", user="root")).error is None
    # Its own limit wins over the default; -1 is none; a deleted queue frees a place.
    c.apply(a, SetUserLimits("alice", (("max_queues", 3),)))
    assert c.apply(a, DeclareQueue("a3", user="alice")).error is None
    assert isinstance(c.apply(a, DeclareQueue("a4", user="alice")).error, LimitExceeded)
    c.apply(a, DeleteQueue("a1"))
    assert c.apply(a, DeclareQueue("a4", user="alice")).error is None
    c.apply(a, SetUserLimits("alice", (("max_queues", -1),)))
    assert users.limit("alice", "max_queues") is None
    c.apply(a, SetUserLimits("alice", (("max_queues", None),)))  # back to the default
    assert users.limit("alice", "max_queues") == 2
    bad = c.apply(a, SetUserLimits("alice", (("max_bananas", 1),)))
    assert isinstance(bad.error, InvalidArgument)
    assert isinstance(c.apply(a, SetUserLimits("nobody", (("max_queues", 1),))).error,
                      InvalidArgument)


def test_limits_tags_and_declaring_users_survive_a_snapshot() -> None:
    c, a = _flagged()
    c.apply(a, SetUserLimits("", (("max_consumers", 7),)))
    c.apply(a, SetUserLimits("alice", (("max_queues", 5), ("max_connections", 2))))
    c.apply(a, SetUserTags("alice", ("monitoring",)))
    c.apply(a, DeclareQueue("mine", user="alice"))
    restored = State()
    restored.restore_meta(c.state.meta_snapshot())
    for name, q in c.state.queues.items():
        restored.queues[name] = type(q).restore(q.snapshot())
    alice = restored.users.get("alice")
    assert alice == c.state.users.get("alice") and isinstance(alice, User)
    assert alice.monitoring and dict(alice.limits) == {"max_queues": 5, "max_connections": 2}
    assert restored.users.default_limits == {"max_consumers": 7}
    assert restored.queues["mine"].user == "alice"
    assert restored.digest() == c.state.digest()
    assert restored.users.limit("alice", "max_consumers") == 7
    # A new password keeps the tags and limits, as it keeps the rights.
    c.apply(a, PutUser("alice", *_creds("new"), False))
    assert c.state.users.get("alice").limits == alice.limits  # type: ignore[union-attr]
