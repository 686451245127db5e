"""Exchanges, bindings, routed publishes and dead letters through an exchange, on the
pure state machine (cluster/exchanges.py, cluster/queues.py). Every event goes through
the codec on its way, as on the log."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from batonmq.cluster import codec
from batonmq.cluster.codec import MalformedEvent
from batonmq.cluster.effects import Completed, Effect, Moved, Removed, Stored
from batonmq.cluster.errors import (
    AccessRefused,
    BatonError,
    ExchangeNotFound,
    InvalidArgument,
    PreconditionFailed,
    QueueExists,
    QueueNotFound,
)
from batonmq.cluster.events import (
    Accept,
    Acquire,
    Bind,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    Enqueue,
    Event,
    Expire,
    Heartbeat,
    Interest,
    Leave,
    Origin,
    Propose,
    Reject,
    Release,
    RoutedEnqueue,
    Unbind,
    Vote,
)
from batonmq.cluster.exchanges import BUILTIN_EXCHANGES
from batonmq.cluster.results import Bound, Declared, ExchangeDeleted, Routed
from batonmq.cluster.state import State

A, B = "a/1", "b/1"


class Log:
    """Two members on one log; each event is encoded, kept, decoded and applied."""

    def __init__(self) -> None:
        self.state = State()
        self.records: list[bytes] = []
        self.seqs: dict[str, int] = {}
        self.effects: list[Effect] = []
        for who in (A, B):
            self._apply(who, Heartbeat("voter", "", {}))
        self._apply(A, Propose(1, (A, B), "c"))
        for who in (A, B):
            self._apply(who, Vote(1, True))
        assert self.state.membership.members == [A, B]

    def _apply(self, who: str, ev: Event[Any]) -> Completed:
        self.seqs[who] = seq = self.seqs.get(who, 0) + 1
        node, runtime = who.split("/")
        record = codec.encode(Origin(node, runtime, seq, 1000 + len(self.records)), ev)
        offset = len(self.records)
        self.records.append(record)
        origin, event = codec.decode(record)
        assert event == ev
        out: list[Effect] = []
        self.state.apply(offset, origin, event, out)
        self.effects = out
        return next(e for e in out if isinstance(e, Completed))

    def ok(self, ev: Event[Any], who: str = A) -> Any:
        done = self._apply(who, ev)
        assert done.error is None, done.error
        return done.result

    def fails(self, ev: Event[Any], who: str = A) -> BatonError:
        done = self._apply(who, ev)
        assert done.error is not None, done.result
        return done.error

    def replica(self) -> State:
        """A second replica that applied the same records."""
        other = State()
        for offset, record in enumerate(self.records):
            origin, event = codec.decode(record)
            other.apply(offset, origin, event, [])
        return other


def _bindings(state: State, exchange: str) -> list[tuple[str, str, dict[str, Any]]]:
    ex = state.exchanges.get(exchange)
    assert ex is not None
    return list(ex.bindings)


def test_the_built_in_exchanges_exist_and_stay() -> None:
    log = Log()
    assert set(BUILTIN_EXCHANGES) <= set(log.state.exchanges.exchanges)
    assert log.ok(DeclareExchange("amq.topic", "topic")) == Declared(created=False)
    assert isinstance(log.fails(DeclareExchange("amq.topic", "direct")), PreconditionFailed)
    assert isinstance(log.fails(DeclareExchange("amq.fanout", "fanout", durable=False)),
                      PreconditionFailed)
    assert isinstance(log.fails(DeclareExchange("", "direct")), AccessRefused)
    assert isinstance(log.fails(DeclareExchange("amq.mine", "direct")), AccessRefused)
    for name in BUILTIN_EXCHANGES:
        assert isinstance(log.fails(DeleteExchange(name)), AccessRefused)
    log.ok(DeclareQueue("q"))
    assert isinstance(log.fails(Bind("q", "")), AccessRefused)
    assert log.ok(Bind("q", "amq.direct", "k")) == Bound(changed=True)


def test_declare_compares_type_and_settings() -> None:
    log = Log()
    assert log.ok(DeclareExchange("x", "topic", arguments={"alternate-exchange": "ae"})) == (
        Declared(created=True)
    )
    assert log.ok(DeclareExchange("x", "topic", arguments={"alternate-exchange": "ae"})) == (
        Declared(created=False)
    )
    for other in (
        DeclareExchange("x", "direct", arguments={"alternate-exchange": "ae"}),
        DeclareExchange("x", "topic"),
        DeclareExchange("x", "topic", durable=False, arguments={"alternate-exchange": "ae"}),
        DeclareExchange("x", "topic", internal=True, arguments={"alternate-exchange": "ae"}),
    ):
        err = log.fails(other)
        assert isinstance(err, PreconditionFailed) and not isinstance(err, QueueExists)
    assert isinstance(log.fails(DeclareExchange("y", "x-delayed")), InvalidArgument)
    assert isinstance(log.fails(DeclareExchange("bad\nname", "direct")), InvalidArgument)
    assert log.state.exchanges.get("y") is None


def test_bind_and_unbind_need_both_ends_and_are_idempotent() -> None:
    log = Log()
    log.ok(DeclareQueue("q"))
    log.ok(DeclareExchange("x", "direct"))
    assert isinstance(log.fails(Bind("q", "nope", "k")), ExchangeNotFound)
    assert isinstance(log.fails(Bind("nope", "x", "k")), QueueNotFound)
    assert isinstance(log.fails(Unbind("q", "nope", "k")), ExchangeNotFound)
    assert log.ok(Bind("q", "x", "k")) == Bound(changed=True)
    assert log.ok(Bind("q", "x", "k")) == Bound(changed=False)
    assert log.ok(Bind("q", "x", "k2")) == Bound(changed=True)
    assert _bindings(log.state, "x") == [("q", "k", {}), ("q", "k2", {})]
    assert log.ok(Unbind("q", "x", "k")) == Bound(changed=True)
    assert log.ok(Unbind("q", "x", "k")) == Bound(changed=False)
    assert _bindings(log.state, "x") == [("q", "k2", {})]
    log.ok(DeclareExchange("h", "headers"))
    assert isinstance(log.fails(Bind("q", "h", "", {"x-match": "some"})), InvalidArgument)
    assert log.ok(Bind("q", "h", "", {"x-match": "any", "a": 1})) == Bound(changed=True)


def test_delete_exchange_if_unused_and_with_its_bindings() -> None:
    log = Log()
    log.ok(DeclareQueue("q"))
    log.ok(DeclareExchange("x", "fanout"))
    log.ok(Bind("q", "x"))
    assert isinstance(log.fails(DeleteExchange("x", if_unused=True)), PreconditionFailed)
    assert log.ok(DeleteExchange("x")) == ExchangeDeleted(bindings=1)
    assert log.state.exchanges.get("x") is None
    assert isinstance(log.fails(DeleteExchange("x")), ExchangeNotFound)
    log.ok(DeclareExchange("x", "fanout"))  # declared again: no binding comes back
    assert _bindings(log.state, "x") == []


def test_deleting_a_queue_removes_its_bindings_and_empty_auto_delete_exchanges() -> None:
    log = Log()
    log.ok(DeclareQueue("q1"))
    log.ok(DeclareQueue("q2"))
    log.ok(DeclareExchange("x", "direct"))
    log.ok(DeclareExchange("auto", "fanout", auto_delete=True))
    log.ok(Bind("q1", "x", "a"))
    log.ok(Bind("q2", "x", "a"))
    log.ok(Bind("q1", "auto"))
    log.ok(Bind("q1", "amq.topic", "#"))
    log.ok(DeleteQueue("q1"))
    assert _bindings(log.state, "x") == [("q2", "a", {})]
    assert _bindings(log.state, "amq.topic") == []
    assert log.state.exchanges.get("auto") is None
    # An auto-delete exchange never bound stays; unbinding its last binding deletes it.
    log.ok(DeclareExchange("auto2", "fanout", auto_delete=True))
    assert log.state.exchanges.get("auto2") is not None
    log.ok(Bind("q2", "auto2"))
    log.ok(Unbind("q2", "auto2"))
    assert log.state.exchanges.get("auto2") is None


def test_a_non_durable_exchange_goes_with_the_member_that_declared_it() -> None:
    log = Log()
    log.ok(DeclareExchange("mine", "fanout", durable=False), who=B)
    log.ok(DeclareExchange("kept", "fanout"), who=B)
    log.ok(Leave(), who=B)
    log.ok(Propose(2, (A,), "c"))
    log.ok(Vote(2, True))
    assert log.state.membership.members == [A]
    assert log.state.exchanges.get("mine") is None
    assert log.state.exchanges.get("kept") is not None


def _stored(effects: list[Effect]) -> dict[int, list[bytes]]:
    return {e.qid: [m[0] for m in e.messages] for e in effects if isinstance(e, Stored)}


def test_a_routed_publish_enqueues_on_each_queue_at_one_log_position() -> None:
    log = Log()
    log.ok(DeclareQueue("q1"))
    log.ok(DeclareQueue("q2", max_length=1))
    log.ok(Enqueue("q2", ((b"old", {}),)))
    msgs = ((b"m1", {"h": 1}), (b"m2", {}))
    r = log.ok(RoutedEnqueue(("q1", "q2", "gone", "q1"), msgs, exchange="x", routing_key="k"))
    assert r == Routed(queues=["q1"], positions=[0], full=["q2"], missing=["gone"])
    assert _stored(log.effects) == {log.state.queues["q1"].qid: [b"m1", b"m2"]}
    assert log.state.queues["q1"].next_pos == 2  # named twice, enqueued once
    # Nothing routed: an empty answer, not an error.
    log.ok(DeleteQueue("q1"))
    assert log.ok(RoutedEnqueue(("q1",), msgs)) == Routed([], [], [], ["q1"])
    # A bad priority refuses the whole event before any queue changes.
    log.ok(DeclareQueue("q3"))
    assert isinstance(log.fails(RoutedEnqueue(("q3",), msgs, priority=11)), InvalidArgument)
    assert log.state.queues["q3"].next_pos == 0


def test_a_re_sent_routed_publish_is_enqueued_on_no_queue_twice() -> None:
    log = Log()
    log.ok(DeclareQueue("q1"))
    log.ok(DeclareQueue("q2", max_length=1))
    log.ok(Enqueue("q2", ((b"old", {}),)))
    log.ok(Enqueue("q1", ((b"first", {}),)))
    ev = RoutedEnqueue(("q1", "q2"), ((b"m", {}),), (("pub-1", 1),), "x", "k")
    assert log.ok(ev) == Routed(["q1"], [1], ["q2"], [])
    # q2 makes room; the publisher sends the same publish again (it was not confirmed
    # on q2): q1 has it already, q2 takes it now.
    log.ok(Interest("q2", True))
    log.ok(Acquire("q2", f"{A}/1", 1))
    log.ok(Accept("q2", f"{A}/1", (0,)))
    assert log.ok(ev) == Routed(["q1", "q2"], [1, 1], [], [])
    assert _stored(log.effects) == {log.state.queues["q2"].qid: [b"m"]}
    assert log.ok(ev) == Routed(["q1", "q2"], [1, 1], [], [])  # and again: nowhere
    assert _stored(log.effects) == {}
    assert log.state.queues["q1"].next_pos == 2 and log.state.queues["q2"].next_pos == 2
    assert log.state.ignored["duplicate-publish"] == 3


def test_exchanges_are_in_the_snapshot_the_digest_and_a_joiners_state() -> None:
    log = Log()
    log.ok(DeclareQueue("q"))
    log.ok(DeclareExchange("x", "headers", auto_delete=True, arguments={"a": [1, 2]}))
    before = log.state.digest()
    log.ok(Bind("q", "x", "", {"x-match": "any", "k": "v"}))
    assert log.state.digest() != before  # a binding alone changes the digest
    log.ok(Bind("q", "amq.fanout"))
    digest = log.state.digest()
    assert log.replica().digest() == digest

    # A restart: the store keeps the exchanges apart from the meta snapshot, written
    # only when they changed (take_exchanges), and reads both back.
    stored = log.state.take_exchanges()
    assert stored is not None and log.state.take_exchanges() is None  # nothing new
    restored = State()
    restored.restore_meta(msgpack.unpackb(msgpack.packb(log.state.meta_snapshot()), raw=False))
    restored.exchanges.restore(msgpack.unpackb(msgpack.packb(stored), raw=False))
    assert restored.exchanges.describe() == log.state.exchanges.describe()
    log.ok(Unbind("q", "amq.fanout"))
    assert log.state.take_exchanges() == log.state.exchanges.snapshot()  # changed: again
    digest = log.state.digest()

    joiner = State()  # a join: the full snapshot as it travels in UpdateState
    joiner.install(msgpack.unpackb(msgpack.packb(log.state.full_snapshot()), raw=False))
    assert joiner.digest() == digest
    assert joiner.exchanges.route("x", "", {"k": "v"}, joiner.queues) == ["q"]
    assert joiner.exchanges.get("x").auto_delete  # type: ignore[union-attr]
    joiner.exchanges.restore(None)  # the same state but for its exchanges
    assert joiner.digest() != digest  # so checkpoints would tell the replicas apart


def test_a_snapshot_from_before_exchanges_restores_the_built_ins() -> None:
    log = Log()
    log.ok(DeclareExchange("x", "direct"))
    meta, keys, queues = log.state.full_snapshot()
    assert len(meta) == 10 and meta[:9] == log.state.meta_snapshot()
    joiner = State()  # from a donor that had no exchanges: its meta part has 9 items
    joiner.install([meta[:9], keys, queues])
    assert sorted(joiner.exchanges.exchanges) == sorted(BUILTIN_EXCHANGES)
    restored = State()  # a store from before exchanges has none to restore
    restored.exchanges.restore([["y", "fanout", True, False, False, {}, A, []]])
    restored.exchanges.restore(None)
    assert sorted(restored.exchanges.exchanges) == sorted(BUILTIN_EXCHANGES)


def test_the_new_events_round_trip_and_old_records_decode() -> None:
    origin = Origin("n", "r", 1, 5)
    for ev in (
        DeclareExchange("x", "headers", False, True, True, {"a": {"b": 1}}),
        DeleteExchange("x", True),
        Bind("q", "x", "a.*", {"x-match": "all"}),
        Unbind("q", "x"),
        RoutedEnqueue(("a", "b"), ((b"m", {}),), (("k", 1),), "x", "r", 5, 6, 1),
        DeclareQueue("q", dead_letter_exchange="", dead_letter_routing_key="dlq"),
    ):
        assert codec.decode(codec.encode(origin, ev)) == (origin, ev)
    # A DeclareQueue written before dead-letter exchanges: no exchange.
    record = msgpack.packb(["n", "r", 1, 5, DeclareQueue.OP, "q", True, None, "drop-head"])
    assert codec.decode(record)[1] == DeclareQueue("q", overflow="drop-head")
    for bad in (
        [RoutedEnqueue.OP, [], [[b"m", {}]]],
        [RoutedEnqueue.OP, ["a", 1], [[b"m", {}]]],
        [RoutedEnqueue.OP, ["a"], [[b"m", {}]], [["k", 2]]],
        [Bind.OP, "q", "x", "k", []],
        [DeclareExchange.OP, "x", 1],
        [DeleteExchange.OP, "x", 1],
    ):
        with pytest.raises(MalformedEvent):
            codec.decode(msgpack.packb(["n", "r", 1, 5, *bad]))


# --- dead letters through an exchange --------------------------------------------------


def _moves(effects: list[Effect]) -> list[Moved]:
    return [e for e in effects if isinstance(e, Moved)]


def _dlx_log(**queue: Any) -> Log:
    log = Log()
    log.ok(DeclareExchange("dlx", "fanout"))
    log.ok(DeclareQueue("d1"))
    log.ok(DeclareQueue("d2"))
    log.ok(Bind("d1", "dlx"))
    log.ok(Bind("d2", "dlx"))
    log.ok(DeclareQueue("q", dead_letter_exchange="dlx", **queue))
    log.ok(Interest("q", True))
    return log


def test_a_rejected_message_is_copied_to_every_routed_queue() -> None:
    log = _dlx_log()
    log.ok(Bind("q", "dlx"))  # never back into the queue it left
    log.ok(Enqueue("q", ((b"m", {}),)))
    log.ok(Acquire("q", f"{A}/1", 1))
    log.ok(Reject("q", f"{A}/1", (0,)))
    qs = log.state.queues
    moves = _moves(log.effects)
    assert [(m.dst_qid, m.keep) for m in moves] == [(qs["d1"].qid, True), (qs["d2"].qid, False)]
    assert all(m.src_qid == qs["q"].qid and m.src_pos == 0 for m in moves)
    assert moves[0].headers == {
        "x-death-reason": "rejected",
        "x-death-queue": "q",
        "x-death-position": 0,
        "x-death-delivery-count": 1,
        "x-death-acquired-count": 1,
        "x-death-exchange": "dlx",
        "x-death-routing-key": "q",
        "x-last-death-reason": "rejected",
        "x-last-death-queue": "q",
        "x-last-death-exchange": "dlx",
    }
    assert all(m.defaults == {  # kept where the message has them: its first death
        "x-first-death-reason": "rejected",
        "x-first-death-queue": "q",
        "x-first-death-exchange": "dlx",
    } for m in moves)
    assert (qs["d1"].ready, qs["d2"].ready, qs["q"].next_pos) == (1, 1, 1)
    assert qs["q"].dead_lettered == 1 and qs["d1"].enqueued == 1


def test_dead_letters_at_the_delivery_limit_by_ttl_and_by_drop_head() -> None:
    log = _dlx_log(delivery_limit=1, max_length=2, overflow="drop-head", message_ttl_ms=10)
    qs = log.state.queues
    log.ok(Enqueue("q", ((b"a", {}), (b"b", {}))))
    log.ok(Acquire("q", f"{A}/1", 1))
    log.ok(Release("q", f"{A}/1", (0,)))  # the limit: dead-lettered
    assert [m.headers["x-death-reason"] for m in _moves(log.effects)] == ["delivery-limit"] * 2
    log.ok(Enqueue("q", ((b"c", {}), (b"d", {}))))  # full: "b" goes by drop-head
    assert [(m.src_pos, m.headers["x-death-reason"]) for m in _moves(log.effects)] == [
        (1, "maxlen"), (1, "maxlen")
    ]
    log.ok(Expire("q", 2))
    assert [(m.src_pos, m.headers["x-death-reason"]) for m in _moves(log.effects)] == [
        (2, "expired"), (2, "expired")
    ]
    assert (qs["d1"].ready, qs["d2"].ready) == (3, 3)


def test_the_routing_key_is_the_publishs_unless_the_queue_names_one() -> None:
    log = Log()
    log.ok(DeclareExchange("dlx", "direct"))
    for name in ("by-k1", "by-k2", "by-q", "by-fixed"):
        log.ok(DeclareQueue(name))
    log.ok(Bind("by-k1", "dlx", "k1"))
    log.ok(Bind("by-k2", "dlx", "k2"))
    log.ok(Bind("by-q", "dlx", "q"))
    log.ok(Bind("by-fixed", "dlx", "fixed"))
    log.ok(DeclareQueue("q", dead_letter_exchange="dlx"))
    log.ok(DeclareQueue("f", dead_letter_exchange="dlx", dead_letter_routing_key="fixed"))
    log.ok(RoutedEnqueue(("q", "f"), ((b"1", {}), (b"2", {})), routing_key="k1"))
    log.ok(Enqueue("q", ((b"3", {}),)))  # a plain publish: the queue's name
    log.ok(RoutedEnqueue(("q", "f"), ((b"4", {}),), routing_key="k2"))
    for name in ("q", "f"):
        log.ok(Interest(name, True))
        log.ok(Acquire(name, f"{A}/1", 4))
    qs = log.state.queues
    got = []
    for p in (0, 1, 2, 3):
        log.ok(Reject("q", f"{A}/1", (p,)))
        got.append([m.dst_qid for m in _moves(log.effects)])
    assert got == [[qs["by-k1"].qid], [qs["by-k1"].qid], [qs["by-q"].qid], [qs["by-k2"].qid]]
    log.ok(Reject("f", f"{A}/1", (0, 1, 2)))
    assert {m.dst_qid for m in _moves(log.effects)} == {qs["by-fixed"].qid}
    assert log.replica().digest() == log.state.digest()


def test_the_default_exchange_and_routing_nowhere() -> None:
    log = Log()
    log.ok(DeclareQueue("dlq"))
    log.ok(DeclareQueue("q", dead_letter_exchange="", dead_letter_routing_key="dlq"))
    log.ok(DeclareQueue("lost", dead_letter_exchange="nope"))
    log.ok(Enqueue("q", ((b"m", {}),)))
    log.ok(Enqueue("lost", ((b"m", {}),)))
    log.ok(Expire("q", 0))
    assert [m.dst_qid for m in _moves(log.effects)] == [log.state.queues["dlq"].qid]
    log.ok(Expire("lost", 0))  # no such exchange: dropped
    assert _moves(log.effects) == [] and any(isinstance(e, Removed) for e in log.effects)


def test_dead_letter_exchange_settings_are_checked() -> None:
    log = Log()
    for bad in (
        DeclareQueue("q", dead_letter="d", dead_letter_exchange="x"),
        DeclareQueue("q", dead_letter_routing_key="k"),
        DeclareQueue("q", dead_letter_exchange="\x00"),
    ):
        assert isinstance(log.fails(bad), InvalidArgument)
    log.ok(DeclareQueue("q", dead_letter_exchange="x"))
    assert isinstance(log.fails(DeclareQueue("q", dead_letter_exchange="y")), QueueExists)
    stats = log.state.queues["q"].stats()
    assert stats["dead_letter_exchange"] == "x" and stats["dead_letter_routing_key"] is None


def test_the_routing_keys_kept_for_dead_letters_are_forgotten_as_messages_leave() -> None:
    log = Log()
    log.ok(DeclareQueue("q", dead_letter_exchange="dlx"))
    log.ok(Interest("q", True))
    for i in range(100):
        log.ok(RoutedEnqueue(("q",), ((b"m", {}),), routing_key=f"k{i}"))
        log.ok(Acquire("q", f"{A}/1", 1))
        log.ok(Accept("q", f"{A}/1", (i,)))
    q = log.state.queues["q"]
    assert len(q.rkeys) <= 33
    assert q.key_of(99) == "k99"
    assert log.replica().digest() == log.state.digest()


def test_routing_at_the_edge_follows_binding_changes() -> None:
    log = Log()
    ex = log.state.exchanges
    for name in ("q1", "q2"):
        log.ok(DeclareQueue(name))
    log.ok(DeclareExchange("d", "direct"))
    log.ok(Bind("q1", "d", "k"))
    assert ex.route("d", "k", {}, log.state.queues) == ["q1"]
    log.ok(Bind("q2", "d", "k"))
    log.ok(Bind("q2", "d", "k2"))
    assert ex.route("d", "k", {}, log.state.queues) == ["q1", "q2"]
    log.ok(Unbind("q1", "d", "k"))
    assert ex.route("d", "k", {}, log.state.queues) == ["q2"]
    assert ex.route("", "q1", {}, log.state.queues) == ["q1"]  # the default exchange
    assert ex.route("", "nope", {}, log.state.queues) == []
    with pytest.raises(ExchangeNotFound):
        ex.route("nope", "k", {}, log.state.queues)
    log.ok(DeclareExchange("t", "topic"))
    log.ok(Bind("q1", "t", "a.#"))
    log.ok(Bind("q2", "t", "*.b"))
    assert ex.route("t", "a.b", {}, log.state.queues) == ["q1", "q2"]
    assert ex.route("t", "a", {}, log.state.queues) == ["q1"]
    log.ok(Unbind("q1", "t", "a.#"))
    log.ok(Bind("q1", "t", "#.b"))
    assert ex.route("t", "a.b", {}, log.state.queues) == ["q2", "q1"]
    assert ex.route("t", "a", {}, log.state.queues) == []


def test_a_dead_letters_key_travels_on_even_when_empty() -> None:
    # q1 dead-letters through a topic exchange to q2, which dead-letters by the key
    # again: a message published with "" keeps "" (not a queue's name) on its way.
    log = Log()
    log.ok(DeclareExchange("t", "topic"))
    log.ok(DeclareQueue("q1", dead_letter_exchange="t"))
    log.ok(DeclareQueue("q2", dead_letter_exchange="t"))
    log.ok(DeclareQueue("empty-key"))
    log.ok(Bind("q2", "t", "#"))
    log.ok(Bind("empty-key", "t", ""))
    log.ok(RoutedEnqueue(("q1",), ((b"m", {}),), routing_key=""))
    for q in ("q1", "q2"):
        log.ok(Interest(q, True))
        log.ok(Acquire(q, f"{A}/1", 1))
        log.ok(Reject(q, f"{A}/1", (0,)))
    qs = log.state.queues
    assert qs["q2"].key_of(0) == ""
    assert [m.dst_qid for m in _moves(log.effects)] == [qs["empty-key"].qid]


def test_arguments_compare_with_their_types() -> None:
    log = Log()
    log.ok(DeclareQueue("q"))
    log.ok(DeclareExchange("h", "headers", arguments={"a": 1, "b": [1]}))
    assert log.ok(DeclareExchange("h", "headers", arguments={"b": [1], "a": 1})) == (
        Declared(created=False)  # the order of a map's keys does not matter
    )
    for other in ({"a": True, "b": [1]}, {"a": 1.0, "b": [1]}, {"a": 1, "b": [True]}):
        assert isinstance(log.fails(DeclareExchange("h", "headers", arguments=other)),
                          PreconditionFailed)
    assert log.ok(Bind("q", "h", "", {"x-match": "any", "k": 1})) == Bound(changed=True)
    assert log.ok(Bind("q", "h", "", {"k": 1, "x-match": "any"})) == Bound(changed=False)
    assert log.ok(Bind("q", "h", "", {"x-match": "any", "k": True})) == Bound(changed=True)
    assert log.ok(Unbind("q", "h", "", {"x-match": "any", "k": 1.0})) == Bound(changed=False)
    assert log.ok(Unbind("q", "h", "", {"x-match": "any", "k": True})) == Bound(changed=True)
    assert _bindings(log.state, "h") == [("q", "", {"x-match": "any", "k": 1})]
