"""An AMQP channel's publisher confirms and settlements (broker/amqp_channel.py), on a
stand-in connection and node: which frames the client is sent as the log answers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pamqp import commands
from pamqp import frame as pamqp_frame

from batonmq.broker.amqp_channel import Channel, ChannelOwner
from batonmq.broker.amqp_codec import ChannelError, Content
from batonmq.broker.config import BrokerConfig
from batonmq.cluster.exchanges import Exchanges
from batonmq.cluster.errors import QueueFull, QueueNotFound
from batonmq.broker.amqp_message import route_of
from batonmq.cluster.events import Bind, DeclareExchange, DeleteQueue, Enqueue, RoutedEnqueue
from batonmq.cluster.results import Enqueued, Routed


class Owner:
    """The connection as a channel sees it; records what is written and submitted."""

    def __init__(self) -> None:
        self.closed = False
        self.paused = False
        self.frame_max = 131072
        self.config = BrokerConfig(data_dir="unused")
        queue = SimpleNamespace(max_length=None, max_priority=0, ready=0, tracks_keys=False)
        self.submitted: list[tuple[Any, asyncio.Future[Any]]] = []
        queues = {"q": queue, "r": queue}
        self.node = SimpleNamespace(
            state=SimpleNamespace(queues=queues, exchanges=Exchanges()),
            queues=queues,
            submit=self._submit,
        )
        self.rights = SimpleNamespace(check=lambda right, name, what="": None)
        self.cancel_notify = True
        self.peers = None  # (no replica groups)
        self.written = b""
        self.keys = 0

    def _submit(self, event: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.submitted.append((event, fut))
        return fut

    def write(self, data: bytes) -> None:
        self.written += data

    def next_key(self) -> str:
        self.keys += 1
        return f"k:{self.keys:x}"

    def commands_started(self, n: int) -> None:
        pass

    def commands_finished(self, n: int) -> None:
        pass

    def consumer_load(self) -> tuple[int, int]:
        return (0, 0)

    def exclusive_owner(self, queue: str) -> object | None:
        return None

    def fail(self, exc: Exception) -> None:
        raise AssertionError(f"the connection would close: {exc}")

    def frames(self) -> list[Any]:
        data, self.written, out = self.written, b"", []
        while data:
            used, _, frame = pamqp_frame.unmarshal(data)
            data = data[used:]
            out.append(frame)
        return out


def publish(ch: Channel, queue: str, body: bytes) -> None:
    ch.publish(Content(1, commands.Basic.Publish(exchange="", routing_key=queue),
                       commands.Basic.Properties(), body))


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_confirms_coalesce_a_run_and_tell_the_rest_alone() -> None:
    owner = Owner()
    ch = Channel(cast(ChannelOwner, owner), 1)
    ch.handle(commands.Confirm.Select())
    assert [type(f) for f in owner.frames()] == [commands.Confirm.SelectOk]
    for queue, body in (("q", b"1"), ("r", b"2"), ("q", b"3"), ("q", b"4")):
        publish(ch, queue, body)
    ch.flush()
    # One Enqueue per queue, each publish with its own idempotency key.
    (q_event, q_fut), (r_event, r_fut) = owner.submitted
    assert isinstance(q_event, Enqueue) and q_event.queue == "q"
    assert [b for b, _ in q_event.messages] == [b"1", b"3", b"4"]
    assert q_event.keys == (("k:1", 1), ("k:3", 1), ("k:4", 1))
    assert isinstance(r_event, Enqueue) and r_event.keys == (("k:2", 1),)
    r_fut.set_result(Enqueued(0, 1))
    await settle()
    (ack,) = owner.frames()
    assert isinstance(ack, commands.Basic.Ack) and (ack.delivery_tag, ack.multiple) == (2, False)
    q_fut.set_result(Enqueued(0, 3))
    await settle()
    (ack,) = owner.frames()
    assert isinstance(ack, commands.Basic.Ack) and (ack.delivery_tag, ack.multiple) == (4, True)


async def test_a_failed_publish_is_nacked_and_the_others_acked() -> None:
    owner = Owner()
    ch = Channel(cast(ChannelOwner, owner), 1)
    ch.handle(commands.Confirm.Select(nowait=True))
    publish(ch, "q", b"1")
    ch.flush()
    publish(ch, "r", b"2")
    ch.flush()
    publish(ch, "q", b"3")
    ch.flush()
    (_, f1), (_, f2), (_, f3) = owner.submitted
    f2.set_exception(QueueFull("queue 'r' is full"))
    f3.set_result(Enqueued(1, 1))
    await settle()
    frames = owner.frames()
    assert [(type(f).__name__, f.delivery_tag) for f in frames] == [("Nack", 2), ("Ack", 3)]
    f1.set_result(Enqueued(0, 1))
    await settle()
    (ack,) = owner.frames()
    assert isinstance(ack, commands.Basic.Ack) and ack.delivery_tag == 1 and not ack.multiple


async def test_unroutable_and_unknown_exchange() -> None:
    owner = Owner()
    ch = Channel(cast(ChannelOwner, owner), 1)
    ch.handle(commands.Confirm.Select(nowait=True))
    ch.publish(Content(1, commands.Basic.Publish(exchange="", routing_key="nowhere", mandatory=True),
                       commands.Basic.Properties(correlation_id="c"), b"lost"))
    await settle()
    frames = owner.frames()
    assert [type(f).__name__ for f in frames] == ["Return", "ContentHeader", "ContentBody", "Ack"]
    assert frames[0].reply_code == 312 and frames[1].properties.correlation_id == "c"
    assert owner.submitted == []
    with pytest.raises(ChannelError) as info:
        ch.publish(Content(1, commands.Basic.Publish(exchange="nope", routing_key="x"),
                           commands.Basic.Properties(), b""))
    assert info.value.code == 404


async def test_settling_unknown_tags_closes_the_channel() -> None:
    ch = Channel(cast(ChannelOwner, Owner()), 1)
    with pytest.raises(ChannelError) as info:
        ch.handle(commands.Basic.Ack(7))
    assert info.value.code == 406 and "unknown delivery tag 7" in info.value.text
    ch.handle(commands.Basic.Ack(0, multiple=True))  # all of nothing: fine


async def test_immediate_is_not_implemented() -> None:
    from batonmq.broker.amqp_codec import ConnectionFault

    ch = Channel(cast(ChannelOwner, Owner()), 1)
    with pytest.raises(ConnectionFault) as info:
        ch.publish(Content(1, commands.Basic.Publish(exchange="", routing_key="q", immediate=True),
                           commands.Basic.Properties(), b""))
    assert info.value.code == 540


async def test_a_publish_routed_to_two_queues_is_one_append_after_what_came_before() -> None:
    """A fan-out publish is one RoutedEnqueue, submitted after the channel's earlier
    publishes (their batch is flushed first); acked once every queue has it, nacked if
    a queue refused it; its exchange and routing key travel with it."""
    owner = Owner()
    state = owner.node.state
    state.exchanges.declare("n/r", DeclareExchange("fan", "fanout"))
    for q in ("q", "r"):
        state.exchanges.bind(Bind(q, "fan", ""), state.queues)
    ch = Channel(cast(ChannelOwner, owner), 1)
    ch.handle(commands.Confirm.Select(nowait=True))
    publish(ch, "q", b"0")
    for body in (b"1", b"2"):
        ch.publish(Content(1, commands.Basic.Publish(exchange="fan", routing_key="k"),
                           commands.Basic.Properties(), body))
    ch.flush()
    events = [e for e, _ in owner.submitted]
    assert [type(e).__name__ for e in events] == ["Enqueue", "RoutedEnqueue", "RoutedEnqueue"]
    fanned = events[1]
    assert isinstance(fanned, RoutedEnqueue)
    assert fanned.queues == ("q", "r") and fanned.messages[0][0] == b"1"
    assert route_of(fanned.messages[0][1], "q") == ("fan", "k")
    assert route_of(events[0].messages[0][1], "q") == ("", "q")
    (_, f0), (_, f1), (_, f2) = owner.submitted
    f1.set_result(Routed(queues=["q", "r"], positions=[1, 0], full=[], missing=[]))
    f2.set_result(Routed(queues=["q"], positions=[2], full=["r"], missing=[]))
    await settle()
    f0.set_result(Enqueued(0, 1))
    await settle()
    told = [(type(f).__name__, f.delivery_tag, f.multiple) for f in owner.frames()]
    assert told == [("Ack", 2, False), ("Nack", 3, False), ("Ack", 1, False)], told


async def test_a_channel_keeps_few_idle_getters() -> None:
    """Basic.Get on many queues: the getters that hold nothing end past a few."""
    from batonmq.broker import amqp_channel

    owner = Owner()
    added: list[Any] = []
    removed: list[Any] = []

    def add(queue: str, prefetch: int, session: Any, tag: int, counters: bool = False) -> Any:
        c = SimpleNamespace(queue=queue, prefetch=prefetch, held={}, acquiring=0, settling=0,
                            closed=False, tag=tag)
        added.append(c)
        return c

    owner.delivery = SimpleNamespace(add=add, remove=removed.append, pump=lambda q: None,
                                     by_queue={})  # type: ignore[attr-defined]
    names = [f"g{i}" for i in range(amqp_channel._MAX_GETTERS + 5)]
    ready = SimpleNamespace(max_length=None, max_priority=0, ready=1, tracks_keys=False)
    owner.node.state.queues = owner.node.queues = {n: ready for n in names}
    ch = Channel(cast(ChannelOwner, owner), 1)
    for n in names:
        ch.handle(commands.Basic.Get(queue=n))
    assert len(added) == len(names)
    assert len(removed) >= 5
    ch.release_all()


async def test_a_get_waits_for_the_channels_earlier_commands_and_what_follows_waits_too() -> None:
    """A channel's order: Basic.Get after the channel's own publish is handled once the
    publish is applied, and a method read after the get is answered after it."""
    owner = Owner()
    ch = Channel(cast(ChannelOwner, owner), 1)
    publish(ch, "q", b"1")
    ch.handle(commands.Basic.Get(queue="q"))
    ch.handle(commands.Basic.Qos(prefetch_count=5))
    (event, fut), = owner.submitted  # the publish went first, and alone
    assert isinstance(event, Enqueue)
    assert owner.frames() == []  # the get (and the qos behind it) wait
    fut.set_result(Enqueued(0, 1))
    await settle()
    # (the stand-in's queue shows no ready message: the get finds it empty, then qos)
    assert [type(f) for f in owner.frames()] == [commands.Basic.GetEmpty, commands.Basic.QosOk]
    ch.handle(commands.Basic.Get(queue="q"))  # nothing earlier pending: at once
    assert [type(f) for f in owner.frames()] == [commands.Basic.GetEmpty]


async def test_a_queue_gone_before_its_delete_is_applied_is_deleted_ok() -> None:
    """An auto-delete queue's last consumer cancelled, then Queue.Delete: the broker's own
    DeleteQueue may be applied first. RabbitMQ answers DeleteOk (aio-pika's RPC close)."""
    owner = Owner()
    ch = Channel(cast(ChannelOwner, owner), 1)
    ch.handle(commands.Queue.Delete(queue="q"))
    (event, fut), = owner.submitted
    assert isinstance(event, DeleteQueue) and event.queue == "q"
    fut.set_exception(QueueNotFound("queue 'q' does not exist"))
    await settle()
    (ok,) = owner.frames()
    assert isinstance(ok, commands.Queue.DeleteOk) and ok.message_count == 0
    assert ch.open
