"""The AMQP 0-9-1 listener of a real ``baton serve --amqp-listen`` process, driven by
pika's blocking client as RabbitMQ's tutorials and their users drive RabbitMQ
(docs/amqp.md)."""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from pamqp import commands
from pamqp import frame as pamqp_frame

from batonmq import clients
from batonmq.broker.config import amqp_ready_address
from tests.helpers import eventually_sync
from tests.integration.conftest import BrokerProcess
from tests.integration.test_cli import baton

pytestmark = pytest.mark.integration

AMQP = ["--amqp-listen", "127.0.0.1:0"]


def amqp_port(b: BrokerProcess) -> int:
    """The AMQP listener's port, from the broker's latest start."""
    lines = b.log_path.read_text(errors="replace").splitlines()
    found = [a for a in map(amqp_ready_address, lines) if a is not None]
    assert found, f"no AMQP line in the broker's output:\n{b.output()}"
    return int(found[-1].rpartition(":")[2])


@pytest.fixture
def amqp_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", extra=AMQP)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def connect(b: BrokerProcess, user: str = "guest", password: str = "guest",
            **params: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", amqp_port(b), credentials=pika.PlainCredentials(user, password),
        connection_attempts=1, **params,
    ))


def queue_stats(b: BrokerProcess, queue: str) -> dict[str, Any]:
    async def stats() -> dict[str, Any]:
        async with await clients.connect(b.address) as conn:
            return await conn.queue_stats(queue)

    import asyncio

    return asyncio.run(stats())


def test_work_queue_with_confirms_and_manual_acks(amqp_broker: BrokerProcess) -> None:
    """Two workers share a queue: every confirmed message reaches exactly one of them."""
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.queue_declare("tasks", durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    sent = {f"task-{i}".encode() for i in range(200)}
    for body in sorted(sent):
        ch.basic_publish("", "tasks", body, pika.BasicProperties(delivery_mode=2),
                         mandatory=True)  # confirmed one by one (pika waits)
    conn.close()

    got: dict[int, list[bytes]] = {0: [], 1: []}
    done = threading.Event()
    lock = threading.Lock()

    def worker(n: int) -> None:
        c = connect(amqp_broker)
        wch = c.channel()
        wch.basic_qos(prefetch_count=5)

        def on_message(chan: Any, method: Any, props: Any, body: bytes) -> None:
            with lock:
                got[n].append(body)
                total = len(got[0]) + len(got[1])
            chan.basic_ack(method.delivery_tag)
            if total >= len(sent):
                done.set()

        wch.basic_consume("tasks", on_message)
        deadline = time.monotonic() + 30
        while not done.is_set() and time.monotonic() < deadline:
            c.process_data_events(time_limit=0.1)
        c.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert done.is_set(), f"received {len(got[0]) + len(got[1])} of {len(sent)}"
    received = got[0] + got[1]
    assert sorted(received) == sorted(sent)  # each exactly once, none lost
    stats = eventually_sync(
        lambda: (s := queue_stats(amqp_broker, "tasks"))["acquired"] == 0 and s, "all acked"
    )
    assert stats["ready"] == 0 and stats["accepted"] == len(sent)


def test_rpc_with_reply_to_and_correlation_id(amqp_broker: BrokerProcess) -> None:
    """The RPC tutorial: a server-named exclusive reply queue, properties kept end to end."""
    server = connect(amqp_broker)
    sch = server.channel()
    sch.queue_declare("rpc_queue")

    def on_request(chan: Any, method: Any, props: Any, body: bytes) -> None:
        n = int(body)
        chan.basic_publish("", props.reply_to, str(n * n).encode(),
                           pika.BasicProperties(correlation_id=props.correlation_id,
                                                headers={"served-by": "square"}))
        chan.basic_ack(method.delivery_tag)

    sch.basic_qos(prefetch_count=1)
    sch.basic_consume("rpc_queue", on_request)

    client = connect(amqp_broker)
    cch = client.channel()
    reply_queue = cch.queue_declare("", exclusive=True).method.queue
    assert reply_queue.startswith("amq.gen-")
    answers: dict[str, tuple[bytes, Any]] = {}

    def on_reply(chan: Any, method: Any, props: Any, body: bytes) -> None:
        answers[props.correlation_id] = (body, props)

    cch.basic_consume(reply_queue, on_reply, auto_ack=True)
    corr = str(uuid.uuid4())
    cch.basic_publish("", "rpc_queue", b"12",
                      pika.BasicProperties(reply_to=reply_queue, correlation_id=corr,
                                           content_type="text/plain"))
    deadline = time.monotonic() + 20
    while corr not in answers and time.monotonic() < deadline:
        server.process_data_events(time_limit=0.05)
        client.process_data_events(time_limit=0.05)
    assert corr in answers
    body, props = answers[corr]
    assert body == b"144"
    assert props.headers == {"served-by": "square"}
    client.close()
    # An exclusive queue goes with its connection.
    eventually_sync(lambda: not _queue_exists(amqp_broker, reply_queue),
                    "the exclusive reply queue deleted")
    server.close()


def _queue_exists(b: BrokerProcess, queue: str) -> bool:
    conn = connect(b)
    try:
        conn.channel().queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    finally:
        if conn.is_open:
            conn.close()


def test_reject_counts_a_failure_and_nack_does_not(amqp_broker: BrokerProcess) -> None:
    """As RabbitMQ 4.3's quorum queues: basic.reject raises x-delivery-count, basic.nack
    only x-acquired-count; the redelivered flag is set on every hand-out after the first."""
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.queue_declare("counting", durable=True, arguments={"x-queue-type": "quorum"})
    ch.basic_publish("", "counting", b"m", pika.BasicProperties(headers={"app": "x"}))
    seen: list[tuple[bool, dict[str, Any]]] = []

    def get() -> Any:
        for _ in range(200):
            method, props, body = ch.basic_get("counting")
            if method is not None:
                seen.append((method.redelivered, dict(props.headers or {})))
                return method
            time.sleep(0.02)
        raise AssertionError("no message")

    ch.basic_nack(get().delivery_tag, requeue=True)
    ch.basic_nack(get().delivery_tag, requeue=True)
    ch.basic_reject(get().delivery_tag, requeue=True)
    ch.basic_ack(get().delivery_tag)
    assert seen == [
        (False, {"app": "x"}),
        (True, {"app": "x", "x-acquired-count": 1}),
        (True, {"app": "x", "x-acquired-count": 2}),
        (True, {"app": "x", "x-acquired-count": 3, "x-delivery-count": 1}),
    ]
    conn.close()


def test_dead_lettering_at_the_delivery_limit(amqp_broker: BrokerProcess) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.queue_declare("dead")
    ch.queue_declare("poison", durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 2,
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead",
    })
    ch.basic_publish("", "poison", b"bad", pika.BasicProperties(message_id="p-1"))
    rejects = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        method, _, _ = ch.basic_get("dead", auto_ack=True)
        if method is not None:
            break
        method, _, _ = ch.basic_get("poison")
        if method is not None:
            ch.basic_reject(method.delivery_tag, requeue=True)
            rejects += 1
        time.sleep(0.02)
    else:
        raise AssertionError("the message never reached the dead-letter queue")
    assert rejects == 3  # returned more than x-delivery-limit times, as RabbitMQ
    # A re-declare with other arguments is refused as RabbitMQ does.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("poison", durable=True, arguments={"x-delivery-limit": 5})
    assert info.value.reply_code == 406
    if conn.is_open:
        conn.close()


def test_prefetch_is_honoured(amqp_broker: BrokerProcess) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.queue_declare("prefetch")
    for i in range(20):
        ch.basic_publish("", "prefetch", str(i).encode())
    ch.basic_qos(prefetch_count=3)
    held: list[int] = []
    ch.basic_consume("prefetch", lambda c, m, p, b: held.append(m.delivery_tag))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert len(held) == 3  # no more until some are acked
    ch.basic_ack(held[-1], multiple=True)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and len(held) < 6:
        conn.process_data_events(time_limit=0.1)
    conn.process_data_events(time_limit=0.5)
    assert len(held) == 6
    conn.close()


def test_a_global_prefetch_is_shared_by_the_channels_consumers(amqp_broker: BrokerProcess) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    for q in ("g1", "g2"):
        ch.queue_declare(q)
        for i in range(10):
            ch.basic_publish("", q, str(i).encode())
    ch.basic_qos(prefetch_count=4, global_qos=True)
    held: list[tuple[str, int]] = []
    for q in ("g1", "g2"):
        ch.basic_consume(q, lambda c, m, p, b: held.append((m.routing_key, m.delivery_tag)))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert len(held) == 4  # together, not 4 each
    ch.basic_ack(held[0][1])
    ch.basic_ack(held[1][1])
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert len(held) == 6
    conn.close()


def test_basic_get_and_get_empty(amqp_broker: BrokerProcess) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.queue_declare("getq")
    assert ch.basic_get("getq") == (None, None, None)  # GetEmpty
    ch.basic_publish("", "getq", b"one", pika.BasicProperties(content_type="text/plain"))
    ch.basic_publish("", "getq", b"two")
    method, props, body = None, None, b""
    for _ in range(100):
        method, props, body = ch.basic_get("getq")
        if method is not None:
            break
        time.sleep(0.02)
    assert method is not None and body == b"one" and props.content_type == "text/plain"
    assert method.message_count == 1 and not method.redelivered
    ch.basic_ack(method.delivery_tag)
    # A channel closed with an unacked message gives it back.
    method, _, body = ch.basic_get("getq")
    assert body == b"two"
    ch.close()
    ch = conn.channel()
    for _ in range(100):
        method, _, body = ch.basic_get("getq", auto_ack=True)
        if method is not None:
            break
        time.sleep(0.02)
    assert body == b"two" and method.redelivered
    conn.close()


def test_a_bad_password_is_refused_cleanly(amqp_broker: BrokerProcess) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect(amqp_broker, password="not-guest")
    assert "ACCESS_REFUSED" in str(info.value)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(amqp_broker, user="nobody", password="x")
    assert "Traceback" not in amqp_broker.output()


def test_refused_logins_are_logged_at_most_once_a_second(amqp_broker: BrokerProcess) -> None:
    """A flood of bad logins does not flood the log (docs/security.md): the lines say
    how many more were refused."""
    for _ in range(12):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            connect(amqp_broker, user="nobody", password="x")
    # The last line may still be due; the counter has them all.
    lines = [l for l in amqp_broker.output().splitlines() if "AMQP login refused" in l]
    assert 1 <= len(lines) < 12, lines


def test_connections_still_logging_in_have_their_own_limit(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b", extra=[*AMQP, "--max-unauthenticated-per-host", "3",
                                             "--hello-timeout", "30"])
    b.start()
    socks = []
    try:
        for _ in range(3):  # connected, and silent: still logging in
            socks.append(socket.create_connection(("127.0.0.1", amqp_port(b)), timeout=10))
        late = socket.create_connection(("127.0.0.1", amqp_port(b)), timeout=10)
        socks.append(late)
        late.sendall(b"AMQP\x00\x00\x09\x01")
        try:
            assert late.recv(100) == b""  # closed, unanswered
        except ConnectionResetError:
            pass
        eventually_sync(lambda: "max_unauthenticated_per_host" in b.output(), "the refusal line")
        for s in socks[:3]:
            s.close()
        # The broker counts them out as they close; then a client logs in again.
        conn = eventually_sync(lambda: _connects(b), "an AMQP login is accepted")
        conn.close()
    finally:
        for s in socks:
            s.close()
        b.stop()


def _connects(b: BrokerProcess) -> pika.BlockingConnection | None:
    try:
        return connect(b)
    except pika.exceptions.AMQPConnectionError:
        return None


def test_unsupported_methods_close_with_540_and_a_wrong_vhost_with_530(
    amqp_broker: BrokerProcess,
) -> None:
    conn = connect(amqp_broker)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.channel().basic_recover(requeue=False)
    assert info.value.reply_code == 540
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info2:
        connect(amqp_broker, virtual_host="other")
    assert "(530) \"NOT_ALLOWED - vhost 'other' not found" in str(info2.value)
    conn = connect(amqp_broker)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info3:
        ch.basic_publish("no-such-exchange", "k", b"x")
        ch.queue_declare("after")  # the close comes back on the next call
    assert info3.value.reply_code == 404
    ch = conn.channel()  # the connection lives on
    ch.queue_declare("after")
    conn.close()
    assert "Traceback" not in amqp_broker.output()


def test_access_refused_by_rights(amqp_broker: BrokerProcess) -> None:
    r = baton("user", "add", "dave", "--password-stdin", "--broker", amqp_broker.address,
              stdin=b"dave-pw\n")
    assert r.returncode == 0, r.stderr
    r = baton("permissions", "set", "dave", "--configure", "dq.*", "--write", "dq.*",
              "--read", "dq.*", "--broker", amqp_broker.address)
    assert r.returncode == 0, r.stderr
    conn = connect(amqp_broker, user="dave", password="dave-pw")
    ch = conn.channel()
    ch.queue_declare("dq1")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().queue_declare("other")
    assert info.value.reply_code == 403
    conn.close()


def test_a_mandatory_publish_does_not_tell_which_queues_exist(
    amqp_broker: BrokerProcess,
) -> None:
    """Through the default exchange, a user who may not write a queue gets 403 whether
    it exists or not; one who may gets Basic.Return for a missing queue (docs/amqp.md)."""
    r = baton("user", "add", "erin", "--password-stdin", "--broker", amqp_broker.address,
              stdin=b"erin-pw\n")
    assert r.returncode == 0, r.stderr
    r = baton("permissions", "set", "erin", "--configure", "eq.*", "--write", "eq.*",
              "--read", "eq.*", "--broker", amqp_broker.address)
    assert r.returncode == 0, r.stderr
    admin = connect(amqp_broker)
    admin.channel().queue_declare("secret-exists")
    admin.close()
    conn = connect(amqp_broker, user="erin", password="erin-pw")
    answers = {}
    for queue in ("secret-exists", "secret-missing"):
        ch = conn.channel()
        ch.confirm_delivery()
        try:
            ch.basic_publish("", queue, b"probe", mandatory=True)
            answers[queue] = "published"
        except pika.exceptions.UnroutableError:
            answers[queue] = "returned"
        except pika.exceptions.ChannelClosedByBroker as exc:
            answers[queue] = str(exc.reply_code)
    assert answers == {"secret-exists": "403", "secret-missing": "403"}, answers
    # Her own names: a missing queue is returned, an existing one takes the message.
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", "eq.missing", b"m", mandatory=True)
    ch.queue_declare("eq.mine")
    ch.basic_publish("", "eq.mine", b"m", mandatory=True)
    conn.close()


def _frames(sock: socket.socket, timeout: float) -> list[Any]:
    """Frames read until the broker closes the socket (or ``timeout``)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    out = []
    while data:
        used, _, frame = pamqp_frame.unmarshal(data)
        data = data[used:]
        out.append(frame)
    return out


def test_a_wrong_header_gets_ours_and_a_silent_client_is_closed(amqp_broker: BrokerProcess) -> None:
    port = amqp_port(amqp_broker)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"AMQP\x00\x00\x08\x00")
        assert sock.recv(64) == b"AMQP\x00\x00\x09\x01"
        assert sock.recv(64) == b""  # closed
    # A client that settles heartbeats of 1 s and then sends nothing is closed.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        time.sleep(0.2)
        sock.recv(65536)  # Connection.Start
        sock.sendall(pamqp_frame.marshal(
            commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                        response="\0guest\0guest"), 0))
        time.sleep(0.5)
        sock.recv(65536)  # Connection.Tune
        sock.sendall(pamqp_frame.marshal(commands.Connection.TuneOk(2047, 131072, 1), 0))
        sock.sendall(pamqp_frame.marshal(commands.Connection.Open("/"), 0))
        started = time.monotonic()
        frames = _frames(sock, 10)
        assert time.monotonic() - started < 5
    assert any(isinstance(f, commands.Connection.OpenOk) for f in frames)
    assert sum(type(f).__name__ == "Heartbeat" for f in frames) >= 1


def test_a_frame_error_closes_the_connection_with_501(amqp_broker: BrokerProcess) -> None:
    port = amqp_port(amqp_broker)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        time.sleep(0.2)
        sock.recv(65536)  # Connection.Start
        sock.sendall(pamqp_frame.marshal(
            commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                        response="\0guest\0guest"), 0))
        time.sleep(0.5)
        sock.recv(65536)  # Connection.Tune
        sock.sendall(pamqp_frame.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0)
                     + pamqp_frame.marshal(commands.Connection.Open("/"), 0))
        time.sleep(0.3)
        sock.recv(65536)  # Connection.OpenOk
        sock.sendall(struct.pack(">BHI", 1, 1, 4) + b"\x00\x14\x00\x0a" + b"\x00")  # bad end
        frames = _frames(sock, 5)
        close = [f for f in frames if isinstance(f, commands.Connection.Close)]
        assert close and close[0].reply_code == 501, frames
        sock.sendall(pamqp_frame.marshal(commands.Connection.CloseOk(), 0))
    assert "Traceback" not in amqp_broker.output()


def test_server_cancels_consumers_of_a_deleted_queue(amqp_broker: BrokerProcess) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.queue_declare("doomed")
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(cancelled.append)
    ch.basic_consume("doomed", lambda *a: None)
    other = connect(amqp_broker)
    other.channel().queue_delete("doomed")
    deadline = time.monotonic() + 10
    while not cancelled and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert cancelled
    conn.close()
    other.close()


def test_a_lost_connection_gives_back_what_it_held_as_failed(amqp_broker: BrokerProcess) -> None:
    """Unacked messages of a connection that ends go back to the queue; the next
    consumer sees them redelivered, their failed delivery counted."""
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.queue_declare("held")
    for i in range(3):
        ch.basic_publish("", "held", str(i).encode())
    ch.basic_qos(prefetch_count=10)
    held: list[bytes] = []
    ch.basic_consume("held", lambda c, m, p, b: held.append(b))
    deadline = time.monotonic() + 10
    while len(held) < 3 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert sorted(held) == [b"0", b"1", b"2"]
    conn.close()  # without acking
    again = connect(amqp_broker)
    ch = again.channel()
    got: list[tuple[bytes, bool, Any]] = []
    ch.basic_consume("held", lambda c, m, p, b: got.append((b, m.redelivered, p.headers)),
                     auto_ack=True)
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        again.process_data_events(time_limit=0.1)
    assert sorted(b for b, _, _ in got) == [b"0", b"1", b"2"]
    assert all(redelivered and headers["x-delivery-count"] == 1 for _, redelivered, headers in got)
    again.close()


def test_channel_flow_and_recover(amqp_broker: BrokerProcess) -> None:
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.queue_declare("flowq")
    assert ch.flow(False) is False
    got: list[Any] = []
    ch.basic_consume("flowq", lambda c, m, p, b: got.append((m.delivery_tag, m.redelivered, p.headers)))
    ch.basic_publish("", "flowq", b"x")
    conn.process_data_events(time_limit=1.5)
    assert got == []  # flow off: nothing delivered
    assert ch.flow(True) is True
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert got == [(1, False, None)]
    ch.basic_recover(requeue=True)  # back, not as a failure
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert got[1] == (2, True, {"x-acquired-count": 1})
    ch.basic_ack(2)
    conn.close()


def test_queue_administration_and_publisher_outcomes(amqp_broker: BrokerProcess) -> None:
    """Purge, delete (if-empty), auto-delete; an unroutable mandatory publish comes back;
    a publish a full queue refuses is nacked."""
    conn = connect(amqp_broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("admin-q")
    for _ in range(4):
        ch.basic_publish("", "admin-q", b"x")
    assert ch.queue_declare("admin-q", passive=True).method.message_count == 4
    assert ch.queue_purge("admin-q").method.message_count == 4
    ch.basic_publish("", "admin-q", b"y")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_delete("admin-q", if_empty=True)
    assert info.value.reply_code == 406
    ch = conn.channel()
    ch.confirm_delivery()
    assert ch.queue_delete("admin-q").method.message_count == 1
    assert not _queue_exists(amqp_broker, "admin-q")
    # Unroutable with mandatory: Basic.Return, then the confirm.
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", "no-such-queue", b"lost", mandatory=True)
    ch.basic_publish("", "no-such-queue", b"dropped")  # without mandatory: dropped, acked
    # reject-publish: the publish that does not fit is nacked.
    ch.queue_declare("small", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", "small", b"1")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "small", b"2")
    # auto-delete: the queue goes with its last consumer.
    ch.queue_declare("temp", auto_delete=True)
    tag = ch.basic_consume("temp", lambda *a: None)
    ch.basic_cancel(tag)
    eventually_sync(lambda: not _queue_exists(amqp_broker, "temp"), "the auto-delete queue gone")
    conn.close()


def test_amqps_with_the_client_ports_certificate(tmp_path: Path) -> None:
    from batonmq.loadtest.certs import make_certs

    certs = make_certs(tmp_path)
    b = BrokerProcess(tmp_path / "tls", extra=AMQP + [
        "--tls-cert", str(certs.cert), "--tls-key", str(certs.key), "--tls-ca", str(certs.ca),
        "--hello-timeout", "2"])
    b.start()
    try:
        context = clients.tls.client_context(str(certs.ca))
        conn = connect(b, ssl_options=pika.SSLOptions(context, "127.0.0.1"))
        ch = conn.channel()
        ch.queue_declare("secure")
        ch.confirm_delivery()
        ch.basic_publish("", "secure", b"over tls")
        for _ in range(100):
            method, _, body = ch.basic_get("secure", auto_ack=True)
            if method is not None:
                break
            time.sleep(0.02)
        assert body == b"over tls"
        conn.close()
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            connect(b, socket_timeout=3, blocked_connection_timeout=3)  # plaintext
    finally:
        b.stop()


def test_consumer_limits_apply(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "limits", extra=AMQP + ["--max-consumers", "2",
                                                         "--max-connection-prefetch", "50"])
    b.start()
    try:
        conn = connect(b)
        ch = conn.channel()
        ch.queue_declare("lim")
        ch.basic_qos(prefetch_count=20)
        ch.basic_consume("lim", lambda *a: None)
        other = conn.channel()  # the limits are the connection's, across channels
        other.basic_qos(prefetch_count=40)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            other.basic_consume("lim", lambda *a: None)
            other.queue_declare("lim", passive=True)
        assert info.value.reply_code == 406 and "max_connection_prefetch" in info.value.reply_text
        ch.basic_consume("lim", lambda *a: None)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.basic_consume("lim", lambda *a: None)
            ch.queue_declare("lim", passive=True)
        assert info.value.reply_code == 406 and "max_consumers" in info.value.reply_text
        conn.close()
    finally:
        b.stop()


def test_amqp_connections_are_listed_with_their_consumers(amqp_broker: BrokerProcess) -> None:
    import asyncio

    conn = connect(amqp_broker, client_properties={"connection_name": "billing"})
    ch = conn.channel()
    ch.queue_declare("listed")
    ch.basic_qos(prefetch_count=7)
    ch.basic_consume("listed", lambda *a: None)

    async def listing() -> list[dict[str, Any]]:
        async with await clients.connect(amqp_broker.address) as native:
            return await native.connections()

    found = [c for c in asyncio.run(listing()) if c["client_name"].startswith("AMQP")]
    assert len(found) == 1 and found[0]["user"] == "guest"
    assert "billing" in found[0]["client_name"]
    assert [(c["queue"], c["prefetch"]) for c in found[0]["consumers"]] == [("listed", 7)]
    conn.close()


def test_struct_sanity() -> None:
    # (the heartbeat frame the broker writes is the spec's 8 bytes)
    from batonmq.broker.amqp_codec import HEARTBEAT

    assert HEARTBEAT == struct.pack(">BHIB", 8, 0, 0, 0xCE)
