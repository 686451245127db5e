"""The Spark source and the import-entries pipeline with real Spark (local[2]) and real
broker processes (docs/design.md §11, docs/spark.md).

One Spark session is shared by the module (its start costs ~8 s); the pipeline runs
in its own processes so that its driver can be killed with ``kill -9``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the 'spark' extra: pip install -e '.[test,spark]'")

from batonmq import clients
from batonmq.cluster.errors import Timeout
from batonmq.clients.import_entries import committed_position, generate
from tests.helpers import eventually_sync
from tests.integration.conftest import REPO, BrokerProcess, brokers_of, started
from tests.integration.test_cli import baton

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from batonmq.clients.import_entries import spark_session

    session = spark_session("baton-tests")
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    """Two brokers on one file: log, shared by the module (each test uses its own queue)."""
    base = tmp_path_factory.mktemp("spark-brokers")
    log_url = f"file:{base / 'shared-log'}"
    started = [BrokerProcess(base / f"node-{i}", log_url=log_url, node_id=f"node-{i}") for i in (1, 2)]
    try:
        for b in started:
            b.start()
        yield started
    finally:
        for b in started:
            b.stop()


def addresses(brokers: list[BrokerProcess]) -> str:
    return ",".join(b.address for b in brokers)


def run_available_now(spark: Any, brokers: str, queue: str, table: Path, checkpoint: Path) -> None:
    """One run of a plain source -> Parquet query over what the queue holds now."""
    query = (
        spark.readStream.format("baton")
        .option("brokers", brokers)
        .option("queue", queue)
        .option("maxEntriesPerTrigger", "1500")
        .load()
        .writeStream.format("parquet")
        .option("path", str(table))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(100)
    assert query.exception() is None, query.exception()


def batch_ends(checkpoint: Path) -> list[int]:
    """Each planned micro-batch's end position, from the checkpoint's offset log."""
    names = sorted(int(n) for n in os.listdir(checkpoint / "offsets") if n.isdigit())
    return [
        json.loads((checkpoint / "offsets" / str(n)).read_text().splitlines()[2])["position"]
        for n in names
    ]


def test_source_reads_ranges_and_commits(
    spark: Any, brokers: list[BrokerProcess], tmp_path: Path
) -> None:
    queue = "src-q"
    table, checkpoint = tmp_path / "table", tmp_path / "ck"
    with clients.sync.connect(brokers[0].address) as conn:
        conn.declare_queue(queue)
        conn.publish_batch(queue, [(b"body-%d" % i, {"n": i, "s": "x"}) for i in range(3000)])
        # The first batches plan from the second broker's answers as well as the first's.
        run_available_now(spark, addresses(brokers[::-1]), queue, table, checkpoint)
        rows = spark.read.parquet(str(table)).collect()
        assert sorted(r.position for r in rows) == list(range(3000))
        by_pos = {r.position: r for r in rows}
        assert by_pos[42].body == b"body-42" and by_pos[42].headers == {"n": "42", "s": "x"}
        assert by_pos[42].publish_time is not None
        stats = conn.queue_stats(queue)
        assert stats["reserved_by"] == f"spark:{queue}"
        # Spark commits a batch (AcceptThrough) when it plans the next one: everything
        # up to the second-to-last batch's end is accepted, the last batch's entries not
        # until the next run's next batch.
        ends = batch_ends(checkpoint)
        assert ends[-1] == 3000
        head = ends[-2] if len(ends) > 1 else 0
        assert stats["head"] == head and stats["ready"] == 3000 - head
        # No consumer gets anything from a reserved queue.
        with conn.consume(queue, prefetch=10) as consumer:
            with pytest.raises(Timeout):
                consumer.next(timeout=0.5)
        conn.publish_batch(queue, [b"late-%d" % i for i in range(10)])
        run_available_now(spark, addresses(brokers), queue, table, checkpoint)
        assert conn.queue_stats(queue)["ready"] == 10  # the earlier batch is accepted now
        positions = [r.position for r in spark.read.parquet(str(table)).collect()]
        assert sorted(positions) == list(range(3010))  # each once
        # The pipeline's own flush: accept what the checkpoint says is committed.
        assert committed_position(str(checkpoint)) == 3010
        assert conn.accept_through(queue, 3010, f"spark:{queue}") == 10
        assert conn.queue_stats(queue)["ready"] == 0


class Pipeline:
    """``baton import-entries run`` in its own process group (JVM included)."""

    def __init__(self, tmp: Path, brokers: str, queue: str, *extra: str) -> None:
        self.cmd = [
            sys.executable, "-m", "batonmq.broker", "--log-level", "WARNING", "import-entries", "run",
            "--brokers", brokers, "--queue", queue, "--table", str(tmp / "table"),
            "--checkpoint", str(tmp / "ck"), "--trigger", "0.5", "--max-per-trigger", "3000",
            *extra,
        ]
        self.out = tmp / "pipeline.out"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ)
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(
                self.cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.out.read_text(errors="replace")[-6000:]

    def kill9(self) -> None:
        """kill -9 of the driver: the Python process and its JVM (which runs in a
        session of its own, with Spark's Python workers)."""
        assert self.proc is not None
        tree = descendants(self.proc.pid)
        os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_group(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return -1


def wait_for(check: Callable[[], bool], timeout: float, what: str, pipeline: Pipeline) -> None:
    """Poll ``check`` while the pipeline runs (its output goes with a failure)."""

    def probe() -> bool:
        if check():
            return True
        assert pipeline.proc is None or pipeline.proc.poll() is None, pipeline.output()
        return False

    eventually_sync(probe, what, timeout=timeout, interval=0.2, context=pipeline.output)


@pytest.mark.timeout(300)
def test_pipeline_exactly_once_across_kill9_of_the_driver(
    spark: Any, brokers: list[BrokerProcess], tmp_path: Path
) -> None:
    queue = "entries-kill9"
    total = 6_000
    bodies = list(generate(total, run="k9", seed=7))
    valid = sum(ok for _, ok in bodies)
    with clients.sync.connect(addresses(brokers)) as conn:
        conn.declare_queue(queue)
        conn.publish_batch(queue, [b for b, _ in bodies[:4000]])
        pipeline = Pipeline(tmp_path, addresses(brokers), queue, "--no-leadership")
        pipeline.start()
        try:
            ck = str(tmp_path / "ck")
            wait_for(lambda: (committed_position(ck) or 0) >= 1500, 90, "a committed batch", pipeline)
            pipeline.kill9()  # between micro-batches or in the middle of one
            conn.publish_batch(queue, [b for b, _ in bodies[4000:]])
            pipeline.start()
            wait_for(lambda: (committed_position(ck) or 0) >= total, 120, "all committed", pipeline)
            wait_for(lambda: conn.queue_stats(queue)["ready"] == 0, 30, "queue empty", pipeline)
        finally:
            pipeline.stop()
        table = spark.read.parquet(str(tmp_path / "table"))
        assert table.count() == valid
        assert table.select("key").distinct().count() == valid
        assert table.select("position").distinct().count() == valid
        dlq = conn.queue_stats(f"{queue}.dlq")
        assert dlq["ready"] == total - valid  # each invalid entry dead-lettered once
        with conn.consume(f"{queue}.dlq", prefetch=500) as consumer:
            got = [consumer.next(timeout=5) for _ in range(total - valid)]
            reasons = {m.headers["x-import-error"].split(":")[0] for m in got}
            assert "not JSON" in reasons and len(got) == total - valid
            assert len({m.headers["x-source-position"] for m in got}) == len(got)
            for m in got:
                m.ack()


@pytest.mark.timeout(300)
def test_ctrl_c_of_the_pipeline_ends_it_quietly(
    brokers: list[BrokerProcess], tmp_path: Path
) -> None:
    queue = "entries-ctrl-c"
    with clients.sync.connect(addresses(brokers)) as conn:
        conn.declare_queue(queue)
        conn.publish_batch(queue, [b for b, _ in generate(20_000, run="cc", seed=3)])
    pipeline = Pipeline(tmp_path, addresses(brokers), queue, "--no-leadership")
    pipeline.start()
    try:
        ck = str(tmp_path / "ck")
        wait_for(lambda: (committed_position(ck) or 0) >= 3000, 90, "a committed batch", pipeline)
        assert pipeline.proc is not None
        # Spark's JVM and Python workers are outside the pipeline's process group, so the
        # Ctrl-C below cannot kill a worker in the middle of a batch.
        spark_processes = descendants(pipeline.proc.pid)
        assert spark_processes, "the pipeline has no Spark processes"
        in_group = [p for p in spark_processes if process_group(p) == pipeline.proc.pid]
        assert not in_group, f"Spark processes in the pipeline's process group: {in_group}"
        os.killpg(pipeline.proc.pid, signal.SIGINT)  # Ctrl-C: the whole process group
        assert pipeline.proc.wait(60) == 0, pipeline.output()
    finally:
        pipeline.stop()
    out = pipeline.output()
    # The batch in progress finishes first: no interrupted writer, no Java stack trace.
    assert "ERROR" not in out and "Exception" not in out, out
    assert not re.search(r"^\s+at [\w.$]+\(", out, re.M), out
    assert "query stopped" in out


@pytest.mark.timeout(300)
def test_two_instances_only_the_leader_runs_the_query_and_the_other_takes_over(
    spark: Any, brokers: list[BrokerProcess], tmp_path: Path
) -> None:
    """The acceptance scenario (loadtest/spark_acceptance.py) at a CI size: two instances
    on one checkpoint, kill -9 of the leader while entries are published, the standby
    finishes from the checkpoint: no duplicate, no gap, queue empty, DLQ once."""
    from batonmq.loadtest.spark_acceptance import scenario_takeover

    cluster = SimpleNamespace(addresses=addresses(brokers))
    result = scenario_takeover(tmp_path, cluster, spark, 6000, 600, 60)  # type: ignore[arg-type]
    assert result["only_leader_ran_query"], result
    assert result["table_rows"] == result["distinct_keys"] == result["valid"], result
    assert result["queue_ready"] == 0 and result["dlq_entries"] == result["invalid"], result
    assert result["ok"], result


@pytest.fixture
def three_grouped(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Three brokers on one file log of two data partitions in replica groups of two:
    one broker is in both groups, each other one in one (docs/design.md §16)."""
    yield from started(brokers_of(
        tmp_path, f"file:{tmp_path / 'shared-log'}", 3, ["--partitions", "2", "--replicas", "2"],
    ))


def connected(broker: BrokerProcess) -> set[str]:
    """The client names of ``broker``'s connections."""
    with clients.sync.connect(broker.address, timeout=5, route=False) as conn:
        return {c["client_name"] for c in conn.connections()}


def settled_groups(address: str) -> dict[int, dict[str, Any]]:
    """Both groups of two caught-up live replicas, nothing moving, spread 2/1/1."""

    def steady(t: dict[str, Any]) -> bool:
        groups = t.get("groups") or []
        if len(groups) != 2 or not all(
            g["replicas"] is not None and len(g["replicas"]) == 2 and not g["joining"]
            and not g["leaving"] and g["live_replicas"] == 2 for g in groups
        ):
            return False
        held = [sum(i["node_id"] in g["replicas"] for g in groups) for i in t["instances"]]
        return sorted(held) == [1, 1, 2]

    def probe() -> dict[str, Any]:
        with clients.sync.connect(address, timeout=5) as conn:
            return conn.topology()

    top = eventually_sync(probe, "replica groups settled", timeout=60, until=steady, interval=0.2)
    return {g["partition"]: g for g in top["groups"]}


@pytest.mark.timeout(400)
def test_pipeline_exactly_once_across_a_partition_move(
    spark: Any, three_grouped: list[BrokerProcess], tmp_path: Path
) -> None:
    """The broker the source reads from leaves the queue's replica group in the middle of
    the run (``baton partitions move --wait``): the source follows the queue to its new
    replicas (the client's routing), and every entry lands in the table once."""
    groups = settled_groups(three_grouped[0].address)
    by_node = {b.node_id: b for b in three_grouped}
    # The source reads from the broker in both groups (its partition stays balanced
    # after the move, so the control leader's planner moves nothing back).
    source = next(
        b for b in three_grouped if all(b.node_id in g["replicas"] for g in groups.values())
    )
    k = 1
    target = next(b for b in three_grouped if b.node_id not in groups[k]["replicas"])
    others = [b for b in three_grouped if b is not source]
    queue, total = "entries-move", 3000
    bodies = [b for b, _ in generate(total, run="mv", seed=11)]
    valid = sum(ok for _, ok in generate(total, run="mv", seed=11))
    ck = str(tmp_path / "ck")
    with clients.sync.connect(source.address) as conn:
        conn.declare_queue(queue, partition=k)
        conn.publish_batch(queue, bodies[:1000])
        # The source's brokers: the one it reads from first (it applies the partition).
        pipeline = Pipeline(
            tmp_path, addresses([source, *others]), queue, "--max-per-trigger", "400"
        )
        pipeline.start()
        try:
            # (Spark's start is most of the test; a busy machine makes it slow.)
            wait_for(lambda: (committed_position(ck) or 0) >= 300, 150, "a committed batch",
                     pipeline)
            publishing = threading.Event()
            errors: list[BaseException] = []

            def produce() -> None:  # entries keep coming while the partition moves
                try:
                    with clients.sync.connect(addresses(others)) as producer:
                        for i in range(1000, 2500, 50):
                            producer.publish_batch(queue, bodies[i:i + 50])
                            publishing.wait(0.1)  # (a pace, about 500 entries/s)
                except BaseException as exc:
                    errors.append(exc)

            producer = threading.Thread(target=produce, name="move-producer")
            producer.start()
            r = baton(
                "partitions", "move", str(k), "--from", source.node_id, "--to", target.node_id,
                "--wait", "--timeout", "90", "--broker", others[0].address, timeout=120,
            )
            producer.join(60)
            assert r.returncode == 0, (r.stdout, r.stderr)
            assert not producer.is_alive() and not errors, errors
            moved = settled_groups(others[0].address)[k]
            assert source.node_id not in moved["replicas"], moved
            assert target.node_id in moved["replicas"], moved
            # These can only be read from the partition's new replicas.
            conn.publish_batch(queue, bodies[2500:])
            wait_for(lambda: (committed_position(ck) or 0) >= total, 90, "all committed", pipeline)
            wait_for(lambda: conn.queue_stats(queue)["ready"] == 0, 30, "queue empty", pipeline)
            stats = conn.queue_stats(queue)
            assert stats["acquired"] == 0 and stats["partition"] == k, stats
            # The driver follows the queue: it has a connection to a broker of the new
            # group (its client's routing, clients/routing.py).
            wait_for(lambda: any(
                f"baton-spark:spark:{queue}" in connected(by_node[n]) for n in moved["replicas"]
            ), 30, "the driver connected to a new replica", pipeline)
        finally:
            pipeline.stop()
        table = spark.read.parquet(str(tmp_path / "table"))
        assert table.count() == valid
        assert table.select("key").distinct().count() == valid
        assert table.select("position").distinct().count() == valid
        assert conn.queue_stats(f"{queue}.dlq")["ready"] == total - valid  # each once
