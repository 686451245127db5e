"""``python -m batonmq.loadtest`` (also ``baton loadtest``): run a preset, check it, report it.

    python -m batonmq.loadtest --preset throughput --duration 15 --brokers 3
    python -m batonmq.loadtest --system baton --system rabbitmq --system nats --report DIR
    python -m batonmq.loadtest --system nats --system nats-sync --peer-nodes 1
    python -m batonmq.loadtest --preset latency --faults "kill9,sigstop,join@30s" --duration 300
    python -m batonmq.loadtest --old-build 8c400b8 --faults "upgrade@5s" --duration 30
    python -m batonmq.loadtest --config run.toml
    python -m batonmq.loadtest --check DIR     # re-check a kept run (or report) directory

Exit status: 0 if the checker found no violation, 1 if it did, 2 on a usage or start-up
error. See docs/loadtest.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "add_arguments", "run_from_args", "load_config"]

#: Run options (not workload fields) a config file may set, with their defaults.
_RUN_DEFAULTS: dict[str, Any] = {
    "preset": "throughput",
    "duration": 15.0,
    "system": ["baton"],
    "brokers": 3,
    "peer_nodes": 3,
    "brokers_at": None,
    "log": None,
    "faults": None,
    "disk_limit": None,
    "partitions": 1,
    "replicas": None,
    "old_build": None,
    "json": None,
    "report": None,
    "seed": 1,
    "quiet": False,
}
#: Workload overrides on the command line (None: the preset's value).
_WORKLOAD_OPTIONS = ("messages", "producers", "consumers", "size", "rate", "queues", "window",
                     "prefetch", "ack_batch", "leaders")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the load-test options to a parser (shared with ``baton loadtest``)."""
    from batonmq.loadtest.workloads import PRESETS

    # Defaults are None here so that a config file's values count unless an option is
    # given: the real defaults are in _RUN_DEFAULTS.
    p.add_argument("--config", default=None, metavar="FILE",
                   help="TOML file with these options (and a [workload] table); "
                   "options given here win")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="workload preset (default throughput)")
    p.add_argument("--duration", type=float, default=None, help="seconds of publishing (15)")
    p.add_argument("--system", action="append", default=None,
                   choices=("baton", "baton-amqp", "rabbitmq", "nats", "nats-sync"),
                   help="system to run the workload on; repeat for a side-by-side run "
                   "(default baton)")
    p.add_argument("--brokers", type=int, default=None, help="Baton brokers to start (3)")
    p.add_argument("--peer-nodes", type=int, default=None, choices=(1, 3),
                   help="nodes of each peer (RabbitMQ, NATS): 1, or a cluster of 3 "
                   "replicating every queue three ways (3)")
    p.add_argument("--brokers-at", default=None,
                   help="HOST:PORT,... of running Baton brokers: start none")
    p.add_argument("--log", default=None, help="log URL for the started brokers (default: a "
                   "shared file: log in the run dir; 'kafka': start a Kafka with .ci/kafka)")
    p.add_argument("--faults", default=None, metavar="SPEC",
                   help="fault schedule, e.g. 'kill9,sigstop,join@30s' or "
                   "'sigstop@random:20s' (docs/loadtest.md)")
    p.add_argument("--partitions", type=int, choices=range(1, 1025), default=None, metavar="N",
                   help="data partitions of the Baton brokers' new log (1: one log; N > 1: a"
                   " control partition and N data partitions, the queues spread over them)")
    p.add_argument("--replicas", type=int, default=None, metavar="R",
                   help="with --partitions N > 1: each data partition's replica group has R"
                   " of the started brokers (serve --replicas R; default: the brokers' default, 3)")
    p.add_argument("--disk-limit", type=int, default=None, metavar="MB",
                   help="put the brokers' data dirs and file log on a tmpfs of MB MiB "
                   "(needed by the diskfull fault; root)")
    p.add_argument("--old-build", default=None, metavar="DIR|COMMIT",
                   help="start the brokers on another build of Baton: a venv dir, a baton "
                   "executable, or a commit of this repository (built once into a cached "
                   "venv); the 'upgrade' fault restarts them on this build")
    p.add_argument("--json", default=None, help="write the results as JSON to this file")
    p.add_argument("--report", default=None, metavar="DIR",
                   help="keep the runs (one sub-dir per system) and write DIR/report.html "
                   "with PNG plots")
    p.add_argument("--seed", type=int, default=None, help="seed of random choices (1)")
    p.add_argument("--messages", type=int, default=None, help="stop publishing after N")
    p.add_argument("--producers", type=int, default=None, help="producer processes")
    p.add_argument("--consumers", type=int, default=None, help="consumer processes")
    p.add_argument("--size", type=int, default=None, help="body bytes")
    p.add_argument("--rate", type=float, default=None, help="target publish msg/s in all")
    p.add_argument("--queues", type=int, default=None, help="work queues")
    p.add_argument("--window", type=int, default=None, help="unconfirmed publishes per producer")
    p.add_argument("--prefetch", type=int, default=None, help="consumer prefetch")
    p.add_argument("--ack-batch", type=int, default=None, help="messages per ack batch")
    p.add_argument("--leaders", type=int, default=None, metavar="N",
                   help="also run N candidates for the service lt-leader, each taking the "
                   "term in turn (Baton only; the checker proves one leader at a time)")
    p.add_argument("--quiet", action="store_true", default=None, help="no progress lines")
    p.add_argument("--check", default=None, metavar="DIR",
                   help="do not run: check and measure the histories in DIR (a run dir, "
                   "or a --report dir with one run dir per system)")


def load_config(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a TOML config: (run options, workload overrides).

    Keys are the long option names (``-`` or ``_``); ``system`` may be a list (or
    ``systems``); a ``[workload]`` table sets fields of the preset's Workload.

    Raises:
        ValueError: unreadable file, or an unknown key.
    """
    from dataclasses import fields

    from batonmq.loadtest.workloads import Workload

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"config {path}: {exc}") from exc
    run: dict[str, Any] = {}
    workload: dict[str, Any] = {}
    known_workload = {f.name for f in fields(Workload)} - {"name"}
    for key, value in data.items():
        k = key.replace("-", "_")
        if k == "workload" and isinstance(value, dict):
            for wk, wv in value.items():
                wk = wk.replace("-", "_")
                if wk not in known_workload:
                    raise ValueError(f"config {path}: unknown workload field {wk!r} "
                                     f"(known: {', '.join(sorted(known_workload))})")
                workload[wk] = wv
        elif k in ("system", "systems"):
            run["system"] = [value] if isinstance(value, str) else list(value)
        elif k in _RUN_DEFAULTS:
            run[k] = value
        elif k in _WORKLOAD_OPTIONS:
            workload["max_messages" if k == "messages" else k] = value
        else:
            raise ValueError(f"config {path}: unknown key {key!r}")
    return run, workload


def _check_dirs(path: Path) -> list[Path]:
    """The run dirs under ``path``: itself if it holds histories, else its sub-dirs that do."""
    if any(path.glob("*.hist")):
        return [path]
    return sorted(d for d in path.iterdir() if d.is_dir() and any(d.glob("*.hist")))


def _preflight(system: str, workload: Any) -> None:
    """Fail early: a peer's server is not installed (naming the package), or cannot run
    the workload."""
    from batonmq.loadtest.peers import require_binary

    if system == "rabbitmq":
        require_binary("rabbitmq-server", "rabbitmq-server", ("/usr/lib/rabbitmq/bin/rabbitmq-server",))
        require_binary("epmd", "erlang-base")
        import aio_pika  # noqa: F401 - the client library (pip: aio-pika)
    elif system in ("nats", "nats-sync"):
        if workload.release_share or workload.reject_share or workload.dead_letter:
            raise RuntimeError(
                "NATS JetStream has no delivery limit with dead-lettering: "
                f"preset {workload.name!r} cannot run on it"
            )
        from batonmq.loadtest.peers.nats import nats_binary

        nats_binary(sync=system == "nats-sync")  # builds the pinned server if it must
        import nats  # noqa: F401 - the client library (pip: nats-py)


def run_from_args(args: argparse.Namespace) -> int:
    """Run (or ``--check``) as the parsed options say; returns the exit status."""
    from batonmq.loadtest.faults import FaultSpecError, parse_faults
    from batonmq.loadtest.report import write_report
    from batonmq.loadtest.runner import (
        RunConfig,
        RunResult,
        analyse_dir,
        comparison_rows,
        format_comparison,
        format_report,
        run,
        save,
    )
    from batonmq.loadtest.workloads import get_preset

    if args.check:
        dirs = _check_dirs(Path(args.check))
        if not dirs:
            print(f"loadtest: no histories (*.hist) in {args.check}", file=sys.stderr)
            return 2
        checked = [analyse_dir(d) for d in dirs]
        for r in checked:
            print(format_report(r))
        if len(checked) > 1:
            print(format_comparison(checked))
        if args.json:
            _write_json(checked, args.json, comparison_rows)
        return 0 if all(r.ok for r in checked) else 1

    opts = dict(_RUN_DEFAULTS)
    wl_over: dict[str, Any] = {}
    if args.config:
        try:
            file_run, file_wl = load_config(args.config)
        except ValueError as exc:
            print(f"loadtest: {exc}", file=sys.stderr)
            return 2
        opts.update(file_run)
        wl_over.update(file_wl)
    for key in _RUN_DEFAULTS:
        value = getattr(args, key, None)
        if value is not None:
            opts[key] = value
    for key in _WORKLOAD_OPTIONS:
        value = getattr(args, key, None)
        if value is not None:
            wl_over["max_messages" if key == "messages" else key] = value
    systems: list[str] = list(dict.fromkeys(opts["system"]))  # once each, in order
    duration = float(opts["duration"])
    if duration <= 0 or int(opts["brokers"]) < 1:
        print("loadtest: --duration and --brokers must be positive", file=sys.stderr)
        return 2
    replicas = opts["replicas"]
    if replicas is not None and (int(opts["partitions"]) <= 1 or opts["brokers_at"]):
        print("loadtest: --replicas is for a split log of brokers the harness starts: give"
              " --partitions N > 1 (and no --brokers-at)", file=sys.stderr)
        return 2
    if replicas is not None and not 1 <= int(replicas) <= 15:
        print(f"loadtest: --replicas is 1 to 15, not {replicas}", file=sys.stderr)
        return 2
    if int(opts["peer_nodes"]) not in (1, 3):
        print("loadtest: --peer-nodes must be 1 or 3", file=sys.stderr)
        return 2
    try:
        workload = get_preset(str(opts["preset"]), **wl_over)
    except (KeyError, TypeError) as exc:
        print(f"loadtest: bad preset or workload field: {exc}", file=sys.stderr)
        return 2
    try:
        faults = parse_faults(opts["faults"], duration, int(opts["seed"])) if opts["faults"] else []
    except FaultSpecError as exc:
        print(f"loadtest: --faults: {exc}", file=sys.stderr)
        return 2
    try:
        for system in systems:
            _preflight(system, workload)
    except (RuntimeError, ImportError) as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        return 2
    from batonmq.cluster.errors import BatonError

    old_build: str | None = None
    if opts["old_build"]:
        from batonmq.loadtest.builds import resolve_build

        try:
            old_build = str(resolve_build(
                str(opts["old_build"]),
                progress=lambda line: print(f"loadtest: {line}", file=sys.stderr, flush=True),
            ))
        except BatonError as exc:
            print(f"loadtest: --old-build: {exc.message}", file=sys.stderr)
            return 2
    disk_limit = opts["disk_limit"]
    if disk_limit is None and any(f.kind == "diskfull" for f in faults):
        disk_limit = 1024  # diskfull needs a size-limited data dir: a 1 GiB tmpfs
    report = Path(opts["report"]) if opts["report"] else None
    results: list[RunResult] = []
    _exit_on_sigterm()  # so that the runner's finally blocks stop every server it started
    for system in systems:
        config = RunConfig(
            workload=workload,
            duration=duration,
            system=system,
            brokers=int(opts["brokers"]),
            peer_nodes=int(opts["peer_nodes"]),
            log_url=opts["log"],
            brokers_at=tuple(a for a in (opts["brokers_at"] or "").split(",") if a),
            report_dir=str(report / system) if report else None,
            seed=int(opts["seed"]),
            progress=not opts["quiet"],
            faults=tuple(faults) if system == "baton" else (),
            faults_spec=(opts["faults"] or "") if system == "baton" else "",
            disk_limit_mb=disk_limit if system == "baton" else None,
            partitions=int(opts["partitions"]),
            replicas=int(replicas or 0),
            old_build=old_build if system in ("baton", "baton-amqp") else None,
        )
        try:
            result = run(config)
        except RuntimeError as exc:
            print(f"loadtest: {system}: {exc}", file=sys.stderr)
            return 2
        except BatonError as exc:  # e.g. a queue on a partition its broker cannot serve
            print(f"loadtest: {system}: {exc.message}", file=sys.stderr)
            return 2
        print(format_report(result))
        save(result, None, keep_dir=bool(report))
        if not result.ok:
            print(f"histories kept in {result.run_dir}", file=sys.stderr)
        results.append(result)
    if len(results) > 1:
        print()
        print(format_comparison(results))
    if report:
        path = write_report(results, report, title=f"Baton load test: {workload.name}")
        print(f"report: {path}")
    if opts["json"]:
        _write_json(results, opts["json"], comparison_rows)
    if not all(r.ok for r in results):
        return 1
    if any(r.metrics.get("fault_errors") for r in results):
        # The guarantees held, but not every scheduled fault happened: not a pass.
        print("loadtest: some faults could not be applied (see 'fault errors')", file=sys.stderr)
        return 2
    return 0


def _exit_on_sigterm() -> None:
    """Make SIGTERM exit through the ``finally`` blocks (status 143), as ^C does: the
    runner then stops the brokers, the peer nodes and their epmd it started."""
    import signal
    import threading

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminate)


def _write_json(results: Sequence[Any], path: str, rows: Any) -> None:
    """One run: its result mapping; several: ``{"ok", "runs", "comparison"}``."""
    if len(results) == 1:
        data: dict[str, Any] = results[0].to_dict()
    else:
        data = {
            "ok": all(r.ok for r in results),
            "runs": [r.to_dict() for r in results],
            "comparison": rows(results),
        }
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    p = argparse.ArgumentParser(
        prog="python -m batonmq.loadtest",
        description="Baton load test: run a workload (on Baton and peers), inject faults, "
        "check the guarantees, report figures and plots.",
    )
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
