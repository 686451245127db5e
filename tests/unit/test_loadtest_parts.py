"""Load-test harness parts without brokers: fault schedules, config files, measures, plots."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import pytest

from batonmq.loadtest import worker
from batonmq.loadtest.__main__ import load_config
from batonmq.loadtest.adapters import Delivery
from batonmq.loadtest.faults import FaultEvent, FaultSpecError, parse_faults
from batonmq.loadtest.history import (
    FLAG_NORMAL, HistoryWriter, Op, OpKind, load_run, make_body, write_ops,
)
from batonmq.loadtest.procstat import tree_usage
from batonmq.loadtest.workloads import PRESETS
from batonmq.loadtest.runner import analyse_dir, format_comparison, measure, timeline

K = OpKind


def test_a_cycle_of_kinds_every_interval() -> None:
    events = parse_faults("kill9,sigstop,join@30s", duration=100)
    assert [(e.at, e.kind) for e in events] == [(30, "kill9"), (60, "sigstop"), (90, "join")]
    assert events[1].duration == 6.0  # the sigstop default


def test_fixed_times_durations_and_groups() -> None:
    events = parse_faults("sigstop:8@at:10,40; kill9:500ms@at:25", duration=60)
    assert events == [
        FaultEvent(10, "sigstop", 8.0),
        FaultEvent(25, "kill9", 0.5),
        FaultEvent(40, "sigstop", 8.0),
    ]
    assert parse_faults("kill9@at:1m", duration=30) == []  # past the duration


def test_random_schedules_repeat_with_the_seed() -> None:
    a = parse_faults("kill9,sigstop@random:10s", duration=120, seed=7)
    b = parse_faults("kill9,sigstop@random:10s", duration=120, seed=7)
    c = parse_faults("kill9,sigstop@random:10s", duration=120, seed=8)
    assert a == b and a != c
    assert 6 <= len(a) <= 24 and all(0 < e.at < 120 for e in a)
    assert {e.kind for e in a} <= {"kill9", "sigstop"}
    assert all(e.pick is not None for e in a)


@pytest.mark.parametrize("spec", ["kill9", "explode@10s", "kill9@0s", "kill9@soon", "kill9:x@5s"])
def test_bad_fault_specs_are_refused(spec: str) -> None:
    with pytest.raises(FaultSpecError):
        parse_faults(spec, duration=60)


def test_config_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        'preset = "latency"\nduration = 30\nsystems = ["baton", "rabbitmq"]\n'
        'faults = "kill9@10s"\nsize = 512\n[workload]\nqueues = 4\nack-batch = 20\n'
    )
    run, workload = load_config(str(path))
    assert run == {"preset": "latency", "duration": 30, "system": ["baton", "rabbitmq"],
                   "faults": "kill9@10s"}
    assert workload == {"size": 512, "queues": 4, "ack_batch": 20}
    path.write_text("durations = 3\n")
    with pytest.raises(ValueError, match="unknown key"):
        load_config(str(path))
    path.write_text("[workload]\nqueue = 3\n")
    with pytest.raises(ValueError, match="unknown workload field"):
        load_config(str(path))


def _ops(lag: int | None) -> list[Op]:
    ops = []
    for i in range(100):
        t = i * 10_000_000  # one publish every 10 ms, confirmed 2 ms later
        ops.append(Op(K.PUBLISH_INVOKE, t, "p1", "q", f"p1:{i}", -1, -1 if lag is None else lag))
        ops.append(Op(K.PUBLISH_OK, t + 2_000_000, "p1", "q", f"p1:{i}", i))
        ops.append(Op(K.DELIVER, t + 3_000_000, "c1/q", "q", f"p1:{i}", i, 0))
        ops.append(Op(K.ACK_OK, t + 4_000_000, "c1/q", "q", f"p1:{i}", i))
    ops.append(Op(K.FAULT, 500_000_000, "faults", "", "kill9", -1, 0, "node=node-2 address=a"))
    return sorted(ops, key=lambda o: o.t)


def test_measure_and_coordinated_omission_correction() -> None:
    m = measure(_ops(None))
    assert m["confirmed"] == 100 and m["accepted"] == 100
    assert 1.99 <= m["confirm_latency_ms"]["p50"] <= 2.05
    assert 2.99 <= m["e2e_latency_ms"]["p99"] <= 3.05
    assert "confirm_latency_corrected_ms" not in m
    late = measure(_ops(5_000_000))  # each publish went out 5 ms after it was due
    assert 6.99 <= late["confirm_latency_corrected_ms"]["p50"] <= 7.1
    assert 7.99 <= late["e2e_latency_corrected_ms"]["p50"] <= 8.1
    assert late["confirm_latency_ms"]["p50"] <= 2.05


def test_timeline_bins_rates_and_marks_faults() -> None:
    tl = timeline(_ops(None), bin_s=0.5)
    assert tl["t"][:2] == [0.0, 0.5]
    assert tl["confirmed"][0] == 100.0  # 50 confirms in the first half second
    assert sum(tl["accepted"]) * 0.5 == 100
    assert tl["faults"] == [[0.5, "kill9", "start", "node=node-2 address=a"]]
    assert tl["confirm_p50"][0] > 0


def test_report_and_comparison_from_run_dirs(tmp_path: Path) -> None:
    from batonmq.loadtest.report import write_report

    results = []
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        write_ops(d / "all.hist", _ops(None))
        r = analyse_dir(d)
        r.config = {"system": name, "preset": "throughput", "duration": 1.0, "workload": {}}
        results.append(r)
    table = format_comparison(results)
    assert table.splitlines()[2].startswith("a ") and "OK" in table
    # A saturated peer's five-digit latencies stay apart from their neighbours.
    slow = results[1].metrics
    for key in ("confirm_latency_ms", "e2e_latency_ms"):
        slow[key] = {k: 10334.77 for k in slow[key]}
    assert format_comparison(results).splitlines()[3].split()[3:9] == ["10334.77"] * 6
    html = write_report(results, tmp_path / "report")
    for png in ("throughput.png", "latency.png", "comparison.png"):
        data = (tmp_path / "report" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert png in html.read_text()
    text = html.read_text()
    assert "lost prefix/middle/postfix" in text and "split_brain" in text
    assert "Per broker" in text  # what each broker delivered, side by side


def test_a_saturated_generator_process_is_named_in_the_figures(tmp_path: Path) -> None:
    import json

    from batonmq.loadtest.procstat import summarize
    from batonmq.loadtest.runner import format_report

    # p1's first second (its start-up) is left out; it then runs at 0.95 of a core.
    p1 = [{"t": t, "label": "p1", "cpu": c, "rss_mib": 30.0}
          for t, c in ((1, 0.2), (2, 0.95), (3, 0.95), (4, 0.95), (9, 0.1))]
    c1 = [{"t": t, "label": "c1", "cpu": 0.4, "rss_mib": 20.0} for t in (1, 2, 3, 4)]
    summary = summarize(p1 + c1, load_end=5.0, skip_first=True)
    assert summary["p1"]["cpu_mean"] == pytest.approx(0.95)  # t=1 skipped, t=9 after the load
    assert summary["c1"]["cpu_mean"] == pytest.approx(0.4)
    runs = []
    for name, gen in (("busy", p1 + c1), ("calm", c1)):
        d = tmp_path / name
        d.mkdir()
        write_ops(d / "all.hist", _ops(None))
        t0 = min(op.t for op in _ops(None))
        (d / "samples.json").write_text(json.dumps(
            {"samples": [], "load_end": 5.0, "t0_mono_ns": t0, "generator": gen}))
        r = analyse_dir(d)
        r.config = {"system": name, "preset": "throughput", "duration": 1.0, "workload": {}}
        runs.append(r)
    busy, calm = runs
    assert busy.metrics["generator"]["saturated"] == ["p1"]
    assert calm.metrics["generator"]["saturated"] == []
    assert "GENERATOR SATURATED (p1" in format_report(busy)
    assert "SATURATED" not in format_report(calm)
    rows = format_comparison(runs).splitlines()
    assert rows[2].startswith("busy ") and "0.95!" in rows[2]
    assert rows[3].startswith("calm ") and "0.40 " in rows[3] and "!" not in rows[3]


def test_tree_usage_counts_a_process_and_its_children() -> None:
    usage = tree_usage([os.getpid(), 999_999_999])
    assert set(usage) == {os.getpid()}
    cpu, rss = usage[os.getpid()]
    assert cpu > 0 and rss > 10 << 20


def test_the_new_fault_kinds_parse_and_network_kinds_need_toxiproxy(tmp_path: Path) -> None:
    from batonmq.loadtest.cluster import BatonCluster
    from batonmq.loadtest.faults import NET_KINDS, check_supported

    spec = "netsplit:3s,client-partition,slow-net,bitflip,truncate,clockjump@5s"
    kinds = [e.kind for e in parse_faults(spec, 31)]
    assert kinds == ["netsplit", "client-partition", "slow-net", "bitflip", "truncate",
                     "clockjump"]
    assert parse_faults(spec, 31)[0].duration == 3.0
    events = parse_faults("client-partition@5s", 10)
    with pytest.raises(RuntimeError, match="Toxiproxy"):
        check_supported(events, BatonCluster(3, tmp_path))
    check_supported(events, BatonCluster(3, tmp_path, net=True))  # no server started yet
    assert "netsplit-during-join" in NET_KINDS and "bitflip" not in NET_KINDS


def test_the_steady_clock_ignores_a_step_of_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    import time as real_time

    from batonmq.cluster.node import steady_clock

    clock = steady_clock()
    before = clock()
    wall = real_time.time() + 600.0
    monkeypatch.setattr("batonmq.cluster.node.time.time", lambda: wall)
    assert abs(clock() - before) < 1000  # ten minutes ahead on the wall: not here
    assert abs(steady_clock()() - (before + 600_000)) < 1000  # a new start reads it


def test_network_faults_pick_only_brokers_behind_the_proxies(tmp_path: Path) -> None:
    """A broker a ``join`` fault started has no proxy (Kafka's per-broker listeners are
    fixed at its start, and the workers never learn the joiner's address): network
    faults pick among the proxied brokers only, in turn or at random."""

    from batonmq.loadtest.cluster import BatonCluster
    from batonmq.loadtest.faults import FaultInjector

    for log_url in (None, "kafka"):
        cluster = BatonCluster(4, tmp_path, log_url=log_url, net=True)
        for _ in range(4):
            b = cluster._new_broker()
            b.state = "running"
        assert cluster.net is not None
        for b in cluster.brokers[:3]:  # node-4 joined later: not proxied
            cluster.net.proxies[f"client-{b.node_id}"] = "127.0.0.1:1"
            cluster.net.proxies[f"peer-{b.node_id}"] = "127.0.0.1:3"
            if log_url == "kafka":
                cluster.net.proxies[f"kafka-{b.node_id}"] = "127.0.0.1:2"
        if log_url is None:
            cluster.net.proxies["client-node-4"] = "127.0.0.1:1"  # not its peer link
        assert cluster._proxies_of(cluster.brokers[0]) == (
            ["client-node-1", "peer-node-1", "kafka-node-1"] if log_url else
            ["client-node-1", "peer-node-1"])
        want = {b.node_id for b in cluster.brokers if cluster.proxied(b)}
        assert want == {"node-1", "node-2", "node-3"}
        runner = FaultInjector(cluster, [], tmp_path / "faults.hist", 0.0)
        picked = {runner._pick_broker(FaultEvent(0, "netsplit", 1, pick=p), proxied=True).node_id
                  for p in range(8)}
        picked |= {runner._pick_broker(FaultEvent(0, "netsplit", 1), proxied=True).node_id
                   for _ in range(8)}
        assert picked == want
        assert "node-4" in {runner._pick_broker(FaultEvent(0, "kill9", 1, pick=p)).node_id
                            for p in range(8)}


class _HeldBack:
    """A stand-in adapter whose queue gives its last messages back only later, as a
    cluster does with what a killed broker's consumer held: idle for a while, not empty."""

    errors: tuple[type[BaseException], ...] = (ConnectionError,)
    failovers = 0
    address = "stand-in"

    def __init__(self, ready: list[bytes], held: list[bytes], back_after: int) -> None:
        self.ready, self.held, self.back_after = ready, held, back_after
        self.polls = 0
        self.accepted: list[bytes] = []

    async def subscribe(self, queue: str, prefetch: int) -> "_HeldBack":
        return self

    async def get_many(self, max_count: int, timeout: float) -> list[Delivery]:
        self.polls += 1
        if self.held and self.polls > self.back_after:
            self.ready += self.held
            self.held = []
        batch, self.ready = self.ready[:max_count], self.ready[max_count:]
        if not batch:
            await asyncio.sleep(timeout)
        return [Delivery(len(self.accepted) + i, 0, b, None) for i, b in enumerate(batch)]

    async def ack_many(self, deliveries: list[Delivery]) -> list[BaseException | None]:
        self.accepted += [d.body for d in deliveries]
        return [None] * len(deliveries)

    async def close(self) -> None:
        pass

    async def depth(self, queue: str) -> tuple[int, dict[str, object]]:
        n = len(self.ready) + len(self.held)
        return n, {"ready": n}


@pytest.mark.parametrize("wait, drained", [(0.0, False), (20.0, True)])
def test_the_drain_comes_back_while_the_queue_still_holds_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wait: float, drained: bool
) -> None:
    bodies = [make_body(f"m{i}".encode(), FLAG_NORMAL, 16) for i in range(4)]
    # Given back after ~0.5 s of 0.1 s polls: longer than the 0.2 s idle stop.
    stand_in = _HeldBack(bodies[:2], bodies[2:], back_after=5)

    async def open_stand_in(*args: object) -> _HeldBack:
        return stand_in

    monkeypatch.setattr(worker, "open_adapter", open_stand_in)
    workload = dataclasses.replace(PRESETS["latency"], queues=1)
    with HistoryWriter(tmp_path / "drain.hist", worker.DRAIN_ACTOR) as w:
        asyncio.run(worker.drain_queues("baton", ["stand-in"], workload, w, 0.2, wait))
    assert (stand_in.accepted == bodies) is drained
    final = [op for op in load_run(tmp_path) if op.kind == OpKind.FINAL]
    assert [op.count for op in final] == [0 if drained else 2]


def test_upgrade_faults_need_an_old_build_and_one_with_no_old_broker_left_is_recorded(
    tmp_path: Path,
) -> None:
    import sys

    from batonmq.loadtest.cluster import BatonCluster
    from batonmq.loadtest.faults import FaultInjector, check_supported

    events = parse_faults("upgrade,upgrade,enable-features@5s", 16)
    assert [e.kind for e in events] == ["upgrade", "upgrade", "enable-features"]
    with pytest.raises(RuntimeError, match="--old-build"):
        check_supported(events, BatonCluster(3, tmp_path))
    old = tmp_path / "old-venv" / "bin" / "baton"
    cluster = BatonCluster(3, tmp_path, old_baton=old)
    check_supported(events, cluster)
    for _ in range(3):
        cluster._new_broker().state = "running"
    # Brokers start on the old build; an upgraded one runs this interpreter's build.
    assert [b.build for b in cluster.brokers] == ["old"] * 3
    assert cluster._program(cluster.brokers[0]) == [str(old)]
    cluster.brokers[0].build = "new"
    assert cluster._program(cluster.brokers[0]) == [sys.executable, "-m", "batonmq.broker"]
    assert [b.node_id for b in cluster.old_brokers()] == ["node-2", "node-3"]

    for b in cluster.brokers:
        b.build = "new"
    injector = FaultInjector(cluster, [], tmp_path / "faults.hist", 0.0)
    with HistoryWriter(tmp_path / "faults.hist", "faults") as w:
        injector._apply(FaultEvent(0, "upgrade", 0.0), w)
    records = [(op.msg, op.count, op.info) for op in load_run(tmp_path)]
    assert records == [("upgrade", 0, "none left"), ("upgrade", 1, "none left")]


def test_grow_and_kill9_replicas_parse_and_a_bad_spelling_is_one_clear_error() -> None:
    events = parse_faults("grow@at:10; kill9-replicas:3s@at:30", 60)
    assert events == [FaultEvent(10, "grow", 0.0), FaultEvent(30, "kill9-replicas", 3.0)]
    assert parse_faults("kill9-replicas@at:5", 10)[0].duration == 2.0  # kill9's down time
    with pytest.raises(FaultSpecError, match="unknown fault 'kill9-replica'"):
        parse_faults("kill9-replica@at:5", 10)


def test_kill9_replicas_kills_one_replica_of_each_group_never_a_majority() -> None:
    from batonmq.loadtest.faults import replica_victims

    def rows(*groups: list[str]) -> list[dict[str, object]]:
        return [{"partition": k, "replicas": g} for k, g in enumerate(groups)]

    six = [f"node-{i}" for i in range(1, 7)]
    # Two disjoint groups of three: one of each.
    assert replica_victims(rows(six[:3], six[3:]), six) == ["node-1", "node-4"]
    # Overlapping groups: a broker in both covers both.
    assert replica_victims(rows(["node-1", "node-2", "node-3"], ["node-3", "node-1", "node-5"]),
                           six) == ["node-1"]
    # A group of two (or one) has no minority to kill; a replica down already counts.
    assert replica_victims(rows(["node-1", "node-2"], six[3:]), six) == ["node-4"]
    assert replica_victims(rows(six[:3], six[3:]), ["node-2", "node-3", *six[3:]]) == ["node-4"]
    # Groups of five: the second group's pick is also in the first, which keeps 3 of 5.
    assert replica_victims(rows(six[:5], six[1:]), six) == ["node-1", "node-2"]
    # A pick that would take a majority of a later group is passed over.
    groups = rows(["node-1", "node-2", "node-3"], ["node-1", "node-4", "node-5"],
                  ["node-2", "node-4", "node-6"])
    assert replica_victims(groups, six) == ["node-1", "node-6"]  # not node-2, not node-4


def test_the_report_line_carries_the_notes_of_grow_and_kill9_replicas() -> None:
    from batonmq.loadtest.faults import fault_line

    faults = [
        {"t": 10.0, "kind": "grow", "phase": "start", "detail": ""},
        {"t": 14.0, "kind": "grow", "phase": "end",
         "detail": "node=node-7 address=127.0.0.1:1 partitions=1 moved=1:node-6"},
        {"t": 30.0, "kind": "kill9-replicas", "phase": "start", "detail": "killed=node-1:0"},
        {"t": 30.0, "kind": "kill9", "phase": "start", "detail": "node=node-1 address=a"},
        {"t": 33.0, "kind": "kill9", "phase": "end", "detail": "node=node-1 address=a"},
        {"t": 33.0, "kind": "kill9-replicas", "phase": "end",
         "detail": "killed=node-1:0 back_after=3.0s (one replica of each group)"},
    ]
    assert fault_line(faults) == (
        "faults: grow@10s(node=node-7 address=127.0.0.1:1 partitions=1 moved=1:node-6),"
        " kill9-replicas@30s(killed=node-1:0 back_after=3.0s (one replica of each group)),"
        " kill9@30s(node-1)")
