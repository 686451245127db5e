"""Logins and the cross-site checks of the admin HTTP listener, on real brokers
(docs/admin.md "Logging in", docs/security.md "The admin listener"): a page of another
local origin in a real Chromium cannot purge a queue (a self-submitting form, a
``no-cors`` fetch), a DNS-rebinding ``Host`` is refused, the API without a login is 401,
a user sees and changes only what its rights allow, a monitoring user reads /metrics and
changes nothing, state changes need the CSRF token or the tool header, a session ends
by logout or idle time, and the listener serves HTTPS with its own certificate."""

from __future__ import annotations

import asyncio
import re
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from batonmq import clients
from batonmq.broker.config import admin_ready_address
from batonmq.loadtest.certs import make_certs
from tests.helpers import eventually
from tests.integration.conftest import BrokerProcess
from tests.integration.test_admin import ADMIN, admin_broker, admin_of, basic
from tests.integration.test_console import browser, open_console, queue_cell, wait_for

pytestmark = pytest.mark.integration

__all__ = ["admin_broker", "browser"]  # the fixtures, imported for these tests

TOOL = {"X-Baton-Request": "1"}
GUEST = {"Authorization": basic("guest", "guest")}


@pytest.fixture
async def raw() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client that sends no login unless told (cookies kept, per host)."""
    jar = aiohttp.CookieJar(unsafe=True)  # cookies of 127.0.0.1 too
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10),
                                     cookie_jar=jar) as s:
        yield s


async def call(http: aiohttp.ClientSession, method: str, url: str,
               headers: dict[str, str] | None = None, **kw: Any) -> tuple[int, Any, Any]:
    """(status, JSON body or text, response headers)."""
    async with http.request(method, url, headers=headers or {}, **kw) as r:
        body = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, body, r.headers


async def stats(address: str, queue: str) -> dict[str, Any]:
    """The queue's stats now (what an admin request changed is applied before it is
    answered)."""
    async with await clients.connect(address) as conn:
        return await conn.queue_stats(queue)


async def _filled(address: str, queue: str, n: int) -> None:
    async with await clients.connect(address) as conn:
        await conn.declare_queue(queue)
        await conn.publish_batch(queue, [b"secret %d" % i for i in range(n)])


# -- a page of another origin, in a real Chromium ---------------------------------------------

ATTACK = """<!DOCTYPE html><html><head><title>attacker</title></head><body>
<form id="f" method="POST" action="{target}" enctype="text/plain">
<input name='{{"x":"' value='"}}'></form>
<script>
fetch("{target}", {{method: "POST", mode: "no-cors", credentials: "include", body: "{{}}"}})
  .then(() => {{ document.title = "fetched"; }}, (e) => {{ document.title = "fetch failed"; }})
  .finally(() => {{ setTimeout(() => document.getElementById("f").submit(), 0); }});
</script></body></html>"""


@pytest.fixture
def attacker(admin_broker: BrokerProcess) -> Iterator[str]:
    """A page served from another local origin (127.0.0.2) that tries to purge the queue
    ``secret`` of the broker's admin listener."""
    page = ATTACK.format(target=f"{admin_of(admin_broker)}/api/queues/secret/purge").encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.2", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.2:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_of_another_origin_cannot_purge_a_queue(
    admin_broker: BrokerProcess, attacker: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    asyncio.run(_filled(admin_broker.address, "secret", 5))
    base = admin_of(admin_broker)
    host = base.removeprefix("http://")
    # The browser holds both kinds of login for the listener: HTTP Basic credentials
    # (a tool's URL opened in it) and a console session.
    open_console(browser, base)
    wait_for(browser, lambda: queue_cell(browser, "secret", "ready") == "5", "the queue")
    browser.get(f"http://guest:guest@{host}/api/overview")
    assert '"node_id"' in browser.find_element(By.TAG_NAME, "body").text

    browser.get(attacker)
    # The no-cors fetch settles, then the form posts and the browser shows the answer.
    wait_for(browser, lambda: browser.current_url.startswith(base), "the form's post")
    answer = browser.find_element(By.TAG_NAME, "body").text
    assert '"error"' in answer and '"purged"' not in answer, answer
    after = asyncio.run(stats(admin_broker.address, "secret"))
    assert after["ready"] == 5 and after["purged"] == 0


# -- Host, Origin, logins ----------------------------------------------------------------------


async def test_a_rebinding_host_is_refused_and_gets_no_data(
    admin_broker: BrokerProcess, raw: aiohttp.ClientSession
) -> None:
    await _filled(admin_broker.address, "secret", 3)
    base = admin_of(admin_broker)
    for path in ("/api/queues", "/api/queues/secret/peek", "/metrics", "/"):
        status, body, _ = await call(raw, "GET", base + path,
                                     {**GUEST, "Host": "attacker.example"})
        assert status == 403, (path, body)
        assert "secret" not in str(body) and "attacker.example" in str(body)
    status, body, _ = await call(raw, "GET", base + "/api/queues",
                                 {**GUEST, "Host": f"localhost:{base.rpartition(':')[2]}"})
    assert status == 200 and [q["queue"] for q in body["queues"]] == ["secret"]
    # The probes answer whatever the Host (they tell nothing about the data).
    status, body, _ = await call(raw, "GET", base + "/healthz", {"Host": "probe.example"})
    assert status == 200 and body["status"] == "ok"
    # A request of another origin: refused even with a good login.
    status, body, _ = await call(raw, "POST", base + "/api/queues/secret/purge",
                                 {**GUEST, **TOOL, "Origin": "http://127.0.0.2:8766"})
    assert status == 403 and "origin" in body["error"]["message"]
    assert (await stats(admin_broker.address, "secret"))["ready"] == 3


async def test_an_allowed_host_name_is_served(tmp_path: Path, raw: aiohttp.ClientSession) -> None:
    b = BrokerProcess(tmp_path / "b", extra=[*ADMIN, "--admin-allowed-hosts", "baton.example"])
    b.start()
    try:
        base = admin_of(b)
        status, body, _ = await call(raw, "GET", base + "/api/overview",
                                     {**GUEST, "Host": "baton.example"})
        assert status == 200 and body["node_id"]
        status, _, _ = await call(raw, "GET", base + "/api/overview",
                                  {**GUEST, "Host": "other.example"})
        assert status == 403
    finally:
        b.stop()


async def test_no_login_or_a_wrong_one_is_401_with_a_basic_challenge(
    admin_broker: BrokerProcess, raw: aiohttp.ClientSession
) -> None:
    base = admin_of(admin_broker)
    for headers in ({}, {"Authorization": basic("guest", "wrong")},
                    {"Authorization": basic("nobody", "guest")},
                    {"Authorization": "Basic !!!"}):
        status, body, h = await call(raw, "GET", base + "/api/queues", headers)
        assert status == 401, (headers, body)
        assert h["WWW-Authenticate"].startswith('Basic realm="baton"')
        assert body["error"]["name"] == "LoginRequired"
    # The console asks with its own header: no browser dialog, its own form.
    status, _, h = await call(raw, "GET", base + "/api/queues", {"X-Baton-Request": "console"})
    assert status == 401 and "WWW-Authenticate" not in h
    # Open: the probes, the console's files (no data), and who is logged in (nobody).
    for path in ("/healthz", "/", "/console/console.js"):
        status, _, h = await call(raw, "GET", base + path)
        assert status == 200, path
        assert h["X-Frame-Options"] == "DENY" and h["X-Content-Type-Options"] == "nosniff"
        assert "frame-ancestors 'none'" in h["Content-Security-Policy"]
    status, body, _ = await call(raw, "GET", base + "/api/session")
    assert (status, body["user"]) == (200, None)
    # Refused logins are logged, at most a line a second, never with a traceback.
    log = admin_broker.log_path.read_text()
    assert "admin login refused from 127.0.0.1" in log and "Traceback" not in log
    r = await asyncio.gather(*(call(raw, "GET", base + "/api/overview",
                                    {"Authorization": basic("guest", f"bad{i}")})
                               for i in range(3)))
    assert [s for s, _, _ in r] == [401] * 3
    topo = await clients_topology(admin_broker.address)
    assert topo["access_refused"]["login"] >= 6


async def clients_topology(address: str) -> dict[str, Any]:
    async with await clients.connect(address) as conn:
        return await conn.topology()


async def test_a_user_sees_and_changes_only_what_its_rights_allow(
    admin_broker: BrokerProcess, raw: aiohttp.ClientSession
) -> None:
    await _filled(admin_broker.address, "secret", 2)
    await _filled(admin_broker.address, "alice.work", 2)
    async with await clients.connect(admin_broker.address) as admin:
        await admin.put_user("alice", "alice-pw")
        await admin.set_permissions("alice", configure=r"alice\..*", read=r"alice\..*")
    base = admin_of(admin_broker)
    alice = {"Authorization": basic("alice", "alice-pw"), **TOOL}
    status, body, _ = await call(raw, "GET", base + "/api/queues", alice)
    assert status == 200 and [q["queue"] for q in body["queues"]] == ["alice.work"]
    for method, path in (("GET", "/api/queues/secret"), ("GET", "/api/queues/secret/peek"),
                         ("POST", "/api/queues/secret/purge"), ("DELETE", "/api/queues/secret"),
                         ("PUT", "/api/queues/bob.q"), ("GET", "/metrics"),
                         ("GET", "/api/connections"), ("GET", "/api/users"),
                         ("POST", "/api/features/enable")):
        status, body, _ = await call(raw, method, base + path, alice, json={})
        assert status == 403 and body["error"]["name"] == "AccessRefused", (path, body)
    status, body, _ = await call(raw, "POST", base + "/api/queues/alice.work/purge", alice)
    assert (status, body) == (200, {"purged": 2})
    assert (await stats(admin_broker.address, "secret"))["ready"] == 2
    # Members' addresses are an admin's (as the native Topology).
    status, body, _ = await call(raw, "GET", base + "/api/nodes", alice)
    assert status == 200 and all(i["address"] == "" for i in body["instances"])


async def test_a_monitoring_user_reads_metrics_and_changes_nothing(
    admin_broker: BrokerProcess, raw: aiohttp.ClientSession
) -> None:
    await _filled(admin_broker.address, "secret", 2)
    async with await clients.connect(admin_broker.address) as admin:
        await admin.put_user("prom", "prom-pw")
        await admin.set_user_tags("prom", ["monitoring"])
        users = {u["name"]: u for u in await admin.list_users()}
        assert users["prom"]["tags"] == ["monitoring"]
    base = admin_of(admin_broker)
    prom = {"Authorization": basic("prom", "prom-pw"), **TOOL}
    status, text, _ = await call(raw, "GET", base + "/metrics", prom)
    assert status == 200 and 'baton_queue_ready_messages{queue="secret"} 2.0' in text
    for path in ("/api/queues", "/api/queues/secret", "/api/connections", "/api/log",
                 "/api/overview"):
        status, _, _ = await call(raw, "GET", base + path, prom)
        assert status == 200, path
    for method, path in (("POST", "/api/queues/secret/purge"), ("GET", "/api/queues/secret/peek"),
                         ("DELETE", "/api/queues/secret"), ("GET", "/api/users")):
        status, body, _ = await call(raw, method, base + path, prom)
        assert status == 403, (path, body)
    assert (await stats(admin_broker.address, "secret"))["ready"] == 2


async def test_state_changes_need_the_tool_header_or_the_sessions_csrf_token(
    admin_broker: BrokerProcess, raw: aiohttp.ClientSession
) -> None:
    await _filled(admin_broker.address, "secret", 4)
    base = admin_of(admin_broker)
    purge = base + "/api/queues/secret/purge"
    status, body, _ = await call(raw, "POST", purge, GUEST)  # Basic, no X-Baton-Request
    assert status == 403 and "X-Baton-Request" in body["error"]["message"]
    # A console session: its cookie is HttpOnly and SameSite=Strict; without its token
    # nothing changes.
    status, body, _ = await call(raw, "POST", base + "/api/login", {"X-Baton-Request": "console"},
                                 json={"user": "guest", "password": "wrong"})
    assert status == 401 and "wrong user name or password" in body["error"]["message"]
    async with raw.post(base + "/api/login", headers={"X-Baton-Request": "console"},
                        json={"user": "guest", "password": "guest"}) as r:
        assert r.status == 200
        who = await r.json()
        cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
    assert who["user"] == "guest" and who["csrf"]
    status, body, _ = await call(raw, "POST", purge)
    assert status == 403 and "X-Baton-CSRF" in body["error"]["message"]
    status, body, _ = await call(raw, "POST", purge, {"X-Baton-CSRF": "not-the-token"})
    assert status == 403
    assert (await stats(admin_broker.address, "secret"))["ready"] == 4
    status, body, _ = await call(raw, "POST", purge, {"X-Baton-CSRF": who["csrf"]})
    assert (status, body) == (200, {"purged": 4})
    # A login without the header (a cross-site form could send one) is refused too.
    status, _, _ = await call(raw, "POST", base + "/api/login",
                              json={"user": "guest", "password": "guest"})
    assert status == 403
    # Logout ends the session: the API refuses the cookie from then on.
    status, body, _ = await call(raw, "POST", base + "/api/logout", {"X-Baton-CSRF": who["csrf"]})
    assert (status, body) == (200, {"logged_out": True})
    status, _, _ = await call(raw, "GET", base + "/api/queues")
    assert status == 401


async def test_a_session_ends_when_idle_too_long(tmp_path: Path, raw: aiohttp.ClientSession) -> None:
    b = BrokerProcess(tmp_path / "b", extra=[*ADMIN, "--admin-session-idle", "1"])
    b.start()
    try:
        base = admin_of(b)
        status, _, _ = await call(raw, "POST", base + "/api/login", {"X-Baton-Request": "c"},
                                  json={"user": "guest", "password": "guest"})
        assert status == 200
        status, body, _ = await call(raw, "GET", base + "/api/session")
        assert body["user"] == "guest"

        async def who() -> Any:
            return (await call(raw, "GET", base + "/api/session"))[1]["user"]

        # Asked only now and then (a request restarts the idle clock).
        await eventually(who, "the idle session ended", until=lambda u: u is None,
                         timeout=10, interval=1.5)
        status, _, _ = await call(raw, "GET", base + "/api/queues")
        assert status == 401
    finally:
        b.stop()


async def test_the_admin_listener_serves_https_with_its_certificate(
    tmp_path: Path, raw: aiohttp.ClientSession
) -> None:
    certs = make_certs(tmp_path)
    b = BrokerProcess(tmp_path / "b", extra=[
        *ADMIN, "--admin-tls-cert", str(certs.cert), "--admin-tls-key", str(certs.key)])
    b.start()
    try:
        lines = b.log_path.read_text(errors="replace").splitlines()
        (host,) = [a for a in map(admin_ready_address, lines) if a is not None][-1:]
        ctx = ssl.create_default_context(cafile=str(certs.ca))
        async with raw.get(f"https://{host}/api/overview", ssl=ctx, headers=GUEST) as r:
            assert r.status == 200 and (await r.json())["node_id"]
        async with raw.post(f"https://{host}/api/login", ssl=ctx,
                            headers={"X-Baton-Request": "console"},
                            json={"user": "guest", "password": "guest"}) as r:
            assert r.status == 200 and "Secure" in r.headers["Set-Cookie"]
        with pytest.raises(aiohttp.ClientError):  # plain HTTP is not served
            async with raw.get(f"http://{host}/healthz") as r:
                await r.read()
    finally:
        b.stop()


async def test_baton_dev_prints_its_consoles_and_the_login_that_opens_them(
    tmp_path: Path, raw: aiohttp.ClientSession
) -> None:
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "batonmq.broker", "dev", "--nodes", "1", "--admin",
         "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "dev")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        loop = asyncio.get_running_loop()
        while not any("log in as guest / guest" in line for line in seen):
            line = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 60)
            assert line, "baton dev ended:\n" + "".join(seen)
            seen.append(line)
        (console,) = [m.group(1) for line in seen
                      if (m := re.search(r"admin console (http://\S+/)", line))]
        status, body, _ = await call(raw, "GET", console + "api/overview", GUEST)
        assert status == 200 and body["node_id"] == "node-1"
        status, _, _ = await call(raw, "GET", console + "api/overview")
        assert status == 401
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()
