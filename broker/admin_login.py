"""Who asks the admin HTTP listener, and from which page (docs/admin.md "Logging in";
docs/security.md "The admin listener").

:class:`AdminLogin` is the listener's second middleware, after the network check: it
checks the ``Host`` and ``Origin`` headers (broker/admin_auth.py), who is asking (HTTP
Basic for tools and Prometheus, or the console's session cookie; the users are the
cluster's and their passwords are checked as AMQP's PLAIN logins are, by
broker/access.py), and that a state-changing request carries the session's CSRF token
or the ``X-Baton-Request`` header. It also serves ``POST /api/login``,
``POST /api/logout`` and ``GET /api/session``. Each handler of broker/admin.py then
checks the request's :class:`Actor` for the rights its command needs.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from batonmq.broker.access import Rights, check_password_login
from batonmq.broker.admin_auth import (
    COOKIE,
    CSRF_HEADER,
    REQUEST_HEADER,
    BasicCache,
    HostCheck,
    Session,
    Sessions,
    basic_credentials,
)
from batonmq.broker.admission import QuietLog
from batonmq.broker.config import BrokerConfig
from batonmq.broker.networks import LOOPBACK, allows
from batonmq.cluster.errors import BatonError, InvalidArgument
from batonmq.cluster.node import Node
from batonmq.cluster.users import GUEST, User

__all__ = [
    "ACTOR",
    "Actor",
    "AdminLogin",
    "LoginRequired",
    "error_response",
    "json_response",
    "request_body",
]

log = logging.getLogger("baton.admin")

# What needs no login: the probes, the console's own files (they hold no data; the page
# logs in through the API), the login itself, and who is logged in.
_OPEN = frozenset({"/healthz", "/readyz", "/", "/api/login", "/api/session"})
_STATE_CHANGING = frozenset({"POST", "PUT", "DELETE", "PATCH"})
# Refused admin logins are logged at most once a second, as the native port's are.
_log_refusal = QuietLog(log, "admin login refused")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class LoginBroker(Protocol):
    """What the logins need of the broker (broker/server.py's ``Broker``)."""

    @property
    def config(self) -> BrokerConfig:
        """The broker's settings."""
        ...

    @property
    def node(self) -> Node:
        """The replica (its users)."""
        ...

    def refused(self, what: str) -> None:
        """Count one refusal (``what``: "login", "network", "csrf", or a right)."""
        ...


class LoginRequired(BatonError):
    """No login, or a wrong one (401)."""

    code = 18


@dataclass(slots=True)
class Actor:
    """Who a request acts as: the user's rights (read from the state at each check, as
    a native session's), and the console session it came with, if any."""

    rights: Rights
    session: Session | None = None
    token: str | None = None

    def user(self) -> User:
        return self.rights.user()

    def check_monitor(self, what: str) -> None:
        """An admin or a ``monitoring`` user only (AccessRefused otherwise)."""
        self.rights.check_monitoring(what)

    def monitors(self) -> bool:
        user = self.user()
        return user.admin or user.monitoring


#: The request's key for its :class:`Actor`.
ACTOR: web.RequestKey[Actor] = web.RequestKey("actor", Actor)


def _json_default(value: object) -> object:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def json_response(body: Any, status: int = 200) -> web.Response:
    """A JSON answer (bytes become base64 strings)."""
    return web.Response(
        text=json.dumps(body, default=_json_default),
        status=status,
        content_type="application/json",
    )


def error_response(status: int, name: str, message: str, code: int = 0) -> web.Response:
    """A JSON error: ``{"error": {"code", "name", "message"}}``."""
    return json_response({"error": {"code": code, "name": name, "message": message}}, status)


async def request_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object ({} without a body).

    Raises:
        InvalidArgument: not a JSON object.
    """
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError as exc:
        raise InvalidArgument(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return body


class AdminLogin:
    """The logins, sessions and cross-site checks of one admin listener.

    Args:
        broker: the broker whose users log in.
        tls: whether the listener serves HTTPS (its cookie is then ``Secure``).
        clock: monotonic seconds (sessions' idle time).
    """

    def __init__(
        self, broker: LoginBroker, tls: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.broker = broker
        self.tls = tls
        cfg = broker.config
        self.hosts = HostCheck(cfg.admin_allowed_hosts)
        self.sessions = Sessions(cfg.admin_session_idle, clock)
        self._basic = BasicCache()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The Host and Origin checks, the login, and the CSRF check, before any handler
        (after the network check of :func:`_guard`)."""
        path = request.path
        probe = path in ("/healthz", "/readyz")
        scheme = "https" if self.tls else "http"
        # The probes answer any Host: they tell nothing a rebinding page could use, and
        # a platform's probe names the broker as it likes.
        refusal = None if probe else self.hosts.host_refusal(request.headers.get("Host"))
        if refusal is None:
            refusal = self.hosts.origin_refusal(
                request.headers.get("Origin"), request.headers.get("Host"), scheme
            )
        if refusal is not None:
            self.broker.refused("network")
            return error_response(403, "Forbidden", refusal)
        if request.method in _STATE_CHANGING and path == "/api/login":
            if not request.headers.get(REQUEST_HEADER):
                return error_response(403, "Forbidden", f"a login needs the {REQUEST_HEADER} header")
        if probe or path in _OPEN or path.startswith("/console/"):
            return await handler(request)
        actor = await self._actor(request)
        if request.method in _STATE_CHANGING:
            refusal = self._csrf_refusal(request, actor)
            if refusal is not None:
                self.broker.refused("csrf")
                return error_response(403, "Forbidden", refusal)
        request[ACTOR] = actor
        return await handler(request)

    @staticmethod
    def _csrf_refusal(request: web.Request, actor: Actor) -> str | None:
        """Why a state-changing request is refused as a possible cross-site request, or
        None: with a session cookie it must carry the session's CSRF token, with HTTP
        Basic the ``X-Baton-Request`` header (neither can a page of another origin send)."""
        if actor.session is not None:
            token = request.headers.get(CSRF_HEADER, "")
            if not token or not hmac_equal(token, actor.session.csrf):
                return f"a state-changing request of a console session needs its {CSRF_HEADER} token"
            return None
        if not request.headers.get(REQUEST_HEADER):
            return (
                f"a state-changing request needs the header {REQUEST_HEADER}: 1 (any value;"
                " it shows that a tool, not a page of another site, sent it)"
            )
        return None

    def _loopback(self, request: web.Request) -> bool:
        return bool(request.remote) and allows(LOOPBACK, request.remote or "")

    async def _actor(self, request: web.Request) -> Actor:
        """Who the request logs in as: its HTTP Basic credentials, else its session
        cookie.

        Raises:
            LoginRequired: neither, or a wrong one.
        """
        try:
            basic = basic_credentials(request.headers.get("Authorization"))
        except ValueError as exc:
            self._refused_login(request, str(exc))
            raise LoginRequired(str(exc)) from None
        if basic is not None:
            name, password = basic
            user = await self._check_password(request, name, password)
            return Actor(Rights(lambda: self.broker.node.state.users, user.name, self.broker.refused))
        token = request.cookies.get(COOKIE)
        session = self.sessions.get(token, self._stored_key)
        if session is None:
            raise LoginRequired(
                "log in: HTTP Basic with a user of the cluster, or the console's login"
                + (" (the session ended: it was idle too long, logged out, or its user"
                   " changed)" if token else "")
            )
        return Actor(
            Rights(lambda: self.broker.node.state.users, session.user, self.broker.refused),
            session, token,
        )

    def _stored_key(self, name: str) -> bytes | None:
        user = self.broker.node.state.users.get(name)
        return None if user is None else user.stored_key

    async def _check_password(self, request: web.Request, name: str, password: str) -> User:
        """The user ``name`` if ``password`` is its password (the check AMQP's PLAIN
        login makes, off the event loop; a good one is remembered while the user's
        credentials stay the same).

        Raises:
            LoginRequired: a wrong user name or password (logged at most once a second,
                counted as a refused login), or guest from beyond loopback.
        """
        users = self.broker.node.state.users
        loopback = self._loopback(request)
        known = users.get(name)
        if known is not None and (loopback or known.name != GUEST) and self._basic.hit(
            name, password, known.stored_key
        ):
            return known
        loop = asyncio.get_running_loop()
        try:
            user = await loop.run_in_executor(
                None, check_password_login, users, name, password, loopback
            )
        except PermissionError as exc:
            self._refused_login(request, str(exc))
            raise LoginRequired(f"login refused: {exc}") from None
        self._basic.add(name, password, user.stored_key)
        return user

    def _refused_login(self, request: web.Request, why: str) -> None:
        self.broker.refused("login")
        _log_refusal(request.remote or "?", why)

    def _cookie(self, response: web.StreamResponse, token: str, max_age: int | None = None) -> None:
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="Strict", secure=self.tls,
            path="/", max_age=max_age,
        )

    async def login(self, request: web.Request) -> web.Response:
        """``{"user", "password"}``: a console session (its cookie set, its CSRF token in
        the answer) for a good password; 401 for a wrong one."""
        body = await request_body(request)
        name, password = body.get("user"), body.get("password")
        if not isinstance(name, str) or not isinstance(password, str) or not name:
            raise InvalidArgument('give {"user": NAME, "password": PASSWORD}')
        user = await self._check_password(request, name, password)
        token, session = self.sessions.start(user.name, user.stored_key)
        response = json_response(self._who(user, session))
        self._cookie(response, token)
        log.info("admin console login of %r from %s", user.name, request.remote)
        return response

    async def logout(self, request: web.Request) -> web.Response:
        """End the console session (with HTTP Basic there is nothing to end)."""
        actor = request[ACTOR]
        ended = self.sessions.end(actor.token)
        response = json_response({"logged_out": ended})
        if actor.token is not None:
            response.del_cookie(COOKIE, path="/")
        return response

    async def session(self, request: web.Request) -> web.Response:
        """Who is logged in (and the console session's CSRF token); ``{"user": null}``
        when nobody is (the console then shows its login form: not an error)."""
        try:
            actor = await self._actor(request)
        except LoginRequired:
            if request.headers.get("Authorization"):
                raise  # a wrong Basic login is refused as anywhere
            return json_response({"user": None, "admin": False, "monitoring": False,
                                  "tags": [], "csrf": None})
        return json_response(self._who(actor.user(), actor.session))

    @staticmethod
    def _who(user: User, session: Session | None) -> dict[str, Any]:
        return {
            "user": user.name, "admin": user.admin, "monitoring": user.monitoring,
            "tags": list(user.tags), "csrf": session.csrf if session is not None else None,
        }



def hmac_equal(a: str, b: str) -> bool:
    """Whether two tokens are equal, in constant time."""
    return hmac.compare_digest(a.encode(), b.encode())
