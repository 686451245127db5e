"""Exchange-to-exchange bindings under random logs (hypothesis; flag ``exchange_bindings``):
the state routes a publish to exactly the queues a plain model of the binding graph
reaches (each once, cycles included), and a replica fed the same records, and one
restored from a snapshot midway, end with the same digest."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batonmq.cluster import codec
from batonmq.cluster.effects import Completed, Effect
from batonmq.cluster.events import (
    Bind,
    BindExchange,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    EnableFeatures,
    Event,
    Heartbeat,
    Origin,
    Propose,
    UnbindExchange,
    Vote,
)
from batonmq.cluster.features import FEATURES
from batonmq.cluster.routing import binding_matches
from batonmq.cluster.state import State

ME = "n/r"
QUEUES = ("q1", "q2", "q3")
EXCHANGES = ("x1", "x2", "x3", "x4")
KEYS = ("a", "b", "a.b", "")
_BIND_KEYS = st.sampled_from(("a", "a.b", "#", "*", "", "b"))

_op = st.one_of(
    st.tuples(st.just("bind-queue"), st.sampled_from(QUEUES), st.sampled_from(EXCHANGES), _BIND_KEYS),
    st.tuples(st.sampled_from(("bind", "bind", "unbind")), st.sampled_from(EXCHANGES),
              st.sampled_from(EXCHANGES), _BIND_KEYS),
    st.tuples(st.just("publish"), st.sampled_from(EXCHANGES), st.sampled_from(KEYS)),
    st.tuples(st.just("publish"), st.sampled_from(EXCHANGES), st.sampled_from(KEYS)),
    st.tuples(st.just("delete"), st.sampled_from(EXCHANGES)),
    st.tuples(st.just("declare"), st.sampled_from(EXCHANGES),
              st.sampled_from(("direct", "fanout", "topic"))),
)
_types = st.tuples(*(st.sampled_from(("direct", "fanout", "topic")) for _ in EXCHANGES))


class Log:
    def __init__(self) -> None:
        self.state = State()
        self.records: list[bytes] = []
        self.seq = 0
        flags = {"features": sorted(FEATURES)}
        for ev in (Heartbeat("voter", "", flags), Propose(1, (ME,), "c"), Vote(1, True),
                   EnableFeatures(("exchange_bindings",))):
            self.apply(ev)
        assert "exchange_bindings" in self.state.features.enabled

    def apply(self, ev: Event[Any]) -> Completed | None:
        self.seq += 1
        record = codec.encode(Origin("n", "r", self.seq, 1000 + self.seq), ev)
        self.records.append(record)
        origin, event = codec.decode(record)
        out: list[Effect] = []
        self.state.apply(len(self.records) - 1, origin, event, out)
        return next((e for e in out if isinstance(e, Completed)), None)


class Model:
    """name -> type; queue bindings and exchange bindings as (source, target, key) sets."""

    def __init__(self) -> None:
        self.types: dict[str, str] = {}
        self.to_queues: list[tuple[str, str, str]] = []
        self.to_exchanges: list[tuple[str, str, str]] = []

    def route(self, exchange: str, key: str) -> set[str]:
        reached = {exchange}
        todo = [exchange]
        while todo:
            x = todo.pop()
            for s, d, k in self.to_exchanges:
                if s == x and d not in reached and binding_matches(self.types[x], k, {}, key, {}):
                    reached.add(d)
                    todo.append(d)
        return {q for s, q, k in self.to_queues
                if s in reached and binding_matches(self.types[s], k, {}, key, {})}

    def delete(self, name: str) -> None:
        del self.types[name]
        self.to_queues = [b for b in self.to_queues if b[0] != name]
        self.to_exchanges = [b for b in self.to_exchanges if name not in (b[0], b[1])]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_types, st.lists(_op, max_size=40), st.integers(min_value=0, max_value=40))
def test_routing_through_the_graph_matches_the_model_and_replicas_agree(
    types: tuple[str, ...], ops: list[tuple[Any, ...]], cut: int
) -> None:
    log, model = Log(), Model()
    for q in QUEUES:
        log.apply(DeclareQueue(q))
    for name, kind in zip(EXCHANGES, types):
        log.apply(DeclareExchange(name, kind))
        model.types[name] = kind
    restored: State | None = None
    for i, op in enumerate(ops):
        if i == cut:  # a joiner installed from a full snapshot here
            restored = State()
            restored.install(msgpack.unpackb(msgpack.packb(log.state.full_snapshot()), raw=False))
            restored_at = len(log.records)
        match op:
            case ("bind-queue", q, x, k):
                done = log.apply(Bind(q, x, k))
                if x in model.types and done is not None and done.error is None:
                    if (x, q, k) not in model.to_queues:
                        model.to_queues.append((x, q, k))
            case ("bind" | "unbind", d, s, k):
                ev = BindExchange(d, s, k) if op[0] == "bind" else UnbindExchange(d, s, k)
                done = log.apply(ev)
                exists = d in model.types and s in model.types
                assert done is not None and (done.error is None) == exists, (op, done)
                if exists and op[0] == "bind" and (s, d, k) not in model.to_exchanges:
                    model.to_exchanges.append((s, d, k))
                elif exists and op[0] == "unbind" and (s, d, k) in model.to_exchanges:
                    model.to_exchanges.remove((s, d, k))
            case ("publish", x, k):
                if x not in model.types:
                    continue
                got = log.state.exchanges.route(x, k, {}, log.state.queues)
                assert len(got) == len(set(got)), got
                assert set(got) == model.route(x, k), (op, model.to_exchanges, model.to_queues)
            case ("delete", x):
                done = log.apply(DeleteExchange(x))
                assert done is not None and (done.error is None) == (x in model.types)
                if x in model.types:
                    model.delete(x)
            case ("declare", x, kind):
                done = log.apply(DeclareExchange(x, kind))
                if x not in model.types:
                    model.types[x] = kind
    fed = State()
    for offset, record in enumerate(log.records):
        origin, event = codec.decode(record)
        fed.apply(offset, origin, event, [])
    assert fed.digest() == log.state.digest()
    if restored is not None:
        for offset, record in enumerate(log.records[restored_at:], start=restored_at):
            origin, event = codec.decode(record)
            restored.apply(offset, origin, event, [])
        assert restored.digest() == log.state.digest()
        assert restored.exchanges.describe() == log.state.exchanges.describe()
