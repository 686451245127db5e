"""The admin API's exchanges, bindings, publishing and getting (docs/admin.md
"Exchanges, bindings and messages"), as RabbitMQ's management UI has them: list the
exchanges and bindings, publish a message to a queue or through an exchange, and get
messages from a queue, acked (fetch-and-ack) or given back (fetch-and-requeue).

Each route checks the logged-in user's own rights, as the native protocol does
(broker/access.py): the exchanges and bindings it has a right on, ``write`` to publish
(on the queue, or on the exchange), ``read`` to get. A get acquires through the log as a
consumer does (broker/delivery.py): a consumer of this broker, used for the one request,
takes up to ``count`` ready messages, then settles them with one ``Accept`` or one
``Release`` ("not now": their delivery count does not go up) and ends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import binascii
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from batonmq.broker.admin_login import ACTOR, json_response, request_body
from batonmq.broker.exchanges import ExchangeFacade
from batonmq.broker.limits import check_headers
from batonmq.clients import wire
from batonmq.cluster.errors import BatonError, InvalidArgument, MessageTooLarge, QueueNotFound
from batonmq.cluster.events import Accept, Release

if TYPE_CHECKING:
    from batonmq.broker.config import BrokerConfig
    from batonmq.broker.delivery import Delivery
    from batonmq.cluster.node import Node
    from batonmq.cluster.results import Result

__all__ = ["MAX_GET", "GET_WAIT", "MessageRoutes", "DEFAULT_EXCHANGE_ALIAS"]

#: The most messages one get takes.
MAX_GET = 100
#: The longest a get waits for the messages it saw ready (seconds): they are acquired
#: through the log, by the broker that owns the queue (this one, once it asks).
GET_WAIT = 3.0
_POLL = 0.02
#: The default exchange (``""``) in a path, as RabbitMQ's management API names it.
DEFAULT_EXCHANGE_ALIAS = "amq.default"


class MessagesBroker(Protocol):
    """What the routes need of the broker."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def node(self) -> Node: ...

    @property
    def delivery(self) -> Delivery: ...


class _Getter:
    """The session side of a get's consumer (broker/reply.py's ``Replier``): it keeps
    what is delivered and sends nothing anywhere."""

    candidate = ""
    closed = False
    paused = False

    def __init__(self) -> None:
        self.messages: list[list[Any]] = []
        self.cancelled: BatonError | None = None

    def send(self, frame: wire.Frame) -> None:
        pass

    def reply(self, corr: int, fut: asyncio.Future[Any], shape: Any) -> None:
        pass

    def error(self, corr: int, exc: BatonError) -> None:
        pass

    def commands_started(self, n: int) -> None:
        pass

    def commands_finished(self, n: int) -> None:
        pass

    def deliver(self, tag: int, messages: list[list[Any]]) -> None:
        self.messages.extend(messages)

    def consumer_cancelled(self, tag: int, exc: BatonError) -> None:
        self.cancelled = exc


def _body(body: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """A publish request's body and headers: ``{"body": str, "encoding": "utf8" |
    "base64", "headers": {...}}``.

    Raises:
        InvalidArgument: a missing or bad body, encoding or headers.
    """
    unknown = sorted(k for k in body if k not in ("body", "encoding", "headers", "routing_key"))
    if unknown:
        raise InvalidArgument(f"unknown field {unknown[0]!r} (give body, encoding, headers,"
                              " routing_key)")
    text = body.get("body")
    if not isinstance(text, str):
        raise InvalidArgument('give the message as {"body": "text"}')
    encoding = body.get("encoding", "utf8")
    if encoding == "utf8":
        data = text.encode("utf-8", "surrogatepass")
    elif encoding == "base64":
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument("body is not base64") from None
    else:
        raise InvalidArgument(f"encoding must be utf8 or base64, not {encoding!r}")
    headers = body.get("headers", {})
    if not isinstance(headers, dict):
        raise InvalidArgument("headers must be a JSON object")
    return data, headers


def _message(m: list[Any]) -> dict[str, Any]:
    pos, count, body, headers, publish_time = m[:5]
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"position": pos, "delivery_count": count,
            "body": base64.b64encode(body).decode(), "body_utf8": text,
            "headers": headers, "publish_time_ms": publish_time}


class MessageRoutes:
    """The exchange, binding, publish and get routes of one admin listener."""

    def __init__(self, broker: MessagesBroker) -> None:
        self.broker = broker

    def add_to(self, router: web.UrlDispatcher) -> None:
        """Register the routes."""
        # (GET /api/exchanges: broker/admin_exchanges.py)
        router.add_get("/api/bindings", self.bindings)
        router.add_post("/api/exchanges/{name}/publish", self.publish_exchange)
        router.add_post("/api/queues/{name}/publish", self.publish_queue)
        router.add_post("/api/queues/{name}/get", self.get)

    def _visible(self, request: web.Request) -> list[dict[str, Any]]:
        rights = request[ACTOR].rights
        return [x for x in self.broker.node.state.exchanges.describe() if rights.sees(x["exchange"])]

    async def bindings(self, request: web.Request) -> web.Response:
        return json_response({"bindings": [
            {"exchange": x["exchange"], **b} for x in self._visible(request) for b in x["bindings"]
        ]})

    async def _publish(self, request: web.Request, exchange: str, routing_key: str,
                       data: bytes, headers: dict[str, Any]) -> Result:
        cfg = self.broker.config
        if len(data) > cfg.max_message:
            raise MessageTooLarge(f"message of {len(data)} bytes is above the maximum of {cfg.max_message}")
        check_headers(headers)
        facade = ExchangeFacade(self.broker.node, request[ACTOR].rights)
        return await facade.publish(exchange, routing_key, data, headers)

    async def publish_exchange(self, request: web.Request) -> web.Response:
        """``{"routing_key": K, "body": ..., "encoding": ..., "headers": {...}}``: publish
        through the exchange (``amq.default``: the default one); answers where it went."""
        name = request.match_info["name"]
        body = await request_body(request)
        data, headers = _body(body)
        key = body.get("routing_key", "")
        if not isinstance(key, str):
            raise InvalidArgument("routing_key must be a string")
        exchange = "" if name == DEFAULT_EXCHANGE_ALIAS else name
        return json_response(await self._publish(request, exchange, key, data, headers))

    async def publish_queue(self, request: web.Request) -> web.Response:
        """``{"body": ..., "encoding": ..., "headers": {...}}``: publish to the queue
        (through the default exchange)."""
        name = request.match_info["name"]
        body = await request_body(request)
        if "routing_key" in body:
            raise InvalidArgument("a publish to a queue takes no routing_key")
        data, headers = _body(body)
        request[ACTOR].rights.check("write", name)
        if name not in self.broker.node.queues:
            raise QueueNotFound(f"queue {name!r} does not exist")
        return json_response(await self._publish(request, "", name, data, headers))

    async def get(self, request: web.Request) -> web.Response:
        """``{"count": N, "ack": true | false}``: take up to N (1..100, default 1) ready
        messages; ``ack`` true (the default) accepts them (fetch-and-ack), false gives
        them back at once, their delivery count unchanged (fetch-and-requeue)."""
        name = request.match_info["name"]
        request[ACTOR].rights.check("read", name)
        body = await request_body(request)
        unknown = sorted(k for k in body if k not in ("count", "ack"))
        if unknown:
            raise InvalidArgument(f"unknown field {unknown[0]!r} (give count, ack)")
        count, ack = body.get("count", 1), body.get("ack", True)
        if type(count) is not int or not 1 <= count <= MAX_GET:
            raise InvalidArgument(f"count must be an integer from 1 to {MAX_GET}")
        if type(ack) is not bool:
            raise InvalidArgument("ack must be true (accept) or false (requeue)")
        node, delivery = self.broker.node, self.broker.delivery
        q = node.queues.get(name)
        if q is None:
            raise QueueNotFound(f"queue {name!r} does not exist")
        if q.ready == 0:
            return json_response({"queue": name, "messages": [], "acked": ack})
        getter = _Getter()
        c = delivery.add(name, count, getter, 0)
        c.counted = False  # (not a consumer the queue's counts show)
        taken: list[list[Any]] = []
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + GET_WAIT
            while True:
                q = node.queues.get(name)
                if getter.cancelled is not None or q is None:
                    break
                got = len(getter.messages)
                if got >= count or (got and not c.acquiring) or loop.time() >= deadline:
                    break
                if not got and q.ready == 0 and not c.acquiring:
                    break
                await asyncio.sleep(_POLL)
            c.prefetch = 0  # no refill once these are settled: the get takes no more
            taken = list(getter.messages)
            positions = tuple(m[0] for m in taken if m[0] in c.held)
            for p in positions:
                del c.held[p]
            c.settled_positions(list(positions))
            if positions:
                event: Accept | Release = (
                    Accept(name, c.cid, positions) if ack
                    else Release(name, c.cid, positions, False)
                )
                await node.submit(event)
        finally:
            # Whatever it still holds (nothing, unless the request failed half-way or an
            # acquire was in flight) goes back without counting as a failed delivery;
            # the answer waits for that, so that it describes the queue as it is.
            released = delivery.remove(c, unread=list(c.held))
        if released is not None:
            with contextlib.suppress(BatonError):  # (the messages are settled either way)
                await released
        if getter.cancelled is not None and not taken:
            raise getter.cancelled
        return json_response({"queue": name, "messages": [_message(m) for m in taken],
                              "acked": ack})
