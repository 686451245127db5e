"""Giving freed memory back to the system.

A busy broker frees most of what it allocates soon after (message bodies, frames,
batches), but glibc's malloc keeps freed pages in its heap unless they sit at its very
top: after a load, a third of a broker's RSS was such free memory. ``malloc_trim(0)``
hands every whole free page back (``madvise``); it takes a few milliseconds for a heap
of 100 MiB and runs on an executor thread, so the event loop goes on meanwhile (ctypes
lets go of the GIL). Elsewhere than glibc there is nothing to call and nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable

__all__ = ["malloc_trim", "return_freed_memory", "TRIM_INTERVAL"]

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
