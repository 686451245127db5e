"""RabbitMQ's tutorials through pika and aio-pika on a 3-broker cluster, each with a
kill -9 of the broker the clients use: they reconnect to another broker, as a client
given the cluster's hosts does, and nothing confirmed is lost (docs/amqp.md)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import pika
import pika.exceptions
import pytest

from tests.helpers import eventually, eventually_sync, now
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import amqp_port, queue_stats
from tests.integration.test_amqp_aio import amqp_cluster, url  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

#: What a pika client sees when its broker is gone: the connection lost, or a call on
#: the channel or connection that went with it.
LOST = (pika.exceptions.AMQPConnectionError, pika.exceptions.ChannelWrongStateError,
        pika.exceptions.ConnectionWrongStateError)


def connect_any(brokers: list[BrokerProcess]) -> pika.BlockingConnection:
    """A connection to the first of ``brokers`` that answers: pika tries the hosts it is
    given in turn, as RabbitMQ's users list a cluster's nodes."""
    return pika.BlockingConnection([
        pika.ConnectionParameters("127.0.0.1", amqp_port(b), connection_attempts=1,
                                  credentials=pika.PlainCredentials("guest", "guest"))
        for b in brokers
    ])


def port_of(conn: pika.BlockingConnection) -> int:
    """The port a pika connection is on (from the parameters of the host it took)."""
    return int(conn._impl.params.port)


class Client(threading.Thread):
    """A pika client in a thread of its own that reconnects when its broker is gone.

    ``session(conn)`` runs on each new connection until it returns (the client's work
    is done) or the connection is lost (then the next broker of ``brokers`` that
    answers gets a new connection, and a new session). ``brokers`` start with the one
    the client uses first. Anything else a session raises ends the thread and is
    raised again by :meth:`finish`.
    """

    def __init__(self, brokers: list[BrokerProcess],
                 session: Callable[[pika.BlockingConnection], None]) -> None:
        super().__init__(daemon=True)
        self.brokers = brokers
        self.session = session
        self.stop = threading.Event()
        self.connections: list[int] = []  # the AMQP port of each connection made
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    conn = connect_any(self.brokers)
                except pika.exceptions.AMQPConnectionError:
                    continue  # none answered: try them again
                self.connections.append(port_of(conn))
                try:
                    self.session(conn)
                    return
                except LOST:
                    continue
                finally:
                    if conn.is_open:
                        conn.close()
        except BaseException as exc:  # raised again in the test's thread
            self.error = exc

    def finish(self, timeout: float = 10.0) -> None:
        self.stop.set()
        self.join(timeout)
        assert not self.is_alive(), "the client did not end"
        if self.error is not None:
            raise self.error


class Publisher(Client):
    """Publishes ``total`` messages (``prefix-0``, ``prefix-1``, ...) to ``exchange``
    with ``key``, mandatory, one at a time with confirms: a message is ``confirmed`` once
    its publish returned (pika waits for the confirm); one nacked, or cut off by a lost
    connection, is published again (so it may be there twice)."""

    def __init__(self, brokers: list[BrokerProcess], exchange: str, key: str,
                 prefix: str, total: int) -> None:
        super().__init__(brokers, self.publish)
        self.exchange, self.key, self.prefix, self.total = exchange, key, prefix, total
        self.confirmed: list[bytes] = []

    def publish(self, conn: pika.BlockingConnection) -> None:
        ch = conn.channel()
        ch.confirm_delivery()
        while len(self.confirmed) < self.total:
            body = f"{self.prefix}-{len(self.confirmed)}".encode()
            try:
                ch.basic_publish(self.exchange, self.key, body,
                                 pika.BasicProperties(delivery_mode=2), mandatory=True)
            except pika.exceptions.NackError:
                continue
            self.confirmed.append(body)


class Worker(Client):
    """Declares ``queue`` (durable, quorum) on each connection and consumes it with
    manual acks and a prefetch of 10, acking each message at once, or, while ``busy``
    is set, holding it unacked (``held``)."""

    def __init__(self, brokers: list[BrokerProcess], queue: str) -> None:
        super().__init__(brokers, self.work)
        self.queue = queue
        self.acked: list[bytes] = []
        self.redelivered: list[bytes] = []
        self.busy = threading.Event()
        self.held: list[bytes] = []
        self.sessions = 0  # connections on which it consumed

    def work(self, conn: pika.BlockingConnection) -> None:
        ch = conn.channel()
        ch.queue_declare(self.queue, durable=True, arguments={"x-queue-type": "quorum"})
        ch.basic_qos(prefetch_count=10)

        def on_message(chan: Any, method: Any, props: Any, body: bytes) -> None:
            if method.redelivered:
                self.redelivered.append(body)
            if self.busy.is_set():
                self.held.append(body)
                return
            chan.basic_ack(method.delivery_tag)
            self.acked.append(body)

        ch.basic_consume(self.queue, on_message)
        self.sessions += 1
        while not self.stop.is_set():
            conn.process_data_events(time_limit=0.05)

    def got_all(self, confirmed: list[bytes]) -> None:
        """Wait until every confirmed message has been acked."""
        eventually_sync(lambda: set(confirmed) <= set(self.acked),
                        f"every confirmed message acked from {self.queue}", timeout=20,
                        context=lambda: f"{len(set(self.acked))} of {len(confirmed)}")


def drained(b: BrokerProcess, queue: str) -> dict[str, Any]:
    """The stats of ``queue`` (read through ``b``) once nothing is ready or acquired."""
    return eventually_sync(lambda: queue_stats(b, queue), f"{queue} drained",
                           until=lambda s: s["ready"] == 0 and s["acquired"] == 0)


def test_work_queue_survives_a_kill_9_of_the_broker_its_clients_use(
    amqp_cluster: list[BrokerProcess],  # noqa: F811 (the fixture)
) -> None:
    """A publisher with confirms and a worker with manual acks and a prefetch both use
    node-1; it is killed -9 mid-stream, while the worker is busy with messages it has
    not acked; both reconnect (the publisher to node-2, the worker to node-3) and go on.
    Every confirmed message is acked at least once, those the worker held come again,
    redelivered, and the queue drains to nothing ready and nothing acquired."""
    b1, b2, b3 = amqp_cluster
    publisher = Publisher([b1, b2, b3], "", "tasks", "task", 300)
    worker = Worker([b1, b3, b2], "tasks")
    worker.start()
    eventually_sync(lambda: worker.sessions, "the worker consuming")
    publisher.start()
    try:
        eventually_sync(lambda: len(worker.acked) >= 50, "the first 50 messages acked on node-1")
        worker.busy.set()
        eventually_sync(lambda: len(worker.held) >= 5, "the worker busy with 5 messages")
        b1.kill9()
        held_at_kill = set(worker.held)
        worker.busy.clear()
        publisher.join(25)
        assert len(publisher.confirmed) == publisher.total, publisher.error
        worker.got_all(publisher.confirmed)
        assert held_at_kill <= set(worker.redelivered)
        stats = drained(b2, "tasks")
    finally:
        worker.finish()
        publisher.finish()
    ports = [amqp_port(b) for b in amqp_cluster]
    assert publisher.connections == [ports[0], ports[1]]
    assert worker.connections == [ports[0], ports[2]]
    assert stats["accepted"] >= publisher.total
    assert stats["failed_deliveries"] >= len(held_at_kill)
    for b in (b2, b3):
        assert "Traceback" not in b.output()


@pytest.mark.parametrize(("kind", "bindings", "key"), [
    ("fanout", ("", ""), ""),
    ("direct", ("error", "error"), "error"),
    ("topic", ("*.critical", "kern.#"), "kern.critical"),
], ids=["fanout", "direct", "topic"])
def test_publish_subscribe_and_routing_survive_a_kill_9_of_the_broker_their_clients_use(
    amqp_cluster: list[BrokerProcess],  # noqa: F811 (the fixture)
    kind: str, bindings: tuple[str, str], key: str,
) -> None:
    """Two subscribers' durable queues are bound to an exchange (fanout, direct, topic)
    on node-1, where they consume and where a publisher publishes with confirms (with a
    routing key both bindings match); node-1 is killed -9 mid-stream; the subscribers
    reconnect elsewhere and declare their queues again (not the bindings: those are
    replicated), the publisher reconnects to node-2 and goes on; each subscriber gets
    every confirmed message."""
    b1, b2, b3 = amqp_cluster
    setup = connect_any([b1])
    ch = setup.channel()
    ch.exchange_declare("logs", exchange_type=kind, durable=True)
    subscribers = [Worker([b1, b2, b3], "logs-a"), Worker([b1, b3, b2], "logs-b")]
    for sub, binding in zip(subscribers, bindings):
        ch.queue_declare(sub.queue, durable=True, arguments={"x-queue-type": "quorum"})
        ch.queue_bind(sub.queue, "logs", routing_key=binding or None)
    setup.close()
    publisher = Publisher([b1, b2, b3], "logs", key, "log", 200)
    for sub in subscribers:
        sub.start()
    eventually_sync(lambda: all(sub.sessions for sub in subscribers), "the subscribers consuming")
    publisher.start()
    try:
        eventually_sync(lambda: all(len(sub.acked) >= 40 for sub in subscribers),
                        "the first 40 messages with each subscriber")
        b1.kill9()
        publisher.join(25)
        assert len(publisher.confirmed) == publisher.total, publisher.error
        for sub in subscribers:
            sub.got_all(publisher.confirmed)
            drained(b3, sub.queue)
    finally:
        publisher.finish()
        for sub in subscribers:
            sub.finish()
    ports = [amqp_port(b) for b in amqp_cluster]
    assert publisher.connections == [ports[0], ports[1]]
    assert [sub.connections for sub in subscribers] == [[ports[0], ports[1]],
                                                        [ports[0], ports[2]]]
    assert all(sub.sessions == 2 for sub in subscribers)
    for b in (b2, b3):
        assert "Traceback" not in b.output()


async def connect_first(
    brokers: list[BrokerProcess],
) -> tuple[aio_pika.abc.AbstractConnection, BrokerProcess]:
    """aio-pika connected to the first of ``brokers`` that answers (tried again, in
    order, until one does), and that broker."""
    async def attempt() -> tuple[aio_pika.abc.AbstractConnection, BrokerProcess] | None:
        for b in brokers:
            try:
                return await aio_pika.connect(url(b)), b
            except (OSError, aio_pika.exceptions.AMQPConnectionError):
                continue
        return None

    found = await eventually(attempt, f"one of {[b.address for b in brokers]} answers")
    assert found is not None
    return found


class RpcServer:
    """The RPC tutorial's server (aio-pika): it consumes the durable ``rpc_queue`` with
    a prefetch of 1, answers ``n`` with ``n * n`` to ``reply_to`` with the request's
    ``correlation_id`` (and headers ``served-on``, its broker's AMQP port, and
    ``redelivered``), confirmed before it acks the request, so an answer a kill cut off
    comes again. It reconnects to the first of ``brokers`` that answers when its
    connection is lost. While ``stall`` is set, it works on the request with that body
    until ``killed`` is set, and never answers it."""

    def __init__(self, brokers: list[BrokerProcess], stall: bytes = b"") -> None:
        self.brokers = brokers
        self.served_on: list[int] = []  # the port of each connection it consumed on
        self.stall = stall
        self.busy = asyncio.Event()
        self.killed = asyncio.Event()

    async def run(self) -> None:
        while True:  # until cancelled
            conn, b = await connect_first(self.brokers)
            try:
                await self._serve(conn, amqp_port(b))
            finally:
                await conn.close()

    async def _serve(self, conn: aio_pika.abc.AbstractConnection, port: int) -> None:
        lost = asyncio.Event()  # (closed() waits for a close, not for a lost connection)
        conn.close_callbacks.add(lambda *_: lost.set())
        ch = await conn.channel(publisher_confirms=True)
        await ch.set_qos(prefetch_count=1)
        requests = await ch.declare_queue("rpc_queue", durable=True,
                                          arguments={"x-queue-type": "quorum"})

        async def on_request(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            assert message.reply_to and message.correlation_id
            if message.body == self.stall and not self.killed.is_set():
                self.busy.set()
                await self.killed.wait()
                return
            n = int(message.body)
            await ch.default_exchange.publish(  # returns once confirmed
                aio_pika.Message(str(n * n).encode(), correlation_id=message.correlation_id,
                                 headers={"served-on": port,
                                          "redelivered": message.redelivered}),
                routing_key=message.reply_to,
            )
            await message.ack()

        await requests.consume(on_request)
        self.served_on.append(port)
        await lost.wait()


class RpcClient:
    """The RPC tutorial's client (aio-pika): an exclusive, server-named reply queue,
    consumed without acks; a call publishes ``n`` to ``rpc_queue`` with ``reply_to``
    and a ``correlation_id`` of its own and waits for the answer that carries it (a
    second answer to one call is dropped)."""

    def __init__(self, conn: aio_pika.abc.AbstractConnection) -> None:
        self.conn = conn
        self.answers: dict[str, asyncio.Future[aio_pika.abc.AbstractIncomingMessage]] = {}
        self.reply_queue = ""

    async def open(self) -> None:
        self.ch = await self.conn.channel()
        replies = await self.ch.declare_queue("", exclusive=True)
        assert replies.name.startswith("amq.gen-")
        self.reply_queue = replies.name

        async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            waiting = self.answers.get(message.correlation_id or "")
            if waiting is not None and not waiting.done():
                waiting.set_result(message)

        await replies.consume(on_reply, no_ack=True)

    async def call(self, n: int, timeout: float = 20) -> tuple[int, int, bool]:
        """(the answer, the port of the server's broker, whether the request was
        redelivered to the server)."""
        corr = f"call-{n}"
        self.answers[corr] = asyncio.get_running_loop().create_future()
        await self.ch.default_exchange.publish(
            aio_pika.Message(str(n).encode(), correlation_id=corr, reply_to=self.reply_queue),
            routing_key="rpc_queue",
        )
        answer = await asyncio.wait_for(self.answers[corr], timeout)
        assert answer.correlation_id == corr and answer.headers is not None
        headers = answer.headers
        return int(answer.body), int(str(headers["served-on"])), headers["redelivered"] is True


async def test_rpc_is_answered_across_a_kill_9_of_the_servers_broker(
    amqp_cluster: list[BrokerProcess],  # noqa: F811 (the fixture)
) -> None:
    """The RPC tutorial with aio-pika: the server consumes ``rpc_queue`` on node-1, the
    client's reply queue is on node-2. node-1 is killed -9 while the server works on a
    call; the server reconnects to node-3 and answers that call (redelivered) and every
    later one, each with its own correlation id."""
    b1, b2, b3 = amqp_cluster
    ports = [amqp_port(b) for b in amqp_cluster]
    server = RpcServer([b1, b3, b2], stall=b"4")
    serving = asyncio.create_task(server.run())
    client = RpcClient(await aio_pika.connect(url(b2)))
    try:
        await client.open()
        await eventually(lambda: now(server.served_on), "the server consuming on node-1")
        assert [await client.call(n) for n in (1, 2, 3)] == [(n * n, ports[0], False)
                                                             for n in (1, 2, 3)]
        in_flight = asyncio.create_task(client.call(4))
        await eventually(lambda: now(server.busy.is_set()), "the server busy with call 4")
        b1.kill9()
        server.killed.set()
        later = [await client.call(n) for n in (5, 6, 7, 8)]
        assert later == [(n * n, ports[2], False) for n in (5, 6, 7, 8)]
        assert await in_flight == (16, ports[2], True)
        assert server.served_on == [ports[0], ports[2]]
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await client.conn.close()
    for b in (b2, b3):
        assert "Traceback" not in b.output()


async def test_an_rpc_client_whose_broker_is_killed_declares_a_new_reply_queue(
    amqp_cluster: list[BrokerProcess],  # noqa: F811 (the fixture)
) -> None:
    """The client's broker (node-2) is killed -9: its exclusive reply queue goes with it
    (deleted once the view drops node-2), as RabbitMQ's does with its connection. The
    client reconnects to node-3, declares a new reply queue and its calls are answered
    by the server on node-1."""
    b1, b2, b3 = amqp_cluster
    server = RpcServer([b1])
    serving = asyncio.create_task(server.run())
    client = RpcClient(await aio_pika.connect(url(b2)))
    try:
        await client.open()
        await eventually(lambda: now(server.served_on), "the server consuming on node-1")
        assert await client.call(1) == (1, amqp_port(b1), False)
        old = client.reply_queue
        b2.kill9()
        conn, b = await connect_first([b2, b3])
        assert b is b3
        await client.conn.close()
        client = RpcClient(conn)
        await client.open()
        assert client.reply_queue != old
        assert [await client.call(n) for n in (2, 3)] == [(4, amqp_port(b1), False),
                                                          (9, amqp_port(b1), False)]
        await eventually(lambda: declared(conn, old), "the old reply queue deleted",
                         until=lambda found: not found, timeout=15)
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await client.conn.close()
    for b in (b1, b3):
        assert "Traceback" not in b.output()


async def declared(conn: aio_pika.abc.AbstractConnection, queue: str) -> bool:
    """Whether ``queue`` exists (a passive declare, on a channel of its own)."""
    ch = await conn.channel()
    try:
        await ch.declare_queue(queue, passive=True)
        return True
    except aio_pika.exceptions.ChannelNotFoundEntity:
        return False
    finally:
        if not ch.is_closed:
            await ch.close()


def test_dead_lettering_at_the_delivery_limit_counts_a_kill_9_as_a_failed_delivery(
    amqp_cluster: list[BrokerProcess],  # noqa: F811 (the fixture)
) -> None:
    """``poison`` (``x-delivery-limit`` 2: dead-lettered when returned a third time) is
    declared on node-1 with ``dead`` as its dead-letter queue; a consumer on node-2 nacks
    the message (no failure), rejects it (failure 1), and holds it when node-2 is killed
    -9 (failure 2); reconnected to node-1 it rejects it again (failure 3), and ``dead``,
    read on node-3, gets it exactly once."""
    b1, b2, b3 = amqp_cluster
    conn = connect_any([b1])
    ch = conn.channel()
    ch.queue_declare("dead", durable=True)
    ch.queue_declare("poison", durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 2,
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead",
    })
    ch.confirm_delivery()
    ch.basic_publish("", "poison", b"bad", pika.BasicProperties(message_id="p-1"),
                     mandatory=True)
    conn.close()
    seen: list[tuple[bool, Any, Any]] = []  # redelivered, x-delivery-count, x-acquired-count

    def consume(conn: pika.BlockingConnection) -> tuple[Any, list[int]]:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        tags: list[int] = []

        def on_message(chan: Any, method: Any, props: Any, body: bytes) -> None:
            assert body == b"bad" and props.message_id == "p-1"
            headers = props.headers or {}
            seen.append((method.redelivered, headers.get("x-delivery-count"),
                         headers.get("x-acquired-count")))
            tags.append(method.delivery_tag)

        ch.basic_consume("poison", on_message)
        return ch, tags

    def delivered(conn: pika.BlockingConnection, tags: list[int], n: int) -> None:
        eventually_sync(lambda: conn.process_data_events(time_limit=0.05) or len(tags) >= n,
                        f"delivery {n} on this connection")

    conn = connect_any([b2, b1, b3])
    ch, tags = consume(conn)
    delivered(conn, tags, 1)
    ch.basic_nack(tags[-1], requeue=True)
    delivered(conn, tags, 2)
    ch.basic_reject(tags[-1], requeue=True)
    delivered(conn, tags, 3)
    b2.kill9()  # while the consumer holds it
    with pytest.raises(LOST):
        delivered(conn, tags, 4)
    conn = connect_any([b2, b1, b3])
    assert port_of(conn) == amqp_port(b1)
    ch, tags = consume(conn)
    delivered(conn, tags, 1)
    ch.basic_reject(tags[-1], requeue=True)
    assert seen == [(False, None, None), (True, None, 1), (True, 1, 2), (True, 2, 3)]

    reader = connect_any([b3])
    rch = reader.channel()
    method, props, body = eventually_sync(lambda: rch.basic_get("dead", auto_ack=True),
                                          "the dead letter on node-3",
                                          until=lambda got: got[0] is not None)
    assert body == b"bad" and props.message_id == "p-1"
    assert props.headers["x-death-reason"] == "delivery-limit"
    assert props.headers["x-death-queue"] == "poison"
    assert (props.headers["x-death-delivery-count"], props.headers["x-death-acquired-count"]) == (3, 4)
    # Exactly once: nothing more in either queue, one enqueue of the dead letter.
    poison = eventually_sync(lambda: queue_stats(b3, "poison"), "poison settled",
                             until=lambda s: s["ready"] == 0 and s["acquired"] == 0)
    assert poison["dead_lettered"] == 1 and poison["failed_deliveries"] == 3
    dead = queue_stats(b3, "dead")
    assert (dead["enqueued"], dead["ready"], dead["acquired"]) == (1, 0, 0)
    assert rch.basic_get("dead") == (None, None, None)
    conn.close()
    reader.close()
    for b in (b1, b3):
        assert "Traceback" not in b.output()
