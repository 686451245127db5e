"""The pure part of AMQP transactions (broker/amqp_tx.py): what is held, its limits,
and whether a commit's commands all succeeded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batonmq.broker import amqp_tx
from batonmq.broker.amqp_tx import MAX_TX_BYTES, MAX_TX_ITEMS, TooLarge, Transaction, failed
from batonmq.cluster.errors import LogUnavailable, QueueFull, QueueNotFound
from batonmq.cluster.results import Routed


def test_take_empties_and_keeps_the_order() -> None:
    t: Transaction[str, str] = Transaction()
    t.hold_publish("p1", 10)
    t.hold_settlement("accept", [(1, "s1"), (2, "s2")])
    t.hold_publish("p2", 5)
    t.hold_settlement("reject", [])  # nothing to hold
    assert (t.items, t.size) == (4, 15)
    assert t.take() == (["p1", "p2"], [("accept", [(1, "s1"), (2, "s2")])])
    assert t.take() == ([], []) and (t.items, t.size) == (0, 0)


def test_limits() -> None:
    t: Transaction[str, str] = Transaction()
    with pytest.raises(TooLarge, match="commit more often"):
        t.hold_publish("big", MAX_TX_BYTES + 1)
    t.hold_settlement("accept", [(i, "s") for i in range(MAX_TX_ITEMS)])
    with pytest.raises(TooLarge):
        t.hold_publish("one more", 1)
    assert t.publishes == []


def _done(value: Any = None, exc: BaseException | None = None) -> asyncio.Future[Any]:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)
    return fut


async def test_what_fails_a_commit() -> None:
    ok = Routed(queues=["a"], positions=[0], full=[], missing=[])
    full = Routed(queues=["a"], positions=[0], full=["b"], missing=[])
    assert not failed([(_done(ok), False), (_done(None), True)])
    assert failed([(_done(full), False)])
    assert failed([(_done(exc=QueueFull("full")), False)])
    assert failed([(_done(exc=LogUnavailable("down")), True)])
    # a settlement whose queue went is ignored, as RabbitMQ; a publish's is not
    assert not failed([(_done(exc=QueueNotFound("gone")), True)])
    assert failed([(_done(exc=QueueNotFound("gone")), False)])
    assert amqp_tx.PARTIAL == "partial tx completion"
