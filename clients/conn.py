"""The connection's core: the asyncio protocol, correlation ids and write coalescing.

Layout (after aiokafka ``conn.py``):

* :class:`BatonProtocol` is the I/O edge: an :class:`asyncio.Protocol` that feeds bytes into
  the sans-IO :class:`~batonmq.clients.wire.FrameCodec` and hands whole frames to the channel.
  No StreamReader: one ``data_received`` call decodes every frame in the chunk.
* :class:`Channel` maps correlation ids to futures. ``Ok`` resolves a future with its
  result dict, ``Error`` rejects it with :func:`batonmq.cluster.errors.for_code`. When the
  connection ends, every pending future fails with :class:`ConnectionClosed` chained from
  the cause, every consumer's iterator raises it too, and every Term is lost.
* Writes are coalesced: frames written in one event-loop tick go out in one
  ``transport.write`` (docs/design.md §13 "batch at every boundary").
* A channel outlives its transports: its :class:`~batonmq.clients.failover.Failover` moves
  it to another broker when one is lost, and sends again what may be sent again.
* The channel routes pushed frames: Deliver and ConsumerCancelled to the
  :class:`~batonmq.clients.consumer.Consumer` of the tag, LeaderEvent to the
  :class:`~batonmq.clients.leadership.Term` of the service. It implements the narrow
  protocols those classes depend on (``ConsumerChannel``, ``LeadershipChannel``,
  ``ProducerChannel``, ``FailoverChannel``).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Container, Coroutine, Sequence
from typing import Any, Final, cast

from batonmq.clients import errors, scram
from batonmq.clients.addresses import format_address
from batonmq.clients.consumer import Consumer
from batonmq.clients.scram import DEFAULT_USER
from batonmq.clients.failover import Failover
from batonmq.clients.leadership import Term
from batonmq.clients.results import consume_result
from batonmq.clients.foreign import client_hint, foreign_protocol
from batonmq.clients.tls import NOT_TLS_HINT
from batonmq.clients.wire import (
    DEFAULT_MAX_FRAME,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    ConsumerCancelled,
    Expired,
    Deliver,
    Error,
    Frame,
    FrameCodec,
    Hello,
    HelloOk,
    AuthChallenge,
    AuthResponse,
    Lead,
    LeaderEvent,
    Ok,
    Ping,
    Resign,
)
from batonmq.cluster.errors import (
    BatonError,
    ConnectionClosed,
    FrameTooLarge,
    InvalidArgument,
    ProtocolError,
    UnsupportedVersion,
)

__all__ = ["BatonProtocol", "Channel"]

# Write-coalescing: frames are gathered until the end of the loop tick, but a buffer this
# large is written at once so that pause_writing() is noticed during big publishes.
_FLUSH_AT: Final = 256 * 1024
# How long close() waits for the transport to report connection_lost before aborting it.
_CLOSE_WAIT: Final = 2.0


class BatonProtocol(asyncio.Protocol):
    """The I/O edge of a :class:`Channel`: bytes in -> frames, frames -> bytes out."""

    __slots__ = ("_conn", "transport", "codec", "_new_max_frame", "stale", "_first")

    def __init__(self, conn: Channel) -> None:
        self._conn = conn
        self.transport: asyncio.Transport | None = None
        self.codec = FrameCodec(DEFAULT_MAX_FRAME)
        # Set by HelloOk; the codec is swapped for one with the server's limit once
        # its buffer is empty (FrameCodec has no setter for max_frame).
        self._new_max_frame = 0
        # Set when the connection failed over away from this transport: whatever it
        # still reports is ignored.
        self.stale = False
        self._first = True  # nothing received yet

    def set_max_frame(self, max_frame: int) -> None:
        """Decode with the broker's frame limit from now on (from HelloOk): at once if
        nothing is buffered, else once the buffer is empty."""
        self._new_max_frame = max_frame
        if not self.codec.buffered:
            self.codec = FrameCodec(max_frame)
            self._new_max_frame = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport implements asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.stale:
            return
        conn = self._conn
        if self._first:
            self._first = False
            # A TLS record (alert 0x15 or handshake 0x16, version 3.x) where a frame's
            # length should be: the broker speaks TLS and this client does not.
            foreign = foreign_protocol(data[:8])
            if foreign == "TLS" and not conn.tls:
                conn.abort(ProtocolError(NOT_TLS_HINT))
                return
            if foreign in ("HTTP", "AMQP"):
                # The address is another listener (the admin API, AMQP) or not Baton.
                conn.abort(ProtocolError(client_hint(foreign)))
                return
        try:
            self.codec.receive_data(data)
            while True:
                frame = self.codec.next_frame()
                if not isinstance(frame, Frame):
                    break
                conn.dispatch(frame)
            if self._new_max_frame and not self.codec.buffered:
                self.codec = FrameCodec(self._new_max_frame)
                self._new_max_frame = 0
        except BatonError as exc:
            conn.abort(exc)
        except (TypeError, ValueError, KeyError) as exc:  # malformed field contents
            err = ProtocolError(f"malformed frame from the broker: {exc}")
            err.__cause__ = exc
            conn.abort(err)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.stale:
            self._conn.transport_lost(exc)

    def pause_writing(self) -> None:
        if not self.stale:
            self._conn.writable.clear()

    def resume_writing(self) -> None:
        if not self.stale:
            self._conn.writable.set()


class Channel:
    """One session with the cluster, over one broker's transport at a time.

    Created by :func:`batonmq.clients.client.connect`, used through the
    :class:`~batonmq.clients.client.Connection` facade and by the connection's
    consumers, terms and producer.

    Attributes:
        client_name: sent in Hello.
        loop: the event loop the channel runs on.
        address: ``"HOST:PORT"`` of the broker this channel is open to.
        server: the broker's name/version string from HelloOk.
        node_id: the broker's node id from HelloOk.
        max_frame: the largest frame the broker accepts, in bytes.
        max_message: the largest message body the broker accepts, in bytes.
        opened: the first Hello succeeded (only then is a lost broker failed over from).
        writable: set while the transport takes writes (flow control).
        failover: moves the channel to another broker when one is lost.
        tls: the TLS context every transport is opened with (True: the system's
            defaults; None: plaintext).
        keepalive: send a Ping after this many seconds without sending anything
            (None: never), so that a broker's ``idle_timeout`` spares an idle client;
            a Ping not answered within as many seconds more counts as a lost broker.
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        *,
        client_name: str,
        failover: bool = False,
        failover_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        tls: ssl.SSLContext | bool | None = None,
        keepalive: float | None = None,
        credentials: tuple[str, str] = (DEFAULT_USER, DEFAULT_USER),
    ) -> None:
        self.client_name = client_name
        self._credentials = credentials
        self.user = ""  # the user the broker greeted us as
        self.admin = False  # whether that user is an admin
        self.locates = False  # the broker answers Locate (docs/client.md "Routing")
        self.keepalive = keepalive  # seconds of silence after which a Ping is sent
        self._keepalive: asyncio.Task[None] | None = None
        self._last_write = 0.0
        self.tls = tls  # every transport, also a failover's, is opened with it
        self.failover = Failover(
            self,
            addresses,
            enabled=failover,
            timeout=failover_timeout,
            connect_timeout=connect_timeout,
        )
        self.opened = False  # the first Hello succeeded
        self._hello_corr = 0
        self.address = ""
        self.server = ""
        self.node_id = ""
        self.protocol_version = PROTOCOL_VERSION  # the session's, from HelloOk
        self.max_frame = DEFAULT_MAX_FRAME
        self.max_message = DEFAULT_MAX_FRAME
        self.loop = asyncio.get_running_loop()
        self._protocol: BatonProtocol | None = None
        self._transport: asyncio.Transport | None = None
        self._corr = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._subscribing: dict[int, Consumer] = {}
        self._consumers: dict[int, Consumer] = {}
        self._wbuf: list[bytes] = []
        self._wbuf_size = 0
        self._flush_scheduled = False
        self.writable = asyncio.Event()
        self.writable.set()
        self._lost = asyncio.Event()
        self._closed: ConnectionClosed | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._hello: asyncio.Future[HelloOk | AuthChallenge] | None = None
        self._terms: dict[str, Term] = {}  # service -> this connection's run for it

    # --- life cycle -------------------------------------------------------------------

    async def open(self, host: str, port: int) -> None:
        """Open a transport to ``host:port`` and exchange Hello/HelloOk on it.

        Raises:
            OSError: TCP connect failed, or the TLS handshake did (``ssl.SSLError``).
            UnsupportedVersion: the broker speaks another protocol version.
            BatonError: the broker refused the Hello, or the transport ended first.
        """
        self.address = format_address(host, port)
        transport, protocol = await self.loop.create_connection(
            lambda: BatonProtocol(self), host, port, ssl=self.tls or None
        )
        self._protocol = protocol
        self._transport = transport
        self._lost = asyncio.Event()
        self._hello = self.loop.create_future()
        self._hello_corr = self.next_corr()
        # SCRAM (clients/scram.py): the password never crosses the wire.
        exchange = scram.ClientExchange(*self._credentials)
        auth = {"mechanism": scram.MECHANISM, "message": exchange.first()}
        self.write(self.encode(Hello(self._hello_corr, PROTOCOL_VERSION, self.client_name, auth)))
        challenge = await self._hello
        if not isinstance(challenge, AuthChallenge):
            raise ProtocolError(f"the broker answered Hello with {type(challenge).__name__}")
        message = challenge.data.get("message")
        if not isinstance(message, bytes):
            raise ProtocolError("malformed AuthChallenge")
        # scrypt takes a tenth of a second: not on the loop, whose other connections go on.
        final = await self.loop.run_in_executor(None, exchange.final, message)
        if self._closed is not None:  # the broker refused or closed meanwhile: say why
            cause = self._closed.__cause__
            raise cause if isinstance(cause, BatonError) else self._closed
        if self._lost.is_set():
            raise self.closed_error("closed by the broker during the login", None)
        self._hello = self.loop.create_future()
        self.write(self.encode(AuthResponse(self._hello_corr, {"message": final})))
        hello = await self._hello
        if not isinstance(hello, HelloOk):
            raise ProtocolError(f"the broker answered the login with {type(hello).__name__}")
        outcome = hello.auth.get("message")
        exchange.verify(outcome if isinstance(outcome, bytes) else b"")
        self.user = str(hello.auth.get("user", ""))
        # The broker answers Locate (a client routes only through one that does).
        self.locates = hello.auth.get("locate") is True
        self.admin = hello.auth.get("admin") is True
        # The broker answers with the version the session speaks: the lower of its own
        # newest and ours (docs/protocol.md "Versions").
        if not MIN_PROTOCOL_VERSION <= hello.version <= PROTOCOL_VERSION:
            raise UnsupportedVersion(
                f"broker speaks protocol {hello.version}, this client {MIN_PROTOCOL_VERSION}"
                f" to {PROTOCOL_VERSION}"
            )
        self.protocol_version = hello.version
        self.server = hello.server
        self.node_id = hello.node_id
        self.max_frame = hello.max_frame
        self.max_message = hello.max_message
        protocol.set_max_frame(hello.max_frame)
        if self.keepalive and self._keepalive is None:
            self._keepalive = self.loop.create_task(self._keep_alive(self.keepalive))

    async def _keep_alive(self, every: float) -> None:
        """Ping while nothing else is sent (until the connection ends)."""
        while self._closed is None:
            await asyncio.sleep(max(0.01, self._last_write + every - self.loop.time()))
            if self._closed is not None:
                return
            if self.loop.time() - self._last_write >= every and not self.reconnecting:
                corr = self.next_corr()
                try:
                    fut = self.request(Ping(corr), corr)
                except BatonError:
                    return  # closed meanwhile
                fut.add_done_callback(consume_result)
                self._last_write = self.loop.time()  # also when the write is held
                await asyncio.wait({fut}, timeout=every)
                if not fut.done() and self._closed is None and not self.reconnecting:
                    # A broker that stopped (paused, partitioned away, hung) never
                    # closes the TCP connection: treat its silence as a lost broker.
                    self.abort(
                        None,
                        f"broker {self.address} did not answer a keepalive Ping"
                        f" within {every:g}s",
                    )

    @property
    def closed(self) -> bool:
        """True once the connection has ended (closed here, by the broker, or lost)."""
        return self._closed is not None

    @property
    def reconnecting(self) -> bool:
        """True while a failover is under way."""
        return self.failover.reconnecting

    @property
    def failovers(self) -> int:
        """How many times this connection failed over to a broker."""
        return self.failover.failovers

    async def close(self) -> None:
        """Close the connection (see :meth:`batonmq.clients.client.Connection.close`)."""
        self.failover.cancel()
        if self._closed is None:
            self.flush_writes()
            self.abort(None, "closed by the client", final=True)
        if self._transport is not None and not self._lost.is_set():
            try:
                async with asyncio.timeout(_CLOSE_WAIT):
                    await self._lost.wait()
            except TimeoutError:
                self._transport.abort()

    def abort(self, cause: BaseException | None, reason: str = "", *, final: bool = False) -> None:
        """End the connection: fail everything pending, close the transport.

        With failover on (and not ``final``), a lost broker is not the end: the
        connection fails over instead (:meth:`Failover.start`).
        """
        failover = self.failover
        if not final and self._closed is None and self.opened and failover.enabled:
            if failover.reconnecting:
                # A failover attempt failed (e.g. Error corr 0 during Hello).
                hello = self._hello
                if hello is not None and not hello.done():
                    hello.set_exception(
                        cause if isinstance(cause, BaseException) else ConnectionClosed(reason)
                    )
                if self._transport is not None and not self._transport.is_closing():
                    self._transport.abort()
                return
            failover.start(cause, reason)
            return
        if self._closed is None:
            text = reason or (f"{type(cause).__name__}: {cause}" if cause else "closed")
            self._closed = self.closed_error(text, cause)
            self._fail_all(text, cause)
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if cause is None:
                transport.close()
            else:
                transport.abort()
        elif transport is None:
            self._lost.set()

    def closed_again(self) -> ConnectionClosed:
        """A fresh ConnectionClosed like the one the connection ended with."""
        closed = self._closed
        if closed is None:
            return ConnectionClosed("not connected")
        err = ConnectionClosed(closed.message)
        err.__cause__ = closed.__cause__
        return err

    def background(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as a task kept until it is done (its outcome is dropped)."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(consume_result)

    def closed_error(self, text: str, cause: BaseException | None) -> ConnectionClosed:
        """A ConnectionClosed naming this connection's broker, chained from ``cause``."""
        err = ConnectionClosed(f"connection to {self.address or 'broker'} closed: {text}")
        err.__cause__ = cause
        return err

    def _fail_all(self, text: str, cause: BaseException | None) -> None:
        pending, self._pending = self._pending, {}
        self._subscribing.clear()
        resubscribe = self.failover.reset()
        for consumer in resubscribe:
            consumer.end(self.closed_error(text, cause))
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(self.closed_error(text, cause))
        hello = self._hello
        if hello is not None and not hello.done():
            hello.set_exception(
                cause if isinstance(cause, BatonError) else self.closed_error(text, cause)
            )
        consumers, self._consumers = self._consumers, {}
        for consumer in consumers.values():
            consumer.end(self.closed_error(text, cause))
        self.end_terms()  # the broker resigns for the ended session
        self.writable.set()  # wake writers so that they see the closed state
        if self._keepalive is not None:
            self._keepalive.cancel()

    def transport_lost(self, exc: Exception | None) -> None:
        """The transport ended (called by :class:`BatonProtocol`)."""
        self._lost.set()
        if self.failover.reconnecting and self._closed is None:
            # A failover attempt's transport ended before its Hello completed.
            hello = self._hello
            if hello is not None and not hello.done():
                hello.set_exception(self.closed_error("lost during Hello", exc))
            return
        if self._closed is None:
            hello = self._hello
            if exc is None and not self.tls and hello is not None and not hello.done():
                # A TLS broker drops a plaintext client without a word.
                self.abort(None, "closed by the broker during Hello (if the broker expects TLS, use --tls-ca / ssl=)")
            else:
                self.abort(exc, "" if exc is not None else "closed by the broker")
        self._wbuf.clear()
        self._wbuf_size = 0

    # --- for the failover -------------------------------------------------------------

    def detach_transport(self, *, drop_writes: bool) -> None:
        """Forget the current transport: whatever it still reports is ignored, and it
        is aborted. ``drop_writes``: frames not yet written are dropped too."""
        protocol = self._protocol
        if protocol is not None:
            protocol.stale = True
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.abort()
        self._lost.set()  # a stale protocol does not report connection_lost
        if drop_writes:
            self._wbuf.clear()
            self._wbuf_size = 0

    def fail_pending(
        self, keep: Container[int], text: str, cause: BaseException | None
    ) -> list[int]:
        """Fail every pending command whose correlation id is not in ``keep`` with
        ConnectionClosed(``text``) chained from ``cause``.

        Returns:
            The correlation ids failed.
        """
        failed: list[int] = []
        for corr, fut in list(self._pending.items()):
            if corr in keep:
                continue
            del self._pending[corr]
            self._subscribing.pop(corr, None)
            failed.append(corr)
            if not fut.done():
                fut.set_exception(self.closed_error(text, cause))
        return failed

    def is_pending(self, corr: int) -> bool:
        """True while the command ``corr`` waits for its answer."""
        return corr in self._pending

    def take_consumers(self) -> list[Consumer]:
        """Stop routing deliveries to every consumer, and return them."""
        consumers, self._consumers = self._consumers, {}
        return list(consumers.values())

    def end_terms(self) -> None:
        """Tell every Term of this connection that its session ended."""
        for term in list(self._terms.values()):
            term.session_lost()

    def wake_writers(self) -> None:
        """Let writers waiting for flow control go on (they then see the new state)."""
        self.writable.set()

    # --- frames in --------------------------------------------------------------------

    def dispatch(self, frame: Frame) -> None:
        """Route one frame from the broker (called from data_received)."""
        match frame:
            case Ok():
                self.failover.answered(frame.corr)
                if self._subscribing:
                    consumer = self._subscribing.pop(frame.corr, None)
                    if consumer is not None:
                        # Register before the caller resumes: Deliver may follow in this chunk.
                        consumer.subscribed(frame.result)
                fut = self._pending.pop(frame.corr, None)
                if fut is not None and not fut.done():
                    fut.set_result(frame.result)
            case Deliver():
                consumer = self._consumers.get(frame.consumer)
                if consumer is not None:
                    consumer.deliver(frame.messages)
                # else: a delivery that crossed our Cancel; the broker releases it.
            case Error():
                err = errors.for_code(frame.code, frame.message)
                if frame.corr == 0:
                    self.abort(err)
                    return
                if (
                    frame.corr == self._hello_corr
                    and self._hello is not None
                    and not self._hello.done()
                ):
                    self._hello.set_exception(err)
                    return
                self.failover.answered(frame.corr)
                self._subscribing.pop(frame.corr, None)
                fut = self._pending.pop(frame.corr, None)
                if fut is not None and not fut.done():
                    fut.set_exception(err)
            case LeaderEvent():
                term = self._terms.get(frame.service)
                if term is not None:
                    term.leader_event(frame.event, frame.token, frame.leader)
            case Expired():
                consumer = self._consumers.get(frame.consumer)
                if consumer is not None:
                    consumer.expired(frame.positions)
            case ConsumerCancelled():
                consumer = self._consumers.pop(frame.consumer, None)
                if consumer is not None:
                    consumer.end(errors.for_code(frame.code, frame.message))
            case HelloOk() | AuthChallenge():
                if self._hello is None or self._hello.done():
                    raise ProtocolError(f"unexpected {type(frame).__name__}")
                self._hello.set_result(frame)
            case _:
                raise ProtocolError(
                    f"the broker sent a client-side frame: {type(frame).__name__}"
                )

    def expect_subscribed(self, corr: int, consumer: Consumer) -> None:
        """Hand the Ok of the Subscribe ``corr`` to ``consumer.subscribed`` before its
        future resolves (a Deliver may follow in the same chunk)."""
        self._subscribing[corr] = consumer

    def add_consumer(self, tag: int, consumer: Consumer) -> None:
        """Route Deliver and ConsumerCancelled for consumer ``tag`` to ``consumer``."""
        self._consumers[tag] = consumer

    def remove_consumer(self, tag: int) -> None:
        """Stop routing frames for consumer ``tag`` (nothing if it is not routed)."""
        self._consumers.pop(tag, None)

    def add_term(self, term: Term) -> bool:
        """Route LeaderEvents of ``term.service`` to ``term``.

        Returns:
            False (nothing changed) if another Term of this connection runs for it.
        """
        if term.service in self._terms:
            return False
        self._terms[term.service] = term
        return True

    def remove_term(self, term: Term) -> None:
        """Stop routing LeaderEvents to ``term`` (nothing if another Term took its place)."""
        if self._terms.get(term.service) is term:
            del self._terms[term.service]

    # --- frames out -------------------------------------------------------------------

    def next_corr(self) -> int:
        """The next correlation id of this connection."""
        self._corr += 1
        return self._corr

    def encode(self, frame: Frame) -> bytes:
        """Encode ``frame`` with this connection's codec.

        Raises:
            ConnectionClosed: the connection has ended.
            FrameTooLarge: the frame is above the broker's ``max_frame``.
            InvalidArgument: a field cannot be packed.
        """
        protocol = self._protocol
        if protocol is None or self._closed is not None:
            raise self.closed_again()
        try:
            data = protocol.codec.send(frame)
        except FrameTooLarge:
            raise
        except (TypeError, ValueError, OverflowError) as exc:  # msgpack cannot pack it
            raise InvalidArgument(f"cannot encode {type(frame).__name__}: {exc}") from exc
        if len(data) - 4 > self.max_frame:
            raise FrameTooLarge(
                f"frame of {len(data) - 4} bytes is above the broker's maximum of "
                f"{self.max_frame}"
            )
        return data

    def write(self, data: bytes) -> None:
        """Queue encoded bytes; they go out with the others of this loop tick (or at
        once past the coalescing limit)."""
        self._wbuf.append(data)
        self._wbuf_size += len(data)
        if self._wbuf_size >= _FLUSH_AT:
            self.flush_writes()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush_writes)

    def flush_writes(self) -> None:
        """Write the queued bytes to the transport in one ``transport.write``."""
        self._flush_scheduled = False
        buf = self._wbuf
        if not buf:
            return
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        self._wbuf_size = 0
        self._last_write = self.loop.time()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def send_encoded(
        self, corr: int, data: bytes, retry: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """Write an encoded command; return the future its Ok/Error settles.

        ``retry``: the command may be sent again after a failover (idempotent). While
        a failover is under way, every command waits for the new broker.

        Raises:
            ConnectionClosed: the connection has ended.
        """
        if self._closed is not None:
            raise self.closed_again()
        fut: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self._pending[corr] = fut
        if self.failover.hold(corr, data, retry):
            return fut
        self.write(data)
        return fut

    def request(
        self, frame: Frame, corr: int, retry: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """Write a command frame; return the future its Ok/Error settles.

        Raises:
            As :meth:`encode` and :meth:`send_encoded`.
        """
        return self.send_encoded(corr, self.encode(frame), retry)

    async def wait_writable(self) -> None:
        """Flow control: wait while the transport's buffer is above its high-water mark.

        Raises:
            ConnectionClosed: the connection has ended.
        """
        if not self.writable.is_set():
            await self.writable.wait()
        if self._closed is not None:
            raise self.closed_again()

    # --- service leadership (for Term) ------------------------------------------------

    def lead_request(self, service: str) -> asyncio.Future[dict[str, Any]]:
        """Send Lead for ``service``; return the future of its answer."""
        corr = self.next_corr()
        # Sent again after a failover: the new session is a (new) candidate.
        return self.request(Lead(corr, service), corr, retry=True)

    def resign_request(self, service: str) -> asyncio.Future[dict[str, Any]]:
        """Send Resign for ``service``; return the future of its answer."""
        corr = self.next_corr()
        return self.request(Resign(corr, service), corr)
