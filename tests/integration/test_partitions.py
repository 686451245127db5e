"""A cluster on a log of a control partition and four data partitions (docs/design.md
§16), real brokers: queues spread over the partitions, each partition applied and
fenced on its own, a kill -9, a restart, a broker joining live (one update per
partition), an exchange fanning out over partitions, a dead-letter queue with its
queue, a dead-letter exchange over partitions; on the file log and on Kafka (a topic of five partitions)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batonmq import clients
from batonmq.cluster.errors import InvalidArgument, QueueExists
from tests.helpers import equal_digests, eventually, topology, wait_stats
from tests.integration.conftest import BrokerProcess, brokers_of, started

pytestmark = pytest.mark.integration

N = 4


def _brokers(tmp_path: Path, url: str, count: int = 3) -> list[BrokerProcess]:
    return brokers_of(tmp_path, url, count, ["--partitions", str(N)])


@pytest.fixture
def parted(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Three brokers on one file: log of 1 + 4 partitions."""
    yield from started(_brokers(tmp_path, f"file:{tmp_path / 'shared-log'}"))


async def _spread(conn: clients.Connection, names: list[str]) -> dict[str, int]:
    for name in names:
        await conn.declare_queue(name)
    return {name: (await conn.queue_stats(name))["partition"] for name in names}


async def test_queues_spread_over_the_partitions_and_each_is_applied_alike(
    parted: list[BrokerProcess], tmp_path: Path
) -> None:
    log_dir = tmp_path / "shared-log"
    assert sorted(p.name for p in log_dir.iterdir() if p.name.startswith("partition-")) == [
        f"partition-{k}" for k in range(1, N + 1)
    ]
    conn = await clients.connect([b.address for b in parted], timeout=5)
    names = [f"q{i}" for i in range(8)]
    where = await _spread(conn, names)
    assert sorted(where.values()) == [1, 1, 2, 2, 3, 3, 4, 4], where
    await conn.declare_queue("pinned", partition=3)
    assert (await conn.queue_stats("pinned"))["partition"] == 3
    with pytest.raises(QueueExists, match="partition 3, not 2"):
        await conn.declare_queue("pinned", partition=2)
    with pytest.raises(InvalidArgument, match="partition 9 does not exist"):
        await conn.declare_queue("nowhere", partition=9)
    # Every broker sees every queue where it was placed.
    for b in parted:
        async with await clients.connect(b.address, timeout=5) as c:
            assert {n: (await c.queue_stats(n))["partition"] for n in names} == where
    for i, name in enumerate(names):
        await conn.publish_batch(name, [b"%s-%d" % (name.encode(), j) for j in range(10 + i)])
    for i, name in enumerate(names):
        got = []
        async with conn.consume(name, prefetch=50) as consumer:
            while len(got) < 10 + i:
                batch = await consumer.get_many(50, timeout=10)
                assert batch, f"{name}: {len(got)} of {10 + i}"
                got += [m.body for m in batch]
                await consumer.ack_many(batch)
        assert sorted(got) == sorted(b"%s-%d" % (name.encode(), j) for j in range(10 + i))
    top = await topology(parted[0].address)
    assert [p["partition"] for p in top["partitions"]] == list(range(1, N + 1))
    assert all(p["member"] and p["healthy"] for p in top["partitions"]), top["partitions"]
    assert sum(p["queues"] for p in top["partitions"]) == len(names) + 1
    await equal_digests(parted)
    await conn.close()


async def test_a_kill9_and_a_restart_lose_nothing_on_any_partition(
    parted: list[BrokerProcess],
) -> None:
    addresses = [b.address for b in parted]
    conn = await clients.connect(addresses[1:], timeout=5, failover_timeout=30)
    names = [f"k{i}" for i in range(N)]
    where = await _spread(conn, names)
    assert sorted(where.values()) == list(range(1, N + 1))
    for name in names:
        await conn.publish_batch(name, [b"%s-%03d" % (name.encode(), j) for j in range(100)])
    # Consumers on the broker about to die hold messages of every partition.
    victim = parted[0]
    doomed = await clients.connect(victim.address, timeout=5)
    held = []
    for name in names:
        consumer = doomed.consume(name, prefetch=10)
        await consumer.__aenter__()
        msg = await consumer.get(timeout=10)
        assert msg is not None
        held.append(msg)
    await asyncio.to_thread(victim.kill9)
    # What the dead broker's consumers held goes back on every partition's view change.
    for name in names:
        await wait_stats(conn, name, timeout=40, acquired=0, ready=100)
    survivors = parted[1:]
    await equal_digests(survivors)
    # Restarted on its data dir: it resumes every partition from its own store.
    await asyncio.to_thread(victim.restart)
    async with await clients.connect(victim.address, timeout=5) as c:
        for name in names:
            await wait_stats(c, name, timeout=30, ready=100)
    await equal_digests(parted)
    for name in names:
        seen: set[bytes] = set()
        async with conn.consume(name, prefetch=100) as consumer:
            while len(seen) < 100:
                batch = await consumer.get_many(100, timeout=10)
                assert batch, f"{name}: {len(seen)} of 100"
                for m in batch:
                    assert m.body not in seen, m.body
                    seen.add(m.body)
                await consumer.ack_many(batch)
    await conn.close()


async def test_a_broker_joins_live_with_an_update_of_each_partition(
    parted: list[BrokerProcess], tmp_path: Path
) -> None:
    conn = await clients.connect([b.address for b in parted], timeout=5)
    names = [f"j{i}" for i in range(N)]
    where = await _spread(conn, names)
    for name in names:
        await conn.publish_batch(name, [b"x" * 100] * 200)
    joiner = _brokers(tmp_path, f"file:{tmp_path / 'shared-log'}", 4)[3]
    try:
        joiner.start(timeout=60)
        # Four brokers and the default group size (3): the planner moves partitions to
        # the joiner until each broker holds N * 3 / 4 of them, each caught up by its
        # own partition's update; the others stay on their groups.
        def settled(t: dict[str, Any]) -> bool:
            mine = sorted(g["partition"] for g in t["groups"]
                          if joiner.node_id in (g["replicas"] or ()))
            return (t["status"] == "ok" and len(mine) == N * 3 // 4
                    and all(not g["joining"] and len(g["replicas"] or ()) == 3
                            for g in t["groups"])
                    and [p["partition"] for p in t["partitions"]] == mine)

        top = await eventually(
            lambda: topology(joiner.address), "the joiner a replica of 3 of the 4 partitions",
            timeout=60, until=settled,
        )
        mine = [p["partition"] for p in top["partitions"]]
        out = joiner.output()
        for k in mine:
            assert f"partition {k}: " in out, out  # each partition said its own lines
        # A client given the joiner is served every queue: those of the joiner's
        # partitions by it, the others by their groups (the client routes to them).
        async with await clients.connect(joiner.address, timeout=5) as c:
            for name in names:
                stats = await c.queue_stats(name)
                assert stats["ready"] == 200 and not stats["updating"], stats
            here = next(n for n in names if where[n] in mine)
            elsewhere = next(n for n in names if where[n] not in mine)
            for name in (here, elsewhere):
                got = []
                async with c.consume(name, prefetch=200) as consumer:
                    while len(got) < 200:
                        batch = await consumer.get_many(200, timeout=10)
                        assert batch, f"{name}: {len(got)} of 200"
                        await consumer.ack_many(batch)
                        got += batch
                assert len(got) == 200, name
        await equal_digests([*parted, joiner])
    finally:
        joiner.stop()
    await conn.close()


async def test_an_exchange_fans_out_over_partitions_and_a_dead_letter_queue_goes_with_its_queue(
    parted: list[BrokerProcess],
) -> None:
    conn = await clients.connect(parted[0].address, timeout=5)
    names = [f"f{i}" for i in range(N)]
    where = await _spread(conn, names)
    assert len(set(where.values())) == N
    await conn.declare_exchange("fan", "fanout")
    for name in names:
        await conn.bind_queue(name, "fan")
    for i in range(5):
        routed = await conn.publish_to("fan", "", b"m%d" % i)
        assert sorted(routed.queues) == names and not routed.missing, routed
    for name in names:
        await wait_stats(conn, name, ready=5)
    # A queue declared with a dead-letter queue goes to the dead-letter queue's
    # partition: its dead letters stay on it (cheaper).
    await conn.declare_queue("dead")
    await conn.declare_queue("live", dead_letter="dead")
    assert (await conn.queue_stats("live"))["partition"] == (
        await conn.queue_stats("dead")
    )["partition"]
    await conn.publish("live", b"bad")
    async with conn.consume("live") as consumer:
        msg = await consumer.get(timeout=10)
        assert msg is not None
        await msg.reject(confirm=True)
    await wait_stats(conn, "dead", ready=1)
    # Through an exchange, its queues on every partition (test_partition_dead_letters.py).
    await conn.declare_queue("dlx", dead_letter_exchange="fan")
    await conn.publish("dlx", b"worse")
    async with conn.consume("dlx") as consumer:
        msg = await consumer.get(timeout=10)
        assert msg is not None
        await msg.reject(confirm=True)
    for name in names:
        await wait_stats(conn, name, ready=6)
    # A policy is set on control and applied by every data partition to its queues.
    await conn.set_policy("cap", "^f", {"max-length": 7})
    for b in parted:
        async with await clients.connect(b.address, timeout=5) as c:
            for name in names:
                stats = await eventually(
                    lambda c=c, name=name: c.queue_stats(name), f"{name} under the policy",
                    until=lambda st: st.get("policy") == "cap",
                )
                assert stats["max_length"] == 7, stats
    await equal_digests(parted)
    await conn.close()


async def test_a_kafka_topic_of_five_partitions(tmp_path: Path, kafka_bootstrap: str) -> None:
    topic = f"baton-parted-{uuid.uuid4().hex[:10]}"
    brokers = _brokers(tmp_path, f"kafka://{kafka_bootstrap}/{topic}", 2)
    try:
        for b in brokers:
            b.start(timeout=60)
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            (described,) = await admin.describe_topics([topic])
        finally:
            await admin.close()
        assert len(described["partitions"]) == N + 1, described
        conn = await clients.connect([b.address for b in brokers], timeout=5)
        where = await _spread(conn, [f"kq{i}" for i in range(N)])
        assert sorted(where.values()) == list(range(1, N + 1))
        for name in where:
            await conn.publish_batch(name, [b"a", b"b", b"c"])
        for name in where:
            async with conn.consume(name) as consumer:
                got = await consumer.get_many(3, timeout=10)
                await consumer.ack_many(got)
            assert sorted(m.body for m in got) == [b"a", b"b", b"c"]
        await equal_digests(brokers)
        await conn.close()
    finally:
        for b in brokers:
            b.stop()


async def test_metrics_and_the_queue_list_name_each_data_partition(tmp_path: Path) -> None:
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    from tests.integration.test_admin import TOOL_HEADERS, admin_of

    b = BrokerProcess(tmp_path / "one", extra=["--partitions", "2", "--admin-listen", "127.0.0.1:0"])
    b.start()
    try:
        async with await clients.connect(b.address, timeout=5) as conn:
            await conn.declare_queue("m1")
            await conn.declare_queue("m2")
            await conn.publish("m2", b"x")
        async with aiohttp.ClientSession(headers=TOOL_HEADERS) as http:
            async with http.get(f"{admin_of(b)}/metrics") as r:
                assert r.status == 200
                text = await r.text()
            async with http.get(f"{admin_of(b)}/api/queues") as r:
                listed = await r.json()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        by_part = {
            s.labels["partition"]: s.value for s in families["baton_partition_queues"].samples
        }
        assert by_part == {"1": 1, "2": 1}, by_part
        member = {s.labels["partition"]: s.value for s in families["baton_partition_member"].samples}
        assert member == {"1": 1, "2": 1}
        rows = listed if isinstance(listed, list) else listed["queues"]
        assert sorted((q["queue"], q["partition"]) for q in rows) == [("m1", 1), ("m2", 2)], rows
    finally:
        b.stop()


async def test_each_data_partition_lag_is_in_metrics_topology_and_the_admin_api(
    tmp_path: Path,
) -> None:
    """``baton_partition_apply_lag_records`` and the ``lag`` of each topology row: one
    per data partition, a number >= 0 every time, that reaches 0 once the broker has
    applied what was published (docs/admin.md)."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    from tests.integration.test_admin import TOOL_HEADERS, admin_of

    b = BrokerProcess(tmp_path / "one", extra=["--partitions", "2", "--admin-listen", "127.0.0.1:0"])
    b.start()
    try:
        base = admin_of(b)
        async with await clients.connect(b.address, timeout=5) as conn:
            await conn.declare_queue("lag1", partition=1)
            await conn.declare_queue("lag2", partition=2)
            for name in ("lag1", "lag2"):
                for _ in range(5):
                    await conn.publish_batch(name, [b"m"] * 200)
            # The native Topology answer (``baton topology``) has each row's lag.
            native = await conn.topology()
            assert [p["partition"] for p in native["partitions"]] == [1, 2]
            assert all(isinstance(p["lag"], int) and p["lag"] >= 0
                       for p in native["partitions"]), native["partitions"]
        async with aiohttp.ClientSession(headers=TOOL_HEADERS) as http:

            async def lags() -> tuple[dict[str, float], dict[int, int], dict[int, int]]:
                async with http.get(f"{base}/metrics") as r:
                    assert r.status == 200
                    text = await r.text()
                async with http.get(f"{base}/api/nodes") as r:
                    assert r.status == 200
                    rows = (await r.json())["partitions"]
                families = {f.name: f for f in text_string_to_metric_families(text)}
                metric = {
                    s.labels["partition"]: s.value
                    for s in families["baton_partition_apply_lag_records"].samples
                }
                # Every lag known and a number >= 0, whenever it is read.
                assert set(metric) == {"1", "2"}, metric
                assert all(v >= 0 for v in metric.values()), metric
                api = {r["partition"]: r["lag"] for r in rows}
                assert set(api) == {1, 2}, rows
                assert all(type(v) is int and v >= 0 for v in api.values()), rows
                applied = {r["partition"]: r["applied"] for r in rows}
                return metric, api, applied

            metric, api, applied = await eventually(
                lags, "every data partition's lag at 0", timeout=30,
                until=lambda got: all(v == 0 for v in got[0].values())
                and all(v == 0 for v in got[1].values()),
            )
            # Caught up: the 1,000 publishes of each partition are applied here.
            assert all(offset >= 5 for offset in applied.values()), applied
    finally:
        b.stop()


async def test_a_fan_out_over_partitions_survives_its_forwarder_being_killed(
    parted: list[BrokerProcess],
) -> None:
    """A publish through an exchange whose queues are on four partitions is one FanOut on
    the first; that partition's leader forwards it to the others. With the leader stopped
    the publish is confirmed and kept; killed, the next leader forwards every entry once."""
    by_node = {b.node_id: b for b in parted}
    top = await topology(parted[0].address)
    leader = top["partitions"][0]["leader"]
    forwarder = by_node[leader.split("/")[0]]
    others = [b for b in parted if b is not forwarder]
    conn = await clients.connect(others[0].address, timeout=5)
    names = [f"t{i}" for i in range(N)]
    where = await _spread(conn, names)
    assert sorted(where.values()) == list(range(1, N + 1))
    await conn.declare_exchange("fan", "fanout")
    for name in names:
        await conn.bind_queue(name, "fan")
    await asyncio.to_thread(forwarder.pause)
    try:
        total = 60
        for i in range(total):
            routed = await conn.publish_to("fan", "", b"p%03d" % i)
            assert sorted(routed.queues) == names, routed
        home = next(n for n in names if where[n] == 1)
        stats = {n: await conn.queue_stats(n) for n in names}
        assert stats[home]["ready"] == total
        # Held on the home partition: its forwarder is stopped (a view change may already
        # have moved the duty on, so some may have gone).
        await asyncio.to_thread(forwarder.kill9)
    finally:
        forwarder.stop()  # (resumed first, if it is still there)
    for name in names:
        await wait_stats(conn, name, timeout=40, ready=total)
    for name in names:
        seen: list[bytes] = []
        async with conn.consume(name, prefetch=100) as consumer:
            while len(seen) < total:
                batch = await consumer.get_many(100, timeout=10)
                assert batch, f"{name}: {len(seen)} of {total}"
                seen += [m.body for m in batch]
                await consumer.ack_many(batch)
        assert sorted(seen) == [b"p%03d" % i for i in range(total)], name  # each once
    await equal_digests(others)
    await conn.close()


async def test_each_data_partition_is_checkpointed_and_truncated_on_its_own(
    tmp_path: Path,
) -> None:
    """Retention per partition: under a load on one data partition, its leader
    checkpoints and truncates it; the digests agree partition by partition."""
    url = f"file:{tmp_path / 'shared-log'}?segment_bytes={128 * 1024}"
    brokers = [
        BrokerProcess(tmp_path / f"node-{i}", log_url=url, node_id=f"node-{i}",
                      extra=["--partitions", "2", "--checkpoint-ms", "300"])
        for i in (1, 2)
    ]
    try:
        for b in brokers:
            b.start()
        async with await clients.connect(brokers[0].address, timeout=5) as conn:
            await conn.declare_queue("busy", partition=2)

            async def truncated() -> dict[str, object]:
                await conn.publish_batch("busy", [b"x" * 1000] * 50)
                async with conn.consume("busy", prefetch=100) as consumer:
                    got = await consumer.get_many(100, timeout=5)
                    await consumer.ack_many(got)
                top = await topology(brokers[0].address)
                row: dict[str, object] = top["partitions"][1]
                return row

            row = await eventually(
                truncated, "data partition 2 truncated by its checkpoints", timeout=60,
                until=lambda r: isinstance(r["log_truncated_before"], int)
                and r["log_truncated_before"] > 0,
            )
            assert row["checkpoint"] is not None and row["digest_mismatches"] == 0, row
        segments = sorted((tmp_path / "shared-log" / "partition-2").glob("*.seg"))
        assert segments and int(segments[0].stem) > 0, segments
        await equal_digests(brokers)
    finally:
        for b in brokers:
            b.stop()
