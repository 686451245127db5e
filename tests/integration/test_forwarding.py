"""Forwarding between brokers (docs/design.md §16, "Forwarding between brokers"): real
brokers of a split log whose data partitions each have a replica group of two, so one of
three brokers applies neither partition. A native client and an AMQP client (pika) of that
broker declare, publish, purge and delete through it (a replica appends for it, over a
peer link); its consumers are relayed to a replica (native and AMQP, and a broken link
ends them), an AMQP Basic.Get is refused with one sentence naming the replicas; the metrics
count on it and not on a replica; a restart (a new runtime that replayed control and
records its key first) forwards again; and killing the replica it forwards to makes it
pick the other, losing and doubling no confirmed publish. Peer links go over TLS, with
client certificates, as the join update does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import aio_pika
import aiohttp
import pika
import pytest

from batonmq import clients
from batonmq.cluster.errors import NotReplica, QueueNotFound
from batonmq.loadtest.certs import make_certs
from tests.helpers import eventually, now, topology, wait_stats
from tests.integration.conftest import BrokerProcess, brokers_of, started
from tests.integration.test_admin import TOOL_HEADERS, admin_of, metric_samples
from tests.integration.test_amqp import amqp_port
from tests.integration.test_tls import tls_flags

pytestmark = pytest.mark.integration

#: Two data partitions, groups of two, and no replacement of a dead broker within a test.
GROUPS = ["--partitions", "2", "--replicas", "2", "--replace-after-ms", "600000"]


@pytest.fixture
def grouped(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    extra = [*GROUPS, "--admin-listen", "127.0.0.1:0", "--amqp-listen", "127.0.0.1:0"]
    yield from started(brokers_of(tmp_path, f"file:{tmp_path / 'shared-log'}", 3, extra))


async def _outsider(
    brokers: list[BrokerProcess], k: int = 1, ssl: Any = None
) -> tuple[BrokerProcess, list[BrokerProcess]]:
    """A broker outside data partition ``k``'s replica group, and the group's two
    brokers (once the group has settled: two live replicas, none joining)."""

    async def group() -> list[str] | None:
        async with await clients.connect(brokers[0].address, timeout=5, ssl=ssl) as c:
            groups = (await c.topology()).get("groups") or []
        g = next((g for g in groups if g["partition"] == k), None)
        if g is None or not g["replicas"] or len(g["replicas"]) != 2 or g["joining"]:
            return None
        return list(g["replicas"]) if g["live_replicas"] == 2 else None

    replicas = await eventually(group, f"data partition {k}'s group settled", timeout=60)
    assert replicas is not None
    out = next(b for b in brokers if b.node_id not in replicas)
    return out, [b for b in brokers if b.node_id in replicas]


async def _forwarded(http: aiohttp.ClientSession, b: BrokerProcess) -> dict[str, float]:
    async with http.get(f"{admin_of(b)}/metrics") as r:
        text = await r.text()
    out = {f"kind={k}": v for k, v in _by(text, "baton_forwarded", "kind").items()}
    out["errors"] = metric_samples(text, "baton_forward_errors")[""]
    return out


def _pika(b: BrokerProcess) -> pika.BlockingConnection:
    """A blocking pika connection to ``b``'s AMQP listener (one attempt)."""
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", amqp_port(b), connection_attempts=1))


def _by(text: str, name: str, label: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels[label]: s.value for s in family.samples if s.name.endswith("_total")}
    raise AssertionError(f"no metric {name}")


async def test_a_broker_outside_the_group_serves_native_and_amqp_clients(
    grouped: list[BrokerProcess],
) -> None:
    outsider, replicas = await _outsider(grouped)
    conn = await clients.connect(outsider.address, timeout=5, route=False)
    assert (await conn.declare_queue("fq", partition=1))["created"]
    positions = [await conn.publish("fq", b"native-%02d" % i) for i in range(20)]
    assert positions == list(range(20))
    await conn.publish_batch("fq", [b"batch-%02d" % i for i in range(10)])

    # AMQP on the same broker: the declare (same settings) and confirmed publishes.
    def amqp_side() -> str:
        pc = _pika(outsider)
        try:
            ch = pc.channel()
            ch.queue_declare("fq", durable=True)
            ch.confirm_delivery()
            for i in range(20):
                ch.basic_publish("", "fq", b"amqp-%02d" % i, mandatory=True)
            # A Basic.Get is relayed: one message, given back here.
            method, _props, body = ch.basic_get("fq")
            assert method is not None
            ch.basic_nack(method.delivery_tag, requeue=True)
            return bytes(body)
        finally:
            pc.close()

    assert (await asyncio.to_thread(amqp_side)).startswith(b"native-")

    # Its stats are read where it is.
    with pytest.raises(NotReplica, match="ask one of its replicas"):
        await conn.queue_stats("fq")
    with pytest.raises(NotReplica, match="ask one of its replicas"):
        await conn.peek("fq", 5)

    # A consumer here is served by a replica, relayed: acks, a release and a cancel go
    # back to it; this broker appends no Interest on the partition (the owner and the
    # interested brokers are replicas).
    got: list[bytes] = []
    outsider_runtime = (await topology(outsider.address))["runtime"]
    replica_runtimes = [(await topology(r.address))["runtime"] for r in replicas]
    async with await clients.connect(replicas[1].address, timeout=5) as rc:
        async with conn.consume("fq", prefetch=10) as consumer:
            while len(got) < 30:
                batch = await consumer.get_many(10, timeout=10)
                assert batch, f"{len(got)} of 30 through the relay"
                got += [m.body for m in batch]
                await consumer.ack_many(batch)
            stats = await rc.queue_stats("fq")
            assert stats["owner"] is not None, stats
            for member in [stats["owner"], *stats["interested"]]:
                assert outsider_runtime not in member, stats
                assert any(r in member for r in replica_runtimes), stats
            again = await consumer.get(timeout=10)
            assert again is not None
            await again.release()
        # The release and the cancel gave back what the relayed consumer held.
        await wait_stats(rc, "fq", timeout=10, ready=50 - len(got), acquired=0)
        # The rest from the replica itself: each message once in all.
        async with rc.consume("fq", prefetch=50) as consumer:
            while len(got) < 50:
                batch = await consumer.get_many(50, timeout=10)
                assert batch, f"{len(got)} of 50"
                got += [m.body for m in batch]
                await consumer.ack_many(batch)
    assert sorted(got) == sorted(
        [b"native-%02d" % i for i in range(20)] + [b"batch-%02d" % i for i in range(10)]
        + [b"amqp-%02d" % i for i in range(20)]
    )

    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=10), headers=TOOL_HEADERS
    ) as http:
        here = await _forwarded(http, outsider)
        assert here["kind=declare"] >= 2 and here["kind=publish"] >= 3, here
        assert here["errors"] == 0, here
        for r in replicas:
            there = await _forwarded(http, r)
            assert there == {"errors": 0}, there  # nothing forwarded by a replica

    # Purge and delete go through too; the replicas apply them.
    await conn.publish("fq", b"left")
    assert await conn.purge_queue("fq") == 1
    await conn.delete_queue("fq")
    async with await clients.connect(replicas[0].address, timeout=5) as rc:
        await eventually(lambda: _gone(rc, "fq"), "fq deleted on the replicas", timeout=10)
    await conn.close()

    # Restarted, it is a new runtime that replayed control (no Join of its own): it
    # records its key, then forwards again.
    await asyncio.to_thread(outsider.terminate)
    await asyncio.to_thread(outsider.restart)
    async with await clients.connect(outsider.address, timeout=5, route=False) as c:
        await c.declare_queue("again", partition=1)
        assert await c.publish("again", b"after a restart") == 0
    assert "recording its member key on control" in outsider.output_since(b"== test: start 2")
    assert "Traceback" not in outsider.output()


async def _gone(conn: clients.Connection, queue: str) -> bool:
    try:
        await conn.queue_stats(queue)
    except QueueNotFound:
        return True
    return False


@pytest.fixture
def grouped_plain(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    yield from started(brokers_of(tmp_path, f"file:{tmp_path / 'shared-log'}", 3, GROUPS))


async def test_killing_the_replica_it_forwards_to_makes_a_broker_pick_another(
    grouped_plain: list[BrokerProcess],
) -> None:
    outsider, replicas = await _outsider(grouped_plain)
    conn = await clients.connect(outsider.address, timeout=5, route=False)
    await conn.declare_queue("kq", partition=1)
    # The partition's leader is the replica it forwards to first.
    rows = (await topology(replicas[0].address))["partitions"]
    row = next(r for r in rows if r["partition"] == 1)
    leader = row["leader"].split("/")[0]
    victim = next(r for r in replicas if r.node_id == leader)
    survivor = next(r for r in replicas if r is not victim)

    confirmed: set[bytes] = set()
    failed: list[str] = []

    async def publisher(n: int) -> None:
        for i in range(150):
            body = b"p%d-%03d" % (n, i)
            try:
                await conn.publish("kq", body)
            except clients.BatonError as exc:
                failed.append(f"{body!r}: {exc!r}")
            else:
                confirmed.add(body)

    async def kill_midway() -> None:
        await eventually(lambda: now(len(confirmed) >= 100), "100 confirmed",
                         timeout=30)
        await asyncio.to_thread(victim.kill9)

    # A consumer of the broker outside the group, relayed to the leader: it holds a few.
    held = await clients.connect(outsider.address, timeout=5, route=False)
    relayed = held.consume("kq", prefetch=5)
    await relayed.__aenter__()

    async def hold_some() -> None:
        await eventually(lambda: now(len(confirmed) >= 20), "20 confirmed", timeout=30)
        assert len(await relayed.get_many(5, timeout=10)) >= 1

    await asyncio.gather(*(publisher(n) for n in range(4)), kill_midway(), hold_some())
    assert len(confirmed) >= 500, failed  # re-picked: the publishes after the kill went on
    out = outsider.output()
    assert "trying another replica" in out, out[-3000:]
    # Its link to the dead replica broke: the relayed consumer ends, retriable.
    with pytest.raises(clients.ConnectionClosed):
        while True:
            await relayed.get(timeout=10)
    await held.close()

    async with await clients.connect(survivor.address, timeout=5) as rc:
        seen: set[bytes] = set()
        async with rc.consume("kq", prefetch=200) as consumer:
            while not confirmed <= seen:
                batch = await consumer.get_many(200, timeout=10)
                assert batch, f"{len(confirmed - seen)} confirmed publishes missing"
                for m in batch:
                    assert m.body not in seen, f"{m.body!r} twice"
                    seen.add(m.body)
                await consumer.ack_many(batch)
            assert await consumer.get(timeout=1) is None  # and nothing more
    await conn.close()


async def test_a_peer_link_goes_over_tls_with_client_certificates(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    flags = [*GROUPS, *tls_flags(certs, "--tls-verify-clients")]
    brokers = brokers_of(tmp_path, f"file:{tmp_path / 'shared-log'}", 3, flags)
    ctx = clients.tls.client_context(str(certs.ca), str(certs.client_cert), str(certs.client_key))
    try:
        for b in brokers:
            await asyncio.to_thread(b.start)

        out, _ = await _outsider(brokers, 2, ctx)
        async with await clients.connect(out.address, ssl=ctx, route=False) as c:
            await c.declare_queue("tq", partition=2)
            assert [await c.publish("tq", b"m%d" % i) for i in range(5)] == list(range(5))
        assert "peer link to 127.0.0.1:" in out.output()
        assert "Traceback" not in out.output()
    finally:
        for b in brokers:
            b.stop()


async def test_an_amqp_consumer_of_a_broker_outside_the_group_is_relayed(
    grouped: list[BrokerProcess],
) -> None:
    """pika on a broker outside the queue's group consumes it (relayed to a replica):
    manual acks, nacks with requeue seen again redelivered, a no_ack consumer, a cancel
    and a channel close that leave no consumer on the replica."""
    outsider, replicas = await _outsider(grouped)
    async with await clients.connect(outsider.address, timeout=5, route=False) as conn:
        await conn.declare_queue("aq", partition=1)
    total = 300

    def consume_acked() -> tuple[list[bytes], int]:
        pc = _pika(outsider)
        try:
            ch = pc.channel()
            ch.confirm_delivery()
            for i in range(total):
                ch.basic_publish("", "aq", b"m-%03d" % i, mandatory=True)
            ch.basic_qos(prefetch_count=40)
            acked: list[bytes] = []
            nacked: set[bytes] = set()
            seen_again = 0
            for method, _props, body in ch.consume("aq", inactivity_timeout=10):
                assert method is not None, f"{len(acked)} of {total} through the relay"
                if method.redelivered:
                    seen_again += body in nacked
                if int(body[2:]) % 10 == 0 and body not in nacked:
                    nacked.add(body)
                    ch.basic_nack(method.delivery_tag, requeue=True)
                    continue
                ch.basic_ack(method.delivery_tag)
                acked.append(body)
                if len(acked) == total:
                    break
            ch.cancel()
            return acked, seen_again
        finally:
            pc.close()

    acked, seen_again = await asyncio.to_thread(consume_acked)
    assert sorted(acked) == [b"m-%03d" % i for i in range(total)]
    assert seen_again == total // 10
    async with await clients.connect(replicas[0].address, timeout=5) as rc:
        # Everything acked on the replica; the cancel ended the consumer there.
        await wait_stats(rc, "aq", timeout=10, ready=0, acquired=0, interested=[])

        def no_ack_and_close() -> tuple[int, int]:
            pc = _pika(outsider)
            try:
                ch = pc.channel()
                ch.confirm_delivery()
                for i in range(60):
                    ch.basic_publish("", "aq", b"n-%02d" % i, mandatory=True)
                got = 0
                for method, _props, _body in ch.consume("aq", auto_ack=True,
                                                        inactivity_timeout=10):
                    assert method is not None, f"{got} of 60 without acks"
                    got += 1
                    if got == 60:
                        break
                ch.cancel()
                for i in range(10):
                    ch.basic_publish("", "aq", b"h-%02d" % i, mandatory=True)
                # A consumer that holds some, then its channel closes: they go back.
                ch2 = pc.channel()
                ch2.basic_qos(prefetch_count=5)
                held = 0
                for method, _props, _body in ch2.consume("aq", inactivity_timeout=10):
                    assert method is not None
                    held += 1
                    if held == 5:
                        break
                ch2.close()
                return got, held
            finally:
                pc.close()

        got, held = await asyncio.to_thread(no_ack_and_close)
        assert (got, held) == (60, 5)
        await wait_stats(rc, "aq", timeout=10, ready=10, acquired=0, interested=[])

        def in_a_transaction() -> int:
            pc = _pika(outsider)
            try:
                ch = pc.channel()
                ch.tx_select()
                ch.basic_qos(prefetch_count=10)
                tags = []
                for method, _props, _body in ch.consume("aq", inactivity_timeout=10):
                    assert method is not None
                    tags.append(method.delivery_tag)
                    if len(tags) == 10:
                        break
                ch.basic_ack(tags[4], multiple=True)  # five, held until the commit
                ch.basic_reject(tags[5], requeue=False)  # dropped (no dead-letter queue)
                ch.tx_rollback()  # (nothing settled: the six are the client's again)
                ch.basic_ack(tags[2])
                ch.tx_commit()  # one acked
                return ch.cancel()  # (the nine it holds go back when it closes)
            finally:
                pc.close()

        assert await asyncio.to_thread(in_a_transaction) == 0
        await wait_stats(rc, "aq", timeout=10, ready=9, acquired=0, interested=[])

        # aio-pika too: the nine left and fifty more, each tenth nacked once.
        aio = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port(outsider)}/")
        async with aio:
            ch = await aio.channel()
            for i in range(50):
                await ch.default_exchange.publish(aio_pika.Message(b"a-%02d" % i), "aq")
            await ch.set_qos(prefetch_count=20)
            queue = await ch.get_queue("aq", ensure=False)
            done: list[bytes] = []
            again: set[bytes] = set()
            async with queue.iterator() as messages:
                async for message in messages:
                    if message.body.startswith(b"a-") and int(message.body[2:]) % 10 == 0 \
                            and message.body not in again:
                        again.add(message.body)
                        await message.nack(requeue=True)
                        continue
                    assert message.body not in again or message.redelivered
                    await message.ack()
                    done.append(message.body)
                    if len(done) == 59:
                        break
        assert len(set(done)) == 59 and again <= set(done)
        await wait_stats(rc, "aq", timeout=10, ready=0, acquired=0, interested=[])

        def gets() -> list[bytes]:
            pc = _pika(outsider)
            try:
                ch = pc.channel()
                ch.confirm_delivery()
                assert ch.basic_get("aq") == (None, None, None)  # Get-Empty
                for i in range(3):
                    ch.basic_publish("", "aq", b"g-%d" % i, mandatory=True)
                out = []
                m1, _, b1 = ch.basic_get("aq")
                assert m1 is not None and not m1.redelivered
                ch.basic_ack(m1.delivery_tag)
                m2, _, b2 = ch.basic_get("aq", auto_ack=True)
                assert m2 is not None
                m3, _, b3 = ch.basic_get("aq")
                assert m3 is not None
                ch.basic_nack(m3.delivery_tag, requeue=True)
                m4, _, b4 = ch.basic_get("aq")
                assert m4 is not None and m4.redelivered and b4 == b3
                ch.basic_ack(m4.delivery_tag)
                out += [b1, b2, b4]
                assert ch.basic_get("aq") == (None, None, None)
                return out
            finally:
                pc.close()

        assert sorted(await asyncio.to_thread(gets)) == [b"g-0", b"g-1", b"g-2"]
        await wait_stats(rc, "aq", timeout=10, ready=0, acquired=0, interested=[])

    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=10), headers=TOOL_HEADERS
    ) as http:
        here = await _forwarded(http, outsider)
        assert here.get("kind=consume", 0) >= 5, here
    assert "Traceback" not in outsider.output()


async def test_a_broken_peer_link_ends_a_relayed_amqp_consumer(
    grouped: list[BrokerProcess],
) -> None:
    """The replica an AMQP consumer is relayed to dies: a client that takes a server's
    Basic.Cancel (consumer_cancel_notify) gets one; one that does not sees its channel
    closed with a clear reply text; what they held is not lost."""
    outsider, replicas = await _outsider(grouped)
    async with await clients.connect(outsider.address, timeout=5, route=False) as conn:
        await conn.declare_queue("bq", partition=1)
        for i in range(40):
            await conn.publish("bq", b"b-%02d" % i)
    rows = (await topology(replicas[0].address))["partitions"]
    leader = next(r for r in rows if r["partition"] == 1)["leader"].split("/")[0]
    victim = next(r for r in replicas if r.node_id == leader)
    survivor = next(r for r in replicas if r is not victim)

    def connect(notify: bool) -> pika.BlockingConnection:
        props = None if notify else {"capabilities": {}}  # (pika asks for it by default)
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", amqp_port(outsider), connection_attempts=1,
            client_properties=props))

    def kill_while_held() -> tuple[list[Any], list[Any], list[bytes]]:
        notified, plain = connect(True), connect(False)
        try:
            cancels: list[Any] = []
            closed: list[Any] = []
            held: list[bytes] = []
            for pc in (notified, plain):
                ch = pc.channel()
                ch.basic_qos(prefetch_count=5)
                ch.basic_consume("bq", lambda _c, _m, _p, body: held.append(body))
                if pc is notified:
                    ch.add_on_cancel_callback(cancels.append)
                else:  # (the blocking channel tells its close on the next call only)
                    ch._impl.add_on_close_callback(lambda _ch, why: closed.append(why))
            deadline = time.monotonic() + 10
            while len(held) < 10 and time.monotonic() < deadline:
                for pc in (notified, plain):
                    pc.process_data_events(0.05)
            assert len(held) == 10, held  # each holds its prefetch, unacked
            victim.kill9()
            deadline = time.monotonic() + 15
            while (not cancels or not closed) and time.monotonic() < deadline:
                for pc in (notified, plain):
                    pc.process_data_events(0.05)
            return cancels, closed, held
        finally:
            for pc in (notified, plain):
                if pc.is_open:
                    pc.close()

    cancels, closed, held = await asyncio.to_thread(kill_while_held)
    assert cancels, "no Basic.Cancel for the relayed consumer"
    assert closed, "the channel of a client without consumer_cancel_notify stayed open"
    reason = closed[0]
    assert isinstance(reason, pika.exceptions.ChannelClosedByBroker), reason
    assert reason.reply_code == 506, reason
    assert "ended" in reason.reply_text and "consume again" in reason.reply_text, reason

    # Nothing held was lost: all 40 from the survivor, each once.
    async with await clients.connect(survivor.address, timeout=5) as rc:
        seen: list[bytes] = []
        async with rc.consume("bq", prefetch=50) as consumer:
            while len(seen) < 40:
                batch = await consumer.get_many(50, timeout=15)
                assert batch, f"{len(seen)} of 40"
                seen += [m.body for m in batch]
                await consumer.ack_many(batch)
        assert sorted(seen) == [b"b-%02d" % i for i in range(40)]
    assert "Traceback" not in outsider.output()
