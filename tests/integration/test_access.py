"""Logins and rights against real brokers (docs/security.md): without credentials, and as
a user lacking the right, a client can do nothing of each frame family; with it, it can."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from batonmq import clients
from batonmq.broker.config import ADMIN_READY_PREFIX
from batonmq.clients import wire
from batonmq.cluster.errors import AccessRefused, ConnectionClosed, InvalidArgument
from tests.helpers import eventually, login_frames, read_frame
from tests.integration.conftest import BrokerProcess
from tests.integration.test_cli import baton

pytestmark = pytest.mark.integration

ADMIN_PASSWORD = "correct horse battery staple"


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker whose cluster started with an admin password: no guest."""
    secret = tmp_path / "admin-password"
    secret.write_text(ADMIN_PASSWORD + "\n")
    b = BrokerProcess(tmp_path / "secured", extra=["--admin-password-file", str(secret)])
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _raw(address: str) -> tuple[socket.socket, wire.FrameCodec]:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10), wire.FrameCodec()


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except OSError:
        return True


def test_a_hello_without_a_login_is_refused_and_closed(broker: BrokerProcess) -> None:
    sock, codec = _raw(broker.address)
    with sock:
        sock.sendall(codec.send(wire.Hello(1, wire.PROTOCOL_VERSION, "anonymous")))
        err = read_frame(sock, codec)
        assert isinstance(err, wire.Error) and err.code == AccessRefused.code, err
        assert "needs a login" in err.message
        assert _closed(sock)


def test_a_wrong_proof_is_refused_and_closed(broker: BrokerProcess) -> None:
    sock, codec = _raw(broker.address)
    with sock:
        hello, respond, _ = login_frames("guest", "not-guest")
        sock.sendall(codec.send(hello))
        sock.sendall(codec.send(respond(read_frame(sock, codec))))
        err = read_frame(sock, codec)
        assert isinstance(err, wire.Error) and err.code == AccessRefused.code, err
        assert "wrong user name or password" in err.message
        assert _closed(sock)


async def test_the_admin_password_replaces_guest_and_wrong_passwords_are_refused(
    secured: BrokerProcess,
) -> None:
    with pytest.raises(AccessRefused, match="wrong user name or password"):
        await clients.connect(secured.address)  # guest/guest: there is no guest
    with pytest.raises(AccessRefused, match="wrong user name or password"):
        await clients.connect(secured.address, username="admin", password="guess")
    with pytest.raises(AccessRefused, match="wrong user name or password"):
        await clients.connect(secured.address, username="nobody", password="guess")
    url = f"baton://admin:{ADMIN_PASSWORD.replace(' ', '%20')}@{secured.address}"
    async with await clients.connect(url) as admin:
        assert admin.user == "admin"
        users = await admin.list_users()
        assert [u["name"] for u in users] == ["admin"] and users[0]["admin"]
        topo = await admin.topology()
        assert topo["instances"][0]["address"] == secured.address  # an admin sees addresses
        assert topo["access_refused"]["login"] >= 3


async def _refused(call: Callable[[], Awaitable[Any]], right: str) -> None:
    with pytest.raises(AccessRefused, match=right):
        await call()


Conn = clients.Connection


async def _consume_one(c: Conn) -> None:
    async with c.consume("jobs", prefetch=10) as consumer:
        msg = await consumer.get(timeout=10)
        assert msg is not None
        await msg.ack()


async def _lead(c: Conn) -> None:
    async with c.lead("svc") as term:
        assert term.token > 0


async def _handover(c: Conn) -> None:
    # Let through, a handover of a service that has no leader fails on its merits.
    try:
        await c.handover("svc", timeout=1)
    except InvalidArgument as exc:
        assert "no leader" in exc.message or "candidate" in exc.message, exc


# Each frame family: the frame a client without a login sends first, the calls a user
# without the right makes (each refused, naming the right), the rights that allow them,
# and the same calls again (each must go through).
FAMILIES: dict[str, tuple[wire.Frame, list[tuple[str, Callable[[Conn], Awaitable[Any]]]],
                          dict[str, str]]] = {
    "read": (
        wire.Subscribe(1, "jobs", 1),
        [("no read right", lambda c: c.peek("jobs")),
         ("no read right", _consume_one),
         ("no read right", lambda c: c.message_history("jobs", 0))],
        {"read": "jobs"},
    ),
    "publish": (
        wire.Publish(1, "jobs", b"x", {}, ""),
        [("no write right", lambda c: c.publish("jobs", b"x")),
         ("no write right", lambda c: c.publish_batch("jobs", [b"y", b"z"]))],
        {"write": "jobs"},
    ),
    "purge and delete": (
        wire.PurgeQueue(1, "jobs"),
        [("no configure right", lambda c: c.purge_queue("jobs")),
         ("no configure right", lambda c: c.declare_queue("jobs2")),
         ("no configure right", lambda c: c.delete_queue("jobs2"))],
        {"configure": "jobs|jobs2"},
    ),
    "reserve and range reads": (
        wire.ReadRange(1, "jobs", 0, 3, 10),
        [("no read right", lambda c: c.read_range("jobs", 0, 3)),
         ("no read right", lambda c: c.reserve("jobs", "spark")),
         ("no read right", lambda c: c.accept_through("jobs", 1, "spark")),
         ("no read right", lambda c: c.reserve("jobs", None))],
        {"read": "jobs"},
    ),
    "service leadership": (
        wire.Lead(1, "svc"),
        [("no lead right", _lead),
         ("no lead right", _handover)],
        {"lead": "svc"},
    ),
}


@pytest.mark.parametrize("family", list(FAMILIES))
async def test_each_frame_family_needs_its_right(secured: BrokerProcess, family: str) -> None:
    first_frame, calls, rights = FAMILIES[family]
    # Without a login: the family's frame as the first frame closes the connection.
    sock, codec = _raw(secured.address)
    with sock:
        sock.sendall(codec.send(first_frame))
        err = read_frame(sock, codec)
        assert isinstance(err, wire.Error) and err.code != 0, err
        assert _closed(sock)
    admin = await clients.connect(secured.address, username="admin", password=ADMIN_PASSWORD)
    await admin.declare_queue("jobs")
    await admin.publish_batch("jobs", [b"a", b"b", b"c"])
    await admin.put_user("alice", "alice-pw")
    alice = await clients.connect(secured.address, username="alice", password="alice-pw")
    try:
        for why, call in calls:
            await _refused(lambda: call(alice), why)
        assert (await admin.queue_stats("jobs"))["ready"] == 3  # nothing happened
        # With the right, on the connection already open (rights apply at once).
        await admin.set_permissions("alice", **rights)
        for _, call in calls:
            await call(alice)
        refused = (await admin.topology())["access_refused"]
        assert sum(refused.get(r, 0) for r in rights) >= len(calls), refused
    finally:
        await alice.close()
        await admin.close()


async def test_a_user_sees_only_its_queues_and_an_admin_all(secured: BrokerProcess) -> None:
    async with await clients.connect(
        secured.address, username="admin", password=ADMIN_PASSWORD
    ) as admin:
        for q in ("jobs", "other"):
            await admin.declare_queue(q)
        await admin.put_user("alice", "alice-pw")
        await admin.set_permissions("alice", configure="tmp-.*", write="jobs", read="jobs")
        async with await clients.connect(
            secured.address, username="alice", password="alice-pw"
        ) as alice:
            await _refused(lambda: alice.queue_stats("other"), "no right on queue")
            assert (await alice.queue_stats("jobs"))["ready"] == 0
            assert [q["queue"] for q in await alice.list_queues()] == ["jobs"]
            await _refused(lambda: alice.publish("jobs2", b"x"), "no write right")  # whole name
            await _refused(lambda: alice.declare_queue("tmp-2", dead_letter="jobs-dlq"),
                           "no write right on queue 'jobs-dlq'")
            assert await alice.declare_queue("tmp-1")
            await _refused(lambda: alice.list_users(), "not an admin")
            await _refused(lambda: alice.put_user("mallory", "pw", admin=True), "not an admin")
            await _refused(lambda: alice.set_permissions("alice", write=".*"), "not an admin")
            await _refused(lambda: alice.connections(), "not an admin")
            topo = await alice.topology()
            assert all(i["address"] == "" for i in topo["instances"])  # addresses: admin only
            users = sorted(c["user"] for c in await admin.connections())
            assert users == ["admin", "alice"]  # an admin sees who is connected as whom
        assert [q["queue"] for q in await admin.list_queues()] == ["jobs", "other", "tmp-1"]


async def test_a_deleted_user_can_do_nothing_more_and_a_user_cannot_ask_for_a_join_update(
    secured: BrokerProcess,
) -> None:
    async with await clients.connect(
        secured.address, username="admin", password=ADMIN_PASSWORD
    ) as admin:
        await admin.put_user("bob", "bob-pw", admin=True)
        bob = await clients.connect(secured.address, username="bob", password="bob-pw")
        await bob.declare_queue("b")
        # A user session asking for the join update (every message of every queue).
        sock, codec = _raw(secured.address)
        with sock:
            hello, respond, check = login_frames("bob", "bob-pw")
            sock.sendall(codec.send(hello))
            sock.sendall(codec.send(respond(read_frame(sock, codec))))
            check(read_frame(sock, codec))
            sock.sendall(codec.send(wire.UpdateRequest(2, 0, None, True)))
            err = read_frame(sock, codec)
            assert isinstance(err, wire.Error) and err.code == AccessRefused.code, err
            assert "joining broker" in err.message
        assert await admin.delete_user("bob") is True
        # Its connection was closed when the broker applied the delete
        # (Error corr 0 AccessRefused, docs/security.md).
        with pytest.raises((AccessRefused, ConnectionClosed), match="was deleted"):
            await bob.declare_queue("b2")
        await bob.close()
        with pytest.raises(AccessRefused):
            await clients.connect(secured.address, username="bob", password="bob-pw")
        with pytest.raises(Exception, match="last admin"):
            await admin.delete_user("admin")


async def test_users_and_rights_reach_every_broker_of_the_cluster(
    cluster: list[BrokerProcess],
) -> None:
    a, b, c = cluster
    async with await clients.connect(a.address) as guest:  # guest, from loopback
        await guest.put_user("carol", "carol-pw")
        await guest.set_permissions("carol", write="in")
    for other in (b, c):
        async def logged_in() -> bool:
            try:
                async with await clients.connect(
                    other.address, username="carol", password="carol-pw"
                ):
                    return True
            except AccessRefused:
                return False

        await eventually(logged_in, f"carol can log in at {other.address}", timeout=20)
        async with await clients.connect(
            other.address, username="carol", password="carol-pw"
        ) as carol:
            await _refused(lambda: carol.declare_queue("in"), "no configure right")


def test_the_cli_manages_users_and_logs_in_as_one(secured: BrokerProcess) -> None:
    admin_env = {"BATON_USER": "admin", "BATON_PASSWORD": ADMIN_PASSWORD}
    r = baton("user", "add", "dave", "--password-stdin", "--broker", secured.address,
              stdin=b"dave-pw\n", env=admin_env)
    assert r.returncode == 0, r.stderr
    assert "user dave added" in r.stdout
    r = baton("permissions", "set", "dave", "--configure", "dq.*", "--write", "dq.*",
              "--read", "dq.*", "--broker", secured.address, env=admin_env)
    assert r.returncode == 0, r.stderr
    r = baton("user", "list", "--json", "--broker", secured.address, env=admin_env)
    assert r.returncode == 0, r.stderr
    assert '"configure": "dq.*"' in r.stdout and "salt" not in r.stdout
    dave = {"BATON_PASSWORD": "dave-pw"}
    r = baton("--user", "dave", "queue", "declare", "dq1", "--broker", secured.address, env=dave)
    assert r.returncode == 0, r.stderr
    r = baton("--user", "dave", "queue", "declare", "other", "--broker", secured.address,
              env=dave)
    assert r.returncode != 0 and "no configure right on queue 'other'" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = baton("queues", "--broker", secured.address, env={"BATON_PASSWORD": "x"})
    assert r.returncode != 0 and "wrong user name or password" in r.stderr
    r = baton("user", "passwd", "dave", "--password-stdin", "--broker", secured.address,
              stdin=b"new-pw\n", env=admin_env)
    assert r.returncode == 0, r.stderr
    r = baton("--user", "dave", "queues", "--broker", secured.address,
              env={"BATON_PASSWORD": "new-pw"})
    assert r.returncode == 0, r.stderr
    r = baton("user", "delete", "dave", "--broker", secured.address, env=admin_env)
    assert r.returncode == 0, r.stderr


async def test_allow_from_refuses_connections_from_other_networks(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    # Everything here comes from 127.0.0.1: a list without loopback refuses it.
    b = BrokerProcess(tmp_path / "walled", extra=[
        "--allow-from", "10.0.0.0/8", "--admin-listen", "127.0.0.1:0",
        "--admin-allow-from", "192.168.0.0/16",
    ])
    b.start()
    try:
        with pytest.raises(AccessRefused, match="not allowed here"):
            await clients.connect(b.address)
        admin = next(line.split()[-1] for line in b.output().splitlines()
                     if line.startswith(ADMIN_READY_PREFIX))
        with pytest.raises(urllib.error.HTTPError) as http:
            urllib.request.urlopen(f"http://{admin}/api/overview", timeout=10)
        assert http.value.code == 403 and b"192.168.0.0/16" in http.value.read()
    finally:
        b.stop()
    b.extra[1] = "10.0.0.0/8,loopback"
    b.extra[5] = "loopback"
    b.start()
    try:
        async with await clients.connect(b.address) as conn:
            await conn.declare_queue("inside")
    finally:
        b.stop()


async def test_exchange_commands_need_their_rights(secured: BrokerProcess) -> None:
    async with await clients.connect(
        secured.address, username="admin", password=ADMIN_PASSWORD
    ) as admin:
        for q in ("jobs", "other"):
            await admin.declare_queue(q)
        await admin.declare_exchange("ex", "direct")
        await admin.declare_exchange("other-ex", "direct")
        await admin.bind_queue("other", "other-ex", "k")
        await admin.put_user("alice", "alice-pw")
        await admin.set_permissions("alice", configure="ex|tmp", write="jobs|ex", read="ex")
        async with await clients.connect(
            secured.address, username="alice", password="alice-pw"
        ) as alice:
            assert await alice.declare_exchange("ex", "direct") is False
            assert [x["exchange"] for x in await alice.list_exchanges()] == ["ex"]
            await _refused(lambda: alice.declare_exchange("mine", "fanout"),
                           "no configure right on exchange 'mine'")
            await _refused(lambda: alice.delete_exchange("other-ex"), "no configure right")
            await _refused(lambda: alice.bind_queue("other", "ex", "k"),
                           "no write right on queue 'other'")
            await _refused(lambda: alice.bind_queue("jobs", "other-ex", "k"),
                           "no read right on exchange 'other-ex'")
            assert await alice.bind_queue("jobs", "ex", "k") is True
            assert (await alice.publish_to("ex", "k", b"m")).queues == ["jobs"]
            await _refused(lambda: alice.publish_to("other-ex", "k", b"m"),
                           "no write right on exchange 'other-ex'")
            await _refused(lambda: alice.publish_to("", "other", b"m"),
                           "no write right on queue 'other'")
            await _refused(lambda: alice.declare_queue("tmp", dead_letter_exchange="dlx"),
                           "no write right on exchange 'dlx'")
            assert await alice.declare_queue("tmp", dead_letter_exchange="ex")
        assert (await admin.queue_stats("other"))["ready"] == 0  # nothing went there
        assert (await admin.queue_stats("jobs"))["ready"] == 1


def _server_salt(address: str, user: str) -> str:
    """The salt a broker's SCRAM challenge gives ``user`` (``s=`` of server-first)."""
    from batonmq.clients import scram, wire
    from tests.integration.test_bad_clients import RawClient

    raw = RawClient(address, hello=False)
    try:
        exchange = scram.ClientExchange(user, "any-password")
        raw.send(wire.Hello(raw.next_corr(), wire.PROTOCOL_VERSION, "probe",
                            {"mechanism": scram.MECHANISM, "message": exchange.first()}))
        challenge = raw.read()
        assert isinstance(challenge, wire.AuthChallenge), challenge
        message = challenge.data["message"]
        text = message.decode() if isinstance(message, bytes) else str(message)
        return dict(part.split("=", 1) for part in text.split(","))["s"]
    finally:
        raw.close()


def test_every_broker_gives_an_unknown_user_the_same_salt(tmp_path: Path) -> None:
    """A known user's salt is the same on every broker (it is replicated); an unknown
    user's must be too, or comparing two brokers tells which users exist."""
    log_url = f"file:{tmp_path / 'shared-log'}"
    brokers = [
        BrokerProcess(tmp_path / f"n{i}", log_url=log_url, node_id=f"n{i}") for i in (1, 2)
    ]
    try:
        for b in brokers:
            b.start()
        for name in ("guest", "nobody-here", "mallory"):
            salts = {_server_salt(b.address, name) for b in brokers}
            assert len(salts) == 1, (name, salts)
        # And unknown names still get salts of their own.
        assert _server_salt(brokers[0].address, "nobody-here") != _server_salt(
            brokers[0].address, "mallory"
        )
        # A restarted broker (a new runtime) answers the same.
        before = _server_salt(brokers[1].address, "nobody-here")
        brokers[1].stop()
        brokers[1].restart()
        assert _server_salt(brokers[1].address, "nobody-here") == before
    finally:
        for b in brokers:
            b.stop()
