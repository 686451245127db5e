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
from tests.helpers import eventually_sync
from tests.integration.conftest import BrokerProcess


class RawClient:
    """A client on a plain socket: frames are built by hand, so it can send what the
    client library refuses to (and never read, when a test wants that)."""

    def __init__(self, address: str, hello: bool = True) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.codec = wire.FrameCodec(64 * 1024 * 1024)
        self.corr = 0
        if hello:
            self.send(wire.Hello(self.next_corr(), wire.PROTOCOL_VERSION, "raw"))
            assert isinstance(self.read(), wire.HelloOk)

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
