"""The pure topology tracker (clients/topology.py): snapshots in, listener events out."""

from __future__ import annotations

from typing import Any

import pytest

from batonmq.cluster.errors import ProtocolError
from batonmq.clients.topology import Topology, TopologyEventType, TopologyTracker

__all__: list[str] = []

INIT, CHANGING, CHANGED, PROPS = (
    TopologyEventType.INIT,
    TopologyEventType.CHANGING,
    TopologyEventType.CHANGED,
    TopologyEventType.PROPERTIES_CHANGED,
)


def snap(
    view: int = 1,
    members: tuple[str, ...] = ("a", "b", "c"),
    changing: bool = False,
    props: dict[str, Any] | None = None,
    local: str = "a",
) -> Topology:
    """A topology command result for members named by node id (runtime "r")."""
    result = {
        "cluster_id": "c1",
        "view": view,
        "changing": changing,
        "leader": f"{members[0]}/r",
        "instances": [
            {
                "node_id": m,
                "runtime": "r",
                "role": "voter",
                "address": f"{m}:1",
                "leader": i == 0,
                "local": m == local,
                "properties": (props or {}).get(m, {}),
            }
            for i, m in enumerate(members)
        ],
        "applied": 7,
        "digest": "x",
    }
    return Topology.from_mapping(result)


def run(tracker: TopologyTracker, *steps: tuple[float, Topology]) -> list[TopologyEventType]:
    return [e.type for t, s in steps for e in tracker.observe(s, t)]


def test_first_snapshot_is_init_and_an_unchanged_one_gives_nothing() -> None:
    tr = TopologyTracker(0.2)
    events = tr.observe(snap(), 0.0)
    assert [e.type for e in events] == [INIT]
    assert events[0].old is None and events[0].new.members == ("a/r", "b/r", "c/r")
    assert tr.observe(snap(), 1.0) == []
    assert tr.current == snap()


def test_a_view_change_gives_changing_then_changed() -> None:
    tr = TopologyTracker(0.2)
    assert run(
        tr,
        (0.0, snap()),
        (1.0, snap(changing=True)),
        (2.0, snap(changing=True)),
        (3.0, snap(view=2, members=("a", "b"))),
    ) == [INIT, CHANGING, CHANGED]
    assert tr.current is not None and tr.current.view == 2


def test_changes_within_the_minimum_delay_are_coalesced() -> None:
    tr = TopologyTracker(0.5)
    # CHANGING and CHANGED inside one delay reach the listener as one CHANGED.
    assert run(
        tr,
        (0.0, snap()),
        (0.1, snap(changing=True)),
        (0.3, snap(view=2, members=("a", "b"))),
        (0.6, snap(view=2, members=("a", "b"))),
    ) == [INIT, CHANGED]
    # A change that reverts within the delay is not reported at all.
    assert run(
        tr, (0.7, snap(view=2, members=("a", "b"), props={"a": {"x": 1}})),
        (1.0, snap(view=2, members=("a", "b"))),
    ) == []


def test_same_members_with_other_properties_is_properties_changed() -> None:
    tr = TopologyTracker(0.0)
    assert run(
        tr,
        (0.0, snap()),
        (1.0, snap(props={"b": {"zone": "eu"}})),
        (2.0, snap(props={"b": {"zone": "eu"}}, local="b")),  # local is not a property
        (3.0, snap(members=("a", "c", "b"))),  # a reordered view is another view
    ) == [INIT, PROPS, CHANGED]


def test_a_change_that_settles_without_a_new_view_is_changed() -> None:
    tr = TopologyTracker(0.0)
    assert run(tr, (0.0, snap()), (1.0, snap(changing=True)), (2.0, snap())) == [
        INIT,
        CHANGING,
        CHANGED,
    ]


def test_events_carry_old_and_new() -> None:
    tr = TopologyTracker(0.0)
    tr.observe(snap(), 0.0)
    (event,) = tr.observe(snap(view=2, members=("a", "b")), 1.0)
    assert event.old == snap() and event.new.view == 2
    assert event.new.local is not None and event.new.local.node_id == "a"


def test_malformed_result_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        Topology.from_mapping({"view": 1})
    with pytest.raises(ValueError):
        TopologyTracker(-1)
