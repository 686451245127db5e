"""The placement map of a cluster of several data partitions (cluster/placement.py,
docs/design.md §16): pure, applied in log order on the control partition."""

from __future__ import annotations

import pytest

from batonmq.cluster.errors import InvalidArgument, QueueExists
from batonmq.cluster.events import EnableFeatures, Heartbeat, PlaceQueues
from batonmq.cluster.features import FEATURES
from batonmq.cluster.placement import Placement
from batonmq.cluster.snapshot import digest
from batonmq.cluster.state import State
from tests.unit.test_membership import Cluster


def test_queues_go_to_the_partition_with_the_fewest_lowest_first() -> None:
    p = Placement()
    got = [p.place(PlaceQueues((f"q{i}",), 0, 4)) for i in range(10)]
    assert got == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    assert p.counts == {1: 3, 2: 3, 3: 2, 4: 2}
    # An explicit placement counts too: the next chosen one goes around it.
    assert p.place(PlaceQueues(("pinned",), 3, 4)) == 3
    assert p.place(PlaceQueues(("next",), 0, 4)) == 4


def test_a_name_keeps_its_partition_and_an_other_explicit_one_is_refused() -> None:
    p = Placement()
    assert p.place(PlaceQueues(("a",), 2, 4)) == 2
    assert p.place(PlaceQueues(("a",), 0, 4)) == 2  # declared again: back where it was
    assert p.place(PlaceQueues(("a",), 2, 4)) == 2
    with pytest.raises(QueueExists, match="partition 2, not 3"):
        p.place(PlaceQueues(("a",), 3, 4))
    assert p.get("a") == 2 and len(p) == 1


def test_a_queue_goes_with_its_dead_letter_queue() -> None:
    p = Placement()
    p.place(PlaceQueues(("x",), 0, 4))  # partition 1
    assert p.place(PlaceQueues(("dlq",), 0, 4)) == 2
    # The queue goes where its dead-letter queue already is, not to the emptiest.
    assert p.place(PlaceQueues(("work", "dlq"), 0, 4)) == 2
    # Placed together when neither was placed.
    assert p.place(PlaceQueues(("w2", "d2"), 0, 4)) == 3 and p.get("d2") == 3
    # Both placed apart already: each stays (dead letters are forwarded between them).
    assert p.place(PlaceQueues(("x", "dlq"), 0, 4)) == 1 and p.get("dlq") == 2
    # A partition asked for the queue is kept, its dead-letter queue elsewhere or not.
    assert p.place(PlaceQueues(("new", "dlq"), 4, 4)) == 4 and p.get("dlq") == 2
    assert p.place(PlaceQueues(("new2", "d3"), 4, 4)) == 4 and p.get("d3") == 4


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (PlaceQueues(("q",), 0, 0), "1 to 1024 data partitions"),
        (PlaceQueues(("q",), 5, 4), "partition 5 does not exist"),
        (PlaceQueues(("q",), -1, 4), "partition -1 does not exist"),
        (PlaceQueues((), 0, 4), "at least one queue"),
        (PlaceQueues(("",), 0, 4), "queue name"),
        (PlaceQueues(("bad\nname",), 0, 4), "queue name"),
    ],
)
def test_bad_placements_are_refused(event: PlaceQueues, why: str) -> None:
    p = Placement()
    with pytest.raises(InvalidArgument, match=why):
        p.place(event)
    assert len(p) == 0


def test_the_snapshot_restores_the_map_and_its_counts() -> None:
    p = Placement()
    for i in range(5):
        p.place(PlaceQueues((f"q{i}",), 0, 3))
    again = Placement()
    again.restore(p.snapshot())
    assert again.placed == p.placed and again.counts == p.counts
    assert again.snapshot() == p.snapshot()
    empty = Placement()
    empty.restore(None)
    assert len(empty) == 0


def _flagged() -> Cluster:
    c = Cluster()
    a = "n1/r1"
    c.apply(a, Heartbeat("voter", "addr", {"features": sorted(FEATURES)}))
    c.duties()
    assert c.apply(a, EnableFeatures(tuple(FEATURES))).error is None
    return c


def test_the_state_places_only_with_the_flag_and_keeps_the_map_in_its_snapshot() -> None:
    c = Cluster()
    c.beat("n1/r1")
    done = c.apply("n1/r1", PlaceQueues(("q",), 0, 4))
    assert isinstance(done.error, InvalidArgument) and "flag partitions" in str(done.error)
    assert len(c.state.placement) == 0

    c = _flagged()
    before = digest(c.state)
    done = c.apply("n1/r1", PlaceQueues(("q", "q.dlq"), 0, 4))
    assert done.error is None and done.result is not None and done.result.partition == 1
    assert digest(c.state) != before  # the map is replicated state: the digest covers it
    restored = State()
    restored.restore_meta(c.state.meta_snapshot())
    assert restored.placement.placed == {"q": 1, "q.dlq": 1}
    joined = State()
    joined.install(c.state.full_snapshot())
    assert joined.placement.placed == {"q": 1, "q.dlq": 1}
    assert digest(joined) == digest(c.state)


def test_bindings_on_a_control_partition_name_placed_queues() -> None:
    """On the control partition the queues are elsewhere: a binding may name a placed
    queue, not one never placed."""
    from batonmq.cluster.errors import QueueNotFound
    from batonmq.cluster.events import Bind, DeclareExchange

    c = _flagged()
    assert c.apply("n1/r1", DeclareExchange("x", "fanout")).error is None
    assert c.apply("n1/r1", PlaceQueues(("q",), 0, 2)).error is None
    assert c.apply("n1/r1", Bind("q", "x")).error is None
    assert isinstance(c.apply("n1/r1", Bind("nowhere", "x")).error, QueueNotFound)


def test_a_data_partition_fences_range_commits_by_the_highest_token_it_has_seen() -> None:
    """On a data partition the service terms are not in its own log: a FenceTerm (or a
    commit) with a higher token makes every lower one stale there."""
    from batonmq.cluster.errors import StaleToken
    from batonmq.cluster.events import AcceptThrough, DeclareQueue, Enqueue, FenceTerm, Reserve

    c = _flagged()
    c.state.data_partition = 1
    a = "n1/r1"
    assert c.apply(a, DeclareQueue("q")).error is None
    assert c.apply(a, Enqueue("q", tuple((b"%d" % i, {}) for i in range(6)))).error is None
    # A term no partition has seen yet acts (nothing higher is known here).
    assert c.apply(a, Reserve("q", "reader-1", "spark", 7)).error is None
    assert c.apply(a, AcceptThrough("q", 2, "reader-1", "spark", 7)).error is None
    # The next term's leader announces it: the old one is refused from then on.
    assert c.apply(a, FenceTerm("spark", 12)).error is None
    late = c.apply(a, AcceptThrough("q", 4, "reader-1", "spark", 7))
    assert isinstance(late.error, StaleToken) and "later term (12)" in str(late.error)
    assert c.state.ignored.get("stale-token") == 1
    # A lower FenceTerm arriving late changes nothing; the new term commits.
    assert c.apply(a, FenceTerm("spark", 9)).error is None
    assert c.state.range_tokens == {"spark": 12}
    assert c.apply(a, AcceptThrough("q", 4, "reader-1", "spark", 12)).error is None
    # The tokens seen are replicated state: in the snapshot, restored alike.
    restored = State()
    restored.restore_meta(c.state.meta_snapshot())
    assert restored.range_tokens == {"spark": 12}
    assert digest(restored) != digest(State())
    bad = c.apply(a, FenceTerm("", 3))
    assert isinstance(bad.error, InvalidArgument)


def test_fence_term_needs_the_flag() -> None:
    from batonmq.cluster.events import FenceTerm

    c = Cluster()
    c.beat("n1/r1")
    done = c.apply("n1/r1", FenceTerm("spark", 3))
    assert isinstance(done.error, InvalidArgument) and "flag partitions" in str(done.error)


def test_a_grown_count_puts_new_queues_on_the_new_partitions_and_old_ones_stay() -> None:
    """Growing N (docs/design.md §16): after GrowPartitions(4) on a cluster of 2, new
    queues go to the emptiest partitions, the new ones, whatever count an appender that
    has not applied the growth yet says; names placed before keep their partitions."""
    from batonmq.cluster.events import GrowPartitions

    p = Placement()
    before = [p.place(PlaceQueues((f"old{i}",), 0, 2)) for i in range(4)]
    assert before == [1, 2, 1, 2]
    grown = p.grow(GrowPartitions(4))
    assert (grown.count, grown.before) == (4, 0)
    assert p.place(PlaceQueues(("new1",), 0, 2)) == 3  # an appender's stale count: 2
    assert p.place(PlaceQueues(("new2",), 0, 4)) == 4
    assert p.place(PlaceQueues(("new3",), 0, 2)) == 3
    assert p.place(PlaceQueues(("pinned",), 4, 2)) == 4  # 4 exists now, asked with count 2
    assert p.place(PlaceQueues(("new4",), 0, 2)) == 1  # 1, 2, 3 have two, 4 three: the lowest
    assert p.place(PlaceQueues(("old1",), 0, 4)) == 2  # declared again: where it was
    assert {f"old{i}": p.get(f"old{i}") for i in range(4)} == dict(
        old0=1, old1=2, old2=1, old3=2
    )
    with pytest.raises(InvalidArgument, match="partition 5 does not exist"):
        p.place(PlaceQueues(("five",), 5, 2))
    # An appender whose log has more partitions than recorded (grown, not recorded yet)
    # places among the recorded ones only.
    with pytest.raises(InvalidArgument, match="partition 5 does not exist"):
        p.place(PlaceQueues(("five",), 5, 6))
    assert p.place(PlaceQueues(("new5",), 0, 6)) in (1, 2, 3, 4)
    # Growing again: higher only.
    assert p.grow(GrowPartitions(6)).before == 4
    for bad, why in ((6, "cannot go to 6"), (3, "cannot go to 3"), (1, "2 to 1024"),
                     (2000, "2 to 1024")):
        with pytest.raises(InvalidArgument, match=why):
            p.grow(GrowPartitions(bad))
    assert p.partitions == 6


def test_a_grown_count_is_in_the_snapshot_only_once_grown() -> None:
    from batonmq.cluster.events import GrowPartitions

    p = Placement()
    p.place(PlaceQueues(("a",), 0, 2))
    assert p.snapshot() == [["a", 1]]  # never grown: the form (and digest) of before
    p.grow(GrowPartitions(3))
    assert p.snapshot() == [[["a", 1]], 3]
    again = Placement()
    again.restore(p.snapshot())
    assert (again.placed, again.counts, again.partitions) == ({"a": 1}, {1: 1}, 3)
    assert again.place(PlaceQueues(("b",), 0, 2)) == 2
    assert again.place(PlaceQueues(("c",), 0, 2)) == 3
    only = Placement()  # grown before any queue was placed
    only.grow(GrowPartitions(2))
    assert bool(only) and only.snapshot() == [[], 2]
    copy = Placement()
    copy.restore(only.snapshot())
    assert copy.partitions == 2 and len(copy) == 0
    copy.restore([["x", 2], ["y", 1]])  # two names: not the grown form
    assert copy.placed == {"x": 2, "y": 1} and copy.partitions == 0


def test_the_state_grows_only_with_the_flag_and_keeps_the_count_in_its_snapshot() -> None:
    from batonmq.cluster.events import GrowPartitions
    from batonmq.cluster.results import PartitionsGrown

    c = Cluster()
    c.beat("n1/r1")
    done = c.apply("n1/r1", GrowPartitions(4))
    assert isinstance(done.error, InvalidArgument) and "flag partitions" in str(done.error)
    assert c.state.placement.partitions == 0

    c = _flagged()
    unused = c.state.meta_snapshot()
    assert len(unused) == 11  # nothing placed, never grown: no placement part
    before = digest(c.state)
    done = c.apply("n1/r1", GrowPartitions(4))
    assert done.error is None and done.result == PartitionsGrown(4, 0)
    assert digest(c.state) != before
    shrink = c.apply("n1/r1", GrowPartitions(3))
    assert isinstance(shrink.error, InvalidArgument) and "has 4 data partitions" in str(
        shrink.error
    )
    assert c.state.ignored.get("not-grown") == 1
    assert c.apply("n1/r1", GrowPartitions(1)).error is not None  # out of range: not counted
    assert c.state.ignored.get("not-grown") == 1
    restored = State()
    restored.restore_meta(c.state.meta_snapshot())
    assert restored.placement.partitions == 4
    joined = State()
    joined.install(c.state.full_snapshot())
    assert joined.placement.partitions == 4 and digest(joined) == digest(c.state)
    placed = c.apply("n1/r1", PlaceQueues(("q",), 0, 2))
    assert placed.result is not None and placed.result.partition == 1
    placed = c.apply("n1/r1", PlaceQueues(("r",), 0, 2))
    assert placed.result is not None and placed.result.partition == 2
    placed = c.apply("n1/r1", PlaceQueues(("s",), 0, 2))
    assert placed.result is not None and placed.result.partition == 3


def test_control_counts_a_users_queues_for_max_queues_in_log_order() -> None:
    from batonmq.cluster.codec import decode, encode
    from batonmq.cluster.errors import LimitExceeded
    from batonmq.cluster.events import Origin, PutUser, ReleaseQueue, SetUserLimits
    from tests.unit.test_users import _creds

    c = _flagged()
    a = "n1/r1"
    assert c.apply(a, PutUser("alice", *_creds("pw"), False)).error is None
    assert c.apply(a, SetUserLimits("alice", (("max_queues", 2),))).error is None
    plain = c.state.placement.snapshot()
    for name in ("a1", "a2"):
        done = c.apply(a, PlaceQueues((name,), 0, 4, "alice"))
        assert done.error is None and done.result.partition in (1, 2)
    assert c.state.placement.snapshot() != plain  # (the claims are replicated state)
    over = c.apply(a, PlaceQueues(("a3", "a3.dlq"), 0, 4, "alice"))
    assert isinstance(over.error, LimitExceeded) and "max_queues 2" in str(over.error)
    assert "a3" not in c.state.placement and c.state.ignored.get("user-limit") == 1
    # One it has (declared again after a deletion not released yet): no second count.
    assert c.apply(a, PlaceQueues(("a1",), 0, 4, "alice")).error is None
    # Released by its deletion (a second release, or another user's, changes nothing).
    for user in ("bob", "alice", "alice"):
        assert c.apply(a, ReleaseQueue("a1", user)).error is None
    assert c.apply(a, PlaceQueues(("a3",), 0, 4, "alice")).error is None
    joined = State()
    joined.install(c.state.full_snapshot())
    assert joined.placement.claims == {"a2": "alice", "a3": "alice"}
    assert digest(joined) == digest(c.state)
    origin = Origin("n", "r", 1, 0)
    for ev in (PlaceQueues(("q",), 0, 4, "alice"), ReleaseQueue("q", "alice")):
        assert decode(encode(origin, ev))[1] == ev
    # Without the flag user_limits, control refuses a user's placement and a release.
    c2 = Cluster()
    c2.apply(a, Heartbeat("voter", "addr", {"features": sorted(FEATURES)}))
    c2.duties()
    assert c2.apply(a, EnableFeatures(("partitions",))).error is None
    for ev in (PlaceQueues(("q",), 0, 4, "alice"), ReleaseQueue("q", "alice")):
        done = c2.apply(a, ev)
        assert isinstance(done.error, InvalidArgument) and "user_limits" in str(done.error)
