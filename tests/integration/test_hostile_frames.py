"""Hostile frames against a live cluster: a decode bomb on the native port and
half-sent AMQP bodies on many channels (docs/security.md "Bad input harms no one
else", docs/amqp.md "Limits"). Through each, the attacked broker stays in the view,
its memory stays within 150 MiB of where it was, and a healthy client publishing and
consuming on it sees no error."""

from __future__ import annotations

import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from batonmq import clients
from batonmq.broker.config import amqp_ready_address
from batonmq.clients import wire
from tests.helpers import eventually_sync, login_frames, read_frame, rss_mib
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration

#: How far the attacked broker's RSS may rise above its level before the attack.
RSS_BUDGET_MIB = 150


@dataclass
class Watch:
    """What a healthy client and a sampler saw while an attack ran."""

    rss_before: float = 0.0
    rss_max: float = 0.0
    rss_after: float = 0.0
    rounds: int = 0  # healthy publish -> consume -> ack round trips
    max_round: float = 0.0  # the slowest of them, seconds
    errors: list[str] = field(default_factory=list)
    view_before: int = 0
    view_after: int = 0

    def figures(self) -> str:
        return (
            f"RSS {self.rss_before:.0f} MiB before, {self.rss_max:.0f} MiB at most,"
            f" {self.rss_after:.0f} MiB after; {self.rounds} healthy rounds, slowest"
            f" {self.max_round * 1000:.0f} ms; view {self.view_before} -> {self.view_after}"
        )


def _metric(b: BrokerProcess, name: str) -> float:
    """One unlabelled sample of metric family ``name`` from the broker's /metrics."""
    from tests.integration.test_admin import TOOL_HEADERS, admin_of, metric_samples

    request = urllib.request.Request(f"{admin_of(b)}/metrics", headers=TOOL_HEADERS)
    with urllib.request.urlopen(request, timeout=10) as r:
        return metric_samples(r.read().decode(), name)[""]


def _body_waits(b: BrokerProcess) -> float:
    return _metric(b, "baton_amqp_body_waits")


def _view(address: str) -> tuple[int, list[str]]:
    with clients.sync.connect(address, timeout=10, failover=False) as c:
        top = c.topology()
        return top["view"], [i["node_id"] for i in top["instances"]]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Two brokers on a shared file log; node-1 also serves AMQP."""
    log_url = f"file:{tmp_path / 'shared-log'}"
    brokers = [
        BrokerProcess(tmp_path / "node-1", log_url=log_url, node_id="node-1",
                      extra=["--amqp-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]),
        BrokerProcess(tmp_path / "node-2", log_url=log_url, node_id="node-2"),
    ]
    try:
        for b in brokers:
            b.start()
        eventually_sync(
            lambda: _view(brokers[1].address)[1], "both brokers in the view", timeout=20,
            until=lambda ids: ids == ["node-1", "node-2"],
        )
        yield brokers
    finally:
        for b in brokers:
            b.stop()


def _under_attack(pair: list[BrokerProcess], attack: Callable[[BrokerProcess], None]) -> Watch:
    """Run ``attack`` on node-1 while a healthy client publishes to and consumes from
    node-1 and a sampler reads node-1's RSS; return what they saw."""
    target, other = pair
    assert target.proc is not None
    pid = target.proc.pid
    watch = Watch()
    with clients.sync.connect(target.address, failover=False) as admin:
        admin.declare_queue("steady")
        admin.put_user("nobody", "nobody-password")  # no rights at all
    watch.view_before = _view(other.address)[0]
    stop = threading.Event()
    ready = threading.Event()

    def healthy() -> None:
        try:
            with clients.sync.connect(target.address, failover=False) as conn, \
                    conn.consume("steady", prefetch=10) as consumer:
                ready.set()
                deadline = time.monotonic() + 600  # bounded whatever happens
                while not stop.is_set() and time.monotonic() < deadline:
                    started = time.monotonic()
                    conn.publish("steady", b"round-%d" % watch.rounds)
                    msg = consumer.next(timeout=10)
                    msg.ack(confirm=True)
                    watch.max_round = max(watch.max_round, time.monotonic() - started)
                    watch.rounds += 1
                    stop.wait(0.01)  # a steady trickle, not a flood
        except Exception as exc:  # noqa: BLE001 - the test reports whatever it was
            watch.errors.append(repr(exc))
        finally:
            ready.set()

    def sample() -> None:
        while not stop.is_set():
            watch.rss_max = max(watch.rss_max, rss_mib(pid))
            stop.wait(0.02)

    # Settle the broker first: its level before is the one a busy client keeps.
    client = threading.Thread(target=healthy, name="healthy-client")
    client.start()
    ready.wait(20)
    eventually_sync(lambda: watch.rounds, "the healthy client runs", until=lambda n: n >= 20,
                    timeout=20, context=lambda: repr(watch.errors))
    watch.rss_before = watch.rss_max = rss_mib(pid)
    sampler = threading.Thread(target=sample, name="rss-sampler")
    sampler.start()
    try:
        attack(target)
        rounds = watch.rounds
        eventually_sync(lambda: watch.rounds, "the healthy client goes on after the attack",
                        until=lambda n: n >= rounds + 20, timeout=30,
                        context=lambda: watch.figures() + repr(watch.errors))
    finally:
        stop.set()
        client.join(30)
        sampler.join(5)
    watch.rss_after = rss_mib(pid)
    view, ids = _view(other.address)
    watch.view_after = view
    print(watch.figures())
    assert ids == ["node-1", "node-2"], f"node-1 left the view: {ids}; {watch.figures()}"
    return watch


def _check(watch: Watch, target: BrokerProcess) -> None:
    assert not watch.errors, f"the healthy client failed: {watch.errors}; {watch.figures()}"
    assert watch.view_after == watch.view_before, (
        f"node-1 was dropped from the view and rejoined; {watch.figures()}"
    )
    grown = watch.rss_max - watch.rss_before
    assert grown < RSS_BUDGET_MIB, (
        f"the broker's RSS grew by {grown:.0f} MiB (budget {RSS_BUDGET_MIB}); {watch.figures()}"
    )
    assert "Traceback" not in target.output()


# --- the native protocol: a decode bomb ------------------------------------------------


def _bomb(n: int) -> bytes:
    """A PublishBatch of ``n`` empty arrays: ``[21, 7, "app.a", [[], [], ...]]``."""
    payload = b"\x94\x15\x07\xa5app.a\xdd" + struct.pack(">I", n) + b"\x90" * n
    return struct.pack(">I", len(payload)) + payload


def _login(address: str, user: str, password: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    codec = wire.FrameCodec(64 * 1024 * 1024)

    def read() -> wire.Frame:
        return read_frame(sock, codec)

    hello, respond, check = login_frames(user, password)
    sock.sendall(codec.send(hello))
    sock.sendall(codec.send(respond(read())))
    check(read())
    return sock


def _send_and_drain(sock: socket.socket, data: bytes) -> bytes:
    """Send ``data`` and read what comes back until the broker closes (or 60 s)."""
    got = b""
    try:
        sock.sendall(data)
        sock.settimeout(60)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    finally:
        sock.close()
    return got


def test_a_decode_bomb_from_a_user_without_rights_harms_no_one(
    pair: list[BrokerProcess],
) -> None:
    answers: list[bytes] = []

    def attack(target: BrokerProcess) -> None:
        # 30 million empty arrays in a 30 MiB frame, then a 4 MiB one.
        for n in (30_000_000, 4_000_000):
            answers.append(_send_and_drain(_login(target.address, "nobody", "nobody-password"),
                                           _bomb(n)))

    watch = _under_attack(pair, attack)
    _check(watch, pair[0])
    for got in answers:
        codec = wire.FrameCodec()
        codec.receive_data(got)
        err = codec.next_frame()
        assert isinstance(err, wire.Error) and err.corr == 0, err
        assert "PublishBatch" in err.message and "max_array_len" in err.message, err
    assert "PublishBatch frame is above the decoding limits" in pair[0].output()


# --- AMQP: half-sent bodies on many channels -------------------------------------------

_AMQP_BODY = 8 * 1024 * 1024  # what each attacking publish announces (max_message)


class RawAmqp:
    """An AMQP 0-9-1 client on a plain socket, frames written with pamqp, so that it
    can start publishes and never finish them."""

    def __init__(self, address: str, user: str, password: str) -> None:
        from pamqp import commands

        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.buf = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        assert isinstance(self.read()[1], commands.Connection.Start)
        self.send(0, commands.Connection.StartOk(mechanism="PLAIN",
                                                  response=f"\0{user}\0{password}"))
        tune = self.read()[1]
        assert isinstance(tune, commands.Connection.Tune), tune
        self.frame_max = tune.frame_max
        self.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        self.send(0, commands.Connection.Open("/"))
        assert isinstance(self.read()[1], commands.Connection.OpenOk)

    def send(self, channel: int, frame: object) -> None:
        from pamqp import frame as pframe

        self.sock.sendall(pframe.marshal(frame, channel))  # type: ignore[arg-type]

    def read(self) -> tuple[int, object]:
        from pamqp import frame as pframe

        while True:
            if len(self.buf) >= 7:
                size = struct.unpack(">I", self.buf[3:7])[0]
                if len(self.buf) >= 8 + size:
                    used, channel, frame = pframe.unmarshal(self.buf[: 8 + size])
                    self.buf = self.buf[used:]
                    return channel, frame
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self.buf += data

    def open_channel(self, number: int) -> None:
        from pamqp import commands

        self.send(number, commands.Channel.Open())

    def start_publish(self, channel: int, queue: str, body: int) -> None:
        """Basic.Publish to ``queue``, a content header announcing ``_AMQP_BODY`` bytes,
        and ``body`` bytes of it (never all of them)."""
        from pamqp import body as pbody, commands, header

        self.send(channel, commands.Basic.Publish(exchange="", routing_key=queue))
        self.send(channel, header.ContentHeader(0, _AMQP_BODY, commands.Basic.Properties()))
        step = self.frame_max - 8
        chunk = b"x" * step
        sent = 0
        while sent < body:
            part = chunk[: min(step, body - sent)]
            self.send(channel, pbody.ContentBody(part))
            sent += len(part)

    def close(self) -> None:
        self.sock.close()


def _amqp_address(target: BrokerProcess) -> str:
    lines = target.log_path.read_text(errors="replace").splitlines()
    found = next(filter(None, map(amqp_ready_address, lines)), None)
    assert found is not None, target.output()
    return found


def test_half_sent_amqp_bodies_harm_no_one(pair: list[BrokerProcess]) -> None:
    from pamqp import commands

    closes: dict[str, object] = {}

    def attack(target: BrokerProcess) -> None:
        address = _amqp_address(target)
        with clients.sync.connect(target.address, failover=False) as admin:
            admin.declare_queue("target")
        # A user without rights: each publish is refused at its content header (403),
        # and what comes of its body is dropped.
        nobody = RawAmqp(address, "nobody", "nobody-password")
        try:
            refused = 0
            for n in range(1, 251):
                nobody.open_channel(n)
                assert isinstance(nobody.read()[1], commands.Channel.OpenOk)
                nobody.start_publish(n, "target", nobody.frame_max * 2)
                channel, frame = nobody.read()
                if isinstance(frame, commands.Channel.Close) and frame.reply_code == 403:
                    refused += 1
                    nobody.send(channel, commands.Channel.CloseOk())
            closes["nobody refused"] = refused
        finally:
            nobody.close()
        # A user with the right, 250 channels each with 8 MiB - 1 of an 8 MiB body:
        # the connection is closed once it has more under way than amqp_body_buffer.
        hog = RawAmqp(address, "guest", "guest")
        try:
            hog.sock.settimeout(10)
            for n in range(1, 251):
                hog.open_channel(n)
                hog.start_publish(n, "target", _AMQP_BODY - 1)
        except OSError as exc:
            closes["hog send"] = repr(exc)
        try:
            while True:
                channel, frame = hog.read()
                if isinstance(frame, commands.Connection.Close):
                    closes["hog"] = frame
                    break
        except (OSError, ConnectionError) as exc:
            closes["hog read"] = repr(exc)
        finally:
            hog.close()
        # Several connections, each within its own budget, together above the broker's:
        # the bodies past it wait (their connections are not read). Whether a client's
        # send blocks depends on how much the kernel's socket buffers take in (up to
        # tens of MiB on loopback), so the wait is read from the broker's own counter.
        waits_before = _body_waits(target)
        many = [RawAmqp(address, "guest", "guest") for _ in range(6)]
        stalled = []

        def fill(conn: RawAmqp) -> None:
            conn.sock.settimeout(5)
            try:
                for n in (1, 2):
                    conn.open_channel(n)
                    conn.start_publish(n, "target", _AMQP_BODY - 1)
            except OSError:
                stalled.append(conn)  # the broker stopped reading it

        threads = [threading.Thread(target=fill, args=(c,)) for c in many]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        closes["stalled"] = len(stalled)
        # 12 bodies of 8 MiB announced against 64 MiB: some must wait. Read before the
        # connections close (a close would end their waits unseen).
        closes["waits"] = eventually_sync(
            lambda: (_body_waits(target) - waits_before) or None, timeout=30,
            what="a body waiting for the broker's body budget",
        )
        closes["held"] = _metric(target, "baton_amqp_body_bytes")
        for c in many:
            c.close()

    watch = _under_attack(pair, attack)
    print(closes)
    _check(watch, pair[0])
    assert closes.get("nobody refused") == 250, closes
    hog_close = closes.get("hog")
    assert isinstance(hog_close, commands.Connection.Close), closes
    assert hog_close.reply_code == 506 and "amqp_body_buffer" in hog_close.reply_text, closes
    assert "amqp_body_buffer" in pair[0].output()
    assert closes["waits"] >= 1, closes
    assert closes["held"] <= 64 * 1024 * 1024, f"more held than amqp_body_buffer_total: {closes}"
    # Once the attackers are gone, AMQP publishes go through again.
    import pika

    host, _, port = _amqp_address(pair[0]).rpartition(":")
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, int(port)))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "target", b"y" * (4 * 1024 * 1024))
    finally:
        conn.close()
