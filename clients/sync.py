"""The blocking client: the async client run on a private event loop in a daemon thread.

Every call is ``asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)`` around the
same :class:`~batonmq.clients.client.Connection` method, so both clients share one
implementation and one set of semantics. Deliveries are taken from the loop thread in
batches (one cross-thread hop per batch, not per message).

Size: a little over 800 lines, because it mirrors each command of the async
:class:`~batonmq.clients.client.Connection` with one blocking method (as client.py has one
per command): split, one API would be spread over modules.

Example::

    from batonmq import clients

    with clients.sync.connect("127.0.0.1:5671") as conn:
        conn.publish("orders", b"body")
        with conn.consume("orders", prefetch=100) as consumer:
            for msg in consumer.iter(timeout=5.0):
                msg.ack()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from ssl import SSLContext
from types import TracebackType
from typing import Any, Final, TypeVar

from batonmq.clients import client as _aio
from batonmq.clients.consumer import Consumer, Message
from batonmq.clients.leadership import HandoverResult, ServiceInfo, Term
from batonmq.cluster.errors import ConnectionClosed, InvalidArgument, Timeout
from batonmq.cluster.results import (
    GroupChanged,
    MessageHistory,
    PartitionsGrown,
    Rebalanced,
    ReplicationSet,
    Peeked,
    PolicyChanged,
    Routed,
)

__all__ = ["connect", "SyncConnection", "SyncConsumer", "SyncMessage", "SyncTerm"]

_T = TypeVar("_T")

#: How many buffered deliveries one cross-thread hop takes at most.
_TAKE_MAX: Final = 1024


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # imported lazily: importing clients must stay cheap
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class _LoopThread:
    """A private event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self._main, name="baton-client", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                # What a call left running (an interrupted connect) ends here, not
                # as a "Task was destroyed" line and a traceback at exit.
                pending = asyncio.all_tasks(self.loop)
                for task in pending:
                    task.cancel()
                if pending:
                    self.loop.run_until_complete(
                        asyncio.gather(*pending, return_exceptions=True)
                    )
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float | None) -> _T:
        """Run ``coro`` on the loop and wait for it.

        Raises:
            Timeout: it did not finish within ``timeout`` seconds (it is cancelled;
                its outcome is unknown).
            Whatever ``coro`` raises.
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise InvalidArgument("a blocking call was made from the client's own loop thread")
        if not self._thread.is_alive():
            coro.close()
            raise ConnectionClosed("the client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise Timeout(f"no answer within {timeout} s; the outcome is unknown") from None
        except BaseException:
            future.cancel()  # interrupted (Ctrl-C): the call ends with the caller
            raise

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if threading.current_thread() is not self._thread:
                self._thread.join()


def connect(
    addresses: str | Sequence[str],
    *,
    client_name: str = "baton-python",
    timeout: float = 10.0,
    failover: bool | None = None,
    failover_timeout: float = 30.0,
    ssl: SSLContext | bool | None = None,
    keepalive: float | None = None,
    username: str | None = None,
    password: str | None = None,
    route: bool = True,
) -> SyncConnection:
    """Open a blocking connection (see :func:`batonmq.clients.client.connect`).

    Args:
        addresses: ``"HOST:PORT"``, a comma-separated list of them, or a sequence.
        client_name: sent in Hello.
        timeout: seconds per address for connecting, and the default time limit of
            every later call on the connection (a call that waits for a failover
            may hit it first: raise it to ``failover_timeout`` or more if calls
            should rather wait).
        failover, failover_timeout, ssl, keepalive, username, password, route: as for
            :func:`batonmq.clients.client.connect` (the URL form names the user too).

    Returns:
        A :class:`SyncConnection`; use it as ``with clients.sync.connect(...) as conn``.

    Raises:
        InvalidArgument: an address cannot be parsed.
        AccessRefused: a broker refused the login.
        ConnectionClosed: no address worked.
    """
    thread = _LoopThread()
    try:
        conn = thread.run(
            _aio.connect(
                addresses,
                client_name=client_name,
                timeout=timeout,
                failover=failover,
                failover_timeout=failover_timeout,
                ssl=ssl,
                keepalive=keepalive,
                username=username,
                password=password,
                route=route,
            ),
            # connect applies the timeout per address; allow for all of them.
            None,
        )
    except BaseException:
        thread.stop()
        raise
    return SyncConnection(conn, thread, timeout)


class SyncConnection:
    """A blocking :class:`~batonmq.clients.client.Connection`: the same calls, the same results.

    Each call blocks until the broker answers or ``timeout`` seconds pass (then
    :class:`~batonmq.cluster.errors.Timeout`, outcome unknown). It is safe to call from
    several threads at once.

    Attributes:
        timeout: the default time limit of each call, in seconds (None: no limit).
    """

    def __init__(self, conn: _aio.Connection, thread: _LoopThread, timeout: float | None) -> None:
        self._conn = conn
        self._thread = thread
        self.timeout = timeout

    @property
    def connection(self) -> _aio.Connection:
        """The async connection underneath (use it only from its loop thread)."""
        return self._conn

    @property
    def address(self) -> str:
        """``"HOST:PORT"`` of the broker."""
        return self._conn.address

    @property
    def replica_connections(self) -> list[str]:
        """The brokers opened besides :attr:`address` to reach queues' replicas
        (docs/client.md "Routing")."""
        return self._conn.replica_connections

    @property
    def node_id(self) -> str:
        """The broker's node id from HelloOk."""
        return self._conn.node_id

    @property
    def server(self) -> str:
        """The broker's name/version string from HelloOk."""
        return self._conn.server

    @property
    def max_message(self) -> int:
        """The largest message body the broker accepts, in bytes."""
        return self._conn.max_message

    @property
    def closed(self) -> bool:
        """True once the connection has ended."""
        return self._conn.closed

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run a coroutine of the async connection on its loop and wait for it, at
        most :attr:`timeout` seconds.

        Raises:
            Timeout: no result in time (the coroutine is cancelled; its outcome is
                unknown).
            Whatever ``coro`` raises.
        """
        return self._thread.run(coro, self.timeout)

    def run_unbounded(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """As :meth:`run`, without a time limit (for calls that bound their own wait)."""
        return self._thread.run(coro, None)

    def close(self) -> None:
        """Close the connection and stop its loop thread. Closing twice is harmless."""
        try:
            if not self._conn.closed or self._thread.loop.is_running():
                self._thread.run(self._conn.close(), None)
        except ConnectionClosed:
            pass
        finally:
            self._thread.stop()

    def __enter__(self) -> SyncConnection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SyncConnection {self._conn!r}>"

    def ping(self) -> float:
        """Round trip to the broker in seconds (see :meth:`Connection.ping`)."""
        return self.run(self._conn.ping())

    def topology(self) -> dict[str, Any]:
        """The cluster's view (see :meth:`Connection.topology`)."""
        return self.run(self._conn.topology())

    def declare_queue(
        self,
        name: str,
        *,
        durable: bool = True,
        max_length: int | None = None,
        overflow: str = "reject-publish",
        delivery_limit: int = 20,
        dead_letter: str | None = None,
        message_ttl: float | None = None,
        retry: _aio.Retry | None = None,
        ack_timeout: float | None = None,
        max_priority: int | None = None,
        single_active_consumer: bool = False,
        dedupe_window: float | None = None,
        dead_letter_exchange: str | None = None,
        dead_letter_routing_key: str | None = None,
        partition: int | None = None,
        expires: float | None = None,
    ) -> dict[str, Any]:
        """Create a queue or check its settings (see :meth:`Connection.declare_queue`)."""
        return self.run(
            self._conn.declare_queue(
                name,
                durable=durable,
                max_length=max_length,
                overflow=overflow,
                delivery_limit=delivery_limit,
                dead_letter=dead_letter,
                message_ttl=message_ttl,
                retry=retry,
                ack_timeout=ack_timeout,
                max_priority=max_priority,
                single_active_consumer=single_active_consumer,
                dedupe_window=dedupe_window,
                dead_letter_exchange=dead_letter_exchange,
                dead_letter_routing_key=dead_letter_routing_key,
                partition=partition,
                expires=expires,
            )
        )

    def declare_exchange(self, name: str, type: str, **settings: Any) -> bool:
        """Create an exchange or check its settings; returns whether it was created
        (keyword settings as :meth:`Connection.declare_exchange`)."""
        return self.run(self._conn.declare_exchange(name, type, **settings))

    def list_exchanges(self) -> list[dict[str, Any]]:
        """Every exchange you have a right on, with its settings and bindings (see
        :meth:`Connection.list_exchanges`)."""
        return self.run(self._conn.list_exchanges())

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> int:
        """Delete an exchange; returns how many bindings went with it."""
        return self.run(self._conn.delete_exchange(name, if_unused=if_unused))

    def bind_queue(
        self, queue: str, exchange: str, routing_key: str = "",
        arguments: Mapping[str, Any] | None = None, *, unbind: bool = False,
    ) -> bool:
        """Bind a queue to an exchange, or (``unbind``) remove the binding."""
        return self.run(
            self._conn.bind_queue(queue, exchange, routing_key, arguments, unbind=unbind)
        )

    def bind_exchange(
        self, destination: str, source: str, routing_key: str = "",
        arguments: Mapping[str, Any] | None = None, *, unbind: bool = False,
    ) -> bool:
        """Bind exchange ``destination`` to exchange ``source``, or (``unbind``) remove
        the binding (see :meth:`Connection.bind_exchange`)."""
        return self.run(
            self._conn.bind_exchange(destination, source, routing_key, arguments, unbind=unbind)
        )

    def publish_to(
        self, exchange: str, routing_key: str, body: bytes | bytearray | memoryview,
        headers: Mapping[str, Any] | None = None, **options: Any,
    ) -> Routed:
        """Publish one message through an exchange (see :meth:`Connection.publish_to`)."""
        return self.run(self._conn.publish_to(exchange, routing_key, body, headers, **options))

    def delete_queue(self, name: str) -> int:
        """Delete a queue; returns how many messages were dropped."""
        return self.run(self._conn.delete_queue(name))

    def purge_queue(self, name: str) -> int:
        """Drop a queue's ready messages; returns how many."""
        return self.run(self._conn.purge_queue(name))

    def queue_stats(self, name: str) -> dict[str, Any]:
        """A queue's counters (at least ``"ready"`` and ``"acquired"``)."""
        return self.run(self._conn.queue_stats(name))

    def list_queues(self) -> list[dict[str, Any]]:
        """Every queue's stats."""
        return self.run(self._conn.list_queues())

    def put_user(self, name: str, password: str, *, admin: bool = False) -> bool:
        """Add a user or change its password (see :meth:`Connection.put_user`)."""
        return self.run(self._conn.put_user(name, password, admin=admin))

    def delete_user(self, name: str) -> bool:
        """Remove a user (see :meth:`Connection.delete_user`)."""
        return self.run(self._conn.delete_user(name))

    def list_users(self) -> list[dict[str, Any]]:
        """Every user and its rights."""
        return self.run(self._conn.list_users())

    def list_features(self) -> list[dict[str, Any]]:
        """The feature flags (see :meth:`Connection.list_features`)."""
        return self.run(self._conn.list_features())

    def enable_features(self, names: list[str] | None = None) -> list[str]:
        """Enable feature flags (see :meth:`Connection.enable_features`)."""
        return self.run(self._conn.enable_features(names))

    def grow_partitions(self, count: int) -> PartitionsGrown:
        """Grow the cluster's data partitions (see :meth:`Connection.grow_partitions`)."""
        return self.run(self._conn.grow_partitions(count))

    def move_partition(self, partition: int, source: str, target: str) -> GroupChanged:
        """Move a partition's replica (see :meth:`Connection.move_partition`)."""
        return self.run(self._conn.move_partition(partition, source, target))

    def rebalance_partitions(self, dry_run: bool = False) -> Rebalanced:
        """Even out the partitions per broker (see :meth:`Connection.rebalance_partitions`)."""
        return self.run(self._conn.rebalance_partitions(dry_run))

    def set_replicas(self, replicas: int) -> ReplicationSet:
        """Set the replica group size (see :meth:`Connection.set_replicas`)."""
        return self.run(self._conn.set_replicas(replicas))

    def set_permissions(
        self,
        name: str,
        *,
        configure: str | None = None,
        write: str | None = None,
        read: str | None = None,
        lead: str | None = None,
    ) -> None:
        """Set a user's rights (see :meth:`Connection.set_permissions`)."""
        self.run(self._conn.set_permissions(
            name, configure=configure, write=write, read=read, lead=lead
        ))

    def set_user_limits(
        self,
        name: str,
        *,
        max_queues: int | None = None,
        max_connections: int | None = None,
        max_consumers: int | None = None,
        reset: tuple[str, ...] = (),
    ) -> None:
        """Set a user's limits (see :meth:`Connection.set_user_limits`)."""
        self.run(self._conn.set_user_limits(
            name, max_queues=max_queues, max_connections=max_connections,
            max_consumers=max_consumers, reset=reset,
        ))

    def set_user_tags(self, name: str, tags: list[str]) -> None:
        """Set a user's tags (see :meth:`Connection.set_user_tags`)."""
        self.run(self._conn.set_user_tags(name, tags))

    def list_policies(self) -> list[dict[str, Any]]:
        """Every policy (see :meth:`Connection.list_policies`)."""
        return self.run(self._conn.list_policies())

    def set_policy(self, name: str, pattern: str, definition: dict[str, Any], *,
                   priority: int = 0, apply_to: str = "queues") -> PolicyChanged:
        """Add or replace a policy (see :meth:`Connection.set_policy`)."""
        return self.run(self._conn.set_policy(name, pattern, definition, priority=priority,
                                              apply_to=apply_to))

    def clear_policy(self, name: str) -> PolicyChanged:
        """Remove a policy (see :meth:`Connection.clear_policy`)."""
        return self.run(self._conn.clear_policy(name))

    def peek(self, queue: str, count: int = 10) -> Peeked:
        """Ready messages without acquiring them (see :meth:`Connection.peek`)."""
        return self.run(self._conn.peek(queue, count))

    def connections(self) -> list[dict[str, Any]]:
        """The broker's client connections (see :meth:`Connection.connections`)."""
        return self.run(self._conn.connections())

    def message_history(self, queue: str, position: int, max_records: int = 0) -> MessageHistory:
        """A message's life from the log (see :meth:`Connection.message_history`)."""
        return self.run(self._conn.message_history(queue, position, max_records))

    def reserve(
        self, queue: str, holder: str | None, *, service: str = "", token: int = -1
    ) -> dict[str, Any]:
        """Reserve a queue for a range reader, fenced by a term if ``service`` and
        ``token`` are given (see :meth:`batonmq.clients.client.Connection.reserve`)."""
        return self.run(self._conn.reserve(queue, holder, service=service, token=token))

    def accept_through(
        self, queue: str, through: int, holder: str, *, service: str = "", token: int = -1
    ) -> int:
        """Accept every ready message below ``through``, fenced by a term if ``service``
        and ``token`` are given (see the async client)."""
        return self.run(
            self._conn.accept_through(queue, through, holder, service=service, token=token)
        )

    def read_range(
        self, queue: str, start: int, end: int, *, limit: int = 10_000
    ) -> tuple[list[list[Any]], int]:
        """Read positions ``start <= p < end`` without acquiring (see the async client)."""
        return self.run(self._conn.read_range(queue, start, end, limit=limit))

    def publish(
        self,
        queue: str,
        body: bytes | bytearray | memoryview,
        headers: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        delay: float | None = None,
        not_before: float | datetime | None = None,
        priority: int | None = None,
        ttl: float | None = None,
    ) -> int:
        """Publish one message; returns its position once confirmed (``delay``,
        ``not_before``: a delayed message, as :meth:`Connection.publish`).

        Raises:
            The same as :meth:`Connection.publish`, and Timeout.
        """
        return self.run(
            self._conn.publish(
                queue,
                body,
                headers,
                idempotency_key=idempotency_key,
                delay=delay,
                not_before=not_before,
                priority=priority,
                ttl=ttl,
            )
        )

    def publish_batch(
        self,
        queue: str,
        messages: Iterable[bytes | bytearray | memoryview | tuple[bytes, Mapping[str, Any]]],
        *,
        idempotency_key: str | None = None,
        delay: float | None = None,
        not_before: float | datetime | None = None,
        priority: int | None = None,
        ttl: float | None = None,
    ) -> list[int]:
        """Publish many messages; returns their positions once all are confirmed.

        Atomic per frame only, as :meth:`Connection.publish_batch`.
        """
        items = list(messages)  # consume the iterable in the caller's thread
        return self.run(
            self._conn.publish_batch(
                queue,
                items,
                idempotency_key=idempotency_key,
                delay=delay,
                not_before=not_before,
                priority=priority,
                ttl=ttl,
            )
        )

    def consume(
        self, queue: str, *, prefetch: int = 100, ack_timeout: float | None = None
    ) -> SyncConsumer:
        """A blocking consumer of ``queue``; subscribe by entering it (``with``)."""
        return SyncConsumer(
            self, self._conn.consume(queue, prefetch=prefetch, ack_timeout=ack_timeout)
        )

    def lead(self, service: str, *, timeout: float | None = None) -> SyncTerm:
        """Run for leader of ``service``; ``with conn.lead(name) as term:`` blocks until
        this session leads (see :meth:`Connection.lead`; ``timeout`` bounds the wait,
        not the connection's call timeout)."""
        return SyncTerm(self, self._conn.lead(service, timeout=timeout))

    def services(self) -> list[ServiceInfo]:
        """Every service's leader, token and candidates (see :meth:`Connection.services`)."""
        return self.run(self._conn.services())

    def service_leader(self, service: str) -> ServiceInfo | None:
        """One service's leadership, or None (see :meth:`Connection.service_leader`)."""
        return self.run(self._conn.service_leader(service))

    def handover(
        self, service: str, *, to: str | None = None, timeout: float = 30.0
    ) -> HandoverResult:
        """Ask the leader to hand over and wait for the next term (see
        :meth:`Connection.handover`); ``timeout`` bounds the whole call."""
        return self._thread.run(
            self._conn.handover(service, to=to, timeout=timeout), timeout + 15
        )


class SyncTerm:
    """A blocking :class:`~batonmq.clients.leadership.Term`: ``with conn.lead(name) as term``.

    ``term.lost`` and ``term.handover_requested`` are :class:`threading.Event` objects
    that follow the async term's events; ``term.token`` is the fencing token.
    """

    def __init__(self, conn: SyncConnection, term: Term) -> None:
        self._conn = conn
        self._term = term
        self.lost = threading.Event()
        self.handover_requested = threading.Event()
        self._mirrors: list[asyncio.Task[None]] = []

    @property
    def service(self) -> str:
        return self._term.service

    @property
    def token(self) -> int:
        """The term's fencing token (-1 before it was granted)."""
        return self._term.token

    @property
    def candidate(self) -> str:
        return self._term.candidate

    @property
    def leading(self) -> bool:
        return self._term.leading

    def __repr__(self) -> str:
        return f"<SyncTerm {self._term!r}>"

    def __enter__(self) -> SyncTerm:
        self._conn.run_unbounded(self._enter())
        return self

    async def _enter(self) -> None:
        term = self._term
        await term.__aenter__()
        loop = asyncio.get_running_loop()
        self._mirrors = [
            loop.create_task(_mirror(term.lost, self.lost)),
            loop.create_task(_mirror(term.handover_requested, self.handover_requested)),
        ]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._conn.run(self._exit())
        except (ConnectionClosed, Timeout):
            if exc is None:
                raise
        finally:
            self.lost.set()

    async def _exit(self) -> None:
        for task in self._mirrors:
            task.cancel()
        await self._term.__aexit__(None, None, None)


async def _mirror(source: asyncio.Event, target: threading.Event) -> None:
    await source.wait()
    target.set()


class SyncConsumer:
    """A blocking :class:`~batonmq.clients.consumer.Consumer`: a context manager and an iterator.

    ``for msg in consumer`` blocks until the next message and ends when the consumer is
    cancelled; ``consumer.iter(timeout=...)`` and ``consumer.next(timeout=...)`` raise
    :class:`~batonmq.cluster.errors.Timeout` when no message arrives in time. Use one consumer
    from one thread at a time.
    """

    def __init__(self, conn: SyncConnection, consumer: Consumer) -> None:
        self._conn = conn
        self._consumer = consumer
        self._local: deque[SyncMessage] = deque()

    @property
    def queue(self) -> str:
        """The queue's name."""
        return self._consumer.queue

    @property
    def tag(self) -> int:
        """The broker's consumer tag (0 until subscribed)."""
        return self._consumer.tag

    def __enter__(self) -> SyncConsumer:
        self._conn.run(self._consumer.start())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.cancel()
        except (ConnectionClosed, Timeout):
            if exc is None:
                raise

    def cancel(self) -> int:
        """Stop the consumer; returns how many messages the broker released.

        Messages taken from the broker but not yet returned by :meth:`next` go
        back without raising their delivery count (only their acquired count).
        """
        unread = [m.message for m in self._local]
        self._local.clear()
        return self._conn.run(self._consumer.cancel_with_unread(unread))

    def __iter__(self) -> Iterator[SyncMessage]:
        return self.iter()

    def iter(self, timeout: float | None = None) -> Iterator[SyncMessage]:
        """Iterate over deliveries.

        Args:
            timeout: the longest wait for each message (None: wait forever).

        Raises:
            Timeout: no message arrived within ``timeout``.
            ConnectionClosed, or the broker's error if it cancelled the consumer.
        """
        while True:
            try:
                yield self.next(timeout)
            except StopIteration:
                return

    def __next__(self) -> SyncMessage:
        return self.next()

    def next(self, timeout: float | None = None) -> SyncMessage:
        """The next message.

        Args:
            timeout: the longest wait in seconds (None: wait forever).

        Raises:
            Timeout: no message arrived in time.
            StopIteration: the consumer was cancelled.
            ConnectionClosed, or the broker's error if it cancelled the consumer.
        """
        if self._local:
            return self._local.popleft()
        batch, ended = self._conn.run_unbounded(_take(self._consumer, timeout))
        if not batch:
            if ended:
                raise StopIteration
            raise Timeout(f"no message within {timeout} s")
        conn = self._conn
        local = self._local
        for msg in batch:
            local.append(SyncMessage(conn, msg))
        return local.popleft()

    def ack_many(self, messages: Iterable[SyncMessage], *, confirm: bool = False) -> None:
        """Accept several messages with one frame."""
        self._conn.run(
            self._consumer.ack_many([m.message for m in messages], confirm=confirm)
        )

    def release_many(
        self, messages: Iterable[SyncMessage], *, failed: bool = False, confirm: bool = False
    ) -> None:
        """Release several messages with one frame ("not now", or ``failed``: see
        :meth:`batonmq.clients.consumer.Message.release`)."""
        self._conn.run(
            self._consumer.release_many(
                [m.message for m in messages], failed=failed, confirm=confirm
            )
        )

    def reject_many(self, messages: Iterable[SyncMessage], *, confirm: bool = False) -> None:
        """Reject several messages with one frame."""
        self._conn.run(
            self._consumer.reject_many([m.message for m in messages], confirm=confirm)
        )


async def _take(consumer: Consumer, timeout: float | None) -> tuple[list[Message], bool]:
    """Runs on the loop: wait up to ``timeout`` for deliveries and take a batch.

    The timeout is applied here, on the loop, and not to the cross-thread future, so a
    batch taken from the consumer's buffer can never be lost to a timeout race.

    Returns:
        The messages (possibly none) and whether the consumer ended normally.
    """
    try:
        first = await consumer.get(timeout)
    except StopAsyncIteration:
        return [], True
    if first is None:
        return [], False
    return consumer.with_buffered(first, _TAKE_MAX), False


class SyncMessage:
    """A delivered message with blocking :meth:`ack`, :meth:`release` and :meth:`reject`.

    Attributes: the same as :class:`batonmq.clients.consumer.Message`.
    """

    __slots__ = (
        "_conn",
        "_msg",
        "queue",
        "position",
        "body",
        "headers",
        "delivery_count",
        "acquired_count",
        "publish_time",
    )

    def __init__(self, conn: SyncConnection, msg: Message) -> None:
        self._conn = conn
        self._msg = msg
        self.queue = msg.queue
        self.position = msg.position
        self.body = msg.body
        self.headers = msg.headers
        self.delivery_count = msg.delivery_count
        self.acquired_count = msg.acquired_count
        self.publish_time = msg.publish_time

    def __repr__(self) -> str:
        return (
            f"<SyncMessage {self.queue!r}@{self.position} delivery={self.delivery_count}"
            f" acquired={self.acquired_count}>"
        )

    @property
    def settled(self) -> bool:
        """True once ack/release/reject was called."""
        return self._msg.settled

    @property
    def message(self) -> Message:
        """The async message underneath (use it only from the client's loop thread)."""
        return self._msg

    def ack(self, *, confirm: bool = False) -> None:
        """Accept the message (see :meth:`batonmq.clients.consumer.Message.ack`)."""
        self._conn.run(self._msg.ack(confirm=confirm))

    def release(self, *, failed: bool = False, delay: float = 0.0, confirm: bool = False) -> None:
        """Give the message back to its queue: "not now", or ``failed``, after ``delay``
        seconds (see :meth:`batonmq.clients.consumer.Message.release`)."""
        self._conn.run(self._msg.release(failed=failed, delay=delay, confirm=confirm))

    def in_progress(self) -> None:
        """Start the message's ack timeout again (see
        :meth:`batonmq.clients.consumer.Message.in_progress`)."""
        self._conn.run(self._msg.in_progress())

    def reject(self, *, confirm: bool = False) -> None:
        """Reject the message (see :meth:`batonmq.clients.consumer.Message.reject`)."""
        self._conn.run(self._msg.reject(confirm=confirm))
