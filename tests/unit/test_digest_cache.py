"""The replica digest packs again only the queues changed since the last one
(cluster/state.py): the value stays the whole state hashed afresh, whatever changed,
whether or not the driver took the changes meanwhile (take_dirty)."""

from __future__ import annotations

import hashlib

import msgpack

from batonmq.cluster import codec
from batonmq.cluster.effects import Effect
from batonmq.cluster.events import (
    Acquire,
    DeclareQueue,
    DeleteQueue,
    Enqueue,
    Event,
    Heartbeat,
    Interest,
    Leave,
    Origin,
    Propose,
    Vote,
)
from batonmq.cluster.state import State

__all__: list[str] = []


def hashed_afresh(s: State) -> str:
    """The state's digest as defined (docs/design.md §8), computed from nothing."""
    h = hashlib.sha256()
    packer = msgpack.Packer(use_bin_type=True)
    h.update(packer.pack(s.meta_snapshot()))
    h.update(packer.pack(s.exchanges.snapshot()))
    h.update(packer.pack(s.publish_keys.digest_part()))
    for name in sorted(s.queues):
        h.update(packer.pack(s.queues[name].snapshot()))
    return h.hexdigest()


class Replica:
    def __init__(self) -> None:
        self.state = State()
        self.offset = -1
        self.seq: dict[str, int] = {}

    def apply(self, ev: Event, who: str = "n1/r1") -> None:
        node, runtime = who.split("/")
        self.seq[who] = self.seq.get(who, 0) + 1
        self.offset += 1
        origin, decoded = codec.decode(
            codec.encode(Origin(node, runtime, self.seq[who], 1000 + self.offset), ev)
        )
        out: list[Effect] = []
        self.state.apply(self.offset, origin, decoded, out)

    def agrees(self) -> None:
        assert self.state.digest() == hashed_afresh(self.state)


def test_the_digest_follows_every_change_with_or_without_take_dirty() -> None:
    r = Replica()
    r.apply(Heartbeat("voter", "", {}))
    r.apply(Heartbeat("voter", "", {}), "n2/r2")
    r.apply(Propose(1, ("n1/r1", "n2/r2"), "c"))
    r.apply(Vote(1, True))
    r.apply(Vote(1, True), "n2/r2")
    for name in ("a", "b", "c"):
        r.apply(DeclareQueue(name))
        r.apply(Enqueue(name, tuple((b"m%d" % i, {}) for i in range(5))))
    r.agrees()
    unchanged = r.state.digest()
    assert r.state.digest() == unchanged  # nothing moved: the same value from the cache

    # One queue changes; taken by the driver before the next digest, or not.
    r.apply(Interest("b", True), "n2/r2")
    r.apply(Acquire("b", "n2/r2/1", 3), "n2/r2")
    assert len(r.state.queues["b"].acquired) == 3
    r.state.take_dirty()
    r.agrees()
    r.apply(Enqueue("a", ((b"more", {}),)))
    r.agrees()

    # Deleted, and declared again under the same name (a new queue object).
    r.apply(DeleteQueue("c"))
    r.agrees()
    r.apply(DeclareQueue("c"))
    r.state.take_dirty()
    r.agrees()

    # A member leaves: its queue's interest, ownership and holds change with the view.
    r.apply(Leave(), "n2/r2")
    r.apply(Propose(2, ("n1/r1",), "c"))
    r.apply(Vote(2, True))
    assert not r.state.queues["b"].acquired
    r.state.take_dirty()
    r.agrees()

    # A state installed from another's full snapshot (a joiner) agrees as well.
    joiner = State()
    joiner.install(r.state.full_snapshot())
    assert joiner.digest() == hashed_afresh(joiner) == r.state.digest()
