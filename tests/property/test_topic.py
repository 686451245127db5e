"""Topic matching (cluster/routing.py) against a plain recursive reference, on keys
made of few words so that empty words, ``*`` and ``#`` meet often."""

from __future__ import annotations

from functools import lru_cache

from hypothesis import given, settings
from hypothesis import strategies as st

from batonmq.cluster.routing import TopicTrie, route, split_topic, topic_matches


def _reference(pattern: str, key: str) -> bool:
    """RabbitMQ's rule, written the obvious way: ``""`` has no word, otherwise the
    words are what ``.`` separates; ``*`` takes one word, ``#`` any number."""
    p = tuple(pattern.split(".")) if pattern else ()
    w = tuple(key.split(".")) if key else ()

    @lru_cache(maxsize=None)
    def m(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(w)
        if p[i] == "#":
            return m(i + 1, j) or (j < len(w) and m(i, j + 1))
        if j == len(w):
            return False
        return (p[i] == "*" or p[i] == w[j]) and m(i + 1, j + 1)

    return m(0, 0)


_WORD = st.sampled_from(["a", "b", "", "ab"])
_PWORD = st.sampled_from(["a", "b", "", "*", "#", "ab"])


def _joined(words: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(words, max_size=6).map(".".join)


@settings(max_examples=3000, deadline=None)
@given(_joined(_PWORD), _joined(_WORD))
def test_topic_matching_agrees_with_the_reference(pattern: str, key: str) -> None:
    assert topic_matches(split_topic(pattern), split_topic(key)) == _reference(pattern, key)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["q1", "q2", "q3"]), _joined(_PWORD)), max_size=8),
       _joined(_WORD))
def test_a_topic_exchange_routes_to_each_matching_queue_once(
    bindings: list[tuple[str, str]], key: str
) -> None:
    got = route("topic", [(q, k, {}) for q, k in bindings], key, {})
    want: list[str] = []
    for q, k in bindings:
        if _reference(k, key) and q not in want:
            want.append(q)
    assert got == want


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["q1", "q2", "q3", "q4"]), _joined(_PWORD)), max_size=12),
       _joined(_WORD))
def test_the_trie_routes_as_the_bindings_one_by_one(bindings: list[tuple[str, str]], key: str) -> None:
    assert TopicTrie(bindings).match(key) == route("topic", [(q, k, {}) for q, k in bindings], key, {})
