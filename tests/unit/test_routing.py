"""The exchange types' matching (cluster/routing.py), case by case."""

from __future__ import annotations

from typing import Any

import pytest

from batonmq.cluster.routing import headers_match, route, split_topic, topic_matches


def _topic(pattern: str, key: str) -> bool:
    return topic_matches(split_topic(pattern), split_topic(key))


def test_direct_routes_on_the_exact_key() -> None:
    bindings = [("q1", "red", {}), ("q2", "green", {}), ("q3", "red", {}), ("q1", "red", {})]
    assert route("direct", bindings, "red", {}) == ["q1", "q3"]
    assert route("direct", bindings, "Red", {}) == []
    assert route("direct", [("q", "", {})], "", {}) == ["q"]


def test_fanout_ignores_the_key() -> None:
    bindings = [("q1", "x", {}), ("q2", "", {}), ("q1", "y", {})]
    assert route("fanout", bindings, "anything", {}) == ["q1", "q2"]
    assert route("fanout", [], "k", {}) == []


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("a.#", "a", True),  # "#" takes zero words
        ("a.#", "a.b.c", True),
        ("#.a", "a", True),
        ("#.a", "b.a", True),
        ("#.a", "a.b", False),
        ("#", "", True),  # the empty key has no word
        ("*", "", False),
        ("", "", True),
        ("", "a", False),
        ("*", ".", False),  # "." is two empty words
        ("*.*", ".", True),
        ("a..b", "a..b", True),
        ("a.*.b", "a..b", True),  # "*" takes an empty word
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("#.#", "a.b", True),
        ("#.*.#", "", False),
        ("#.*.#", "a", True),
        ("a.", "a.", True),
        ("a.", "a", False),
        ("*.b.#", "x.b", True),
    ],
)
def test_topic_matching_edge_cases(pattern: str, key: str, matches: bool) -> None:
    assert _topic(pattern, key) is matches


def test_split_topic_keeps_empty_words() -> None:
    assert split_topic("") == ()
    assert split_topic("a") == ("a",)
    assert split_topic("a.") == ("a", "")
    assert split_topic("..") == ("", "", "")


@pytest.mark.parametrize(
    ("arguments", "headers", "matches"),
    [
        ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
        ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
        ({"a": 1, "b": "x"}, {"a": 1, "b": "y"}, False),  # all is the default
        ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
        ({"x-match": "any", "a": 1, "b": "x"}, {"c": 1}, False),
        ({"x-match": "all"}, {}, True),  # nothing left to match: all matches
        ({"x-match": "any"}, {"a": 1}, False),  # and any does not
        ({"x-match": "all", "a": None}, {"a": "whatever"}, True),  # presence
        ({"x-match": "all", "a": None}, {}, False),
        ({"x-match": "all", "a": 1}, {"a": 1.0}, False),  # int and float differ
        ({"x-match": "all", "a": 1}, {"a": True}, False),  # a bool is not an int
        ({"x-match": "all", "a": "v"}, {"a": b"v"}, True),  # text and bytes alike
        # x- arguments are left out by all/any, counted by the -with-x forms
        ({"x-match": "all", "x-k": 1, "a": 1}, {"a": 1}, True),
        ({"x-match": "all-with-x", "x-k": 1, "a": 1}, {"a": 1}, False),
        ({"x-match": "all-with-x", "x-k": 1, "a": 1}, {"a": 1, "x-k": 1}, True),
        ({"x-match": "any", "x-k": 1}, {"x-k": 1}, False),
        ({"x-match": "any-with-x", "x-k": 1}, {"x-k": 1}, True),
        ({"x-match": "bogus", "a": 1}, {"a": 1}, False),
    ],
)
def test_headers_matching(arguments: dict[str, Any], headers: dict[str, Any], matches: bool) -> None:
    assert headers_match(arguments, headers) is matches


def test_headers_exchange_routes_on_headers_not_the_key() -> None:
    bindings = [
        ("q1", "ignored", {"x-match": "any", "format": "pdf", "type": "report"}),
        ("q2", "", {"x-match": "all", "format": "pdf", "type": "log"}),
    ]
    assert route("headers", bindings, "k", {"format": "pdf", "type": "log"}) == ["q1", "q2"]
    assert route("headers", bindings, "k", {"type": "report"}) == ["q1"]
    assert route("headers", bindings, "k", {}) == []


def test_an_unknown_type_routes_nowhere() -> None:
    assert route("x-custom", [("q", "", {})], "", {}) == []
