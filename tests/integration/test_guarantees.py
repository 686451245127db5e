"""docs/design.md §5 guarantees against a real ``baton serve`` process on the file log.

1 publish confirmed => durable (kill -9 mid-stream), 3 accept => never again,
4 release => back with count + 1, 5 reject / delivery limit => dead-lettered,
6 consumer disconnect => its messages return, 7 per-queue order, 8 restart.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from batonmq import clients
from batonmq.cluster.errors import BatonError, ConnectionClosed
from tests.helpers import drain, eventually, login_frames, now
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration


async def next_msg(consumer: clients.Consumer, timeout: float = 10.0) -> clients.Message:
    """The consumer's next message, or fail the test after ``timeout`` seconds."""
    return await asyncio.wait_for(consumer.__aiter__().__anext__(), timeout)


async def test_round_trip_and_stats(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("orders", delivery_limit=5, dead_letter="orders.dlq")
        await conn.declare_queue("orders.dlq")
        p = await conn.publish("orders", b"body", headers={"k": "v"})
        ps = await conn.publish_batch("orders", [b"a", b"b"])
        assert ps == [p + 1, p + 2]
        stats = await conn.queue_stats("orders")
        assert stats["ready"] == 3 and stats["acquired"] == 0
        async with conn.consume("orders", prefetch=100) as consumer:
            msg = await next_msg(consumer)
            assert (msg.queue, msg.position, msg.body, msg.headers, msg.delivery_count) == (
                "orders", p, b"body", {"k": "v"}, 0,
            )
            stats = await conn.queue_stats("orders")
            assert stats["acquired"] == 3 and stats["ready"] == 0  # prefetch took all three
            await msg.ack(confirm=True)
        stats = await conn.queue_stats("orders")
        assert stats["acquired"] == 0 and stats["ready"] == 2 and stats["accepted"] == 1


async def test_guarantee_1_and_8_confirmed_publishes_survive_kill9(broker: BrokerProcess) -> None:
    """Publish with confirms from several tasks, kill -9 mid-stream, restart: every
    confirmed message is there."""
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("durable")
    confirmed: set[bytes] = set()
    stop = asyncio.Event()

    async def producer(k: int) -> None:
        try:
            async with await clients.connect(broker.address) as conn:
                i = 0
                while not stop.is_set():
                    body = b"p%d-%d" % (k, i)
                    await conn.publish("durable", body)
                    confirmed.add(body)
                    i += 1
        except BatonError:
            pass  # the broker died under us: unconfirmed ones may or may not be there

    tasks = [asyncio.create_task(producer(k)) for k in range(4)]
    await eventually(lambda: now(len(confirmed)), "1500 publishes confirmed", timeout=60,
                     until=lambda n: n >= 1500, interval=0.01)
    broker.kill9()
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert len(confirmed) >= 1500
    broker.restart()
    got = await drain(broker.address, "durable")
    bodies = [m.body for m in got]
    assert confirmed <= set(bodies), f"{len(confirmed - set(bodies))} confirmed messages lost"
    assert len(bodies) == len(set(bodies)), "a message was enqueued twice"


async def test_guarantee_3_and_8_accepted_never_return_after_kill9(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("work")
        await conn.publish_batch("work", [b"m%d" % i for i in range(3000)])
    accepted: set[int] = set()
    try:
        async with await clients.connect(broker.address) as conn:
            async with conn.consume("work", prefetch=200) as consumer:
                while True:
                    msg = await next_msg(consumer)
                    await msg.ack(confirm=True)
                    accepted.add(msg.position)
                    if len(accepted) == 1000:
                        broker.kill9()
    except BatonError:
        pass
    assert len(accepted) >= 1000
    broker.restart()
    async with await clients.connect(broker.address) as conn:
        stats = await conn.queue_stats("work")
    assert stats["ready"] + stats["acquired"] == 3000 - len(accepted)
    rest = await drain(broker.address, "work")
    positions = {m.position for m in rest}
    assert not positions & accepted, "an accepted message was delivered again"
    assert positions | accepted == set(range(3000)), "a message was lost"


async def test_guarantee_4_release_raises_delivery_count(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("rel")
        pos = await conn.publish("rel", b"again")
        async with conn.consume("rel", prefetch=1) as consumer:
            for expected in range(3):
                msg = await next_msg(consumer)
                assert (msg.position, msg.delivery_count) == (pos, expected)
                assert msg.acquired_count == expected
                await msg.release(failed=True, confirm=True)
            # A "not now" release raises the acquired count only.
            msg = await next_msg(consumer)
            assert (msg.delivery_count, msg.acquired_count) == (3, 3)
            await msg.release(confirm=True)
            msg = await next_msg(consumer)
            assert (msg.delivery_count, msg.acquired_count) == (3, 4)
            await msg.ack(confirm=True)
        stats = await conn.queue_stats("rel")
        assert stats["redelivered"] == 3 and stats["ready"] == 0
        assert (stats["acquisitions"], stats["failed_deliveries"], stats["given_back"]) == (5, 3, 1)


async def test_guarantee_5_reject_and_delivery_limit_dead_letter(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("dlq")
        await conn.declare_queue("jobs", delivery_limit=3, dead_letter="dlq")
        await conn.declare_queue("nodlq", delivery_limit=2)
        rejected = await conn.publish("jobs", b"bad")
        poison = await conn.publish("jobs", b"poison")
        await conn.publish("nodlq", b"dropped")
        async with conn.consume("jobs", prefetch=10) as consumer:
            deliveries = 0
            while True:
                msg = await next_msg(consumer)
                deliveries += 1
                if msg.position == rejected:
                    await msg.reject(confirm=True)
                else:
                    assert msg.body == b"poison"
                    # A poison message: fails every time.
                    await msg.release(failed=True, confirm=True)
                stats = await conn.queue_stats("jobs")
                if stats["ready"] + stats["acquired"] == 0:
                    break
        assert deliveries == 1 + 3  # the poison message is delivered exactly 3 times
        dead = await drain(broker.address, "dlq")
        by_body = {m.body: m for m in dead}
        assert set(by_body) == {b"bad", b"poison"}
        assert by_body[b"bad"].headers["x-death-reason"] == "rejected"
        assert by_body[b"poison"].headers["x-death-reason"] == "delivery-limit"
        assert by_body[b"poison"].headers["x-death-position"] == poison
        async with conn.consume("nodlq", prefetch=1) as consumer:
            for _ in range(2):
                await (await next_msg(consumer)).release(failed=True, confirm=True)
        stats = await conn.queue_stats("nodlq")
        assert stats["dropped"] == 1 and stats["ready"] == 0


async def test_guarantee_6_consumer_disconnect_releases(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("dc")
        await conn.publish_batch("dc", [b"x%d" % i for i in range(10)])
    # A consumer that takes messages and vanishes without a goodbye.
    reader, writer = await asyncio.open_connection(*broker.address.split(":"))
    doomed = await clients.connect(broker.address)
    consumer = doomed.consume("dc", prefetch=5)
    await consumer.__aenter__()
    first = [await next_msg(consumer) for _ in range(5)]
    async with await clients.connect(broker.address) as conn:
        assert (await conn.queue_stats("dc"))["acquired"] == 5
    writer.close()
    await doomed.close()  # the socket closes; no Cancel was sent for the consumer
    got = await drain(broker.address, "dc")
    assert sorted(m.position for m in got) == list(range(10))
    counts = {m.position: m.delivery_count for m in got}
    assert all(counts[m.position] == 1 for m in first)
    assert all(counts[p] == 0 for p in range(10) if p not in {m.position for m in first})


async def test_guarantee_7_order_and_redelivery_keeps_position(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("ordered")
        await conn.publish_batch("ordered", [b"%d" % i for i in range(20)])
        async with conn.consume("ordered", prefetch=5) as consumer:
            batch = [await next_msg(consumer) for _ in range(5)]
            assert [m.position for m in batch] == [0, 1, 2, 3, 4]
            await batch[1].release(failed=True, confirm=True)
            for m in batch[:1] + batch[2:]:
                await m.ack(confirm=True)
            seen = []
            while len(seen) < 16:
                m = await next_msg(consumer)
                seen.append((m.position, m.delivery_count))
                await asyncio.wait_for(m.ack(confirm=True), 10)
        # Position 1 came back before everything behind it, keeping its position.
        assert seen[0] == (1, 1)
        assert [p for p, _ in seen[1:]] == list(range(5, 20))


async def test_sigterm_is_clean_and_loses_nothing(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("t")
        await conn.publish_batch("t", [b"a", b"b", b"c"])
        with pytest.raises(ConnectionClosed):
            async with conn.consume("t", prefetch=10) as consumer:
                m = await next_msg(consumer)
                await m.ack(confirm=True)
                # SIGTERM while this consumer still holds two messages.
                assert broker.terminate() == 0
    assert "broker stopped" in broker.output()
    broker.restart()
    rest = await drain(broker.address, "t")
    assert sorted(m.body for m in rest) == [b"b", b"c"]


async def test_bad_frames_close_only_that_connection(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as good:
        await good.declare_queue("safe")
        host, port = broker.address.split(":")
        # Garbage, an oversized length prefix, and a frame before Hello.
        for payload in (b"\x00\x00\x00\x05garbage!", b"\xff\xff\xff\xf0", b"\x00\x00\x00\x01\xc1"):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(payload)
            await writer.drain()
            data = await asyncio.wait_for(reader.read(), 10)  # the broker closes it
            assert data, "expected an Error frame before the close"
            writer.close()
        await good.publish("safe", b"still fine")
        assert (await good.queue_stats("safe"))["ready"] == 1
        with pytest.raises(clients.MessageTooLarge):
            await good.publish("safe", b"x" * (good_max(good) + 1))
        with pytest.raises(clients.QueueNotFound):
            await good.publish("nope", b"x")
        with pytest.raises(clients.QueueExists):
            await good.declare_queue("safe", delivery_limit=7)


def good_max(conn: clients.Connection) -> int:
    return int(conn.max_message)


async def test_second_broker_on_same_data_dir_is_refused(broker: BrokerProcess) -> None:
    twin = BrokerProcess(broker.data_dir)
    try:
        with pytest.raises(RuntimeError, match="cannot start"):
            twin.start(timeout=15)
    finally:
        twin.stop()
    assert broker.proc is not None and broker.proc.poll() is None
    os.kill(broker.proc.pid, 0)  # still alive
    _ = signal  # (imported for the reader: kill -9 tests live above)
    with pytest.raises(ConnectionClosed):
        await clients.connect("127.0.0.1:1", timeout=2)


async def test_unconfirmed_acks_before_cancel_are_applied(broker: BrokerProcess) -> None:
    """``await msg.ack()`` without confirm returns at once; acks sent before the
    consumer's Cancel reach the log before its release, so none comes back."""
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("fast")
        await conn.publish_batch("fast", [b"%d" % i for i in range(500)])
        async with conn.consume("fast", prefetch=100) as consumer:
            for _ in range(300):
                await (await next_msg(consumer)).ack()
        stats = await conn.queue_stats("fast")
        assert (stats["accepted"], stats["ready"], stats["acquired"]) == (300, 200, 0)
        assert consumer.settle_failures == 0


async def test_cancel_returns_unread_messages_without_a_delivery_attempt(
    broker: BrokerProcess,
) -> None:
    """Messages still in the client's buffer at cancel were never processed: their
    delivery count stays; the one the application held counts as an attempt."""
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("buffered", delivery_limit=2)
        await conn.publish_batch("buffered", [b"%d" % i for i in range(10)])
        seen = []
        for rnd in range(3):  # three consumers in a row take one message each
            async with conn.consume("buffered", prefetch=10) as consumer:
                first = await next_msg(consumer)
                seen.append((first.position, first.delivery_count))
                # Rounds 1 and 2 see all ten; position 0 is gone by round 3.
                want = 9 if rnd < 2 else 8
                await eventually(lambda: now(consumer.buffered), f"{want} messages buffered",
                                 until=lambda n: n >= want, interval=0.01)
        assert seen == [(0, 0), (0, 1), (1, 0)]
        stats = await conn.queue_stats("buffered")
        # Position 0 was handed out twice (delivery_limit 2): dead-lettered (dropped);
        # the 9 buffered ones were never processed and are all still there.
        assert (stats["ready"], stats["dropped"]) == (9, 1)
        got = await drain(broker.address, "buffered")
        assert {m.delivery_count for m in got} <= {0, 1}
        assert sorted(m.position for m in got) == list(range(1, 10))


async def test_settle_with_bad_positions_is_an_error_not_a_hang(broker: BrokerProcess) -> None:
    from batonmq.clients import wire

    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("raw")
        await conn.publish("raw", b"x")
    host, port = broker.address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    codec = wire.FrameCodec()

    delivered: list[wire.Deliver] = []

    async def receive(want: type[wire.Frame]) -> wire.Frame:
        while True:
            got = codec.next_frame()
            if got is wire.NEED_DATA:
                codec.receive_data(await asyncio.wait_for(reader.read(65536), 10))
                continue
            if isinstance(got, wire.Deliver):
                delivered.append(got)
            assert isinstance(got, wire.Frame)
            if isinstance(got, want):
                return got

    async def call(frame: wire.Frame) -> wire.Frame:
        writer.write(codec.send(frame))
        return await receive((wire.Ok, wire.Error, wire.HelloOk))  # type: ignore[arg-type]

    first, respond, check = login_frames()
    writer.write(codec.send(first))
    writer.write(codec.send(respond(await receive(wire.AuthChallenge))))
    check(await receive(wire.HelloOk))
    sub = await call(wire.Subscribe(2, "raw", 10))
    assert isinstance(sub, wire.Ok)
    tag = sub.result["consumer"]
    if not delivered:
        await receive(wire.Deliver)
    answer = await call(wire.Ack(3, tag, [True]))  # type: ignore[list-item]
    assert isinstance(answer, wire.Error) and answer.code == clients.InvalidArgument.code
    answer = await call(wire.Ack(4, tag, [0, 99]))
    assert isinstance(answer, wire.Ok) and answer.result == {"count": 1, "not_acquired": [99]}
    writer.close()


async def test_headers_are_bounded_and_big_headers_are_delivered(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("hdr")
        with pytest.raises(clients.MessageTooLarge):
            await conn.publish("hdr", b"x", headers={"big": "h" * 70_000})
        # 2,000 messages with 4 KiB headers at a big prefetch: delivered in several frames.
        big = {"h": "v" * 4096}
        await conn.publish_batch("hdr", [(b"m", big)] * 2000)
        got = await drain(broker.address, "hdr")
        assert len(got) == 2000 and all(m.headers == big for m in got)


async def test_store_ahead_of_the_log_is_refused_clearly(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("x")
    assert broker.terminate() == 0
    wrong = BrokerProcess(broker.data_dir, log_url="memory:")
    try:
        with pytest.raises(RuntimeError, match="not the log this data dir was built from"):
            wrong.start(timeout=15)
    finally:
        wrong.stop()


async def test_fuzzed_frames_never_crash_the_broker(broker: BrokerProcess) -> None:
    """Random bytes, random msgpack after a valid Hello, truncated frames and oversized
    length prefixes, on many connections: each one is closed or answered, and the broker
    keeps serving everyone else with nothing lost."""
    import random

    import msgpack

    from batonmq.clients import wire

    rng = random.Random(20261122)
    codec = wire.FrameCodec()
    hello = codec.send(wire.Hello(1, wire.PROTOCOL_VERSION, "fuzz"))
    publish = codec.send(wire.Publish(2, "fuzzed", b"x" * 100, {}))
    host, port = broker.address.split(":")
    async with await clients.connect(broker.address) as good:
        await good.declare_queue("fuzzed")
        await good.publish("fuzzed", b"before")

        def case(i: int) -> bytes:
            kind = i % 5
            if kind == 0:  # random bytes
                return rng.randbytes(rng.randint(1, 300))
            if kind == 1:  # a valid hello, then random bytes
                return hello + rng.randbytes(rng.randint(1, 300))
            if kind == 2:  # a valid hello, then well-formed msgpack of a wrong shape
                junk = [rng.randint(0, 40)] + [
                    rng.choice([None, -1, 2**64 - 1 if rng.random() < 0.1 else 7, "s", b"b",
                                [1, [2]], {"k": {}}, 1.5, True])
                    for _ in range(rng.randint(0, 6))
                ]
                payload = msgpack.packb(junk)
                return hello + len(payload).to_bytes(4, "big") + payload
            if kind == 3:  # a publish cut short, then the connection closes
                return hello + publish[: rng.randint(1, len(publish) - 1)]
            return hello + rng.randbytes(1) + b"\xff\xff\xff"  # an oversized length prefix

        for i in range(150):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(case(i))
            try:
                await writer.drain()
                if i % 5 == 3:
                    writer.write_eof()
                await asyncio.wait_for(reader.read(1 << 16), 10)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass  # the broker closed on us first: fine
            finally:
                writer.close()
        assert broker.proc is not None and broker.proc.poll() is None, broker.output()
        await good.publish("fuzzed", b"after")
        stats = await good.queue_stats("fuzzed")
        # Only the valid publishes count: "before", "after", and none of the cut ones.
        assert stats["ready"] == 2, stats
