"""The topology watch: :meth:`Connection.watch_topology`'s polling task (docs/design.md §7).

:class:`TopologyWatch` polls the connection's ``topology`` command and feeds the pure
:class:`~batonmq.clients.topology.TopologyTracker`, whose events go to the listener. It
depends on the connection only through :class:`TopologySource`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any, Protocol

from batonmq.cluster.errors import BatonError, ConnectionClosed
from batonmq.clients.results import consume_result
from batonmq.clients.topology import Topology as TopologySnapshot
from batonmq.clients.topology import TopologyEvent, TopologyTracker

__all__ = ["TopologySource", "TopologyWatch"]

_log = logging.getLogger("baton.client")


class TopologySource(Protocol):
    """What a :class:`TopologyWatch` polls (a :class:`~batonmq.clients.client.Connection`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the connection runs on."""
        ...

    @property
    def closed(self) -> bool:
        """True once the connection has ended."""
        ...

    async def topology(self) -> dict[str, Any]:
        """The cluster as the connected broker has applied it."""
        ...


class TopologyWatch:
    """A running :meth:`Connection.watch_topology`: stop it with :meth:`stop`."""

    __slots__ = ("_conn", "_listener", "_interval", "_tracker", "_task")

    def __init__(
        self,
        conn: TopologySource,
        listener: Callable[[TopologyEvent], Any],
        interval: float,
        tracker: TopologyTracker,
    ) -> None:
        self._conn = conn
        self._listener = listener
        self._interval = interval
        self._tracker = tracker
        self._task = conn.loop.create_task(self._run(), name="baton-topology-watch")
        self._task.add_done_callback(consume_result)

    @property
    def current(self) -> TopologySnapshot | None:
        """The topology the last event reported (None before INIT)."""
        return self._tracker.current

    @property
    def running(self) -> bool:
        """True until the watch is stopped or its connection has closed."""
        return not self._task.done()

    def stop(self) -> None:
        """Stop polling; no event is delivered after this returns."""
        self._task.cancel()

    async def aclose(self) -> None:
        """Stop, and wait until the polling task has ended."""
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise  # our caller was cancelled

    async def _run(self) -> None:
        conn, loop = self._conn, self._conn.loop
        while not conn.closed:
            try:
                snapshot = TopologySnapshot.from_mapping(await conn.topology())
            except ConnectionClosed:
                if conn.closed:
                    return
            except BatonError as exc:
                _log.warning("topology poll failed: %s", exc)
            else:
                for event in self._tracker.observe(snapshot, loop.time()):
                    try:
                        result = self._listener(event)
                        if inspect.isawaitable(result):
                            await result
                    except Exception:
                        _log.exception("topology listener failed on %s", event.type.name)
            await asyncio.sleep(self._interval)

