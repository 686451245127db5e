"""The queue state machine against a deliberately simple model queue (hypothesis).

The model keeps every live message as a dict entry with its state; the real
State keeps compact indexes. After every step both must agree on what is ready,
who holds what, the delivery counts, what was dead-lettered, and on the order in
which messages are offered. Every step also goes through the msgpack codec, and
a replica fed the same records (restored from snapshots midway) must end with the
same digest.

The model moves its messages only as :data:`batonmq.cluster.state.TRANSITIONS`
says: each operation looks its (state, operation) pair up in the table and takes
the state it names, and the terminal states decide what becomes of the message
(accepted and dropped ones are gone, dead-lettered ones go to the dead-letter
queue). So the table is checked against the code: a wrong entry makes the model
disagree with the real State, a missing one fails the model's lookup. Because a
random walk may miss a rare move, each move of the table is also made once on its
own, on one message of a real State (the tests at the end).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from batonmq.cluster.errors import Fenced, NotOwner, PreconditionFailed, QueueFull
from batonmq.cluster import codec
from batonmq.cluster.events import (
    Accept,
    ClearPolicy,
    SetPolicy,
    AcceptThrough,
    Acquire,
    Checkpoint,
    DeclareQueue,
    EnableFeatures,
    Enqueue,
    Event,
    Expire,
    ExpireQueue,
    Handoff,
    Heartbeat,
    Interest,
    Origin,
    Propose,
    PurgeQueue,
    Reject,
    Release,
    ReleaseAll,
    Reserve,
    Vote,
)
from batonmq.cluster.features import ANNOUNCE, FEATURES
from batonmq.cluster.results import (
    AcceptedThrough,
    Declared,
    Deleted,
    Enqueued,
    Purged,
    Settled,
)
from batonmq.cluster.effects import Acquired, CheckpointApplied, Completed, Effect, Moved
from batonmq.cluster.queues import MessageState, QueueState, TRANSITIONS
from batonmq.cluster.queue_state import IMMEDIATE_MS
from batonmq.cluster.features import ANNOUNCE, FEATURES
from batonmq.cluster.state import State
from tests.unit.test_digest_cache import hashed_afresh

CONSUMERS = ("n1/r1/1", "n1/r1/2", "n2/r9/1")
MEMBERS = ("n1/r1", "n2/r9")


def runtime_of(consumer: str) -> str:
    return consumer.rsplit("/", 1)[0]


LIMIT = 2
#: The operations the model moves messages by; every one is looked up in TRANSITIONS.
MODELLED_OPS = frozenset(
    {"enqueue", "enqueue-delayed", "wake", "acquire", "accept", "release", "release*", "return",
     "delay", "reject", "expire", "drop-head", "purge", "accept-through"}
)
READY, ACQUIRED, DELAYED = MessageState.READY, MessageState.ACQUIRED, MessageState.DELAYED
#: Delays (ms) the rules draw: 0 (none) or a few envelope ticks (one per applied event).
DELAYS = st.sampled_from([0, 0, 2, 5, 30])


def test_every_operation_of_the_table_is_modelled() -> None:
    """A transition added to the table must be added to the model too (and the other
    way round), or the model would not check it."""
    assert {op for _, op in TRANSITIONS} == MODELLED_OPS


class QueueModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = State()
        self.records: list[bytes] = []
        self.seqs: dict[str, int] = {}
        self.seq = 0
        # model: position -> [MessageState (READY, DELAYED or ACQUIRED), consumer,
        # delivery count (failed deliveries), acquired count (hand-outs that ended),
        # due time of a DELAYED one]
        self.msgs: dict[int, list[Any]] = {}
        self.acquisitions = 0  # every hand-out
        self.failures = 0  # every failed delivery (failed release, reject, lost consumer)
        self.given_back = 0  # every "return" (no failure)
        self.timed_out = 0  # failed deliveries that were an ack timeout
        self.next_pos = 0
        self.dlq_len = 0
        # The declared max-length, and a policy's (flag policies, cluster/policies.py):
        # the state machine enforces the lower of the two (max_length below); ``grace``
        # is the most the queue held when a policy lowered it (nothing is removed then).
        self.declared_max: int | None = None
        self.policy_cap: int | None = None
        self.grace = 0
        self.accepted = 0  # messages of q that ended ACCEPTED
        self.dropped = 0  # ... and DROPPED
        self.keyed: dict[str, tuple[int, int]] = {}  # idempotency key -> (first, count)
        self.retry: tuple[str, int, int | None] | None = None  # the queue's retry policy
        self.max_priority = 0  # a priority queue's highest priority (0: not one)
        self.sac = False  # a single-active-consumer queue: its owner keeps it
        self.expires: int | None = None  # queue expiry (flag queue_expiry), ms
        self.used_at = 0  # the replicated clock when q was last used (declare, acquire, interest)
        # Two member runtimes: both beat, n1/r1 proposes, both vote (docs/design.md §7).
        for m in MEMBERS:  # (their builds announce their flags: some are enabled below)
            self._apply(Heartbeat("voter", "", {ANNOUNCE: sorted(FEATURES)}), m)
        self._apply(Propose(1, MEMBERS, "cluster"), "n1/r1")
        for m in MEMBERS:
            self._apply(Vote(1, True), m)
        assert self.state.membership.members == list(MEMBERS)
        self._apply(EnableFeatures(("queue_expiry",)))
        assert "queue_expiry" in self.state.features.enabled
        self._apply(DeclareQueue("dlq"))
        self.owner = "n1/r1"
        self._apply(EnableFeatures(("policies",)))
        assert "policies" in self.state.features.enabled
        self._apply(EnableFeatures(("message_ttl",)))
        assert "message_ttl" in self.state.features.enabled

    @property
    def max_length(self) -> int | None:
        """The queue's effective max-length (docs/operations.md "Policies": the lower)."""
        d, p = self.declared_max, self.policy_cap
        return d if p is None else p if d is None else min(d, p)

    # -- plumbing --------------------------------------------------------------------

    def _apply(self, ev: Event, who: str = "n1/r1") -> list[Effect]:
        self.seq += 1  # a global clock for the envelope times
        q = self.state.queues.get("q")
        if q is not None and self.expires is not None and who in MEMBERS and (
            isinstance(ev, Interest)
            or isinstance(ev, Acquire) and q.owner == who and ev.consumer.startswith(who + "/")
        ):
            self.used_at = 1000 + self.seq  # (a use: the queue's expiry counts from here)
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
        """Ready positions in the order they are offered: by position, and on a
        priority queue highest priority first."""
        ready = [p for p, m in self.msgs.items() if m[0] is READY]
        if self.max_priority:
            return sorted(ready, key=lambda p: (-self.msgs[p][5], p))
        return sorted(ready)

    def _held(self, consumer: str) -> list[int]:
        return sorted(p for p, m in self.msgs.items() if m[0] is ACQUIRED and m[1] == consumer)

    def _delayed(self) -> dict[int, int]:
        return {p: m[4] for p, m in self.msgs.items() if m[0] is DELAYED}

    def _wake(self, clock: int) -> None:
        """The replicated clock is at ``clock`` when an acquire applies: delayed messages
        whose time has come are ready again."""
        for p, due in self._delayed().items():
            if due <= clock:
                self._move(p, "wake")

    def _clock_next(self) -> int:
        """The envelope time (hence the clock) of the next applied event."""
        return 1000 + self.seq + 1

    def _move(self, p: int, op: str, consumer: str | None = None, due: int = 0) -> None:
        """Move message ``p`` (a new one if not in the model yet) by ``op``, as
        TRANSITIONS says; a terminal state ends it: an accepted or dropped message is
        gone (counted), a dead-lettered one is in the dead-letter queue now."""
        assert op in MODELLED_OPS
        src = self.msgs[p][0] if p in self.msgs else None
        assert (src, op) in TRANSITIONS, f"the table has no {op!r} from {src}"
        dst = TRANSITIONS[(src, op)]
        if dst is READY or dst is ACQUIRED or dst is DELAYED:
            m = self.msgs.setdefault(p, [dst, None, 0, 0, 0, 0, None])
            m[0:2] = [dst, consumer if dst is ACQUIRED else None]
            m[4] = due if dst is DELAYED else 0
            return
        del self.msgs[p]
        if dst is MessageState.DEAD_LETTERED:  # the queue has a dead-letter queue
            self.dlq_len += 1
        elif dst is MessageState.ACCEPTED:
            self.accepted += 1
        else:
            assert dst is MessageState.DROPPED, dst
            self.dropped += 1

    # -- rules -----------------------------------------------------------------------

    @precondition(lambda self: "q" not in self.state.queues)
    @rule(
        max_length=st.one_of(st.none(), st.integers(1, 8)),
        drop_head=st.booleans(),
        retry=st.sampled_from([None, ("fixed", 3, None), ("linear", 2, None),
                               ("exponential", 2, 3)]),
        max_priority=st.sampled_from([0, 0, 3]),
        sac=st.booleans(),
        expires=st.sampled_from([None, None, 3, 20]),
    )
    def declare(
        self,
        max_length: int | None,
        drop_head: bool,
        retry: tuple[str, int, int | None] | None,
        max_priority: int,
        sac: bool,
        expires: int | None,
    ) -> None:
        overflow = "drop-head" if drop_head else "reject-publish"
        kind, delay, cap = retry or ("", 0, None)
        self._forget_queue()
        self.expires, self.used_at = expires, self._clock_next()
        done = self._completed(
            self._apply(
                DeclareQueue(
                    "q",
                    max_length=max_length,
                    overflow=overflow,
                    delivery_limit=LIMIT,
                    dead_letter="dlq",
                    retry=kind,
                    retry_delay_ms=delay,
                    retry_max_ms=cap,
                    max_priority=max_priority,
                    single_active_consumer=sac,
                    expires_ms=expires,
                )
            )
        )
        assert done.result == Declared(created=True)
        self.declared_max, self.overflow, self.retry = max_length, overflow, retry
        self.grace = 0
        self.max_priority, self.sac = max_priority, sac
        for m in MEMBERS:  # both have consumers; the first interest makes the owner
            self._apply(Interest("q", True), m)
        assert self.state.queues["q"].owner == "n1/r1"

    def _forget_queue(self) -> None:
        """The model of a queue declared anew (the last one expired): nothing in it."""
        assert not self.msgs
        self.next_pos = self.accepted = self.dropped = 0
        self.acquisitions = self.failures = self.given_back = self.timed_out = 0
        self.keyed = {}
        self.owner = "n1/r1"

    @precondition(lambda self: "q" in self.state.queues)
    @rule(early=st.booleans())
    def expire_queue(self, early: bool) -> None:
        """Queue expiry (docs/events.md): while a broker is interested, or before its
        expires_ms of the replicated clock since the last use, an ExpireQueue (late or
        repeated) changes nothing; once both brokers' consumers left and the clock passed
        it, the queue goes with all it holds. Here the brokers' consumers then come back
        to a queue declared anew, or both stay on the queue that does not expire."""
        before = self.state.queues["q"].snapshot()
        done = self._completed(self._apply(ExpireQueue("q"), self.owner))
        assert isinstance(done.error, PreconditionFailed)  # (both brokers are interested)
        assert self.state.queues["q"].snapshot() == before
        if self.expires is None or early:
            return
        for m in MEMBERS:  # every consumer leaves; held messages stay held
            self._apply(Interest("q", False), m)
        while self._clock_next() < self.used_at + self.expires:
            done = self._completed(self._apply(ExpireQueue("q")))
            assert isinstance(done.error, PreconditionFailed), "expired early"
        done = self._completed(self._apply(ExpireQueue("q")))
        assert done.error is None and isinstance(done.result, Deleted)
        assert done.result.deleted == len(self.msgs)
        assert "q" not in self.state.queues
        self.msgs = {}  # (gone with the queue: neither dead-lettered nor accepted)

    @rule(cap=st.one_of(st.none(), st.integers(1, 8)))
    def policy(self, cap: int | None) -> None:
        """An operator sets a max-length policy on q, or clears it; it applies at once,
        whether q exists yet or not, and removes nothing."""
        if cap is None:
            ev: Event = ClearPolicy("cap")
        else:
            ev = SetPolicy("cap", "^q$", "queues", (("max-length", cap),), 0)
        done = self._completed(self._apply(ev))
        assert done.error is None or (cap is None and self.policy_cap is None), done.error
        self.policy_cap = cap
        q = self.state.queues.get("q")
        if q is not None:
            self.grace = max(self.grace, q.length)
            assert q.max_length == self.max_length
            assert q.policy == (None if cap is None else "cap")

    @precondition(lambda self: "q" in self.state.queues)
    @rule()
    def handoff(self) -> None:
        """Time slice: the owner passes the queue to the other interested member (not
        a single-active-consumer queue: its owner keeps it)."""
        self._apply(Handoff("q"), self.owner)
        if not self.sac:
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
    @rule(n=st.integers(1, 4), delay=DELAYS, priority=st.integers(0, 5),
          ttls=st.sampled_from([(), (), (None, 5), (0, 2), (3, 30)]))
    def enqueue(self, n: int, delay: int, priority: int, ttls: tuple[int | None, ...]) -> None:
        """A publish, held from consumers for ``delay`` ms of the replicated clock, with a
        priority (capped on a priority queue, ignored elsewhere) and the messages' own
        TTLs (flag message_ttl; cycled over the messages)."""
        clock = self._clock_next()
        due = clock + delay
        own = tuple(ttls[i % len(ttls)] for i in range(n)) if ttls else ()
        ev = Enqueue("q", tuple((b"m%d" % i, {}) for i in range(n)), (), delay, 0, priority, own)
        out = self._apply(ev)
        if self._enqueue_model(self._completed(out), n, due if delay else 0, priority):
            assert self._completed(out).result == Enqueued(self.next_pos - n, n)
            for i, t in enumerate(own):
                if t is not None:  # expired once the clock is past this
                    self.msgs[self.next_pos - n + i][6] = clock + (t or IMMEDIATE_MS)

    def _outlived(self, p: int, clock: int) -> bool:
        exp = self.msgs[p][6]
        return exp is not None and clock > exp

    def _take(self, count: int, clock: int) -> list[int]:
        """What an acquire of ``count`` applied at ``clock`` hands out: the lowest
        positions first (guarantee 7), where one past its own TTL is expired as it
        reaches the head instead of being handed out."""
        expect: list[int] = []
        for p in self._ready() if count > 0 else []:
            if len(expect) == count:
                break
            if self._outlived(p, clock):
                self._move(p, "expire")
            else:
                expect.append(p)
        return expect

    def _enqueue_model(self, done: Completed, n: int, due: int = 0, priority: int = 0) -> bool:
        """Model a new publish of ``n`` messages; False if it was refused (QueueFull)."""
        length = len(self.msgs)
        if self.max_length is not None and length + n > self.max_length:
            excess = length + n - self.max_length
            ready = self._ready()
            if self.overflow == "reject-publish" or n > self.max_length or excess > len(ready):
                assert isinstance(done.error, QueueFull)
                return False
            for p in ready[:excess]:
                self._move(p, "drop-head")
        assert done.error is None, done.error
        for _ in range(n):
            if due:
                self._move(self.next_pos, "enqueue-delayed", due=due)
            else:
                self._move(self.next_pos, "enqueue")
            self.msgs[self.next_pos][5] = min(priority, self.max_priority)
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
            assert done.result == Enqueued(first, count, [first])
            assert {name: q.snapshot() for name, q in self.state.queues.items()} == before
            return
        key = f"k{len(self.keyed)}"
        first = self.next_pos
        done = self._completed(
            self._apply(Enqueue("q", tuple((b"k%d" % i, {}) for i in range(n)), ((key, n),)))
        )
        if self._enqueue_model(done, n):
            assert done.result == Enqueued(first, n, [first])
            self.keyed[key] = (first, n)

    @precondition(lambda self: "q" in self.state.queues)
    @rule(consumer=st.sampled_from(CONSUMERS), count=st.integers(0, 5))
    def acquire(self, consumer: str, count: int) -> None:
        who = runtime_of(consumer)
        if who == self.owner and count > 0:
            self._wake(self._clock_next())
        out = self._apply(Acquire("q", consumer, count), who)
        got = [e for e in out if isinstance(e, Acquired)]
        if who != self.owner:  # only the owner acquires (guarantee 2)
            assert not got and isinstance(self._completed(out).error, NotOwner)
            return
        expect = self._take(count, self._clock_next() - 1)  # (the acquire's clock)
        if not expect:
            assert not got
            return
        assert got[0].positions == expect
        assert got[0].counts == [self.msgs[p][2] for p in expect]
        assert got[0].acquired == [self.msgs[p][3] for p in expect]
        self.acquisitions += len(expect)
        for p in expect:
            self._move(p, "acquire", consumer)

    def _settle_args(self, data: st.DataObject) -> tuple[str, list[int]]:
        # Mostly a consumer that holds messages, so that settling them is exercised.
        holders = sorted({m[1] for m in self.msgs.values() if m[0] is ACQUIRED})
        consumer = data.draw(st.sampled_from(holders * 3 + list(CONSUMERS)))
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
        assert done.result == Settled(len(ok), [p for p in positions if p not in held])
        for p in ok:
            self._move(p, "accept")

    def _retry_due(self, count: int, clock: int) -> int:
        """When a message that failed ``count`` times is ready again under the queue's
        retry policy (0: at once)."""
        if self.retry is None:
            return 0
        kind, d, cap = self.retry
        d = {"fixed": d, "linear": d * count, "exponential": d * 2 ** (count - 1)}[kind]
        return clock + (d if cap is None else min(d, cap))

    def _release_model(
        self, ok: list[int], failed: bool = True, due: int = 0, clock: int = 0
    ) -> None:
        """Failed deliveries raise both counters (the delivery limit applies to the
        delivery count); a "return" raises the acquired count only. With a ``due``
        time they wait, delayed, until then; failed ones without one, as long as the
        queue's retry policy says (``clock``: the releasing event's)."""
        for p in ok:
            m = self.msgs[p]
            m[3] += 1
            if not failed:
                self.given_back += 1
                self._move(p, "delay" if due else "return", due=due)
                continue
            self.failures += 1
            m[2] += 1
            if m[2] >= LIMIT:
                self._move(p, "release*")
            else:
                wait = due or self._retry_due(m[2], clock)
                self._move(p, "delay" if wait else "release", due=wait)

    @precondition(lambda self: "q" in self.state.queues)
    @rule(data=st.data(), failed=st.booleans(), delay=DELAYS)
    def release(self, data: st.DataObject, failed: bool, delay: int) -> None:
        consumer, positions = self._settle_args(data)
        held = set(self._held(consumer))
        due = self._clock_next() + delay
        # A consumer's broker releases at the ack timeout as a failed delivery.
        timed_out = failed and data.draw(st.booleans(), label="ack timeout")
        done = self._completed(
            self._apply(
                Release("q", consumer, tuple(positions), failed, delay, timed_out),
                runtime_of(consumer),
            )
        )
        ok = [p for p in positions if p in held]
        if timed_out:
            self.timed_out += len(ok)
        assert isinstance(done.result, Settled) and done.result.count == len(ok)
        self._release_model(ok, failed, due if delay else 0, due - delay)

    @precondition(lambda self: "q" in self.state.queues)
    @rule(count=st.integers(1, 3))
    def bounce(self, count: int) -> None:
        """A consumer of the owner takes messages and gives them straight back (it fails
        on them): redelivered until the delivery limit dead-letters them."""
        consumer = next(c for c in CONSUMERS if runtime_of(c) == self.owner)
        self._wake(self._clock_next())
        got = [e for e in self._apply(Acquire("q", consumer, count), self.owner) if isinstance(e, Acquired)]
        expect = self._take(count, self._clock_next() - 1)
        assert [e.positions for e in got] == ([expect] if expect else [])
        self.acquisitions += len(expect)
        for p in expect:
            self._move(p, "acquire", consumer)
        clock = self._clock_next()
        done = self._completed(self._apply(Release("q", consumer, tuple(expect)), self.owner))
        assert isinstance(done.result, Settled) and done.result.count == len(expect)
        self._release_model(expect, clock=clock)

    @precondition(lambda self: "q" in self.state.queues)
    @rule(data=st.data())
    def reject(self, data: st.DataObject) -> None:
        consumer, positions = self._settle_args(data)
        held = set(self._held(consumer))
        self._apply(Reject("q", consumer, tuple(positions)), runtime_of(consumer))
        for p in positions:
            if p in held:
                self.failures += 1
                self._move(p, "reject")

    @precondition(lambda self: "q" in self.state.queues)
    @rule(data=st.data())
    def release_all(self, data: st.DataObject) -> None:
        """Cancel/disconnect: all back; only those the application had (``failed``,
        or in records without it all but ``unread``) count a failed delivery."""
        consumer = data.draw(st.sampled_from(CONSUMERS))
        held = self._held(consumer)
        named = data.draw(st.lists(st.sampled_from(held), unique=True)) if held else []
        if data.draw(st.booleans(), label="names the failed ones"):
            # Also a bogus position it does not hold: ignored.
            ev = ReleaseAll("q", consumer, (), tuple(named) + (self.next_pos + 5,))
            failed = [p for p in held if p in named]
        else:
            ev = ReleaseAll("q", consumer, tuple(named))
            failed = [p for p in held if p not in named]
        clock = self._clock_next()
        done = self._completed(self._apply(ev, runtime_of(consumer)))
        assert isinstance(done.result, Settled) and done.result.count == len(held)
        self._release_model([p for p in held if p not in failed], failed=False)
        self._release_model(failed, clock=clock)

    @precondition(lambda self: "q" in self.state.queues)
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        through = data.draw(st.integers(-1, self.next_pos))
        clock = self._clock_next()
        out = self._apply(Expire("q", through))
        if self.state.queues["q"].reserved_by is not None:
            return
        for p in [p for p in self._ready() if p <= through]:
            self._move(p, "expire")
        for p in self._ready():  # then the head ones past their own TTL, up to one not
            if not self._outlived(p, clock):
                break
            self._move(p, "expire")
        assert self._completed(out).error is None

    @precondition(lambda self: "q" in self.state.queues)
    @rule()
    def purge(self) -> None:
        done = self._completed(self._apply(PurgeQueue("q")))
        ready = self._ready() + sorted(self._delayed())
        assert done.result == Purged(len(ready))
        for p in ready:
            self._move(p, "purge")

    @precondition(lambda self: "q" in self.state.queues)
    @rule(data=st.data())
    def read_range(self, data: st.DataObject) -> None:
        """A range reader reserves the queue, commits a position range and lets the
        queue go: every ready message below the commit is accepted (docs/design.md §11)."""
        through = data.draw(st.integers(0, self.next_pos + 1))
        self._apply(Reserve("q", "reader"))
        done = self._completed(self._apply(AcceptThrough("q", through, "reader")))
        self._apply(Reserve("q", None))
        gone = [p for p in self._ready() + sorted(self._delayed()) if p < through]
        assert isinstance(done.result, AcceptedThrough) and done.result.count == len(gone)
        for p in gone:
            self._move(p, "accept-through")

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
        replica's own there must be the same (docs/design.md §8)."""
        prev = self.state.checkpoints[-1] if self.state.checkpoints else (-1, "")
        out = self._apply(Checkpoint(prev[0], prev[1]))
        done = [e for e in out if isinstance(e, CheckpointApplied)]
        assert len(done) == 1 and done[0].offset == len(self.records) - 1
        assert done[0].mine == (prev[1] if prev[0] >= 0 else None)
        # Another member's checkpoint is ignored, deterministically.
        assert self._completed(self._apply(Checkpoint(), "n2/r9")).error is not None

    @rule()
    def persist(self) -> None:
        """The node driver takes what changed after each batch to store it."""
        self.state.take_dirty()

    @rule()
    def digest(self) -> None:
        """The digest (which packs again only the queues changed since the last one) is
        the whole state hashed afresh, byte for byte as ever."""
        assert self.state.digest() == hashed_afresh(self.state)

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        q = self.state.queues.get("q")
        if q is None:
            assert not self.msgs
            return
        assert q.ready == len(self._ready())
        assert q.delayed == self._delayed()
        assert dict(q.acquired) == {
            p: m[1] for p, m in self.msgs.items() if m[0] is ACQUIRED
        }
        live_counts = {p: m[2] for p, m in self.msgs.items() if m[2]}
        assert {p: c for p, c in q.counts.items() if c} == live_counts
        live_acquired = {p: m[3] for p, m in self.msgs.items() if m[3]}
        assert {p: c for p, c in q.acq_counts.items() if c} == live_acquired
        assert (q.acquisitions, q.failed_deliveries, q.given_back, q.timed_out) == (
            self.acquisitions, self.failures, self.given_back, self.timed_out
        )
        assert q.next_pos == self.next_pos
        assert q.length <= max(self.max_length or q.length, self.grace)
        assert self.state.queues["dlq"].ready == self.dlq_len
        assert q.accepted == self.accepted
        assert q.dropped + q.purged == self.dropped  # purged: dropped on request

    @invariant()
    def last_use_agrees(self) -> None:
        q = self.state.queues.get("q")
        if q is not None and self.expires is not None:
            assert (q.expires_ms, q.used_at) == (self.expires, self.used_at)

    @invariant()
    def snapshot_round_trips(self) -> None:
        for q in self.state.queues.values():
            assert QueueState.restore(q.snapshot()).snapshot() == q.snapshot()

    def teardown(self) -> None:
        # A replica applying the same records, restored from snapshots halfway,
        # ends with the same digest (docs/design.md §2: two replicas, one log).
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
        restored.apply_policies()  # as the node does once the queues are restored
        for i, record in enumerate(self.records[half:], start=half):
            origin, ev = codec.decode(record)
            restored.apply(i, origin, ev, [])
        assert restored.digest() == self.state.digest()
        # A joiner installs a member's full snapshot taken at some offset and applies
        # the rest of the log from there: the same digest again (docs/design.md §8).
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


# -- each move of the table, one message at a time ------------------------------------

#: The operations that bring a message to each state, from nothing.
PATHS: dict[MessageState | None, list[str]] = {
    None: [],
    READY: ["enqueue"],
    DELAYED: ["enqueue-delayed"],
    ACQUIRED: ["enqueue", "acquire"],
}
OPERATIONS: dict[str, list[Event]] = {
    "enqueue": [Enqueue("q", ((b"m", {}),))],
    # Held 3 ms of the replicated clock: each event below is 1 ms later.
    "enqueue-delayed": [Enqueue("q", ((b"m", {}),), (), 3)],
    # The clock passes its time (heartbeats move it on); the next acquire takes it,
    # and a "not now" shows it ready.
    "wake": [Heartbeat("voter", "", {})] * 3
    + [Acquire("q", "n1/r1/1", 1), Release("q", "n1/r1/1", (0,), False)],
    "delay": [Release("q", "n1/r1/1", (0,), True, 1000)],
    "acquire": [Acquire("q", "n1/r1/1", 1)],
    "accept": [Accept("q", "n1/r1/1", (0,))],
    "release": [Release("q", "n1/r1/1", (0,))],
    "release*": [Release("q", "n1/r1/1", (0,))],  # at the delivery limit (see PATHS)
    "return": [Release("q", "n1/r1/1", (0,), False)],
    "reject": [Reject("q", "n1/r1/1", (0,))],
    "expire": [Expire("q", 0)],
    "drop-head": [Enqueue("q", ((b"n", {}),))],  # max_length 1: the new one pushes it out
    "purge": [PurgeQueue("q")],
    "accept-through": [Reserve("q", "reader"), AcceptThrough("q", 1, "reader"), Reserve("q", None)],
}


class _OneMessage:
    """Position 0 of queue ``q`` (max_length 1, drop-head, delivery limit 2, dead-letter
    queue ``dlq``) on a real State, moved by the operations the table names."""

    def __init__(self) -> None:
        self.state = State()
        self.seq = 0
        self._apply(Heartbeat("voter", "", {}))
        self._apply(Propose(1, ("n1/r1",), "cluster"))
        self._apply(Vote(1, True))
        self._apply(DeclareQueue("dlq"))
        self._apply(
            DeclareQueue("q", max_length=1, overflow="drop-head", delivery_limit=LIMIT, dead_letter="dlq")
        )
        self._apply(Interest("q", True))

    def _apply(self, ev: Event) -> list[Effect]:
        self.seq += 1
        out: list[Effect] = []
        self.state.apply(self.seq, Origin("n1", "r1", self.seq, 1000 + self.seq), ev, out)
        done = [e for e in out if isinstance(e, Completed)]
        assert len(done) == 1 and done[0].error is None, done
        return out

    def do(self, op: str) -> MessageState:
        """Apply ``op`` to the message; where it is now, as the real State says."""
        q = self.state.queues["q"]
        accepted = q.accepted
        out = [e for ev in OPERATIONS[op] for e in self._apply(ev)]
        if 0 in q.acquired:
            return ACQUIRED
        if 0 in q.delayed:
            return DELAYED
        if q.holds(0):
            return READY
        if any(isinstance(e, Moved) and (e.src_qid, e.src_pos) == (q.qid, 0) for e in out):
            return MessageState.DEAD_LETTERED
        return MessageState.ACCEPTED if q.accepted > accepted else MessageState.DROPPED


@pytest.mark.parametrize("src,op", list(TRANSITIONS), ids=lambda v: str(getattr(v, "name", v)))
def test_each_move_of_the_table_is_what_the_state_does(src: MessageState | None, op: str) -> None:
    one = _OneMessage()
    path = ["enqueue", "acquire", "release", "acquire"] if op == "release*" else PATHS[src]
    reached = None
    for step in path:
        reached = one.do(step)
    assert reached is src
    assert one.do(op) is TRANSITIONS[(src, op)]
