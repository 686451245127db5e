"""Acceptance run of the import-entries pipeline (docs/spark.md):

    python -m batonmq.loadtest.spark_acceptance [--count 100000] [--workdir DIR] [--json OUT]

Starts three brokers on one file: log (127.0.0.1), then:

1. **throughput**: ``count`` entries published first, one pipeline instance drains
   them: entries/s into the table (local[2]).
2. **crashes**: ``count`` entries published while the query runs; the driver is killed
   with ``kill -9`` twice and the broker it used (the first of its list) once; then the
   table must hold each valid entry exactly once (rows = distinct keys = valid
   entries), the dead-letter queue each invalid entry once, and the queue be empty.
3. **takeover**: two pipeline instances on one checkpoint; only the leader runs the
   query; it is killed with ``kill -9``; the other must take over within ``--takeover``
   seconds and finish from the checkpoint, with no duplicate and no gap.

Every step is bounded in time; everything started is stopped at the end. Prints one
JSON document with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batonmq import clients
from batonmq.broker.config import ready_address
from batonmq.clients.import_entries import committed_position

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return dict(os.environ)


class Proc:
    """A child process in its own process group, with its output in a file."""

    def __init__(self, name: str, cmd: list[str], out: Path) -> None:
        self.name, self.cmd, self.out = name, cmd, out
        self.proc: subprocess.Popen[bytes] | None = None
        self.mark = 0  # output offset at the last start

    def start(self) -> None:
        self.mark = self.out.stat().st_size if self.out.exists() else 0
        with open(self.out, "ab") as f:
            self.proc = subprocess.Popen(
                self.cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(), cwd=REPO,
                start_new_session=True,
            )

    def text(self) -> str:
        """Output since the last start."""
        with open(self.out, "rb") as f:
            f.seek(self.mark)
            return f.read().decode(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """kill -9 of the process (a driver's JVM follows: it exits when its stdin closes);
        then the rest of its group, so nothing is left behind."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        time.sleep(0.5)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 60) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def wait_until(check: Callable[[], bool], timeout: float, what: str, *watch: Proc) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        for p in watch:
            if p.proc is not None and p.proc.poll() is not None and p.name.startswith("pipeline"):
                raise RuntimeError(f"{p.name} exited ({p.proc.returncode}):\n{p.text()[-3000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"not within {timeout}s: {what}\n" + "\n".join(p.text()[-2000:] for p in watch))


class Cluster:
    """Brokers on 127.0.0.1 and one file log: each listens on port 0 at its first start
    and on the port it reported (its ready line) at every restart."""

    def __init__(self, work: Path, n: int = 3) -> None:
        self.log_url = f"file:{work / 'shared-log'}"
        self.work = work
        self.ports = [0] * n  # known from each broker's first ready line
        self.brokers = [Proc(f"broker-{i + 1}", [], work / f"node-{i + 1}.out") for i in range(n)]

    @property
    def addresses(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self, i: int | None = None) -> None:
        for k in range(len(self.brokers)) if i is None else [i]:
            b = self.brokers[k]
            b.cmd = [
                sys.executable, "-m", "batonmq.broker", "--log-level", "WARNING", "serve",
                "--listen", f"127.0.0.1:{self.ports[k]}", "--data-dir", str(self.work / f"node-{k + 1}"),
                "--log", self.log_url, "--node-id", f"node-{k + 1}",
            ]
            b.start()
            wait_until(lambda: self._reported(b) is not None, 30, f"{b.name} ready", b)
            address = self._reported(b)
            assert address is not None
            self.ports[k] = int(address.rpartition(":")[2])

    @staticmethod
    def _reported(b: Proc) -> str | None:
        """The address in the broker's ready line since its last start, if printed."""
        return next(filter(None, map(ready_address, b.text().splitlines())), None)

    def stop(self) -> None:
        for b in self.brokers:
            b.stop(20)


def pipeline(name: str, work: Path, addresses: str, queue: str, ck: Path, table: Path) -> Proc:
    return Proc(
        name,
        [sys.executable, "-m", "batonmq.broker", "--log-level", "WARNING", "import-entries", "run",
         "--brokers", addresses, "--queue", queue, "--table", str(table),
         "--checkpoint", str(ck), "--trigger", "0.5", "--max-per-trigger", "20000"],
        work / f"{name}.out",
    )


def generator(work: Path, addresses: str, queue: str, count: int, rate: float | None, run: str) -> Proc:
    cmd = [sys.executable, "-m", "batonmq.broker", "--log-level", "WARNING", "import-entries", "generate",
           "--brokers", addresses, "--queue", queue, "--count", str(count), "--run", run,
           "--seed", "5"]
    if rate:
        cmd += ["--rate", str(rate)]
    return Proc(f"generate-{queue}", cmd, work / f"generate-{queue}.out")


def generated(g: Proc) -> dict[str, Any]:
    assert g.proc is not None
    g.proc.wait(300)
    lines = [line for line in g.text().splitlines() if line.startswith("{")]
    if g.proc.returncode != 0 or not lines:
        raise RuntimeError(f"generator failed:\n{g.text()[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def committed(ck: Path) -> int:
    return committed_position(str(ck)) or 0


def progressed(ck: Path, mark: int, step: float, addresses: str, queue: str) -> Callable[[], bool]:
    """True once ``step`` more positions are committed, or all published so far."""

    def check() -> bool:
        with clients.sync.connect(addresses, timeout=5) as conn:
            tail = int(conn.queue_stats(queue)["next_position"])
        return committed(ck) >= min(mark + step, tail)

    return check


def check_table(spark: Any, table: Path, conn: Any, queue: str, expected: dict[str, Any]) -> dict[str, Any]:
    df = spark.read.parquet(str(table))
    rows = df.count()
    keys = df.select("key").distinct().count()
    positions = df.select("position").distinct().count()
    stats = conn.queue_stats(queue)
    dlq = conn.queue_stats(f"{queue}.dlq")
    out = {
        "published": expected["published"],
        "valid": expected["valid"],
        "invalid": expected["invalid"],
        "table_rows": rows,
        "distinct_keys": keys,
        "distinct_positions": positions,
        "queue_ready": stats["ready"],
        "queue_acquired": stats["acquired"],
        "dlq_entries": dlq["ready"],
    }
    out["ok"] = (
        rows == keys == positions == expected["valid"]
        and stats["ready"] == 0 and stats["acquired"] == 0
        and dlq["ready"] == expected["invalid"]
    )
    return out


def running_queries(p: Proc) -> int:
    return p.text().count("query ") - p.text().count("query stopped")


def scenario_throughput(work: Path, cluster: Cluster, spark: Any, count: int) -> dict[str, Any]:
    queue = "accept-throughput"
    g = generator(work, cluster.addresses, queue, count, None, "tp")
    g.start()
    expected = generated(g)
    ck, table = work / "tp-ck", work / "tp-table"
    p = pipeline("pipeline-tp", work, cluster.addresses, queue, ck, table)
    p.start()
    try:
        wait_until(lambda: "running" in p.text(), 120, "query running", p)
        start = time.monotonic()
        # The first micro-batch includes Python worker start-up (6-12 s here).
        wait_until(lambda: committed(ck) >= expected["published"], 600, "all committed", p)
        seconds = time.monotonic() - start
        with clients.sync.connect(cluster.addresses) as conn:
            wait_until(lambda: conn.queue_stats(queue)["ready"] == 0, 30, "queue empty", p)
            result = check_table(spark, table, conn, queue, expected)
    finally:
        p.stop()
    result["seconds"] = round(seconds, 2)
    result["entries_per_s"] = round(expected["published"] / seconds)
    return result


def scenario_crashes(work: Path, cluster: Cluster, spark: Any, count: int, rate: float) -> dict[str, Any]:
    queue = "accept-crashes"
    ck, table = work / "cr-ck", work / "cr-table"
    with clients.sync.connect(cluster.addresses) as conn:
        conn.declare_queue(queue)
    p = pipeline("pipeline-cr", work, cluster.addresses, queue, ck, table)
    p.start()
    events: list[str] = []
    t0 = time.monotonic()

    def note(what: str) -> None:
        events.append(f"{time.monotonic() - t0:7.1f}s {what} (committed {committed(ck)})")

    try:
        wait_until(lambda: "running" in p.text(), 120, "query running", p)
        g = generator(work, cluster.addresses, queue, count, rate, "cr")
        g.start()
        note("generator started")
        wait_until(lambda: committed(ck) >= count * 0.15, 300, "15% committed", p)
        p.kill9()
        note("driver killed (kill -9) #1")
        p.start()
        wait_until(lambda: "running" in p.text(), 120, "query running again", p)
        mark = committed(ck)
        wait_until(progressed(ck, mark, count * 0.1, cluster.addresses, queue), 300,
                   "progress after restart", p)
        cluster.brokers[0].kill9()  # the first of the list: the source's driver and reads use it
        note("broker-1 killed (kill -9)")
        mark = committed(ck)
        wait_until(progressed(ck, mark, count * 0.1, cluster.addresses, queue), 300,
                   "progress after broker loss", p)
        p.kill9()
        note("driver killed (kill -9) #2")
        p.start()
        expected = generated(g)
        note("generator done")
        wait_until(lambda: committed(ck) >= expected["published"], 600, "all committed", p)
        note("all committed")
        with clients.sync.connect(cluster.addresses) as conn:
            wait_until(lambda: conn.queue_stats(queue)["ready"] == 0, 60, "queue empty", p)
            result = check_table(spark, table, conn, queue, expected)
    finally:
        p.stop()
    cluster.start(0)  # back for the next scenario
    result["seconds"] = round(time.monotonic() - t0, 1)
    result["events"] = events
    return result


def scenario_takeover(
    work: Path, cluster: Cluster, spark: Any, count: int, rate: float, limit: float
) -> dict[str, Any]:
    queue = "accept-takeover"
    ck, table = work / "to-ck", work / "to-table"
    with clients.sync.connect(cluster.addresses) as conn:
        conn.declare_queue(queue)
    a = pipeline("pipeline-a", work, cluster.addresses, queue, ck, table)
    b = pipeline("pipeline-b", work, cluster.addresses, queue, ck, table)
    g = generator(work, cluster.addresses, queue, count, rate, "to")
    a.start()
    b.start()
    try:
        wait_until(lambda: "leading" in a.text() or "leading" in b.text(), 120, "a leader", a, b)
        wait_until(lambda: "ready" in a.text() and "ready" in b.text(), 120, "both ready", a, b)
        leader, standby = (a, b) if "leading" in a.text() else (b, a)
        g.start()
        wait_until(lambda: committed(ck) >= count * 0.3, 300, "30% committed", a, b)
        only_one = "leading" not in standby.text() and "running" not in standby.text()
        leader.kill9()
        killed_at = time.monotonic()
        at = committed(ck)
        wait_until(lambda: "running" in standby.text(), limit, "takeover", standby)
        takeover = time.monotonic() - killed_at
        wait_until(lambda: committed(ck) > at, 120, "progress after takeover", standby)
        first_commit = time.monotonic() - killed_at
        expected = generated(g)
        wait_until(lambda: committed(ck) >= expected["published"], 600, "all committed", standby)
        with clients.sync.connect(cluster.addresses) as conn:
            wait_until(lambda: conn.queue_stats(queue)["ready"] == 0, 60, "queue empty", standby)
            result = check_table(spark, table, conn, queue, expected)
    finally:
        g.stop(5)  # (only still running if the scenario failed early)
        a.stop()
        b.stop()
    result["only_leader_ran_query"] = only_one
    result["takeover_s"] = round(takeover, 1)
    result["first_commit_after_kill_s"] = round(first_commit, 1)
    result["ok"] = result["ok"] and only_one
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=2000, help="entries/s published during runs")
    p.add_argument("--takeover-count", type=int, default=None, help="default: count / 2")
    p.add_argument("--takeover", type=float, default=60.0, help="takeover limit, seconds")
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--only", choices=("throughput", "crashes", "takeover"), action="append")
    args = p.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="baton-spark-acceptance-"))
    work.mkdir(parents=True, exist_ok=True)
    from batonmq.clients.import_entries import spark_session

    cluster = Cluster(work)
    cluster.start()
    spark = spark_session("baton-acceptance-check", master="local[1]")
    spark.sparkContext.setLogLevel("ERROR")
    results: dict[str, Any] = {"count": args.count, "workdir": str(work)}
    only = set(args.only or ("throughput", "crashes", "takeover"))
    try:
        if "throughput" in only:
            results["throughput"] = scenario_throughput(work, cluster, spark, args.count)
            print(json.dumps({"throughput": results["throughput"]}), flush=True)
        if "crashes" in only:
            results["crashes"] = scenario_crashes(work, cluster, spark, args.count, args.rate)
            print(json.dumps({"crashes": results["crashes"]}), flush=True)
        if "takeover" in only:
            n = args.takeover_count or args.count // 2
            results["takeover"] = scenario_takeover(work, cluster, spark, n, args.rate, args.takeover)
            print(json.dumps({"takeover": results["takeover"]}), flush=True)
    finally:
        spark.stop()
        cluster.stop()
    results["ok"] = all(r["ok"] for k, r in results.items() if isinstance(r, dict))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    if results["ok"] and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
