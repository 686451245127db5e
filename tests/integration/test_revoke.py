"""A revoked right or a deleted user, against real brokers (docs/security.md, "Revoking
rights"): on a 2-broker cluster, a consumer of user U on broker 2 while an admin
revokes U's read right, or deletes U, through broker 1. Every broker ends what U may no
longer have when it applies the change from the log: the consumer is cancelled (native
ConsumerCancelled; AMQP Basic.Cancel), what it held goes back to the queue, messages
published later reach only others, and a deleted user's connections close."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pika
import pika.exceptions
import pytest

from batonmq import clients
from batonmq.clients import wire
from batonmq.cluster.errors import AccessRefused
from tests.helpers import eventually, eventually_sync, login_frames, read_frame
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import AMQP, amqp_port

pytestmark = pytest.mark.integration

T = TypeVar("T")


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """Two brokers on one shared file: log, each with an AMQP listener. ``guest`` (an
    admin, from loopback) is the admin."""
    url = f"file:{tmp_path / 'shared-log'}"
    brokers = [
        BrokerProcess(tmp_path / f"node-{i}", log_url=url, node_id=f"node-{i}", extra=AMQP)
        for i in (1, 2)
    ]
    try:
        for b in brokers:
            b.start()
        yield brokers[0], brokers[1]
    finally:
        for b in brokers:
            b.stop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def _admin_do(b: BrokerProcess, what: str, *args: Any, **kw: Any) -> Any:
    async with await clients.connect(b.address) as admin:
        return await getattr(admin, what)(*args, **kw)


async def _set_up(b: BrokerProcess, queue: str, user: str) -> None:
    async with await clients.connect(b.address) as admin:
        await admin.declare_queue(queue)
        await admin.put_user(user, f"{user}-pw")
        await admin.set_permissions(user, read=queue)


async def _publish(b: BrokerProcess, queue: str, bodies: list[bytes]) -> None:
    async with await clients.connect(b.address) as admin:
        for body in bodies:
            await admin.publish(queue, body)


async def _drain(b: BrokerProcess, queue: str, n: int) -> set[bytes]:
    """What another consumer (guest, on ``b``) gets of ``queue``: ``n`` messages."""
    got: set[bytes] = set()
    async with await clients.connect(b.address) as admin:
        async with admin.consume(queue, prefetch=50) as consumer:
            while len(got) < n:
                m = await consumer.get(timeout=15)
                assert m is not None, f"only {sorted(got)} of {n} messages reached another consumer"
                got.add(bytes(m.body))
                await m.ack()
    return got


async def _logged_in(b: BrokerProcess, user: str) -> clients.Connection:
    async def attempt() -> clients.Connection | None:
        try:
            return await clients.connect(b.address, username=user, password=f"{user}-pw")
        except AccessRefused:
            return None

    return await eventually(attempt, f"{user} can log in at {b.address}", timeout=20)


async def test_a_revoked_read_right_cancels_the_consumer_on_every_broker(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    one, two = pair
    await _set_up(one, "jobs", "ursula")
    ursula = await _logged_in(two, "ursula")
    try:
        async with ursula.consume("jobs", prefetch=10) as consumer:
            await _publish(one, "jobs", [b"before-1", b"before-2", b"before-3"])
            held = [await consumer.get(timeout=10) for _ in range(3)]
            assert all(m is not None for m in held)  # held, not acked, at the revoke
            await _admin_do(one, "set_permissions", "ursula", read="")
            with pytest.raises(AccessRefused, match="read right was revoked"):
                await consumer.get(timeout=10)
            await _publish(one, "jobs", [b"after-1", b"after-2", b"after-3"])
            # What it held went back; what came later stayed for others.
            got = await _drain(one, "jobs", 6)
            assert got == {b"before-1", b"before-2", b"before-3", b"after-1", b"after-2",
                           b"after-3"}
            assert consumer.buffered == 0
        # Its connection is still open (only the consumer ended).
        assert not ursula.closed
    finally:
        await ursula.close()
    assert "Traceback" not in two.output()


def test_a_deleted_users_consumer_ends_and_its_connection_closes(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    one, two = pair
    run(_set_up(one, "jobs", "dora"))
    host, _, port = two.address.rpartition(":")

    def login() -> tuple[socket.socket, wire.FrameCodec] | None:
        sock, codec = socket.create_connection((host, int(port)), timeout=10), wire.FrameCodec()
        hello, respond, check = login_frames("dora", "dora-pw")
        sock.sendall(codec.send(hello))
        sock.sendall(codec.send(respond(read_frame(sock, codec))))
        ok = read_frame(sock, codec)
        if isinstance(ok, wire.Error):
            sock.close()
            return None
        check(ok)
        return sock, codec

    sock, codec = eventually_sync(login, "dora can log in at broker 2", timeout=20)
    with sock:
        sock.sendall(codec.send(wire.Subscribe(2, "jobs", 10)))
        assert isinstance(read_frame(sock, codec), wire.Ok)
        run(_publish(one, "jobs", [b"before-1", b"before-2"]))
        delivered = 0
        while delivered < 2:
            f = read_frame(sock, codec)
            assert isinstance(f, wire.Deliver), f
            delivered += len(f.messages)
        run(_admin_do(one, "delete_user", "dora"))
        f = read_frame(sock, codec)  # (before the fix: a timeout, the session went on)
        assert isinstance(f, wire.Error) and f.corr == 0 and f.code == AccessRefused.code, f
        assert "deleted" in f.message
        with pytest.raises(ConnectionError):
            read_frame(sock, codec)
    run(_publish(one, "jobs", [b"after-1", b"after-2"]))
    assert run(_drain(one, "jobs", 4)) == {b"before-1", b"before-2", b"after-1", b"after-2"}


def _pika(b: BrokerProcess, user: str) -> pika.BlockingConnection:
    def attempt() -> pika.BlockingConnection | None:
        try:
            return pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", amqp_port(b), credentials=pika.PlainCredentials(user, f"{user}-pw"),
                connection_attempts=1,
            ))
        except pika.exceptions.ProbableAuthenticationError:
            return None

    return eventually_sync(attempt, f"{user} can log in over AMQP at {b.address}", timeout=20)


def test_over_amqp_a_revoke_sends_basic_cancel_and_a_delete_closes_the_connection(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    one, two = pair
    run(_set_up(one, "ajobs", "amos"))
    conn = _pika(two, "amos")
    ch = conn.channel()
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(cancelled.append)
    received: list[bytes] = []
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume("ajobs", lambda _c, _m, _p, body: received.append(body))
    run(_publish(one, "ajobs", [b"before-1", b"before-2", b"before-3"]))
    deadline = time.monotonic() + 10
    while len(received) < 3 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert len(received) == 3  # held, not acked, at the revoke
    run(_admin_do(one, "set_permissions", "amos", read=""))
    deadline = time.monotonic() + 10
    while not cancelled and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert cancelled, "no Basic.Cancel from the broker after the revoke"
    run(_publish(one, "ajobs", [b"after-1", b"after-2", b"after-3"]))
    got = run(_drain(one, "ajobs", 6))
    assert got == {b"before-1", b"before-2", b"before-3", b"after-1", b"after-2", b"after-3"}
    conn.process_data_events(time_limit=0.2)
    assert len(received) == 3
    # A delete closes the connection: Connection.Close 320 CONNECTION_FORCED.
    run(_admin_do(one, "delete_user", "amos"))
    deadline = time.monotonic() + 10
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
    assert closed.value.reply_code == 320 and "deleted" in closed.value.reply_text
    assert "Traceback" not in two.output()


async def test_a_revoked_lead_right_resigns_the_users_candidacy(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    one, two = pair
    async with await clients.connect(one.address) as admin:
        await admin.put_user("leo", "leo-pw")
        await admin.set_permissions("leo", lead="svc")
        leo = await _logged_in(two, "leo")
        try:
            async with leo.lead("svc", timeout=10) as term:
                assert term.leading
                await admin.set_permissions("leo", lead="")
                # The broker resigned its candidacy: the term is lost, nobody leads.
                async with asyncio.timeout(10):
                    await term.lost.wait()

                async def leader() -> str | None:
                    infos = {i.service: i for i in await admin.services()}
                    return infos["svc"].leader if "svc" in infos else None

                await eventually(leader, "svc has no leader", until=lambda x: x is None)
        finally:
            await leo.close()
