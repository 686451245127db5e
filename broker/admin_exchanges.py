"""The admin listener's exchanges and bindings (docs/admin.md "Exchanges and bindings").

* ``GET /api/exchanges``: the exchanges the user has any right on, each with its
  bindings to queues and to exchanges (as ``baton exchange list --json``);
* ``POST /api/bindings/e/{source}/q/{queue}``, ``POST /api/bindings/e/{source}/e/{destination}``:
  bind a queue, or an exchange (flag ``exchange_bindings``), to exchange ``source``,
  with the JSON body ``{"routing_key": "...", "arguments": {...}}`` (both optional);
  ``{"changed": bool}``;
* ``DELETE`` of the same paths, with the same body: remove that binding.

The paths are RabbitMQ's management API's, without the vhost. Each change goes through
:class:`~batonmq.broker.exchanges.ExchangeFacade` with the logged-in user's rights, as a
native session's (``write`` on the queue or the destination exchange, ``read`` on the
source), and answers once it is applied on this broker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from batonmq.broker.admin_login import ACTOR, json_response, request_body
from batonmq.broker.exchanges import ExchangeFacade
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.node import Node

__all__ = ["ExchangeRoutes"]


class ExchangeRoutes:
    """The handlers, on the node ``node()`` answers (the broker's, once it runs)."""

    def __init__(self, node: Callable[[], Node]) -> None:
        self._node = node

    def add(self, router: web.UrlDispatcher) -> None:
        """Add the routes to an admin application's router."""
        router.add_get("/api/exchanges", self.exchanges)
        path = "/api/bindings/e/{source}/{kind:[qe]}/{destination}"
        router.add_post(path, self.bind)
        router.add_delete(path, self.unbind)

    async def exchanges(self, request: web.Request) -> web.Response:
        actor = request[ACTOR]
        every = actor.monitors()
        return json_response({"exchanges": [
            x for x in self._node().state.exchanges.describe()
            if every or actor.rights.sees(x["exchange"])
        ]})

    async def bind(self, request: web.Request) -> web.Response:
        return await self._change(request, unbind=False)

    async def unbind(self, request: web.Request) -> web.Response:
        return await self._change(request, unbind=True)

    async def _change(self, request: web.Request, unbind: bool) -> web.Response:
        source = request.match_info["source"]
        destination = request.match_info["destination"]
        key, arguments = _binding_body(await request_body(request))
        facade = ExchangeFacade(self._node(), request[ACTOR].rights)
        if request.match_info["kind"] == "e":
            call = facade.unbind_exchange if unbind else facade.bind_exchange
            bound = await call(destination, source, key, arguments)
        else:
            bound = await (facade.unbind if unbind else facade.bind)(
                destination, source, key, arguments)
        return json_response({"changed": bound.changed})


def _binding_body(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A binding request's routing key and arguments.

    Raises:
        InvalidArgument: an unknown key, or one of the wrong type.
    """
    unknown = sorted(set(body) - {"routing_key", "arguments"})
    if unknown:
        raise InvalidArgument(f"unknown binding field(s) {unknown} (known: routing_key, arguments)")
    key = body.get("routing_key", "")
    arguments = body.get("arguments", {})
    if not isinstance(key, str):
        raise InvalidArgument("routing_key must be a string")
    if not isinstance(arguments, dict):
        raise InvalidArgument("arguments must be a JSON object")
    return key, arguments
