"""Who may use the admin HTTP listener, and from which page (docs/admin.md "Logging in",
docs/security.md "The admin listener").

Pure parts, no aiohttp: broker/admin.py's middleware asks them about each request.

* :class:`HostCheck`: the ``Host`` header must name this listener (an IP address, a
  localhost name or a name the operator allowed); anything else is a DNS-rebinding page
  and gets 403. ``Origin``, when sent, must be this very origin.
* :class:`Sessions`: the console's logins, each a random cookie value with its own CSRF
  token, ended by an idle timeout or a logout, or when the user's password changes or
  the user is deleted.
* :class:`BasicCache`: HTTP Basic logins (tools, Prometheus) checked once with the
  password's scrypt work, then remembered while the user's credentials stay the same.

Passwords are checked by broker/access.py's ``check_password_login``, as AMQP's are.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = [
    "BasicCache",
    "COOKIE",
    "CSRF_HEADER",
    "HostCheck",
    "REQUEST_HEADER",
    "Session",
    "Sessions",
    "basic_credentials",
]

#: The console's session cookie.
COOKIE = "baton_session"
#: The header that carries a console session's CSRF token on a state-changing request.
CSRF_HEADER = "X-Baton-CSRF"
#: The header a tool sends on a state-changing request made with HTTP Basic (any
#: value): a page of another origin cannot send it without a CORS preflight, which
#: this listener never grants.
REQUEST_HEADER = "X-Baton-Request"
#: The most console sessions a broker keeps; the least recently used goes first.
MAX_SESSIONS = 10_000
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``(host, port)`` of a ``Host`` header or an origin's netloc (host lowercased,
    IPv6 without brackets); None if malformed."""
    value = value.strip().lower()
    if not value:
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = value.partition(":")
        if ":" in port_text:
            return None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return None
        return host, int(port_text)
    return host, None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class HostCheck:
    """Which ``Host`` and ``Origin`` headers this listener answers.

    A DNS-rebinding page reaches the listener under a host *name* the attacker controls;
    an IP address in ``Host`` cannot be such a page (its origin would be this listener
    itself), so IP addresses are answered, as are ``localhost`` names and the names the
    operator allows (``admin_allowed_hosts``: ``NAME`` for any port, ``NAME:PORT``, ``*``
    for any name at all, e.g. behind a proxy that checks it).

    Args:
        allowed: the ``admin_allowed_hosts`` setting (None: none).
        port: the listener's port (0 until bound).
    """

    def __init__(self, allowed: str | None, port: int = 0) -> None:
        self.port = port
        self.any = False
        self._names: set[str] = set()
        self._with_port: set[tuple[str, int]] = set()
        for item in (allowed or "").split(","):
            item = item.strip().lower()
            if not item:
                continue
            if item == "*":
                self.any = True
                continue
            split = _split_host(item)
            if split is None:
                continue
            host, port_ = split
            if port_ is None:
                self._names.add(host)
            else:
                self._with_port.add((host, port_))

    def host_refusal(self, host_header: str | None) -> str | None:
        """Why a request with this ``Host`` header is refused, or None."""
        if self.any:
            return None
        if not host_header:
            return "the request has no Host header"
        split = _split_host(host_header)
        if split is None:
            return f"the Host header {host_header[:100]!r} is malformed"
        host, port = split
        if port is not None and self.port and port != self.port and (host, port) not in self._with_port:
            return f"the Host header {host_header[:100]!r} names another port than this listener's"
        if (
            _is_ip(host) or host in _LOCAL_NAMES or host.endswith(".localhost")
            or host in self._names or (port is not None and (host, port) in self._with_port)
        ):
            return None
        return (
            f"the Host header {host_header[:100]!r} is not a name of this listener (a page"
            " of another site behind a DNS name?); operators allow names with"
            " admin_allowed_hosts"
        )

    @staticmethod
    def origin_refusal(origin: str | None, host_header: str | None, scheme: str) -> str | None:
        """Why a request with this ``Origin`` header is refused (it is not this very
        origin: ``scheme://Host``), or None (no Origin, or the same origin)."""
        if origin is None:
            return None
        try:
            parts = urlsplit(origin.strip())
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            return f"requests from origin {origin[:100]!r} are not served"
        default = 443 if scheme == "https" else 80
        mine = _split_host(host_header or "")
        theirs = _split_host(parts.netloc)
        if (
            mine is None or theirs is None or parts.scheme != scheme
            or (mine[0], mine[1] or default) != (theirs[0], theirs[1] or default)
        ):
            return (
                f"requests from origin {origin[:100]!r} are not served (cross-origin): only"
                " this listener's own pages may use it"
            )
        return None


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    """``(user, password)`` of an ``Authorization: Basic ...`` header; None if there is
    none or it is another scheme.

    Raises:
        ValueError: a Basic header that is not base64 of ``user:password``.
    """
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        text = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError("the Basic credentials are not base64 of user:password") from None
    user, sep, password = text.partition(":")
    if not sep:
        raise ValueError("the Basic credentials are not user:password")
    return user, password


@dataclass(slots=True)
class Session:
    """One console login."""

    user: str
    csrf: str
    #: The user's StoredKey at login: a new password ends the session.
    stored_key: bytes
    last: float


class Sessions:
    """The console's logins on this broker (not replicated: a cookie is good on the
    broker that made it).

    Args:
        idle: seconds a session lasts without a request.
        clock: monotonic seconds (a test's clock).
    """

    def __init__(self, idle: float, clock: Callable[[], float]) -> None:
        self.idle = idle
        self._clock = clock
        self._by_token: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_token)

    def start(self, user: str, stored_key: bytes) -> tuple[str, Session]:
        """A new session for ``user``: its cookie value and the session."""
        token = secrets.token_urlsafe(32)
        session = Session(user, secrets.token_urlsafe(32), stored_key, self._clock())
        self._by_token[token] = session
        while len(self._by_token) > MAX_SESSIONS:
            self._by_token.popitem(last=False)
        return token, session

    def get(self, token: str | None, stored_key: Callable[[str], bytes | None]) -> Session | None:
        """The live session of cookie value ``token`` (its idle clock restarted), or
        None: unknown, idle too long, or its user deleted or given a new password
        (``stored_key(user)``: the user's StoredKey now, None if deleted)."""
        if not token:
            return None
        session = self._by_token.get(token)
        if session is None:
            return None
        now = self._clock()
        key = stored_key(session.user)
        if now - session.last > self.idle or key is None or not hmac.compare_digest(key, session.stored_key):
            del self._by_token[token]
            return None
        session.last = now
        self._by_token.move_to_end(token)
        return session

    def end(self, token: str | None) -> bool:
        """End the session of cookie value ``token``; whether there was one."""
        return token is not None and self._by_token.pop(token, None) is not None


class BasicCache:
    """HTTP Basic logins already checked: a scrape every few seconds must not cost a
    scrypt each. An entry is keyed by the user and an HMAC of the password under a
    random key of this process (the password itself is not kept), and holds the user's
    StoredKey at the check: a new password, or a deleted user, makes it miss."""

    def __init__(self, size: int = 1024) -> None:
        self._key = os.urandom(32)
        self._size = size
        self._entries: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()

    def _id(self, user: str, password: str) -> tuple[str, bytes]:
        return user, hmac.new(self._key, password.encode("utf-8", "surrogatepass"),
                              hashlib.sha256).digest()

    def hit(self, user: str, password: str, stored_key: bytes | None) -> bool:
        """Whether this user and password were checked while the user's StoredKey was
        ``stored_key`` (None: no such user now)."""
        entry = self._id(user, password)
        known = self._entries.get(entry)
        if known is None or stored_key is None or not hmac.compare_digest(known, stored_key):
            return False
        self._entries.move_to_end(entry)
        return True

    def add(self, user: str, password: str, stored_key: bytes) -> None:
        self._entries[self._id(user, password)] = stored_key
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
