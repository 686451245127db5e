"""One AMQP 0-9-1 client connection: the handshake, heartbeats and channels (docs/amqp.md).

:class:`AmqpConnection` is the asyncio Protocol of the broker's AMQP listener
(``--amqp-listen``). It reads with the sans-IO :class:`~batonmq.broker.amqp_codec.AmqpCodec`
and does the connection class itself: the protocol header, ``Connection.Start`` /
``StartOk`` (SASL PLAIN and AMQPLAIN against Baton's users, ``guest`` from loopback
only), ``Tune`` / ``TuneOk`` (frame size, channels, heartbeats both ways), ``Open``
(vhost ``/`` only), and the ``Close`` handshakes. Each channel's methods go to its
:class:`~batonmq.broker.amqp_channel.Channel`.

A client's mistake closes its channel or its connection with the reply code AMQP
gives it, and a line at INFO at most; a bug here is logged with its traceback and
closes the connection with 541, never the broker.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from typing import Any, Final, Protocol, cast

from pamqp import base, commands

from batonmq.broker.access import Rights, check_user_limit
from batonmq.broker.amqp_login import MECHANISMS, check_login
from batonmq.broker.admission import LoginGate, QuietLog
from batonmq.broker.amqp_channel import Channel
from batonmq.broker.amqp_codec import (
    BodyStart,
    HEARTBEAT,
    PROTOCOL_HEADER,
    AmqpCodec,
    ChannelError,
    ConnectionFault,
    Content,
    Heartbeat,
    Method,
    Oversized,
    ProtocolHeader,
    method_frame,
    reply_text,
)
from batonmq.broker.config import BrokerConfig
from batonmq.broker.delivery import Consumer, Delivery
from batonmq.broker.exchanges import EXCHANGE_BINDINGS
from batonmq.broker.inspect import ConnectionView
from batonmq.broker.memory import BodyBudget
from batonmq.broker.networks import LOOPBACK, Networks, allows
from batonmq.broker.peers import Peers
from batonmq.cluster.errors import AccessRefused, LimitExceeded
from batonmq.cluster.events import DeleteQueue
from batonmq.cluster.node import Node
from batonmq.cluster.users import Users

__all__ = ["AmqpBroker", "AmqpConnection", "CHANNEL_MAX", "FRAME_MAX", "HEARTBEAT_S", "check_login"]

log = logging.getLogger("baton.amqp")

#: The frame size the broker offers in Tune (RabbitMQ's default).
FRAME_MAX: Final = 131072
#: The most channels a connection may open (RabbitMQ's default).
CHANNEL_MAX: Final = 2047
#: The heartbeat interval the broker offers in Tune, seconds (RabbitMQ's default).
HEARTBEAT_S: Final = 60
#: Seconds the broker waits for Close-Ok after it sent Close.
CLOSE_WAIT: Final = 3.0
_FLUSH_AT: Final = 256 * 1024
#: The most bytes a connection may send before its login is decided (the protocol
#: header, StartOk and what a client pipelines after it are far less).
MAX_BEFORE_LOGIN: Final = 64 * 1024
# Refused logins are logged at most once a second, as the native port's are.
_log_refusal = QuietLog(log, "AMQP login refused")
_log_limited = QuietLog(log, "refused an AMQP connection")


class AmqpBroker(Protocol):
    """What an AMQP connection needs of the broker (broker/server.py's ``Broker``)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def version(self) -> str: ...

    @property
    def node(self) -> Node: ...

    @property
    def delivery(self) -> Delivery: ...

    @property
    def peers(self) -> Peers | None:
        """The links to other brokers (replica groups), or None."""
        ...

    @property
    def allow_from(self) -> Networks | None: ...

    @property
    def amqp_connections(self) -> set[AmqpConnection]:
        """The open AMQP connections: one adds itself when connected, leaves when lost."""
        ...

    @property
    def amqp_bodies(self) -> BodyBudget:
        """The bytes of half-sent bodies the broker may hold over all connections."""
        ...

    def refused(self, what: str) -> None: ...

    def connections(self) -> Iterable[ConnectionView]:
        """The open client connections, native and AMQP."""
        ...

    @property
    def logins(self) -> LoginGate:
        """The connections still logging in, native and AMQP (broker/admission.py)."""
        ...


class AmqpConnection(asyncio.Protocol):
    """Serves one AMQP 0-9-1 client connection."""

    def __init__(self, broker: AmqpBroker) -> None:
        cfg = broker.config
        self.broker = broker
        self.config = cfg
        self.codec = AmqpCodec(FRAME_MAX, cfg.max_message)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.loopback = False
        self.closed = False
        self.paused = False  # the client does not read
        self.frame_max = FRAME_MAX
        self.channel_max = CHANNEL_MAX
        self.heartbeat = 0.0
        self.cancel_notify = False
        self.channels: dict[int, Channel] = {}
        self._closing_channels: set[int] = set()  # Channel.Close sent, Close-Ok awaited
        self._stage = "header"  # header, start, login, tune, open, ready, closing
        self.rights = Rights(lambda: Users(), "", broker.refused)
        self.user = ""
        self.client_properties: dict[str, Any] = {}
        self._out: list[bytes] = []
        self._out_size = 0
        self._last_read = 0.0
        self._last_write = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0  # (loop time) the handshake must be done by
        self._in_flight = 0
        self._read_blocks: set[str] = set()
        self._key_prefix = os.urandom(8).hex()
        self._key_counter = 0
        self.exclusive: set[str] = set()  # queues this connection declared exclusive
        self._auto_delete: set[str] = set()
        self._host = ""
        self._gated = False  # counted in the broker's LoginGate until it logs in or closes
        # Bodies announced by a content header and not yet whole: channel -> size
        # reserved in the broker's budget (docs/amqp.md "Limits").
        self._bodies: dict[int, int] = {}
        self._body_limit = max(cfg.amqp_body_buffer, cfg.max_message)
        self._body_wait: BodyStart | None = None  # waiting for the broker's budget

    # -- what the listing of connections reads (broker/inspect.py ConnectionView) ----------

    @property
    def client_name(self) -> str:
        """``AMQP``, the client library and the connection name it gave, if any."""
        props = self.client_properties
        parts = ["AMQP"] + [str(props[k]) for k in ("product", "connection_name") if props.get(k)]
        return " ".join(parts)

    @property
    def consumers(self) -> dict[int, Consumer]:
        """The consumers of every channel (numbered across the connection)."""
        found = [c for ch in self.channels.values() for c in ch.consumers()]
        return dict(enumerate(found, 1))

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def stage(self) -> str:
        """Where the connection is: header, start, login, tune, open, ready, closing."""
        return self._stage

    # -- what channels need (amqp_channel.ChannelOwner) --------------------------------------

    @property
    def node(self) -> Node:
        return self.broker.node

    @property
    def delivery(self) -> Delivery:
        return self.broker.delivery

    @property
    def peers(self) -> Peers | None:
        return self.broker.peers

    def next_key(self) -> str:
        self._key_counter += 1
        return f"{self._key_prefix}:{self._key_counter:x}"

    def user_consumers(self) -> int:
        """The consumers of this connection's user on this broker, native and AMQP."""
        return sum(len(c.consumers) for c in self.broker.connections() if c.user == self.user)

    def consumer_load(self) -> tuple[int, int]:
        loads = [ch.load() for ch in self.channels.values()]
        return sum(n for n, _ in loads), sum(p for _, p in loads)

    def exclusive_owner(self, queue: str) -> object | None:
        for conn in self.broker.amqp_connections:
            if queue in conn.exclusive and not conn.closed:
                return conn
        return None

    def queue_declared(self, queue: str, exclusive: bool, auto_delete: bool) -> None:
        if exclusive:
            self.exclusive.add(queue)
        if auto_delete:
            self._auto_delete.add(queue)

    def consumer_gone(self, queue: str) -> None:
        """Auto-delete: the queue goes with the last consumer (on this broker, relayed
        ones too: those are not in its delivery, docs/amqp.md "Replica groups")."""
        if queue in self._auto_delete and not self.delivery.by_queue.get(queue) and not any(
            c.queue == queue and not c.closed
            for conn in self.broker.amqp_connections
            for ch in conn.channels.values()
            for c in ch.consumers()
        ):
            self._auto_delete.discard(queue)
            self.node.submit(DeleteQueue(queue)).add_done_callback(_quiet)

    def commands_started(self, n: int) -> None:
        self._in_flight += n
        if self._in_flight >= self.config.max_in_flight:
            self._block("in flight")

    def commands_finished(self, n: int) -> None:
        self._in_flight -= n
        if self._in_flight < self.config.max_in_flight // 2:
            self._unblock("in flight")

    def close_channel(self, channel: Channel, code: int, text: str) -> None:
        """Close ``channel`` with ``code``: what it held goes back; frames on it are
        dropped until the client's Close-Ok."""
        if not channel.open or self.closed:
            return
        log.info("closing channel %d of %s: %d %s", channel.number, self.peer, code, text)
        returns = channel.release_all()
        self.channels.pop(channel.number, None)
        self.codec.forget(channel.number)
        self._body_done(channel.number)
        self._closing_channels.add(channel.number)
        # (sent once what it held is back, as for the client's own Channel.Close)
        self._send_after(channel.number, commands.Channel.Close(code, reply_text(code, text), 0, 0),
                         returns)

    def _send_after(self, number: int, m: base.Frame, returns: list[asyncio.Future[Any]]) -> None:
        """Send a channel's ``Close`` or ``Close-Ok`` once what its consumers held is
        back on its queues (applied here), as RabbitMQ requeues before it answers: a
        ``Basic.Get`` on another channel after the close finds those messages."""
        if not returns:
            self._send(number, m)
            return
        left = [len(returns)]

        def done(_: asyncio.Future[Any]) -> None:
            left[0] -= 1
            if not left[0] and not self.closed:
                self._send(number, m)

        for fut in returns:
            fut.add_done_callback(done)

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        host = str(peer[0]) if peer else ""
        self.loopback = bool(peer) and allows(LOOPBACK, host)
        loop = asyncio.get_running_loop()
        self._last_read = self._last_write = loop.time()
        if not allows(self.broker.allow_from, host):
            log.warning("refused an AMQP connection from %s: not in allow_from", self.peer)
            self.broker.refused("network")
            self._abort()
            return
        if len(self.broker.amqp_connections) >= self.config.max_connections:
            log.warning("refused an AMQP connection from %s: max_connections", self.peer)
            self._abort()
            return
        # Until it logs in, it counts against the smaller limit of those that have not
        # (docs/security.md): strangers never fill max_connections.
        full = self.broker.logins.admit(host)
        if full is not None:
            _log_limited(self.peer, full)
            self.broker.refused("unauthenticated")
            self._abort()
            return
        self._host, self._gated = host, True
        self.broker.amqp_connections.add(self)
        self._deadline = loop.time() + self.config.hello_timeout
        self._timer = loop.call_later(self.config.hello_timeout, self._tick)

    def data_received(self, data: bytes) -> None:
        self._last_read = asyncio.get_running_loop().time()
        self.codec.receive_data(data)
        if self._stage == "login" and self.codec.buffered > MAX_BEFORE_LOGIN:
            # Before its login is decided a client may not make the broker buffer more
            # (reading stops while the password is checked; this bounds what was in
            # flight then).
            log.info("closing AMQP connection from %s: more than %d bytes before the"
                     " login was decided", self.peer, MAX_BEFORE_LOGIN)
            self._abort()
            return
        self._read()

    def _read(self) -> None:
        codec = self.codec
        while not self.closed and not self._read_blocks and self._stage != "login":
            try:
                event = codec.next_event()
            except ConnectionFault as exc:
                self.fail(exc)
                return
            if event is None:
                break
            try:
                self._event(event)
            except ConnectionFault as exc:
                self.fail(exc)
            except Exception:  # a bug: logged with its traceback, the broker goes on
                log.exception("error handling an AMQP frame from %s", self.peer)
                self.fail(ConnectionFault(541, "internal error"))
        if self._stage in ("header", "start") and codec.buffered > MAX_BEFORE_LOGIN:
            self.fail(ConnectionFault(501, "more than 64 KiB before the login"))
            return
        for ch in list(self.channels.values()):
            try:
                ch.flush()  # the publishes of this read, one Enqueue per queue
            except Exception:  # a bug: logged with its traceback, the broker goes on
                log.exception("error submitting AMQP publishes from %s", self.peer)
                self.fail(ConnectionFault(541, "internal error"))
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._authenticated()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._release()
        self._bodies_done()
        self.broker.amqp_connections.discard(self)

    def _authenticated(self) -> None:
        """It logged in (or closed): it no longer counts against max_unauthenticated."""
        if self._gated:
            self._gated = False
            self.broker.logins.done(self._host)

    def pause_writing(self) -> None:
        self.paused = True
        self._block("output")

    def resume_writing(self) -> None:
        self.paused = False
        self._unblock("output")
        for ch in list(self.channels.values()):
            ch.pump()

    # -- frames ----------------------------------------------------------------------------------

    def _event(self, event: Any) -> None:
        match event:
            case ProtocolHeader():
                if not event.ok:
                    # The spec: answer with the header this broker speaks, then close.
                    log.info("closing AMQP connection from %s: not an AMQP 0-9-1 header", self.peer)
                    self._raw(PROTOCOL_HEADER)
                    self._close_transport()
                    return
                self._start()
            case Heartbeat():
                pass
            case Method():
                self._method(event.channel, event.method)
            case BodyStart():
                if self._stage != "ready":
                    raise ConnectionFault(504, "a publish before the connection is open")
                ch = self._channel(event.channel, event.method)
                if ch is None:
                    self.codec.forget(event.channel)  # closing: its body is dropped
                    return
                try:
                    # Rights before any of the body is held (as RabbitMQ: 403).
                    ch.check_publish(event.method, event.properties)
                except ChannelError as exc:
                    self.close_channel(ch, exc.code, exc.text)
                    return
                self._body_start(event)
            case Content() | Oversized():
                if self._stage != "ready":
                    raise ConnectionFault(504, "a publish before the connection is open")
                self._body_done(event.channel)
                ch = self._channel(event.channel, event.method)
                if ch is None:
                    return
                try:
                    ch.publish(event)
                except ChannelError as exc:
                    self.close_channel(ch, exc.code, exc.text)

    def _channel(self, number: int, method: base.Frame) -> Channel | None:
        """The open channel a method is for (None: it is being closed, the method is
        dropped).

        Raises:
            ConnectionFault: 504, no such channel.
        """
        ch = self.channels.get(number)
        if ch is not None:
            return ch
        if number in self._closing_channels:
            return None
        raise ConnectionFault(
            504, f"expected 'channel.open' on channel {number}, got {method.name}",
        )

    def _method(self, number: int, m: base.Frame) -> None:
        stage = self._stage
        if stage == "closing":
            if isinstance(m, commands.Connection.CloseOk):
                self._close_transport()
            elif isinstance(m, commands.Connection.Close):
                self._send(0, commands.Connection.CloseOk())
                self._close_transport()
            return
        if number == 0:
            self._connection_method(m)
            return
        if stage != "ready":
            raise ConnectionFault(504, f"{m.name} on channel {number} before the connection is open")
        if number > self.channel_max:
            raise ConnectionFault(504, f"channel {number} is above channel_max {self.channel_max}")
        if isinstance(m, commands.Channel.Open):
            if number in self.channels:
                raise ConnectionFault(504, f"channel {number} is already open", (20, 10))
            self._closing_channels.discard(number)
            self.channels[number] = Channel(self, number)
            self._send(number, commands.Channel.OpenOk())
            return
        if isinstance(m, commands.Channel.CloseOk):
            self._closing_channels.discard(number)
            return
        if isinstance(m, commands.Channel.Close):
            ch = self.channels.pop(number, None)
            returns = ch.release_all() if ch is not None else []
            self._closing_channels.discard(number)
            self.codec.forget(number)
            self._send_after(number, commands.Channel.CloseOk(), returns)
            return
        ch = self._channel(number, m)
        if ch is None:
            return
        try:
            ch.handle(m)
        except ChannelError as exc:
            self.close_channel(ch, exc.code, exc.text)

    def _connection_method(self, m: base.Frame) -> None:
        stage = self._stage
        match m:
            case commands.Connection.StartOk() if stage == "start":
                self._login(m)
            case commands.Connection.TuneOk() if stage == "tune":
                self._tuned(m)
            case commands.Connection.Open() if stage == "open":
                if m.virtual_host != "/":
                    raise ConnectionFault(
                        530, f"vhost '{m.virtual_host}' not found (Baton has the vhost '/' only)",
                        (10, 40),
                    )
                try:  # the user's max_connections, on this broker (as RabbitMQ's, at open)
                    held = sum(
                        1 for c in self.broker.connections() if c.user == self.user and c is not self
                    )
                    check_user_limit(self.node.state.users, self.user, "max_connections", held)
                except LimitExceeded as exc:
                    self.broker.refused("limit")
                    _log_limited(self.peer, exc.message)
                    raise ConnectionFault(530, exc.message, (10, 40)) from None
                self._stage = "ready"
                self._send(0, commands.Connection.OpenOk())
                log.debug("AMQP connection from %s open as %r", self.peer, self.user)
            case commands.Connection.Close():
                self._release()
                self._send(0, commands.Connection.CloseOk())
                self._close_transport()
            case commands.Connection.CloseOk():
                raise ConnectionFault(503, "connection.close-ok without a connection.close", (10, 51))
            case commands.Connection.Blocked() | commands.Connection.Unblocked():
                pass
            case commands.Connection.UpdateSecret() if stage == "ready":
                # As RabbitMQ for its internal users: Update-Secret-Ok, the secret not
                # used; the connection keeps its user and rights (docs/amqp.md).
                self._send(0, commands.Connection.UpdateSecretOk())
            case _:
                raise ConnectionFault(503, f"{m.name} is not expected here ({stage})")

    # -- handshake -------------------------------------------------------------------------------

    def _start(self) -> None:
        self._stage = "start"
        props: dict[str, Any] = {
            "product": "Baton",
            "version": self.broker.version,
            "platform": "Python",
            "information": "Baton: an event-sourced, replicated message broker",
            "capabilities": {
                "publisher_confirms": True,
                "basic.nack": True,
                "consumer_cancel_notify": True,
                "per_consumer_qos": True,
                "authentication_failure_close": True,
                "connection.blocked": False,
                # (flag exchange_bindings: advertised once enabled; before, Exchange.Bind
                # is refused with 540, docs/amqp.md)
                "exchange_exchange_bindings": EXCHANGE_BINDINGS in self.node.state.features.enabled,
                "direct_reply_to": False,
            },
        }
        self._send(0, commands.Connection.Start(0, 9, props, MECHANISMS, "en_US"))

    def _login(self, m: commands.Connection.StartOk) -> None:
        self.client_properties = dict(m.client_properties or {})
        caps = self.client_properties.get("capabilities")
        self.cancel_notify = isinstance(caps, dict) and bool(caps.get("consumer_cancel_notify"))
        self._stage = "login"
        # Nothing more is read until the login is decided: a client that streams data
        # meanwhile (publishes it may never be allowed to make) is not buffered.
        self._block("login")
        users = self.node.state.users
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(
            None, check_login, users, m.mechanism or "", m.response or b"", self.loopback
        )
        fut.add_done_callback(self._logged_in)

    def _logged_in(self, fut: asyncio.Future[str]) -> None:
        if self.closed:
            return
        exc = fut.exception() if not fut.cancelled() else PermissionError("cancelled")
        if exc is not None:
            if not isinstance(exc, PermissionError):
                log.error("AMQP login from %s failed: %r", self.peer, exc)
            self.broker.refused("login")
            _log_refusal(self.peer, str(exc))
            # authentication_failure_close: Close 403, then the socket.
            self._send(0, commands.Connection.Close(403, reply_text(403, str(exc)), 0, 0))
            self._close_transport()
            return
        self.user = fut.result()
        self.rights = Rights(lambda: self.node.state.users, self.user, self.broker.refused)
        self._authenticated()
        self._stage = "tune"
        self._send(0, commands.Connection.Tune(CHANNEL_MAX, FRAME_MAX, HEARTBEAT_S))
        self._unblock("login")
        self._read()  # what the client sent meanwhile

    def _tuned(self, m: commands.Connection.TuneOk) -> None:
        if m.frame_max and m.frame_max < 4096:
            raise ConnectionFault(530, f"frame_max {m.frame_max} is below the minimum 4096", (10, 31))
        self.codec.tune(m.frame_max or 0)
        self.frame_max = self.codec.frame_max
        self.channel_max = min(m.channel_max or CHANNEL_MAX, CHANNEL_MAX)
        self.heartbeat = float(m.heartbeat or 0)
        self._stage = "open"
        if self.heartbeat > 0:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_later(self.heartbeat / 4, self._tick)

    # -- timers ----------------------------------------------------------------------------------

    def _tick(self) -> None:
        """The handshake's deadline, then heartbeats: one sent when nothing else was
        for half the interval, and the connection closed when the client sent nothing
        for two intervals."""
        self._timer = None
        if self.closed or self._stage == "closing":
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._stage != "ready" and self._stage != "login" and now >= self._deadline:
            log.info("closing AMQP connection from %s: handshake not done within %gs",
                     self.peer, self.config.hello_timeout)
            self._close_transport()
            return
        hb = self.heartbeat
        if hb > 0:
            if self._read_blocks:
                self._last_read = now  # we do not read it: its heartbeats wait unread
            if now - self._last_read > 2 * hb:
                log.info("closing AMQP connection from %s: no heartbeat for %gs", self.peer, 2 * hb)
                self._release()
                self._abort()
                return
            if now - self._last_write >= hb / 2:
                self._raw(HEARTBEAT)
        wait = hb / 4 if hb > 0 else 1.0
        if self._stage != "ready":
            wait = min(wait, max(self._deadline - now, 0.05))
        elif hb <= 0:
            return  # open, no heartbeats: nothing more to watch
        self._timer = loop.call_later(wait, self._tick)

    # -- writing ---------------------------------------------------------------------------------

    def _send(self, channel: int, m: base.Frame) -> None:
        self.write(method_frame(channel, m))

    def write(self, data: bytes) -> None:
        """Queue bytes; those of one loop tick go out in one write."""
        if self.closed or self.transport is None or not data:
            return
        self._out.append(data)
        self._out_size += len(data)
        if self._out_size >= _FLUSH_AT:
            self._flush()
        elif len(self._out) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _raw(self, data: bytes) -> None:
        self.write(data)
        self._flush()

    def _flush(self) -> None:
        if not self._out:
            return
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self._last_write = asyncio.get_running_loop().time()

    # -- half-sent bodies (docs/amqp.md "Limits") -------------------------------------------------

    def _body_start(self, event: BodyStart) -> None:
        """Reserve a body's announced size: over this connection's budget the
        connection closes; over the broker's, reading stops until it fits.

        Raises:
            ConnectionFault: 506, above this connection's budget.
        """
        held = sum(self._bodies.values())
        if held + event.size > self._body_limit:
            log.warning(
                "closing AMQP connection from %s: %d bytes of bodies half-sent on %d"
                " channels, and %d more announced on channel %d (amqp_body_buffer %d)",
                self.peer, held, len(self._bodies), event.size, event.channel, self._body_limit,
            )
            raise ConnectionFault(
                506, f"{held + event.size} bytes of message bodies under way on this"
                f" connection, above amqp_body_buffer {self._body_limit}",
            )
        if self.broker.amqp_bodies.reserve(event.size):
            self._bodies[event.channel] = event.size
            return
        # The broker holds all it may of half-sent bodies: this one waits its turn.
        self._body_wait = event
        self._block("bodies")
        self.broker.amqp_bodies.wait(event.size, self._body_granted)

    def _body_granted(self) -> None:
        event = self._body_wait
        self._body_wait = None
        if event is None or self.closed:
            if event is not None:
                self.broker.amqp_bodies.release(event.size)
            return
        self._bodies[event.channel] = event.size
        self._unblock("bodies")

    def _body_done(self, channel: int) -> None:
        """The body on ``channel`` is whole, or dropped: give its bytes back."""
        size = self._bodies.pop(channel, None)
        if size is not None:
            self.broker.amqp_bodies.release(size)
        elif self._body_wait is not None and self._body_wait.channel == channel:
            self.broker.amqp_bodies.cancel(self._body_granted)
            self._body_wait = None
            self._unblock("bodies")

    def _bodies_done(self) -> None:
        if self._body_wait is not None:
            self.broker.amqp_bodies.cancel(self._body_granted)
            self._body_wait = None
        for channel in list(self._bodies):
            self._body_done(channel)

    def _block(self, why: str) -> None:
        if not self._read_blocks and self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self._read_blocks.add(why)

    def _unblock(self, why: str) -> None:
        if why not in self._read_blocks:
            return
        self._read_blocks.discard(why)
        if not self._read_blocks and self.transport is not None and not self.closed:
            self.transport.resume_reading()
            if self.codec.buffered:
                asyncio.get_running_loop().call_soon(self._read)

    # -- closing ---------------------------------------------------------------------------------

    def fail(self, exc: ConnectionFault) -> None:
        """Close the connection with ``exc``'s code: Close, then wait for Close-Ok."""
        if self.closed or self._stage == "closing":
            return
        log.info("closing AMQP connection from %s: %d %s", self.peer, exc.code, exc.text)
        self._release()
        self.codec.drop_content()  # until Close-Ok only frames are read, no bodies kept
        self._bodies_done()
        if self._stage == "header":
            self._close_transport()
            return
        class_id, method_id = exc.method
        self._send(0, commands.Connection.Close(exc.code, reply_text(exc.code, exc.text), class_id, method_id))
        self._flush()
        self._stage = "closing"
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(CLOSE_WAIT, self._close_transport)

    def _release(self) -> None:
        """Every channel ends (what they held goes back); exclusive queues go."""
        channels = list(self.channels.values())
        self.channels.clear()
        for ch in channels:
            ch.release_all()
        for queue in sorted(self.exclusive):
            self.node.submit(DeleteQueue(queue)).add_done_callback(_quiet)
        self.exclusive.clear()

    def rights_changed(self) -> None:
        """The user was deleted or its rights changed (applied from the log): a
        deleted user's connection closes (Connection.Close 320 CONNECTION_FORCED, as
        RabbitMQ closes a deleted user's connections); otherwise every channel cancels
        its consumers of queues the user may no longer read (docs/amqp.md)."""
        if self.closed or self._stage == "closing" or not self.user:
            return
        try:
            self.rights.user()
        except AccessRefused:
            self.fail(ConnectionFault(320, f"user '{self.user}' was deleted"))
            return
        for ch in list(self.channels.values()):
            ch.rights_changed()

    def close(self, why: str = "broker shutdown") -> None:
        """Close the connection (the broker stops, an operator closes it): Close 320
        CONNECTION_FORCED."""
        self.fail(ConnectionFault(320, why))
        self._close_transport()

    def _close_transport(self) -> None:
        self._flush()
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def _abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


def _quiet(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
