"""Each data partition's log end and apply lag (broker/log_ends.py): read together, a log
that hangs or fails is unknown (None) after the deadline, never 0, and the lag of an
unknown end is unknown."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import pytest

from batonmq.broker import log_ends
from batonmq.broker.log_ends import apply_lag, partition_log_ends
from batonmq.cluster.errors import LogUnavailable
from batonmq.cluster.log import open_log


class _HungLog:
    """A log whose end never comes (a Kafka that accepts and never answers)."""

    async def end_offset(self) -> int:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class _FailingLog:
    async def end_offset(self) -> int:
        raise LogUnavailable("the log is down")


@dataclass
class _Part:
    partition: int
    log: Any


@dataclass
class _Node:
    """What partition_log_ends reads of a node: its parts, control first."""

    data: list[_Part]

    def parts(self) -> list[_Part]:
        return [_Part(0, None), *self.data]


def test_the_lag_of_an_unknown_end_is_unknown() -> None:
    assert apply_lag(None, 5) is None
    assert apply_lag(10, 5) == 4
    assert apply_lag(10, 9) == 0
    assert apply_lag(3, 9) == 0  # a replica past the end read a moment earlier
    assert apply_lag(0, -1) == 0  # an empty log, nothing applied


async def test_ends_are_read_together_and_a_silent_log_is_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(log_ends, "LOG_QUERY_TIMEOUT", 0.3)
    good = await open_log("memory:")
    await good.append([b"a", b"b", b"c"])
    node = _Node([_Part(1, good), _Part(2, _HungLog()), _Part(3, _HungLog()),
                  _Part(4, _FailingLog())])
    started = time.monotonic()
    ends = await asyncio.wait_for(partition_log_ends(node), 5)  # type: ignore[arg-type]
    took = time.monotonic() - started
    assert ends == {1: 3, 2: None, 3: None, 4: None}
    # One deadline for all of them, not one after the other.
    assert took < 0.55, took
    await good.close()


async def test_a_log_of_one_has_no_data_partition_ends() -> None:
    assert await partition_log_ends(_Node([])) == {}  # type: ignore[arg-type]
