"""Consumers relayed between brokers (docs/design.md §16, "Forwarding between brokers").

With replica groups, a consumer on a broker that does not replicate its queue's data
partition is served by one of the partition's replicas: the broker subscribes there over
its peer link (broker/peers.py), as a native consumer acting for its client's user (the
rights were checked here, at the edge), and passes each delivery on under its client's
consumer tag; the client's acks, releases, rejects, touches and its cancel go back the
same way, answered as the replica answers them. So the consumer's ``Interest``,
``Acquire`` and settlements are the replica's own events: this broker appends nothing on
a partition it does not replicate, and a queue's ownership stays within its group.

A link that breaks ends the relayed consumers on it (``ConsumerCancelled``, retriable:
the replica gives back what they held, as for any consumer whose connection ended); the
client subscribes again.

The client is a native session (broker/session.py), which passes its client's frames
on (:meth:`Relay.command`), or an AMQP channel (broker/amqp_channel.py), which turns
``Basic.Ack`` / ``Nack`` / ``Reject`` into the same frames and waits for their answers
(:meth:`Relay.settle`); an AMQP ``Basic.Get`` is a relay of prefetch 1 for one message,
after :meth:`Relay.ready_messages`. Each relayed consumer that a replica took counts in
``baton_forwarded_total{kind="consume"}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Protocol

from batonmq.broker.peers import Peer, Peers, NotSent
from batonmq.clients import wire
from batonmq.cluster.errors import (
    BatonError,
    ConnectionClosed,
    InternalError,
    LogUnavailable,
    NotReplica,
)

__all__ = ["Relay", "RELAYED"]

log = logging.getLogger("baton.peers")

#: The client frames of a relayed consumer that go to the replica as they are (with the
#: replica's consumer tag and a corr of the link).
RELAYED = (wire.Ack, wire.Release, wire.Reject, wire.Touch, wire.Cancel)


class _Client(Protocol):
    """The client's session, as a relay answers it."""

    def deliver(self, tag: int, messages: list[list[Any]]) -> None: ...

    def send(self, frame: wire.Frame) -> None: ...

    def error(self, corr: int, exc: BatonError) -> None: ...

    def consumer_cancelled(self, tag: int, exc: BatonError) -> None: ...

    def commands_started(self, n: int) -> None: ...

    def commands_finished(self, n: int) -> None: ...


class Relay:
    """One client consumer (``tag``) of a queue on data partition ``k``, served by a
    replica.

    Args:
        peers: this broker's peer links.
        k: the queue's data partition.
        queue: the queue.
        client: the client's session.
        tag: the client's consumer tag.
    """

    def __init__(self, peers: Peers, k: int, queue: str, client: _Client, tag: int) -> None:
        self._peers = peers
        self._k = k
        self.queue = queue
        self._client = client
        self.tag = tag
        self._peer: Peer | None = None
        self._remote = 0  # the replica's consumer tag
        self.closed = False
        self.received = 0  # messages the replica delivered to it
        # Deliveries that came before the client was told its consumer's tag.
        self._early: list[list[list[Any]]] | None = []

    async def start(self, f: wire.Subscribe) -> str:
        """Subscribe on a replica, its partition's leader first; the replica's address.

        Raises:
            LogUnavailable: no replica could be reached.
            BatonError: the replica refused the consumer (as it would a client's).
        """
        last: BatonError | None = None
        tried: list[str] = []
        for address in self._peers.replicas(self._k):
            peer = self._peers.peer(address)
            try:
                result = await peer.request(
                    lambda corr: wire.Subscribe(corr, f.queue, f.prefetch, f.options), self
                )
            except (NotSent, NotReplica) as exc:
                self._peers.counts.errors += 1
                last = exc
                tried.append(address)
                continue
            self._peer, self._remote = peer, result["consumer"]
            counts = self._peers.counts
            counts.forwarded["consume"] = counts.forwarded.get("consume", 0) + 1
            if self.closed:  # (the client went meanwhile)
                self.close()
            return address
        raise LogUnavailable(
            f"queue {f.queue!r} is on data partition {self._k}, which this broker does not"
            f" replicate, and none of its replicas took the consumer"
            f" ({', '.join(tried) or 'no live replica'})"
            + (f": {last.message}" if last is not None else "")
        )

    async def ready_messages(self) -> int:
        """The queue's ready messages, as a replica (its partition's leader first) has
        applied them (an AMQP ``Basic.Get`` answers ``Get-Empty`` at once on 0).

        Raises:
            LogUnavailable: no replica could be reached.
            BatonError: the replica's answer (``QueueNotFound``, ...).
        """
        last: BatonError | None = None
        for address in self._peers.replicas(self._k):
            try:
                stats = await self._peers.peer(address).request(
                    lambda corr: wire.QueueStats(corr, self.queue)
                )
            except (NotSent, NotReplica) as exc:
                self._peers.counts.errors += 1
                last = exc
                continue
            ready = stats.get("ready") if isinstance(stats, dict) else None
            return ready if isinstance(ready, int) else 0
        raise LogUnavailable(
            f"queue {self.queue!r} is on data partition {self._k}, which this broker does"
            f" not replicate, and none of its replicas answered"
            + (f": {last.message}" if last is not None else "")
        )

    def command(self, f: wire.Ack | wire.Release | wire.Reject | wire.Touch | wire.Cancel) -> None:
        """Pass a client's settlement (or cancel) to the replica; answer it as the
        replica does."""
        peer, client = self._peer, self._client
        if peer is None:
            client.error(f.corr, ConnectionClosed("the consumer is not subscribed on a replica"))
            return
        client.commands_started(1)
        sent = dataclasses.replace(f, consumer=self._remote)

        async def run() -> None:
            try:
                result = await peer.request(lambda corr: dataclasses.replace(sent, corr=corr))
                client.send(wire.Ok(f.corr, result))
            except BatonError as exc:
                client.error(f.corr, exc)
            except Exception as exc:  # a bug: the client gets an error, the broker goes on
                log.error("relayed %s failed: %r", type(f).__name__, exc)
                client.error(f.corr, InternalError(repr(exc)))
            finally:
                client.commands_finished(1)

        asyncio.ensure_future(run())
        if isinstance(f, wire.Cancel):
            self.closed = True
            peer.unsubscribed(self._remote)

    def settle(self, f: wire.Ack | wire.Release | wire.Reject) -> asyncio.Future[Any]:
        """Send a settlement to the replica (its ``consumer`` and ``corr`` are set
        here); the future of the replica's answer (``Ok``'s map).

        Raises (through the future):
            ConnectionClosed: not subscribed, or the link broke (the replica gave back
                what the consumer held).
            BatonError: the replica's answer.
        """
        peer = self._peer
        if peer is None or self.closed:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_exception(ConnectionClosed("the consumer is not subscribed on a replica"))
            return fut
        sent = dataclasses.replace(f, consumer=self._remote)
        return asyncio.ensure_future(
            peer.request(lambda corr: dataclasses.replace(sent, corr=corr))
        )

    def close(self, received: int = -1) -> asyncio.Future[None] | None:
        """The client went: the replica's consumer ends (what it held goes back; with
        ``received`` 0, none of it as a failed delivery). The future of the cancel
        (it never fails: a broken link released it anyway), None if not subscribed."""
        self.closed = True
        peer = self._peer
        if peer is None:
            return None
        self._peer = None
        peer.unsubscribed(self._remote)
        remote = self._remote

        async def cancel() -> None:
            try:
                await peer.request(lambda corr: wire.Cancel(corr, remote, [], received))
            except BatonError as exc:  # (a broken link released it anyway)
                log.info("cancelling a relayed consumer: %s", exc.message)

        return asyncio.ensure_future(cancel())

    # -- what the peer link feeds it (peers.RelaySink) ----------------------------------

    def ready(self) -> None:
        """The client has its consumer's tag: the deliveries that came before go now."""
        early, self._early = self._early, None
        for messages in early or ():
            self.deliver(messages)

    def deliver(self, messages: list[list[Any]]) -> None:
        self.received += len(messages)
        if self._early is not None:
            self._early.append(messages)
        elif not self.closed:
            self._client.deliver(self.tag, messages)

    def expired(self, positions: list[int]) -> None:
        if not self.closed:
            self._client.send(wire.Expired(self.tag, positions))

    def cancelled(self, why: BatonError) -> None:
        if not self.closed:
            self.closed = True
            self._client.consumer_cancelled(self.tag, why)
