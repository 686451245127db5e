"""An AMQP connection whose login is being checked reads nothing more from its socket,
and is closed if what it sent before passes MAX_BEFORE_LOGIN (broker/amqp_connection.py,
docs/security.md): a client that streams data while its password is checked cannot make
the broker buffer it. The password check is held in an executor that never runs it."""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import SimpleNamespace
from typing import Any, Callable

from pamqp import commands, frame as pamqp_frame

from batonmq.broker.admission import LoginGate
from batonmq.broker.amqp_codec import PROTOCOL_HEADER
from batonmq.broker.amqp_connection import MAX_BEFORE_LOGIN, AmqpConnection
from batonmq.broker.config import BrokerConfig
from batonmq.cluster.features import Features
from batonmq.cluster.users import Users


class HeldExecutor(concurrent.futures.ThreadPoolExecutor):
    """Takes the password checks and never runs them (a login still being decided)."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.jobs: list[concurrent.futures.Future[Any]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.jobs.append(fut)
        return fut


class FakeTransport:
    def __init__(self) -> None:
        self.reading = True
        self.aborted = False
        self.closed = False
        self.written = bytearray()

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else None

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


def fake_broker() -> Any:
    cfg = BrokerConfig(data_dir="unused")
    return SimpleNamespace(
        config=cfg, version="test", node=SimpleNamespace(state=SimpleNamespace(users=Users(), features=Features())),
        delivery=None, allow_from=None, amqp_connections=set(),
        refused=lambda what: None, logins=LoginGate(10, 10),
    )


def start_ok() -> bytes:
    return pamqp_frame.marshal(
        commands.Connection.StartOk({}, "PLAIN", "\0guest\0guest", "en_US"), 0
    )


def heartbeats(size: int) -> bytes:
    return b"\x08\x00\x00\x00\x00\x00\x00\xce" * (size // 8)


def test_reading_stops_during_the_login_and_too_much_data_closes() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        held = HeldExecutor()
        loop.set_default_executor(held)
        broker = fake_broker()
        conn = AmqpConnection(broker)
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        assert broker.logins.count == 1
        conn.data_received(PROTOCOL_HEADER)
        conn.data_received(start_ok() + heartbeats(4096))
        assert conn.stage == "login" and held.jobs
        assert not transport.reading  # nothing more is read until the login is decided
        # What was in flight when reading stopped is bounded: past it, closed.
        for _ in range(MAX_BEFORE_LOGIN // 65536 + 2):
            conn.data_received(heartbeats(65536))
            if transport.aborted:
                break
        assert transport.aborted
        conn.connection_lost(None)
        assert broker.logins.count == 0  # it no longer counts as logging in

    asyncio.run(asyncio.wait_for(run(), 10))
