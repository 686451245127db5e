"""The asyncio client: one TCP connection to a broker, commands, consumers, messages.

Layout (STYLE.md "Client layout", after aiokafka ``conn.py``):

* :class:`_BatonProtocol` is the I/O edge: an :class:`asyncio.Protocol` that feeds bytes into
  the sans-IO :class:`~batonmq.clients.wire.FrameCodec` and hands whole frames to the connection.
  No StreamReader: one ``data_received`` call decodes every frame in the chunk.
* :class:`Connection` maps correlation ids to futures. ``Ok`` resolves a future with its
  result dict, ``Error`` rejects it with :func:`batonmq.cluster.errors.for_code`. When the
  connection ends, every pending future fails with :class:`ConnectionClosed` chained from
  the cause, and every consumer's iterator raises it too.
* Writes are coalesced: frames written in one event-loop tick go out in one
  ``transport.write`` (DESIGN §13 "batch at every boundary").
* :class:`Consumer` buffers deliveries; :class:`Message` settles itself. Settlements of one
  kind issued in the same tick for the same consumer share one Ack/Release/Reject frame.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, cast

from batonmq.clients import errors

_log = logging.getLogger("baton.client")
from batonmq.cluster.errors import (
    BatonError,
    ConnectionClosed,
    FrameTooLarge,
    InvalidArgument,
    MessageTooLarge,
    NotAcquired,
    ProtocolError,
    UnknownConsumer,
    UnsupportedVersion,
)
from batonmq.clients.wire import (
    DEFAULT_MAX_FRAME,
    PROTOCOL_VERSION,
    AcceptThrough,
    Ack,
    Cancel,
    ConsumerCancelled,
    DeclareQueue,
    DeleteQueue,
    Deliver,
    Error,
    Frame,
    FrameCodec,
    Handover,
    Hello,
    HelloOk,
    Lead,
    LeaderEvent,
    ListQueues,
    Ok,
    Ping,
    Topology,
    Publish,
    PublishBatch,
    PurgeQueue,
    QueueStats,
    ReadRange,
    Reject,
    Release,
    Reserve,
    Resign,
    Services,
    Subscribe,
)
from batonmq.clients.leadership import HandoverResult, ServiceInfo, Term
from batonmq.clients.topology import Topology as TopologySnapshot
from batonmq.clients.topology import TopologyEvent, TopologyTracker

__all__ = [
    "DEFAULT_PORT",
    "connect",
    "parse_addresses",
    "Connection",
    "Consumer",
    "Message",
    "TopologyWatch",
]

#: Port used when an address has no ``:PORT``.
DEFAULT_PORT: Final = 5671

# Write-coalescing: frames are gathered until the end of the loop tick, but a buffer this
# large is written at once so that pause_writing() is noticed during big publishes.
_FLUSH_AT: Final = 256 * 1024
# How long close() waits for the transport to report connection_lost before aborting it.
_CLOSE_WAIT: Final = 2.0
# Failover back-off: after each round over every address, wait this long (doubling).
_BACKOFF_FIRST: Final = 0.05
_BACKOFF_MAX: Final = 1.0

# Settlement kinds: index into Consumer._batches and the frame class that carries them.
_ACK: Final = 0
_RELEASE: Final = 1
_REJECT: Final = 2
_SETTLE_FRAMES: Final[tuple[type[Ack], type[Release], type[Reject]]] = (Ack, Release, Reject)

_EMPTY_HEADERS: Final[dict[str, Any]] = {}


def parse_addresses(addresses: str | Sequence[str]) -> list[tuple[str, int]]:
    """Turn ``"HOST:PORT"`` strings into ``(host, port)`` pairs.

    Args:
        addresses: one address, a comma-separated list, or a sequence of either.
            IPv6 hosts are written in brackets: ``"[::1]:5671"``. A missing port
            means :data:`DEFAULT_PORT`.

    Returns:
        The addresses in the order given.

    Raises:
        InvalidArgument: no address, or one that cannot be parsed.
    """
    items = [addresses] if isinstance(addresses, str) else list(addresses)
    out: list[tuple[str, int]] = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidArgument(f"address must be a str, got {type(item).__name__}")
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            host, port = part, DEFAULT_PORT
            if part.startswith("["):
                end = part.find("]")
                if end < 0:
                    raise InvalidArgument(f"bad address {part!r}: missing ']'")
                host, rest = part[1:end], part[end + 1 :]
                if rest:
                    if not rest.startswith(":"):
                        raise InvalidArgument(f"bad address {part!r}")
                    port = _parse_port(part, rest[1:])
            elif part.count(":") == 1:
                host, port_text = part.split(":")
                port = _parse_port(part, port_text)
            elif ":" in part:
                raise InvalidArgument(f"bad address {part!r}: write IPv6 hosts as [HOST]:PORT")
            if not host:
                raise InvalidArgument(f"bad address {part!r}: empty host")
            out.append((host, port))
    if not out:
        raise InvalidArgument("no broker address given")
    return out


def _parse_port(address: str, text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise InvalidArgument(f"bad address {address!r}: port is not a number") from None
    if not 0 < port < 65536:
        raise InvalidArgument(f"bad address {address!r}: port out of range")
    return port


def _format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def connect(
    addresses: str | Sequence[str],
    *,
    client_name: str = "baton-python",
    timeout: float = 10.0,
    failover: bool | None = None,
    failover_timeout: float = 30.0,
) -> Connection:
    """Open a connection to the first broker that accepts TCP and answers Hello.

    Args:
        addresses: ``"HOST:PORT"``, a comma-separated list of them, or a sequence.
            They are tried in order. The connection keeps the whole list for failover.
        client_name: sent in Hello; shows up in the broker's session list.
        timeout: seconds allowed per address for TCP connect plus the Hello exchange
            (also per attempt during failover).
        failover: when the connection to the broker is lost, reconnect to another
            address (round-robin, the lost one last), re-subscribe the consumers and
            re-send unconfirmed publishes (see docs/client.md, "Failover"). Default:
            on with several addresses, off with one (``True`` with one address
            retries that address).
        failover_timeout: seconds a failover may take in all; then every pending
            call fails with ConnectionClosed and the connection is closed.

    Returns:
        An open :class:`Connection`. Use it as ``async with await connect(...) as conn``.

    Raises:
        InvalidArgument: an address cannot be parsed.
        ConnectionClosed: no address worked; the message names every address tried
            and why, and the exception is chained from the last failure.
    """
    parsed = parse_addresses(addresses)
    if failover is None:
        failover = len(parsed) > 1
    failures: list[str] = []
    last: BaseException | None = None
    for index, (host, port) in enumerate(parsed):
        conn = Connection(
            parsed,
            client_name=client_name,
            failover=failover,
            failover_timeout=failover_timeout,
            connect_timeout=timeout,
        )
        conn._index = index
        try:
            async with asyncio.timeout(timeout):
                await conn._open(host, port)
        except (OSError, BatonError, TimeoutError) as exc:
            conn._abort(exc)
            last = exc
            why = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            failures.append(f"{_format_address(host, port)} ({why})")
            continue
        except BaseException as exc:  # cancelled: do not leak the transport
            conn._abort(exc)
            raise
        conn._opened = True
        return conn
    raise ConnectionClosed("could not connect to any broker: " + "; ".join(failures)) from last


class _BatonProtocol(asyncio.Protocol):
    """The I/O edge of a :class:`Connection`: bytes in -> frames, frames -> bytes out."""

    __slots__ = ("_conn", "transport", "codec", "_new_max_frame", "stale")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.transport: asyncio.Transport | None = None
        self.codec = FrameCodec(DEFAULT_MAX_FRAME)
        # Set by HelloOk; the codec is swapped for one with the server's limit once
        # its buffer is empty (FrameCodec has no setter for max_frame).
        self._new_max_frame = 0
        # Set when the connection failed over away from this transport: whatever it
        # still reports is ignored.
        self.stale = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport implements asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.stale:
            return
        conn = self._conn
        try:
            self.codec.receive_data(data)
            while True:
                frame = self.codec.next_frame()
                if not isinstance(frame, Frame):
                    break
                conn._dispatch(frame)
            if self._new_max_frame and not self.codec.buffered:
                self.codec = FrameCodec(self._new_max_frame)
                self._new_max_frame = 0
        except BatonError as exc:
            conn._abort(exc)
        except (TypeError, ValueError, KeyError) as exc:  # malformed field contents
            err = ProtocolError(f"malformed frame from the broker: {exc}")
            err.__cause__ = exc
            conn._abort(err)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.stale:
            self._conn._connection_lost(exc)

    def pause_writing(self) -> None:
        if not self.stale:
            self._conn._writable.clear()

    def resume_writing(self) -> None:
        if not self.stale:
            self._conn._writable.set()


class Connection:
    """One session with one broker. Create it with :func:`connect`.

    Every method is a command: it gets the next correlation id, is written (coalesced
    with the other frames of this loop tick) and returns when the broker's ``Ok``
    arrives. An ``Error`` reply raises the matching :mod:`batonmq.cluster.errors` class. If
    the connection ends first the call raises :class:`ConnectionClosed` (the command's
    outcome is then unknown) — unless failover is on: then the connection moves to
    another broker and publishes, subscriptions and read-only or idempotent commands
    are sent again there (see :func:`connect` and docs/client.md, "Failover").

    Attributes:
        addresses: every ``(host, port)`` the connection may use, in order.
        address: ``"HOST:PORT"`` of the broker this connection is open to.
        server: the broker's name/version string from HelloOk.
        node_id: the broker's node id from HelloOk.
        max_frame: the largest frame the broker accepts, in bytes.
        max_message: the largest message body the broker accepts, in bytes.
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        *,
        client_name: str,
        failover: bool = False,
        failover_timeout: float = 30.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self.addresses: list[tuple[str, int]] = list(addresses)
        self.client_name = client_name
        #: Reconnect to another address when the connection is lost (see connect()).
        self.failover = failover
        self.failover_timeout = failover_timeout
        self.connect_timeout = connect_timeout
        #: How many times this connection failed over to a broker.
        self.failovers = 0
        self._index = 0  # self.addresses[_index] is the broker connected to
        self._opened = False  # the first Hello succeeded
        self._reconnecting = False
        self._failover_task: asyncio.Task[None] | None = None
        # corr -> (encoded frame, retriable) of commands to send again after a
        # failover (retriable) or not yet sent because a failover is under way.
        self._resend: dict[int, tuple[bytes, bool]] = {}
        self._resubscribe: list[Consumer] = []
        # Idempotency keys: a random id per connection and a counter (docs/client.md).
        self._key_prefix = secrets.token_hex(8) + ":"
        self._key_seq = 0
        self._hello_corr = 0
        self.address = ""
        self.server = ""
        self.node_id = ""
        self.max_frame = DEFAULT_MAX_FRAME
        self.max_message = DEFAULT_MAX_FRAME
        self._loop = asyncio.get_running_loop()
        self._protocol: _BatonProtocol | None = None
        self._transport: asyncio.Transport | None = None
        self._corr = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._subscribing: dict[int, Consumer] = {}
        self._consumers: dict[int, Consumer] = {}
        self._wbuf: list[bytes] = []
        self._wbuf_size = 0
        self._flush_scheduled = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost = asyncio.Event()
        self._closed: ConnectionClosed | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._hello: asyncio.Future[HelloOk] | None = None
        self._terms: dict[str, Term] = {}  # service -> this connection's run for it

    # --- life cycle -------------------------------------------------------------------

    async def _open(self, host: str, port: int) -> None:
        self.address = _format_address(host, port)
        transport, protocol = await self._loop.create_connection(
            lambda: _BatonProtocol(self), host, port
        )
        self._protocol = protocol
        self._transport = transport
        self._lost = asyncio.Event()
        self._hello = self._loop.create_future()
        self._hello_corr = self._next_corr()
        self._write(self._encode(Hello(self._hello_corr, PROTOCOL_VERSION, self.client_name)))
        hello = await self._hello
        if hello.version != PROTOCOL_VERSION:
            raise UnsupportedVersion(
                f"broker speaks protocol {hello.version}, this client {PROTOCOL_VERSION}"
            )
        self.server = hello.server
        self.node_id = hello.node_id
        self.max_frame = hello.max_frame
        self.max_message = hello.max_message
        protocol._new_max_frame = hello.max_frame
        if not protocol.codec.buffered:
            protocol.codec = FrameCodec(hello.max_frame)
            protocol._new_max_frame = 0

    @property
    def closed(self) -> bool:
        """True once the connection has ended (closed here, by the broker, or lost)."""
        return self._closed is not None

    async def close(self) -> None:
        """Close the connection.

        Frames already written (e.g. acks issued this tick) are flushed; then every
        pending command fails with :class:`ConnectionClosed` and every consumer's
        iterator ends with it. Closing twice is harmless.
        """
        task = self._failover_task
        if task is not None and not task.done():
            task.cancel()
        if self._closed is None:
            self._flush_writes()
            self._abort(None, "closed by the client", final=True)
        if self._transport is not None and not self._lost.is_set():
            try:
                async with asyncio.timeout(_CLOSE_WAIT):
                    await self._lost.wait()
            except TimeoutError:
                self._transport.abort()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed is not None else "open"
        return f"<Connection {self.address} node={self.node_id!r} {state}>"

    def _abort(self, cause: BaseException | None, reason: str = "", *, final: bool = False) -> None:
        """End the connection: fail everything pending, close the transport.

        With failover on (and not ``final``), a lost broker is not the end: the
        connection fails over instead (:meth:`_start_failover`).
        """
        if not final and self._closed is None and self._opened and self.failover:
            if self._reconnecting:
                # A failover attempt failed (e.g. Error corr 0 during Hello).
                hello = self._hello
                if hello is not None and not hello.done():
                    hello.set_exception(
                        cause if isinstance(cause, BaseException) else ConnectionClosed(reason)
                    )
                if self._transport is not None and not self._transport.is_closing():
                    self._transport.abort()
                return
            self._start_failover(cause, reason)
            return
        if self._closed is None:
            text = reason or (f"{type(cause).__name__}: {cause}" if cause else "closed")
            self._closed = self._closed_error(text, cause)
            self._fail_all(text, cause)
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if cause is None:
                transport.close()
            else:
                transport.abort()
        elif transport is None:
            self._lost.set()

    def _closed_again(self) -> ConnectionClosed:
        """A fresh ConnectionClosed like the one the connection ended with."""
        closed = self._closed
        if closed is None:
            return ConnectionClosed("not connected")
        err = ConnectionClosed(closed.message)
        err.__cause__ = closed.__cause__
        return err

    def _background(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_consume_result)

    def _closed_error(self, text: str, cause: BaseException | None) -> ConnectionClosed:
        err = ConnectionClosed(f"connection to {self.address or 'broker'} closed: {text}")
        err.__cause__ = cause
        return err

    def _fail_all(self, text: str, cause: BaseException | None) -> None:
        pending, self._pending = self._pending, {}
        self._subscribing.clear()
        self._resend.clear()
        self._reconnecting = False
        resubscribe, self._resubscribe = self._resubscribe, []
        for consumer in resubscribe:
            consumer._end(self._closed_error(text, cause))
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(self._closed_error(text, cause))
        hello = self._hello
        if hello is not None and not hello.done():
            hello.set_exception(
                cause if isinstance(cause, BatonError) else self._closed_error(text, cause)
            )
        consumers, self._consumers = self._consumers, {}
        for consumer in consumers.values():
            consumer._end(self._closed_error(text, cause))
        for term in list(self._terms.values()):
            term._session_lost()  # the broker resigns for the ended session
        self._writable.set()  # wake writers so that they see the closed state

    def _connection_lost(self, exc: Exception | None) -> None:
        self._lost.set()
        if self._reconnecting and self._closed is None:
            # A failover attempt's transport ended before its Hello completed.
            hello = self._hello
            if hello is not None and not hello.done():
                hello.set_exception(self._closed_error("lost during Hello", exc))
            return
        if self._closed is None:
            self._abort(exc, "" if exc is not None else "closed by the broker")
        self._wbuf.clear()
        self._wbuf_size = 0

    # --- frames in --------------------------------------------------------------------

    def _dispatch(self, frame: Frame) -> None:
        """Route one frame from the broker (called from data_received)."""
        kind = type(frame)
        if kind is Ok:
            assert isinstance(frame, Ok)
            if self._resend:
                self._resend.pop(frame.corr, None)
            if self._subscribing:
                consumer = self._subscribing.pop(frame.corr, None)
                if consumer is not None:
                    # Register before the caller resumes: Deliver may follow in this chunk.
                    consumer._subscribed(frame.result)
            fut = self._pending.pop(frame.corr, None)
            if fut is not None and not fut.done():
                fut.set_result(frame.result)
        elif kind is Deliver:
            assert isinstance(frame, Deliver)
            consumer = self._consumers.get(frame.consumer)
            if consumer is not None:
                consumer._deliver(frame.messages)
            # else: a delivery that crossed our Cancel; the broker releases it.
        elif kind is Error:
            assert isinstance(frame, Error)
            err = errors.for_code(frame.code, frame.message)
            if frame.corr == 0:
                self._abort(err)
                return
            if (
                frame.corr == self._hello_corr
                and self._hello is not None
                and not self._hello.done()
            ):
                self._hello.set_exception(err)
                return
            if self._resend:
                self._resend.pop(frame.corr, None)
            self._subscribing.pop(frame.corr, None)
            fut = self._pending.pop(frame.corr, None)
            if fut is not None and not fut.done():
                fut.set_exception(err)
        elif kind is LeaderEvent:
            assert isinstance(frame, LeaderEvent)
            term = self._terms.get(frame.service)
            if term is not None:
                term._event(frame.event, frame.token, frame.leader)
        elif kind is ConsumerCancelled:
            assert isinstance(frame, ConsumerCancelled)
            consumer = self._consumers.pop(frame.consumer, None)
            if consumer is not None:
                consumer._end(errors.for_code(frame.code, frame.message))
        elif kind is HelloOk:
            assert isinstance(frame, HelloOk)
            if self._hello is None or self._hello.done():
                raise ProtocolError("unexpected HelloOk")
            self._hello.set_result(frame)
        else:
            raise ProtocolError(f"the broker sent a client-side frame: {kind.__name__}")

    # --- frames out -------------------------------------------------------------------

    def _next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def _encode(self, frame: Frame) -> bytes:
        protocol = self._protocol
        if protocol is None or self._closed is not None:
            raise self._closed_again()
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

    def _write(self, data: bytes) -> None:
        self._wbuf.append(data)
        self._wbuf_size += len(data)
        if self._wbuf_size >= _FLUSH_AT:
            self._flush_writes()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_writes)

    def _flush_writes(self) -> None:
        self._flush_scheduled = False
        buf = self._wbuf
        if not buf:
            return
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        self._wbuf_size = 0
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def _send_encoded(
        self, corr: int, data: bytes, retry: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """Write an encoded command; return the future its Ok/Error settles.

        ``retry``: the command may be sent again after a failover (idempotent). While
        a failover is under way, every command waits for the new broker.
        """
        if self._closed is not None:
            raise self._closed_again()
        fut: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._pending[corr] = fut
        if self._reconnecting:
            self._resend[corr] = (data, retry)
            return fut
        if retry and self.failover:
            self._resend[corr] = (data, True)
        self._write(data)
        return fut

    def _request(
        self, frame: Frame, corr: int, retry: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """Write a command frame; return the future its Ok/Error settles."""
        return self._send_encoded(corr, self._encode(frame), retry)

    def _new_key(self) -> str:
        self._key_seq += 1
        return f"{self._key_prefix}{self._key_seq:x}"

    # --- failover ---------------------------------------------------------------------

    def _start_failover(self, cause: BaseException | None, reason: str) -> None:
        """The broker is gone: keep what can be sent again, fail the rest, reconnect.

        Publishes (they carry idempotency keys), subscriptions and idempotent
        commands stay pending and are sent again to the next broker; the others
        fail with ConnectionClosed (retriable; their outcome is unknown). Consumers
        drop their buffered messages (the broker released them) and are
        re-subscribed; messages delivered before can no longer be settled.
        """
        if self._reconnecting:
            return
        self._reconnecting = True
        text = reason or (f"{type(cause).__name__}: {cause}" if cause else "closed by the broker")
        _log.warning("connection to %s lost (%s); failing over", self.address, text)
        old = self._protocol
        if old is not None:
            old.stale = True
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.abort()
        self._lost.set()
        self._wbuf.clear()
        self._wbuf_size = 0
        for corr, fut in list(self._pending.items()):
            entry = self._resend.get(corr)
            if entry is not None and entry[1]:
                continue
            del self._pending[corr]
            self._resend.pop(corr, None)
            self._subscribing.pop(corr, None)
            if not fut.done():
                fut.set_exception(
                    self._closed_error(
                        f"{text}; failing over to another broker, so the outcome of this"
                        " command is unknown (it is not sent again: it is not idempotent)",
                        cause,
                    )
                )
        consumers, self._consumers = self._consumers, {}
        for consumer in consumers.values():
            consumer._failed_over()
            self._resubscribe.append(consumer)
        # A new session is a new candidate: a held term is lost (the old session's
        # candidacy ends with it); one still waiting runs again on the new broker.
        for term in list(self._terms.values()):
            term._session_lost()
        self._writable.set()  # commands issued now wait in _resend, not on the transport
        self._failover_task = self._loop.create_task(self._failover_loop(cause, text))
        self._failover_task.add_done_callback(_consume_result)

    async def _failover_loop(self, cause: BaseException | None, text: str) -> None:
        loop = self._loop
        deadline = loop.time() + self.failover_timeout
        n = len(self.addresses)
        start = (self._index + 1) % n  # the lost broker is tried last
        delay = _BACKOFF_FIRST
        failures: list[str] = []
        last: BaseException | None = cause
        attempt = 0
        while self._closed is None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            index = (start + attempt) % n
            host, port = self.addresses[index]
            attempt += 1
            try:
                async with asyncio.timeout(min(self.connect_timeout, remaining)):
                    await self._open(host, port)
            except (OSError, BatonError, TimeoutError) as exc:
                self._drop_attempt()
                last = exc
                why = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
                failures = failures[-(n - 1) :] if n > 1 else []
                failures.append(f"{_format_address(host, port)} ({why})")
                if attempt % n == 0:
                    await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))
                    delay = min(delay * 2, _BACKOFF_MAX)
                continue
            except BaseException:
                self._drop_attempt()
                raise
            self._index = index
            self._reconnected()
            return
        if self._closed is None:
            err = ConnectionClosed(
                f"connection lost ({text}) and failover found no broker within"
                f" {self.failover_timeout:g}s: " + "; ".join(failures)
            )
            err.__cause__ = last
            self._abort(err, err.message, final=True)

    def _drop_attempt(self) -> None:
        """Forget a failed failover attempt's transport."""
        protocol = self._protocol
        if protocol is not None:
            protocol.stale = True
        self._lost.set()  # a stale protocol does not report connection_lost
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.abort()

    def _reconnected(self) -> None:
        """Hello succeeded on the new broker: re-subscribe, then send what waited."""
        self._reconnecting = False
        self.failovers += 1
        _log.warning("failed over to %s (node %s)", self.address, self.node_id)
        for corr, (data, _retry) in sorted(self._resend.items()):  # in the order issued
            if corr in self._pending:
                self._write(data)
            else:
                del self._resend[corr]
        # After the re-sends: a re-subscribe is a new command (written once, here).
        consumers, self._resubscribe = self._resubscribe, []
        for consumer in consumers:
            if consumer._state == _ACTIVE:
                consumer._resubscribe()

    async def _wait_writable(self) -> None:
        """Flow control: wait while the transport's buffer is above its high-water mark."""
        if not self._writable.is_set():
            await self._writable.wait()
        if self._closed is not None:
            raise self._closed_again()

    # --- commands ---------------------------------------------------------------------

    async def topology(self) -> dict[str, Any]:
        """The cluster as the connected broker has applied it (DESIGN §7).

        Returns:
            A mapping with ``cluster_id``, ``view`` (the view's sequence number),
            ``changing`` (a new view is being agreed), ``leader`` and ``instances``:
            the members in the cluster's stable order, each with ``node_id``,
            ``runtime``, ``role`` ("voter" or "observer"), ``address``, ``leader``
            (bool), ``local`` (the broker answering) and ``properties``. Also the
            answering broker's ``applied`` log offset and state ``digest``.

        Raises:
            ConnectionClosed: the connection ended first.
        """
        corr = self._next_corr()
        return await self._request(Topology(corr), corr, retry=True)

    def watch_topology(
        self,
        listener: Callable[[TopologyEvent], Any],
        *,
        interval: float = 0.5,
        min_event_delay: float = 0.2,
    ) -> TopologyWatch:
        """Call ``listener`` with topology events (DESIGN §7) until stopped.

        Polls :meth:`topology` every ``interval`` seconds and feeds a
        :class:`~batonmq.clients.topology.TopologyTracker`: the first answer gives INIT, then
        CHANGING (a view change is under way), CHANGED (a new view: other number or
        members) and PROPERTIES_CHANGED (same members, an instance's properties,
        role, address or the leader changed), at most one per ``min_event_delay``
        seconds (changes in between are coalesced). The listener may be a plain
        function or a coroutine function; its exceptions are logged and ignored.

        Returns:
            A :class:`TopologyWatch`; ``watch.stop()`` ends it. It also ends when the
            connection closes.

        Raises:
            InvalidArgument: ``interval`` is not positive or ``min_event_delay`` < 0.
        """
        if not interval > 0:
            raise InvalidArgument("interval must be positive")
        if not min_event_delay >= 0:
            raise InvalidArgument("min_event_delay must be >= 0")
        return TopologyWatch(self, listener, interval, TopologyTracker(min_event_delay))

    # --- service leadership (DESIGN §7) -------------------------------------------------

    def lead(self, service: str, *, timeout: float | None = None) -> Term:
        """Run for leader of ``service``; use the result as ``async with``.

        ``async with conn.lead("import-entries") as term:`` waits until this session
        leads the service, then runs the block; leaving the block resigns, and the
        next candidate gets a new term. Inside, ``term.token`` is the term's fencing
        token (it grows with every term), ``term.lost`` is set when the leadership is
        lost (broker lost, view change, failover: a new session is a new candidate)
        and ``term.handover_requested`` when an admin asked for a handover (finish the
        running work and leave the block). See docs/client.md, "Service leadership".

        Args:
            service: the service's name (1..255 printable characters).
            timeout: seconds to wait for the leadership (None: as long as it takes);
                then Timeout is raised from ``async with`` and the candidacy is
                withdrawn.

        Returns:
            A :class:`~batonmq.clients.leadership.Term` (not yet running).

        Raises:
            InvalidArgument: a bad service name or timeout (also from ``async with``:
                this connection already runs for the service).
        """
        return Term(self, service, timeout)

    def _lead_request(self, service: str) -> asyncio.Future[dict[str, Any]]:
        corr = self._next_corr()
        # Sent again after a failover: the new session is a (new) candidate.
        return self._request(Lead(corr, service), corr, retry=True)

    def _resign_request(self, service: str) -> asyncio.Future[dict[str, Any]]:
        corr = self._next_corr()
        return self._request(Resign(corr, service), corr)

    async def services(self) -> list[ServiceInfo]:
        """Every service with a candidate: leader, fencing token, candidates, handover
        state, as the connected broker applied them (sorted by name).

        Raises:
            ConnectionClosed: the connection ended first.
        """
        corr = self._next_corr()
        result = await self._request(Services(corr), corr, retry=True)
        items = result.get("services")
        if not isinstance(items, list):
            raise ProtocolError("Services result has no 'services' list")
        return [ServiceInfo.from_mapping(m) for m in items]

    async def service_leader(self, service: str) -> ServiceInfo | None:
        """One service's :class:`~batonmq.clients.leadership.ServiceInfo` (None: it has no
        candidate at all). ``info.leader`` and ``info.token`` are the current term."""
        for info in await self.services():
            if info.service == service:
                return info
        return None

    async def handover(
        self, service: str, *, to: str | None = None, timeout: float = 30.0
    ) -> HandoverResult:
        """Ask the leader of ``service`` to hand over (admin), and wait for the next term.

        The leader is told (``term.handover_requested``) and resigns when its running
        work is done; then ``to`` (a candidate key, or a node id: that node's first
        candidate) or else the first other candidate gets a new term.

        Args:
            service: the service's name.
            to: who should lead next (None: the next candidate in line).
            timeout: seconds to wait for the new term.

        Returns:
            The new term: its ``leader``, ``token`` and the ``previous`` leader.

        Raises:
            InvalidArgument: the service has no leader, no other candidate, or ``to``
                names none of its candidates.
            Timeout: no new term within ``timeout`` (the leader is still working; the
                handover stays requested).
            ConnectionClosed: the connection ended first (the outcome is unknown).
        """
        if not timeout > 0:
            raise InvalidArgument("timeout must be positive")
        if to is not None and not isinstance(to, str):
            raise InvalidArgument("to must be a str (a candidate key or node id) or None")
        corr = self._next_corr()
        ms = max(1, int(timeout * 1000))
        frame = Handover(corr, service, to or "", ms)
        try:
            async with asyncio.timeout(timeout + 10):  # the broker answers at ``timeout``
                result = await self._request(frame, corr)
        except TimeoutError:
            raise errors.Timeout(f"no answer to handover of {service!r} from the broker") from None
        try:
            return HandoverResult(
                str(result["service"]),
                str(result["leader"]),
                int(result["token"]),
                None if result.get("previous") is None else str(result["previous"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed handover result: {exc!r}") from exc

    async def ping(self) -> float:
        """Round trip to the broker.

        Returns:
            Seconds between sending Ping and receiving its Ok.

        Raises:
            ConnectionClosed: the connection ended first.
        """
        start = time.perf_counter()
        corr = self._next_corr()
        await self._request(Ping(corr), corr, retry=True)
        return time.perf_counter() - start

    async def declare_queue(
        self,
        name: str,
        *,
        durable: bool = True,
        max_length: int | None = None,
        overflow: str = "reject-publish",
        delivery_limit: int = 20,
        dead_letter: str | None = None,
        message_ttl: float | None = None,
    ) -> dict[str, Any]:
        """Create a queue, or check that it exists with these settings.

        Args:
            name: the queue's name.
            durable: keep the queue across broker restarts.
            max_length: cap on ready messages (None: no cap).
            overflow: at ``max_length``: ``"reject-publish"`` (publish fails with
                QueueFull) or ``"drop-head"`` (the oldest ready message is dropped).
            delivery_limit: a message delivered this many times and released again is
                dead-lettered (or dropped without a dead-letter queue).
            dead_letter: queue that receives rejected and over-limit messages.
            message_ttl: seconds a message may wait before it expires (None: forever).

        Returns:
            The broker's result, e.g. ``{"created": True}``.

        Raises:
            QueueExists: the queue exists with different settings.
            InvalidArgument: a setting is out of range.
        """
        ttl_ms = None if message_ttl is None else int(round(message_ttl * 1000))
        options = {
            "durable": durable,
            "max_length": max_length,
            "overflow": overflow,
            "delivery_limit": delivery_limit,
            "dead_letter": dead_letter,
            "message_ttl_ms": ttl_ms,
        }
        corr = self._next_corr()
        # Idempotent (create, or check the settings), so sent again after a failover.
        return await self._request(DeclareQueue(corr, name, options), corr, retry=True)

    async def delete_queue(self, name: str) -> int:
        """Delete a queue with every message in it; its consumers are cancelled.

        Returns:
            The number of messages dropped.

        Raises:
            QueueNotFound: no such queue.
        """
        corr = self._next_corr()
        return _int_field(await self._request(DeleteQueue(corr, name), corr), "deleted")

    async def purge_queue(self, name: str) -> int:
        """Drop every ready message of a queue (acquired ones stay with their consumers).

        Returns:
            The number of messages dropped.

        Raises:
            QueueNotFound: no such queue.
        """
        corr = self._next_corr()
        return _int_field(await self._request(PurgeQueue(corr, name), corr), "purged")

    async def queue_stats(self, name: str) -> dict[str, Any]:
        """A queue's counters.

        Returns:
            The broker's stats mapping; it has at least ``"ready"`` and ``"acquired"``.

        Raises:
            QueueNotFound: no such queue.
        """
        corr = self._next_corr()
        return await self._request(QueueStats(corr, name), corr, retry=True)

    async def list_queues(self) -> list[dict[str, Any]]:
        """Every queue's stats (the same mappings as :meth:`queue_stats`)."""
        corr = self._next_corr()
        result = await self._request(ListQueues(corr), corr, retry=True)
        queues = result.get("queues")
        if not isinstance(queues, list):
            raise ProtocolError("ListQueues result has no 'queues' list")
        return queues

    # --- range readers (the Spark source, DESIGN §11; docs/protocol.md) ---------------

    async def reserve(self, queue: str, holder: str | None) -> dict[str, Any]:
        """Reserve ``queue`` for the range reader ``holder`` (None: end the reservation).

        While reserved, consumers get nothing from the queue and TTL expiry and
        drop-head overflow leave it alone; messages consumers took before stay
        theirs (``acquired`` in the result: read only once it is 0).

        Returns:
            ``{"reserved_by", "acquired", "head", "next_position"}``; ``head`` is the
            lowest ready position.

        Raises:
            QueueReserved: another holder has the queue.
            QueueNotFound: no such queue.
        """
        corr = self._next_corr()
        # Idempotent for the same holder: sent again after a failover.
        return await self._request(Reserve(corr, queue, holder or ""), corr, retry=True)

    async def accept_through(self, queue: str, through: int, holder: str) -> int:
        """As the holder of ``queue``'s reservation, accept every ready message below
        position ``through``. Cumulative and idempotent (a repeat accepts nothing).

        Returns:
            How many messages this call accepted.

        Raises:
            QueueReserved: ``holder`` does not have the queue's reservation.
            QueueNotFound: no such queue.
        """
        corr = self._next_corr()
        result = await self._request(AcceptThrough(corr, queue, through, holder), corr, retry=True)
        return _int_field(result, "count")

    async def read_range(
        self, queue: str, start: int, end: int, *, limit: int = 10_000
    ) -> tuple[list[list[Any]], int]:
        """Read the messages still in ``queue`` at positions ``start <= p < end``
        without acquiring them (one ReadRange; call again from the returned ``next``
        until it equals ``end``).

        The broker answers once it has applied the queue up to ``end``, so every
        broker answers the same for a reserved queue.

        Returns:
            ``(messages, next)``: messages as ``[position, body, headers,
            publish_time_ms]`` lists in position order, and where to continue.

        Raises:
            QueueNotFound: no such queue.
            Timeout: the broker did not reach ``end`` in time (try another).
            InvalidArgument: a bad range or limit.
        """
        corr = self._next_corr()
        result = await self._request(ReadRange(corr, queue, start, end, limit), corr, retry=True)
        messages = result.get("messages")
        if not isinstance(messages, list):
            raise ProtocolError(f"ReadRange result has no 'messages' list: {result!r}")
        return messages, _int_field(result, "next")

    async def publish(
        self,
        queue: str,
        body: bytes | bytearray | memoryview,
        headers: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> int:
        """Publish one message and wait until the broker confirms it.

        A confirmed message is durable on the log: it is never lost afterwards.
        Every publish carries an idempotency key; the cluster enqueues a publish
        re-sent with a key it applied to the queue recently only once, and confirms
        it with the original position. After a failover, unconfirmed publishes are
        re-sent this way (exactly once on the queue).

        Args:
            queue: the queue's name.
            body: opaque bytes (bytes, bytearray or memoryview).
            headers: string-keyed mapping of msgpack-encodable values.
            idempotency_key: your own key for this publish (e.g. to publish again
                safely from a new connection after a crash); by default a key unique
                to this connection and publish.

        Returns:
            The message's position in the queue.

        Raises:
            MessageTooLarge: the body is above the broker's ``max_message`` (nothing sent).
            InvalidArgument: body or headers of the wrong type (nothing sent).
            QueueNotFound, QueueFull: from the broker.
            ConnectionClosed: the connection ended before the confirmation; the message
                may or may not have been enqueued.
        """
        data = _body(body)
        if len(data) > self.max_message:
            raise MessageTooLarge(
                f"body of {len(data)} bytes is above the broker's maximum of {self.max_message}"
            )
        hdrs = _headers(headers)
        key = self._new_key() if idempotency_key is None else _key(idempotency_key)
        if not self._writable.is_set():
            await self._wait_writable()
        corr = self._next_corr()
        result = await self._request(Publish(corr, queue, data, hdrs, key), corr, retry=True)
        return _int_field(result, "position")

    async def publish_batch(
        self,
        queue: str,
        messages: Iterable[bytes | bytearray | memoryview | tuple[bytes, Mapping[str, Any]]],
        *,
        idempotency_key: str | None = None,
    ) -> list[int]:
        """Publish many messages and wait until all are confirmed.

        The messages are sent in as few PublishBatch frames as fit (each frame holds at
        most about ``max_frame / 2`` bytes of bodies). **Each frame is atomic on the
        broker, the batch as a whole is not**: if this raises, the messages of some
        frames may have been enqueued.

        Each frame carries an idempotency key, as for :meth:`publish`.

        Args:
            queue: the queue's name.
            messages: bodies, or ``(body, headers)`` pairs.
            idempotency_key: your own key for the batch; with several frames,
                frame ``i`` uses ``f"{idempotency_key}#{i}"``.

        Returns:
            The positions of the messages, in order.

        Raises:
            MessageTooLarge: a body is above ``max_message`` (nothing sent).
            InvalidArgument: a body or headers of the wrong type (nothing sent).
            QueueNotFound, QueueFull: from the broker.
            ConnectionClosed: the connection ended before every confirmation arrived.
        """
        limit = max(1, self.max_frame // 2)
        max_message = self.max_message
        chunks: list[list[list[Any]]] = []
        chunk: list[list[Any]] = []
        size = 0
        for item in messages:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise InvalidArgument("a batch item must be a body or a (body, headers) pair")
                data, hdrs = _body(item[0]), _headers(item[1])
            else:
                data, hdrs = _body(item), _EMPTY_HEADERS
            if len(data) > max_message:
                raise MessageTooLarge(
                    f"body of {len(data)} bytes is above the broker's maximum of {max_message}"
                )
            cost = len(data) + (16 + 64 * len(hdrs) if hdrs else 8)
            if chunk and size + cost > limit:
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append([data, hdrs])
            size += cost
        if chunk:
            chunks.append(chunk)
        if not chunks:
            return []
        # Encode every frame first, so that a bad header fails before anything is sent.
        base = None if idempotency_key is None else _key(idempotency_key)
        encoded: list[tuple[int, bytes]] = []
        for i, part in enumerate(chunks):
            corr = self._next_corr()
            if base is None:
                key = self._new_key()
            else:
                key = base if len(chunks) == 1 else f"{base}#{i}"
            encoded.append((corr, self._encode(PublishBatch(corr, queue, part, key))))
        futures: list[asyncio.Future[dict[str, Any]]] = []
        try:
            for corr, data in encoded:
                if not self._writable.is_set():
                    await self._wait_writable()
                futures.append(self._send_encoded(corr, data, retry=True))
        finally:
            if len(futures) < len(encoded):
                for fut in futures:  # we will not await them: keep their errors quiet
                    fut.add_done_callback(_consume_result)
        results = await asyncio.gather(*futures, return_exceptions=True)
        positions: list[int] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            first = _int_field(result, "first_position")
            positions.extend(range(first, first + _int_field(result, "count")))
        return positions

    def consume(self, queue: str, *, prefetch: int = 100) -> Consumer:
        """A consumer of ``queue``; subscribe by entering it (``async with``).

        Args:
            queue: the queue's name.
            prefetch: the most messages the broker delivers before they are settled.

        Returns:
            A :class:`Consumer` (not yet subscribed).
        """
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 1:
            raise InvalidArgument(f"prefetch must be a positive int, got {prefetch!r}")
        return Consumer(self, queue, prefetch)


class TopologyWatch:
    """A running :meth:`Connection.watch_topology`: stop it with :meth:`stop`."""

    __slots__ = ("_conn", "_listener", "_interval", "_tracker", "_task")

    def __init__(
        self,
        conn: Connection,
        listener: Callable[[TopologyEvent], Any],
        interval: float,
        tracker: TopologyTracker,
    ) -> None:
        self._conn = conn
        self._listener = listener
        self._interval = interval
        self._tracker = tracker
        self._task = conn._loop.create_task(self._run(), name="baton-topology-watch")
        self._task.add_done_callback(_consume_result)

    @property
    def current(self) -> TopologySnapshot | None:
        """The topology the last event reported (None before INIT)."""
        return self._tracker.current

    @property
    def running(self) -> bool:
        return not self._task.done()

    def stop(self) -> None:
        """Stop polling; no event is delivered after this returns."""
        self._task.cancel()

    async def aclose(self) -> None:
        """Stop, and wait until the polling task has ended."""
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise  # our caller was cancelled

    async def _run(self) -> None:
        conn, loop = self._conn, self._conn._loop
        while not conn.closed:
            try:
                snapshot = TopologySnapshot.from_mapping(await conn.topology())
            except ConnectionClosed:
                if conn.closed:
                    return
            except BatonError as exc:
                _log.warning("topology poll failed: %s", exc)
            else:
                for event in self._tracker.observe(snapshot, loop.time()):
                    try:
                        result = self._listener(event)
                        if inspect.isawaitable(result):
                            await result
                    except Exception:
                        _log.exception("topology listener failed on %s", event.type.name)
            await asyncio.sleep(self._interval)


def _consume_result(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _body(body: object) -> bytes:
    if type(body) is bytes:
        return body
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise InvalidArgument(f"message body must be bytes, got {type(body).__name__}")


def _headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    if headers is None:
        return _EMPTY_HEADERS
    if type(headers) is dict:
        return headers
    if isinstance(headers, Mapping):
        return dict(headers)
    raise InvalidArgument(f"headers must be a mapping, got {type(headers).__name__}")


def _key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidArgument("idempotency_key must be a non-empty str")
    return key


def _int_field(result: dict[str, Any], key: str) -> int:
    value = result.get(key)
    if not isinstance(value, int):
        raise ProtocolError(f"the broker's result has no int {key!r}: {result!r}")
    return value


class _SettleBatch:
    """Positions of one kind settled in one loop tick, and the callers waiting on them."""

    __slots__ = ("positions", "waiters")

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.waiters: list[asyncio.Future[None]] = []


_NEW: Final = 0
_ACTIVE: Final = 1
_ENDED: Final = 2


class Consumer:
    """A subscription to one queue: an async context manager and an async iterator.

    ``async with conn.consume("q") as consumer`` sends Subscribe; ``async for msg in
    consumer`` yields :class:`Message` objects as the broker delivers them (at most
    ``prefetch`` unsettled at a time); leaving the block sends Cancel. Messages still
    buffered here when the consumer is cancelled are dropped: the broker releases
    them, like every other unsettled message of the consumer.

    Iteration ends normally after :meth:`cancel`, raises the broker's error (e.g.
    QueueNotFound) when the broker cancels the consumer, and raises
    :class:`ConnectionClosed` when the connection ends.
    """

    __slots__ = (
        "_conn",
        "queue",
        "prefetch",
        "tag",
        "_state",
        "_buffer",
        "_ready",
        "_error",
        "_batches",
        "_abandoned",
        "settle_failures",
        "_flush_at",
        "_epoch",
    )

    def __init__(self, conn: Connection, queue: str, prefetch: int) -> None:
        self._conn = conn
        self.queue = queue
        self.prefetch = prefetch
        #: The broker's consumer tag (0 until subscribed).
        self.tag = 0
        self._state = _NEW
        self._buffer: deque[Message] = deque()
        self._ready = asyncio.Event()
        self._error: BaseException | None = None
        self._batches: list[_SettleBatch | None] = [None, None, None]
        self._abandoned = False
        #: Unconfirmed settlements the broker refused (each is also logged).
        self.settle_failures = 0
        self._flush_at = max(1, prefetch // 4)
        # Subscriptions so far (one per broker, failover starts a new one): a
        # Message of an earlier one cannot be settled.
        self._epoch = 0

    def __repr__(self) -> str:
        state = ("new", "active", "ended")[self._state]
        return f"<Consumer {self.queue!r} tag={self.tag} {state} buffered={len(self._buffer)}>"

    @property
    def buffered(self) -> int:
        """Messages delivered but not yet taken by the iterator."""
        return len(self._buffer)

    async def start(self) -> None:
        """Subscribe (what ``async with`` does on enter).

        Raises:
            QueueNotFound: no such queue.
            InvalidArgument: already started.
            ConnectionClosed: the connection ended.
        """
        if self._state != _NEW:
            raise InvalidArgument("consumer already started")
        conn = self._conn
        corr = conn._next_corr()
        fut = conn._request(Subscribe(corr, self.queue, self.prefetch), corr, retry=True)
        conn._subscribing[corr] = self
        try:
            await fut
        except asyncio.CancelledError:
            # Do not leave a subscription behind on the broker: cancel it now, or as
            # soon as its Ok arrives (see _subscribed).
            self._abandoned = True
            if self._state == _ACTIVE:
                conn._background(self.cancel())
            raise

    def _subscribed(self, result: dict[str, Any]) -> None:
        tag = result.get("consumer")
        if not isinstance(tag, int):
            raise ProtocolError(f"Subscribe result has no int 'consumer': {result!r}")
        self.tag = tag
        if self._state == _ENDED and not self._abandoned:
            return  # ended while (re-)subscribing: e.g. closed
        self._state = _ACTIVE
        self._conn._consumers[tag] = self
        if self._abandoned:
            self._conn._background(self.cancel())

    def _deliver(self, messages: list[Any]) -> None:
        """Buffer one Deliver frame's messages (hot path: one Message per message)."""
        if self._state != _ACTIVE:
            return
        append = self._buffer.append
        queue = self.queue
        epoch = self._epoch
        for position, delivery_count, body, headers, publish_time in messages:
            append(
                Message(self, queue, position, body, headers, delivery_count, publish_time, epoch)
            )
        self._ready.set()

    def _failed_over(self) -> None:
        """The broker was lost: it released every message of this subscription.

        Buffered messages are dropped (they will be redelivered), settlements not yet
        sent fail, and messages handed out before can no longer be settled.
        """
        self._epoch += 1
        self.tag = 0
        self._buffer.clear()
        for kind in (_ACK, _RELEASE, _REJECT):
            batch = self._batches[kind]
            if batch is None:
                continue
            self._batches[kind] = None
            for waiter, position in zip(batch.waiters, batch.positions):
                if not waiter.done():
                    waiter.set_exception(_released_by_failover(self.queue, position))

    def _resubscribe(self) -> None:
        """Subscribe again (same queue and prefetch) on the broker failed over to."""
        conn = self._conn
        corr = conn._next_corr()
        fut = conn._request(Subscribe(corr, self.queue, self.prefetch), corr, retry=True)
        conn._subscribing[corr] = self

        def done(f: asyncio.Future[dict[str, Any]]) -> None:
            exc = None if f.cancelled() else f.exception()
            if exc is not None:
                _log.warning("re-subscribing to %r after failover failed: %s", self.queue, exc)
                self._end(exc)

        fut.add_done_callback(done)

    def _end(self, error: BaseException | None) -> None:
        """Stop iteration: normally (error None) or by raising ``error``."""
        if self._state == _ENDED:
            return
        self._state = _ENDED
        self._error = error
        self._buffer.clear()
        self._ready.set()

    async def _cancel_with_unread(self, unread: list[Message]) -> int:
        """Cancel, with ``unread`` (taken by a wrapper, never handed out) put back first."""
        self._buffer.extendleft(reversed(unread))
        return await self.cancel()

    async def cancel(self) -> int:
        """Stop the consumer: send Cancel and wait for the broker's Ok.

        Buffered messages are dropped here; the broker releases every message of
        this consumer that was not settled. Those still buffered (never handed to
        the application) go back without raising their delivery count; the others
        count as a failed delivery. Cancelling an ended consumer does nothing.

        Returns:
            How many messages the broker released (0 if nothing was sent).

        Raises:
            ConnectionClosed: the connection ended while cancelling.
        """
        if self._state != _ACTIVE:
            self._end(None)
            return 0
        unread = [m.position for m in self._buffer]
        self._end(None)
        conn = self._conn
        if conn._closed is not None:
            return 0
        if self.tag == 0:
            # Failing over, not subscribed on the new broker yet: the old broker
            # released everything; a re-subscribe in flight is cancelled when its Ok
            # arrives (see _subscribed).
            self._abandoned = True
            return 0
        # Flush settlements issued before the cancel so that they are not released.
        for kind in (_ACK, _RELEASE, _REJECT):
            if self._batches[kind] is not None:
                self._flush(kind)
        corr = conn._next_corr()
        try:
            result = await conn._request(Cancel(corr, self.tag, unread), corr)
        except UnknownConsumer:
            return 0  # the broker ended it first (ConsumerCancelled crossed our Cancel)
        except ConnectionClosed:
            if conn._closed is None:
                return 0  # failing over: the lost broker released everything
            raise
        finally:
            conn._consumers.pop(self.tag, None)
        released = result.get("released", 0)
        return released if isinstance(released, int) else 0

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.cancel()
        except BatonError:
            if exc is None:
                raise
            # else: keep the exception that left the block

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        buffer = self._buffer
        while not buffer:
            if self._state != _ACTIVE:
                if self._error is not None:
                    raise _fresh(self._error)
                if self._state == _NEW:
                    raise InvalidArgument("consumer not started: use 'async with conn.consume(...)'")
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        return buffer.popleft()

    async def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None if none arrives within ``timeout`` seconds.

        Raises:
            StopAsyncIteration: the consumer was cancelled.
            ConnectionClosed: the connection ended.
            BatonError: the broker's error, if it cancelled the consumer.
        """
        if self._buffer or timeout is None:
            return await self.__anext__()
        try:
            async with asyncio.timeout(timeout):
                return await self.__anext__()
        except TimeoutError:
            return None

    async def get_many(self, max_count: int, timeout: float | None = None) -> list[Message]:
        """Wait for at least one message (up to ``timeout``), then take up to ``max_count``.

        Returns:
            The messages taken; empty on timeout or once the consumer has ended
            normally.

        Raises:
            ConnectionClosed, or the broker's error if it cancelled the consumer.
        """
        try:
            first = await self.get(timeout)
        except StopAsyncIteration:
            return []
        if first is None:
            return []
        return self._with_buffered(first, max_count)

    def _with_buffered(self, first: Message, max_count: int) -> list[Message]:
        """``first`` and then buffered messages, up to ``max_count`` in all."""
        out = [first]
        buffer = self._buffer
        while buffer and len(out) < max_count:
            out.append(buffer.popleft())
        return out

    # --- settlement (coalesced per loop tick) -----------------------------------------

    def _settle(self, kind: int, position: int) -> asyncio.Future[None]:
        conn = self._conn
        fut: asyncio.Future[None] = conn._loop.create_future()
        if self._state != _ACTIVE:
            if conn._closed is not None:
                fut.set_exception(conn._closed_again())
            else:
                fut.set_exception(
                    UnknownConsumer(
                        f"consumer {self.tag} of {self.queue!r} was cancelled; "
                        "its unsettled messages were released"
                    )
                )
            return fut
        batch = self._batches[kind]
        if batch is None:
            batch = self._batches[kind] = _SettleBatch()
            conn._loop.call_soon(self._flush, kind)
        batch.positions.append(position)
        batch.waiters.append(fut)
        if len(batch.positions) >= self._flush_at:
            # A consumer working through a full buffer never yields; sending part
            # of its acks early lets the broker refill while it works on the rest.
            self._flush(kind)
        return fut

    def _unconfirmed_done(self, fut: asyncio.Future[None]) -> None:
        """Outcome of an unconfirmed settlement: nobody awaits it, so count and log
        failures (a closed connection shows up in the iterator anyway)."""
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None or isinstance(exc, ConnectionClosed):
            return
        self.settle_failures += 1
        _log.warning("settlement on consumer %s of %r failed: %s", self.tag, self.queue, exc)

    def _flush(self, kind: int) -> None:
        batch = self._batches[kind]
        if batch is None:
            return
        self._batches[kind] = None
        conn = self._conn
        corr = conn._next_corr()
        try:
            fut = conn._request(_SETTLE_FRAMES[kind](corr, self.tag, batch.positions), corr)
        except BatonError as exc:
            for waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        waiters, positions = batch.waiters, batch.positions
        fut.add_done_callback(lambda done: _fan_out(done, waiters, positions))

    async def ack_many(self, messages: Iterable[Message], *, confirm: bool = False) -> None:
        """Accept several messages with one frame (see :meth:`Message.ack`).

        With ``confirm``, waits for every one; if some were refused (e.g. released by
        a failover), raises the first such error after all have completed.
        """
        await self._settle_many(_ACK, messages, confirm)

    async def release_many(self, messages: Iterable[Message], *, confirm: bool = False) -> None:
        """Release several messages with one frame (see :meth:`Message.release`)."""
        await self._settle_many(_RELEASE, messages, confirm)

    async def reject_many(self, messages: Iterable[Message], *, confirm: bool = False) -> None:
        """Reject several messages with one frame (see :meth:`Message.reject`)."""
        await self._settle_many(_REJECT, messages, confirm)

    async def _settle_many(self, kind: int, messages: Iterable[Message], confirm: bool) -> None:
        items = list(messages)
        for msg in items:
            if msg._consumer is not self:
                raise InvalidArgument(f"message {msg.position} is not from this consumer")
            if msg._settled:
                raise InvalidArgument(f"message {msg.position} is already settled")
            if msg._epoch != self._epoch:
                raise _released_by_failover(self.queue, msg.position)
        futures = []
        for msg in items:
            msg._settled = True
            futures.append(self._settle(kind, msg.position))
        if not confirm:
            for fut in futures:
                fut.add_done_callback(self._unconfirmed_done)
            return
        # Wait for every one (so no failure goes unretrieved), then raise the first.
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome


def _released_by_failover(queue: str, position: int) -> NotAcquired:
    return NotAcquired(
        f"message {queue!r}@{position} was delivered by a broker this connection has"
        " failed over from: that broker released it, and it will be redelivered"
        " (it cannot be settled any more)"
    )


def _fresh(error: BaseException) -> BaseException:
    """A new instance of a stored error, so that raising it in many tasks does not
    pile every task's traceback onto one exception object."""
    if isinstance(error, BatonError):
        fresh = type(error)(error.message)
        fresh.__cause__ = error.__cause__
        return fresh
    return error


def _fan_out(
    done: asyncio.Future[dict[str, Any]],
    waiters: list[asyncio.Future[None]],
    positions: list[int],
) -> None:
    """Complete each settlement of one frame; the broker names the positions it
    did not hold (``not_acquired``), and only those callers fail."""
    exc = None if done.cancelled() else done.exception()
    missing: set[int] = set()
    if exc is None and not done.cancelled():
        missing = set(done.result().get("not_acquired") or ())
    for waiter, position in zip(waiters, positions):
        if waiter.done():
            continue
        if done.cancelled():
            waiter.cancel()
        elif exc is not None:
            waiter.set_exception(_fresh(exc))
        elif position in missing:
            waiter.set_exception(
                NotAcquired(
                    f"message {position} was not held by this consumer any more"
                    " (released after a disconnect or restart?)"
                )
            )
        else:
            waiter.set_result(None)


class Message:
    """One delivered message, acquired by its consumer until settled.

    Settle it exactly once with :meth:`ack`, :meth:`release` or :meth:`reject`;
    a second settlement raises InvalidArgument. Unsettled messages are released by
    the broker when their consumer is cancelled or the connection ends.

    Attributes:
        queue: the queue's name.
        position: the message's position in the queue (its id together with ``queue``).
        body: the message body (bytes).
        headers: the headers published with it.
        delivery_count: earlier deliveries of this message that ended in a release
            (0 on the first delivery; see docs/client.md).
        publish_time: when the broker took the message, in ms since the epoch.
    """

    __slots__ = (
        "_consumer",
        "queue",
        "position",
        "body",
        "headers",
        "delivery_count",
        "publish_time",
        "_settled",
        "_epoch",
    )

    def __init__(
        self,
        consumer: Consumer,
        queue: str,
        position: int,
        body: bytes,
        headers: dict[str, Any],
        delivery_count: int,
        publish_time: int,
        epoch: int = 0,
    ) -> None:
        self._consumer = consumer
        self.queue = queue
        self.position = position
        self.body = body
        self.headers = headers
        self.delivery_count = delivery_count
        self.publish_time = publish_time
        self._settled = False
        self._epoch = epoch

    def __repr__(self) -> str:
        return (
            f"<Message {self.queue!r}@{self.position} delivery={self.delivery_count} "
            f"{len(self.body)}B>"
        )

    @property
    def consumer(self) -> Consumer:
        """The consumer that holds this message."""
        return self._consumer

    @property
    def settled(self) -> bool:
        """True once ack/release/reject was called."""
        return self._settled

    async def _settle_as(self, kind: int, confirm: bool) -> None:
        if self._settled:
            raise InvalidArgument(f"message {self.queue!r}@{self.position} is already settled")
        if self._epoch != self._consumer._epoch:
            raise _released_by_failover(self.queue, self.position)
        self._settled = True
        fut = self._consumer._settle(kind, self.position)
        if confirm:
            await fut
        else:
            fut.add_done_callback(self._consumer._unconfirmed_done)

    async def ack(self, *, confirm: bool = False) -> None:
        """Accept the message: it is removed for good and never redelivered.

        Without ``confirm`` the accept is queued (sent with the others of this
        loop tick) and the call returns at once — a consumer loop then costs no
        round trip per message. If the connection ends before the broker applied
        it, the message is redelivered (at-least-once), as with any broker. With
        ``confirm=True`` it returns once the broker applied the accept: from then
        on the message can never come back (DESIGN §5, guarantee 3).

        Raises:
            InvalidArgument: the message was already settled (nothing sent).
            NotAcquired: (confirm) the broker no longer holds it for this consumer;
                or (always, nothing sent) it was delivered before the connection
                failed over to another broker, which released it.
            UnknownConsumer: the consumer was cancelled (its messages were released).
            ConnectionClosed: (confirm) the connection ended first (outcome unknown).
        """
        await self._settle_as(_ACK, confirm)

    async def release(self, *, confirm: bool = False) -> None:
        """Give the message back to its queue; its delivery count goes up by one.

        At the queue's ``delivery_limit`` it is dead-lettered instead.
        ``confirm`` as for :meth:`ack`.

        Raises:
            The same as :meth:`ack`.
        """
        await self._settle_as(_RELEASE, confirm)

    async def reject(self, *, confirm: bool = False) -> None:
        """Reject the message: it goes to the dead-letter queue (or is dropped).

        ``confirm`` as for :meth:`ack`.

        Raises:
            The same as :meth:`ack`.
        """
        await self._settle_as(_REJECT, confirm)
