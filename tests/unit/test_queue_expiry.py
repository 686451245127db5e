"""Queue expiry (AMQP's x-expires) in the replicated state (docs/events.md "Queue expiry"):
decided by the replicated clock and the queue's last use in log order, behind the flag
``queue_expiry``, and invisible (records, snapshots, digests) while no queue expires."""

from __future__ import annotations

from batonmq.cluster.codec import decode, encode
from batonmq.cluster.effects import Completed, Effect, QueueGone
from batonmq.cluster.errors import (
    InvalidArgument,
    PreconditionFailed,
    QueueExists,
    QueueNotFound,
)
from batonmq.cluster.events import (
    Acquire,
    DeclareQueue,
    Enqueue,
    Event,
    ExpireQueue,
    Interest,
    Origin,
)
from batonmq.cluster.queue_state import QueueState
from batonmq.cluster.results import Declared, Deleted
from tests.unit.test_membership import Cluster
from tests.unit.test_users import _cluster


def _at(c: Cluster, who: str, ev: Event, ts: int) -> Completed:  # type: ignore[type-arg]
    """Apply ``ev`` from ``who`` with envelope time ``ts`` (the replicated clock)."""
    c.seqs[who] = seq = c.seqs.get(who, 0) + 1
    node, runtime = who.split("/")
    c.offset += 1
    out: list[Effect] = []
    c.state.apply(c.offset, Origin(node, runtime, seq, ts), ev, out)
    c.effects.extend(out)
    return next(e for e in out if isinstance(e, Completed))


def _flagged() -> tuple[Cluster, str, str]:
    c, a, b = _cluster()
    # What an applied EnableFeatures(("queue_expiry",)) leaves (tests/unit/test_features.py
    # covers how a flag gets enabled).
    c.state.features.enabled["queue_expiry"] = c.state.applied
    return c, a, b


def test_a_declare_without_expiry_is_the_record_older_builds_write() -> None:
    origin = Origin("n", "r", 1, 0)
    plain = encode(origin, DeclareQueue("q"))
    assert plain == encode(origin, DeclareQueue("q", user=None, expires_ms=None))
    expiring = encode(origin, DeclareQueue("q", expires_ms=5000))
    assert len(expiring) > len(plain)
    assert decode(expiring)[1] == DeclareQueue("q", expires_ms=5000)
    both = DeclareQueue("q", user="alice", expires_ms=5000)
    assert decode(encode(origin, both))[1] == both
    assert decode(encode(origin, ExpireQueue("q")))[1] == ExpireQueue("q")


def test_without_the_flag_expiry_is_refused_and_nothing_changes() -> None:
    c, a, _ = _cluster()
    plain, _, _ = _cluster()
    refused = _at(c, a, DeclareQueue("q", expires_ms=100), 2000)
    assert isinstance(refused.error, InvalidArgument) and "queue_expiry" in str(refused.error)
    assert "q" not in c.state.queues
    for cl in (c, plain):
        _at(cl, a, DeclareQueue("q"), 2000)
    gone = _at(c, a, ExpireQueue("q"), 10**9)
    assert isinstance(gone.error, InvalidArgument) and "q" in c.state.queues
    _at(plain, a, DeclareQueue("q"), 10**9)  # (the same clock on both)
    # A queue without expiry: the snapshot of builds before the flag, the same digest.
    assert len(c.state.queues["q"].snapshot()) == 19
    assert c.state.queues["q"].stats()["expires_ms"] is None


def test_an_unused_queue_is_deleted_by_the_replicated_clock_only() -> None:
    c, a, _ = _flagged()
    assert _at(c, a, DeclareQueue("q", expires_ms=100), 5000).result == Declared(created=True)
    _at(c, a, Enqueue("q", ((b"x", {}),)), 5010)  # (a publish is not a use)
    early = _at(c, a, ExpireQueue("q"), 5099)
    assert isinstance(early.error, PreconditionFailed) and "q" in c.state.queues
    assert c.state.ignored["not-expired"] == 1
    done = _at(c, a, ExpireQueue("q"), 5100)
    assert done.error is None and done.result == Deleted(deleted=1)
    assert "q" not in c.state.queues
    assert any(isinstance(e, QueueGone) and e.queue == "q" for e in c.effects)
    # A late or repeated one is ignored alike on every replica.
    again = _at(c, a, ExpireQueue("q"), 5200)
    assert isinstance(again.error, QueueNotFound) and c.state.ignored["not-expired"] == 2


def test_consumers_gets_and_declares_are_uses_in_log_order() -> None:
    c, a, b = _flagged()
    _at(c, a, DeclareQueue("q", expires_ms=100), 1000)
    _at(c, b, Interest("q", True), 1050)
    # While a broker has consumers it never expires, however long.
    assert isinstance(_at(c, a, ExpireQueue("q"), 9000).error, PreconditionFailed)
    _at(c, b, Interest("q", False), 9000)  # the last consumer went: counted from here
    assert isinstance(_at(c, a, ExpireQueue("q"), 9099).error, PreconditionFailed)
    _at(c, a, DeclareQueue("q", expires_ms=100), 9090)  # declared again (clock stays 9099)
    assert c.state.queues["q"].used_at == 9099
    assert isinstance(_at(c, a, ExpireQueue("q"), 9150).error, PreconditionFailed)
    # An acquire (a Basic.Get, a consumer's fetch) is a use too.
    _at(c, a, Interest("q", True), 9160)
    _at(c, a, Acquire("q", f"{a}/1", 1), 9180)
    assert c.state.queues["q"].used_at == 9180
    _at(c, a, Interest("q", False), 9190)
    assert c.state.queues["q"].stats()["used_at"] == 9190
    assert _at(c, a, ExpireQueue("q"), 9290).result == Deleted(deleted=0)


def test_a_late_expiry_does_not_delete_a_queue_declared_anew() -> None:
    c, a, _ = _flagged()
    _at(c, a, DeclareQueue("q", expires_ms=100), 1000)
    # The owner appended ExpireQueue at 1100 but another client's declare came first.
    _at(c, a, DeclareQueue("q", expires_ms=100), 1100)
    assert isinstance(_at(c, a, ExpireQueue("q"), 1101).error, PreconditionFailed)
    assert "q" in c.state.queues


def test_a_member_leaving_with_the_last_consumers_starts_the_count() -> None:
    c, a, b = _flagged()
    _at(c, a, DeclareQueue("q", expires_ms=100), 1000)
    _at(c, b, Interest("q", True), 1001)
    c.silent.add(b)
    for t in range(1, 12):  # b is silent: suspected, then dropped from the view
        _at(c, a, Enqueue("q", ((b"x", {}),)), 1001 + t)
        c.beat(a)
    assert b not in c.state.membership.member_set
    q = c.state.queues["q"]
    assert not q.interested and q.used_at > 1001
    assert isinstance(_at(c, a, ExpireQueue("q"), q.used_at + 99).error, PreconditionFailed)
    assert _at(c, a, ExpireQueue("q"), q.used_at + 100).error is None


def test_other_expiry_is_another_queue() -> None:
    c, a, _ = _flagged()
    _at(c, a, DeclareQueue("q", expires_ms=100), 1000)
    other = _at(c, a, DeclareQueue("q", expires_ms=200), 1001)
    assert isinstance(other.error, QueueExists)
    assert ("expires_ms", 100, 200) in other.error.differing
    assert isinstance(_at(c, a, DeclareQueue("q"), 1002).error, QueueExists)
    bad = _at(c, a, DeclareQueue("r", expires_ms=0), 1003)
    assert isinstance(bad.error, InvalidArgument) and "expires" in str(bad.error)


def test_expiry_and_last_use_survive_a_snapshot() -> None:
    c, a, _ = _flagged()
    c.state.features.enabled["user_limits"] = c.state.applied
    _at(c, a, DeclareQueue("q", expires_ms=100, user="alice"), 50_000)
    _at(c, a, DeclareQueue("plain"), 50_001)
    q = c.state.queues["q"]
    back = QueueState.restore(q.snapshot())
    assert (back.expires_ms, back.used_at, back.user) == (100, 50_000, "alice")
    assert back.snapshot() == q.snapshot()
    assert QueueState.restore(c.state.queues["plain"].snapshot()).expires_ms is None
    # A queue that expires without a declaring user keeps its parts in place.
    _at(c, a, DeclareQueue("r", expires_ms=50), 50_002)
    r = QueueState.restore(c.state.queues["r"].snapshot())
    assert (r.user, r.expires_ms, r.used_at) == (None, 50, 50_002)


async def test_a_message_s_history_says_its_queue_expired() -> None:
    from batonmq.broker.history import message_history
    from tests.unit.test_node import _close, _node

    node = await _node("a", "memory:")
    try:
        assert "queue_expiry" in node.state.features.enabled  # (a new cluster's flags)
        await node.submit(DeclareQueue("brief", expires_ms=1))
        await node.submit(Enqueue("brief", ((b"m", {}),)))
        while "brief" in node.state.queues:  # (each append is at least as late)
            try:
                await node.submit(ExpireQueue("brief"))
            except PreconditionFailed:
                pass
        last = (await message_history(node, "brief", 0)).steps[-1]
        assert (last["what"], last["reason"]) == (
            "deleted with its queue", "the queue expired (unused for its expires)")
    finally:
        await _close(node)
