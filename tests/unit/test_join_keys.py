"""Join keys in the replicated membership (docs/design.md §8, cluster/membership.py): a
runtime's Join puts the public key of its member proof on the log; every replica records
it, snapshots and restores it, and forgets it when the runtime leaves or is dropped."""

from __future__ import annotations

import msgpack
import pytest

from batonmq.cluster import codec
from batonmq.cluster.codec import MalformedEvent
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import Join, Leave, Origin
from batonmq.cluster.membership import MAX_PENDING_JOINS
from batonmq.cluster.state import State
from tests.unit.test_membership import Cluster

K1 = bytes(range(32))
K2 = bytes(range(1, 33))


def _two_members() -> Cluster:
    c = Cluster()
    c.beat("a/1")
    c.beat("b/1")
    assert c.state.membership.members == ["a/1", "b/1"]
    return c


def _joined(c: Cluster, who: str, key: bytes = K1) -> None:
    """``who`` joins live: its Join, then its heartbeats bring it into the view."""
    assert c.apply(who, Join(f"addr-{who}", key)).error is None
    c.beat(who)
    assert who in c.state.membership.members


def test_join_with_a_key_round_trips_and_an_old_join_decodes_without_one() -> None:
    origin = Origin("n3", "r3", 1, 1000)
    assert codec.decode(codec.encode(origin, Join("h:1", K1))) == (origin, Join("h:1", K1))
    old = msgpack.packb(["n3", "r3", 1, 1000, Join.OP, "h:1"])
    _, ev = codec.decode(old)
    assert ev == Join("h:1") and ev.member_key == b""
    with pytest.raises(MalformedEvent):
        codec.decode(msgpack.packb(["n3", "r3", 1, 1000, Join.OP, "h:1", "not bytes"]))


def test_a_join_records_its_runtimes_key_and_a_join_without_one_records_nothing() -> None:
    c = _two_members()
    done = c.apply("j/1", Join("addr-j", K1))
    assert done.error is None
    c.apply("k/1", Join("addr-k"))  # an older broker's Join: no key
    assert c.state.membership.join_keys == {"j/1": K1}


def test_a_key_of_the_wrong_size_is_refused_and_not_recorded() -> None:
    c = _two_members()
    done = c.apply("j/1", Join("addr-j", K1[:31]))
    assert isinstance(done.error, InvalidArgument) and "32 bytes" in done.error.message
    assert c.state.membership.join_keys == {}


def test_join_keys_are_snapshotted_restored_and_in_the_digest() -> None:
    c = _two_members()
    c.apply("j/1", Join("addr-j", K1))
    c.apply("k/1", Join("addr-k", K2))
    c.apply("j/1", Join("addr-j", K1))  # again: now after k's, in log order
    # Through msgpack, as the store keeps it and the join update sends it.
    meta = msgpack.unpackb(
        msgpack.packb(c.state.meta_snapshot(), use_bin_type=True), raw=False, strict_map_key=False
    )
    restored = State()
    restored.restore_meta(meta)
    assert list(restored.membership.join_keys.items()) == [("k/1", K2), ("j/1", K1)]
    assert restored.digest() == c.state.digest()
    # A joiner that installs the full snapshot has them too.
    joiner = State()
    joiner.install(c.state.full_snapshot())
    assert joiner.membership.join_keys == c.state.membership.join_keys
    assert joiner.digest() == c.state.digest()
    # The digest covers them.
    assert _keyed_twin(K1).digest() == _keyed_twin(K1).digest()
    assert _keyed_twin(K1).digest() != _keyed_twin(K2).digest()


def _keyed_twin(key: bytes) -> State:
    c = _two_members()
    c.apply("j/1", Join("addr-j", key))
    return c.state


def test_a_snapshot_from_before_join_keys_restores_with_none() -> None:
    c = _two_members()
    meta = c.state.meta_snapshot()
    assert len(meta[4]) == 10  # the membership part ends with the join keys
    old = list(meta)
    old[4] = meta[4][:9]  # what an older broker wrote
    restored = State()
    restored.restore_meta(old)
    assert restored.membership.join_keys == {}
    assert restored.membership.members == ["a/1", "b/1"]
    assert restored.digest() == c.state.digest()


def test_the_key_stays_while_its_runtime_is_a_member_and_goes_when_it_leaves() -> None:
    c = _two_members()
    _joined(c, "j/1")
    # In the view, still taking in its update: a retried request needs the key.
    assert c.state.membership.join_keys == {"j/1": K1}
    c.apply("j/1", Leave())
    assert c.state.membership.join_keys == {}


def test_the_key_goes_when_its_runtime_is_dropped_from_the_view() -> None:
    c = _two_members()
    _joined(c, "j/1")
    for _ in range(6):  # j is paused: a and b beat on, and the view drops it
        c.beat("a/1", "b/1")
    assert c.state.membership.members == ["a/1", "b/1"]
    assert c.state.membership.join_keys == {}
    # Back, it appends its Join again (cluster/update.py): recorded once more.
    assert c.apply("j/1", Join("addr-j/1", K1)).error is None
    assert c.state.membership.join_keys == {"j/1": K1}


def test_keys_of_runtimes_outside_the_view_are_bounded() -> None:
    c = _two_members()
    _joined(c, "j/1")  # a member: never pruned for the bound
    for i in range(MAX_PENDING_JOINS + 5):  # joiners that died before they beat
        c.apply(f"dead{i}/1", Join("addr", K2))
    keys = c.state.membership.join_keys
    assert len(keys) == MAX_PENDING_JOINS + 1 and keys["j/1"] == K1
    assert "dead0/1" not in keys and "dead4/1" not in keys  # the oldest went first
    assert f"dead{MAX_PENDING_JOINS + 4}/1" in keys and "dead5/1" in keys
