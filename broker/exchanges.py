"""Exchanges for a protocol edge: declare, delete, bind, unbind and publish through them
(docs/design.md §14).

:class:`ExchangeFacade` is what a wire edge (the AMQP listener) calls, one per
connection (it checks that connection's user's rights). Each command is checked here
first, so that an invalid one never grows the log (broker/limits.py, the built-in
exchanges' rules, the rights), then submitted to the node like a native session's
command (broker/session.py). A method checks and submits *when it is called* (a command
refused here raises there) and returns a future: ``await`` it for what applying the
event answered, once it is durable and applied here, or for the error applying it
raised. So commands reach the log in the order they are called, as AMQP's channel
order wants, even when the caller does not wait for one before calling the next.

A publish is routed *here*, on the broker that received it, from the replicated state
it has applied (cluster/exchanges.py), and appended as one ``RoutedEnqueue`` naming the
queues: a fan-out is one atomic append. A binding changed between this routing and the
append's apply is not seen by the publish; a queue deleted meanwhile is skipped and
reported in :attr:`~batonmq.cluster.results.Routed.missing`. A publish that routes to no
queue appends nothing (its result has no queue: AMQP's ``mandatory`` returns it); one
that a routed queue refused (``full``: ``max_length`` with ``reject-publish``) is on
the other queues, and the edge nacks it, as RabbitMQ does. The messages are stored as
they are given: the exchange and routing key are not added to their headers (an edge
that must deliver them keeps them there itself; a dead letter routed through an
exchange carries ``x-death-exchange`` and ``x-death-routing-key``, and RabbitMQ's
``x-first-death-*`` and ``x-last-death-*``).

Errors (:func:`error_kind` names the kind, for an edge's reply codes):

* ``not-found``: :class:`~batonmq.cluster.errors.ExchangeNotFound`,
  :class:`~batonmq.cluster.errors.QueueNotFound` (AMQP 404);
* ``precondition``: :class:`~batonmq.cluster.errors.PreconditionFailed` (and
  :class:`~batonmq.cluster.errors.QueueExists`, a kind of it): another type or other
  settings, ``if_unused`` with bindings (AMQP 406);
* ``access-refused``: :class:`~batonmq.cluster.errors.AccessRefused`: the default
  exchange (declare, delete, bind), a built-in one (delete), a new ``amq.`` name, an
  ``internal`` exchange (publish), a missing right (AMQP 403);
* ``invalid``: :class:`~batonmq.cluster.errors.InvalidArgument`: a bad name, type, key,
  ``x-match``, delay or priority (AMQP 406, or 503 for an unknown exchange type);
* ``unavailable``: a retriable error (``LogUnavailable``, ``ShuttingDown``, ``Fenced``,
  ...); ``other``: anything else (``MessageTooLarge``, ``InternalError``).

Rights (broker/access.py; queues and exchanges share the name patterns), as RabbitMQ
checks them: declaring or deleting an exchange needs ``configure`` on its name (a
passive declare none); binding and unbinding need ``write`` on the queue and ``read``
on the exchange (an exchange to an exchange: ``write`` on the destination, ``read`` on the
source); publishing needs ``write`` on the exchange, or, through the default
exchange, on the queue the routing key names (as a native publish does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final, TypeVar

from batonmq.broker.access import Rights
from batonmq.broker.limits import check_event
from batonmq.broker.peers import routable
from batonmq.cluster.errors import (
    AccessRefused,
    BatonError,
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
    RoutedEnqueue,
    Unbind,
    UnbindExchange,
)
from batonmq.cluster.exchanges import BUILTIN_EXCHANGES, DEFAULT_EXCHANGE
from batonmq.cluster.node import Node
from batonmq.cluster.queue_state import MAX_PRIORITY
from batonmq.cluster.results import Bound, Declared, ExchangeDeleted, Routed
from batonmq.cluster.state import State

__all__ = [
    "ERROR_KINDS",
    "EXCHANGE_BINDINGS",
    "ExchangeFacade",
    "check_exchange_bindings",
    "error_kind",
    "exchange_options",
]

T = TypeVar("T")

#: The kinds :func:`error_kind` answers.
ERROR_KINDS: Final = ("not-found", "precondition", "access-refused", "invalid", "unavailable", "other")


#: The feature flag of exchange-to-exchange bindings (cluster/features.py).
EXCHANGE_BINDINGS: Final = "exchange_bindings"


def check_exchange_bindings(state: State) -> None:
    """Exchange-to-exchange bindings need their feature flag.

    Raises:
        InvalidArgument: the flag ``exchange_bindings`` is not enabled.
    """
    if EXCHANGE_BINDINGS not in state.features.enabled:
        raise InvalidArgument(
            "exchange-to-exchange bindings need the feature flag exchange_bindings: enable it"
            " once every broker runs a build that has it (baton feature enable"
            " exchange_bindings)"
        )


def error_kind(exc: BaseException) -> str:
    """The kind of error a facade call raised (one of :data:`ERROR_KINDS`)."""
    if isinstance(exc, (ExchangeNotFound, QueueNotFound)):
        return "not-found"
    if isinstance(exc, PreconditionFailed):
        return "precondition"
    if isinstance(exc, AccessRefused):
        return "access-refused"
    if isinstance(exc, InvalidArgument):
        return "invalid"
    if isinstance(exc, BatonError) and exc.retriable:
        return "unavailable"
    return "other"


def exchange_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :meth:`ExchangeFacade.declare_exchange` from a native
    DeclareExchange's ``options`` map (durable, auto_delete, internal, passive: bools;
    arguments: a map).

    Raises:
        InvalidArgument: an unknown option, or one of the wrong type.
    """
    known = ("durable", "auto_delete", "internal", "passive", "arguments")
    for key, value in options.items():
        if key not in known:
            raise InvalidArgument(f"unknown exchange option {key!r} (known: {', '.join(known)})")
        if not isinstance(value, dict if key == "arguments" else bool):
            raise InvalidArgument(f"exchange option {key!r} has the wrong type")
    return dict(options)


class ExchangeFacade:
    """Exchanges, bindings and publishes through them, for one connection of an edge.

    Args:
        node: this broker's node (commands are submitted to it; routing reads its state).
        rights: the connection's user's rights; None checks none (the broker's own use).
    """

    def __init__(self, node: Node, rights: Rights | None = None) -> None:
        self.node = node
        self.rights = rights

    def _check(self, right: str, name: str, what: str) -> None:
        if self.rights is not None:
            self.rights.check(right, name, what)

    # -- reading the state applied here ---------------------------------------------

    def exchange(self, name: str) -> dict[str, Any] | None:
        """An exchange as this broker has applied it (type, settings, bindings), or None."""
        ex = self.node.state.exchanges.get(name)
        return None if ex is None else ex.describe()

    def route(self, exchange: str, routing_key: str, headers: Mapping[str, Any]) -> list[str]:
        """The queues a message would go to now, by the state applied here.

        Raises:
            ExchangeNotFound: there is no such exchange.
        """
        return self.node.state.exchanges.route(
            exchange, routing_key, headers, routable(self.node)
        )

    # -- commands ----------------------------------------------------------------------

    def declare_exchange(
        self,
        exchange: str,
        type: str,
        *,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
        passive: bool = False,
    ) -> asyncio.Future[Declared]:
        """Declare an exchange: ``created`` False if it existed with these settings.
        ``passive``: only check that it exists, here, appending nothing (the other
        arguments are not compared, as AMQP's passive declare).

        Raises:
            AccessRefused, InvalidArgument, PreconditionFailed; ExchangeNotFound
                (passive only).
        """
        if passive:
            if self.node.state.exchanges.get(exchange) is None:
                raise ExchangeNotFound(f"exchange {exchange!r} does not exist")
            return _done(Declared(created=False))
        if exchange == DEFAULT_EXCHANGE:
            raise AccessRefused("the default exchange cannot be declared")
        self._check("configure", exchange, "exchange")
        event = DeclareExchange(
            exchange, type, durable, auto_delete, internal, dict(arguments or {})
        )
        check_event(event)
        return self.node.submit(event)

    def delete_exchange(
        self, exchange: str, *, if_unused: bool = False
    ) -> asyncio.Future[ExchangeDeleted]:
        """Delete an exchange and its bindings.

        Raises:
            AccessRefused (a built-in exchange), ExchangeNotFound, PreconditionFailed
                (``if_unused`` and it has bindings).
        """
        if exchange in BUILTIN_EXCHANGES:
            raise AccessRefused(f"the built-in exchange {exchange!r} cannot be deleted")
        self._check("configure", exchange, "exchange")
        event = DeleteExchange(exchange, if_unused)
        check_event(event)
        return self.node.submit(event)

    def bind(
        self,
        queue: str,
        exchange: str,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> asyncio.Future[Bound]:
        """Bind ``queue`` to ``exchange``: ``changed`` False if that binding existed.

        Raises:
            AccessRefused (the default exchange), ExchangeNotFound, QueueNotFound,
                InvalidArgument (a bad ``x-match``, an overlong key).
        """
        event = Bind(queue, exchange, routing_key, dict(arguments or {}))
        self._binding(event)
        return self.node.submit(event)

    def unbind(
        self,
        queue: str,
        exchange: str,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> asyncio.Future[Bound]:
        """Remove a binding: ``changed`` False if there was none.

        Raises:
            AccessRefused (the default exchange), ExchangeNotFound, QueueNotFound.
        """
        event = Unbind(queue, exchange, routing_key, dict(arguments or {}))
        self._binding(event)
        return self.node.submit(event)

    def bind_exchange(
        self,
        destination: str,
        source: str,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> asyncio.Future[Bound]:
        """Bind exchange ``destination`` to exchange ``source`` (what ``source`` routes
        by this binding goes on to ``destination``): ``changed`` False if that binding
        existed. Needs the feature flag ``exchange_bindings``.

        Raises:
            AccessRefused (the default exchange, a missing right), ExchangeNotFound,
                InvalidArgument (the flag is not enabled, a bad ``x-match``, an overlong
                key).
        """
        event = BindExchange(destination, source, routing_key, dict(arguments or {}))
        self._exchange_binding(event)
        return self.node.submit(event)

    def unbind_exchange(
        self,
        destination: str,
        source: str,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> asyncio.Future[Bound]:
        """Remove an exchange-to-exchange binding: ``changed`` False if there was none.

        Raises:
            AccessRefused, ExchangeNotFound, InvalidArgument (the flag is not enabled).
        """
        event = UnbindExchange(destination, source, routing_key, dict(arguments or {}))
        self._exchange_binding(event)
        return self.node.submit(event)

    def _exchange_binding(self, event: BindExchange | UnbindExchange) -> None:
        check_exchange_bindings(self.node.state)
        if DEFAULT_EXCHANGE in (event.source, event.destination):
            raise AccessRefused("operation not permitted on the default exchange")
        # (as RabbitMQ: write on the destination, read on the source)
        self._check("write", event.destination, "exchange")
        self._check("read", event.source, "exchange")
        check_event(event)

    def _binding(self, event: Bind | Unbind) -> None:
        if event.exchange == DEFAULT_EXCHANGE:
            raise AccessRefused("nothing can be bound to the default exchange")
        self._check("write", event.queue, "queue")
        self._check("read", event.exchange, "exchange")
        check_event(event)

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
        *,
        key: str = "",
        delay_ms: int = 0,
        not_before: int = 0,
        priority: int = 0,
        ttl_ms: int | None = None,
    ) -> asyncio.Future[Routed]:
        """Publish one message through ``exchange``, routed here by ``routing_key`` (and,
        for a headers exchange, ``headers``), as one append onto every routed queue.

        ``key``: the publish's idempotency key ("" none): a re-sent publish with the
        same key is enqueued again on no queue that has it (within its dedupe window).
        ``delay_ms``, ``not_before``, ``priority``, ``ttl_ms``: as a native publish's
        options (``ttl_ms``, the message's own TTL, is the caller's to check against
        the flag ``message_ttl``: the state refuses it before).

        Returns the queues that have the message now (empty: it reached no queue, and
        nothing was appended), the first position on each, the queues that refused it
        (full, reject-publish) and those deleted since the routing.

        Raises:
            ExchangeNotFound; AccessRefused (an internal exchange, no write right);
            InvalidArgument (overlong key, headers nested too deep, bad delay or
            priority); MessageTooLarge (above the log's record limit).
        """
        if delay_ms < 0 or not_before < 0:
            raise InvalidArgument("a publish's delay and not_before must not be negative")
        if not 0 <= priority <= MAX_PRIORITY:
            raise InvalidArgument(f"priority must be 0..{MAX_PRIORITY}")
        state = self.node.state
        if exchange == DEFAULT_EXCHANGE:
            self._check("write", routing_key, "queue")
        else:
            ex = state.exchanges.get(exchange)
            if ex is None:
                raise ExchangeNotFound(f"exchange {exchange!r} does not exist")
            if ex.internal:
                raise AccessRefused(f"exchange {exchange!r} is internal: clients cannot publish to it")
            self._check("write", exchange, "exchange")
        message_headers = dict(headers or {})
        queues = self.route(exchange, routing_key, message_headers)
        if not queues:
            return _done(Routed(queues=[], positions=[], full=[], missing=[]))
        event = RoutedEnqueue(
            tuple(queues),
            ((body, message_headers),),
            ((key, 1),) if key else (),
            exchange,
            routing_key,
            delay_ms,
            not_before,
            priority,
            () if ttl_ms is None else (ttl_ms,),
        )
        check_event(event)
        return self.node.submit(event)


def _done(value: T) -> asyncio.Future[T]:
    """A future that already has ``value`` (a command answered without the log)."""
    fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut
