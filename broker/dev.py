"""``baton dev --nodes N``: a local cluster of N brokers on one shared ``file:`` log.

Each broker is a real ``baton serve`` process with its own data dir under ``--data-dir``
(its output in ``node-I.out`` there) and the shared log ``file:<data-dir>/log``,
listening on the ``--listen`` port and the next ones (with port 0, each on a free port
of its own); ``--amqp-listen`` and ``--admin-listen`` likewise, and any other ``serve``
setting given is passed to every broker. The addresses are printed once every broker is
a member of the view.

A broker that exits (killed, crashed) is reported by name and the others keep running:
Enter restarts the brokers that are down (``--restart``: at once, by itself), on their
data dirs and ports, so a kill shows failover and recovery. Ctrl-C (or SIGTERM) stops
them all, cleanly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from batonmq.broker.config import admin_ready_address, amqp_ready_address, ready_address

__all__ = ["run_dev", "DEV_OWN_FLAGS"]

#: ``serve`` flags ``baton dev`` sets for each broker itself.
DEV_OWN_FLAGS = (
    "--data-dir", "--listen", "--host", "--port", "--log", "--log-url", "--node-id",
    "--amqp-listen", "--admin-listen", "--advertise",
)

#: Seconds a broker has to print its ready line.
_START_S = 60.0


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class _Node:
    """One broker of the dev cluster."""

    name: str
    data_dir: Path
    listen: tuple[str, int]
    amqp: tuple[str, int] | None
    admin: tuple[str, int] | None
    serve_args: list[str]
    log_url: str
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""
    extras: list[str] = field(default_factory=list)  # its AMQP and admin addresses
    out_path: Path = field(init=False)
    reported: bool = False  # its exit was reported

    def __post_init__(self) -> None:
        self.out_path = self.data_dir.parent / f"{self.name}.out"

    def command(self) -> list[str]:
        host, port = self.listen
        cmd = [
            sys.executable, "-m", "batonmq.broker", "serve",
            "--listen", f"{host}:{port}",
            "--data-dir", str(self.data_dir),
            "--log", self.log_url,
            "--node-id", self.name,
        ]
        if self.amqp is not None:
            cmd += ["--amqp-listen", f"{self.amqp[0]}:{self.amqp[1]}"]
        if self.admin is not None:
            cmd += ["--admin-listen", f"{self.admin[0]}:{self.admin[1]}"]
        return cmd + self.serve_args

    def launch(self) -> int:
        """Start the broker; returns the offset in its output file its lines start at."""
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.out_path, "ab") as out:
            start = out.tell()
            self.proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.reported = False
        return start

    def wait_ready(self, since: int, deadline: float) -> None:
        """Wait for the ready line printed after ``since``; learn the ports bound (so
        that a restart takes the same ones).

        Raises:
            RuntimeError: the broker exited first, or did not get ready in time; with
                its last lines (its own reason, such as an address in use).
        """
        assert self.proc is not None
        while True:
            lines = self._lines(since)
            amqp = [a for a in map(amqp_ready_address, lines) if a]
            admin = [a for a in map(admin_ready_address, lines) if a]
            ready = [a for a in map(ready_address, lines) if a]
            if ready:
                self.address = ready[-1]
                self.listen = (self.listen[0], int(self.address.rpartition(":")[2]))
                self.extras = []
                if amqp and self.amqp is not None:
                    self.amqp = (self.amqp[0], int(amqp[-1].rpartition(":")[2]))
                    self.extras.append(f"AMQP {amqp[-1]}")
                if admin and self.admin is not None:
                    self.admin = (self.admin[0], int(admin[-1].rpartition(":")[2]))
                    self.extras.append(f"admin console http://{admin[-1]}/")
                return
            code = self.proc.poll()
            if code is not None or time.monotonic() > deadline:
                why = _signal_name(code) if code is not None else f"not ready in {_START_S:.0f} s"
                tail = "\n".join(f"    {line}" for line in lines[-8:])
                raise RuntimeError(
                    f"{self.name} did not start ({why}); its last lines ({self.out_path}):\n{tail}"
                )
            time.sleep(0.05)

    def _lines(self, since: int) -> list[str]:
        try:
            with open(self.out_path, "rb") as f:
                f.seek(since)
                return f.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def describe(self) -> str:
        more = f"  ({', '.join(self.extras)})" if self.extras else ""
        pid = self.proc.pid if self.proc is not None else "-"
        return f"{self.name} {self.address} pid {pid}{more}"


def _port_plus(address: tuple[str, int] | None, i: int) -> tuple[str, int] | None:
    if address is None:
        return None
    host, port = address
    return host, (port + i if port else 0)


def _enter_pressed(pressed: threading.Event) -> None:
    """Set ``pressed`` on each line read from the terminal (a daemon thread)."""
    while True:
        try:
            line = sys.stdin.readline()
        except (OSError, ValueError):
            return
        if not line:
            return  # no terminal (or closed): only --restart restarts
        pressed.set()


def run_dev(
    nodes: int,
    data_dir: str,
    listen: tuple[str, int],
    serve_args: list[str],
    *,
    amqp: tuple[str, int] | None = None,
    admin: tuple[str, int] | None = None,
    restart: bool = False,
) -> int:
    """Run the local cluster until interrupted; returns the exit status."""
    if nodes < 1:
        print("baton dev: --nodes must be at least 1", file=sys.stderr)
        return 2
    own = [a for a in serve_args if a.split("=", 1)[0] in DEV_OWN_FLAGS]
    if own:
        print(f"baton dev: {own[0].split('=', 1)[0]} is set by baton dev itself for each broker"
              " (see baton dev --help)", file=sys.stderr)
        return 2
    root = Path(data_dir).absolute()
    root.mkdir(parents=True, exist_ok=True)
    log_url = f"file:{root / 'log'}"
    cluster = [
        _Node(
            f"node-{i + 1}", root / f"node-{i + 1}", _port_plus(listen, i) or listen,
            _port_plus(amqp, i), _port_plus(admin, i), list(serve_args), log_url,
        )
        for i in range(nodes)
    ]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    pressed = threading.Event()
    try:
        starts = [n.launch() for n in cluster]
        deadline = time.monotonic() + _START_S
        for node, since in zip(cluster, starts):
            node.wait_ready(since, deadline)
            print(f"  {node.describe()} ready", flush=True)
        if admin is not None:
            # The admin listener asks for a login (docs/admin.md): a dev cluster has guest.
            print("admin console and API: log in as guest / guest (from this machine)",
                  flush=True)
        print(f"cluster of {nodes} on {log_url} (each broker's output: {root}/node-N.out)",
              flush=True)
        print(f"addresses: {','.join(n.address for n in cluster)}", flush=True)
        print("Ctrl-C stops them all.", flush=True)
        threading.Thread(target=_enter_pressed, args=(pressed,), daemon=True).start()
        while not stop.is_set():
            down = [n for n in cluster if n.proc is not None and n.proc.poll() is not None]
            for node in down:
                if not node.reported:
                    node.reported = True
                    assert node.proc is not None
                    left = len(cluster) - len(down)
                    what = "restarting it" if restart else "press Enter to restart it"
                    print(
                        f"{node.name} ({node.address}) exited ({_signal_name(node.proc.returncode)});"
                        f" {left} of {len(cluster)} running; {what}",
                        flush=True,
                    )
            if down and (restart or pressed.is_set()):
                pressed.clear()
                for node in down:
                    since = node.launch()
                    try:
                        node.wait_ready(since, time.monotonic() + _START_S)
                    except RuntimeError as exc:  # the others keep running
                        print(f"baton dev: {exc}", file=sys.stderr, flush=True)
                        node.reported = True
                        continue
                    print(f"  {node.describe()} restarted", flush=True)
            pressed.clear()
            stop.wait(0.2)
        return 0
    except RuntimeError as exc:
        print(f"baton dev: {exc}", file=sys.stderr)
        return 1
    finally:
        procs = [n.proc for n in cluster if n.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        print("all brokers stopped", flush=True)
