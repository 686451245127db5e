"""The admin HTTP listener of a real ``baton serve --admin-listen 127.0.0.1:0`` process:
metrics, health, the JSON API (docs/admin.md)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batonmq import clients
from batonmq.broker.config import admin_ready_address
from tests.helpers import eventually, topology, wait_stats
from tests.integration.conftest import REPO, BrokerProcess
from tests.integration.test_cli import baton

pytestmark = pytest.mark.integration

ADMIN = ["--admin-listen", "127.0.0.1:0"]


def admin_of(b: BrokerProcess) -> str:
    """The ``http://HOST:PORT`` of the broker's admin listener, from its latest start."""
    lines = b.log_path.read_text(errors="replace").splitlines()
    found = [a for a in map(admin_ready_address, lines) if a is not None]
    assert found, f"no admin line in the broker's output:\n{b.output()}"
    return f"http://{found[-1]}"


@pytest.fixture
def admin_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", extra=ADMIN)
    b.start()
    try:
        yield b
    finally:
        b.stop()


#: How tests log in to the admin listener: the default guest (from loopback), with the
#: header a tool sends on a state-changing request (docs/admin.md "Logging in").
def basic(user: str, password: str) -> str:
    """An ``Authorization: Basic`` header's value."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


GUEST_BASIC = basic("guest", "guest")
TOOL_HEADERS = {"X-Baton-Request": "1", "Authorization": GUEST_BASIC}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=10), headers=TOOL_HEADERS
    ) as s:
        yield s


async def get_json(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as r:
        assert r.content_type == "application/json", await r.text()
        return r.status, await r.json()


def metric_samples(text: str, name: str) -> dict[str, float]:
    """The samples of metric family ``name`` by their ``queue`` label."""
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels.get("queue", ""): s.value for s in family.samples}
    raise AssertionError(f"no metric {name} in:\n{text[:2000]}")


async def test_metrics_ready_gauge_equals_baton_queues(
    admin_broker: BrokerProcess, http: aiohttp.ClientSession
) -> None:
    base = admin_of(admin_broker)
    async with await clients.connect(admin_broker.address) as conn:
        await conn.declare_queue("filled")
        await conn.publish_batch("filled", [b"m%d" % i for i in range(37)])
        async with conn.consume("filled", prefetch=5) as consumer:
            msg = await consumer.get(timeout=5)
            assert msg is not None
            await msg.ack()
            await wait_stats(conn, "filled", accepted=1)
    out = subprocess.run(
        [sys.executable, "-m", "batonmq.broker", "queues", "--json",
         "--broker", admin_broker.address],
        capture_output=True, check=True, cwd=REPO, timeout=30,
    )
    listed = {r["queue"]: r for r in json.loads(out.stdout)}
    async with http.get(f"{base}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    ready = metric_samples(text, "baton_queue_ready_messages")
    assert ready["filled"] == listed["filled"]["ready"] == 36
    assert metric_samples(text, "baton_queue_published_messages")["filled"] == 37
    assert metric_samples(text, "baton_queue_accepted_messages")["filled"] == 1
    # The broker's first append tries a linger (append_linger_us is on by default).
    assert metric_samples(text, "baton_append_lingers")[""] >= 1
    # The JSON API carries the counters the console computes its rates from.
    status, body = await get_json(http, f"{base}/api/queues/filled")
    assert status == 200
    delivered = metric_samples(text, "baton_queue_delivered_messages")["filled"]
    assert (body["enqueued"], body["delivered"], body["accepted"]) == (37, delivered, 1)
    assert delivered >= 1 and body["released"] == body["rejected"] == 0
    status, body = await get_json(http, f"{base}/api/queues")
    assert [(q["queue"], q["delivered"]) for q in body["queues"]] == [("filled", delivered)]
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"baton_log_append_seconds", "baton_log_fsync_seconds", "baton_apply_lag_records",
            "process_cpu_seconds", "baton_connections", "baton_leader"} <= names


async def test_the_console_is_served_from_the_package(
    admin_broker: BrokerProcess, http: aiohttp.ClientSession
) -> None:
    base = admin_of(admin_broker)
    async with http.get(f"{base}/") as r:
        assert r.status == 200 and r.content_type == "text/html"
        html = await r.text()
        assert "<title>Baton console</title>" in html
        assert "script-src 'self'" in r.headers["Content-Security-Policy"]
    for name, kind in (("console.js", "text/javascript"), ("console.css", "text/css")):
        async with http.get(f"{base}/console/{name}") as r:
            assert (r.status, r.content_type) == (200, kind)
            assert len(await r.read()) > 500
    for missing in ("nope.js", "index.html", "..%2Fadmin.py"):
        status, body = await get_json(http, f"{base}/console/{missing}")
        assert status == 404 and "error" in body, missing


async def test_healthz_and_readyz_of_a_serving_broker(
    admin_broker: BrokerProcess, http: aiohttp.ClientSession
) -> None:
    base = admin_of(admin_broker)
    status, body = await get_json(http, f"{base}/healthz")
    assert status == 200 and body["status"] == "ok"
    status, body = await get_json(http, f"{base}/readyz")
    assert status == 200, body
    assert body["ready"] and body["member"] and body["healthy"] and body["reasons"] == []


async def test_purge_through_the_api_empties_the_queue(
    admin_broker: BrokerProcess, http: aiohttp.ClientSession
) -> None:
    base = admin_of(admin_broker)
    async with http.put(f"{base}/api/queues/work", json={"delivery_limit": 3}) as r:
        assert r.status == 200 and await r.json() == {"created": True}
    async with await clients.connect(admin_broker.address) as conn:
        await conn.publish_batch("work", [b"x"] * 12)
        async with http.post(f"{base}/api/queues/work/purge") as r:
            assert r.status == 200 and await r.json() == {"purged": 12}
        stats = await conn.queue_stats("work")
        assert (stats["ready"], stats["purged"], stats["delivery_limit"]) == (0, 12, 3)
    status, body = await get_json(http, f"{base}/api/queues/work")
    assert status == 200 and body["ready"] == 0
    async with http.delete(f"{base}/api/queues/work") as r:
        assert r.status == 200 and await r.json() == {"deleted": 0}
    status, body = await get_json(http, f"{base}/api/queues")
    assert [q["queue"] for q in body["queues"]] == []


async def test_peek_leaves_ready_and_acquired_as_they_were(
    admin_broker: BrokerProcess, http: aiohttp.ClientSession
) -> None:
    base = admin_of(admin_broker)
    async with await clients.connect(admin_broker.address) as conn:
        await conn.declare_queue("peeked")
        await conn.publish_batch("peeked", [b"body-%d" % i for i in range(10)])
        async with conn.consume("peeked", prefetch=3) as consumer:
            await wait_stats(conn, "peeked", acquired=3)
            before = await conn.queue_stats("peeked")
            status, body = await get_json(http, f"{base}/api/queues/peeked/peek?count=4")
            assert status == 200
            assert [m["position"] for m in body["messages"]] == [3, 4, 5, 6]
            assert [m["body_utf8"] for m in body["messages"]] == [
                "body-3", "body-4", "body-5", "body-6"
            ]
            native = await conn.peek("peeked", count=2)
            assert [m[0] for m in native.messages] == [3, 4]
            assert native.messages[0][2] == b"body-3"
            after = await conn.queue_stats("peeked")
            assert (after["ready"], after["acquired"]) == (before["ready"], before["acquired"]) \
                == (7, 3)
            status, listed = await get_json(http, f"{base}/api/connections")
            consumers = [c for conn_ in listed["connections"] for c in conn_["consumers"]]
            assert [(c["queue"], c["prefetch"]) for c in consumers] == [("peeked", 3)]
            assert consumer is not None


async def test_errors_are_json_with_the_right_status(
    admin_broker: BrokerProcess, http: aiohttp.ClientSession
) -> None:
    base = admin_of(admin_broker)
    status, body = await get_json(http, f"{base}/api/queues/missing")
    assert status == 404 and body["error"]["name"] == "QueueNotFound"
    assert "missing" in body["error"]["message"]
    status, body = await get_json(http, f"{base}/api/queues/missing/peek")
    assert status == 404
    async with http.put(f"{base}/api/queues/q", data=b"not json") as r:
        assert r.status == 400 and "not JSON" in (await r.json())["error"]["message"]
    async with http.put(f"{base}/api/queues/q", json={"max_length": "ten"}) as r:
        assert r.status == 400
    status, body = await get_json(http, f"{base}/api/queues/q/peek?count=0")
    assert status == 400 and "count" in body["error"]["message"]
    status, body = await get_json(http, f"{base}/api/nothing-here")
    assert status == 404 and "error" in body


async def test_message_history_from_the_log(
    admin_broker: BrokerProcess, http: aiohttp.ClientSession
) -> None:
    base = admin_of(admin_broker)
    async with await clients.connect(admin_broker.address) as conn:
        await conn.declare_queue("dlq")
        await conn.declare_queue("hist", dead_letter="dlq")
        await conn.publish_batch("hist", [b"a", b"b"])
        async with conn.consume("hist", prefetch=1) as consumer:
            msg = await consumer.get(timeout=5)
            assert msg is not None and msg.position == 0
            await msg.release()
            msg = await consumer.get(timeout=5)
            assert msg is not None and msg.position == 0
            await msg.reject()
            await wait_stats(conn, "dlq", ready=1)
    status, body = await get_json(http, f"{base}/api/queues/hist/messages/0/history")
    assert status == 200, body
    assert body["complete"] and body["state"] == "gone"
    assert [s["what"] for s in body["steps"]] == [
        "enqueued", "acquired", "released", "acquired", "dead-lettered"
    ]
    acquired = [s for s in body["steps"] if s["what"] == "acquired"]
    # A plain release is a "not now": the second hand-out, no failed delivery before it.
    assert [(s["acquisition"], s["delivery_count"]) for s in acquired] == [(1, 0), (2, 0)]
    released = [s for s in body["steps"] if s["what"] == "released"]
    assert [s["failed"] for s in released] == [False]
    last = body["steps"][-1]
    assert (last["reason"], last["to_queue"], last["to_position"]) == ("rejected", "dlq", 0)
    offsets = [s["offset"] for s in body["steps"]]
    assert offsets == sorted(offsets) and all(s["time_ms"] > 0 for s in body["steps"])


async def test_readyz_is_503_for_a_broker_dropped_from_the_view(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    log_url = f"file:{tmp_path / 'shared-log'}"
    brokers = [
        BrokerProcess(tmp_path / f"node-{i}", log_url=log_url, node_id=f"node-{i}", extra=ADMIN)
        for i in (1, 2, 3)
    ]
    try:
        for b in brokers:
            b.start()
        n1, n2, n3 = brokers
        base = admin_of(n2)
        status, _ = await get_json(http, f"{base}/readyz")
        assert status == 200
        # The owner flag: only the broker whose consumer took the queue owns it.
        async with await clients.connect(n1.address) as conn:
            await conn.declare_queue("owned")
            await conn.publish("owned", b"x")
            async with conn.consume("owned", prefetch=1):
                await wait_stats(conn, "owned", acquired=1)

                async def owners() -> list[float]:
                    flags = []
                    for b in brokers:
                        async with http.get(f"{admin_of(b)}/metrics") as r:
                            flags.append(
                                metric_samples(await r.text(), "baton_queue_owner")["owned"]
                            )
                    return flags

                await eventually(owners, "node-1 alone owns 'owned' on every replica",
                                 until=lambda f: f == [1.0, 0.0, 0.0])
        n2.pause()

        async def dropped() -> bool:
            t = await topology(n1.address)
            return "node-2" not in [i["node_id"] for i in t["instances"]]

        await eventually(dropped, "node-2 dropped from the view", timeout=20)
        # Resumed, it finds itself out of the view and asks to come back in; the
        # others take it back within milliseconds of its first heartbeat, too soon
        # for a probe to catch the 503 in between. So they are held still (for less
        # than their suspicion time) until it has said 503, then let go.
        # Asked while it is stopped: answered once it runs again (200 if before it
        # applied its drop, else 503).
        async def status_now() -> int:
            s, body = await get_json(http, f"{base}/readyz")
            if s == 503:
                assert body["member"] is False and body["reasons"], body
            return s

        request = asyncio.ensure_future(get_json(http, f"{base}/readyz"))
        n1.pause()
        n3.pause()
        try:
            n2.resume()
            assert (await request)[0] in (200, 503)
            await eventually(status_now, "node-2 reports 503", timeout=2, until=lambda s: s == 503)
        finally:
            n1.resume()
            n3.resume()
        await eventually(status_now, "node-2 ready again", timeout=20, until=lambda s: s == 200)
    finally:
        for b in brokers:
            b.stop()


# --- the same over the native protocol, from the command line -----------------------------


def test_cli_peek_connections_and_history(broker: BrokerProcess) -> None:
    addr = broker.address
    r = baton("publish", "--broker", addr, "--declare", "seen", "one", "two", "three")
    assert r.returncode == 0, r.stderr
    r = baton("queue", "peek", "seen", "--count", "2", "--broker", addr, "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(m["position"], m["body"], m["delivery_count"]) for m in rows] == [
        (0, "one", 0), (1, "two", 0)
    ]
    r = baton("queue", "peek", "unknown", "--broker", addr)
    assert r.returncode == 1 and "does not exist" in r.stderr
    with clients.sync.connect(addr) as conn:
        assert conn.queue_stats("seen")["ready"] == 3  # peeking took nothing
        with conn.consume("seen", prefetch=2) as consumer:
            msg = consumer.next(timeout=5)
            msg.ack()
            r = baton("connections", "--broker", addr, "--json")
            assert r.returncode == 0, r.stderr
            listed = json.loads(r.stdout)
            consumers = [c for row in listed for c in row["consumers"]]
            assert [(c["queue"], c["prefetch"]) for c in consumers] == [("seen", 2)]
            assert len(listed) == 2  # this test's connection and the command's own
    r = baton("message", "history", "seen", "0", "--broker", addr, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    h = json.loads(r.stdout)
    assert h["complete"] and h["state"] == "gone"
    assert [s["what"] for s in h["steps"]] == ["enqueued", "acquired", "accepted"]
    r = baton("message", "history", "seen", "0", "--broker", addr)
    assert r.returncode == 0 and "accepted" in r.stdout
    r = baton("message", "history", "seen", "99", "--broker", addr, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "absent"


async def test_history_says_when_retention_removed_the_beginning(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    url = f"file:{tmp_path / 'log'}?segment_bytes=4096"
    b = BrokerProcess(tmp_path / "broker", log_url=url,
                      extra=ADMIN + ["--checkpoint-ms", "300"])
    b.start()
    try:
        base = admin_of(b)
        async with await clients.connect(b.address) as conn:
            await conn.declare_queue("old")
            assert await conn.publish("old", b"first") == 0

            await conn.declare_queue("filler")

            async def log_start() -> int:
                for _ in range(20):  # grow the log past a few segments meanwhile
                    await conn.publish_batch("filler", [b"f" * 200] * 5)
                _, body = await get_json(http, f"{base}/api/log")
                return int(body["start"])

            await eventually(log_start, "the log truncated", timeout=30, until=lambda s: s > 0)
            async with conn.consume("old", prefetch=1) as consumer:
                msg = await consumer.get(timeout=5)
                assert msg is not None and msg.position == 0
                await msg.ack()
        status, h = await get_json(http, f"{base}/api/queues/old/messages/0/history")
        assert status == 200, h
        assert h["complete"] is False and h["log_start"] > 0
        assert "retention" in h["note"]
        assert [s["what"] for s in h["steps"]] == ["accept asked"]
        assert h["state"] == "gone"
    finally:
        b.stop()


async def test_services_handover_and_deregister_through_the_api(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    b = BrokerProcess(tmp_path / "broker", extra=ADMIN + ["--service", "svc"])
    b.start()
    try:
        base = admin_of(b)

        async def svc() -> dict[str, Any]:
            _, body = await get_json(http, f"{base}/api/services")
            return next((s for s in body["services"] if s["service"] == "svc"), {})

        first = await eventually(svc, "the broker leads svc", until=lambda s: s.get("leader"))
        assert first["candidates"] == [first["leader"]]
        async with http.post(f"{base}/api/services/svc/handover", json={}) as r:
            assert r.status == 400, await r.text()  # nobody else to hand over to
        async with http.post(f"{base}/api/services/nope/handover") as r:
            assert r.status == 404
        async with await clients.connect(b.address) as conn:
            leading = asyncio.Event()

            async def lead() -> None:
                async with conn.lead("svc"):
                    leading.set()
                    await asyncio.Event().wait()  # hold the term until cancelled

            task = asyncio.create_task(lead())
            try:
                await eventually(svc, "the session is a candidate",
                                 until=lambda s: len(s.get("candidates", [])) == 2)
                async with http.post(f"{base}/api/services/svc/handover", json={}) as r:
                    assert r.status == 202, await r.text()
                    assert (await r.json())["service"] == "svc"
                await asyncio.wait_for(leading.wait(), 20)
                now_ = await svc()
                session = now_["leader"]
                assert session != first["leader"] and session in now_["candidates"]
                async with http.delete(
                    f"{base}/api/services/svc/candidates/{session}"
                ) as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["was_candidate"] is True
                after = await svc()
                assert session not in after.get("candidates", [])
                async with http.delete(f"{base}/api/services/svc/candidates/x%2Fy") as r:
                    assert r.status == 404
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    finally:
        b.stop()


async def test_closing_a_connection_through_the_api_returns_its_messages(
    admin_broker: BrokerProcess, http: aiohttp.ClientSession
) -> None:
    base = admin_of(admin_broker)
    async with await clients.connect(admin_broker.address) as watcher:
        await watcher.declare_queue("held")
        await watcher.publish_batch("held", [b"m"] * 8)
        victim = await clients.connect(admin_broker.address, failover=False)
        try:
            async with victim.consume("held", prefetch=5):
                await wait_stats(watcher, "held", acquired=5)
                _, listed = await get_json(http, f"{base}/api/consumers")
                [row] = listed["consumers"]
                assert (row["queue"], row["prefetch"], row["held"]) == ("held", 5, 5)
                async with http.delete(f"{base}/api/connections/{row['connection']}") as r:
                    assert r.status == 200 and (await r.json())["closed"] == row["connection"]
                # Its consumer ended with the connection: the messages are back.
                await wait_stats(watcher, "held", acquired=0, ready=8)
                _, listed = await get_json(http, f"{base}/api/consumers")
                assert listed["consumers"] == []
        except clients.ConnectionClosed:
            pass  # the victim's own cancel found its connection closed
        finally:
            await victim.close()
        async with http.delete(f"{base}/api/connections/127.0.0.1:1") as r:
            assert r.status == 404
