"""Service leadership for applications (docs/design.md §7): one leader among candidates.

Use it through :meth:`batonmq.clients.client.Connection.lead`::

    async with conn.lead("import-entries") as term:
        # This session leads "import-entries" now. term.token is the term's fencing
        # token: pass it along with every write that only the leader may make.
        while not term.lost.is_set() and not term.handover_requested.is_set():
            await do_some_work(term.token)
    # Leaving the block resigns: the next candidate gets a new term.

A :class:`Term` is one run for leadership on one connection. ``__aenter__`` makes
the session a candidate and waits until it leads; ``term.lost`` is set when the
leadership is lost (the broker was lost, the session was dropped by a view change,
a failover moved the connection to another broker — a new session is a new
candidate — or the block was left); ``term.handover_requested`` is set when an
admin asked for a handover: finish the running work and leave the block.

This module is pure bookkeeping on the client's event loop; the frames are sent by
the connection, which a Term knows only through :class:`LeadershipChannel` (it sends
Lead and Resign, and routes the pushed LeaderEvents of the service to the Term).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from batonmq.cluster.errors import BatonError, ConnectionClosed, InvalidArgument, ProtocolError, Timeout
from batonmq.cluster.results import LeadStatus
from batonmq.clients.wire import read_result

__all__ = ["Term", "ServiceInfo", "HandoverResult", "LeadershipChannel"]

_log = logging.getLogger("baton.client")


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    """One service as the connected broker applied it.

    Attributes:
        service: its name.
        leader: the leading candidate's key ("node/runtime" for a broker,
            "node/runtime/s<n>" for a client session), or None.
        token: the current term's fencing token (the log offset that granted it),
            or None without a leader.
        terms: how many terms were granted since the service last had candidates.
        candidates: every candidate, in the order they ran (the first leads next).
        handover_requested: an admin asked the leader to hand over.
        handover_to: the candidate named to lead next, if any.
    """

    service: str
    leader: str | None
    token: int | None
    terms: int
    candidates: tuple[str, ...]
    handover_requested: bool
    handover_to: str | None

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> "ServiceInfo":
        """Build from one item of the broker's ``Services`` answer.

        Raises:
            ProtocolError: a field is missing or has the wrong type.
        """
        try:
            info = cls(
                str(m["service"]),
                None if m["leader"] is None else str(m["leader"]),
                None if m["token"] is None else int(m["token"]),
                int(m["terms"]),
                tuple(str(c) for c in m["candidates"]),
                bool(m["handover_requested"]),
                None if m["handover_to"] is None else str(m["handover_to"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed service entry from the broker: {exc!r}") from exc
        return info


@dataclass(frozen=True, slots=True)
class HandoverResult:
    """A handover completed: ``leader`` holds the new term, fencing ``token``;
    ``previous`` led before (None if it was already gone)."""

    service: str
    leader: str
    token: int
    previous: str | None


class LeadershipChannel(Protocol):
    """What a :class:`Term` needs of its connection (``conn.Channel`` implements it)."""

    @property
    def closed(self) -> bool:
        """True once the connection has ended (not while it fails over)."""
        ...

    @property
    def reconnecting(self) -> bool:
        """True while a failover is under way."""
        ...

    @property
    def failovers(self) -> int:
        """How many times the connection failed over: each is a new session."""
        ...

    def closed_again(self) -> ConnectionClosed:
        """A fresh ConnectionClosed like the one the connection ended with."""
        ...

    def lead_request(self, service: str) -> asyncio.Future[dict[str, Any]]:
        """Send Lead for ``service``; the future of its answer (a
        :class:`~batonmq.cluster.results.LeadStatus` map)."""
        ...

    def resign_request(self, service: str) -> asyncio.Future[dict[str, Any]]:
        """Send Resign for ``service``; the future of its answer."""
        ...

    def add_term(self, term: Term) -> bool:
        """Route the service's LeaderEvents to ``term`` (:meth:`Term.leader_event`) and
        tell it when the session ends (:meth:`Term.session_lost`).

        Returns:
            False (nothing changed) if another Term of this connection runs for it.
        """
        ...

    def remove_term(self, term: Term) -> None:
        """Stop routing to ``term`` (nothing if another Term took its place)."""
        ...


class Term:
    """One run for leadership of ``service`` on one connection (see the module doc).

    Attributes:
        service: the service's name.
        token: the fencing token of this term (the log offset that granted it; it
            grows with every term of the service). -1 until granted.
        candidate: this session's candidate key ("node/runtime/s<n>").
        lost: set when this session no longer leads (or the block was left).
        handover_requested: set when an admin asked this leader to hand over.
    """

    def __init__(self, conn: LeadershipChannel, service: str, timeout: float | None) -> None:
        if not isinstance(service, str) or not service:
            raise InvalidArgument("service must be a non-empty str")
        if timeout is not None and not timeout > 0:
            raise InvalidArgument("timeout must be positive (or None: wait forever)")
        self.service = service
        self.token = -1
        self.candidate = ""
        self.lost = asyncio.Event()
        self.handover_requested = asyncio.Event()
        self._conn = conn
        self._timeout = timeout
        self._granted = False
        self._entered = False
        self._session = -1  # conn.failovers when the candidacy was made
        self._wake = asyncio.Event()  # granted, or the session was lost

    def __repr__(self) -> str:
        state = "leading" if self.leading else ("lost" if self.lost.is_set() else "waiting")
        return f"<Term {self.service!r} {state} token={self.token}>"

    @property
    def leading(self) -> bool:
        """True while this session holds the term."""
        return self._granted and not self.lost.is_set()

    async def __aenter__(self) -> "Term":
        """Run for leader and wait until this session leads.

        Raises:
            InvalidArgument: this connection already runs for this service.
            Timeout: not leading within the ``timeout`` given to ``lead`` (the
                candidacy is withdrawn).
            ConnectionClosed: the connection ended (failovers are waited out: the
                new session runs again).
        """
        conn = self._conn
        if self._entered:
            raise InvalidArgument("a Term can be entered once; call conn.lead() again")
        if not conn.add_term(self):
            raise InvalidArgument(f"this connection already runs for service {self.service!r}")
        self._entered = True
        try:
            async with _timeout(self._timeout, self.service):
                while True:
                    self._reset()
                    status = read_result(LeadStatus, await conn.lead_request(self.service))
                    self._session = conn.failovers
                    self.candidate = status.candidate
                    if (
                        status.leader == self.candidate
                        and self.candidate
                        and status.token is not None
                    ):
                        self._grant(status.token)
                    while not self._wake.is_set():
                        await self._wake.wait()
                    if conn.closed:
                        raise conn.closed_again()
                    if self.leading and self._session == conn.failovers:
                        return self
                    # A failover while waiting: the new session runs again.
        except BaseException:
            self._finish()
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Resign (the next candidate gets a new term); ``lost`` is set after."""
        conn = self._conn
        same_session = self._session == conn.failovers and not conn.closed
        self._finish()
        if same_session and not conn.reconnecting:
            try:
                await conn.resign_request(self.service)
            except ConnectionClosed:
                pass  # the broker resigns for a session that ends
            except BatonError as err:
                _log.warning("resigning service %s failed: %s", self.service, err)

    # -- called by the connection ---------------------------------------------------

    def _reset(self) -> None:
        self._granted = False
        self.token = -1
        self.candidate = ""
        self.lost.clear()
        self.handover_requested.clear()
        self._wake.clear()

    def _grant(self, token: int) -> None:
        self._granted = True
        self.token = token
        self._wake.set()

    def leader_event(self, event: str, token: int, leader: str) -> None:
        """A LeaderEvent frame for this service: ``granted``, ``lost`` or ``handover``."""
        if event == "granted":
            if self.candidate and leader == self.candidate and not self._granted:
                self._grant(token)
        elif event == "lost":
            if self._granted:
                self.lost.set()
                self._wake.set()
        elif event == "handover":
            if self._granted and token == self.token:
                self.handover_requested.set()

    def session_lost(self) -> None:
        """The connection failed over or closed: this session's candidacy is gone."""
        if self._granted:
            self.lost.set()
        self._wake.set()

    def _finish(self) -> None:
        """The run is over: release the name on the connection; the term is lost."""
        self._conn.remove_term(self)
        if self._granted:
            self.lost.set()
        else:
            self._resign_in_background()
        self._wake.set()

    def _resign_in_background(self) -> None:
        """Withdraw a candidacy that never led (timeout, cancel) without waiting.

        Sent even when the Lead's answer never came (its candidacy may have been
        applied) or a failover re-sent the Lead: the broker resigns for the session
        that sends it, after the Lead it read before, and a Resign of a session that
        is no candidate changes nothing.
        """
        conn = self._conn
        if not conn.closed:
            try:
                conn.resign_request(self.service).add_done_callback(_consume)
            except BatonError:
                pass


class _timeout:
    """``asyncio.timeout`` that raises :class:`batonmq.cluster.errors.Timeout` (None: no limit)."""

    def __init__(self, seconds: float | None, service: str) -> None:
        self._cm = asyncio.timeout(seconds)
        self._seconds = seconds
        self._service = service

    async def __aenter__(self) -> None:
        await self._cm.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._cm.__aexit__(exc_type, exc, tb)
        except TimeoutError:
            raise Timeout(
                f"this session did not get to lead service {self._service!r} within"
                f" {self._seconds:g}s (another candidate leads)"
            ) from None


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
