"""A bad or hostile client harms no one else: invalid commands are refused before they
reach the log, deep headers get an Error frame, and a client that never reads its
replies cannot grow the broker without bound (docs/security.md)."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from batonmq import clients
from batonmq.clients import wire
from batonmq.cluster.errors import InvalidArgument
from tests.helpers import eventually_sync, login_frames, rss_mib
from tests.integration.conftest import BrokerProcess


class RawClient:
    """A client on a plain socket: frames are built by hand, so it can send what the
    client library refuses to (and never read, when a test wants that)."""

    def __init__(self, address: str, hello: bool = True, source: str | None = None) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection(
            (host, int(port)), timeout=10, source_address=(source, 0) if source else None
        )
        self.codec = wire.FrameCodec(64 * 1024 * 1024)
        self.corr = 0
        if hello:
            first, respond, check = login_frames(corr=self.next_corr())
            self.send(first)
            self.send(respond(self.read()))
            check(self.read())

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def send(self, frame: wire.Frame) -> None:
        self.sock.sendall(self.codec.send(frame))

    def send_payload(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">I", len(payload)) + payload)

    def read(self) -> wire.Frame:
        while True:
            frame = self.codec.next_frame()
            if isinstance(frame, wire.Frame):
                return frame
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self.codec.receive_data(data)

    def ping(self) -> wire.Frame:
        corr = self.next_corr()
        self.send(wire.Ping(corr))
        return self.read()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[RawClient]:
    c = RawClient(broker.address)
    try:
        yield c
    finally:
        c.close()


def _log_holds(broker: BrokerProcess, marker: bytes) -> bool:
    """Whether any file of the broker's log holds ``marker``."""
    for root, _, files in os.walk(broker.data_dir / "log"):
        for name in files:
            if marker in (Path(root) / name).read_bytes():
                return True
    return False


def test_overlong_names_and_keys_are_refused_before_the_log(
    broker: BrokerProcess, raw: RawClient
) -> None:
    raw.send(wire.DeclareQueue(raw.next_corr(), "q", {}))
    assert isinstance(raw.read(), wire.Ok)
    cases = {
        "queue name": lambda m: wire.DeclareQueue(raw.next_corr(), m, {}),
        "dead-letter name": lambda m: wire.DeclareQueue(raw.next_corr(), "q2", {"dead_letter": m}),
        "publish queue": lambda m: wire.Publish(raw.next_corr(), m, b"x", {}, ""),
        "batch queue": lambda m: wire.PublishBatch(raw.next_corr(), m, [[b"x", {}]], ""),
        "publish key": lambda m: wire.Publish(raw.next_corr(), "q", b"x", {}, m),
        "batch key": lambda m: wire.PublishBatch(raw.next_corr(), "q", [[b"x", {}]], m),
    }
    for what, make in cases.items():
        marker = f"{what.replace(' ', '-')}-{'Z' * 1000}"
        raw.send(make(marker))
        answer = raw.read()
        assert isinstance(answer, wire.Error), (what, answer)
        assert answer.code == InvalidArgument.code, (what, answer)
        assert "bytes" in answer.message, (what, answer.message)
        assert not _log_holds(broker, marker.encode()), f"the {what} reached the log"
    assert isinstance(raw.ping(), wire.Ok)


def _nested(depth: int) -> bytes:
    """msgpack of a map nested ``depth`` deep (built by hand: msgpack's packer stops
    at 512 levels)."""
    return b"\x81\xa1a" * depth + b"\x80"


@pytest.mark.parametrize("depth", [100, 600])
def test_deeply_nested_headers_get_an_error_frame(
    broker: BrokerProcess, raw: RawClient, depth: int
) -> None:
    raw.send(wire.DeclareQueue(raw.next_corr(), "q", {}))
    assert isinstance(raw.read(), wire.Ok)
    corr = raw.next_corr()
    head = msgpack.packb(wire.Publish.OP) + msgpack.packb(corr) + msgpack.packb("q")
    payload = b"\x96" + head + msgpack.packb(b"body") + _nested(depth) + msgpack.packb("")
    raw.send_payload(payload)
    answer = raw.read()
    assert isinstance(answer, wire.Error) and answer.corr == corr, answer
    assert answer.code == InvalidArgument.code and "nest" in answer.message, answer
    assert isinstance(raw.ping(), wire.Ok)  # the connection is still served
    assert "Traceback" not in broker.output()
    with clients.sync.connect(broker.address) as conn:
        assert conn.queue_stats("q")["ready"] == 0


def test_a_client_that_never_reads_cannot_grow_the_broker(broker: BrokerProcess) -> None:
    """Commands answered at once (Topology, ListQueues), pipelined without reading a
    reply: the broker stops reading that connection, its memory stays bounded, and
    other clients are served meanwhile."""
    assert broker.proc is not None
    pid = broker.proc.pid
    with clients.sync.connect(broker.address) as conn:
        for i in range(50):
            conn.declare_queue(f"queue-{i:03d}-" + "n" * 200)  # a large ListQueues answer
    before = rss_mib(pid)
    hog = RawClient(broker.address)
    try:
        hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        frames = b"".join(
            hog.codec.send(
                wire.ListQueues(hog.next_corr()) if i % 2 else wire.Topology(hog.next_corr())
            )
            for i in range(2000)
        )
        hog.sock.settimeout(2.0)
        sent = 0
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and sent < 400:
                hog.sock.sendall(frames)  # blocks for good once the broker stops reading
                sent += 1
        except (TimeoutError, OSError):
            pass  # the broker stopped reading (or closed the hog): what the test wants
        grown = rss_mib(pid) - before
        assert grown < 40, f"the broker grew by {grown:.0f} MiB for a client that never reads"
        # Another client is served while the hog is stuck.
        with clients.sync.connect(broker.address, timeout=10) as other:
            assert other.ping() >= 0
            assert len(other.list_queues()) == 50
    finally:
        hog.close()


def test_a_connection_over_max_output_for_long_is_closed(tmp_path: Path) -> None:
    """One answer larger than max_output, never read: the connection is closed once
    output_grace has passed, with the reason logged."""
    b = BrokerProcess(tmp_path / "b", extra=["--max-output", "4096", "--output-grace", "0.5"])
    b.start()
    try:
        with clients.sync.connect(b.address) as conn:
            for i in range(50):
                conn.declare_queue(f"queue-{i:03d}-" + "n" * 240)  # ListQueues: ~15 KiB
        hog = RawClient(b.address)
        try:
            hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            # Enough answers (30 MiB) to fill the sockets' buffers on both sides.
            hog.sock.sendall(
                b"".join(hog.codec.send(wire.ListQueues(hog.next_corr())) for _ in range(2000))
            )
            eventually_sync(
                lambda: "still unread" in b.output(), "the broker closes the hog", timeout=20,
                context=b.output,
            )
        finally:
            hog.close()
        with clients.sync.connect(b.address) as other:
            assert other.ping() >= 0
        assert "Traceback" not in b.output()
    finally:
        b.stop()


def test_connection_and_consumer_limits(tmp_path: Path) -> None:
    b = BrokerProcess(
        tmp_path / "b",
        extra=["--max-connections", "3", "--max-consumers", "2",
               "--max-connection-prefetch", "150"],
    )
    b.start()
    try:
        with clients.sync.connect(b.address) as conn:
            conn.declare_queue("q")
            one = conn.consume("q", prefetch=100).__enter__()
            two = conn.consume("q", prefetch=40).__enter__()
            with pytest.raises(clients.LimitExceeded, match="max_consumers"):
                conn.consume("q", prefetch=1).__enter__()
            two.cancel()
            with pytest.raises(clients.LimitExceeded, match="max_connection_prefetch"):
                conn.consume("q", prefetch=60).__enter__()
            with conn.consume("q", prefetch=50):
                pass
            one.cancel()
            others = [clients.sync.connect(b.address) for _ in range(2)]  # 3 in all
            try:
                with pytest.raises(clients.ConnectionClosed, match="max_connections"):
                    clients.sync.connect(b.address, timeout=5)
            finally:
                for o in others:
                    o.close()
            # A slot is free again once a connection closed.
            eventually_sync(
                lambda: _connects(b.address), "a connection is accepted again", timeout=10
            )
        assert "Traceback" not in b.output()
    finally:
        b.stop()


def _connects(address: str) -> bool:
    try:
        with clients.sync.connect(address, timeout=5) as c:
            c.ping()
        return True
    except clients.ConnectionClosed:
        return False


def test_a_connection_without_hello_is_closed(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b", extra=["--hello-timeout", "0.5"])
    b.start()
    try:
        silent = RawClient(b.address, hello=False)
        try:
            silent.sock.settimeout(10)
            answer = silent.read()  # the Error corr 0, then the close
            assert isinstance(answer, wire.Error) and answer.corr == 0
            assert "Hello" in answer.message
            with pytest.raises(ConnectionError):
                silent.read()
        finally:
            silent.close()
        # A client that says Hello in time stays, idle or not.
        with clients.sync.connect(b.address) as conn:
            time.sleep(1.0)  # longer than the hello timeout, on purpose
            assert conn.ping() >= 0
    finally:
        b.stop()


def test_idle_timeout_closes_silent_connections_but_not_pinging_clients(
    tmp_path: Path,
) -> None:
    b = BrokerProcess(tmp_path / "b", extra=["--idle-timeout", "1"])
    b.start()
    try:
        silent = RawClient(b.address)
        try:
            silent.sock.settimeout(10)
            answer = silent.read()
            assert isinstance(answer, wire.Error) and "idle" in answer.message, answer
        finally:
            silent.close()
        with clients.sync.connect(b.address, keepalive=0.3) as conn:
            conn.declare_queue("q")
            with conn.consume("q", prefetch=1) as consumer:
                time.sleep(2.5)  # idle for longer than the idle timeout, on purpose
                conn.publish("q", b"x")
                m = consumer.next(timeout=5)
                assert m.body == b"x"
            assert conn.connection.failovers == 0
    finally:
        b.stop()


def test_a_large_frame_before_hello_is_refused(broker: BrokerProcess) -> None:
    """Before Hello the broker buffers little: a connection may not make it hold a
    max_frame-sized frame without saying who it is."""
    raw = RawClient(broker.address, hello=False)
    try:
        raw.sock.sendall(struct.pack(">I", 16 * 1024 * 1024) + b"\x00" * (70 * 1024))
        answer = raw.read()
        assert isinstance(answer, wire.Error) and answer.corr == 0
        assert "before Hello" in answer.message, answer
    finally:
        raw.close()
    assert "Traceback" not in broker.output()
