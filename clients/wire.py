"""Baton's wire protocol: frames and a sans-IO codec shared by broker and client.

A frame on the wire is a 4-byte big-endian length followed by that many bytes of
msgpack: an array ``[op, field1, field2, ...]``. ``op`` is the frame's op-code from
the table below; the fields follow the frame dataclass's field order. The full
reference with every field is docs/protocol.md.

This module does no I/O (the h11 style): feed bytes in with
:meth:`FrameCodec.receive_data`, take frames out with :meth:`FrameCodec.next_frame`,
and turn frames into bytes with :meth:`FrameCodec.send`. The asyncio sides in
``broker/`` and ``clients/`` are thin loops around it.

Size: every frame class lives here, next to the op-code table and the codec that reads
them, so that the table, the schema checks and the frames cannot drift apart; the module
is long because the protocol has that many frames, not because it does several jobs.
"""

from __future__ import annotations

import struct
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Final, TypeVar, Union, cast, get_args, get_origin, get_type_hints

import msgpack

from batonmq.cluster.errors import FrameTooLarge, ProtocolError, UnknownCommand
from batonmq.cluster.results import RESULT_TYPES, Result

__all__ = [
    "PROTOCOL_VERSION",
    "MIN_PROTOCOL_VERSION",
    "DEFAULT_MAX_FRAME",
    "NEED_DATA",
    "Frame",
    "Hello",
    "HelloOk",
    "Ok",
    "Error",
    "Ping",
    "AuthChallenge",
    "AuthResponse",
    "PutUser",
    "DeleteUser",
    "ListUsers",
    "ListFeatures",
    "EnableFeatures",
    "SetRights",
    "SetUserLimits",
    "SetUserTags",
    "ListPolicies",
    "SetPolicy",
    "ClearPolicy",
    "GrowPartitions",
    "PeerProof",
    "Submit",
    "Submitted",
    "MovePartition",
    "RebalancePartitions",
    "SetReplicas",
    "DeclareQueue",
    "DeleteQueue",
    "PurgeQueue",
    "QueueStats",
    "ListQueues",
    "DeclareExchange",
    "DeleteExchange",
    "Bind",
    "Unbind",
    "BindExchange",
    "UnbindExchange",
    "PublishTo",
    "ListExchanges",
    "Publish",
    "PublishBatch",
    "Subscribe",
    "Deliver",
    "Ack",
    "Release",
    "Reject",
    "Cancel",
    "ConsumerCancelled",
    "Expired",
    "Touch",
    "Topology",
    "Peek",
    "Connections",
    "MessageHistory",
    "UpdateRequest",
    "UpdateState",
    "UpdateQueue",
    "UpdateFront",
    "UpdateDone",
    "ReadRange",
    "Reserve",
    "AcceptThrough",
    "Lead",
    "Resign",
    "LeaderEvent",
    "Services",
    "Handover",
    "LEADER_EVENTS",
    "FRAME_TYPES",
    "FrameCodec",
    "DecodeLimits",
    "MAX_BATCH_MESSAGES",
    "MAX_FRAME_ELEMENTS",
    "decode_payload",
    "frame_elements",
    "ok",
    "result_map",
    "read_result",
]

#: The newest wire protocol version this side speaks. A client's Hello says its newest;
#: the broker answers HelloOk with the version the session speaks, the lower of the two
#: (docs/protocol.md "Versions"), so either side may be the newer one.
PROTOCOL_VERSION: Final = 1
#: The oldest version this side still speaks.
MIN_PROTOCOL_VERSION: Final = 1
#: Default cap on one frame (and on an incomplete frame held in the buffer).
DEFAULT_MAX_FRAME: Final = 16 * 1024 * 1024

#: The most messages one PublishBatch may hold (a broker refuses a longer one while it
#: decodes it; the client splits a batch into frames of at most this many).
MAX_BATCH_MESSAGES: Final = 32_768
#: The most msgpack values (array items, and keys and values of maps) one frame a broker
#: reads may decode to. Decoded, a value costs up to ~72 bytes of memory for its one
#: byte on the wire (an empty array or map): this bound, not the frame's size, is what
#: keeps a hostile frame's decoding to tens of MiB (docs/security.md "Bad input harms no one else").
MAX_FRAME_ELEMENTS: Final = 524_288

_LEN = struct.Struct(">I")


R = TypeVar("R", bound=Result)


class _NeedData:
    """Sentinel type: the buffer does not hold a whole frame yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()

Headers = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Frame:
    """Base of every frame. ``OP`` is the frame's op-code on the wire."""

    OP: ClassVar[int] = 0


# --- session -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello(Frame):
    """C->S, first frame of a connection. Answered by HelloOk or Error, or first by
    AuthChallenge (``auth`` starts a SASL-like exchange: docs/protocol.md,
    "Authentication")."""

    OP: ClassVar[int] = 1
    corr: int
    version: int
    client_name: str
    auth: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HelloOk(Frame):
    """S->C: the broker accepts the session."""

    OP: ClassVar[int] = 2
    corr: int
    version: int
    server: str
    node_id: str
    max_frame: int
    max_message: int
    auth: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AuthChallenge(Frame):
    """S->C: the next step of the authentication ``Hello`` started (``data``: the
    mechanism's message). Answered by AuthResponse."""

    OP: ClassVar[int] = 6
    corr: int
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AuthResponse(Frame):
    """C->S: the client's answer to AuthChallenge. Answered by HelloOk, or Error
    AccessRefused (then the broker closes the connection)."""

    OP: ClassVar[int] = 7
    corr: int
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Ok(Frame):
    """S->C: command ``corr`` completed; ``result`` holds its named results."""

    OP: ClassVar[int] = 3
    corr: int
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Error(Frame):
    """S->C: command ``corr`` failed (corr 0: the connection itself failed)."""

    OP: ClassVar[int] = 4
    corr: int
    code: int
    message: str


@dataclass(frozen=True, slots=True)
class Ping(Frame):
    """C->S: answered by Ok; for liveness checks and latency probes."""

    OP: ClassVar[int] = 5
    corr: int


# --- queues --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeclareQueue(Frame):
    """C->S: create a queue, or check that it exists with these settings.

    ``options`` keys: durable (bool), max_length (int|None), overflow
    ("reject-publish"|"drop-head"), delivery_limit (int), dead_letter (str|None),
    message_ttl_ms (int|None), retry (str|None), retry_delay_ms (int), retry_max_ms (int|None).
    """

    OP: ClassVar[int] = 10
    corr: int
    queue: str
    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeleteQueue(Frame):
    """C->S: delete a queue and every message in it."""

    OP: ClassVar[int] = 11
    corr: int
    queue: str


@dataclass(frozen=True, slots=True)
class PurgeQueue(Frame):
    """C->S: drop every ready message of a queue (acquired ones stay)."""

    OP: ClassVar[int] = 12
    corr: int
    queue: str


@dataclass(frozen=True, slots=True)
class QueueStats(Frame):
    """C->S: answered by Ok with the queue's counters."""

    OP: ClassVar[int] = 13
    corr: int
    queue: str


@dataclass(frozen=True, slots=True)
class ListQueues(Frame):
    """C->S: answered by Ok({"queues": [stats, ...]})."""

    OP: ClassVar[int] = 14
    corr: int


@dataclass(frozen=True, slots=True)
class Locate(Frame):
    """C->S: where ``queue``'s commands go (docs/design.md §16, "Clients route to
    replicas"): Ok({"partition": k, "anywhere": bool, "addresses": [str],
    "groups": bool}). ``anywhere``: send them over this connection (a log of one, no
    replica groups, or this broker is a caught-up replica of the queue's partition); else ``addresses`` are its live caught-up replicas.
    A queue not placed yet (or that the user has no right on) answers partition 0 and
    ``anywhere``. ``groups``: the cluster has replica groups."""

    OP: ClassVar[int] = 125
    corr: int
    queue: str


# --- exchanges (docs/design.md §14) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeclareExchange(Frame):
    """C->S: create an exchange (``type``: direct, fanout, topic, headers), or check that
    it exists with these settings; Ok({"created": bool}). ``options`` keys: durable,
    auto_delete, internal, passive (bools), arguments (map)."""

    OP: ClassVar[int] = 16
    corr: int
    exchange: str
    type: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeleteExchange(Frame):
    """C->S: delete an exchange and its bindings; Ok({"bindings": n})."""

    OP: ClassVar[int] = 17
    corr: int
    exchange: str
    if_unused: bool = False


@dataclass(frozen=True, slots=True)
class Bind(Frame):
    """C->S: bind a queue to an exchange; Ok({"changed": bool})."""

    OP: ClassVar[int] = 18
    corr: int
    queue: str
    exchange: str
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Unbind(Frame):
    """C->S: remove a binding; Ok({"changed": bool})."""

    OP: ClassVar[int] = 19
    corr: int
    queue: str
    exchange: str
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BindExchange(Frame):
    """C->S: bind exchange ``destination`` to exchange ``source`` (what ``source``
    routes by this binding goes on to ``destination``); Ok({"changed": bool}). Needs the
    feature flag ``exchange_bindings``."""

    OP: ClassVar[int] = 24
    corr: int
    destination: str
    source: str
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class UnbindExchange(Frame):
    """C->S: remove an exchange-to-exchange binding; Ok({"changed": bool}). Needs the
    feature flag ``exchange_bindings``."""

    OP: ClassVar[int] = 25
    corr: int
    destination: str
    source: str
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ListExchanges(Frame):
    """C->S: answered by Ok({"exchanges": [...]}), from the state the broker applied."""

    OP: ClassVar[int] = 23
    corr: int


@dataclass(frozen=True, slots=True)
class PublishTo(Frame):
    """C->S: publish one message through an exchange, routed by the broker that reads
    it; Ok({"queues", "positions", "full", "missing"}). ``key`` and ``options`` as for
    Publish."""

    OP: ClassVar[int] = 22
    corr: int
    exchange: str
    routing_key: str
    body: bytes
    headers: dict[str, Any]
    key: str = ""
    options: dict[str, Any] = field(default_factory=dict)


# --- messages ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Publish(Frame):
    """C->S: enqueue one message; Ok({"position": p}) once durable on the log.

    ``key`` is the publish's idempotency key (optional on the wire; "" = none): a
    publish re-sent with a key the cluster already applied to the queue is not
    enqueued again, and its Ok reports the original position. ``options``: the work-queue
    features the message uses (``delay_ms``, ``not_before``; docs/protocol.md).
    """

    OP: ClassVar[int] = 20
    corr: int
    queue: str
    body: bytes
    headers: dict[str, Any]
    key: str = ""
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PublishBatch(Frame):
    """C->S: enqueue messages atomically; Ok({"first_position": p, "count": n}).

    ``messages`` is a list of ``[body, headers]`` pairs; ``key`` the batch's
    idempotency key (optional, as for Publish); ``options`` as for Publish, for every
    message of the batch.
    """

    OP: ClassVar[int] = 21
    corr: int
    queue: str
    messages: list[Any]
    key: str = ""
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Subscribe(Frame):
    """C->S: start a consumer; Ok({"consumer": tag}). ``prefetch`` caps unsettled deliveries.
    ``options``: ``counters: bool`` adds the acquired count to each delivered message;
    ``ack_timeout_ms: int`` sets this consumer's ack timeout (else the queue's)."""

    OP: ClassVar[int] = 30
    corr: int
    queue: str
    prefetch: int
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Deliver(Frame):
    """S->C: messages for consumer ``consumer``.

    ``messages`` is a list of ``[position, delivery_count, body, headers,
    publish_time_ms]``, with ``acquired_count`` as a sixth item for a consumer that
    subscribed with the ``counters`` option.
    """

    OP: ClassVar[int] = 31
    consumer: int
    messages: list[Any]


@dataclass(frozen=True, slots=True)
class Ack(Frame):
    """C->S: accept delivered messages; Ok once the accept is applied."""

    OP: ClassVar[int] = 32
    corr: int
    consumer: int
    positions: list[int]


@dataclass(frozen=True, slots=True)
class Release(Frame):
    """C->S: give delivered messages back to the queue. ``failed``: a failed delivery
    (delivery count + 1, the delivery limit applies); false: "not now" (acquired count
    only). ``delay_ms``: ready again only that much later (by the replicated clock)."""

    OP: ClassVar[int] = 33
    corr: int
    consumer: int
    positions: list[int]
    failed: bool = True
    delay_ms: int = 0


@dataclass(frozen=True, slots=True)
class Reject(Frame):
    """C->S: reject delivered messages (dead-lettered, or dropped without a DLQ)."""

    OP: ClassVar[int] = 34
    corr: int
    consumer: int
    positions: list[int]


@dataclass(frozen=True, slots=True)
class Cancel(Frame):
    """C->S: stop a consumer; its unsettled messages are released.

    ``unread`` lists delivered messages the client never handed to the application
    (still in its buffer): they go back *without* raising their delivery count, as
    AMQP 1.0's "released" outcome. ``received``: messages the client received on this
    subscription; those delivered after them go back without a failure too (-1: not told).
    """

    OP: ClassVar[int] = 35
    corr: int
    consumer: int
    unread: list[int]
    received: int = -1


@dataclass(frozen=True, slots=True)
class ConsumerCancelled(Frame):
    """S->C: the broker ended a consumer (e.g. its queue was deleted)."""

    OP: ClassVar[int] = 36
    consumer: int
    code: int
    message: str


@dataclass(frozen=True, slots=True)
class Expired(Frame):
    """S->C: these messages of consumer ``consumer`` passed its ack timeout unsettled:
    the broker released them as a failed delivery (settling them now fails)."""

    OP: ClassVar[int] = 37
    consumer: int
    positions: list[int]


@dataclass(frozen=True, slots=True)
class Touch(Frame):
    """C->S: the application still works on these delivered messages: their ack
    timeout starts again. Ok({"count": n, "not_acquired": [...]}) at once."""

    OP: ClassVar[int] = 38
    corr: int
    consumer: int
    positions: list[int]


# --- cluster --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Topology(Frame):
    """C->S: answered by Ok with the cluster's view as this broker applied it:
    ``cluster_id``, ``view``, ``changing``, ``leader``, ``instances`` (stable order;
    each with node_id, runtime, role, address, leader, local, properties) and this
    broker's ``applied`` offset and state ``digest``."""

    OP: ClassVar[int] = 40
    corr: int


@dataclass(frozen=True, slots=True)
class Peek(Frame):
    """C->S: answered by Ok({"queue", "messages": [[position, delivery_count, body,
    headers, publish_time_ms], ...]}): the first ``count`` (1..1000) ready messages in
    delivery order, read from this broker's state and store without acquiring them."""

    OP: ClassVar[int] = 15
    corr: int
    queue: str
    count: int


@dataclass(frozen=True, slots=True)
class Connections(Frame):
    """C->S: answered by Ok({"connections": [...]}): this broker's client connections
    and their consumers (docs/admin.md)."""

    OP: ClassVar[int] = 41
    corr: int


@dataclass(frozen=True, slots=True)
class MessageHistory(Frame):
    """C->S: answered by Ok with the life of message (``queue``, ``position``) read from
    the log, at most ``max_records`` records (0: the broker's bound); docs/admin.md."""

    OP: ClassVar[int] = 42
    corr: int
    queue: str
    position: int
    max_records: int = 0


# --- broker to broker: a joining broker's update (docs/design.md §8) -----------------------


@dataclass(frozen=True, slots=True)
class UpdateRequest(Frame):
    """Joiner->member: stream me the state. The member waits until it has applied
    log offset ``since``, captures its state at its next batch boundary, and answers
    with UpdateState, then per queue UpdateQueue, UpdateFront..., UpdateDone, and
    finally Ok (or Error). ``queues``: the names to stream (None: every queue);
    ``state``: whether UpdateState carries the replicated index (a first request)
    or only the capture offset (a retry after the first member died). ``member``
    and ``proof``: the joining runtime and its signature of the member's challenge
    (sent in HelloOk after a Hello with the MEMBER mechanism); a request without a
    valid proof is answered with Error AccessRefused (cluster/member_proof.py)."""

    OP: ClassVar[int] = 80
    corr: int
    since: int
    queues: Any
    state: bool
    member: str = ""
    proof: bytes = b""
    #: The feature flags the joiner's build supports (cluster/features.py); None: it
    #: says none (a build from before them). Sent only to a member whose HelloOk listed
    #: its own, so that older members, which refuse a longer frame, can serve it too.
    features: Any = None
    #: The physical log partition whose state to stream (None or 0: the control
    #: partition, or the only one; docs/design.md §16). Written only when not 0, so that
    #: older members, which refuse a longer frame, can serve the others.
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class UpdateState(Frame):
    """Member->joiner: the capture's log offset ``applied`` and, if asked, the
    replicated state there (``snapshot``: meta, publish keys, queue indexes)."""

    OP: ClassVar[int] = 81
    corr: int
    applied: int
    snapshot: Any


@dataclass(frozen=True, slots=True)
class UpdateQueue(Frame):
    """Member->joiner: the messages of ``queue`` (id ``qid``) follow, ``count`` at most."""

    OP: ClassVar[int] = 82
    corr: int
    queue: str
    qid: int
    count: int


@dataclass(frozen=True, slots=True)
class UpdateFront(Frame):
    """Member->joiner: messages ``[[position, stored message], ...]`` of queue ``qid``,
    back to front (positions descending), in the store's own encoding."""

    OP: ClassVar[int] = 83
    corr: int
    qid: int
    entries: list[Any]


@dataclass(frozen=True, slots=True)
class UpdateDone(Frame):
    """Member->joiner: every message of ``queue`` at the capture has been sent."""

    OP: ClassVar[int] = 84
    corr: int
    queue: str
    qid: int
# --- range readers (the Spark source, docs/design.md §11) ---------------------------------------


@dataclass(frozen=True, slots=True)
class ReadRange(Frame):
    """C->S: the messages still in ``queue`` at positions ``start <= p < end``, read
    without acquiring them, from this broker's store.

    Answered by Ok({"messages": [[position, body, headers, publish_time_ms], ...],
    "next": p}) once this broker has applied the queue up to ``end``; at most
    ``limit`` messages (and about max_frame / 2 bytes): continue from ``next``
    (``next == end`` when the range is done).
    """

    OP: ClassVar[int] = 50
    corr: int
    queue: str
    start: int
    end: int
    limit: int


@dataclass(frozen=True, slots=True)
class Reserve(Frame):
    """C->S: reserve ``queue`` for the range reader ``holder`` ("" ends the reservation).

    Ok({"reserved_by", "acquired", "head", "next_position"}) once applied. With
    ``service`` and ``token`` (a leadership term's fencing token) it is refused with
    StaleToken unless that term is still the service's current one; "" and -1: unfenced.
    """

    OP: ClassVar[int] = 51
    corr: int
    queue: str
    holder: str
    service: str = ""
    token: int = -1


@dataclass(frozen=True, slots=True)
class AcceptThrough(Frame):
    """C->S: the holder of ``queue``'s reservation accepts every ready message below
    ``through`` (cumulative, idempotent). Ok({"count": n, "head": p}) once applied.
    ``service`` and ``token`` fence it as in :class:`Reserve`."""

    OP: ClassVar[int] = 52
    corr: int
    queue: str
    through: int
    holder: str
    service: str = ""
    token: int = -1


# --- service leadership (docs/design.md §7) ------------------------------------------------------

#: The ``event`` values of :class:`LeaderEvent`.
LEADER_EVENTS: Final = ("granted", "lost", "handover")


@dataclass(frozen=True, slots=True)
class Lead(Frame):
    """C->S: this session runs for leader of ``service``.

    Answered once the candidacy is applied: Ok({"service", "candidate", "leader",
    "token"}) with this session's candidate key and the leader then (``leader`` equal
    to ``candidate``: this session leads, with fencing ``token``). Later changes come
    as :class:`LeaderEvent` frames. Idempotent on one session.
    """

    OP: ClassVar[int] = 60
    corr: int
    service: str


@dataclass(frozen=True, slots=True)
class Resign(Frame):
    """C->S: this session stops running for ``service`` (and stops leading it);
    Ok({"was_candidate": bool}) once applied."""

    OP: ClassVar[int] = 61
    corr: int
    service: str


@dataclass(frozen=True, slots=True)
class LeaderEvent(Frame):
    """S->C: leadership news for one of this session's candidacies.

    ``event``: "granted" (this session leads ``service`` now; ``token`` is the
    term's fencing token), "lost" (it no longer leads; ``leader`` is the new leader
    or ""), "handover" (an admin asked it to hand over when its running work is done;
    ``token`` is the current term's).
    """

    OP: ClassVar[int] = 62
    service: str
    event: str
    token: int
    leader: str


@dataclass(frozen=True, slots=True)
class Services(Frame):
    """C->S: answered by Ok({"services": [...]}): each service's leader, token,
    candidates and handover state, as this broker applied them."""

    OP: ClassVar[int] = 63
    corr: int


@dataclass(frozen=True, slots=True)
class Handover(Frame):
    """C->S (admin): ask the leader of ``service`` to hand over when its running work
    is done, to the candidate ``to`` names ("" = the next one).

    Answered when a new term has started: Ok({"service", "leader", "token",
    "previous"}); Error Timeout if none started within ``timeout_ms``.
    """

    OP: ClassVar[int] = 64
    corr: int
    service: str
    to: str
    timeout_ms: int


# --- users and rights (admin; docs/security.md) ------------------------------------------


@dataclass(frozen=True, slots=True)
class PutUser(Frame):
    """C->S (admin): add user ``name`` or give it new credentials and admin flag
    (keeping its rights). ``credentials``: ``{"salt", "cost", "stored_key",
    "server_key"}`` (clients/scram.py), made by the client: the password never
    reaches the broker. Answered by Ok({"changed": bool}), true when the user is new."""

    OP: ClassVar[int] = 90
    corr: int
    name: str
    credentials: dict[str, Any]
    admin: bool


@dataclass(frozen=True, slots=True)
class DeleteUser(Frame):
    """C->S (admin): remove user ``name``. Ok({"changed": bool}): it existed."""

    OP: ClassVar[int] = 91
    corr: int
    name: str


@dataclass(frozen=True, slots=True)
class ListUsers(Frame):
    """C->S (admin): Ok({"users": [{"name", "admin", "configure", "write", "read",
    "lead"}, ...]})."""

    OP: ClassVar[int] = 92
    corr: int


@dataclass(frozen=True, slots=True)
class SetRights(Frame):
    """C->S (admin): set rights of user ``name``: ``{right: pattern}`` for some of
    ``configure``, ``write``, ``read``, ``lead`` (regular expressions that must match a
    whole queue or service name; "" matches nothing). Ok({"changed": true})."""

    OP: ClassVar[int] = 93
    corr: int
    name: str
    rights: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ListFeatures(Frame):
    """C->S: the feature flags (cluster/features.py), Ok({"features": [{"name", "state",
    "format", "since", "doc", "supported_by", "unsupported_by"}, ...], "format": n})."""

    OP: ClassVar[int] = 94
    corr: int


@dataclass(frozen=True, slots=True)
class EnableFeatures(Frame):
    """C->S (admin): enable these feature flags (``names``: a list; None: every flag the
    broker's build knows). Refused while a live member does not support one.
    Ok({"enabled": [names newly enabled], "format": n})."""

    OP: ClassVar[int] = 95
    corr: int
    names: Any = None


@dataclass(frozen=True, slots=True)
class SetUserLimits(Frame):
    """C->S (admin): set limits of user ``name`` (``""``: the cluster's default for
    non-admin users): ``{limit: value}`` for some of ``max_queues``,
    ``max_connections``, ``max_consumers``; -1: no limit; nil: the default again. Needs
    the feature flag ``user_limits``. Ok({"changed": true})."""

    OP: ClassVar[int] = 96
    corr: int
    name: str
    limits: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SetUserTags(Frame):
    """C->S (admin): set the tags of user ``name``, all of them (``monitoring``: the
    admin listener's /metrics and read-only statistics). Needs the feature flag
    ``user_limits``. Ok({"changed": true})."""

    OP: ClassVar[int] = 97
    corr: int
    name: str
    tags: list[Any]


@dataclass(frozen=True, slots=True)
class ListPolicies(Frame):
    """C->S: the cluster's policies, Ok({"policies": [{"name", "pattern", "apply_to",
    "definition", "priority"}, ...]}) (docs/operations.md "Policies")."""

    OP: ClassVar[int] = 110
    corr: int


@dataclass(frozen=True, slots=True)
class SetPolicy(Frame):
    """C->S (admin): add or replace policy ``name``: queues whose names match
    ``pattern`` take ``definition``'s settings ({key: value}); ``apply_to`` "queues"
    (or "all"); the highest ``priority`` applies. Needs the feature flag ``policies``.
    Ok({"changed": new?, "queues": n})."""

    OP: ClassVar[int] = 111
    corr: int
    name: str
    pattern: str
    apply_to: str
    definition: dict[str, Any]
    priority: int


@dataclass(frozen=True, slots=True)
class ClearPolicy(Frame):
    """C->S (admin): remove policy ``name``. Needs the feature flag ``policies``.
    Ok({"changed": existed?, "queues": n})."""

    OP: ClassVar[int] = 112
    corr: int
    name: str


@dataclass(frozen=True, slots=True)
class GrowPartitions(Frame):
    """C->S (admin): grow the cluster to ``count`` data partitions (more than it has; as
    many: nothing changes; fewer: refused). Needs a cluster of several partitions and
    the feature flag ``partitions`` (docs/operations.md "Growing N").
    Ok({"count": n, "before": n, "started": [partitions this broker applies already]})."""

    OP: ClassVar[int] = 120
    corr: int
    count: int


# --- broker to broker: forwarding to a partition's replicas (docs/design.md §16) -----------


@dataclass(frozen=True, slots=True)
class PeerProof(Frame):
    """Broker->broker, first on a peer link (after a Hello with the MEMBER mechanism):
    ``member`` (this runtime, as in the Hello) proves its key by ``proof``, its signature
    of the challenge in HelloOk (cluster/member_proof.py, context ``baton-peer``).
    Answered by Ok, or Error AccessRefused: the serving broker accepts only a member of
    control's view whose proof verifies against the key its Join recorded."""

    OP: ClassVar[int] = 130
    corr: int
    member: str
    proof: bytes


@dataclass(frozen=True, slots=True)
class Submit(Frame):
    """Broker->broker, on a proven peer link: append ``event`` (one log event, in the
    log's record codec, cluster/codec.py) to data ``partition``, which the serving broker
    replicates, as its own. Answered by Submitted, or Error (NotReplica: the serving
    broker does not replicate ``partition``; any error of the command itself)."""

    OP: ClassVar[int] = 131
    corr: int
    partition: int
    event: bytes


@dataclass(frozen=True, slots=True)
class Submitted(Frame):
    """Broker->broker: the Submit ``corr`` was applied; ``result`` is what applying it
    answered, ``[result type name, its Ok map]`` or nil (broker/peers.py)."""

    OP: ClassVar[int] = 132
    corr: int
    result: Any


# Replica groups' operator commands (docs/operations.md "Replica groups"): op-codes from
# 150, each needing a split cluster with the feature flag replica_groups.


@dataclass(frozen=True, slots=True)
class MovePartition(Frame):
    """C->S (admin): move data partition ``partition``'s replica from broker ``source``
    to broker ``target`` (node ids): ``target`` joins and catches up, then ``source``
    leaves and deletes its copy. Ok({"partition", "replicas", "joining", "leaving"})."""

    OP: ClassVar[int] = 150
    corr: int
    partition: int
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class RebalancePartitions(Frame):
    """C->S (admin): the moves that even out the partitions per live broker, appended
    unless ``dry_run``. Ok({"moves": [{"partition", "to", "from"}], "applied": bool})."""

    OP: ClassVar[int] = 151
    corr: int
    dry_run: bool


@dataclass(frozen=True, slots=True)
class SetReplicas(Frame):
    """C->S (admin): each data partition's group is to have ``replicas`` brokers (the
    control leader's planner adds or trims). Ok({"replicas": n, "before": n})."""

    OP: ClassVar[int] = 152
    corr: int
    replicas: int


FRAME_TYPES: Final[dict[int, type[Frame]]] = {
    cls.OP: cls
    for cls in (
        Hello,
        HelloOk,
        AuthChallenge,
        AuthResponse,
        Ok,
        Error,
        Ping,
        DeclareQueue,
        DeleteQueue,
        PurgeQueue,
        QueueStats,
        ListQueues,
        DeclareExchange,
        DeleteExchange,
        Bind,
        Unbind,
        BindExchange,
        UnbindExchange,
        PublishTo,
        ListExchanges,
        Publish,
        PublishBatch,
        Subscribe,
        Deliver,
        Ack,
        Release,
        Reject,
        Cancel,
        ConsumerCancelled,
        Expired,
        Touch,
        Topology,
        Peek,
        Connections,
        MessageHistory,
        UpdateRequest,
        UpdateState,
        UpdateQueue,
        UpdateFront,
        UpdateDone,
        ReadRange,
        Reserve,
        AcceptThrough,
        Lead,
        Resign,
        LeaderEvent,
        Services,
        Handover,
        PutUser,
        DeleteUser,
        ListUsers,
        SetRights,
        ListFeatures,
        EnableFeatures,
        SetUserLimits,
        SetUserTags,
        ListPolicies,
        SetPolicy,
        ClearPolicy,
        GrowPartitions,
        Locate,
        PeerProof,
        Submit,
        Submitted,
        MovePartition,
        RebalancePartitions,
        SetReplicas,
    )
}


def _runtime_type(hint: Any) -> Union[type, tuple[type, ...]]:
    origin = getattr(hint, "__origin__", None)
    if origin is not None:
        return cast(type, origin)  # dict[str, Any] -> dict, list[int] -> list
    return cast(type, hint)


# Field names and the runtime type each must have, per op-code; read once from the
# dataclass definitions above so the table cannot drift from them.
_SCHEMA: Final[dict[int, tuple[tuple[str, Any], ...]]] = {
    op: tuple(
        (f.name, _runtime_type(get_type_hints(cls)[f.name])) for f in fields(cls)
    )
    for op, cls in FRAME_TYPES.items()
}
# How many leading fields a frame must have: trailing fields with a default were
# added later and may be left out (an older peer's frame still decodes).
_REQUIRED: Final[dict[int, int]] = {
    op: sum(1 for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)
    for op, cls in FRAME_TYPES.items()
}


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Bounds that hold *while* a frame is decoded (the broker's side; a client trusts
    its broker and decodes without them).

    msgpack's decoder checks every array's and map's announced length before it
    allocates it, and hooks count the values decoded so far, so a frame that would
    decode to more is refused part-way, at a cost bounded by these numbers, never by
    what the frame claims (docs/security.md "Bad input harms no one else").

    Attributes:
        max_array: longest array in a frame, unless the frame's op allows more.
        max_map: most entries of one map (headers, options, arguments...).
        max_batch: most messages of one PublishBatch.
        max_positions: longest list of positions (Ack, Release, Reject, Touch, Cancel).
        max_elements: most values one frame decodes to, in all.
    """

    max_array: int = 65_536
    max_map: int = 65_536
    max_batch: int = MAX_BATCH_MESSAGES
    max_positions: int = 100_000
    max_elements: int = MAX_FRAME_ELEMENTS

    @classmethod
    def for_broker(cls, max_headers: int, max_positions: int) -> DecodeLimits:
        """The limits of a broker with these settings.

        Args:
            max_headers: ``max_message_headers``: an array or map inside headers has at
                most one value per byte of them (and a command's maps are smaller).
            max_positions: the most unsettled messages a connection may hold
                (``max_connection_prefetch``): a settle names no more.
        """
        wide = max(max_headers, 4096)
        return cls(max_array=wide, max_map=wide, max_positions=max(max_positions, 1))


#: Frames whose list of positions may be as long as a connection's unsettled messages.
_POSITION_OPS: Final = frozenset({32, 33, 34, 35, 38})  # Ack Release Reject Cancel Touch
#: Frames that carry lists of names (a join's queues, feature flags): bounded by
#: ``max_elements`` only.
_NAME_LIST_OPS: Final = frozenset({80, 95})  # UpdateRequest EnableFeatures
_PUBLISH_BATCH_OP: Final = 21


def _peek_op(payload: bytes | memoryview) -> int | None:
    """The op-code of a frame's payload, read from its first bytes without decoding
    the rest (None: not an array that starts with a small int)."""
    if not payload:
        return None
    first = payload[0]
    if 0x90 <= first <= 0x9F:
        at = 1
    elif first == 0xDC:
        at = 3
    elif first == 0xDD:
        at = 5
    else:
        return None
    if len(payload) <= at:
        return None
    op = payload[at]
    if op < 0x80:
        return int(op)
    if op == 0xCC and len(payload) > at + 1:
        return int(payload[at + 1])
    return None


class FrameCodec:
    """Sans-IO framing: bytes in, frames out; frames in, bytes out.

    Args:
        max_frame: the largest frame accepted or sent. A length prefix above it
            raises FrameTooLarge at once, so an incomplete frame never holds more
            than ``max_frame`` bytes of buffer.
        limits: bounds that hold while a frame is decoded (the broker's side);
            None: none beyond ``max_frame`` (a client reading its broker).
    """

    __slots__ = ("_buf", "_max_frame", "_packer", "_limits")

    #: A payload at least this large, and most of the buffer, is handed out without a
    #: copy by :meth:`next_payload`: the buffer holding it is given up, a new one kept.
    _DETACH_AT: ClassVar[int] = 64 * 1024

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME, limits: DecodeLimits | None = None) -> None:
        self._buf = bytearray()
        self._max_frame = max_frame
        self._packer = msgpack.Packer(use_bin_type=True)
        self._limits = limits

    @property
    def max_frame(self) -> int:
        return self._max_frame

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf)

    def receive_data(self, data: bytes) -> None:
        """Add bytes read from the transport."""
        self._buf += data

    def next_length(self) -> int | None:
        """The payload length the next frame announces (None: not 4 bytes yet)."""
        if len(self._buf) < 4:
            return None
        (length,) = _LEN.unpack_from(self._buf, 0)
        return int(length)

    def next_frame(self) -> Frame | _NeedData:
        """Return the next complete frame, or NEED_DATA.

        Raises:
            FrameTooLarge: the next frame's length is above ``max_frame``.
            UnknownCommand: the op-code is not in the table.
            ProtocolError: the payload is not a well-formed frame, or breaks the
                codec's decode limits.
        """
        buf = self._buf
        length = self._complete()
        if length is None:
            return NEED_DATA
        end = 4 + length
        payload = memoryview(buf)[4:end]  # decoded in place: no copy
        try:
            return decode_payload(payload, self._limits)
        finally:
            payload.release()  # the buffer cannot be resized while a view exists
            del buf[:end]

    def _complete(self) -> int | None:
        """The length of the next frame's payload once the buffer holds all of it.

        Raises:
            FrameTooLarge: the next frame's length is above ``max_frame``.
        """
        length = self.next_length()
        if length is None:
            return None
        if length > self._max_frame:
            raise FrameTooLarge(
                f"frame of {length} bytes is above the maximum of {self._max_frame}"
            )
        return length if len(self._buf) >= 4 + length else None

    def next_payload(self) -> bytes | memoryview | _NeedData:
        """Take the next complete frame's payload out of the buffer, undecoded (to be
        decoded with :meth:`decode`, e.g. on another thread), or NEED_DATA.

        Raises:
            FrameTooLarge: the next frame's length is above ``max_frame``.
        """
        buf = self._buf
        length = self._complete()
        if length is None:
            return NEED_DATA
        end = 4 + length
        if length >= self._DETACH_AT and len(buf) - end <= length:
            # A large frame that is most of the buffer is not copied: the buffer goes
            # with it and what follows it is copied into a new one (never more than
            # the frame itself, so that many large frames read at once cost linear time).
            self._buf = buf[end:]
            return memoryview(buf)[4:end]
        payload = bytes(buf[4:end])
        del buf[:end]
        return payload

    def decode(self, payload: bytes | memoryview) -> Frame:
        """Decode a payload :meth:`next_payload` returned, within the codec's limits.
        Pure: safe to call on another thread.

        Raises:
            UnknownCommand: the op-code is not in the table.
            ProtocolError: the payload is not a well-formed frame, or breaks the limits.
        """
        return decode_payload(payload, self._limits)

    def send(self, frame: Frame) -> bytes:
        """Encode one frame to bytes (length prefix included).

        Raises:
            FrameTooLarge: the encoded frame is above ``max_frame``.
        """
        payload = self._packer.pack(encode_fields(frame))
        if len(payload) > self._max_frame:
            raise FrameTooLarge(
                f"frame of {len(payload)} bytes is above the maximum of {self._max_frame}"
            )
        return _LEN.pack(len(payload)) + payload


def encode_fields(frame: Frame) -> list[Any]:
    """The msgpack array for a frame: ``[op, *fields]``.

    Trailing fields that are None (every such field defaults to None: fields added in a
    later version) are left out, so that a peer of an older version, which refuses a
    frame longer than it knows, reads the frame (docs/protocol.md "Versions").
    """
    out: list[Any] = [frame.OP]
    name: str
    for name in frame.__slots__:  # slots of a slotted dataclass are its fields, in order
        out.append(getattr(frame, name))
    while out[-1] is None and len(out) > _REQUIRED[frame.OP] + 1:
        out.pop()
    return out


def decode_payload(payload: bytes | memoryview, limits: DecodeLimits | None = None) -> Frame:
    """Decode one frame's msgpack payload (without the length prefix).

    Args:
        limits: bounds that hold while decoding (None: none but the payload's size).

    Raises:
        UnknownCommand: the op-code is not in the table.
        ProtocolError: anything else malformed, or above ``limits``.
    """
    if limits is None:
        try:
            items = msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True)
        except Exception as exc:  # msgpack raises several unrelated types
            raise ProtocolError(f"frame is not valid msgpack: {exc}") from exc
    else:
        items = _bounded_unpack(payload, limits)
    if not isinstance(items, list) or not items or type(items[0]) is not int:
        raise ProtocolError("frame must be a msgpack array starting with an op-code")
    op = items[0]
    schema = _SCHEMA.get(op)
    if schema is None:
        raise UnknownCommand(f"unknown op-code {op}")
    values = items[1:]
    if not _REQUIRED[op] <= len(values) <= len(schema):
        raise ProtocolError(
            f"{FRAME_TYPES[op].__name__} needs {len(schema)} fields, got {len(values)}"
        )
    for (name, typ), value in zip(schema, values):
        if typ is Any:
            continue
        if typ is int and isinstance(value, bool):
            raise ProtocolError(f"{FRAME_TYPES[op].__name__}.{name} must be int")
        if not isinstance(value, typ):
            raise ProtocolError(
                f"{FRAME_TYPES[op].__name__}.{name} must be {getattr(typ, '__name__', typ)},"
                f" got {type(value).__name__}"
            )
    if (
        limits is not None
        and op == _PUBLISH_BATCH_OP
        and len(values) > 2
        and len(values[2]) > limits.max_batch
    ):
        raise ProtocolError(
            f"PublishBatch of {len(values[2])} messages is above the maximum of"
            f" {limits.max_batch}"
        )
    return FRAME_TYPES[op](*values)


class _TooMany(ValueError):
    """A frame decodes to more values than its limit (raised from a decode hook)."""


def _bounded_unpack(payload: bytes | memoryview, limits: DecodeLimits) -> Any:
    """msgpack-decode ``payload`` so that no array, map or total count of values can
    exceed ``limits``: msgpack refuses an array or map whose announced length is above
    its cap *before* it allocates it, and the hooks count what was decoded so far."""
    op = _peek_op(payload)
    max_array = limits.max_array
    if op == _PUBLISH_BATCH_OP:
        max_array = max(max_array, limits.max_batch)
    elif op in _POSITION_OPS:
        max_array = max(max_array, limits.max_positions)
    elif op in _NAME_LIST_OPS:
        max_array = max(max_array, limits.max_elements)
    max_array = min(max_array, limits.max_elements)
    left = limits.max_elements

    def on_list(value: list[Any]) -> list[Any]:
        nonlocal left
        left -= len(value)
        if left < 0:
            raise _TooMany(f"more than {limits.max_elements} values")
        return value

    def on_map(value: dict[str, Any]) -> dict[str, Any]:
        nonlocal left
        left -= 2 * len(value)
        if left < 0:
            raise _TooMany(f"more than {limits.max_elements} values")
        return value

    name = FRAME_TYPES[op].__name__ if op in FRAME_TYPES else "frame"
    try:
        return msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            use_list=True,
            list_hook=on_list,
            object_hook=on_map,
            max_array_len=max_array,
            max_map_len=min(limits.max_map, limits.max_elements // 2),
        )
    except _TooMany as exc:
        raise ProtocolError(f"{name} frame decodes to {exc}: refused") from exc
    except ValueError as exc:
        if "exceeds max_" in str(exc):
            raise ProtocolError(f"{name} frame is above the decoding limits: {exc}") from exc
        raise ProtocolError(f"frame is not valid msgpack: {exc}") from exc
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"frame is not valid msgpack: {exc}") from exc


def frame_elements(value: Any) -> int:
    """How many values ``value`` adds to a frame's count (:data:`MAX_FRAME_ELEMENTS`):
    the items of its arrays, and the keys and values of its maps, all the way down."""
    count = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            count += 2 * len(v)
            stack.extend(x for x in v.values() if isinstance(x, (dict, list, tuple)))
        elif isinstance(v, (list, tuple)):
            count += len(v)
            stack.extend(x for x in v if isinstance(x, (dict, list, tuple)))
    return count


# --- command results in Ok frames (cluster/results.py) -------------------------------

#: Tells whether a value read off the wire has a field's type.
_Check = Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return type(value) is int  # msgpack decodes ints as int exactly (and bool is no int here)


def _check(hint: Any) -> _Check:
    """The check for a result field's type (a msgpack value: no sets, no tuples)."""
    if hint is Any:
        return lambda value: True
    if hint is int:
        return _is_int
    if hint is type(None):
        return lambda value: value is None
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        parts = tuple(_check(arg) for arg in get_args(hint))
        return lambda value: any(part(value) for part in parts)
    if origin is list:
        (item,) = get_args(hint)
        each = _check(item)
        return lambda value: isinstance(value, list) and all(each(v) for v in value)
    if origin is dict:
        return lambda value: isinstance(value, dict)  # a map's contents are its reader's
    if isinstance(hint, type):
        return lambda value: isinstance(value, hint)
    raise TypeError(f"no wire check for a result field of type {hint!r}")


# Per result class: (field, its check, its type as written, left out while None), in
# field order; read once from the dataclass definitions so it cannot drift from them.
_RESULT_SCHEMA: Final[dict[type[Result], tuple[tuple[str, _Check, str, bool], ...]]] = {
    cls: tuple(
        (
            f.name,
            _check(get_type_hints(cls)[f.name]),
            str(f.type),
            f.default is None,
        )
        for f in fields(cls)
    )
    for cls in RESULT_TYPES
}


def result_map(result: Result) -> dict[str, Any]:
    """The map form of ``result`` that an ``Ok`` frame carries: field name -> value,
    without the fields whose default is None while they are None."""
    out: dict[str, Any] = {}
    for name, _, _, optional in _RESULT_SCHEMA[type(result)]:
        value = getattr(result, name)
        if value is not None or not optional:
            out[name] = value
    return out


def ok(corr: int, result: Result) -> Ok:
    """The ``Ok`` frame answering command ``corr`` with ``result``."""
    return Ok(corr, result_map(result))


def read_result(kind: type[R], result: Mapping[str, Any]) -> R:
    """Read an ``Ok`` frame's result map as a ``kind`` (the inverse of :func:`result_map`).

    Raises:
        ProtocolError: a field is missing or has the wrong type.
    """
    # On the path of every confirmed publish and settle: one lookup per field.
    values: list[Any] = []
    for name, check, typename, optional in _RESULT_SCHEMA[kind]:
        value = result.get(name, _ABSENT)
        if value is _ABSENT:
            if not optional:
                raise ProtocolError(
                    f"the broker's {kind.__name__} result has no {name!r}: {_short(result)}"
                )
            value = None
        elif not check(value):
            raise ProtocolError(
                f"the broker's {kind.__name__} result has {name!r} of type"
                f" {type(value).__name__}, not {typename}: {_short(result)}"
            )
        values.append(value)
    return kind(*values)


#: A field not in a result map (None is a value a field may have).
_ABSENT: Final = object()


def _short(result: Mapping[str, Any]) -> str:
    text = repr(result)
    return text if len(text) <= 200 else text[:200] + "..."
