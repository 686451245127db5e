"""Exchange-to-exchange bindings (flag ``exchange_bindings``) on real ``baton serve``
processes: pika's and aio-pika's ``Exchange.Bind`` / ``Unbind`` (routing through the
edges of every type, a queue reached by several paths getting a message once, a cycle,
deletes and auto-deletes), the same through a 3-broker cluster, the native client, the
CLI and the admin API, and a cluster upgraded from a build without the flag: refused
with 540 and not advertised until the flag is enabled (docs/amqp.md)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import pika
import pika.exceptions
import pytest

from batonmq import clients
from tests.helpers import eventually_sync
from tests.integration.conftest import BrokerProcess
from tests.integration.older_build import LACKING, MODULE
from tests.integration.test_admin import ADMIN, TOOL_HEADERS, admin_of
from tests.integration.test_amqp import AMQP, amqp_port, connect
from tests.integration.test_amqp_aio import amqp_cluster, url  # noqa: F401 (a fixture)
from tests.integration.test_cli import baton
from tests.integration.test_features_ops import one_line_error

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("xbind") / "broker", extra=AMQP + ADMIN)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _get_all(ch: Any, queue: str, want: int, timeout: float = 5.0) -> list[bytes]:
    """Get (auto-acked) until ``want`` messages came or the time is up; then one more
    look, so that a copy too many is seen."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.02)
            continue
        got.append(body)
    method, _, body = ch.basic_get(queue, auto_ack=True)
    if method is not None:
        got.append(body)
    return got


def _exchange(b: BrokerProcess, name: str) -> dict[str, Any] | None:
    r = baton("exchange", "list", "--json", "--broker", b.address)
    assert r.returncode == 0, r.stderr
    return next((x for x in json.loads(r.stdout) if x["exchange"] == name), None)


def test_pika_routes_through_exchange_bindings_of_every_type(broker: BrokerProcess) -> None:
    conn = connect(broker)
    assert conn._impl.server_capabilities["exchange_exchange_bindings"] is True
    ch = conn.channel()
    ch.confirm_delivery()
    for q in ("xb-t", "xb-d", "xb-h"):
        ch.queue_declare(q)
    ch.exchange_declare("xb-src", "topic")
    ch.exchange_declare("xb-fan", "fanout", internal=True)  # reached only through a binding
    ch.exchange_declare("xb-dir", "direct")
    ch.exchange_declare("xb-hdr", "headers")
    ch.exchange_bind("xb-fan", "xb-src", "order.#")
    ch.exchange_bind("xb-dir", "xb-fan")
    ch.exchange_bind("xb-hdr", "xb-src", "#")
    ch.queue_bind("xb-t", "xb-src", "order.*")
    ch.queue_bind("xb-d", "xb-dir", "order.eu")
    ch.queue_bind("xb-h", "xb-hdr", arguments={"x-match": "any", "vip": True})
    ch.basic_publish("xb-src", "order.eu", b"1", mandatory=True)
    ch.basic_publish("xb-src", "order.us", b"2", pika.BasicProperties(headers={"vip": True}),
                     mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("xb-src", "stock.x", b"3", mandatory=True)  # no edge nor queue matches
    assert _get_all(ch, "xb-t", 2) == [b"1", b"2"]
    assert _get_all(ch, "xb-d", 1) == [b"1"]
    assert _get_all(ch, "xb-h", 1) == [b"2"]
    # Unbound: the edge is gone; unbinding it again (or from what is not there) is Unbind-Ok.
    ch.exchange_unbind("xb-fan", "xb-src", "order.#")
    ch.exchange_unbind("xb-fan", "xb-src", "order.#")
    ch.exchange_unbind("xb-fan", "no-such-exchange")
    ch.basic_publish("xb-src", "order.eu", b"4")
    assert _get_all(ch, "xb-t", 1) == [b"4"] and _get_all(ch, "xb-d", 0) == []
    conn.close()
    assert "Traceback" not in broker.output()


def test_a_queue_reached_by_several_paths_and_a_cycle_get_one_copy(broker: BrokerProcess) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("cy-q")
    for x in ("cy-a", "cy-b", "cy-c"):
        ch.exchange_declare(x, "fanout")
    # a -> b -> c -> a, and the queue bound to all three
    ch.exchange_bind("cy-b", "cy-a")
    ch.exchange_bind("cy-c", "cy-b")
    ch.exchange_bind("cy-a", "cy-c")
    ch.exchange_bind("cy-a", "cy-a")
    for x in ("cy-a", "cy-b", "cy-c"):
        ch.queue_bind("cy-q", x)
    for x in ("cy-a", "cy-b", "cy-c"):
        ch.basic_publish(x, "", x.encode())
    assert sorted(_get_all(ch, "cy-q", 3)) == [b"cy-a", b"cy-b", b"cy-c"]
    conn.close()


def test_errors_deletes_and_auto_delete(broker: BrokerProcess) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.exchange_declare("er-src", "fanout")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_bind("er-missing", "er-src")
    assert info.value.reply_code == 404
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_bind("er-src", "")
    assert info.value.reply_code == 403
    ch = conn.channel()
    # Deleting a destination removes the bindings to it; if-unused counts bindings from it.
    ch.exchange_declare("er-dst", "fanout")
    ch.exchange_bind("er-dst", "er-src")
    assert _exchange(broker, "er-src")["exchange_bindings"] == [  # type: ignore[index]
        {"destination": "er-dst", "routing_key": "", "arguments": {}}
    ]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_delete("er-src", if_unused=True)
    assert info.value.reply_code == 406
    ch = conn.channel()
    ch.exchange_delete("er-dst", if_unused=True)  # bound *to*, not from: unused
    assert _exchange(broker, "er-src")["exchange_bindings"] == []  # type: ignore[index]
    # An auto-delete source goes with its last binding, to a queue or an exchange.
    ch.exchange_declare("er-auto", "fanout", auto_delete=True)
    ch.exchange_declare("er-dst", "fanout")
    ch.exchange_bind("er-dst", "er-auto")
    ch.exchange_unbind("er-dst", "er-auto")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare("er-auto", "fanout", passive=True)
    assert info.value.reply_code == 404
    conn.close()
    assert "Traceback" not in broker.output()


async def test_aio_pika_binds_exchanges_with_and_without_nowait(broker: BrokerProcess) -> None:
    conn = await aio_pika.connect(url(broker))
    async with conn:
        ch = await conn.channel()
        src = await ch.declare_exchange("aio-src", aio_pika.ExchangeType.DIRECT)
        dst = await ch.declare_exchange("aio-dst", aio_pika.ExchangeType.FANOUT)
        q = await ch.declare_queue("aio-q")
        await q.bind(dst)
        await dst.bind(src, "k")
        await src.publish(aio_pika.Message(b"through"), "k")
        await src.publish(aio_pika.Message(b"not-k"), "other")
        msg = await q.get(timeout=5)
        assert msg is not None and msg.body == b"through"
        await msg.ack()
        await dst.unbind(src, "k")
        # nowait: no Bind-Ok comes; the channel's next method is ordered after it
        raw = await ch.get_underlay_channel()
        await raw.exchange_bind("aio-dst", "aio-src", "n", nowait=True)
        await src.publish(aio_pika.Message(b"nowait"), "n")
        msg = await q.get(timeout=5)
        assert msg is not None and msg.body == b"nowait"
        await msg.ack()
        assert await q.get(fail=False) is None


async def test_a_cluster_routes_through_a_binding_made_on_another_broker(
    amqp_cluster: list[BrokerProcess],  # noqa: F811
) -> None:
    b1, b2, b3 = amqp_cluster
    binder = await aio_pika.connect(url(b1))
    publisher = await aio_pika.connect(url(b2))
    reader = await aio_pika.connect(url(b3))
    async with binder, publisher, reader:
        ch1 = await binder.channel()
        src = await ch1.declare_exchange("cl-src", aio_pika.ExchangeType.TOPIC, durable=True)
        dst = await ch1.declare_exchange("cl-dst", aio_pika.ExchangeType.FANOUT, durable=True)
        q = await ch1.declare_queue("cl-q", durable=True, arguments={"x-queue-type": "quorum"})
        await q.bind(dst)
        await dst.bind(src, "eu.#")
        await q.bind(src, "#")  # a second path to the same queue
        ch2 = await publisher.channel(publisher_confirms=True, on_return_raises=True)

        async def bound() -> bool:
            ex = await ch2.get_exchange("cl-src")
            await ex.publish(aio_pika.Message(b"probe"), "eu.de", mandatory=True)
            return True

        # (b2 routes with what it has applied: the binding arrives there by the log)
        deadline = time.monotonic() + 10
        while True:
            try:
                await bound()
                break
            except aio_pika.exceptions.DeliveryError:
                assert time.monotonic() < deadline, "b2 never routed through the binding"
        pub = await ch2.get_exchange("cl-src")
        for i in range(5):
            await pub.publish(aio_pika.Message(f"m{i}".encode()), "eu.fr")
        ch3 = await reader.channel()
        q3 = await ch3.get_queue("cl-q")
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < 6 and time.monotonic() < deadline:
            m = await q3.get(fail=False, no_ack=True)
            if m is None:
                await asyncio.sleep(0.05)
                continue
            got.append(m.body)
        assert await q3.get(fail=False) is None  # one copy each, though two paths lead there
        assert got == [b"probe"] + [f"m{i}".encode() for i in range(5)]


async def test_native_client_cli_and_admin_api(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("na-q")
        await conn.declare_exchange("na-src", "topic")
        await conn.declare_exchange("na-dst", "direct")
        await conn.bind_queue("na-q", "na-dst", "a.b")
        assert await conn.bind_exchange("na-dst", "na-src", "a.*") is True
        assert await conn.bind_exchange("na-dst", "na-src", "a.*") is False
        assert (await conn.publish_to("na-src", "a.b", b"x")).queues == ["na-q"]
        with pytest.raises(clients.ExchangeNotFound):
            await conn.bind_exchange("na-dst", "nope")
        assert await conn.bind_exchange("na-dst", "na-src", "a.*", unbind=True) is True
        assert (await conn.publish_to("na-src", "a.b", b"y")).queues == []
    # CLI
    r = baton("binding", "add", "na-dst", "--from-exchange", "na-src", "--routing-key", "c.#",
              "--broker", broker.address)
    assert r.returncode == 0 and "binding na-src -> exchange na-dst ('c.#') added" in r.stderr, r
    r = baton("binding", "list", "--exchange", "na-src", "--json", "--broker", broker.address)
    assert json.loads(r.stdout) == [
        {"exchange": "na-src", "destination": "na-dst", "routing_key": "c.#", "arguments": {}}
    ]
    r = baton("binding", "list", "--exchange", "na-src", "--broker", broker.address)
    assert "-> na-dst" in r.stdout
    r = baton("binding", "remove", "na-dst", "--from-exchange", "na-src", "--routing-key", "c.#",
              "--broker", broker.address)
    assert r.returncode == 0 and "removed" in r.stderr
    assert "not both" in one_line_error(baton(
        "binding", "add", "na-dst", "na-src", "--from-exchange", "na-src",
        "--broker", broker.address))
    # The admin API, RabbitMQ's paths without the vhost
    base = admin_of(broker)
    async with aiohttp.ClientSession(headers=TOOL_HEADERS,
                                     timeout=aiohttp.ClientTimeout(total=10)) as http:
        path = f"{base}/api/bindings/e/na-src/e/na-dst"
        async with http.post(path, json={"routing_key": "d.#"}) as resp:
            assert resp.status == 200 and await resp.json() == {"changed": True}
        async with http.get(f"{base}/api/exchanges") as resp:
            rows = {x["exchange"]: x for x in (await resp.json())["exchanges"]}
        assert rows["na-src"]["exchange_bindings"] == [
            {"destination": "na-dst", "routing_key": "d.#", "arguments": {}}
        ]
        async with http.post(f"{base}/api/bindings/e/na-src/q/na-q", json={"routing_key": "q"}) as resp:
            assert resp.status == 200
        async with http.delete(path, json={"routing_key": "d.#"}) as resp:
            assert resp.status == 200 and await resp.json() == {"changed": True}
        async with http.post(f"{base}/api/bindings/e/nope/e/na-dst") as resp:
            assert resp.status == 404
        async with http.post(path, json={"routing_key": 1}) as resp:
            assert resp.status == 400
    assert "Traceback" not in broker.output()


def test_a_cluster_upgraded_from_a_build_without_the_flag(tmp_path: Path) -> None:
    """Made by a build without the flag: after a restart on this build, Exchange.Bind is
    refused with 540 and the capability not advertised, until the flag is enabled."""
    b = BrokerProcess(tmp_path / "broker", extra=AMQP, module=MODULE)
    b.start()
    b.stop()
    b = BrokerProcess(tmp_path / "broker", extra=AMQP)
    b.start()
    try:
        conn = connect(b)
        assert conn._impl.server_capabilities["exchange_exchange_bindings"] is False
        ch = conn.channel()
        ch.exchange_declare("up-src", "fanout", durable=True)
        ch.exchange_declare("up-dst", "fanout", durable=True)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            ch.exchange_bind("up-dst", "up-src")
        assert info.value.reply_code == 540 and LACKING in info.value.reply_text
        assert LACKING in one_line_error(baton(
            "binding", "add", "up-dst", "--from-exchange", "up-src", "--broker", b.address))
        r = baton("feature", "enable", LACKING, "--broker", b.address)
        assert r.returncode == 0, r.stderr
        conn = eventually_sync(
            lambda: (c if (c := connect(b))._impl.server_capabilities[
                "exchange_exchange_bindings"] else c.close()),
            "the capability once the flag is enabled",
        )
        ch = conn.channel()
        ch.exchange_bind("up-dst", "up-src")
        ch.queue_declare("up-q", durable=True)
        ch.queue_bind("up-q", "up-dst")
        conn.close()
        # A restart keeps the binding (the exchange table in the store).
        b.stop()
        b.start()
        src = _exchange(b, "up-src")
        assert src is not None and src["exchange_bindings"] == [
            {"destination": "up-dst", "routing_key": "", "arguments": {}}
        ]
        conn = connect(b)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("up-src", "", b"after a restart", mandatory=True)
        assert _get_all(ch, "up-q", 1) == [b"after a restart"]
        conn.close()
        assert "Traceback" not in b.output()
    finally:
        b.stop()
