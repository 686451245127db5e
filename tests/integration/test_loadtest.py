"""The load-test harness end to end, with real processes: a short run on 3 brokers is clean and a
corrupted history fails; a fault run (kill -9, SIGSTOP, join) keeps every guarantee; the same
workload runs on RabbitMQ and NATS JetStream servers that the harness starts itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from batonmq.loadtest.history import OpKind, load_run, write_ops
from tests.integration.conftest import REPO, partitions_under_test

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def loadtest(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    parts = partitions_under_test()
    if parts > 1 and "--check" not in args and "--partitions" not in args:
        args = (*args, "--partitions", str(parts))  # the suite on a split log
    return subprocess.run(
        [sys.executable, "-m", "batonmq.loadtest", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


@pytest.mark.timeout(180)
def test_throughput_run_on_three_brokers_is_clean_and_a_corrupted_history_fails(
    tmp_path: Path,
) -> None:
    report = tmp_path / "report"
    run_dir = report / "baton"
    out = tmp_path / "result.json"
    done = loadtest(
        "--preset", "throughput", "--duration", "6", "--brokers", "3",
        "--report", str(report), "--json", str(out),
        timeout=150,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["ok"] is True
    assert all(v == 0 for k, v in result["checker"]["counts"].items()), result["checker"]
    metrics = result["metrics"]
    assert metrics["confirmed"] > 0 and metrics["confirmed_msgs_per_s"] > 0
    assert metrics["accepted"] > 0 and metrics["consume_msgs_per_s"] > 0
    assert metrics["confirm_latency_ms"]["p50"] > 0
    assert metrics["e2e_latency_ms"]["p99"] > 0
    assert "confirmed" in done.stderr  # the live progress lines
    assert "checker: OK" in done.stdout

    # The kept histories check clean on their own ...
    again = loadtest("--check", str(run_dir), timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr

    # ... until a second consumer gets a message while the first one still holds it.
    ops = load_run(run_dir)
    held = next(op for op in ops if op.kind == OpKind.DELIVER and op.actor != "drain")
    twin = replace(held, t=held.t + 1, actor="intruder/" + held.queue)
    write_ops(run_dir / "zz-injected.hist", [twin])
    bad = loadtest("--check", str(run_dir), timeout=60)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "checker: FAILED" in bad.stdout
    assert "double_delivery=1" in bad.stdout


@pytest.mark.timeout(180)
def test_replicas_reach_every_broker_and_the_results_record_them(tmp_path: Path) -> None:
    refused = loadtest("--replicas", "2", "--partitions", "1", "--duration", "1",
                       timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--replicas is for a split log" in refused.stderr, refused.stderr
    # Groups of all three brokers: until a broker forwards a command for a partition it
    # does not apply, the harness's clients need every broker to serve every queue.
    report, out = tmp_path / "report", tmp_path / "result.json"
    done = loadtest(
        "--preset", "throughput", "--duration", "5", "--brokers", "3", "--partitions", "2",
        "--replicas", "3", "--queues", "4", "--report", str(report), "--json", str(out),
        timeout=150,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["ok"] is True, result["checker"]
    assert result["config"]["partitions"] == 2 and result["config"]["replicas"] == 3
    assert "partitions 2  replicas 3" in done.stdout, done.stdout
    assert "replica groups of 3" in (report / "report.html").read_text()
    starts = [line for f in (report / "baton").rglob("*") if f.is_file()
              for line in f.read_text(errors="replace").splitlines()
              if line.startswith("== harness: start")]
    assert len(starts) == 3, starts
    assert all("options --partitions 2 --replicas 3" in line for line in starts), starts


@pytest.mark.timeout(240)
def test_fault_run_with_kill9_sigstop_and_join_keeps_the_guarantees(tmp_path: Path) -> None:
    report = tmp_path / "report"
    out = tmp_path / "result.json"
    done = loadtest(
        # Faults every 5 s in turn; a slow restart delays the next one, and faults not
        # started when the load ends are skipped: 30 s leave room for the first three.
        "--preset", "latency", "--rate", "1500", "--duration", "30", "--brokers", "3",
        "--faults", "kill9,sigstop,join@5s", "--report", str(report), "--json", str(out),
        "--quiet",
        timeout=220,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    counts = result["checker"]["counts"]
    assert all(counts[k] == 0 for k in ("lost", "double_delivery", "redelivered_after_accept",
                                         "accepted_twice", "duplicate_enqueue", "order",
                                         "poison_loop")), counts
    faults = result["metrics"]["faults"]
    started = [f["kind"] for f in faults if f["phase"] == "start"]
    assert started[:3] == ["kill9", "sigstop", "join"], faults
    assert not result["metrics"].get("fault_errors")
    # The killed broker's consumers lost their holds at the fault, and the run went on.
    assert result["checker"]["stats"]["faults"] >= 3
    assert result["metrics"]["accepted"] > 0.9 * result["metrics"]["confirmed"]
    # The joined broker was sampled too, and the fault times are on the timeline.
    assert "node-4" in result["metrics"]["servers"]["per_process"]
    assert [f[1] for f in result["metrics"]["timeline"]["faults"] if f[2] == "start"][:3] == \
        ["kill9", "sigstop", "join"]
    for png in ("throughput.png", "latency.png", "servers.png"):
        assert (report / png).read_bytes()[:4] == b"\x89PNG"
    assert "kill9" in (report / "report.html").read_text()


@pytest.mark.timeout(240)
def test_grow_and_kill9_replicas_on_replica_groups_keep_the_guarantees(tmp_path: Path) -> None:
    """A broker joins for good and takes a partition (four brokers hold six replicas:
    the planner moves one to the fifth); then one replica of each group is killed -9 at
    once and restarted; the checker stays clean."""
    report, out = tmp_path / "report", tmp_path / "result.json"
    done = loadtest(
        "--preset", "latency", "--rate", "800", "--duration", "16", "--brokers", "4",
        "--partitions", "2", "--replicas", "3",
        "--faults", "grow@at:3; kill9-replicas:2s@at:9", "--report", str(report),
        "--json", str(out), "--quiet",
        timeout=220,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert all(v == 0 for v in result["checker"]["counts"].values()), result["checker"]
    assert not result["metrics"].get("fault_errors")
    faults = result["metrics"]["faults"]
    started = [f["kind"] for f in faults if f["phase"] == "start"]
    assert started[:2] == ["grow", "kill9-replicas"], faults
    grown = next(f["detail"] for f in faults if f["kind"] == "grow" and f["phase"] == "end")
    assert grown.startswith("node=node-5 ") and " partitions=" in grown, grown
    assert "moved=" not in grown, grown  # the planner gave it one: no move asked for
    kills = [f["detail"] for f in faults if f["kind"] == "kill9" and f["phase"] == "start"]
    end = next(f["detail"] for f in faults
               if f["kind"] == "kill9-replicas" and f["phase"] == "end")
    # Groups of three on two partitions: one or two brokers, one replica of each group.
    assert 1 <= len(kills) <= 2 and "(one replica of each group)" in end, (kills, end)
    assert "back_after=" in end and "faults: grow@" in done.stdout, done.stdout
    # The grown broker stayed to the end and was sampled.
    assert "node-5" in result["metrics"]["servers"]["per_process"]


def _need(binary: str, package: str, *paths: str) -> None:
    if shutil.which(binary) is None and not any(Path(p).exists() for p in paths):
        reason = f"{binary} is not installed (apt-get install -y {package})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}: CI installs it, so this may not skip", pytrace=False)
        pytest.skip(reason)


@pytest.mark.timeout(240)
def test_the_same_workload_on_rabbitmq_and_nats_clusters_side_by_side(tmp_path: Path) -> None:
    """The harness starts a 3-node RabbitMQ cluster (quorum queue on 3 replicas) and a
    3-node NATS cluster (R3 stream, fsync on every write), runs a few hundred messages
    through each, and stops every node."""
    _need("rabbitmq-server", "rabbitmq-server", "/usr/lib/rabbitmq/bin/rabbitmq-server")
    _need("nats-server", "nats-server")
    report = tmp_path / "report"
    out = tmp_path / "result.json"
    done = loadtest(
        "--system", "rabbitmq", "--system", "nats-sync", "--peer-nodes", "3",
        "--messages", "400", "--duration", "20", "--size", "1024",
        "--report", str(report), "--json", str(out), "--quiet",
        timeout=230,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["ok"] is True
    assert [r["system"] for r in result["comparison"]] == ["rabbitmq (3 nodes)",
                                                           "nats-sync (3 nodes)"]
    for run in result["runs"]:
        m = run["metrics"]
        assert run["config"]["brokers"] == 3
        assert m["confirmed"] == 400 and m["accepted"] == 400, (run["config"], m)
        assert m["e2e_latency_ms"]["p50"] > 0
        # Every node's process tree was sampled, and so were the generator's processes.
        nodes = m["servers"]["per_process"]
        assert len(nodes) == 3 and all(v["rss_max_mib"] > 0 for v in nodes.values()), nodes
        # A worker is sampled once a second and its first sample (start-up) is left
        # out, so one that finished 400 messages within about a second may be missing.
        sampled = set(m["generator"]["per_process"])
        assert sampled and sampled <= {"p1", "p2", "c1", "c2"}, sampled
        assert run["checker"]["counts"]["pending"] == 0
    # The replicas: the quorum queue (its Raft member dir: vhost "/" as 2F, then the
    # queue name) and the stream each had one on every node.
    for node in ("node1", "node2", "node3"):
        assert list((report / "rabbitmq" / "servers" / node / "mnesia").rglob("2F_LT-*")), node
        assert list((report / "nats-sync" / "servers" / node / "store").rglob("LT_lt-0")), node
    assert "sync_interval: always" in (
        report / "nats-sync" / "servers" / "node1" / "nats.conf").read_text()
    assert "publish/s" in done.stdout and "nodes 3" in done.stdout
    assert (report / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    # The servers are gone: no process still runs with the report dir on its command line
    # or in its environment (nats-server's config, beam.smp's Mnesia dir, epmd's HOME).
    assert _processes_mentioning(str(report)) == []


def _processes_mentioning(text: str) -> list[str]:
    """Live processes with ``text`` on their command line or in their environment (the
    harness gives RabbitMQ's epmd and nodes a HOME in the run dir)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmd or text in env:
            found.append(f"{pid}: {cmd[:200]}")
    return found


@pytest.mark.timeout(300)
def test_kafka_restart_and_a_full_disk_lose_nothing_confirmed(tmp_path: Path) -> None:
    from tests.kafka_fixture import missing_tools, unavailable

    missing = missing_tools()
    if missing:
        unavailable(f"no Kafka: {' and '.join(missing)} needed by .ci/kafka")
    if os.geteuid() != 0:
        unavailable("the diskfull fault mounts a tmpfs: run as root")
    report = tmp_path / "report"
    out = tmp_path / "result.json"
    done = loadtest(
        "--preset", "latency", "--rate", "500", "--duration", "20", "--brokers", "3",
        "--log", "kafka", "--disk-limit", "256",
        "--faults", "kafka-restart:2s@at:4; diskfull:4s@at:8", "--report", str(report),
        "--json", str(out), "--quiet",
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["config"]["log"] == "kafka"
    assert result["ok"] is True, result["checker"]
    started = [f["kind"] for f in result["metrics"]["faults"] if f["phase"] == "start"]
    assert started == ["kafka-restart", "diskfull"], result["metrics"]["faults"]
    ended = [f for f in result["metrics"]["faults"] if f["phase"] == "end"]
    assert int(ended[1]["detail"].removeprefix("filled=")) > 100 << 20  # the tmpfs was full
    assert result["metrics"]["confirmed"] > 1000
    assert result["checker"]["counts"]["lost"] == 0
    # Kafka and the tmpfs are gone again.
    assert _processes_mentioning(str(report)) == []
    assert not os.path.ismount(report / "baton" / "servers" / "data")


def _toxiproxy_or_skip() -> None:
    from batonmq.loadtest.netfaults import ToxiproxyError, toxiproxy_binary

    try:
        toxiproxy_binary()
    except ToxiproxyError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{exc}: CI installs it, so this may not skip", pytrace=False)
        pytest.skip(str(exc))


@pytest.mark.timeout(200)
def test_network_faults_through_toxiproxy_keep_the_guarantees(tmp_path: Path) -> None:
    """A netsplit, a cut of one broker's clients and a slow network, in turn, in one run."""
    _toxiproxy_or_skip()
    report = tmp_path / "report"
    out = tmp_path / "result.json"
    kinds = ["netsplit", "client-partition", "slow-net"]
    done = loadtest(
        "--preset", "latency", "--rate", "800", "--duration", "28", "--brokers", "3",
        "--faults", f"{':5s,'.join(kinds)}:5s@at:4,12,20", "--report", str(report),
        "--json", str(out), "--quiet",
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    counts = result["checker"]["counts"]
    assert all(v == 0 for k, v in counts.items() if k != "pending"), counts
    assert counts["pending"] == 0, counts
    assert not result["metrics"].get("fault_errors")
    phases = [(f["kind"], f["phase"]) for f in result["metrics"]["faults"]]
    assert phases == [(k, p) for k in kinds for p in ("start", "end")], phases
    metrics = result["metrics"]
    # Accepts cut with their connection have an unknown outcome (not counted as accepted).
    assert metrics["confirmed"] > 0 and metrics["accepted"] > 0.95 * metrics["confirmed"], metrics
    # The cut broker's workers lost their connections and went on elsewhere.
    assert "failing over" in done.stderr
    # Every round trip crossed the proxies' 80 ms (+-40) each way while the network was slow.
    assert metrics["confirm_latency_ms"]["max"] >= 80, metrics["confirm_latency_ms"]


@pytest.mark.timeout(200)
def test_disk_faults_bitflip_and_truncate_make_the_broker_rejoin_afresh(tmp_path: Path) -> None:
    report = tmp_path / "report"
    out = tmp_path / "result.json"
    done = loadtest(
        "--preset", "latency", "--rate", "800", "--duration", "20", "--brokers", "3",
        "--faults", "bitflip,truncate@5s", "--report", str(report), "--json", str(out),
        "--quiet",
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    counts = result["checker"]["counts"]
    assert all(v == 0 for v in counts.values()), counts
    assert not result["metrics"].get("fault_errors")
    ended = [f for f in result["metrics"]["faults"] if f["phase"] == "end"]
    assert [f["kind"] for f in ended][:2] == ["bitflip", "truncate"], ended
    # Each damaged broker said so once per fault, kept the damaged store, and rejoined.
    servers = report / "baton" / "servers"
    said = sum(p.read_text().count("CRITICAL baton.broker: store damaged")
               for p in servers.glob("node-*.out"))
    assert said == len(ended), (said, ended)
    assert len(list((servers / "data").glob("node-*/store.damaged-*"))) == len(ended)


@pytest.mark.timeout(200)
def test_clockjump_under_libfaketime_drops_no_member_and_loses_nothing(tmp_path: Path) -> None:
    from batonmq.loadtest.cluster import LIBFAKETIME

    if not LIBFAKETIME.exists():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("libfaketime is missing: CI installs it", pytrace=False)
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    report = tmp_path / "report"
    out = tmp_path / "result.json"
    done = loadtest(
        "--preset", "latency", "--rate", "800", "--duration", "20", "--brokers", "3",
        "--faults", "clockjump:6s@at:4", "--report", str(report), "--json", str(out), "--quiet",
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    counts = result["checker"]["counts"]
    assert all(v == 0 for v in counts.values()), counts
    assert not result["metrics"].get("fault_errors")
    faults = result["metrics"]["faults"]
    assert [(f["kind"], f["phase"]) for f in faults] == [("clockjump", "start"),
                                                        ("clockjump", "end")], faults
    # No member was suspected or dropped: the broker's view is the same after the jumps.
    views = [f["detail"].rsplit("view=", 1)[1] for f in faults]
    assert views[0] != "?" and views[0] == views[1], faults


@pytest.mark.timeout(220)
def test_composite_faults_kill_while_paused_and_netsplit_during_join(tmp_path: Path) -> None:
    _toxiproxy_or_skip()
    report = tmp_path / "report"
    out = tmp_path / "result.json"
    done = loadtest(
        "--preset", "latency", "--rate", "800", "--duration", "20", "--brokers", "3",
        "--faults", "kill9-while-paused,netsplit-during-join@4s", "--report", str(report),
        "--json", str(out), "--quiet",
        timeout=200,
    )
    result = json.loads(out.read_text())
    counts = result["checker"]["counts"]
    # redelivered_after_accept is left out: a consumer of the paused broker may still
    # hand its application messages that broker sent before the pause, after another
    # consumer accepted them (docs/loadtest.md "Composite faults").
    strict = ("lost", "double_delivery", "accepted_twice", "duplicate_enqueue", "order",
              "unexpected", "split_brain", "pending")
    bad = {k: counts[k] for k in strict if counts[k]}
    assert not bad, (bad, result["checker"].get("examples"), done.stdout[-3000:])
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert not result["metrics"].get("fault_errors")
    started = [f["kind"] for f in result["metrics"]["faults"] if f["phase"] == "start"]
    assert started[:3] == ["kill9-while-paused", "sigstop", "kill9"], started
    assert "netsplit-during-join" in started and "join" in started, started
    ends = [f for f in result["metrics"]["faults"]
            if f["kind"] == "netsplit-during-join" and f["phase"] == "end"]
    assert ends and "joined=node-4" in ends[0]["detail"], ends


@pytest.mark.timeout(180)
def test_work_queue_run_keeps_delays_and_retries_across_kill9(tmp_path: Path) -> None:
    """The work-queue preset (delayed publishes, a retry policy for failed releases) on
    three brokers with a kill -9: nothing is delivered before its delay or retry delay
    and nothing is lost across the retries."""
    report = tmp_path / "report"
    out = tmp_path / "result.json"
    done = loadtest(
        "--preset", "work-queue", "--rate", "1500", "--duration", "12", "--brokers", "3",
        "--faults", "kill9@4s", "--report", str(report), "--json", str(out), "--quiet",
        timeout=170,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    counts = result["checker"]["counts"]
    assert all(v == 0 for v in counts.values()), counts
    stats = result["checker"]["stats"]
    assert stats["redeliveries"] > 0 and stats["faults"] >= 1, stats
    history = load_run(report / "baton")
    delayed = [op for op in history if op.kind == OpKind.PUBLISH_INVOKE and op.info]
    assert delayed and all(op.info == "delay_ms=500" for op in delayed)


@pytest.mark.timeout(120)
def test_peers_reach_a_broker_through_its_own_proxy_which_netsplit_cuts(tmp_path: Path) -> None:
    """Behind Toxiproxy each broker advertises a peer proxy (what its heartbeats offer
    a joiner), apart from its clients' proxy: a ``client-partition`` leaves that link
    up, a ``netsplit`` cuts it too."""
    _toxiproxy_or_skip()
    import threading

    from batonmq.clients import sync as client_sync
    from batonmq.clients.errors import BatonError
    from batonmq.loadtest.cluster import BatonCluster
    from tests.helpers import eventually_sync

    cluster = BatonCluster(2, tmp_path, net=True)
    try:
        cluster.start()
        b = cluster.brokers[0]
        assert cluster.net is not None and cluster.proxied(b)
        peer = cluster.net.proxies[f"peer-{b.node_id}"]
        assert peer not in (b.address, b.client_address)

        def advertised() -> dict[str, str]:
            with client_sync.connect(b.address, timeout=5.0) as conn:
                return {i["node_id"]: i["address"] for i in conn.topology()["instances"]}

        seen = eventually_sync(advertised, "both brokers in the view",
                               until=lambda a: len(a) == 2, timeout=30.0)
        assert seen == {x.node_id: cluster.net.proxies[f"peer-{x.node_id}"]
                        for x in cluster.brokers}

        def answers(address: str) -> bool:
            try:
                with client_sync.connect(address, timeout=2.0, failover=False) as conn:
                    return bool(conn.topology())
            except (BatonError, OSError):
                return False

        def during(fault: str) -> dict[str, bool]:
            got: dict[str, bool] = {}
            hold = threading.Thread(target=getattr(cluster, fault), args=(b, 4.0))
            hold.start()
            try:
                # The toxics are in place once the client link stops answering.
                eventually_sync(lambda: not answers(b.client_address), f"{fault} in place",
                                timeout=10.0, interval=0.2)
                got = {"peer": answers(peer), "direct": answers(b.address)}
            finally:
                hold.join()
            return got

        assert during("client_partition") == {"peer": True, "direct": True}
        assert during("netsplit") == {"peer": False, "direct": True}
        eventually_sync(lambda: answers(peer) and answers(b.client_address), "healed",
                        timeout=10.0)
    finally:
        cluster.stop()
