"""Forwarding between brokers (docs/design.md §16, "Forwarding between brokers").

With replica groups a data partition is applied, stored and served by some brokers
only, while a client may send its commands to any. A broker that receives a command for
a queue on a partition it does not replicate has it appended by one of the partition's
replicas instead, over a **peer link**: one connection per peer broker, opened on
demand and kept, reconnected with backoff, its requests multiplexed by correlation id.

The forwarding side (:class:`Peers`, set as ``Partitioned.remote``): the event goes,
in the log's record codec (cluster/codec.py), in a ``Submit`` frame to the partition's
replicas in turn, its leader first; a connection failure or a ``NotReplica`` answer
makes it try the next (a bounded number of rounds, then ``LogUnavailable`` naming them).
The answer comes back as ``Submitted`` with the result (a cluster/results.py value,
:func:`encode_result`), or as the native ``Error`` frame, raised here as the same
BatonError class: a client of this broker sees what a client of the replica would. A
publish sent again after a link broke keeps its publish keys, so the replica
deduplicates it exactly as it would a client's own retry.

The link authenticates as a cluster member: ``Hello`` with the ``MEMBER`` mechanism
(cluster/member_link.py, shared with the join update), then ``PeerProof``, the
runtime's signature of the challenge by the key its ``Join`` recorded on control
(cluster/member_proof.py). A runtime whose key control has not recorded (it replayed
the log instead of joining) appends its ``Join`` again first, with the same key.

The serving side (:class:`PeerService`, one per member session of broker/session.py):
a proof is accepted only from a member of control's view as applied here whose proof
verifies against the recorded key; a ``Submit`` only on a proven link, from a runtime
still in the view, for a data partition this broker replicates (else ``NotReplica``),
and only for the queue events that may be appended by any replica
(:data:`FORWARDABLE`): it is appended as this broker's own with ``node.submit``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from batonmq.broker.access import Rights
from batonmq.clients import wire
from batonmq.cluster import codec
from batonmq.cluster.errors import (
    AccessRefused,
    BatonError,
    ConnectionClosed,
    InternalError,
    InvalidArgument,
    LogUnavailable,
    NotReplica,
    ProtocolError,
    for_code,
)
from batonmq.cluster.events import (
    AcceptThrough,
    AnyEvent,
    DeclareQueue,
    DeleteQueue,
    Enqueue,
    FanOut,
    ForwardIn,
    Origin,
    PurgeQueue,
    Reserve,
    RoutedEnqueue,
)
from batonmq.cluster.member_link import MemberLink
from batonmq.cluster.member_proof import PEER, MemberKey, check_peer
from batonmq.cluster.node import Node
from batonmq.cluster.partitioned import Partitioned
from batonmq.cluster.results import RESULT_TYPES, Result
from batonmq.cluster.state import State
from batonmq.cluster.users import Users

__all__ = [
    "FORWARDABLE",
    "ForwardCounts",
    "Peers",
    "PeerService",
    "encode_event",
    "decode_event",
    "encode_result",
    "decode_result",
    "kind_of",
    "elsewhere",
    "routable",
    "NotSent",
    "RelaySink",
    "MemberRights",
]

log = logging.getLogger("baton.peers")

#: The events a broker may have another append for it: a client's commands on a queue
#: (and a publish forwarded between partitions), which mean the same whichever replica
#: appends them. A consumer's events (Interest, Acquire, settlements) name this
#: broker's runtime and consumers, and stay with the partition's replicas.
FORWARDABLE: tuple[type[AnyEvent], ...] = (
    DeclareQueue, DeleteQueue, PurgeQueue, Enqueue, RoutedEnqueue, FanOut, ForwardIn,
    Reserve, AcceptThrough,
)
#: Those that are safe to send again to another replica after a link broke with the
#: event in flight: the publishes (their keys deduplicate them) and a declare (it
#: checks, or creates once). A delete or purge is not: its outcome is unknown.
_AGAIN: tuple[type[AnyEvent], ...] = (DeclareQueue, Enqueue, RoutedEnqueue, FanOut, ForwardIn)
_PUBLISHES = (Enqueue, RoutedEnqueue, FanOut, ForwardIn)

#: Rounds over a partition's replicas before a forward fails, and the pause after each.
ROUNDS = 3
ROUND_PAUSE = 0.3
#: A peer that could not be reached is tried again after this (doubling up to the max).
BACKOFF_MIN = 0.1
BACKOFF_MAX = 5.0
CONNECT_TIMEOUT = 3.0
#: How long a serving broker waits for the proving runtime's view and key to be
#: applied here (it may have appended its Join a moment ago).
PROOF_WAIT = 5.0
#: The largest frame a peer link reads (a Submitted result is small; an Error too).
_MAX_FRAME = 16 << 20
_NO_ORIGIN = Origin("", "", 0, 0)
_RESULTS: Mapping[str, type[Result]] = {cls.__name__: cls for cls in RESULT_TYPES}


def kind_of(event: AnyEvent) -> str:
    """The ``kind`` label of ``baton_forwarded_total``: publish, declare or other."""
    if isinstance(event, _PUBLISHES):
        return "publish"
    if isinstance(event, DeclareQueue):
        return "declare"
    return "other"


def encode_event(event: AnyEvent) -> bytes:
    """``event`` in the log's record codec (cluster/codec.py), with an empty envelope:
    the replica appends it as its own."""
    return codec.encode(_NO_ORIGIN, event)


def decode_event(data: bytes) -> AnyEvent:
    """The event :func:`encode_event` encoded.

    Raises:
        MalformedEvent: not a well-formed event.
        UnreadableRecord: an event of a newer build.
    """
    return codec.decode(data)[1]


def encode_result(result: Result | None) -> Any:
    """What a ``Submitted`` frame carries: ``[type name, its Ok map]``, or None."""
    if result is None:
        return None
    return [type(result).__name__, wire.result_map(result)]


def decode_result(raw: Any) -> Result | None:
    """The result :func:`encode_result` encoded.

    Raises:
        ProtocolError: not a known result type, or a field missing or of a wrong type.
    """
    if raw is None:
        return None
    if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[1], dict)):
        raise ProtocolError(f"a forwarded result must be [type, map], not {raw!r:.200}")
    kind = _RESULTS.get(raw[0]) if isinstance(raw[0], str) else None
    if kind is None:
        raise ProtocolError(f"unknown result type {raw[0]!r} in a forwarded result")
    return wire.read_result(kind, raw[1])


@dataclass
class ForwardCounts:
    """What the metrics read (``baton_forwarded_total``, ``baton_forward_errors_total``)."""

    #: Events a replica took for this broker, by :func:`kind_of`.
    forwarded: dict[str, int] = field(default_factory=dict)
    #: Attempts that failed: no connection, the link broke, or the peer does not
    #: replicate the partition (another replica is then tried).
    errors: int = 0


class ForwardingNode(Protocol):
    """What the forwarding side needs of the broker's node (cluster/partitioned.py)."""

    key: str
    join_key: MemberKey
    address: str

    @property
    def state(self) -> State:
        """Control's state: its view and the member keys its Joins recorded."""
        ...

    @property
    def tls(self) -> Any:
        """The TLS context to connect to another broker with (None: plaintext)."""
        ...

    def replica_addresses(self, k: int) -> list[str]:
        """Live replicas of data partition ``k``, its leader first."""
        ...

    async def rejoin(self) -> None:
        """Append this runtime's Join (its key) to control again."""
        ...


class PeerLink(MemberLink):
    """The connection to one peer broker, greeted as a member."""

    what = "peer link"
    client = "baton-peer"


class Peer:
    """One peer broker: its link, opened on demand and kept, requests by corr."""

    def __init__(self, address: str, node: ForwardingNode) -> None:
        self.address = address
        self._node = node
        self._link: PeerLink | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        #: Relayed consumers (broker/relay.py): by the peer's consumer tag, and those
        #: whose Subscribe is not answered yet, by corr.
        self.sinks: dict[int, RelaySink] = {}
        self._subscribing: dict[int, RelaySink] = {}
        self._corr = 2  # (1: the Hello, 2: the proof)
        self._opening = asyncio.Lock()
        self._backoff = 0.0
        self._retry_at = 0.0
        self._why = ""

    async def submit(self, partition: int, event: bytes) -> Any:
        """Send one ``Submit``; returns the raw ``Submitted`` result.

        Raises:
            ConnectionClosed: no link (:class:`NotSent`: nothing was sent) or the link
                broke before the answer.
            BatonError: the replica's answer.
        """
        return await self.request(lambda corr: wire.Submit(corr, partition, event))

    async def request(
        self, make: Callable[[int], wire.Frame], sink: RelaySink | None = None
    ) -> Any:
        """Send the frame ``make(corr)`` makes; returns its answer's result (``Ok``'s map,
        ``Submitted``'s result). With ``sink``, a ``Subscribe``: the consumer tag its
        ``Ok`` names gets the deliveries from then on (broker/relay.py).

        Raises:
            ConnectionClosed: no link (:class:`NotSent`: nothing was sent) or the link
                broke before the answer.
            BatonError: the peer's answer.
        """
        link = await self._connected()
        self._corr += 1
        corr = self._corr
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[corr] = fut
        if sink is not None:
            self._subscribing[corr] = sink
        try:
            if link.writer.is_closing():
                # (the peer went; the link's reader has not seen it yet)
                raise NotSent(f"the peer link to {self.address} is closed")
            link.send(make(corr))
        except (RuntimeError, OSError) as exc:  # written to a transport just closed
            self._pending.pop(corr, None)
            self._subscribing.pop(corr, None)
            raise NotSent(f"the peer link to {self.address} is closed: {exc}") from None
        except BaseException:
            self._pending.pop(corr, None)
            self._subscribing.pop(corr, None)
            raise
        return await fut

    def unsubscribed(self, tag: int) -> None:
        """The relayed consumer ``tag`` has ended: its deliveries go nowhere."""
        self.sinks.pop(tag, None)

    async def _connected(self) -> PeerLink:
        if self._link is not None:
            return self._link
        async with self._opening:
            if self._link is not None:
                return self._link
            if time.monotonic() < self._retry_at:
                raise NotSent(f"{self.address} is unreachable (tried again shortly): {self._why}")
            try:
                link = await self._open()
            except BatonError as exc:
                self._backoff = min(max(2 * self._backoff, BACKOFF_MIN), BACKOFF_MAX)
                self._retry_at = time.monotonic() + self._backoff
                self._why = exc.message
                # (a refused proof too: another replica may have applied this runtime's
                # Join already; nothing was sent)
                raise NotSent(exc.message) from exc
            self._backoff = 0.0
            self._link = link
            self._reader = asyncio.create_task(self._read(link), name="baton-peer")
            log.info("peer link to %s open", self.address)
            return link

    async def _open(self) -> PeerLink:
        node = self._node
        link = await PeerLink.open(
            self.address, node.key, node.tls, max_frame=_MAX_FRAME, error=ConnectionClosed,
            timeout=CONNECT_TIMEOUT,
        )
        try:
            proof = node.join_key.prove(link.nonce, link.node_id, PEER)
            link.send(wire.PeerProof(2, node.key, proof))
            frame = await link.next(PROOF_WAIT + CONNECT_TIMEOUT)
            if isinstance(frame, wire.Error):
                raise for_code(frame.code, f"{self.address} refused this broker's peer link:"
                                           f" {frame.message}")
            if not isinstance(frame, wire.Ok):
                raise ProtocolError(f"{self.address} answered the peer proof with {frame}")
        except BaseException:
            link.close()
            raise
        return link

    async def _read(self, link: PeerLink) -> None:
        why: BatonError = ConnectionClosed(f"the peer link to {self.address} closed")
        try:
            while True:
                frame = await link.next()
                if isinstance(frame, (wire.Submitted, wire.Ok)):
                    sink = self._subscribing.pop(frame.corr, None)
                    if sink is not None and isinstance(frame.result.get("consumer"), int):
                        # (now: its first Deliver may be the next frame read)
                        self.sinks[frame.result["consumer"]] = sink
                    fut = self._pending.pop(frame.corr, None)
                    if fut is not None and not fut.done():
                        fut.set_result(frame.result)
                elif isinstance(frame, wire.Deliver):
                    target = self.sinks.get(frame.consumer)
                    if target is not None:
                        target.deliver(frame.messages)
                elif isinstance(frame, wire.Expired):
                    target = self.sinks.get(frame.consumer)
                    if target is not None:
                        target.expired(frame.positions)
                elif isinstance(frame, wire.ConsumerCancelled):
                    target = self.sinks.pop(frame.consumer, None)
                    if target is not None:
                        target.cancelled(for_code(frame.code, frame.message))
                elif isinstance(frame, wire.Error):
                    err = for_code(frame.code, frame.message)
                    if frame.corr == 0:  # the link itself failed
                        why = ConnectionClosed(
                            f"{self.address} closed the peer link: {err.message}"
                        )
                        return
                    self._subscribing.pop(frame.corr, None)
                    fut = self._pending.pop(frame.corr, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(err)
        except BatonError as exc:
            why = exc if isinstance(exc, ConnectionClosed) else ConnectionClosed(exc.message)
        except asyncio.CancelledError:
            why = ConnectionClosed(f"the peer link to {self.address} was closed here")
            raise
        finally:
            self._link = None
            link.close()
            pending, self._pending = self._pending, {}
            for fut in pending.values():
                if not fut.done():
                    fut.set_exception(why)
            sinks, self.sinks, self._subscribing = self.sinks, {}, {}
            for sink in sinks.values():
                sink.cancelled(why)
            log.info("peer link to %s closed: %s", self.address, why.message)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._link is not None:
            self._link.close()


class MemberRights(Rights):
    """A proven peer link's rights: a consumer it subscribes acts for a user of the
    forwarding broker, whose rights that broker checked at its edge (broker/relay.py)."""

    def __init__(self, member: str, refused: Callable[[str], None]) -> None:
        super().__init__(Users, f"member {member}", refused)

    def allowed(self, right: str, name: str) -> bool:
        return True


class RelaySink(Protocol):
    """A relayed consumer, as the peer link feeds it (broker/relay.py)."""

    def deliver(self, messages: list[list[Any]]) -> None: ...

    def expired(self, positions: list[int]) -> None: ...

    def cancelled(self, why: BatonError) -> None: ...


class NotSent(ConnectionClosed):
    """No link to the peer: nothing was sent (safe to send to another replica)."""


class Peers:
    """This broker's peer links, and forwarding an event to a data partition's replicas
    (``Partitioned.remote``)."""

    def __init__(self, node: ForwardingNode) -> None:
        self._node = node
        self._peers: dict[str, Peer] = {}
        self.counts = ForwardCounts()
        self._recording: asyncio.Task[None] | None = None

    async def remote(self, k: int, event: AnyEvent) -> Any:
        """Have a replica of data partition ``k`` append ``event``; its result.

        Raises:
            NotReplica: an event no other broker may append for this one (a consumer's).
            LogUnavailable: no replica could be reached (every one tried, in rounds).
            BatonError: what the replica answered (as if appended here).
        """
        node = self._node
        if not isinstance(event, FORWARDABLE):
            self.counts.errors += 1
            raise NotReplica(
                f"{type(event).__name__} of queue {getattr(event, 'queue', '?')!r} cannot be"
                f" forwarded: data partition {k} is served by its replicas only"
                f" ({', '.join(node.replica_addresses(k)) or 'none live'}); connect there"
            )
        await self._recorded()
        data = encode_event(event)
        again = isinstance(event, _AGAIN)
        tried: list[str] = []
        last: BatonError | None = None
        for round_ in range(ROUNDS):
            for address in node.replica_addresses(k):
                if address == node.address:
                    continue
                try:
                    raw = await self._peer(address).submit(k, data)
                except (ConnectionClosed, NotReplica) as exc:
                    self.counts.errors += 1
                    last = exc
                    if address not in tried:
                        tried.append(address)
                    if not again and not isinstance(exc, (NotSent, NotReplica)):
                        raise ConnectionClosed(
                            f"the link to {address} broke before it answered a forwarded"
                            f" {type(event).__name__}: its outcome is unknown"
                        ) from exc
                    log.info("forwarding to partition %d: %s; trying another replica",
                             k, exc.message)
                    continue
                except BatonError:
                    self._took(event)  # (answered: the command's own error)
                    raise
                self._took(event)
                return decode_result(raw)
            if round_ + 1 < ROUNDS:
                await asyncio.sleep(ROUND_PAUSE * (round_ + 1))
        raise LogUnavailable(
            f"data partition {k} is not replicated by this broker and none of its replicas"
            f" could take the command ({', '.join(tried) or 'no live replica'})"
            + (f": {last.message}" if last is not None else "")
        )

    def _took(self, event: AnyEvent) -> None:
        kind = kind_of(event)
        self.counts.forwarded[kind] = self.counts.forwarded.get(kind, 0) + 1

    def replicas(self, k: int) -> list[str]:
        """The other brokers that replicate data partition ``k``, its leader first."""
        return [a for a in self._node.replica_addresses(k) if a != self._node.address]

    def peer(self, address: str) -> Peer:
        """The link to the broker at ``address`` (opened when first used)."""
        return self._peer(address)

    def _peer(self, address: str) -> Peer:
        peer = self._peers.get(address)
        if peer is None:
            peer = self._peers[address] = Peer(address, self._node)
        return peer

    async def _recorded(self) -> None:
        """This runtime's key recorded on control: a runtime that replayed the log (no
        Join of its own) appends one, with the same key, once."""
        node = self._node
        if node.state.membership.join_keys.get(node.key) == node.join_key.public:
            return
        if self._recording is None or self._recording.done():
            log.info("node %s: recording its member key on control (a Join) for its peer"
                     " links", node.key)
            self._recording = asyncio.ensure_future(node.rejoin())
        await asyncio.shield(self._recording)

    def close(self) -> None:
        """Close every peer link."""
        for peer in self._peers.values():
            peer.close()
        self._peers.clear()


class ServingNode(Protocol):
    """What the serving side needs of the broker's node."""

    node_id: str

    @property
    def state(self) -> State:
        """Control's state (its view, the member keys, the placement map)."""
        ...

    def partition_node(self, partition: int) -> Node | None:
        """The node of physical log partition ``partition``, if this broker applies it."""
        ...


class PeerService:
    """The serving side of one member session's peer link.

    Args:
        conn: the session (answers go there).
        node: this broker's node.
        member: the session's (member, nonce) from its MEMBER Hello.
        proven: called once the link's proof verified (the session has logged in).
        refused: counts a refusal (the broker's ``access_refused``).
    """

    def __init__(
        self,
        conn: _Conn,
        node: ServingNode,
        member: tuple[str, bytes],
        proven: Callable[[], None],
        refused: Callable[[str], None],
    ) -> None:
        self._conn = conn
        self._node = node
        self._member = member
        self._proven = proven
        self._refused = refused
        self.proven = False
        #: Its proof is being checked (the session's hello timeout waits for it).
        self.proving = False
        self._tasks: set[asyncio.Task[None]] = set()

    def prove(self, f: wire.PeerProof) -> None:
        """Check the link's proof (waiting a moment for its Join to be applied here):
        Ok, or Error AccessRefused."""
        self._spawn(self._prove(f), f.corr)

    async def _prove(self, f: wire.PeerProof) -> None:
        self.proving = True
        try:
            await self._check(f)
        finally:
            self.proving = False
        self.proven = True
        self._proven()
        self._conn.send(wire.Ok(f.corr, {}))

    async def _check(self, f: wire.PeerProof) -> None:
        deadline = time.monotonic() + PROOF_WAIT
        while True:
            ms = self._node.state.membership
            try:
                check_peer(ms.join_keys, ms.member_set, self._member, f.member, f.proof,
                           self._node.node_id)
                break
            except AccessRefused as exc:
                settled = f.member in ms.member_set and f.member in ms.join_keys
                if settled or f.member != self._member[0] or time.monotonic() > deadline:
                    log.warning("refused a peer link from %s: %s", self._conn.peer, exc.message)
                    self._refused("member")
                    raise
            await asyncio.sleep(0.05)

    def submit(self, f: wire.Submit) -> None:
        """Append a forwarded event on the data partition it names: Submitted, or Error."""
        if not self.proven:
            self._refused("member")
            raise AccessRefused("a peer link sends PeerProof before Submit")
        self._spawn(self._submit(f), f.corr)

    async def _submit(self, f: wire.Submit) -> None:
        node = self._node
        member = self._member[0]
        if member not in node.state.membership.member_set:
            self._refused("member")
            raise AccessRefused(f"{member!r} is no longer a member of the cluster's view")
        part = node.partition_node(f.partition) if f.partition > 0 else None
        if (
            part is None
            or part.partition != f.partition
            or (isinstance(node, Partitioned) and f.partition not in node.wanted())
        ):  # (not applied here, or being closed: this broker left its group)
            raise NotReplica(
                f"broker {node.node_id} does not replicate data partition {f.partition}"
            )
        event = decode_event(f.event)
        if not isinstance(event, FORWARDABLE):
            raise InvalidArgument(f"{type(event).__name__} is not forwarded between brokers")
        for name in _queues_of(event):
            placed = node.state.placement.get(name)
            if placed is not None and placed != f.partition:
                raise InvalidArgument(
                    f"queue {name!r} is on data partition {placed}, not {f.partition}"
                )
        result = await part.submit(event)
        self._conn.send(wire.Submitted(f.corr, encode_result(result)))

    def _spawn(self, work: Awaitable[None], corr: int) -> None:
        conn = self._conn
        conn.commands_started(1)

        async def run() -> None:
            try:
                await work
            except BatonError as exc:
                conn.error(corr, exc)
            except Exception as exc:  # a bug: the peer gets an error, the broker goes on
                log.error("forwarded command failed: %r", exc)
                conn.error(corr, InternalError(repr(exc)))
            finally:
                conn.commands_finished(1)

        # (kept to the end when the link closes: a forwarded event in flight is appended,
        # or not, as a client's command whose connection ended; a publish sent again
        # elsewhere is deduplicated by its keys)
        task = asyncio.create_task(run(), name="baton-peer-serve")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _Routable(Container[str]):
    """The queues a publish may be routed to on a broker of replica groups: those it
    applies, and those placed on a data partition that other brokers apply (the publish
    is forwarded there; one deleted meanwhile is answered as missing, as a queue deleted
    between the routing and the append)."""

    __slots__ = ("_node",)

    def __init__(self, node: Partitioned) -> None:
        self._node = node

    def __contains__(self, name: object) -> bool:
        node = self._node
        if name in node.queues:
            return True
        k = node.state.placement.get(name) if isinstance(name, str) else None
        return k is not None and not node.replicates(k)


def routable(node: Node) -> Container[str]:
    """The queues a publish through an exchange may go to from this broker (its edge's
    routing, broker/exchanges.py and the AMQP listener): those it applies, and on a
    broker of replica groups those whose partition other brokers apply too."""
    return _Routable(node) if isinstance(node, Partitioned) else node.queues


def elsewhere(node: Node, queue: str, doing: str = "consume from") -> NotReplica | None:
    """Why ``queue`` cannot be consumed (or read, ``doing``) here: its data partition is
    applied by other brokers (replica groups), which serve it (None: it can be, or the
    queue is placed nowhere)."""
    if not isinstance(node, Partitioned):
        return None
    k = node.state.placement.get(queue)
    if k is None or node.replicates(k):
        return None
    where = ", ".join(node.replica_addresses(k)) or "none live now"
    return NotReplica(
        f"queue {queue!r} is on data partition {k}, which this broker does not replicate:"
        f" {doing} one of its replicas ({where})"
    )


def _queues_of(event: AnyEvent) -> Collection[str]:
    queue = getattr(event, "queue", None)
    if isinstance(queue, str):
        return (queue,)
    queues = getattr(event, "queues", ())
    return tuple(q for q in queues if isinstance(q, str))


class _Conn(Protocol):
    """The session, as the serving side answers it."""

    @property
    def peer(self) -> str:
        """The peer's address, for the log."""
        ...

    def send(self, frame: wire.Frame) -> None: ...

    def error(self, corr: int, exc: BatonError) -> None: ...

    def commands_started(self, n: int) -> None: ...

    def commands_finished(self, n: int) -> None: ...
