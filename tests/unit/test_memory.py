"""Giving freed memory back: the periodic malloc_trim and the store's memory settings."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from batonmq.broker.memory import malloc_trim, return_freed_memory
from batonmq.store.rocks import RocksStore


async def test_the_heap_is_trimmed_every_interval_until_cancelled() -> None:
    calls: list[int] = []
    trimming = asyncio.create_task(return_freed_memory(0.01, calls.append))  # type: ignore[arg-type]
    while len(calls) < 3:
        await asyncio.sleep(0.01)
    trimming.cancel()
    with pytest.raises(asyncio.CancelledError):
        await trimming
    seen = len(calls)
    await asyncio.sleep(0.05)
    assert calls[:3] == [0, 0, 0] and len(calls) == seen  # none after the cancel


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_glibc_malloc_trim_is_found_and_runs() -> None:
    trim = malloc_trim()
    assert trim is not None
    assert trim(0) in (0, 1)  # 1: memory was given back


def test_the_store_keeps_small_memtables_and_block_cache(tmp_path: Path) -> None:
    store = RocksStore(str(tmp_path / "store"))
    try:
        options = max((tmp_path / "store").glob("OPTIONS-*"), key=lambda p: p.stat().st_mtime)
        text = options.read_text()
        assert "write_buffer_size=4194304" in text and "max_write_buffer_number=2" in text
        used = store.memory()
        assert used["block_cache_capacity"] == 4 << 20
        assert 0 < used["memtables"] < 4 << 20
    finally:
        store.close()


def test_the_body_budget_grants_waiters_in_order_once_they_fit() -> None:
    from batonmq.broker.memory import BodyBudget

    budget = BodyBudget(100)
    granted: list[str] = []
    assert budget.reserve(60) and not budget.reserve(50)
    budget.wait(50, lambda: granted.append("a"))
    budget.wait(10, lambda: granted.append("b"))
    assert not budget.reserve(10)  # fits, but others wait before it
    budget.release(20)  # 40 used: a's 50 fits, then b's 10
    assert granted == ["a", "b"] and budget.used == 100
    cancelled = lambda: granted.append("c")  # noqa: E731
    budget.wait(30, cancelled)
    budget.cancel(cancelled)
    budget.release(100)
    assert granted == ["a", "b"] and budget.used == 0
