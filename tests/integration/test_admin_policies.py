"""The admin API's policies, exchanges, bindings, publishing and getting, against a real
broker (docs/admin.md "Policies", "Exchanges, bindings and messages"): admins change
policies, with the login and CSRF rules of every change; a bad policy is a 400 with one
line and writes nothing; a queue's stats name its policy; publishing and getting are
checked with the user's own rights; a get acks or requeues."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from batonmq import clients
from tests.integration.conftest import BrokerProcess
from tests.helpers import eventually
from tests.integration.test_admin import ADMIN, admin_broker, admin_of, basic, http  # noqa: F401
from tests.integration.test_admin_login import call, raw  # noqa: F401

pytestmark = pytest.mark.integration

TOOL = {"X-Baton-Request": "1"}
GUEST = {"Authorization": basic("guest", "guest"), **TOOL}
ALICE = {"Authorization": basic("alice", "alice-pw"), **TOOL}


async def _alice(address: str) -> None:
    async with await clients.connect(address) as admin:
        await admin.put_user("alice", "alice-pw")
        await admin.set_permissions("alice", configure="a\\..*", write="a\\..*", read="a\\..*")


async def test_policies_through_the_api(admin_broker: BrokerProcess, raw: aiohttp.ClientSession) -> None:
    base = admin_of(admin_broker)
    await _alice(admin_broker.address)
    async with await clients.connect(admin_broker.address) as conn:
        await conn.declare_queue("a.work", max_length=100)
    url = f"{base}/api/policies/cap"
    policy = {"pattern": "^a\\.", "definition": {"max-length": 10, "dead-letter": "a.dlq"},
              "priority": 2}
    # Every change needs a login, an admin, and the tool header (or the console's token).
    status, body, _ = await call(raw, "PUT", url, headers={"Authorization": basic("guest", "guest")},
                                 json=policy)
    assert status == 403, body
    status, body, _ = await call(raw, "PUT", url, headers=ALICE, json=policy)
    assert status == 403 and "manage policies" in body["error"]["message"], body
    for bad, said in (
        ({"pattern": "(", "definition": {"max-length": 1}}, "bad policy pattern"),
        ({"pattern": "x", "definition": {"max-length": "ten"}}, "'max-length' must be an integer"),
        ({"pattern": "x", "definition": {"colour": 1}}, "unknown policy key 'colour'"),
        ({"pattern": "x"}, "give at least pattern and definition"),
        ({"pattern": "x", "definition": {"max-length": 1}, "prio": 1}, "unknown field 'prio'"),
        ({"pattern": "x", "definition": {"max-length": 1}, "priority": "high"}, "priority"),
    ):
        status, body, _ = await call(raw, "PUT", url, headers=GUEST, json=bad)
        assert status == 400 and body["error"]["name"] == "InvalidArgument", (bad, body)
        assert said in body["error"]["message"] and "\n" not in body["error"]["message"]
    status, body, _ = await call(raw, "GET", f"{base}/api/policies", headers=ALICE)
    assert (status, body) == (200, {"policies": []})  # nothing was written

    status, body, _ = await call(raw, "PUT", url, headers=GUEST, json=policy)
    assert (status, body) == (200, {"changed": True, "queues": 1})
    status, body, _ = await call(raw, "GET", f"{base}/api/policies", headers=ALICE)
    assert status == 200 and body["policies"] == [
        {"name": "cap", "pattern": "^a\\.", "apply_to": "queues", "priority": 2,
         "definition": {"dead-letter": "a.dlq", "max-length": 10}}]
    status, body, _ = await call(raw, "GET", f"{base}/api/queues/a.work", headers=ALICE)
    assert status == 200 and (body["policy"], body["max_length"], body["dead_letter"]) == (
        "cap", 10, "a.dlq")
    status, body, _ = await call(raw, "GET", f"{base}/api/policies/nope", headers=GUEST)
    assert status == 404 and body["error"]["name"] == "UnknownPolicy"
    status, body, _ = await call(raw, "DELETE", f"{base}/api/policies/nope", headers=GUEST)
    assert status == 404
    status, body, _ = await call(raw, "DELETE", url, headers=ALICE)
    assert status == 403
    status, body, _ = await call(raw, "DELETE", url, headers=GUEST)
    assert (status, body) == (200, {"changed": True, "queues": 0})
    status, body, _ = await call(raw, "GET", f"{base}/api/queues/a.work", headers=GUEST)
    assert (body["policy"], body["max_length"]) == (None, 100)


async def test_exchanges_bindings_publish_and_get(
    admin_broker: BrokerProcess, raw: aiohttp.ClientSession
) -> None:
    base = admin_of(admin_broker)
    await _alice(admin_broker.address)
    async with await clients.connect(admin_broker.address) as conn:
        await conn.declare_queue("a.in")
        await conn.declare_queue("b.secret")
        await conn.declare_exchange("a.x", "topic")
        await conn.bind_queue("a.in", "a.x", "k.*")
        await conn.bind_queue("b.secret", "amq.topic", "#")
    status, body, _ = await call(raw, "GET", f"{base}/api/exchanges", headers=ALICE)
    assert status == 200 and [x["exchange"] for x in body["exchanges"]] == ["a.x"]
    status, body, _ = await call(raw, "GET", f"{base}/api/bindings", headers=GUEST)
    assert status == 200
    assert {(b["exchange"], b["queue"], b["routing_key"]) for b in body["bindings"]} == {
        ("a.x", "a.in", "k.*"), ("amq.topic", "b.secret", "#")}

    async def publish(path: str, login: dict[str, str], **message: Any) -> tuple[int, Any]:
        status, body, _ = await call(raw, "POST", f"{base}/api/{path}", headers=login,
                                     json=message)
        return status, body

    # Through an exchange, with alice's rights on it; to a queue; base64 bodies.
    status, body = await publish("exchanges/a.x/publish", ALICE, routing_key="k.1", body="one",
                                 headers={"h": 1})
    assert status == 200 and body["queues"] == ["a.in"], body
    status, body = await publish("exchanges/a.x/publish", ALICE, routing_key="z", body="lost")
    assert status == 200 and body["queues"] == []  # routed nowhere
    status, body = await publish("queues/a.in/publish", ALICE,
                                 body=base64.b64encode(b"\xff\x00two").decode(), encoding="base64")
    assert status == 200 and body["queues"] == ["a.in"], body
    status, body = await publish("exchanges/amq.default/publish", GUEST, routing_key="a.in",
                                 body="three")
    assert status == 200 and body["queues"] == ["a.in"], body
    # Alice has no right on b.secret nor on amq.topic; mistakes are one line.
    for path, msg, want in (
        ("queues/b.secret/publish", {"body": "x"}, 403),
        ("exchanges/amq.topic/publish", {"body": "x", "routing_key": "r"}, 403),
        ("exchanges/a.nope/publish", {"body": "x"}, 404),
        ("queues/a.nope/publish", {"body": "x"}, 404),
        ("queues/a.in/publish", {"text": "x"}, 400),
        ("queues/a.in/publish", {"body": "%%", "encoding": "base64"}, 400),
        ("queues/a.in/publish", {"body": "x", "headers": []}, 400),
    ):
        status, body = await publish(path, ALICE, **msg)
        assert status == want, (path, msg, body)
    status, body, _ = await call(raw, "POST", f"{base}/api/queues/b.secret/get", headers=ALICE,
                                 json={})
    assert status == 403

    # Get and requeue: the message stays, first in line, its delivery count unchanged.
    url = f"{base}/api/queues/a.in/get"
    status, body, _ = await call(raw, "POST", url, headers=ALICE, json={"count": 1, "ack": False})
    assert status == 200 and body["acked"] is False, body
    (m,) = body["messages"]
    assert (m["body_utf8"], m["headers"], m["delivery_count"]) == ("one", {"h": 1}, 0)
    async with await clients.connect(admin_broker.address) as conn:
        s = await conn.queue_stats("a.in")
        assert (s["ready"], s["acquired"], s["accepted"]) == (3, 0, 0), s
    # Get and ack: gone for good.
    status, body, _ = await call(raw, "POST", url, headers=ALICE, json={"count": 2})
    assert status == 200 and body["acked"] is True
    assert [m["body_utf8"] for m in body["messages"]] == ["one", None]
    assert base64.b64decode(body["messages"][1]["body"]) == b"\xff\x00two"
    async with await clients.connect(admin_broker.address) as conn:
        s = await conn.queue_stats("a.in")
        assert (s["ready"], s["acquired"], s["accepted"], s["consumers"]) == (1, 0, 2, 0), s
    status, body, _ = await call(raw, "POST", url, headers=ALICE, json={"count": 5})
    assert [m["body_utf8"] for m in body["messages"]] == ["three"]
    status, body, _ = await call(raw, "POST", url, headers=ALICE, json={})
    assert (status, body["messages"]) == (200, [])  # empty
    for bad in ({"count": 0}, {"count": 101}, {"ack": "yes"}, {"requeue": True}):
        status, body, _ = await call(raw, "POST", url, headers=ALICE, json=bad)
        assert status == 400, (bad, body)


async def test_a_get_through_another_broker_takes_the_queue_from_its_owner(
    tmp_path: Path, raw: aiohttp.ClientSession
) -> None:
    """The queue's owner is another broker, whose consumer holds a message: the get's
    consumer wants the queue too, ownership moves by time slices (docs/design.md §6),
    and the other messages come."""
    url = f"file:{tmp_path / 'shared-log'}"
    one, two = (BrokerProcess(tmp_path / f"node-{i}", log_url=url, node_id=f"node-{i}",
                              extra=ADMIN) for i in (1, 2))
    one.start()
    two.start()
    try:
        async with await clients.connect(one.address) as conn:
            await conn.declare_queue("work")
            await conn.publish_batch("work", [b"a", b"b", b"c"])
            async with conn.consume("work", prefetch=1) as consumer:
                async for msg in consumer:
                    break  # "a", held by node-1's consumer
                s = await conn.queue_stats("work")
                assert s["owner"].startswith("node-1/") and s["acquired"] == 1, s
                status, body, _ = await call(raw, "POST", f"{admin_of(two)}/api/queues/work/get",
                                             headers=GUEST, json={"count": 2})
                assert status == 200, body
                assert [m["body_utf8"] for m in body["messages"]] == ["b", "c"]
                await msg.ack()
            s = await eventually(lambda: conn.queue_stats("work"), "all three accepted",
                                 until=lambda s: s["accepted"] == 3)
            assert (s["ready"], s["acquired"]) == (0, 0), s
    finally:
        two.stop()
        one.stop()
