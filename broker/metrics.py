"""The broker's Prometheus metrics, read from its state when scraped (docs/admin.md).

Nothing here runs per message. The queue and broker figures are read from the state this
broker has applied, by a custom collector, at scrape time only (:class:`BrokerCollector`).
The two latency histograms (log append, log sync) are observed once per append batch and
once per group commit, through the hooks ``Appender.append_observer`` and
``Log.sync_observer``. Each broker has its own :class:`~prometheus_client.CollectorRegistry`
(never the process-global one), so two brokers of one process, as in the tests, do not
mix their figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batonmq.broker.delivery import Delivery
from batonmq.broker.log_ends import apply_lag
from batonmq.broker.memory import BodyBudget
from batonmq.broker.peers import ForwardCounts
from batonmq.cluster.features import FEATURES
from batonmq.cluster.node import Node
from batonmq.cluster.partitioned import Partitioned

__all__ = ["BrokerMetrics", "BrokerCollector", "MetricsBroker", "CONTENT_TYPE"]

#: The Content-Type of the text exposition format that :meth:`BrokerMetrics.render` writes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Appends of a file log take ~0.1-20 ms (one fdatasync); Kafka's acks=all a few ms more.
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)


class MetricsBroker(Protocol):
    """What the metrics read of the broker (broker/server.py's ``Broker``)."""

    @property
    def node(self) -> Node:
        """The replica: its state, appender, log and checkpoints."""
        ...

    @property
    def delivery(self) -> Delivery:
        """This broker's consumers."""
        ...

    def connection_count(self) -> int:
        """Open client connections."""
        ...

    @property
    def amqp_bodies(self) -> BodyBudget:
        """The bytes of half-sent AMQP bodies the broker may hold over all connections."""
        ...

    @property
    def refusals(self) -> dict[str, int]:
        """Commands and logins refused, by what was missing (docs/security.md)."""
        ...

    @property
    def forwarding(self) -> ForwardCounts:
        """Events forwarded to other brokers, and the attempts that failed."""
        ...


class BrokerCollector(Collector):
    """Reads one broker's figures when scraped. ``log_end`` and ``partition_ends`` are
    set by the scraper just before (reading a log's end is asynchronous; a collector
    is not)."""

    def __init__(self, broker: MetricsBroker) -> None:
        self.broker = broker
        self.log_end: int | None = None
        #: Each data partition's log end (None: unknown), by partition number.
        self.partition_ends: dict[int, int | None] = {}

    def collect(self) -> Iterator[Metric]:
        """Yield every queue and broker metric (docs/admin.md lists them)."""
        node = self.broker.node
        yield from self._queues(node)
        yield from self._broker(node)

    def _queues(self, node: Node) -> Iterator[Metric]:
        gauges = {
            "ready": GaugeMetricFamily(
                "baton_queue_ready_messages", "Messages ready for delivery.", labels=["queue"]
            ),
            "acquired": GaugeMetricFamily(
                "baton_queue_acquired_messages", "Messages held by a consumer, not yet settled.",
                labels=["queue"],
            ),
            "consumers": GaugeMetricFamily(
                "baton_queue_consumers", "This broker's consumers of the queue.", labels=["queue"]
            ),
            "owner": GaugeMetricFamily(
                "baton_queue_owner", "1 if this broker owns the queue (hands its messages out).",
                labels=["queue"],
            ),
        }
        counters = {
            "enqueued": CounterMetricFamily(
                "baton_queue_published_messages", "Messages enqueued (replicated count).",
                labels=["queue"],
            ),
            "delivered": CounterMetricFamily(
                "baton_queue_delivered_messages",
                "Messages acquired for a consumer, any broker's (counted since this replica"
                " started applying).",
                labels=["queue"],
            ),
            "accepted": CounterMetricFamily(
                "baton_queue_accepted_messages", "Messages accepted (replicated count).",
                labels=["queue"],
            ),
            "released": CounterMetricFamily(
                "baton_queue_released_messages",
                "Messages released by a consumer (counted since this replica started applying).",
                labels=["queue"],
            ),
            "rejected": CounterMetricFamily(
                "baton_queue_rejected_messages",
                "Messages rejected by a consumer (counted since this replica started applying).",
                labels=["queue"],
            ),
            "expired": CounterMetricFamily(
                "baton_queue_expired_messages", "Messages expired by the queue's TTL.",
                labels=["queue"],
            ),
            "dead_lettered": CounterMetricFamily(
                "baton_queue_dead_lettered_messages",
                "Messages dead-lettered (rejected, delivery limit, expired, dropped by overflow).",
                labels=["queue"],
            ),
        }
        consumers = self.broker.delivery.by_queue
        me = node.key
        for name, q in node.queues.items():
            labels = [name]
            gauges["ready"].add_metric(labels, q.ready)
            gauges["acquired"].add_metric(labels, len(q.acquired))
            gauges["consumers"].add_metric(labels, len(consumers.get(name, ())))
            gauges["owner"].add_metric(labels, 1 if q.owner == me else 0)
            counters["enqueued"].add_metric(labels, q.enqueued)
            counters["delivered"].add_metric(labels, q.delivered)
            counters["accepted"].add_metric(labels, q.accepted)
            counters["released"].add_metric(labels, q.released)
            counters["rejected"].add_metric(labels, q.rejected)
            counters["expired"].add_metric(labels, q.expired)
            counters["dead_lettered"].add_metric(labels, q.dead_lettered)
        yield from gauges.values()
        yield from counters.values()

    def _broker(self, node: Node) -> Iterator[Metric]:
        state = node.state
        ms = state.membership
        yield _gauge("baton_applied_offset", "The last log offset applied here.", state.applied)
        lag = apply_lag(self.log_end, state.applied)
        if lag is not None:
            yield _gauge(
                "baton_apply_lag_records",
                "Records on the log not applied here yet (log end minus applied offset).",
                lag,
            )
        yield _gauge(
            "baton_outbox_events", "Events waiting for their log append.",
            node.appender.outbox_depth,
        )
        lingers = CounterMetricFamily(
            "baton_append_lingers",
            "Times the appender waited append_linger_us for more events before an append"
            " (it stops while waiting gathers nothing, docs/performance.md).",
        )
        lingers.add_metric([], node.appender.lingers)
        yield lingers
        yield _gauge(
            "baton_connections", "Open client connections.", self.broker.connection_count()
        )
        bodies = self.broker.amqp_bodies
        yield _gauge("baton_amqp_body_bytes",
                     "Bytes reserved for AMQP message bodies still arriving, over all"
                     " connections (at most amqp_body_buffer_total).", bodies.used)
        waits = CounterMetricFamily(
            "baton_amqp_body_waits",
            "AMQP bodies that waited for room under amqp_body_buffer_total, their"
            " connection not read meanwhile.",
        )
        waits.add_metric([], bodies.waits)
        yield waits
        yield _gauge("baton_view_members", "Members of the established view.", len(ms.members))
        yield _gauge("baton_view_sequence", "The established view's sequence number.",
                     ms.view_seq)
        yield _gauge("baton_member", "1 while this broker is in the established view.",
                     1 if node.joined.is_set() else 0)
        yield _gauge("baton_leader", "1 while this broker is the cluster's leader.",
                     1 if ms.leader() == node.key else 0)
        yield _gauge("baton_observer", "1 if this broker is an observer (never votes or leads).",
                     1 if node.role == "observer" else 0)
        yield _gauge("baton_healthy", "0 while the log or the store cannot be used.",
                     1 if node.healthy else 0)
        yield _gauge("baton_log_cut",
                     "1 once the log (on a split log: any of its partitions) was found to end"
                     " below the offset applied here (records cut from its end; baton log"
                     " verify): until a restart.",
                     1 if any(n.health.log_cut is not None for n in node.parts()) else 0)
        catchup = node.catchup
        yield _gauge("baton_join_in_progress", "1 while this broker takes in a join update.",
                     1 if catchup is not None else 0)
        if catchup is not None:
            p = catchup.progress
            yield _gauge("baton_join_queues", "Queues the running join update brings.", p.queues)
            yield _gauge("baton_join_queues_done", "Queues the running join update has brought.",
                         p.queues_done)
            yield _gauge("baton_join_messages_received",
                         "Messages the running join update has brought.", sum(p.received.values()))
        ignored = CounterMetricFamily(
            "baton_ignored_events",
            "Events ignored deterministically by the state machine, by reason (replicated).",
            labels=["reason"],
        )
        for reason, n in sorted(state.ignored.items()):
            ignored.add_metric([reason], n)
        yield ignored
        refused = CounterMetricFamily(
            "baton_access_refused",
            "Logins and commands this broker refused (AccessRefused), by what was missing:"
            " login, admin, member, or the right (configure, write, read, lead).",
            labels=["missing"],
        )
        for what, n in sorted(self.broker.refusals.items()):
            refused.add_metric([what], n)
        yield refused
        counts = self.broker.forwarding
        forwarded = CounterMetricFamily(
            "baton_forwarded",
            "Events a replica of a data partition this broker does not replicate appended"
            " for it (docs/design.md §16), by kind: publish, declare, other.",
            labels=["kind"],
        )
        for kind, n in sorted(counts.forwarded.items()):
            forwarded.add_metric([kind], n)
        yield forwarded
        yield _counter("baton_forward_errors",
                       "Forwarding attempts that failed: no connection to the replica, the"
                       " link broke, or it did not replicate the partition (another is tried).",
                       counts.errors)
        yield _counter("baton_digest_mismatches",
                       "Checkpoints at which this replica's digest differed from the leader's.",
                       node.digest_mismatches)
        last = node.last_checkpoint
        yield _gauge("baton_last_checkpoint_offset",
                     "Log offset of the last checkpoint applied here (-1: none).",
                     last["offset"] if last else -1)
        yield _gauge("baton_log_truncated_before",
                     "The log's start after this broker's last truncation (as leader).",
                     node.truncated_before)
        yield from self._features(node)
        yield from self._partitions(node)
        services = GaugeMetricFamily(
            "baton_service_terms", "Terms granted so far, per service.", labels=["service"]
        )
        leaders = GaugeMetricFamily(
            "baton_service_has_leader", "1 if the service has a leader.", labels=["service"]
        )
        for name, s in sorted(state.services.services.items()):
            services.add_metric([name], s.terms)
            leaders.add_metric([name], 1 if s.leader is not None else 0)
        yield services
        yield leaders


    def _partitions(self, node: Node) -> Iterator[Metric]:
        """Each data partition of a log of several, as applied here (docs/design.md §16);
        nothing for a log of one."""
        data = node.parts()[1:]
        if not data:
            return
        rows: list[tuple[str, str, Any]] = [
            ("baton_partition_applied_offset", "The last offset of the data partition applied"
             " here.", lambda n: n.state.applied),
            ("baton_partition_member", "1 while this broker is in the data partition's view.",
             lambda n: 1 if n.joined.is_set() else 0),
            ("baton_partition_view_sequence", "The data partition's established view.",
             lambda n: n.state.membership.view_seq),
            ("baton_partition_healthy", "0 while the data partition's log or store cannot be"
             " used.", lambda n: 1 if n.healthy else 0),
            ("baton_partition_queues", "Queues on the data partition.",
             lambda n: len(n.state.queues)),
            ("baton_partition_last_checkpoint_offset", "Offset of the data partition's last"
             " checkpoint applied here (-1: none).",
             lambda n: n.last_checkpoint["offset"] if n.last_checkpoint else -1),
            ("baton_partition_outbox_events", "Events waiting for their append to the data"
             " partition.", lambda n: n.appender.outbox_depth),
            ("baton_partition_forwards_pending", "Publishes and dead letters the data"
             " partition keeps for other partitions, not forwarded yet.",
             lambda n: n.state.forwards.pending_count),
            ("baton_partition_dead_letters_in_flight", "Dead letters that left a queue of"
             " the data partition and are not yet on every partition they go to.",
             lambda n: n.state.forwards.in_flight),
        ]
        for name, doc, value in rows:
            family = GaugeMetricFamily(name, doc, labels=["partition"])
            for n in data:
                family.add_metric([str(n.partition)], value(n))
            yield family
        yield from _groups(node)
        # A partition whose log end is unknown has no sample (unknown is not 0).
        lags = GaugeMetricFamily(
            "baton_partition_apply_lag_records",
            "Records on the data partition's log not applied here yet (its log end minus"
            " applied offset).", labels=["partition"],
        )
        for n in data:
            lag = apply_lag(self.partition_ends.get(n.partition), n.state.applied)
            if lag is not None:
                lags.add_metric([str(n.partition)], lag)
        yield lags

    @staticmethod
    def _features(node: Node) -> Iterator[Metric]:
        """Feature flags and formats (cluster/features.py), and whether applying stopped
        for good: at a record this build cannot read (a newer build wrote it: upgrade
        this broker) or on an internal error (a bug: restart it)."""
        flags = node.state.features
        enabled = GaugeMetricFamily(
            "baton_feature_enabled",
            "1 if the feature flag is enabled in the cluster, else 0 (replicated): every"
            " flag this build knows, and any a newer build enabled.",
            labels=["feature"],
        )
        for name in [*FEATURES, *flags.unknown()]:
            enabled.add_metric([name], 1 if name in flags.enabled else 0)
        yield enabled
        yield _gauge("baton_format",
                     "The cluster's format: the highest of its enabled flags' (1: none).",
                     flags.format)
        applier = node.applier
        unreadable = applier.unreadable is not None
        stopped = GaugeMetricFamily(
            "baton_apply_stopped",
            "1 while applying the log has stopped for good, by reason: unreadable (a record"
            " this build cannot read) or error (an internal error); until a restart.",
            labels=["reason"],
        )
        stopped.add_metric(["unreadable"], 1 if applier.stopped and unreadable else 0)
        stopped.add_metric(["error"], 1 if applier.stopped and not unreadable else 0)
        yield stopped


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class BrokerMetrics:
    """One broker's metrics: a private registry with the state collector, the latency
    histograms and the process's CPU and memory.

    Args:
        broker: the broker to read.
    """

    def __init__(self, broker: MetricsBroker) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = BrokerCollector(broker)
        self.registry.register(self.collector)
        # process_cpu_seconds_total, process_resident_memory_bytes, ... (Linux /proc).
        ProcessCollector(registry=self.registry)
        self.append_seconds = Histogram(
            "baton_log_append_seconds",
            "Time of one log append (a batch of events), from the call to durable.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.sync_seconds = Histogram(
            "baton_log_fsync_seconds",
            "Time of one fdatasync of the file log (one group commit).",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def attach(self, node: Node) -> None:
        """Observe ``node``'s appends and its log's syncs (once per batch)."""
        node.appender.append_observer = self.append_seconds.observe
        node.log.sync_observer = self.sync_seconds.observe

    def render(
        self, log_end: int | None, partition_ends: dict[int, int | None] | None = None
    ) -> bytes:
        """The text exposition of every metric now.

        Args:
            log_end: the log's end offset (next offset), for the apply lag; None if unknown.
            partition_ends: each data partition's log end (broker/log_ends.py),
                for its apply lag; a partition missing or None has no lag sample.
        """
        self.collector.log_end = log_end
        self.collector.partition_ends = partition_ends or {}
        return generate_latest(self.registry)


def _groups(node: Node) -> Iterator[Metric]:
    """Each data partition of the cluster: whether this broker applies it, and its replica
    group's live brokers and size as control says (docs/design.md §16, "Replica groups")."""
    if not isinstance(node, Partitioned):
        return
    here = GaugeMetricFamily("baton_partition_applied_here", "1 if this broker applies the"
                             " data partition (is in its replica group), else 0.",
                             labels=["partition"])
    live = GaugeMetricFamily("baton_partition_replicas_live", "The data partition's"
                             " caught-up replicas that are live members of the view.",
                             labels=["partition"])
    size = GaugeMetricFamily("baton_partition_replicas", "The data partition's caught-up"
                             " replicas (its group; every member before groups).",
                             labels=["partition"])
    for k in range(1, node.count + 1):
        n_live, n_size = node.replication.live_replicas(k)
        here.add_metric([str(k)], 1 if k in node.data else 0)
        live.add_metric([str(k)], n_live)
        size.add_metric([str(k)], n_size)
    yield from (here, live, size)
    yield GaugeMetricFamily(
        "baton_partitions_under_replicated", "Data partitions whose live caught-up"
        " replicas are fewer than the group size the planner wants (min(R, live members)).",
        value=len(node.replication.under_replicated()),
    )
