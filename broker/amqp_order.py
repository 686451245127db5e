"""A channel's order: AMQP's promise that a channel's methods take effect in the order
the client sent them (docs/amqp.md, "A channel's order").

A channel's commands reach the log in order already (one appender, first in first
out); what can break the order is a method that reads this broker's applied state
before the channel's earlier commands are applied there: a ``Basic.Get`` right after the
channel's own ``Basic.Nack`` with requeue, or after a publish without confirms, saw the
queue empty. :class:`ChannelOrder` holds such a read until the commands the channel
submitted before it are applied (whatever their outcome), and holds what the client
sent after it behind it. It does no I/O of its own; broker/amqp_channel.py gives it the
commands' futures and the steps to run.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from pamqp import commands

__all__ = ["READS", "ChannelOrder"]

#: The methods that read what a channel's earlier methods change (a queue's ready
#: messages and consumers, whether a queue or an exchange exists): each waits until the
#: commands those submitted are applied on this broker.
READS = (
    commands.Basic.Get,
    commands.Basic.Consume,
    commands.Queue.Declare,
    commands.Queue.Delete,
    commands.Exchange.Declare,
    commands.Exchange.Delete,
)


class ChannelOrder:
    """The commands one channel submitted that are not applied yet, and the steps held
    while a read waits for them.

    Args:
        run: runs one held step; returns False once the channel has closed (the steps
            left are dropped).
        resumed: called when the held steps have run and none waits any more.
    """

    __slots__ = ("_pending", "_backlog", "_run", "_resumed", "waiting")

    def __init__(self, run: Callable[[Callable[[], None]], bool],
                 resumed: Callable[[], None]) -> None:
        self._pending: set[asyncio.Future[Any]] = set()
        self._backlog: deque[Callable[[], None]] = deque()
        self._run = run
        self._resumed = resumed
        self.waiting = False  # a read waits: what comes is held behind it

    @property
    def pending(self) -> bool:
        """Whether a command the channel submitted is not applied yet."""
        return bool(self._pending)

    def track(self, fut: asyncio.Future[Any]) -> None:
        """A command of the channel's client: a later read waits for it."""
        if not fut.done():
            self._pending.add(fut)
            fut.add_done_callback(self._pending.discard)

    def hold(self, step: Callable[[], None]) -> None:
        """Run ``step`` after what waits (call only while :attr:`waiting`)."""
        self._backlog.append(step)

    def wait(self, read: Callable[[], None]) -> None:
        """Run ``read`` once the commands submitted so far are applied, then what was
        held behind it, in order."""
        self.waiting = True
        self._backlog.appendleft(read)
        left = len(self._pending)

        def one_done(_f: asyncio.Future[Any]) -> None:
            nonlocal left
            left -= 1
            if left == 0:
                self._resume()

        for f in list(self._pending):
            f.add_done_callback(one_done)

    def _resume(self) -> None:
        self.waiting = False
        while self._backlog and not self.waiting:
            if not self._run(self._backlog.popleft()):
                self._backlog.clear()
                return
        if not self.waiting:
            self._resumed()

    def clear(self) -> None:
        """The channel closed: nothing held runs."""
        self._backlog.clear()
        self._pending.clear()
