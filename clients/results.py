"""Small helpers shared by the client's modules: futures nobody awaits, result fields."""

from __future__ import annotations

import asyncio
from typing import Any

from batonmq.cluster.errors import ProtocolError

__all__ = ["consume_result", "int_field"]


def consume_result(fut: asyncio.Future[Any]) -> None:
    """Done callback for a future or task nobody awaits: retrieve its exception so
    that asyncio does not log it as never retrieved."""
    if not fut.cancelled():
        fut.exception()


def int_field(result: dict[str, Any], key: str) -> int:
    """The int ``result[key]`` of a broker's answer.

    Raises:
        ProtocolError: the field is missing or not an int.
    """
    value = result.get(key)
    if not isinstance(value, int):
        raise ProtocolError(f"the broker's result has no int {key!r}: {result!r}")
    return value
