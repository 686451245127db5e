"""Connections that have not logged in yet: their own, smaller limit (docs/security.md).

A connection costs the broker memory and a slot of ``max_connections`` from the moment
it is accepted, but whoever opens it has proved nothing until its login completes (a
native Hello and AuthResponse, an AMQP StartOk whose password checks, a joining
broker's UpdateRequest with its member proof). :class:`LoginGate` counts such
connections, native and AMQP together, broker-wide (``max_unauthenticated``) and per
source address (``max_unauthenticated_per_host``): more are refused at once, so
strangers can never fill ``max_connections`` and lock out the users who log in. The
hello timeout bounds how long each may stay unauthenticated.
"""

from __future__ import annotations

import logging
import time

__all__ = ["LoginGate", "QuietLog"]


class LoginGate:
    """Counts the connections still logging in, in all and per source address.

    Args:
        limit: the most at once (``BrokerConfig.max_unauthenticated``).
        per_host: the most at once from one address
            (``BrokerConfig.max_unauthenticated_per_host``).
    """

    __slots__ = ("limit", "per_host", "_by_host", "_count")

    def __init__(self, limit: int, per_host: int) -> None:
        self.limit = limit
        self.per_host = per_host
        self._by_host: dict[str, int] = {}
        self._count = 0

    @property
    def count(self) -> int:
        """How many connections are still logging in."""
        return self._count

    def admit(self, host: str) -> str | None:
        """Count one more connection from ``host``, still logging in.

        Returns:
            None if it is admitted (then :meth:`done` must be called once for it), or
            why it is refused: the setting that is full.
        """
        if self._count >= self.limit:
            return (
                f"{self.limit} connections are still logging in here"
                " (max_unauthenticated)"
            )
        held = self._by_host.get(host, 0)
        if held >= self.per_host:
            return (
                f"{self.per_host} connections from {host or 'this address'} are still"
                " logging in here (max_unauthenticated_per_host)"
            )
        self._by_host[host] = held + 1
        self._count += 1
        return None

    def done(self, host: str) -> None:
        """A connection from ``host`` admitted by :meth:`admit` logged in or closed."""
        held = self._by_host.get(host, 0)
        if held <= 0:
            return
        if held == 1:
            del self._by_host[host]
        else:
            self._by_host[host] = held - 1
        self._count -= 1


class QuietLog:
    """A WARNING line per refusal, at most one a second: a flood of refused logins or
    connections must not flood the log; the refusal counter (``access_refused`` in the
    metrics) has them all. The next line says how many were not logged.

    Args:
        logger: where the lines go.
        what: how a line starts ("login refused", "AMQP login refused").
    """

    __slots__ = ("logger", "what", "_logged_at", "_quiet")

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what
        self._logged_at = -1.0
        self._quiet = 0

    def __call__(self, peer: str, why: str) -> None:
        """Log one refusal of ``peer`` for ``why`` (or count it, within a second of the
        last line)."""
        now = time.monotonic()
        if self._logged_at >= 0 and now - self._logged_at < 1.0:
            self._quiet += 1
            return
        more = f" ({self._quiet} more refused since the last such line)" if self._quiet else ""
        self.logger.warning("%s from %s: %s%s", self.what, peer, why, more)
        self._logged_at, self._quiet = now, 0
