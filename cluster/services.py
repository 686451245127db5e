"""Service leadership in log order (docs/design.md §7, last bullet). Pure: no I/O, no clock.

A *service* is a named singleton (e.g. ``import-entries``) with one leader among its
candidates. A candidate is a broker runtime (``"node/runtime"``, its member key) or
a client session hosted on one (``"node/runtime/session"``). Everything here is
decided by the log order, the same way on every replica:

* Candidates are kept in the order their ``Candidate`` events were applied. The
  first candidate in that order leads; a new term starts only when the leader goes
  (it resigns, its session ends, or its broker runtime leaves the view) — the leader
  is stable while it lives, as the cluster leader is.
* Each term carries a **fencing token**: the log offset of the event that granted
  it. Offsets only grow, so a service's tokens strictly increase; at most one term
  per service is granted per event (a view change dropping several candidates
  grants one term, to the first candidate whose broker is still in the view).
* ``Handover`` marks the service "handover requested" (optionally naming the next
  leader). The leader is told (an effect the broker pushes to its session) and
  resigns when its running work is done; then the named candidate, or else the
  first one, gets the next term. A handover never takes leadership away by force.

The driver is :class:`batonmq.cluster.state.State`; this module returns what changed
(:class:`Grant`) and ``State`` turns it into effects, as with
:mod:`batonmq.cluster.membership`.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from batonmq.cluster.errors import InvalidArgument, StaleToken

__all__ = ["Service", "Services", "Grant", "MAX_SERVICE_NAME", "check_candidate", "host_of"]

MAX_SERVICE_NAME: Final = 255


class Grant(NamedTuple):
    """The leader of ``service`` changed at this event: ``leader`` (None: nobody
    leads now) holds the term with fencing ``token``; ``previous`` led before."""

    service: str
    leader: str | None
    token: int
    previous: str | None


@dataclass(slots=True)
class Service:
    """One service's replicated state."""

    name: str
    candidates: list[str] = field(default_factory=list)  # in log order
    leader: str | None = None
    token: int = -1  # log offset of the event that granted the current term
    terms: int = 0  # terms granted so far (while the service existed)
    handover: bool = False  # an admin asked the leader to hand over
    handover_to: str | None = None  # the candidate the admin named, if any

    def snapshot(self) -> list[Any]:
        return [self.name, list(self.candidates), self.leader, self.token, self.terms,
                self.handover, self.handover_to]

    @classmethod
    def restore(cls, s: list[Any]) -> "Service":
        return cls(s[0], list(s[1]), s[2], s[3], s[4], s[5], s[6])

    def describe(self) -> dict[str, Any]:
        """The msgpack-able view for clients (``Services`` frame)."""
        return {
            "service": self.name,
            "leader": self.leader,
            "token": self.token if self.leader is not None else None,
            "terms": self.terms,
            "candidates": list(self.candidates),
            "handover_requested": self.handover,
            "handover_to": self.handover_to,
        }


def host_of(candidate: str) -> str:
    """The broker runtime ("node/runtime") that hosts ``candidate``."""
    parts = candidate.split("/")
    return "/".join(parts[:2])


def check_candidate(origin: str, service: str, candidate: str) -> None:
    """A broker runtime may nominate only itself or one of its own sessions.

    Raises:
        InvalidArgument: a bad service name, or a candidate ``origin`` does not host.
    """
    if not service or len(service) > MAX_SERVICE_NAME or not service.isprintable():
        raise InvalidArgument(f"service name must be 1..{MAX_SERVICE_NAME} printable characters")
    if candidate == origin:
        return
    session = candidate[len(origin) + 1 :] if candidate.startswith(origin + "/") else ""
    if not session or "/" in session or not session.isprintable():
        raise InvalidArgument(f"{origin} cannot act for candidate {candidate!r}")


class Services:
    """Every service's leadership; driven by :class:`batonmq.cluster.state.State`."""

    def __init__(self) -> None:
        self.services: dict[str, Service] = {}
        # Bumped by every transition; not replicated state (not in snapshots): lets
        # the broker skip the effects of batches that changed no service.
        self.version = 0

    # -- queries ----------------------------------------------------------------------

    def get(self, name: str) -> Service | None:
        return self.services.get(name)

    def describe(self) -> list[dict[str, Any]]:
        """Every service, sorted by name."""
        return [self.services[n].describe() for n in sorted(self.services)]

    def check_token(self, service: str, token: int) -> None:
        """Is ``token`` the fencing token of ``service``'s current term?

        A writer fenced by a term (a range commit, docs/spark.md) may act only while
        its term is the current one, in log order: once another term is granted (the
        leader resigned, was handed over, or its broker left the view) its token is
        stale for good, since tokens only grow.

        Raises:
            InvalidArgument: a negative token.
            StaleToken: the service has no leader now, or another term.
        """
        if token < 0:
            raise InvalidArgument(f"a fencing token for service {service!r} must be >= 0")
        s = self.services.get(service)
        if s is None or s.leader is None:
            raise StaleToken(
                f"fencing token {token} of service {service!r} is stale: the service has no"
                " leader now"
            )
        if s.token != token:
            raise StaleToken(
                f"fencing token {token} of service {service!r} is stale: the current term's"
                f" token is {s.token} (leader {s.leader})"
            )

    # -- transitions (``offset`` is the applied event's log offset) --------------------

    def candidate(self, service: str, candidate: str, offset: int) -> Grant | None:
        """Add a candidate (idempotent); with no leader it is granted a term now."""
        self.version += 1
        s = self.services.get(service)
        if s is None:
            s = self.services[service] = Service(service)
        if candidate not in s.candidates:
            s.candidates.append(candidate)
        if s.leader is None:
            return self._elect(s, offset, None)
        return None

    def resign(self, service: str, candidate: str, offset: int) -> tuple[bool, Grant | None]:
        """Remove a candidate. Returns (it was a candidate, the new term if it led)."""
        self.version += 1
        s = self.services.get(service)
        if s is None or candidate not in s.candidates:
            return False, None
        s.candidates.remove(candidate)
        grant = self._elect(s, offset, None) if s.leader == candidate else None
        if not s.candidates:
            del self.services[service]  # tokens still grow: they are log offsets
        return True, grant

    def handover(self, service: str, to: str, offset: int) -> tuple[str, int, str | None]:
        """Ask the leader to hand over. Returns (leader, its token, the named
        candidate or None).

        Raises:
            InvalidArgument: the service has no leader, no other candidate, or
                ``to`` names no candidate other than the leader.
        """
        self.version += 1
        s = self.services.get(service)
        if s is None or s.leader is None:
            raise InvalidArgument(f"service {service!r} has no leader")
        others = [c for c in s.candidates if c != s.leader]
        target: str | None = None
        if to:
            target = next((c for c in others if c == to or c.startswith(to + "/")), None)
            if target is None:
                raise InvalidArgument(
                    f"{to!r} is not a candidate for service {service!r} other than its leader"
                    f" {s.leader} (candidates: {', '.join(s.candidates)})"
                )
        elif not others:
            raise InvalidArgument(
                f"service {service!r} has no candidate besides its leader {s.leader}:"
                " nobody to hand over to"
            )
        s.handover, s.handover_to = True, target
        return s.leader, s.token, target

    def drop_member(self, key: str, offset: int, live: Container[str]) -> list[Grant]:
        """Runtime ``key`` left the view: drop it and its sessions from every service.

        ``live`` holds the runtimes of the new view: a new term goes only to a
        candidate hosted there (several runtimes may leave in one view change; this
        grants at most one term per service for it).
        """
        self.version += 1
        prefix = key + "/"
        grants: list[Grant] = []
        for name in sorted(self.services):
            s = self.services[name]
            gone = [c for c in s.candidates if c == key or c.startswith(prefix)]
            if not gone:
                continue
            s.candidates = [c for c in s.candidates if c not in gone]
            if s.leader in gone:
                grants.append(self._elect(s, offset, live))
            if not s.candidates:
                del self.services[name]
        return grants

    def _elect(self, s: Service, offset: int, live: Container[str] | None) -> Grant:
        """Start the next term: the named handover target if it still runs, else the
        first candidate in log order (hosted by a live runtime)."""
        previous = s.leader
        eligible = [c for c in s.candidates if live is None or host_of(c) in live]
        leader: str | None = None
        if s.handover_to is not None and s.handover_to in eligible:
            leader = s.handover_to
        elif eligible:
            leader = eligible[0]
        s.leader = leader
        s.handover, s.handover_to = False, None
        if leader is not None:
            s.token = offset
            s.terms += 1
        return Grant(s.name, leader, s.token if leader is not None else offset, previous)

    # -- persistence ------------------------------------------------------------------

    def snapshot(self) -> list[Any]:
        return [self.services[n].snapshot() for n in sorted(self.services)]

    def restore(self, snap: list[Any]) -> None:
        self.services = {s[0]: Service.restore(s) for s in snap}
