"""Run a workload against a system, then check and measure its history.

A run: start the system (Baton: N ``baton serve`` processes on free loopback ports, one
shared ``file:`` log by default; or a RabbitMQ / NATS server, see :mod:`batonmq.loadtest.peers`)
unless it is given; declare the queues; spawn producer and consumer worker processes;
publish for the duration, applying the fault schedule (:mod:`batonmq.loadtest.faults`) and
sampling the servers' CPU and RSS (:mod:`batonmq.loadtest.procstat`); let the consumers catch
up; stop them; drain every queue from the runner (recorded as actor ``drain``) and
record each queue's final ready + acquired count; stop what was started; merge the
histories; run the checker; compute rates, latencies and a per-second timeline from the
same history.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from batonmq.loadtest.adapters import BatonAdapter
from batonmq.loadtest.connect import open_adapter
from batonmq.loadtest.checker import CheckResult, check
from batonmq.loadtest.cluster import BatonCluster, ExternalSystem
from batonmq.loadtest.faults import (
    NET_KINDS, FaultEvent, FaultInjector, check_supported, fault_line,
)
from batonmq.loadtest.hist import LogHistogram
from batonmq.loadtest.history import HistoryWriter, Op, OpKind, load_run
from batonmq.loadtest.procstat import GENERATOR_SATURATED, Sampler, summarize
from batonmq.loadtest.worker import DRAIN_ACTOR, WorkerSpec, drain_queues, worker_main
from batonmq.loadtest.workloads import Workload, rotate, spread

__all__ = [
    "System",
    "RunConfig",
    "RunResult",
    "make_system",
    "run",
    "measure",
    "timeline",
    "analyse_dir",
    "format_report",
    "format_comparison",
    "comparison_rows",
    "save",
]

RUNNER_ACTOR = "runner"
SAMPLES_FILE = "samples.json"


class System(Protocol):
    """A system under test: server processes the harness starts, samples and stops.

    Attributes:
        name: what the reports call it (``baton``, ``rabbitmq``, ``nats``).
        adapter: the client adapter the workers use (:data:`batonmq.loadtest.adapters.ADAPTERS`).
    """

    name: str
    adapter: str

    def start(self) -> list[str]:
        """Start it; returns the client addresses once every node serves."""
        ...

    def stop(self) -> None:
        """Stop whatever :meth:`start` started (idempotent)."""
        ...

    def processes(self) -> dict[str, int]:
        """``label -> pid`` of its live server processes (sampled for CPU and RSS)."""
        ...


@dataclass(frozen=True, slots=True)
class RunConfig:
    """One run's settings (``python -m batonmq.loadtest`` options)."""

    workload: Workload
    duration: float
    system: str = "baton"
    brokers: int = 3
    #: Nodes of a peer (RabbitMQ, NATS): 1, or a cluster of 3.
    peer_nodes: int = 3
    log_url: str | None = None
    brokers_at: tuple[str, ...] = ()
    report_dir: str | None = None
    seed: int = 1
    progress: bool = True
    faults: tuple[FaultEvent, ...] = ()
    #: The ``--faults`` text the schedule came from (for the report).
    faults_spec: str = ""
    #: Put the Baton data dirs and file log on a tmpfs of this many MiB (diskfull).
    disk_limit_mb: int | None = None
    #: Data partitions of the started Baton brokers' new log (``serve --partitions``).
    partitions: int = 1
    #: Each data partition's replica group size (``serve --replicas``; 0: not given).
    replicas: int = 0
    #: Another build's ``baton`` (``--old-build``, loadtest/builds.py): the brokers start
    #: on it, and ``upgrade`` faults move them to the running build.
    old_build: str | None = None
    #: Seconds the consumers get to catch up after the producers finish.
    catch_up: float = 20.0
    #: Seconds without a message after which the drain of a queue ends.
    drain_idle: float = 1.0
    #: Seconds the drain keeps coming back to a queue that still reports messages (held
    #: by a consumer of a broker that is gone, until the cluster gives them back).
    drain_wait: float = 30.0
    #: Seconds between CPU / RSS samples of the servers.
    sample_interval: float = 1.0


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


def make_system(config: RunConfig, base_dir: Path) -> System:
    """The system a config names, not started yet.

    Raises:
        RuntimeError: an unknown system, or options that do not fit it.
    """
    old = Path(config.old_build) if config.old_build else None
    parts = ["--partitions", str(config.partitions)] if config.partitions > 1 else []
    if config.replicas and config.partitions > 1:
        parts += ["--replicas", str(config.replicas)]
    if old is not None and (config.brokers_at or config.system not in ("baton", "baton-amqp")):
        raise RuntimeError("--old-build is for Baton brokers the harness starts")
    if config.system == "baton":
        if config.brokers_at:
            return ExternalSystem(list(config.brokers_at))
        return BatonCluster(config.brokers, base_dir, config.log_url, config.disk_limit_mb,
                            net=any(e.kind in NET_KINDS for e in config.faults),
                            fake_clock=any(e.kind == "clockjump" for e in config.faults),
                            old_baton=old, extra_args=parts)
    if config.brokers_at:
        raise RuntimeError("--brokers-at is for Baton only: the harness runs the peers itself")
    if config.system == "baton-amqp":
        return BatonCluster(config.brokers, base_dir, config.log_url, amqp=True, old_baton=old,
                            extra_args=parts)
    if config.system == "rabbitmq":
        from batonmq.loadtest.peers.rabbitmq import RabbitSystem

        return RabbitSystem(base_dir, config.peer_nodes)
    if config.system in ("nats", "nats-sync"):
        from batonmq.loadtest.peers.nats import NatsSystem

        return NatsSystem(base_dir, config.peer_nodes, sync=config.system == "nats-sync")
    raise RuntimeError(
        f"unknown system {config.system!r} (baton, baton-amqp, rabbitmq, nats, nats-sync)"
    )


async def _prepare(
    system: str, addresses: list[str], workload: Workload, w: HistoryWriter, purge: bool
) -> None:
    conn = await open_adapter(system, addresses, workload)
    if workload.work_queue and not isinstance(conn, BatonAdapter):
        await conn.close()
        raise RuntimeError(f"the {workload.name} workload uses delays and retries: Baton only")
    if workload.leaders and not isinstance(conn, BatonAdapter):
        await conn.close()
        raise RuntimeError("--leaders runs candidates for a Baton service: Baton only")
    try:
        for q in workload.queue_names():
            dlq = workload.dead_letter_of(q)
            if dlq is not None:
                await conn.declare(dlq, 20, None)
                w.record(OpKind.QUEUE, dlq, info="delivery_limit=20")
                if purge:
                    await conn.purge(dlq)
            info = f"delivery_limit={workload.delivery_limit},dead_letter={dlq or ''}"
            if workload.work_queue and isinstance(conn, BatonAdapter):
                await conn.declare_work(q, workload.delivery_limit, dlq, workload.retry_delay)
                info += f",retry_ms={int(workload.retry_delay * 1000)}"
            else:
                await conn.declare(q, workload.delivery_limit, dlq)
            w.record(OpKind.QUEUE, q, info=info)
            if purge:
                await conn.purge(q)
    finally:
        await conn.close()


class _Progress:
    """The live progress line: one line rewritten in place on a terminal, else a line a second."""

    def __init__(self, enabled: bool, system: str, t0: float) -> None:
        self.enabled = enabled
        self.system = system
        self.t0 = t0
        self.tty = sys.stderr.isatty()
        self.last_pub = self.last_con = 0
        self.last_t = t0
        self.width = 0

    def update(self, phase: str, pub: int, con: int, cpu: float, rss: float, fault: str) -> None:
        now = time.monotonic()
        dt = max(1e-6, now - self.last_t)
        pub_rate, con_rate = (pub - self.last_pub) / dt, (con - self.last_con) / dt
        self.last_pub, self.last_con, self.last_t = pub, con, now
        if not self.enabled:
            return
        text = (
            f"  {self.system:8} {phase:8} {now - self.t0:6.1f}s  confirmed {pub:>9,} "
            f"({pub_rate:>7,.0f}/s)  accepted {con:>9,} ({con_rate:>7,.0f}/s)  "
            f"cpu {cpu:4.2f}  rss {rss:6.0f} MiB{('  ' + fault) if fault else ''}"
        )
        if self.tty:
            pad = max(0, self.width - len(text))
            self.width = len(text)
            sys.stderr.write("\r" + text + " " * pad)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def run(config: RunConfig) -> RunResult:
    """Run one load test (see the module docstring) and return its checked figures.

    Raises:
        RuntimeError: the system could not be started, or the faults do not fit it.
    """
    import uvloop

    workload = config.workload
    if config.report_dir:
        run_dir = Path(config.report_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        for old in [*run_dir.glob("*.hist"), run_dir / SAMPLES_FILE, run_dir / "result.json"]:
            old.unlink(missing_ok=True)
        # An earlier run's servers (log, data dirs) would bring its messages, whose ids
        # this run reuses: start from nothing.
        shutil.rmtree(run_dir / "servers", ignore_errors=True)
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="baton-loadtest-"))
    load_before = os.getloadavg()[0]  # other work on the machine skews the figures
    system = make_system(config, run_dir / "servers")
    check_supported(list(config.faults), system)
    ctx = multiprocessing.get_context("spawn")
    procs: list[multiprocessing.process.BaseProcess] = []
    injector: FaultInjector | None = None
    sampler: Sampler | None = None
    gen_sampler: Sampler | None = None
    failed_workers: list[str] = []
    fault_errors: list[str] = []
    faults_applied: list[dict[str, Any]] = []
    load_end = 0.0
    try:
        _log(config.progress, f"loadtest: starting {config.system} ..." if not config.brokers_at
             else "loadtest: using brokers at " + ",".join(config.brokers_at))
        addresses = system.start()
        with HistoryWriter(run_dir / "runner.hist", RUNNER_ACTOR) as w:
            uvloop.run(_prepare(system.adapter, addresses, workload, w,
                                purge=bool(config.brokers_at)))
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
                addresses=rotate(addresses, i),
                queues=spread(queues, n_con, i) + spread(dlqs, n_con, i) if dlqs
                else spread(queues, n_con, i),
                ack_all=tuple(dlqs),
                workload=workload,
                history=str(run_dir / f"c{i + 1}.hist"),
                duration=config.duration,
                max_messages=None,
                rate=None,
                seed=config.seed * 1000 + 500 + i,
                system=system.adapter,
            )
            proc = ctx.Process(target=worker_main, args=(spec, counter, stop), name=spec.actor)
            consumers.append((proc, counter))
        for i in range(n_pro):
            counter = ctx.RawValue("q", 0)
            cap = workload.max_messages
            spec = WorkerSpec(
                role="producer",
                actor=f"p{i + 1}",
                addresses=rotate(addresses, i + 1),
                queues=tuple(queues),
                ack_all=(),
                workload=workload,
                history=str(run_dir / f"p{i + 1}.hist"),
                duration=config.duration,
                max_messages=None if cap is None else (cap + n_pro - 1 - i) // n_pro,
                rate=None if workload.rate is None else workload.rate / n_pro,
                seed=config.seed * 1000 + i,
                system=system.adapter,
            )
            proc = ctx.Process(target=worker_main, args=(spec, counter, stop), name=spec.actor)
            producers.append((proc, counter))
        # Service candidates (--leaders): one more worker, for the duration.
        leaders = [ctx.Process(target=worker_main, name="l1", args=(WorkerSpec(
            "leader", "l1", tuple(addresses), (), (), workload, str(run_dir / "l1.hist"),
            config.duration, None, None, config.seed * 1000 + 900, system.adapter,
        ), ctx.RawValue("q", 0), stop))] if workload.leaders else []
        # backlog-drain: the consumers start only once the producers are done.
        first = [p for p, _ in (producers if workload.backlog else consumers + producers)]
        first += leaders
        for p in first:
            p.start()
            procs.append(p)
        t0 = time.monotonic()
        sampler = Sampler(system.processes, t0, config.sample_interval)
        sampler.start()
        # The generator's own processes too: a saturated one measures itself.
        gen_sampler = Sampler(
            lambda: {p.name: p.pid for p in list(procs) if p.pid is not None and p.is_alive()},
            t0, config.sample_interval,
        )
        gen_sampler.start()
        if config.faults:
            assert isinstance(system, BatonCluster)  # check_supported
            injector = FaultInjector(system, list(config.faults), run_dir / "faults.hist", t0)
            injector.start()
        progress = _Progress(config.progress, config.system, t0)
        s = sampler

        def tick(phase: str) -> tuple[int, int]:
            pub = sum(int(c.value) for _, c in producers)
            con = sum(int(c.value) for _, c in consumers)
            fault = ""
            if injector is not None and injector.log:
                last = injector.log[-1]
                fault = f"{last.kind} {last.phase} @{last.t:.0f}s"
            progress.update(phase, pub, con, s.latest_cpu, s.latest_rss_mib, fault)
            return pub, con

        # Load phase: until every producer is done (duration, or its message cap).
        hard_stop = t0 + config.duration + 60
        while any(p.is_alive() for p, _ in producers) and time.monotonic() < hard_stop:
            time.sleep(1.0)
            tick("load")
        for p, _ in producers:
            p.join(5)
            if p.is_alive():
                p.terminate()
        for p in leaders:  # they stop at the end of the duration by themselves
            p.join(15)
            if p.is_alive():
                p.terminate()  # the worker then still flushes its history (worker.py)
                p.join(15)
        load_end = time.monotonic() - t0
        if injector is not None:
            injector.stop()  # skip faults not yet due; wait for a running one to end
        if workload.backlog:
            for p, _ in consumers:
                p.start()
                procs.append(p)
        # Catch-up: consumers keep going until nothing more is accepted for a while.
        idle_since = time.monotonic()
        pub, con = tick("catch-up")
        catch_up_end = time.monotonic() + config.catch_up + (
            config.duration + 30 if workload.backlog else 0.0
        )
        while time.monotonic() < catch_up_end:
            if con >= pub and not workload.release_share and not workload.reject_share:
                break
            time.sleep(0.5)
            before = con
            pub, con = tick("catch-up")
            if con != before:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > (5.0 if workload.backlog else 1.5):
                break
        progress.done()
        stop.set()
        for p, _ in consumers:
            p.join(20)
            if p.is_alive():
                p.terminate()  # the worker then still flushes its history (worker.py)
                p.join(15)
        _log(config.progress, "loadtest: draining the queues ...")
        with HistoryWriter(run_dir / "drain.hist", DRAIN_ACTOR) as w:
            uvloop.run(drain_queues(system.adapter, addresses, workload, w, config.drain_idle,
                                    config.drain_wait))
        failed_workers = [p.name for p in procs if p.exitcode not in (0, None)]
    finally:
        if injector is not None:
            injector.stop()
            fault_errors = injector.errors
            faults_applied = injector.summary()
        if sampler is not None:
            sampler.stop()
        if gen_sampler is not None:
            gen_sampler.stop()
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
        system.stop()
        if sampler is not None:
            with open(run_dir / SAMPLES_FILE, "w") as f:
                json.dump({"samples": sampler.samples, "load_end": load_end,
                           "t0_mono_ns": int(sampler.t0 * 1e9),
                           "generator": gen_sampler.samples if gen_sampler else []}, f)
    result = analyse_dir(run_dir)
    result.config = {
        "system": config.system,
        "preset": workload.name,
        "duration": config.duration,
        "brokers": (len(config.brokers_at) or config.brokers)
        if config.system in ("baton", "baton-amqp") else config.peer_nodes,
        "log": (config.log_url or ("external" if config.brokers_at else "file:"))
        if config.system in ("baton", "baton-amqp") else "",
        "seed": config.seed,
        "faults": config.faults_spec,
        "partitions": config.partitions,
        "replicas": config.replicas or None,  # (None: not given, the brokers' default, 3)
        "old_build": config.old_build or "",
        "workload": asdict(workload),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
        "server_version": str(getattr(system, "version", "") or ""),
    }
    if failed_workers:
        result.metrics["failed_workers"] = failed_workers
    if fault_errors:
        result.metrics["fault_errors"] = fault_errors
    if faults_applied:
        result.metrics["faults"] = faults_applied
    return result


def measure(ops: Sequence[Op]) -> dict[str, Any]:
    """Rates and latencies of a merged history (the drain is left out of both).

    - confirmed publish msg/s: publish-ok records over first publish-invoke .. last
      publish-ok;
    - consume msg/s: ack-ok records of the workers over their first delivery .. last
      ack-ok;
    - confirm latency: publish-ok time - publish-invoke time, per message;
    - end-to-end latency: a message's first delivery to a worker - its publish-invoke;
    - for target-rate runs also both latencies from the time each publish was *due*
      (``*_corrected``: coordinated omission corrected; the invoke record's ``count``
      is how late the producer sent it).
    """
    invoked: dict[str, int] = {}
    lag: dict[str, int] = {}
    confirm = LogHistogram()
    e2e = LogHistogram()
    confirm_c = LogHistogram()
    e2e_c = LogHistogram()
    delivered: set[str] = set()
    first_pub = last_ok = 0
    first_del = last_ack = 0
    n_ok = n_ack = n_fail = 0
    for op in ops:
        kind = op.kind
        if kind == OpKind.PUBLISH_INVOKE:
            invoked[op.msg] = op.t
            if op.count >= 0:
                lag[op.msg] = op.count
            if not first_pub:
                first_pub = op.t
        elif kind == OpKind.PUBLISH_OK:
            n_ok += 1
            last_ok = op.t
            t = invoked.get(op.msg)
            if t is not None:
                confirm.record(op.t - t)
                if lag:
                    confirm_c.record(op.t - t + lag.get(op.msg, 0))
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
                    if lag:
                        e2e_c.record(op.t - t + lag.get(op.msg, 0))
        elif kind == OpKind.ACK_OK:
            n_ack += 1
            last_ack = op.t
    pub_s = (last_ok - first_pub) / 1e9 if n_ok else 0.0
    con_s = (last_ack - first_del) / 1e9 if n_ack else 0.0
    out: dict[str, Any] = {
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
    if lag:
        out["confirm_latency_corrected_ms"] = confirm_c.summary_ms()
        out["e2e_latency_corrected_ms"] = e2e_c.summary_ms()
    return out


def timeline(ops: Sequence[Op], bin_s: float = 1.0) -> dict[str, Any]:
    """Per-second figures of a history, for the plots (times in s from the first publish).

    Returns:
        ``t`` (bin starts), ``confirmed`` and ``accepted`` (msg/s per bin), confirm and
        end-to-end latency p50 / p99 per bin (ms, by the time the confirm / delivery
        happened; 0 for an empty bin), and ``faults``: ``[t, kind, phase, info]``.
    """
    t0 = next((op.t for op in ops if op.kind == OpKind.PUBLISH_INVOKE), ops[0].t if ops else 0)
    width = int(bin_s * 1e9)
    invoked: dict[str, int] = {}
    delivered: set[str] = set()
    conf_n: dict[int, int] = {}
    acc_n: dict[int, int] = {}
    conf_h: dict[int, LogHistogram] = {}
    e2e_h: dict[int, LogHistogram] = {}
    faults: list[list[Any]] = []
    last = 0
    for op in ops:
        b = (op.t - t0) // width
        kind = op.kind
        if kind == OpKind.PUBLISH_INVOKE:
            invoked[op.msg] = op.t
        elif kind == OpKind.PUBLISH_OK:
            conf_n[b] = conf_n.get(b, 0) + 1
            t = invoked.get(op.msg)
            if t is not None:
                conf_h.setdefault(b, LogHistogram()).record(op.t - t)
            last = max(last, b)
        elif kind == OpKind.FAULT:
            faults.append([round((op.t - t0) / 1e9, 3), op.msg, ("start", "end")[op.count == 1],
                           op.info])
        elif op.actor == DRAIN_ACTOR:
            continue
        elif kind == OpKind.DELIVER and op.msg not in delivered:
            delivered.add(op.msg)
            t = invoked.get(op.msg)
            if t is not None:
                e2e_h.setdefault(b, LogHistogram()).record(op.t - t)
        elif kind == OpKind.ACK_OK:
            acc_n[b] = acc_n.get(b, 0) + 1
            last = max(last, b)
    bins = range(0, last + 1)

    def pct(hs: dict[int, LogHistogram], q: float) -> list[float]:
        return [round(hs[i].percentile(q) / 1e6, 3) if i in hs else 0.0 for i in bins]

    return {
        "bin_s": bin_s,
        "t": [round(i * bin_s, 3) for i in bins],
        "confirmed": [conf_n.get(i, 0) / bin_s for i in bins],
        "accepted": [acc_n.get(i, 0) / bin_s for i in bins],
        "confirm_p50": pct(conf_h, 0.5),
        "confirm_p99": pct(conf_h, 0.99),
        "e2e_p50": pct(e2e_h, 0.5),
        "e2e_p99": pct(e2e_h, 0.99),
        "faults": faults,
        "t0_mono_ns": t0,
    }


def _samples(run_dir: Path, t0_ns: int) -> dict[str, Any]:
    """The CPU / RSS samples of a run dir, re-based to the timeline's t0, and a summary."""
    path = run_dir / SAMPLES_FILE
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    # Sample times count from the runner's start of the load; the timeline's from the
    # first publish (same CLOCK_MONOTONIC): shift them onto the timeline.
    shift = (int(data.get("t0_mono_ns") or t0_ns) - t0_ns) / 1e9
    rows: list[dict[str, Any]] = [
        {**r, "t": round(r["t"] + shift, 3)} for r in data.get("samples", [])
    ]
    load_end = float(data.get("load_end") or 0.0) + shift
    summary = summarize(rows, load_end)
    gen = summarize([{**r, "t": r["t"] + shift} for r in data.get("generator", [])], load_end,
                    skip_first=True)
    total_cpu = round(sum(v["cpu_mean"] for v in summary.values()), 3)
    out: dict[str, Any] = {"samples": rows, "per_process": summary, "cpu_mean_total": total_cpu,
           "rss_max_mib_total": round(sum(v["rss_max_mib"] for v in summary.values()), 1)}
    if gen:
        out["generator"] = {
            "per_process": gen,
            "cpu_max_process": max(v["cpu_mean"] for v in gen.values()),
            "saturated": [k for k, v in gen.items() if v["cpu_mean"] >= GENERATOR_SATURATED],
        }
    return out


def analyse_dir(run_dir: str | os.PathLike[str]) -> RunResult:
    """Load a run directory's histories, check them and measure them."""
    ops = load_run(run_dir)
    metrics = measure(ops)
    tl = timeline(ops)
    metrics["timeline"] = tl
    procs = _samples(Path(run_dir), tl["t0_mono_ns"])
    if procs:
        gen = procs.pop("generator", None)
        metrics["servers"] = procs
        if gen:
            metrics["generator"] = gen
    old = Path(run_dir) / "result.json"
    result = RunResult(check(ops), metrics, str(run_dir))
    if old.exists():  # --check of a kept run: keep what the run knew about itself
        try:
            kept = json.loads(old.read_text())
            result.config = kept.get("config", {})
            for key in ("faults", "fault_errors", "failed_workers"):
                if key in kept.get("metrics", {}):
                    metrics[key] = kept["metrics"][key]
        except (OSError, ValueError):
            pass
    return result


def _lat(h: dict[str, float]) -> str:
    return "".join(f"{h[k]:>9.2f}" for k in ("p50", "p90", "p99", "p99.9", "max"))


def format_report(result: RunResult) -> str:
    """The table printed at the end of a run."""
    m = result.metrics
    lines = []
    cfg = result.config
    if cfg:
        where = (f"  brokers {cfg.get('brokers')}  log {cfg.get('log')}"
                 + (f"  partitions {cfg['partitions']}" if (cfg.get("partitions") or 1) > 1
                    else "")
                 + (f"  replicas {cfg['replicas']}" if cfg.get("replicas") else "")
                 if cfg.get("system", "baton") in ("baton", "baton-amqp")
                 else f"  nodes {cfg.get('brokers')}"
                 + (f"  server {cfg['server_version']}" if cfg.get("server_version") else ""))
        load = cfg.get("loadavg_1m")
        lines.append(
            f"{cfg.get('system', 'baton')}: preset {cfg.get('preset')}  {cfg.get('duration')}s"
            + where + (f"  faults {cfg['faults']}" if cfg.get("faults") else "")
            + (f"  old build {cfg['old_build']}" if cfg.get("old_build") else "")
            + (f"  (machine load {load[0]:.1f} -> {load[1]:.1f} on {cfg.get('cpus')} cpus)"
               if load else "")
        )
    lines.append(
        f"confirmed publishes {m['confirmed']:>10,}  {m['confirmed_msgs_per_s']:>10,.0f} msg/s"
        f"   (failed {m['publish_failed']})"
    )
    lines.append(
        f"accepted (consumed) {m['accepted']:>10,}  {m['consume_msgs_per_s']:>10,.0f} msg/s"
    )
    lines.append(f"{'latency ms':22}{'p50':>9}{'p90':>9}{'p99':>9}{'p99.9':>9}{'max':>9}")
    for label, key in (
        ("confirm", "confirm_latency_ms"),
        ("end-to-end", "e2e_latency_ms"),
        ("confirm (corrected)", "confirm_latency_corrected_ms"),
        ("end-to-end (corrected)", "e2e_latency_corrected_ms"),
    ):
        if key in m:
            lines.append(f"{label:22}" + _lat(m[key]))
    servers = m.get("servers")
    if servers:
        per = servers["per_process"]
        lines.append(
            f"server CPU {servers['cpu_mean_total']:.2f} cores (mean, load phase), "
            f"peak RSS {servers['rss_max_mib_total']:.0f} MiB: "
            + ", ".join(f"{k} {v['cpu_mean']:.2f}/{v['rss_max_mib']:.0f}" for k, v in per.items())
        )
    gen = m.get("generator")
    if gen:
        lines.append(
            "generator CPU (cores per process, mean, load phase): "
            + ", ".join(f"{k} {v['cpu_mean']:.2f}" for k, v in gen["per_process"].items())
            + (f"  -- GENERATOR SATURATED ({', '.join(gen['saturated'])} >= "
               f"{GENERATOR_SATURATED:.0%} of a core): these figures may measure the generator"
               if gen["saturated"] else "")
        )
    if m.get("faults"):
        lines.append(fault_line(m["faults"]))
    if m.get("fault_errors"):
        lines.append("fault errors: " + "; ".join(m["fault_errors"]))
    if m.get("failed_workers"):
        lines.append(f"workers that failed: {', '.join(m['failed_workers'])}")
    lines.append(result.check.summary())
    return "\n".join(lines)


def comparison_rows(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One row per system of the side-by-side table (also used by the HTML report)."""
    rows = []
    for r in results:
        m = r.metrics
        servers = m.get("servers", {})
        rows.append({
            "system": r.config.get("system", "baton")
            + (f" ({r.config.get('brokers')} brokers)"
               if r.config.get("system") in ("baton", "baton-amqp")
               else f" ({r.config.get('brokers')} nodes)" if r.config.get("brokers") else ""),
            "confirmed_msgs_per_s": m["confirmed_msgs_per_s"],
            "consume_msgs_per_s": m["consume_msgs_per_s"],
            "confirm": m["confirm_latency_ms"],
            "e2e": m["e2e_latency_ms"],
            "cpu": servers.get("cpu_mean_total"),
            "rss": servers.get("rss_max_mib_total"),
            # The busiest generator process's cores, and whether one was saturated.
            "generator_cpu": m.get("generator", {}).get("cpu_max_process"),
            "generator_saturated": bool(m.get("generator", {}).get("saturated")),
            "checker": "OK" if r.ok else "FAILED",
        })
    return rows


def format_comparison(results: Sequence[RunResult]) -> str:
    """The side-by-side table of several systems' runs of one workload."""
    head = (f"{'system':22}{'publish/s':>11}{'consume/s':>11}"
            f"{'conf p50':>10}{'p99':>10}{'p99.9':>10}{'e2e p50':>10}{'p99':>10}{'p99.9':>10}"
            f"{'cpu':>6}{'rss MiB':>9}{'gen':>6}  checker")
    lines = [head, "-" * len(head)]
    for row in comparison_rows(results):
        c, e = row["confirm"], row["e2e"]
        cpu = f"{row['cpu']:.2f}" if row["cpu"] is not None else "-"
        rss = f"{row['rss']:.0f}" if row["rss"] is not None else "-"
        gen = ("-" if row["generator_cpu"] is None
               else f"{row['generator_cpu']:.2f}" + ("!" if row["generator_saturated"] else ""))
        lines.append(
            f"{row['system']:22}{row['confirmed_msgs_per_s']:>11,.0f}"
            f"{row['consume_msgs_per_s']:>11,.0f}"
            # Columns wide enough for a saturated peer's latencies (10,334.77 ms).
            f"{c['p50']:>10.2f}{c['p99']:>10.2f}{c['p99.9']:>10.2f}"
            f"{e['p50']:>10.2f}{e['p99']:>10.2f}{e['p99.9']:>10.2f}"
            f"{cpu:>6}{rss:>9}{gen:>6}  {row['checker']}"
        )
    lines.append("(latencies in ms; cpu: server cores used, mean over the load; "
                 "rss: peak server memory; gen: cores of the busiest generator process, "
                 "! = generator saturated)")
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
