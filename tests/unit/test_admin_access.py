"""The admin listener's one access check, its JSON errors, and its readiness rule."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from batonmq.broker.admin import READY_MAX_LAG, _guard, access_refusal, readiness
from batonmq.cluster.errors import QueueNotFound
from batonmq.cluster.log import open_log
from batonmq.cluster.node import Node
from batonmq.store.memory import MemoryStore


@pytest.mark.parametrize("peer", ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"])
def test_loopback_peers_are_served(peer: str) -> None:
    assert access_refusal(peer) is None


@pytest.mark.parametrize(
    "peer", ["10.0.0.5", "192.168.1.20", "8.8.8.8", "::ffff:10.1.2.3", "fe80::1", "2001:db8::1"]
)
def test_other_peers_are_refused_with_a_reason(peer: str) -> None:
    refusal = access_refusal(peer)
    assert refusal is not None and "loopback" in refusal and peer in refusal


@pytest.mark.parametrize("peer", [None, "", "not-an-address"])
def test_an_unknown_peer_is_refused(peer: str | None) -> None:
    assert access_refusal(peer) is not None


class _Transport:
    """Just enough of a transport for aiohttp to read the peer's address."""

    def __init__(self, host: str) -> None:
        self.host = host

    def get_extra_info(self, name: str, default: object = None) -> object:
        return (self.host, 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return False


async def _reached(request: web.Request) -> web.StreamResponse:
    return web.json_response({"reached": True})


async def test_a_non_loopback_peer_gets_403_json_and_never_reaches_the_handler() -> None:
    request = make_mocked_request("GET", "/api/overview", transport=_Transport("10.1.2.3"))
    response = await _guard(request, _reached)
    assert isinstance(response, web.Response) and response.status == 403
    assert response.content_type == "application/json"
    body = json.loads(response.text or "")
    assert body["error"]["name"] == "Forbidden" and "10.1.2.3" in body["error"]["message"]


async def test_a_loopback_peer_reaches_the_handler_and_errors_become_json() -> None:
    request = make_mocked_request("GET", "/api/overview", transport=_Transport("127.0.0.1"))
    response = await _guard(request, _reached)
    assert isinstance(response, web.Response) and response.status == 200

    async def missing(request: web.Request) -> web.StreamResponse:
        raise QueueNotFound("queue 'x' does not exist")

    response = await _guard(request, missing)
    assert isinstance(response, web.Response) and response.status == 404
    assert json.loads(response.text or "")["error"]["code"] == QueueNotFound.code


def test_the_broker_package_loads_no_http_or_metrics_library_until_asked() -> None:
    # The admin listener is off by default; its libraries are loaded when it starts.
    code = (
        "import sys, batonmq.broker, batonmq.broker.cli, batonmq.broker.session;"
        "print(sorted(m for m in ('aiohttp', 'prometheus_client') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


async def test_readiness_says_why_a_broker_is_not_ready() -> None:
    log = await open_log("memory:")
    node = Node("n1", log, MemoryStore())
    body = readiness(node, 0)
    assert body["ready"] is False and body["member"] is False
    assert any("member" in r for r in body["reasons"])
    node.joined.set()
    body = readiness(node, 0)  # nothing on the log, nothing applied (-1): caught up
    assert body == {"ready": True, "member": True, "healthy": True, "applied": -1,
                    "log_end": 0, "lag": 0, "apply_stopped": False, "reasons": [], "warnings": []}
    body = readiness(node, READY_MAX_LAG + 5)
    assert body["ready"] is False and body["lag"] == READY_MAX_LAG + 5  # applied is -1
    assert readiness(node, None)["ready"] is False  # the log's end unknown
    node.healthy = False
    body = readiness(node, 0)
    assert body["ready"] is False and body["healthy"] is False
    assert body["reasons"] == ["cannot read or write the log, or write the store"]
    node.health.problem = "log corrupt after offset 7: bad CRC"  # what needs an operator
    assert readiness(node, 0)["reasons"] == ["log corrupt after offset 7: bad CRC"]
    await log.close()
