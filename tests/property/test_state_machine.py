"""The queue state machine against a deliberately simple model queue (hypothesis).

The model keeps every live message as a dict entry with its state; the real
State keeps compact indexes. After every step both must agree on what is ready,
who holds what, the delivery counts, what was dead-lettered, and on the order in
which messages are offered. Every step also goes through the msgpack codec, and
a replica fed the same records (restored from snapshots midway) must end with the
same digest.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from batonmq.cluster.errors import Fenced, NotOwner, QueueFull
from batonmq.cluster import codec
from batonmq.cluster.events import (
    Accept,
    Acquire,
    Checkpoint,
    DeclareQueue,
    Enqueue,
    Event,
    Expire,
    Handoff,
    Heartbeat,
    Interest,
    Origin,
    Propose,
    PurgeQueue,
    Reject,
    Release,
    ReleaseAll,
    Vote,
)
from batonmq.cluster.state import (
    Acquired,
    CheckpointApplied,
    Completed,
    Effect,
    QueueState,
    State,
)

CONSUMERS = ("n1/r1/1", "n1/r1/2", "n2/r9/1")
MEMBERS = ("n1/r1", "n2/r9")


def runtime_of(consumer: str) -> str:
    return consumer.rsplit("/", 1)[0]
LIMIT = 2


class QueueModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = State()
        self.records: list[bytes] = []
        self.seqs: dict[str, int] = {}
        self.seq = 0
        # model: position -> [state, consumer, count]
        self.msgs: dict[int, list[Any]] = {}
        self.next_pos = 0
        self.dlq_len = 0
        self.max_length: int | None = None
        self.dropped = 0
        self.keyed: dict[str, tuple[int, int]] = {}  # idempotency key -> (first, count)
        # Two member runtimes: both beat, n1/r1 proposes, both vote (DESIGN §7).
        for m in MEMBERS:
            self._apply(Heartbeat("voter", "", {}), m)
        self._apply(Propose(1, MEMBERS, "cluster"), "n1/r1")
        for m in MEMBERS:
            self._apply(Vote(1, True), m)
        assert self.state.membership.members == list(MEMBERS)
        self._apply(DeclareQueue("dlq"))
        self.owner = "n1/r1"

    # -- plumbing --------------------------------------------------------------------

    def _apply(self, ev: Event, who: str = "n1/r1") -> list[Effect]:
        self.seq += 1  # a global clock for the envelope times
        self.seqs[who] = seq = self.seqs.get(who, 0) + 1
        node, runtime = who.split("/")
        record = codec.encode(Origin(node, runtime, seq, 1000 + self.seq), ev)
        self.records.append(record)
        origin, decoded = codec.decode(record)
        assert decoded == ev
        out: list[Effect] = []
        self.state.apply(len(self.records) - 1, origin, decoded, out)
        return out

    @staticmethod
    def _completed(out: list[Effect]) -> Completed:
        done = [e for e in out if isinstance(e, Completed)]
        assert len(done) == 1
        return done[0]

    def _ready(self) -> list[int]:
        return sorted(p for p, m in self.msgs.items() if m[0] == "ready")

    def _held(self, consumer: str) -> list[int]:
        return sorted(p for p, m in self.msgs.items() if m[0] == "acquired" and m[1] == consumer)

    def _dead_letter(self, p: int) -> None:
        del self.msgs[p]
        self.dlq_len += 1

    # -- rules -----------------------------------------------------------------------

    @precondition(lambda self: "q" not in self.state.queues)
    @rule(max_length=st.one_of(st.none(), st.integers(1, 8)), drop_head=st.booleans())
    def declare(self, max_length: int | None, drop_head: bool) -> None:
        overflow = "drop-head" if drop_head else "reject-publish"
        done = self._completed(
            self._apply(
                DeclareQueue(
                    "q",
                    max_length=max_length,
                    overflow=overflow,
                    delivery_limit=LIMIT,
                    dead_letter="dlq",
                )
            )
        )
        assert done.result == {"created": True}
        self.max_length, self.overflow = max_length, overflow
        for m in MEMBERS:  # both have consumers; the first interest makes the owner
            self._apply(Interest("q", True), m)
        assert self.state.queues["q"].owner == "n1/r1"

    @precondition(lambda self: "q" in self.state.queues)
    @rule()
    def handoff(self) -> None:
        """Time slice: the owner passes the queue to the other interested member."""
        self._apply(Handoff("q"), self.owner)
        self.owner = MEMBERS[1] if self.owner == MEMBERS[0] else MEMBERS[0]
        assert self.state.queues["q"].owner == self.owner

    @rule(data=st.data())
    def outsider(self, data: st.DataObject) -> None:
        """Events from a runtime outside the view are fenced, changing nothing."""
        before = {name: q.snapshot() for name, q in self.state.queues.items()}
        ev = data.draw(st.sampled_from([PurgeQueue("q"), Enqueue("q", ((b"x", {}),)),
                                        Acquire("q", "n3/r3/1", 5)]))
        done = self._completed(self._apply(ev, "n3/r3"))
        assert isinstance(done.error, Fenced)
        assert {name: q.snapshot() for name, q in self.state.queues.items()} == before

    @precondition(lambda self: "q" in self.state.queues)
    @rule(n=st.integers(1, 4))
    def enqueue(self, n: int) -> None:
        out = self._apply(Enqueue("q", tuple((b"m%d" % i, {}) for i in range(n))))
        if self._enqueue_model(self._completed(out), n):
            assert self._completed(out).result == {"first_position": self.next_pos - n, "count": n}

    def _enqueue_model(self, done: Completed, n: int) -> bool:
        """Model a new publish of ``n`` messages; False if it was refused (QueueFull)."""
        length = len(self.msgs)
        if self.max_length is not None and length + n > self.max_length:
            excess = length + n - self.max_length
            ready = self._ready()
            if self.overflow == "reject-publish" or n > self.max_length or excess > len(ready):
                assert isinstance(done.error, QueueFull)
                return False
            for p in ready[:excess]:
                self._dead_letter(p)
        assert done.error is None, done.error
        for _ in range(n):
            self.msgs[self.next_pos] = ["ready", None, 0]
            self.next_pos += 1
        return True

    @precondition(lambda self: "q" in self.state.queues)
    @rule(n=st.integers(1, 3), data=st.data())
    def enqueue_keyed(self, n: int, data: st.DataObject) -> None:
        """A publish with an idempotency key, or a re-send of an earlier one: a
        re-send changes nothing and is answered with the original positions."""
        if self.keyed and data.draw(st.booleans(), label="resend"):
            key = data.draw(st.sampled_from(sorted(self.keyed)), label="key")
            first, count = self.keyed[key]
            before = {name: q.snapshot() for name, q in self.state.queues.items()}
            done = self._completed(
                self._apply(Enqueue("q", tuple((b"r", {}) for _ in range(count)), ((key, count),)))
            )
            assert done.error is None, done.error
            assert done.result == {"first_position": first, "count": count, "positions": [first]}
            assert {name: q.snapshot() for name, q in self.state.queues.items()} == before
            return
        key = f"k{len(self.keyed)}"
        first = self.next_pos
        done = self._completed(
            self._apply(Enqueue("q", tuple((b"k%d" % i, {}) for i in range(n)), ((key, n),)))
        )
        if self._enqueue_model(done, n):
            assert done.result == {"first_position": first, "count": n, "positions": [first]}
            self.keyed[key] = (first, n)

    @precondition(lambda self: "q" in self.state.queues)
    @rule(consumer=st.sampled_from(CONSUMERS), count=st.integers(0, 5))
    def acquire(self, consumer: str, count: int) -> None:
        who = runtime_of(consumer)
        out = self._apply(Acquire("q", consumer, count), who)
        got = [e for e in out if isinstance(e, Acquired)]
        if who != self.owner:  # only the owner acquires (guarantee 2)
            assert not got and isinstance(self._completed(out).error, NotOwner)
            return
        expect = self._ready()[:count]  # lowest positions first (guarantee 7)
        if not expect:
            assert not got
            return
        assert got[0].positions == expect
        assert got[0].counts == [self.msgs[p][2] for p in expect]
        for p in expect:
            self.msgs[p][0:2] = ["acquired", consumer]

    def _settle_args(self, data: st.DataObject) -> tuple[str, list[int]]:
        consumer = data.draw(st.sampled_from(CONSUMERS))
        held = self._held(consumer)
        chosen = data.draw(st.lists(st.sampled_from(held), unique=True)) if held else []
        bogus = data.draw(st.lists(st.integers(0, self.next_pos + 2), max_size=2, unique=True))
        return consumer, chosen + [b for b in bogus if b not in chosen]

    @precondition(lambda self: "q" in self.state.queues)
    @rule(data=st.data())
    def accept(self, data: st.DataObject) -> None:
        consumer, positions = self._settle_args(data)
        held = set(self._held(consumer))
        done = self._completed(
            self._apply(Accept("q", consumer, tuple(positions)), runtime_of(consumer))
        )
        ok = [p for p in positions if p in held]
        assert done.result == {"count": len(ok), "not_acquired": [p for p in positions if p not in held]}
        for p in ok:
            del self.msgs[p]

    def _release_model(self, ok: list[int]) -> None:
        for p in ok:
            m = self.msgs[p]
            m[2] += 1
            if m[2] >= LIMIT:
                self._dead_letter(p)
            else:
                m[0:2] = ["ready", None]

    @precondition(lambda self: "q" in self.state.queues)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        consumer, positions = self._settle_args(data)
        held = set(self._held(consumer))
        done = self._completed(
            self._apply(Release("q", consumer, tuple(positions)), runtime_of(consumer))
        )
        ok = [p for p in positions if p in held]
        assert done.result is not None and done.result["count"] == len(ok)
        self._release_model(ok)

    @precondition(lambda self: "q" in self.state.queues)
    @rule(data=st.data())
    def reject(self, data: st.DataObject) -> None:
        consumer, positions = self._settle_args(data)
        held = set(self._held(consumer))
        self._apply(Reject("q", consumer, tuple(positions)), runtime_of(consumer))
        for p in positions:
            if p in held:
                self._dead_letter(p)

    @precondition(lambda self: "q" in self.state.queues)
    @rule(data=st.data())
    def release_all(self, data: st.DataObject) -> None:
        """Cancel/disconnect: all back; those never handed out keep their count."""
        consumer = data.draw(st.sampled_from(CONSUMERS))
        held = self._held(consumer)
        unread = data.draw(st.lists(st.sampled_from(held), unique=True)) if held else []
        done = self._completed(
            self._apply(ReleaseAll("q", consumer, tuple(unread)), runtime_of(consumer))
        )
        assert done.result is not None and done.result["count"] == len(held)
        for p in unread:
            self.msgs[p][0:2] = ["ready", None]
        self._release_model([p for p in held if p not in unread])

    @precondition(lambda self: "q" in self.state.queues)
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        through = data.draw(st.integers(-1, self.next_pos))
        self._apply(Expire("q", through))
        for p in [p for p in self._ready() if p <= through]:
            self._dead_letter(p)

    @precondition(lambda self: "q" in self.state.queues)
    @rule()
    def purge(self) -> None:
        done = self._completed(self._apply(PurgeQueue("q")))
        ready = self._ready()
        assert done.result == {"purged": len(ready)}
        for p in ready:
            del self.msgs[p]

    @rule(back=st.integers(0, 5))
    def duplicate(self, back: int) -> None:
        """A retried append of an already applied event (same origin seq) is ignored."""
        before = {name: q.snapshot() for name, q in self.state.queues.items()}
        dups = self.state.ignored.get("duplicate", 0)
        seq = max(0, self.seqs["n1/r1"] - back)
        record = codec.encode(Origin("n1", "r1", seq, 1), PurgeQueue("q"))
        self.records.append(record)
        origin, ev = codec.decode(record)
        out: list[Effect] = []
        self.state.apply(len(self.records) - 1, origin, ev, out)
        assert out == []
        assert self.state.ignored["duplicate"] == dups + 1
        assert {name: q.snapshot() for name, q in self.state.queues.items()} == before

    @rule()
    def checkpoint(self) -> None:
        """The leader checkpoints, carrying its digest at the previous checkpoint: this
        replica's own there must be the same (DESIGN §8)."""
        prev = self.state.checkpoints[-1] if self.state.checkpoints else (-1, "")
        out = self._apply(Checkpoint(prev[0], prev[1]))
        done = [e for e in out if isinstance(e, CheckpointApplied)]
        assert len(done) == 1 and done[0].offset == len(self.records) - 1
        assert done[0].mine == (prev[1] if prev[0] >= 0 else None)
        # Another member's checkpoint is ignored, deterministically.
        assert self._completed(self._apply(Checkpoint(), "n2/r9")).error is not None

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        q = self.state.queues.get("q")
        if q is None:
            assert not self.msgs
            return
        assert q.ready == len(self._ready())
        assert dict(q.acquired) == {
            p: m[1] for p, m in self.msgs.items() if m[0] == "acquired"
        }
        live_counts = {p: m[2] for p, m in self.msgs.items() if m[2]}
        assert {p: c for p, c in q.counts.items() if c} == live_counts
        assert q.next_pos == self.next_pos
        assert q.length <= (self.max_length or q.length)
        assert self.state.queues["dlq"].ready == self.dlq_len

    @invariant()
    def snapshot_round_trips(self) -> None:
        for q in self.state.queues.values():
            assert QueueState.restore(q.snapshot()).snapshot() == q.snapshot()

    def teardown(self) -> None:
        # A replica applying the same records, restored from snapshots halfway,
        # ends with the same digest (DESIGN §2: two replicas, one log).
        replica = State()
        half = len(self.records) // 2
        for i, record in enumerate(self.records[:half]):
            origin, ev = codec.decode(record)
            replica.apply(i, origin, ev, [])
        restored = State()
        restored.restore_meta(replica.meta_snapshot())
        restored.restore_keys(replica.key_entries())
        for name, q in replica.queues.items():
            restored.queues[name] = QueueState.restore(q.snapshot())
        for i, record in enumerate(self.records[half:], start=half):
            origin, ev = codec.decode(record)
            restored.apply(i, origin, ev, [])
        assert restored.digest() == self.state.digest()
        # A joiner installs a member's full snapshot taken at some offset and applies
        # the rest of the log from there: the same digest again (DESIGN §8).
        joiner = State()
        joiner.install(replica.full_snapshot())
        assert joiner.digest() == replica.digest()
        assert joiner.take_dirty()[1].keys() == replica.queues.keys()
        checks: list[Effect] = []
        for i, record in enumerate(self.records[half:], start=half):
            origin, ev = codec.decode(record)
            joiner.apply(i, origin, ev, checks)
        assert joiner.digest() == self.state.digest()
        # Its checkpoint digests agree with the leader's wherever it has its own.
        for e in checks:
            if isinstance(e, CheckpointApplied) and e.mine is not None and e.expected:
                assert e.mine == e.expected


QueueModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestQueueModel = QueueModel.TestCase
