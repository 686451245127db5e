"""Join, Checkpoint and Heartbeat.hold on the log (docs/design.md §8): codec and state."""

from __future__ import annotations

import msgpack
import pytest

from batonmq.cluster import codec
from batonmq.cluster.codec import MalformedEvent
from batonmq.cluster.events import Checkpoint, Heartbeat, Join, Origin, Propose, Vote
from batonmq.cluster.effects import Completed, Effect
from batonmq.cluster.state import State

O = Origin("n1", "r1", 1, 1000)


@pytest.mark.parametrize(
    "event",
    [Join("127.0.0.1:5671"), Checkpoint(), Checkpoint(41, "ab" * 32), Heartbeat("voter", "a:1", {}, 17)],
)
def test_new_events_round_trip(event: object) -> None:
    origin, decoded = codec.decode(codec.encode(O, event))  # type: ignore[arg-type]
    assert (origin, decoded) == (O, event)


def test_a_heartbeat_written_before_hold_existed_decodes_with_hold_unknown() -> None:
    record = msgpack.packb(["n1", "r1", 1, 1000, Heartbeat.OP, "voter", "a:1", {}])
    _, ev = codec.decode(record)
    assert ev == Heartbeat("voter", "a:1", {}) and ev.hold == -1


@pytest.mark.parametrize(
    "fields",
    [["voter", "a:1", {}, "high"], ["voter", "a:1"], ["voter", "a:1", {}, 1, 2]],
)
def test_malformed_heartbeats_are_refused(fields: list[object]) -> None:
    with pytest.raises(MalformedEvent):
        codec.decode(msgpack.packb(["n1", "r1", 1, 1000, Heartbeat.OP, *fields]))


def _cluster() -> tuple[State, int]:
    state = State()
    offset = 0
    for key in ("n1/r1", "n2/r2"):
        node, runtime = key.split("/")
        state.apply(offset, Origin(node, runtime, 1, 1), Heartbeat("voter", "", {}, 0), [])
        offset += 1
    state.apply(offset, Origin("n1", "r1", 2, 1), Propose(1, ("n1/r1", "n2/r2"), "c"), [])
    offset += 1
    for i, key in enumerate(("n1/r1", "n2/r2")):
        node, runtime = key.split("/")
        state.apply(offset, Origin(node, runtime, 3, 1), Vote(1, True), [])
        offset += 1
    assert state.membership.members == ["n1/r1", "n2/r2"]
    return state, offset


def test_a_joiner_is_not_fenced_and_changes_nothing_but_its_sequence() -> None:
    state, offset = _cluster()
    before = state.queues.copy(), state.membership.snapshot()
    out: list[Effect] = []
    state.apply(offset, Origin("n3", "r3", 1, 1), Join("127.0.0.1:9"), out)
    assert [type(e) for e in out] == [Completed] and out[0].error is None  # type: ignore[attr-defined]
    assert (state.queues, state.membership.snapshot()) == before
    assert state.last_seq["n3/r3"] == 1


def test_hold_is_the_lowest_of_the_live_runtimes_and_unknown_until_all_told() -> None:
    state, offset = _cluster()
    assert state.membership.hold() == 0
    state.apply(offset, Origin("n1", "r1", 4, 1), Heartbeat("voter", "", {}, 90), [])
    state.apply(offset + 1, Origin("n2", "r2", 4, 1), Heartbeat("voter", "", {}, 50), [])
    assert state.membership.hold() == 50
    state.apply(offset + 2, Origin("n3", "r3", 1, 1), Heartbeat("voter", "", {}), [])
    assert state.membership.hold() is None  # a runtime that did not say: truncate nothing
