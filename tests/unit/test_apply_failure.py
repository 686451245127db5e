"""An unexpected exception while applying a batch stops applying: a CRITICAL log,
``healthy`` false, and nothing of the batch skipped or lost (docs/design.md §3)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from batonmq.cluster.errors import ShuttingDown
from batonmq.cluster.events import DeclareQueue, Enqueue
from batonmq.cluster.log import open_log
from batonmq.cluster.node import Node
from batonmq.cluster.results import Declared, Enqueued
from batonmq.cluster.state import State
from batonmq.store.memory import MemoryStore


async def _eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.001)


async def test_a_failing_apply_stops_applying_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log_ = await open_log("memory:")
    store = MemoryStore()
    node = Node("a", log_, store)
    await asyncio.wait_for(node.start(), 10)
    assert await node.submit(DeclareQueue("q")) == Declared(created=True)
    real_apply = State.apply

    failures = []

    def failing_apply(self: State, offset: int, origin: Any, event: Any, out: list[Any]) -> None:
        # Fails once: a retry would then apply the rest, but must not have skipped it.
        if isinstance(event, Enqueue) and not failures:
            failures.append(offset)
            raise RuntimeError("injected apply bug")
        real_apply(self, offset, origin, event, out)

    monkeypatch.setattr(State, "apply", failing_apply)
    caplog.set_level(logging.CRITICAL, logger="baton.node")
    fut = node.submit(Enqueue("q", ((b"x", {}),)))
    await _eventually(lambda: not node.healthy, "the node reports unhealthy")
    assert any(
        r.levelno == logging.CRITICAL and "injected apply bug" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    # Applying stopped (it is not retried past or over the failed batch): the
    # waiting command fails at once (its outcome is unknown: it is on the log), a
    # later one is refused before the log, and the node stays unhealthy.
    with pytest.raises(ShuttingDown, match="outcome is unknown"):
        await asyncio.wait_for(fut, 5)
    end = await log_.end_offset()
    with pytest.raises(ShuttingDown, match="stopped applying the log"):
        await asyncio.wait_for(node.submit(DeclareQueue("other")), 5)
    assert await log_.end_offset() == end, "a refused command was appended"
    assert "other" not in node.state.queues
    assert not node.healthy
    # The store still holds the last good batch: a restart applies the failed one.
    assert store.load().applied < await log_.end_offset() - 1
    monkeypatch.setattr(State, "apply", real_apply)
    await node.stop()
    store.close()
    again = Node("a", log_, store.reopen())
    await asyncio.wait_for(again.start(), 10)
    try:
        q = again.state.queues["q"]
        assert q.length == 1, "the batch that failed to apply was lost"
        assert "other" not in again.state.queues
        assert again.healthy
        assert await again.submit(Enqueue("q", ((b"y", {}),))) == Enqueued(1, 1)
    finally:
        await again.leave()
        await again.stop()
        await log_.close()
