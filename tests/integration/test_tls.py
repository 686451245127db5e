"""TLS on the client port and on the join update (docs/security.md): brokers with a test
CA's certificate (tests/tlscerts.py), clients that trust it, ones that do not, and
ones that do not speak TLS."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batonmq import clients
from batonmq.cluster.errors import ConnectionClosed
from tests.helpers import eventually
from tests.integration.conftest import REPO, BrokerProcess
from batonmq.loadtest.certs import Certs, make_certs

pytestmark = pytest.mark.integration


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path)


def tls_flags(c: Certs, *more: str) -> list[str]:
    return ["--tls-cert", str(c.cert), "--tls-key", str(c.key), "--tls-ca", str(c.ca), *more]


@pytest.fixture
def tls_broker(tmp_path: Path, certs: Certs) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", extra=tls_flags(certs, "--hello-timeout", "1"))
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _ctx(c: Certs, client_cert: bool = False) -> ssl.SSLContext:
    if client_cert:
        return clients.tls.client_context(str(c.ca), str(c.client_cert), str(c.client_key))
    return clients.tls.client_context(str(c.ca))


async def test_publish_and_consume_over_tls(tls_broker: BrokerProcess, certs: Certs) -> None:
    async with await clients.connect(tls_broker.address, ssl=_ctx(certs)) as conn:
        await conn.declare_queue("q")
        positions = [await conn.publish("q", f"m{i}".encode()) for i in range(20)]
        assert positions == list(range(20))
        got = []
        async with conn.consume("q", prefetch=10) as consumer:
            async for m in consumer:
                got.append(m.body)
                await m.ack()
                if len(got) == 20:
                    break
        assert got == [f"m{i}".encode() for i in range(20)]
    with clients.sync.connect(tls_broker.address, ssl=_ctx(certs)) as sconn:
        assert sconn.queue_stats("q")["ready"] == 0
    assert "(TLS)" in tls_broker.output()


async def test_a_plaintext_client_is_told_the_broker_expects_tls(
    tls_broker: BrokerProcess, certs: Certs
) -> None:
    with pytest.raises(ConnectionClosed, match=r"expects TLS.*use --tls-ca / ssl="):
        await clients.connect(tls_broker.address, timeout=5)

    async def logged() -> bool:
        return "handshake" in tls_broker.output().lower()

    await eventually(logged, "the broker logs the refused plaintext connection")
    assert "Traceback" not in tls_broker.output()
    # The broker goes on serving TLS clients.
    async with await clients.connect(tls_broker.address, ssl=_ctx(certs)) as conn:
        await conn.ping()


async def test_a_client_with_another_ca_is_refused(
    tls_broker: BrokerProcess, tmp_path: Path
) -> None:
    other = make_certs(tmp_path, "other")
    with pytest.raises(ConnectionClosed, match="CERTIFICATE_VERIFY_FAILED"):
        await clients.connect(tls_broker.address, ssl=_ctx(other), timeout=5)
    # System defaults do not know the test CA either.
    with pytest.raises(ConnectionClosed, match="CERTIFICATE_VERIFY_FAILED"):
        await clients.connect(tls_broker.address, ssl=True, timeout=5)


async def test_verify_clients_wants_a_client_certificate(tmp_path: Path, certs: Certs) -> None:
    b = BrokerProcess(tmp_path / "broker", extra=tls_flags(certs, "--tls-verify-clients"))
    b.start()
    try:
        async with await clients.connect(b.address, ssl=_ctx(certs, client_cert=True)) as conn:
            await conn.declare_queue("q")
        # Without a certificate the handshake (TLS 1.3: the first read) fails.
        with pytest.raises(ConnectionClosed):
            await clients.connect(b.address, ssl=_ctx(certs), timeout=5)
        # A client certificate from another CA is refused too.
        other = make_certs(tmp_path, "other")
        with pytest.raises(ConnectionClosed):
            await clients.connect(b.address, ssl=_ctx(other, client_cert=True), timeout=5)
        assert "Traceback" not in b.output()
    finally:
        b.stop()


def test_cli_commands_take_tls_ca(tls_broker: BrokerProcess, certs: Certs) -> None:
    def baton(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "batonmq.broker", *argv],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )

    ok = baton("--tls-ca", str(certs.ca), "queue", "declare", "q", "--broker", tls_broker.address)
    assert ok.returncode == 0, ok.stderr
    ok = baton("--tls-ca", str(certs.ca), "health", "--broker", tls_broker.address)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    plain = baton("queues", "--broker", tls_broker.address)
    assert plain.returncode == 1
    assert "expects TLS" in plain.stderr and "Traceback" not in plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 1, plain.stderr
    missing = baton("--tls-ca", "/nonexistent/ca.pem", "queues", "--broker", tls_broker.address)
    assert missing.returncode == 1 and "no such file" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr


async def test_a_tls_client_to_a_plaintext_broker_fails_clearly(
    broker: BrokerProcess, certs: Certs
) -> None:
    with pytest.raises(ConnectionClosed) as info:
        await clients.connect(broker.address, ssl=_ctx(certs), timeout=5)
    assert "SSL" in str(info.value) or "TLS" in str(info.value)

    async def logged() -> bool:
        return "a TLS client on a port without TLS" in broker.output()

    await eventually(logged, "the broker logs the TLS client in one line")
    assert "Traceback" not in broker.output()


async def test_a_broker_joins_a_tls_cluster_by_an_update_over_tls(
    tmp_path: Path, certs: Certs
) -> None:
    url = f"file:{tmp_path / 'shared-log'}"
    flags = tls_flags(certs, "--tls-verify-clients", "--checkpoint-ms", "500")
    first = BrokerProcess(tmp_path / "node-1", log_url=url, node_id="node-1", extra=flags)
    second = BrokerProcess(
        tmp_path / "node-2", log_url=url, node_id="node-2", extra=[*flags, "--join", "update"]
    )
    ctx = _ctx(certs, client_cert=True)
    try:
        first.start()
        async with await clients.connect(first.address, ssl=ctx) as conn:
            await conn.declare_queue("q")
            await conn.publish_batch("q", [(f"m{i}".encode(), {}) for i in range(500)])
        second.start()

        async def joined() -> dict[str, Any] | None:
            async with await clients.connect(second.address, ssl=ctx) as c:
                top = await c.topology()
            j = top.get("join")
            return top if top["member"] and j is not None and "seconds" in j else None

        top = await eventually(joined, "the second broker's join update", timeout=60)
        assert top is not None and top["join"].get("messages", 500) >= 0
        assert "serving a join update" in first.output()
        async with await clients.connect(second.address, ssl=ctx) as c:
            assert (await c.queue_stats("q"))["ready"] == 500
        # A failover reconnects by TLS too.
        async with await clients.connect(
            [first.address, second.address], ssl=ctx, failover_timeout=30
        ) as c:
            assert c.address == first.address
            await c.publish("q", b"before")
            first.kill9()
            await c.publish("q", b"after")  # sent again to the second broker, over TLS
            assert c.failovers == 1 and c.address == second.address
            assert (await c.queue_stats("q"))["ready"] == 502
        assert "Traceback" not in first.output() + second.output()
    finally:
        second.stop()
        first.stop()


def test_tls_settings_mistakes_are_one_line(tmp_path: Path, certs: Certs) -> None:
    def serve(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "batonmq.broker", "serve", "--data-dir",
             str(tmp_path / "d"), "--listen", "127.0.0.1:0", *flags],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )

    cases = {
        ("--tls-cert", str(certs.cert)): "tls_cert and tls_key",
        ("--tls-cert", str(certs.cert), "--tls-key", "/nonexistent.key"): "no such file",
        ("--tls-cert", str(certs.ca), "--tls-key", str(certs.key)): "cannot be used",
        ("--tls-verify-clients",): "need tls_cert",
    }
    for flags, says in cases.items():
        done = serve(*flags)
        assert done.returncode != 0 and says in done.stderr, (flags, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr


def test_plaintext_bytes_to_a_tls_port_do_not_crash_the_broker(
    tls_broker: BrokerProcess,
) -> None:
    host, _, port = tls_broker.address.rpartition(":")
    for _ in range(5):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"\x00\x00\x00\x05garbage")
            s.settimeout(5)
            try:
                while s.recv(4096):
                    pass
            except OSError:
                pass
    assert tls_broker.proc is not None and tls_broker.proc.poll() is None
    assert "Traceback" not in tls_broker.output()
