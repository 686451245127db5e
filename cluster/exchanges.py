"""Exchanges and their bindings, replicated (docs/design.md §14, docs/events.md). Pure.

:class:`Exchanges` is the part of the replicated state that ``DeclareExchange``,
``DeleteExchange``, ``Bind`` and ``Unbind`` change, and that routes a message
(:meth:`Exchanges.route`): at the broker that received a publish, and at apply time
for a queue's dead letters (cluster/queues.py), where every replica routes alike
because it reads the same table.

The built-in exchanges always exist and cannot be deleted: the default exchange ``""``
(it sends a message to the queue its routing key names; nothing can be bound to it),
``amq.direct``, ``amq.fanout``, ``amq.topic``, ``amq.headers`` and ``amq.match``. Other
names starting with ``amq.`` are reserved, as RabbitMQ reserves them.

A binding is ``(queue, routing key, arguments)`` on an exchange; binding the same again
changes nothing. Deleting a queue removes its bindings, deleting an exchange its
own; an ``auto_delete`` exchange goes when its last binding does; a non-durable one
goes when the member that declared it leaves the view, as a non-durable queue does.

Exchange-to-exchange bindings (flag ``exchange_bindings``; RabbitMQ's): an exchange
binding ``(destination exchange, routing key, arguments)`` is kept on its *source*
exchange, beside its queue bindings, and matched as they are. Routing follows them
breadth first from the exchange published to: each queue reached gets the message
once, however many paths reach it, and each exchange is visited once, so a cycle ends.
As in RabbitMQ, an exchange's bindings as a *source* (to queues and to exchanges) keep
it: ``if_unused`` and ``auto_delete`` count both kinds, not the bindings to it.
Deleting an exchange removes the bindings to it as well, and an ``auto_delete``
source left with no binding by that goes too (and so on).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from batonmq.cluster.errors import (
    AccessRefused,
    ExchangeNotFound,
    InvalidArgument,
    PreconditionFailed,
    QueueNotFound,
)
from batonmq.cluster.events import (
    Bind,
    BindExchange,
    DeclareExchange,
    DeleteExchange,
    Unbind,
    UnbindExchange,
)
from batonmq.cluster.results import Bound, Declared, ExchangeDeleted
from batonmq.cluster.routing import EXCHANGE_TYPES, TopicTrie, route

__all__ = ["BUILTIN_EXCHANGES", "DEFAULT_EXCHANGE", "Exchange", "Exchanges", "MAX_EXCHANGE_NAME"]

DEFAULT_EXCHANGE: Final = ""
#: The exchanges every cluster has, with their types.
BUILTIN_EXCHANGES: Final[dict[str, str]] = {
    DEFAULT_EXCHANGE: "direct",
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}
MAX_EXCHANGE_NAME: Final = 255
_X_MATCH: Final = ("all", "any", "all-with-x", "any-with-x")

Binding = tuple[str, str, dict[str, Any]]  # (queue, routing key, arguments)


@dataclass(slots=True)
class Exchange:
    """One exchange: its settings and its bindings, in the order they were made."""

    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    declared_by: str = ""  # the member that declared it ("" for the built-ins)
    bindings: list[Binding] = field(default_factory=list)
    # Bindings to other exchanges, (destination exchange, routing key, arguments):
    # flag exchange_bindings; a trailing snapshot part only when there is one.
    exchange_bindings: list[Binding] = field(default_factory=list)
    # Derived from bindings (not snapshotted), made at the first routing after a change:
    # direct exchanges: routing key -> queues; topic exchanges: a trie of the keys.
    by_key: dict[str, list[str]] | None = None
    trie: TopicTrie | None = None
    # The same, of the exchange bindings.
    x_by_key: dict[str, list[str]] | None = None
    x_trie: TopicTrie | None = None

    @property
    def builtin(self) -> bool:
        return self.name in BUILTIN_EXCHANGES

    def settings(self) -> tuple[Any, ...]:
        return (self.type, self.durable, self.auto_delete, self.internal, typed(self.arguments))

    @property
    def in_use(self) -> int:
        """How many bindings it has as a source (to queues and to exchanges)."""
        return len(self.bindings) + len(self.exchange_bindings)

    def find(self, binding: Binding, exchange: bool = False) -> int:
        """The index of an equal binding (arguments compared with their types), or -1;
        ``exchange``: among the bindings to exchanges."""
        queue, key, arguments = binding
        want = typed(arguments)
        for i, (q, k, a) in enumerate(self.exchange_bindings if exchange else self.bindings):
            if q == queue and k == key and typed(a) == want:
                return i
        return -1

    def describe(self) -> dict[str, Any]:
        """What a listing shows of it."""
        return {
            "exchange": self.name,
            "type": self.type,
            "durable": self.durable,
            "auto_delete": self.auto_delete,
            "internal": self.internal,
            "arguments": dict(self.arguments),
            "bindings": [
                {"queue": q, "routing_key": k, "arguments": dict(a)} for q, k, a in self.bindings
            ],
            "exchange_bindings": [
                {"destination": d, "routing_key": k, "arguments": dict(a)}
                for d, k, a in self.exchange_bindings
            ],
        }

    def snapshot(self) -> list[Any]:
        snap = [
            self.name,
            self.type,
            self.durable,
            self.auto_delete,
            self.internal,
            self.arguments,
            self.declared_by,
            [[q, k, a] for q, k, a in self.bindings],
        ]
        if self.exchange_bindings:
            # (flag exchange_bindings: only when there is one, so that a cluster without
            # any keeps the snapshots and digests of the builds before it)
            snap.append([[d, k, a] for d, k, a in self.exchange_bindings])
        return snap

    @classmethod
    def restore(cls, snap: list[Any]) -> Exchange:
        name, type_, durable, auto_delete, internal, arguments, declared_by, bindings = snap[:8]
        to_exchanges = snap[8] if len(snap) > 8 else []
        return cls(
            name, type_, durable, auto_delete, internal, dict(arguments), declared_by,
            [(q, k, dict(a)) for q, k, a in bindings],
            [(d, k, dict(a)) for d, k, a in to_exchanges],
        )

    def queues_for(self, routing_key: str, headers: Mapping[str, Any]) -> list[str]:
        """The queues this exchange's bindings send a message to."""
        if self.type == "direct":
            if self.by_key is None:
                self.by_key = _by_key(self.bindings)
            return list(self.by_key.get(routing_key, ()))
        if self.type == "topic":
            if self.trie is None:
                self.trie = TopicTrie((q, k) for q, k, _ in self.bindings)
            return self.trie.match(routing_key)
        return route(self.type, self.bindings, routing_key, headers)

    def exchanges_for(self, routing_key: str, headers: Mapping[str, Any]) -> list[str]:
        """The exchanges this exchange's exchange bindings send a message on to."""
        if not self.exchange_bindings:
            return []
        if self.type == "direct":
            if self.x_by_key is None:
                self.x_by_key = _by_key(self.exchange_bindings)
            return list(self.x_by_key.get(routing_key, ()))
        if self.type == "topic":
            if self.x_trie is None:
                self.x_trie = TopicTrie((d, k) for d, k, _ in self.exchange_bindings)
            return self.x_trie.match(routing_key)
        return route(self.type, self.exchange_bindings, routing_key, headers)


def _by_key(bindings: list[Binding]) -> dict[str, list[str]]:
    """A direct exchange's bindings as routing key -> destinations, each once."""
    by_key: dict[str, list[str]] = {}
    for d, k, _ in bindings:
        ds = by_key.setdefault(k, [])
        if d not in ds:
            ds.append(d)
    return by_key


def _builtins() -> dict[str, Exchange]:
    return {name: Exchange(name, kind) for name, kind in BUILTIN_EXCHANGES.items()}


class Exchanges:
    """Every exchange, by name; changed only by the four events' methods below. Each
    method checks everything before it changes anything."""

    def __init__(self) -> None:
        self.exchanges: dict[str, Exchange] = _builtins()
        self._snap: list[Any] | None = None  # the snapshot, until the next change
        self.version = 0  # counts the changes (the node stores the table when it moved)

    def get(self, name: str) -> Exchange | None:
        return self.exchanges.get(name)

    def _changed(self, ex: Exchange | None = None) -> None:
        self._snap = None
        self.version += 1
        if ex is not None:
            ex.by_key = None
            ex.trie = None
            ex.x_by_key = None
            ex.x_trie = None

    def _existing(self, name: str) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None:
            raise ExchangeNotFound(f"exchange {name!r} does not exist")
        return ex

    # -- the events ------------------------------------------------------------------

    def declare(self, key: str, ev: DeclareExchange) -> Declared:
        """Create an exchange (``key`` declares it), or confirm one with equal settings.

        Raises:
            AccessRefused: the default exchange, or a new name starting with ``amq.``.
            InvalidArgument: a bad name or type.
            PreconditionFailed: it exists with another type or other settings.
        """
        if ev.exchange == DEFAULT_EXCHANGE:
            raise AccessRefused("the default exchange cannot be declared")
        check_exchange_name(ev.exchange)
        if ev.type not in EXCHANGE_TYPES:
            raise InvalidArgument(
                f"unknown exchange type {ev.type!r} (types: {', '.join(EXCHANGE_TYPES)})"
            )
        settings = (ev.type, ev.durable, ev.auto_delete, ev.internal, typed(ev.arguments))
        ex = self.exchanges.get(ev.exchange)
        if ex is not None:
            if ex.settings() != settings:
                what = "type" if ex.type != ev.type else "settings"
                raise PreconditionFailed(
                    f"exchange {ev.exchange!r} exists with another {what}: type {ex.type},"
                    f" durable {ex.durable}, auto_delete {ex.auto_delete}, internal"
                    f" {ex.internal}, arguments {ex.arguments}"
                )
            return Declared(created=False)
        if ev.exchange.startswith("amq."):
            raise AccessRefused(f"exchange names starting with 'amq.' are reserved: {ev.exchange!r}")
        self.exchanges[ev.exchange] = Exchange(
            ev.exchange, ev.type, ev.durable, ev.auto_delete, ev.internal,
            dict(ev.arguments), key,
        )
        self._changed()
        return Declared(created=True)

    def delete(self, ev: DeleteExchange) -> ExchangeDeleted:
        """Delete an exchange with its bindings.

        Raises:
            AccessRefused: a built-in exchange.
            ExchangeNotFound: there is no such exchange.
            PreconditionFailed: ``if_unused`` and it has bindings.
        """
        if ev.exchange in BUILTIN_EXCHANGES:
            raise AccessRefused(f"the built-in exchange {ev.exchange!r} cannot be deleted")
        ex = self._existing(ev.exchange)
        if ev.if_unused and ex.in_use:
            raise PreconditionFailed(
                f"exchange {ev.exchange!r} has {ex.in_use} bindings (if_unused)"
            )
        bindings = ex.in_use
        self._remove(ev.exchange)
        return ExchangeDeleted(bindings=bindings)

    def bind(self, ev: Bind, queues: Container[str]) -> Bound:
        """Bind ``ev.queue`` to ``ev.exchange``; ``changed`` False if it was bound so.

        Raises:
            AccessRefused: the default exchange.
            ExchangeNotFound, QueueNotFound: either does not exist.
            InvalidArgument: a headers binding with a bad ``x-match``.
        """
        ex = self._bindable(ev, queues)
        _check_x_match(ex, ev.arguments)
        binding = (ev.queue, ev.routing_key, dict(ev.arguments))
        if ex.find(binding) >= 0:
            return Bound(changed=False)
        ex.bindings.append(binding)
        self._changed(ex)
        return Bound(changed=True)

    def unbind(self, ev: Unbind, queues: Container[str]) -> Bound:
        """Remove a binding; ``changed`` False if there was none (not an error).

        Raises:
            AccessRefused: the default exchange.
            ExchangeNotFound, QueueNotFound: either does not exist.
        """
        ex = self._bindable(ev, queues)
        binding = (ev.queue, ev.routing_key, dict(ev.arguments))
        at = ex.find(binding)
        if at < 0:
            return Bound(changed=False)
        del ex.bindings[at]
        self._changed(ex)
        if ex.auto_delete and not ex.in_use:
            self._remove(ex.name)
        return Bound(changed=True)

    def _bindable(self, ev: Bind | Unbind, queues: Container[str]) -> Exchange:
        if ev.exchange == DEFAULT_EXCHANGE:
            raise AccessRefused("nothing can be bound to the default exchange")
        ex = self._existing(ev.exchange)
        if ev.queue not in queues:
            raise QueueNotFound(f"queue {ev.queue!r} does not exist")
        return ex

    def bind_exchange(self, ev: BindExchange) -> Bound:
        """Bind exchange ``ev.destination`` to ``ev.source``; ``changed`` False if it
        was bound so (an exchange may be bound to itself: routing visits it once).

        Raises:
            AccessRefused: the default exchange, as either end.
            ExchangeNotFound: either does not exist.
            InvalidArgument: a headers binding with a bad ``x-match``.
        """
        source = self._exchange_bindable(ev)
        _check_x_match(source, ev.arguments)
        binding = (ev.destination, ev.routing_key, dict(ev.arguments))
        if source.find(binding, exchange=True) >= 0:
            return Bound(changed=False)
        source.exchange_bindings.append(binding)
        self._changed(source)
        return Bound(changed=True)

    def unbind_exchange(self, ev: UnbindExchange) -> Bound:
        """Remove an exchange binding; ``changed`` False if there was none. An
        ``auto_delete`` source left with no binding goes.

        Raises:
            AccessRefused: the default exchange, as either end.
            ExchangeNotFound: either does not exist.
        """
        source = self._exchange_bindable(ev)
        at = source.find((ev.destination, ev.routing_key, dict(ev.arguments)), exchange=True)
        if at < 0:
            return Bound(changed=False)
        del source.exchange_bindings[at]
        self._changed(source)
        if source.auto_delete and not source.in_use:
            self._remove(source.name)
        return Bound(changed=True)

    def _exchange_bindable(self, ev: BindExchange | UnbindExchange) -> Exchange:
        if DEFAULT_EXCHANGE in (ev.source, ev.destination):
            raise AccessRefused("operation not permitted on the default exchange")
        self._existing(ev.destination)
        return self._existing(ev.source)

    # -- what other changes do to exchanges --------------------------------------------

    def _remove(self, name: str) -> None:
        """Remove exchange ``name`` with its bindings and the bindings to it; an
        ``auto_delete`` exchange that this leaves with no binding goes too, and so on
        (as RabbitMQ)."""
        todo = [name]
        while todo:
            gone = todo.pop(0)
            if self.exchanges.pop(gone, None) is None:
                continue
            self._changed()
            for other in sorted(self.exchanges):
                ex = self.exchanges[other]
                if not any(b[0] == gone for b in ex.exchange_bindings):
                    continue
                ex.exchange_bindings = [b for b in ex.exchange_bindings if b[0] != gone]
                self._changed(ex)
                if ex.auto_delete and not ex.in_use:
                    todo.append(other)

    def queue_deleted(self, queue: str) -> None:
        """A queue is gone: its bindings go, and auto-delete exchanges left with none."""
        for name in sorted(self.exchanges):
            ex = self.exchanges.get(name)
            if ex is not None and any(b[0] == queue for b in ex.bindings):
                ex.bindings = [b for b in ex.bindings if b[0] != queue]
                self._changed(ex)
                if ex.auto_delete and not ex.in_use:
                    self._remove(name)

    def member_left(self, key: str) -> None:
        """The non-durable exchanges the member ``key`` declared go with it."""
        for name in sorted(self.exchanges):
            ex = self.exchanges.get(name)
            if ex is not None and not ex.durable and ex.declared_by == key:
                self._remove(name)

    # -- routing -------------------------------------------------------------------

    def route(
        self, exchange: str, routing_key: str, headers: Mapping[str, Any], queues: Container[str]
    ) -> list[str]:
        """The existing queues a message published to ``exchange`` goes to (the default
        exchange: the queue named ``routing_key``, if it exists).

        Raises:
            ExchangeNotFound: there is no such exchange.
        """
        if exchange == DEFAULT_EXCHANGE:
            return [routing_key] if routing_key in queues else []
        first = self._existing(exchange)
        if not first.exchange_bindings:  # (the common case: no exchange to follow)
            return [q for q in first.queues_for(routing_key, headers) if q in queues]
        # Breadth first through the exchange bindings (RabbitMQ's exchange-to-exchange
        # routing): each exchange visited once (a cycle ends), each queue taken once.
        out: list[str] = []
        taken: set[str] = set()
        visited = {exchange}
        todo = [first]
        for ex in todo:  # (grows as it goes)
            for q in ex.queues_for(routing_key, headers):
                if q not in taken and q in queues:
                    taken.add(q)
                    out.append(q)
            for name in ex.exchanges_for(routing_key, headers):
                nxt = self.exchanges.get(name)
                if nxt is not None and name not in visited:
                    visited.add(name)
                    todo.append(nxt)
        return out

    # -- snapshots ---------------------------------------------------------------------

    def snapshot(self) -> list[Any]:
        """Canonical: every exchange by name, built-ins included."""
        if self._snap is None:
            self._snap = [self.exchanges[n].snapshot() for n in sorted(self.exchanges)]
        return self._snap

    def restore(self, snap: list[Any] | None) -> None:
        """Restore from :meth:`snapshot`; None (a snapshot from before exchanges): the
        built-ins only."""
        self.exchanges = _builtins()
        for item in snap or ():
            ex = Exchange.restore(item)
            self.exchanges[ex.name] = ex
        self._changed()

    def describe(self) -> list[dict[str, Any]]:
        """Every exchange, by name, as listings show them."""
        return [self.exchanges[n].describe() for n in sorted(self.exchanges)]


def _check_x_match(ex: Exchange, arguments: Mapping[str, Any]) -> None:
    """A headers exchange's binding needs a known ``x-match``.

    Raises:
        InvalidArgument: it has another.
    """
    if ex.type == "headers":
        how = arguments.get("x-match", "all")
        if how not in _X_MATCH:
            raise InvalidArgument(f"x-match must be one of {', '.join(_X_MATCH)}, not {how!r}")


def typed(value: Any) -> Any:
    """``value`` with each scalar tagged by its type, so that arguments compare as AMQP
    tables do: ``1``, ``1.0`` and ``True`` differ (Python's ``==`` says they are equal);
    maps compare whatever their keys' order."""
    if isinstance(value, dict):
        return ("map", tuple(sorted((str(k), typed(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("list", tuple(typed(v) for v in value))
    return (type(value).__name__, value)


def check_exchange_name(name: str) -> None:
    """Raises InvalidArgument unless ``name`` is 1..255 printable characters."""
    if not name or len(name) > MAX_EXCHANGE_NAME or not name.isprintable():
        raise InvalidArgument(
            f"exchange name must be 1..{MAX_EXCHANGE_NAME} printable characters"
        )
