"""Coverage-guided fuzzing of what reads bytes from outside (docs/fuzzing.md).

    python -m batonmq.loadtest.fuzz frames --runs 1000000
    python -m batonmq.loadtest.fuzz events --runs 1000000
    python -m batonmq.loadtest.fuzz handshake --runs 1000000
    python -m batonmq.loadtest.fuzz sealed --runs 1000000
    python -m batonmq.loadtest.fuzz amqp --runs 1000000
    python -m batonmq.loadtest.fuzz amqp-session --runs 100000

Six targets, each fed by atheris (libFuzzer for Python: it mutates inputs towards
new branches of the instrumented code) from a seed corpus of real encoded frames and
events:

``frames``
    the sans-IO wire codec (:class:`batonmq.clients.wire.FrameCodec`): bytes in any
    chunking, every frame out of them. Allowed: frames, ``NEED_DATA`` and
    :class:`~batonmq.cluster.errors.ProtocolError` (with its subclasses); a decoded
    frame must encode again to bytes that decode to the same encoding.
``events``
    the log record decoder (:func:`batonmq.cluster.codec.decode`), then the event
    applied to a replica's state with two members and a queue. Allowed:
    :class:`~batonmq.cluster.codec.MalformedEvent`; a decoded event must encode again
    stably, and applying it must not raise (a raise there would stop a broker's
    applier on every replica).
``handshake``
    the broker's side of the Hello exchange: a :class:`batonmq.broker.session.Session`
    on a recording transport, fed the bytes in chunks until it greets or closes.
    Allowed: a HelloOk to the Hello's corr, or an Error frame and the connection
    closed, or waiting for more bytes (never more than a frame's worth buffered);
    nothing else written, no exception out of ``data_received``.

``amqp``
    the AMQP 0-9-1 codec (:class:`batonmq.broker.amqp_codec.AmqpCodec`): the protocol
    header and frames in any chunking. Allowed: events, waiting for more bytes and
    :class:`~batonmq.broker.amqp_codec.FrameError` (the connection closes with its
    code); a method decoded must encode again (or be refused by pamqp with ValueError)
    to a frame that decodes to the same method; never more than a frame buffered.

``amqp-session``
    the broker's side of an AMQP connection (:class:`batonmq.broker.amqp_connection.AmqpConnection`)
    on a recording transport and a stand-in broker (default users, no queues, commands
    that never complete), fed the bytes in chunks: the handshake with its login, then
    any channel methods. Allowed: whatever it writes is AMQP (the protocol header,
    whole frames), a connection it closes was told why (``Connection.Close``, or its
    header for a wrong one), no exception out of ``data_received``, and no error with
    a traceback in the log (a client's mistake is answered, not logged as a bug).

``sealed``
    opening a sealed log's record (:meth:`batonmq.cluster.log.sealed.SealedLog.open`):
    the record's bytes or ``UNOPENED``, never an exception.

Anything else is a crash: atheris prints the input and the traceback and the exit
status is not 0. ``--corpus DIR`` keeps the inputs found (and starts from them).
Needs the ``fuzz`` extra (``pip install 'batonmq[fuzz]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import logging
import os
import struct
import sys
import tempfile
import types
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any, Final, cast

from pamqp import base as pamqp_base
from pamqp import commands as pamqp_commands
from pamqp import frame as pamqp_frame

from batonmq.broker.admission import LoginGate
from batonmq.broker.amqp_codec import HEARTBEAT as AMQP_HEARTBEAT
from batonmq.broker.amqp_codec import PROTOCOL_HEADER as AMQP_HEADER
from batonmq.broker.amqp_codec import AmqpCodec, FrameError
from batonmq.broker.amqp_codec import Method as AmqpMethod
from batonmq.broker.amqp_codec import ProtocolHeader as AmqpProtocolHeader
from batonmq.broker.amqp_codec import method_frame as amqp_method_frame
from batonmq.broker.amqp_connection import AmqpBroker, AmqpConnection
from batonmq.broker.config import BrokerConfig
from batonmq.broker.delivery import Consumer
from batonmq.broker.memory import BodyBudget
from batonmq.broker.session import Session, SessionBroker
from batonmq.clients import scram, wire
from batonmq.cluster import codec
from batonmq.cluster.codec import MalformedEvent, UnreadableRecord
from batonmq.cluster.effects import Effect
from batonmq.cluster.errors import ProtocolError
from batonmq.cluster.exchanges import Exchanges
from batonmq.cluster.features import Features
from batonmq.cluster.log import UNOPENED
from batonmq.cluster.log.memory import MemoryLog
from batonmq.cluster.log.sealed import KeyFile, SealedLog
from batonmq.cluster.events import (
    Accept,
    Acquire,
    DeclareQueue,
    Enqueue,
    Heartbeat,
    Origin,
    Propose,
    Release,
    Vote,
)
from batonmq.cluster.state import State
from batonmq.cluster.users import Users

__all__ = ["TARGETS", "COVERED", "seeds", "main"]

#: The frame limit of the codecs fuzzed: small, so oversized lengths are reached.
MAX_FRAME = 1 << 16


def _chunks(data: bytes) -> Iterator[bytes]:
    """The input after its first byte, cut in pieces of that byte's size (0: whole):
    the fuzzer explores how reads split frames too."""
    if not data:
        return
    size, rest = data[0], data[1:]
    if size == 0:
        yield rest
        return
    for i in range(0, len(rest), size):
        yield rest[i : i + size]


# -- frames ---------------------------------------------------------------------------------


def one_frames(data: bytes) -> None:
    """Decode every frame of ``data`` as a broker does (within its decode limits); check
    each encodes again stably."""
    codec_in = wire.FrameCodec(MAX_FRAME, wire.DecodeLimits())
    for chunk in _chunks(data):
        codec_in.receive_data(chunk)
        while True:
            try:
                frame = codec_in.next_frame()
            except ProtocolError:
                return  # the connection is closed with this error
            if not isinstance(frame, wire.Frame):
                break
            _check_frame_round_trip(frame)
        if codec_in.buffered > MAX_FRAME + 4:
            raise AssertionError(f"{codec_in.buffered} bytes buffered for one frame")


def _check_frame_round_trip(frame: wire.Frame) -> None:
    out = wire.FrameCodec(MAX_FRAME * 4)
    encoded = out.send(frame)
    again = wire.decode_payload(encoded[4:])
    if type(again) is not type(frame) or out.send(again) != encoded:
        raise AssertionError(f"{frame!r} does not encode stably: {again!r}")


# -- events ---------------------------------------------------------------------------------

_MEMBERS = ("n1/r1", "n2/r2")


def _template_state() -> State:
    """A replica's state with two members in the view and queues ``q`` and ``dlq``,
    some messages in ``q`` and one acquired: fuzzed events reach the queue code."""
    state = State()
    seqs: dict[str, int] = {}
    offset = 0

    def apply(event: Any, who: str = "n1/r1") -> None:
        nonlocal offset
        seqs[who] = seqs.get(who, 0) + 1
        node, runtime = who.split("/")
        record = codec.encode(Origin(node, runtime, seqs[who], 1000 + offset), event)
        origin, decoded = codec.decode(record)
        out: list[Effect] = []
        state.apply(offset, origin, decoded, out)
        offset += 1

    for m in _MEMBERS:
        apply(Heartbeat("voter", "", {}), m)
    apply(Propose(1, _MEMBERS, "cluster"))
    for m in _MEMBERS:
        apply(Vote(1, True), m)
    apply(DeclareQueue("dlq"))
    apply(DeclareQueue("q", delivery_limit=2, dead_letter="dlq", max_length=5))
    apply(Enqueue("q", tuple((b"m%d" % i, {"i": i}) for i in range(4))))
    apply(Acquire("q", "n1/r1/c1", 2))
    return state


_TEMPLATE: State | None = None


def one_events(data: bytes) -> None:
    """Decode ``data`` as a log record; apply what decodes to a copy of the template
    state, as its own runtime's next event and as a member's."""
    global _TEMPLATE
    try:
        origin, event = codec.decode(data)
    except (MalformedEvent, UnreadableRecord):
        return
    encoded = codec.encode(origin, event)
    again = codec.decode(encoded)
    if codec.encode(*again) != encoded:
        raise AssertionError(f"{event!r} does not encode stably")
    if _TEMPLATE is None:
        _TEMPLATE = _template_state()
    for who in (origin, Origin("n1", "r1", 1 << 40, origin.ts)):
        state = copy.deepcopy(_TEMPLATE)
        out: list[Effect] = []
        state.apply(state.applied + 1, who, event, out)
        state.digest()  # what a checkpoint computes: must not raise either


# -- handshake ------------------------------------------------------------------------------


class _Transport:
    """Records what the session writes; stands in for the socket."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0  # everything written has gone out

    def abort(self) -> None:
        self.closing = True


class _HandshakeSession(Session):
    """A real session up to its greeting; the commands after it are not the handshake's
    (and would need a running node), so they are only counted."""

    after_greeting = 0

    def handle_frame(self, f: wire.Frame) -> None:
        if self.greeted:
            self.after_greeting += 1
            return
        super().handle_frame(f)


_USERS = Users()  # the default table: guest


def _fake_broker() -> SessionBroker:
    config = BrokerConfig(data_dir="unused", max_frame=MAX_FRAME, max_message=MAX_FRAME // 4)
    broker = SimpleNamespace(
        config=config,
        version="fuzz",
        sessions=set(),
        node=SimpleNamespace(node_id="fuzz-node",
                             state=SimpleNamespace(users=_USERS, features=Features())),
        delivery=SimpleNamespace(remove=lambda consumer: None),
        leadership=SimpleNamespace(session_closed=lambda session: None),
        auth_secret=b"fuzz" * 8,
        allow_from=None,
        refused=lambda what: None,
        connections=lambda: [],
        logins=LoginGate(1 << 30, 1 << 30),  # every fuzzed connection is admitted
    )
    return cast(SessionBroker, broker)


_LOOP: asyncio.AbstractEventLoop | None = None


async def _handshake(data: bytes) -> None:
    session = _HandshakeSession(_fake_broker())
    transport = _Transport()
    session.connection_made(cast(asyncio.BaseTransport, transport))
    for chunk in _chunks(data):
        if session.closed or session.greeted:
            break
        session.data_received(chunk)
        if session.codec.buffered > MAX_FRAME + 4:
            raise AssertionError(f"{session.codec.buffered} bytes buffered before the greeting")
    await asyncio.sleep(0)  # the session's writes go out at the end of the tick
    replies = wire.FrameCodec(MAX_FRAME)
    replies.receive_data(bytes(transport.written))
    frames: list[wire.Frame] = []
    while isinstance(frame := replies.next_frame(), wire.Frame):
        frames.append(frame)
    if replies.buffered:
        raise AssertionError(f"{replies.buffered} bytes written that are no frame")
    if frames and isinstance(frames[0], wire.AuthChallenge):
        frames = frames[1:]  # a login under way (its proof cannot be guessed)
    if session.greeted:
        if not frames or not isinstance(frames[0], wire.HelloOk):
            raise AssertionError(f"greeted without a HelloOk: {frames!r}")
        if not all(isinstance(f, wire.Error) for f in frames[1:]):
            raise AssertionError(f"more than HelloOk and errors written: {frames!r}")
    elif session.closed:
        if not frames or not isinstance(frames[-1], wire.Error) or not transport.closing:
            raise AssertionError(f"closed without an Error frame: {frames!r}")
    elif frames:
        raise AssertionError(f"wrote {frames!r} to a client that has not logged in")
    session.connection_lost(None)


def one_handshake(data: bytes) -> None:
    """Feed ``data`` to a fresh broker session until it greets or closes."""
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
    _LOOP.run_until_complete(_handshake(data))


# -- sealed ---------------------------------------------------------------------------------

_SEALED: SealedLog | None = None


def _sealed_log() -> SealedLog:
    """A sealed memory log with one key (its key file read from a temporary directory,
    removed at once: a KeyFile keeps the keys it read when its file is gone)."""
    global _SEALED
    if _SEALED is None:
        with tempfile.TemporaryDirectory(prefix="baton-fuzz-keys-") as keys_dir:
            path = os.path.join(keys_dir, "keys.toml")
            with open(path, "w") as f:
                f.write('[[key]]\nid = "k1"\nsecret = "' + "a2V5" * 8 + '"\n')
            _SEALED = SealedLog(MemoryLog("fuzz"), KeyFile(path, clock=lambda: 0.0))
    return _SEALED


def one_sealed(data: bytes) -> None:
    """Open ``data`` as a sealed record: the record's bytes or UNOPENED, nothing else."""
    log = _sealed_log()
    opened = log.open(data, 0.0)
    if opened != UNOPENED and log.seal([opened])[0][:6] != data[:6]:
        raise AssertionError("a record opened that its key did not seal")


# -- amqp -----------------------------------------------------------------------------------

#: The AMQP codec's limits: a small frame_max so that oversized frames are reached.
AMQP_FRAME_MAX = 4096
AMQP_MAX_BODY = 1024


def one_amqp(data: bytes) -> None:
    """Feed ``data`` to an AMQP codec; check what it decodes."""
    codec = AmqpCodec(AMQP_FRAME_MAX, AMQP_MAX_BODY)
    for chunk in _chunks(data):
        codec.receive_data(chunk)
        while True:
            try:
                event = codec.next_event()
            except FrameError:
                return  # the connection is closed with this code
            if event is None:
                break
            if isinstance(event, AmqpProtocolHeader) and not event.ok:
                return  # answered with the broker's header and closed
            if isinstance(event, AmqpMethod):
                _check_amqp_round_trip(event)
        if codec.buffered > AMQP_FRAME_MAX + len(AMQP_HEADER):
            raise AssertionError(f"{codec.buffered} bytes buffered for one frame")


def _check_amqp_round_trip(event: AmqpMethod) -> None:
    try:
        encoded = amqp_method_frame(event.channel, event.method)
    except (ValueError, TypeError, OverflowError, struct.error):
        # pamqp refuses to write the value back (a name its pattern refuses, a double
        # it writes as a float); the broker writes no client's table with it
        # (broker/amqp_message.py encode_table)
        return
    again = AmqpCodec(len(encoded) + 16, AMQP_MAX_BODY)
    again.receive_data(AMQP_HEADER + encoded)
    again.next_event()
    decoded = again.next_event()
    if not isinstance(decoded, AmqpMethod) or type(decoded.method) is not type(event.method):
        raise AssertionError(f"{event.method.name} does not decode again: {decoded!r}")


class _Tracebacks(logging.Handler):
    """Fails the input on an error logged with a traceback (a bug, not a client's
    mistake)."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.levelno >= logging.ERROR:
            raise AssertionError(f"logged a traceback: {record.getMessage()}")


class _StandInDelivery:
    """The broker's delivery as a channel sees it: a consumer added gets two messages
    at once (one of them redelivered, with headers), so settlements have tags to hit."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.by_queue: dict[str, list[Consumer]] = {}
        self.added = 0

    def add(self, queue: str, prefetch: int, session: Any, tag: int, counters: bool = False,
            ack_timeout_ms: int | None = None) -> Consumer:
        self.added += 1
        c = Consumer(tag, f"fuzz/r/{self.added}", queue, prefetch, session, counters)
        self.by_queue.setdefault(queue, []).append(c)
        base = self.added * 10
        messages: list[list[Any]] = [
            [base, 0, b"body", {"h": 1}, 0, 0],
            [base + 1, 2, b"", {"amqp-properties": {"correlation_id": "c"}}, 0, 3],
        ]
        for m in messages:
            c.held[int(m[0])] = len(c.held)
        self.loop.call_soon(session.deliver, tag, messages)
        return c

    def consumers_of(self, queue: str) -> list[Consumer]:
        return [c for c in self.by_queue.get(queue, ()) if c.counted and not c.closed]

    def remove(self, c: Consumer, *args: Any) -> None:
        c.closed = True
        peers = self.by_queue.get(c.queue, [])
        if c in peers:
            peers.remove(c)

    def pump(self, queue: str) -> None:
        pass

    def settled(self, c: Consumer) -> None:
        pass

    def released(self, c: Consumer) -> None:
        pass


def _amqp_broker(loop: asyncio.AbstractEventLoop) -> AmqpBroker:
    config = BrokerConfig(data_dir="unused", max_message=AMQP_MAX_BODY, hello_timeout=30)
    queue = SimpleNamespace(ready=3, length=3, max_length=None, max_priority=0, tracks_keys=False)
    broker = SimpleNamespace(
        config=config,
        version="fuzz",
        node=SimpleNamespace(
            node_id="fuzz-node",
            queues={"q": queue},
            state=SimpleNamespace(users=_USERS, queues={"q": queue}, exchanges=Exchanges(),
                                  features=Features()),
            submit=lambda event: loop.create_future(),  # never completes
        ),
        delivery=_StandInDelivery(loop),
        allow_from=None,
        amqp_connections=set(),
        amqp_bodies=BodyBudget(config.amqp_body_buffer_total),
        refused=lambda what: None,
        connections=lambda: [],
        logins=LoginGate(1 << 30, 1 << 30),
    )
    return cast(AmqpBroker, broker)


async def _amqp_session(data: bytes) -> None:
    loop = asyncio.get_running_loop()
    conn = AmqpConnection(_amqp_broker(loop))
    transport = _Transport()
    conn.connection_made(cast(asyncio.BaseTransport, transport))
    for chunk in _chunks(data):
        if conn.closed:
            break
        conn.data_received(chunk)
        for _ in range(200):  # a login checks the password off the loop: wait for it
            if conn.stage != "login" or conn.closed:
                break
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)  # deliveries to consumers just added
    await asyncio.sleep(0)  # the writes of the tick
    written = bytes(transport.written)
    if written.startswith(AMQP_HEADER):
        if written != AMQP_HEADER or not transport.closing:
            raise AssertionError(f"a wrong header answered with more than ours: {written!r}")
    else:
        methods = []
        while written:
            try:
                used, _, frame = pamqp_frame.unmarshal(written)
            except Exception as exc:  # noqa: BLE001
                raise AssertionError(f"wrote bytes that are no AMQP frame: {written[:64]!r}") from exc
            written = written[used:]
            if isinstance(frame, pamqp_base.Frame):
                methods.append(frame)
        if transport.closing and conn.stage != "header":
            if not any(isinstance(m, pamqp_commands.Connection.Close | pamqp_commands.Connection.CloseOk)
                       for m in methods):
                raise AssertionError(f"closed without Connection.Close: {[m.name for m in methods]}")
    conn.connection_lost(None)


def one_amqp_session(data: bytes) -> None:
    """Feed ``data`` to a fresh AMQP connection of the broker."""
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
    log = logging.getLogger("baton.amqp")
    handler = _Tracebacks()
    log.addHandler(handler)
    try:
        _LOOP.run_until_complete(_amqp_session(data))
    finally:
        log.removeHandler(handler)


def _amqp_session_seeds() -> list[bytes]:
    from pamqp import commands as amqp
    from pamqp import frame as amqp_frame
    from pamqp import header as amqp_header
    from pamqp.body import ContentBody

    login = (
        amqp_frame.marshal(amqp.Connection.StartOk({"capabilities": {"consumer_cancel_notify": True}},
                                                   "PLAIN", "\0guest\0guest"), 0)
        + amqp_frame.marshal(amqp.Connection.TuneOk(2047, 4096, 0), 0)
        + amqp_frame.marshal(amqp.Connection.Open("/"), 0)
        + amqp_frame.marshal(amqp.Channel.Open(), 1)
    )
    work = [
        amqp_frame.marshal(amqp.Queue.Declare(queue="q", arguments={"x-queue-type": "stream"}), 1),
        amqp_frame.marshal(amqp.Queue.Declare(queue="q", passive=True), 1),
        amqp_frame.marshal(amqp.Confirm.Select(), 1)
        + amqp_frame.marshal(amqp.Basic.Publish(exchange="", routing_key="q", mandatory=True), 1)
        + amqp_frame.marshal(amqp_header.ContentHeader(0, 2, amqp.Basic.Properties(
            headers={"f": 1.5, "n": [1, {"x": None}]})), 1)
        + amqp_frame.marshal(ContentBody(b"hi"), 1),
        amqp_frame.marshal(amqp.Basic.Qos(prefetch_count=5), 1)
        + amqp_frame.marshal(amqp.Basic.Consume(queue="q"), 1),
        amqp_frame.marshal(amqp.Basic.Ack(1), 1),
        amqp_frame.marshal(amqp.Basic.Consume(queue="q", consumer_tag="c1"), 1)
        + amqp_frame.marshal(amqp.Basic.Ack(1), 1)
        + amqp_frame.marshal(amqp.Basic.Nack(2, multiple=True), 1)
        + amqp_frame.marshal(amqp.Basic.Cancel("c1"), 1),
        amqp_frame.marshal(amqp.Basic.Consume(queue="q", no_ack=True), 1)
        + amqp_frame.marshal(amqp.Basic.Reject(2), 1)
        + amqp_frame.marshal(amqp.Basic.Recover(requeue=True), 1),
        amqp_frame.marshal(amqp.Basic.Get(queue="q"), 1)
        + amqp_frame.marshal(amqp.Queue.Purge(queue="q"), 1)
        + amqp_frame.marshal(amqp.Queue.Delete(queue="q", if_empty=True), 1),
        amqp_frame.marshal(amqp.Channel.Flow(active=False), 1)
        + amqp_frame.marshal(amqp.Basic.Consume(queue="q"), 1)
        + amqp_frame.marshal(amqp.Channel.Flow(active=True), 1),
        amqp_frame.marshal(amqp.Tx.Select(), 1),
        amqp_frame.marshal(amqp.Exchange.Declare(exchange="logs", exchange_type="fanout"), 1),
        amqp_frame.marshal(amqp.Channel.Close(200, "bye", 0, 0), 1)
        + amqp_frame.marshal(amqp.Connection.Close(200, "bye", 0, 0), 0),
    ]
    bad_login = amqp_frame.marshal(amqp.Connection.StartOk({}, "PLAIN", "\0guest\0nope"), 0)
    # (Read 48 bytes at a time too: deliveries then come between a consume and its acks.)
    return [size + AMQP_HEADER + login + w for w in work for size in (b"\x00", b"\x30")] + [
        b"\x00" + AMQP_HEADER + bad_login,
        b"\x00" + AMQP_HEADER + login + b"".join(work),
        b"\x00" + b"AMQP\x00\x00\x08\x00",
    ]


def _amqp_seeds() -> list[bytes]:
    from pamqp import commands as amqp
    from pamqp import frame as amqp_frame
    from pamqp import header as amqp_header
    from pamqp.body import ContentBody

    frames = [
        amqp_frame.marshal(amqp.Connection.StartOk({"product": "fuzz"}, "PLAIN", "\0guest\0guest"), 0),
        amqp_frame.marshal(amqp.Connection.TuneOk(2047, 4096, 60), 0),
        amqp_frame.marshal(amqp.Connection.Open("/"), 0),
        amqp_frame.marshal(amqp.Channel.Open(), 1),
        amqp_frame.marshal(amqp.Queue.Declare(queue="q", durable=True,
                                              arguments={"x-delivery-limit": 3, "x-dead-letter-exchange": ""}), 1),
        amqp_frame.marshal(amqp.Basic.Publish(exchange="", routing_key="q"), 1)
        + amqp_frame.marshal(amqp_header.ContentHeader(0, 5, amqp.Basic.Properties(
            correlation_id="c", headers={"h": [1, "x", {"n": None}]})), 1)
        + amqp_frame.marshal(ContentBody(b"hello"), 1),
        amqp_frame.marshal(amqp.Basic.Ack(3, multiple=True), 1),
        amqp_frame.marshal(amqp.Basic.Consume(queue="q", consumer_tag="t"), 1),
        AMQP_HEARTBEAT,
    ]
    return [b"\x00" + AMQP_HEADER + f for f in frames] + [
        b"\x00" + AMQP_HEADER + b"".join(frames),
        b"\x03" + AMQP_HEADER + b"".join(frames),
        b"\x00" + b"AMQP\x00\x00\x08\x00",
    ]


# -- seeds ----------------------------------------------------------------------------------


def _frame_bytes(frames: Sequence[wire.Frame]) -> bytes:
    out = wire.FrameCodec(MAX_FRAME)
    return b"".join(out.send(f) for f in frames)


def _seed_frames() -> list[wire.Frame]:
    return [
        wire.Hello(1, wire.PROTOCOL_VERSION, "fuzz-client"),
        wire.HelloOk(1, wire.PROTOCOL_VERSION, "baton/1", "n1", MAX_FRAME, 1024),
        wire.Ping(2),
        wire.DeclareQueue(3, "q", {"durable": True, "max_length": 10}),
        wire.Publish(4, "q", b"body", {"h": 1}, ""),
        wire.PublishBatch(5, "q", [[b"a", {}], [b"b", {"k": "v"}]]),
        wire.Subscribe(6, "q", 10),
        wire.Ack(7, 1, [0, 1, 2]),
        wire.Error(8, 3, "queue 'x' does not exist"),
        wire.Topology(9),
    ]


def seeds(target: str) -> list[bytes]:
    """The seed corpus of a target: real encoded frames or events, whole and chunked.

    Raises:
        KeyError: unknown target.
    """
    if target == "events":
        origin = Origin("n1", "r1", 7, 1700000000000)
        events: list[Any] = [
            Heartbeat("voter", "127.0.0.1:5671", {"zone": "a"}),
            Propose(2, _MEMBERS, "cluster"),
            Vote(2, True),
            DeclareQueue("q2", max_length=3, overflow="drop-head"),
            Enqueue("q", ((b"x", {}), (b"y", {"h": [1, 2]})), (("key", 2),)),
            Acquire("q", "n1/r1/c1", 3),
            Accept("q", "n1/r1/c1", (0, 1)),
            Release("q", "n1/r1/c1", (1,)),
        ]
        return [codec.encode(origin, e) for e in events]
    if target == "amqp":
        return _amqp_seeds()
    if target == "amqp-session":
        return _amqp_session_seeds()
    if target == "sealed":
        log = _sealed_log()
        return log.seal([b"", b"x", b"record" * 20, b"\x00" * 100]) + [b"\xc1S\x01\x02k1" + b"\x00" * 40]
    frames = _seed_frames()
    if target == "frames":
        one = [b"\x00" + _frame_bytes([f]) for f in frames]
        return one + [b"\x00" + _frame_bytes(frames), b"\x03" + _frame_bytes(frames)]
    if target == "handshake":
        hello = _frame_bytes([frames[0]])
        login = scram.ClientExchange("guest", "guest", nonce="fuzznonce")
        scram_hello = _frame_bytes([wire.Hello(1, wire.PROTOCOL_VERSION, "fuzz", {
            "mechanism": scram.MECHANISM, "message": login.first()})])
        response = _frame_bytes([wire.AuthResponse(1, {"message": b"c=biws,r=fuzznonce,p=AAAA"})])
        member = _frame_bytes([wire.Hello(1, wire.PROTOCOL_VERSION, "fuzz", {"mechanism": "MEMBER"})])
        return [
            b"\x00" + scram_hello,
            b"\x00" + scram_hello + response,
            b"\x02" + member + _frame_bytes(frames[2:5]),
            b"\x00" + hello,
            b"\x01" + hello,
            b"\x00" + _frame_bytes([wire.Hello(1, 99, "old")]),
            b"\x00" + _frame_bytes([frames[2]]),
            b"\x00" + hello + _frame_bytes(frames[2:5]),
            b"\x05" + hello[:-2],
        ]
    raise KeyError(target)


_STATE_MODULES: Final = frozenset(
    f"batonmq.cluster.{m}"
    for m in ("codec", "events", "state", "queues", "membership", "services", "keys", "snapshot")
)
#: The modules whose branches guide each target (instrumented for coverage).
COVERED: Final[dict[str, frozenset[str]]] = {
    "frames": frozenset({"batonmq.clients.wire"}),
    "events": _STATE_MODULES,
    "handshake": frozenset(
        {"batonmq.clients.wire", "batonmq.clients.scram", "batonmq.broker.session",
         "batonmq.broker.connection"}
    ),
    "sealed": frozenset({"batonmq.cluster.log.sealed"}),
    "amqp": frozenset({"batonmq.broker.amqp_codec", "pamqp.frame", "pamqp.decode", "pamqp.header",
                       "pamqp.base", "pamqp.commands"}),
    "amqp-session": frozenset({"batonmq.broker.amqp_connection", "batonmq.broker.amqp_channel",
                               "batonmq.broker.amqp_codec", "batonmq.broker.amqp_queues",
                               "batonmq.broker.amqp_routes", "batonmq.broker.amqp_message"}),
}

TARGETS: dict[str, Callable[[bytes], None]] = {
    "frames": one_frames,
    "events": one_events,
    "handshake": one_handshake,
    "sealed": one_sealed,
    "amqp": one_amqp,
    "amqp-session": one_amqp_session,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Fuzz one target with atheris; returns only when the runs end without a crash
    (libFuzzer exits the process itself on a crash, with status 1)."""
    parser = argparse.ArgumentParser(prog="python -m batonmq.loadtest.fuzz")
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--runs", type=int, default=100_000, help="inputs to try")
    parser.add_argument("--corpus", help="directory of inputs to start from and keep (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed")
    parser.add_argument("--max-len", type=int, default=4096, help="longest input tried, bytes")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    try:
        import atheris
    except ImportError:
        print("baton: fuzzing needs atheris: pip install 'batonmq[fuzz]'", file=sys.stderr)
        return 2
    corpus = args.corpus or tempfile.mkdtemp(prefix=f"baton-fuzz-{args.target}-")
    os.makedirs(corpus, exist_ok=True)
    for i, seed in enumerate(seeds(args.target)):
        with open(os.path.join(corpus, f"seed-{i}"), "wb") as f:
            f.write(seed)
    target = TARGETS[args.target]
    for data in seeds(args.target):
        target(data)  # the seeds themselves must pass (and warm up the template state)
    # Coverage of the modules the target exercises, not of every library loaded:
    # atheris.instrument_all() takes a minute here, these a second or two.
    count = 0
    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType) and str(obj.__module__) in COVERED[args.target]:
            atheris.instrument_func(obj)
            count += 1
    print(f"fuzz: instrumented {count} functions of {len(COVERED[args.target])} modules", file=sys.stderr)
    atheris.Setup(
        [sys.argv[0], f"-runs={args.runs}", f"-seed={args.seed}", f"-max_len={args.max_len}", corpus],
        target,
    )
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
