"""The consuming side of a connection: :class:`Consumer` and the :class:`Message` it delivers.

A :class:`Consumer` buffers the broker's deliveries and hands them out as an async
iterator; the broker delivers at most ``prefetch`` unsettled messages (its credit).
:class:`Message` settles itself. Settlements of one kind issued in the same loop tick
for the same consumer share one Ack/Release/Reject frame (a batch is also sent early
once it holds a quarter of ``prefetch``, so the broker can refill while the
application works on the rest).

The consumer talks to its connection through :class:`ConsumerChannel`; the connection
routes Subscribe answers, Deliver, Expired and ConsumerCancelled frames to it
(:meth:`Consumer.subscribed`, :meth:`Consumer.deliver`, :meth:`Consumer.expired`,
:meth:`Consumer.end`) and tells it about failovers.

Size: a little over 800 lines: :class:`Message` settles through its consumer's
coalesced batches and the consumer makes the messages, so the two live together; moving
Message out would need a protocol for its consumer (a follow-up).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine, Iterable
from types import TracebackType
from typing import Any, Final, Protocol

from batonmq.cluster.errors import (
    BatonError,
    ConnectionClosed,
    InvalidArgument,
    NotAcquired,
    ProtocolError,
    UnknownConsumer,
)
from batonmq.clients.wire import (
    Ack,
    Cancel,
    Frame,
    Reject,
    Release,
    Subscribe,
    Touch,
    read_result,
)
from batonmq.cluster.results import Cancelled, Settled, Subscribed

__all__ = ["ConsumerChannel", "Consumer", "Message", "ACK", "RELEASE", "REJECT", "RELEASE_FAILED"]

_log = logging.getLogger("baton.client")

# Settlement kinds: index into Consumer._batches. RELEASE is the "not now" release
# (acquired count only), RELEASE_FAILED the failed delivery (delivery count too).
ACK: Final = 0
RELEASE: Final = 1
REJECT: Final = 2
RELEASE_FAILED: Final = 3
_KINDS: Final = (ACK, RELEASE, REJECT, RELEASE_FAILED)


def _settle_frame(
    kind: int, corr: int, tag: int, positions: list[int], delay_ms: int = 0
) -> Frame:
    """The frame that carries one batch of settlements of ``kind``."""
    if kind == ACK:
        return Ack(corr, tag, positions)
    if kind == REJECT:
        return Reject(corr, tag, positions)
    return Release(corr, tag, positions, kind == RELEASE_FAILED, delay_ms)


class ConsumerChannel(Protocol):
    """What a :class:`Consumer` needs of its connection (``conn.Channel`` implements it)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the connection runs on."""
        ...

    @property
    def closed(self) -> bool:
        """True once the connection has ended (not while it fails over)."""
        ...

    def closed_again(self) -> ConnectionClosed:
        """A fresh ConnectionClosed like the one the connection ended with."""
        ...

    def next_corr(self) -> int:
        """The next correlation id."""
        ...

    def request(
        self, frame: Frame, corr: int, retry: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """Write a command frame; return the future its Ok/Error settles."""
        ...

    def expect_subscribed(self, corr: int, consumer: Consumer) -> None:
        """Hand the Ok of the Subscribe ``corr`` to ``consumer.subscribed`` first."""
        ...

    def add_consumer(self, tag: int, consumer: Consumer) -> None:
        """Route deliveries for consumer ``tag`` to ``consumer``."""
        ...

    def remove_consumer(self, tag: int) -> None:
        """Stop routing deliveries for consumer ``tag``."""
        ...

    def background(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as a task the connection keeps until it is done."""
        ...


class _SettleBatch:
    """Positions of one kind settled in one loop tick, and the callers waiting on them."""

    __slots__ = ("positions", "waiters")

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.waiters: list[asyncio.Future[None]] = []


_NEW: Final = 0
_ACTIVE: Final = 1
_ENDED: Final = 2


class Consumer:
    """A subscription to one queue: an async context manager and an async iterator.

    ``async with conn.consume("q") as consumer`` sends Subscribe; ``async for msg in
    consumer`` yields :class:`Message` objects as the broker delivers them (at most
    ``prefetch`` unsettled at a time); leaving the block sends Cancel. Messages still
    buffered here when the consumer is cancelled are dropped: the broker releases
    them, like every other unsettled message of the consumer.

    Iteration ends normally after :meth:`cancel`, raises the broker's error (e.g.
    QueueNotFound) when the broker cancels the consumer, and raises
    :class:`ConnectionClosed` when the connection ends.
    """

    __slots__ = (
        "_conn",
        "queue",
        "prefetch",
        "tag",
        "_state",
        "_buffer",
        "_ready",
        "_error",
        "_batches",
        "_abandoned",
        "settle_failures",
        "_flush_at",
        "_epoch",
        "_received",
        "ack_timeout",
        "expired_count",
        "_expired",
    )

    def __init__(
        self,
        conn: ConsumerChannel,
        queue: str,
        prefetch: int,
        ack_timeout: float | None = None,
    ) -> None:
        self._conn = conn
        #: Seconds a delivered message may stay unsettled before the broker releases
        #: it as a failed delivery (None: the queue's setting).
        self.ack_timeout = ack_timeout
        #: Messages of this consumer the broker released at their ack timeout.
        self.expired_count = 0
        # Position -> how many times the broker released it at the ack timeout: a
        # Message made before the last one cannot be settled (its position may be
        # held again, by a later delivery to this same consumer).
        self._expired: dict[int, int] = {}
        self.queue = queue
        self.prefetch = prefetch
        #: The broker's consumer tag (0 until subscribed).
        self.tag = 0
        self._state = _NEW
        self._buffer: deque[Message] = deque()
        self._ready = asyncio.Event()
        self._error: BaseException | None = None
        self._batches: list[_SettleBatch | None] = [None, None, None, None]
        self._abandoned = False
        #: Unconfirmed settlements the broker refused (each is also logged).
        self.settle_failures = 0
        self._flush_at = max(1, prefetch // 4)
        # Subscriptions so far (one per broker, failover starts a new one): a
        # Message of an earlier one cannot be settled.
        self._epoch = 0
        # Messages received on this subscription: a cancel tells the broker, so that
        # those still on their way do not count as a failed delivery.
        self._received = 0

    def __repr__(self) -> str:
        state = ("new", "active", "ended")[self._state]
        return f"<Consumer {self.queue!r} tag={self.tag} {state} buffered={len(self._buffer)}>"

    @property
    def buffered(self) -> int:
        """Messages delivered but not yet taken by the iterator."""
        return len(self._buffer)

    async def start(self) -> None:
        """Subscribe (what ``async with`` does on enter).

        Raises:
            QueueNotFound: no such queue.
            InvalidArgument: already started.
            ConnectionClosed: the connection ended.
        """
        if self._state != _NEW:
            raise InvalidArgument("consumer already started")
        conn = self._conn
        corr = conn.next_corr()
        fut = conn.request(self._subscribe_frame(corr), corr, retry=True)
        conn.expect_subscribed(corr, self)
        try:
            await fut
        except asyncio.CancelledError:
            # Do not leave a subscription behind on the broker: cancel it now, or as
            # soon as its Ok arrives (see subscribed).
            self._abandoned = True
            if self._state == _ACTIVE:
                conn.background(self.cancel())
            raise

    def _subscribe_frame(self, corr: int) -> Subscribe:
        # "counters": each delivery carries the acquired count too.
        options: dict[str, Any] = {"counters": True}
        if self.ack_timeout is not None:
            options["ack_timeout_ms"] = max(1, int(self.ack_timeout * 1000))
        return Subscribe(corr, self.queue, self.prefetch, options)

    @property
    def active(self) -> bool:
        """True while subscribed (or re-subscribing after a failover) and not ended."""
        return self._state == _ACTIVE

    @property
    def epoch(self) -> int:
        """Subscriptions so far (one per broker: a failover starts a new one). A
        :class:`Message` of an earlier one cannot be settled."""
        return self._epoch

    # --- called by the connection -----------------------------------------------------

    def subscribed(self, result: dict[str, Any]) -> None:
        """The broker's Ok to Subscribe (called before the caller of :meth:`start`
        resumes: a Deliver may follow in the same chunk).

        Raises:
            ProtocolError: the result has no consumer tag.
        """
        tag = read_result(Subscribed, result).consumer
        self.tag = tag
        if self._state == _ENDED and not self._abandoned:
            return  # ended while (re-)subscribing: e.g. closed
        self._state = _ACTIVE
        self._conn.add_consumer(tag, self)
        if self._abandoned:
            self._conn.background(self.cancel())

    def deliver(self, messages: list[Any]) -> None:
        """Buffer one Deliver frame's messages (hot path: one Message per message)."""
        if self._state != _ACTIVE:
            return
        append = self._buffer.append
        queue = self.queue
        epoch = self._epoch
        expired = self._expired
        for position, delivery_count, body, headers, publish_time, acquired in messages:
            msg = Message(
                self, queue, position, body, headers, delivery_count, publish_time, epoch,
                acquired,
            )
            if expired:
                msg.expiry = expired.get(position, 0)
            append(msg)
        self._received += len(messages)
        self._ready.set()

    def expired(self, positions: list[int]) -> None:
        """The broker released these messages at their ack timeout (an Expired frame):
        those still buffered are dropped, and settling the others fails."""
        self.expired_count += len(positions)
        gone = set(positions)
        for p in gone:
            self._expired[p] = self._expired.get(p, 0) + 1
        if self._buffer:
            kept = [m for m in self._buffer if m.position not in gone]
            self._buffer.clear()
            self._buffer.extend(kept)
        _log.warning(
            "consumer %s of %r: %d message(s) passed the ack timeout and were released",
            self.tag, self.queue, len(positions),
        )

    def expiries(self, position: int) -> int:
        """How many times the message at ``position`` was released at its ack timeout."""
        return self._expired.get(position, 0) if self._expired else 0

    def touch(self, position: int) -> asyncio.Future[dict[str, Any]]:
        """Send Touch for ``position`` (see :meth:`Message.in_progress`)."""
        conn = self._conn
        corr = conn.next_corr()
        return conn.request(Touch(corr, self.tag, [position]), corr)

    def failed_over(self) -> None:
        """The broker was lost: it released every message of this subscription.

        Buffered messages are dropped (they will be redelivered), settlements not yet
        sent fail, and messages handed out before can no longer be settled.
        """
        self._epoch += 1
        self.tag = 0
        self._received = 0
        self._expired.clear()
        self._buffer.clear()
        for kind in _KINDS:
            batch = self._batches[kind]
            if batch is None:
                continue
            self._batches[kind] = None
            for waiter, position in zip(batch.waiters, batch.positions):
                if not waiter.done():
                    waiter.set_exception(_released_by_failover(self.queue, position))

    def resubscribe(self) -> None:
        """Subscribe again (same queue and prefetch) on the broker failed over to."""
        conn = self._conn
        corr = conn.next_corr()
        fut = conn.request(self._subscribe_frame(corr), corr, retry=True)
        conn.expect_subscribed(corr, self)

        def done(f: asyncio.Future[dict[str, Any]]) -> None:
            exc = None if f.cancelled() else f.exception()
            if exc is not None:
                _log.warning("re-subscribing to %r after failover failed: %s", self.queue, exc)
                self.end(exc)

        fut.add_done_callback(done)

    def end(self, error: BaseException | None) -> None:
        """Stop iteration: normally (error None) or by raising ``error``."""
        if self._state == _ENDED:
            return
        self._state = _ENDED
        self._error = error
        self._buffer.clear()
        self._ready.set()

    # --- the application's side -------------------------------------------------------

    async def cancel_with_unread(self, unread: list[Message]) -> int:
        """Cancel, with ``unread`` (taken by a wrapper, never handed out) put back first.

        Returns and raises as :meth:`cancel`.
        """
        self._buffer.extendleft(reversed(unread))
        return await self.cancel()

    async def cancel(self) -> int:
        """Stop the consumer: send Cancel and wait for the broker's Ok.

        Buffered messages are dropped here; the broker releases every message of
        this consumer that was not settled. Only those the application had (taken
        from the iterator, not settled) count as a failed delivery; those still
        buffered or on their way go back with only their acquired count raised.
        Cancelling an ended consumer does nothing.

        Returns:
            How many messages the broker released (0 if nothing was sent).

        Raises:
            ConnectionClosed: the connection ended while cancelling.
        """
        if self._state != _ACTIVE:
            self.end(None)
            return 0
        unread = [m.position for m in self._buffer]
        self.end(None)
        conn = self._conn
        if conn.closed:
            return 0
        if self.tag == 0:
            # Failing over, not subscribed on the new broker yet: the old broker
            # released everything; a re-subscribe in flight is cancelled when its Ok
            # arrives (see subscribed).
            self._abandoned = True
            return 0
        # Flush settlements issued before the cancel so that they are not released
        # (and go out in the same write: a message released "not now" reaches the
        # broker with the Cancel, so it is not handed back to this leaving consumer).
        for kind in _KINDS:
            if self._batches[kind] is not None:
                self._flush(kind)
        corr = conn.next_corr()
        try:
            result = await conn.request(Cancel(corr, self.tag, unread, self._received), corr)
        except UnknownConsumer:
            return 0  # the broker ended it first (ConsumerCancelled crossed our Cancel)
        except ConnectionClosed:
            if not conn.closed:
                return 0  # failing over: the lost broker released everything
            raise
        finally:
            conn.remove_consumer(self.tag)
        return read_result(Cancelled, result).released

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.cancel()
        except BatonError:
            if exc is None:
                raise
            # else: keep the exception that left the block

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        buffer = self._buffer
        while not buffer:
            if self._state != _ACTIVE:
                if self._error is not None:
                    raise _fresh(self._error)
                if self._state == _NEW:
                    raise InvalidArgument("consumer not started: use 'async with conn.consume(...)'")
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        return buffer.popleft()

    async def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None if none arrives within ``timeout`` seconds.

        Raises:
            StopAsyncIteration: the consumer was cancelled.
            ConnectionClosed: the connection ended.
            BatonError: the broker's error, if it cancelled the consumer.
        """
        if self._buffer or timeout is None:
            return await self.__anext__()
        try:
            async with asyncio.timeout(timeout):
                return await self.__anext__()
        except TimeoutError:
            return None

    async def get_many(self, max_count: int, timeout: float | None = None) -> list[Message]:
        """Wait for at least one message (up to ``timeout``), then take up to ``max_count``.

        Returns:
            The messages taken; empty on timeout or once the consumer has ended
            normally.

        Raises:
            ConnectionClosed, or the broker's error if it cancelled the consumer.
        """
        try:
            first = await self.get(timeout)
        except StopAsyncIteration:
            return []
        if first is None:
            return []
        return self.with_buffered(first, max_count)

    def with_buffered(self, first: Message, max_count: int) -> list[Message]:
        """``first`` (a message just taken) and then buffered messages, up to
        ``max_count`` in all, taken from the buffer without waiting."""
        out = [first]
        buffer = self._buffer
        while buffer and len(out) < max_count:
            out.append(buffer.popleft())
        return out

    # --- settlement (coalesced per loop tick) -----------------------------------------

    def settle(self, kind: int, position: int, delay_ms: int = 0) -> asyncio.Future[None]:
        """Queue the settlement ``kind`` (ACK, RELEASE, REJECT, RELEASE_FAILED) of
        ``position``: it
        goes out with the others of this loop tick, in one frame.

        Returns:
            The future the broker's answer settles (it fails right away if the
            consumer has ended).
        """
        conn = self._conn
        fut: asyncio.Future[None] = conn.loop.create_future()
        if self._state != _ACTIVE:
            if conn.closed:
                fut.set_exception(conn.closed_again())
            else:
                fut.set_exception(
                    UnknownConsumer(
                        f"consumer {self.tag} of {self.queue!r} was cancelled; "
                        "its unsettled messages were released"
                    )
                )
            return fut
        if delay_ms:
            # A delayed release goes alone, now (batches share one frame's fields).
            self._send(kind, _SettleBatch(), [position], [fut], delay_ms)
            return fut
        batch = self._batches[kind]
        if batch is None:
            batch = self._batches[kind] = _SettleBatch()
            conn.loop.call_soon(self._flush, kind)
        batch.positions.append(position)
        batch.waiters.append(fut)
        if len(batch.positions) >= self._flush_at:
            # A consumer working through a full buffer never yields; sending part
            # of its acks early lets the broker refill while it works on the rest.
            self._flush(kind)
        return fut

    def unconfirmed_done(self, fut: asyncio.Future[None]) -> None:
        """Outcome of an unconfirmed settlement: nobody awaits it, so count and log
        failures (a closed connection shows up in the iterator anyway)."""
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None or isinstance(exc, ConnectionClosed):
            return
        self.settle_failures += 1
        _log.warning("settlement on consumer %s of %r failed: %s", self.tag, self.queue, exc)

    def _flush(self, kind: int) -> None:
        batch = self._batches[kind]
        if batch is None:
            return
        self._batches[kind] = None
        self._send(kind, batch, batch.positions, batch.waiters)

    def _send(
        self,
        kind: int,
        batch: _SettleBatch,
        positions: list[int],
        waiters: list[asyncio.Future[None]],
        delay_ms: int = 0,
    ) -> None:
        conn = self._conn
        corr = conn.next_corr()
        try:
            frame = _settle_frame(kind, corr, self.tag, positions, delay_ms)
            fut = conn.request(frame, corr)
        except BatonError as exc:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        fut.add_done_callback(lambda done: _fan_out(done, waiters, positions))

    async def ack_many(self, messages: Iterable[Message], *, confirm: bool = False) -> None:
        """Accept several messages with one frame (see :meth:`Message.ack`).

        With ``confirm``, waits for every one; if some were refused (e.g. released by
        a failover), raises the first such error after all have completed.
        """
        await self._settle_many(ACK, messages, confirm)

    async def release_many(
        self, messages: Iterable[Message], *, failed: bool = False, confirm: bool = False
    ) -> None:
        """Release several messages with one frame (see :meth:`Message.release`)."""
        await self._settle_many(RELEASE_FAILED if failed else RELEASE, messages, confirm)

    async def reject_many(self, messages: Iterable[Message], *, confirm: bool = False) -> None:
        """Reject several messages with one frame (see :meth:`Message.reject`)."""
        await self._settle_many(REJECT, messages, confirm)

    async def _settle_many(self, kind: int, messages: Iterable[Message], confirm: bool) -> None:
        items = list(messages)
        for msg in items:
            if msg.consumer is not self:
                raise InvalidArgument(f"message {msg.position} is not from this consumer")
            msg.check_live()
        futures = []
        for msg in items:
            futures.append(msg.issue_settlement(kind))
        if not confirm:
            for fut in futures:
                fut.add_done_callback(self.unconfirmed_done)
            return
        # Wait for every one (so no failure goes unretrieved), then raise the first.
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome


def _released_by_failover(queue: str, position: int) -> NotAcquired:
    return NotAcquired(
        f"message {queue!r}@{position} was delivered by a broker this connection has"
        " failed over from: that broker released it, and it will be redelivered"
        " (it cannot be settled any more)"
    )


def _fresh(error: BaseException) -> BaseException:
    """A new instance of a stored error, so that raising it in many tasks does not
    pile every task's traceback onto one exception object."""
    if isinstance(error, BatonError):
        fresh = type(error)(error.message)
        fresh.__cause__ = error.__cause__
        return fresh
    return error


def _fan_out(
    done: asyncio.Future[dict[str, Any]],
    waiters: list[asyncio.Future[None]],
    positions: list[int],
) -> None:
    """Complete each settlement of one frame; the broker names the positions it
    did not hold (``not_acquired``), and only those callers fail."""
    exc = None if done.cancelled() else done.exception()
    missing: set[int] = set()
    if exc is None and not done.cancelled():
        try:
            missing = set(read_result(Settled, done.result()).not_acquired)
        except ProtocolError as bad:
            exc = bad
    for waiter, position in zip(waiters, positions):
        if waiter.done():
            continue
        if done.cancelled():
            waiter.cancel()
        elif exc is not None:
            waiter.set_exception(_fresh(exc))
        elif position in missing:
            waiter.set_exception(
                NotAcquired(
                    f"message {position} was not held by this consumer any more"
                    " (released after a disconnect or restart?)"
                )
            )
        else:
            waiter.set_result(None)


class Message:
    """One delivered message, acquired by its consumer until settled.

    Settle it exactly once with :meth:`ack`, :meth:`release` or :meth:`reject`;
    a second settlement raises InvalidArgument. Unsettled messages are released by
    the broker when their consumer is cancelled or the connection ends.

    Attributes:
        queue: the queue's name.
        position: the message's position in the queue (its id together with ``queue``).
        body: the message body (bytes).
        headers: the headers published with it.
        delivery_count: earlier deliveries of this message that failed (a failed
            release, a consumer timeout, the crash or disconnect of its consumer; 0
            on the first delivery). The queue's delivery limit applies to it.
        acquired_count: earlier hand-outs of this message to a consumer, failed or
            not (0 on the first delivery; see docs/client.md, "The two counters").
        publish_time: when the broker took the message, in ms since the epoch.
    """

    __slots__ = (
        "_consumer",
        "queue",
        "position",
        "body",
        "headers",
        "delivery_count",
        "acquired_count",
        "publish_time",
        "_settled",
        "_epoch",
        "expiry",
    )

    def __init__(
        self,
        consumer: Consumer,
        queue: str,
        position: int,
        body: bytes,
        headers: dict[str, Any],
        delivery_count: int,
        publish_time: int,
        epoch: int = 0,
        acquired_count: int = 0,
    ) -> None:
        self._consumer = consumer
        self.queue = queue
        self.position = position
        self.body = body
        self.headers = headers
        self.delivery_count = delivery_count
        self.acquired_count = acquired_count
        self.publish_time = publish_time
        self._settled = False
        self._epoch = epoch
        #: Ack-timeout releases of its position before this delivery (see
        #: :meth:`Consumer.expiries`): when they differ, this delivery has expired.
        self.expiry = 0

    def __repr__(self) -> str:
        return (
            f"<Message {self.queue!r}@{self.position} delivery={self.delivery_count} "
            f"acquired={self.acquired_count} "
            f"{len(self.body)}B>"
        )

    @property
    def consumer(self) -> Consumer:
        """The consumer that holds this message."""
        return self._consumer

    @property
    def settled(self) -> bool:
        """True once ack/release/reject was called."""
        return self._settled

    @property
    def epoch(self) -> int:
        """The subscription of its consumer that delivered it (:attr:`Consumer.epoch`)."""
        return self._epoch

    def issue_settlement(self, kind: int, delay_ms: int = 0) -> asyncio.Future[None]:
        """Mark the message settled and queue the settlement ``kind`` on its consumer
        (:meth:`Consumer.settle`); the caller has checked that it may be settled."""
        self._settled = True
        return self._consumer.settle(kind, self.position, delay_ms)

    def check_live(self) -> None:
        """Raise if this delivery cannot be settled any more (nothing is sent).

        Raises:
            InvalidArgument: already settled.
            NotAcquired: released by a failover, or at its ack timeout.
        """
        if self._settled:
            raise InvalidArgument(f"message {self.queue!r}@{self.position} is already settled")
        consumer = self._consumer
        if self._epoch != consumer.epoch:
            raise _released_by_failover(self.queue, self.position)
        if consumer.expiries(self.position) != self.expiry:
            raise NotAcquired(
                f"message {self.queue!r}@{self.position} passed its ack timeout: the broker"
                " released it (it cannot be settled any more)"
            )

    async def _settle_as(self, kind: int, confirm: bool, delay_ms: int = 0) -> None:
        self.check_live()
        fut = self.issue_settlement(kind, delay_ms)
        if confirm:
            await fut
        else:
            fut.add_done_callback(self._consumer.unconfirmed_done)

    async def ack(self, *, confirm: bool = False) -> None:
        """Accept the message: it is removed for good and never redelivered.

        Without ``confirm`` the accept is queued (sent with the others of this
        loop tick) and the call returns at once — a consumer loop then costs no
        round trip per message. If the connection ends before the broker applied
        it, the message is redelivered (at-least-once), as with any broker. With
        ``confirm=True`` it returns once the broker applied the accept: from then
        on the message can never come back (docs/design.md §5, guarantee 3).

        Raises:
            InvalidArgument: the message was already settled (nothing sent).
            NotAcquired: (confirm) the broker no longer holds it for this consumer;
                or (always, nothing sent) it was delivered before the connection
                failed over to another broker, which released it.
            UnknownConsumer: the consumer was cancelled (its messages were released).
            ConnectionClosed: (confirm) the connection ended first (outcome unknown).
        """
        await self._settle_as(ACK, confirm)

    async def release(
        self, *, failed: bool = False, delay: float = 0.0, confirm: bool = False
    ) -> None:
        """Give the message back to its queue, at its position.

        Two flavours (docs/client.md, "The two counters"):

        * ``release()`` is **"not now"**: the message is fine, this consumer just
          does not take it now. Only its acquired count goes up; the delivery limit
          does not apply.
        * ``release(failed=True)`` is a **failed delivery**: the application could
          not process it. Its delivery count goes up by one too, and the release
          that reaches the queue's ``delivery_limit`` dead-letters it instead.

        ``delay`` (seconds): no consumer gets the message again before that much time
        has passed, by the cluster's replicated clock; then it is ready again at its
        position. ``confirm`` as for :meth:`ack`.

        Raises:
            InvalidArgument: a negative delay (nothing sent), or one above 30 days.
            The same as :meth:`ack`.
        """
        if delay < 0:
            raise InvalidArgument("delay must not be negative")
        kind = RELEASE_FAILED if failed else RELEASE
        await self._settle_as(kind, confirm, int(delay * 1000))

    async def in_progress(self) -> None:
        """Tell the broker the application still works on the message: its ack
        timeout (``consume(..., ack_timeout=...)`` or the queue's) starts again.

        Raises:
            InvalidArgument: the message was already settled (nothing sent).
            NotAcquired: the broker no longer holds it for this consumer (it passed
                its ack timeout, or the connection failed over).
            UnknownConsumer, ConnectionClosed: as for :meth:`ack`.
        """
        self.check_live()
        consumer = self._consumer
        if not consumer.active:
            raise UnknownConsumer(f"consumer of {self.queue!r} was cancelled")
        result = read_result(Settled, await consumer.touch(self.position))
        if result.not_acquired:
            raise NotAcquired(
                f"message {self.queue!r}@{self.position} is not held by this consumer any"
                " more (it passed its ack timeout?)"
            )

    async def reject(self, *, confirm: bool = False) -> None:
        """Reject the message: it goes to the dead-letter queue (or is dropped).

        ``confirm`` as for :meth:`ack`.

        Raises:
            The same as :meth:`ack`.
        """
        await self._settle_as(REJECT, confirm)
