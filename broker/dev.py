"""``baton dev --nodes N``: a local cluster of N brokers on one shared ``file:`` log.

Each broker is a real ``baton serve`` process with its own data dir under
``--data-dir`` and the shared log ``file:<data-dir>/log``, listening on the
``--listen`` port and the next ones (with port 0, each on a free port of its own).
The addresses, from the brokers' ready lines, are printed once every broker is
a member of the view (with ``--admin-listen HOST:0`` among the options passed on, each
broker's console address too, and the login to use: ``guest`` / ``guest``); Ctrl-C (or
SIGTERM) stops them all, cleanly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from batonmq.broker.config import admin_ready_address, ready_address

__all__ = ["run_dev"]


def _wait_ready(proc: subprocess.Popen[bytes], deadline: float) -> tuple[str, str | None]:
    """Read the broker's output until its ready line; returns the address it names and
    its admin listener's, if it has one (``--admin-listen``: its line comes first)."""
    assert proc.stdout is not None
    admin = None
    for raw in proc.stdout:
        line = raw.decode(errors="replace").rstrip()
        admin = admin_ready_address(line) or admin
        address = ready_address(line)
        if address is not None:
            return address, admin
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"broker {proc.pid} did not start (exit {proc.poll()})")


def run_dev(nodes: int, data_dir: str, host: str, base_port: int, extra: list[str]) -> int:
    """Run the local cluster until interrupted; returns the exit status."""
    if nodes < 1:
        print("baton dev: --nodes must be at least 1", file=sys.stderr)
        return 2
    os.makedirs(data_dir, exist_ok=True)
    log_url = f"file:{os.path.join(os.path.abspath(data_dir), 'log')}"
    procs: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    addresses = []
    try:
        for i in range(nodes):
            cmd = [
                sys.executable, "-m", "batonmq.broker", "serve",
                "--listen", f"{host}:{base_port + i if base_port else 0}",
                "--data-dir", os.path.join(data_dir, f"node-{i + 1}"),
                "--log", log_url,
                "--node-id", f"node-{i + 1}",
                *extra,
            ]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        admins = False
        for proc in procs:
            address, admin = _wait_ready(proc, deadline)
            addresses.append(address)
            print(f"  broker {address} ready"
                  + (f", admin console http://{admin}/" if admin else ""), flush=True)
            admins = admins or admin is not None
        if admins:
            # The admin listener asks for a login (docs/admin.md): a dev cluster has guest.
            print("admin console and API: log in as guest / guest (from this machine)",
                  flush=True)
        print(f"cluster of {nodes} on {log_url}", flush=True)
        print(f"addresses: {','.join(addresses)}", flush=True)
        print("Ctrl-C stops them all.", flush=True)
        while not stop.is_set():
            for proc in procs:
                if proc.poll() is not None:
                    print(f"a broker exited with {proc.returncode}", file=sys.stderr)
                    return 1
            stop.wait(0.5)
        return 0
    except RuntimeError as exc:
        print(f"baton dev: {exc}", file=sys.stderr)
        return 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        print("all brokers stopped", flush=True)
