"""Replicated events: what goes on the ordered log (docs/design.md §4, docs/events.md).

Every record on the log is one event with an envelope (:class:`Origin`): the node
that appended it, that node's runtime id (one per process), its origin sequence
number and its wall-clock time in ms. (origin node, runtime, seq) identifies an
event, so a retried append is applied once; the time is the only way time enters
the state machine.

Events are frozen, slotted dataclasses with an explicit op-code; the msgpack codec
is :mod:`batonmq.cluster.codec`. No ad-hoc dicts in the logic. Each event class names
what applying it answers (``class DeleteQueue(Event[Deleted])``, cluster/results.py;
None for the membership events), so :meth:`batonmq.cluster.node.Node.submit` returns
a future of that type.

Size: a little over 800 lines, because every replicated event is one dataclass here,
with what it does and what it answers, next to the op-code table that lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Generic, TypeAlias, TypeVar

from batonmq.cluster.results import (
    AcceptedThrough,
    Bound,
    Candidacy,
    Checkpointed,
    Counted,
    Declared,
    Deleted,
    Enqueued,
    ExchangeDeleted,
    FeaturesEnabled,
    HandoverAsked,
    Owner,
    GroupChanged,
    PartitionsGrown,
    Placed,
    PolicyChanged,
    Purged,
    ReplicationSet,
    Reserved,
    Result,
    Routed,
    Settled,
    UserChanged,
)

__all__ = [
    "Origin",
    "Event",
    "AnyEvent",
    "DeclareQueue",
    "DeleteQueue",
    "PurgeQueue",
    "DeclareExchange",
    "DeleteExchange",
    "Bind",
    "Unbind",
    "BindExchange",
    "UnbindExchange",
    "Enqueue",
    "RoutedEnqueue",
    "Acquire",
    "Accept",
    "Release",
    "Reject",
    "ReleaseAll",
    "Expire",
    "Reserve",
    "AcceptThrough",
    "Interest",
    "Handoff",
    "Heartbeat",
    "Propose",
    "Vote",
    "Leave",
    "Join",
    "Checkpoint",
    "EnableFeatures",
    "Candidate",
    "Resign",
    "Handover",
    "PutUser",
    "DeleteUser",
    "SetRights",
    "SetUserLimits",
    "SetUserTags",
    "ExpireQueue",
    "SetPolicy",
    "ClearPolicy",
    "MEMBERSHIP_EVENTS",
    "PlaceQueues",
    "GrowPartitions",
    "FenceTerm",
    "FanOut",
    "ForwardIn",
    "ForwardDone",
    "RouteDeadLetter",
    "ReleaseQueue",
    "AssignReplicas",
    "AddReplica",
    "ReplicaReady",
    "RemoveReplica",
    "SetReplication",
    "EVENT_TYPES",
    "OVERFLOW_POLICIES",
    "DEFAULT_DELIVERY_LIMIT",
    "DEFAULT_DEDUPE_WINDOW_MS",
]

OVERFLOW_POLICIES: Final = ("reject-publish", "drop-head")
DEFAULT_DELIVERY_LIMIT: Final = 20
#: A queue's default dedupe window (ms of the replicated clock), as JetStream's.
DEFAULT_DEDUPE_WINDOW_MS: Final = 120_000


@dataclass(frozen=True, slots=True)
class Origin:
    """Who appended an event, and when (by the appender's clock, ms since the epoch)."""

    node: str
    runtime: str
    seq: int
    ts: int


#: What applying an event answers (cluster/results.py), or None.
R_co = TypeVar("R_co", bound="Result | None", covariant=True)


@dataclass(frozen=True, slots=True)
class Event(Generic[R_co]):
    """Base of every event; ``OP`` is its op-code on the log. ``R_co`` is what
    applying it answers (the command's result)."""

    OP: ClassVar[int] = 0


#: Any event, whatever it answers.
AnyEvent: TypeAlias = "Event[Result | None]"


# --- wiring ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeclareQueue(Event[Declared]):
    """Create a queue, or check an existing one has the same settings.

    ``delivery_limit``: a message's delivery fails at most this many times; the
    failed release that reaches it dead-letters the message instead.

    ``retry`` ("fixed", "linear", "exponential"; "" none), ``retry_delay_ms`` and
    ``retry_max_ms``: a message whose delivery failed is held for a delay that grows
    with its delivery count before it is ready again (docs/events.md).

    ``ack_timeout_ms``: how long a consumer may hold a message unsettled before its
    broker releases it as a failed delivery (a consumer may set its own).
    ``max_priority`` (1..9; 0: none): a priority queue, whose higher-priority messages go
    first (strictly: lower ones wait while any higher one is ready).
    ``single_active_consumer``: one consumer at a time gets every message; the queue
    stays with its owner while that broker has consumers (no time slices).
    ``dedupe_window_ms``: how long a publish's idempotency key is remembered (0: never;
    re-sent publishes are then enqueued again).
    ``dead_letter_exchange`` / ``dead_letter_routing_key``: dead letters are routed
    through that exchange's bindings at apply time (RabbitMQ's x-dead-letter-exchange
    and x-dead-letter-routing-key; the routing key defaults to the one the message was
    published with). ``dead_letter`` (a queue) and an exchange are exclusive.
    """

    OP: ClassVar[int] = 1
    queue: str
    durable: bool = True
    max_length: int | None = None
    overflow: str = "reject-publish"
    delivery_limit: int = DEFAULT_DELIVERY_LIMIT
    dead_letter: str | None = None
    message_ttl_ms: int | None = None
    retry: str = ""
    retry_delay_ms: int = 0
    retry_max_ms: int | None = None
    ack_timeout_ms: int | None = None
    max_priority: int = 0
    single_active_consumer: bool = False
    dedupe_window_ms: int = DEFAULT_DEDUPE_WINDOW_MS
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    #: The user that declares it (flag ``user_limits``: its queues count against its
    #: ``max_queues``); None, and then left out of the record, before the flag.
    user: str | None = None
    #: Queue expiry (flag ``queue_expiry``, AMQP's ``x-expires``): the queue is deleted
    #: once it was unused (no consumers, no get, not declared again) for this many ms of
    #: the replicated clock (:class:`ExpireQueue`); None, and then left out of the
    #: record, for a queue that never expires.
    expires_ms: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteQueue(Event[Deleted]):
    """Delete a queue and all its messages; its consumers are cancelled."""

    OP: ClassVar[int] = 2
    queue: str


@dataclass(frozen=True, slots=True)
class PurgeQueue(Event[Purged]):
    """Drop every ready message; acquired ones stay with their consumers."""

    OP: ClassVar[int] = 3
    queue: str


@dataclass(frozen=True, slots=True)
class ExpireQueue(Event[Deleted]):
    """Delete ``queue``: it has expired (flag ``queue_expiry``; ``DeclareQueue.expires_ms``).

    Appended by the queue's owner, else the leader, when its clock says the queue has been
    unused for its ``expires_ms``; the state machine checks again, in log order, against
    the replicated clock and the queue's replicated last use, so a late or repeated one
    (the queue was used, or declared anew, since) changes nothing (docs/design.md §4).
    """

    OP: ClassVar[int] = 22
    queue: str


# --- exchanges and bindings (cluster/exchanges.py, docs/design.md §14) -------------------


@dataclass(frozen=True, slots=True)
class DeclareExchange(Event[Declared]):
    """Create an exchange (``type``: direct, fanout, topic or headers), or check that one
    exists with the same settings. ``durable`` False: it goes when the declaring member
    leaves the view; ``auto_delete``: it goes when its last binding does;
    ``internal``: clients cannot publish to it (only dead letters go through it).
    ``arguments`` are kept and compared, not interpreted."""

    OP: ClassVar[int] = 4
    exchange: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeleteExchange(Event[ExchangeDeleted]):
    """Delete an exchange and its bindings (``if_unused``: only if it has none)."""

    OP: ClassVar[int] = 5
    exchange: str
    if_unused: bool = False


@dataclass(frozen=True, slots=True)
class Bind(Event[Bound]):
    """Bind ``queue`` to ``exchange`` with a routing key and (headers exchanges)
    arguments."""

    OP: ClassVar[int] = 6
    queue: str
    exchange: str
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Unbind(Event[Bound]):
    """Remove the binding of ``queue`` to ``exchange`` with this key and arguments."""

    OP: ClassVar[int] = 7
    queue: str
    exchange: str
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BindExchange(Event[Bound]):
    """Bind exchange ``destination`` to exchange ``source``: what ``source`` routes by
    this binding goes on to ``destination``'s bindings (RabbitMQ's exchange-to-exchange
    bindings). Flag ``exchange_bindings``: written only once it is enabled, refused by
    the state before."""

    OP: ClassVar[int] = 8
    destination: str
    source: str
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class UnbindExchange(Event[Bound]):
    """Remove the binding of exchange ``destination`` to exchange ``source`` with this
    key and arguments (flag ``exchange_bindings``)."""

    OP: ClassVar[int] = 9
    destination: str
    source: str
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


# --- messages ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Enqueue(Event[Enqueued]):
    """Append messages to a queue, atomically; positions are assigned at apply time.

    ``messages`` is a tuple of ``(body, headers)`` pairs.

    ``keys`` are the publishes' idempotency keys as ``(key, count)`` spans that
    cover ``messages`` in order: one span per client publish (a batch publish is
    one span of many messages, merged single publishes are one span each). ``""``
    is a publish without a key; ``()`` means no keys at all (records written before
    keys existed). A span whose key the state already applied to this queue is not
    enqueued again; the result reports its original positions (client failover
    re-sends unconfirmed publishes with the same key: exactly once on the queue).

    ``delay_ms`` / ``not_before`` (ms since the epoch): the messages are stored now but
    held from consumers until the replicated clock passes ``max(clock at apply +
    delay_ms, not_before)``. ``priority`` (0..9): on a priority queue, capped at its
    ``max_priority``; ignored elsewhere.

    ``ttls`` (flag ``message_ttl``): each message's own time to live in ms, in the
    order of ``messages`` (None: none), as AMQP's ``expiration``; ``()``: no message has
    one (the record is then the one builds before the flag write: the codec leaves it
    out). A message expires at the replicated clock at apply plus its TTL, and is
    dropped or dead-lettered when it reaches the head of the queue past that time
    (docs/events.md "A message's own TTL"). Refused while the flag is off.
    """

    OP: ClassVar[int] = 10
    queue: str
    messages: tuple[tuple[bytes, dict[str, Any]], ...]
    keys: tuple[tuple[str, int], ...] = ()
    delay_ms: int = 0
    not_before: int = 0
    priority: int = 0
    ttls: tuple[int | None, ...] = ()


@dataclass(frozen=True, slots=True)
class RoutedEnqueue(Event[Routed]):
    """Append the same messages to several queues, at one log position: a publish
    through an exchange, routed by the broker that received it (docs/design.md §14).

    Each queue takes them as an :class:`Enqueue` with the same fields would: the
    idempotency ``keys`` are remembered per queue, so a re-sent publish is enqueued
    again on no queue that has it. A queue deleted since the routing is skipped
    (``missing`` in the result), a full one (reject-publish) refuses them alone
    (``full``); the others take them. ``exchange`` and ``routing_key`` are what the
    publish named (a dead letter of these messages is routed with that key unless
    its queue names another). ``ttls``: as for :class:`Enqueue` (flag ``message_ttl``).
    """

    OP: ClassVar[int] = 19
    queues: tuple[str, ...]
    messages: tuple[tuple[bytes, dict[str, Any]], ...]
    keys: tuple[tuple[str, int], ...] = ()
    exchange: str = ""
    routing_key: str = ""
    delay_ms: int = 0
    not_before: int = 0
    priority: int = 0
    ttls: tuple[int | None, ...] = ()


@dataclass(frozen=True, slots=True)
class Acquire(Event[Counted]):
    """Acquire up to ``count`` of the queue's next ready messages for ``consumer``.

    The applier picks the positions (lowest ready first), so two acquires can
    never name the same message: the log order decides.
    """

    OP: ClassVar[int] = 11
    queue: str
    consumer: str
    count: int


@dataclass(frozen=True, slots=True)
class Accept(Event[Settled]):
    """The consumer accepted these messages: forget them (guarantee 3)."""

    OP: ClassVar[int] = 12
    queue: str
    consumer: str
    positions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Release(Event[Settled]):
    """Give messages back to the queue (guarantee 4).

    ``failed``: the delivery failed (the application could not process the messages),
    so their delivery count goes up and the delivery limit applies. ``False`` is a
    "not now": only their acquired count goes up (docs/events.md, the two counters).
    Records written before the field existed were failed releases.

    ``delay_ms``: the messages are ready again only once the replicated clock has
    passed the clock at apply plus this (0: at once). ``timed_out``: appended by the
    consumer's broker because they passed the consumer's ack timeout (a failed one).
    """

    OP: ClassVar[int] = 13
    queue: str
    consumer: str
    positions: tuple[int, ...]
    failed: bool = True
    delay_ms: int = 0
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class Reject(Event[Settled]):
    """Dead-letter these messages, or drop them if the queue has no DLQ (guarantee 5)."""

    OP: ClassVar[int] = 14
    queue: str
    consumer: str
    positions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReleaseAll(Event[Settled]):
    """Release every message ``consumer`` holds on ``queue`` (cancel, disconnect).

    ``failed`` (when not None) names the held messages whose delivery failed: the
    application had them and did not settle them. Every other held message (still
    in the client's buffer, on its way there, or acquired for a consumer that had
    gone) goes back with only its acquired count raised.

    Without ``failed`` (None: records of brokers from before the field, and a
    disconnect), those in ``unread`` go back without a failure and all others
    count as a failed delivery.
    """

    OP: ClassVar[int] = 15
    queue: str
    consumer: str
    unread: tuple[int, ...] = ()
    failed: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Expire(Event[Counted]):
    """Ready messages at positions <= ``through`` have passed the queue's TTL.

    Appended by a broker that read the messages' enqueue times; the applier does
    not read a clock (docs/design.md §2). Expired messages are dead-lettered if the queue
    has a DLQ.
    """

    OP: ClassVar[int] = 16
    queue: str
    through: int


@dataclass(frozen=True, slots=True)
class Reserve(Event[Reserved]):
    """Reserve ``queue`` for one range reader (the Spark source, docs/design.md §11), or end the
    reservation (``holder`` None).

    While a queue is reserved no consumer acquires from it (consumers stay subscribed
    and get nothing), so a reader that reads position ranges without acquiring has
    them to itself; TTL expiry and drop-head overflow leave it alone, so positions do
    not vanish under the reader. Reserving a queue another holder has is refused.

    ``service`` and ``token``: a reader that runs as the leader of a service (the
    import-entries pipeline) names the service and its term's fencing token; the event
    is refused (``StaleToken``) unless that term is still the service's current one, so
    a leader that was paused while another took over cannot act late. "" and -1: not
    fenced (a reader without leadership).
    """

    OP: ClassVar[int] = 17
    queue: str
    holder: str | None
    service: str = ""
    token: int = -1


@dataclass(frozen=True, slots=True)
class AcceptThrough(Event[AcceptedThrough]):
    """The reservation's ``holder`` has processed every message below ``through``:
    accept (forget) every *ready* message at a position < ``through``.

    Cumulative and idempotent: a repeated or older commit accepts nothing more.
    ``service`` and ``token`` fence it as in :class:`Reserve`.
    """

    OP: ClassVar[int] = 18
    queue: str
    through: int
    holder: str
    service: str = ""
    token: int = -1


# --- ownership (docs/design.md §6) ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interest(Event[Owner]):
    """The origin broker has (``on``) or no longer has consumers for ``queue``.

    With no owner, the first interest applied makes its broker the owner; an
    owner losing interest passes the queue to the next interested broker.
    """

    OP: ClassVar[int] = 20
    queue: str
    on: bool


@dataclass(frozen=True, slots=True)
class Handoff(Event[Owner]):
    """The owner passes ``queue`` on: to ``to`` if that broker is interested, else to
    the next interested broker after it in view order (time slice, docs/design.md §6)."""

    OP: ClassVar[int] = 21
    queue: str
    to: str = ""


# --- membership (docs/design.md §7) ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heartbeat(Event[None]):
    """The origin runtime is alive; its role, client address and properties.

    ``hold`` is the lowest log offset this runtime still needs on the log: its applied
    offset, or less while it serves a join update from an older point (docs/design.md §8).
    The leader truncates the log only below every live runtime's hold; -1: unknown.

    ``serving`` says whether its client port answers and it holds the whole state (a
    member that is not itself taking in an update): only such a runtime can give a
    joining broker an update (docs/design.md §8). It is not part of the replicated state;
    records of brokers that predate it decode as True.
    """

    OP: ClassVar[int] = 30
    role: str
    address: str
    properties: dict[str, Any]
    hold: int = -1
    serving: bool = True


@dataclass(frozen=True, slots=True)
class Propose(Event[None]):
    """Propose view ``view_seq`` with these members ("node/runtime"), in order."""

    OP: ClassVar[int] = 31
    view_seq: int
    members: tuple[str, ...]
    cluster_id: str


@dataclass(frozen=True, slots=True)
class Vote(Event[None]):
    """A listed voter's answer to the open proposal for ``view_seq``."""

    OP: ClassVar[int] = 32
    view_seq: int
    yes: bool


@dataclass(frozen=True, slots=True)
class Leave(Event[None]):
    """The origin runtime shuts down cleanly: drop it from the next view at once."""

    OP: ClassVar[int] = 33


@dataclass(frozen=True, slots=True)
class Join(Event[None]):
    """A new runtime (empty store) joins without replaying the log (docs/design.md §8).

    Appended before it asks a member for the state; the member that serves the
    update captures its state at a batch boundary at or after this event, so the
    joiner only ever reads the log from about here on. ``address`` is where the
    joiner will serve clients (for operators; the update is pulled by the joiner).
    ``member_key`` is the raw Ed25519 public key of the key pair this runtime made
    at its start (cluster/member_proof.py): a member serves the update only to a peer
    that signs its challenge with the matching private key. Records from before the
    field have none (such a joiner is served by no member of this version). A joiner
    that the view dropped meanwhile appends its Join again, with the same key.
    """

    OP: ClassVar[int] = 70
    address: str
    member_key: bytes = b""


@dataclass(frozen=True, slots=True)
class EnableFeatures(Event[FeaturesEnabled]):
    """Enable these feature flags (cluster/features.py) for good.

    Applied only if every live runtime supports every one of them (its heartbeats
    announce them); else refused, and nothing is enabled. While a runtime of a build
    from before feature flags is live, the record is skipped as such a build skips it,
    as ``malformed`` (it cannot decode it), so every replica counts it alike.
    """

    OP: ClassVar[int] = 72
    names: tuple[str, ...]


# --- retention and cross-replica checks (docs/design.md §8) -----------------------------------


@dataclass(frozen=True, slots=True)
class Checkpoint(Event[Checkpointed]):
    """Appended by the leader now and then. Every replica computes its state digest
    when it applies a checkpoint; the next checkpoint carries the leader's digest
    at the previous one (``prev_offset``, ``prev_digest``), and a replica whose own
    digest there differs reports it loudly. Checkpoints are also where the leader
    truncates the log: below the previous one, once every live runtime holds past it.
    """

    OP: ClassVar[int] = 71
    prev_offset: int = -1
    prev_digest: str = ""
# --- service leadership (docs/design.md §7, last bullet; cluster/services.py) ------------------


@dataclass(frozen=True, slots=True)
class Candidate(Event[Candidacy]):
    """``candidate`` runs for leader of ``service``.

    A candidate is the origin broker runtime itself ("node/runtime") or a client
    session it hosts ("node/runtime/session"); a broker can only nominate itself
    and its own sessions. With no leader, the candidate is granted a term at once;
    its fencing token is this event's log offset.
    """

    OP: ClassVar[int] = 60
    service: str
    candidate: str


@dataclass(frozen=True, slots=True)
class Resign(Event[Candidacy]):
    """``candidate`` stops running for ``service`` (its session ended, or it left
    its ``lead`` block). If it led, the next candidate gets a new term."""

    OP: ClassVar[int] = 61
    service: str
    candidate: str


@dataclass(frozen=True, slots=True)
class Handover(Event[HandoverAsked]):
    """An admin asks the leader of ``service`` to hand over, when its running work
    is done; the next term goes to ``to`` (a candidate key, or a prefix of one such
    as a node id) if that is a candidate then, else to the first candidate.
    ``to`` is "" for "any other candidate"."""

    OP: ClassVar[int] = 62
    service: str
    to: str = ""


# --- users and rights (cluster/users.py, docs/security.md) -----------------------------------


@dataclass(frozen=True, slots=True)
class PutUser(Event[UserChanged]):
    """Add a user, or give one new credentials (SCRAM with scrypt: clients/scram.py;
    never a password) and admin flag, keeping its rights. ``initial``: the admin that
    ``baton serve --admin-password-file`` makes at a cluster's first start; it replaces
    the default ``guest`` and is ignored once any user event was applied."""

    OP: ClassVar[int] = 90
    name: str
    salt: bytes
    cost: int
    stored_key: bytes
    server_key: bytes
    admin: bool
    initial: bool = False


@dataclass(frozen=True, slots=True)
class DeleteUser(Event[UserChanged]):
    """Remove a user (not the last admin). Its open connections are refused from then on."""

    OP: ClassVar[int] = 91
    name: str


@dataclass(frozen=True, slots=True)
class SetRights(Event[UserChanged]):
    """Set a user's rights: ``[[right, pattern], ...]`` (cluster/users.py RIGHTS; the
    rights not listed keep their patterns)."""

    OP: ClassVar[int] = 92
    name: str
    rights: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class SetUserLimits(Event[UserChanged]):
    """Set a user's limits (flag ``user_limits``; cluster/users.py LIMITS):
    ``[[limit, value], ...]``, a value of -1 for no limit, None for the cluster's default
    again; the limits not listed stay. ``name`` "": the cluster's default for non-admin
    users."""

    OP: ClassVar[int] = 93
    name: str
    limits: tuple[tuple[str, int | None], ...]


@dataclass(frozen=True, slots=True)
class SetUserTags(Event[UserChanged]):
    """Set a user's tags, all of them (flag ``user_limits``; cluster/users.py TAGS:
    ``monitoring``)."""

    OP: ClassVar[int] = 94
    name: str
    tags: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SetPolicy(Event[PolicyChanged]):
    """Add or replace a policy (flag ``policies``; cluster/policies.py,
    docs/operations.md "Policies"): queues whose names match ``pattern`` (a Python
    regular expression, searched) take the settings of ``definition``
    (``[[key, value], ...]``, sorted) where RabbitMQ's rules let it; of the policies
    that match a queue, the one with the highest ``priority`` applies (equal
    priorities: the name that sorts first)."""

    OP: ClassVar[int] = 100
    name: str
    pattern: str
    apply_to: str
    definition: tuple[tuple[str, Any], ...]
    priority: int


@dataclass(frozen=True, slots=True)
class ClearPolicy(Event[PolicyChanged]):
    """Remove a policy (flag ``policies``); its queues go back to their declared
    settings, or take the next policy that matches them."""

    OP: ClassVar[int] = 101
    name: str


# --- partitions (docs/design.md §16) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlaceQueues(Event[Placed]):
    """Place queues on a data partition, on the control partition (flag ``partitions``).

    ``queues`` go together (a queue and its dead-letter queue): on the partition that
    one of them already has, else on ``partition`` (1..``count``), else (0) on the one
    of the ``count`` data partitions with the fewest queues placed (ties: the lowest).
    A placement is kept for the name: a queue declared again under it returns there.
    """

    OP: ClassVar[int] = 110
    queues: tuple[str, ...]
    partition: int = 0
    count: int = 1
    # The user a new queue (the first) counts for, on a split log (flag user_limits):
    # refused past the user's max_queues, in control's log order.
    user: str | None = None


@dataclass(frozen=True, slots=True)
class ReleaseQueue(Event[None]):
    """On the control partition of a split log (flags ``partitions`` and
    ``user_limits``): ``queue`` of ``user`` was deleted on its data partition, so it no
    longer counts for the user's max_queues (every broker appends it; the first applied
    counts)."""

    OP: ClassVar[int] = 116
    queue: str
    user: str


@dataclass(frozen=True, slots=True)
class GrowPartitions(Event[PartitionsGrown]):
    """On the control partition (flag ``partitions``): the cluster has ``count`` data
    partitions from here on, more than before (docs/design.md §16, "Growing N").

    Appended by the broker an operator asks, once the log has the partitions; every
    broker that applies it opens the new partitions' logs and starts their replicas.
    Placement chooses among ``count`` from here on; a count not above the one recorded
    is refused (shrinking is not possible; ignore reason ``not-grown``).
    """

    OP: ClassVar[int] = 120
    count: int


# --- replica groups (docs/design.md §16, "Replica groups"; flag replica_groups) ----------


@dataclass(frozen=True, slots=True)
class AssignReplicas(Event[GroupChanged]):
    """On the control partition: data partition ``partition``'s replica group is
    ``nodes`` (node ids), caught up at once — a partition never assigned before, which
    is empty or was applied by every member until then. Appended by control's leader."""

    OP: ClassVar[int] = 121
    partition: int
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AddReplica(Event[GroupChanged]):
    """On the control partition: broker ``node`` joins data partition ``partition``'s
    group; it catches up (a join update of that partition) and says ReplicaReady. With
    ``instead``, that replica leaves the group once no replica is joining (a move)."""

    OP: ClassVar[int] = 122
    partition: int
    node: str
    instead: str | None = None


@dataclass(frozen=True, slots=True)
class ReplicaReady(Event[GroupChanged]):
    """On the control partition: broker ``node``, joining ``partition``'s group, is a
    member of the partition's view (caught up). Appended by that broker."""

    OP: ClassVar[int] = 123
    partition: int
    node: str


@dataclass(frozen=True, slots=True)
class RemoveReplica(Event[GroupChanged]):
    """On the control partition: broker ``node`` leaves ``partition``'s group at once (it
    is gone, or the group is larger than the setting). It stops applying the partition
    and deletes the partition's data."""

    OP: ClassVar[int] = 124
    partition: int
    node: str


@dataclass(frozen=True, slots=True)
class SetReplication(Event[ReplicationSet]):
    """On the control partition: each data partition's group has ``replicas`` brokers
    (capped by the members there are). ``initial``: only if none was set (a broker's
    ``--replicas`` on a new cluster; the first applied counts)."""

    OP: ClassVar[int] = 125
    replicas: int
    initial: bool = False


@dataclass(frozen=True, slots=True)
class FenceTerm(Event[None]):
    """On a data partition (flag ``partitions``): service ``service`` has a term of fencing
    ``token`` (granted on the control partition). A range commit of that service with a
    lower token is refused here from now on; appended by the broker of the new term's
    leader to every data partition."""

    OP: ClassVar[int] = 111
    service: str
    token: int


@dataclass(frozen=True, slots=True)
class FanOut(Event[Routed]):
    """A publish through an exchange whose queues are on several data partitions
    (flag ``partitions``; cluster/forwarding.py), appended to one of them, its *home*:
    enqueued here on ``queues`` as a :class:`RoutedEnqueue` would be, and kept for each
    other partition of ``forward`` (``[(partition, queues), ...]``) until forwarded.
    ``ttls``: as for :class:`Enqueue` (flag ``message_ttl``), kept with each entry too."""

    OP: ClassVar[int] = 112
    queues: tuple[str, ...]
    messages: tuple[tuple[bytes, dict[str, Any]], ...]
    keys: tuple[tuple[str, int], ...] = ()
    exchange: str = ""
    routing_key: str = ""
    delay_ms: int = 0
    not_before: int = 0
    priority: int = 0
    forward: tuple[tuple[int, tuple[str, ...]], ...] = ()
    ttls: tuple[int | None, ...] = ()


@dataclass(frozen=True, slots=True)
class ForwardIn(Event[Routed]):
    """Entry ``number`` that data partition ``home`` keeps for this one (flag
    ``partitions``): enqueued on ``queues`` if it is the next one expected from ``home``;
    a lower number is a duplicate (nothing enqueued), a higher one is refused.
    ``ttls``: as for :class:`Enqueue` (flag ``message_ttl``); a message's TTL counts from
    this apply, by this partition's replicated clock (when it enters its queues here)."""

    OP: ClassVar[int] = 113
    home: int
    number: int
    queues: tuple[str, ...]
    messages: tuple[tuple[bytes, dict[str, Any]], ...]
    keys: tuple[tuple[str, int], ...] = ()
    exchange: str = ""
    routing_key: str = ""
    delay_ms: int = 0
    not_before: int = 0
    priority: int = 0
    ttls: tuple[int | None, ...] = ()


@dataclass(frozen=True, slots=True)
class ForwardDone(Event[None]):
    """The entries this data partition kept for partition ``target``, numbered up to
    ``through``, were applied there: dropped here (flag ``partitions``)."""

    OP: ClassVar[int] = 114
    target: int
    through: int


@dataclass(frozen=True, slots=True)
class RouteDeadLetter(Event[None]):
    """The routes of the dead letter numbered ``number`` in this data partition's outbox
    (flag ``partitions``; cluster/forwarding.py), as its leader resolved them: copied to
    the queues ``local`` here, and kept for each other partition of ``forward``
    (``[(partition, queues), ...]``) until forwarded. The first one applied for a number
    decides; a later one is a duplicate."""

    OP: ClassVar[int] = 115
    number: int
    local: tuple[str, ...] = ()
    forward: tuple[tuple[int, tuple[str, ...]], ...] = ()


EVENT_TYPES: Final[dict[int, type[AnyEvent]]] = {
    cls.OP: cls
    for cls in (
        DeclareQueue,
        DeleteQueue,
        PurgeQueue,
        DeclareExchange,
        DeleteExchange,
        Bind,
        Unbind,
        BindExchange,
        UnbindExchange,
        Enqueue,
        RoutedEnqueue,
        Acquire,
        Accept,
        Release,
        Reject,
        ReleaseAll,
        Expire,
        Reserve,
        AcceptThrough,
        Interest,
        Handoff,
        Heartbeat,
        Propose,
        Vote,
        Leave,
        Join,
        Checkpoint,
        EnableFeatures,
        Candidate,
        Resign,
        Handover,
        PutUser,
        DeleteUser,
        SetRights,
        SetUserLimits,
        SetUserTags,
        ExpireQueue,
        PlaceQueues,
        GrowPartitions,
        AssignReplicas,
        AddReplica,
        ReplicaReady,
        RemoveReplica,
        SetReplication,
        FenceTerm,
        FanOut,
        ForwardIn,
        ForwardDone,
        RouteDeadLetter,
        ReleaseQueue,
        SetPolicy,
        ClearPolicy,
    )
}

#: Events a runtime may append before it is in the established view.
MEMBERSHIP_EVENTS: Final = (Heartbeat, Propose, Vote, Leave, Join)
