"""Connections that have not logged in cannot crowd out those that have
(docs/security.md "Bad input harms no one else"): a joining broker's MEMBER session must
prove itself within the hello timeout, and connections still logging in have their own
limit, in all and per source address. Real brokers, raw sockets; the source addresses
are loopback ones (127.0.0.2, ...), each its own host to the broker."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from batonmq import clients
from batonmq.clients import wire
from batonmq.cluster.errors import LimitExceeded
from tests.helpers import eventually_sync, login_frames
from tests.integration.conftest import BrokerProcess
from tests.integration.test_bad_clients import RawClient


def member_hello(address: str, source: str | None = None) -> RawClient:
    """A raw connection that said Hello MEMBER and got its challenge (and never proves
    anything)."""
    raw = RawClient(address, hello=False, source=source)
    raw.send(wire.Hello(raw.next_corr(), wire.PROTOCOL_VERSION, "stranger",
                        {"mechanism": "MEMBER", "member": "n1/r1"}))
    ok = raw.read()
    assert isinstance(ok, wire.HelloOk), ok
    return raw


def logs_in(address: str, source: str | None = None) -> RawClient:
    """A raw connection that logged in as guest."""
    raw = RawClient(address, hello=False, source=source)
    first, respond, check = login_frames(corr=raw.next_corr())
    raw.send(first)
    answer = raw.read()
    if isinstance(answer, wire.Error):
        raw.close()
        raise clients.ConnectionClosed(answer.message)
    raw.send(respond(answer))
    check(raw.read())
    return raw


def refused_at_once(raw: RawClient) -> str:
    """The Error corr 0 a refused connection gets, then the close; its message."""
    answer = raw.read()
    assert isinstance(answer, wire.Error) and answer.corr == 0, answer
    with pytest.raises(ConnectionError):
        raw.read()
    return answer.message


@pytest.fixture
def strict(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "b", extra=[
        "--max-connections", "20", "--max-unauthenticated", "6",
        "--max-unauthenticated-per-host", "4", "--hello-timeout", "30",
    ])
    b.start()
    try:
        yield b
    finally:
        b.stop()


def test_a_member_session_without_its_proof_is_closed_at_the_hello_timeout(
    tmp_path: Path,
) -> None:
    b = BrokerProcess(tmp_path / "b", extra=["--hello-timeout", "1"])
    b.start()
    try:
        raw = member_hello(b.address)
        try:
            raw.sock.settimeout(8)  # well past the hello timeout
            answer = raw.read()
            assert isinstance(answer, wire.Error) and answer.corr == 0, answer
            assert "member proof" in answer.message and "hello_timeout" in answer.message
            with pytest.raises(ConnectionError):
                raw.read()
        finally:
            raw.close()
        # A logged-in client stays past it.
        with clients.sync.connect(b.address) as conn:
            conn.declare_queue("q")
            eventually_sync(lambda: "member proof" in b.output(), "the close is logged")
            assert conn.ping() >= 0
        assert "Traceback" not in b.output()
    finally:
        b.stop()


def test_strangers_from_one_address_cannot_lock_out_a_user(strict: BrokerProcess) -> None:
    with ExitStack() as stack:
        for _ in range(4):
            stack.callback(member_hello(strict.address, "127.0.0.2").close)
        fifth = RawClient(strict.address, hello=False, source="127.0.0.2")
        stack.callback(fifth.close)
        why = refused_at_once(fifth)
        assert "max_unauthenticated_per_host" in why
        # A user from another address logs in, and those logged in leave the count.
        users = [logs_in(strict.address, "127.0.0.1") for _ in range(8)]
        for u in users:
            stack.callback(u.close)
            assert isinstance(u.ping(), wire.Ok)
    assert "Traceback" not in strict.output()


def test_connections_still_logging_in_have_a_broker_wide_limit(strict: BrokerProcess) -> None:
    with ExitStack() as stack:
        pending = []
        for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
            for _ in range(2):
                raw = member_hello(strict.address, source)
                stack.callback(raw.close)
                pending.append(raw)
        late = RawClient(strict.address, hello=False, source="127.0.0.5")
        stack.callback(late.close)
        message = refused_at_once(late)
        assert "max_unauthenticated" in message
        # Once one of them goes, a user gets in.
        pending[0].close()
        user = eventually_sync(lambda: _try_login(strict.address), "a login is accepted")
        stack.callback(user.close)
        assert isinstance(user.ping(), wire.Ok)
    out = strict.output()
    assert "max_unauthenticated" in out and "Traceback" not in out


def _try_login(address: str) -> RawClient | None:
    try:
        return logs_in(address, "127.0.0.6")
    except (clients.ConnectionClosed, ConnectionError, socket.timeout):
        return None


def test_connections_without_hello_count_too(strict: BrokerProcess) -> None:
    with ExitStack() as stack:
        for _ in range(4):
            stack.callback(RawClient(strict.address, hello=False, source="127.0.0.7").close)
        raw = RawClient(strict.address, hello=False, source="127.0.0.7")
        stack.callback(raw.close)
        answer = raw.read()
        assert isinstance(answer, wire.Error) and answer.code == LimitExceeded.code, answer
        assert "max_unauthenticated_per_host" in answer.message
        with pytest.raises(clients.ConnectionClosed, match="max_unauthenticated_per_host"):
            logs_in(strict.address, "127.0.0.7")
