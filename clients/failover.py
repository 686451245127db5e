"""Failover: when the broker is lost, move the connection to another and send again.

What a failover keeps and what it fails (docs/client.md, "Failover"): publishes (they
carry idempotency keys), subscriptions and idempotent commands stay pending and are
sent again to the next broker, in the order issued; the others fail with
ConnectionClosed (their outcome is unknown). Consumers drop their buffered messages
(the broker released them) and are re-subscribed; a held leadership term is lost.
Commands issued while a failover is under way wait for the new broker.

:class:`Failover` keeps that bookkeeping for one connection and runs the reconnect
loop: round-robin over the addresses, the lost one last, with a doubling back-off
after each round, until ``timeout``. It drives the connection through
:class:`FailoverChannel`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Container, Sequence
from typing import Final, Protocol

from batonmq.clients.addresses import format_address
from batonmq.clients.consumer import Consumer
from batonmq.clients.results import consume_result
from batonmq.cluster.errors import BatonError, ConnectionClosed

__all__ = ["FailoverChannel", "Failover"]

_log = logging.getLogger("baton.client")

# Failover back-off: after each round over every address, wait this long (doubling).
_BACKOFF_FIRST: Final = 0.05
_BACKOFF_MAX: Final = 1.0


class FailoverChannel(Protocol):
    """What a :class:`Failover` needs of its connection (``conn.Channel`` implements it)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the connection runs on."""
        ...

    @property
    def address(self) -> str:
        """``"HOST:PORT"`` of the broker the connection is (or was last) open to."""
        ...

    @property
    def node_id(self) -> str:
        """The node id of that broker."""
        ...

    @property
    def closed(self) -> bool:
        """True once the connection has ended."""
        ...

    async def open(self, host: str, port: int) -> None:
        """Open a transport to ``host:port`` and exchange Hello on it."""
        ...

    def detach_transport(self, *, drop_writes: bool) -> None:
        """Forget and abort the current transport."""
        ...

    def fail_pending(
        self, keep: Container[int], text: str, cause: BaseException | None
    ) -> list[int]:
        """Fail the pending commands not in ``keep``; return their correlation ids."""
        ...

    def is_pending(self, corr: int) -> bool:
        """True while the command ``corr`` waits for its answer."""
        ...

    def take_consumers(self) -> list[Consumer]:
        """Stop routing deliveries to every consumer, and return them."""
        ...

    def end_terms(self) -> None:
        """Tell every Term that its session ended."""
        ...

    def wake_writers(self) -> None:
        """Let writers waiting for flow control go on."""
        ...

    def write(self, data: bytes) -> None:
        """Queue encoded bytes for the transport."""
        ...

    def abort(self, cause: BaseException | None, reason: str = "", *, final: bool = False) -> None:
        """End the connection."""
        ...


class Failover:
    """The failover of one connection (see the module doc).

    Attributes:
        addresses: every ``(host, port)`` the connection may use, in order.
        index: ``addresses[index]`` is the broker connected to.
        enabled: reconnect to another address when the connection is lost.
        timeout: seconds a failover may take in all.
        connect_timeout: seconds per attempt (TCP connect plus Hello).
        failovers: how many times the connection failed over to a broker.
    """

    def __init__(
        self,
        channel: FailoverChannel,
        addresses: Sequence[tuple[str, int]],
        *,
        enabled: bool,
        timeout: float,
        connect_timeout: float,
    ) -> None:
        self._channel = channel
        self.addresses: list[tuple[str, int]] = list(addresses)
        self.index = 0
        self.enabled = enabled
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.failovers = 0
        self._reconnecting = False
        self._task: asyncio.Task[None] | None = None
        # corr -> (encoded frame, retriable) of commands to send again after a
        # failover (retriable) or not yet sent because a failover is under way.
        self._resend: dict[int, tuple[bytes, bool]] = {}
        self._resubscribe: list[Consumer] = []

    @property
    def reconnecting(self) -> bool:
        """True while a failover is under way."""
        return self._reconnecting

    # --- called by the connection for every command -----------------------------------

    def hold(self, corr: int, data: bytes, retry: bool) -> bool:
        """Note a command being sent: keep it to send again after a failover if
        ``retry`` (and failover is on).

        Returns:
            True if the command must not be written now: a failover is under way,
            and it is sent once the new broker answered Hello.
        """
        if self._reconnecting:
            self._resend[corr] = (data, retry)
            return True
        if retry and self.enabled:
            self._resend[corr] = (data, True)
        return False

    def answered(self, corr: int) -> None:
        """The broker answered ``corr``: it is never sent again."""
        if self._resend:
            self._resend.pop(corr, None)

    def reset(self) -> list[Consumer]:
        """The connection ended: forget everything kept.

        Returns:
            The consumers that waited to be re-subscribed (the caller ends them).
        """
        self._resend.clear()
        self._reconnecting = False
        resubscribe, self._resubscribe = self._resubscribe, []
        return resubscribe

    def cancel(self) -> None:
        """Stop a failover under way (the connection is being closed)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()

    # --- failing over -----------------------------------------------------------------

    def start(self, cause: BaseException | None, reason: str) -> None:
        """The broker is gone: keep what can be sent again, fail the rest, reconnect.

        Publishes (they carry idempotency keys), subscriptions and idempotent
        commands stay pending and are sent again to the next broker; the others
        fail with ConnectionClosed (retriable; their outcome is unknown). Consumers
        drop their buffered messages (the broker released them) and are
        re-subscribed; messages delivered before can no longer be settled.
        """
        if self._reconnecting:
            return
        self._reconnecting = True
        channel = self._channel
        text = reason or (f"{type(cause).__name__}: {cause}" if cause else "closed by the broker")
        _log.warning("connection to %s lost (%s); failing over", channel.address, text)
        channel.detach_transport(drop_writes=True)
        keep = {corr for corr, (_data, retry) in self._resend.items() if retry}
        failed = channel.fail_pending(
            keep,
            f"{text}; failing over to another broker, so the outcome of this"
            " command is unknown (it is not sent again: it is not idempotent)",
            cause,
        )
        for corr in failed:
            self._resend.pop(corr, None)
        for consumer in channel.take_consumers():
            consumer.failed_over()
            self._resubscribe.append(consumer)
        # A new session is a new candidate: a held term is lost (the old session's
        # candidacy ends with it); one still waiting runs again on the new broker.
        channel.end_terms()
        channel.wake_writers()  # commands issued now wait in _resend, not on the transport
        self._task = channel.loop.create_task(self._run(cause, text))
        self._task.add_done_callback(consume_result)

    async def _run(self, cause: BaseException | None, text: str) -> None:
        channel = self._channel
        loop = channel.loop
        deadline = loop.time() + self.timeout
        n = len(self.addresses)
        start = (self.index + 1) % n  # the lost broker is tried last
        delay = _BACKOFF_FIRST
        failures: list[str] = []
        last: BaseException | None = cause
        attempt = 0
        while not channel.closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            index = (start + attempt) % n
            host, port = self.addresses[index]
            attempt += 1
            try:
                async with asyncio.timeout(min(self.connect_timeout, remaining)):
                    await channel.open(host, port)
            except (OSError, BatonError, TimeoutError) as exc:
                channel.detach_transport(drop_writes=False)
                last = exc
                why = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
                failures = failures[-(n - 1) :] if n > 1 else []
                failures.append(f"{format_address(host, port)} ({why})")
                if attempt % n == 0:
                    await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))
                    delay = min(delay * 2, _BACKOFF_MAX)
                continue
            except BaseException:
                channel.detach_transport(drop_writes=False)
                raise
            self.index = index
            self._reconnected()
            return
        if not channel.closed:
            err = ConnectionClosed(
                f"connection lost ({text}) and failover found no broker within"
                f" {self.timeout:g}s: " + "; ".join(failures)
            )
            err.__cause__ = last
            channel.abort(err, err.message, final=True)

    def _reconnected(self) -> None:
        """Hello succeeded on the new broker: re-subscribe, then send what waited."""
        channel = self._channel
        self._reconnecting = False
        self.failovers += 1
        _log.warning("failed over to %s (node %s)", channel.address, channel.node_id)
        for corr, (data, _retry) in sorted(self._resend.items()):  # in the order issued
            if channel.is_pending(corr):
                channel.write(data)
            else:
                del self._resend[corr]
        # After the re-sends: a re-subscribe is a new command (written once, here).
        consumers, self._resubscribe = self._resubscribe, []
        for consumer in consumers:
            if consumer.active:
                consumer.resubscribe()
