"""The admin API's policies (docs/admin.md "Policies"): ``GET /api/policies``,
``GET /api/policies/{name}``, ``PUT /api/policies/{name}`` and
``DELETE /api/policies/{name}``, checked by broker/policies.py as the native commands
are (the flag ``policies``, then the policy: a bad one is a 400 with one clear line and
nothing is written). Reading is open to every logged-in user, as ``baton policy list``
is; changing is an admin's (the login, CSRF and ``Origin`` checks of
broker/admin_login.py come first)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from batonmq.broker.admin_login import ACTOR, error_response, json_response, request_body
from batonmq.broker.policies import clear_policy_event, list_policies, set_policy_event
from batonmq.cluster.errors import InvalidArgument

if TYPE_CHECKING:
    from batonmq.cluster.node import Node

__all__ = ["PolicyRoutes"]

_BODY_KEYS = ("pattern", "definition", "priority", "apply_to")


class PolicyRoutes:
    """The policy routes of one admin listener, on the broker's ``node``."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def add_to(self, router: web.UrlDispatcher) -> None:
        """Register the routes."""
        router.add_get("/api/policies", self.list)
        router.add_get("/api/policies/{name}", self.get)
        router.add_put("/api/policies/{name}", self.put)
        router.add_delete("/api/policies/{name}", self.delete)

    async def list(self, request: web.Request) -> web.Response:
        return json_response({"policies": list_policies(self.node.state).policies})

    async def get(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        policy = self.node.state.policies.get(name)
        if policy is None:
            return error_response(404, "UnknownPolicy", f"no policy {name!r}")
        return json_response(policy.describe())

    async def put(self, request: web.Request) -> web.Response:
        """``{"pattern": RE, "definition": {...}, "priority": P, "apply_to": "queues"}``
        (priority and apply_to optional): add or replace the policy."""
        request[ACTOR].rights.check_admin("manage policies")
        body: dict[str, Any] = await request_body(request)
        unknown = sorted(k for k in body if k not in _BODY_KEYS)
        if unknown:
            raise InvalidArgument(
                f"unknown field {unknown[0]!r} (give pattern, definition, priority, apply_to)"
            )
        if "pattern" not in body or "definition" not in body:
            raise InvalidArgument("give at least pattern and definition")
        event = set_policy_event(
            self.node.state, request.match_info["name"], body["pattern"],
            body.get("apply_to", "queues"), body["definition"], body.get("priority", 0),
        )
        return json_response(await self.node.submit(event))

    async def delete(self, request: web.Request) -> web.Response:
        request[ACTOR].rights.check_admin("manage policies")
        name = request.match_info["name"]
        if "policies" in self.node.state.features.enabled and self.node.state.policies.get(name) is None:
            return error_response(404, "UnknownPolicy", f"no policy {name!r}")
        event = clear_policy_event(self.node.state, name)
        return json_response(await self.node.submit(event))
