"""Giving freed memory back to the system.

A busy broker frees most of what it allocates soon after (message bodies, frames,
batches), but glibc's malloc keeps freed pages in its heap unless they sit at its very
top: after a load, a third of a broker's RSS was such free memory. ``malloc_trim(0)``
hands every whole free page back (``madvise``); it takes a few milliseconds for a heap
of 100 MiB and runs on an executor thread, so the event loop goes on meanwhile (ctypes
lets go of the GIL). Elsewhere than glibc there is nothing to call and nothing is done.

:class:`BodyBudget` bounds memory the other way: the bytes of half-sent AMQP message
bodies the broker holds over all connections (docs/amqp.md "Limits").
"""

from __future__ import annotations

import asyncio
import ctypes
from collections import deque
from collections.abc import Callable

__all__ = ["BodyBudget", "malloc_trim", "return_freed_memory", "TRIM_INTERVAL"]

#: Seconds between two trims.
TRIM_INTERVAL = 30.0


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS).

    Looked up among the symbols the process already has (its C library is loaded), not
    with ``ctypes.util.find_library``, which runs ``ldconfig`` in a child process."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


async def return_freed_memory(
    interval: float = TRIM_INTERVAL, trim: Callable[[int], int] | None = None
) -> None:
    """Trim the malloc heap every ``interval`` seconds, until cancelled."""
    trim = trim or malloc_trim()
    if trim is None:
        return
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval)
        await loop.run_in_executor(None, trim, 0)


class BodyBudget:
    """Bytes a broker may hold of message bodies still arriving, over all connections.

    A connection reserves a body's announced size before it holds any of it
    (:meth:`reserve`); when the budget has no room, it waits (:meth:`wait`, its reading
    paused) and is granted the bytes, in the order the waiters came, once enough was
    released.

    Args:
        limit: the bytes that may be reserved at once.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        #: How many bodies had to wait for room (a connection's reading paused), ever.
        self.waits = 0
        self._waiters: deque[tuple[int, Callable[[], None]]] = deque()

    def reserve(self, size: int) -> bool:
        """Reserve ``size`` bytes if they fit and nobody waits; False if not."""
        if self._waiters or self.used + size > self.limit:
            return False
        self.used += size
        return True

    def wait(self, size: int, granted: Callable[[], None]) -> None:
        """Reserve ``size`` bytes as soon as they fit, after the earlier waiters, then
        call ``granted``."""
        self.waits += 1
        self._waiters.append((size, granted))

    def cancel(self, granted: Callable[[], None]) -> None:
        """Forget a waiter (its connection closed)."""
        self._waiters = deque(w for w in self._waiters if w[1] is not granted)

    def release(self, size: int) -> None:
        """Give back ``size`` reserved bytes, and grant the waiters that now fit."""
        self.used -= size
        while self._waiters and self.used + self._waiters[0][0] <= self.limit:
            n, granted = self._waiters.popleft()
            self.used += n
            granted()
