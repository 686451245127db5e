"""Benchmark: CPU time per message, brokers and clients, at a fixed modest rate.

Runs the load-test harness (:func:`batonmq.loadtest.runner.run`: brokers on a shared file
log, producer and consumer worker processes, the checker) with the ``latency`` preset's
shape (1 KiB, 2 producers, 2 consumers, one queue, confirmed publishes, acks in batches
of 50) at ``--rate`` msg/s for ``--duration`` seconds, once per ``--brokers`` count, and
prints one figure per configuration: **CPU µs per message** of the broker processes (in
all and per broker) and of the client processes (producers and consumers), with the rate
actually reached and the checker's verdict.

    python -m batonmq.loadtest.bench_efficiency                     # 1 then 3 brokers
    python -m batonmq.loadtest.bench_efficiency --brokers 1 --rounds 3 --json out.json

A figure is the processes' mean cores over the load phase but its first ``--warmup``
seconds (``/proc`` every second, :mod:`batonmq.loadtest.procstat`) divided by the
confirmed publish rate: CPU seconds
per confirmed message, in µs. A broker's figure is everything its process does for that
message (reading and answering the publish, appending, applying, writing the store,
delivering, taking the ack), on every broker of the cluster; a client's figure includes
the harness's own history recording. ``--rounds N`` repeats the configurations N times,
interleaved (1, 3, 1, 3, ...), so that a figure's spread on a shared machine shows.
Exit status 1 if a run's checker found a violation or a run fell short of the rate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any

from batonmq.loadtest.runner import SAMPLES_FILE, RunConfig, RunResult, run
from batonmq.loadtest.workloads import get_preset

__all__ = ["main", "bench_one", "figures"]

#: A run that confirmed less than this share of its target rate is reported as short:
#: its figures measure a saturated system, not the modest rate asked for.
SHORT_OF_RATE = 0.9


def _cores(samples: list[dict[str, Any]], start: float, end: float) -> dict[str, float]:
    """Mean cores per process label over the samples taken in ``start .. end`` (s)."""
    by: dict[str, list[float]] = {}
    for r in samples:
        if start < r["t"] <= end:
            by.setdefault(r["label"], []).append(r["cpu"])
    return {k: sum(v) / len(v) for k, v in by.items()}


def load_cores(run_dir: str, warmup: float) -> tuple[dict[str, float], dict[str, float]]:
    """Mean cores of each broker and each client process over the load phase of a run,
    leaving out its first ``warmup`` seconds (the workers start, log in and connect: a
    SCRAM login costs the broker a scrypt).

    Returns:
        (broker label -> cores, client label -> cores)
    """
    with open(os.path.join(run_dir, SAMPLES_FILE)) as f:
        data = json.load(f)
    end = float(data.get("load_end") or 0.0) or float("inf")
    return (_cores(data.get("samples", []), warmup, end),
            _cores(data.get("generator", []), warmup, end))


def figures(result: RunResult, brokers: int, partitions: int, rate: float,
            warmup: float) -> dict[str, Any]:
    """One configuration's figures from a harness run.

    Returns:
        ``broker_us_per_msg`` (all brokers together), ``per_broker_us_per_msg``,
        ``client_us_per_msg`` (producers and consumers together), ``per_client_us_per_msg``,
        the cores behind each, the rates reached, the checker's verdict and counts.
    """
    m = result.metrics
    confirmed = float(m.get("confirmed_msgs_per_s") or 0.0)
    servers, clients = load_cores(result.run_dir, warmup)

    def per_msg(cores: float) -> float:
        return round(cores / confirmed * 1e6, 1) if confirmed > 0 else 0.0

    broker_cores = sum(servers.values())
    client_cores = sum(clients.values())
    counts = result.check.counts
    return {
        "brokers": brokers,
        "partitions": partitions,
        "target_msgs_per_s": rate,
        "confirmed_msgs_per_s": round(confirmed, 1),
        "consumed_msgs_per_s": round(float(m.get("consume_msgs_per_s") or 0.0), 1),
        "confirmed": int(m.get("confirmed", 0)),
        "broker_us_per_msg": per_msg(broker_cores),
        "broker_cores": round(broker_cores, 3),
        "per_broker_us_per_msg": {k: per_msg(v) for k, v in servers.items()},
        "client_us_per_msg": per_msg(client_cores),
        "client_cores": round(client_cores, 3),
        "per_client_us_per_msg": {k: per_msg(v) for k, v in clients.items()},
        "confirm_p50_ms": m.get("confirm_latency_ms", {}).get("p50", 0.0),
        "confirm_p99_ms": m.get("confirm_latency_ms", {}).get("p99", 0.0),
        "checker_ok": result.ok,
        "lost": counts.get("lost", 0),
        "double_delivery": counts.get("double_delivery", 0),
        "short_of_rate": confirmed < rate * SHORT_OF_RATE,
        "loadavg_1m": result.config.get("loadavg_1m", []),
    }


def bench_one(brokers: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one configuration through the harness and return its :func:`figures`."""
    workload = get_preset("latency", rate=float(args.rate))
    config = RunConfig(workload=workload, duration=args.duration, brokers=brokers,
                       partitions=args.partitions, progress=False, catch_up=10.0,
                       drain_wait=10.0)
    result = run(config)
    out = figures(result, brokers, args.partitions, float(args.rate), args.warmup)
    if not args.keep:
        shutil.rmtree(result.run_dir, ignore_errors=True)
    else:
        out["run_dir"] = result.run_dir
    return out


def _line(f: dict[str, Any]) -> str:
    per_b = " ".join(f"{k} {v:.0f}" for k, v in sorted(f["per_broker_us_per_msg"].items()))
    per_c = " ".join(f"{k} {v:.0f}" for k, v in sorted(f["per_client_us_per_msg"].items()))
    verdict = "OK" if f["checker_ok"] else (
        f"FAILED (lost {f['lost']}, double delivery {f['double_delivery']})")
    short = "  SHORT OF THE RATE" if f["short_of_rate"] else ""
    return (
        f"{f['brokers']} broker(s), {f['partitions']} partition(s): "
        f"{f['confirmed_msgs_per_s']:,.0f} confirmed/s, {f['consumed_msgs_per_s']:,.0f} "
        f"consumed/s (target {f['target_msgs_per_s']:,.0f}){short}\n"
        f"  broker CPU {f['broker_us_per_msg']:.0f} µs/msg ({f['broker_cores']:.2f} cores)"
        f"  [{per_b}]\n"
        f"  client CPU {f['client_us_per_msg']:.0f} µs/msg ({f['client_cores']:.2f} cores)"
        f"  [{per_c}]\n"
        f"  confirm p50 / p99 {f['confirm_p50_ms']:.1f} / {f['confirm_p99_ms']:.1f} ms;"
        f"  load {'/'.join(str(x) for x in f['loadavg_1m'])};  checker {verdict}"
    )


def _counts(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of broker counts: {text!r}") from None
    if not out or any(n < 1 or n > 9 for n in out):
        raise argparse.ArgumentTypeError(f"broker counts must be 1..9: {text!r}")
    return out


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m batonmq.loadtest.bench_efficiency",
                                description=__doc__.split("\n", 1)[0])
    p.add_argument("--brokers", type=_counts, default=[1, 3],
                   help="broker counts to run, comma-separated (default 1,3)")
    p.add_argument("--rate", type=_positive(float), default=2000.0,
                   help="publishes per second in all (default 2000)")
    p.add_argument("--duration", type=_positive(float), default=20.0,
                   help="seconds of load per run (default 20)")
    p.add_argument("--partitions", type=_positive(int), default=1,
                   help="data partitions of the brokers' log (default 1)")
    p.add_argument("--rounds", type=_positive(int), default=1,
                   help="run the configurations this many times, interleaved (default 1)")
    p.add_argument("--warmup", type=float, default=2.0,
                   help="seconds at the start of the load left out of the figures (default 2)")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    args = p.parse_args(argv)
    if args.duration > 600:
        p.error("--duration: at most 600 seconds")
    if not 0 <= args.warmup < args.duration - 1:
        p.error("--warmup: from 0 to a second less than --duration")
    runs: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for n in args.brokers:
            f = bench_one(n, args)
            runs.append(f)
            print(_line(f), flush=True)
    ok = all(r["checker_ok"] and not r["short_of_rate"] for r in runs)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"ok": ok, "cpus": os.cpu_count(), "runs": runs}, out, indent=1)
    print("ok" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
