"""Service leadership under random logs (hypothesis): candidates come and go, leaders
resign, admins ask for handovers, brokers die and join. After every step the
invariants of docs/design.md §7 hold, and a replica that applies the same records (restored
from a snapshot midway) ends with the same digest."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from batonmq.cluster import codec
from batonmq.cluster.events import Candidate, Event, Handover, Heartbeat, Origin, Propose, Resign, Vote
from batonmq.cluster.services import host_of
from batonmq.cluster.effects import Effect, LeaderChanged
from batonmq.cluster.queues import QueueState
from batonmq.cluster.state import State

SERVICES = ("s1", "s2")


class Harness:
    """Brokers on one log; each event is encoded, applied, and kept for a replica."""

    def __init__(self) -> None:
        self.state = State(suspect_beats=3)
        self.records: list[bytes] = []
        self.seqs: dict[str, int] = {}
        self.effects: list[tuple[int, Effect]] = []
        self.next_node = 0

    def apply(self, who: str, ev: Event) -> None:
        self.seqs[who] = seq = self.seqs.get(who, 0) + 1
        node, runtime = who.split("/")
        record = codec.encode(Origin(node, runtime, seq, 1000 + len(self.records)), ev)
        offset = len(self.records)
        self.records.append(record)
        out: list[Effect] = []
        origin, event = codec.decode(record)
        self.state.apply(offset, origin, event, out)
        self.effects.extend((offset, e) for e in out)

    def duties(self) -> None:
        ms = self.state.membership
        for _ in range(10):
            acted = False
            proposer = ms.proposer()
            if proposer is not None and ms.needs_view() and ms.proposal is None:
                self.apply(proposer, Propose(ms.view_seq + 1, tuple(ms.desired()), "cid"))
                acted = True
            for voter in ms.voters_pending():
                self.apply(voter, Vote(ms.proposal.seq if ms.proposal else 0, True))
                acted = True
            if not acted:
                return

    def add_broker(self) -> str:
        self.next_node += 1
        key = f"n{self.next_node}/r"
        self.apply(key, Heartbeat("voter", "", {}))
        self.duties()
        return key

    def kill(self, *victims: str) -> None:
        """Everyone else beats until the view drops the ``victims`` (at once)."""
        for _ in range(10):
            if not set(victims) & set(self.state.membership.members):
                return
            for m in list(self.state.membership.members):
                if m not in victims:
                    self.apply(m, Heartbeat("voter", "", {}))
            self.duties()


step = st.one_of(
    st.tuples(st.just("lead"), st.integers(0, 5), st.sampled_from(SERVICES), st.integers(0, 2)),
    st.tuples(st.just("resign"), st.integers(0, 5), st.sampled_from(SERVICES), st.integers(0, 2)),
    st.tuples(st.just("resign-leader"), st.integers(0, 5), st.sampled_from(SERVICES), st.just(0)),
    st.tuples(st.just("handover"), st.integers(0, 5), st.sampled_from(SERVICES), st.integers(0, 3)),
    st.tuples(st.just("kill"), st.integers(0, 5), st.just(""), st.integers(0, 1)),
    st.tuples(st.just("join"), st.just(0), st.just(""), st.just(0)),
)


def check_invariants(h: Harness) -> None:
    members = set(h.state.membership.members)
    for name, s in h.state.services.services.items():
        assert s.candidates, f"{name}: a service without candidates is forgotten"
        assert len(set(s.candidates)) == len(s.candidates)
        for c in s.candidates:
            assert host_of(c) in members, f"{c} of {name} is hosted outside the view"
        assert s.leader in s.candidates, f"{name}: the leader {s.leader} is a candidate"
        assert s.token <= h.state.applied
        if s.handover_to is not None:
            assert s.handover
    # Tokens strictly increase per service; at most one term per service per event.
    last: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    for offset, e in h.effects:
        if isinstance(e, LeaderChanged):
            assert (e.service, offset) not in seen, f"two terms of {e.service} at {offset}"
            seen.add((e.service, offset))
            if e.leader is not None:
                assert e.token == offset
                assert e.token > last.get(e.service, -1)
                last[e.service] = e.token


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=40), cut=st.floats(0, 1))
# The leader's broker and the next candidate's die in one view change: one new term.
@example(
    steps=[("lead", 0, "s1", 0), ("lead", 1, "s1", 1), ("lead", 2, "s1", 0), ("kill", 0, "", 1)],
    cut=0.5,
)
def test_random_leadership_logs(steps: list[tuple[str, int, str, int]], cut: float) -> None:
    h = Harness()
    for _ in range(3):
        h.add_broker()
    for kind, who, service, arg in steps:
        members = h.state.membership.members
        broker = members[who % len(members)]
        if kind == "lead":
            h.apply(broker, Candidate(service, broker if arg == 0 else f"{broker}/s{arg}"))
        elif kind == "resign":
            h.apply(broker, Resign(service, broker if arg == 0 else f"{broker}/s{arg}"))
        elif kind == "resign-leader":
            s = h.state.services.get(service)
            if s is not None and s.leader is not None:
                h.apply(host_of(s.leader), Resign(service, s.leader))
        elif kind == "handover":
            targets = ["", "n1", "n2/r", "n3/r/s1"]
            h.apply(broker, Handover(service, targets[arg]))
        elif kind == "kill":
            if arg == 1 and len(members) > 2:  # two brokers die together: one view change
                h.kill(broker, members[(who + 1) % len(members)])
            elif len(members) > 1:
                h.kill(broker)
        else:
            h.add_broker()
        check_invariants(h)

    # A replica applies the same records, restored from a snapshot taken at ``cut``.
    n = len(h.records)
    k = int(cut * n)
    first = State(suspect_beats=3)
    out: list[Effect] = []
    for offset, record in enumerate(h.records[:k]):
        origin, event = codec.decode(record)
        first.apply(offset, origin, event, out)
    replica = State(suspect_beats=3)
    meta = msgpack.unpackb(msgpack.packb(first.meta_snapshot()), raw=False)
    replica.restore_meta(meta)
    replica.queues = {
        name: QueueState.restore(q.snapshot()) for name, q in first.queues.items()
    }
    replica.applied = first.applied
    replica_effects: list[tuple[int, Any]] = []
    for offset in range(k, n):
        origin, event = codec.decode(h.records[offset])
        out = []
        replica.apply(offset, origin, event, out)
        replica_effects.extend((offset, e) for e in out if isinstance(e, LeaderChanged))
    assert replica.digest() == h.state.digest()
    assert replica.services.snapshot() == h.state.services.snapshot()
    # The replica announces the same terms after the cut.
    expected = [(o, e) for o, e in h.effects if o >= k and isinstance(e, LeaderChanged)]
    assert replica_effects == expected
