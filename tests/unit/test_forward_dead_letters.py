"""Dead letters forwarded between data partitions (cluster/forwarding.py, docs/design.md
§16): on a data partition, a message dead-lettered to a queue that is not here, or
through an exchange, leaves its queue into the partition's outbox in the same apply; a
RouteDeadLetter (the first applied) turns it into entries for the other partitions and
copies to the queues here; ForwardDone frees the outbox body. Two states stand for two
partitions."""

from __future__ import annotations

from batonmq.cluster.effects import Moved, Removed
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import (
    Acquire,
    DeclareQueue,
    Enqueue,
    Expire,
    ForwardDone,
    ForwardIn,
    Interest,
    Reject,
    RouteDeadLetter,
)
from batonmq.cluster.forwarding import OUTBOX_QID, DeadLetter
from batonmq.cluster.snapshot import digest
from batonmq.cluster.state import State
from tests.unit.test_placement import _flagged

A = "n1/r1"
MSG = ((b"hello", {"h": 1}),)


def _partition(k: int, *queues: DeclareQueue):  # type: ignore[no-untyped-def]
    c = _flagged()
    c.state.data_partition = k
    c.state.index.away = c.state.forwards
    for q in queues:
        assert c.apply(A, q).error is None
    return c


def _reject(c, queue: str) -> None:  # type: ignore[no-untyped-def]
    assert c.apply(A, Enqueue(queue, MSG)).error is None
    assert c.apply(A, Interest(queue, True)).error is None
    got = c.apply(A, Acquire(queue, f"{A}/1", 1))
    assert got.error is None and got.result.count == 1
    pos = c.state.queues[queue].next_pos - 1
    assert c.apply(A, Reject(queue, f"{A}/1", (pos,))).error is None


def test_a_rejected_message_for_a_queue_elsewhere_leaves_its_queue_into_the_outbox() -> None:
    home = _partition(1, DeclareQueue("q", dead_letter="dlq"))
    _reject(home, "q")
    q = home.state.queues["q"]
    assert q.length == 0 and q.dead_lettered == 1 and q.dropped == 0
    assert home.state.forwards.unrouted == {0: DeadLetter("q", "dlq", None, "dlq")}
    assert home.state.forwards.in_flight == 1
    moved = [e for e in home.effects if isinstance(e, Moved)]
    assert [(m.src_qid, m.dst_qid, m.dst_pos, m.keep) for m in moved] == [
        (q.qid, OUTBOX_QID, 0, False)
    ]
    assert moved[0].headers["x-death-reason"] == "rejected"


def test_routed_once_forwarded_once_and_the_outbox_body_freed() -> None:
    home = _partition(1, DeclareQueue("q", dead_letter="dlq"))
    target = _partition(2, DeclareQueue("dlq"))
    _reject(home, "q")
    assert home.apply(A, RouteDeadLetter(0, (), ((2, ("dlq",)),))).error is None
    # A second forwarder's (or a retry's) routing of the same number changes nothing.
    assert home.apply(A, RouteDeadLetter(0, (), ((3, ("other",)),))).error is None
    assert home.state.ignored.get("duplicate-route") == 1
    assert not home.state.forwards.unrouted
    (number, entry), = home.state.forwards.pending(2)
    assert entry.outbox == 0 and entry.queues == ("dlq",) and entry.messages == ()
    assert home.state.forwards.pending(3) == []
    body = ((b"hello", {"h": 1, "x-death-reason": "rejected"}),)
    for _ in range(2):  # the second: a forwarder that died before ForwardDone
        done = target.apply(A, ForwardIn(1, number, entry.queues, body, (), "", "dlq"))
        assert done.error is None
    assert target.state.queues["dlq"].ready == 1
    assert target.state.ignored.get("duplicate-forward") == 1
    home.effects.clear()
    assert home.apply(A, ForwardDone(2, number)).error is None
    assert [e for e in home.effects if isinstance(e, Removed)] == [Removed(OUTBOX_QID, [0])]
    assert home.state.forwards.in_flight == 0


def test_a_dead_letter_exchange_routes_here_and_elsewhere() -> None:
    home = _partition(
        1, DeclareQueue("q", dead_letter_exchange="dlx", dead_letter_routing_key="k"),
        DeclareQueue("here"),
    )
    _reject(home, "q")
    (n, letter), = home.state.forwards.unrouted.items()
    assert letter.exchange == "dlx" and letter.routing_key == "k"
    home.effects.clear()
    # Never back into the queue it left, even if a route names it.
    assert home.apply(A, RouteDeadLetter(n, ("here", "q"), ((2, ("b",)), (3, ("c",))))).error is None
    moved = [e for e in home.effects if isinstance(e, Moved)]
    assert [(m.src_qid, m.dst_qid, m.keep) for m in moved] == [
        (OUTBOX_QID, home.state.queues["here"].qid, True)
    ]
    assert home.state.queues["here"].ready == 1 and home.state.queues["q"].ready == 0
    assert home.state.forwards.refs == {n: 2}
    home.effects.clear()
    assert home.apply(A, ForwardDone(2, 0)).error is None
    assert not [e for e in home.effects if isinstance(e, Removed)]  # partition 3 needs it
    assert home.apply(A, ForwardDone(3, 0)).error is None
    assert [e for e in home.effects if isinstance(e, Removed)] == [Removed(OUTBOX_QID, [n])]


def test_a_dead_letter_routed_nowhere_is_dropped_from_the_outbox() -> None:
    home = _partition(1, DeclareQueue("q", dead_letter="gone"))
    _reject(home, "q")
    home.effects.clear()
    assert home.apply(A, RouteDeadLetter(0)).error is None
    assert home.effects[0] == Removed(OUTBOX_QID, [0])
    assert home.state.ignored.get("dead-letter-unrouted") == 1
    assert home.state.forwards.in_flight == 0


def test_expired_and_overflowing_messages_go_to_the_outbox_too() -> None:
    home = _partition(1, DeclareQueue("q", dead_letter="dlq", max_length=1, overflow="drop-head"))
    for _ in range(2):  # the second drops the first from the head
        assert home.apply(A, Enqueue("q", MSG)).error is None
    assert home.apply(A, Expire("q", 1)).error is None
    reasons = [
        e.headers["x-death-reason"] for e in home.effects
        if isinstance(e, Moved) and e.dst_qid == OUTBOX_QID
    ]
    assert reasons == ["maxlen", "expired"] and len(home.state.forwards.unrouted) == 2
    assert home.state.queues["q"].length == 0


def test_a_log_of_one_still_drops_a_dead_letter_for_a_missing_queue() -> None:
    c = _flagged()  # (data_partition 0: no outbox)
    assert c.apply(A, DeclareQueue("q", dead_letter="nowhere")).error is None
    _reject(c, "q")
    assert c.state.queues["q"].dropped == 1 and not c.state.forwards


def test_the_outbox_is_replicated_state_and_unchanged_while_unused() -> None:
    home = _partition(1, DeclareQueue("q", dead_letter="dlq"), DeclareQueue("x"))
    assert home.state.forwards.snapshot() == [[], []]  # (as before dead letters forwarded)
    _reject(home, "q")
    _reject(home, "q")
    assert home.apply(A, RouteDeadLetter(0, (), ((2, ("dlq",)),))).error is None
    joined = State()
    joined.install(home.state.full_snapshot())
    assert joined.forwards.snapshot() == home.state.forwards.snapshot()
    assert joined.forwards.refs == {0: 1} and set(joined.forwards.unrouted) == {1}
    assert digest(joined) == digest(home.state)


def test_bad_routes_are_refused() -> None:
    home = _partition(1, DeclareQueue("q", dead_letter="dlq"))
    _reject(home, "q")
    for bad in (((1, ("a",)),), ((2, ("a",)), (2, ("b",))), ((0, ("a",)),), ((2, ()),)):
        done = home.apply(A, RouteDeadLetter(0, (), bad))
        assert isinstance(done.error, InvalidArgument)
    assert 0 in home.state.forwards.unrouted
