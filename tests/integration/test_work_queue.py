"""Work-queue semantics against real brokers: the two counters of a message (docs/events.md,
"The two counters").

A message's *acquired count* goes up at every hand-out to a consumer; its *delivery
count* only when a delivery fails (a failed release, a reject, the loss of the consumer
that had it), and the delivery limit applies to the delivery count. So a consumer that
leaves with buffered or in-flight messages, or releases one "not now", never brings a
healthy message closer to the dead-letter queue, whatever the consumer churn.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from batonmq import clients
from batonmq.cluster.errors import BatonError, QueueNotFound
from tests.helpers import drain, equal_digests, eventually, now, wait_stats
from tests.integration.conftest import BrokerProcess
from tests.integration.test_join import brokers, log_url

pytestmark = pytest.mark.integration


async def next_msg(consumer: clients.Consumer, timeout: float = 10.0) -> clients.Message:
    """The consumer's next message, or fail the test after ``timeout`` seconds."""
    return await asyncio.wait_for(consumer.__aiter__().__anext__(), timeout)


async def test_leaving_with_buffered_messages_raises_their_acquired_count_only(
    broker: BrokerProcess,
) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("buf", delivery_limit=2)
        await conn.publish_batch("buf", [b"%d" % i for i in range(150)])
        async with conn.consume("buf", prefetch=100) as consumer:
            for _ in range(100):
                await (await next_msg(consumer)).ack()
        stats = await wait_stats(conn, "buf", accepted=100, acquired=0)
        assert stats["failed_deliveries"] == 0 and stats["redelivered"] == 0
        rest = await drain(broker.address, "buf", count=50)
        assert sorted(m.position for m in rest) == list(range(100, 150))
        # Never handed to the application: no failed delivery, whatever the client had.
        assert all(m.delivery_count == 0 for m in rest)
        assert all(m.acquired_count <= 1 for m in rest)
        stats = await conn.queue_stats("buf")
        assert stats["failed_deliveries"] == 0 and stats["dead_lettered"] == 0
        assert stats["given_back"] == sum(m.acquired_count for m in rest)


async def test_one_release_counts_once(broker: BrokerProcess) -> None:
    """prefetch 1, release and leave: the release is one hand-out (not now) or one
    failure (failed=True), never two; a delivery limit of 2 needs two failures."""
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("once.dlq")
        await conn.declare_queue("once", delivery_limit=2, dead_letter="once.dlq")
        pos = await conn.publish("once", b"healthy")
        for failed in (False, True, False):
            async with conn.consume("once", prefetch=1) as consumer:
                msg = await next_msg(consumer)
                await msg.release(failed=failed)
        async with conn.consume("once", prefetch=1) as consumer:
            msg = await next_msg(consumer)
            assert (msg.position, msg.delivery_count, msg.acquired_count) == (pos, 1, 3)
            await msg.release(failed=True, confirm=True)  # the second failure: limit 2
        dead = await drain(broker.address, "once.dlq", count=1)
        assert dead[0].headers["x-death-reason"] == "delivery-limit"
        assert dead[0].headers["x-death-delivery-count"] == 2
        assert dead[0].headers["x-death-acquired-count"] == 4
        stats = await conn.queue_stats("once")
        assert (stats["acquisitions"], stats["failed_deliveries"], stats["given_back"]) == (4, 2, 2)


async def test_poison_released_twice_and_one_rejected_dead_letter_two(
    broker: BrokerProcess,
) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("p.dlq")
        await conn.declare_queue("p", delivery_limit=2, dead_letter="p.dlq")
        await conn.publish_batch("p", [b"poison", b"bad"] + [b"ok%d" % i for i in range(8)])
        while True:
            # A fresh consumer each time, with room for everything: leaving with a
            # full buffer must not count.
            async with conn.consume("p", prefetch=10) as consumer:
                msg = await next_msg(consumer)
                if msg.body == b"poison":
                    await msg.release(failed=True, confirm=True)
                elif msg.body == b"bad":
                    await msg.reject(confirm=True)
                else:
                    await msg.ack(confirm=True)
            stats = await conn.queue_stats("p")
            if stats["ready"] + stats["acquired"] == 0:
                break
        assert stats["dead_lettered"] == 2 and stats["accepted"] == 8
        dead = await drain(broker.address, "p.dlq", count=2)
        assert sorted(m.body for m in dead) == [b"bad", b"poison"]


async def test_many_short_lived_consumers_dead_letter_only_failed_messages(
    cluster: list[BrokerProcess],
) -> None:
    """Consumers on three brokers come and go with random prefetch, take a few
    messages, ack or release the healthy ones "not now", fail the poison ones, and
    leave with whatever they buffered; one broker is killed with kill -9 midway. With
    delivery_limit 2, exactly the poison messages are dead-lettered: churn, in-flight
    deliveries and the crash never fail a healthy message twice."""
    addresses = [b.address for b in cluster]
    rng = random.Random(7)
    total, poison = 240, set(range(0, 240, 16))
    async with await clients.connect(addresses) as conn:
        await conn.declare_queue("churn.dlq")
        await conn.declare_queue("churn", delivery_limit=2, dead_letter="churn.dlq")
        bodies = [(b"poison-%d" if i in poison else b"ok-%d") % i for i in range(total)]
        await conn.publish_batch("churn", bodies)
    accepted: set[bytes] = set()
    stop = asyncio.Event()
    sessions = 0

    async def worker(address: str, seed: int) -> None:
        nonlocal sessions
        r = random.Random(seed)
        while not stop.is_set():
            try:
                async with await clients.connect(address, failover=False) as c:
                    while not stop.is_set():
                        async with c.consume("churn", prefetch=r.randint(1, 20)) as consumer:
                            sessions += 1
                            for _ in range(r.randint(1, 4)):
                                msg = await consumer.get(timeout=0.5)
                                if msg is None:
                                    break
                                if msg.body.startswith(b"poison"):
                                    await msg.release(failed=True)
                                elif r.random() < 0.3:
                                    await msg.release()  # "not now"
                                else:
                                    await msg.ack(confirm=True)
                                    accepted.add(msg.body)
            except (BatonError, OSError):
                # This worker's broker was killed: go on through another one.
                address = r.choice([a for a in addresses if a != address])
                await asyncio.sleep(0.2)  # (a dead broker refuses at once: pace the retries)

    tasks = [asyncio.create_task(worker(addresses[i % 3], rng.random())) for i in range(6)]
    try:
        await eventually(lambda: now(len(accepted)), "a quarter accepted", timeout=60,
                         until=lambda n: n >= 60)
        cluster[2].kill9()  # its consumers' messages come back as failed deliveries
        async with await clients.connect(addresses[:2]) as conn:

            async def settled() -> int:
                s = await conn.queue_stats("churn")
                return int(s["accepted"] + s["dead_lettered"])

            await eventually(settled, "every message accepted or dead-lettered", timeout=120,
                             until=lambda n: n == total)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
    assert sessions >= 30, sessions  # many short-lived consumers
    dead = await drain(addresses[0], "churn.dlq", count=len(poison))
    assert sorted(m.headers["x-death-position"] for m in dead) == sorted(poison)
    assert all(m.headers["x-death-reason"] == "delivery-limit" for m in dead)
    async with await clients.connect(addresses[:2]) as conn:
        stats = await conn.queue_stats("churn")
    assert (stats["accepted"], stats["dead_lettered"]) == (total - len(poison), len(poison))
    # The churn gave back many messages without failing them.
    assert stats["given_back"] > 0


# --- delays: publish(delay=...), release(delay=...) ------------------------------------------


async def test_delayed_publish_and_release_wait_for_their_time(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("later")
        t0 = time.time()
        await conn.publish("later", b"in-1s", delay=1.0)
        await conn.publish("later", b"now")
        stats = await conn.queue_stats("later")
        assert (stats["ready"], stats["delayed"]) == (1, 1)
        async with conn.consume("later", prefetch=10) as consumer:
            first = await next_msg(consumer)
            assert first.body == b"now"
            released_at = time.time()
            await first.release(delay=1.5)  # "not now": back in 1.5 s
            second = await next_msg(consumer)
            assert second.body == b"in-1s" and time.time() - t0 >= 1.0
            assert second.publish_time / 1000 <= t0 + 0.5  # held, not published late
            await second.ack()
            third = await next_msg(consumer)
            assert third.body == b"now" and time.time() - released_at >= 1.5
            assert (third.delivery_count, third.acquired_count) == (0, 1)
            await third.ack(confirm=True)
        stats = await conn.queue_stats("later")
        assert (stats["ready"], stats["delayed"], stats["accepted"]) == (0, 0, 2)


@pytest.mark.parametrize("kind", ["file", "kafka"])
async def test_delays_and_retries_hold_across_kill9_of_the_owner_and_a_live_join(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Delayed publishes, delayed releases and a retry policy are replicated state: the
    owner's kill -9 and a broker joining meanwhile neither lose them nor hand them out
    before their time, and the replicas agree."""
    nodes = brokers(tmp_path, log_url(kind, tmp_path, request), 3, ["--checkpoint-ms", "500"])
    try:
        for b in nodes[:2]:
            b.start()
        owner, other = nodes[0].address, nodes[1].address
        async with await clients.connect(owner) as conn:
            await conn.declare_queue(
                "d", delivery_limit=5, retry=clients.Retry("fixed", delay=2.0)
            )
            t0 = time.time()
            await conn.publish_batch("d", [b"late-%d" % i for i in range(10)], delay=6.0)
            await conn.publish_batch("d", [b"now-%d" % i for i in range(15)])
            not_before: dict[bytes, float] = {b"late-%d" % i: t0 + 6.0 for i in range(10)}
            async with conn.consume("d", prefetch=15) as consumer:
                for _ in range(15):
                    msg = await next_msg(consumer)
                    i = int(msg.body.split(b"-")[1])
                    if i < 5:  # failed: the queue's policy holds it 2 s
                        not_before[msg.body] = time.time() + 2.0
                        await msg.release(failed=True, confirm=True)
                    elif i < 10:  # "not now", back in 3 s
                        not_before[msg.body] = time.time() + 3.0
                        await msg.release(delay=3.0, confirm=True)
                    else:
                        await msg.ack(confirm=True)
            stats = await conn.queue_stats("d")
            assert (stats["ready"], stats["delayed"]) == (0, 20)
        nodes[0].kill9()  # the owner, with every delayed message on its watch
        await asyncio.to_thread(nodes[2].start, 60)  # joins live, by an update
        got: dict[bytes, tuple[float, int, int]] = {}
        async with await clients.connect([nodes[2].address, other]) as conn:
            async with conn.consume("d", prefetch=50) as consumer:
                while len(got) < 20:
                    msg = await next_msg(consumer, timeout=30)
                    got[msg.body] = (time.time(), msg.delivery_count, msg.acquired_count)
                    await msg.ack(confirm=True)
        assert set(got) == set(not_before), "a delayed message was lost or came twice"
        early = {b: round(not_before[b] - t, 3) for b, (t, _, _) in got.items() if t < not_before[b]}
        assert not early, f"handed out before their time (s early): {early}"
        assert all(got[b"now-%d" % i][1:] == (1, 1) for i in range(5))  # failed once
        assert all(got[b"now-%d" % i][1:] == (0, 1) for i in range(5, 10))  # not now
        assert all(got[b"late-%d" % i][1:] == (0, 0) for i in range(10))
        await equal_digests(nodes[1:])
    finally:
        for n in nodes:
            n.stop()


# --- ack timeout -----------------------------------------------------------------------------


async def test_ack_timeout_releases_as_a_failure_and_tells_only_that_consumer(
    broker: BrokerProcess,
) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("slow", ack_timeout=60)
        await conn.declare_queue("other")
        await conn.publish_batch("slow", [b"stuck", b"busy"])
        await conn.publish_batch("other", [b"o%d" % i for i in range(3)])
        async with conn.consume("slow", prefetch=1, ack_timeout=0.6) as slow, conn.consume(
            "other", prefetch=1
        ) as other:
            stuck = await next_msg(slow)
            assert stuck.body == b"stuck"
            await eventually(lambda: now(slow.expired_count), "the ack timeout", timeout=10,
                             until=lambda n: n == 1)
            with pytest.raises(clients.NotAcquired):
                await stuck.ack(confirm=True)
            # The connection and its other consumer go on.
            for _ in range(3):
                await (await next_msg(other)).ack(confirm=True)
            # Back as a failed delivery, to the same consumer; in_progress keeps it.
            busy = await next_msg(slow)
            again = busy if busy.body == b"stuck" else await next_msg(slow)
            assert again.body == b"stuck" and (again.delivery_count, again.acquired_count) == (1, 1)
            for _ in range(4):
                await asyncio.sleep(0.3)  # pacing: working past the timeout, saying so
                await again.in_progress()
            await again.ack(confirm=True)
            if busy is not again:
                await busy.ack(confirm=True)
            else:
                await (await next_msg(slow)).ack(confirm=True)
        stats = await conn.queue_stats("slow")
        assert (stats["timed_out"], stats["failed_deliveries"], stats["accepted"]) == (1, 1, 2)
        assert stats["ack_timeout_ms"] == 60000
        assert slow.expired_count == 1


def test_the_queues_ack_timeout_applies_by_default_sync(broker: BrokerProcess) -> None:
    with clients.sync.connect(broker.address) as conn:
        conn.declare_queue("q.to", ack_timeout=0.5, delivery_limit=2)
        conn.publish("q.to", b"x")
        with conn.consume("q.to", prefetch=1) as consumer:
            msg = consumer.next(timeout=5)
            msg.in_progress()  # held: extends it
            again = consumer.next(timeout=10)  # the timeout passed: redelivered
            assert (again.position, again.delivery_count) == (msg.position, 1)
            with pytest.raises(clients.NotAcquired):
                msg.ack(confirm=True)
            again.ack(confirm=True)
        assert conn.queue_stats("q.to")["timed_out"] == 1


@pytest.mark.parametrize("kind", ["file", "kafka"])
async def test_ack_timeouts_hold_across_kill9_of_the_owner_and_a_live_join(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The owner is killed while its consumer holds a message, and a broker joins: the
    view change gives the message back (a failure). The next owner's consumer lets it
    pass its ack timeout (a second failure, told to that consumer only), and the joiner
    serves it the third time, counters intact."""
    nodes = brokers(tmp_path, log_url(kind, tmp_path, request), 3, ["--checkpoint-ms", "500"])
    try:
        for b in nodes[:2]:
            b.start()
        async with await clients.connect(nodes[0].address) as first:
            await first.declare_queue("t", ack_timeout=1.0, delivery_limit=5)
            await first.publish("t", b"job")
            held = first.consume("t", prefetch=1)
            await held.__aenter__()
            msg = await next_msg(held)
            assert (msg.delivery_count, msg.acquired_count) == (0, 0)
            nodes[0].kill9()  # the owner, holding the message
        await asyncio.to_thread(nodes[2].start, 60)  # joins live, during the failover
        async with await clients.connect(nodes[1].address) as second:
            async with second.consume("t", prefetch=1) as consumer:
                msg = await next_msg(consumer, timeout=30)  # after the view change
                assert (msg.delivery_count, msg.acquired_count) == (1, 1)
                await eventually(lambda: now(consumer.expired_count), "the ack timeout",
                                 timeout=15, until=lambda n: n == 1)
                again = await next_msg(consumer)  # back to it, as a failed delivery
                assert (again.delivery_count, again.acquired_count) == (2, 2)
                await again.release()  # "not now": for the joiner's consumer
        async with await clients.connect(nodes[2].address) as third:
            async with third.consume("t", prefetch=1) as consumer:
                msg = await next_msg(consumer, timeout=30)
                assert (msg.delivery_count, msg.acquired_count) == (2, 3)
                await msg.ack(confirm=True)
            stats = await third.queue_stats("t")
        assert (stats["timed_out"], stats["failed_deliveries"], stats["accepted"]) == (1, 2, 1)
        await equal_digests(nodes[1:])
    finally:
        for n in nodes:
            n.stop()


# --- priorities ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "kafka"])
async def test_priorities_hold_across_kill9_of_the_owner_and_a_live_join(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A priority queue offers higher priorities first and, within one, in position order;
    messages the killed owner's consumer held come back with their priority, and a
    broker that joined meanwhile serves them in the same order."""
    nodes = brokers(tmp_path, log_url(kind, tmp_path, request), 3, ["--checkpoint-ms", "500"])
    try:
        for b in nodes[:2]:
            b.start()
        prio = {p: (p * 7) % 4 for p in range(24)}  # priorities 0..3, interleaved
        async with await clients.connect(nodes[0].address) as first:
            await first.declare_queue("pq", max_priority=3)
            for p in range(24):
                assert await first.publish("pq", b"%d" % p, priority=prio[p]) == p
            held = first.consume("pq", prefetch=3)
            await held.__aenter__()
            taken = [(await next_msg(held)).position for _ in range(3)]
            order = sorted(prio, key=lambda p: (-prio[p], p))
            assert taken == order[:3]
            nodes[0].kill9()  # the owner, its consumer holding the three first
        await asyncio.to_thread(nodes[2].start, 60)  # joins live
        got: list[int] = []
        async with await clients.connect(nodes[2].address) as third:
            async with third.consume("pq", prefetch=1) as consumer:
                while len(got) < 24:
                    msg = await next_msg(consumer, timeout=30)
                    got.append(msg.position)
                    await msg.ack(confirm=True)
        assert got == order
        await equal_digests(nodes[1:])
    finally:
        for n in nodes:
            n.stop()


# --- single active consumer ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "kafka"])
async def test_single_active_consumer_fails_over_in_order_across_kill9_and_a_join(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One consumer at a time gets the messages, in order. Its broker (the owner) is
    killed: the consumer of the next broker in interest order takes over from the
    lowest position; when it leaves, the consumer of a broker that joined meanwhile does."""
    nodes = brokers(tmp_path, log_url(kind, tmp_path, request), 3, ["--checkpoint-ms", "500"])
    try:
        for b in nodes[:2]:
            b.start()
        async with await clients.connect(nodes[1].address) as c1_conn, await clients.connect(
            nodes[0].address
        ) as c2_conn:
            await c1_conn.declare_queue("sac", single_active_consumer=True)
            await c1_conn.publish_batch("sac", [b"%d" % i for i in range(40)])
            c1 = c1_conn.consume("sac", prefetch=5)
            await c1.__aenter__()  # first: node-2 owns the queue, c1 is active
            # node-1 may not have applied the declaration yet (it came through node-2).
            await eventually(lambda: c2_conn.queue_stats("sac"), "node-2 owns it",
                             until=lambda s: s["owner"] is not None
                             and s["owner"].startswith("node-2/"),
                             ignore=(QueueNotFound,))
            async with c2_conn.consume("sac", prefetch=5) as c2:
                for i in range(10):
                    msg = await next_msg(c1)
                    assert msg.position == i
                    await msg.ack(confirm=True)
                await asyncio.sleep(0.3)  # pacing: time for a wrong delivery to c2 to show
                assert c2.buffered == 0, "a second consumer got messages"
                nodes[1].kill9()  # the active consumer's broker, holding 10..14
                await asyncio.to_thread(nodes[2].start, 60)  # joins live
                async with await clients.connect(nodes[2].address) as c3_conn:
                    async with c3_conn.consume("sac", prefetch=5) as c3:
                        for i in range(10, 20):
                            msg = await next_msg(c2, timeout=30)
                            assert msg.position == i, (msg.position, i)
                            assert msg.delivery_count == (1 if i < 15 else 0)
                            await msg.ack(confirm=True)
                        assert c3.buffered == 0, "a second consumer got messages"
                        await c2.cancel()  # leaves: the joiner's consumer takes over
                        for i in range(20, 40):
                            msg = await next_msg(c3, timeout=30)
                            assert msg.position == i, (msg.position, i)
                            await msg.ack(confirm=True)
        await equal_digests([nodes[0], nodes[2]])
    finally:
        for n in nodes:
            n.stop()


# --- the dedupe window -----------------------------------------------------------------------


async def test_the_dedupe_window_survives_kill9_and_ends_with_its_time(
    broker: BrokerProcess,
) -> None:
    window = 10.0  # long enough for a kill -9 and a restart on a busy machine
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("dd", dedupe_window=window)
        first = await conn.publish("dd", b"x", idempotency_key="order-1")
        remembered = time.monotonic()  # the key's time is the replicated clock's, a bit later
        assert await conn.publish("dd", b"x", idempotency_key="order-1") == first
    broker.kill9()
    broker.restart()
    async with await clients.connect(broker.address) as conn:
        # Within the window, after a crash: still the same publish.
        assert time.monotonic() - remembered < window, "the restart took longer than the window"
        assert await conn.publish("dd", b"x", idempotency_key="order-1") == first
        # Time passing on purpose: the window ends (by the replicated clock).
        await asyncio.sleep(max(0.0, remembered + window + 0.5 - time.monotonic()))
        assert await conn.publish("dd", b"x", idempotency_key="order-1") == first + 1
        assert (await conn.queue_stats("dd"))["dedupe_window_ms"] == int(window * 1000)
