"""One client session: a client's commands, routed to the parts of the broker that do them.

:class:`Session` is the asyncio Protocol the broker's listener makes for each client
connection. The framing, write coalescing and flow control (commands in flight,
paused reads) are its base, :class:`~batonmq.broker.connection.ClientConnection`
(broker/connection.py). The session holds what the protocol keeps per connection
(greeted or not, its consumers, the single publishes read in one go) and routes
each frame to its handler:

* publishes (single ones read in one go merged into one Enqueue per queue),
  settlements, subscriptions and queue administration, here, through the node and
  the broker's delivery (broker/delivery.py);
* queries (queue stats, topology, peek, connections), answered from the state applied
  here, and a message's history, read from the log (broker/inspect.py, broker/history.py);
* service leadership (``Lead``, ``Resign``, ``Handover``) to broker/leadership.py;
* a joining broker's ``UpdateRequest`` to broker/donor.py; a peer broker's forwarded
  events (``PeerProof``, ``Submit``) to broker/peers.py; a consumer of a queue that
  other brokers replicate to broker/relay.py;
* range reads (``ReadRange``) to broker/ranges.py.

It sees the broker through :class:`SessionBroker` only, and is seen by delivery and
leadership as a :class:`~batonmq.broker.reply.Replier`.

Size: over 1,000 lines, because :meth:`Session.handle_frame` routes every client
command of the protocol (queues, exchanges, messages, queries, leadership, users) and
the broker-to-broker ones (a join update, a peer link and its relayed consumers); the
handlers live in the modules above, and each route is a few lines.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import msgpack

from batonmq.broker.access import (
    Login,
    Rights,
    check_user_limit,
    limits_event,
    list_users,
    tags_event,
    user_event,
)
from batonmq.broker.admission import LoginGate, QuietLog
from batonmq.broker.features import enable_event, feature_list
from batonmq.cluster.features import FEATURES
from batonmq.broker.config import BrokerConfig
from batonmq.broker.connection import MAX_IN_FLIGHT, ClientConnection
from batonmq.broker.delivery import Consumer, Delivery
from batonmq.broker.donor import UpdateDonor
from batonmq.broker.exchanges import ExchangeFacade, exchange_options
from batonmq.broker.history import message_history
from batonmq.broker.inspect import ConnectionView, list_connections, peek
from batonmq.broker.leadership import Leadership
from batonmq.broker.limits import check_event, check_headers, check_key, check_name
from batonmq.broker.networks import Networks, allows
from batonmq.broker.partitions import (
    grow_partitions,
    move_partition,
    rebalance_partitions,
    set_replicas,
)
from batonmq.broker.peers import MemberRights, Peers, PeerService, elsewhere
from batonmq.broker.relay import RELAYED, Relay
from batonmq.broker.policies import clear_policy_event, list_policies, set_policy_event
from batonmq.broker.ranges import read_range
from batonmq.broker.reply import Shape, as_is
from batonmq.clients import wire
from batonmq.cluster import member_proof
from batonmq.cluster.errors import (
    AccessRefused,
    BatonError,
    InternalError,
    InvalidArgument,
    LimitExceeded,
    MessageTooLarge,
    ProtocolError,
    UnknownConsumer,
    UnsupportedVersion,
)
from batonmq.cluster.events import (
    DEFAULT_DEDUPE_WINDOW_MS,
    DEFAULT_DELIVERY_LIMIT,
    Accept,
    AcceptThrough,
    DeclareQueue,
    DeleteQueue,
    Enqueue,
    Event,
    PurgeQueue,
    Reject,
    Release,
    Reserve,
)
from batonmq.cluster.node import Node
from batonmq.cluster.partitioned import Partitioned
from batonmq.cluster.state import State
from batonmq.cluster.queue_state import MAX_TTL_MS
from batonmq.cluster.users import Users
from batonmq.cluster.results import (
    Cancelled,
    Enqueued,
    ExchangeList,
    Published,
    QueueList,
    Result,
    Settled,
    Subscribed,
)

# MAX_IN_FLIGHT is documented here (docs/protocol.md); it lives in broker/connection.py.
__all__ = ["MAX_IN_FLIGHT", "Session", "SessionBroker", "declare_event"]

log = logging.getLogger("baton.session")

#: The longest delay of a release: 30 days.
MAX_DELAY_MS = 30 * 24 * 3600 * 1000

R = TypeVar("R", bound="Result | None")

_DECLARE_OPTIONS: dict[str, tuple[type, ...]] = {
    "durable": (bool,),
    "max_length": (int, type(None)),
    "overflow": (str,),
    "delivery_limit": (int,),
    "dead_letter": (str, type(None)),
    "message_ttl_ms": (int, type(None)),
    "retry": (str, type(None)),
    "retry_delay_ms": (int,),
    "retry_max_ms": (int, type(None)),
    "ack_timeout_ms": (int, type(None)),
    "max_priority": (int, type(None)),
    "single_active_consumer": (bool,),
    "dedupe_window_ms": (int,),
    "dead_letter_exchange": (str, type(None)),
    "dead_letter_routing_key": (str, type(None)),
    # Where to place a new queue (docs/design.md §16); not part of the event.
    "partition": (int,),
    "expires_ms": (int, type(None)),
}


class SessionBroker(Protocol):
    """What a session needs of the broker that accepted its connection
    (broker/server.py's :class:`Broker`)."""

    @property
    def config(self) -> BrokerConfig:
        """The limits a session enforces (frame, message, headers, prefetch) and the
        join update's rate."""
        ...

    @property
    def version(self) -> str:
        """The broker's version, told in HelloOk."""
        ...

    @property
    def sessions(self) -> set[Session]:
        """The open sessions: a session adds itself when connected, leaves when lost."""
        ...

    @property
    def node(self) -> Node:
        """This broker's node: commands are submitted to it."""
        ...

    @property
    def delivery(self) -> Delivery:
        """This broker's consumers."""
        ...

    @property
    def leadership(self) -> Leadership:
        """This broker's side of service leadership."""
        ...

    def queue_stats(self, name: str) -> dict[str, Any]:
        """The QueueStats answer (raises QueueNotFound)."""
        ...

    def list_queues(self) -> list[dict[str, Any]]:
        """Every queue's stats, by name."""
        ...

    async def current_topology(self) -> dict[str, Any]:
        """The Topology answer, with each data partition's lag (its log end read first)."""
        ...

    def connections(self) -> Iterable[ConnectionView]:
        """The open client sessions (the Connections answer)."""
        ...

    @property
    def allow_from(self) -> Networks | None:
        """The networks clients may connect from (None: anywhere)."""
        ...

    @property
    def auth_secret(self) -> bytes:
        """What an unknown user's SCRAM salt is made from: the same on every broker of
        the cluster."""
        ...

    def refused(self, what: str) -> None:
        """Count one refusal: ``what`` is "login" or the right that was missing."""
        ...

    @property
    def logins(self) -> LoginGate:
        """The connections still logging in (broker/admission.py)."""
        ...

    @property
    def peers(self) -> Peers | None:
        """The links to other brokers (replica groups; broker/peers.py), or None."""
        ...


class Session(ClientConnection):
    """Serves one client connection."""

    def __init__(self, broker: SessionBroker) -> None:
        cfg = broker.config
        super().__init__(
            cfg.max_frame,
            cfg.max_in_flight,
            cfg.max_output,
            cfg.output_grace,
            wire.DecodeLimits.for_broker(cfg.max_headers, cfg.max_connection_prefetch),
        )
        self.broker = broker
        self.client_name = ""
        self.greeted = False
        self.protocol_version = wire.PROTOCOL_VERSION  # negotiated by Hello
        self._login: Login | None = None  # a login under way
        self._hello_frame: wire.Hello | None = None
        # What the user may do; none until it logs in (a member link has no user).
        self.rights = Rights(lambda: Users(), "", broker.refused)
        self.consumers: dict[int, Consumer] = {}
        self._next_tag = 0
        self._packer = msgpack.Packer(use_bin_type=True)
        # Single publishes read in one go, per queue, merged into one Enqueue event:
        # (corr, body, headers, idempotency key).
        self._publishes: dict[str, list[tuple[int, bytes, dict[str, Any], str]]] = {}
        self._update: asyncio.Task[None] | None = None  # a join update served here
        self._answering: set[asyncio.Task[None]] = set()  # Topology answers being read
        # A joining broker's session (Hello MEMBER): (its member key, its challenge).
        self._member: tuple[str, bytes] | None = None
        # Service leadership (broker/leadership.py): "node/runtime/s<n>", made at the
        # first Lead.
        self.candidate = ""
        # Counted in the broker's LoginGate until it logs in or closes.
        self._gated = False
        self._member_proven = False
        self._peer: PeerService | None = None  # a peer link's serving side
        self._relays: dict[int, Relay] = {}  # consumers served by a replica, by tag

    @property
    def user(self) -> str:
        """Who logged in ("" before the login, and for a joining broker's link)."""
        return self.rights.name

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        cfg = self.broker.config
        if not allows(self.broker.allow_from, self.peer_host):
            log.warning("refused a connection from %s: not in allow_from", self.peer)
            self.broker.refused("network")
            self.fail(AccessRefused(
                f"connections from {self.peer_host or 'this peer'} are not allowed here (allow_from)"
            ))
            return
        if len(self.broker.sessions) >= cfg.max_connections:
            self.fail(LimitExceeded(
                f"this broker has {cfg.max_connections} connections open (max_connections)"
            ))
            return
        # Until it logs in, it counts against the smaller limit of those that have not
        # (docs/security.md): strangers never fill max_connections.
        full = self.broker.logins.admit(self.peer_host)
        if full is not None:
            _log_limited(self.peer, full)
            self.broker.refused("unauthenticated")
            self.fail(LimitExceeded(full))
            return
        self._gated = True
        self.broker.sessions.add(self)
        self.watch_timeouts(cfg.hello_timeout, cfg.idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._authenticated()
        if self._update is not None:
            self._update.cancel()
        self.broker.sessions.discard(self)
        for c in list(self.consumers.values()):
            self.broker.delivery.remove(c)
        self.consumers.clear()
        for relay in self._relays.values():
            relay.close()
        self._relays.clear()
        if self.greeted:
            self.broker.leadership.session_closed(self)  # resign its candidacies

    def resume_writing(self) -> None:
        super().resume_writing()
        for c in list(self.consumers.values()):
            self.broker.delivery.pump(c.queue)

    def frames_handled(self) -> None:
        self._flush_publishes()

    def logged_in(self) -> bool:
        # A joining broker's session is greeted at its MEMBER Hello, but has proved
        # nothing until the proof of its UpdateRequest verifies. While the donor checks
        # it (once it has applied the log up to the Join: busy) the hello timeout
        # waits; a refused proof leaves the session to it.
        return self.greeted and (self._member is None or self._member_proven)

    def _proven(self) -> None:
        """The donor verified this member session's proof: it has logged in (a peer
        link's consumers act for users the forwarding broker checked)."""
        self._member_proven = True
        if self._member is not None:
            self.rights = MemberRights(self._member[0], self.broker.refused)
        self._authenticated()

    def _authenticated(self) -> None:
        """It logged in (or closed): it no longer counts against max_unauthenticated."""
        if self._gated:
            self._gated = False
            self.broker.logins.done(self.peer_host)

    def busy(self) -> bool:
        # A joining broker only reads while its update streams: it is not idle.
        return (self._update is not None and not self._update.done()) or (
            self._peer is not None and self._peer.proving  # (a peer proof being checked)
        )

    # -- to the consumers (broker/delivery.py) ---------------------------------------------

    def deliver(self, tag: int, messages: list[list[Any]]) -> None:
        """Send a Deliver frame of ``messages`` to this session's consumer ``tag``."""
        try:
            self.send(wire.Deliver(tag, messages))
        except BatonError as exc:  # cannot happen with the size limits; never wedge a consumer
            log.error("cannot deliver to %s: %s", self.peer, exc)
            self.fail(InternalError(f"delivery failed: {exc.message}"))

    def consumer_cancelled(self, tag: int, exc: BatonError) -> None:
        """The broker ended this session's consumer ``tag``: tell the client why."""
        self.consumers.pop(tag, None)
        self._relays.pop(tag, None)
        self.send(wire.ConsumerCancelled(tag, exc.code, exc.message))

    def rights_changed(self) -> None:
        """This session's user was deleted or its rights changed (applied from the
        log): a deleted user's session closes (Error corr 0 AccessRefused); a consumer
        of a queue the user may no longer read is cancelled (ConsumerCancelled
        AccessRefused; what it held goes back to the queue, not as a failed delivery);
        a candidacy for a service it may no longer lead resigns (docs/security.md)."""
        try:
            self.rights.user()
        except AccessRefused:
            self.fail(AccessRefused(f"user {self.user!r} was deleted"))
            return
        for tag, c in list(self.consumers.items()):
            if self.rights.allowed("read", c.queue):
                continue
            del self.consumers[tag]
            # received=0: the client did nothing wrong, nothing it had counts as failed.
            self.broker.delivery.remove(c, received=0)
            self.consumer_cancelled(tag, AccessRefused(
                f"user {self.user!r} may no longer read queue {c.queue!r}: its read right"
                f" was revoked"
            ))
        for tag, relay in list(self._relays.items()):  # (served by a replica)
            if not self.rights.allowed("read", relay.queue):
                del self._relays[tag]
                relay.close()
                self.consumer_cancelled(tag, AccessRefused(
                    f"user {self.user!r} may no longer read queue {relay.queue!r}: its read"
                    " right was revoked"
                ))
        self.broker.leadership.rights_changed(self, lambda s: self.rights.allowed("lead", s))

    def _submit(self, corr: int, event: Event[R], shape: Shape[R]) -> None:
        check_event(event)  # before the log: an invalid command never grows it
        self.reply(corr, self.broker.node.submit(event), shape)

    def _topology(self, corr: int) -> None:
        """Answer a Topology command once each data partition's log end is read (its
        lag; bounded, broker/log_ends.py): the session reads on meanwhile."""
        self.commands_started(1)

        async def answer() -> None:
            try:
                topology = await self.broker.current_topology()
                self.send(wire.Ok(corr, self.rights.topology(topology)))
            except BatonError as exc:
                self.error(corr, exc)
            except Exception as exc:  # a bug: the client gets an error, the broker goes on
                log.error("topology failed: %r", exc)
                self.error(corr, InternalError(repr(exc)))
            finally:
                self.commands_finished(1)

        task = asyncio.create_task(answer(), name="baton-topology")
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    # -- commands ---------------------------------------------------------------------------

    def handle_frame(self, f: wire.Frame) -> None:
        """Route one frame to its handler (the first must be Hello)."""
        if not self.greeted:
            if isinstance(f, wire.Hello) and self._hello_frame is None:
                self._hello(f)
            elif isinstance(f, wire.AuthResponse) and self._login is not None:
                self._logged_in(f)
            else:
                self.fail(ProtocolError("the first frame must be Hello (then AuthResponse)"))
            return
        if self._member is not None:
            if isinstance(f, (wire.PeerProof, wire.Submit)):
                self._peer_link(f)  # forwarding between brokers (broker/peers.py)
                return
            relaying = self._peer is not None and self._peer.proven
            if not isinstance(f, (wire.UpdateRequest, wire.Ping)) and not (
                relaying and isinstance(f, (wire.Subscribe, wire.QueueStats, *RELAYED))
            ):  # (a proven peer link's consumers: relayed ones, and a relayed Basic.Get's
                # look at the queue first, broker/relay.py)
                self.broker.refused("member")
                raise AccessRefused(
                    f"a member session sends UpdateRequest, PeerProof, Submit and Ping only,"
                    f" not {type(f).__name__}"
                )
        elif isinstance(f, (wire.UpdateRequest, wire.PeerProof, wire.Submit)):
            self.broker.refused("member")
            why = (
                "only a joining broker (Hello MEMBER) may ask for the join update"
                if isinstance(f, wire.UpdateRequest)
                else "only a cluster member (Hello MEMBER) may open a peer link"
            )
            log.warning("refused a join update to %s: %s", self.peer, why)
            raise AccessRefused(why)
        if isinstance(f, RELAYED) and f.consumer in self._relays:
            relay = self._relays[f.consumer]  # its replica answers (broker/relay.py)
            if isinstance(f, wire.Cancel):
                del self._relays[f.consumer]
            relay.command(f)
            return
        if isinstance(f, wire.Publish):
            self._publish(f)
            return
        # Anything else is submitted after the publishes read before it (log order
        # = the order the client sent them).
        self._flush_publishes()
        match f:
            case wire.PublishBatch():
                self.rights.check("write", f.queue)
                messages = self._batch(f.messages)
                delay_ms, not_before, priority = _publish_options(f.options)
                self._submit(
                    f.corr,
                    Enqueue(
                        f.queue,
                        messages,
                        ((f.key, len(messages)),) if f.key else (),
                        delay_ms,
                        not_before,
                        priority,
                        _ttls(f.options, len(messages), self.broker.node.state),
                    ),
                    # A re-sent batch reports its original positions (cluster/state.py),
                    # without the key spans' positions.
                    lambda r: Enqueued(r.first_position, r.count),
                )
            case wire.Ack():
                self._settle(f.corr, f.consumer, f.positions, Accept)
            case wire.Release():
                if not 0 <= f.delay_ms <= MAX_DELAY_MS:
                    raise InvalidArgument(f"delay_ms must be 0..{MAX_DELAY_MS}")
                self._settle(f.corr, f.consumer, f.positions, Release, f.failed, f.delay_ms)
            case wire.Reject():
                self._settle(f.corr, f.consumer, f.positions, Reject)
            case wire.Subscribe():
                self.rights.check("read", f.queue)
                self._subscribe(f)
            case wire.Cancel():
                self._cancel(f)
            case wire.Touch():
                c = self.consumers.get(f.consumer)
                if c is None:
                    raise UnknownConsumer(f"no consumer {f.consumer} on this connection")
                count, missing = c.touch(f.positions)
                self.send(wire.ok(f.corr, Settled(count, missing)))
            case wire.DeclareQueue():
                check_declare(self.rights, f.queue, f.options)
                declare = declare_event(
                    f.queue, f.options, self.rights.name, self.broker.node.state
                )
                partition = f.options.get("partition", 0)
                if partition:
                    check_event(declare)
                    self.reply(f.corr, asyncio.ensure_future(
                        _declare_on(self.broker.node, declare, partition)
                    ), as_is)
                else:
                    self._submit(f.corr, declare, as_is)
            case wire.DeleteQueue():
                self.rights.check("configure", f.queue)
                self._submit(f.corr, DeleteQueue(f.queue), as_is)
            case wire.PurgeQueue():
                self.rights.check("configure", f.queue)
                self._submit(f.corr, PurgeQueue(f.queue), as_is)
            case wire.DeclareExchange():
                self.reply(f.corr, self._exchanges().declare_exchange(
                    f.exchange, f.type, **exchange_options(f.options)), as_is)
            case wire.DeleteExchange():
                self.reply(f.corr, self._exchanges().delete_exchange(
                    f.exchange, if_unused=f.if_unused), as_is)
            case wire.Bind() | wire.Unbind():
                ex = self._exchanges()
                call = ex.bind if isinstance(f, wire.Bind) else ex.unbind
                self.reply(f.corr, call(f.queue, f.exchange, f.routing_key, f.arguments), as_is)
            case wire.BindExchange() | wire.UnbindExchange():
                ex = self._exchanges()
                xcall = ex.bind_exchange if isinstance(f, wire.BindExchange) else ex.unbind_exchange
                self.reply(f.corr, xcall(f.destination, f.source, f.routing_key, f.arguments), as_is)
            case wire.PublishTo():
                self._check_body(f.body, f.headers)
                delay_ms, not_before, priority = _publish_options(f.options)
                ttl = _ttls(f.options, 1, self.broker.node.state)
                self.reply(f.corr, self._exchanges().publish(
                    f.exchange, f.routing_key, f.body, f.headers, key=f.key,
                    delay_ms=delay_ms, not_before=not_before, priority=priority,
                    ttl_ms=ttl[0] if ttl else None), as_is)
            case wire.ListExchanges():
                exchanges = [
                    x for x in self.broker.node.state.exchanges.describe()
                    if self.rights.sees(x["exchange"])
                ]
                self.send(wire.ok(f.corr, ExchangeList(exchanges)))
            case wire.QueueStats():
                self.rights.check_any(f.queue)
                self.send(wire.Ok(f.corr, self.broker.queue_stats(f.queue)))
            case wire.Locate():
                # Where the queue's commands go (docs/design.md §16, "Clients route to
                # replicas"): from control's placement, which every broker applies. A
                # queue the user has no right on is "not placed": the command itself is
                # then refused, with its own error, wherever it is sent.
                node = self.broker.node
                if isinstance(node, Partitioned):
                    where = node.locate(f.queue, self.rights.sees(f.queue))
                else:
                    where = {"partition": 1, "anywhere": True, "addresses": [],
                             "groups": False}
                self.send(wire.Ok(f.corr, where))
            case wire.ListQueues():
                queues = [q for q in self.broker.list_queues() if self.rights.sees(q["queue"])]
                self.send(wire.ok(f.corr, QueueList(queues)))
            case wire.Topology():
                self._topology(f.corr)
            case wire.Peek():
                self.rights.check("read", f.queue)
                self._here(f.queue)
                self.send(wire.ok(f.corr, peek(self.broker.node, f.queue, f.count)))
            case wire.Connections():
                self.rights.check_admin("list connections")
                self.send(wire.ok(f.corr, list_connections(self.broker.connections())))
            case wire.MessageHistory():
                self.rights.check("read", f.queue)
                self._here(f.queue)
                history = message_history(
                    self.broker.node, f.queue, f.position, max_records=f.max_records or None
                )
                self.reply(f.corr, asyncio.ensure_future(history), as_is)
            case wire.Lead():
                self.rights.check("lead", f.service)
                self.broker.leadership.lead(self, f)
            case wire.Resign():
                self.broker.leadership.resign(self, f)  # only this session's own run
            case wire.Services():
                self.send(wire.ok(f.corr, self.broker.leadership.describe()))
            case wire.Handover():
                self.rights.check("lead", f.service)
                self.broker.leadership.handover(self, f)
            case wire.Ping():
                self.send(wire.Ok(f.corr, {}))
            case wire.UpdateRequest():
                if self._update is not None and not self._update.done():
                    raise InvalidArgument("an update is already being served on this connection")
                part = self.broker.node.partition_node(f.partition or 0)
                if part is None or type(f.partition or 0) is not int:
                    raise InvalidArgument(f"this broker applies no log partition {f.partition!r}")
                donor = UpdateDonor(self, part, self.broker.config.update_max_rate,
                                    self.broker.refused)
                self._update = asyncio.create_task(
                    donor.serve(f, self._member, self._proven), name="baton-update"
                )
            case wire.ReadRange():
                self.rights.check("read", f.queue)
                self._here(f.queue)
                self.reply(
                    f.corr, read_range(self.broker.node, f, self.broker.config.max_frame), as_is
                )
            case wire.Reserve():
                self.rights.check("read", f.queue)
                _check_fence(f.service, f.token)
                self._submit(
                    f.corr, Reserve(f.queue, f.holder or None, f.service, f.token), as_is
                )
            case wire.AcceptThrough():
                self.rights.check("read", f.queue)
                if f.through < 0:
                    raise InvalidArgument("through must be a non-negative position")
                _check_fence(f.service, f.token)
                self._submit(
                    f.corr, AcceptThrough(f.queue, f.through, f.holder, f.service, f.token), as_is
                )
            case wire.PutUser() | wire.DeleteUser() | wire.SetRights():
                self.rights.check_admin("manage users")
                self._submit(f.corr, user_event(f), as_is)
            case wire.SetUserLimits():
                self.rights.check_admin("manage users")
                self._submit(
                    f.corr, limits_event(f.name, f.limits, self.broker.node.state), as_is
                )
            case wire.SetUserTags():
                self.rights.check_admin("manage users")
                self._submit(f.corr, tags_event(f.name, f.tags, self.broker.node.state), as_is)
            case wire.ListUsers():
                self.rights.check_admin("list users")
                self.send(wire.ok(f.corr, list_users(self.broker.node.state.users)))
            case wire.ListPolicies():
                self.send(wire.ok(f.corr, list_policies(self.broker.node.state)))
            case wire.SetPolicy():
                self.rights.check_admin("manage policies")
                self._submit(f.corr, set_policy_event(
                    self.broker.node.state, f.name, f.pattern, f.apply_to, f.definition,
                    f.priority,
                ), as_is)
            case wire.ClearPolicy():
                self.rights.check_admin("manage policies")
                self._submit(f.corr, clear_policy_event(self.broker.node.state, f.name), as_is)
            case wire.ListFeatures():
                self.send(wire.ok(f.corr, feature_list(self.broker.node.state)))
            case wire.EnableFeatures():
                self.rights.check_admin("enable feature flags")
                self._submit(f.corr, enable_event(self.broker.node.state, f.names), as_is)
            case wire.GrowPartitions():
                self.rights.check_admin("grow partitions")
                self.reply(f.corr, asyncio.ensure_future(
                    grow_partitions(self.broker.node, f.count)
                ), as_is)
            case wire.MovePartition():
                self.rights.check_admin("move partitions")
                self.reply(f.corr, asyncio.ensure_future(move_partition(
                    self.broker.node, f.partition, f.source, f.target
                )), as_is)
            case wire.RebalancePartitions():
                self.rights.check_admin("rebalance partitions")
                self.reply(f.corr, asyncio.ensure_future(
                    rebalance_partitions(self.broker.node, f.dry_run)
                ), as_is)
            case wire.SetReplicas():
                self.rights.check_admin("set the replica group size")
                self.reply(f.corr, asyncio.ensure_future(
                    set_replicas(self.broker.node, f.replicas)
                ), as_is)
            case wire.Hello():
                raise ProtocolError("Hello was already sent on this connection")
            case _:
                raise ProtocolError(f"{type(f).__name__} is not a client command")

    def _here(self, queue: str) -> None:
        """A read of ``queue``'s messages is answered where they are: refused, naming
        them, on a broker outside its replica group (docs/design.md §16)."""
        away = elsewhere(self.broker.node, queue, "ask")
        if away is not None:
            raise away

    def _exchanges(self) -> ExchangeFacade:
        """Exchange commands, with this session's rights (docs/design.md §14)."""
        return ExchangeFacade(self.broker.node, self.rights)

    def _publish(self, f: wire.Publish) -> None:
        """One publish: merged with the others read in one go when its queue has no
        max_length (see :meth:`_flush_publishes`), else submitted alone."""
        self.rights.check("write", f.queue)
        self._check_body(f.body, f.headers)
        check_name("queue name", f.queue)  # before merging: a bad one fails alone
        check_key(f.key)
        q = self.broker.node.queues.get(f.queue)
        if q is not None and q.max_length is None and not f.options:
            self._publishes.setdefault(f.queue, []).append((f.corr, f.body, f.headers, f.key))
            return
        delay_ms, not_before, priority = _publish_options(f.options)  # (they go alone)
        ttls = _ttls(f.options, 1, self.broker.node.state)
        self._flush_publishes()
        self._submit(
            f.corr,
            Enqueue(
                f.queue,
                ((f.body, f.headers),),
                ((f.key, 1),) if f.key else (),
                delay_ms,
                not_before,
                priority,
                ttls,
            ),
            lambda r: Published(r.first_position),
        )

    def _flush_publishes(self) -> None:
        """Submit the merged publishes: one Enqueue per queue, one Ok per publish.

        Only queues without max_length are merged: a merged Enqueue is atomic, and
        merging must not make a publish that fits fail with QueueFull.
        """
        if not self._publishes:
            return
        pending, self._publishes = self._publishes, {}
        for queue, items in pending.items():
            # One key span per publish, so that the state can tell a re-sent one.
            keys = tuple((k, 1) for _, _, _, k in items) if any(i[3] for i in items) else ()
            fut = self.broker.node.submit(
                Enqueue(queue, tuple((b, h) for _, b, h, _ in items), keys)
            )
            self.commands_started(len(items))
            fut.add_done_callback(self._merged_done(items))

    def _merged_done(
        self, items: list[tuple[int, bytes, dict[str, Any], str]]
    ) -> Callable[[asyncio.Future[Enqueued]], None]:
        def done(f: asyncio.Future[Enqueued]) -> None:
            self.commands_finished(len(items))
            exc = f.exception() if not f.cancelled() else InternalError("command cancelled")
            if exc is None:
                result = f.result()
                # With keys, each publish's own position (a re-sent one keeps its
                # original); without, they are consecutive.
                positions: list[int] | range | None = result.positions
                if positions is None:
                    first = result.first_position
                    positions = range(first, first + len(items))
                for (corr, _, _, _), position in zip(items, positions):
                    self.send(wire.ok(corr, Published(position)))
            else:
                err = exc if isinstance(exc, BatonError) else InternalError(repr(exc))
                for corr, _, _, _ in items:
                    self.error(corr, err)

        return done

    def _peer_link(self, f: wire.PeerProof | wire.Submit) -> None:
        """A peer link's frame (broker/peers.py): its proof, then forwarded events."""
        assert self._member is not None
        if self._peer is None:
            self._peer = PeerService(
                self, self.broker.node, self._member, self._proven, self.broker.refused
            )
        if isinstance(f, wire.PeerProof):
            self._peer.prove(f)
        else:
            self._peer.submit(f)

    def _member_hello(self, f: wire.Hello) -> None:
        """A joining broker's Hello (cluster/member_proof.py): the session gets a fresh
        challenge, which its UpdateRequest must sign, and may send only UpdateRequest
        and Ping."""
        member = f.auth.get("member")
        if not isinstance(member, str) or not member:
            why = "a MEMBER Hello names the joining runtime (auth 'member')"
            _log_refusal(self.peer, why)
            self.broker.refused("member")
            self.fail(AccessRefused(why))
            return
        self._member = (member, member_proof.new_nonce())
        # The flags this build supports: a joiner of this version then says its own in
        # its UpdateRequest (cluster/features.py); an older joiner ignores the key.
        self._greet(f.corr, {"nonce": self._member[1], "features": sorted(FEATURES)})

    def _hello(self, f: wire.Hello) -> None:
        # The client says the newest version it speaks; the session speaks the lower of
        # that and this broker's newest (answered in HelloOk), so a newer client works
        # with this broker and an older one too, down to MIN_PROTOCOL_VERSION.
        if f.version < wire.MIN_PROTOCOL_VERSION:
            self.fail(
                UnsupportedVersion(
                    f"protocol version {f.version} is not supported (this broker speaks "
                    f"{wire.MIN_PROTOCOL_VERSION} to {wire.PROTOCOL_VERSION})"
                )
            )
            return
        self.protocol_version = min(f.version, wire.PROTOCOL_VERSION)
        self._hello_frame = f
        self.client_name = f.client_name
        if f.auth.get("mechanism") == member_proof.MECHANISM:
            self._member_hello(f)
            return
        login = Login(self.broker.node.state.users, self.broker.auth_secret)
        try:
            challenge = login.first(f.auth)
        except AccessRefused as exc:
            self._refuse(exc.message)
            return
        self._login = login
        self.send(wire.AuthChallenge(f.corr, {"message": challenge}))

    def _logged_in(self, f: wire.AuthResponse) -> None:
        """The client's proof: greet it, or refuse and close."""
        login, self._login = self._login, None
        assert login is not None
        try:
            user, outcome = login.final(f.data, self.loopback, self.peer)
        except AccessRefused as exc:
            self._refuse(exc.message)
            return
        try:  # the user's max_connections, on this broker (docs/security.md)
            held = sum(1 for c in self.broker.connections() if c.user == user.name)
            check_user_limit(self.broker.node.state.users, user.name, "max_connections", held)
        except LimitExceeded as exc:
            _log_limited(self.peer, exc.message)
            self.broker.refused("limit")
            self.fail(exc)
            return
        self.rights = Rights(lambda: self.broker.node.state.users, user.name, self.broker.refused)
        self._authenticated()
        # "locate": this broker answers Locate (docs/client.md "Routing"); a client
        # sends it only to a broker that says so (one before it closes on the frame).
        self._greet(f.corr, {"message": outcome, "user": user.name, "admin": user.admin,
                             "locate": True})

    def _greet(self, corr: int, auth: dict[str, Any]) -> None:
        self.greeted = True
        cfg = self.broker.config
        self.send(
            wire.HelloOk(
                corr,
                self.protocol_version,
                f"baton/{self.broker.version}",
                self.broker.node.node_id,
                cfg.max_frame,
                cfg.max_message,
                auth,
            )
        )

    def _refuse(self, why: str) -> None:
        _log_refusal(self.peer, why)
        self.broker.refused("login")
        self.fail(AccessRefused(why))

    def _check_body(self, body: bytes, headers: dict[str, Any]) -> None:
        limit = self.broker.config.max_message
        if len(body) > limit:
            raise MessageTooLarge(f"message of {len(body)} bytes is above the maximum of {limit}")
        if headers:
            check_headers(headers)  # before packing: deep nesting is refused, not packed
            size = len(self._packer.pack(headers))
            if size > self.broker.config.max_headers:
                raise MessageTooLarge(
                    f"headers of {size} bytes are above the maximum of "
                    f"{self.broker.config.max_headers}"
                )

    def _batch(self, messages: list[Any]) -> tuple[tuple[bytes, dict[str, Any]], ...]:
        if not messages:
            raise InvalidArgument("publish_batch needs at least one message")
        out = []
        for m in messages:
            if (
                not isinstance(m, list)
                or len(m) != 2
                or not isinstance(m[0], bytes)
                or not isinstance(m[1], dict)
            ):
                raise InvalidArgument("each batch message must be [body: bytes, headers: map]")
            self._check_body(m[0], m[1])
            out.append((m[0], m[1]))
        return tuple(out)

    def _subscribe(self, f: wire.Subscribe) -> None:
        cfg = self.broker.config
        limit = cfg.max_prefetch
        if not 1 <= f.prefetch <= limit:
            raise InvalidArgument(f"prefetch must be 1..{limit}")
        if len(self.consumers) >= cfg.max_consumers:
            raise LimitExceeded(
                f"a connection may have {cfg.max_consumers} consumers at once (max_consumers)"
            )
        check_user_limit(self.broker.node.state.users, self.user, "max_consumers", sum(
            len(c.consumers) for c in self.broker.connections() if c.user == self.user
        ))
        total = sum(c.prefetch for c in self.consumers.values()) + f.prefetch
        if total > cfg.max_connection_prefetch:
            raise LimitExceeded(
                f"the prefetch of a connection's consumers may add up to"
                f" {cfg.max_connection_prefetch} (max_connection_prefetch), this would be {total}"
            )
        check_name("queue name", f.queue)  # its Interest events go to the log
        counters, ack_timeout_ms = _subscribe_options(f.options)
        self._next_tag += 1
        tag = self._next_tag
        node = self.broker.node
        peers = self.broker.peers
        k = node.state.placement.get(f.queue) if isinstance(node, Partitioned) else None
        if peers is not None and k is not None and elsewhere(node, f.queue) is not None:
            # Replica groups: one of the partition's replicas serves it (broker/relay.py).
            relay = self._relays[tag] = Relay(peers, k, f.queue, self, tag)

            async def subscribe() -> Subscribed:
                try:
                    await relay.start(f)
                except BaseException:
                    self._relays.pop(tag, None)
                    raise
                return Subscribed(tag)

            fut = asyncio.ensure_future(subscribe())
            self.reply(f.corr, fut, as_is)
            fut.add_done_callback(lambda _: relay.ready())  # (after the Ok: its deliveries)
            return
        c = self.broker.delivery.add(f.queue, f.prefetch, self, tag, counters, ack_timeout_ms)
        self.consumers[tag] = c
        self.send(wire.ok(f.corr, Subscribed(tag)))
        self.broker.delivery.pump(f.queue)

    def _cancel(self, f: wire.Cancel) -> None:
        c = self.consumers.pop(f.consumer, None)
        if c is None:
            raise UnknownConsumer(f"no consumer {f.consumer} on this connection")
        fut = self.broker.delivery.remove(c, f.unread, f.received)
        if fut is None:
            self.send(wire.ok(f.corr, Cancelled(0)))
        else:
            self.reply(f.corr, fut, lambda r: Cancelled(r.count))

    def _settle(
        self,
        corr: int,
        tag: int,
        positions: list[int],
        kind: type[Accept | Release | Reject],
        failed: bool = True,
        delay_ms: int = 0,
    ) -> None:
        """Settle what the consumer holds; report the rest as ``not_acquired``.

        Clients coalesce many callers' settlements into one frame, so one stale
        position must not fail the others: they are answered with :class:`Settled`
        (``count`` settled, the rest ``not_acquired``).
        """
        c = self.consumers.get(tag)
        if c is None:
            raise UnknownConsumer(f"no consumer {tag} on this connection")
        if not all(type(p) is int and p >= 0 for p in positions):
            raise InvalidArgument("positions must be non-negative integers")
        held = c.held
        mine: list[int] = []
        missing: list[int] = []
        for p in positions:
            if p in held:
                del held[p]
                mine.append(p)
            else:
                missing.append(p)  # never delivered to it, settled already, or twice here
        if not mine:
            self.send(wire.ok(corr, Settled(0, missing)))
            return
        c.settled_positions(mine)
        c.settling += len(mine)
        if kind is Release:
            event: Accept | Release | Reject = Release(
                c.queue, c.cid, tuple(mine), failed, delay_ms
            )
            self.broker.delivery.released(c)
        else:
            event = kind(c.queue, c.cid, tuple(mine))
        fut = self.broker.node.submit(event)
        delivery = self.broker.delivery

        def settled(f: asyncio.Future[Settled]) -> None:
            c.settling -= len(mine)
            if f.cancelled() or f.exception() is not None:
                # Still ours: released if we disconnect (the client had them).
                held.update(dict.fromkeys(mine, -1))
            delivery.settled(c)

        fut.add_done_callback(settled)
        delivery.settled(c)  # credit is back now; see Consumer.credit
        self.reply(corr, fut, lambda r: Settled(r.count, missing + r.not_acquired))


def _publish_options(options: dict[str, Any]) -> tuple[int, int, int]:
    """Read a Publish's options; returns ``(delay_ms, not_before, priority)``.

    Raises:
        InvalidArgument: an unknown option, or a bad value.
    """
    if not options:
        return 0, 0, 0
    for key, value in options.items():
        if key not in ("delay_ms", "not_before", "priority", "ttl_ms"):
            raise InvalidArgument(
                f"unknown publish option {key!r} (known: delay_ms, not_before, priority,"
                " ttl_ms)"
            )
        if type(value) is not int or value < 0:
            raise InvalidArgument(f"publish option {key!r} must be a non-negative int")
    delay_ms = options.get("delay_ms", 0)
    if delay_ms > MAX_DELAY_MS:
        raise InvalidArgument(f"delay_ms must be at most {MAX_DELAY_MS}")
    priority = options.get("priority", 0)
    if priority > 9:
        raise InvalidArgument("priority must be 0..9")
    return delay_ms, options.get("not_before", 0), priority


def _ttls(options: dict[str, Any], n: int, state: State) -> tuple[int | None, ...]:
    """A publish's own TTL (option ``ttl_ms``, checked by :func:`_publish_options`) for
    each of its ``n`` messages, or () without one.

    Raises:
        InvalidArgument: the flag ``message_ttl`` is off, or the TTL is too long.
    """
    ttl = options.get("ttl_ms") if options else None
    if ttl is None:
        return ()
    if "message_ttl" not in state.features.enabled:
        raise InvalidArgument(
            "a message's own TTL (ttl) needs the feature flag message_ttl: enable it with"
            " 'baton feature enable message_ttl' once every broker runs Baton 0.4.0 or later"
        )
    if ttl > MAX_TTL_MS:
        raise InvalidArgument(f"ttl_ms must be at most {MAX_TTL_MS}")
    return (ttl,) * n


def _subscribe_options(options: dict[str, Any]) -> tuple[bool, int | None]:
    """Read a Subscribe's options; returns ``(counters, ack_timeout_ms)``.

    Raises:
        InvalidArgument: an unknown option, or one of the wrong type or range.
    """
    for key, value in options.items():
        if key == "counters":
            if not isinstance(value, bool):
                raise InvalidArgument("subscribe option 'counters' must be a bool")
        elif key == "ack_timeout_ms":
            if type(value) is not int or not 1 <= value <= MAX_DELAY_MS:
                raise InvalidArgument(f"ack_timeout_ms must be 1..{MAX_DELAY_MS}")
        else:
            raise InvalidArgument(
                f"unknown subscribe option {key!r} (known: counters, ack_timeout_ms)"
            )
    return bool(options.get("counters", False)), options.get("ack_timeout_ms")




def check_declare(rights: Rights, queue: str, options: dict[str, Any]) -> None:
    """The rights a declare of ``queue`` with ``options`` needs (docs/security.md):
    configure on the queue, and write where its dead letters go.

    Raises:
        AccessRefused: one is missing; or the name is one of AMQP's direct reply-to
            queues (publishes to those need no write right: their random names are it).
    """
    if queue.startswith("amq.rabbitmq.reply-to"):
        raise AccessRefused(
            f"queue name {queue!r} is reserved for AMQP's direct reply-to (docs/amqp.md)"
        )
    rights.check("configure", queue)
    dead_letter = options.get("dead_letter")
    if isinstance(dead_letter, str) and dead_letter:
        rights.check("write", dead_letter)  # its messages go there
    dlx = options.get("dead_letter_exchange")
    if isinstance(dlx, str):  # its dead letters are published there
        if dlx:
            rights.check("write", dlx, "exchange")
        else:  # the default exchange: the queue the routing key names
            rk = options.get("dead_letter_routing_key")
            rights.check("write", rk if isinstance(rk, str) else "")


async def _declare_on(node: Node, declare: DeclareQueue, partition: int) -> Any:
    """Place the queue on data ``partition`` (docs/design.md §16), then declare it."""
    await node.place(declare.queue, partition)
    return await node.submit(declare)


def declare_event(
    queue: str, options: dict[str, Any], user: str | None = None, state: State | None = None
) -> DeclareQueue:
    """The DeclareQueue event for ``queue`` with the client's ``options``, declared by
    ``user``: the event names the user only once the cluster (``state``) has the flag
    ``user_limits`` (before, a record with it is one older builds cannot read). An
    ``expires_ms`` needs the flag ``queue_expiry``.

    Raises:
        InvalidArgument: an unknown option, or one of the wrong type.
    """
    if user is not None and (state is None or "user_limits" not in state.features.enabled):
        user = None
    for key, value in options.items():
        allowed = _DECLARE_OPTIONS.get(key)
        if allowed is None:
            raise InvalidArgument(
                f"unknown queue option {key!r} (known: {', '.join(_DECLARE_OPTIONS)})"
            )
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise InvalidArgument(f"queue option {key!r} has the wrong type")
    expires_ms = options.get("expires_ms")
    if expires_ms is not None and (state is None or "queue_expiry" not in state.features.enabled):
        # (a record with it is one older builds cannot read; the state refuses it too)
        raise InvalidArgument(
            "queue expiry (expires, AMQP x-expires) needs the feature flag queue_expiry:"
            " enable it with 'baton feature enable queue_expiry' once every broker runs"
            " Baton 0.4.0 or later"
        )
    return DeclareQueue(
        queue,
        durable=options.get("durable", True),
        max_length=options.get("max_length"),
        overflow=options.get("overflow", "reject-publish"),
        delivery_limit=options.get("delivery_limit", DEFAULT_DELIVERY_LIMIT),
        dead_letter=options.get("dead_letter"),
        message_ttl_ms=options.get("message_ttl_ms"),
        retry=options.get("retry") or "",
        retry_delay_ms=options.get("retry_delay_ms", 0),
        retry_max_ms=options.get("retry_max_ms"),
        ack_timeout_ms=options.get("ack_timeout_ms"),
        max_priority=options.get("max_priority") or 0,
        single_active_consumer=options.get("single_active_consumer", False),
        dedupe_window_ms=options.get("dedupe_window_ms", DEFAULT_DEDUPE_WINDOW_MS),
        dead_letter_exchange=options.get("dead_letter_exchange"),
        dead_letter_routing_key=options.get("dead_letter_routing_key"),
        user=user,
        expires_ms=expires_ms,
    )


# Refused logins, and connections refused by a limit, are logged at most once a second
# each (docs/security.md).
_log_refusal = QuietLog(log, "login refused")
_log_limited = QuietLog(log, "refused a connection")


def _check_fence(service: str, token: int) -> None:
    """A range commit is either unfenced ("" and -1) or names a service and a token >= 0.

    Raises:
        InvalidArgument: one without the other, or a negative token.
    """
    if (service == "") != (token == -1) or token < -1:
        raise InvalidArgument(
            "a fenced range commit needs both the service and its term's token (>= 0);"
            " an unfenced one neither"
        )
