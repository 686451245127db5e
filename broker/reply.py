"""What delivery and service leadership need of a client session: a way to answer it.

:class:`Replier` is the narrow side of a session (broker/session.py) that
broker/delivery.py and broker/leadership.py hold and call: send a frame, answer a
command when its future completes, deliver to one of its consumers, and count the
commands in flight (the session stops reading past its limit). They never see the
rest of the session, and this module imports none of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from batonmq.clients import wire
from batonmq.cluster.errors import BatonError
from batonmq.cluster.results import Result

__all__ = ["Replier", "Shape", "as_is"]

R = TypeVar("R")

#: Turns what a command's future resolves with into the result its Ok frame carries
#: (may raise BatonError).
Shape = Callable[[R], Result]


def as_is(result: Result) -> Result:
    """The :data:`Shape` of a command whose result is its answer as it is."""
    return result


class Replier(Protocol):
    """One client session, as the broker's parts that answer it see it.

    Attributes:
        candidate: the session's service-leadership candidate key
            (``"node/runtime/s<n>"``), made by the broker at its first Lead; ``""``
            until then.
    """

    candidate: str

    @property
    def closed(self) -> bool:
        """The connection has ended: nothing sent goes anywhere."""
        ...

    @property
    def paused(self) -> bool:
        """The client is not reading: stop delivering to it."""
        ...

    def send(self, frame: wire.Frame) -> None:
        """Queue a frame for this tick's write (dropped once closed)."""
        ...

    def reply(self, corr: int, fut: asyncio.Future[R], shape: Shape[R]) -> None:
        """Answer ``corr`` with the future's outcome (Ok with its result shaped, or
        Error) when it completes; the command counts as in flight until then."""
        ...

    def error(self, corr: int, exc: BatonError) -> None:
        """Answer ``corr`` with an Error frame."""
        ...

    def commands_started(self, n: int) -> None:
        """``n`` more commands are in flight on this connection."""
        ...

    def commands_finished(self, n: int) -> None:
        """``n`` commands in flight on this connection have completed."""
        ...

    def deliver(self, tag: int, messages: list[list[Any]]) -> None:
        """Send a Deliver frame of ``messages`` to the session's consumer ``tag``."""
        ...

    def consumer_cancelled(self, tag: int, exc: BatonError) -> None:
        """The broker ended the session's consumer ``tag`` (e.g. its queue was deleted)."""
        ...
