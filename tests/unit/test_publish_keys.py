"""Publish idempotency keys in the pure state machine and the event codec: a publish
re-sent with a key the state already applied is enqueued once and confirmed with its
original positions; the key memory is bounded, in log order, and part of the digest."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from batonmq.cluster.errors import QueueFull
from batonmq.cluster import codec
from batonmq.cluster.codec import MalformedEvent
from batonmq.cluster.events import DeclareQueue, Enqueue, Event, Heartbeat, Origin, Propose, Vote
from batonmq.cluster.results import Enqueued
from batonmq.cluster.effects import Completed, Effect, Stored
from batonmq.cluster.keys import PublishKeys
from batonmq.cluster.queues import QueueState
from batonmq.cluster.state import State

__all__: list[str] = []

MEMBER = "n1/r1"


class Log:
    """Records applied through the codec to any number of replicas."""

    def __init__(self, *replicas: State) -> None:
        self.replicas = list(replicas)
        self.records: list[bytes] = []
        self.seq = 0
        self.apply(Heartbeat("voter", "", {}))
        self.apply(Propose(1, (MEMBER,), "c"))
        self.apply(Vote(1, True))
        self.apply(DeclareQueue("q"))

    def apply(self, ev: Event) -> tuple[Completed, list[Effect]]:
        self.seq += 1
        record = codec.encode(Origin("n1", "r1", self.seq, 1000 + self.seq), ev)
        self.records.append(record)
        origin, decoded = codec.decode(record)
        assert decoded == ev
        outs = []
        for state in self.replicas:
            out: list[Effect] = []
            state.apply(len(self.records) - 1, origin, decoded, out)
            outs.append(out)
        done = [e for e in outs[0] if isinstance(e, Completed)]
        assert len(done) == 1
        return done[0], outs[0]


def newest(
    remembered: list[tuple[int, str, int, int]],
) -> dict[tuple[int, str], tuple[int, int]]:
    """The plain model of the key memory: (qid, key) -> (first, expires) of the newest of
    the remembered (qid, key, first, expires), in log order."""
    return {(qid, key): (first, expires) for qid, key, first, expires in remembered}


def msgs(*bodies: bytes) -> tuple[tuple[bytes, dict[str, Any]], ...]:
    return tuple((b, {}) for b in bodies)


def test_same_key_twice_enqueues_once_with_the_original_position() -> None:
    a, b = State(), State()
    log = Log(a, b)
    first, out = log.apply(Enqueue("q", msgs(b"x"), (("k1", 1),)))
    assert first.result == Enqueued(0, 1, [0])
    assert any(isinstance(e, Stored) for e in out)
    log.apply(Enqueue("q", msgs(b"y"), (("k2", 1),)))
    again, out = log.apply(Enqueue("q", msgs(b"x"), (("k1", 1),)))
    assert again.error is None
    assert again.result == Enqueued(0, 1, [0])
    assert not any(isinstance(e, Stored) for e in out)  # nothing stored again
    q = a.queues["q"]
    assert (q.next_pos, q.enqueued, q.ready) == (2, 2, 2)
    assert a.ignored["duplicate-publish"] == 1
    assert a.digest() == b.digest()


def test_a_batch_resent_reports_its_original_range() -> None:
    a = State()
    log = Log(a)
    log.apply(Enqueue("q", msgs(b"0"), (("a", 1),)))
    done, _ = log.apply(Enqueue("q", msgs(b"1", b"2", b"3"), (("batch", 3),)))
    assert done.result == Enqueued(1, 3, [1])
    again, _ = log.apply(Enqueue("q", msgs(b"1", b"2", b"3"), (("batch", 3),)))
    assert again.result == Enqueued(1, 3, [1])
    assert a.queues["q"].next_pos == 4


def test_a_merged_enqueue_with_some_resent_publishes_enqueues_only_the_new() -> None:
    a = State()
    log = Log(a)
    log.apply(Enqueue("q", msgs(b"a", b"b"), (("ka", 1), ("kb", 1))))
    done, out = log.apply(
        Enqueue("q", msgs(b"c", b"a", b"d", b"b", b"e"),
                (("kc", 1), ("ka", 1), ("", 1), ("kb", 1), ("ke", 1)))
    )
    # New ones get consecutive new positions; re-sent ones their original.
    assert isinstance(done.result, Enqueued) and done.result.positions == [2, 0, 3, 1, 4]
    stored = [e for e in out if isinstance(e, Stored)]
    assert len(stored) == 1 and stored[0].first == 2
    assert [m[0] for m in stored[0].messages] == [b"c", b"d", b"e"]
    assert a.queues["q"].next_pos == 5
    # The same key twice in one event: the second copy is the re-send.
    done, _ = log.apply(Enqueue("q", msgs(b"f", b"f"), (("kf", 1), ("kf", 1))))
    assert isinstance(done.result, Enqueued) and done.result.positions == [5, 5]
    assert a.queues["q"].next_pos == 6


def test_keys_are_per_queue_and_an_unkeyed_publish_is_never_deduplicated() -> None:
    a = State()
    log = Log(a)
    log.apply(DeclareQueue("other"))
    log.apply(Enqueue("q", msgs(b"x"), (("k", 1),)))
    done, _ = log.apply(Enqueue("other", msgs(b"x"), (("k", 1),)))
    assert done.result == Enqueued(0, 1, [0])
    assert a.queues["other"].next_pos == 1
    log.apply(Enqueue("q", msgs(b"x")))
    log.apply(Enqueue("q", msgs(b"x")))
    assert a.queues["q"].next_pos == 3


def test_a_publish_that_failed_is_not_remembered() -> None:
    a = State()
    log = Log(a)
    log.apply(DeclareQueue("small", max_length=1))
    log.apply(Enqueue("small", msgs(b"1"), (("k1", 1),)))
    full, _ = log.apply(Enqueue("small", msgs(b"2"), (("k2", 1),)))
    assert isinstance(full.error, QueueFull)
    assert (a.queues["small"].qid, "k2") not in a.keys
    # Re-sent publish of a full queue: still the original answer, no QueueFull.
    again, _ = log.apply(Enqueue("small", msgs(b"1"), (("k1", 1),)))
    assert again.error is None and again.result == Enqueued(0, 1, [0])


def test_the_key_memory_is_bounded_oldest_first() -> None:
    a = State(key_memory=3)
    log = Log(a)
    for i in range(5):
        log.apply(Enqueue("q", msgs(b"%d" % i), ((f"k{i}", 1),)))
    qid = a.queues["q"].qid
    assert list(a.keys) == [(qid, "k2"), (qid, "k3"), (qid, "k4")]
    log.apply(Enqueue("q", msgs(b"0"), (("k0", 1),)))  # forgotten: enqueued again
    assert a.queues["q"].next_pos == 6
    log.apply(Enqueue("q", msgs(b"4"), (("k4", 1),)))  # remembered
    assert a.queues["q"].next_pos == 6


def test_key_memory_survives_snapshot_and_restore_with_equal_digests() -> None:
    a, b = State(key_memory=4), State(key_memory=4)
    log = Log(a, b)
    for i in range(6):
        log.apply(Enqueue("q", msgs(b"%d" % i), ((f"k{i}", 1),)))
    restored = State(key_memory=4)
    restored.restore_meta(msgpack.unpackb(msgpack.packb(b.meta_snapshot()), use_list=True))
    restored.restore_keys(b.key_entries())
    for name, q in b.queues.items():
        restored.queues[name] = QueueState.restore(q.snapshot())
    assert restored.digest() == a.digest()
    assert restored.keys == a.keys
    log.replicas.append(restored)
    for i in range(3, 9):  # k3..k5 are re-sends, k6..k8 new; k2.. get evicted in order
        log.apply(Enqueue("q", msgs(b"%d" % i), ((f"k{i}", 1),)))
    assert a.queues["q"].next_pos == 9
    assert restored.digest() == a.digest() == b.digest()


def test_take_keys_gives_new_keys_and_the_forgotten_prefix() -> None:
    """What the node stores per batch: only the keys added since, and which to drop."""
    a = State(key_memory=2)
    log = Log(a)
    log.apply(Enqueue("q", msgs(b"0"), (("k0", 1),)))
    new, low = a.take_keys()
    assert [e[:3] for e in new] == [(0, a.queues["q"].qid, "k0")] and low == 0
    log.apply(Enqueue("q", msgs(b"1", b"2"), (("k1", 1), ("k2", 1))))
    new, low = a.take_keys()
    assert [e[0] for e in new] == [1, 2] and low == 1  # k0 forgotten
    assert a.take_keys() == ([], 1)
    assert [e[2] for e in a.key_entries()] == ["k1", "k2"]


def test_codec_round_trips_keys_and_reads_records_without_them() -> None:
    origin = Origin("n", "r", 1, 2)
    ev = Enqueue("q", msgs(b"a", b"b", b"c"), (("k1", 2), ("", 1)))
    assert codec.decode(codec.encode(origin, ev)) == (origin, ev)
    old = msgpack.packb(["n", "r", 1, 2, Enqueue.OP, "q", [[b"a", {}]]], use_bin_type=True)
    assert codec.decode(old) == (origin, Enqueue("q", msgs(b"a")))


@pytest.mark.parametrize(
    "keys",
    [
        "k",  # not a list
        [["k", 1]],  # covers 1 of 2 messages
        [["k", 0], ["j", 2]],  # empty span
        [[1, 2]],  # key not a str
        [["k", True, 1]],
        [["k", 1.0], ["j", 1]],
    ],
)
def test_codec_rejects_malformed_key_spans(keys: Any) -> None:
    record = msgpack.packb(
        ["n", "r", 1, 2, Enqueue.OP, "q", [[b"a", {}], [b"b", {}]], keys], use_bin_type=True
    )
    with pytest.raises(MalformedEvent):
        codec.decode(record)


def test_the_digest_part_keeps_up_with_the_keys_and_survives_a_restore() -> None:
    """The key memory's share of the replica digest is kept as keys come and go (not
    packed from every key at each checkpoint): it must equal the sum made from scratch,
    through remembering, forgetting by the memory bound and by the window, and a restore."""
    import random

    from batonmq.cluster.keys import _MASK, _entry_hash

    def from_scratch(k: PublishKeys) -> list[int]:
        entries = k.entries()
        return [k.total, len(entries), sum(_entry_hash(*e) for e in entries) & _MASK]

    rng = random.Random(7)
    keys = PublishKeys(memory=50)
    seen = set()
    for i in range(3000):
        keys.remember(rng.randrange(3), f"k{rng.randrange(80)}", i,
                      rng.choice([-1, i + rng.randrange(100)]))
        if rng.random() < 0.1:
            keys.forget_expired(i)
        part = keys.digest_part()
        assert part == from_scratch(keys), i
        seen.add(part[2])
    assert len(seen) > 2900  # the sum moves with every change
    again = PublishKeys(memory=50)
    again.total = keys.total
    again.restore(keys.entries())
    assert again.digest_part() == keys.digest_part()
    again.remember(0, "new", 1, -1)
    keys.remember(0, "new", 1, -1)
    assert again.digest_part() == keys.digest_part() == from_scratch(keys)


def test_the_compact_memory_answers_as_a_plain_model_through_cuts_and_a_restore() -> None:
    """The key memory keeps its entries in arrays whose forgotten prefix is cut off now
    and then: every lookup must still answer as a plain dict of the newest entry of
    each key among the last ``memory`` ones (and the same after a restore)."""
    import random

    from batonmq.cluster.keys import _CUT

    memory = _CUT + 500  # small enough to cut the prefix many times below
    rng = random.Random(11)
    keys = PublishKeys(memory=memory)
    log: list[tuple[int, str, int, int]] = []  # every remember, in order

    def model() -> dict[tuple[int, str], tuple[int, int]]:
        return newest(log[-memory:])

    for i in range(6 * memory):
        entry = (rng.randrange(3), f"k{rng.randrange(2 * memory)}", i, rng.choice([-1, i + 50]))
        keys.remember(*entry)
        log.append(entry)
        if i % 1999 == 0:
            expected = model()
            assert keys.known == expected, i
            for qid in range(3):  # every key ever used: remembered or forgotten
                for n in range(2 * memory):
                    assert keys.lookup(qid, f"k{n}") == expected.get((qid, f"k{n}")), (i, n)
            assert len(keys) == min(i + 1, memory)
    again = PublishKeys(memory=memory)
    again.total = keys.total
    again.restore(keys.entries())
    assert again.known == keys.known == model()
    assert again.entries() == keys.entries()


def test_client_form_keys_are_kept_as_integers_and_answer_as_a_plain_model() -> None:
    """Keys in the clients' form (``<16 hex digits>:<hex counter>``) are kept as two
    integers in sorted runs per queue and connection, other keys as strings. Whatever
    the mix — counters out of order (a re-send overtaking), a key remembered again, keys
    that only look like the clients' form (upper case, a leading zero, too long) — every
    lookup answers as a plain dict of the newest entry of each key among the last
    ``memory``, through forgetting, cuts of the runs and a restore; ``entries`` gives
    the very strings remembered."""
    import random

    from batonmq.cluster.keys import _CUT

    memory = _CUT + 700
    rng = random.Random(13)
    conns = [f"{rng.getrandbits(64):016x}" for _ in range(3)]
    counters = [0, 0, 0]

    def a_key() -> str:
        c = rng.randrange(3)
        roll = rng.random()
        if roll < 0.8:  # the next counter, as a client makes them
            counters[c] += 1
            return f"{conns[c]}:{counters[c]:x}"
        if roll < 0.9 and counters[c] > 5:  # an older counter again
            return f"{conns[c]}:{rng.randrange(1, counters[c]):x}"
        return rng.choice([
            f"{conns[c].upper()}:{counters[c] + 1:x}",  # not lower case
            f"{conns[c]}:0{counters[c] + 1:x}",  # a leading zero
            f"{conns[c]}:{'f' * 16}",  # a counter too long for the runs
            f"{conns[c]}:",  # no counter
            f"{conns[c][:15]}:{counters[c] + 1:x}",  # a short id
            f"k{rng.randrange(50)}",
        ])

    keys = PublishKeys(memory=memory)
    log: list[tuple[int, str, int, int]] = []

    def model() -> dict[tuple[int, str], tuple[int, int]]:
        return newest(log[-memory:])

    used: set[tuple[int, str]] = set()
    for i in range(5 * memory):
        entry = (rng.randrange(2), a_key(), i, -1)
        keys.remember(*entry)
        log.append(entry)
        used.add((entry[0], entry[1]))
        if i % 2477 == 0 or i == 5 * memory - 1:
            expected = model()
            assert keys.known == expected, i
            for qid, key in used:
                assert keys.lookup(qid, key) == expected.get((qid, key)), (i, qid, key)
    assert [e[2] for e in keys.entries()] == [e[1] for e in log[-memory:]]
    strings = sum(1 for e in log[-memory:] if not e[1].startswith(tuple(conns)) or
                  e[1] != e[1].lower() or ":0" in e[1] or e[1].endswith(":") or
                  e[1].endswith("f" * 16))
    assert len(keys._strs) == strings < memory // 5  # the clients' keys hold no string
    again = PublishKeys(memory=memory)
    again.total = keys.total
    again.restore(keys.entries())
    assert again.known == keys.known == model()
    assert again.entries() == keys.entries()
    assert again.digest_part() == keys.digest_part()


def test_a_re_sent_client_key_is_found_wherever_it_sits_in_its_run() -> None:
    """A re-send finds its original position whether its counter is the newest of its
    connection, an old one, or one that arrived after newer ones (a re-send that
    overtook), and a forgotten one is not found."""
    keys = PublishKeys(memory=100)
    conn = "0123456789abcdef"
    for n in (1, 2, 3, 5, 4):  # 4 came after 5
        keys.remember(0, f"{conn}:{n:x}", 10 * n, -1)
    for n in (1, 2, 3, 4, 5):
        assert keys.lookup(0, f"{conn}:{n:x}") == (10 * n, -1)
    assert keys.lookup(0, f"{conn}:6") is None
    assert keys.lookup(1, f"{conn}:1") is None  # another queue
    ev = Enqueue("q", msgs(b"a", b"b", b"c"), keys=((f"{conn}:4", 1), (f"{conn}:6", 1),
                                                    (f"{conn}:1", 1)))
    messages, starts, fresh, dups = keys.split(0, 70, ev)
    assert (messages, starts, dups) == (msgs(b"b"), [40, 70, 10], 2)
    assert [f[:2] for f in fresh] == [(f"{conn}:6", 70)]
    small = PublishKeys(memory=2)
    for n in (1, 2, 3):
        small.remember(0, f"{conn}:{n:x}", n, -1)
    assert small.lookup(0, f"{conn}:1") is None and small.lookup(0, f"{conn}:3") == (3, -1)


@pytest.mark.parametrize("memory, steps", [(0, 300), (1, 300), (2, 300), (7, 300), (None, 2500)])
def test_a_connections_publishes_are_kept_as_blocks_and_answer_as_a_plain_model(
    memory: int | None, steps: int
) -> None:
    """A connection's publishes in one event (consecutive counters, positions a fixed
    step apart, one expiry) are kept as one block of integers. Through events that
    interleave connections and queues, a step that changes inside an event, keys
    remembered again in the middle of a block, forgetting by the memory bound (which
    cuts blocks from the front) and by the window, and a restore, every lookup, entry
    and the digest sum answer as a plain model; and the blocks are few."""
    import random

    from batonmq.cluster.keys import _CUT, _MASK, _entry_hash

    memory = _CUT + 900 if memory is None else memory  # None: cut the arrays many times
    rng = random.Random(17)
    conns = [f"{rng.getrandbits(64):016x}" for _ in range(4)]
    counters = [0] * 4
    keys = PublishKeys(memory=memory)
    log: list[tuple[int, str, int, int]] = []
    alive: list[tuple[int, str, int, int]] = []  # what the model still remembers
    pos = 0
    clock = 0

    def model() -> dict[tuple[int, str], tuple[int, int]]:
        return newest(alive)

    def remember(qid: int, key: str, first: int, expires: int) -> None:
        keys.remember(qid, key, first, expires)
        log.append((qid, key, first, expires))
        alive.append((qid, key, first, expires))
        del alive[: max(0, len(alive) - memory)]

    for step in range(steps):
        clock += rng.randrange(1, 4)
        c = rng.randrange(4)
        qid = rng.randrange(2)
        expires = rng.choice([-1, clock + 400])
        count = rng.choice([1, 1, 1, 2, 3])
        for _ in range(rng.randrange(1, 12)):
            if rng.random() < 0.05 and counters[c] > 3:  # an old key again, mid-block
                remember(qid, f"{conns[c]}:{rng.randrange(1, counters[c]):x}", pos, expires)
            else:
                counters[c] += 1
                remember(qid, f"{conns[c]}:{counters[c]:x}", pos, expires)
            pos += count if rng.random() < 0.9 else count + 1  # now and then a new step
        if rng.random() < 0.1:
            keys.forget_expired(clock)
            while alive and 0 <= alive[0][3] <= clock:
                alive.pop(0)
        if step % 250 == 0 or step % 7 == 0 and memory < 10 or step == steps - 1:
            expected = model()
            assert keys.known == expected, step
            for qid in range(2):
                for c2 in range(4):
                    for n in range(1, counters[c2] + 2):
                        key = f"{conns[c2]}:{n:x}"
                        assert keys.lookup(qid, key) == expected.get((qid, key)), (step, key)
            entries = keys.entries()
            assert [e[1:] for e in entries] == alive
            assert keys.digest_part() == [
                keys.total, len(alive), sum(_entry_hash(*e) for e in entries) & _MASK
            ]
    blocks = len(keys._bseq) - keys._bhead
    if memory > 1000:
        assert blocks < len(keys) // 3, (blocks, len(keys))  # several keys to a block
    again = PublishKeys(memory=memory)
    again.total = keys.total
    again.restore(keys.entries())
    assert again.known == keys.known == model()
    assert again.entries() == keys.entries()
    assert again.digest_part() == keys.digest_part()
