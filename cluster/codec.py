"""The msgpack codec for log records (docs/events.md "Records").

A record is ``[node, runtime, seq, ts, op, *fields]`` in format 1 (no version mark:
what builds before feature flags write), and ``[format, node, runtime, seq, ts, op,
*fields]`` from format 2 on (cluster/features.py): the cluster's format decides which
an :class:`EventEncoder` writes (heartbeats excepted: always format 1), and
:func:`decode` reads both.

Decoding validates shapes and types, so a malformed record (a bug, a foreign
writer, a bit flip past the CRC) becomes :class:`MalformedEvent`, which the
applier counts and skips — the same way on every replica. A well-formed record of a
format above this build's, or of an op-code this build does not know, is
:class:`UnreadableRecord` instead: a newer build wrote it, and the applier stops
there, loudly, rather than skip what its peers apply.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, Final

import msgpack

from batonmq.cluster.errors import BatonError
from batonmq.cluster.events import (
    EVENT_TYPES,
    Accept,
    AnyEvent,
    AssignReplicas,
    EnableFeatures,
    Enqueue,
    FanOut,
    RouteDeadLetter,
    ForwardIn,
    Heartbeat,
    Origin,
    PlaceQueues,
    Propose,
    Reject,
    Release,
    ReleaseAll,
    DeclareQueue,
    RoutedEnqueue,
    SetRights,
    SetUserLimits,
    SetUserTags,
    SetPolicy,
)

from batonmq.cluster.features import MAX_FORMAT, VERSION

__all__ = ["MalformedEvent", "UnreadableRecord", "encode", "decode", "EventEncoder"]


class MalformedEvent(BatonError):
    """A log record is not a well-formed event. ``origin``: who wrote it, when its
    envelope could be read (only its fields are bad)."""

    code = 1
    origin: "Origin | None" = None


class UnreadableRecord(BatonError):
    """A well-formed log record that this build cannot read: a format above
    :data:`~batonmq.cluster.features.MAX_FORMAT` or an unknown op-code (a newer build
    wrote it). Never skipped: the applier stops there."""

    code = 1


_FIELDS: Final[dict[int, tuple[str, ...]]] = {
    op: tuple(f.name for f in fields(cls)) for op, cls in EVENT_TYPES.items()
}
# Fields without a default must be present; trailing fields with one were added
# later and may be missing from a record an older broker wrote.
_REQUIRED: Final[dict[int, int]] = {
    op: sum(1 for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)
    for op, cls in EVENT_TYPES.items()
}
_POSITION_EVENTS: Final = (Accept.OP, Release.OP, Reject.OP)
_HEARTBEAT: Final = Heartbeat.OP
_DECLARE: Final = DeclareQueue.OP
_ENQUEUES: Final = (Enqueue.OP, RoutedEnqueue.OP)
#: Where the ttls field (flag message_ttl) is, in each event that has it last: an
#: Enqueue, a RoutedEnqueue, and a FanOut and ForwardIn that carry a RoutedEnqueue on.
_TTLS_AT: Final = {
    op: _FIELDS[op].index("ttls") for op in (*_ENQUEUES, FanOut.OP, ForwardIn.OP)
}


class EventEncoder:
    """Encodes events with one reused msgpack Packer (cheaper than packb per call)."""

    __slots__ = ("_packer", "format")

    def __init__(self, format: int = 1) -> None:
        self._packer = msgpack.Packer(use_bin_type=True)
        #: The format records are written in: the cluster's (cluster/features.py); 1
        #: writes no version mark, so that builds before feature flags read them.
        self.format = format

    def encode(self, origin: Origin, event: AnyEvent) -> bytes:
        items: list[Any] = [origin.node, origin.runtime, origin.seq, origin.ts, event.OP]
        # Heartbeats stay in format 1 in every format: they are how a broker of any build
        # sees who is alive, so that one of an older build started on the log finds the
        # live members (and asks them, and is refused naming the flags it lacks) instead
        # of taking itself for the only live broker and forming a cluster of its own.
        if self.format > 1 and event.OP != _HEARTBEAT:
            items.insert(0, self.format)
        name: str
        for name in event.__slots__:  # a slotted dataclass's slots are its fields
            items.append(getattr(event, name))
        if event.OP == _DECLARE:
            # DeclareQueue.expires_ms (flag queue_expiry), then DeclareQueue.user (flag
            # user_limits), are left out while not set, so that the record is the one
            # builds before them write and read (docs/design.md §15).
            if items[-1] is None:
                items.pop()
                if items[-1] is None:
                    items.pop()
        elif event.OP in _TTLS_AT and not items[-1]:
            # The messages' own TTLs (flag message_ttl), left out while none has one.
            items.pop()
        return self._packer.pack(items)


_default_encoder = EventEncoder()


def encode(origin: Origin, event: AnyEvent) -> bytes:
    """Encode one event with its envelope."""
    return _default_encoder.encode(origin, event)


def decode(record: bytes) -> tuple[Origin, AnyEvent]:
    """Decode one log record.

    Raises:
        MalformedEvent: not msgpack, wrong arity or field types.
        UnreadableRecord: a format or an op-code this build does not know.
    """
    try:
        items = msgpack.unpackb(record, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise MalformedEvent(f"record is not msgpack: {exc}") from exc
    if not isinstance(items, list) or len(items) < 5:
        raise MalformedEvent("record is not an event array")
    if type(items[0]) is int:  # format 2 on: the version mark first
        fmt = items[0]
        if fmt > MAX_FORMAT:
            raise UnreadableRecord(
                f"record of format {fmt}; this build (Baton {VERSION}) reads formats up to"
                f" {MAX_FORMAT}"
            )
        if fmt < 2 or len(items) < 6:
            raise MalformedEvent(f"bad record format mark {fmt}")
        del items[0]
    node, runtime, seq, ts, op = items[:5]
    if not (
        isinstance(node, str)
        and isinstance(runtime, str)
        and type(seq) is int
        and type(ts) is int
        and type(op) is int
    ):
        raise MalformedEvent("bad event envelope")
    try:
        event = _event(op, items[5:])
    except MalformedEvent as exc:
        exc.origin = Origin(node, runtime, seq, ts)
        raise
    return Origin(node, runtime, seq, ts), event


def _event(op: int, values: list[Any]) -> AnyEvent:
    """The event of op-code ``op`` from its fields, checked (see :func:`decode`)."""
    names = _FIELDS.get(op)
    if names is None:
        raise UnreadableRecord(
            f"event op-code {op} is unknown to this build (Baton {VERSION}): a newer build"
            " wrote it"
        )
    if not _REQUIRED[op] <= len(values) <= len(names):
        raise MalformedEvent(
            f"{EVENT_TYPES[op].__name__} needs {_REQUIRED[op]} to {len(names)} fields"
        )
    if op == Enqueue.OP:
        values[1] = _messages(values[1])
        if len(values) >= 3:
            values[2] = _keys(values[2], len(values[1]))
        if len(values) > _TTLS_AT[op]:
            values[-1] = _ttls(values[-1], len(values[1]))
    elif op == RoutedEnqueue.OP:
        if not isinstance(values[0], list) or not values[0] or not all(
            isinstance(q, str) for q in values[0]
        ):
            raise MalformedEvent("RoutedEnqueue.queues must be a non-empty list of strings")
        values[0] = tuple(values[0])
        values[1] = _messages(values[1])
        if len(values) >= 3:
            values[2] = _keys(values[2], len(values[1]))
        if len(values) > _TTLS_AT[op]:
            values[-1] = _ttls(values[-1], len(values[1]))
    elif (op in _POSITION_EVENTS or op == ReleaseAll.OP) and len(values) > 2:
        values[2] = _positions(values[2])
        if len(values) > 3:
            if op == ReleaseAll.OP:
                if values[3] is not None:
                    values[3] = _positions(values[3])
            elif op == Release.OP and type(values[3]) is not bool:
                raise MalformedEvent("Release.failed must be a bool")
    elif op == SetRights.OP and len(values) > 1:
        raw = values[1]
        if not isinstance(raw, list) or not all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r)
            for r in raw
        ):
            raise MalformedEvent("SetRights.rights must be [[right, pattern], ...]")
        values[1] = tuple((r[0], r[1]) for r in raw)
    elif op == SetUserLimits.OP:
        raw = values[1]
        if not isinstance(raw, list) or not all(
            isinstance(r, list) and len(r) == 2 and isinstance(r[0], str)
            and (r[1] is None or type(r[1]) is int)
            for r in raw
        ):
            raise MalformedEvent("SetUserLimits.limits must be [[limit, int or nil], ...]")
        values[1] = tuple((r[0], r[1]) for r in raw)
    elif op == SetUserTags.OP:
        if not isinstance(values[1], list) or not all(isinstance(t, str) for t in values[1]):
            raise MalformedEvent("SetUserTags.tags must be a list of strings")
        values[1] = tuple(values[1])
    elif op == SetPolicy.OP:
        raw = values[3]
        if not isinstance(raw, list) or not all(
            isinstance(r, list) and len(r) == 2 and isinstance(r[0], str) for r in raw
        ):
            raise MalformedEvent("SetPolicy.definition must be [[key, value], ...]")
        values[3] = tuple((r[0], r[1]) for r in raw)
    elif op == EnableFeatures.OP:
        if not isinstance(values[0], list) or not all(isinstance(n, str) for n in values[0]):
            raise MalformedEvent("EnableFeatures.names must be a list of strings")
        values[0] = tuple(values[0])
    elif op == AssignReplicas.OP:
        if not isinstance(values[1], list) or not all(isinstance(n, str) for n in values[1]):
            raise MalformedEvent("AssignReplicas.nodes must be a list of strings")
        values[1] = tuple(values[1])
    elif op in (FanOut.OP, ForwardIn.OP):
        q = 0 if op == FanOut.OP else 2  # the queues' field
        if not isinstance(values[q], list) or not all(isinstance(x, str) for x in values[q]):
            raise MalformedEvent(f"{EVENT_TYPES[op].__name__}.queues must be a list of strings")
        values[q] = tuple(values[q])
        values[q + 1] = _messages(values[q + 1])
        if len(values) > q + 2:
            values[q + 2] = _keys(values[q + 2], len(values[q + 1]))
        if op == FanOut.OP and len(values) > 8:
            raw = values[8]
            if not isinstance(raw, list) or not all(
                isinstance(g, list) and len(g) == 2 and type(g[0]) is int
                and isinstance(g[1], list) and all(isinstance(x, str) for x in g[1])
                for g in raw
            ):
                raise MalformedEvent("FanOut.forward must be [[partition, [queue, ...]], ...]")
            values[8] = tuple((g[0], tuple(g[1])) for g in raw)
        if len(values) > _TTLS_AT[op]:
            values[-1] = _ttls(values[-1], len(values[q + 1]))
    elif op == RouteDeadLetter.OP:
        if len(values) > 1:
            if not isinstance(values[1], list) or not all(isinstance(x, str) for x in values[1]):
                raise MalformedEvent("RouteDeadLetter.local must be a list of strings")
            values[1] = tuple(values[1])
        if len(values) > 2:
            raw = values[2]
            if not isinstance(raw, list) or not all(
                isinstance(g, list) and len(g) == 2 and type(g[0]) is int
                and isinstance(g[1], list) and all(isinstance(x, str) for x in g[1])
                for g in raw
            ):
                raise MalformedEvent(
                    "RouteDeadLetter.forward must be [[partition, [queue, ...]], ...]"
                )
            values[2] = tuple((g[0], tuple(g[1])) for g in raw)
    elif op == PlaceQueues.OP:
        if not isinstance(values[0], list) or not all(isinstance(q, str) for q in values[0]):
            raise MalformedEvent("PlaceQueues.queues must be a list of strings")
        values[0] = tuple(values[0])
    elif op == Propose.OP:
        if not isinstance(values[1], list) or not all(isinstance(m, str) for m in values[1]):
            raise MalformedEvent("Propose.members must be a list of strings")
        values[1] = tuple(values[1])
    try:
        event = EVENT_TYPES[op](*values)
    except TypeError as exc:
        raise MalformedEvent(str(exc)) from exc
    _check_scalars(event)
    return event


def _messages(raw: Any) -> tuple[tuple[bytes, dict[str, Any]], ...]:
    if not isinstance(raw, list) or not raw:
        raise MalformedEvent("enqueue needs a non-empty list of messages")
    out = []
    for m in raw:
        if (
            not isinstance(m, list)
            or len(m) != 2
            or not isinstance(m[0], bytes)
            or not isinstance(m[1], dict)
        ):
            raise MalformedEvent("enqueue message must be [body: bin, headers: map]")
        out.append((m[0], m[1]))
    return tuple(out)


def _keys(raw: Any, n: int) -> tuple[tuple[str, int], ...]:
    """Idempotency key spans: ``[[key: str, count: int > 0], ...]`` covering all
    ``n`` messages, or empty."""
    if not isinstance(raw, list):
        raise MalformedEvent("enqueue keys must be a list")
    out = []
    total = 0
    for span in raw:
        if (
            not isinstance(span, list)
            or len(span) != 2
            or not isinstance(span[0], str)
            or type(span[1]) is not int
            or span[1] < 1
        ):
            raise MalformedEvent("enqueue key span must be [key: str, count: int > 0]")
        total += span[1]
        out.append((span[0], span[1]))
    if out and total != n:
        raise MalformedEvent(f"enqueue key spans cover {total} messages, not {n}")
    return tuple(out)


def _ttls(raw: Any, n: int) -> tuple[int | None, ...]:
    """The messages' own TTLs (flag message_ttl): ``[ms: int >= 0 or None, ...]``, one
    per message, or empty."""
    if not isinstance(raw, list) or (raw and len(raw) != n) or not all(
        t is None or (type(t) is int and t >= 0) for t in raw
    ):
        raise MalformedEvent(f"ttls must be a list of {n} non-negative ints or nulls, or empty")
    return tuple(raw)


def _positions(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(type(p) is int and p >= 0 for p in raw):
        raise MalformedEvent("positions must be a list of non-negative ints")
    return tuple(raw)


_SCALAR_CHECKS: Final[dict[str, tuple[type, ...]]] = {
    "queue": (str,),
    "consumer": (str,),
    "count": (int,),
    "through": (int,),
    "durable": (bool,),
    "max_length": (int, type(None)),
    "overflow": (str,),
    "delivery_limit": (int,),
    "dead_letter": (str, type(None)),
    "message_ttl_ms": (int, type(None)),
    "retry": (str,),
    "retry_delay_ms": (int,),
    "retry_max_ms": (int, type(None)),
    "ack_timeout_ms": (int, type(None)),
    "timed_out": (bool,),
    "on": (bool,),
    "delay_ms": (int,),
    "not_before": (int,),
    "priority": (int,),
    "max_priority": (int,),
    "single_active_consumer": (bool,),
    "dedupe_window_ms": (int,),
    "dead_letter_exchange": (str, type(None)),
    "dead_letter_routing_key": (str, type(None)),
    "exchange": (str,),
    "type": (str,),
    "auto_delete": (bool,),
    "internal": (bool,),
    "arguments": (dict,),
    "if_unused": (bool,),
    "routing_key": (str,),
    "source": (str,),
    "destination": (str,),
    "to": (str,),
    "holder": (str, type(None)),
    "role": (str,),
    "address": (str,),
    "member_key": (bytes,),
    "properties": (dict,),
    "view_seq": (int,),
    "yes": (bool,),
    "cluster_id": (str,),
    "hold": (int,),
    "serving": (bool,),
    "prev_offset": (int,),
    "prev_digest": (str,),
    "service": (str,),
    "token": (int,),
    "candidate": (str,),
    "name": (str,),
    "salt": (bytes,),
    "cost": (int,),
    "stored_key": (bytes,),
    "server_key": (bytes,),
    "admin": (bool,),
    "initial": (bool,),
    "user": (str, type(None)),
    "partition": (int,),
    "node": (str,),
    "instead": (str, type(None)),
    "replicas": (int,),
    "home": (int,),
    "number": (int,),
    "target": (int,),
    "expires_ms": (int, type(None)),
    "pattern": (str,),
    "apply_to": (str,),
}


def _check_scalars(event: AnyEvent) -> None:
    name: str
    for name in event.__slots__:
        allowed = _SCALAR_CHECKS.get(name)
        if allowed is None:
            continue
        value = getattr(event, name)
        if not isinstance(value, allowed) or (
            isinstance(value, bool) and bool not in allowed
        ):
            raise MalformedEvent(f"{type(event).__name__}.{name} has type {type(value).__name__}")
