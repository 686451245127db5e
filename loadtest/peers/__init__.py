"""Peer brokers run side by side with Baton: the same workload, on the same machine.

Each peer has a system (its server, started and stopped by the harness on 127.0.0.1
with its data in the run dir) and a client adapter (:class:`batonmq.loadtest.adapters.ClientAdapter`):

- :mod:`batonmq.loadtest.peers.rabbitmq`: RabbitMQ (Debian's ``rabbitmq-server``), one quorum
  queue per work queue, publisher confirms, manual acks, via aio-pika;
- :mod:`batonmq.loadtest.peers.nats`: NATS JetStream (Debian's ``nats-server``), one work-queue
  stream per work queue with a shared durable pull consumer, via nats-py.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

__all__ = ["require_binary", "wait_for_line", "stop_process"]


def require_binary(name: str, package: str, candidates: tuple[str, ...] = ()) -> str:
    """The path of a server binary, or a RuntimeError naming the Debian package to install."""
    for path in candidates:
        if Path(path).exists():
            return path
    found = shutil.which(name)
    if found:
        return found
    raise RuntimeError(
        f"{name} not found: install Debian's {package} package "
        f"(apt-get install -y {package}) to run this peer"
    )


def wait_for_line(
    proc: subprocess.Popen[bytes], out: Path, needle: bytes, timeout: float, what: str
) -> None:
    """Wait until ``needle`` appears in the process's output file.

    Raises:
        RuntimeError: the process exited or the time ran out (with the output's tail).
    """
    deadline = time.monotonic() + timeout
    while True:
        text = out.read_bytes() if out.exists() else b""
        if needle in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited with {proc.returncode}: {text.decode(errors='replace')[-2000:]}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{what} did not get ready in {timeout:g}s: {text.decode(errors='replace')[-2000:]}"
            )
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen[bytes] | None, grace: float = 30.0) -> None:
    """SIGTERM a process we started, SIGKILL it after ``grace`` s, and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
