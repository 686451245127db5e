"""The admin HTTP listener: metrics, health and a JSON API, in the broker's process
(docs/admin.md; docs/design.md §1).

``baton serve --admin-listen HOST:PORT`` starts it (it is off by default). It runs on the
broker's own event loop with aiohttp and costs nothing per message: every answer is read
from the state this broker has applied, when asked (broker/metrics.py for ``/metrics``).
Writes (declare, delete, purge, handover, deregister, enabling feature flags) are
submitted to the log like the native protocol's commands and answered once applied here.

Access is decided in two middlewares, before any handler: :func:`_guard` serves only
peers in ``admin_allow_from`` (:func:`access_refusal`; loopback by default, anyone else
gets 403) and adds the headers every answer carries (no framing, no sniffing);
:meth:`AdminLogin.middleware <batonmq.broker.admin_login.AdminLogin.middleware>` then
checks the ``Host`` and ``Origin`` headers (broker/admin_auth.py: a DNS-rebinding or
cross-origin page gets 403), who is asking
(HTTP Basic, or the console's session cookie; the users and their passwords are the
cluster's, checked as AMQP's plain passwords are) and, for a state-changing request,
the session's CSRF token or the ``X-Baton-Request`` header. Each handler then checks
the user's rights as the native protocol does (broker/access.py), plus the
``monitoring`` tag for ``/metrics`` and the read-only statistics. ``/healthz``,
``/readyz``, the console's files and the login itself need no login.

Routes (every body JSON; errors are ``{"error": {"code", "name", "message"}}``):

* ``GET /`` and ``GET /console/{file}``: the web console, plain HTML, CSS and JS shipped
  as package data in ``broker/console/`` that polls the JSON API (no build step, nothing
  loaded from elsewhere);
* ``GET /healthz``, ``GET /readyz``, ``GET /metrics``;
* ``POST /api/login``, ``POST /api/logout``, ``GET /api/session`` (the console's login);
* ``/api/users[/{name}[/limits|/tags]]``, ``/api/limits`` (admin);
* ``/api/overview``, ``/api/nodes``, ``/api/queues[/{name}[/purge|/peek|
  /messages/{position}/history]]``, ``/api/connections[/{id}]``, ``/api/consumers``,
  ``/api/services[/{name}/handover|/{name}/candidates/{candidate}]``, ``/api/log``,
  ``/api/features[/enable]``;
* ``/api/exchanges``, ``/api/bindings/e/{source}/q|e/{name}`` (broker/admin_exchanges.py);
* ``/api/policies[/{name}]`` (broker/admin_policies.py); ``/api/bindings``,
  ``/api/exchanges/{name}/publish``, ``/api/queues/{name}/publish``,
  ``/api/queues/{name}/get`` (broker/admin_messages.py).
"""

from __future__ import annotations

import asyncio
import base64
import importlib.resources
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from aiohttp import web

from batonmq.broker.access import limits_event, list_users, tags_event
from batonmq.broker.admin_auth import REQUEST_HEADER
from batonmq.broker.admin_messages import MessageRoutes
from batonmq.broker.admin_policies import PolicyRoutes
from batonmq.broker.admin_login import (
    ACTOR,
    AdminLogin,
    LoginRequired,
    error_response,
    json_response,
    request_body,
)
from batonmq.broker.config import BrokerConfig
from batonmq.broker.admin_exchanges import ExchangeRoutes
from batonmq.broker.delivery import Delivery
from batonmq.broker.features import enable_event, feature_list
from batonmq.broker.history import message_history
from batonmq.broker.inspect import MAX_PEEK, ConnectionView, list_connections, peek
from batonmq.broker.log_ends import LOG_QUERY_TIMEOUT, apply_lag, partition_log_ends
from batonmq.broker.metrics import CONTENT_TYPE, BrokerMetrics
from batonmq.broker.networks import LOOPBACK, Networks, allows, describe, parse_networks
from batonmq.broker.session import check_declare, declare_event
from batonmq.cluster.errors import (
    AccessRefused,
    BatonError,
    ExchangeNotFound,
    InternalError,
    InvalidArgument,
    LogUnavailable,
    QueueExists,
    QueueNotFound,
    ShuttingDown,
    Timeout,
    UnknownConsumer,
)
from batonmq.cluster.events import DeleteQueue, Event, Handover, PurgeQueue, Resign
from batonmq.cluster.features import FEATURES
from batonmq.cluster.node import Node
from batonmq.cluster.partitioned import Partitioned
from batonmq.cluster.queues import validate_declare
from batonmq.cluster.results import Result
from batonmq.cluster.services import host_of

__all__ = [
    "AdminBroker",
    "AdminServer",
    "CONSOLE_FILES",
    "READY_MAX_LAG",
    "access_refusal",
    "console_file",
    "readiness",
]

log = logging.getLogger("baton.admin")

#: /readyz says "not caught up" while more log records than this wait to be applied here.
READY_MAX_LAG = 10_000

#: The web console's files (package data in ``broker/console/``) and their content types.
CONSOLE_FILES = {
    "index.html": "text/html",
    "console.js": "text/javascript",
    "console.css": "text/css",
}

# The console loads only its own files and talks only to this listener: a name that
# slipped past the console's escaping still could not load or run anything else.
_CONSOLE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
        " img-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
    "Referrer-Policy": "no-referrer",
}

# Every answer: never framed (clickjacking), never sniffed into another content type.
_SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
}
_FRAME_CSP = "frame-ancestors 'none'"
_error = error_response

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
R = TypeVar("R", bound="Result | None")


class AdminBroker(Protocol):
    """What the admin listener needs of the broker (broker/server.py's ``Broker``)."""

    @property
    def config(self) -> BrokerConfig:
        """The broker's settings."""
        ...

    @property
    def version(self) -> str:
        """The broker's version."""
        ...

    @property
    def address(self) -> str:
        """The client listener's ``HOST:PORT``."""
        ...

    @property
    def node(self) -> Node:
        """The replica."""
        ...

    @property
    def delivery(self) -> Delivery:
        """This broker's consumers."""
        ...

    def connections(self) -> Iterable[ConnectionView]:
        """The open client sessions."""
        ...

    def close_connection(self, peer: str) -> bool:
        """Close the client connection from ``peer``; False if there is none."""
        ...

    def queue_stats(self, name: str) -> dict[str, Any]:
        """One queue's stats (raises QueueNotFound)."""
        ...

    def list_queues(self) -> list[dict[str, Any]]:
        """Every queue's stats."""
        ...

    async def current_topology(self) -> dict[str, Any]:
        """The Topology answer, with each data partition's lag (its log end read first)."""
        ...

    def connection_count(self) -> int:
        """Open client connections."""
        ...

    def refused(self, what: str) -> None:
        """Count one refusal (``what``: "login", "admin" or a right)."""
        ...


#: The networks the admin listener serves (``admin_allow_from``), kept in the application.
ALLOWED: web.AppKey[Networks] = web.AppKey("allowed", tuple)


def access_refusal(peer: str | None, networks: Networks = LOOPBACK) -> str | None:
    """Why a request from ``peer`` (its IP address) is refused, or None to serve it.

    The one access check of the admin listener: only peers in ``networks`` (the
    broker's ``admin_allow_from``, loopback by default).
    """
    if not peer:
        return "the admin API cannot tell the peer's address"
    if not allows(networks, peer):
        return f"the admin API serves {describe(networks)} only, not {peer} (admin_allow_from)"
    return None


def console_file(name: str) -> bytes:
    """The content of one of the web console's files (``CONSOLE_FILES``), read from the
    installed package (importlib.resources: works from a wheel as from the source tree).

    Raises:
        KeyError: ``name`` is not one of the console's files.
    """
    if name not in CONSOLE_FILES:
        raise KeyError(name)
    return importlib.resources.files("batonmq.broker").joinpath("console", name).read_bytes()


def readiness(
    node: Node, log_end: int | None, partition_ends: dict[int, int | None] | None = None
) -> dict[str, Any]:
    """The /readyz answer: ready when this broker is a member of the view, applying
    (healthy) and caught up with the log (at most READY_MAX_LAG records behind). A broker
    that stopped applying for good (a record its build cannot read, an internal error)
    is never ready: ``reasons`` says why. On a log of several partitions, every data
    partition (``partition_ends``: each one's log end, broker/log_ends.py) is held to
    the same, and a partition control recorded that is not open here yet (growing N)
    keeps it not ready; their reasons start with ``data partition K:``."""
    member = node.joined.is_set()
    healthy = node.healthy
    applied = node.state.applied
    lag = apply_lag(log_end, applied)
    reasons = _not_ready(node, lag)
    ends = partition_ends or {}
    for part in node.parts()[1:]:
        part_lag = apply_lag(ends.get(part.partition), part.state.applied)
        reasons.extend(
            f"data partition {part.partition}: {why}" for why in _not_ready(part, part_lag)
        )
    if isinstance(node, Partitioned) and node.growth.missing:
        reasons.append(node.growth.problem or "data partition(s) "
                       f"{', '.join(map(str, node.growth.missing))} not open here yet")
    # A group short of a majority is the cluster's problem, not this broker's: said, and
    # the broker stays ready (docs/operations.md "Replica groups").
    short = node.replication.short_of_majority() if isinstance(node, Partitioned) else []
    warnings = [f"data partition {k}: {live} of {size} replicas live, fewer than a majority"
                for k, live, size in short]
    return {
        "ready": not reasons,
        "member": member,
        "healthy": healthy,
        "applied": applied,
        "log_end": log_end,
        "lag": lag,
        "apply_stopped": node.applier.stopped,
        "reasons": reasons,
        "warnings": warnings,
    }


def _not_ready(node: Node, lag: int | None) -> list[str]:
    """Why one partition's node keeps this broker from being ready (none: it does not)."""
    reasons = []
    if not node.joined.is_set():
        reasons.append("not a member of the established view (joining, or dropped)")
    if node.applier.stopped:
        # For good, until a restart (an upgrade, for a record this build cannot read).
        reasons.append(node.health.problem or "stopped applying the log (see its log)")
    elif not node.healthy:
        reasons.append(node.health.problem or "cannot read or write the log, or write the store")
    if node.catchup is not None:
        reasons.append("a join update is still bringing queues here")
    if lag is None:
        reasons.append("the log's end is unknown")
    elif lag > READY_MAX_LAG:
        reasons.append(f"{lag} log records behind")
    return reasons


def _status_of(exc: BatonError) -> int:
    match exc:
        case LoginRequired():
            return 401
        case AccessRefused():
            return 403
        case QueueNotFound() | UnknownConsumer() | ExchangeNotFound():
            return 404
        case InvalidArgument():
            return 400
        case QueueExists():
            return 409
        case LogUnavailable() | ShuttingDown() | Timeout():
            return 503
        case InternalError():
            return 500
        case _:  # the command is valid but the state refuses it (NotOwner, QueueReserved...)
            return 409


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The network check, then JSON errors for everything the handlers raise, and the
    headers every answer carries."""
    response = await _guarded(request, handler)
    for name, value in _SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    csp = response.headers.get("Content-Security-Policy")
    if csp is None:
        response.headers["Content-Security-Policy"] = _FRAME_CSP
    elif "frame-ancestors" not in csp:
        response.headers["Content-Security-Policy"] = f"{csp}; {_FRAME_CSP}"
    if request.path.startswith("/api/"):
        response.headers.setdefault("Cache-Control", "no-store")
    return response


async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        networks = request.app[ALLOWED]
    except (KeyError, TypeError):  # an application made without it (tests): loopback
        networks = LOOPBACK
    refusal = access_refusal(request.remote, networks)
    if refusal is not None:
        return _error(403, "Forbidden", refusal)
    try:
        return await handler(request)
    except LoginRequired as exc:
        response = _error(401, "LoginRequired", exc.message, exc.code)
        # A browser's console asks with its own header and shows its own login form;
        # tools and Prometheus are told to use HTTP Basic.
        if request.headers.get(REQUEST_HEADER) != "console":
            response.headers["WWW-Authenticate"] = 'Basic realm="baton", charset="UTF-8"'
        return response
    except BatonError as exc:
        return _error(_status_of(exc), type(exc).__name__, exc.message, exc.code)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.reason, exc.text or exc.reason)
    except Exception as exc:  # a bug: answered, logged, the broker goes on
        log.exception("admin request %s %s failed", request.method, request.path)
        return _error(500, "InternalError", f"internal error: {exc!r}")


class AdminServer:
    """The admin HTTP listener of one broker.

    Args:
        broker: the broker it reports on and steers.
        metrics: the broker's metrics (broker/metrics.py).
    """

    def __init__(
        self, broker: AdminBroker, metrics: BrokerMetrics, tls: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.broker = broker
        self.metrics = metrics
        self.address = ""
        self.tls = tls
        self.logins = AdminLogin(broker, tls is not None, clock)
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        """The aiohttp application with every route (also used by tests)."""
        logins = self.logins
        app = web.Application(middlewares=[_guard, logins.middleware], client_max_size=1 << 20)
        app[ALLOWED] = parse_networks(self.broker.config.admin_allow_from)
        r = app.router
        r.add_post("/api/login", logins.login)
        r.add_post("/api/logout", logins.logout)
        r.add_get("/api/session", logins.session)
        r.add_get("/api/users", self.users)
        r.add_get("/api/users/{name}", self.user)
        r.add_put("/api/users/{name}/limits", self.set_limits)
        r.add_put("/api/users/{name}/tags", self.set_tags)
        r.add_get("/api/limits", self.default_limits)
        r.add_put("/api/limits", self.set_default_limits)
        r.add_get("/", self.console_index)
        r.add_get("/console/{file}", self.console_asset)
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/metrics", self.metrics_text)
        r.add_get("/api/overview", self.overview)
        r.add_get("/api/nodes", self.nodes)
        r.add_get("/api/queues", self.queues)
        r.add_get("/api/queues/{name}", self.queue)
        r.add_put("/api/queues/{name}", self.declare)
        r.add_delete("/api/queues/{name}", self.delete)
        r.add_post("/api/queues/{name}/purge", self.purge)
        r.add_get("/api/queues/{name}/peek", self.peek)
        r.add_get("/api/queues/{name}/messages/{position}/history", self.history)
        r.add_get("/api/connections", self.connections)
        r.add_delete("/api/connections/{id}", self.close_connection)
        r.add_get("/api/consumers", self.consumers)
        r.add_get("/api/services", self.services)
        r.add_post("/api/services/{name}/handover", self.handover)
        r.add_delete("/api/services/{name}/candidates/{candidate:.+}", self.deregister)
        r.add_get("/api/log", self.log_info)
        r.add_get("/api/features", self.features)
        r.add_post("/api/features/enable", self.enable_features)
        PolicyRoutes(self.broker.node).add_to(r)  # broker/admin_policies.py
        MessageRoutes(self.broker).add_to(r)  # broker/admin_messages.py
        ExchangeRoutes(lambda: self.broker.node).add(r)  # /api/exchanges, /api/bindings
        return app

    async def start(self, host: str, port: int) -> str:
        """Listen on ``host:port`` (0: any free port); returns the bound ``HOST:PORT``.

        Raises:
            InvalidArgument: the address cannot be listened on.
        """
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=self.tls)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise InvalidArgument(
                f"cannot listen for admin on {host}:{port}: {exc.strerror or exc}"
            ) from exc
        self._runner = runner
        bound = runner.addresses[0]
        self.address = f"{bound[0]}:{bound[1]}"
        self.logins.hosts.port = int(bound[1])
        log.info("admin listener on %s://%s", "https" if self.tls else "http", self.address)
        return self.address

    async def stop(self) -> None:
        """Stop listening and end open requests."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # -- helpers ----------------------------------------------------------------------

    async def _log_end(self) -> int | None:
        try:
            async with asyncio.timeout(LOG_QUERY_TIMEOUT):
                return await self.broker.node.log.end_offset()
        except Exception:  # the log is down or slow: the answer says so instead of failing
            return None

    async def _submit(self, event: Event[R]) -> R:
        return await self.broker.node.submit(event)

    @staticmethod
    def _int_query(request: web.Request, name: str, default: int) -> int:
        text = request.query.get(name)
        if text is None:
            return default
        try:
            return int(text)
        except ValueError:
            raise InvalidArgument(f"{name} must be an integer, not {text!r}") from None

    # -- the web console -------------------------------------------------------------------

    async def console_index(self, request: web.Request) -> web.Response:
        return self._console("index.html")

    async def console_asset(self, request: web.Request) -> web.Response:
        name = request.match_info["file"]
        if name not in CONSOLE_FILES or name == "index.html":
            raise web.HTTPNotFound(text=f"no console file {name!r}")
        return self._console(name)

    @staticmethod
    def _console(name: str) -> web.Response:
        return web.Response(
            body=console_file(name),
            content_type=CONSOLE_FILES[name],
            charset="utf-8",
            headers=_CONSOLE_HEADERS,
        )

    # -- health and metrics ---------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        node = self.broker.node
        return json_response(
            {"status": "ok", "node_id": node.node_id, "runtime": node.runtime_id,
             "version": self.broker.version}
        )

    async def readyz(self, request: web.Request) -> web.Response:
        node = self.broker.node
        log_end, ends = await asyncio.gather(self._log_end(), partition_log_ends(node))
        body = readiness(node, log_end, ends)
        return json_response(body, 200 if body["ready"] else 503)

    async def metrics_text(self, request: web.Request) -> web.Response:
        request[ACTOR].check_monitor("read the metrics")
        # Control's end and each data partition's together: one deadline for the scrape.
        log_end, ends = await asyncio.gather(
            self._log_end(), partition_log_ends(self.broker.node)
        )
        text = self.metrics.render(log_end, ends)
        return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE})

    # -- the cluster ---------------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        b = self.broker
        node = b.node
        ms = node.state.membership
        log_end, ends = await asyncio.gather(self._log_end(), partition_log_ends(node))
        return json_response(
            {
                "node_id": node.node_id,
                "runtime": node.runtime_id,
                "version": b.version,
                "address": b.address,
                "admin_address": self.address,
                "role": node.role,
                "cluster_id": ms.cluster_id,
                "view": ms.view_seq,
                "leader": ms.leader(),
                "is_leader": ms.leader() == node.key,
                "members": len(ms.members),
                "readiness": readiness(node, log_end, ends),
                "queues": len(node.queues),
                "messages_ready": sum(q.ready for q in node.queues.values()),
                "messages_acquired": sum(len(q.acquired) for q in node.queues.values()),
                "connections": b.connection_count(),
                "consumers": sum(len(v) for v in b.delivery.by_queue.values()),
                "services": len(node.state.services.services),
                "digest_mismatches": node.digest_mismatches,
            }
        )

    async def nodes(self, request: web.Request) -> web.Response:
        actor = request[ACTOR]
        body = await self.broker.current_topology()
        if not actor.monitors():  # the members' addresses: admins and monitoring only
            body = actor.rights.topology(body)
        # Suspicion is replicated (docs/design.md §7): a member silent for its beats is
        # suspected on every replica before a new view drops it; the console shows it.
        ms = self.broker.node.state.membership
        for instance in body["instances"]:
            instance["suspected"] = ms.suspected(f"{instance['node_id']}/{instance['runtime']}")
        return json_response(body)

    # -- queues --------------------------------------------------------------------------

    def _with_counts(self, stats: dict[str, Any]) -> dict[str, Any]:
        """A queue's stats plus the counters /metrics has and the native stats do not
        (delivered, released, rejected), so the console computes its rates from one answer."""
        q = self.broker.node.queues.get(stats["queue"])
        if q is not None:
            stats.update(delivered=q.delivered, released=q.released, rejected=q.rejected)
        return stats

    async def queues(self, request: web.Request) -> web.Response:
        # As the native ListQueues: the queues the user has any right on (a monitoring
        # user, as an admin, sees them all).
        actor = request[ACTOR]
        every = actor.monitors()
        return json_response({"queues": [
            self._with_counts(s) for s in self.broker.list_queues()
            if every or actor.rights.sees(s["queue"])
        ]})

    async def queue(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        actor = request[ACTOR]
        if not actor.monitors():
            actor.rights.check_any(name)
        return json_response(self._with_counts(self.broker.queue_stats(name)))

    async def declare(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await request_body(request)
        actor = request[ACTOR]
        check_declare(actor.rights, name, body)
        event = declare_event(name, body, actor.rights.name, self.broker.node.state)
        validate_declare(event)
        result = await self._submit(event)
        return json_response(result, 200)

    async def delete(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        request[ACTOR].rights.check("configure", name)
        return json_response(await self._submit(DeleteQueue(name)))

    async def purge(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        request[ACTOR].rights.check("configure", name)
        return json_response(await self._submit(PurgeQueue(name)))

    async def peek(self, request: web.Request) -> web.Response:
        request[ACTOR].rights.check("read", request.match_info["name"])
        count = self._int_query(request, "count", 10)
        peeked = peek(self.broker.node, request.match_info["name"], count)
        return json_response(
            {
                "queue": peeked.queue,
                "messages": [
                    {
                        "position": p,
                        "delivery_count": n,
                        "body": base64.b64encode(body).decode(),
                        "body_utf8": _utf8(body),
                        "headers": headers,
                        "publish_time_ms": t,
                    }
                    for p, n, body, headers, t in peeked.messages
                ],
                "max_count": MAX_PEEK,
            }
        )

    async def history(self, request: web.Request) -> web.Response:
        request[ACTOR].rights.check("read", request.match_info["name"])
        try:
            position = int(request.match_info["position"])
        except ValueError:
            raise InvalidArgument("position must be an integer") from None
        limit = self._int_query(request, "max_records", 0)
        result = await message_history(
            self.broker.node, request.match_info["name"], position, max_records=limit or None
        )
        return json_response(result)

    # -- connections and consumers -------------------------------------------------------

    async def connections(self, request: web.Request) -> web.Response:
        request[ACTOR].check_monitor("list connections")
        return json_response(list_connections(self.broker.connections()))

    async def close_connection(self, request: web.Request) -> web.Response:
        request[ACTOR].rights.check_admin("close connections")
        peer = request.match_info["id"]
        if not self.broker.close_connection(peer):
            return _error(404, "UnknownConnection", f"no client connection {peer!r} here")
        return json_response({"closed": peer})

    async def consumers(self, request: web.Request) -> web.Response:
        request[ACTOR].check_monitor("list consumers")
        listed = list_connections(self.broker.connections())
        rows = [
            {"connection": c["id"], "client_name": c["client_name"], **consumer}
            for c in listed.connections
            for consumer in c["consumers"]
        ]
        return json_response({"consumers": rows})

    # -- services ------------------------------------------------------------------------

    async def services(self, request: web.Request) -> web.Response:
        return json_response({"services": self.broker.node.state.services.describe()})

    async def handover(self, request: web.Request) -> web.Response:
        body = await request_body(request)
        to = body.get("to", "") or ""
        if not isinstance(to, str):
            raise InvalidArgument("'to' must be a candidate key or node id")
        name = request.match_info["name"]
        request[ACTOR].rights.check("lead", name)
        if self.broker.node.state.services.get(name) is None:
            return _error(404, "UnknownService", f"no service {name!r}")
        return json_response(await self._submit(Handover(name, to)), 202)

    async def deregister(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        request[ACTOR].rights.check("lead", name)
        candidate = request.match_info["candidate"]
        s = self.broker.node.state.services.get(name)
        if s is None or candidate not in s.candidates:
            return _error(404, "UnknownCandidate", f"{candidate!r} is no candidate of {name!r}")
        node = self.broker.node
        host = host_of(candidate)
        if host != node.key:
            # Only the broker that hosts a candidate may resign it (docs/design.md §7).
            member = node.state.membership.known.get(host)
            where = f" at {member.address}" if member is not None and member.address else ""
            raise InvalidArgument(
                f"candidate {candidate!r} is hosted by broker {host}{where}: ask its admin"
                " listener"
            )
        return json_response(await self._submit(Resign(name, candidate)))

    # -- feature flags (broker/features.py, docs/operations.md "Upgrading") -----------------

    async def features(self, request: web.Request) -> web.Response:
        return json_response(feature_list(self.broker.node.state))

    async def enable_features(self, request: web.Request) -> web.Response:
        """``{"names": [...]}`` or ``{"all": true}``: the checks and the words of the
        native ``EnableFeatures``; a live member that lacks a flag is a conflict (409),
        a malformed body or an unknown flag a bad request (400)."""
        request[ACTOR].rights.check_admin("enable feature flags")
        body = await request_body(request)
        if set(body) - {"names", "all"} or ("names" in body) == ("all" in body):
            raise InvalidArgument('give {"names": [flag, ...]} or {"all": true}')
        if "all" in body and body["all"] is not True:
            raise InvalidArgument('"all" must be true (or name the flags in "names")')
        names = None if "all" in body else body["names"]
        known = names is None or (
            isinstance(names, list) and bool(names)
            and all(isinstance(n, str) and n in FEATURES for n in names)
        )
        try:
            # Checked here first, then again by every replica in log order (a member
            # that joined meanwhile): either refusal names the members lacking a flag.
            result = await self._submit(enable_event(self.broker.node.state, names))
        except InvalidArgument as exc:
            if known:  # well-formed and known flags: refused for a member that lacks one
                return _error(409, type(exc).__name__, exc.message, exc.code)
            raise
        return json_response(result)

    # -- users (admin only; docs/security.md) ------------------------------------------------

    async def users(self, request: web.Request) -> web.Response:
        request[ACTOR].rights.check_admin("list users")
        users = self.broker.node.state.users
        return json_response({"users": list_users(users).users, "default_limits": users.defaults()})

    async def user(self, request: web.Request) -> web.Response:
        request[ACTOR].rights.check_admin("list users")
        user = self.broker.node.state.users.get(request.match_info["name"])
        if user is None:
            return _error(404, "UnknownUser", f"no user {request.match_info['name']!r}")
        return json_response(user.describe())

    async def set_limits(self, request: web.Request) -> web.Response:
        """``{"max_queues": N|-1|null, ...}``: a user's limits (null: the default)."""
        request[ACTOR].rights.check_admin("manage users")
        name = request.match_info["name"]
        event = limits_event(name, await request_body(request), self.broker.node.state)
        return json_response(await self._submit(event))

    async def default_limits(self, request: web.Request) -> web.Response:
        request[ACTOR].rights.check_admin("list users")
        return json_response(self.broker.node.state.users.defaults())

    async def set_default_limits(self, request: web.Request) -> web.Response:
        """``{"max_queues": N|-1|null, ...}``: the cluster's default for non-admins."""
        request[ACTOR].rights.check_admin("manage users")
        event = limits_event("", await request_body(request), self.broker.node.state)
        return json_response(await self._submit(event))

    async def set_tags(self, request: web.Request) -> web.Response:
        """``{"tags": ["monitoring"]}``: a user's tags (all of them)."""
        request[ACTOR].rights.check_admin("manage users")
        body = await request_body(request)
        tags = body.get("tags")
        if set(body) != {"tags"} or not isinstance(tags, list):
            raise InvalidArgument('give {"tags": [tag, ...]}')
        event = tags_event(request.match_info["name"], tags, self.broker.node.state)
        return json_response(await self._submit(event))

    # -- the log ----------------------------------------------------------------------------

    async def log_info(self, request: web.Request) -> web.Response:
        request[ACTOR].check_monitor("read the log's figures")
        node = self.broker.node
        try:
            async with asyncio.timeout(LOG_QUERY_TIMEOUT):
                start: int | None = await node.log.start_offset()
        except Exception:  # as in _log_end
            start = None
        end = await self._log_end()
        return json_response(
            {
                "url": node.log.url,
                "start": start,
                "end": end,
                "applied": node.state.applied,
                "lag": None if end is None else max(0, end - 1 - node.state.applied),
                "checkpoint_ms": node.checkpoint_ms,
                "last_checkpoint": node.last_checkpoint,
                "checkpoints": [
                    {"offset": o, "digest": d} for o, d in node.state.checkpoints
                ],
                "truncated_before": node.truncated_before,
                "outbox": node.appender.outbox_depth,
            }
        )


def _utf8(body: bytes) -> str | None:
    try:
        return body.decode()
    except UnicodeDecodeError:
        return None
