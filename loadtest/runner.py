"""Run a workload against a system, then check and measure its history.

A run: start the system (N ``baton serve`` processes on free loopback ports, one shared
``file:`` log by default) unless it is given; declare the queues; spawn producer and
consumer worker processes; publish for the duration; let the consumers catch up; stop
them; drain every queue from the runner (recorded as actor ``drain``) and record each
queue's final ready + acquired count; stop what was started; merge the histories; run
the checker; compute rates and latencies from the same history.

Extension points for later slices: a :class:`System` (start / stop / addresses; a
RabbitMQ or NATS system goes here, with its client adapter in :mod:`loadtest.worker`)
and a fault schedule (:class:`Fault`, applied by :func:`run` at its time into the load).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import clients

from loadtest.checker import CheckResult, check
from loadtest.hist import LogHistogram
from loadtest.history import HistoryWriter, Op, OpKind, load_run
from loadtest.worker import WorkerSpec, consume_queue, worker_main
from loadtest.workloads import Workload

__all__ = [
    "System",
    "BatonCluster",
    "ExternalSystem",
    "Fault",
    "RunConfig",
    "RunResult",
    "run",
    "measure",
    "analyse_dir",
    "format_report",
]

DRAIN_ACTOR = "drain"
RUNNER_ACTOR = "runner"


class System(Protocol):
    """A system under test: something with client addresses that can be started/stopped."""

    name: str

    def start(self) -> list[str]:
        """Start it; returns the client addresses once every node serves."""
        ...

    def stop(self) -> None:
        """Stop whatever :meth:`start` started (idempotent)."""
        ...


class Fault(Protocol):
    """One scheduled fault (kill -9, SIGSTOP, join, ...): not in this slice."""

    at: float  # seconds into the load phase

    def apply(self, system: System) -> str:
        """Inject the fault; returns a description for the history."""
        ...


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BatonCluster:
    """N ``baton serve`` processes on 127.0.0.1 sharing one log, like ``baton dev``.

    Args:
        nodes: how many brokers.
        base_dir: the parent of their data dirs (and of the default ``file:`` log).
        log_url: the shared log (default ``file:<base_dir>/log``).
    """

    name = "baton"

    def __init__(self, nodes: int, base_dir: Path, log_url: str | None = None) -> None:
        self.nodes = nodes
        self.base_dir = base_dir
        self.log_url = log_url or f"file:{base_dir / 'log'}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.addresses: list[str] = []

    def start(self, timeout: float = 60.0) -> list[str]:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        outputs: list[Path] = []
        for i in range(1, self.nodes + 1):
            address = f"127.0.0.1:{_free_port()}"
            out_path = self.base_dir / f"node-{i}.out"
            cmd = [
                sys.executable, "-m", "broker", "--log-level", "WARNING", "serve",
                "--listen", address,
                "--data-dir", str(self.base_dir / f"node-{i}"),
                "--log", self.log_url,
                "--node-id", f"node-{i}",
            ]
            with open(out_path, "wb") as out:
                self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT))
            self.addresses.append(address)
            outputs.append(out_path)
        deadline = time.monotonic() + timeout
        for proc, path in zip(self.procs, outputs):
            while b"baton ready" not in path.read_bytes():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"broker exited with {proc.returncode}: "
                        f"{path.read_text(errors='replace')[-2000:]}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"broker did not get ready in {timeout}s ({path})")
                time.sleep(0.05)
        return list(self.addresses)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()


class ExternalSystem:
    """Brokers someone else runs (``--brokers-at``): nothing to start or stop."""

    name = "baton"

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = list(addresses)

    def start(self) -> list[str]:
        return list(self.addresses)

    def stop(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class RunConfig:
    """One run's settings (``python -m loadtest`` options)."""

    workload: Workload
    duration: float
    brokers: int = 3
    log_url: str | None = None
    brokers_at: tuple[str, ...] = ()
    report_dir: str | None = None
    seed: int = 1
    progress: bool = True
    faults: tuple[Any, ...] = ()
    #: Seconds the consumers get to catch up after the producers finish.
    catch_up: float = 20.0
    #: Seconds without a message after which the drain of a queue ends.
    drain_idle: float = 1.0


@dataclass(slots=True)
class RunResult:
    """A run's figures and the checker's verdict."""

    check: CheckResult
    metrics: dict[str, Any]
    run_dir: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """The checker found no violation."""
        return self.check.ok

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "ok": self.ok,
            "config": self.config,
            "metrics": self.metrics,
            "checker": self.check.to_dict(),
            "run_dir": self.run_dir,
        }


def _log(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr, flush=True)


async def _prepare(addresses: list[str], workload: Workload, w: HistoryWriter, purge: bool) -> None:
    async with await clients.connect(addresses) as conn:
        for q in workload.queue_names():
            dlq = workload.dead_letter_of(q)
            if dlq is not None:
                await conn.declare_queue(dlq)
                w.record(OpKind.QUEUE, dlq, info="delivery_limit=20")
                if purge:
                    await conn.purge_queue(dlq)
            await conn.declare_queue(
                q, delivery_limit=workload.delivery_limit, dead_letter=dlq
            )
            w.record(
                OpKind.QUEUE, q, info=f"delivery_limit={workload.delivery_limit},dead_letter={dlq or ''}"
            )
            if purge:
                await conn.purge_queue(q)


async def _drain(addresses: list[str], workload: Workload, w: HistoryWriter, idle: float) -> None:
    queues = list(workload.queue_names())
    # Work queues first: their poison messages may still move to the dead-letter queues.
    dlqs = [d for q in queues if (d := workload.dead_letter_of(q)) is not None]
    async with await clients.connect(addresses) as conn:
        for group in (queues, dlqs):
            await asyncio.gather(
                *(
                    consume_queue(conn, q, DRAIN_ACTOR, w, workload, ack_all=True, idle_stop=idle)
                    for q in group
                )
            )
        for q in queues + dlqs:
            stats = await conn.queue_stats(q)
            left = int(stats.get("ready", 0)) + int(stats.get("acquired", 0))
            w.record(OpKind.FINAL, q, count=left, info=json.dumps(stats, default=str))


def _spread(items: Sequence[str], parts: int, index: int) -> tuple[str, ...]:
    """Worker ``index``'s share of ``items`` (each item to at least one worker)."""
    if len(items) >= parts:
        return tuple(items[index::parts])
    return (items[index % len(items)],)


def _rotate(addresses: list[str], i: int) -> tuple[str, ...]:
    k = i % len(addresses)
    return tuple(addresses[k:] + addresses[:k])


def run(config: RunConfig) -> RunResult:
    """Run one load test (see the module docstring) and return its checked figures."""
    workload = config.workload
    if config.report_dir:
        run_dir = Path(config.report_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        for old in run_dir.glob("*.hist"):
            old.unlink()
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="baton-loadtest-"))
    system: System
    if config.brokers_at:
        system = ExternalSystem(config.brokers_at)
    else:
        system = BatonCluster(config.brokers, run_dir / "brokers", config.log_url)
    ctx = multiprocessing.get_context("spawn")
    procs: list[multiprocessing.process.BaseProcess] = []
    try:
        _log(config.progress, f"loadtest: starting {config.brokers} broker(s) ..."
             if not config.brokers_at else "loadtest: using brokers at "
             + ",".join(config.brokers_at))
        addresses = system.start()
        import uvloop

        with HistoryWriter(run_dir / "runner.hist", RUNNER_ACTOR) as w:
            uvloop.run(_prepare(addresses, workload, w, purge=bool(config.brokers_at)))
        stop = ctx.Event()
        producers: list[tuple[multiprocessing.process.BaseProcess, Any]] = []
        consumers: list[tuple[multiprocessing.process.BaseProcess, Any]] = []
        queues = workload.queue_names()
        dlqs = [d for q in queues if (d := workload.dead_letter_of(q)) is not None]
        n_pro, n_con = workload.producers, workload.consumers
        for i in range(n_con):
            counter = ctx.RawValue("q", 0)
            spec = WorkerSpec(
                role="consumer",
                actor=f"c{i + 1}",
                addresses=_rotate(addresses, i),
                queues=_spread(queues, n_con, i) + _spread(dlqs, n_con, i) if dlqs
                else _spread(queues, n_con, i),
                ack_all=tuple(dlqs),
                workload=workload,
                history=str(run_dir / f"c{i + 1}.hist"),
                duration=config.duration,
                max_messages=None,
                rate=None,
                seed=config.seed * 1000 + 500 + i,
            )
            proc = ctx.Process(target=worker_main, args=(spec, counter, stop), name=spec.actor)
            consumers.append((proc, counter))
        for i in range(n_pro):
            counter = ctx.RawValue("q", 0)
            cap = workload.max_messages
            spec = WorkerSpec(
                role="producer",
                actor=f"p{i + 1}",
                addresses=_rotate(addresses, i + 1),
                queues=tuple(queues),
                ack_all=(),
                workload=workload,
                history=str(run_dir / f"p{i + 1}.hist"),
                duration=config.duration,
                max_messages=None if cap is None else (cap + n_pro - 1 - i) // n_pro,
                rate=None if workload.rate is None else workload.rate / n_pro,
                seed=config.seed * 1000 + i,
            )
            proc = ctx.Process(target=worker_main, args=(spec, counter, stop), name=spec.actor)
            producers.append((proc, counter))
        for p, _ in consumers + producers:
            p.start()
            procs.append(p)
        t0 = time.monotonic()
        last_pub = last_con = 0
        last_t = t0
        next_fault = 0
        faults = sorted(config.faults, key=lambda f: float(f.at))

        def tick() -> tuple[int, int]:
            nonlocal last_pub, last_con, last_t
            pub = sum(int(c.value) for _, c in producers)
            con = sum(int(c.value) for _, c in consumers)
            now = time.monotonic()
            dt = max(1e-6, now - last_t)
            _log(
                config.progress,
                f"  {now - t0:6.1f}s  confirmed {pub:>9,} ({(pub - last_pub) / dt:>8,.0f}/s)"
                f"  accepted {con:>9,} ({(con - last_con) / dt:>8,.0f}/s)",
            )
            last_pub, last_con, last_t = pub, con, now
            return pub, con

        # Load phase: until every producer is done (duration, or its message cap).
        hard_stop = t0 + config.duration + 30
        while any(p.is_alive() for p, _ in producers) and time.monotonic() < hard_stop:
            while next_fault < len(faults) and time.monotonic() - t0 >= faults[next_fault].at:
                faults[next_fault].apply(system)
                next_fault += 1
            time.sleep(1.0)
            tick()
        for p, _ in producers:
            p.join(5)
            if p.is_alive():
                p.terminate()
        # Catch-up: consumers keep going until nothing more is accepted for a while.
        idle_since = time.monotonic()
        pub, con = tick()
        catch_up_end = time.monotonic() + config.catch_up
        while time.monotonic() < catch_up_end:
            if con >= pub and not workload.release_share and not workload.reject_share:
                break
            time.sleep(0.5)
            before = con
            pub, con = tick()
            if con != before:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > 1.5:
                break
        stop.set()
        for p, _ in consumers:
            p.join(20)
            if p.is_alive():
                p.terminate()
                p.join(5)
        _log(config.progress, "loadtest: draining the queues ...")
        with HistoryWriter(run_dir / "drain.hist", DRAIN_ACTOR) as w:
            uvloop.run(_drain(addresses, workload, w, config.drain_idle))
        failed_workers = [p.name for p in procs if p.exitcode not in (0, None)]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
        system.stop()
    result = analyse_dir(run_dir)
    result.config = {
        "preset": workload.name,
        "duration": config.duration,
        "brokers": len(config.brokers_at) or config.brokers,
        "log": config.log_url or ("external" if config.brokers_at else "file:"),
        "seed": config.seed,
        "workload": asdict(workload),
    }
    if failed_workers:
        result.metrics["failed_workers"] = failed_workers
    return result


def measure(ops: Sequence[Op]) -> dict[str, Any]:
    """Rates and latencies of a merged history (the drain is left out of both).

    - confirmed publish msg/s: publish-ok records over first publish-invoke .. last
      publish-ok;
    - consume msg/s: ack-ok records of the workers over their first delivery .. last
      ack-ok;
    - confirm latency: publish-ok time - publish-invoke time, per message;
    - end-to-end latency: a message's first delivery to a worker - its publish-invoke.
    """
    invoked: dict[str, int] = {}
    confirm = LogHistogram()
    e2e = LogHistogram()
    delivered: set[str] = set()
    first_pub = last_ok = 0
    first_del = last_ack = 0
    n_ok = n_ack = n_fail = 0
    for op in ops:
        kind = op.kind
        if kind == OpKind.PUBLISH_INVOKE:
            invoked[op.msg] = op.t
            if not first_pub:
                first_pub = op.t
        elif kind == OpKind.PUBLISH_OK:
            n_ok += 1
            last_ok = op.t
            t = invoked.get(op.msg)
            if t is not None:
                confirm.record(op.t - t)
        elif kind == OpKind.PUBLISH_FAIL:
            n_fail += 1
        elif op.actor == DRAIN_ACTOR:
            continue
        elif kind == OpKind.DELIVER:
            if not first_del:
                first_del = op.t
            if op.msg not in delivered:
                delivered.add(op.msg)
                t = invoked.get(op.msg)
                if t is not None:
                    e2e.record(op.t - t)
        elif kind == OpKind.ACK_OK:
            n_ack += 1
            last_ack = op.t
    pub_s = (last_ok - first_pub) / 1e9 if n_ok else 0.0
    con_s = (last_ack - first_del) / 1e9 if n_ack else 0.0
    return {
        "published": len(invoked),
        "confirmed": n_ok,
        "publish_failed": n_fail,
        "accepted": n_ack,
        "publish_seconds": round(pub_s, 3),
        "consume_seconds": round(con_s, 3),
        "confirmed_msgs_per_s": n_ok / pub_s if pub_s > 0 else 0.0,
        "consume_msgs_per_s": n_ack / con_s if con_s > 0 else 0.0,
        "confirm_latency_ms": confirm.summary_ms(),
        "e2e_latency_ms": e2e.summary_ms(),
    }


def analyse_dir(run_dir: str | os.PathLike[str]) -> RunResult:
    """Load a run directory's histories, check them and measure them."""
    ops = load_run(run_dir)
    return RunResult(check(ops), measure(ops), str(run_dir))


def format_report(result: RunResult) -> str:
    """The table printed at the end of a run."""
    m = result.metrics
    lines = []
    cfg = result.config
    if cfg:
        lines.append(
            f"preset {cfg.get('preset')}  {cfg.get('duration')}s  brokers {cfg.get('brokers')}"
            f"  log {cfg.get('log')}"
        )
    lines.append(
        f"confirmed publishes {m['confirmed']:>10,}  {m['confirmed_msgs_per_s']:>10,.0f} msg/s"
        f"   (failed {m['publish_failed']})"
    )
    lines.append(
        f"accepted (consumed) {m['accepted']:>10,}  {m['consume_msgs_per_s']:>10,.0f} msg/s"
    )
    lines.append(f"{'latency ms':22}{'p50':>9}{'p90':>9}{'p99':>9}{'p99.9':>9}{'max':>9}")
    for label, key in (("confirm", "confirm_latency_ms"), ("end-to-end", "e2e_latency_ms")):
        h = m[key]
        lines.append(
            f"{label:22}" + "".join(f"{h[k]:>9.2f}" for k in ("p50", "p90", "p99", "p99.9", "max"))
        )
    if m.get("failed_workers"):
        lines.append(f"workers that failed: {', '.join(m['failed_workers'])}")
    lines.append(result.check.summary())
    return "\n".join(lines)


def save(result: RunResult, json_path: str | None, keep_dir: bool) -> None:
    """Write ``--json`` and the run dir's ``result.json``; delete a clean temp run dir."""
    data = result.to_dict()
    if json_path:
        with open(json_path, "w") as f:
            json.dump(data, f, indent=2)
    if keep_dir or not result.ok:
        with open(Path(result.run_dir) / "result.json", "w") as f:
            json.dump(data, f, indent=2)
    else:
        shutil.rmtree(result.run_dir, ignore_errors=True)
