"""docs/grafana-dashboard.json queries only metrics the broker exposes (broker/metrics.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batonmq.broker.delivery import Delivery
from batonmq.broker.memory import BodyBudget
from batonmq.broker.metrics import BrokerMetrics
from batonmq.broker.peers import ForwardCounts
from batonmq.cluster.log import open_log, open_log_set
from batonmq.cluster.node import Node
from batonmq.cluster.partitioned import Partitioned
from batonmq.store.memory import MemoryStore

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"

# What the text exposition adds to a family's name, by type (prometheus_client).
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
}


class _Broker:
    """What BrokerMetrics reads of a broker, around a real node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.delivery = Delivery(node, chunk_bytes=1 << 16)
        self.refusals = {"login": 1}
        self.forwarding = ForwardCounts()
        self.amqp_bodies = BodyBudget(1 << 20)

    def connection_count(self) -> int:
        return 0


def _exposed_names(metrics: BrokerMetrics) -> set[str]:
    """Every sample name the broker's /metrics can show, from the declared families (a
    counter with no sample yet, like ignored events, still counts)."""
    names: set[str] = set()
    for family in metrics.registry.collect():
        names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def _queries(dashboard: dict[str, Any]) -> Iterator[str]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["query"]["query"]


async def _exposed_on_a_split_log() -> set[str]:
    """What a broker of a control partition and 2 data partitions exposes (the
    ``baton_partition_*`` families, which a log of one does not have)."""
    logs = await open_log_set("memory:", partitions=3)
    node = Partitioned("grafana", logs, MemoryStore(), {1: MemoryStore(), 2: MemoryStore()})
    await node.start()
    try:
        metrics = BrokerMetrics(_Broker(node))
        metrics.attach(node)
        return _exposed_names(metrics)
    finally:
        await node.stop()
        await logs.close()


async def test_every_metric_the_dashboard_queries_is_exposed() -> None:
    log = await open_log("memory:")
    node = Node("grafana", log, MemoryStore())
    await node.start()
    try:
        metrics = BrokerMetrics(_Broker(node))
        metrics.attach(node)
        metrics.collector.log_end = await log.end_offset()  # as a scrape sets it
        exposed = _exposed_names(metrics)
        # The families this test relies on are there (so the check below can fail).
        assert {"baton_queue_ready_messages", "baton_log_append_seconds_bucket",
                "process_cpu_seconds_total", "baton_ignored_events_total",
                "baton_apply_lag_records"} <= exposed
        exposed |= await _exposed_on_a_split_log()
        assert "baton_partition_apply_lag_records" in exposed
        dashboard = json.loads(DASHBOARD.read_text())
        queried = {
            name
            for expr in _queries(dashboard)
            for name in re.findall(r"\b(?:baton|process)_[a-z_]+\b", expr)
        }
        assert len(queried) >= 20, sorted(queried)
        assert queried - exposed == set(), f"not exposed by the broker: {queried - exposed}"
    finally:
        await node.stop()
        await log.close()


def test_the_dashboard_covers_what_operators_watch() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    text = " ".join(_queries(dashboard))
    for needed in ("baton_queue_ready_messages", "baton_queue_published_messages_total",
                   "baton_queue_delivered_messages_total", "baton_queue_accepted_messages_total",
                   "baton_apply_lag_records", "histogram_quantile(0.99, sum by (le, instance) "
                   "(rate(baton_log_append_seconds_bucket", "baton_log_fsync_seconds_bucket",
                   "baton_connections", "process_cpu_seconds_total",
                   "process_resident_memory_bytes"):
        assert needed in text, needed
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        assert all(t["expr"].strip() for t in p.get("targets", [])), p["title"]
