"""Who a client session is, and what it may do (docs/security.md).

:class:`Login` is the broker's side of a connection's login: a SCRAM exchange
(clients/scram.py) against the users in the state applied here, and the rule that
``guest`` connects from loopback only. :class:`Rights` answers, for the logged-in
user, whether it may do a command: it reads the user from the state at each check
(cached until the user table changes), so a change of rights or a deleted user
applies at once to connections already open; what a right let a session start (a
consumer, a candidacy) ends when the broker applies its revocation (broker/server.py
``_rights_changed``). Every refusal raises
:class:`~batonmq.cluster.errors.AccessRefused` and is counted by the broker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from batonmq.clients import scram, wire
from batonmq.cluster import events
from batonmq.cluster.errors import AccessRefused, InvalidArgument, LimitExceeded
from batonmq.cluster.results import UserList
from batonmq.cluster.users import (
    GUEST,
    RIGHTS,
    User,
    Users,
    check_limits,
    check_pattern,
    check_tags,
    check_user_name,
)

if TYPE_CHECKING:
    from batonmq.cluster.state import State

__all__ = [
    "Login",
    "Rights",
    "check_password_login",
    "check_user_limit",
    "limits_event",
    "list_users",
    "tags_event",
    "user_event",
]

# A session caches this many (right, name) answers at most, then starts again.
_CACHE = 4096
# A fixed credential checked for an unknown user, so that a refusal takes as long
# whether the user exists or not.
_NOBODY = scram.Credentials(b"baton-amqp-nobody", scram.DEFAULT_COST, b"\0" * 32, b"\0" * 32)


def check_password_login(users: Users, name: str, password: str, loopback: bool) -> User:
    """The user that ``name`` and a plain ``password`` log in as, checked against the
    stored SCRAM keys (the broker does the scrypt work: run it off the event loop). The
    one check of every login that sends a password as it is: AMQP's PLAIN and AMQPLAIN,
    and the admin listener's HTTP Basic and console logins.

    Raises:
        PermissionError: the login is refused (the text says why, without telling
            whether the user exists), or ``guest`` from beyond loopback.
    """
    user = users.get(name)
    creds = (
        scram.Credentials(user.salt, user.cost, user.stored_key, user.server_key)
        if user is not None
        else _NOBODY
    )
    if not scram.check_password(creds, password) or user is None:
        raise PermissionError(f"wrong user name or password for '{name}'")
    if user.name == GUEST and not loopback:
        raise PermissionError(
            f"user '{GUEST}' may connect from loopback only; create a user for remote"
            " clients: baton user add"
        )
    return user


class Login:
    """One login under way: :meth:`first` on the Hello's auth map, then :meth:`final`
    on the AuthResponse's data.

    Args:
        users: the user table applied here.
        secret: the broker's random secret (unknown users' salts).
    """

    def __init__(self, users: Users, secret: bytes) -> None:
        self._users = users

        def lookup(name: str) -> scram.Credentials | None:
            u = users.get(name)
            if u is None:
                return None
            return scram.Credentials(u.salt, u.cost, u.stored_key, u.server_key)

        self._exchange = scram.ServerExchange(lookup, secret)

    def first(self, auth: dict[str, Any]) -> bytes:
        """The challenge for a Hello's ``auth`` map.

        Raises:
            AccessRefused: no login, another mechanism, or a malformed message.
        """
        mechanism = auth.get("mechanism", "")
        if mechanism != scram.MECHANISM:
            raise AccessRefused(
                f"this broker needs a login ({scram.MECHANISM}); clients that name no user"
                f" log in as guest/guest, which works from loopback only"
                if not mechanism
                else f"unknown authentication mechanism {mechanism!r} (this broker speaks"
                f" {scram.MECHANISM})"
            )
        message = auth.get("message")
        if not isinstance(message, bytes):
            raise AccessRefused("the SCRAM first message must be bytes")
        return self._exchange.first(message)

    def final(self, data: dict[str, Any], loopback: bool, peer: str) -> tuple[User, bytes]:
        """The user and the broker's last SCRAM message, once the proof checks.

        Raises:
            AccessRefused: wrong user or password, a malformed message, or ``guest``
                from beyond loopback.
        """
        message = data.get("message")
        if not isinstance(message, bytes):
            raise AccessRefused("the SCRAM final message must be bytes")
        outcome = self._exchange.final(message)
        name = self._exchange.user
        user = self._users.get(name)
        if user is None:  # deleted during the exchange
            raise AccessRefused(f"wrong user name or password for {name!r}")
        if user.name == GUEST and not loopback:
            raise AccessRefused(
                f"user {GUEST!r} may connect from loopback only (this connection is from"
                f" {peer}); create a user for remote clients: baton user add"
            )
        return user, outcome


class Rights:
    """The rights checks of one session's user.

    Args:
        users: the state's user table (read at each check).
        name: the user the session logged in as.
        refused: counts one refusal (what was missing).
    """

    def __init__(self, users: Callable[[], Users], name: str, refused: Callable[[str], None]) -> None:
        self._users = users
        self.name = name
        self._refused = refused
        self._cache: dict[tuple[str, str], bool] = {}
        self._version = -1

    def user(self) -> User:
        """The user as the state has it now.

        Raises:
            AccessRefused: it was deleted.
        """
        users = self._users()
        if users.version != self._version:
            self._cache.clear()
            self._version = users.version
        user = users.get(self.name)
        if user is None:
            self._refused("login")
            raise AccessRefused(f"user {self.name!r} no longer exists")
        return user

    def allowed(self, right: str, name: str) -> bool:
        """Whether the user has ``right`` over ``name`` (no refusal counted)."""
        user = self.user()
        key = (right, name)
        allowed = self._cache.get(key)
        if allowed is None:
            if len(self._cache) >= _CACHE:
                self._cache.clear()
            allowed = self._cache[key] = user.may(right, name)
        return allowed

    def check(self, right: str, name: str, what: str = "") -> None:
        """Raise AccessRefused unless the user has ``right`` over ``name`` (``what`` it
        names: "queue", "exchange", "service"; by default a service for ``lead``, else
        a queue). Queues and exchanges share the rights' name patterns."""
        if not self.allowed(right, name):
            self._refused(right)
            what = what or ("service" if right == "lead" else "queue")
            raise AccessRefused(f"user {self.name!r} has no {right} right on {what} {name!r}")

    def sees(self, queue: str) -> bool:
        """Whether the user has any right over ``queue`` (its stats, its listing)."""
        return any(self.allowed(r, queue) for r in ("configure", "write", "read"))

    def check_any(self, queue: str) -> None:
        if not self.sees(queue):
            self._refused("read")
            raise AccessRefused(f"user {self.name!r} has no right on queue {queue!r}")

    def check_admin(self, what: str) -> None:
        if not self.user().admin:
            self._refused("admin")
            raise AccessRefused(f"user {self.name!r} is not an admin: cannot {what}")

    def check_monitoring(self, what: str) -> None:
        """Raise AccessRefused unless the user is an admin or has the ``monitoring``
        tag (the admin listener's /metrics and read-only statistics)."""
        user = self.user()
        if not (user.admin or user.monitoring):
            self._refused("admin")
            raise AccessRefused(
                f"user {self.name!r} is neither an admin nor tagged monitoring: cannot {what}"
            )

    def topology(self, topology: dict[str, Any]) -> dict[str, Any]:
        """A Topology answer as this user may see it: the addresses for an admin only."""
        if not self.user().admin:
            topology["instances"] = [{**i, "address": ""} for i in topology["instances"]]
        return topology


def user_event(
    f: wire.PutUser | wire.DeleteUser | wire.SetRights,
) -> events.PutUser | events.DeleteUser | events.SetRights:
    """The event for an admin's user command, checked before it goes to the log.

    Raises:
        InvalidArgument: a bad name, malformed credentials, an unknown right or a
            pattern that is not a regular expression.
    """
    check_user_name(f.name)
    match f:
        case wire.PutUser():
            c = f.credentials
            try:
                creds = scram.Credentials(c["salt"], c["cost"], c["stored_key"], c["server_key"])
            except (KeyError, TypeError):
                raise InvalidArgument(
                    "credentials must be {salt, cost, stored_key, server_key}"
                ) from None
            if not all(isinstance(v, bytes) for v in (creds.salt, creds.stored_key, creds.server_key)):
                raise InvalidArgument("credentials: salt and keys must be bytes")
            return events.PutUser(f.name, creds.salt, creds.cost, creds.stored_key,
                                  creds.server_key, f.admin)
        case wire.DeleteUser():
            return events.DeleteUser(f.name)
        case wire.SetRights():
            rights = []
            for right, pattern in sorted(f.rights.items()):
                if right not in RIGHTS:
                    raise InvalidArgument(f"unknown right {right!r} (rights: {', '.join(RIGHTS)})")
                rights.append((right, check_pattern(right, pattern)))
            if not rights:
                raise InvalidArgument("give at least one right to set")
            return events.SetRights(f.name, tuple(rights))


#: What each per-user limit counts, for its refusal.
_COUNTED = {
    "max_queues": "queues",
    "max_connections": "connections open on this broker",
    "max_consumers": "consumers on this broker",
}


def check_user_limit(users: Users, user: str, key: str, held: int) -> None:
    """Raise LimitExceeded if user ``user`` already has ``held`` of what its limit
    ``key`` (``max_connections``, ``max_consumers``) counts. Connections and consumers
    are counted per broker (each broker its own), queues cluster-wide by the state.

    Raises:
        LimitExceeded: at or above the limit.
    """
    limit = users.limit(user, key)
    if limit is not None and held >= limit:
        raise LimitExceeded(
            f"user {user!r} has {held} {_COUNTED[key]}, its limit ({key} {limit});"
            " an admin may raise it (baton user limits)"
        )


def _need_flag(state: State) -> None:
    if "user_limits" not in state.features.enabled:
        raise InvalidArgument(
            "user limits and tags need the feature flag user_limits: enable it once every"
            " broker runs a build that has it (baton feature enable user_limits)"
        )


def limits_event(name: str, limits: dict[str, Any], state: State) -> events.SetUserLimits:
    """The event that sets ``limits`` (``{limit: N, -1 for none, or None for the
    default}``) of user ``name``, or the cluster's default for non-admins (``name`` ""),
    checked before it goes to the log.

    Raises:
        InvalidArgument: the flag ``user_limits`` is not enabled, no such user, an
            unknown limit, a bad value, or no limit given.
    """
    _need_flag(state)
    if name:
        check_user_name(name)
        if state.users.get(name) is None:
            raise InvalidArgument(f"no user {name!r}")
    if not limits:
        raise InvalidArgument("give at least one limit to set")
    check_limits(limits)
    return events.SetUserLimits(name, tuple(sorted(limits.items())))


def tags_event(name: str, tags: list[Any], state: State) -> events.SetUserTags:
    """The event that sets the tags of user ``name`` (all of them).

    Raises:
        InvalidArgument: the flag ``user_limits`` is not enabled, no such user or an
            unknown tag.
    """
    _need_flag(state)
    check_user_name(name)
    if state.users.get(name) is None:
        raise InvalidArgument(f"no user {name!r}")
    if not all(isinstance(t, str) for t in tags):
        raise InvalidArgument("tags must be strings")
    return events.SetUserTags(name, check_tags(tuple(tags)))


def list_users(users: Users) -> UserList:
    """Every user with its rights (no credentials)."""
    return UserList([users.get(n).describe() for n in users.names()])  # type: ignore[union-attr]
