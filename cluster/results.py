"""What a command returns: typed results, from the state machine to the client.

Applying an event answers it with one of these values (or None: the membership
events answer nothing); :class:`~batonmq.cluster.effects.Completed` carries it, the
node resolves the submitting future with it, and the broker answers the client's
command with it or with a wire result made from it (:class:`Published` for a
single publish, :class:`Subscribed`, ...). The client reads the same classes back
from the ``Ok`` frame, so a renamed field is a type error on both sides.

Each event class names its result type (``class DeleteQueue(Event[Deleted])``,
cluster/events.py), and :meth:`batonmq.cluster.node.Node.submit` returns a future of
it.

The ``Ok`` frame carries a result as a map from field name to value
(docs/protocol.md): :func:`batonmq.clients.wire.result_map` and
:func:`batonmq.clients.wire.read_result` convert, the latter checking every field's
type. A field with a default of None is left out of the map while it is None.

This module is a leaf: it imports nothing of Baton, so that the pure core, which
makes these values, and the client, which reads them, share it without either
importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "Result",
    "Declared",
    "Deleted",
    "Purged",
    "Bound",
    "ExchangeDeleted",
    "Routed",
    "UserChanged",
    "UserList",
    "PolicyChanged",
    "PolicyList",
    "FeaturesEnabled",
    "FeatureList",
    "Enqueued",
    "Counted",
    "Settled",
    "Owner",
    "Reserved",
    "AcceptedThrough",
    "Candidacy",
    "HandoverAsked",
    "Checkpointed",
    "Placed",
    "PartitionsGrown",
    "Rebalanced",
    "GroupChanged",
    "ReplicationSet",
    "Published",
    "Subscribed",
    "Cancelled",
    "QueueList",
    "ExchangeList",
    "LeadStatus",
    "Resigned",
    "ServiceList",
    "HandedOver",
    "RangeRead",
    "UpdateSent",
    "Peeked",
    "ConnectionList",
    "MessageHistory",
    "RESULT_TYPES",
]


@dataclass(frozen=True, slots=True)
class Result:
    """Base of every command result: a frozen, slotted dataclass whose fields are the
    keys of its ``Ok`` map on the wire."""


# --- results of applied events (cluster/state.py, cluster/queues.py) ------------------


@dataclass(frozen=True, slots=True)
class Declared(Result):
    """DeclareQueue: ``created`` is False when the queue existed with these settings."""

    created: bool


@dataclass(frozen=True, slots=True)
class Deleted(Result):
    """DeleteQueue: how many messages (ready and acquired) went with the queue."""

    deleted: int


@dataclass(frozen=True, slots=True)
class Bound(Result):
    """Bind, Unbind: whether the binding was made (Bind) or existed (Unbind)."""

    changed: bool


@dataclass(frozen=True, slots=True)
class ExchangeDeleted(Result):
    """DeleteExchange: how many bindings went with the exchange."""

    bindings: int


@dataclass(frozen=True, slots=True)
class Routed(Result):
    """RoutedEnqueue: ``queues`` took the messages (a re-sent publish counts: it is
    there), ``positions[i]`` being the first one's position on ``queues[i]`` (its
    original one for a re-sent publish); ``full`` refused them (max_length with
    reject-publish); ``missing`` were deleted between the routing and the append.
    Empty ``queues``: the publish reached no queue."""

    queues: list[str]
    positions: list[int]
    full: list[str]
    missing: list[str]


@dataclass(frozen=True, slots=True)
class UserChanged(Result):
    """PutUser, DeleteUser, SetRights: whether the user was added (PutUser) or existed
    (DeleteUser); True for SetRights."""

    changed: bool


@dataclass(frozen=True, slots=True)
class PolicyChanged(Result):
    """SetPolicy, ClearPolicy: whether the policy is new (SetPolicy) or existed
    (ClearPolicy), and how many queues have a policy after it (``queues``)."""

    changed: bool
    queues: int


@dataclass(frozen=True, slots=True)
class PolicyList(Result):
    """ListPolicies: every policy, by name, a map each: ``name``, ``pattern``,
    ``apply_to``, ``definition`` and ``priority``."""

    policies: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class FeaturesEnabled(Result):
    """EnableFeatures: the flags this event enabled (those already enabled are left
    out) and the cluster's format after it."""

    enabled: list[str]
    format: int


@dataclass(frozen=True, slots=True)
class FeatureList(Result):
    """ListFeatures: every feature flag known to the broker asked or enabled in the
    cluster, a map each: ``name``, ``state`` ("enabled" / "disabled" / "unknown": enabled
    by a build this broker is not), ``format``, ``since``, ``doc``, the live members
    that support it (``supported_by``) and those that do not (``unsupported_by``);
    and the cluster's ``format``."""

    features: list[dict[str, Any]]
    format: int


@dataclass(frozen=True, slots=True)
class UserList(Result):
    """ListUsers: every user, each a map with ``name``, ``admin`` and a pattern per
    right (``configure``, ``write``, ``read``, ``lead``); never credentials."""

    users: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Purged(Result):
    """PurgeQueue: how many ready messages were dropped."""

    purged: int


@dataclass(frozen=True, slots=True)
class Enqueued(Result):
    """Enqueue (and the PublishBatch answer): the messages' positions are
    ``first_position .. first_position + count - 1``.

    ``positions`` is each key span's first position, when the Enqueue had keys; a
    re-sent span keeps its original one (so they need not be consecutive). The
    PublishBatch answer leaves it out.
    """

    first_position: int
    count: int
    positions: list[int] | None = None


@dataclass(frozen=True, slots=True)
class Counted(Result):
    """Acquire and Expire: how many messages were acquired or expired."""

    count: int


@dataclass(frozen=True, slots=True)
class Settled(Result):
    """Accept, Release, Reject, ReleaseAll (and the Ack/Release/Reject answers):
    ``count`` messages were settled; ``not_acquired`` are the positions named that
    the consumer did not hold (settled already, or never delivered to it)."""

    count: int
    not_acquired: list[int]


@dataclass(frozen=True, slots=True)
class Owner(Result):
    """Interest and Handoff: the queue's owner after the event (a member key, or None)."""

    owner: str | None


@dataclass(frozen=True, slots=True)
class Reserved(Result):
    """Reserve: who holds the queue now (None: nobody), how many messages consumers
    still hold, the lowest ready position and the next position."""

    reserved_by: str | None
    acquired: int
    head: int
    next_position: int


@dataclass(frozen=True, slots=True)
class AcceptedThrough(Result):
    """AcceptThrough: how many messages it accepted, and the lowest ready position."""

    count: int
    head: int


@dataclass(frozen=True, slots=True)
class Candidacy(Result):
    """Candidate and Resign: ``was_candidate`` tells whether ``candidate`` ran for the
    service before (always True for Candidate); ``leader`` and ``token`` are the term
    after the event (None: nobody leads)."""

    service: str
    candidate: str
    was_candidate: bool
    leader: str | None
    token: int | None


@dataclass(frozen=True, slots=True)
class HandoverAsked(Result):
    """Handover: ``leader`` (term ``token``) was asked to hand ``service`` over to
    ``to`` (None: the next candidate in line)."""

    service: str
    leader: str
    token: int
    to: str | None


@dataclass(frozen=True, slots=True)
class Placed(Result):
    """PlaceQueues: the data partition the queues are on."""

    partition: int


@dataclass(frozen=True, slots=True)
class PartitionsGrown(Result):
    """GrowPartitions: the cluster's data partitions, ``count`` now and ``before`` (0 from
    the state of a cluster never grown, whose first count only the log says; the broker's
    answer says it). The broker's answer adds ``started``: which of the new partitions
    this broker applies already (docs/design.md §16, "Growing N")."""

    count: int
    before: int
    started: list[int] | None = None


@dataclass(frozen=True, slots=True)
class GroupChanged(Result):
    """AssignReplicas, AddReplica, ReplicaReady, RemoveReplica: data partition
    ``partition``'s replica group after the event, by node id (docs/design.md §16,
    "Replica groups")."""

    partition: int
    replicas: list[str]
    joining: list[str]
    leaving: list[str]


@dataclass(frozen=True, slots=True)
class ReplicationSet(Result):
    """SetReplication: the cluster's replication setting, ``replicas`` now and ``before``
    (0: never set, the default)."""

    replicas: int
    before: int


@dataclass(frozen=True, slots=True)
class Rebalanced(Result):
    """An operator's rebalance (``baton partitions rebalance``): the moves, each
    ``{"partition": k, "to": node, "from": node}``, and whether they were appended to
    control (False: a dry run, or nothing to move)."""

    moves: list[dict[str, Any]]
    applied: bool


@dataclass(frozen=True, slots=True)
class Checkpointed(Result):
    """Checkpoint: applied at log ``offset``, where this replica's digest is ``digest``."""

    offset: int
    digest: str


# --- answers the broker makes (broker/session.py, broker/leadership.py, ...) -----------


@dataclass(frozen=True, slots=True)
class Published(Result):
    """Publish: the message's position in its queue."""

    position: int


@dataclass(frozen=True, slots=True)
class Subscribed(Result):
    """Subscribe: the consumer's tag on this connection."""

    consumer: int


@dataclass(frozen=True, slots=True)
class Cancelled(Result):
    """Cancel: how many messages the consumer held went back to the queue."""

    released: int


@dataclass(frozen=True, slots=True)
class QueueList(Result):
    """ListQueues: every queue's stats (the QueueStats maps), by name."""

    queues: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ExchangeList(Result):
    """ListExchanges: every exchange, by name, each a map with ``exchange``, ``type``,
    ``durable``, ``auto_delete``, ``internal``, ``arguments`` and ``bindings`` (maps
    with ``queue``, ``routing_key``, ``arguments``)."""

    exchanges: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class LeadStatus(Result):
    """Lead: the session's candidate key and the service's term as the broker has
    applied it (``leader`` None: nobody leads; ``token`` only with a leader)."""

    service: str
    candidate: str
    leader: str | None
    token: int | None


@dataclass(frozen=True, slots=True)
class Resigned(Result):
    """Resign: whether the session ran for the service."""

    was_candidate: bool


@dataclass(frozen=True, slots=True)
class ServiceList(Result):
    """Services: every service with a candidate (a map each), by name."""

    services: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class HandedOver(Result):
    """Handover: the new term of ``service`` (``previous`` led before, if anyone)."""

    service: str
    leader: str
    token: int
    previous: str | None


@dataclass(frozen=True, slots=True)
class RangeRead(Result):
    """ReadRange: ``[position, body, headers, publish_time_ms]`` per message, in
    position order, and the position to read on from."""

    messages: list[list[Any]]
    next: int


@dataclass(frozen=True, slots=True)
class UpdateSent(Result):
    """UpdateRequest: a join update was sent up to log offset ``applied``, with
    ``queues`` queues and ``messages`` messages."""

    applied: int
    queues: int
    messages: int


@dataclass(frozen=True, slots=True)
class Peeked(Result):
    """Peek: a queue's first ready messages, not acquired:
    ``[position, delivery_count, body, headers, publish_time_ms]`` each, in delivery order."""

    queue: str
    messages: list[list[Any]]


@dataclass(frozen=True, slots=True)
class ConnectionList(Result):
    """Connections: this broker's client connections, each a map with ``id``, ``peer``,
    ``client_name``, ``user``, ``in_flight``, ``paused`` and ``consumers`` (maps with ``tag``,
    ``consumer_id``, ``queue``, ``prefetch``, ``held``, ``credit``)."""

    connections: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class MessageHistory(Result):
    """MessageHistory: a message's life as the log tells it (docs/admin.md).

    ``steps`` are maps with ``offset``, ``time_ms``, ``node``, ``what`` and more per
    step; ``complete`` is False when the log no longer holds the message's beginning
    (``note`` says why) or the scan stopped at its bound."""

    queue: str
    position: int
    log_start: int
    log_end: int
    scanned: int
    complete: bool
    state: str
    note: str
    steps: list[dict[str, Any]]


#: Every result class (the wire codec checks them all; the tests round-trip them).
RESULT_TYPES: Final[tuple[type[Result], ...]] = (
    Declared,
    Deleted,
    Purged,
    Bound,
    ExchangeDeleted,
    Routed,
    UserChanged,
    UserList,
    PolicyChanged,
    PolicyList,
    FeaturesEnabled,
    FeatureList,
    Enqueued,
    Counted,
    Settled,
    Owner,
    Reserved,
    AcceptedThrough,
    Candidacy,
    HandoverAsked,
    Checkpointed,
    Placed,
    PartitionsGrown,
    GroupChanged,
    ReplicationSet,
    Rebalanced,
    Published,
    Subscribed,
    Cancelled,
    QueueList,
    ExchangeList,
    LeadStatus,
    Resigned,
    ServiceList,
    HandedOver,
    RangeRead,
    UpdateSent,
    Peeked,
    ConnectionList,
    MessageHistory,
)
