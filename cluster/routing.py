"""Routing a message through an exchange's bindings (docs/design.md §14). Pure: no I/O.

The four exchange types as RabbitMQ defines them:

* ``direct``: a binding matches when its key equals the routing key;
* ``fanout``: every binding matches, whatever the key;
* ``topic``: binding and routing keys are words separated by ``.``; in a binding key
  ``*`` matches exactly one word and ``#`` zero or more. Words may be empty (``"a..b"``
  is three words, ``"a."`` two) and the empty key is no word at all, so ``"#"`` matches
  ``""`` and ``"*"`` does not (RabbitMQ's ``split_topic_key``);
* ``headers``: the binding's arguments are matched against the message's headers;
  ``x-match`` is ``all`` (the default: every argument matches), ``any`` (at least one
  does), or ``all-with-x`` / ``any-with-x`` (RabbitMQ 3.10+: arguments whose name
  starts with ``x-`` count too; with ``all`` and ``any`` they are left out). An
  argument whose value is None matches a header's presence; otherwise the header must
  have the same value of the same kind (ints and floats differ, bools are not ints,
  text and bytes compare as bytes). ``all`` with no argument left matches every
  message, ``any`` none.

The default exchange ``""`` is not routed here: it sends a message to the queue named
by its routing key (cluster/exchanges.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = [
    "EXCHANGE_TYPES",
    "split_topic",
    "topic_matches",
    "headers_match",
    "binding_matches",
    "route",
    "TopicTrie",
]

EXCHANGE_TYPES: Final = ("direct", "fanout", "topic", "headers")

_X_MATCH: Final = ("all", "any", "all-with-x", "any-with-x")


def split_topic(key: str) -> tuple[str, ...]:
    """The words of a topic key: ``""`` has none, ``"a."`` two (``"a"``, ``""``)."""
    if not key:
        return ()
    return tuple(key.split("."))


def topic_matches(binding: tuple[str, ...], words: tuple[str, ...]) -> bool:
    """Whether a binding key's words (with ``*`` and ``#``) match a routing key's words.

    A simulation of the pattern as an automaton: the set of pattern positions reached
    after each word, ``#`` reaching past itself without a word. O(len(binding) *
    len(words)).
    """
    n = len(binding)
    states = _closure(binding, {0})
    for word in words:
        nxt: set[int] = set()
        for i in states:
            if i == n:
                continue
            p = binding[i]
            if p == "#":
                nxt.add(i)  # "#" takes this word and may take more
            elif p == "*" or p == word:
                nxt.add(i + 1)
        if not nxt:
            return False
        states = _closure(binding, nxt)
    return n in states


def _closure(binding: tuple[str, ...], states: set[int]) -> set[int]:
    """Add the positions reachable by letting each ``#`` take no word."""
    out = set(states)
    todo = list(states)
    while todo:
        i = todo.pop()
        if i < len(binding) and binding[i] == "#" and i + 1 not in out:
            out.add(i + 1)
            todo.append(i + 1)
    return out


def _kind(value: Any) -> str:
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (str, bytes)):
        return "text"
    return type(value).__name__


def _same(pattern: Any, value: Any) -> bool:
    kind = _kind(pattern)
    if kind != _kind(value):
        return False
    if kind == "text":
        a = pattern.encode() if isinstance(pattern, str) else pattern
        b = value.encode() if isinstance(value, str) else value
        return bool(a == b)
    return bool(pattern == value)


def headers_match(arguments: Mapping[str, Any], headers: Mapping[str, Any]) -> bool:
    """Whether a headers exchange's binding ``arguments`` match a message's ``headers``
    (see the module docstring). An unknown ``x-match`` matches nothing (the state
    refuses such a binding)."""
    how = arguments.get("x-match", "all")
    if how not in _X_MATCH:
        return False
    with_x = how in ("all-with-x", "any-with-x")
    want_all: bool = how in ("all", "all-with-x")
    for name, pattern in arguments.items():
        if name == "x-match" or (not with_x and name.startswith("x-")):
            continue
        ok = name in headers and (pattern is None or _same(pattern, headers[name]))
        if want_all and not ok:
            return False
        if not want_all and ok:
            return True
    return want_all


def binding_matches(
    kind: str, binding_key: str, arguments: Mapping[str, Any], routing_key: str,
    headers: Mapping[str, Any], words: tuple[str, ...] | None = None,
) -> bool:
    """Whether one binding of an exchange of type ``kind`` matches a message.
    ``words``: :func:`split_topic` of the routing key, when the caller has it."""
    if kind == "direct":
        return binding_key == routing_key
    if kind == "fanout":
        return True
    if kind == "topic":
        return topic_matches(
            split_topic(binding_key), words if words is not None else split_topic(routing_key)
        )
    if kind == "headers":
        return headers_match(arguments, headers)
    return False


def route(
    kind: str,
    bindings: Iterable[tuple[str, str, Mapping[str, Any]]],
    routing_key: str,
    headers: Mapping[str, Any],
) -> list[str]:
    """The queues that ``(queue, binding key, arguments)`` bindings of an exchange of
    type ``kind`` send a message to: each once, in the order of their first matching
    binding."""
    words = split_topic(routing_key) if kind == "topic" else None
    out: list[str] = []
    seen: set[str] = set()
    for queue, key, arguments in bindings:
        if queue in seen:
            continue
        if binding_matches(kind, key, arguments, routing_key, headers, words):
            seen.add(queue)
            out.append(queue)
    return out


class TopicTrie:
    """A topic exchange's binding keys as a trie of words, for routing many messages
    through many bindings: a message visits the branches its words (and ``*``, ``#``)
    lead to, not every binding. Built from ``(queue, binding key)`` pairs in binding
    order; :meth:`match` answers as :func:`route` does (each queue once, in the order
    of its first matching binding)."""

    __slots__ = ("_root",)

    def __init__(self, bindings: Iterable[tuple[str, str]]) -> None:
        # a node: [children by word, [(binding index, queue) ending here]]
        self._root: list[Any] = [{}, []]
        for index, (queue, key) in enumerate(bindings):
            node = self._root
            for word in split_topic(key):
                node = node[0].setdefault(word, [{}, []])
            node[1].append((index, queue))

    def match(self, routing_key: str) -> list[str]:
        words = split_topic(routing_key)
        n = len(words)
        found: list[tuple[int, str]] = []
        seen: set[tuple[int, int]] = set()  # (node, word index) visited: "#" may reach one twice
        todo: list[tuple[list[Any], int]] = [(self._root, 0)]
        while todo:
            node, i = todo.pop()
            mark = (id(node), i)
            if mark in seen:
                continue
            seen.add(mark)
            children = node[0]
            if i == n:
                found.extend(node[1])
            else:
                child = children.get(words[i])
                if child is not None:
                    todo.append((child, i + 1))
                star = children.get("*")
                if star is not None:
                    todo.append((star, i + 1))
            hash_ = children.get("#")
            if hash_ is not None:
                # "#" takes any number of the words left: go on from each
                for j in range(i, n + 1):
                    todo.append((hash_, j))
        found.sort()
        out: list[str] = []
        taken: set[str] = set()
        for _, queue in found:
            if queue not in taken:
                taken.add(queue)
                out.append(queue)
        return out
