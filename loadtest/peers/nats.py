"""NATS JetStream, side by side: a work-queue stream per work queue, acks, via nats-py.

:class:`NatsSystem` runs ``nats-server`` with JetStream on 127.0.0.1 (one node, or a
cluster of three with every stream replicated three ways), its stores in the run dir;
``nats-sync`` is the same with every write fsynced before its PubAck.
:class:`NatsAdapter` maps a queue ``Q`` to a file-stored stream with work-queue
retention on the subject ``lt.Q`` and one durable pull consumer that every consumer
process fetches from (so each message goes to one of them). ``publish`` waits for the
stream's PubAck (stored on a majority of the replicas; not fsynced yet unless
``nats-sync``: by default the server syncs every 2 minutes) and returns its stream
sequence as the position; the consumer fetches up to a batch at a time, and ``ack`` /
``nak`` / ``term`` settle messages (one-way, like AMQP's ack). Delivery limits and
dead-letter queues have no JetStream equivalent (a message over ``max_deliver`` stays
in the stream), so the poison preset is refused.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import time
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

__all__ = ["NatsSystem", "NatsAdapter", "stream_name", "nats_binary", "NATS_VERSION"]

#: The nats-server the harness builds when the installed one cannot sync every write.
NATS_VERSION = "v2.11.17"
NATS_MODULE = "github.com/nats-io/nats-server/v2"

_DURABLE = "lt-workers"
_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, ConnectionError)


def stream_name(queue: str) -> str:
    """The stream of a queue (stream names may not hold ``.``, ``*``, ``>`` or spaces)."""
    return "LT_" + re.sub(r"[^A-Za-z0-9_-]", "_", queue)


def _subject(queue: str) -> str:
    return "lt." + re.sub(r"[^A-Za-z0-9_-]", "_", queue)


def _version(binary: str) -> tuple[int, ...]:
    """``nats-server --version`` as numbers (``(2, 9, 10)``); () if it does not say."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    found = re.search(r"v?(\d+)\.(\d+)\.(\d+)", done.stdout + done.stderr)
    return tuple(int(x) for x in found.groups()) if found else ()


def _cached_binary() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "baton" / f"nats-server-{NATS_VERSION}" / "bin" / "nats-server"


def nats_binary(sync: bool, install: bool = True) -> str:
    """The ``nats-server`` to run.

    ``$BATON_NATS_SERVER`` if set; else the harness's pinned copy
    (:data:`NATS_VERSION`, in ``~/.cache/baton``) if it is there, so that ``nats`` and
    ``nats-sync`` run one server version; else the installed one if it can do what is
    asked (``sync_interval`` needs 2.10 or later; Debian bookworm has 2.9); else the
    pinned copy, built now with ``go install`` (Go and the Go module proxy).

    Raises:
        RuntimeError: no server fit, and the pinned one could not be built.
    """
    env = os.environ.get("BATON_NATS_SERVER")
    if env:
        return env
    cached = _cached_binary()
    if cached.exists():
        return str(cached)
    installed = shutil.which("nats-server")
    if installed and (not sync or _version(installed) >= (2, 10, 0)):
        return installed
    if not sync:
        require_binary("nats-server", "nats-server")  # raises, naming the package
    go = shutil.which("go")
    if not install or go is None:
        raise RuntimeError(
            "nats-sync needs nats-server 2.10 or later (sync_interval); the installed one "
            f"is older: set BATON_NATS_SERVER, or install Go so that the harness can build "
            f"{NATS_MODULE}@{NATS_VERSION}"
        )
    done = subprocess.run(
        [go, "install", f"{NATS_MODULE}@{NATS_VERSION}"], capture_output=True, text=True,
        env={**os.environ, "GOBIN": str(cached.parent)}, timeout=900,
    )
    if done.returncode != 0 or not cached.exists():
        raise RuntimeError(f"go install {NATS_MODULE}@{NATS_VERSION} failed: {done.stderr[-2000:]}")
    return str(cached)


class NatsSystem:
    """``nats-server`` with JetStream on 127.0.0.1: one node or a cluster of three.

    Each node has its own config file, client and cluster (route) ports and JetStream
    store under ``base_dir``; a cluster's nodes list each other's routes. With
    ``sync`` every node fsyncs each write before it acknowledges it
    (``jetstream { sync_interval: always }``), the durability of a Baton confirm; by
    default NATS fsyncs every 2 minutes.

    Args:
        base_dir: the nodes' configs, stores and output.
        nodes: 1 or 3.
        sync: fsync every write.
    """

    adapter = "nats"

    def __init__(self, base_dir: Path, nodes: int = 1, sync: bool = False) -> None:
        if nodes not in (1, 3):
            raise RuntimeError(f"NATS runs on 1 or 3 nodes, not {nodes}")
        self.base_dir = base_dir
        self.nodes = nodes
        self.sync = sync
        self.name = "nats-sync" if sync else "nats"
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.version = ""

    @property
    def addresses(self) -> list[str]:
        """The client listeners, one per node."""
        return [f"127.0.0.1:{p}" for p in self.ports]

    def start(self, timeout: float = 60.0) -> list[str]:
        """Start the nodes; return once JetStream serves requests (a cluster: once it
        has a meta leader).

        Raises:
            RuntimeError: ``nats-server`` is not installed (or too old), or did not start.
        """
        binary = nats_binary(self.sync)
        self.version = ".".join(map(str, _version(binary)))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.ports = [free_port() for _ in range(self.nodes)]
        routes = [free_port() for _ in range(self.nodes)]
        outs: list[Path] = []
        deadline = time.monotonic() + timeout
        try:
            for i, port in enumerate(self.ports):
                d = self.base_dir / f"node{i + 1}"
                d.mkdir(parents=True, exist_ok=True)
                lines = [
                    f'server_name: "baton-nats-{i + 1}"',
                    f"listen: 127.0.0.1:{port}",
                    "jetstream {",
                    f'  store_dir: "{d / "store"}"',
                    *(["  sync_interval: always"] if self.sync else []),
                    "}",
                ]
                if self.nodes > 1:
                    lines += [
                        "cluster {",
                        '  name: "baton-nats"',
                        f"  listen: 127.0.0.1:{routes[i]}",
                        "  routes: [" + ", ".join(
                            f"nats-route://127.0.0.1:{r}" for j, r in enumerate(routes) if j != i
                        ) + "]",
                        "}",
                    ]
                (d / "nats.conf").write_text("\n".join(lines) + "\n")
                out_path = d / "nats.out"
                outs.append(out_path)
                with open(out_path, "wb") as out:
                    self.procs.append(subprocess.Popen(
                        [binary, "-c", str(d / "nats.conf")],
                        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    ))
            for i, (proc, out_path) in enumerate(zip(self.procs, outs)):
                wait_for_line(proc, out_path, b"Server is ready",
                              max(1.0, deadline - time.monotonic()), f"nats-server {i + 1}")
            asyncio.run(_jetstream_ready(self.addresses, deadline))
        except BaseException:
            self.stop()
            raise
        return self.addresses

    def stop(self) -> None:
        """Stop every node (SIGTERM: it flushes its store)."""
        live = [p for p in self.procs if p.poll() is None]
        for proc in live:
            proc.terminate()  # all at once: a cluster that loses quorum waits for nobody
        for proc in live:
            stop_process(proc, 30)
        self.procs = []

    def processes(self) -> dict[str, int]:
        """The server processes."""
        return {
            f"{self.name}-{i + 1}" if len(self.procs) > 1 else self.name: p.pid
            for i, p in enumerate(self.procs) if p.poll() is None
        }


async def _jetstream_ready(addresses: list[str], deadline: float) -> None:
    """Wait until JetStream answers an account-info request (a cluster's meta leader is
    elected a few seconds after the nodes are up; until then requests fail).

    Raises:
        RuntimeError: not ready by ``deadline``.
    """
    nc = await nats.connect(servers=[f"nats://{a}" for a in addresses])
    try:
        js = nc.jetstream()
        while True:
            try:
                await js.account_info()
                return
            except (nats.errors.Error, asyncio.TimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"NATS JetStream not ready: {exc!r}") from exc
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


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

    def __init__(self, nc: Client, address: str, workload: Workload, replicas: int = 1) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self._address = address
        self.workload = workload
        self.replicas = replicas

    @classmethod
    async def open(cls, addresses: list[str], workload: Workload) -> NatsAdapter:
        """Connect to the cluster (its server list: each worker gets the addresses rotated,
        and nats-py picks one of them at random); a stream it declares gets a replica
        on each node.

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
        address = nc.connected_url.netloc if nc.connected_url else addresses[0]
        return cls(nc, address, workload, len(addresses))

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
            num_replicas=self.replicas,
        )
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await self.js.update_stream(config)
        await self._replicated(stream)
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

    async def _replicated(self, stream: str, timeout: float = 30.0) -> None:
        """Wait until the stream has a leader and every other replica is current (a
        load must not start while the stream's group still forms)."""
        deadline = time.monotonic() + timeout
        while True:
            info = await self.js.stream_info(stream)
            cluster = info.cluster
            if self.replicas == 1 or (
                cluster is not None and cluster.leader
                and len(cluster.replicas or []) == self.replicas - 1
                and all(r.current for r in cluster.replicas or [])
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"NATS stream {stream}: replicas not current: {cluster}")
            await asyncio.sleep(0.2)

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
