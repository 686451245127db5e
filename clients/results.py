"""Small helper shared by the client's modules: futures nobody awaits.

(The results the broker answers with are :mod:`batonmq.cluster.results`, read from
the Ok frames with :func:`batonmq.clients.wire.read_result`.)
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["consume_result"]


def consume_result(fut: asyncio.Future[Any]) -> None:
    """Done callback for a future or task nobody awaits: retrieve its exception so
    that asyncio does not log it as never retrieved."""
    if not fut.cancelled():
        fut.exception()
