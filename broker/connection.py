"""One client connection's framing: an asyncio Protocol around the sans-IO FrameCodec.

:class:`ClientConnection` reads frames and hands each to :meth:`handle_frame` (the
session, broker/session.py, routes them to the commands); it writes frames, all
those queued in one loop tick in one write; and it does the flow control: reading
stops while too many commands are in flight, and :attr:`paused` tells the broker's
delivery that the client is not reading.

Every command completes asynchronously (a future from the node); :meth:`reply`
answers with Ok or Error when it does, so many commands can be in flight on one
connection and their completions may come in any order. A malformed or oversized
frame closes this connection only (with an Error frame, corr 0, first).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar, cast

from pamqp import commands

from batonmq.broker.admission import QuietLog
from batonmq.broker.amqp_codec import method_frame
from batonmq.broker.config import MAX_IN_FLIGHT
from batonmq.broker.networks import LOOPBACK, allows
from batonmq.broker.reply import Shape
from batonmq.clients import wire
from batonmq.clients.foreign import HTTP_REPLY, foreign_protocol
from batonmq.cluster.errors import BatonError, InternalError, ProtocolError

__all__ = ["ClientConnection", "MAX_IN_FLIGHT"]

log = logging.getLogger("baton.session")
#: Clients of another protocol on the native port: a line a second at most.
_foreign_log = QuietLog(log, "connection of another protocol closed")
_AMQP_HERE = (
    "NOT_ALLOWED - this is the native client port of a Baton broker: AMQP 0-9-1 clients"
    " connect to the port of its --amqp-listen"
)
#: Seconds an answer to a foreign client has to be read before the connection closes.
_FOREIGN_CLOSE_S = 2.0

R = TypeVar("R")

# Frames queued in one tick are written together, but this many bytes at once.
_FLUSH_AT: Final = 256 * 1024
# The most bytes a connection may send before its Hello is handled.
_MAX_BEFORE_HELLO: Final = 64 * 1024
# A frame at least this large is decoded on a worker thread, not on the event loop:
# within the decode limits a hostile frame costs up to ~150 ns a byte to decode, so a
# frame below this holds the loop for a few ms at most (docs/security.md "Bad input harms no one else").
DECODE_AWAY_AT: Final = 32 * 1024

_decoder: ThreadPoolExecutor | None = None
_decoder_lock = threading.Lock()


def _decode_pool() -> ThreadPoolExecutor:
    """The broker's frame-decoding threads (two: a connection decodes one frame at a
    time, and msgpack holds the GIL while it builds one container)."""
    global _decoder
    with _decoder_lock:
        if _decoder is None:
            _decoder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="baton-decode")
        return _decoder


class ClientConnection(asyncio.Protocol):
    """Frames in and out of one client connection; subclasses handle the frames.

    Args:
        max_frame: the largest frame read or written (``BrokerConfig.max_frame``).
        max_in_flight: stop reading frames while this many commands are in flight
            (``BrokerConfig.max_in_flight``).
        max_output, output_grace: close the connection when the bytes written to
            it and not yet sent stay above ``max_output`` for ``output_grace`` seconds.
        limits: the bounds that hold while a frame is decoded (default:
            ``wire.DecodeLimits()``).
    """

    def __init__(
        self,
        max_frame: int,
        max_in_flight: int = MAX_IN_FLIGHT,
        max_output: int = 64 * 1024 * 1024,
        output_grace: float = 10.0,
        limits: wire.DecodeLimits | None = None,
    ) -> None:
        self.codec = wire.FrameCodec(max_frame, limits or wire.DecodeLimits())
        self.max_in_flight = max_in_flight
        self.max_output = max_output
        self.output_grace = output_grace
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.loopback = False  # the peer's address is a loopback one
        self.peer_host = ""  # the peer's IP address
        self.closed = False
        self.paused = False  # the client is not reading: stop delivering
        self.greeted = False  # Hello done (set by the subclass that handles it)
        self._foreign = False  # a client of another protocol was answered; closing
        self.last_read = 0.0  # loop time of the last bytes read
        self._watch: asyncio.TimerHandle | None = None
        self.in_flight = 0
        # Why reading is paused ("in flight", "output"): it resumes when none is left.
        self._read_blocks: set[str] = set()
        self._over_since: asyncio.TimerHandle | None = None  # output above max_output
        self._out: list[bytes] = []  # encoded frames waiting for this tick's write
        self._out_size = 0  # their bytes
        self._writable = asyncio.Event()
        self._writable.set()

    # -- what a subclass does with the frames ------------------------------------------

    def handle_frame(self, frame: wire.Frame) -> None:
        """Handle one frame read from the client.

        Raises:
            BatonError: answered with an Error frame to the frame's corr (0 if none);
                the connection stays open.
        """
        raise NotImplementedError

    def logged_in(self) -> bool:
        """True once the peer has proved who it is (the hello timeout no longer runs);
        by default, once greeted."""
        return self.greeted

    def busy(self) -> bool:
        """True while the connection waits for the broker (not idle, whatever it sends)."""
        return False

    def frames_handled(self) -> None:
        """Every frame of one read has been handled (not called when the read closed
        the connection with a framing error)."""

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, hence a cast.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_host = str(peer[0]) if peer else ""
        self.loopback = bool(peer) and allows(LOOPBACK, str(peer[0]))

    def data_received(self, data: bytes) -> None:
        if self._foreign:
            if self.transport is not None:
                self.transport.close()  # the foreign client read the answer
            return
        if data:
            self.last_read = asyncio.get_running_loop().time()
            if not self.greeted and not self.codec.buffered:
                foreign = foreign_protocol(data[:8])
                if foreign == "TLS":
                    # A TLS ClientHello where Hello's length should be.
                    self.fail(ProtocolError("a TLS client on a port without TLS"))
                    return
                if foreign is not None:
                    self._refuse_foreign(foreign)
                    return
        codec = self.codec
        codec.receive_data(data)
        # While reading is blocked the rest of a read stays in the codec's buffer
        # (one read may hold thousands of small commands): it is handled once
        # reading resumes.
        while not self.closed and not self._read_blocks:
            try:
                length = codec.next_length()
                if not self.greeted and length is not None and length > _MAX_BEFORE_HELLO:
                    raise ProtocolError(f"a frame of more than {_MAX_BEFORE_HELLO} bytes before Hello")
                payload = codec.next_payload()
                if not isinstance(payload, (bytes, memoryview)):
                    break  # NEED_DATA: the rest of the frame is still to come
                if len(payload) >= DECODE_AWAY_AT:
                    self._decode_away(payload)
                    break
                frame = codec.decode(payload)
            except ProtocolError as exc:
                self.fail(exc)
                return
            self._handle(frame)
        if not self.greeted and not self.closed and codec.buffered > _MAX_BEFORE_HELLO:
            # Hello is small: a client that is not greeted yet may not make the broker
            # buffer up to max_frame for it.
            self.fail(ProtocolError(f"more than {_MAX_BEFORE_HELLO} bytes before Hello"))
            return
        self.frames_handled()

    def _handle(self, frame: wire.Frame) -> None:
        try:
            self.handle_frame(frame)
        except BatonError as exc:
            self.error(getattr(frame, "corr", 0), exc)
        except Exception as exc:  # a bug: answer, log, keep the broker alive
            log.exception("error handling %s from %s", type(frame).__name__, self.peer)
            self.error(getattr(frame, "corr", 0), InternalError(f"internal error: {exc!r}"))

    def _decode_away(self, payload: bytes | memoryview) -> None:
        """Decode a large frame on a worker thread; reading stops until it is handled,
        so frames are still handled in the order they came."""
        self._block_reading("decoding")
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(_decode_pool(), self.codec.decode, payload)
        fut.add_done_callback(self._decoded)

    def _decoded(self, fut: asyncio.Future[wire.Frame]) -> None:
        if self.closed:
            return
        if fut.cancelled():
            self.fail(InternalError("frame decoding cancelled"))
            return
        exc = fut.exception()
        if isinstance(exc, ProtocolError):
            self.fail(exc)
            return
        if exc is not None:
            log.error("decoding a frame from %s failed: %r", self.peer, exc)
            self.fail(InternalError(f"internal error: {exc!r}"))
            return
        self._handle(fut.result())
        if not self.closed:
            self.frames_handled()
        self._unblock_reading("decoding")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._over_since is not None:
            self._over_since.cancel()
            self._over_since = None

    def watch_timeouts(self, hello: float, idle: float) -> None:
        """Close this connection if it has not logged in (:meth:`logged_in`) within
        ``hello`` seconds, or (once it has) sent nothing at all for ``idle`` seconds
        (0: never). Time spent with reading paused by the broker does not count as idle."""
        loop = asyncio.get_running_loop()
        opened = self.last_read = loop.time()

        def check() -> None:
            self._watch = None
            if self.closed:
                return
            now = loop.time()
            if self._read_blocks or self.busy():
                self.last_read = now  # we do not read it, or it waits for us: not idle
            if not self.logged_in():
                if now - opened < hello:
                    wait = opened + hello - now
                elif self.busy():
                    wait = 0.25  # its login is being checked (a member proof): not yet
                else:
                    what = "member proof (UpdateRequest)" if self.greeted else "Hello"
                    self.fail(ProtocolError(f"no {what} within {hello:g}s (hello_timeout)"))
                    return
            elif idle:
                if now - self.last_read >= idle:
                    self.fail(ProtocolError(f"idle for {idle:g}s (idle_timeout): closed"))
                    return
                wait = self.last_read + idle - now
            else:
                return  # greeted, no idle timeout: nothing more to watch
            self._watch = loop.call_later(max(wait, 0.01), check)

        self._watch = loop.call_later(hello, check)

    def pause_writing(self) -> None:
        self.paused = True
        self._writable.clear()
        # The client does not read: read no more commands from it, whose answers
        # would pile up here (docs/security.md).
        self._block_reading("output")

    def resume_writing(self) -> None:
        self.paused = False
        self._writable.set()
        self._unblock_reading("output")

    def _block_reading(self, why: str) -> None:
        if not self._read_blocks and self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self._read_blocks.add(why)

    def _unblock_reading(self, why: str) -> None:
        if why not in self._read_blocks:
            return
        self._read_blocks.discard(why)
        if not self._read_blocks and self.transport is not None and not self.closed:
            self.transport.resume_reading()
            if self.codec.buffered:  # frames read before the block
                asyncio.get_running_loop().call_soon(self._handle_buffered)

    def _handle_buffered(self) -> None:
        if not self.closed and not self._read_blocks and self.codec.buffered:
            self.data_received(b"")

    def _check_output(self) -> None:
        """After a write: past ``max_output`` unsent bytes, close the connection if it
        is still past them ``output_grace`` seconds later."""
        transport = self.transport
        if transport is None or self._over_since is not None:
            return
        if transport.get_write_buffer_size() > self.max_output:
            self._over_since = asyncio.get_running_loop().call_later(
                self.output_grace, self._output_timeout
            )

    def _output_timeout(self) -> None:
        self._over_since = None
        transport = self.transport
        if transport is None or self.closed:
            return
        size = transport.get_write_buffer_size()
        if size > self.max_output:
            log.warning(
                "closing connection from %s: %d bytes written to it are still unread after"
                " %gs (max_output %d)", self.peer, size, self.output_grace, self.max_output,
            )
            self.closed = True
            transport.abort()  # its buffer will never drain: do not wait for it

    async def drained(self) -> None:
        """Return once the transport takes writes again (at once if it does now, or
        once the connection is closed)."""
        await self._writable.wait()

    def close(self) -> None:
        """Close the transport (``connection_lost`` follows)."""
        if self.transport is not None:
            self.transport.close()

    # -- sending ---------------------------------------------------------------------------

    def send(self, frame: wire.Frame, codec: wire.FrameCodec | None = None) -> None:
        """Queue a frame; all frames queued in one loop tick go out in one write.

        Args:
            codec: encode with this codec instead of the connection's (frames above
                ``max_frame``: a join update's).
        """
        if self.closed or self.transport is None:
            return
        out = self._out
        data = (codec or self.codec).send(frame)
        out.append(data)
        self._out_size += len(data)
        if self._out_size >= _FLUSH_AT:
            # Written now, so that a client that does not read is noticed (pause_writing)
            # before the rest of a read's commands are answered.
            self._flush()
        elif len(out) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        out = self._out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._out_size = 0
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self._check_output()

    def error(self, corr: int, exc: BatonError) -> None:
        """Answer ``corr`` with an Error frame."""
        self.send(wire.Error(corr, exc.code, exc.message))

    def _refuse_foreign(self, protocol: str) -> None:
        """An AMQP or HTTP client on the native port: answer in its own protocol and
        close, with a line in the log (at most one a second). An AMQP client gets
        ``Connection.Start`` and then ``Connection.Close`` 530 saying where its port is
        (pika shows that text); an HTTP client a 400 that says where the admin API is."""
        if protocol == "AMQP":
            why = "an AMQP 0-9-1 client (the --amqp-listen port is for those)"
            reply = method_frame(
                0, commands.Connection.Start(0, 9, {"product": "Baton"}, "PLAIN", "en_US")
            ) + method_frame(0, commands.Connection.Close(530, _AMQP_HERE, 0, 0))
        else:
            why = "an HTTP client (the admin API is on the --admin-listen port)"
            reply = HTTP_REPLY
        _foreign_log(self.peer, why)
        self.closed = True
        self.connection_lost(None)
        transport = self.transport
        if transport is None:
            return
        transport.write(reply)
        # Closed once the client answers (an AMQP client's StartOk) or after a moment, so
        # that the answer is read before the connection ends.
        self._foreign = True
        asyncio.get_running_loop().call_later(_FOREIGN_CLOSE_S, transport.close)

    def fail(self, exc: BatonError) -> None:
        """Close this connection after telling the client why."""
        log.info("closing connection from %s: %s", self.peer, exc.message)
        self.send(wire.Error(0, exc.code, exc.message))
        self._flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        self.connection_lost(None)

    def reply(self, corr: int, fut: asyncio.Future[R], shape: Shape[R]) -> None:
        """Answer ``corr`` with the future's outcome when it completes: Ok with
        ``shape`` of its result, or Error."""
        self.commands_started(1)

        def done(f: asyncio.Future[R]) -> None:
            self.commands_finished(1)
            if f.cancelled():
                self.error(corr, InternalError("command cancelled"))
                return
            exc = f.exception()
            if exc is None:
                try:
                    self.send(wire.ok(corr, shape(f.result())))
                except BatonError as shaped:
                    self.error(corr, shaped)
            elif isinstance(exc, BatonError):
                self.error(corr, exc)
            else:
                log.error("command %d failed: %r", corr, exc)
                self.error(corr, InternalError(repr(exc)))

        fut.add_done_callback(done)

    # -- flow control ----------------------------------------------------------------------

    def commands_started(self, n: int) -> None:
        """``n`` more commands in flight; past ``max_in_flight`` stop reading frames."""
        self.in_flight += n
        if self.in_flight >= self.max_in_flight:
            self._block_reading("in flight")

    def commands_finished(self, n: int) -> None:
        """``n`` commands in flight have completed; below half of ``max_in_flight`` read
        frames again."""
        self.in_flight -= n
        if self.in_flight < self.max_in_flight // 2:
            self._unblock_reading("in flight")
