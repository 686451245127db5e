"""The Baton system under test: N ``baton serve`` processes on 127.0.0.1 sharing one log.

Besides start and stop, :class:`BatonCluster` offers what the fault injector
(:mod:`batonmq.loadtest.faults`) needs: kill -9 and restart a broker on its data dir,
SIGSTOP / SIGCONT, join a new broker on a fresh data dir, restart the Kafka broker the
harness started (``--log kafka``), fill the size-limited filesystem under the
brokers' data dirs and the file log (``--disk-limit``), and, with ``net=True``, cut or
slow network links through Toxiproxy (:mod:`batonmq.loadtest.netfaults`).

With ``old_baton`` (``--old-build``: another build's ``baton`` executable, made by
:mod:`batonmq.loadtest.builds`) the brokers start on that build, and :meth:`BatonCluster.upgrade`
restarts one at a time on the running build (``python -m batonmq.broker`` of this
interpreter) on the same data dir, log and ports: a rolling upgrade.
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batonmq.broker.config import amqp_ready_address, ready_address
from batonmq.clients import sync as client_sync
from batonmq.cluster.errors import BatonError
from batonmq.loadtest.netfaults import Toxiproxy

__all__ = ["Broker", "BatonCluster", "ExternalSystem", "free_port", "KAFKA_SCRIPT", "LIBFAKETIME"]

#: Debian's libfaketime (package ``faketime``), preloaded into brokers for clock faults.
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")

#: The script that runs a real Kafka for tests and CI (also used by ``--log kafka``).
KAFKA_SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "kafka"

def free_port() -> int:
    """A port of 127.0.0.1 free right now, for the peers (RabbitMQ, NATS): programs that
    must be told their ports up front. Baton brokers bind port 0 and report theirs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(slots=True)
class Broker:
    """One broker of the cluster (its process changes when it is restarted).

    Attributes:
        node_id: its persistent node id (``node-<n>``).
        address: ``127.0.0.1:PORT`` for clients, from its first start's ready line
            (it listens on port 0 then; restarts listen on the port it got).
        data_dir: its data dir (kept across restarts).
        out: its stdout/stderr file (appended to by every start).
        proc: the running process (None before the first start).
        state: ``running``, ``paused``, ``killed`` or ``stopped``.
        starts: how many times it was started.
        client_address: where clients reach it: its proxy's address when the cluster
            runs behind Toxiproxy, else ``address``.
        log_url: its own log URL when it reaches Kafka through a proxy (else None: the
            cluster's).
        amqp_address: its AMQP listener's ``127.0.0.1:PORT`` (a cluster started with
            ``amqp=True``), from its first start.
        build: ``old`` while it runs on the cluster's ``old_baton``, else ``new`` (the
            running build); every (re)start uses it.
    """

    node_id: str
    data_dir: Path
    out: Path
    proc: subprocess.Popen[bytes] | None = None
    state: str = "stopped"
    starts: int = 0
    extra: list[str] = field(default_factory=list)
    address: str = ""
    client_address: str = ""
    log_url: str | None = None
    amqp_address: str = ""
    build: str = "new"


class BatonCluster:
    """N ``baton serve`` processes on 127.0.0.1 sharing one log, like ``baton dev``.

    Args:
        nodes: how many brokers to start.
        base_dir: the parent of their data dirs, of the default ``file:`` log and of the
            broker output files.
        log_url: the shared log: a URL, ``kafka`` (the harness starts a Kafka broker
            with ``.ci/kafka`` in ``base_dir/kafka`` and uses a fresh topic), or None
            (``file:<base_dir>/data/log``).
        disk_limit_mb: put the data dirs and the file log on a tmpfs of this many MiB
            (needs root: ``mount -t tmpfs``), so that the ``diskfull`` fault can fill it.
        extra_args: more ``baton serve`` options for every broker.
        net: run Toxiproxy and put the brokers' client links (and, with Kafka, their
            links to Kafka) behind its proxies, for the network faults.
        fake_clock: run every broker under libfaketime (wall clock only), so that
            :meth:`set_clock` can step or speed up its wall clock while it runs.
        amqp: every broker also listens for AMQP 0-9-1 (``--amqp-listen``), and the
            cluster's addresses are those listeners: the ``baton-amqp`` system, which the
            workers drive with the RabbitMQ adapter (aio-pika), the very client the
            ``rabbitmq`` system is driven with.
        old_baton: another build's ``baton`` executable
            (:func:`batonmq.loadtest.builds.resolve_build`): every broker the cluster
            starts (joiners too) runs on it until :meth:`upgrade` restarts it on the
            running build. None: every broker runs on the running build.
    """

    name = "baton"
    adapter = "baton"

    def __init__(
        self,
        nodes: int,
        base_dir: Path,
        log_url: str | None = None,
        disk_limit_mb: int | None = None,
        extra_args: list[str] | None = None,
        net: bool = False,
        fake_clock: bool = False,
        amqp: bool = False,
        old_baton: Path | None = None,
    ) -> None:
        self.nodes = nodes
        self.amqp = amqp
        if amqp:
            self.name = "baton-amqp"
            self.adapter = "rabbitmq"
        self.base_dir = base_dir
        self.data_root = base_dir / "data"
        self.requested_log = log_url
        self.log_url = log_url or f"file:{self.data_root / 'log'}"
        self.disk_limit_mb = disk_limit_mb
        self.extra_args = list(extra_args or [])
        self.brokers: list[Broker] = []
        self.kafka_dir: Path | None = None
        self.mounted = False
        self.net: Toxiproxy | None = Toxiproxy(free_port(), base_dir / "toxiproxy.out") if net else None
        self.fake_clock = fake_clock
        self.old_baton = old_baton
        if fake_clock and not LIBFAKETIME.exists():
            raise RuntimeError(
                f"clock faults need libfaketime ({LIBFAKETIME}): apt-get install faketime"
            )

    # --- start / stop --------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        """Client addresses of the brokers started at first (joined ones are not here):
        their AMQP listeners' with ``amqp=True``."""
        if self.amqp:
            return [b.amqp_address for b in self.brokers[: self.nodes]]
        return [b.client_address or b.address for b in self.brokers[: self.nodes]]

    def start(self, timeout: float = 90.0) -> list[str]:
        """Start the log's service if the harness owns it, then every broker.

        Returns:
            The brokers' client addresses.

        Raises:
            RuntimeError: a broker, Kafka or the tmpfs mount could not be started.
        """
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.data_root.mkdir(parents=True, exist_ok=True)
        if self.disk_limit_mb:
            self._mount()
        if self.net is not None:
            self.net.start()
        for _ in range(self.nodes):
            self._new_broker()
        if self.requested_log == "kafka":
            self._start_kafka()
        if self.net is not None:
            # Peers reach a broker at the address it advertises (its heartbeats carry it;
            # a joiner asks it for an update there): a proxy of its own, apart from its
            # clients' proxy, so that a netsplit cuts it from its peers too while a
            # client-partition leaves them be. It listens on a port fixed now, so that the
            # proxy's upstream holds across restarts.
            for b in self.brokers:
                b.address = f"127.0.0.1:{free_port()}"
                b.extra = ["--advertise", self.net.add(f"peer-{b.node_id}", b.address)]
        for b in self.brokers:
            self._launch(b)
        for b in self.brokers:
            self._wait_ready(b, timeout)
            if self.net is not None:
                b.client_address = self.net.add(f"client-{b.node_id}", b.address)
        return self.addresses

    def _new_broker(self) -> Broker:
        n = len(self.brokers) + 1
        b = Broker(
            node_id=f"node-{n}",
            data_dir=self.data_root / f"node-{n}",
            out=self.base_dir / f"node-{n}.out",
            build="old" if self.old_baton is not None else "new",
        )
        self.brokers.append(b)
        return b

    def _program(self, b: Broker) -> list[str]:
        """The command that runs the broker's build (before its arguments)."""
        if b.build == "old":
            assert self.old_baton is not None
            return [str(self.old_baton)]
        return [sys.executable, "-m", "batonmq.broker"]

    def _launch(self, b: Broker) -> None:
        cmd = [
            *self._program(b), "--log-level", "WARNING", "serve",
            "--listen", b.address or "127.0.0.1:0",
            "--data-dir", str(b.data_dir),
            "--log", b.log_url or self.log_url,
            "--node-id", b.node_id,
            *b.extra,
            *(["--amqp-listen", b.amqp_address or "127.0.0.1:0"] if self.amqp else []),
            *self.extra_args,
        ]
        env: dict[str, str] | None = None
        if b.build == "old":
            # The old build's venv holds all of it; a PYTHONPATH of the harness's could
            # put the running build's modules before it (batonmq is a namespace package).
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if self.fake_clock:
            stamp = self._stamp(b)
            if not stamp.exists():
                stamp.write_text("+0\n")
            # The wall clock only: an NTP step or slew does not move CLOCK_MONOTONIC,
            # and asyncio's timers run on it. The stamp file is re-read every second.
            env = {**(env or os.environ), "LD_PRELOAD": str(LIBFAKETIME),
                   "FAKETIME_TIMESTAMP_FILE": str(stamp), "FAKETIME_CACHE_DURATION": "1",
                   "DONT_FAKE_MONOTONIC": "1"}
        with open(b.out, "ab") as out:
            opts = f"; options {' '.join(self.extra_args)}" if self.extra_args else ""
            out.write(f"\n== harness: start {b.starts + 1} of {b.node_id} ({b.build} build:"
                      f" {' '.join(self._program(b))}{opts})\n".encode())
            out.flush()
            b.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        b.starts += 1
        b.state = "running"

    def _wait_ready(self, b: Broker, timeout: float) -> None:
        """Wait for this start's ready line (the file holds earlier starts' lines too) and
        take the broker's address from it."""
        deadline = time.monotonic() + timeout
        marker = f"== harness: start {b.starts} of {b.node_id} (".encode()
        while True:
            text = b.out.read_bytes()
            this_start = text.rsplit(marker, 1)[-1].decode(errors="replace").splitlines()
            address = next(filter(None, map(ready_address, this_start)), None)
            if address is not None and self.amqp and not b.amqp_address:
                # Printed before the ready line (restarts listen on the same port).
                b.amqp_address = next(filter(None, map(amqp_ready_address, this_start)), "")
            if address is not None:
                # The ready line names the advertised address: behind the proxies that
                # is the peer proxy, and the harness set the listen address itself.
                b.address = b.address or address
                return
            assert b.proc is not None
            if b.proc.poll() is not None:
                raise RuntimeError(
                    f"broker {b.node_id} exited with {b.proc.returncode}: "
                    f"{text.decode(errors='replace')[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker {b.node_id} did not get ready in {timeout:g}s ({b.out})")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop every broker (SIGCONT first: a paused one cannot stop), Kafka, the mount."""
        for b in self.brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.proc.send_signal(signal.SIGCONT)
                b.proc.send_signal(signal.SIGTERM)
        for b in self.brokers:
            if b.proc is None:
                continue
            try:
                b.proc.wait(20)
            except subprocess.TimeoutExpired:
                b.proc.kill()
                b.proc.wait(5)
            b.state = "stopped"
        if self.kafka_dir is not None:
            _kafka("stop", str(self.kafka_dir), timeout=60)
            self.kafka_dir = None
        if self.net is not None:
            self.net.stop()
        if self.mounted:
            subprocess.run(["umount", str(self.data_root)], check=False, capture_output=True)
            self.mounted = False

    def processes(self) -> dict[str, int]:
        """Live broker processes, ``node id -> pid`` (for CPU / RSS sampling)."""
        return {
            b.node_id: b.proc.pid
            for b in self.brokers
            if b.proc is not None and b.proc.poll() is None
        }

    # --- faults --------------------------------------------------------------------

    def running(self) -> list[Broker]:
        """Brokers that run and are not paused, in start order."""
        return [b for b in self.brokers if b.state == "running"]

    def kill9(self, b: Broker) -> None:
        """``kill -9`` the broker and reap it."""
        assert b.proc is not None
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(10)
        b.state = "killed"

    def restart(self, b: Broker, timeout: float = 90.0) -> None:
        """Start a stopped or killed broker again on its data dir and port."""
        self._launch(b)
        self._wait_ready(b, timeout)

    def restart_many(self, brokers: list[Broker], timeout: float = 90.0) -> None:
        """Start several stopped or killed brokers again at once, then wait for each
        one's ready line (one after another would keep the last down longer)."""
        for b in brokers:
            self._launch(b)
        for b in brokers:
            self._wait_ready(b, timeout)

    def pause(self, b: Broker) -> None:
        """SIGSTOP the broker."""
        assert b.proc is not None
        b.proc.send_signal(signal.SIGSTOP)
        b.state = "paused"

    def resume(self, b: Broker) -> None:
        """SIGCONT the broker."""
        assert b.proc is not None
        b.proc.send_signal(signal.SIGCONT)
        b.state = "running"

    def terminate(self, b: Broker, timeout: float = 20.0) -> int:
        """Stop one broker cleanly (SIGTERM); ``kill -9`` it if it has not exited
        within ``timeout`` s.

        Returns:
            Its exit status (0 after a clean stop; -9 when it had to be killed).
        """
        assert b.proc is not None
        b.proc.send_signal(signal.SIGTERM)
        try:
            code = b.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            b.proc.kill()
            code = b.proc.wait(5)
        b.state = "stopped"
        return code

    def old_brokers(self) -> list[Broker]:
        """Running brokers still on the old build (``old_baton``), in start order."""
        return [b for b in self.running() if b.build == "old"]

    def upgrade(self, b: Broker, timeout: float = 90.0) -> int:
        """Rolling-upgrade one broker: stop it cleanly (SIGTERM, and wait for its exit),
        start it on the running build on the same data dir, log and ports, and wait
        until it is a member of the view again.

        Returns:
            The old process's exit status (0: it stopped cleanly).

        Raises:
            RuntimeError: it is not on the old build, or did not come back within
                ``timeout``.
        """
        if b.build != "old":
            raise RuntimeError(f"{b.node_id} is not on the old build")
        code = self.terminate(b, timeout=30.0)
        b.build = "new"
        deadline = time.monotonic() + timeout
        self.restart(b, timeout)
        self.wait_member(b, max(1.0, deadline - time.monotonic()))
        return code

    def join(self, timeout: float = 90.0) -> Broker:
        """Start a new broker with a fresh data dir on the same log; wait until it is a member.

        Only ``baton serve`` and the cluster's topology are used, so this works however
        the cluster brings a joiner up to date (log replay or state transfer).

        Raises:
            RuntimeError: it did not start, or no view listed it within ``timeout``.
        """
        b = self._new_broker()
        self._launch(b)
        deadline = time.monotonic() + timeout
        self._wait_ready(b, timeout)
        self.wait_member(b, max(1.0, deadline - time.monotonic()))
        return b

    def groups(self) -> list[dict[str, Any]]:
        """The replica groups a running broker reports (its topology's ``groups`` rows,
        by partition; [] on one log).

        Raises:
            RuntimeError: no running broker answered.
        """
        last = "no running broker"
        for b in self.running():
            try:
                with client_sync.connect(b.address, timeout=5.0, failover=False) as conn:
                    rows = conn.topology().get("groups") or []
                return sorted(rows, key=lambda r: int(r["partition"]))
            except Exception as exc:  # noqa: BLE001 - the next broker may answer
                last = f"{b.node_id}: {type(exc).__name__}: {exc}"
        raise RuntimeError(f"no broker reported its replica groups ({last})")

    def move_replica(self, partition: int, source: str, target: str) -> None:
        """Ask a running broker to move a partition's replica from ``source`` to
        ``target`` (node ids), as ``baton partitions move`` does; the move then runs.

        Raises:
            RuntimeError: the move was refused, or no running broker answered.
        """
        running = self.running()
        if not running:
            raise RuntimeError("no running broker to ask for a move")
        try:
            with client_sync.connect(running[0].address, timeout=10.0) as conn:
                conn.move_partition(partition, source, target)
        except BatonError as exc:
            raise RuntimeError(f"moving partition {partition} from {source} to {target}:"
                               f" {exc.message}") from exc

    def wait_member(self, b: Broker, timeout: float) -> None:
        """Wait until the broker's own topology lists it in the established view."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                with client_sync.connect(b.address, timeout=5.0) as conn:
                    topo = conn.topology()
                ids = [i.get("node_id") for i in topo.get("instances", [])]
                if b.node_id in ids and not topo.get("changing"):
                    return
                last = f"view {topo.get('view')}: {ids}"
            except Exception as exc:  # noqa: BLE001 - reported if it never gets there
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.25)
        raise RuntimeError(f"{b.node_id} is not in the view after {timeout:g}s ({last})")

    def _start_kafka(self) -> None:
        if not KAFKA_SCRIPT.exists():
            raise RuntimeError(f"--log kafka needs {KAFKA_SCRIPT} (run from a source checkout)")
        self.kafka_dir = self.base_dir / "kafka"
        self.kafka_dir.mkdir(parents=True, exist_ok=True)
        _kafka("fetch", timeout=600)
        listeners = []
        if self.net is not None:
            # One Kafka listener per broker, advertised as the address of that broker's
            # proxy: the metadata Kafka returns through the proxy points back at it.
            for b in self.brokers:
                name = f"B{b.node_id.rsplit('-', 1)[-1]}"
                port = free_port()
                proxy = self.net.add(f"kafka-{b.node_id}", f"127.0.0.1:{port}")
                listeners.append(f"{name}:{port}:{proxy.rpartition(':')[2]}")
                b.log_url = proxy
        bootstrap = _kafka("start", str(self.kafka_dir), timeout=180,
                           env={"BATON_KAFKA_LISTENERS": " ".join(listeners)})
        topic = f"baton-loadtest-{uuid.uuid4().hex[:10]}"
        self.log_url = f"kafka://{bootstrap.strip().splitlines()[-1]}/{topic}"
        for b in self.brokers:
            if b.log_url is not None:
                b.log_url = f"kafka://{b.log_url}/{topic}"

    def kafka_restart(self, down: float) -> None:
        """Stop the harness's Kafka broker, wait ``down`` seconds, start it again.

        Raises:
            RuntimeError: the log is not a Kafka the harness started (``--log kafka``).
        """
        if self.kafka_dir is None:
            raise RuntimeError("the kafka-restart fault needs --log kafka (a Kafka the harness starts)")
        _kafka("stop", str(self.kafka_dir), timeout=60)
        time.sleep(down)
        _kafka("start", str(self.kafka_dir), timeout=180)

    def damage_store(self, b: Broker, how: str, timeout: float = 90.0) -> str:
        """Stop the broker cleanly (its store flushes into SST files), damage its store,
        start it again and wait until it is a member: it must find the damage, set the
        store aside and join afresh (docs/operations.md "A damaged store").

        Args:
            how: ``bitflip`` (XOR 16 bytes in the middle of the newest SST file) or
                ``truncate`` (cut the newest SST file, or the WAL if there is none, to a
                third).

        Returns:
            The file damaged (its name).
        """
        self.terminate(b)
        store = b.data_dir / "store"
        files = sorted(store.glob("*.sst"), key=lambda p: p.stat().st_mtime)
        if not files:
            files = sorted(store.glob("*.log"), key=lambda p: p.stat().st_mtime)
        if not files:
            raise RuntimeError(f"{b.node_id}: no store file to damage in {store}")
        victim = files[-1]
        size = victim.stat().st_size
        with open(victim, "r+b") as f:
            if how == "bitflip":
                f.seek(size // 2)
                chunk = f.read(16)
                f.seek(size // 2)
                f.write(bytes(x ^ 0xFF for x in chunk))
            else:
                f.truncate(size // 3)
        self.restart(b, timeout)
        self.wait_member(b, timeout)
        return victim.name

    def enable_features(self, b: Broker, timeout: float = 60.0) -> tuple[list[str], list[str]]:
        """Enable every feature flag through one broker (``await
        conn.enable_features()``, no names: all its build knows), then wait until every
        running broker lists each of them enabled (``conn.list_features()``).

        Returns:
            The flags the call newly enabled, and every flag the broker knows.

        Raises:
            RuntimeError: the call was refused (a live member whose build lacks a flag
                is named), or a broker did not list every flag enabled within
                ``timeout``.
        """
        deadline = time.monotonic() + timeout
        try:
            with client_sync.connect(b.address, timeout=30.0) as conn:
                newly = conn.run(conn.connection.enable_features())
                names = sorted(str(f["name"]) for f in conn.run(conn.connection.list_features()))
        except BatonError as exc:
            raise RuntimeError(f"enable_features through {b.node_id}: {exc.message}") from exc
        while True:
            last: dict[str, str] = {}
            for other in self.running():
                try:
                    with client_sync.connect(other.address, timeout=5.0,
                                             failover=False) as conn:
                        listing = conn.run(conn.connection.list_features())
                except BatonError as exc:
                    last[other.node_id] = f"{type(exc).__name__}: {exc.message}"
                    continue
                states = {str(f["name"]): str(f["state"]) for f in listing}
                off = {n: states.get(n, "missing") for n in names if states.get(n) != "enabled"}
                if off:
                    last[other.node_id] = ", ".join(f"{n} {state}" for n, state in off.items())
            if not last:
                return sorted(newly), names
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the feature flags {names} are not enabled on every broker after"
                    f" {timeout:g}s: {last}"
                )
            time.sleep(0.25)  # polling the brokers: the EnableFeatures event is applied

    def view_of(self, b: Broker) -> str:
        """The established view a broker reports (``?`` if it does not answer in 5 s)."""
        try:
            with client_sync.connect(b.address, timeout=5.0) as conn:
                return str(conn.topology().get("view"))
        except Exception:  # noqa: BLE001 - a fault record, not a reason to stop
            return "?"

    def _stamp(self, b: Broker) -> Path:
        return self.base_dir / f"{b.node_id}.faketime"

    def set_clock(self, b: Broker, spec: str) -> None:
        """Set a broker's wall clock (libfaketime's syntax: ``+300`` five minutes ahead,
        ``-300`` behind, ``+0 x2`` at twice the speed, ``+0`` real); it takes effect
        within a second.

        Raises:
            RuntimeError: the cluster does not run its brokers under libfaketime.
        """
        if not self.fake_clock:
            raise RuntimeError("clock faults need the brokers started under libfaketime")
        stamp = self._stamp(b)
        tmp = stamp.with_suffix(".tmp")
        tmp.write_text(spec + "\n")
        tmp.replace(stamp)  # never a half-written stamp

    # --- network faults (Toxiproxy) -------------------------------------------------

    def _proxies_of(self, b: Broker) -> list[str]:
        assert self.net is not None
        names = (f"client-{b.node_id}", f"peer-{b.node_id}", f"kafka-{b.node_id}")
        return [n for n in names if n in self.net.proxies]

    def proxied(self, b: Broker) -> bool:
        """Are all of the broker's links behind a proxy (its clients, its peers, and
        Kafka on a Kafka log)? A broker a ``join`` started is not: Kafka's listeners, one
        per proxied broker, are fixed when it starts, and the workers never learn the
        joiner's address. Network faults pick among the proxied brokers only."""
        if self.net is None:
            return False
        wanted = [f"client-{b.node_id}", f"peer-{b.node_id}"]
        if self.requested_log == "kafka":
            wanted.append(f"kafka-{b.node_id}")
        return all(n in self.net.proxies for n in wanted)

    def _need_net(self) -> Toxiproxy:
        if self.net is None:
            raise RuntimeError("network faults need the cluster started with net=True (Toxiproxy)")
        return self.net

    def netsplit(self, b: Broker, hold: float) -> None:
        """Cut the broker from its clients, from its peers' links to it (a joiner's
        update from it) and (Kafka) from the log for ``hold`` s, then heal."""
        net = self._need_net()
        names = self._proxies_of(b)
        try:
            for name in names:
                net.cut(name)
            time.sleep(hold)
        finally:
            for name in names:
                net.heal(name)

    def client_partition(self, b: Broker, hold: float) -> None:
        """Cut the broker's clients from it for ``hold`` s, then heal."""
        net = self._need_net()
        name = f"client-{b.node_id}"
        try:
            net.cut(name)
            time.sleep(hold)
        finally:
            net.heal(name)

    def slow_net(self, hold: float, latency_ms: int = 80, jitter_ms: int = 40) -> None:
        """Latency and jitter on every proxied link for ``hold`` s, then heal."""
        net = self._need_net()
        names = list(net.proxies)
        try:
            for name in names:
                net.slow(name, latency_ms, jitter_ms)
            time.sleep(hold)
        finally:
            for name in names:
                net.heal(name)

    def _mount(self) -> None:
        if os.path.ismount(self.data_root):
            raise RuntimeError(f"{self.data_root} is already a mount point")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.disk_limit_mb}m,mode=0755", "tmpfs",
             str(self.data_root)],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(
                "--disk-limit / the diskfull fault need a size-limited filesystem, and "
                f"'mount -t tmpfs' failed ({done.stderr.strip() or done.returncode}); "
                "run the harness as root (or with CAP_SYS_ADMIN)"
            )
        self.mounted = True

    def fill_disk(self, hold: float) -> int:
        """Fill the data filesystem to ENOSPC, keep it full ``hold`` s, free it again.

        Returns:
            Bytes written.

        Raises:
            RuntimeError: the data dirs are not on a size-limited mount (``--disk-limit``).
        """
        if not self.mounted:
            raise RuntimeError("the diskfull fault needs --disk-limit MB (a size-limited data dir)")
        filler = self.data_root / f"filler-{secrets.token_hex(4)}"
        written = 0
        chunk = b"\0" * (1 << 20)
        try:
            with open(filler, "wb", buffering=0) as f:
                while True:
                    try:
                        written += f.write(chunk)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
            # The last partial chunk: fill the remaining bytes too.
            with open(filler, "ab", buffering=0) as f:
                for size in (65536, 4096, 512, 1):
                    while True:
                        try:
                            written += f.write(b"\0" * size)
                        except OSError:
                            break
            time.sleep(hold)
        finally:
            filler.unlink(missing_ok=True)
        return written


class ExternalSystem:
    """Brokers someone else runs (``--brokers-at``): nothing to start, stop or fault."""

    name = "baton"
    adapter = "baton"

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = list(addresses)

    def start(self) -> list[str]:
        """The given addresses."""
        return list(self.addresses)

    def stop(self) -> None:
        """Nothing to stop."""

    def processes(self) -> dict[str, int]:
        """No processes of ours to sample."""
        return {}


def _kafka(*args: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """Run ``.ci/kafka ARGS`` and return its stdout (RuntimeError with stderr on failure)."""
    try:
        done = subprocess.run(
            [str(KAFKA_SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
            # The python that makes the SASL_SSL listener's CA: ours has `cryptography`.
            env={"BATON_KAFKA_PYTHON": sys.executable, **os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f".ci/kafka {' '.join(args)} took over {timeout:g}s") from exc
    if done.returncode != 0:
        raise RuntimeError(f".ci/kafka {' '.join(args)} failed: {done.stderr[-2000:]}")
    return done.stdout
