"""The blocking client (``batonmq.clients.sync``) against a real broker: the same round trip
as the async client, timeouts, and a clean stop of its loop thread."""

from __future__ import annotations

import threading
import time

import pytest

from batonmq import clients
from batonmq.cluster.errors import Timeout
from tests.helpers import wait_stats_sync
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration


def _client_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "baton-client"}


def test_sync_round_trip(broker: BrokerProcess) -> None:
    with clients.sync.connect(broker.address) as conn:
        assert conn.address == broker.address
        assert conn.node_id and conn.server.startswith("baton/")
        assert conn.ping() >= 0
        assert conn.declare_queue("sq", delivery_limit=5, dead_letter="sq.dlq") == {"created": True}
        assert conn.declare_queue("sq.dlq")["created"] is True
        assert conn.declare_queue("sq", delivery_limit=5, dead_letter="sq.dlq") == {"created": False}
        with pytest.raises(clients.QueueExists):
            conn.declare_queue("sq")
        with pytest.raises(clients.InvalidArgument):
            conn.declare_queue("bad", delivery_limit=0)
        p = conn.publish("sq", b"one", headers={"k": "v"})
        assert p == 0
        # publish_batch takes any iterable (a generator here) and keeps order.
        assert conn.publish_batch("sq", (b"m%d" % i for i in range(1, 4))) == [1, 2, 3]
        assert conn.publish_batch("sq", [(b"m4", {"n": 4})]) == [4]
        stats = conn.queue_stats("sq")
        assert (stats["ready"], stats["acquired"], stats["enqueued"]) == (5, 0, 5)
        assert [q["queue"] for q in conn.list_queues()] == ["sq", "sq.dlq"]

        with conn.consume("sq", prefetch=10) as consumer:
            assert consumer.queue == "sq" and consumer.tag > 0
            msgs = [consumer.next(timeout=5) for _ in range(5)]
            assert [(m.position, m.body) for m in msgs] == [
                (0, b"one"), (1, b"m1"), (2, b"m2"), (3, b"m3"), (4, b"m4"),
            ]
            assert msgs[0].headers == {"k": "v"} and msgs[4].headers == {"n": 4}
            assert all(m.delivery_count == 0 and m.queue == "sq" for m in msgs)
            assert msgs[0].publish_time > 0
            assert conn.queue_stats("sq")["acquired"] == 5
            msgs[0].ack(confirm=True)
            assert msgs[0].settled
            with pytest.raises(clients.InvalidArgument):
                msgs[0].ack()  # settled twice
            msgs[1].release(failed=True, confirm=True)
            msgs[2].reject()  # unconfirmed: returns at once
            again = consumer.next(timeout=5)
            assert (again.position, again.body, again.delivery_count) == (1, b"m1", 1)
            assert again.acquired_count == 1
            again.ack()
            consumer.ack_many(msgs[3:], confirm=True)
            with pytest.raises(Timeout):
                consumer.next(timeout=0.3)
            stats = wait_stats_sync(conn, "sq", accepted=4)
            assert (stats["ready"], stats["acquired"], stats["redelivered"], stats["dead_lettered"]) == (
                0, 0, 1, 1,
            )

        with conn.consume("sq.dlq", prefetch=1) as dlq:
            dead = dlq.next(timeout=5)
            assert dead.body == b"m2"
            assert dead.headers["x-death-reason"] == "rejected"
            assert dead.headers["x-death-queue"] == "sq"
            assert dead.headers["x-death-position"] == 2
            dead.ack(confirm=True)
        assert conn.purge_queue("sq") == 0
        assert conn.delete_queue("sq.dlq") == 0
        with pytest.raises(clients.QueueNotFound):
            conn.publish("sq.dlq", b"x")


def test_sync_consumer_iter_and_cancel(broker: BrokerProcess) -> None:
    with clients.sync.connect(broker.address) as conn:
        conn.declare_queue("it")
        conn.publish_batch("it", [b"a", b"b", b"c"])
        got = []
        with conn.consume("it", prefetch=2) as consumer:
            with pytest.raises(Timeout):
                for msg in consumer.iter(timeout=0.5):
                    got.append(msg.body)
                    msg.ack()
            # Holding two without settling: cancel gives them back.
            conn.publish_batch("it", [b"d", b"e"])
            held = [consumer.next(timeout=5), consumer.next(timeout=5)]
            assert [m.body for m in held] == [b"d", b"e"]
            assert consumer.cancel() == 2
        assert got == [b"a", b"b", b"c"]
        stats = wait_stats_sync(conn, "it", ready=2)
        assert (stats["acquired"], stats["accepted"], stats["redelivered"]) == (0, 3, 2)


def test_sync_consumer_ends_after_cancel(broker: BrokerProcess) -> None:
    """After cancel, next() raises StopIteration (not Timeout) and iteration ends."""
    with clients.sync.connect(broker.address) as conn:
        conn.declare_queue("stop")
        conn.publish("stop", b"a")
        with conn.consume("stop", prefetch=1) as consumer:
            assert consumer.next(timeout=5).body == b"a"
            assert consumer.cancel() == 1
            with pytest.raises(StopIteration):
                consumer.next(timeout=0.5)
            assert list(consumer) == []  # "for msg in consumer" ends normally


def test_sync_next_timeout_on_empty_queue(broker: BrokerProcess) -> None:
    with clients.sync.connect(broker.address) as conn:
        conn.declare_queue("empty")
        with conn.consume("empty", prefetch=1) as consumer:
            start = time.monotonic()
            with pytest.raises(Timeout):
                consumer.next(timeout=0.3)
            elapsed = time.monotonic() - start
            assert 0.25 <= elapsed < 3, elapsed
            # Still usable after a timeout.
            conn.publish("empty", b"now")
            msg = consumer.next(timeout=5)
            assert msg.body == b"now"
            msg.ack()


def test_sync_close_stops_its_thread(broker: BrokerProcess) -> None:
    before = _client_threads()
    conn = clients.sync.connect(broker.address)
    during = _client_threads() - before
    assert len(during) == 1
    thread = during.pop()
    assert thread.is_alive() and thread.daemon
    conn.declare_queue("c")
    conn.close()
    assert conn.closed
    assert not thread.is_alive()
    assert _client_threads() == before
    conn.close()  # twice is harmless
    with pytest.raises(clients.ConnectionClosed):
        conn.publish("c", b"x")
    # A failed connect leaves no thread behind either.
    with pytest.raises(clients.ConnectionClosed):
        clients.sync.connect("127.0.0.1:1", timeout=2)
    assert _client_threads() == before
