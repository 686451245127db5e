"""The exchange facade an edge calls (broker/exchanges.py), on a real node: the memory
log and the reference store, as tests/unit/test_node.py runs them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from batonmq.broker.access import Rights
from batonmq.broker.exchanges import ERROR_KINDS, ExchangeFacade, error_kind
from batonmq.cluster.errors import (
    AccessRefused,
    BatonError,
    ExchangeNotFound,
    InvalidArgument,
    LogUnavailable,
    MessageTooLarge,
    PreconditionFailed,
    QueueExists,
    QueueNotFound,
)
from batonmq.cluster.events import Acquire, DeclareQueue, Event, Interest, Reject, RoutedEnqueue
from batonmq.cluster.node import Node
from batonmq.cluster.results import Bound, Declared, ExchangeDeleted, Routed
from batonmq.cluster.users import GUEST_COST, GUEST_SALT, GUEST_SERVER_KEY, GUEST_STORED_KEY, User, Users
from batonmq.store.memory import MemoryStore
from tests.unit.test_node import _close, _node, _reopen


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    n = await _node("a", "memory:")
    try:
        yield n
    finally:
        await _close(n)


def _bodies(node: Node, queue: str) -> list[bytes | None]:
    q = node.state.queues[queue]
    return [m.body if m else None for m in node.store.get_messages(q.qid, list(range(q.next_pos)))]


def _count_submits(node: Node, monkeypatch: pytest.MonkeyPatch) -> list[Event[Any]]:
    seen: list[Event[Any]] = []
    submit = node.submit

    def counting(event: Event[Any]) -> Any:
        seen.append(event)
        return submit(event)

    monkeypatch.setattr(node, "submit", counting)
    return seen


async def test_a_fanout_publish_lands_on_every_bound_queue(node: Node) -> None:
    ex = ExchangeFacade(node)
    for q in ("q1", "q2", "other"):
        await node.submit(DeclareQueue(q))
    assert await ex.declare_exchange("logs", "fanout") == Declared(created=True)
    assert await ex.declare_exchange("logs", "fanout") == Declared(created=False)
    assert await ex.bind("q1", "logs") == Bound(changed=True)
    assert await ex.bind("q2", "logs", "ignored") == Bound(changed=True)
    r = await ex.publish("logs", "any", b"hello", {"h": 1}, key="p1")
    assert r == Routed(queues=["q1", "q2"], positions=[0, 0], full=[], missing=[])
    assert _bodies(node, "q1") == [b"hello"] and _bodies(node, "q2") == [b"hello"]
    assert _bodies(node, "other") == []
    # The same publish sent again (its confirm was lost): on no queue twice.
    again = await ex.publish("logs", "any", b"hello", {"h": 1}, key="p1")
    assert again == r and _bodies(node, "q1") == [b"hello"]
    assert ex.exchange("logs") == {
        "exchange": "logs", "type": "fanout", "durable": True, "auto_delete": False,
        "internal": False, "arguments": {},
        "bindings": [{"queue": "q1", "routing_key": "", "arguments": {}},
                     {"queue": "q2", "routing_key": "ignored", "arguments": {}}],
        "exchange_bindings": [],
    }


async def test_topic_and_headers_and_the_default_exchange(node: Node) -> None:
    ex = ExchangeFacade(node)
    for q in ("a", "b"):
        await node.submit(DeclareQueue(q))
    await ex.bind("a", "amq.topic", "stock.#")
    await ex.bind("b", "amq.topic", "*.nyse")
    await ex.bind("b", "amq.match", "", {"x-match": "any", "kind": "report"})
    assert ex.route("amq.topic", "stock.nyse", {}) == ["a", "b"]
    assert (await ex.publish("amq.topic", "stock.nyse", b"1")).queues == ["a", "b"]
    assert (await ex.publish("amq.topic", "bond.nyse", b"2")).queues == ["b"]
    assert (await ex.publish("amq.match", "", b"3", {"kind": "report"})).queues == ["b"]
    assert (await ex.publish("", "a", b"4")).queues == ["a"]
    assert _bodies(node, "a") == [b"1", b"4"] and _bodies(node, "b") == [b"1", b"2", b"3"]


async def test_a_publish_that_routes_nowhere_appends_nothing(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = ExchangeFacade(node)
    await ex.declare_exchange("d", "direct")
    submitted = _count_submits(node, monkeypatch)
    assert await ex.publish("d", "nobody", b"x") == Routed([], [], [], [])
    assert await ex.publish("", "no-such-queue", b"x") == Routed([], [], [], [])
    assert submitted == []
    await node.submit(DeclareQueue("q"))
    await ex.bind("q", "d", "k")
    await ex.publish("d", "k", b"x")
    assert [type(e) for e in submitted] == [DeclareQueue, type(submitted[1]), RoutedEnqueue]


async def test_errors_have_distinct_kinds(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = ExchangeFacade(node)
    await node.submit(DeclareQueue("q"))
    await ex.declare_exchange("x", "direct")
    await ex.declare_exchange("in", "fanout", internal=True)
    submitted = _count_submits(node, monkeypatch)
    refused_here: list[tuple[Callable[[], Awaitable[Any]], type[BatonError]]] = [
        # refused before anything is appended
        (lambda: ex.declare_exchange("", "direct"), AccessRefused),
        (lambda: ex.delete_exchange("amq.direct"), AccessRefused),
        (lambda: ex.bind("q", ""), AccessRefused),
        (lambda: ex.publish("in", "", b"x"), AccessRefused),
        (lambda: ex.publish("nope", "", b"x"), ExchangeNotFound),
        (lambda: ex.declare_exchange("nope", "direct", passive=True), ExchangeNotFound),
        (lambda: ex.bind("q", "x", "k" * 300), InvalidArgument),
        (lambda: ex.publish("x", "k", b"x", priority=10), InvalidArgument),
    ]
    for call, cls in refused_here:
        with pytest.raises(cls):
            call()  # at the call, not when awaited
    assert submitted == []
    assert await ex.declare_exchange("x", "fanout", passive=True) == Declared(created=False)
    refused_at_apply: list[tuple[Callable[[], Awaitable[Any]], type[BatonError], str]] = [
        (lambda: ex.declare_exchange("x", "fanout"), PreconditionFailed, "precondition"),
        (lambda: ex.declare_exchange("amq.fanout", "topic"), PreconditionFailed, "precondition"),
        (lambda: ex.declare_exchange("amq.new", "topic"), AccessRefused, "access-refused"),
        (lambda: ex.declare_exchange("y", "nonsense"), InvalidArgument, "invalid"),
        (lambda: ex.bind("nope", "x"), QueueNotFound, "not-found"),
        (lambda: ex.bind("q", "nope"), ExchangeNotFound, "not-found"),
        (lambda: ex.delete_exchange("nope"), ExchangeNotFound, "not-found"),
    ]
    for call, cls, kind in refused_at_apply:
        fut = call()
        with pytest.raises(cls) as info:
            await fut
        assert error_kind(info.value) == kind
    assert error_kind(QueueExists()) == "precondition"
    assert error_kind(LogUnavailable()) == "unavailable"
    assert error_kind(MessageTooLarge()) == "other" and error_kind(ValueError()) == "other"
    assert set(ERROR_KINDS) >= {error_kind(e) for e in (AccessRefused(), BatonError())}
    await ex.bind("q", "x", "k")
    with pytest.raises(PreconditionFailed):
        await ex.delete_exchange("x", if_unused=True)
    assert await ex.unbind("q", "x", "k") == Bound(changed=True)
    assert await ex.delete_exchange("x", if_unused=True) == ExchangeDeleted(bindings=0)


def _rights(**patterns: str) -> Rights:
    users = Users()
    users.put(User("bob", GUEST_SALT, GUEST_COST, GUEST_STORED_KEY, GUEST_SERVER_KEY, False))
    users.set_rights("bob", {"configure": "", "write": "", "read": "", **patterns})
    refused: list[str] = []
    return Rights(lambda: users, "bob", refused.append)


async def test_rights_are_checked_before_appending(node: Node) -> None:
    admin = ExchangeFacade(node)
    for q in ("q1", "q2"):
        await node.submit(DeclareQueue(q))
    await admin.declare_exchange("x", "direct")
    await admin.declare_exchange("other", "direct")
    bob = ExchangeFacade(node, _rights(configure="^x$", write="^(q1|x)$", read="^x$"))
    assert await bob.declare_exchange("x", "direct") == Declared(created=False)
    with pytest.raises(AccessRefused, match="no configure right on exchange 'y'"):
        await bob.declare_exchange("y", "direct")
    with pytest.raises(AccessRefused, match="configure"):
        await bob.delete_exchange("other")
    with pytest.raises(AccessRefused, match="no write right on queue 'q2'"):
        await bob.bind("q2", "x", "k")
    with pytest.raises(AccessRefused, match="no read right on exchange 'other'"):
        await bob.bind("q1", "other", "k")
    assert await bob.bind("q1", "x", "k") == Bound(changed=True)
    await admin.bind("q2", "other", "k")
    assert (await bob.publish("x", "k", b"m")).queues == ["q1"]
    with pytest.raises(AccessRefused, match="no write right on exchange 'other'"):
        await bob.publish("other", "k", b"m")
    assert (await bob.publish("", "q1", b"m")).queues == ["q1"]  # write on the queue
    with pytest.raises(AccessRefused, match="no write right on queue 'q2'"):
        await bob.publish("", "q2", b"m")


async def test_exchanges_survive_a_restart_and_dead_letters_are_copied_in_the_store(
    tmp_path: Path,
) -> None:
    url = f"file:{tmp_path / 'log'}"
    node = await _node("a", url)
    ex = ExchangeFacade(node)
    await ex.declare_exchange("dlx", "fanout")
    for q in ("d1", "d2"):
        await node.submit(DeclareQueue(q))
        await ex.bind(q, "dlx")
    await node.submit(DeclareQueue("work", dead_letter_exchange="dlx"))
    await ex.publish("", "work", b"poison", {"h": 1})
    await node.submit(Interest("work", True))
    consumer = node.key + "/1"
    await node.submit(Acquire("work", consumer, 1))
    await node.submit(Reject("work", consumer, (0,)))
    for q in ("d1", "d2"):
        (m,) = node.store.get_messages(node.state.queues[q].qid, [0])
        assert m is not None and m.body == b"poison"
        assert m.headers["h"] == 1 and m.headers["x-death-exchange"] == "dlx"
    assert node.store.get_messages(node.state.queues["work"].qid, [0]) == [None]
    # Dead-lettered again, from d1 through the default exchange: the first death stays.
    await node.submit(DeclareQueue("final"))
    await node.submit(DeclareQueue("hop", dead_letter_exchange="", dead_letter_routing_key="final"))
    await ex.bind("hop", "dlx")
    await ex.publish("", "work", b"twice")
    await node.submit(Acquire("work", consumer, 1))
    await node.submit(Reject("work", consumer, (1,)))
    await node.submit(Interest("hop", True))
    await node.submit(Acquire("hop", consumer, 1))
    await node.submit(Reject("hop", consumer, (0,)))
    (m,) = node.store.get_messages(node.state.queues["final"].qid, [0])
    assert m is not None and m.body == b"twice"
    assert (m.headers["x-first-death-queue"], m.headers["x-first-death-exchange"]) == ("work", "dlx")
    assert (m.headers["x-last-death-queue"], m.headers["x-last-death-exchange"]) == ("hop", "")
    described = ex.exchange("dlx")
    await _close(node)

    store: MemoryStore = _reopen(node)
    again = await _node("a", url, store)
    try:
        assert ExchangeFacade(again).exchange("dlx") == described
        assert (await ExchangeFacade(again).publish("dlx", "", b"after")).queues == [
            "d1", "d2", "hop"
        ]
    finally:
        await _close(again)


def test_a_native_declare_may_name_a_dead_letter_exchange() -> None:
    from batonmq.broker.session import declare_event

    ev = declare_event("q", {"dead_letter_exchange": "", "dead_letter_routing_key": "dlq"})
    assert (ev.dead_letter_exchange, ev.dead_letter_routing_key) == ("", "dlq")
    assert declare_event("q", {}).dead_letter_exchange is None
    with pytest.raises(InvalidArgument, match="wrong type"):
        declare_event("q", {"dead_letter_exchange": 1})


async def test_commands_reach_the_log_in_the_order_they_are_called(node: Node) -> None:
    ex = ExchangeFacade(node)
    await node.submit(DeclareQueue("q"))
    declared = ex.declare_exchange("o", "fanout")
    bound = ex.bind("q", "o")
    deleted = ex.delete_exchange("o")
    # Awaited the other way round: each was submitted when it was called.
    assert await deleted == ExchangeDeleted(bindings=1)
    assert await bound == Bound(changed=True)
    assert await declared == Declared(created=True)


async def test_a_routed_message_s_history_names_its_exchange_and_its_copies(node: Node) -> None:
    from batonmq.broker.history import message_history

    ex = ExchangeFacade(node)
    await ex.declare_exchange("dlx", "fanout")
    for q in ("d1", "d2"):
        await node.submit(DeclareQueue(q))
        await ex.bind(q, "dlx")
    await node.submit(DeclareQueue("work", dead_letter_exchange="dlx"))
    await ex.bind("work", "amq.direct", "jobs")
    await ex.publish("amq.direct", "jobs", b"m", key="pub-7")
    await node.submit(Interest("work", True))
    await node.submit(Acquire("work", node.key + "/1", 1))
    await node.submit(Reject("work", node.key + "/1", (0,)))
    history = await message_history(node, "work", 0)
    first, last = history.steps[0], history.steps[-1]
    assert (first["what"], first["exchange"], first["routing_key"], first["publish_key"]) == (
        "enqueued", "amq.direct", "jobs", "pub-7"
    )
    assert (last["what"], last["to_queue"], last["copies"]) == ("dead-lettered", "d2", [["d1", 0]])
