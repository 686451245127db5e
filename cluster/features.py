"""Format versions and feature flags (docs/design.md §15, docs/operations.md "Upgrading").

Pure: no I/O, no clock. Everything Baton persists or exchanges says which *format
version* wrote it, and a change of format ships behind a named *feature flag*, as
RabbitMQ's feature flags and Kafka's ``metadata.version`` do:

* each build supports the flags of :data:`FEATURES` and announces them in its
  heartbeats (:data:`ANNOUNCE`, a heartbeat property), so every replica knows, in log
  order, which runtimes support which flags;
* a flag is enabled by an :class:`~batonmq.cluster.events.EnableFeatures` event, which
  every replica applies only if every live runtime supports the flag; once enabled a
  flag is never disabled, and a runtime whose build lacks an enabled flag is refused
  at its first heartbeat (:meth:`Features.refusal`);
* the cluster's *format* is the highest format of its enabled flags (1 when none is):
  the format log records are written in (cluster/codec.py), and the one the snapshots
  and the store say they hold.

Format 1 is what builds before flags existed wrote, with no version mark; a build of
this version writes nothing else until a flag is enabled, so it runs in one cluster
with those builds during a rolling upgrade.

A reader that meets a format or an event type it cannot read stops applying, loudly
(cluster/applier.py); it never skips it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "VERSION",
    "Feature",
    "FEATURES",
    "MAX_FORMAT",
    "ANNOUNCE",
    "Features",
    "announced",
    "snapshot_format",
]

#: This build's version: ``version`` in pyproject.toml (a test keeps them equal), bumped
#: with an entry in docs/changelog.md whenever a format changes.
VERSION: Final = "0.4.0"

#: The heartbeat property in which a runtime lists the flags its build supports.
ANNOUNCE: Final = "features"


@dataclass(frozen=True, slots=True)
class Feature:
    """A feature flag: ``name``, the ``format`` it brings, the build ``since`` which it
    exists, and what enabling it changes (``doc``)."""

    name: str
    format: int
    since: str
    doc: str


#: Every flag this build knows, in the order they were added. A new format change adds
#: one here (and a changelog entry); nothing is ever removed.
FEATURES: Final[dict[str, Feature]] = {
    f.name: f
    for f in (
        Feature(
            "versioned_formats", 2, "0.2.0",
            "log records carry their format version in the envelope, and the stored state,"
            " its snapshots and the join update say their format and the enabled flags",
        ),
        Feature(
            "user_limits", 3, "0.3.0",
            "per-user limits (queues, connections, consumers) and user tags (monitoring):"
            " the SetUserLimits and SetUserTags events, and a queue's declaring user in"
            " DeclareQueue and in the queue's snapshot; non-admin users get the default"
            " limit of 1,000 queues",
        ),
        Feature(
            "queue_expiry", 4, "0.4.0",
            "queue expiry (AMQP x-expires): a queue's expires_ms in DeclareQueue and in the"
            " queue's snapshot with the time it was last used, and the ExpireQueue event"
            " that deletes a queue unused for that long",
        ),
        Feature(
            "exchange_bindings", 5, "0.4.0",
            "exchange-to-exchange bindings: the BindExchange and UnbindExchange events, and"
            " an exchange's bindings to other exchanges as a trailing part of its snapshot",
        ),
        Feature(
            "policies", 6, "0.4.0",
            "policies (RabbitMQ-style): the SetPolicy and ClearPolicy events, and the"
            " policy table as a twelfth part of the meta snapshot once a policy is set;"
            " a matching queue's effective settings come from its policy",
        ),
        Feature(
            "partitions", 7, "0.4.0",
            "a log of a control partition and N data partitions (docs/design.md §16): the"
            " PlaceQueues event and the placement map on the control partition (with"
            " user_limits: PlaceQueues.user and ReleaseQueue); FenceTerm, FanOut, ForwardIn,"
            " ForwardDone and RouteDeadLetter on the data partitions; GrowPartitions and"
            " the grown count on the control partition (growing N); a cluster created"
            " with --partitions N > 1 needs it (its first leader enables it)",
        ),
        Feature(
            "message_ttl", 8, "0.4.0",
            "a message's own TTL (AMQP's expiration property, the native ttl): each"
            " message's TTL as a trailing field of Enqueue and RoutedEnqueue (and of"
            " FanOut and ForwardIn, and of a data partition's entries kept for another"
            " partition, on a split log), and a"
            " queue's messages' expiry times as a trailing part of its snapshot while"
            " it holds such messages; before, the property is kept and not enforced",
        ),
        Feature(
            "replica_groups", 9, "0.4.0",
            "replica groups on a split log (docs/design.md §16): the AssignReplicas,"
            " AddReplica, ReplicaReady, RemoveReplica and SetReplication events and the"
            " groups as a sixteenth part of the control partition's meta snapshot; each"
            " data partition is then applied only by the brokers of its group; before,"
            " every broker applies every partition",
        ),
    )
}

#: The highest format this build reads and writes.
MAX_FORMAT: Final = max(f.format for f in FEATURES.values())


def announced(properties: Mapping[str, Any]) -> frozenset[str] | None:
    """The flags a runtime's heartbeat properties announce; None: it announces none (a
    build from before feature flags)."""
    raw = properties.get(ANNOUNCE)
    if not isinstance(raw, list):
        return None
    return frozenset(x for x in raw if isinstance(x, str))


class Features:
    """The replicated feature-flag state: which flags are enabled, since which offset."""

    __slots__ = ("enabled",)

    def __init__(self) -> None:
        self.enabled: dict[str, int] = {}  # name -> log offset of the event that enabled it

    @property
    def format(self) -> int:
        """The cluster's format: the highest of its enabled flags' (1: none enabled)."""
        return max((FEATURES[n].format for n in self.enabled if n in FEATURES), default=1)

    def unknown(self) -> list[str]:
        """Enabled flags this build does not know (a newer build enabled them)."""
        return sorted(n for n in self.enabled if n not in FEATURES)

    def missing(self, supported: Iterable[str] | None) -> list[str]:
        """The enabled flags that a build supporting ``supported`` lacks."""
        have = frozenset(supported or ())
        return sorted(n for n in self.enabled if n not in have)

    def refusal(self, supported: frozenset[str] | None) -> str | None:
        """Why a runtime announcing ``supported`` cannot be a member, or None."""
        lacking = self.missing(supported)
        if not lacking:
            return None
        build = (
            "its build announces no feature flags (Baton before 0.2.0)"
            if supported is None else "its build does not support them"
        )
        return (
            f"this cluster has feature flag(s) {', '.join(lacking)} enabled and {build}:"
            " upgrade this broker to a build that has them (a downgrade after a flag was"
            " enabled is not possible)"
        )

    # -- persistence ---------------------------------------------------------------------

    def snapshot(self) -> list[Any]:
        """``[format, [[name, offset], ...]]``, canonical."""
        return [self.format, sorted([n, o] for n, o in self.enabled.items())]

    def restore(self, snap: list[Any] | None) -> None:
        self.enabled = {} if not snap else {n: o for n, o in snap[1]}


def snapshot_format(snap: list[Any] | None) -> int:
    """The format a :meth:`Features.snapshot` says (1: none, an older build's)."""
    if not snap:
        return 1
    fmt = snap[0]
    return fmt if type(fmt) is int else 1
