"""AMQP transactions (``tx.select``, ``tx.commit``, ``tx.rollback``) with pika and
aio-pika against a real ``baton serve --amqp-listen`` (docs/amqp.md "Transactions"):
publishes and settlements held until the commit and applied by it, dropped (publishes)
or given back (settlements) by a rollback, a mandatory publish returned at the commit,
a commit a queue refused, confirms and transactions refused on one channel, and what a
closed transactional channel held going back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aio_pika
import pika
import pika.exceptions
import pytest

from batonmq import clients
from tests.helpers import eventually_sync
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import AMQP, connect, queue_stats
from tests.integration.test_amqp_aio import url

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("tx") / "broker", extra=AMQP)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _ready(ch: Any, queue: str) -> int:
    """The queue's ready messages, as the channel sees them: a ``Queue.Declare`` waits
    until every command the channel submitted before it is applied (its order), so a
    publish or an ack that was not held would be counted."""
    return int(ch.queue_declare(queue, passive=True).method.message_count)


async def _astats(b: BrokerProcess, queue: str) -> tuple[int, int, int]:
    async with await clients.connect(b.address) as conn:
        s = await conn.queue_stats(queue)
    return s["ready"], s["acquired"], s["accepted"]


def _stats(b: BrokerProcess, queue: str) -> tuple[int, int, int]:
    s = queue_stats(b, queue)
    return s["ready"], s["acquired"], s["accepted"]


def test_publishes_are_held_until_the_commit_and_dropped_by_a_rollback(
    broker: BrokerProcess,
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("tx-a")
    ch.queue_declare("tx-b")
    ch.exchange_declare("tx-fan", "fanout")
    ch.queue_bind("tx-a", "tx-fan")
    ch.queue_bind("tx-b", "tx-fan")
    ch.tx_select()
    ch.tx_select()  # (again: nothing changes)
    for i in range(3):
        ch.basic_publish("", "tx-a", f"a{i}".encode())
    ch.basic_publish("tx-fan", "", b"both")
    assert _ready(ch, "tx-a") == 0 and _ready(ch, "tx-b") == 0
    ch.tx_commit()
    assert _stats(broker, "tx-a")[0] == 4 and _stats(broker, "tx-b")[0] == 1
    ch.basic_publish("", "tx-a", b"dropped")
    ch.tx_rollback()
    ch.tx_commit()  # (an empty commit)
    assert _ready(ch, "tx-a") == 4
    bodies = [ch.basic_get("tx-a", auto_ack=True)[2] for _ in range(4)]
    assert bodies == [b"a0", b"a1", b"a2", b"both"]
    conn.close()
    assert "Traceback" not in broker.output()


def test_settlements_are_held_until_the_commit_and_given_back_by_a_rollback(
    broker: BrokerProcess,
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("tx-s")
    for i in range(3):
        ch.basic_publish("", "tx-s", f"s{i}".encode())
    ch.tx_select()
    tags = []
    for _ in range(3):
        method, _, _ = eventually_sync(lambda: (m := ch.basic_get("tx-s"))[0] and m, "a message")
        tags.append(method.delivery_tag)
    ch.basic_ack(tags[0])
    ch.basic_reject(tags[1], requeue=True)
    _ready(ch, "tx-s")  # (a round trip after both)
    assert _stats(broker, "tx-s") == (0, 3, 0)  # held
    ch.tx_commit()
    assert _stats(broker, "tx-s") == (1, 1, 1)  # one accepted, one back in the queue
    # A rollback gives the settled deliveries back to the client, to settle again.
    ch.basic_ack(tags[2])
    ch.tx_rollback()
    assert _stats(broker, "tx-s") == (1, 1, 1)
    ch.basic_ack(tags[2])  # (not an unknown tag: it is the client's again)
    ch.tx_commit()
    assert _stats(broker, "tx-s") == (1, 0, 2)
    # Settled twice in one transaction: an unknown tag the second time, as RabbitMQ.
    method, _, _ = eventually_sync(lambda: (m := ch.basic_get("tx-s"))[0] and m, "a message")
    ch.basic_ack(method.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_ack(method.delivery_tag)
        ch.tx_commit()
    assert info.value.reply_code == 406 and "unknown delivery tag" in info.value.reply_text
    # The channel closed with the ack held: the message goes back to the queue.
    eventually_sync(lambda: _stats(broker, "tx-s")[:2] == (1, 0), "the message back")
    conn.close()


def test_a_mandatory_publish_is_returned_at_the_commit_and_a_refused_one_fails_it(
    broker: BrokerProcess,
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    returned: list[bytes] = []
    ch.add_on_return_callback(lambda _ch, _m, _p, body: returned.append(body))
    ch.tx_select()
    ch.basic_publish("amq.direct", "nowhere", b"lost", mandatory=True)
    conn.process_data_events(time_limit=0)
    assert returned == []  # not before the commit
    ch.tx_commit()
    eventually_sync(lambda: conn.process_data_events(time_limit=0) or returned, "the return")
    assert returned == [b"lost"]
    # A queue that refuses a publish of the commit (full, reject-publish): 406.
    ch.queue_declare("tx-full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", "tx-full", b"first")
    ch.basic_publish("", "tx-full", b"second")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.tx_commit()
    assert info.value.reply_code == 406 and "partial tx completion" in info.value.reply_text
    conn.close()
    assert "Traceback" not in broker.output()


def test_confirms_and_transactions_are_refused_on_one_channel(broker: BrokerProcess) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.tx_select()
    assert (info.value.reply_code, info.value.reply_text) == (
        406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")
    ch = conn.channel()
    ch.tx_select()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.confirm_delivery()
    assert info.value.reply_code == 406 and "tx to confirm" in info.value.reply_text
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.tx_commit()
    assert info.value.reply_code == 406 and "not transactional" in info.value.reply_text
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.tx_rollback()
    assert info.value.reply_code == 406
    conn.channel().queue_declare("tx-after")  # the connection lives on
    conn.close()


async def test_aio_pika_transactions_commit_and_roll_back(broker: BrokerProcess) -> None:
    conn = await aio_pika.connect(url(broker))
    async with conn:
        ch = await conn.channel(publisher_confirms=False)
        q = await ch.declare_queue("tx-aio")
        async with ch.transaction():
            for i in range(3):
                await ch.default_exchange.publish(aio_pika.Message(f"m{i}".encode()), "tx-aio")
        with pytest.raises(RuntimeError):
            async with ch.transaction():
                await ch.default_exchange.publish(aio_pika.Message(b"rolled back"), "tx-aio")
                raise RuntimeError("the application fails: the transaction rolls back")
        got = []
        while (m := await q.get(fail=False, no_ack=True)) is not None:
            got.append(m.body)
        assert got == [b"m0", b"m1", b"m2"]
        # An ack in a transaction: applied by the commit
        await ch.default_exchange.publish(aio_pika.Message(b"to-ack"), "tx-aio")
        tx = ch.transaction()
        await tx.select()
        await tx.commit()  # (publishes the one above)
        m = await q.get(timeout=5)
        await m.ack()
        assert await _astats(broker, "tx-aio") == (0, 1, 3)  # (the 3 gets above, no-ack)
        await tx.commit()
        assert await _astats(broker, "tx-aio") == (0, 0, 4)
