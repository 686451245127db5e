"""Service leadership on one broker (docs/design.md §7): the edge around cluster/services.py.

* **Sessions** run for leader with the ``Lead`` frame: each session that does gets a
  candidate key ``"node/runtime/s<n>"``; the broker appends ``Candidate`` and, when
  the session ends, ``Resign`` for each of its candidacies (a broker that dies has its
  candidates dropped by the view change instead).
* **Pushes**: for every applied ``LeaderChanged`` / ``HandoverRequested`` effect that
  concerns one of this broker's sessions, it sends a ``LeaderEvent`` frame: granted
  (with the fencing token), lost, or handover requested.
* **Handover** (admin): the broker appends ``Handover`` and answers the frame once a
  later term of the service has started, or with Timeout.
* **Broker-level candidates** (``baton serve --service NAME``): the broker itself runs
  for leader of those services; asked to hand over, it has no running work, so it
  resigns at once and runs again (at the back of the line).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from batonmq.broker.reply import Replier
from batonmq.clients import wire
from batonmq.cluster.errors import BatonError, InvalidArgument, Timeout
from batonmq.cluster.events import Candidate, Handover, Resign
from batonmq.cluster.node import Node
from batonmq.cluster.results import (
    Candidacy,
    HandedOver,
    HandoverAsked,
    LeadStatus,
    Resigned,
    ServiceList,
)
from batonmq.cluster.services import MAX_SERVICE_NAME, Service, host_of
from batonmq.cluster.effects import Effect, HandoverRequested, LeaderChanged, MembersChanged

__all__ = ["Leadership", "MAX_CANDIDACIES", "MAX_HANDOVER_MS"]

log = logging.getLogger("baton.leadership")

#: Most services one session may run for at once (a bound on replicated state).
MAX_CANDIDACIES: Final = 64
#: Longest a Handover frame may wait for the new term.
MAX_HANDOVER_MS: Final = 3_600_000


@dataclass(slots=True)
class _Waiter:
    """A Handover frame waiting for a term of ``service`` later than ``token``."""

    session: Replier
    corr: int
    service: str
    token: int
    timer: asyncio.TimerHandle | None = None


class Leadership:
    """This broker's side of service leadership."""

    def __init__(self, node: Node, services: list[str] | None = None) -> None:
        self.node = node
        self.services = list(services or [])  # broker-level candidacies
        self._next_session = 0
        self._sessions: dict[str, Replier] = {}  # candidate key -> its session
        self._candidacies: dict[Replier, set[str]] = {}  # session -> services
        self._waiters: list[_Waiter] = []
        self._running: set[str] = set()  # broker-level Candidate appended, not yet applied
        self._seen = (-1, -1)  # (services version, view) when effects were last looked at

    # -- broker-level candidates -------------------------------------------------------

    def start(self) -> None:
        """Run for the configured services (once the node is a member)."""
        for name in self.services:
            _check_name(name)
        self._run_for_services()

    def _run_for_services(self) -> None:
        me = self.node.key
        if not self.services or not self.node.state.membership.is_member(me):
            return
        for name in self.services:
            s = self.node.state.services.get(name)
            if name in self._running or (s is not None and me in s.candidates):
                continue
            self._running.add(name)
            self.node.submit(Candidate(name, me)).add_done_callback(self._ran(name))

    def _ran(self, name: str) -> Callable[[asyncio.Future[Candidacy]], None]:
        def done(fut: asyncio.Future[Candidacy]) -> None:
            self._running.discard(name)
            exc = None if fut.cancelled() else fut.exception()
            if exc is not None:
                log.warning("cannot run for service %s: %s", name, exc)

        return done

    # -- sessions ----------------------------------------------------------------------

    def candidate_key(self, session: Replier) -> str:
        """The session's candidate key, made at its first Lead."""
        if not session.candidate:
            self._next_session += 1
            session.candidate = f"{self.node.key}/s{self._next_session}"
        return session.candidate

    def lead(self, session: Replier, f: wire.Lead) -> None:
        """Handle Lead: append Candidate; answer with the term as applied then."""
        _check_name(f.service)
        mine = self._candidacies.setdefault(session, set())
        if f.service not in mine and len(mine) >= MAX_CANDIDACIES:
            raise InvalidArgument(
                f"a session may run for at most {MAX_CANDIDACIES} services at once"
            )
        cand = self.candidate_key(session)
        mine.add(f.service)
        self._sessions[cand] = session
        fut = self.node.submit(Candidate(f.service, cand))

        def failed(fut: asyncio.Future[Candidacy]) -> None:
            if (fut.cancelled() or fut.exception() is not None) and not session.closed:
                mine.discard(f.service)

        fut.add_done_callback(failed)
        session.reply(f.corr, fut, lambda _r: self._status(f.service, cand))

    def _status(self, service: str, cand: str) -> LeadStatus:
        """The candidacy as this broker has applied it (read when the Ok is sent, so
        it is never older than a LeaderEvent sent before it)."""
        s = self.node.state.services.get(service)
        leader = None if s is None else s.leader
        return LeadStatus(
            service=service,
            candidate=cand,
            leader=leader,
            token=None if s is None or leader is None else s.token,
        )

    def resign(self, session: Replier, f: wire.Resign) -> None:
        """Handle Resign: append it (also when not a candidate: it is idempotent)."""
        _check_name(f.service)
        self._candidacies.get(session, set()).discard(f.service)
        cand = self.candidate_key(session)
        session.reply(
            f.corr,
            self.node.submit(Resign(f.service, cand)),
            lambda r: Resigned(r.was_candidate),
        )

    def session_closed(self, session: Replier) -> None:
        """The session ended: resign its candidacies, drop its handover waits."""
        services = self._candidacies.pop(session, set())
        if session.candidate:
            self._sessions.pop(session.candidate, None)
            for name in sorted(services):
                self.node.submit(Resign(name, session.candidate)).add_done_callback(_quiet)
        for w in [w for w in self._waiters if w.session is session]:
            self._drop_waiter(w)

    def rights_changed(self, session: Replier, may_lead: Callable[[str], bool]) -> None:
        """The session's user had its rights changed: resign its candidacies for the
        services ``may_lead`` no longer allows (a leader among them loses its term)."""
        mine = self._candidacies.get(session)
        if not mine or not session.candidate:
            return
        for name in sorted(n for n in mine if not may_lead(n)):
            # Still its candidacy until the Resign is applied: the session is then
            # told it lost the term (LeaderEvent "lost"), as when a term ends otherwise.
            self.node.submit(Resign(name, session.candidate)).add_done_callback(
                _discard_when_done(mine, name)
            )

    def describe(self) -> ServiceList:
        """The Services frame's answer."""
        return ServiceList(self.node.state.services.describe())

    # -- handover (admin) ----------------------------------------------------------------

    def handover(self, session: Replier, f: wire.Handover) -> None:
        """Handle Handover: append it; answer when a later term has started."""
        _check_name(f.service)
        if not 1 <= f.timeout_ms <= MAX_HANDOVER_MS:
            raise InvalidArgument(f"timeout_ms must be 1..{MAX_HANDOVER_MS}")
        fut = self.node.submit(Handover(f.service, f.to))
        session.commands_started(1)

        def done(fut: asyncio.Future[HandoverAsked]) -> None:
            session.commands_finished(1)
            if fut.cancelled():
                return
            exc = fut.exception()
            if exc is not None:
                if isinstance(exc, BatonError):
                    session.error(f.corr, exc)
                return
            w = _Waiter(session, f.corr, f.service, fut.result().token)
            if not self._answer(w, self.node.state.services.get(f.service), None):
                w.timer = asyncio.get_running_loop().call_later(
                    f.timeout_ms / 1000, self._timed_out, w, f.timeout_ms
                )
                self._waiters.append(w)

        fut.add_done_callback(done)

    def _answer(self, w: _Waiter, s: Service | None, previous: str | None) -> bool:
        """Answer ``w`` if the service has a term later than the one asked to hand over."""
        if s is None or s.leader is None or s.token <= w.token:
            return False
        w.session.send(wire.ok(w.corr, HandedOver(w.service, s.leader, s.token, previous)))
        return True

    def _timed_out(self, w: _Waiter, timeout_ms: int) -> None:
        if w in self._waiters:
            self._waiters.remove(w)
            w.session.error(
                w.corr,
                Timeout(
                    f"no new term of service {w.service!r} within {timeout_ms / 1000:g}s: its"
                    " leader has not finished its work (it still leads; the handover stays"
                    " requested)"
                ),
            )

    def _drop_waiter(self, w: _Waiter) -> None:
        if w.timer is not None:
            w.timer.cancel()
        if w in self._waiters:
            self._waiters.remove(w)

    # -- reacting to the log ---------------------------------------------------------------

    def on_effects(self, effects: list[Effect]) -> None:
        """Called with every applied batch's effects (after the store write)."""
        state = self.node.state
        seen = (state.services.version, state.membership.view_seq)
        if seen == self._seen:
            return  # no service changed and no new view: nothing here (the hot path)
        self._seen = seen
        for e in effects:
            match e:
                case LeaderChanged():
                    self._leader_changed(e)
                case HandoverRequested():
                    self._handover_requested(e)
                case MembersChanged() if self.services:
                    self._run_for_services()  # fenced and back: run again

    def _push(self, cand: str | None, service: str, event: str, token: int, leader: str) -> None:
        if cand is None:
            return
        session = self._sessions.get(cand)
        if session is not None and service in self._candidacies.get(session, ()):
            session.send(wire.LeaderEvent(service, event, token, leader))

    def _leader_changed(self, e: LeaderChanged) -> None:
        me = self.node.key
        if e.leader is not None and host_of(e.leader) == me:
            if e.leader == me:
                log.info("this broker leads service %s (token %d)", e.service, e.token)
            self._push(e.leader, e.service, "granted", e.token, e.leader)
        if e.previous is not None and e.previous != e.leader and host_of(e.previous) == me:
            if e.previous == me:
                log.info("this broker no longer leads service %s", e.service)
            self._push(e.previous, e.service, "lost", e.token, e.leader or "")
        if e.leader is not None and self._waiters:
            s = self.node.state.services.get(e.service)
            for w in [w for w in self._waiters if w.service == e.service]:
                # The state may be ahead of this effect (it is read after the batch).
                if self._answer(w, s, e.previous):
                    self._drop_waiter(w)

    def _handover_requested(self, e: HandoverRequested) -> None:
        if host_of(e.leader) != self.node.key:
            return
        if e.leader == self.node.key:
            # A broker-level leader has no running work: hand over now, run again.
            log.info("handing service %s over (asked by an admin)", e.service)
            self.node.submit(Resign(e.service, e.leader)).add_done_callback(_quiet)
            if e.service in self.services:
                self.node.submit(Candidate(e.service, e.leader)).add_done_callback(_quiet)
            return
        self._push(e.leader, e.service, "handover", e.token, e.leader)


def _check_name(name: str) -> None:
    if not name or len(name) > MAX_SERVICE_NAME or not name.isprintable():
        raise InvalidArgument(f"service name must be 1..{MAX_SERVICE_NAME} printable characters")


def _discard_when_done(names: set[str], name: str) -> Callable[[asyncio.Future[Any]], None]:
    def done(fut: asyncio.Future[Any]) -> None:
        _quiet(fut)
        names.discard(name)

    return done


def _quiet(fut: asyncio.Future[Any]) -> None:
    """Background leadership events: a failure (e.g. fenced) shows in the state."""
    if not fut.cancelled():
        fut.exception()
