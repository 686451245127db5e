"""Exchanges on real brokers (docs/design.md §14): through the native protocol, carried
by a join update and a restart, and dead letters routed through an exchange."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from batonmq import clients
from tests.helpers import drain, equal_digests, eventually, wait_stats
from tests.integration.conftest import BrokerProcess
from tests.integration.test_join import FAST, brokers, checkpoint_agreement, join_done

pytestmark = pytest.mark.integration


async def test_routing_errors_and_dead_letters_on_one_broker(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        for q in ("eu", "us", "all", "dlq-a", "dlq-b"):
            await conn.declare_queue(q)
        assert await conn.declare_exchange("orders", "topic") is True
        assert await conn.declare_exchange("orders", "topic") is False
        with pytest.raises(clients.PreconditionFailed):
            await conn.declare_exchange("orders", "fanout")
        with pytest.raises(clients.ExchangeNotFound):
            await conn.declare_exchange("nope", "topic", passive=True)
        with pytest.raises(clients.errors.AccessRefused):
            await conn.delete_exchange("amq.topic")
        with pytest.raises(clients.ExchangeNotFound):
            await conn.bind_queue("eu", "nope", "k")
        await conn.bind_queue("eu", "orders", "eu.#")
        await conn.bind_queue("us", "orders", "us.*")
        await conn.bind_queue("all", "orders", "#")
        r = await conn.publish_to("orders", "eu.de.berlin", b"o1", {"n": 1})
        assert r.queues == ["eu", "all"] and r.full == [] and r.missing == []
        assert (await conn.publish_to("orders", "us.ny", b"o2")).queues == ["us", "all"]
        assert (await conn.publish_to("orders", "", b"o3")).queues == ["all"]
        assert (await conn.publish_to("", "eu", b"o4")).queues == ["eu"]
        await conn.bind_queue("all", "orders", "#", unbind=True)
        assert (await conn.publish_to("orders", "asia", b"o5")).queues == []  # unroutable

        # Dead letters through a fanout exchange: each rejected message is in both DLQs.
        await conn.declare_exchange("dlx", "fanout")
        await conn.bind_queue("dlq-a", "dlx")
        await conn.bind_queue("dlq-b", "dlx")
        await conn.declare_queue("work", dead_letter_exchange="dlx")
        await conn.publish("work", b"poison", {"h": 1})
        async with conn.consume("work", prefetch=1) as consumer:
            (m,) = await consumer.get_many(1, timeout=10)
            await consumer.reject_many([m], confirm=True)
    for q in ("dlq-a", "dlq-b"):
        (dead,) = await drain(broker.address, q, count=1)
        assert dead.body == b"poison" and dead.headers["h"] == 1
        assert dead.headers["x-death-reason"] == "rejected"
        assert dead.headers["x-death-exchange"] == "dlx"
        assert dead.headers["x-death-routing-key"] == "work"
    assert [m.body for m in await drain(broker.address, "eu", count=2)] == [b"o1", b"o4"]


async def test_a_joiner_and_a_restarted_broker_route_as_the_others(tmp_path: Path) -> None:
    nodes = brokers(tmp_path, f"file:{tmp_path / 'shared-log'}", 2, FAST)
    try:
        nodes[0].start()
        a = nodes[0].address
        async with await clients.connect(a) as conn:
            for q in ("q1", "q2", "q3"):
                await conn.declare_queue(q)
            await conn.declare_exchange("fan", "fanout", auto_delete=True)
            await conn.declare_exchange("hdr", "headers")
            await conn.bind_queue("q1", "fan")
            await conn.bind_queue("q2", "fan")
            await conn.bind_queue("q3", "hdr", "", {"x-match": "any", "kind": "report"})
        # The second broker joins by an update: the exchanges come in its index.
        await asyncio.to_thread(nodes[1].start, 60)
        assert "joining at log offset" in nodes[1].output()
        await eventually(lambda: join_done(nodes[1].address), "the join update to finish",
                         timeout=60)
        b = nodes[1].address
        async with await clients.connect(a) as conn:
            listed = await conn.list_exchanges()
        assert [x["exchange"] for x in listed] == [
            "", "amq.direct", "amq.fanout", "amq.headers", "amq.match", "amq.topic", "fan", "hdr"
        ]
        async with await clients.connect(b) as conn:
            assert await conn.list_exchanges() == listed
            assert (await conn.publish_to("fan", "", b"via-joiner")).queues == ["q1", "q2"]
            assert (await conn.publish_to("hdr", "", b"r", {"kind": "report"})).queues == ["q3"]
            assert await conn.declare_exchange("hdr", "headers") is False
        await equal_digests(nodes)
        await checkpoint_agreement(nodes)

        # A restart (kill -9) loads them from its store.
        nodes[0].kill9()
        nodes[0].restart()
        async with await clients.connect(a) as conn:
            assert (await conn.publish_to("fan", "", b"after-restart")).queues == ["q1", "q2"]
            await wait_stats(conn, "q1", ready=2)
        await equal_digests(nodes)
    finally:
        for n in nodes:
            n.stop()
