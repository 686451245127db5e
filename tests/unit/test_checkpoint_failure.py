"""A failed checkpoint says why (cluster/checkpoints.py): a timeout has no message of its
own, and the line used to end at "checkpoint failed: "."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from batonmq.cluster.checkpoints import Checkpoints
from batonmq.cluster.errors import LogUnavailable
from batonmq.cluster.health import Health


@pytest.mark.parametrize("exc, said", [
    (TimeoutError(), "checkpoint failed: TimeoutError: not applied within 30 s"),
    (LogUnavailable("disk full"), "checkpoint failed: LogUnavailable: disk full"),
])
def test_a_checkpoint_failure_logs_its_reason(
    exc: BaseException, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        failed = asyncio.Event()

        def submit(event: Any) -> asyncio.Future[Any]:
            fut: asyncio.Future[Any] = loop.create_future()
            fut.set_exception(exc)
            loop.call_soon(failed.set)
            return fut

        joined = asyncio.Event()
        joined.set()
        state = SimpleNamespace(membership=SimpleNamespace(leader=lambda: "me"), checkpoints=[])
        cp = Checkpoints("me", cast(Any, state), cast(Any, None), Health(), joined, submit, 1)
        task = asyncio.create_task(cp.run())
        try:
            await asyncio.wait_for(failed.wait(), 5)
            for _ in range(10):  # the warning follows the failed future
                await asyncio.sleep(0)
        finally:
            task.cancel()

    caplog.set_level(logging.WARNING, logger="baton.node")
    asyncio.run(asyncio.wait_for(run(), 10))
    lines = [r.getMessage() for r in caplog.records if "checkpoint failed" in r.getMessage()]
    assert lines and lines[0] == said, lines
