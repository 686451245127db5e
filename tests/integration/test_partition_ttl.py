"""A message's own TTL through an exchange whose queues are on several data partitions
(docs/design.md §16, docs/events.md "A message's own TTL"), one real broker on a log of a
control partition and four data partitions: the publish is one FanOut on the lowest
partition, forwarded to the others as ForwardIn, and each message keeps its TTL on every
queue, at home and forwarded: the one with a short TTL expires (never delivered) on each,
the one without stays on each. Native (``ttl``) and AMQP (``expiration``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from batonmq import clients
from tests.helpers import drain, wait_stats
from tests.integration.conftest import BrokerProcess, brokers_of, started
from tests.integration.test_amqp import AMQP, connect
from tests.integration.test_partition_dead_letters import in_flight_settled

pytestmark = pytest.mark.integration

N = 4


@pytest.fixture
def parted(tmp_path: Path) -> Iterator[BrokerProcess]:
    """One broker (native and AMQP) on a file: log of 1 + 4 partitions."""
    brokers = brokers_of(tmp_path, f"file:{tmp_path / 'shared-log'}", 1,
                         ["--partitions", str(N), *AMQP])
    for (b,) in started(brokers):
        yield b


async def _fan(conn: clients.Connection, exchange: str) -> list[str]:
    """A fanout exchange bound to one queue on each data partition; their names."""
    await conn.declare_exchange(exchange, "fanout")
    names = [f"{exchange}{k}" for k in range(1, N + 1)]
    for k, name in enumerate(names, 1):
        await conn.declare_queue(name, partition=k)
        assert (await conn.queue_stats(name))["partition"] == k
        await conn.bind_queue(name, exchange)
    return names


async def _expired_on_every_queue(b: BrokerProcess, names: list[str]) -> None:
    """On each queue, the message with a TTL expired (not delivered), the other stays."""
    async with await clients.connect(b.address, timeout=5) as conn:
        for name in names:
            await wait_stats(conn, name, expired=1, ready=1)
        await in_flight_settled(b.address)
        for name in names:
            got = await drain(b.address, name, idle=0.5)
            assert [m.body for m in got] == [b"stays"], name


async def _native(b: BrokerProcess) -> None:
    async with await clients.connect(b.address, timeout=5) as conn:
        names = await _fan(conn, "fan")
        start = time.monotonic()
        routed = await conn.publish_to("fan", "", b"brief", ttl=0.3)
        assert sorted(routed.queues) == names
        await conn.publish_to("fan", "", b"stays")
        await _expired_on_every_queue(b, names)
        assert time.monotonic() - start >= 0.3


def test_a_native_ttl_is_kept_on_every_partition(parted: BrokerProcess) -> None:
    asyncio.run(asyncio.wait_for(_native(parted), 60))


def test_an_amqp_expiration_is_kept_on_every_partition(parted: BrokerProcess) -> None:
    async def declare() -> list[str]:
        async with await clients.connect(parted.address, timeout=5) as conn:
            return await _fan(conn, "afan")

    names = asyncio.run(asyncio.wait_for(declare(), 30))
    conn = connect(parted)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("afan", "", b"brief", pika.BasicProperties(expiration="300"))
    ch.basic_publish("afan", "", b"stays")
    conn.close()
    asyncio.run(asyncio.wait_for(_expired_on_every_queue(parted, names), 60))
