"""RabbitMQ, side by side: a quorum queue per work queue, publisher confirms, manual acks.

:class:`RabbitSystem` runs Debian's ``rabbitmq-server`` (3.10 on bookworm) as a single
node on 127.0.0.1 with everything in the run dir: its own ``epmd`` on a free port (so
it neither needs nor touches a system-wide one), its own Erlang cookie (``HOME``),
config, Mnesia dir and logs; no plugins. :class:`RabbitAdapter` talks AMQP 0-9-1 with
aio-pika: one channel with publisher confirms for publishing (``publish`` returns when
the broker confirmed the message, i.e. the quorum queue committed it), one channel per
consumer with ``basic.qos(prefetch)``, ``basic.ack`` per message (AMQP has no reply to
an ack), ``basic.nack(requeue)`` to release and ``basic.reject`` to reject.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections import deque
from pathlib import Path
from typing import Any

import aio_pika
import aio_pika.abc
import aiormq.exceptions

from batonmq.loadtest.adapters import Delivery, Subscription
from batonmq.loadtest.cluster import free_port
from batonmq.loadtest.peers import require_binary, stop_process, wait_for_line

__all__ = ["RabbitSystem", "RabbitAdapter"]

_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # Debian's; /usr/sbin's wrapper su's
_ERRORS: tuple[type[BaseException], ...] = (
    aio_pika.exceptions.AMQPException,
    aiormq.exceptions.AMQPError,
    ConnectionError,
)


class RabbitSystem:
    """One RabbitMQ node on 127.0.0.1, started and stopped by the harness.

    Args:
        base_dir: its config, data and logs.
    """

    name = "rabbitmq"
    adapter = "rabbitmq"

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None

    @property
    def addresses(self) -> list[str]:
        """The AMQP listener."""
        return [f"127.0.0.1:{self.port}"]

    def start(self, timeout: float = 120.0) -> list[str]:
        """Start epmd and the node; return once it accepts AMQP connections.

        Raises:
            RuntimeError: ``rabbitmq-server`` is not installed, or did not start.
        """
        server = require_binary("rabbitmq-server", "rabbitmq-server", (_SERVER,))
        epmd_bin = require_binary("epmd", "erlang-base")
        d = self.base_dir
        d.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        epmd_port, dist_port = free_port(), free_port()
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            "loopback_users = none\n"
            # No disk alarm in a short run on a busy test machine's disk.
            "disk_free_limit.absolute = 50MB\n"
        )
        (d / "enabled_plugins").write_text("[].\n")
        (d / "rabbitmq-env.conf").write_text("")
        env = {
            **os.environ,
            "HOME": str(d),  # the Erlang cookie goes here
            "ERL_EPMD_PORT": str(epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODENAME": f"baton-lt-{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_LOGS": "-",
            "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
        }
        with open(d / "epmd.out", "wb") as out:
            self.epmd = subprocess.Popen(
                [epmd_bin, "-address", "127.0.0.1", "-port", str(epmd_port)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        out_path = d / "rabbitmq.out"
        with open(out_path, "wb") as out:
            # Its own session: if it must be killed, its process group (beam.smp and
            # its helpers under the shell script) goes with it.
            self.proc = subprocess.Popen(
                [server], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=d,
                start_new_session=True, stdin=subprocess.DEVNULL,
            )
        try:
            wait_for_line(self.proc, out_path, b"Server startup complete", timeout, "rabbitmq-server")
        except BaseException:
            self.stop()
            raise
        return self.addresses

    def stop(self) -> None:
        """Stop the node (the script passes SIGTERM on to beam.smp), then epmd."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the group we started
                proc.wait(10)
        self.proc = None
        stop_process(self.epmd, 10)
        self.epmd = None

    def processes(self) -> dict[str, int]:
        """The node's script process (its tree holds beam.smp)."""
        if self.proc is not None and self.proc.poll() is None:
            return {"rabbitmq": self.proc.pid}
        return {}


class _RabbitSubscription:
    def __init__(self, channel: aio_pika.abc.AbstractChannel) -> None:
        self.channel = channel
        self.buffer: deque[aio_pika.abc.AbstractIncomingMessage] = deque()
        self.ready = asyncio.Event()
        self.tag: str | None = None
        self.queue: aio_pika.abc.AbstractQueue | None = None

    async def start(self, queue: str, prefetch: int) -> None:
        await self.channel.set_qos(prefetch_count=prefetch)
        self.queue = await self.channel.get_queue(queue, ensure=False)
        self.tag = await self.queue.consume(self._on_message, no_ack=False)

    async def _on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.buffer.append(message)
        self.ready.set()

    async def get_many(self, max_count: int, timeout: float) -> list[Delivery]:
        if not self.buffer:
            if self.channel.is_closed:
                raise aio_pika.exceptions.ChannelInvalidStateError("channel closed")
            self.ready.clear()
            try:
                await asyncio.wait_for(self.ready.wait(), timeout)
            except TimeoutError:
                return []
        out: list[Delivery] = []
        while self.buffer and len(out) < max_count:
            m = self.buffer.popleft()
            count = (m.headers or {}).get("x-delivery-count", 0)
            out.append(Delivery(-1, int(count) if isinstance(count, int) else 0, m.body, m))
        return out

    async def ack_many(self, deliveries: list[Delivery]) -> list[BaseException | None]:
        out: list[BaseException | None] = []
        for d in deliveries:
            try:
                await d.handle.ack()
            except _ERRORS as exc:
                out.append(exc)
            else:
                out.append(None)
        return out

    async def release_many(self, deliveries: list[Delivery]) -> None:
        for d in deliveries:
            await d.handle.nack(requeue=True)

    async def reject_many(self, deliveries: list[Delivery]) -> None:
        for d in deliveries:
            await d.handle.reject(requeue=False)

    async def close(self) -> None:
        if self.queue is not None and self.tag is not None and not self.channel.is_closed:
            await self.queue.cancel(self.tag)
        self.buffer.clear()
        if not self.channel.is_closed:
            await self.channel.close()


class RabbitAdapter:
    """RabbitMQ through aio-pika (see the module doc)."""

    name = "rabbitmq"
    errors = _ERRORS

    def __init__(self, conn: aio_pika.abc.AbstractConnection, address: str) -> None:
        self.conn = conn
        self._address = address
        self._channel: aio_pika.abc.AbstractChannel | None = None

    @classmethod
    async def open(cls, addresses: list[str]) -> RabbitAdapter:
        """Connect to the first address (guest on loopback)."""
        address = addresses[0]
        conn = await aio_pika.connect(f"amqp://guest:guest@{address}/")
        return cls(conn, address)

    @property
    def address(self) -> str:
        return self._address

    @property
    def failovers(self) -> int:
        return 0

    async def _pub_channel(self) -> aio_pika.abc.AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self.conn.channel(publisher_confirms=True)
        return self._channel

    async def declare(self, queue: str, delivery_limit: int, dead_letter: str | None) -> None:
        ch = await self._pub_channel()
        # RabbitMQ dead-letters a message delivered *more* than x-delivery-limit times;
        # Baton when its delivery count reaches the limit: one less gives the same count.
        args: dict[str, Any] = {
            "x-queue-type": "quorum",
            "x-delivery-limit": max(0, delivery_limit - 1),
        }
        if dead_letter:  # declared by the caller first, like Baton's
            args["x-dead-letter-exchange"] = ""
            args["x-dead-letter-routing-key"] = dead_letter
        await ch.declare_queue(queue, durable=True, arguments=args)

    async def purge(self, queue: str) -> None:
        ch = await self._pub_channel()
        q = await ch.get_queue(queue, ensure=True)
        await q.purge()

    async def publish(self, queue: str, body: bytes) -> int:
        ch = await self._pub_channel()
        await ch.default_exchange.publish(
            aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=queue,
        )
        return -1

    async def subscribe(self, queue: str, prefetch: int) -> Subscription:
        sub = _RabbitSubscription(await self.conn.channel())
        await sub.start(queue, prefetch)
        return sub

    async def depth(self, queue: str) -> tuple[int, dict[str, Any]]:
        ch = await self._pub_channel()
        q = await ch.declare_queue(queue, passive=True)
        result = q.declaration_result
        ready = int(getattr(result, "message_count", 0) or 0)
        consumers = int(getattr(result, "consumer_count", 0) or 0)
        return ready, {"ready": ready, "consumers": consumers}

    async def close(self) -> None:
        await self.conn.close()
