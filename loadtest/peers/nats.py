"""NATS JetStream, side by side: a work-queue stream per work queue, acks, via nats-py.

:class:`NatsSystem` runs Debian's ``nats-server`` with JetStream on 127.0.0.1, its store
in the run dir. :class:`NatsAdapter` maps a queue ``Q`` to a file-stored stream with
work-queue retention on the subject ``lt.Q`` and one durable pull consumer that every
consumer process fetches from (so each message goes to one of them). ``publish`` waits
for the stream's PubAck (stored, not yet fsynced: the server syncs every 2 minutes by
default) and returns its stream sequence as the position; the consumer fetches up to a
batch at a time, and ``ack`` / ``nak`` / ``term`` settle messages (one-way, like AMQP's
ack). Delivery limits and dead-letter queues have no JetStream equivalent (a message
over ``max_deliver`` stays in the stream), so the poison preset is refused.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext

from batonmq.loadtest.adapters import Delivery, Subscription
from batonmq.loadtest.cluster import free_port
from batonmq.loadtest.peers import require_binary, stop_process, wait_for_line
from batonmq.loadtest.workloads import Workload

__all__ = ["NatsSystem", "NatsAdapter", "stream_name"]

_DURABLE = "lt-workers"
_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, ConnectionError)


def stream_name(queue: str) -> str:
    """The stream of a queue (stream names may not hold ``.``, ``*``, ``>`` or spaces)."""
    return "LT_" + re.sub(r"[^A-Za-z0-9_-]", "_", queue)


def _subject(queue: str) -> str:
    return "lt." + re.sub(r"[^A-Za-z0-9_-]", "_", queue)


class NatsSystem:
    """One ``nats-server -js`` on 127.0.0.1, started and stopped by the harness.

    Args:
        base_dir: its JetStream store and its output.
    """

    name = "nats"
    adapter = "nats"

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def addresses(self) -> list[str]:
        """The client listener."""
        return [f"127.0.0.1:{self.port}"]

    def start(self, timeout: float = 60.0) -> list[str]:
        """Start the server; return once it is ready for clients.

        Raises:
            RuntimeError: ``nats-server`` is not installed, or did not start.
        """
        binary = require_binary("nats-server", "nats-server")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        out_path = self.base_dir / "nats.out"
        with open(out_path, "wb") as out:
            self.proc = subprocess.Popen(
                [binary, "-js", "-a", "127.0.0.1", "-p", str(self.port),
                 "-sd", str(self.base_dir / "store"), "-n", f"baton-lt-{self.port}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        try:
            wait_for_line(self.proc, out_path, b"Server is ready", timeout, "nats-server")
        except BaseException:
            self.stop()
            raise
        return self.addresses

    def stop(self) -> None:
        """Stop the server (SIGTERM: it flushes its store)."""
        stop_process(self.proc, 30)
        self.proc = None

    def processes(self) -> dict[str, int]:
        """The server process."""
        if self.proc is not None and self.proc.poll() is None:
            return {"nats": self.proc.pid}
        return {}


class _NatsSubscription:
    def __init__(self, psub: JetStreamContext.PullSubscription, nc: Client) -> None:
        self.psub = psub
        self.nc = nc

    async def get_many(self, max_count: int, timeout: float) -> list[Delivery]:
        try:
            msgs = await self.psub.fetch(max_count, timeout=timeout)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            return []
        out = []
        for m in msgs:
            md = m.metadata
            out.append(Delivery(int(md.sequence.stream), int(md.num_delivered) - 1, m.data, m))
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
            await d.handle.nak()

    async def reject_many(self, deliveries: list[Delivery]) -> None:
        for d in deliveries:
            await d.handle.term()

    async def close(self) -> None:
        # The acks are one-way: a flush round trip makes sure the server has read them.
        await self.nc.flush(timeout=10)
        await self.psub.unsubscribe()


class NatsAdapter:
    """NATS JetStream through nats-py (see the module doc)."""

    name = "nats"
    errors = _ERRORS

    def __init__(self, nc: Client, address: str, workload: Workload) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self._address = address
        self.workload = workload

    @classmethod
    async def open(cls, addresses: list[str], workload: Workload) -> NatsAdapter:
        """Connect to the first address.

        Raises:
            RuntimeError: the workload needs delivery limits or dead-letter queues.
        """
        if workload.release_share or workload.reject_share or workload.dead_letter:
            raise RuntimeError(
                "NATS JetStream has no delivery limit with dead-lettering: "
                f"preset {workload.name!r} cannot run on it"
            )
        nc = await nats.connect(
            servers=[f"nats://{a}" for a in addresses], allow_reconnect=False,
            max_reconnect_attempts=0,
        )
        return cls(nc, addresses[0], workload)

    @property
    def address(self) -> str:
        return self._address

    @property
    def failovers(self) -> int:
        return 0

    async def declare(self, queue: str, delivery_limit: int, dead_letter: str | None) -> None:
        stream = stream_name(queue)
        config = StreamConfig(
            name=stream,
            subjects=[_subject(queue)],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
        )
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await self.js.update_stream(config)
        await self.js.add_consumer(
            stream,
            ConsumerConfig(
                durable_name=_DURABLE,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=30.0,
                # Room for every consumer process's prefetch.
                max_ack_pending=max(1000, self.workload.prefetch * self.workload.consumers * 2),
                max_waiting=512,
            ),
        )

    async def purge(self, queue: str) -> None:
        await self.js.purge_stream(stream_name(queue))

    async def publish(self, queue: str, body: bytes) -> int:
        ack = await self.js.publish(_subject(queue), body, timeout=30.0, stream=stream_name(queue))
        return int(ack.seq)

    async def subscribe(self, queue: str, prefetch: int) -> Subscription:
        psub = await self.js.pull_subscribe(
            _subject(queue), durable=_DURABLE, stream=stream_name(queue)
        )
        return _NatsSubscription(psub, self.nc)

    async def depth(self, queue: str) -> tuple[int, dict[str, Any]]:
        await self.nc.flush()
        info = await self.js.stream_info(stream_name(queue))
        n = int(info.state.messages)
        return n, {"messages": n, "first_seq": info.state.first_seq, "last_seq": info.state.last_seq}

    async def close(self) -> None:
        try:
            await self.nc.flush(timeout=10)  # one-way acks: make sure the server read them
        except (nats.errors.Error, asyncio.TimeoutError):
            pass
        await self.nc.close()
