"""A data partition follows control's feature flags and policies (cluster/partitioned.py
``lacking``, docs/design.md §16): what it lacks becomes the events that make it equal,
and applying them leaves nothing lacking."""

from __future__ import annotations

from batonmq.cluster.events import ClearPolicy, EnableFeatures, SetPolicy
from batonmq.cluster.features import FEATURES
from batonmq.cluster.growth import lacking
from batonmq.cluster.policies import check_definition
from tests.unit.test_placement import _flagged

A = "n1/r1"


def _policy(name: str, pattern: str, max_length: int) -> SetPolicy:
    return SetPolicy(name, pattern, "queues", check_definition({"max-length": max_length}), 0)


def test_equal_states_lack_nothing() -> None:
    control, data = _flagged(), _flagged()
    assert lacking(control.state, data.state) == []
    for c in (control, data):
        assert c.apply(A, _policy("cap", "^a", 5)).error is None
    assert lacking(control.state, data.state) == []


def test_missing_flags_and_policies_are_set_and_extra_ones_cleared() -> None:
    control, data = _flagged(), _flagged()
    # The data partition refused an enable (it had no view then): it lacks two flags.
    some = sorted(FEATURES)[:2]
    for name in some:
        del data.state.features.enabled[name]
    assert control.apply(A, _policy("cap", "^a", 5)).error is None   # missed by data
    assert control.apply(A, _policy("both", "^b", 7)).error is None
    assert data.apply(A, _policy("both", "^b", 9)).error is None    # an older definition
    assert data.apply(A, _policy("gone", "^c", 1)).error is None    # cleared on control
    events = lacking(control.state, data.state)
    assert events == [
        EnableFeatures(tuple(some)), _policy("both", "^b", 7), _policy("cap", "^a", 5),
        ClearPolicy("gone"),
    ]
    for ev in events:
        assert data.apply(A, ev).error is None, ev
    assert lacking(control.state, data.state) == []
    assert {p.name for p in data.state.policies.listed()} == {"cap", "both"}
