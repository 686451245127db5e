"""Client adapters: the few calls the workers make, for each system under test.

The workers (:mod:`batonmq.loadtest.worker`) run the same workload on every system through a
:class:`ClientAdapter`: declare, purge, publish with a confirm, subscribe with a
prefetch, take deliveries in batches and settle them (ack / release / reject). Baton's
adapter is here; RabbitMQ's and NATS JetStream's are in :mod:`batonmq.loadtest.peers`;
:func:`batonmq.loadtest.connect.open_adapter` picks one by name.

What a settlement means differs by protocol, and the history says which (see
docs/loadtest.md): Baton confirms a batch of accepts (``ack_many(confirm=True)``); an
AMQP 0-9-1 ``basic.ack`` and a NATS ``+ACK`` have no reply, so for RabbitMQ and NATS an
``ack-ok`` record means the ack was written to the connection.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple, Protocol

from batonmq import clients
from batonmq.cluster.errors import BatonError


__all__ = [
    "Delivery",
    "Subscription",
    "ClientAdapter",
    "BatonAdapter",
    "ADAPTERS",
]

ADAPTERS = ("baton", "rabbitmq", "nats")


class Delivery(NamedTuple):
    """One delivered message.

    Attributes:
        position: its position in the queue (-1 where the system has none).
        delivery_count: how many times it was delivered before (0 the first time).
        body: the body (its id leads it, see :func:`batonmq.loadtest.history.make_body`).
        handle: the client library's own message object (for settling it).
    """

    position: int
    delivery_count: int
    body: bytes
    handle: Any


class Subscription(Protocol):
    """A consumer of one queue."""

    async def get_many(self, max_count: int, timeout: float) -> list[Delivery]:
        """Up to ``max_count`` deliveries; [] after ``timeout`` s without one."""
        ...

    async def ack_many(self, deliveries: list[Delivery]) -> list[BaseException | None]:
        """Accept them; per delivery, None or the error (failed, or outcome unknown)."""
        ...

    async def release_many(self, deliveries: list[Delivery]) -> None:
        """Give them back (delivery count + 1)."""
        ...

    async def reject_many(self, deliveries: list[Delivery]) -> None:
        """Reject them (dead-letter or drop)."""
        ...

    async def close(self) -> None:
        """Cancel the subscription (unsettled messages go back)."""
        ...


class ClientAdapter(Protocol):
    """A connection to the system under test, with the calls the harness makes.

    Attributes:
        name: the system (``baton``, ``rabbitmq``, ``nats``).
        errors: the exceptions that mean "this operation failed or its outcome is
            unknown" (recorded as ``*-fail`` / ``consumer-lost``, never fatal).
    """

    name: str
    errors: tuple[type[BaseException], ...]

    @property
    def address(self) -> str:
        """The broker the connection is on now."""
        ...

    @property
    def failovers(self) -> int:
        """How many times the connection moved to another broker."""
        ...

    async def declare(self, queue: str, delivery_limit: int, dead_letter: str | None) -> None:
        """Create the queue (or check it)."""
        ...

    async def purge(self, queue: str) -> None:
        """Drop its ready messages."""
        ...

    async def publish(self, queue: str, body: bytes) -> int:
        """Publish and wait for the confirm; returns the position (-1 if none)."""
        ...

    async def subscribe(self, queue: str, prefetch: int) -> Subscription:
        """Start a consumer of ``queue`` with at most ``prefetch`` unsettled messages."""
        ...

    async def depth(self, queue: str) -> tuple[int, dict[str, Any]]:
        """Messages still on the queue (ready + unsettled), and the raw stats."""
        ...

    async def close(self) -> None:
        """Close the connection."""
        ...


class _BatonSubscription:
    def __init__(self, consumer: clients.Consumer) -> None:
        self.consumer = consumer

    async def get_many(self, max_count: int, timeout: float) -> list[Delivery]:
        msgs = await self.consumer.get_many(max_count, timeout=timeout)
        return [Delivery(m.position, m.delivery_count, m.body, m) for m in msgs]

    async def ack_many(self, deliveries: list[Delivery]) -> list[BaseException | None]:
        # One confirmed ack per message (the client still sends them in one frame per
        # loop tick): each message gets its own outcome, where ack_many(confirm=True)
        # would fail the whole batch on its first refused position.
        results = await asyncio.gather(
            *(d.handle.ack(confirm=True) for d in deliveries), return_exceptions=True
        )
        return [r if isinstance(r, BaseException) else None for r in results]

    async def release_many(self, deliveries: list[Delivery]) -> None:
        await self.consumer.release_many([d.handle for d in deliveries], failed=True)

    async def reject_many(self, deliveries: list[Delivery]) -> None:
        await self.consumer.reject_many([d.handle for d in deliveries])

    async def close(self) -> None:
        await self.consumer.cancel()


class BatonAdapter:
    """Baton through :mod:`clients` (one connection, failover over all addresses)."""

    name = "baton"
    errors: tuple[type[BaseException], ...] = (BatonError,)

    def __init__(self, conn: clients.Connection) -> None:
        self.conn = conn

    @classmethod
    async def open(cls, addresses: list[str]) -> BatonAdapter:
        """Connect (with failover over all the addresses)."""
        return cls(await clients.connect(addresses, client_name="baton-loadtest"))

    @property
    def address(self) -> str:
        return self.conn.address

    @property
    def failovers(self) -> int:
        return self.conn.failovers

    async def declare(self, queue: str, delivery_limit: int, dead_letter: str | None) -> None:
        await self.conn.declare_queue(queue, delivery_limit=delivery_limit, dead_letter=dead_letter)

    async def purge(self, queue: str) -> None:
        await self.conn.purge_queue(queue)

    async def publish(self, queue: str, body: bytes) -> int:
        return await self.conn.publish(queue, body)

    # -- work-queue features (Baton only; the workers check the adapter's type) --------

    async def declare_work(
        self, queue: str, delivery_limit: int, dead_letter: str | None, retry_delay: float
    ) -> None:
        """Create the queue with a fixed retry policy (``retry_delay`` s; 0: none)."""
        retry = clients.Retry("fixed", retry_delay) if retry_delay > 0 else None
        await self.conn.declare_queue(
            queue, delivery_limit=delivery_limit, dead_letter=dead_letter, retry=retry
        )

    async def publish_delayed(self, queue: str, body: bytes, delay: float) -> int:
        """Publish a message the queue holds from consumers for ``delay`` seconds."""
        return await self.conn.publish(queue, body, delay=delay)

    async def subscribe(self, queue: str, prefetch: int) -> Subscription:
        consumer = self.conn.consume(queue, prefetch=prefetch)
        await consumer.start()
        return _BatonSubscription(consumer)

    # -- service leadership (Baton only) ---------------------------------------------

    @property
    def closed(self) -> bool:
        """The connection ended (failover gave up, or it was closed)."""
        return self.conn.closed

    def lead(self, service: str, timeout: float | None) -> clients.Term:
        """Run for leader of ``service``: ``async with adapter.lead(...) as term``."""
        return self.conn.lead(service, timeout=timeout)

    async def depth(self, queue: str) -> tuple[int, dict[str, Any]]:
        stats = await self.conn.queue_stats(queue)
        held = int(stats.get("ready", 0)) + int(stats.get("acquired", 0))
        return held + int(stats.get("delayed", 0)), stats  # (delayed: still on the queue)

    async def close(self) -> None:
        await self.conn.close()
