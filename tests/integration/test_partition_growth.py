"""Growing N on a live cluster (docs/operations.md "Growing N", docs/design.md §16), real
brokers: two brokers on a log of 2 data partitions grown to 4 by ``baton partitions add``
under a small load, on the file log and on Kafka (a topic grown from 3 to 5 partitions):
new queues go to partitions 3 and 4, old ones stay and lose nothing, both brokers open
the new partitions, a restarted broker comes back with 4, a broker joining after the
growth gets all of them, and shrinking is refused. Also: a broker that cannot open a new
partition says so and keeps serving; a cluster of one partition is refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batonmq import clients
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.log import open_log_set
from tests.helpers import equal_digests, eventually, topology, wait_stats
from tests.integration.conftest import REPO, BrokerProcess

pytestmark = pytest.mark.integration


def baton(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``baton`` command (this checkout's) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "batonmq.broker", *args],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=dict(os.environ),
    )


def _broker(tmp_path: Path, url: str, i: int, *more: str) -> BrokerProcess:
    return BrokerProcess(
        tmp_path / f"node-{i}", log_url=url, node_id=f"node-{i}",
        extra=["--partitions", "2", *more],
    )


async def _shown_by_admin(b: BrokerProcess) -> tuple[list[str], list[int]]:
    """The data partitions broker ``b``'s admin listener shows: in its metrics
    (``baton_partition_member``) and in ``/api/nodes``."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    from tests.integration.test_admin import TOOL_HEADERS, admin_of

    async with aiohttp.ClientSession(headers=TOOL_HEADERS) as http:
        async with http.get(f"{admin_of(b)}/metrics") as r:
            text = await r.text()
        async with http.get(f"{admin_of(b)}/api/nodes") as r:
            nodes = await r.json()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    member = sorted(s.labels["partition"] for s in families["baton_partition_member"].samples)
    return member, [p["partition"] for p in nodes["partitions"]]


async def _readyz(b: BrokerProcess) -> tuple[int, Any]:
    """Broker ``b``'s /readyz: its status and answer (every data partition counts)."""
    import aiohttp

    from tests.integration.test_admin import admin_of, get_json

    async with aiohttp.ClientSession() as http:
        return await get_json(http, f"{admin_of(b)}/readyz")


@pytest.fixture(params=["file", "kafka"])
def log_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "kafka":
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        return f"kafka://{bootstrap}/baton-grow-{uuid.uuid4().hex[:10]}"
    return f"file:{tmp_path / 'shared-log'}"


@pytest.fixture
def pair(tmp_path: Path, log_url: str) -> Iterator[list[BrokerProcess]]:
    """Two brokers on a log of a control partition and 2 data partitions."""
    brokers = [_broker(tmp_path, log_url, i) for i in (1, 2)]
    try:
        for b in brokers:
            b.start(timeout=60)
        yield brokers
    finally:
        for b in brokers:
            b.stop()


async def _log_partitions(url: str) -> int:
    """How many partitions the log has (control included)."""
    if url.startswith("file:"):
        root = Path(url.removeprefix("file:"))
        return 1 + sum(1 for p in root.iterdir() if p.name.startswith("partition-"))
    from aiokafka.admin import AIOKafkaAdminClient

    bootstrap, _, topic = url.removeprefix("kafka://").partition("/")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return len(described["partitions"])


async def _open_everywhere(broker: BrokerProcess, count: int) -> dict[str, Any]:
    """``broker``'s topology once it applies ``count`` data partitions, each a member."""
    return await eventually(
        lambda: topology(broker.address), f"{broker.node_id} applying {count} partitions",
        timeout=60, context=broker.output,
        until=lambda t: t.get("partition_count") == count
        and [p["partition"] for p in t["partitions"]] == list(range(1, count + 1))
        and all(p["member"] for p in t["partitions"]) and t["status"] == "ok",
    )


async def test_a_live_cluster_grows_from_2_to_4_data_partitions(
    pair: list[BrokerProcess], log_url: str, tmp_path: Path,
) -> None:
    conn = await clients.connect([b.address for b in pair], timeout=5, failover_timeout=30)
    old = [f"old{i}" for i in range(4)]
    for name in old:
        await conn.declare_queue(name)
    where = {name: (await conn.queue_stats(name))["partition"] for name in old}
    assert sorted(where.values()) == [1, 1, 2, 2], where
    for name in old:
        await conn.publish_batch(name, [b"%s-before-%d" % (name.encode(), j) for j in range(20)])
    # A policy set before the growth applies on the new partitions too.
    await conn.set_policy("cap", "^new", {"max-length": 7})

    # A small load on the old queues while the cluster grows.
    published = {name: 20 for name in old}
    stop = asyncio.Event()

    async def load() -> None:
        i = 0
        while not stop.is_set():
            name = old[i % len(old)]
            await conn.publish(name, b"%s-during-%d" % (name.encode(), published[name]))
            published[name] += 1
            i += 1
            await asyncio.sleep(0.01)

    loader = asyncio.create_task(load())
    try:
        await eventually(lambda: asyncio.sleep(0, sum(published.values())), "the load running",
                         until=lambda n: n > 100)
        done = await asyncio.to_thread(
            baton, "partitions", "add", "--count", "4", "--broker", pair[0].address
        )
        assert done.returncode == 0, done.stderr
        assert "grew the cluster from 2 to 4 data partitions" in done.stderr, done.stderr
        assert "has not opened" not in done.stderr, done.stderr  # the broker asked has them
        # Both brokers open the new partitions as they apply the growth.
        for b in pair:
            await _open_everywhere(b, 4)
        await eventually(lambda: asyncio.sleep(0, sum(published.values())), "more load",
                         until=lambda n, at=sum(published.values()): n > at + 50)
    finally:
        stop.set()
        await loader
    assert await _log_partitions(log_url) == 5

    # New queues go to the new (emptiest) partitions; the old ones stay where they were.
    await conn.declare_queue("new1")
    await conn.declare_queue("new2")
    async with await clients.connect(pair[1].address, timeout=5) as other:
        assert (await other.queue_stats("new1"))["partition"] == 3
        assert (await other.queue_stats("new2"))["partition"] == 4
        assert {n: (await other.queue_stats(n))["partition"] for n in old} == where
        for name in ("new1", "new2"):
            stats = await eventually(
                lambda name=name: other.queue_stats(name), f"{name} under the policy",
                until=lambda st: st.get("policy") == "cap",
            )
            assert stats["max_length"] == 7, stats
        await other.publish_batch("new1", [b"n1-%d" % j for j in range(7)])
        await other.publish_batch("new2", [b"n2-%d" % j for j in range(7)])
    for name in old:
        await wait_stats(conn, name, ready=published[name])

    # Shrinking is refused, with a clear message (client and command line alike).
    with pytest.raises(InvalidArgument, match="shrinking is not possible: this cluster has 4"):
        await conn.grow_partitions(3)
    refused = await asyncio.to_thread(
        baton, "partitions", "add", "--count", "2", "--broker", pair[1].address
    )
    assert refused.returncode == 1 and "shrinking is not possible" in refused.stderr, refused
    again = await conn.grow_partitions(4)
    assert (again.count, again.before) == (4, 4)  # as many: nothing changes

    # A broker restarted after the growth comes back with the 4.
    await asyncio.to_thread(pair[1].terminate)
    await asyncio.to_thread(pair[1].restart)
    await _open_everywhere(pair[1], 4)
    # A broker joining after the growth gets every partition.
    # (--partitions on an existing log is for a new cluster: it applies the log's 4.)
    joiner = _broker(tmp_path, log_url, 3, "--partitions", "6")
    try:
        joiner.start(timeout=90)
        await _open_everywhere(joiner, 4)
        assert "to grow a running cluster: baton partitions add --count 6" in joiner.output()
        async with await clients.connect(joiner.address, timeout=5) as c:
            assert (await c.queue_stats("new2"))["partition"] == 4
            async with c.consume("new2", prefetch=10) as consumer:
                got = await consumer.get_many(7, timeout=10)
                await consumer.ack_many(got)
            assert sorted(m.body for m in got) == sorted(b"n2-%d" % j for j in range(7))
        listed = await asyncio.to_thread(
            baton, "partitions", "list", "--broker", joiner.address
        )
        assert listed.returncode == 0, listed.stderr
        assert "4 data partition(s); this broker applies 4" in listed.stdout, listed.stdout
        header, *rows = listed.stdout.splitlines()[:5]
        assert header.split()[:4] == ["partition", "queues", "applied", "lag"], header
        assert [r.split()[0] for r in rows] == ["1", "2", "3", "4"], listed.stdout
        assert all(r.split()[3].isdigit() for r in rows), listed.stdout  # each lag known
        shown = await asyncio.to_thread(baton, "topology", "--broker", joiner.address)
        assert "data partitions 4, open here: 1, 2, 3, 4" in shown.stdout, shown
        await equal_digests([*pair, joiner])
    finally:
        joiner.stop()

    # Nothing of the old queues was lost or doubled.
    for name in old:
        seen: set[bytes] = set()
        async with conn.consume(name, prefetch=200) as consumer:
            while len(seen) < published[name]:
                batch = await consumer.get_many(200, timeout=10)
                assert batch, f"{name}: {len(seen)} of {published[name]}"
                for m in batch:
                    assert m.body not in seen, m.body
                    seen.add(m.body)
                await consumer.ack_many(batch)
    await conn.close()


async def test_a_growth_whose_broker_died_before_recording_it_is_completed(
    pair: list[BrokerProcess], log_url: str,
) -> None:
    """The broker asked to grow died between growing the log and recording the count
    (here: the log grown while it was down): once it runs again it records the log's
    count on control, and every broker opens the new partition."""
    async with await clients.connect(pair[0].address, timeout=5) as conn:
        await conn.declare_queue("before")  # on 1
        await conn.declare_queue("other")  # on 2
    pair[1].stop()
    logs = await open_log_set(log_url)
    try:
        assert await logs.grow(4) == 4  # a control partition and 3 data partitions
    finally:
        await logs.close()
    pair[1].start(timeout=60)
    for b in pair:
        await _open_everywhere(b, 3)
    async with await clients.connect(pair[0].address, timeout=5) as conn:
        await conn.declare_queue("after")  # the emptiest: the new one
        assert (await conn.queue_stats("after"))["partition"] == 3
        await conn.publish("after", b"served by both")
        await wait_stats(conn, "after", ready=1)
    await equal_digests(pair)


async def test_a_broker_that_cannot_open_a_new_partition_says_so_and_serves_on(
    tmp_path: Path,
) -> None:
    url = f"file:{tmp_path / 'shared-log'}"
    brokers = [_broker(tmp_path, url, i, "--admin-listen", "127.0.0.1:0") for i in (1, 2)]
    try:
        for b in brokers:
            b.start()
        # Broker 2 cannot make the new partition's store: a file is where its directory goes.
        blocker = tmp_path / "node-2" / "store-p3"
        blocker.write_text("in the way")
        async with await clients.connect(brokers[0].address, timeout=5) as conn:
            await conn.declare_queue("before")  # on 1
            await conn.declare_queue("other")  # on 2
            grown = await conn.grow_partitions(3)
            assert (grown.count, grown.before, grown.started) == (3, 2, [3])
            await conn.declare_queue("after")
            assert (await conn.queue_stats("after"))["partition"] == 3
        top = await eventually(
            lambda: topology(brokers[1].address), "broker 2 saying why partition 3 is not open",
            timeout=30, until=lambda t: "cannot open data partition(s) 3" in t["status"],
        )
        assert top["healthy"] and top["partition_count"] == 3, top
        assert [p["partition"] for p in top["partitions"]] == [1, 2]
        assert "cannot open data partition(s) 3 here" in brokers[1].output()
        assert await _shown_by_admin(brokers[1]) == (["1", "2"], [1, 2])
        # Not ready (a load balancer keeps clients away) while a partition is not open.
        status, ready = await _readyz(brokers[1])
        assert status == 503 and not ready["ready"], ready
        assert any("cannot open data partition(s) 3" in r for r in ready["reasons"]), ready
        async with await clients.connect(brokers[1].address, timeout=5) as c:
            await c.publish("before", b"still served")
            await wait_stats(c, "before", ready=1)
        # Once the way is clear it opens the partition on its own.
        blocker.unlink()
        await _open_everywhere(brokers[1], 3)
        assert await _shown_by_admin(brokers[1]) == (["1", "2", "3"], [1, 2, 3])
        ready = await eventually(
            lambda: _readyz(brokers[1]), "broker 2 ready with partition 3 open",
            timeout=30, until=lambda r: r[0] == 200,
        )
        assert ready[1]["reasons"] == [], ready
        async with await clients.connect(brokers[1].address, timeout=5) as c:
            await c.publish("after", b"on partition 3")
            await wait_stats(c, "after", ready=1)
        await equal_digests(brokers)
    finally:
        for b in brokers:
            b.stop()


async def test_a_broker_whose_new_partition_node_is_refused_says_so_and_serves_on(
    tmp_path: Path,
) -> None:
    """A new partition's node refused at its start (here: broker 2 finds a store for it
    that does not fit the new partition's log) is not retried under the same runtime;
    the broker says so, serves the other partitions, and opens it once restarted."""
    import shutil

    url = f"file:{tmp_path / 'shared-log'}"
    brokers = [_broker(tmp_path, url, i) for i in (1, 2)]
    try:
        for b in brokers:
            b.start()
        async with await clients.connect(brokers[0].address, timeout=5) as conn:
            await conn.declare_queue("one", partition=1)
            for i in range(100):  # partition 1's log well past what partition 3's will be
                await conn.publish("one", b"%d" % i)
        await wait_stats_on(brokers[1], "one", 100)
        await asyncio.to_thread(brokers[1].terminate)
        shutil.copytree(tmp_path / "node-2" / "store-p1", tmp_path / "node-2" / "store-p3")
        await asyncio.to_thread(brokers[1].restart)
        async with await clients.connect(brokers[0].address, timeout=5) as conn:
            grown = await conn.grow_partitions(3)
            assert grown.started == [3]
        top = await eventually(
            lambda: topology(brokers[1].address), "broker 2 saying partition 3 was refused",
            timeout=30, until=lambda t: "data partition 3 was refused here" in t["status"],
        )
        assert top["healthy"] and [p["partition"] for p in top["partitions"]] == [1, 2], top
        assert "restart it to open it" in top["status"]
        await wait_stats_on(brokers[1], "one", 100)  # still served
        await asyncio.to_thread(brokers[1].terminate)
        shutil.rmtree(tmp_path / "node-2" / "store-p3")
        await asyncio.to_thread(brokers[1].restart)
        await _open_everywhere(brokers[1], 3)
        await equal_digests(brokers)
    finally:
        for b in brokers:
            b.stop()


async def wait_stats_on(b: BrokerProcess, queue: str, ready: int) -> None:
    async with await clients.connect(b.address, timeout=5) as c:
        await wait_stats(c, queue, ready=ready)


async def test_a_cluster_of_one_partition_is_not_grown(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "one", extra=["--partitions", "1"])
    b.start()
    try:
        r = await asyncio.to_thread(baton, "partitions", "add", "--count", "4",
                                    "--broker", b.address)
        assert r.returncode == 1, r
        assert "this cluster's log is one partition" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    finally:
        b.stop()
