"""Users and their rights, in the replicated state (docs/security.md).

Pure: every broker applies the same user events in log order, so every broker agrees on
who may connect and do what. What is kept of a password is its SCRAM credentials
(salt, scrypt cost, StoredKey, ServerKey: clients/scram.py), never the password.

A cluster whose log never had a user event has one user, ``guest`` (password
``guest``), an admin that may connect from loopback only (the broker checks that), as
RabbitMQ's default: the first broker, the demo and the tests work as they are. The
first user event makes the table explicit: ``guest`` is kept (until deleted) unless that
event is the *initial* admin of ``baton serve --admin-password-file``, which replaces it.

Rights, as RabbitMQ's, are regular expressions over names that must match the whole
name (``re.fullmatch``; "" matches nothing): *configure* (declare, delete, purge a queue),
*write* (publish to it), *read* (consume, get, peek, range reads and commits), and
*lead* (run for, and hand over, a service's leadership; over service names). An admin
has every right, and manages users and sees the cluster's addresses.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from batonmq.cluster.errors import InvalidArgument, LimitExceeded

__all__ = [
    "DEFAULT_LIMITS",
    "GUEST",
    "LIMITS",
    "MONITORING",
    "RIGHTS",
    "TAGS",
    "UNLIMITED",
    "User",
    "Users",
    "check_limits",
    "check_queue_limit",
    "check_queue_count",
    "check_pattern",
    "check_tags",
    "check_user_name",
]

#: The default user's name (loopback only).
GUEST = "guest"
#: The rights a user has over names, in the order the wire and the snapshots list them.
RIGHTS = ("configure", "write", "read", "lead")
_ALL = ".*"
MAX_PATTERN = 1024
#: The per-user limits (docs/security.md "Per-user limits"), as RabbitMQ's user limits.
LIMITS = ("max_queues", "max_connections", "max_consumers")
#: A limit's value meaning "no limit" (a user's own limit may say so to lift a default).
UNLIMITED = -1
#: What a non-admin user may have when neither it nor the cluster's default says
#: otherwise, once the ``user_limits`` flag is enabled; admins have no limit unless
#: their own says so.
DEFAULT_LIMITS: dict[str, int] = {"max_queues": 1000}
#: The tag of a user that may read ``/metrics`` and every read-only statistic of the
#: admin listener, and change nothing (as RabbitMQ's ``monitoring`` tag).
MONITORING = "monitoring"
#: The tags a user may have.
TAGS = (MONITORING,)

# The SCRAM credentials of the default guest/guest (clients/scram.py, cost 2^10: its
# password is public, so a costly hash would protect nothing). A unit test derives them
# again from the password.
GUEST_SALT = b"baton-guest-salt"
GUEST_COST = 1 << 10
GUEST_STORED_KEY = bytes.fromhex("be108f82a649c41687ecbf059a99664fc30d8f17f838da9daab36627aebf01d7")
GUEST_SERVER_KEY = bytes.fromhex("6bba72d1c98087c5089b4d606a4e7ac37dfc38db63add3c21485a1b8be5a2ecd")


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def check_pattern(right: str, pattern: str) -> str:
    """``pattern`` if it is a valid regular expression for ``right``.

    Raises:
        InvalidArgument: it does not compile, or is longer than 1,024 characters.
    """
    if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN:
        raise InvalidArgument(f"the {right} pattern must be a string of at most {MAX_PATTERN} characters")
    try:
        _compiled(pattern)
    except re.error as exc:
        raise InvalidArgument(f"the {right} pattern {pattern!r} is not a regular expression: {exc}") from None
    return pattern


def check_limits(limits: dict[str, int | None]) -> dict[str, int | None]:
    """``limits`` if each is one of :data:`LIMITS` with a value of 0 or more,
    :data:`UNLIMITED`, or None (not set: the default applies).

    Raises:
        InvalidArgument: an unknown limit or a bad value.
    """
    for name, value in limits.items():
        if name not in LIMITS:
            raise InvalidArgument(f"unknown limit {name!r} (limits: {', '.join(LIMITS)})")
        if value is not None and (type(value) is not int or value < UNLIMITED):
            raise InvalidArgument(f"{name} must be 0 or more, or -1 for no limit, not {value!r}")
    return limits


def check_tags(tags: tuple[str, ...]) -> tuple[str, ...]:
    """``tags``, sorted and without duplicates, if each is one of :data:`TAGS`.

    Raises:
        InvalidArgument: an unknown tag.
    """
    for tag in tags:
        if tag not in TAGS:
            raise InvalidArgument(f"unknown user tag {tag!r} (tags: {', '.join(TAGS)})")
    return tuple(sorted(set(tags)))


def check_user_name(name: str) -> str:
    """``name`` if it can be a user's name: 1 to 255 UTF-8 bytes, no control characters.

    Raises:
        InvalidArgument: it cannot.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgument("a user name must not be empty")
    if len(name.encode("utf-8", "surrogatepass")) > 255 or any(c < " " or c == "\x7f" for c in name):
        raise InvalidArgument(f"user name {name[:40]!r} is longer than 255 bytes or has control characters")
    return name


@dataclass(frozen=True, slots=True)
class User:
    """One user: credentials, admin or not, and a pattern per right."""

    name: str
    salt: bytes
    cost: int
    stored_key: bytes
    server_key: bytes
    admin: bool = False
    configure: str = ""
    write: str = ""
    read: str = ""
    lead: str = ""
    #: Tags (:data:`TAGS`), sorted.
    tags: tuple[str, ...] = ()
    #: The user's own limits, ``((name, value), ...)`` sorted; a limit not listed is the
    #: cluster's default (non-admins) or none (admins).
    limits: tuple[tuple[str, int], ...] = ()

    @property
    def monitoring(self) -> bool:
        """Whether the user has the ``monitoring`` tag."""
        return MONITORING in self.tags

    def may(self, right: str, name: str) -> bool:
        """Whether this user has ``right`` (one of :data:`RIGHTS`) over ``name``."""
        if self.admin:
            return True
        pattern: str = getattr(self, right)
        return bool(pattern) and _compiled(pattern).fullmatch(name) is not None

    def describe(self) -> dict[str, Any]:
        """What ``baton user list`` shows (no credentials)."""
        return {"name": self.name, "admin": self.admin, **{r: getattr(self, r) for r in RIGHTS},
                "tags": list(self.tags), "limits": dict(self.limits)}

    def snapshot(self) -> list[Any]:
        snap = [self.name, self.salt, self.cost, self.stored_key, self.server_key, self.admin,
                self.configure, self.write, self.read, self.lead]
        # Tags and limits only when set: the snapshot (and the digest) of a cluster that
        # never set one is the one builds before them make (docs/design.md §15).
        if self.tags or self.limits:
            snap += [list(self.tags), [[k, v] for k, v in self.limits]]
        return snap

    @classmethod
    def restore(cls, snap: list[Any]) -> User:
        if len(snap) > 10:
            tags = tuple(snap[10])
            limits = tuple((k, v) for k, v in snap[11])
            return cls(*snap[:10], tags=tags, limits=limits)  # type: ignore[misc]
        return cls(*snap)


def _guest() -> User:
    return User(GUEST, GUEST_SALT, GUEST_COST, GUEST_STORED_KEY, GUEST_SERVER_KEY, True,
                _ALL, _ALL, _ALL, _ALL)


class Users:
    """The user table. ``explicit`` is False until the first user event: then the
    table is the default (``guest`` only)."""

    def __init__(self) -> None:
        self.explicit = False
        self._users: dict[str, User] = {GUEST: _guest()}
        self.version = 0  # bumped by every change: sessions cache their rights by it
        #: The cluster's default limits for non-admin users, where set (else
        #: DEFAULT_LIMITS' value applies).
        self.default_limits: dict[str, int] = {}

    def get(self, name: str) -> User | None:
        return self._users.get(name)

    def __len__(self) -> int:
        return len(self._users)

    def names(self) -> list[str]:
        return sorted(self._users)

    def put(self, user: User, *, initial: bool = False) -> bool:
        """Add ``user``, or replace its credentials and admin flag (keeping its
        rights); ``initial``: the first start's admin, which replaces the default
        ``guest``, and is ignored once the table is explicit.

        Returns whether the user was new.
        """
        if initial:
            if self.explicit:
                return False
            self._users = {}
        self.explicit = True
        self.version += 1
        old = self._users.get(user.name)
        if old is not None and not initial:
            # A new password or admin flag keeps the rights already set.
            user = replace(user, configure=old.configure, write=old.write, read=old.read,
                           lead=old.lead, tags=old.tags, limits=old.limits)
        self._users[user.name] = user
        return old is None

    def delete(self, name: str) -> bool:
        """Remove ``name``. Returns whether it existed.

        Raises:
            InvalidArgument: it is the last admin (nobody could manage users then).
        """
        user = self._users.get(name)
        if user is None:
            return False
        if user.admin and sum(1 for u in self._users.values() if u.admin) == 1:
            raise InvalidArgument(f"{name!r} is the last admin user: add another admin first")
        self.explicit = True
        self.version += 1
        del self._users[name]
        return True

    def set_rights(self, name: str, patterns: dict[str, str]) -> None:
        """Set the rights of ``name`` (one pattern per right given).

        Raises:
            InvalidArgument: no such user, an unknown right or a bad pattern.
        """
        user = self._users.get(name)
        if user is None:
            raise InvalidArgument(f"no user {name!r}")
        for right, pattern in patterns.items():
            if right not in RIGHTS:
                raise InvalidArgument(f"unknown right {right!r} (rights: {', '.join(RIGHTS)})")
            check_pattern(right, pattern)
        self.explicit = True
        self.version += 1
        merged = {r: patterns.get(r, getattr(user, r)) for r in RIGHTS}
        self._users[name] = replace(
            user, configure=merged["configure"], write=merged["write"], read=merged["read"],
            lead=merged["lead"],
        )

    def set_tags(self, name: str, tags: tuple[str, ...]) -> None:
        """Set the tags of ``name`` (all of them: the others go).

        Raises:
            InvalidArgument: no such user or an unknown tag.
        """
        user = self._users.get(name)
        if user is None:
            raise InvalidArgument(f"no user {name!r}")
        tags = check_tags(tags)
        self.explicit = True
        self.version += 1
        self._users[name] = replace(user, tags=tags)

    def set_limits(self, name: str, limits: dict[str, int | None]) -> None:
        """Set limits of ``name``, or the cluster's default for non-admins when ``name``
        is "" (one value per limit given; None: back to the default).

        Raises:
            InvalidArgument: no such user, an unknown limit or a bad value.
        """
        check_limits(limits)
        user = self._users.get(name)
        if name == "":
            merged = dict(self.default_limits)
        elif user is None:
            raise InvalidArgument(f"no user {name!r}")
        else:
            merged = dict(user.limits)
        for key, value in limits.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        self.explicit = True
        self.version += 1
        if user is None:
            self.default_limits = merged
        else:
            self._users[name] = replace(user, limits=tuple(sorted(merged.items())))

    def limit(self, name: str, key: str) -> int | None:
        """The limit ``key`` (one of :data:`LIMITS`) that applies to user ``name``: its
        own, else for a non-admin the cluster's default; None: no limit."""
        user = self._users.get(name)
        if user is None:
            return None
        own = dict(user.limits).get(key)
        if own is None and not user.admin:
            own = self.default_limits.get(key, DEFAULT_LIMITS.get(key))
        return None if own is None or own == UNLIMITED else own

    def defaults(self) -> dict[str, int | None]:
        """The limits a non-admin user without its own has (None: no limit)."""
        out: dict[str, int | None] = {}
        for key in LIMITS:
            value = self.default_limits.get(key, DEFAULT_LIMITS.get(key))
            out[key] = None if value is None or value == UNLIMITED else value
        return out

    def snapshot(self) -> list[Any] | None:
        """None while the table is the default (so older snapshots read the same)."""
        if not self.explicit:
            return None
        snap: list[Any] = [self._users[n].snapshot() for n in sorted(self._users)]
        if self.default_limits:
            # A map after the users' lists, only once a default was set (docs/design.md §15).
            snap.append({"default_limits": sorted([k, v] for k, v in self.default_limits.items())})
        return snap

    def restore(self, snap: list[Any] | None) -> None:
        self.version += 1
        self.default_limits = {}
        if snap is None:
            self.explicit = False
            self._users = {GUEST: _guest()}
        else:
            self.explicit = True
            users = [s for s in snap if isinstance(s, list)]
            for extra in snap:
                if isinstance(extra, dict):
                    self.default_limits = {k: v for k, v in extra.get("default_limits", ())}
            self._users = {u.name: u for u in (User.restore(s) for s in users)}


def check_queue_limit(
    users: Users, queues: Mapping[str, Any], queue: str, user: str | None,
    ignore: Callable[[str], None],
) -> None:
    """A new queue ``queue`` of ``user`` within the user's ``max_queues``
    (docs/security.md "Per-user limits"): decided by the state, in log order, so every
    replica decides alike (``queues``: the state's, each with its ``user``).

    Raises:
        LimitExceeded: the user has that many queues already (counted ``user-limit``).
    """
    if queue in queues or user is None:
        return
    # A scan (no derived count to keep in step with every way a queue goes): only
    # for a new queue of a user with a limit.
    check_queue_count(users, user, (q.user for q in queues.values()), ignore)


def check_queue_count(
    users: Users, user: str, owners: Iterable[str | None], ignore: Callable[[str], None]
) -> None:
    """One more queue of ``user`` within its ``max_queues``, the users of the queues
    that count being ``owners`` (read only if the user has a limit).

    Raises:
        LimitExceeded: the user has that many queues already (counted ``user-limit``).
    """
    limit = users.limit(user, "max_queues")
    if limit is None:
        return
    held = sum(1 for u in owners if u == user)
    if held >= limit:
        ignore("user-limit")
        raise LimitExceeded(
            f"user {user!r} has {held} queues, its limit (max_queues {limit}): delete"
            " some, or an admin raises it (baton user limits)"
        )
