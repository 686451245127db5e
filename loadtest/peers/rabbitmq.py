"""RabbitMQ, side by side: a quorum queue per work queue, publisher confirms, manual acks.

:class:`RabbitSystem` runs Debian's ``rabbitmq-server`` (3.10 on bookworm) as one node
or a cluster of three on 127.0.0.1 with everything in the run dir: its own ``epmd`` on a
free port (so it neither needs nor touches a system-wide one), its own Erlang cookie
(``HOME``), config, Mnesia dir and logs per node; no plugins. With three nodes each
quorum queue has a replica on every node. :class:`RabbitAdapter` talks AMQP 0-9-1 with
aio-pika: one channel with publisher confirms for publishing (``publish`` returns when
the broker confirmed the message, i.e. the quorum queue committed it), one channel per
consumer with ``basic.qos(prefetch)``, ``basic.ack`` per message (AMQP has no reply to
an ack), ``basic.nack(requeue)`` to release and ``basic.reject`` to reject.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import time
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
_CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
_ERRORS: tuple[type[BaseException], ...] = (
    aio_pika.exceptions.AMQPException,
    aiormq.exceptions.AMQPError,
    ConnectionError,
)


class RabbitSystem:
    """RabbitMQ on 127.0.0.1, one node or a cluster of three, started and stopped by the harness.

    Every node is a ``rabbitmq-server`` with its own node name, AMQP and distribution
    ports, Mnesia dir and log dir under ``base_dir``; they share one ``epmd`` on a port
    of their own (so nothing here touches a system-wide epmd) and one Erlang cookie,
    written to ``base_dir/.erlang.cookie`` (mode 0400) under the ``HOME`` the nodes and
    ``rabbitmqctl`` get. The nodes start at once (each takes 10-20 s to boot); then
    nodes 2 and 3 join node 1 (``stop_app`` / ``join_cluster`` / ``start_app``), which
    cannot race the way concurrent peer discovery can (two nodes each forming a
    cluster of their own).

    Args:
        base_dir: config, data and logs of every node.
        nodes: 1 or 3.
    """

    name = "rabbitmq"
    adapter = "rabbitmq"

    def __init__(self, base_dir: Path, nodes: int = 1) -> None:
        if nodes not in (1, 3):
            raise RuntimeError(f"RabbitMQ runs on 1 or 3 nodes, not {nodes}")
        self.base_dir = base_dir
        self.nodes = nodes
        self.ports: list[int] = []
        self.node_names: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.epmd: subprocess.Popen[bytes] | None = None
        self._env: dict[str, str] = {}
        # Debian's layout names the version: /usr/lib/rabbitmq/lib/rabbitmq_server-3.10.8
        found = sorted(Path(_SERVER).parents[1].glob("lib/rabbitmq_server-*"))
        self.version = found[-1].name.split("-", 1)[1] if found else ""

    @property
    def addresses(self) -> list[str]:
        """The AMQP listeners, one per node."""
        return [f"127.0.0.1:{p}" for p in self.ports]

    def start(self, timeout: float = 180.0) -> list[str]:
        """Start epmd and the nodes, form the cluster; return once every node runs in it.

        Raises:
            RuntimeError: ``rabbitmq-server`` is not installed, a node did not start, or
                the cluster did not form.
        """
        server = require_binary("rabbitmq-server", "rabbitmq-server", (_SERVER,))
        require_binary("rabbitmqctl", "rabbitmq-server", (_CTL,))
        epmd_bin = require_binary("epmd", "erlang-base")
        d = self.base_dir
        d.mkdir(parents=True, exist_ok=True)
        cookie = d / ".erlang.cookie"
        if not cookie.exists():  # kept on a re-run in the same dir: the nodes' data knows it
            cookie.write_text(secrets.token_hex(16))
            cookie.chmod(0o400)
        epmd_port = free_port()
        self._env = {
            **os.environ,
            "HOME": str(d),  # the Erlang cookie is read from here, by nodes and rabbitmqctl
            "ERL_EPMD_PORT": str(epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        with open(d / "epmd.out", "wb") as out:
            self.epmd = subprocess.Popen(
                [epmd_bin, "-address", "127.0.0.1", "-port", str(epmd_port)],
                stdout=out, stderr=subprocess.STDOUT, env=self._env, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        try:
            outs = [self._start_node(server, i) for i in range(self.nodes)]
            for i, (proc, out_path) in enumerate(zip(self.procs, outs)):
                wait_for_line(proc, out_path, b"Server startup complete",
                              max(1.0, deadline - time.monotonic()), f"rabbitmq node {i + 1}")
            if self.nodes > 1:
                self._form_cluster(deadline)
        except BaseException:
            self.stop()
            raise
        return self.addresses

    def _start_node(self, server: str, i: int) -> Path:
        d = self.base_dir / f"node{i + 1}"
        d.mkdir(parents=True, exist_ok=True)
        port, dist_port = free_port(), free_port()
        name = f"baton-rmq-{i + 1}-{port}@localhost"
        self.ports.append(port)
        self.node_names.append(name)
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{port}\n"
            "loopback_users = none\n"
            # No disk alarm in a short run on a busy test machine's disk.
            "disk_free_limit.absolute = 50MB\n"
        )
        (d / "enabled_plugins").write_text("[].\n")  # no management plugin
        (d / "rabbitmq-env.conf").write_text("")
        env = {
            **self._env,
            "RABBITMQ_NODENAME": name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(port),
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
        out_path = d / "rabbitmq.out"
        with open(out_path, "wb") as out:
            # Its own session: if it must be killed, its process group (beam.smp and
            # its helpers under the shell script) goes with it.
            self.procs.append(subprocess.Popen(
                [server], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=d,
                start_new_session=True, stdin=subprocess.DEVNULL,
            ))
        return out_path

    def _ctl(self, node: str, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl -n node ARGS``; its output.

        Raises:
            RuntimeError: it failed (with its output).
        """
        try:
            done = subprocess.run(
                [_CTL, "-n", node, *args], env=self._env, capture_output=True, text=True,
                timeout=timeout, stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"rabbitmqctl -n {node} {' '.join(args)}: no answer in "
                               f"{timeout:g}s") from exc
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {node} {' '.join(args)} failed: "
                               f"{(done.stdout + done.stderr)[-1500:]}")
        return done.stdout

    def _form_cluster(self, deadline: float) -> None:
        """Nodes 2.. join node 1, one after the other (each a few seconds of rabbitmqctl):
        two joins at once change Mnesia's schema at once, and one of them can abort
        (``schema_prepare``). A join that fails anyway is tried again after a reset."""
        seed = self.node_names[0]
        for node in self.node_names[1:]:
            self._ctl(node, "stop_app")
            for attempt in range(1, 4):
                try:
                    self._ctl(node, "join_cluster", seed)
                    break
                except RuntimeError:
                    if attempt == 3 or time.monotonic() > deadline:
                        raise
                    self._ctl(node, "reset")
                    time.sleep(attempt)
            self._ctl(node, "start_app")
        while True:
            status = json.loads(self._ctl(seed, "cluster_status", "--formatter", "json"))
            running = set(status.get("running_nodes", []))
            if running >= set(self.node_names):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ cluster did not form: running {sorted(running)}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop every node (the script passes SIGTERM on to beam.smp), then epmd."""
        live = [p for p in self.procs if p.poll() is None]
        for proc in live:
            proc.terminate()
        for proc in live:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the group we started
                proc.wait(10)
        self.procs = []
        stop_process(self.epmd, 10)
        self.epmd = None

    def processes(self) -> dict[str, int]:
        """The nodes' script processes (each one's tree holds its beam.smp)."""
        return {
            f"rabbitmq-{i + 1}" if len(self.procs) > 1 else "rabbitmq": p.pid
            for i, p in enumerate(self.procs) if p.poll() is None
        }


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

    def __init__(
        self, conn: aio_pika.abc.AbstractConnection, address: str, replicas: int = 1
    ) -> None:
        self.conn = conn
        self._address = address
        self.replicas = replicas
        self._channel: aio_pika.abc.AbstractChannel | None = None

    @classmethod
    async def open(cls, addresses: list[str]) -> RabbitAdapter:
        """Connect to the first address (guest on loopback).

        Every node of the cluster is in ``addresses`` (each worker gets them rotated, so
        the connections spread over the nodes); a quorum queue it declares gets a
        replica on each.
        """
        address = addresses[0]
        conn = await aio_pika.connect(f"amqp://guest:guest@{address}/")
        return cls(conn, address, len(addresses))

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
            "x-quorum-initial-group-size": self.replicas,
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
