"""Routing: a queue's commands go to a broker that applies the queue's data partition
(docs/client.md "Routing"; docs/design.md §16, "Clients route to replicas").

With replica groups a broker applies only some data partitions. Like a Kafka client
that keeps a connection per partition leader, a :class:`~batonmq.clients.client.Connection`
asks any broker where a queue lives (the ``Locate`` frame: its partition and the client
addresses of the partition's live replicas), opens a connection to one of them when
none is open yet (same credentials and TLS), and sends the queue's commands there.
A cluster without groups (a log of one, or replica groups not enabled) says so: then
everything goes over the one connection, as before, and no other connection is ever
opened; a queue whose partition the connected broker applies is answered ``anywhere``
and served over that connection too.

When the map changes under the client — a command answered "not applied by this
broker" (or ``NotReplica``), a replica's connection lost, a command in flight while
its broker closed the partition (``ShuttingDown``, "served by other brokers now"),
a consumer cancelled
because its broker left the group — the route is looked up again and the command is
sent to a current replica: publishes keep their idempotency keys, so a re-sent one
is enqueued once; a consumer subscribes again (what it held goes back to the queue,
as on failover).

:class:`RouteTable` is the pure part (no I/O, no clock: the caller passes ``now``);
:class:`Router` drives it over the connection's channels, and :class:`RoutedConsumer`
is a consumer that follows its queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from batonmq.clients.conn import Channel
from batonmq.clients.consumer import Consumer
from batonmq.clients.producer import Producer
from batonmq.clients.results import consume_result
from batonmq.clients.wire import Locate
from batonmq.cluster.errors import (
    PARTITION_CLOSED,
    BatonError,
    ConnectionClosed,
    LogUnavailable,
    ProtocolError,
    ShuttingDown,
)

__all__ = ["Route", "RouteTable", "Router", "RoutedConsumer", "misrouted", "send_again"]

_log = logging.getLogger("baton.client")

T = TypeVar("T")

#: Seconds a route with replica addresses is used before it is looked up again.
ROUTE_TTL: Final = 5.0
#: Seconds an address that could not be reached is passed over.
DEAD_FOR: Final = 5.0
# Back-off between attempts of a command whose route changed (doubling).
_BACKOFF_FIRST: Final = 0.05
_BACKOFF_MAX: Final = 1.0

#: What a broker says when it is not (or no longer) a replica of the queue's partition.
_MISROUTED_TEXT: Final = ("is not applied by this broker", PARTITION_CLOSED)


@dataclass(frozen=True, slots=True)
class Route:
    """Where one queue's commands go.

    Attributes:
        partition: the queue's data partition (0: not placed yet).
        anywhere: use the connection as it is (every broker, or the one asked,
            applies it).
        addresses: ``"HOST:PORT"`` of its live caught-up replicas, group order.
        at: when it was learned (the caller's clock).
    """

    partition: int
    anywhere: bool
    addresses: tuple[str, ...]
    at: float


class RouteTable:
    """The routes learned from ``Locate`` answers, and the addresses that failed.

    ``flat`` is True once a broker said the cluster has no replica groups: every queue
    goes over the connection as it is (until a command is answered "not applied here",
    which clears it).
    """

    def __init__(self, ttl: float = ROUTE_TTL, dead_for: float = DEAD_FOR) -> None:
        self.ttl = ttl
        self.dead_for = dead_for
        self.flat = False
        self._routes: dict[str, Route] = {}
        self._dead: dict[str, float] = {}  # address -> when it failed

    def learn(self, queue: str, answer: Mapping[str, Any], now: float) -> Route:
        """Note a ``Locate`` answer for ``queue``.

        Raises:
            ProtocolError: the answer lacks a field or has one of the wrong type.
        """
        partition = answer.get("partition")
        anywhere = answer.get("anywhere")
        addresses = answer.get("addresses")
        groups = answer.get("groups")
        if (
            not isinstance(partition, int) or isinstance(partition, bool) or partition < 0
            or not isinstance(anywhere, bool) or not isinstance(addresses, list)
            or not all(isinstance(a, str) for a in addresses) or not isinstance(groups, bool)
        ):
            raise ProtocolError(f"malformed Locate answer: {dict(answer)!r}")
        route = Route(partition, anywhere, tuple(addresses), now)
        self.flat = not groups
        if partition:  # a queue not placed yet is looked up again next time
            self._routes[queue] = route
        return route

    def route(self, queue: str, now: float) -> Route | None:
        """The route of ``queue`` if known and fresh (an ``anywhere`` one stays until
        :meth:`forget`; one with addresses for ``ttl`` seconds)."""
        route = self._routes.get(queue)
        if route is None or (not route.anywhere and now - route.at >= self.ttl):
            return None
        return route

    def forget(self, queue: str) -> None:
        """The route of ``queue`` is wrong (a broker said so): look it up again."""
        self._routes.pop(queue, None)
        self.flat = False

    def clear(self) -> None:
        """Forget every route (the connection failed over to another broker: an
        ``anywhere`` answer named the broker it left)."""
        self._routes.clear()

    def failed(self, address: str, now: float) -> None:
        """``address`` could not be reached or its connection was lost."""
        self._dead[address] = now

    def dead(self, now: float) -> set[str]:
        """The addresses that failed within ``dead_for`` seconds."""
        for address, at in list(self._dead.items()):
            if now - at >= self.dead_for:
                del self._dead[address]
        return set(self._dead)

    @staticmethod
    def pick(route: Route, open_: Collection[str], avoid: Collection[str]) -> str | None:
        """The replica to send to: one already open, else the first in group order;
        those in ``avoid`` only when every one is.

        Returns:
            An address, or None: any broker does (``anywhere``, or no live replica is
            known: the connected broker then answers why).
        """
        if route.anywhere or not route.addresses:
            return None
        candidates = [a for a in route.addresses if a not in avoid] or list(route.addresses)
        for address in candidates:
            if address in open_:
                return address
        return candidates[0]


def misrouted(exc: BaseException) -> bool:
    """Whether ``exc`` says the broker does not (or no longer) apply the queue's
    partition: ``LogUnavailable`` "not applied by this broker" or "served by other
    brokers now", or the forwarding's ``NotReplica``."""
    if type(exc).__name__ == "NotReplica":
        return True
    return isinstance(exc, LogUnavailable) and any(t in exc.message for t in _MISROUTED_TEXT)


def send_again(exc: BaseException, *, replica: bool, resend: bool) -> bool:
    """Whether a routed command that failed with ``exc`` goes to a replica again.

    Misrouted: always (the broker did not apply it). ``ShuttingDown`` because the
    broker's copy of the queue's partition closed with the command in flight (its
    group changed) and, on a ``replica``'s channel rather than the primary one (which
    has its own failover), a lost connection: the outcome is unknown, so only a command
    that may be applied twice (``resend``: idempotent) goes again. Any other
    ``ShuttingDown`` (the broker stops, or stopped applying) is the caller's to see.
    """
    if misrouted(exc):
        return True
    if isinstance(exc, ShuttingDown) and PARTITION_CLOSED in exc.message:
        return resend
    if replica and isinstance(exc, ConnectionClosed):
        return resend
    return False


class Router:
    """Sends each queue's commands over a connection to one of its replicas.

    Args:
        primary: the connection's channel (the broker :func:`connect` reached; it
            keeps its own failover). Commands without a queue, ``Locate`` and the
            queues every broker applies go over it.
        open_channel: opens a channel to ``"HOST:PORT"`` with the connection's
            credentials and TLS (no failover: a lost replica is routed around).
        enabled: False: every command goes over ``primary`` (``connect(route=False)``).
    """

    def __init__(
        self,
        primary: Channel,
        open_channel: Callable[[str], Awaitable[Channel]],
        *,
        enabled: bool = True,
    ) -> None:
        self.primary = primary
        self.enabled = enabled
        self.table = RouteTable()
        self.table.flat = not enabled
        self._open_channel = open_channel
        self._channels: dict[str, Channel] = {}
        self._opening: dict[str, asyncio.Future[Channel]] = {}
        self._locating: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._failovers = primary.failovers
        self._producers: dict[int, Producer] = {id(primary): Producer(primary)}
        self.closing = False

    @property
    def producer(self) -> Producer:
        """The primary channel's producer (its keys are the connection's keys)."""
        return self._producers[id(self.primary)]

    @property
    def extra_channels(self) -> list[Channel]:
        """The open channels to replicas besides the primary one."""
        return [c for c in self._channels.values() if not c.closed]

    def producer_of(self, channel: Channel) -> Producer:
        """The producer over ``channel``."""
        producer = self._producers.get(id(channel))
        if producer is None:
            producer = self._producers[id(channel)] = Producer(channel)
        return producer

    @property
    def ended(self) -> bool:
        """The connection is closed or closing: nothing is routed any more."""
        return self.closing or self.primary.closed

    async def close(self) -> None:
        """Close every channel opened to a replica (the caller closes the primary)."""
        self.closing = True
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    # --- choosing the channel ---------------------------------------------------------

    async def locate(self, queue: str) -> Route:
        """Ask the connected broker where ``queue`` is served (one question at a time
        per queue: the commands issued meanwhile wait for its answer, in order)."""
        asking = self._locating.get(queue)
        if asking is None:
            primary = self.primary
            corr = primary.next_corr()
            asking = primary.request(Locate(corr, queue), corr, retry=True)
            self._locating[queue] = asking

            def done(f: asyncio.Future[dict[str, Any]]) -> None:
                if self._locating.get(queue) is f:
                    del self._locating[queue]
                consume_result(f)  # every waiter may be gone

            asking.add_done_callback(done)
        answer = await asyncio.shield(asking)
        return self.table.learn(queue, answer, self.primary.loop.time())

    async def channel(self, queue: str, avoid: Collection[str] = ()) -> Channel:
        """The channel to send ``queue``'s commands over (opened if needed).

        Raises:
            ConnectionClosed: the connection ended, or the replica cannot be reached
                (it is passed over for a while).
            BatonError: the broker refused the ``Locate`` (e.g. no right on the queue).
        """
        if self.table.flat or not self.enabled or not self.primary.locates:
            return self.primary  # (a broker before Locate: no routing, as before)
        if self.primary.failovers != self._failovers:
            self._failovers = self.primary.failovers
            self.table.clear()
        now = self.primary.loop.time()
        route = self.table.route(queue, now)
        if route is None:
            route = await self.locate(queue)
            now = self.primary.loop.time()
        open_ = {a for a, c in self._channels.items() if not c.closed}
        open_.add(self.primary.address)
        address = RouteTable.pick(route, open_, set(avoid) | self.table.dead(now))
        if address is None or address == self.primary.address:
            return self.primary
        return await self._open(address)

    async def _open(self, address: str) -> Channel:
        channel = self._channels.get(address)
        if channel is not None and not channel.closed:
            return channel
        opening = self._opening.get(address)
        if opening is None:
            opening = self.primary.loop.create_future()
            self._opening[address] = opening
            try:
                channel = await self._open_channel(address)
            except BaseException as exc:
                self.table.failed(address, self.primary.loop.time())
                del self._opening[address]
                err = ConnectionClosed(f"cannot reach the replica {address}: {exc}")
                opening.set_exception(err)
                opening.exception()  # others may not wait for it
                raise err from exc
            del self._opening[address]
            if self.ended:
                await channel.close()
                raise self.primary.closed_again()
            self._channels[address] = channel
            opening.set_result(channel)
            _log.info("routing: connected to replica %s (node %s)", address, channel.node_id)
            return channel
        return await asyncio.shield(opening)

    # --- sending ----------------------------------------------------------------------

    def retriable(self, exc: BaseException, channel: Channel, resend: bool) -> bool:
        """Whether a command that failed with ``exc`` on ``channel`` goes to another
        replica: the broker did not apply it (misrouted), or a replica's connection
        was lost and the command may be sent again (``resend``: idempotent)."""
        if self.ended or not self.enabled:
            return False
        replica = channel is not self.primary
        if replica and isinstance(exc, ConnectionClosed):
            self.table.failed(channel.address, self.primary.loop.time())
        return send_again(exc, replica=replica, resend=resend)

    async def run(
        self, queue: str, command: Callable[[Channel], Awaitable[T]], *, resend: bool = True
    ) -> T:
        """Send ``command`` over the channel of ``queue``'s replica; when the route
        turns out wrong (or the replica is lost and ``resend``), look it up again and
        send it again, until the primary's failover timeout.

        Raises:
            What the command raises otherwise; the last error after the timeout.
        """
        loop = self.primary.loop
        deadline = loop.time() + self.primary.failover.timeout
        delay = _BACKOFF_FIRST
        avoid: set[str] = set()
        while True:
            channel: Channel | None = None
            try:
                channel = await self.channel(queue, avoid)
                return await command(channel)
            except BatonError as exc:
                if channel is None:  # no channel: the replica could not be reached
                    if self.ended or loop.time() >= deadline:
                        raise
                elif not self.retriable(exc, channel, resend) or loop.time() >= deadline:
                    raise
                else:
                    if channel is not self.primary:
                        avoid.add(channel.address)
                    _log.info("routing: %s on %s for queue %r; routing again",
                              type(exc).__name__, channel.address, queue)
                self.table.forget(queue)
                await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))
                delay = min(delay * 2, _BACKOFF_MAX)


class RoutedConsumer(Consumer):
    """A consumer that subscribes on a replica of its queue's partition and, when that
    broker leaves the group or is lost, subscribes again on a current replica without
    the application seeing an error (what it held goes back to the queue)."""

    __slots__ = ("_router", "_moving")

    def __init__(
        self, router: Router, queue: str, prefetch: int, ack_timeout: float | None = None
    ) -> None:
        super().__init__(router.primary, queue, prefetch, ack_timeout)
        self._router = router
        self._moving = False

    @property
    def channel(self) -> Channel:
        """The channel the consumer is (or was last) subscribed over."""
        conn = self._conn
        assert isinstance(conn, Channel)
        return conn

    async def start(self) -> None:
        """Subscribe on a replica of the queue's partition (see :meth:`Consumer.start`)."""

        async def subscribe(channel: Channel) -> None:
            self._conn = channel
            await Consumer.start(self)

        await self._router.run(self.queue, subscribe)

    def end(self, error: BaseException | None) -> None:
        """End iteration, unless ``error`` says the queue moved or its replica was
        lost: then subscribe again on a current replica."""
        router = self._router
        moved = error is not None and self.active and router.enabled and not router.ended and (
            misrouted(error)
            or isinstance(error, ConnectionClosed) and self.channel is not router.primary
        )
        if not moved:
            Consumer.end(self, error)
            return
        _log.warning("consumer of %r: %s; subscribing again on a current replica",
                     self.queue, error)
        self.failed_over()
        if not self._moving:
            self._moving = True
            router.primary.background(self._move(error))

    async def _move(self, error: BaseException | None) -> None:
        router = self._router
        old = self.channel
        loop = router.primary.loop
        deadline = loop.time() + router.primary.failover.timeout
        delay = _BACKOFF_FIRST
        router.table.forget(self.queue)
        if old is not router.primary:
            router.table.failed(old.address, loop.time())
        try:
            while self.active and not router.ended:
                try:
                    channel = await router.channel(self.queue, {old.address})
                except BatonError as exc:
                    error = exc
                else:
                    self._conn = channel
                    self.resubscribe()  # a failure comes back through end()
                    return
                if loop.time() >= deadline:
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
                router.table.forget(self.queue)
        finally:
            self._moving = False
        Consumer.end(self, error)
