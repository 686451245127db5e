"""Per-user limits on real brokers (docs/security.md "Per-user limits"): a non-admin over
its queue limit is refused natively and over AMQP (406), its connections over the limit
at login (native LimitExceeded, AMQP 530 at open) and its consumers over theirs; an
admin raises a limit with ``baton user limits``; ``baton user list`` shows them; they
survive a restart (they are replicated)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pika
import pika.exceptions
import pytest

from batonmq import clients
from batonmq.cluster.errors import ConnectionClosed, LimitExceeded
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import amqp_broker, connect  # noqa: F401 (a fixture)
from tests.integration.test_cli import baton

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(amqp_broker: BrokerProcess) -> BrokerProcess:
    """A broker with its AMQP listener on (test_amqp's)."""
    return amqp_broker


def limits(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    r = baton("user", "limits", *args, "--broker", address)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r


def alice_url(b: BrokerProcess) -> str:
    return f"baton://alice:alice-pw@{b.address}"


async def _add_alice(b: BrokerProcess) -> None:
    async with await clients.connect(b.address) as admin:
        await admin.put_user("alice", "alice-pw")
        await admin.set_permissions("alice", configure=".*", write=".*", read=".*")


async def test_a_non_admin_over_its_queue_limit_is_refused_natively_and_over_amqp(
    broker: BrokerProcess,
) -> None:
    await _add_alice(broker)
    limits(broker.address, "alice", "--max-queues", "2")
    async with await clients.connect(alice_url(broker)) as alice:
        for name in ("a1", "a2"):
            assert (await alice.declare_queue(name))["created"]
        with pytest.raises(LimitExceeded, match=r"user 'alice' has 2 queues.*max_queues 2"):
            await alice.declare_queue("a3")
        assert not (await alice.declare_queue("a1"))["created"]  # one it has: no new queue
        # Over AMQP: Queue.Declare refused with 406, as RabbitMQ's user limit.
        amqp = connect(broker, "alice", "alice-pw")
        try:
            ch = amqp.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                ch.queue_declare("a3")
            assert closed.value.reply_code == 406 and "max_queues" in closed.value.reply_text
        finally:
            amqp.close()
        # An admin raises it: now it works, natively and over AMQP.
        limits(broker.address, "alice", "--max-queues", "4")
        assert (await alice.declare_queue("a3"))["created"]
        amqp = connect(broker, "alice", "alice-pw")
        try:
            assert amqp.channel().queue_declare("a4").method.queue == "a4"
        finally:
            amqp.close()
        with pytest.raises(LimitExceeded):
            await alice.declare_queue("a5")
    # An admin has no limit (the default applies to non-admins only).
    limits(broker.address, "--default", "--max-queues", "0")
    async with await clients.connect(broker.address) as admin:
        for i in range(3):
            await admin.declare_queue(f"admin{i}")


async def test_connection_and_consumer_limits_and_the_listing(broker: BrokerProcess) -> None:
    await _add_alice(broker)
    limits(broker.address, "alice", "--max-connections", "1", "--max-consumers", "1")
    r = baton("user", "list", "--json", "--broker", broker.address)
    (alice,) = [u for u in json.loads(r.stdout) if u["name"] == "alice"]
    assert alice["limits"] == {"max_connections": 1, "max_consumers": 1}
    r = baton("user", "list", "--broker", broker.address)
    assert "max_connections 1, max_consumers 1" in r.stdout, r.stdout
    first = await clients.connect(alice_url(broker), failover=False)
    try:
        # Counted per broker: the client says so after trying each broker it knows.
        with pytest.raises(ConnectionClosed, match=r"LimitExceeded: .*max_connections 1"):
            await clients.connect(alice_url(broker), failover=False)
        # AMQP: Connection.Close 530 NOT_ALLOWED at open, as RabbitMQ's.
        # (pika reports a close at open as a probable access denial, with the reply.)
        with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
            connect(broker, "alice", "alice-pw")
        assert '(530) "NOT_ALLOWED - user \'alice\' has 1 connections' in str(refused.value)
        await first.declare_queue("work")
        async with first.consume("work", prefetch=1):
            with pytest.raises(LimitExceeded, match="max_consumers 1"):
                async with first.consume("work", prefetch=1):
                    pass
        async with first.consume("work", prefetch=1):  # the slot is free again
            pass
    finally:
        await first.close()
    # Other users are not counted against alice.
    async with await clients.connect(broker.address) as admin, \
            await clients.connect(broker.address):
        assert await admin.queue_stats("work")


async def test_limits_survive_a_restart(broker: BrokerProcess) -> None:
    await _add_alice(broker)
    limits(broker.address, "alice", "--max-queues", "1")
    limits(broker.address, "--default", "--max-consumers", "5")
    async with await clients.connect(alice_url(broker)) as alice:
        await alice.declare_queue("only")
    broker.stop()
    broker.start()
    async with await clients.connect(broker.address) as admin:
        users = {u["name"]: u for u in await admin.list_users()}
    assert users["alice"]["limits"] == {"max_queues": 1}
    async with await clients.connect(alice_url(broker)) as alice:
        with pytest.raises(LimitExceeded, match="max_queues 1"):
            await alice.declare_queue("second")
    r = baton("user", "limits", "--max-queues", "x", "alice", "--broker", broker.address)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert os.path.isdir(broker.data_dir)


async def test_the_admin_api_sets_and_lists_limits_and_tags(tmp_path: Path) -> None:
    import aiohttp

    from tests.integration.test_admin import ADMIN, TOOL_HEADERS, admin_of

    b = BrokerProcess(tmp_path / "b", extra=ADMIN)
    b.start()
    try:
        await _add_alice(b)
        base = admin_of(b)
        async with aiohttp.ClientSession(headers=TOOL_HEADERS) as http:
            async with http.put(f"{base}/api/users/alice/limits",
                                json={"max_queues": 1, "max_consumers": -1}) as r:
                assert r.status == 200, await r.text()
            async with http.put(f"{base}/api/limits", json={"max_connections": 50}) as r:
                assert r.status == 200
            async with http.put(f"{base}/api/users/alice/tags", json={"tags": ["nope"]}) as r:
                assert r.status == 400 and "unknown user tag" in (await r.json())["error"]["message"]
            async with http.put(f"{base}/api/users/nobody/limits", json={"max_queues": 1}) as r:
                assert r.status == 400
            async with http.get(f"{base}/api/users") as r:
                body = await r.json()
            (alice,) = [u for u in body["users"] if u["name"] == "alice"]
            assert alice["limits"] == {"max_queues": 1, "max_consumers": -1}
            assert body["default_limits"] == {"max_queues": 1000, "max_connections": 50,
                                              "max_consumers": None}
            async with http.get(f"{base}/api/users/alice") as r:
                assert (await r.json())["limits"]["max_queues"] == 1
        async with await clients.connect(alice_url(b)) as alice_conn:
            await alice_conn.declare_queue("one")
            with pytest.raises(LimitExceeded):
                await alice_conn.declare_queue("two")
    finally:
        b.stop()
