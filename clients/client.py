"""The asyncio client: :func:`connect` and :class:`Connection`, the object users call.

Layout (after aiokafka's ``conn.py``, ``producer/`` and ``consumer/``):

* :mod:`~batonmq.clients.conn`: the asyncio protocol and the :class:`~batonmq.clients.conn.Channel`
  that maps correlation ids to futures, coalesces writes and fails every pending future
  with the cause when the connection ends.
* :mod:`~batonmq.clients.failover`: reconnecting to another address and sending again
  what was in flight.
* :mod:`~batonmq.clients.producer`: Publish, PublishBatch and idempotency keys.
* :mod:`~batonmq.clients.consumer`: :class:`Consumer` (credit, settle batching) and
  :class:`Message`.
* :mod:`~batonmq.clients.watch`: :class:`TopologyWatch`, the poller of
  :meth:`Connection.watch_topology`.
* :mod:`~batonmq.clients.leadership`: :class:`~batonmq.clients.leadership.Term`.
* :mod:`~batonmq.clients.routing`: each queue's commands to a replica of its data
  partition (replica groups, docs/design.md §16).
* :mod:`~batonmq.clients.queue_options`: :class:`Retry` and a declaration's options.

:class:`Connection` is the facade over them: every call of docs/client.md is here, and
the names that used to live in this module (``Consumer``, ``Message``, ``TopologyWatch``,
``parse_addresses``, ``DEFAULT_PORT``) are still importable from it.

Size: about a thousand lines, because the facade has one method per command of the
protocol, each with the docstring users read; what the methods do lives in the modules
above, and the methods are a few lines each.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime
from ssl import SSLContext
from types import TracebackType
from typing import Any

from batonmq.clients import errors
from batonmq.clients.addresses import DEFAULT_PORT, format_address, parse_addresses, split_url
from batonmq.clients.conn import Channel
from batonmq.clients.consumer import Consumer, Message
from batonmq.clients.leadership import HandoverResult, ServiceInfo, Term
from batonmq.clients.producer import Producer, publish_options
from batonmq.clients.queue_options import Retry, declare_options
from batonmq.clients.routing import RoutedConsumer, Router
from batonmq.clients.scram import DEFAULT_USER, make_credentials
from batonmq.clients.topology import TopologyEvent, TopologyTracker
from batonmq.clients.watch import TopologyWatch
from batonmq.clients.wire import (
    AcceptThrough,
    Bind,
    BindExchange,
    DeclareExchange,
    DeleteExchange,
    ListExchanges,
    Unbind,
    UnbindExchange,
    DeclareQueue,
    DeleteQueue,
    Frame,
    Handover,
    Connections,
    DeleteUser,
    ListQueues,
    ListUsers,
    ListFeatures,
    EnableFeatures,
    MessageHistory,
    Peek,
    Ping,
    PurgeQueue,
    PutUser,
    QueueStats,
    ReadRange,
    Reserve,
    Services,
    SetRights,
    SetUserLimits,
    SetUserTags,
    ListPolicies,
    SetPolicy,
    ClearPolicy,
    GrowPartitions as GrowPartitionsFrame,
    MovePartition,
    RebalancePartitions,
    SetReplicas,
    Topology,
    read_result,
)
from batonmq.cluster.errors import AccessRefused, BatonError, ConnectionClosed, InvalidArgument
from batonmq.cluster.results import (
    AcceptedThrough,
    Bound,
    ExchangeDeleted,
    ExchangeList,
    Routed,
    ConnectionList,
    MessageHistory as History,
    Peeked,
    Declared,
    Deleted,
    HandedOver,
    Purged,
    QueueList,
    RangeRead,
    Reserved,
    ServiceList,
    UserChanged,
    UserList,
    FeatureList,
    PolicyChanged,
    PolicyList,
    FeaturesEnabled,
    PartitionsGrown,
    GroupChanged,
    Rebalanced,
    ReplicationSet,
)

__all__ = [
    "DEFAULT_PORT",
    "connect",
    "Retry",
    "parse_addresses",
    "Connection",
    "Consumer",
    "Message",
    "TopologyWatch",
]


async def connect(
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
) -> Connection:
    """Open a connection to the first broker that accepts TCP and answers Hello.

    Args:
        addresses: ``"HOST:PORT"``, a comma-separated list of them, or a sequence.
            They are tried in order. The connection keeps the whole list for failover.
            The URL form ``baton://USER:PASSWORD@HOST:PORT,HOST:PORT`` names the user
            too (percent-encode ``@``, ``:`` and ``%`` in them).
        client_name: sent in Hello; shows up in the broker's session list.
        timeout: seconds allowed per address for TCP connect plus the Hello exchange
            (also per attempt during failover).
        failover: when the connection to the broker is lost, reconnect to another
            address (round-robin, the lost one last), re-subscribe the consumers and
            re-send unconfirmed publishes (see docs/client.md, "Failover"). Default:
            on with several addresses, off with one (``True`` with one address
            retries that address).
        failover_timeout: seconds a failover may take in all; then every pending
            call fails with ConnectionClosed and the connection is closed.
        ssl: connect by TLS with this context (``clients.tls.client_context(ca)``
            verifies the broker against a CA file), or ``True`` for the system's
            defaults; every reconnect of a failover uses it too. None: plaintext.
        keepalive: send a Ping after this many seconds in which nothing was sent
            (None: never); set it below a broker's ``idle_timeout``. A Ping not
            answered within as many seconds more means the broker is lost (stopped,
            partitioned away): the connection fails over, or closes without failover.
        username, password: who logs in (SCRAM: the password never crosses the
            wire; docs/security.md). Not given (here or in the URL): ``guest`` /
            ``guest``, which brokers accept from loopback only, and only while the
            cluster has that user.
        route: send each queue's commands to a replica of its data partition, over
            connections opened as needed (docs/client.md "Routing"). False: everything
            over this one connection (a broker outside a queue's group then forwards,
            or refuses, as it does for any client).

    Returns:
        An open :class:`Connection`. Use it as ``async with await connect(...) as conn``.

    Raises:
        InvalidArgument: an address cannot be parsed, or a user without a password.
        AccessRefused: a broker refused the login (wrong user name or password, or
            ``guest`` from beyond loopback): the other addresses are not tried.
        ConnectionClosed: no address worked; the message names every address tried
            and why, and the exception is chained from the last failure.
    """
    addresses, url_user, url_password = split_url(addresses)
    parsed = parse_addresses(addresses)
    username = username if username is not None else url_user
    password = password if password is not None else url_password
    if username is None:
        username = DEFAULT_USER
    if password is None:
        if username != DEFAULT_USER:
            raise InvalidArgument(f"user {username!r} needs a password")
        password = DEFAULT_USER
    if failover is None:
        failover = len(parsed) > 1
    failures: list[str] = []
    last: BaseException | None = None
    for index, (host, port) in enumerate(parsed):
        channel = Channel(
            parsed,
            client_name=client_name,
            failover=failover,
            failover_timeout=failover_timeout,
            connect_timeout=timeout,
            tls=ssl,
            keepalive=keepalive,
            credentials=(username, password),
        )
        channel.failover.index = index
        try:
            async with asyncio.timeout(timeout):
                await channel.open(host, port)
        except AccessRefused as exc:
            channel.abort(exc)
            raise AccessRefused(f"{format_address(host, port)}: {exc.message}") from None
        except (OSError, BatonError, TimeoutError) as exc:
            channel.abort(exc)
            last = exc
            why = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            failures.append(f"{format_address(host, port)} ({why})")
            continue
        except BaseException as exc:  # cancelled: do not leak the transport
            channel.abort(exc)
            raise
        channel.opened = True

        async def open_replica(address: str, *, name: str = client_name,
                               credentials: tuple[str, str] = (username, password)) -> Channel:
            # A replica's connection (docs/client.md "Routing"): same name, credentials,
            # TLS and keepalive; no failover of its own (a lost replica is routed around).
            ((rhost, rport),) = parse_addresses(address)
            replica = Channel([(rhost, rport)], client_name=name, connect_timeout=timeout,
                              tls=ssl, keepalive=keepalive, credentials=credentials)
            try:
                async with asyncio.timeout(timeout):
                    await replica.open(rhost, rport)
            except BaseException as exc:
                replica.abort(exc)
                raise
            replica.opened = True
            return replica

        return Connection(channel, open_replica if route else None)
    raise ConnectionClosed("could not connect to any broker: " + "; ".join(failures)) from last


class Connection:
    """One session with one broker. Create it with :func:`connect`.

    Every method is a command: it gets the next correlation id, is written (coalesced
    with the other frames of this loop tick) and returns when the broker's ``Ok``
    arrives. An ``Error`` reply raises the matching :mod:`batonmq.cluster.errors` class. If
    the connection ends first the call raises :class:`ConnectionClosed` (the command's
    outcome is then unknown) — unless failover is on: then the connection moves to
    another broker and publishes, subscriptions and read-only or idempotent commands
    are sent again there (see :func:`connect` and docs/client.md, "Failover").

    Attributes:
        addresses: every ``(host, port)`` the connection may use, in order.
        address: ``"HOST:PORT"`` of the broker this connection is open to.
        server: the broker's name/version string from HelloOk.
        node_id: the broker's node id from HelloOk.
        max_frame: the largest frame the broker accepts, in bytes.
        max_message: the largest message body the broker accepts, in bytes.
    """

    def __init__(
        self, channel: Channel, open_replica: Callable[[str], Awaitable[Channel]] | None = None
    ) -> None:
        """Wrap an open channel (:func:`connect` makes both); ``open_replica`` opens a
        channel to another broker, a replica of some queue's partition (None: no
        routing, every command goes over ``channel``)."""
        self._channel = channel
        self._router = Router(channel, open_replica or _no_replicas,
                              enabled=open_replica is not None)
        self._producer: Producer = self._router.producer

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Every ``(host, port)`` the connection may use, in order."""
        return self._channel.failover.addresses

    @property
    def address(self) -> str:
        """``"HOST:PORT"`` of the broker this connection is open to."""
        return self._channel.address

    @property
    def server(self) -> str:
        """The broker's name/version string from HelloOk."""
        return self._channel.server

    @property
    def node_id(self) -> str:
        """The broker's node id from HelloOk."""
        return self._channel.node_id

    @property
    def user(self) -> str:
        """The user this connection logged in as."""
        return self._channel.user

    @property
    def max_frame(self) -> int:
        """The largest frame the broker accepts, in bytes."""
        return self._channel.max_frame

    @property
    def max_message(self) -> int:
        """The largest message body the broker accepts, in bytes."""
        return self._channel.max_message

    @property
    def client_name(self) -> str:
        """The name sent in Hello."""
        return self._channel.client_name

    @property
    def failover(self) -> bool:
        """Reconnect to another address when the connection is lost (see connect())."""
        return self._channel.failover.enabled

    @failover.setter
    def failover(self, value: bool) -> None:
        self._channel.failover.enabled = value

    @property
    def failover_timeout(self) -> float:
        """Seconds a failover may take in all."""
        return self._channel.failover.timeout

    @failover_timeout.setter
    def failover_timeout(self, value: float) -> None:
        self._channel.failover.timeout = value

    @property
    def connect_timeout(self) -> float:
        """Seconds per address for TCP connect plus Hello (also per failover attempt)."""
        return self._channel.failover.connect_timeout

    @connect_timeout.setter
    def connect_timeout(self, value: float) -> None:
        self._channel.failover.connect_timeout = value

    @property
    def failovers(self) -> int:
        """How many times this connection failed over to a broker."""
        return self._channel.failover.failovers

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the connection runs on."""
        return self._channel.loop

    # --- life cycle -------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the connection has ended (closed here, by the broker, or lost)."""
        return self._channel.closed

    async def close(self) -> None:
        """Close the connection.

        Frames already written (e.g. acks issued this tick) are flushed; then every
        pending command fails with :class:`ConnectionClosed` and every consumer's
        iterator ends with it. Closing twice is harmless.
        """
        await self._router.close()
        await self._channel.close()

    @property
    def replica_connections(self) -> list[str]:
        """``"HOST:PORT"`` of the brokers this connection opened besides :attr:`address`
        to reach a queue's replicas (docs/client.md "Routing"); empty on a cluster
        without replica groups."""
        return [c.address for c in self._router.extra_channels]

    async def _on_queue(
        self, queue: str, frame: Callable[[int], Frame], *, retry: bool
    ) -> dict[str, Any]:
        """Send the command ``frame(corr)`` about ``queue`` to a replica of its data
        partition (docs/client.md "Routing"); ``retry``: idempotent (sent again after
        a failover, or to another replica when its broker was lost)."""

        def send(channel: Channel) -> Awaitable[dict[str, Any]]:
            corr = channel.next_corr()
            return channel.request(frame(corr), corr, retry)

        return await self._router.run(queue, send, resend=retry)

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Connection {self.address} node={self.node_id!r} {state}>"

    def _next_corr(self) -> int:
        return self._channel.next_corr()

    def _request(
        self, frame: Frame, corr: int, retry: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        return self._channel.request(frame, corr, retry)

    # --- commands ---------------------------------------------------------------------

    async def topology(self) -> dict[str, Any]:
        """The cluster as the connected broker has applied it (docs/design.md §7).

        Returns:
            A mapping with ``cluster_id``, ``view`` (the view's sequence number),
            ``changing`` (a new view is being agreed), ``leader`` and ``instances``:
            the members in the cluster's stable order, each with ``node_id``,
            ``runtime``, ``role`` ("voter" or "observer"), ``address``, ``leader``
            (bool), ``local`` (the broker answering) and ``properties``. Also the
            answering broker's ``applied`` log offset and state ``digest``.

        Raises:
            ConnectionClosed: the connection ended first.
        """
        corr = self._next_corr()
        return await self._request(Topology(corr), corr, retry=True)

    def watch_topology(
        self,
        listener: Callable[[TopologyEvent], Any],
        *,
        interval: float = 0.5,
        min_event_delay: float = 0.2,
    ) -> TopologyWatch:
        """Call ``listener`` with topology events (docs/design.md §7) until stopped.

        Polls :meth:`topology` every ``interval`` seconds and feeds a
        :class:`~batonmq.clients.topology.TopologyTracker`: the first answer gives INIT, then
        CHANGING (a view change is under way), CHANGED (a new view: other number or
        members) and PROPERTIES_CHANGED (same members, an instance's properties,
        role, address or the leader changed), at most one per ``min_event_delay``
        seconds (changes in between are coalesced). The listener may be a plain
        function or a coroutine function; its exceptions are logged and ignored.

        Returns:
            A :class:`TopologyWatch`; ``watch.stop()`` ends it. It also ends when the
            connection closes.

        Raises:
            InvalidArgument: ``interval`` is not positive or ``min_event_delay`` < 0.
        """
        if not interval > 0:
            raise InvalidArgument("interval must be positive")
        if not min_event_delay >= 0:
            raise InvalidArgument("min_event_delay must be >= 0")
        return TopologyWatch(self, listener, interval, TopologyTracker(min_event_delay))

    # --- service leadership (docs/design.md §7) -------------------------------------------------

    def lead(self, service: str, *, timeout: float | None = None) -> Term:
        """Run for leader of ``service``; use the result as ``async with``.

        ``async with conn.lead("import-entries") as term:`` waits until this session
        leads the service, then runs the block; leaving the block resigns, and the
        next candidate gets a new term. Inside, ``term.token`` is the term's fencing
        token (it grows with every term), ``term.lost`` is set when the leadership is
        lost (broker lost, view change, failover: a new session is a new candidate)
        and ``term.handover_requested`` when an admin asked for a handover (finish the
        running work and leave the block). See docs/client.md, "Service leadership".

        Args:
            service: the service's name (1..255 printable characters).
            timeout: seconds to wait for the leadership (None: as long as it takes);
                then Timeout is raised from ``async with`` and the candidacy is
                withdrawn.

        Returns:
            A :class:`~batonmq.clients.leadership.Term` (not yet running).

        Raises:
            InvalidArgument: a bad service name or timeout (also from ``async with``:
                this connection already runs for the service).
        """
        return Term(self._channel, service, timeout)

    async def services(self) -> list[ServiceInfo]:
        """Every service with a candidate: leader, fencing token, candidates, handover
        state, as the connected broker applied them (sorted by name).

        Raises:
            ConnectionClosed: the connection ended first.
        """
        corr = self._next_corr()
        result = await self._request(Services(corr), corr, retry=True)
        return [ServiceInfo.from_mapping(m) for m in read_result(ServiceList, result).services]

    async def service_leader(self, service: str) -> ServiceInfo | None:
        """One service's :class:`~batonmq.clients.leadership.ServiceInfo` (None: it has no
        candidate at all). ``info.leader`` and ``info.token`` are the current term."""
        for info in await self.services():
            if info.service == service:
                return info
        return None

    async def handover(
        self, service: str, *, to: str | None = None, timeout: float = 30.0
    ) -> HandoverResult:
        """Ask the leader of ``service`` to hand over (admin), and wait for the next term.

        The leader is told (``term.handover_requested``) and resigns when its running
        work is done; then ``to`` (a candidate key, or a node id: that node's first
        candidate) or else the first other candidate gets a new term.

        Args:
            service: the service's name.
            to: who should lead next (None: the next candidate in line).
            timeout: seconds to wait for the new term.

        Returns:
            The new term: its ``leader``, ``token`` and the ``previous`` leader.

        Raises:
            InvalidArgument: the service has no leader, no other candidate, or ``to``
                names none of its candidates.
            Timeout: no new term within ``timeout`` (the leader is still working; the
                handover stays requested).
            ConnectionClosed: the connection ended first (the outcome is unknown).
        """
        if not timeout > 0:
            raise InvalidArgument("timeout must be positive")
        if to is not None and not isinstance(to, str):
            raise InvalidArgument("to must be a str (a candidate key or node id) or None")
        corr = self._next_corr()
        ms = max(1, int(timeout * 1000))
        frame = Handover(corr, service, to or "", ms)
        try:
            async with asyncio.timeout(timeout + 10):  # the broker answers at ``timeout``
                result = await self._request(frame, corr)
        except TimeoutError:
            raise errors.Timeout(f"no answer to handover of {service!r} from the broker") from None
        term = read_result(HandedOver, result)
        return HandoverResult(term.service, term.leader, term.token, term.previous)

    async def ping(self) -> float:
        """Round trip to the broker.

        Returns:
            Seconds between sending Ping and receiving its Ok.

        Raises:
            ConnectionClosed: the connection ended first.
        """
        start = time.perf_counter()
        corr = self._next_corr()
        await self._request(Ping(corr), corr, retry=True)
        return time.perf_counter() - start

    async def declare_queue(
        self,
        name: str,
        *,
        durable: bool = True,
        max_length: int | None = None,
        overflow: str = "reject-publish",
        delivery_limit: int = 20,
        dead_letter: str | None = None,
        message_ttl: float | None = None,
        retry: Retry | None = None,
        ack_timeout: float | None = None,
        max_priority: int | None = None,
        single_active_consumer: bool = False,
        dedupe_window: float | None = None,
        dead_letter_exchange: str | None = None,
        dead_letter_routing_key: str | None = None,
        partition: int | None = None,
        expires: float | None = None,
    ) -> dict[str, Any]:
        """Create a queue, or check that it exists with these settings.

        Args:
            name: the queue's name.
            durable: keep the queue across broker restarts.
            max_length: cap on ready messages (None: no cap).
            overflow: at ``max_length``: ``"reject-publish"`` (publish fails with
                QueueFull) or ``"drop-head"`` (the oldest ready message is dropped).
            delivery_limit: a message whose delivery failed this many times (failed
                releases, consumer losses, see docs/client.md "The two counters") is
                dead-lettered (or dropped without a dead-letter queue).
            dead_letter: queue that receives rejected and over-limit messages.
            message_ttl: seconds a message may wait before it expires (None: forever).
            retry: the retry policy of failed deliveries (None: ready again at once).
            ack_timeout: seconds a consumer may hold a message unsettled before its
                broker releases it as a failed delivery (None: no limit; a consumer
                may set its own).
            max_priority: 1..9 makes a priority queue: messages published with a
                higher priority go first (strict: see docs/client.md, "Priorities").
            single_active_consumer: one consumer at a time gets all the messages;
                the next one takes over when it leaves (docs/client.md).
            dedupe_window: seconds a publish's idempotency key is remembered (None:
                the default, 120; 0: publishes are never deduplicated).
            dead_letter_exchange: route dead letters through this exchange instead of
                to ``dead_letter`` (``""``: the default exchange).
            dead_letter_routing_key: their routing key (None: the one each message
                was published with).
            partition: the data partition (1..N) a new queue goes on, on a cluster of
                several (docs/operations.md "Partitions"); None: the cluster places it
                on the one with the fewest queues. A queue keeps its partition.
            expires: seconds the queue may stay unused (no consumers, no get, not
                declared again) before it is deleted with its messages (None: never;
                AMQP's ``x-expires``; needs the feature flag ``queue_expiry``).

        Returns:
            The broker's result, e.g. ``{"created": True}``.

        Raises:
            QueueExists: the queue exists with different settings.
            InvalidArgument: a setting is out of range.
        """
        options = declare_options(
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
        # Idempotent (create, or check the settings), so sent again after a failover.
        # A new queue goes through any broker, which places it; a broker outside its
        # partition's group says so, and it is declared again on a replica.
        result = await self._on_queue(
            name, lambda corr: DeclareQueue(corr, name, options), retry=True
        )
        read_result(Declared, result)  # checked; the caller gets the map
        return result

    async def delete_queue(self, name: str) -> int:
        """Delete a queue with every message in it; its consumers are cancelled.

        Returns:
            The number of messages dropped.

        Raises:
            QueueNotFound: no such queue.
        """
        result = await self._on_queue(name, lambda corr: DeleteQueue(corr, name), retry=False)
        return read_result(Deleted, result).deleted

    async def purge_queue(self, name: str) -> int:
        """Drop every ready message of a queue (acquired ones stay with their consumers).

        Returns:
            The number of messages dropped.

        Raises:
            QueueNotFound: no such queue.
        """
        result = await self._on_queue(name, lambda corr: PurgeQueue(corr, name), retry=False)
        return read_result(Purged, result).purged

    async def declare_exchange(
        self,
        name: str,
        type: str,
        *,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
        passive: bool = False,
    ) -> bool:
        """Create an exchange (``type``: ``direct``, ``fanout``, ``topic`` or
        ``headers``), or check that one exists with these settings (``passive``: that it
        exists at all). Returns whether it was created.

        Raises:
            PreconditionFailed: it exists with another type or other settings.
            AccessRefused: the default exchange, a new ``amq.`` name, no right.
            ExchangeNotFound: ``passive`` and it does not exist.
        """
        options: dict[str, Any] = {"durable": durable, "auto_delete": auto_delete,
                                   "internal": internal, "arguments": dict(arguments or {})}
        if passive:
            options["passive"] = True
        corr = self._next_corr()
        frame = DeclareExchange(corr, name, type, options)
        return read_result(Declared, await self._request(frame, corr, retry=True)).created

    async def list_exchanges(self) -> list[dict[str, Any]]:
        """Every exchange you have a right on, with its settings and bindings, as the
        connected broker applied them (the built-ins included)."""
        corr = self._next_corr()
        result = await self._request(ListExchanges(corr), corr, retry=True)
        return read_result(ExchangeList, result).exchanges

    async def delete_exchange(self, name: str, *, if_unused: bool = False) -> int:
        """Delete an exchange; returns how many bindings went with it.

        Raises:
            ExchangeNotFound; PreconditionFailed (``if_unused`` and it is bound);
            AccessRefused (a built-in exchange).
        """
        corr = self._next_corr()
        result = await self._request(DeleteExchange(corr, name, if_unused), corr)
        return read_result(ExchangeDeleted, result).bindings

    async def bind_queue(
        self, queue: str, exchange: str, routing_key: str = "",
        arguments: Mapping[str, Any] | None = None, *, unbind: bool = False,
    ) -> bool:
        """Bind ``queue`` to ``exchange`` (``unbind``: remove that binding); returns
        whether anything changed. ``arguments``: a headers exchange's match.

        Raises:
            ExchangeNotFound, QueueNotFound; AccessRefused (the default exchange).
        """
        corr = self._next_corr()
        kind = Unbind if unbind else Bind
        frame = kind(corr, queue, exchange, routing_key, dict(arguments or {}))
        return read_result(Bound, await self._request(frame, corr, retry=True)).changed

    async def bind_exchange(
        self, destination: str, source: str, routing_key: str = "",
        arguments: Mapping[str, Any] | None = None, *, unbind: bool = False,
    ) -> bool:
        """Bind exchange ``destination`` to exchange ``source`` (``unbind``: remove that
        binding): what ``source`` routes by the binding goes on to ``destination``'s
        bindings, as RabbitMQ's exchange-to-exchange bindings. Returns whether anything
        changed. Needs the cluster's feature flag ``exchange_bindings``.

        Raises:
            ExchangeNotFound (either end); AccessRefused (the default exchange, no
                ``write`` right on ``destination`` or ``read`` right on ``source``);
                InvalidArgument (the flag is not enabled).
        """
        corr = self._next_corr()
        kind = UnbindExchange if unbind else BindExchange
        frame = kind(corr, destination, source, routing_key, dict(arguments or {}))
        return read_result(Bound, await self._request(frame, corr, retry=True)).changed

    def publish_to(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | bytearray | memoryview,
        headers: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        delay: float | None = None,
        not_before: float | datetime | None = None,
        priority: int | None = None,
        ttl: float | None = None,
    ) -> Coroutine[Any, Any, Routed]:
        """Publish one message through an exchange (``""``: the default one, to the
        queue ``routing_key`` names); the broker routes it and appends it onto every
        routed queue at once. Returns the queues that have it (empty: it reached none),
        its position on each, and those that refused it (full). Keys, re-sends and
        the other arguments as for :meth:`publish`.

        Raises:
            ExchangeNotFound; AccessRefused (an internal exchange, no write right);
            MessageTooLarge, InvalidArgument (nothing sent).
        """
        return self._producer.publish_to(
            exchange, routing_key, body, headers, idempotency_key=idempotency_key,
            options=publish_options(delay, not_before, priority, ttl),
        )

    async def queue_stats(self, name: str) -> dict[str, Any]:
        """A queue's counters.

        Returns:
            The broker's stats mapping; it has at least ``"ready"`` and ``"acquired"``.

        Raises:
            QueueNotFound: no such queue.
        """
        return await self._on_queue(name, lambda corr: QueueStats(corr, name), retry=True)

    async def list_queues(self) -> list[dict[str, Any]]:
        """Every queue's stats (the same mappings as :meth:`queue_stats`)."""
        corr = self._next_corr()
        result = await self._request(ListQueues(corr), corr, retry=True)
        return read_result(QueueList, result).queues

    async def peek(self, queue: str, count: int = 10) -> Peeked:
        """The first ``count`` ready messages of ``queue``, without acquiring them.

        Args:
            queue: the queue.
            count: how many, 1..1000.

        Returns:
            ``messages``: ``[position, delivery_count, body, headers, publish_time_ms]``
            each, in the order a consumer would get them. Nothing is acquired, nothing goes
            to the log and no count changes.

        Raises:
            QueueNotFound: no such queue.
            InvalidArgument: ``count`` out of range.
        """
        result = await self._on_queue(queue, lambda corr: Peek(corr, queue, count), retry=True)
        return read_result(Peeked, result)

    # -- users and rights (admin; docs/security.md) ----------------------------------

    async def put_user(self, name: str, password: str, *, admin: bool = False) -> bool:
        """Add user ``name``, or give it a new password and admin flag (its rights
        stay). The credentials are made here (scrypt, clients/scram.py): the password
        never reaches a broker.

        Returns:
            True if the user is new.

        Raises:
            AccessRefused: this connection's user is not an admin.
            InvalidArgument: an empty password, a name above 255 bytes or with control
                characters.
        """
        creds = await asyncio.get_running_loop().run_in_executor(None, make_credentials, password)
        corr = self._next_corr()
        frame = PutUser(corr, name, {"salt": creds.salt, "cost": creds.cost,
                                     "stored_key": creds.stored_key,
                                     "server_key": creds.server_key}, admin)
        result = await self._request(frame, corr, retry=True)
        return read_result(UserChanged, result).changed

    async def delete_user(self, name: str) -> bool:
        """Remove user ``name`` (not the last admin); its open connections can do
        nothing more. Returns whether it existed."""
        corr = self._next_corr()
        result = await self._request(DeleteUser(corr, name), corr, retry=True)
        return read_result(UserChanged, result).changed

    async def list_users(self) -> list[dict[str, Any]]:
        """Every user: ``name``, ``admin`` and its pattern per right."""
        corr = self._next_corr()
        result = await self._request(ListUsers(corr), corr, retry=True)
        return read_result(UserList, result).users

    async def list_features(self) -> list[dict[str, Any]]:
        """The feature flags (docs/operations.md "Upgrading"): per flag ``name``,
        ``state`` ("enabled", "disabled", or "unknown": enabled by a newer build),
        ``format``, ``since``, ``doc``, ``enabled_at`` (log offset, -1) and the live
        members that support it (``supported_by``) and do not (``unsupported_by``)."""
        corr = self._next_corr()
        result = await self._request(ListFeatures(corr), corr, retry=True)
        return read_result(FeatureList, result).features

    async def enable_features(self, names: list[str] | None = None) -> list[str]:
        """Enable feature flags for good (admin): ``names``, or None for every flag the
        broker's build knows. Returns the flags newly enabled.

        Raises:
            InvalidArgument: an unknown flag, or a live member whose build lacks one
                (named in the message): upgrade it first.
        """
        corr = self._next_corr()
        result = await self._request(EnableFeatures(corr, names), corr, retry=True)
        return read_result(FeaturesEnabled, result).enabled

    async def grow_partitions(self, count: int) -> PartitionsGrown:
        """Grow the cluster to ``count`` data partitions (admin; docs/operations.md
        "Growing N"): new queues go to the new partitions, existing ones stay. As many
        as it has: nothing changes.

        Returns:
            The count now and ``before``, and which new partitions the broker asked
            applies already (``started``; every broker opens them as it applies the growth).

        Raises:
            InvalidArgument: fewer than the cluster has (shrinking is not possible), a
                cluster of one partition, the flag ``partitions`` off, or the log refused.
            LogUnavailable: the log could not be grown, or the growth not recorded.
        """
        corr = self._next_corr()
        result = await self._request(GrowPartitionsFrame(corr, count), corr, retry=True)
        return read_result(PartitionsGrown, result)

    async def move_partition(self, partition: int, source: str, target: str) -> GroupChanged:
        """Move data partition ``partition``'s replica from broker ``source`` to broker
        ``target`` (node ids; admin; docs/operations.md "Replica groups"): ``target``
        joins and catches up, then ``source`` leaves the group and deletes its copy.

        Returns:
            The group as the move left it (``target`` joining, ``source`` leaving).

        Raises:
            InvalidArgument: no replica groups, an unknown partition, ``source`` not a
                replica of it, ``target`` already in its group or not a live member,
                or a move of it in flight.
        """
        corr = self._next_corr()
        # Not retried: a move appended before the connection dropped would be refused.
        result = await self._request(MovePartition(corr, partition, source, target), corr)
        return read_result(GroupChanged, result)

    async def rebalance_partitions(self, dry_run: bool = False) -> Rebalanced:
        """Even out the data partitions each live broker holds (admin): the moves the
        control leader's planner would start, appended unless ``dry_run``.

        Raises:
            InvalidArgument: no replica groups.
        """
        corr = self._next_corr()
        result = await self._request(RebalancePartitions(corr, dry_run), corr)
        return read_result(Rebalanced, result)

    async def set_replicas(self, replicas: int) -> ReplicationSet:
        """Set each data partition's group size (admin): the control leader's planner
        then adds replicas or trims them. Returns the setting now and ``before`` (0:
        never set, every broker).

        Raises:
            InvalidArgument: no replica groups, or not 1 to 15.
        """
        corr = self._next_corr()
        result = await self._request(SetReplicas(corr, replicas), corr, retry=True)
        return read_result(ReplicationSet, result)

    async def set_permissions(
        self,
        name: str,
        *,
        configure: str | None = None,
        write: str | None = None,
        read: str | None = None,
        lead: str | None = None,
    ) -> None:
        """Set rights of user ``name``: regular expressions that must match a whole
        queue name (``lead``: service name); "" grants nothing; None keeps the pattern.

        Raises:
            InvalidArgument: no such user, no right given, or a bad pattern.
        """
        given = {"configure": configure, "write": write, "read": read, "lead": lead}
        rights = {k: v for k, v in given.items() if v is not None}
        corr = self._next_corr()
        await self._request(SetRights(corr, name, rights), corr, retry=True)

    async def set_user_limits(
        self,
        name: str,
        *,
        max_queues: int | None = None,
        max_connections: int | None = None,
        max_consumers: int | None = None,
        reset: tuple[str, ...] = (),
    ) -> None:
        """Set limits of user ``name`` (admin; ``name`` "": the cluster's default for
        non-admin users). A value of -1 lifts the limit; None leaves it as it is;
        ``reset`` names limits that go back to the default.

        Raises:
            InvalidArgument: no such user, no limit given, a bad value, or the feature
                flag ``user_limits`` is not enabled.
        """
        given: dict[str, int | None] = {
            k: v for k, v in (("max_queues", max_queues), ("max_connections", max_connections),
                              ("max_consumers", max_consumers)) if v is not None
        }
        for key in reset:
            given[key] = None
        corr = self._next_corr()
        await self._request(SetUserLimits(corr, name, given), corr, retry=True)

    async def set_user_tags(self, name: str, tags: list[str]) -> None:
        """Set the tags of user ``name``, all of them (admin): ``["monitoring"]`` lets
        it read the admin listener's /metrics and statistics.

        Raises:
            InvalidArgument: no such user, an unknown tag, or the feature flag
                ``user_limits`` is not enabled.
        """
        corr = self._next_corr()
        await self._request(SetUserTags(corr, name, list(tags)), corr, retry=True)

    async def list_policies(self) -> list[dict[str, Any]]:
        """Every policy (docs/operations.md "Policies"), by name: ``name``, ``pattern``,
        ``apply_to``, ``definition`` and ``priority``."""
        corr = self._next_corr()
        result = await self._request(ListPolicies(corr), corr, retry=True)
        return read_result(PolicyList, result).policies

    async def set_policy(
        self,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        *,
        priority: int = 0,
        apply_to: str = "queues",
    ) -> PolicyChanged:
        """Add or replace policy ``name`` (admin): the queues whose names match
        ``pattern`` (a regular expression, searched) take ``definition``'s settings
        (``max-length``, ``message-ttl``, ``delivery-limit``, ``overflow``,
        ``dead-letter``, ``dead-letter-exchange``, ``dead-letter-routing-key``,
        ``retry``); of the policies matching a queue the highest ``priority`` applies.

        Returns:
            whether it is new, and how many queues have a policy now.

        Raises:
            InvalidArgument: a bad name, pattern or definition, or the feature flag
                ``policies`` is not enabled.
        """
        corr = self._next_corr()
        result = await self._request(
            SetPolicy(corr, name, pattern, apply_to, dict(definition), priority), corr, retry=True
        )
        return read_result(PolicyChanged, result)

    async def clear_policy(self, name: str) -> PolicyChanged:
        """Remove policy ``name`` (admin); its queues go back to their declared settings
        or to the next policy matching them.

        Raises:
            InvalidArgument: no such policy, or the feature flag ``policies`` is not
                enabled.
        """
        corr = self._next_corr()
        result = await self._request(ClearPolicy(corr, name), corr, retry=True)
        return read_result(PolicyChanged, result)

    async def connections(self) -> list[dict[str, Any]]:
        """The connected broker's client connections and their consumers
        (docs/admin.md, "Connections and consumers")."""
        corr = self._next_corr()
        result = await self._request(Connections(corr), corr, retry=True)
        return read_result(ConnectionList, result).connections

    async def message_history(self, queue: str, position: int, max_records: int = 0) -> History:
        """The life of message (``queue``, ``position``) as the log tells it: enqueued,
        acquired, released, accepted or dead-lettered, with log offsets and times
        (docs/admin.md, "Message history").

        Args:
            max_records: the most log records the broker reads (0: its own bound).

        Raises:
            QueueNotFound: the queue exists neither now nor on the log.
            InvalidArgument: a negative position or bound.
        """
        result = await self._on_queue(
            queue, lambda corr: MessageHistory(corr, queue, position, max_records), retry=True
        )
        return read_result(History, result)

    # --- range readers (the Spark source, docs/design.md §11; docs/protocol.md) ---------------

    async def reserve(
        self, queue: str, holder: str | None, *, service: str = "", token: int = -1
    ) -> dict[str, Any]:
        """Reserve ``queue`` for the range reader ``holder`` (None: end the reservation).

        While reserved, consumers get nothing from the queue and TTL expiry and
        drop-head overflow leave it alone; messages consumers took before stay
        theirs (``acquired`` in the result: read only once it is 0).

        Args:
            queue: the queue.
            holder: the reader's name, or None to end the reservation.
            service: with ``token``, fence the call by a leadership term
                (``Term.service``, ``Term.token``): it is refused once that term is
                over (docs/spark.md, "Fencing"). "" and -1: not fenced.
            token: the term's fencing token.

        Returns:
            ``{"reserved_by", "acquired", "head", "next_position"}``; ``head`` is the
            lowest ready position.

        Raises:
            QueueReserved: another holder has the queue.
            QueueNotFound: no such queue.
            StaleToken: the fencing term is over (another leader took over).
        """
        # Idempotent for the same holder: sent again after a failover.
        result = await self._on_queue(
            queue, lambda corr: Reserve(corr, queue, holder or "", service, token), retry=True
        )
        read_result(Reserved, result)  # checked; the caller gets the map
        return result

    async def accept_through(
        self, queue: str, through: int, holder: str, *, service: str = "", token: int = -1
    ) -> int:
        """As the holder of ``queue``'s reservation, accept every ready message below
        position ``through``. Cumulative and idempotent (a repeat accepts nothing).

        Args:
            queue: the queue.
            through: accept the ready messages below this position.
            holder: the reservation's holder.
            service: with ``token``, fence the commit by a leadership term, as in
                :meth:`reserve`.
            token: the term's fencing token.

        Returns:
            How many messages this call accepted.

        Raises:
            QueueReserved: ``holder`` does not have the queue's reservation.
            QueueNotFound: no such queue.
            StaleToken: the fencing term is over (another leader took over).
        """
        result = await self._on_queue(
            queue, lambda corr: AcceptThrough(corr, queue, through, holder, service, token),
            retry=True,
        )
        return read_result(AcceptedThrough, result).count

    async def read_range(
        self, queue: str, start: int, end: int, *, limit: int = 10_000
    ) -> tuple[list[list[Any]], int]:
        """Read the messages still in ``queue`` at positions ``start <= p < end``
        without acquiring them (one ReadRange; call again from the returned ``next``
        until it equals ``end``).

        The broker answers once it has applied the queue up to ``end``, so every
        broker answers the same for a reserved queue.

        Returns:
            ``(messages, next)``: messages as ``[position, body, headers,
            publish_time_ms]`` lists in position order, and where to continue.

        Raises:
            QueueNotFound: no such queue.
            Timeout: the broker did not reach ``end`` in time (try another).
            InvalidArgument: a bad range or limit.
        """
        result = await self._on_queue(
            queue, lambda corr: ReadRange(corr, queue, start, end, limit), retry=True
        )
        read = read_result(RangeRead, result)
        return read.messages, read.next

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
    ) -> Coroutine[Any, Any, int]:
        """Publish one message and wait until the broker confirms it (``await`` it).

        A confirmed message is durable on the log: it is never lost afterwards.
        Every publish carries an idempotency key; the cluster enqueues a publish
        re-sent with a key it applied to the queue recently only once, and confirms
        it with the original position. After a failover, unconfirmed publishes are
        re-sent this way (exactly once on the queue).

        Args:
            queue: the queue's name.
            body: opaque bytes (bytes, bytearray or memoryview).
            headers: string-keyed mapping of msgpack-encodable values.
            idempotency_key: your own key for this publish (e.g. to publish again
                safely from a new connection after a crash); by default a key unique
                to this connection and publish.
            delay: seconds the queue holds the message from consumers (a delayed
                message; by the cluster's replicated clock, docs/client.md).
            not_before: the time (an aware datetime, or seconds since the epoch)
                before which no consumer gets it (with ``delay``: the later of both).
            priority: 0..9, on a queue declared with ``max_priority`` (higher goes
                first; capped at the queue's maximum; ignored on other queues).
            ttl: the message's own time to live, seconds (as AMQP's ``expiration``;
                flag ``message_ttl``): once it ran out, the message is dropped or
                dead-lettered when it reaches the head of the queue instead of being
                handed out (docs/client.md). 0: now or never.

        Returns:
            The message's position in the queue.

        Raises:
            MessageTooLarge: the body is above the broker's ``max_message`` (nothing sent).
            InvalidArgument: body or headers of the wrong type, a negative delay or
                time (nothing sent).
            QueueNotFound, QueueFull: from the broker.
            ConnectionClosed: the connection ended before the confirmation; the message
                may or may not have been enqueued.
        """
        # The producer's own coroutine, not one that awaits it: a publish is the hot
        # path, and a coroutine frame per call is a measurable share of its cost.
        options = publish_options(delay, not_before, priority, ttl)
        if self._router.table.flat:  # no replica groups: the connection as it is
            return self._producer.publish(
                queue, body, headers, idempotency_key=idempotency_key, options=options
            )
        # One key for every attempt: a publish sent again to another replica is
        # enqueued once.
        key = self._producer.new_key() if idempotency_key is None else idempotency_key
        router = self._router
        return router.run(queue, lambda channel: router.producer_of(channel).publish(
            queue, body, headers, idempotency_key=key, options=options))

    async def publish_batch(
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
        """Publish many messages and wait until all are confirmed.

        The messages are sent in as few PublishBatch frames as fit (each frame holds at
        most about ``max_frame / 2`` bytes of bodies). **Each frame is atomic on the
        broker, the batch as a whole is not**: if this raises, the messages of some
        frames may have been enqueued.

        Each frame carries an idempotency key, as for :meth:`publish`.

        Args:
            queue: the queue's name.
            messages: bodies, or ``(body, headers)`` pairs.
            idempotency_key: your own key for the batch; with several frames,
                frame ``i`` uses ``f"{idempotency_key}#{i}"``.
            delay, not_before, priority, ttl: as for :meth:`publish`, for every message.

        Returns:
            The positions of the messages, in order.

        Raises:
            MessageTooLarge: a body is above ``max_message`` (nothing sent).
            InvalidArgument: a body or headers of the wrong type (nothing sent).
            QueueNotFound, QueueFull: from the broker.
            ConnectionClosed: the connection ended before every confirmation arrived.
        """
        options = publish_options(delay, not_before, priority, ttl)
        if self._router.table.flat:
            return await self._producer.publish_batch(
                queue, messages, idempotency_key=idempotency_key, options=options
            )
        items = list(messages)  # sent again as they are, with the same keys
        key = self._producer.new_key() if idempotency_key is None else idempotency_key
        router = self._router
        return await router.run(queue, lambda channel: router.producer_of(channel).publish_batch(
            queue, items, idempotency_key=key, options=options))

    def consume(
        self, queue: str, *, prefetch: int = 100, ack_timeout: float | None = None
    ) -> Consumer:
        """A consumer of ``queue``; subscribe by entering it (``async with``).

        Args:
            queue: the queue's name.
            prefetch: the most messages the broker delivers before they are settled.
            ack_timeout: seconds a delivered message may stay unsettled; then the
                broker releases it as a failed delivery and tells the consumer
                (``msg.in_progress()`` starts it again). None: the queue's setting.

        Returns:
            A :class:`Consumer` (not yet subscribed).
        """
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 1:
            raise InvalidArgument(f"prefetch must be a positive int, got {prefetch!r}")
        if ack_timeout is not None and (
            isinstance(ack_timeout, bool)
            or not isinstance(ack_timeout, (int, float))
            or ack_timeout <= 0
        ):
            raise InvalidArgument(f"ack_timeout must be positive seconds, got {ack_timeout!r}")
        # It subscribes on a replica of the queue's partition, and follows the queue
        # when it moves (docs/client.md "Routing").
        return RoutedConsumer(self._router, queue, prefetch, ack_timeout)



async def _no_replicas(address: str) -> Channel:
    raise ConnectionClosed(f"this connection opens no connection to another broker ({address})")
