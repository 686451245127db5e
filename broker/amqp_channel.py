"""One AMQP 0-9-1 channel: its queues, exchanges and bindings, publishes, confirms,
transactions and consumers (docs/amqp.md).

A :class:`Channel` turns the methods of one channel into Baton's commands, through the
same parts a native session uses: publishes are ``Enqueue`` events with an idempotency
key each (those of one read merged per queue), consumers are
:class:`~batonmq.broker.delivery.Consumer` s of the broker's delivery, settlements are
``Accept`` / ``Release`` / ``Reject`` events. It is the
:class:`~batonmq.broker.reply.Replier` its consumers deliver to. The connection
(broker/amqp_connection.py) owns the channels, the socket and the handshake; it is seen
here as :class:`ChannelOwner` only.

Settlements, as RabbitMQ 4.3's quorum queues count them: ``Basic.Ack`` accepts;
``Basic.Reject`` with requeue is a failed delivery (the delivery count goes up, the
delivery limit applies); ``Basic.Nack`` with requeue and ``Basic.Recover`` give the
message back without a failure (the acquired count only); either without requeue
dead-letters (or drops) it. A closed channel or a lost connection gives back what it
held as failed deliveries.

A transactional channel (``Tx.Select``) holds its publishes and settlements in a
:class:`~batonmq.broker.amqp_tx.Transaction` and submits them at ``Tx.Commit`` through
the same paths as above, answering once they are applied here.

With replica groups, a consumer of a queue whose data partition this broker does not
replicate is relayed to a replica (:class:`~batonmq.broker.relay.Relay`): its ``_Sub``
keeps a record of what it holds (a ``Consumer`` that this broker's delivery does not
serve), and its settlements go to the replica as the native frames.

Size: about 1,600 lines, because the methods of AMQP's Basic, Queue, Confirm and Tx
classes share one channel's state (delivery tags, consumers and getters, a shared
prefetch, unconfirmed publishes, a transaction, relayed consumers settled through the
same delivery tags); what needs none of it is in modules of
its own (broker/amqp_queues.py, the arguments; broker/amqp_routes.py, the exchange seam;
broker/amqp_message.py, the properties; broker/amqp_order.py, the channel's order;
broker/amqp_tx.py, what a transaction holds).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgpack
from pamqp import base, commands

from batonmq.broker import amqp_routes as routes
from batonmq.broker import amqp_tx as tx
from batonmq.broker.access import Rights, check_user_limit
from batonmq.broker.amqp_codec import (
    ChannelError,
    ConnectionFault,
    Content,
    Oversized,
    content_frames,
    declare_ok,
    deliver_frames,
    method_frame,
)
from batonmq.broker.amqp_message import properties_bytes, route_of, to_headers, to_properties
from batonmq.broker.amqp_order import READS, ChannelOrder
from batonmq.broker.amqp_queues import error_code, queue_options, refusal_text
from batonmq.broker.amqp_ttl import message_ttl, with_x_death
from batonmq.broker.config import BrokerConfig
from batonmq.broker.delivery import Consumer, Delivery
from batonmq.broker.exchanges import EXCHANGE_BINDINGS, ExchangeFacade
from batonmq.broker.limits import check_event, check_headers, check_name
from batonmq.broker.peers import Peers, elsewhere, routable
from batonmq.broker.relay import Relay
from batonmq.broker.reply import Shape
from batonmq.broker.session import declare_event
from batonmq.clients import wire
from batonmq.cluster.errors import (
    AccessRefused,
    BatonError,
    ConnectionClosed,
    ExchangeNotFound,
    LimitExceeded,
    MessageTooLarge,
    QueueNotFound,
)
from batonmq.cluster.events import (
    Accept,
    DeleteQueue,
    Enqueue,
    PurgeQueue,
    Reject,
    Release,
    RoutedEnqueue,
)
from batonmq.cluster.node import Node
from batonmq.cluster.partitioned import Partitioned
from batonmq.cluster.results import Enqueued, Routed, Settled

__all__ = ["Channel", "ChannelOwner", "DEFAULT_PREFETCH", "GET_WAIT"]

log = logging.getLogger("baton.amqp")

R = TypeVar("R")

#: The prefetch of a consumer on a channel without ``Basic.Qos`` (AMQP: unlimited).
DEFAULT_PREFETCH = 1000
#: RabbitMQ's direct reply-to pseudo-queue (docs/amqp.md, "Direct reply-to").
REPLY_TO = "amq.rabbitmq.reply-to"
#: A channel keeps a getter (a consumer of prefetch 0, raised to 1 for each Basic.Get)
#: for each queue it gets from; past this many, those that hold nothing end.
_MAX_GETTERS = 16
#: The longest a ``Basic.Get`` waits for the message it saw ready (seconds): it is
#: acquired through the log, by the broker that owns the queue at the time.
GET_WAIT = 3.0
_GET_POLL = 0.02

class ChannelOwner(Protocol):
    """What a channel needs of its connection."""

    @property
    def closed(self) -> bool:
        """The connection has ended (or is closing)."""
        ...

    @property
    def paused(self) -> bool:
        """The client does not read: deliver nothing."""
        ...

    @property
    def frame_max(self) -> int:
        """The frame size settled in Tune."""
        ...

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def node(self) -> Node: ...

    @property
    def delivery(self) -> Delivery: ...

    @property
    def rights(self) -> Rights: ...

    @property
    def peers(self) -> Peers | None:
        """The links to other brokers (replica groups: relayed consumers), or None."""
        ...

    @property
    def cancel_notify(self) -> bool:
        """The client takes a server's ``Basic.Cancel`` (capability consumer_cancel_notify)."""
        ...

    def write(self, data: bytes) -> None:
        """Queue bytes for this tick's write."""
        ...

    def user_consumers(self) -> int:
        """The consumers of the connection's user on this broker (its max_consumers)."""
        ...

    def consumer_load(self) -> tuple[int, int]:
        """The connection's consumers, and the sum of their prefetch."""
        ...

    def next_key(self) -> str:
        """A fresh publish idempotency key of this connection."""
        ...

    def commands_started(self, n: int) -> None: ...

    def commands_finished(self, n: int) -> None: ...

    def close_channel(self, channel: Channel, code: int, text: str) -> None:
        """Close ``channel`` with ``code`` (``Channel.Close``)."""
        ...

    def fail(self, exc: ConnectionFault) -> None:
        """Close the connection with ``exc``'s code (a method handled late)."""
        ...

    def exclusive_owner(self, queue: str) -> object | None:
        """The connection that declared ``queue`` exclusive, if any."""
        ...

    def queue_declared(self, queue: str, exclusive: bool, auto_delete: bool) -> None:
        """This connection declared ``queue`` exclusive and/or auto-delete."""
        ...

    def consumer_gone(self, queue: str) -> None:
        """A consumer of ``queue`` on this connection ended (auto-delete)."""
        ...


@dataclass(slots=True)
class _Sub:
    """One ``Basic.Consume`` (or a channel's getter of one queue)."""

    tag: str
    consumer: Consumer
    no_ack: bool
    getter: bool = False
    cancelled: bool = False  # Basic.Cancel: delivers nothing more, ends when settled
    limit: int = 0  # its own prefetch (Basic.Qos per consumer, or the default)
    # Served by a replica of the queue's data partition (replica groups, broker/relay.py):
    # ``consumer`` is then this channel's record of it only (what it holds), not one
    # of this broker's delivery.
    relay: Relay | None = None
    # A relayed getter that has its message: done once its replica's consumer is
    # cancelled (what that consumer took after its one message is then back).
    ended: asyncio.Future[None] | None = None


@dataclass(slots=True)
class _Get:
    """A ``Basic.Get`` waiting for its message."""

    sub: _Sub
    no_ack: bool
    deadline: float
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class _Publish:
    seq: int  # confirm sequence number (0: not confirming)
    body: bytes
    headers: dict[str, Any]
    key: str
    priority: int = 0
    ttl: int | None = None  # its own TTL, ms (flag message_ttl)


class Channel:
    """One open channel of an AMQP connection."""

    def __init__(self, owner: ChannelOwner, number: int) -> None:
        self.owner = owner
        self.number = number
        self.open = True
        self.active = True  # Channel.Flow
        self.candidate = ""  # (Replier: a channel never leads a service)
        self.prefetch = 0  # Basic.Qos prefetch_count (0: DEFAULT_PREFETCH)
        self.global_prefetch = 0  # Basic.Qos global: the channel's consumers share it
        self._turn = 0  # who gets the odd credit of a shared prefetch first
        self.confirming = False
        self._seq = 0  # the last confirm sequence number given
        self._unconfirmed: dict[int, bool | None] = {}  # seq -> outcome (None: pending)
        self._confirm_soon = False
        self._subs: dict[str, _Sub] = {}  # by consumer tag
        self._by_int: dict[int, _Sub] = {}  # by Consumer.tag
        self._next_int = 0
        self._getters: dict[str, _Sub] = {}  # by queue
        self._get: _Get | None = None
        # Relayed getters that have their message, until their replica's consumer ends.
        self._gets_ending: dict[int, _Sub] = {}
        self._delivery_tag = 0
        self._unacked: dict[int, tuple[_Sub, int]] = {}  # delivery tag -> (sub, position)
        self._publishes: dict[str, list[_Publish]] = {}
        self._last_queue = ""  # the last queue declared (Basic.Consume/Get of "")
        # Direct reply-to: (consumer tag, the queue made for it) while it consumes.
        self._reply: tuple[str, str] | None = None
        self._packer = msgpack.Packer(use_bin_type=True)
        # tx.select: what the channel holds until tx.commit (broker/amqp_tx.py)
        self.tx: tx.Transaction[Content, tuple[_Sub, int]] | None = None
        # During a commit: its commands' futures, each (future, a settlement)
        self._collect: list[tuple[asyncio.Future[Any], bool]] | None = None
        # (AMQP: a channel's methods take effect in order; broker/amqp_order.py)
        self._order = ChannelOrder(self._run_held, self.flush)

    # -- Replier ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.owner.closed or not self.open

    @property
    def paused(self) -> bool:
        return self.owner.paused or not self.active

    def send(self, frame: wire.Frame) -> None:
        """What delivery tells a native session: here only an ack timeout."""
        if isinstance(frame, wire.Expired) and self.open:
            # As RabbitMQ: the channel closes; what it held goes back.
            self.owner.close_channel(
                self, 406, f"delivery acknowledgement on channel {self.number} timed out"
            )

    def reply(self, corr: int, fut: asyncio.Future[R], shape: Shape[R]) -> None:
        fut.add_done_callback(_quiet)

    def error(self, corr: int, exc: BatonError) -> None:
        pass

    def commands_started(self, n: int) -> None:
        self.owner.commands_started(n)

    def commands_finished(self, n: int) -> None:
        self.owner.commands_finished(n)

    def deliver(self, tag: int, messages: list[list[Any]]) -> None:
        """Messages acquired for one of this channel's consumers (or its getter)."""
        sub = self._by_int.get(tag)
        if sub is None:
            return
        c = sub.consumer
        if sub.relay is not None:  # (what a replica delivered is held as a local one's)
            c.held.update(dict.fromkeys((m[0] for m in messages), 0))
        if not self.open or sub.cancelled or (sub.getter and self._get is None):
            # Nobody wants them now: back to the queue, not a failure (never sent).
            positions = [m[0] for m in messages]
            self._settle_positions(c, positions, "release")
            return
        if sub.getter and len(messages) > 1:
            # One Basic.Get, one message (its prefetch is 1; never more told as GetOk).
            self._settle_positions(c, [m[0] for m in messages[1:]], "release")
            messages = messages[:1]
        accepted: list[int] = []
        out: list[bytes] = []
        frame_max = self.owner.frame_max
        for m in messages:
            position, count, body, headers, publish_time, acquired = m[:6]
            if "x-death-reason" in headers:  # a dead letter: RabbitMQ's x-death
                headers = with_x_death(headers, publish_time)
            extra: dict[str, Any] = {}
            if count:
                extra["x-delivery-count"] = count
            if acquired:
                extra["x-acquired-count"] = acquired
            self._delivery_tag += 1
            dtag = self._delivery_tag
            if sub.no_ack:
                accepted.append(position)
            else:
                self._unacked[dtag] = (sub, position)
            if sub.getter:
                q = self.owner.node.queues.get(c.queue)
                exchange, key = route_of(headers, c.queue)
                method = commands.Basic.GetOk(
                    dtag, acquired > 0, exchange, key, q.ready if q is not None else 0
                )
                out.append(content_frames(self.number, method, to_properties(headers, extra),
                                          body, frame_max))
            else:
                exchange, key = route_of(headers, c.queue)
                out.append(deliver_frames(self.number, sub.tag, dtag, acquired > 0, key,
                                          properties_bytes(headers, extra), body, frame_max,
                                          exchange))
        if sub.getter:
            get, self._get = self._get, None
            if get is not None and get.timer is not None:
                get.timer.cancel()
            c.prefetch = 0
            sub.cancelled = sub.relay is not None  # (relayed: ends once it is settled)
            if sub.relay is not None:
                sub.ended = asyncio.get_running_loop().create_future()
                self._gets_ending[c.tag] = sub
        self.owner.write(b"".join(out))
        if accepted:
            self._settle_positions(c, accepted, "accept")
        if sub.relay is not None and sub.getter:
            self._end_if_settled(sub)

    def consumer_cancelled(self, tag: int, exc: BatonError) -> None:
        """The broker ended a consumer (its queue was deleted)."""
        sub = self._by_int.pop(tag, None)
        if sub is None:
            return
        self._subs.pop(sub.tag, None)
        if sub.getter:
            if sub.relay is not None:
                sub.consumer.closed = True  # (a Basic.Get waiting answers at its deadline)
                self._get_ended(sub)
            else:
                self._getters.pop(sub.consumer.queue, None)
            return
        if self._replies(sub):
            self._reply = None  # (a publish naming it as its reply_to is refused again)
        if sub.relay is not None:
            # Its replica ended it, or the peer link broke (the replica gave back what
            # it held): the acks of what it had are no-ops now.
            sub.consumer.closed = True
            self.owner.consumer_gone(sub.consumer.queue)
            if (self.open and not self.owner.cancel_notify and not sub.cancelled
                    and isinstance(exc, ConnectionClosed)):
                # (a client that takes no Basic.Cancel would wait for ever)
                self.owner.close_channel(
                    self, 506, f"consumer '{sub.tag}' of queue '{sub.consumer.queue}' ended:"
                    f" {exc.message}; consume again"
                )
                return
        if self.open and self.owner.cancel_notify and not sub.cancelled:
            self._method(commands.Basic.Cancel(sub.tag, nowait=True))

    # -- methods ------------------------------------------------------------------------------

    def handle(self, method: base.Frame) -> None:
        """One method of this channel (not Channel.Open / Close / CloseOk).

        A method that reads what the channel's earlier methods change (a
        ``Basic.Get`` after the channel's own requeue or publish, a ``Queue.Declare``'s
        message count, ...) waits until their commands are applied on this broker,
        and what the client sends after it waits behind it: AMQP orders a channel's
        methods, and RabbitMQ's clients rely on it.

        Raises:
            ChannelError: the channel closes.
            ConnectionFault: the connection closes.
        """
        order = self._order
        if order.waiting:
            order.hold(lambda: self.handle(method))
            return
        if isinstance(method, READS):
            self.flush()
            if order.pending:
                order.wait(lambda: self._handle_now(method))
                return
        self._handle_now(method)

    def _handle_now(self, method: base.Frame) -> None:
        try:
            self._handle(method)
        except BatonError as exc:
            raise ChannelError(error_code(exc), exc.message) from None

    def _run_held(self, step: Callable[[], None]) -> bool:
        """Run a method or publish that waited (broker/amqp_order.py); False once the
        channel has closed."""
        if not self.open or self.owner.closed:
            return False
        try:
            step()
        except ChannelError as exc:
            self.owner.close_channel(self, exc.code, exc.text)
        except ConnectionFault as exc:
            self.owner.fail(exc)
        except Exception:  # a bug: logged with its traceback, the broker goes on
            log.exception("channel %d: error handling a method that waited", self.number)
            self.owner.close_channel(self, 541, "internal error")
        return self.open and not self.owner.closed

    def _handle(self, m: base.Frame) -> None:
        # Anything but a publish goes after the publishes read before it (log order).
        self.flush()
        match m:
            case commands.Basic.Ack():
                self._settle(m.delivery_tag or 0, bool(m.multiple), "accept")
            case commands.Basic.Reject():
                self._settle(m.delivery_tag or 0, False, "fail" if m.requeue else "reject")
            case commands.Basic.Nack():
                self._settle(m.delivery_tag or 0, bool(m.multiple), "release" if m.requeue else "reject")
            case commands.Basic.Qos():
                self._qos(m)
                self._method(commands.Basic.QosOk())
            case commands.Basic.Consume() if m.queue == REPLY_TO:
                self._consume_reply(m)
            case commands.Basic.Consume():
                self._consume(m)
            case commands.Basic.Cancel():
                self._cancel(m.consumer_tag or "")
                if not m.nowait:
                    self._method(commands.Basic.CancelOk(m.consumer_tag))
            case commands.Basic.Get():
                self._basic_get(m)
            case commands.Basic.Recover():
                if not m.requeue:
                    raise ConnectionFault(540, "basic.recover with requeue=false is not supported", (60, 110))
                self._settle(0, True, "release", now=True)  # (not held by a transaction)
                self._method(commands.Basic.RecoverOk())
            case commands.Confirm.Select():
                if self.tx is not None:
                    raise ChannelError(406, tx.TO_CONFIRM)
                self.confirming = True
                if not m.nowait:
                    self._method(commands.Confirm.SelectOk())
            case commands.Channel.Flow():
                self.active = bool(m.active)
                self._method(commands.Channel.FlowOk(self.active))
                if self.active:
                    self.pump()
            case commands.Queue.Declare():
                self._declare(m)
            case commands.Queue.Delete():
                self._delete(m)
            case commands.Queue.Purge():
                self._purge(m)
            case commands.Queue.Bind() | commands.Queue.Unbind():
                self._bind(m)
            case commands.Exchange.Declare():
                self._declare_exchange(m)
            case commands.Exchange.Delete():
                self._delete_exchange(m)
            case commands.Exchange.Bind() | commands.Exchange.Unbind():
                self._bind_exchange(m)
            case commands.Tx.Select():
                if self.confirming:
                    raise ChannelError(406, tx.TO_TX)
                if self.tx is None:
                    self.tx = tx.Transaction()
                self._method(commands.Tx.SelectOk())
            case commands.Tx.Commit():
                self._commit()
            case commands.Tx.Rollback():
                self._rollback()
            case _:
                raise ConnectionFault(540, f"{m.name} is not supported")

    def _method(self, m: base.Frame) -> None:
        self.owner.write(method_frame(self.number, m))

    # -- queues ------------------------------------------------------------------------------

    # -- exchanges ---------------------------------------------------------------------------

    def _exchanges(self) -> ExchangeFacade:
        return ExchangeFacade(self.owner.node, self.owner.rights)

    def _declare_exchange(self, m: commands.Exchange.Declare) -> None:
        if m.exchange:
            check_name("exchange name", m.exchange)
        if m.passive:
            if self.owner.node.state.exchanges.get(m.exchange) is None:
                raise routes.not_found(m.exchange)
            if not m.nowait:
                self._method(commands.Exchange.DeclareOk())
            return
        routes.check_exchange_type(m.exchange, m.exchange_type)
        if m.exchange == routes.DEFAULT_EXCHANGE or m.exchange.startswith("amq."):
            ex = self.owner.node.state.exchanges.get(m.exchange)
            if ex is None or ex.type != m.exchange_type:
                # (RabbitMQ: the amq. prefix is reserved; the default exchange is fixed)
                raise ChannelError(
                    403, f"exchange name '{m.exchange}' contains reserved prefix 'amq.*'"
                    if m.exchange else "operation not permitted on the default exchange",
                )
            if not m.nowait:  # a built-in one, declared as it is
                self._method(commands.Exchange.DeclareOk())
            return
        fut = self._exchanges().declare_exchange(
            m.exchange, m.exchange_type, durable=bool(m.durable),
            auto_delete=bool(m.auto_delete), internal=bool(m.internal),
            arguments=dict(m.arguments or {}),
        )
        self._after(fut, lambda r: None if m.nowait else self._method(
            commands.Exchange.DeclareOk()))

    def _delete_exchange(self, m: commands.Exchange.Delete) -> None:
        if m.exchange == routes.DEFAULT_EXCHANGE:
            raise ChannelError(403, "operation not permitted on the default exchange")
        if self.owner.node.state.exchanges.get(m.exchange) is None:
            # RabbitMQ answers a delete of a missing exchange with DeleteOk.
            self.owner.rights.check("configure", m.exchange, "exchange")
            if not m.nowait:
                self._method(commands.Exchange.DeleteOk())
            return
        fut = self._exchanges().delete_exchange(m.exchange, if_unused=bool(m.if_unused))
        self._after(fut, lambda r: None if m.nowait else self._method(
            commands.Exchange.DeleteOk()))

    def _bind(self, m: commands.Queue.Bind | commands.Queue.Unbind) -> None:
        queue = self._queue_name(m.queue)
        self._locked(queue)
        bind = isinstance(m, commands.Queue.Bind)
        if m.exchange == routes.DEFAULT_EXCHANGE:
            raise ChannelError(
                403, f"operation not permitted on the default exchange (queue '{queue}')"
            )
        # (RabbitMQ: an empty routing key on a bind means the queue's name, the
        # convention of the default exchange; an unbind takes the key as it is.)
        key = m.routing_key if (m.routing_key or not bind) else queue
        facade = self._exchanges()
        arguments = dict(m.arguments or {})
        if isinstance(m, commands.Queue.Bind):
            nowait = bool(m.nowait)
            self._after(facade.bind(queue, m.exchange, key, arguments),
                        lambda r: None if nowait else self._method(commands.Queue.BindOk()))
            if nowait:
                self._routes_changed()
        else:
            # RabbitMQ (since 3.2) answers an unbind of a missing exchange, queue or
            # binding with Unbind-Ok: aio-pika's RPC unbinds from an auto-delete
            # exchange that went with its last binding.
            self._after(facade.unbind(queue, m.exchange, key, arguments),
                        lambda r: self._method(commands.Queue.UnbindOk()),
                        gone_ok=lambda: self._method(commands.Queue.UnbindOk()))

    def _bind_exchange(self, m: commands.Exchange.Bind | commands.Exchange.Unbind) -> None:
        """``Exchange.Bind`` / ``Unbind`` (flag exchange_bindings; before it, 540 as
        RabbitMQ answers a method it does not implement)."""
        if EXCHANGE_BINDINGS not in self.owner.node.state.features.enabled:
            raise ConnectionFault(
                540, "exchange-to-exchange bindings need the feature flag exchange_bindings"
                " (baton feature enable exchange_bindings, once every broker has it)",
                (commands.Exchange.frame_id, m.frame_id),
            )
        for name in (m.destination, m.source):
            if name:
                check_name("exchange name", name)
        if routes.DEFAULT_EXCHANGE in (m.destination, m.source):
            raise ChannelError(403, "operation not permitted on the default exchange")
        facade = self._exchanges()
        arguments = dict(m.arguments or {})
        nowait = bool(m.nowait)
        if isinstance(m, commands.Exchange.Bind):
            self._after(facade.bind_exchange(m.destination, m.source, m.routing_key, arguments),
                        lambda r: None if nowait else self._method(commands.Exchange.BindOk()))
        else:
            # (RabbitMQ answers an unbind of a missing binding or exchange with Unbind-Ok)
            self._after(facade.unbind_exchange(m.destination, m.source, m.routing_key, arguments),
                        lambda r: None if nowait else self._method(commands.Exchange.UnbindOk()),
                        gone_ok=lambda: None if nowait else self._method(
                            commands.Exchange.UnbindOk()))
        if nowait:
            self._routes_changed()

    def _routes_changed(self) -> None:
        """A ``nowait`` bind or unbind was submitted: the client has no Ok to wait for,
        so what it sends next (a publish routed by the bindings applied here) waits
        until it is applied (AMQP's channel order)."""
        if self._order.pending and not self._order.waiting:
            self._order.wait(lambda: None)

    def _after(self, fut: asyncio.Future[Any], then: Callable[[Any], None],
               gone_ok: Callable[[], None] | None = None) -> None:
        """Call ``then`` with a submitted command's result, or close the channel as its
        error says (``gone_ok``: called instead when it failed because its queue or
        exchange does not exist)."""
        self.commands_started(1)
        self._order.track(fut)

        def done(f: asyncio.Future[Any]) -> None:
            self.commands_finished(1)
            if (gone_ok is not None and not f.cancelled()
                    and isinstance(f.exception(), (QueueNotFound, ExchangeNotFound))):
                if self.open and not self.owner.closed:
                    gone_ok()
                return
            if not self._failed(f):
                then(f.result())

        fut.add_done_callback(done)

    def _queue_name(self, name: str) -> str:
        """A method's queue; "" is the last one this channel declared."""
        if name:
            return name
        if not self._last_queue:
            raise ChannelError(406, "no queue named, and none declared on this channel")
        return self._last_queue

    def _locked(self, queue: str) -> None:
        owner = self.owner.exclusive_owner(queue)
        if owner is not None and owner is not self.owner:
            raise ChannelError(405, f"cannot obtain exclusive access to locked queue '{queue}'"
                                    " in vhost '/'")

    def _declare(self, m: commands.Queue.Declare) -> None:
        name = m.queue or f"amq.gen-{secrets.token_urlsafe(16)}"
        state = self.owner.node.state
        rights = self.owner.rights
        check_name("queue name", name)
        if name == REPLY_TO:  # (as RabbitMQ: always there, empty; declared or not)
            if not m.nowait:
                self.owner.write(declare_ok(self.number, name, 0, 0))
            return
        if m.passive:
            rights.check_any(name)
            if name not in self.owner.node.queues:
                raise ChannelError(404, f"no queue '{name}' in vhost '/'")
            self._locked(name)
            self._declared(name, m.nowait)
            return
        if m.queue.startswith("amq."):
            # (RabbitMQ: the prefix is reserved for the names it makes, amq.gen-...;
            # a passive declare of one is fine)
            raise ChannelError(
                403, f"queue name '{m.queue}' contains reserved prefix 'amq.*'"
            )
        rights.check("configure", name)
        options = queue_options(name, dict(m.arguments or {}), m.durable)
        dead_letter = options.get("dead_letter")
        if isinstance(dead_letter, str):
            rights.check("write", dead_letter)
        dead_letter_exchange = options.get("dead_letter_exchange")
        if isinstance(dead_letter_exchange, str):  # its dead letters are published there
            rights.check("write", dead_letter_exchange, "exchange")
        self._locked(name)
        event = declare_event(name, options, rights.name, self.owner.node.state)
        fut = self.owner.node.submit(event)
        self._order.track(fut)
        self.commands_started(1)

        def done(f: asyncio.Future[Any]) -> None:
            self.commands_finished(1)
            if self._failed(f, queue=name):
                return
            if m.exclusive or m.auto_delete:
                self.owner.queue_declared(name, m.exclusive, m.auto_delete)
            self._declared(name, m.nowait)

        fut.add_done_callback(done)

    def _declared(self, name: str, nowait: bool) -> None:
        self._last_queue = name
        if nowait:
            return
        q = self.owner.node.queues.get(name)
        ready = q.ready if q is not None else 0
        consumers = len(self.owner.delivery.consumers_of(name))
        self.owner.write(declare_ok(self.number, name, ready, consumers))

    def _failed(self, f: asyncio.Future[Any], queue: str | None = None) -> bool:
        """A command's future failed: close the channel (or the connection) as it says
        (``queue``: the queue a declare named). Returns whether it failed."""
        if f.cancelled():
            exc: BaseException = BatonError("command cancelled")
        else:
            found = f.exception()
            if found is None:
                return False
            exc = found
        if not self.open or self.owner.closed:
            return True
        if isinstance(exc, BatonError):
            self.owner.close_channel(self, error_code(exc), refusal_text(exc, queue))
        else:
            log.error("channel %d: command failed: %r", self.number, exc)
            self.owner.close_channel(self, 541, "internal error")
        return True

    def _delete(self, m: commands.Queue.Delete) -> None:
        name = self._queue_name(m.queue)
        self.owner.rights.check("configure", name)
        self._locked(name)
        q = self.owner.node.queues.get(name)
        away = elsewhere(self.owner.node, name) if q is None else None
        if away is not None and m.if_empty:  # (its messages are counted elsewhere)
            raise ChannelError(406, f"{away.message}; delete it if-empty there")
        if q is None and away is None:
            # RabbitMQ answers a delete of a missing queue with DeleteOk.
            if not m.nowait:
                self._method(commands.Queue.DeleteOk(0))
            return
        # (RabbitMQ's if-unused is "no consumers": a message a Basic.Get holds, or
        # one just acked, does not keep the queue; consumers on other brokers are not
        # known here, docs/amqp.md)
        if m.if_unused and self.owner.delivery.consumers_of(name):
            raise ChannelError(406, f"queue '{name}' in vhost '/' in use")
        # (RabbitMQ's if-empty is "no ready message": one a Basic.Get or a consumer
        # holds unacked does not keep the queue; a delayed one, which comes back, does)
        if m.if_empty and q is not None and q.ready + len(q.delayed):
            raise ChannelError(406, f"queue '{name}' in vhost '/' is not empty")
        # A queue gone by the time the delete is applied (an auto-delete queue whose last
        # consumer this client cancelled just before: the broker's own DeleteQueue came
        # first) is a DeleteOk too, as RabbitMQ answers a delete of a missing queue.
        self._after(
            self.owner.node.submit(DeleteQueue(name)),
            lambda r: None if m.nowait else self._method(commands.Queue.DeleteOk(r.deleted)),
            gone_ok=lambda: None if m.nowait else self._method(commands.Queue.DeleteOk(0)),
        )

    def _purge(self, m: commands.Queue.Purge) -> None:
        name = self._queue_name(m.queue)
        self.owner.rights.check("configure", name)
        self._locked(name)
        self._command(PurgeQueue(name), lambda r: None if m.nowait else self._method(
            commands.Queue.PurgeOk(r.purged)))

    def _command(self, event: Any, then: Callable[[Any], None]) -> None:
        self._after(self.owner.node.submit(event), then)

    # -- publishing --------------------------------------------------------------------------

    def publish(self, content: Content | Oversized) -> None:
        """A published message, whole (or one above the size limit).

        Raises:
            ChannelError: the channel closes (unknown exchange, no right, too large).
        """
        if self._order.waiting:  # (after the read that waits: see handle)
            self._order.hold(lambda: self.publish(content))
            return
        try:
            self._publish(content)
        except BatonError as exc:
            raise ChannelError(error_code(exc), exc.message) from None

    def check_publish(
        self, method: commands.Basic.Publish, properties: commands.Basic.Properties
    ) -> None:
        """Check a publish at its content header, before its body comes: the user's
        write right on where it goes (docs/amqp.md "Limits").

        Raises:
            ChannelError: the channel closes (403 without the right).
            ConnectionFault: the connection closes.
        """
        try:
            if self._order.waiting:
                # Rights only: where it goes may be declared by a method that waits
                # before it (the route is found when its turn comes).
                if method.exchange == routes.DEFAULT_EXCHANGE:
                    if not method.routing_key.startswith(REPLY_TO + "."):
                        self.owner.rights.check("write", method.routing_key)
                else:
                    self.owner.rights.check("write", method.exchange, "exchange")
                return
            self._route(method, properties)
        except BatonError as exc:
            raise ChannelError(error_code(exc), exc.message) from None

    def _route(
        self, m: commands.Basic.Publish, properties: commands.Basic.Properties
    ) -> list[str]:
        """The queues a publish goes to, once the user's rights allow it."""
        if m.immediate:
            raise ConnectionFault(540, "immediate=true", (60, 40))  # (as RabbitMQ)
        if properties.headers:
            # Before anything walks them recursively: deep nesting is refused here.
            check_headers(properties.headers)
        if m.exchange == routes.DEFAULT_EXCHANGE:
            # Write on the queue the routing key names, whether it exists or not, before
            # routing: a user without the right gets 403 for a queue that exists and for
            # one that does not alike, so a (mandatory) publish cannot tell which queues
            # exist (docs/amqp.md).
            if not m.routing_key.startswith(REPLY_TO + "."):
                # (a reply queue's random name is the right to reply, as RabbitMQ)
                self.owner.rights.check("write", m.routing_key)
        node = self.owner.node
        queues = routes.route(node.state, routable(node), m.exchange, m.routing_key,
                              properties.headers or {})
        if m.exchange != routes.DEFAULT_EXCHANGE:
            # (as RabbitMQ: write on the exchange, whatever queues it routes to)
            self.owner.rights.check("write", m.exchange, "exchange")
        return queues

    def _publish(self, content: Content | Oversized) -> None:
        m = content.method
        if isinstance(content, Oversized):
            raise ChannelError(
                406, f"message size {content.size} is larger than configured max size"
                f" {self.owner.config.max_message}"
            )
        if content.properties.reply_to == REPLY_TO:
            if self._reply is None:
                raise ChannelError(406, "fast reply consumer does not exist")
            content.properties.reply_to = self._reply[1]
        queues = self._route(m, content.properties)
        if self.tx is not None:
            self._headers(content)  # (checked now; routed again at the commit)
            try:
                self.tx.hold_publish(content, len(content.body))
            except tx.TooLarge as exc:
                raise ChannelError(406, str(exc)) from None
            return
        self._publish_routed(content, queues)

    def _publish_routed(self, content: Content, queues: list[str]) -> None:
        """A publish routed to ``queues`` (none: returned if mandatory)."""
        m = content.method
        seq = 0
        if self.confirming:
            self._seq += 1
            seq = self._seq
            self._unconfirmed[seq] = None
        if not queues:
            if m.mandatory:
                self.owner.write(content_frames(
                    self.number,
                    commands.Basic.Return(312, "NO_ROUTE", m.exchange, m.routing_key),
                    # (written back through the Baton form: pamqp cannot write every
                    # value it reads)
                    to_properties(to_headers(content.properties), {}), content.body,
                    self.owner.frame_max,
                ))
            if seq:
                self._confirmed(seq, True)
            return
        headers = self._headers(content)
        ttl = message_ttl(content.properties.expiration, self.owner.node.state)
        priority = min(content.properties.priority or 0, 9)
        if len(queues) > 1 or self._keeps_key(queues[0], m.routing_key):
            # One atomic append onto every routed queue, after what this channel
            # published before it; confirmed once every queue has it, nacked if any
            # refused it (a full queue with reject-publish), as RabbitMQ does. (Also
            # one queue that dead-letters by the key a message was published with.)
            self.flush()
            self._fan_out(seq, queues, content.body, headers, priority, m, ttl)
            return
        p = _Publish(seq, content.body, headers, self.owner.next_key(), priority, ttl)
        self._publishes.setdefault(queues[0], []).append(p)

    def _keeps_key(self, queue: str, routing_key: str) -> bool:
        """Does ``queue`` keep the routing key its messages were published with (its
        dead letters go through an exchange by it), which is not its name? An Enqueue
        names no key: such a publish goes as a RoutedEnqueue, which does."""
        q = self.owner.node.queues.get(queue)
        return q is not None and q.tracks_keys and routing_key != queue

    def _headers(self, content: Content) -> dict[str, Any]:
        """A publish's headers as Baton stores them.

        Raises:
            MessageTooLarge: above the broker's ``max_headers``.
        """
        m = content.method
        headers = to_headers(content.properties, m.exchange, m.routing_key)
        if headers:
            size = len(self._packer.pack(headers))
            if size > self.owner.config.max_headers:
                raise MessageTooLarge(
                    f"headers of {size} bytes are above the maximum of"
                    f" {self.owner.config.max_headers}"
                )
        return headers

    # -- transactions (broker/amqp_tx.py) ------------------------------------------------

    def _commit(self) -> None:
        """``tx.commit``: submit what the transaction held (the publishes, routed now,
        then the settlements); ``Commit-Ok`` once all are applied here, or the channel
        closes (406) if one failed. What the client sends next waits behind it."""
        if self.tx is None:
            raise ChannelError(406, tx.NOT_TRANSACTIONAL)
        publishes, settlements = self.tx.take()
        futures: list[tuple[asyncio.Future[Any], bool]] = []
        self._collect = futures
        try:
            for content in publishes:
                self._publish_routed(content, self._route(content.method, content.properties))
            self.flush()
            for how, entries in settlements:
                self._settle_entries(how, entries)
        finally:
            self._collect = None

        def committed() -> None:
            if tx.failed(futures):
                raise ChannelError(406, tx.PARTIAL)
            self._method(commands.Tx.CommitOk())

        if self._order.pending:
            self._order.wait(committed)
        else:
            committed()

    def _rollback(self) -> None:
        """``tx.rollback``: drop the held publishes; the held settlements' deliveries
        are the client's to settle again."""
        if self.tx is None:
            raise ChannelError(406, tx.NOT_TRANSACTIONAL)
        _, settlements = self.tx.take()
        if settlements:
            for _, entries in settlements:
                self._unacked.update(entries)
            self._unacked = dict(sorted(self._unacked.items()))
        self._method(commands.Tx.RollbackOk())

    def _fan_out(self, seq: int, queues: list[str], body: bytes, headers: dict[str, Any],
                 priority: int, m: commands.Basic.Publish, ttl: int | None = None) -> None:
        event = RoutedEnqueue(
            tuple(queues), ((body, headers),), ((self.owner.next_key(), 1),),
            m.exchange, m.routing_key, priority=priority, ttls=() if ttl is None else (ttl,),
        )
        check_event(event)
        fut = self.owner.node.submit(event)
        self._order.track(fut)
        if self._collect is not None:
            self._collect.append((fut, False))
        self.commands_started(1)

        def done(f: asyncio.Future[Routed]) -> None:
            self.commands_finished(1)
            ok = not f.cancelled() and f.exception() is None and not f.result().full
            if not f.cancelled() and f.exception() is not None:
                exc = f.exception()
                if not isinstance(exc, BatonError):
                    log.error("publish to %s failed: %r", ", ".join(queues), exc)
            if seq:
                self._confirmed(seq, ok)

        fut.add_done_callback(done)

    def flush(self) -> None:
        """Submit the publishes read so far: one Enqueue per queue, or one per
        message where merging could change the outcome (a queue with max_length, a
        priority)."""
        if not self._publishes:
            return
        pending, self._publishes = self._publishes, {}
        queues = self.owner.node.queues
        for queue, items in pending.items():
            q = queues.get(queue)
            if q is None or q.max_length is not None or q.max_priority:
                for p in items:
                    self._submit(queue, [p], p.priority if q is not None and q.max_priority else 0)
            else:
                self._submit(queue, items, 0)

    def _submit(self, queue: str, items: list[_Publish], priority: int) -> None:
        event = Enqueue(
            queue,
            tuple((p.body, p.headers) for p in items),
            tuple((p.key, 1) for p in items),
            priority=priority,
            ttls=tuple(p.ttl for p in items) if any(p.ttl is not None for p in items) else (),
        )
        fut = self.owner.node.submit(event)
        self._order.track(fut)
        if self._collect is not None:
            self._collect.append((fut, False))
        self.commands_started(len(items))
        seqs = [p.seq for p in items if p.seq]

        def done(f: asyncio.Future[Enqueued]) -> None:
            self.commands_finished(len(items))
            ok = not f.cancelled() and f.exception() is None
            if not ok and not f.cancelled():
                exc = f.exception()
                if not isinstance(exc, BatonError):
                    log.error("publish to %s failed: %r", queue, exc)
            for s in seqs:
                self._confirmed(s, ok)

        fut.add_done_callback(done)

    def _confirmed(self, seq: int, ok: bool) -> None:
        if seq in self._unconfirmed:
            self._unconfirmed[seq] = ok
        if not self._confirm_soon:
            self._confirm_soon = True
            asyncio.get_running_loop().call_soon(self._send_confirms)

    def _send_confirms(self) -> None:
        """Tell the publisher what is durable: one ``Basic.Ack`` with multiple for the
        run of confirmed publishes from the oldest unconfirmed on, then each other
        outcome known alone (a failed one as ``Basic.Nack``)."""
        self._confirm_soon = False
        if not self.open:
            return
        pending = self._unconfirmed
        last = run = 0
        for seq, outcome in pending.items():
            if outcome is not True:
                break
            last, run = seq, run + 1
        out: list[base.Frame] = []
        if run:
            # (Those told alone before are no longer pending: the run may have gaps.)
            for _ in range(run):
                del pending[next(iter(pending))]
            out.append(commands.Basic.Ack(last, multiple=run > 1))
        for seq, outcome in list(pending.items()):
            if outcome is None:
                continue
            del pending[seq]
            out.append(commands.Basic.Ack(seq) if outcome else commands.Basic.Nack(seq, requeue=False))
        for frame in out:
            self._method(frame)

    # -- consuming ---------------------------------------------------------------------------

    def _add(self, queue: str, prefetch: int, tag: str, no_ack: bool, getter: bool) -> _Sub:
        self._next_int += 1
        c = self.owner.delivery.add(queue, prefetch, self, self._next_int, counters=True)
        c.counted = not getter
        sub = _Sub(tag, c, no_ack, getter)
        self._by_int[self._next_int] = sub
        if not getter:
            self._subs[tag] = sub
        return sub

    def _consume(self, m: commands.Basic.Consume, reply: bool = False) -> None:
        queue = self._queue_name(m.queue)
        if not reply:  # (the channel's own reply queue: no right needed, as RabbitMQ)
            self.owner.rights.check("read", queue)
        self._locked(queue)
        here = queue in self.owner.node.queues
        relayed = None if here else self._relayed_partition(queue)
        if not here and relayed is None:
            self._served_elsewhere(queue)
            raise ChannelError(404, f"no queue '{queue}' in vhost '/'")
        if "x-stream-offset" in (m.arguments or {}):
            # (a queue declared as a stream is a Baton queue: no offsets to start at)
            raise ChannelError(
                406, f"x-stream-offset on queue '{queue}': Baton's queues are not streams"
                " (a consumed message leaves the queue)"
            )
        tag = m.consumer_tag or f"amq.ctag-{secrets.token_urlsafe(16)}"
        if tag in self._subs:
            raise ConnectionFault(530, f"attempt to reuse consumer tag '{tag}'", (60, 20))
        if relayed is not None:
            self._consume_relayed(m, queue, tag, relayed)
            return
        # An exclusive consumer is the queue's only one, as RabbitMQ: refused while
        # it has consumers, and none joins it (per broker: consumers on other brokers
        # are not replicated, docs/amqp.md).
        others = self.owner.delivery.consumers_of(queue)
        if others and (m.exclusive or any(c.exclusive for c in others)):
            raise AccessRefused(f"queue '{queue}' in vhost '/' in exclusive use")
        prefetch = self._consumer_limits(bool(m.no_ack))
        shared = self.global_prefetch and not m.no_ack
        sub = self._add(queue, 0 if shared else prefetch, tag, m.no_ack, False)
        sub.consumer.exclusive = bool(m.exclusive)
        sub.limit = prefetch
        if shared:
            self._share()
        if not m.nowait:
            self._method(commands.Basic.ConsumeOk(tag))
        self.owner.delivery.pump(sub.consumer.queue)

    def _relayed_partition(self, queue: str) -> int | None:
        """The data partition of ``queue`` if one of its replicas serves this broker's
        consumers of it (replica groups: this broker does not replicate it), else None."""
        node = self.owner.node
        if self.owner.peers is None or not isinstance(node, Partitioned):
            return None
        if elsewhere(node, queue) is None:
            return None
        return node.state.placement.get(queue)

    def _consume_relayed(self, m: commands.Basic.Consume, queue: str, tag: str, k: int) -> None:
        """A consumer of a queue that other brokers replicate: one of them serves it,
        relayed over the peer link (broker/relay.py, docs/amqp.md "Replica groups"). Its
        prefetch is the replica's consumer's; under a shared (global) prefetch it gets
        at most that prefetch on its own. ``Consume-Ok`` once the replica took it."""
        peers = self.owner.peers
        assert peers is not None
        no_ack = bool(m.no_ack)
        prefetch = self._consumer_limits(no_ack)
        if self.global_prefetch and not no_ack:
            prefetch = min(prefetch, self.global_prefetch)
        self._next_int += 1
        n = self._next_int
        record = Consumer(n, "", queue, prefetch, self, counters=True)
        record.exclusive = bool(m.exclusive)
        relay = Relay(peers, k, queue, self, n)
        sub = _Sub(tag, record, no_ack, limit=prefetch, relay=relay)
        self._by_int[n] = sub
        self._subs[tag] = sub
        fut = asyncio.ensure_future(
            relay.start(wire.Subscribe(0, queue, prefetch, {"counters": True}))
        )
        self._order.track(fut)
        self.commands_started(1)

        def done(f: asyncio.Future[str]) -> None:
            self.commands_finished(1)
            _quiet(f)

        def started() -> None:
            exc = fut.exception() if not fut.cancelled() else ConnectionClosed("cancelled")
            if exc is not None:
                if self._by_int.get(n) is sub:
                    del self._by_int[n]
                if self._subs.get(tag) is sub:
                    del self._subs[tag]
                if isinstance(exc, BatonError):
                    raise ChannelError(error_code(exc), exc.message)
                raise exc
            if not m.nowait:
                self._method(commands.Basic.ConsumeOk(tag))
            relay.ready()  # (after the Consume-Ok: its deliveries)

        fut.add_done_callback(done)
        self._order.wait(started)

    def _consumer_limits(self, no_ack: bool) -> int:
        """The prefetch of a new consumer, once the connection's and the user's limits
        allow one more.

        Raises:
            LimitExceeded: ``max_consumers`` (the connection's or the user's) or
                ``max_connection_prefetch``.
        """
        cfg = self.owner.config
        prefetch = min(self.prefetch or DEFAULT_PREFETCH, cfg.max_prefetch)
        if no_ack:
            prefetch = min(DEFAULT_PREFETCH, cfg.max_prefetch)
        count, total = self.owner.consumer_load()
        if count >= cfg.max_consumers:
            raise LimitExceeded(
                f"a connection may have {cfg.max_consumers} consumers at once (max_consumers)"
            )
        rights = self.owner.rights
        check_user_limit(self.owner.node.state.users, rights.name, "max_consumers",
                         self.owner.user_consumers())
        if total + prefetch > cfg.max_connection_prefetch:
            raise LimitExceeded(
                f"the prefetch of a connection's consumers may add up to"
                f" {cfg.max_connection_prefetch} (max_connection_prefetch), this would be"
                f" {total + prefetch}"
            )
        return prefetch

    def _consume_reply(self, m: commands.Basic.Consume) -> None:
        """Direct reply-to (RabbitMQ's ``amq.rabbitmq.reply-to``, docs/amqp.md): a
        consumer of the pseudo-queue consumes a queue made for it, non-durable,
        exclusive and auto-delete, named ``amq.rabbitmq.reply-to.<random>``; the
        channel's publishes with ``reply_to`` = the pseudo-queue name that queue, so
        replies published to it by the default exchange, on any broker, come back here.

        Raises:
            ChannelError: 406, a consumer that acks, or a second one on the channel.
            LimitExceeded: one consumer more than the limits allow (before any queue).
        """
        if not m.no_ack:
            raise ChannelError(406, "reply consumer cannot acknowledge")
        if self._reply is not None:
            raise ChannelError(406, "reply consumer already set")
        tag = m.consumer_tag or f"amq.ctag-{secrets.token_urlsafe(16)}"
        if tag in self._subs:
            raise ConnectionFault(530, f"attempt to reuse consumer tag '{tag}'", (60, 20))
        self._consumer_limits(True)
        name = f"{REPLY_TO}.{secrets.token_urlsafe(18)}"
        event = declare_event(name, queue_options(name, {}, False), self.owner.rights.name,
                              self.owner.node.state)
        fut = self.owner.node.submit(event)
        self._order.track(fut)
        self.commands_started(1)
        self._reply = (tag, name)

        def done(f: asyncio.Future[Any]) -> None:
            self.commands_finished(1)
            if self._failed(f, queue=name):
                return
            if self.open and not self.owner.closed:
                self.owner.queue_declared(name, True, True)
            else:  # (closed meanwhile: no consumer will ever end it)
                self.owner.node.submit(DeleteQueue(name)).add_done_callback(_quiet)

        def start() -> None:
            try:
                self._consume(commands.Basic.Consume(
                    queue=name, consumer_tag=tag, no_ack=True, exclusive=True,
                    nowait=m.nowait, arguments=m.arguments), reply=True)
            except BatonError as exc:
                raise ChannelError(error_code(exc), exc.message) from None

        fut.add_done_callback(done)
        # The consumer starts once the queue is applied here; what the client sends
        # next waits behind it (a publish naming it as its reply_to goes after).
        self._order.wait(start)

    def _replies(self, sub: _Sub) -> bool:
        """Is ``sub`` the channel's direct reply-to consumer?"""
        return self._reply is not None and self._reply == (sub.tag, sub.consumer.queue)

    def _cancel(self, tag: str) -> None:
        """Stop a consumer: it gets nothing more, and ends once the messages it had are
        settled (they stay the client's to ack, as in AMQP)."""
        sub = self._subs.pop(tag, None)
        if sub is None:
            return
        if self._reply is not None and self._reply[0] == tag:
            self._reply = None  # (its queue goes with it: auto-delete)
        sub.cancelled = True
        sub.consumer.prefetch = 0
        sub.consumer.counted = False
        self._end_if_settled(sub)

    def _end_if_settled(self, sub: _Sub) -> None:
        """End a cancelled consumer once it holds nothing (looked at again while an
        acquire of it is in flight)."""
        c = sub.consumer
        if not sub.cancelled or c.closed or not self.open:
            return
        if sub.relay is not None:
            if c.held or c.settling:
                return  # (looked at again when a settlement is answered)
            self._by_int.pop(c.tag, None)
            c.closed = True
            # (what came after the client's last message goes back, not failed)
            closing = sub.relay.close(received=sub.relay.received)
            if not sub.getter:
                self.owner.consumer_gone(c.queue)
            elif closing is None:
                self._get_ended(sub)
            else:
                closing.add_done_callback(lambda _: self._get_ended(sub))
            return
        if c.held or c.acquiring or c.settling:
            if not c.held:
                asyncio.get_running_loop().call_later(0.2, self._end_if_settled, sub)
            return
        self._by_int.pop(c.tag, None)
        self.owner.delivery.remove(c)
        self.owner.consumer_gone(c.queue)
        self._share()
        self.pump()

    def _served_elsewhere(self, queue: str, doing: str = "consume from") -> None:
        """A queue whose data partition other brokers apply (replica groups), which
        cannot be relayed from here (no peer links; a Basic.Get): refused (404, as
        RabbitMQ for a queue whose node is out of reach) with one sentence naming them
        (docs/design.md §16, docs/amqp.md "Replica groups")."""
        why = elsewhere(self.owner.node, queue, doing)
        if why is not None:
            raise ChannelError(404, why.message)

    def _basic_get(self, m: commands.Basic.Get) -> None:
        queue = self._queue_name(m.queue)
        self.owner.rights.check("read", queue)
        self._locked(queue)
        q = self.owner.node.queues.get(queue)
        if q is None:
            k = self._relayed_partition(queue)
            if k is not None:
                self._basic_get_relayed(m, queue, k)
                return
            self._served_elsewhere(queue, "get from")
            raise ChannelError(404, f"no queue '{queue}' in vhost '/'")
        if self._get is not None:
            self._get_empty()  # (a client that did not wait for the last answer)
        if q.ready == 0:
            self._method(commands.Basic.GetEmpty())
            return
        sub = self._getters.get(queue)
        if sub is None or sub.consumer.closed:
            if len(self._getters) >= _MAX_GETTERS:
                self._drop_idle_getters()
            sub = self._add(queue, 0, "", False, True)
            self._getters[queue] = sub
        loop = asyncio.get_running_loop()
        get = _Get(sub, m.no_ack, loop.time() + GET_WAIT)
        sub.no_ack = m.no_ack
        self._get = get
        c = sub.consumer
        c.prefetch = len(c.held) + 1
        c.paused_until = 0.0  # (asked for now: not the pause after its own release)
        self.owner.delivery.pump(queue)
        get.timer = loop.call_later(_GET_POLL, self._get_check)

    def _basic_get_relayed(self, m: commands.Basic.Get, queue: str, k: int) -> None:
        """``Basic.Get`` of a queue that other brokers replicate (docs/amqp.md "Replica
        groups"): ``Get-Empty`` if a replica has no ready message, else a consumer of
        prefetch 1 relayed to a replica for this one message; it ends once the message
        is settled (at once for ``no_ack``), or with ``Get-Empty`` if none came within
        :data:`GET_WAIT`."""
        peers = self.owner.peers
        assert peers is not None
        if self._get is not None:
            self._get_empty()  # (a client that did not wait for the last answer)
        self._next_int += 1
        n = self._next_int
        record = Consumer(n, "", queue, 1, self, counters=True)
        record.counted = False
        relay = Relay(peers, k, queue, self, n)
        sub = _Sub("", record, bool(m.no_ack), getter=True, limit=1, relay=relay)

        async def fetch() -> bool:
            # A getter of this queue whose message is settled may have taken the next
            # one meanwhile, which its cancel gives back: wait for that first (a client
            # that gets one message at a time then sees every one).
            ending = [
                e.ended for e in self._gets_ending.values()
                if e.ended is not None and e.consumer.queue == queue and not e.consumer.held
            ]
            if ending:
                await asyncio.wait(ending, timeout=GET_WAIT)
            if await relay.ready_messages() == 0:
                return False
            await relay.start(wire.Subscribe(0, queue, 1, {"counters": True}))
            return True

        self._by_int[n] = sub  # (a channel that closes meanwhile ends its relay)
        fut = asyncio.ensure_future(fetch())
        self._order.track(fut)
        self.commands_started(1)

        def done(f: asyncio.Future[bool]) -> None:
            self.commands_finished(1)
            _quiet(f)

        def answer() -> None:
            exc = fut.exception() if not fut.cancelled() else ConnectionClosed("cancelled")
            if exc is not None or not fut.result():
                self._by_int.pop(n, None)
                relay.close(received=0)
                if exc is None:
                    self._method(commands.Basic.GetEmpty())
                    return
                if isinstance(exc, BatonError):
                    raise ChannelError(error_code(exc), exc.message)
                raise exc
            if self._get is not None:
                self._get_empty()
            loop = asyncio.get_running_loop()
            get = _Get(sub, bool(m.no_ack), loop.time() + GET_WAIT)
            self._get = get
            get.timer = loop.call_later(GET_WAIT, self._get_check)
            relay.ready()

        fut.add_done_callback(done)
        self._order.wait(answer)

    def _get_ended(self, sub: _Sub) -> None:
        """A relayed getter's consumer has ended on its replica."""
        self._gets_ending.pop(sub.consumer.tag, None)
        if sub.ended is not None and not sub.ended.done():
            sub.ended.set_result(None)

    def _drop_idle_getters(self) -> None:
        """End the getters that hold nothing (a channel that gets from many queues
        keeps a consumer for only the last few)."""
        for queue, sub in list(self._getters.items()):
            c = sub.consumer
            if not c.held and not c.acquiring and not c.settling:
                del self._getters[queue]
                self._by_int.pop(c.tag, None)
                self.owner.delivery.remove(c)

    def _get_check(self) -> None:
        get = self._get
        if get is None or not self.open:
            return
        c = get.sub.consumer
        q = self.owner.node.queues.get(c.queue)
        now = asyncio.get_running_loop().time()
        if get.sub.relay is not None:  # (relayed: its replica delivers, or the time is up)
            if now >= get.deadline:
                self._get_empty()
            else:
                get.timer = asyncio.get_running_loop().call_later(
                    get.deadline - now, self._get_check)
            return
        if q is None or now >= get.deadline or (q.ready == 0 and not c.acquiring):
            self._get_empty()
            return
        get.timer = asyncio.get_running_loop().call_later(_GET_POLL, self._get_check)

    def _get_empty(self) -> None:
        """Answer the Basic.Get waiting with GetEmpty."""
        get, self._get = self._get, None
        if get is None:
            return
        if get.timer is not None:
            get.timer.cancel()
        get.sub.consumer.prefetch = 0
        self._method(commands.Basic.GetEmpty())
        if get.sub.relay is not None:  # (one Basic.Get, one relayed consumer)
            get.sub.cancelled = True
            self._end_if_settled(get.sub)

    def consumers(self) -> list[Consumer]:
        """This channel's consumers (not its getters), in the order they started."""
        return [s.consumer for s in self._by_int.values() if not s.getter]

    def load(self) -> tuple[int, int]:
        """This channel's consumers, and the sum of their own prefetch."""
        subs = [s for s in self._by_int.values() if not s.getter]
        return len(subs), sum(s.limit for s in subs)

    def _qos(self, m: commands.Basic.Qos) -> None:
        """``Basic.Qos``: per consumer (``global`` false) or for the channel's consumers
        together (true). Either takes effect at once for the consumers already running on
        the channel, as for those started after it (kombu raises a running consumer's
        prefetch for each ETA task it holds, docs/amqp.md "Frameworks").

        Raises:
            ChannelError: 406, a negative prefetch.
            LimitExceeded: raising the running consumers' prefetch would take the
                connection's past ``max_connection_prefetch``.
        """
        if m.prefetch_count < 0:
            raise ChannelError(406, "prefetch_count must not be negative")
        # (a relayed consumer keeps the prefetch it subscribed with on its replica)
        subs = [s for s in self._by_int.values()
                if not (s.getter or s.cancelled or s.no_ack or s.relay)]
        if m.global_:
            self.global_prefetch = m.prefetch_count
        else:
            cfg = self.owner.config
            limit = min(m.prefetch_count or DEFAULT_PREFETCH, cfg.max_prefetch)
            grow = sum(limit - s.limit for s in subs)
            total = self.owner.consumer_load()[1]
            if grow > 0 and total + grow > cfg.max_connection_prefetch:
                raise LimitExceeded(
                    f"the prefetch of a connection's consumers may add up to"
                    f" {cfg.max_connection_prefetch} (max_connection_prefetch), this would be"
                    f" {total + grow}"
                )
            self.prefetch = m.prefetch_count
            for s in subs:
                s.limit = limit
        if self.global_prefetch:
            self._share()
        else:
            for s in subs:
                s.consumer.prefetch = s.limit
                s.consumer.refill = max(1, s.limit // 2)
        self.pump()

    def _share(self) -> None:
        """``Basic.Qos`` global: the channel's consumers may hold ``global_prefetch``
        messages together. Each consumer's prefetch is what it holds (or is acquiring)
        plus its share of what is free, so their credits never add up to more; called
        whenever what they hold goes down (a settle) or they come and go."""
        limit = self.global_prefetch
        subs = [s for s in self._by_int.values()
                if not (s.getter or s.cancelled or s.no_ack or s.relay)]
        if not limit or not subs:
            return
        taken = [len(s.consumer.held) + s.consumer.acquiring for s in subs]
        free = max(0, limit - sum(taken))
        n = len(subs)
        self._turn = (self._turn + 1) % n
        for i, (s, t) in enumerate(zip(subs, taken)):
            share = free // n + (1 if (i - self._turn) % n < free % n else 0)
            c = s.consumer
            c.prefetch = min(s.limit, t + share)
            c.refill = max(1, share // 2)  # (a small share must still be asked for)

    def pump(self) -> None:
        """Deliver again where this channel's consumers wait (flow on, writable)."""
        for q in {s.consumer.queue for s in self._by_int.values() if s.relay is None}:
            self.owner.delivery.pump(q)

    # -- settling ----------------------------------------------------------------------------

    def _settle(self, tag: int, multiple: bool, how: str, now: bool = False) -> None:
        """Settle delivery ``tag`` (with ``multiple``, every one up to it; tag 0 with
        multiple: all). ``how``: accept, fail (failed release), release ("not now"),
        reject (dead-letter or drop). On a transactional channel the settlement is
        held until the commit (``now``: it is not, Basic.Recover's).

        Raises:
            ChannelError: 406, a tag this channel has not delivered or was settled.
        """
        unacked = self._unacked
        if multiple:
            tags = [t for t in unacked if t <= tag or tag == 0]
        else:
            if tag not in unacked:
                raise ChannelError(406, f"unknown delivery tag {tag}")
            tags = [tag]
        entries = [(t, unacked.pop(t)) for t in tags]
        if self.tx is not None and not now:
            try:
                self.tx.hold_settlement(how, entries)
            except tx.TooLarge as exc:
                raise ChannelError(406, str(exc)) from None
            return
        self._settle_entries(how, entries)

    def _settle_entries(self, how: str, entries: list[tuple[int, tuple[_Sub, int]]]) -> None:
        """Settle these deliveries (taken from the unacked map), one command per consumer."""
        by_sub: dict[int, tuple[_Sub, list[int]]] = {}
        for _, (sub, position) in entries:
            by_sub.setdefault(id(sub), (sub, []))[1].append(position)
        for sub, positions in by_sub.values():
            if sub.consumer.closed:
                continue  # its queue went, or the channel closed: nothing to settle
            fut = self._settle_positions(sub.consumer, positions, how)
            if fut is not None:
                self._order.track(fut)
                if self._collect is not None:
                    self._collect.append((fut, True))

    def _settle_positions(
        self, c: Consumer, positions: list[int], how: str
    ) -> asyncio.Future[Settled] | None:
        held = c.held
        mine = [p for p in positions if held.pop(p, None) is not None]
        if not mine or c.closed:
            return None
        sub = self._by_int.get(c.tag)
        if sub is not None and sub.consumer is c and sub.relay is not None:
            return self._settle_relayed(sub, sub.relay, mine, how)
        c.settled_positions(mine)
        c.settling += len(mine)
        delivery = self.owner.delivery
        event: Accept | Release | Reject
        if how == "accept":
            event = Accept(c.queue, c.cid, tuple(mine))
        elif how == "reject":
            event = Reject(c.queue, c.cid, tuple(mine))
        else:
            event = Release(c.queue, c.cid, tuple(mine), failed=how == "fail")
            delivery.released(c)
        fut = self.owner.node.submit(event)
        self._share()

        def settled(f: asyncio.Future[Settled]) -> None:
            c.settling -= len(mine)
            if f.cancelled() or f.exception() is not None:
                held.update(dict.fromkeys(mine, -1))  # still ours: released on close
                self._share()
            delivery.settled(c)
            sub = self._by_int.get(c.tag)
            if sub is not None and sub.consumer is c:
                self._end_if_settled(sub)

        fut.add_done_callback(settled)
        delivery.settled(c)
        if self.global_prefetch:
            self.pump()  # (the shares of its other consumers grew too)
        return fut

    def _settle_relayed(
        self, sub: _Sub, relay: Relay, positions: list[int], how: str
    ) -> asyncio.Future[Any]:
        """Settle what a relayed consumer held: the native frame to its replica."""
        c = sub.consumer
        frame: wire.Ack | wire.Release | wire.Reject
        if how == "accept":
            frame = wire.Ack(0, 0, positions)
        elif how == "reject":
            frame = wire.Reject(0, 0, positions)
        else:
            frame = wire.Release(0, 0, positions, failed=how == "fail")
        c.settling += len(positions)
        fut = relay.settle(frame)
        if sub.getter:
            # A Basic.Get's one message: its consumer ends right behind the settlement
            # (the frames go in order), before the replica could acquire another for it.
            sub.cancelled = c.closed = True
            if self._by_int.get(c.tag) is sub:
                del self._by_int[c.tag]
            relay.close(received=relay.received)

        def settled(f: asyncio.Future[Any]) -> None:
            # (a failure: the link broke and the replica gave back what it held)
            _quiet(f)
            c.settling -= len(positions)
            self._end_if_settled(sub)

        fut.add_done_callback(settled)
        return fut

    # -- closing -----------------------------------------------------------------------------

    def rights_changed(self) -> None:
        """The connection's user may have lost its read right on some of this
        channel's queues: those consumers end at once (what they held goes back to the
        queue, not as a failed delivery; acks of it are ignored), and a client that
        takes a server's Basic.Cancel (consumer_cancel_notify) is told, as RabbitMQ
        tells of a consumer whose queue went. A Basic.Get checks the right itself."""
        rights = self.owner.rights
        ended = False
        for number, sub in list(self._by_int.items()):
            c = sub.consumer
            if sub.getter or c.closed or rights.allowed("read", c.queue) or self._replies(sub):
                continue  # (the channel's reply consumer needs no right)
            del self._by_int[number]
            self._subs.pop(sub.tag, None)
            if sub.relay is not None:
                c.closed = True
                sub.relay.close(received=0)
            else:
                self.owner.delivery.remove(c, received=0)
            self.owner.consumer_gone(c.queue)
            ended = True
            if self.open and self.owner.cancel_notify and not sub.cancelled:
                self._method(commands.Basic.Cancel(sub.tag, nowait=True))
        if ended:
            self._share()
            self.pump()

    def release_all(self) -> list[asyncio.Future[Any]]:
        """The channel closes (or its connection ends): every consumer ends and what
        it held goes back (a failed delivery for what the client had). Returns the
        completions of those returns (``Channel.Close-Ok`` waits for them)."""
        self.open = False
        self._publishes.clear()
        self.tx = None  # (what it held is dropped; the deliveries go back below)
        self._order.clear()
        if self._get is not None and self._get.timer is not None:
            self._get.timer.cancel()
        self._get = None
        delivery = self.owner.delivery
        returns: list[asyncio.Future[Any]] = []
        for sub in list(self._by_int.values()):
            fut: asyncio.Future[Any] | None
            if sub.relay is not None:
                sub.consumer.closed = True
                fut = sub.relay.close()  # (its replica gives back what it held)
            else:
                fut = delivery.remove(sub.consumer)
            if fut is not None:
                returns.append(fut)
            if not sub.getter:
                self.owner.consumer_gone(sub.consumer.queue)
        self._by_int.clear()
        self._subs.clear()
        self._getters.clear()
        self._unacked.clear()
        self._unconfirmed.clear()
        return returns


def _quiet(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
