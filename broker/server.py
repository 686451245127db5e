"""The broker process: store + log + node + delivery + the client listener."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import ssl
import time
import uuid
from typing import TYPE_CHECKING, Any

from batonmq.broker import logs
from batonmq.broker.admission import LoginGate
from batonmq.broker.config import (
    BrokerConfig,
    package_version,
    parse_address,
    split_advertise,
)
from batonmq.broker.delivery import Delivery
from batonmq.broker.inspect import ConnectionView
from batonmq.broker.leadership import Leadership
from batonmq.broker.networks import parse_networks
from batonmq.broker.peers import ForwardCounts, Peers, elsewhere
from batonmq.broker.session import Session
from batonmq.clients import scram
from batonmq.clients.tls import client_context, server_context
from batonmq.cluster.features import ANNOUNCE, announced
from batonmq.cluster.errors import (
    PARTITION_CLOSED, InvalidArgument, LogUnavailable, QueueNotFound, StoreError,
)
from batonmq.cluster.events import PutUser
from batonmq.broker.memory import BodyBudget
from batonmq.broker.log_ends import apply_lag, partition_log_ends
from batonmq.cluster.log import LogSet, open_log_set
from batonmq.cluster.node import Node
from batonmq.cluster.partitioned import Partitioned
from batonmq.cluster.effects import Effect, RightsChanged
from batonmq.store.rocks import RocksStore

if TYPE_CHECKING:
    from batonmq.broker.admin import AdminServer
    from batonmq.broker.amqp_connection import AmqpConnection

__all__ = ["Broker", "VERSION"]

VERSION = package_version()

log = logging.getLogger("baton.broker")


class Broker:
    """A running broker. ``await start()``, then ``await stop()``.

    Raises (from start):
        StoreError: the data dir's store cannot be opened (another broker uses it).
        InvalidArgument: bad configuration, or a node id that does not match the data dir.
        LogUnavailable: the log cannot be opened.
    """

    version = VERSION

    def __init__(self, config: BrokerConfig) -> None:
        config.validate()
        self.config = config
        self.sessions: set[Session] = set()
        self.address = ""
        self._started = False  # start() completed
        self._made_data_dir = False  # start() made the data dir
        self._bound_port = 0  # the port the first start bound (kept by a rejoin)
        self._server: asyncio.base_events.Server | None = None
        self._logs: LogSet | None = None
        self._store: RocksStore | None = None
        self._stores: dict[int, RocksStore] = {}  # the data partitions' (docs/design.md §16)
        self._node: Node | None = None
        self._delivery: Delivery | None = None
        self._rejoining: asyncio.Task[None] | None = None
        self._leadership: Leadership | None = None
        self.admin_address = ""  # the admin listener's HOST:PORT, if it runs (docs/admin.md)
        self.amqp_address = ""  # the AMQP listener's HOST:PORT, if it runs (docs/amqp.md)
        self.amqp_connections: set[AmqpConnection] = set()
        # Half-sent AMQP bodies of every connection (docs/amqp.md "Limits").
        self.amqp_bodies = BodyBudget(max(config.amqp_body_buffer_total, config.max_message))
        self._amqp: asyncio.base_events.Server | None = None
        self._admin: AdminServer | None = None
        self.peers: Peers | None = None  # links to other brokers (broker/peers.py)
        self._no_forwards = ForwardCounts()
        self._tls_on = False
        self._handshakes_failed = 0  # since the last log line about them
        self._handshake_logged = 0.0
        # (node, applied offset, digest): Topology answers (the console polls them) reuse
        # the replica digest until the state moves, instead of packing every queue's
        # index on each request.
        self._digest_at: tuple[object, int, str] | None = None
        # Until this broker knows its cluster's id: an unknown user's SCRAM salt is made
        # from this (see auth_secret); refusals counted by what was missing.
        self._local_secret = os.urandom(32)
        self.allow_from = parse_networks(config.allow_from) if config.allow_from else None
        self.refusals: dict[str, int] = {}
        # Connections not logged in yet, native and AMQP (docs/security.md).
        self.logins = LoginGate(config.max_unauthenticated, config.max_unauthenticated_per_host)

    @property
    def node(self) -> Node:
        assert self._node is not None, "broker not started"
        return self._node

    @property
    def delivery(self) -> Delivery:
        assert self._delivery is not None, "broker not started"
        return self._delivery

    @property
    def leadership(self) -> Leadership:
        assert self._leadership is not None, "broker not started"
        return self._leadership

    def _tls(self) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
        """The listener's TLS context and the one this broker connects to another
        with (a join update), or (None, None) without TLS (docs/security.md).

        Raises:
            InvalidArgument: one of tls_cert / tls_key without the other, or a file
                that cannot be used.
        """
        cfg = self.config
        if not cfg.tls_cert and not cfg.tls_key:
            if cfg.tls_verify_clients or cfg.tls_ca:
                raise InvalidArgument("tls_ca and tls_verify_clients need tls_cert and tls_key")
            return None, None
        if not cfg.tls_cert or not cfg.tls_key:
            raise InvalidArgument("tls_cert and tls_key are set together (or neither)")
        server = server_context(cfg.tls_cert, cfg.tls_key, cfg.tls_ca, cfg.tls_verify_clients)
        # Brokers trust the same CA; this broker's certificate is its client
        # certificate too, for a member that verifies clients.
        client = client_context(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)
        return server, client

    async def start(self) -> None:
        cfg = self.config
        keys = None
        if cfg.log_key_file is not None:
            # Read first: a missing or malformed key file stops the start with its
            # reason (InvalidArgument) before anything is created.
            from batonmq.cluster.log.sealed import KeyFile

            keys = KeyFile(cfg.log_key_file)
        server_tls, client_tls = self._tls()
        self._tls_on = server_tls is not None
        password = admin_password(cfg)  # read now: a bad file stops the start at once
        # A start that fails removes the data dir again if it made it (nothing of a
        # broker that never served is worth keeping): remove_created_data_dir().
        self._made_data_dir = not os.path.exists(cfg.data_dir)
        os.makedirs(cfg.data_dir, mode=0o700, exist_ok=True)
        opened = RocksStore.open_checked(os.path.join(cfg.data_dir, "store"))
        self._store = opened.store
        if opened.damaged is not None:
            # docs/operations.md "A damaged store": never serve from it; the fresh store
            # makes this broker join by an update like a new one.
            log.critical("store damaged (%s): moved to %s; starting empty and joining the "
                         "cluster afresh", opened.reason, opened.damaged)
            if opened.node_id is not None and cfg.node_id in (None, opened.node_id):
                self._store.put_ident("node_id", opened.node_id)
        node_id = self._node_id(self._store)
        self._logs = await self._open_logs(keys)
        options: dict[str, Any] = dict(
            role=cfg.role,
            properties=cfg.properties,
            heartbeat_ms=cfg.heartbeat_ms,
            suspect_beats=cfg.suspect_beats,
            checkpoint_ms=cfg.checkpoint_ms,
            join=cfg.join,
            max_append=cfg.max_append,
            max_outbox=cfg.max_outbox,
            append_linger_us=cfg.append_linger_us,
            tls=client_tls,
        )
        if self._logs.count > 1:
            # A control partition and data partitions (docs/design.md §16): a store each.
            for k in range(1, self._logs.count):
                self._open_store(k)
            self._node = Partitioned(node_id, self._logs, self._store, dict(self._stores), **options)
            self._node.open_store = self._open_store  # growing N (cluster/growth.py)
            groups = self._node.replication  # replica groups (cluster/replication.py)
            groups.replicas = cfg.replicas
            groups.replace_after = cfg.replace_after_ms / 1000
            groups.drop_store = self._drop_store
            groups.on_closed = self._partition_closed
            # Forwarding to the replicas of a partition not applied here (broker/peers.py).
            self.peers = Peers(self._node)
            self._node.remote = self.peers.remote
        else:
            self._node = Node(node_id, self._logs.partition(0), self._store, **options)
        self._delivery = Delivery(
            self._node, chunk_bytes=cfg.max_frame // 4, time_slice_ms=cfg.time_slice_ms
        )
        logs.set_identity(node_id, self._node.runtime_id)
        self._leadership = Leadership(self._node, cfg.services)
        self._node.listener = self._on_effects
        self._node.on_truncated = self._rejoin
        self._delivery.on_fenced = self._close_sessions
        loop = asyncio.get_running_loop()
        # A restart in place (a rejoin) listens where the first start did, also when
        # the configuration says port 0: clients and the cluster know that address.
        port = self._bound_port or cfg.port
        try:
            # Bound now (the address goes into this broker's heartbeats), serving only once the
            # state has caught up with the log: no answers from a half-replayed state.
            self._server = await loop.create_server(
                self._session, cfg.host, port, reuse_address=True, start_serving=False,
                ssl=server_tls,
                # A client that stalls its handshake is dropped like one that never
                # sends Hello.
                ssl_handshake_timeout=cfg.hello_timeout if server_tls else None,
            )
        except OSError as exc:
            raise InvalidArgument(
                f"cannot listen on {cfg.host}:{port}: {exc.strerror or exc}"
            ) from exc
        sock = self._server.sockets[0].getsockname()
        self._bound_port = int(sock[1])
        # What the cluster and clients are told (heartbeats, topology, the ready line):
        # the bound address, or --advertise (required when bound to all interfaces).
        host, port = (
            split_advertise(cfg.advertise, int(sock[1])) if cfg.advertise else (sock[0], sock[1])
        )
        self.address = f"{host}:{port}"
        await self._start_admin()
        await self._bind_amqp(server_tls)
        await self._node.start(self.address)
        await self._initial_admin(password)
        await self._server.start_serving()
        if self._amqp is not None:
            await self._amqp.start_serving()
        self._node.serving = True  # its heartbeats now offer it as a join donor
        self._delivery.start(cfg.expiry_interval)
        self._leadership.start()
        log.info(
            "broker %s listening on %s%s, log %s", node_id, self.address,
            " (TLS)" if server_tls else "", cfg.resolved_log_url(),
        )
        self._started = True

    async def _start_admin(self) -> None:
        """The admin HTTP listener, if configured: up before the node starts, so that
        /healthz answers and /readyz says why not ready while the broker joins."""
        cfg = self.config
        if cfg.admin_listen is None:
            return
        admin_host, admin_port = parse_address(cfg.admin_listen)
        # Loaded only when asked for: aiohttp and prometheus_client cost every process
        # that imports the broker package (load-test workers too) time and memory.
        from batonmq.broker.admin import AdminServer
        from batonmq.broker.metrics import BrokerMetrics

        metrics = BrokerMetrics(self)
        metrics.attach(self.node)
        tls = None
        if bool(cfg.admin_tls_cert) != bool(cfg.admin_tls_key):
            raise InvalidArgument("admin_tls_cert and admin_tls_key are set together (or neither)")
        if cfg.admin_tls_cert and cfg.admin_tls_key:
            # Its own certificate: the admin listener is reached by other names than
            # the client port (docs/admin.md "TLS").
            tls = server_context(cfg.admin_tls_cert, cfg.admin_tls_key)
        self._admin = AdminServer(self, metrics, tls)
        # A rejoin keeps the admin port too (see the client listener above).
        port = int(self.admin_address.rpartition(":")[2]) if self.admin_address else admin_port
        self.admin_address = await self._admin.start(admin_host, port)

    async def _bind_amqp(self, tls: ssl.SSLContext | None) -> None:
        """The AMQP 0-9-1 listener, if configured (docs/amqp.md): bound now, serving
        with the client port. With TLS, it uses the client port's certificate."""
        cfg = self.config
        if cfg.amqp_listen is None:
            return
        from batonmq.broker.amqp_connection import AmqpConnection

        host, port = parse_address(cfg.amqp_listen)
        if self.amqp_address:  # a rejoin keeps the port it had
            port = int(self.amqp_address.rpartition(":")[2])
        try:
            self._amqp = await asyncio.get_running_loop().create_server(
                lambda: AmqpConnection(self), host, port, reuse_address=True,
                start_serving=False, ssl=tls,
                ssl_handshake_timeout=cfg.hello_timeout if tls else None,
            )
        except OSError as exc:
            raise InvalidArgument(
                f"cannot listen for AMQP on {host}:{port}: {exc.strerror or exc}"
            ) from exc
        bound = self._amqp.sockets[0].getsockname()
        self.amqp_address = f"{bound[0]}:{bound[1]}"

    def _session(self) -> Session:
        """A new connection's session. With TLS, the session is only connected once
        the handshake succeeds, and asyncio reports a failed one nowhere (a plaintext
        client, an untrusted certificate): a session still not connected after the
        handshake time is counted and logged, in one line at most every 10 s."""
        session = Session(self)
        if self._tls_on:
            loop = asyncio.get_running_loop()
            loop.call_later(self.config.hello_timeout + 0.5, self._handshake_done, session)
        return session

    def _handshake_done(self, session: Session) -> None:
        if session.transport is not None:
            return
        self._handshakes_failed += 1
        now = time.monotonic()
        if now - self._handshake_logged >= 10.0:
            log.warning(
                "%d connection(s) failed the TLS handshake (a plaintext client, or one"
                " that does not trust this broker's certificate or has none)",
                self._handshakes_failed,
            )
            self._handshakes_failed = 0
            self._handshake_logged = now

    def _on_effects(self, effects: list[Effect]) -> None:
        """Every applied batch's effects: to delivery, then to service leadership, then
        a changed user's sessions look again at what they may keep."""
        self.delivery.on_effects(effects)
        try:
            self.leadership.on_effects(effects)
        except Exception:  # a bug here: logged as such; delivery had its effects already
            log.exception("leadership effect handling failed")
        users = {e.user for e in effects if isinstance(e, RightsChanged)}
        if users:
            self._rights_changed(users)

    def _rights_changed(self, users: set[str]) -> None:
        """A user was deleted or its rights changed (applied here from the log, as on
        every broker): its connections end what it may no longer do: consumers of
        queues it may no longer read are cancelled, candidacies for services it may no
        longer lead resign, and a deleted user's connections close
        (docs/security.md, revoking)."""
        for s in [s for s in self.sessions if s.user in users and not s.closed]:
            try:
                s.rights_changed()
            except Exception:  # a bug: never let one session stop the others
                log.exception("revoking rights on a session failed")
        for a in [a for a in self.amqp_connections if a.user in users and not a.closed]:
            try:
                a.rights_changed()
            except Exception:
                log.exception("revoking rights on an AMQP connection failed")

    def _node_id(self, store: RocksStore) -> str:
        """The persistent node id: kept in the store, made at first start (docs/design.md §7)."""
        kept = store.get_ident("node_id")
        wanted = self.config.node_id
        if kept is not None and wanted is not None and kept != wanted:
            raise InvalidArgument(
                f"data dir {self.config.data_dir} belongs to node {kept!r}, not {wanted!r}"
            )
        node_id = kept or wanted or uuid.uuid4().hex[:12]
        if "/" in node_id or not node_id.isprintable():
            raise InvalidArgument(f"node id {node_id!r} must be printable and contain no '/'")
        if kept is None:
            store.put_ident("node_id", node_id)
        return node_id

    def _rejoin(self) -> None:
        """The log moved on past this broker's state: stop everything and start again,
        which finds the applied offset gone and joins as a new broker (docs/design.md §8)."""
        if self._rejoining is None or self._rejoining.done():
            self._rejoining = asyncio.create_task(self._restart(), name="baton-rejoin")

    async def _restart(self) -> None:
        log.warning("restarting to rejoin the cluster as a new broker")
        try:
            await self.stop()
            await self.start()
        except Exception:
            log.critical("could not rejoin the cluster; stop this broker and start it again",
                         exc_info=True)

    def _close_sessions(self) -> None:
        for s in list(self.sessions):
            if s.transport is not None:
                s.transport.close()
        for a in list(self.amqp_connections):
            a.close()

    async def stop(self) -> None:
        """Stop accepting, end every session (consumers' messages are released),
        leave the view, close."""
        if self._server is not None:
            self._server.close()
        if self._amqp is not None:
            self._amqp.close()
            self._amqp = None
        if self._node is not None:
            self._node.serving = False
        if self._admin is not None:
            await self._admin.stop()
            self._admin = None
        pending = []
        for s in list(self.sessions):
            for c in list(s.consumers.values()):
                fut = self.delivery.remove(c)
                if fut is not None:
                    pending.append(fut)
            s.consumers.clear()
        for a in list(self.amqp_connections):
            a.close()  # (its channels' consumers are released)
        if pending:
            await asyncio.wait(pending, timeout=3)
        for s in list(self.sessions):
            if s.transport is not None:
                s.transport.close()
        if self._delivery is not None:
            await self._delivery.stop()
        if self.peers is not None:
            self.peers.close()
            self.peers = None
        if self._node is not None:
            await self._node.leave()
            await self._node.stop()
        if self._logs is not None:
            await self._logs.close()
        if self._store is not None:
            self._store.close()
        for store in self._stores.values():
            store.close()
        if self._started:  # (a start that failed has said why: nothing more to say)
            log.info("broker stopped")

    def _open_store(self, k: int) -> RocksStore:
        """Data partition ``k``'s store (``store-pK``; docs/design.md §16), closed at stop.

        Raises:
            StoreError: it cannot be opened.
        """
        path = os.path.join(self.config.data_dir, f"store-p{k}")
        try:
            part = RocksStore.open_checked(path)
        except OSError as exc:  # (e.g. its directory cannot be made)
            raise StoreError(f"cannot open the store {path}: {exc.strerror or exc}") from exc
        if part.damaged is not None:
            log.critical("store of partition %d damaged (%s): moved to %s; that"
                         " partition joins afresh", k, part.reason, part.damaged)
        self._stores[k] = part.store
        return part.store

    def _drop_store(self, k: int) -> None:
        """Close data partition ``k``'s store and delete it: this broker left the
        partition's replica group (cluster/replication.py)."""
        store = self._stores.pop(k, None)
        if store is not None:
            store.close()
        path = os.path.join(self.config.data_dir, f"store-p{k}")
        shutil.rmtree(path, ignore_errors=True)
        log.info("data partition %d's store deleted: this broker is not in its group", k)

    def _partition_closed(self, k: int) -> None:
        """This broker stopped applying data partition ``k``: its consumers of the
        partition's queues end, each told where the queue is served now."""
        node = self.node
        if not isinstance(node, Partitioned):
            return
        where = ", ".join(node.replica_addresses(k)) or "its replicas"
        for queue in [q for q in self.delivery.by_queue if node.state.placement.get(q) == k]:
            self.delivery.cancel_all(queue, LogUnavailable(
                f"queue {queue!r} {PARTITION_CLOSED} (data partition {k}"
                f" moved: {where}); subscribe again"
            ))

    async def _open_logs(self, keys: Any) -> LogSet:
        """The log set: a new one with ``--partitions`` data partitions (a control
        partition more when there are several), an existing one as it is."""
        cfg = self.config
        want = cfg.partitions + 1 if cfg.partitions > 1 else 1
        logs = await open_log_set(
            cfg.resolved_log_url(), partitions=want, kafka_password_file=cfg.kafka_password_file
        )
        if keys is not None:
            from batonmq.cluster.log.sealed import SealedLogSet

            logs = await SealedLogSet.wrap(logs, keys)
        if logs.count != want and cfg.partitions > 1:
            have = max(1, logs.count - 1)
            log.warning(
                "--partitions %d is for a new cluster: the log %s exists with %d data"
                " partition(s), which this broker applies%s", cfg.partitions,
                cfg.resolved_log_url(), have,
                # (docs/operations.md "Growing N")
                f"; to grow a running cluster: baton partitions add --count {cfg.partitions}"
                if logs.count > 1 and cfg.partitions > have else "",
            )
        return logs

    def remove_created_data_dir(self) -> bool:
        """After a failed start (and :meth:`stop`): remove the data dir if that start
        made it. Returns whether it did."""
        if self._started or not self._made_data_dir:
            return False
        shutil.rmtree(self.config.data_dir, ignore_errors=True)
        return True

    # -- queries (answered from the state applied here) ---------------------------------

    def queue_stats(self, name: str) -> dict[str, Any]:
        q = self.node.queues.get(name)
        if q is None:  # (replica groups: its replicas name it, broker/peers.py)
            raise elsewhere(self.node, name, "ask") or QueueNotFound(
                f"queue {name!r} does not exist"
            )
        stats = q.stats()
        stats["consumers"] = len(self.delivery.by_queue.get(name, ()))
        stats["updating"] = self.node.locked(name)  # a join update still brings it here
        # Its data partition (docs/design.md §16): physical partition 0 of a log of one
        # is data partition 1.
        stats["partition"] = self.node.part(name).partition or 1
        return stats

    def _digest(self, node: Node) -> str:
        """The replica digest of ``node``'s state at its applied offset, computed once
        per offset (a rejoin makes a new node, so the node is part of the key)."""
        applied = node.state.applied
        cached = self._digest_at
        if cached is None or cached[0] is not node or cached[1] != applied:
            cached = (node, applied, node.state.digest())
            self._digest_at = cached
        return cached[2]

    async def current_topology(self) -> dict[str, Any]:
        """:meth:`topology` with each data partition's lag: their log ends are read
        first, together and bounded (broker/log_ends.py)."""
        return self.topology(await partition_log_ends(self.node))

    def topology(self, ends: dict[int, int | None] | None = None) -> dict[str, Any]:
        """The view as applied here (docs/design.md §7), plus this replica's offset and
        digest; ``ends``: each data partition's log end, for its lag (None: unknown)."""
        node = self.node
        ms = node.state.membership
        # A leader that is suspected is not shown: with no live voter (only observers
        # left) it would stay in the view for good, since no voter drops it.
        leader = ms.live_leader()
        voter_alive = ms.voter_alive()
        if node.health.problem:
            status = node.health.problem  # e.g. a corrupt log: docs/operations.md
        elif not node.healthy:
            status = "log or store failing"
        elif not voter_alive:
            status = "no live voter"
        elif not node.joined.is_set():
            status = "not a member"
        elif not all(n.joined.is_set() for n in node.parts()):
            status = "not a member of every partition"
        elif isinstance(node, Partitioned) and node.growth.missing:
            # Growing N (cluster/growth.py): recorded on control, not open here (yet).
            status = node.growth.problem or (
                f"opening data partition(s) {', '.join(map(str, node.growth.missing))}"
            )
        else:
            status = "ok"
        instances = []
        for key in ms.members:
            m = ms.known.get(key)
            if m is None:
                continue
            instances.append(
                {
                    "node_id": m.node,
                    "runtime": m.runtime,
                    "role": m.role,
                    "address": m.address,
                    "leader": key == leader,
                    "local": key == node.key,
                    # The operator's properties; the flags the build announces in the same
                    # heartbeats apart (None: a build from before feature flags).
                    "properties": {k: v for k, v in m.properties.items() if k != ANNOUNCE},
                    "features": _sorted_or_none(announced(m.properties)),
                    # Silent past its beats, on every replica alike (docs/design.md §7):
                    # the next view will drop it unless it beats again.
                    "suspected": ms.suspected(key),
                    "silent_beats": ms.silent_beats(key),
                }
            )
        return {
            "cluster_id": ms.cluster_id,
            "view": ms.view_seq,
            "changing": ms.proposal is not None or ms.needs_view(),
            "leader": leader,
            "instances": instances,
            "node_id": node.node_id,
            "runtime": node.runtime_id,
            "member": node.joined.is_set(),
            # docs/operations.md: unhealthy when the log or the store fails, and when no
            # voter is alive (nothing can change the view; this broker is on its own).
            "healthy": node.healthy and voter_alive,
            "status": status,
            "applied": node.state.applied,
            # How far this replica's applied log is behind the wall clock: every member
            # heartbeats, so a replica that applies the log is behind by about a beat;
            # ``baton health`` compares it with the suspicion time.
            "behind_ms": max(0, node.clock() - node.state.clock),
            "suspect_ms": self.config.heartbeat_ms * self.config.suspect_beats,
            "digest": self._digest(node),
            # docs/design.md §8: this broker's join (progress while it runs, then its figures),
            # the last checkpoint and any digest mismatch seen (a bug if not 0).
            "join": _join_of(node.parts()),
            "checkpoint": node.last_checkpoint,
            "digest_mismatches": node.digest_mismatches,
            # docs/security.md: logins and commands refused here, by what was missing.
            "access_refused": dict(self.refusals),
            "log_truncated_before": node.truncated_before,
            # Records ignored by the state machine, by reason (replicated: the same on
            # every replica): ``unopened`` counts sealed records no key here opens.
            "ignored": dict(sorted(node.state.ignored.items())),
            "log_sealed": self.config.log_key_file is not None,
            **self._partitions(ends or {}),
        }

    def _partitions(self, ends: dict[int, int | None]) -> dict[str, Any]:
        """A log of several partitions: each data partition as applied here, in its own
        view (docs/design.md §16); nothing for a log of one."""
        node = self.node
        if not isinstance(node, Partitioned):
            return {}
        rows = []
        for n in node.parts()[1:]:
            ms = n.state.membership
            rows.append({
                "partition": n.partition,
                "view": ms.view_seq,
                "leader": ms.live_leader(),
                "member": n.joined.is_set(),
                "healthy": n.healthy,
                "applied": n.state.applied,
                # Records on the partition's log not applied here (None: its end unknown).
                "lag": apply_lag(ends.get(n.partition), n.state.applied),
                "digest": self._digest(n),
                "queues": len(n.state.queues),
                # Forwarded publishes and dead letters not yet on their partitions (§16).
                "forwards_pending": n.state.forwards.pending_count,
                "dead_letters_in_flight": n.state.forwards.in_flight,
                "forwarding": n.state.forwards.progress(),
                "ignored": dict(sorted(n.state.ignored.items())),
                "checkpoint": n.last_checkpoint,
                "digest_mismatches": n.digest_mismatches,
                "log_truncated_before": n.truncated_before,
                "join": _join_of([n]),
            })
        # The cluster's count as control recorded it (growing N); each partition's
        # replica group, whether this broker applies it or not.
        groups = [{"partition": k, "here": k in node.data, **self._group(node, k)}
                  for k in range(1, node.count + 1)]
        return {"partitions": rows, "partition_count": node.count, "groups": groups}

    @staticmethod
    def _group(node: Partitioned, k: int) -> dict[str, Any]:
        """Data partition ``k``'s replica group as control says (docs/design.md §16):
        its brokers by node id, those joining and leaving, and how many are live."""
        g = node.replication.group(k)
        live, size = node.replication.live_replicas(k)
        return {
            "replicas": list(g.replicas) if g is not None else None,
            "joining": list(g.joining) if g is not None else [],
            "leaving": list(g.leaving) if g is not None else [],
            "live_replicas": live,
            "group_size": size,
            # Where a client reaches them (live caught-up replicas, in group order).
            "addresses": node.replica_addresses(k),
        }

    def reload_log_keys(self) -> bool:
        """Read the log key file again now (SIGHUP); False if the log is not sealed or
        the file is bad (the keys read before stay)."""
        from batonmq.cluster.log.sealed import SealedLogSet

        if isinstance(self._logs, SealedLogSet):
            return self._logs.keys.reload()
        return False

    @property
    def auth_secret(self) -> bytes:
        """What an unknown user's SCRAM salt is made from (docs/security.md): derived
        from the cluster's id, which every replica applied from the log, so every broker
        of the cluster answers the same salt for the same unknown name, as it does for a
        known user's, and comparing brokers does not tell which users exist. Before
        this broker knows the id (not a member yet): a random secret of its own."""
        node = self._node
        cluster_id = node.state.membership.cluster_id if node is not None else ""
        if not cluster_id:
            return self._local_secret
        return hashlib.sha256(b"baton-unknown-user-salt\0" + cluster_id.encode()).digest()

    def refused(self, what: str) -> None:
        """Count one refusal (``what``: "login", "member", "admin" or a right)."""
        self.refusals[what] = self.refusals.get(what, 0) + 1

    async def _initial_admin(self, password: str | None) -> None:
        """At a cluster's first start with an admin password: the ``admin`` user,
        instead of ``guest`` (docs/security.md). Only the first such event applies."""
        if password is None or self.node.state.users.explicit:
            return
        loop = asyncio.get_running_loop()
        creds = await loop.run_in_executor(None, scram.make_credentials, password)
        done = await self.node.submit(
            PutUser("admin", creds.salt, creds.cost, creds.stored_key, creds.server_key,
                    True, initial=True)
        )
        if done.changed:
            log.info("created the admin user (no guest user in this cluster)")

    @property
    def forwarding(self) -> ForwardCounts:
        """Events forwarded to other brokers, and the attempts that failed (metrics)."""
        return self.peers.counts if self.peers is not None else self._no_forwards

    def list_queues(self) -> list[dict[str, Any]]:
        return [self.queue_stats(name) for name in sorted(self.node.queues)]

    def connections(self) -> list[ConnectionView]:
        """The open client connections, native and AMQP (the admin listener's and
        ``Connections``' listing)."""
        native: list[ConnectionView] = [s for s in self.sessions if not s.closed]
        return native + [a for a in self.amqp_connections if not a.closed]

    def connection_count(self) -> int:
        """How many client connections are open (native and AMQP)."""
        return len(self.sessions) + len(self.amqp_connections)

    def close_connection(self, peer: str) -> bool:
        """Close the client connection from ``peer`` (``HOST:PORT``); False if none."""
        for s in self.sessions:
            if s.peer == peer and not s.closed:
                s.close()
                return True
        for a in self.amqp_connections:
            if a.peer == peer and not a.closed:
                a.close("closed by an operator")  # Connection.Close 320 CONNECTION_FORCED
                return True
        return False


def admin_password(cfg: BrokerConfig) -> str | None:
    """The first admin's password: the file ``admin_password_file`` names (its first
    line), else ``BATON_ADMIN_PASSWORD``, else None.

    Raises:
        InvalidArgument: the file cannot be read, or holds no password.
    """
    if cfg.admin_password_file:
        try:
            with open(cfg.admin_password_file, encoding="utf-8") as f:
                password = f.readline().rstrip("\r\n")
        except OSError as exc:
            raise InvalidArgument(
                f"cannot read admin_password_file {cfg.admin_password_file}: {exc.strerror or exc}"
            ) from exc
        if not password:
            raise InvalidArgument(f"admin_password_file {cfg.admin_password_file} is empty")
        return password
    return os.environ.get("BATON_ADMIN_PASSWORD") or None


def _sorted_or_none(names: frozenset[str] | None) -> list[str] | None:
    return None if names is None else sorted(names)


def _join_of(nodes: list[Node]) -> dict[str, Any] | None:
    """This broker's join as the topology shows it: the update under way (each partition
    still being updated, on a log of several), else the figures of the one it took (summed
    over the partitions), else None."""
    running = [n for n in nodes if n.catchup is not None]
    if running:
        text = "; ".join(
            (f"partition {n.partition}: " if n.partition else "") + n.catchup.progress.text()
            for n in running if n.catchup is not None
        )
        return {"state": "updating", "progress": text}
    reports = [n.join_report for n in nodes if n.join_report is not None]
    if not reports:
        return None
    if len(reports) == 1:
        return reports[0]
    return {
        "queues": sum(r["queues"] for r in reports),
        "messages": sum(r["messages"] for r in reports),
        "received": sum(r["received"] for r in reports),
        "seconds": max(r["seconds"] for r in reports),
    }
