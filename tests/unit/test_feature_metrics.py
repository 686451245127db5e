"""The feature-flag metrics of ``/metrics`` and ``/readyz`` of a real node on a memory
log (broker/metrics.py, broker/admin.py): the flags and the format, and applying stopped
for good, for a record this build cannot read or for an internal error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batonmq.broker.admin import readiness
from batonmq.broker.delivery import Delivery
from batonmq.broker.memory import BodyBudget
from batonmq.broker.metrics import BrokerMetrics
from batonmq.broker.peers import ForwardCounts
from batonmq.cluster.events import DeclareQueue
from batonmq.cluster.features import FEATURES, MAX_FORMAT
from batonmq.cluster.log import Log, open_log
from batonmq.cluster.node import Node
from batonmq.cluster.state import State
from batonmq.store.memory import MemoryStore


class _Broker:
    """What BrokerMetrics reads of a broker, around a real node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.delivery = Delivery(node, chunk_bytes=1 << 16)
        self.refusals: dict[str, int] = {}
        self.forwarding = ForwardCounts()
        self.amqp_bodies = BodyBudget(1 << 20)

    def connection_count(self) -> int:
        return 0


async def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.005)


def _samples(metrics: BrokerMetrics, name: str, label: str) -> dict[str, float]:
    text = metrics.render(None).decode()
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels.get(label, ""): s.value for s in family.samples}
    raise AssertionError(f"no metric {name}")


@pytest.fixture
async def node() -> AsyncIterator[tuple[Node, Log]]:
    log = await open_log("memory:")
    n = Node("n1", log, MemoryStore())
    await asyncio.wait_for(n.start(), 10)
    try:
        yield n, log
    finally:
        await n.stop()
        await log.close()


async def test_flags_format_and_an_unreadable_record(node: tuple[Node, Log]) -> None:
    n, log = node
    metrics = BrokerMetrics(_Broker(n))
    # A new cluster's leader enables every flag its build knows.
    await _until(lambda: set(n.state.features.enabled) == set(FEATURES), "the flags enabled")
    assert _samples(metrics, "baton_feature_enabled", "feature") == {f: 1.0 for f in FEATURES}
    assert _samples(metrics, "baton_format", "") == {"": float(MAX_FORMAT)}
    assert _samples(metrics, "baton_apply_stopped", "reason") == {"unreadable": 0.0, "error": 0.0}

    at = await log.append([msgpack.packb([MAX_FORMAT + 1, "newer", "r", 1, 0, 1, "q"])])
    await _until(lambda: n.applier.stopped, "applying stopped")
    assert _samples(metrics, "baton_apply_stopped", "reason") == {"unreadable": 1.0, "error": 0.0}
    assert _samples(metrics, "baton_healthy", "") == {"": 0.0}
    body = readiness(n, await log.end_offset())
    assert body["ready"] is False and body["apply_stopped"] is True
    assert body["reasons"][0].startswith(f"stopped applying at log offset {at}: a record this"
                                         f" build cannot read (record of format {MAX_FORMAT + 1}")


async def test_an_internal_error_while_applying(
    node: tuple[Node, Log], monkeypatch: pytest.MonkeyPatch
) -> None:
    n, _ = node
    metrics = BrokerMetrics(_Broker(n))
    real_apply = State.apply

    def failing_apply(self: State, offset: int, origin: Any, event: Any, out: list[Any]) -> None:
        if isinstance(event, DeclareQueue):
            raise RuntimeError("injected apply bug")
        real_apply(self, offset, origin, event, out)

    monkeypatch.setattr(State, "apply", failing_apply)
    n.submit(DeclareQueue("q")).add_done_callback(lambda f: f.exception())
    await _until(lambda: n.applier.stopped, "applying stopped")
    assert _samples(metrics, "baton_apply_stopped", "reason") == {"unreadable": 0.0, "error": 1.0}
    body = readiness(n, 0)
    assert body["ready"] is False and body["apply_stopped"] is True
    assert body["reasons"][0] == "stopped applying the log (see its log)"
