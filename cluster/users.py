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
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from batonmq.cluster.errors import InvalidArgument

__all__ = ["GUEST", "RIGHTS", "User", "Users", "check_pattern", "check_user_name"]

#: The default user's name (loopback only).
GUEST = "guest"
#: The rights a user has over names, in the order the wire and the snapshots list them.
RIGHTS = ("configure", "write", "read", "lead")
_ALL = ".*"
MAX_PATTERN = 1024

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

    def may(self, right: str, name: str) -> bool:
        """Whether this user has ``right`` (one of :data:`RIGHTS`) over ``name``."""
        if self.admin:
            return True
        pattern: str = getattr(self, right)
        return bool(pattern) and _compiled(pattern).fullmatch(name) is not None

    def describe(self) -> dict[str, Any]:
        """What ``baton user list`` shows (no credentials)."""
        return {"name": self.name, "admin": self.admin, **{r: getattr(self, r) for r in RIGHTS}}

    def snapshot(self) -> list[Any]:
        return [self.name, self.salt, self.cost, self.stored_key, self.server_key, self.admin,
                self.configure, self.write, self.read, self.lead]

    @classmethod
    def restore(cls, snap: list[Any]) -> User:
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
                           lead=old.lead)
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

    def snapshot(self) -> list[Any] | None:
        """None while the table is the default (so older snapshots read the same)."""
        if not self.explicit:
            return None
        return [self._users[n].snapshot() for n in sorted(self._users)]

    def restore(self, snap: list[Any] | None) -> None:
        self.version += 1
        if snap is None:
            self.explicit = False
            self._users = {GUEST: _guest()}
        else:
            self.explicit = True
            self._users = {u.name: u for u in (User.restore(s) for s in snap)}
