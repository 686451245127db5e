"""Exchange-to-exchange bindings on the pure state machine (cluster/exchanges.py, flag
``exchange_bindings``): the routing graph (every type, several paths, cycles), what
deletes and auto-deletes remove, the flag, and the snapshot. Every event goes through
the codec on its way, as on the log."""

from __future__ import annotations

from typing import Any

from batonmq.cluster import codec
from batonmq.cluster.errors import AccessRefused, ExchangeNotFound, InvalidArgument, PreconditionFailed
from batonmq.cluster.events import (
    Acquire,
    Bind,
    BindExchange,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    EnableFeatures,
    Heartbeat,
    Interest,
    Leave,
    Origin,
    Propose,
    Reject,
    RoutedEnqueue,
    Unbind,
    UnbindExchange,
    Vote,
)
from batonmq.cluster.exchanges import Exchanges
from batonmq.cluster.features import FEATURES
from batonmq.cluster.results import Bound, ExchangeDeleted
from batonmq.cluster.snapshot import digest
from batonmq.cluster.state import State
from tests.unit.test_exchanges import A, B, Log

FLAG = "exchange_bindings"


def _log(enabled: bool = True) -> Log:
    """Two members whose builds announce every flag; ``enabled``: the flag is on."""
    log = Log()
    for who in (A, B):
        log.ok(Heartbeat("voter", "", {"features": sorted(FEATURES)}), who=who)
    if enabled:
        log.ok(EnableFeatures((FLAG,)))
        assert FLAG in log.state.features.enabled
    return log


def _route(state: State, exchange: str, key: str = "", headers: dict[str, Any] | None = None) -> list[str]:
    return state.exchanges.route(exchange, key, headers or {}, state.queues)


def test_the_flag_gates_the_events_and_the_snapshot_is_unchanged_until_one_exists() -> None:
    off = _log(enabled=False)
    off.ok(DeclareExchange("src", "fanout"))
    off.ok(DeclareExchange("dst", "fanout"))
    err = off.fails(BindExchange("dst", "src"))
    assert isinstance(err, InvalidArgument) and FLAG in err.message
    assert isinstance(off.fails(UnbindExchange("dst", "src")), InvalidArgument)
    on = _log()
    before = on.state.exchanges.snapshot()
    on.ok(DeclareExchange("src", "fanout"))
    on.ok(DeclareExchange("dst", "fanout"))
    plain = [list(x) for x in on.state.exchanges.snapshot()]
    assert all(len(x) == 8 for x in plain) and len(before) + 2 == len(plain)
    assert on.ok(BindExchange("dst", "src", "k")) == Bound(changed=True)
    snap = on.state.exchanges.snapshot()
    src = next(x for x in snap if x[0] == "src")
    assert src[8] == [["dst", "k", {}]]
    # Restored elsewhere: the same table, the same digest.
    other = Exchanges()
    other.restore(snap)
    assert other.snapshot() == snap
    assert digest(on.replica()) == digest(on.state)
    on.ok(UnbindExchange("dst", "src", "k"))
    assert all(len(x) == 8 for x in on.state.exchanges.snapshot())


def test_bind_exchange_needs_both_ends_is_idempotent_and_refuses_the_default() -> None:
    log = _log()
    log.ok(DeclareExchange("src", "direct"))
    log.ok(DeclareExchange("dst", "fanout"))
    assert isinstance(log.fails(BindExchange("dst", "nope")), ExchangeNotFound)
    assert isinstance(log.fails(BindExchange("nope", "src")), ExchangeNotFound)
    assert isinstance(log.fails(BindExchange("dst", "")), AccessRefused)
    assert isinstance(log.fails(BindExchange("", "src")), AccessRefused)
    assert log.ok(BindExchange("dst", "src", "k")) == Bound(changed=True)
    assert log.ok(BindExchange("dst", "src", "k")) == Bound(changed=False)
    assert log.ok(UnbindExchange("dst", "src", "other")) == Bound(changed=False)
    log.ok(DeclareExchange("h", "headers"))
    assert isinstance(log.fails(BindExchange("dst", "h", "", {"x-match": "some"})), InvalidArgument)
    ex = log.state.exchanges.get("src")
    assert ex is not None and ex.describe()["exchange_bindings"] == [
        {"destination": "dst", "routing_key": "k", "arguments": {}}
    ]


def test_routing_follows_edges_of_every_type() -> None:
    log = _log()
    for q in ("qd", "qf", "qt", "qh"):
        log.ok(DeclareQueue(q))
    log.ok(DeclareExchange("d", "direct"))
    log.ok(DeclareExchange("f", "fanout", internal=True))
    log.ok(DeclareExchange("t", "topic"))
    log.ok(DeclareExchange("h", "headers"))
    log.ok(Bind("qd", "d", "k"))
    log.ok(Bind("qf", "f"))
    log.ok(Bind("qt", "t", "a.*"))
    log.ok(Bind("qh", "h", "", {"x-match": "all", "kind": "x"}))
    # topic -> direct -> fanout; topic -> headers
    log.ok(BindExchange("d", "t", "a.#"))
    log.ok(BindExchange("f", "d", "a.b"))
    log.ok(BindExchange("h", "t", "#"))
    # t -> d ("a.#") -> f ("a.b"); d's own binding is "k"; h needs the header
    assert _route(log.state, "t", "a.b") == ["qt", "qf"]
    assert _route(log.state, "t", "a.b", {"kind": "x"}) == ["qt", "qh", "qf"]
    log.ok(Bind("qd", "d", "a.b"))
    assert _route(log.state, "t", "a.b", {"kind": "x"}) == ["qt", "qd", "qh", "qf"]
    assert _route(log.state, "t", "b.c") == []  # no edge matches "b.c" but "#" to h
    assert _route(log.state, "t", "b.c", {"kind": "x"}) == ["qh"]
    # a headers source routes on to exchanges by the headers
    log.ok(DeclareExchange("h2", "headers"))
    log.ok(BindExchange("f", "h2", "", {"x-match": "any", "to": "f"}))
    assert _route(log.state, "h2", "", {"to": "f"}) == ["qf"]
    assert _route(log.state, "h2", "", {"to": "g"}) == []


def test_a_queue_reached_by_several_paths_gets_a_message_once() -> None:
    log = _log()
    log.ok(DeclareQueue("q"))
    log.ok(DeclareQueue("r"))
    for x in ("top", "left", "right"):
        log.ok(DeclareExchange(x, "fanout"))
    log.ok(BindExchange("left", "top"))
    log.ok(BindExchange("right", "top"))
    log.ok(Bind("q", "top"))
    log.ok(Bind("q", "left"))
    log.ok(Bind("q", "right"))
    log.ok(Bind("r", "right"))
    assert _route(log.state, "top") == ["q", "r"]
    # and applied: one copy each
    result = log.ok(RoutedEnqueue(tuple(_route(log.state, "top")), ((b"m", {}),)))
    assert result.queues == ["q", "r"]
    assert log.state.queues["q"].ready == 1 and log.state.queues["r"].ready == 1


def test_cycles_terminate() -> None:
    log = _log()
    log.ok(DeclareQueue("q"))
    for x in ("a", "b", "c"):
        log.ok(DeclareExchange(x, "topic"))
    log.ok(BindExchange("a", "a", "#"))  # to itself
    log.ok(BindExchange("b", "a", "#"))
    log.ok(BindExchange("c", "b", "#"))
    log.ok(BindExchange("a", "c", "#"))
    log.ok(Bind("q", "c", "x.*"))
    assert _route(log.state, "a", "x.y") == ["q"]
    assert _route(log.state, "b", "x.y") == ["q"]
    assert _route(log.state, "a", "z") == []


def test_deleting_an_exchange_removes_bindings_to_and_from_it() -> None:
    log = _log()
    log.ok(DeclareQueue("q"))
    for x in ("src", "mid", "dst"):
        log.ok(DeclareExchange(x, "fanout"))
    log.ok(BindExchange("mid", "src"))
    log.ok(BindExchange("dst", "mid"))
    log.ok(Bind("q", "dst"))
    assert _route(log.state, "src") == ["q"]
    # if_unused counts its bindings as a source, of both kinds
    assert isinstance(log.fails(DeleteExchange("mid", if_unused=True)), PreconditionFailed)
    assert log.ok(DeleteExchange("mid")) == ExchangeDeleted(bindings=1)
    src = log.state.exchanges.get("src")
    assert src is not None and src.exchange_bindings == []
    assert _route(log.state, "src") == []
    # a destination only (no binding as a source) is unused
    log.ok(DeclareExchange("mid", "fanout"))
    log.ok(BindExchange("mid", "src"))
    assert log.ok(DeleteExchange("mid", if_unused=True)) == ExchangeDeleted(bindings=0)


def test_auto_delete_counts_exchange_bindings_as_rabbitmq_does() -> None:
    log = _log()
    log.ok(DeclareQueue("q"))
    log.ok(DeclareExchange("auto", "fanout", auto_delete=True))
    log.ok(DeclareExchange("dst", "fanout"))
    log.ok(Bind("q", "auto"))
    log.ok(BindExchange("dst", "auto"))
    # its queue binding goes: its exchange binding keeps it
    log.ok(Unbind("q", "auto"))
    assert log.state.exchanges.get("auto") is not None
    # its last binding as a source goes: it goes
    log.ok(UnbindExchange("dst", "auto"))
    assert log.state.exchanges.get("auto") is None
    # a binding *to* an auto-delete exchange does not keep it
    log.ok(DeclareExchange("auto", "fanout", auto_delete=True))
    log.ok(BindExchange("auto", "dst"))
    log.ok(Bind("q", "auto"))
    log.ok(DeleteQueue("q"))
    assert log.state.exchanges.get("auto") is None
    dst = log.state.exchanges.get("dst")
    assert dst is not None and dst.exchange_bindings == []


def test_deleting_a_destination_cascades_through_auto_delete_sources() -> None:
    log = _log()
    log.ok(DeclareExchange("a1", "fanout", auto_delete=True))
    log.ok(DeclareExchange("a2", "fanout", auto_delete=True))
    log.ok(DeclareExchange("end", "fanout"))
    log.ok(BindExchange("a2", "a1"))
    log.ok(BindExchange("end", "a2"))
    log.ok(DeleteExchange("end"))
    assert log.state.exchanges.get("a2") is None and log.state.exchanges.get("a1") is None


def test_a_non_durable_destination_goes_with_its_member_and_its_bindings_with_it() -> None:
    log = _log()
    log.ok(DeclareExchange("src", "fanout"))
    log.ok(DeclareExchange("mine", "fanout", durable=False), who=B)
    log.ok(BindExchange("mine", "src"))
    log.ok(Leave(), who=B)
    log.ok(Propose(2, (A,), "c"))
    log.ok(Vote(2, True))
    assert log.state.exchanges.get("mine") is None
    src = log.state.exchanges.get("src")
    assert src is not None and src.exchange_bindings == []
    assert digest(log.replica()) == digest(log.state)


def test_dead_letters_follow_exchange_bindings() -> None:
    log = _log()
    log.ok(DeclareExchange("dlx", "fanout"))
    log.ok(DeclareExchange("dead", "direct"))
    log.ok(DeclareQueue("dlq"))
    log.ok(Bind("dlq", "dead", "k"))
    log.ok(BindExchange("dead", "dlx"))
    log.ok(DeclareQueue("work", dead_letter_exchange="dlx"))
    log.ok(RoutedEnqueue(("work",), ((b"m", {}),), routing_key="k"))
    log.ok(Interest("work", True))
    log.ok(Acquire("work", f"{A}/1", 1))
    log.ok(Reject("work", f"{A}/1", (0,)))
    assert log.state.queues["dlq"].ready == 1


def test_the_events_round_trip_the_codec() -> None:
    for ev in (BindExchange("d", "s", "k", {"x-match": "any", "a": 1}), UnbindExchange("d", "s")):
        record = codec.encode(Origin("n", "r", 1, 2), ev)
        assert codec.decode(record)[1] == ev
