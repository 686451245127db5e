"""What a client's command may hold (broker/limits.py), checked before the log."""

from __future__ import annotations

from typing import Any

import pytest

from batonmq.broker.limits import (
    MAX_HEADER_DEPTH,
    MAX_KEY_BYTES,
    MAX_NAME_BYTES,
    check_event,
    check_headers,
)
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import (
    Bind,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    Enqueue,
    RoutedEnqueue,
    Unbind,
)


def _nested(depth: int) -> dict[str, Any]:
    """Headers ``depth`` levels deep (the headers map is level 1)."""
    h: dict[str, Any] = {}
    for _ in range(depth - 1):
        h = {"a": h}
    return h


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def test_header_depth_limit() -> None:
    check_headers({"list": [[1, 2], {"x": [3]}]})
    ok = _nested(MAX_HEADER_DEPTH)
    assert _depth(ok) == MAX_HEADER_DEPTH
    check_headers(ok)
    with pytest.raises(InvalidArgument, match="nested more than"):
        check_headers(_nested(MAX_HEADER_DEPTH + 1))


def test_very_deep_headers_are_refused_without_recursion() -> None:
    deep: Any = {}
    for _ in range(100_000):  # far past Python's recursion limit
        deep = [deep]
    with pytest.raises(InvalidArgument):
        check_headers({"h": deep})


@pytest.mark.parametrize(
    ("event", "ok"),
    [
        (DeclareQueue("q" * MAX_NAME_BYTES), True),
        (DeclareQueue("q" * (MAX_NAME_BYTES + 1)), False),
        (DeclareQueue("é" * (MAX_NAME_BYTES // 2 + 1)), False),  # bytes, not characters
        (DeclareQueue("q", dead_letter="d" * (MAX_NAME_BYTES + 1)), False),
        (DeleteQueue("q" * (MAX_NAME_BYTES + 1)), False),
        (Enqueue("q", ((b"x", {}),), (("k" * MAX_KEY_BYTES, 1),)), True),
        (Enqueue("q", ((b"x", {}),), (("k" * (MAX_KEY_BYTES + 1), 1),)), False),
        (Enqueue("q", ((b"x", _nested(MAX_HEADER_DEPTH + 1)),)), False),
        (Enqueue("", ((b"x", {}),)), False),
        (DeclareQueue("q", dead_letter_exchange="x" * (MAX_NAME_BYTES + 1)), False),
        (DeclareQueue("q", dead_letter_exchange="", dead_letter_routing_key="k" * 256), False),
        (DeclareQueue("q", dead_letter_exchange="", dead_letter_routing_key="dlq"), True),
        (DeclareExchange("x" * MAX_NAME_BYTES, "topic"), True),
        (DeclareExchange("x" * (MAX_NAME_BYTES + 1), "topic"), False),
        (DeclareExchange("x", "headers", arguments=_nested(MAX_HEADER_DEPTH + 1)), False),
        (DeleteExchange("x" * (MAX_NAME_BYTES + 1)), False),
        (Bind("q", "x", "k" * MAX_KEY_BYTES), True),
        (Bind("q", "x", "k" * (MAX_KEY_BYTES + 1)), False),
        (Unbind("q" * (MAX_NAME_BYTES + 1), "x"), False),
        (Bind("q", "x", "", _nested(MAX_HEADER_DEPTH + 1)), False),
        (RoutedEnqueue(("a", "b"), ((b"x", {}),), (("k", 1),), "x", "rk"), True),
        (RoutedEnqueue((), ((b"x", {}),)), False),  # would never complete
        (RoutedEnqueue(("a", ""), ((b"x", {}),)), False),
        (RoutedEnqueue(("a",), ((b"x", {}),), routing_key="k" * 256), False),
        (RoutedEnqueue(("a",), ((b"x", _nested(MAX_HEADER_DEPTH + 1)),)), False),
    ],
)
def test_check_event(event: Any, ok: bool) -> None:
    if ok:
        check_event(event)
    else:
        with pytest.raises(InvalidArgument):
            check_event(event)
