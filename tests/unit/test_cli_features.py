"""``baton feature list``'s table and the cluster format it states, from the rows a
broker answers (broker/cli_features.py), without a broker."""

from __future__ import annotations

from typing import Any

from batonmq.broker.cli_features import cluster_format, feature_table, member_names


def _row(name: str, state: str, fmt: int, since: str, yes: list[str], no: list[str]) -> dict[str, Any]:
    return {"name": name, "state": state, "format": fmt, "since": since, "doc": "",
            "enabled_at": -1, "supported_by": yes, "unsupported_by": no}


A, B, C = "node-a/1111aaaa2222", "node-b/3333bbbb4444", "node-c/5555cccc6666"


def test_members_are_shown_by_node_id_those_lacking_a_flag_with_their_address() -> None:
    rows = [
        _row("versioned_formats", "enabled", 2, "0.2.0", [A, B, C], []),
        _row("long_named_new_flag", "disabled", 3, "0.3.0", [A], [B, C]),
        _row("from_the_future", "unknown", 0, "", [], []),
    ]
    lines = feature_table(rows, {B: "10.0.0.2:5671"})
    assert lines == [
        "feature              state     format  since  supported by            not supported by",
        "versioned_formats    enabled   2       0.2.0  node-a, node-b, node-c  -",
        "long_named_new_flag  disabled  3       0.3.0  node-a                  "
        "node-b (10.0.0.2:5671), node-c",
        "from_the_future      unknown   ?       -      -                       -",
    ]


def test_two_live_runtimes_of_one_node_are_told_apart() -> None:
    again = "node-a/9999ffff0000"  # restarted, the old runtime not dropped yet
    assert member_names([A, again, B], {}) == {
        A: "node-a/1111aaaa", again: "node-a/9999ffff", B: "node-b"}


def test_the_cluster_format_is_the_highest_of_its_enabled_flags() -> None:
    rows = [_row("f2", "enabled", 2, "0.2.0", [], []), _row("f3", "disabled", 3, "0.3.0", [], [])]
    assert cluster_format(rows) == 2
    assert cluster_format(rows, ["f3"]) == 3  # once f3 is enabled too
    assert cluster_format([_row("f2", "disabled", 2, "0.2.0", [], [])]) == 1  # none enabled
    assert cluster_format([_row("x", "unknown", 0, "", [], [])]) == 1
