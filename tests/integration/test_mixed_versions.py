"""Brokers of the previous build and of this one in one cluster (docs/operations.md
"Upgrading"): they serve, join each other live, keep one digest; feature flags wait for
every member; once a flag is enabled an older broker is refused, with a line naming it;
and a record no broker can read stops every broker that meets it, loudly.

The previous build is a pinned commit of this repository, built once into a cached venv
(loadtest/builds.py); the tests skip only where the git history that holds it is absent.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import msgpack
import pika
import pika.exceptions
import pytest

from batonmq import clients
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.features import FEATURES, MAX_FORMAT
from batonmq.cluster.log import open_log
from batonmq.loadtest.builds import BuildError, NoHistory, resolve_build
from tests.helpers import drain, equal_digests, eventually, now, topology
from tests.integration.conftest import BrokerProcess
from tests.integration.test_amqp import amqp_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The last commit before feature flags: the build a rolling upgrade starts from.
PREVIOUS = "8c400b8"
FLAG = next(iter(FEATURES))


@pytest.fixture(scope="module")
def previous_build() -> Path:
    try:
        return resolve_build(PREVIOUS)
    except NoHistory as exc:  # an sdist or a shallow clone: nothing to build it from
        pytest.skip(f"the previous build {PREVIOUS} cannot be made here: {exc.message}")
    except BuildError as exc:
        pytest.fail(f"building {PREVIOUS} failed: {exc.message}", pytrace=False)


def _diverged(*brokers: BrokerProcess) -> list[str]:
    return [b.data_dir.name for b in brokers if "REPLICA DIVERGED" in b.log_path.read_text()]


async def _publish(address: str, queue: str, n: int, tag: str) -> None:
    async with await clients.connect(address) as conn:
        await conn.declare_queue(queue)
        for i in range(n):
            await conn.publish(queue, f"{tag}-{i}".encode())


async def _consume(address: str, queue: str, n: int) -> list[bytes]:
    return [m.body for m in await drain(address, queue, count=n)]


async def test_old_and_new_brokers_share_a_cluster_until_a_flag_is_enabled(
    tmp_path: Path, previous_build: Path
) -> None:
    log_url = f"file:{tmp_path / 'log'}"
    old1 = BrokerProcess(tmp_path / "n1", log_url, "n1", baton=previous_build,
                         extra=["--checkpoint-ms", "500"])
    new2 = BrokerProcess(tmp_path / "n2", log_url, "n2",
                         extra=["--checkpoint-ms", "500", "--amqp-listen", "127.0.0.1:0"])
    old3 = BrokerProcess(tmp_path / "n3", log_url, "n3", baton=previous_build,
                         extra=["--checkpoint-ms", "500"])
    late = BrokerProcess(tmp_path / "n4", log_url, "n4", baton=previous_build)
    everyone = [old1, new2, old3, late]
    try:
        old1.start()  # an old cluster
        await _publish(old1.address, "q", 50, "a")
        new2.start()  # a new joiner, updated live by an old member
        old3.start()  # an old joiner: a new member may serve it
        await _publish(new2.address, "q", 50, "b")
        got = await _consume(old3.address, "q", 100)  # a new client on an old broker too
        assert len(set(got)) == 100
        await _publish(old3.address, "q", 40, "c")  # left in the queue across the upgrade
        await equal_digests([old1, new2, old3])
        # The previous build's client (its CLI) against a broker of this build, and back.
        for target in (new2, old1):
            sent = subprocess.run(
                [str(previous_build), "publish", "--broker", target.address, "--declare",
                 "oldq", "m1", "m2"], capture_output=True, text=True, timeout=60,
            )
            assert sent.returncode == 0, sent.stdout + sent.stderr
        took = subprocess.run(
            [str(previous_build), "consume", "oldq", "--count", "4", "--broker", new2.address],
            capture_output=True, text=True, timeout=60,
        )
        assert took.returncode == 0 and took.stdout.count("m1") == 2, took.stdout + took.stderr
        # Nothing is enabled while old members are live; enabling names them.
        async with await clients.connect(new2.address) as conn:
            rows = {r["name"]: r for r in await conn.list_features()}
            assert rows[FLAG]["state"] == "disabled"
            assert len(rows[FLAG]["unsupported_by"]) == 2
            with pytest.raises(InvalidArgument, match="n1/.*before feature flags.*n3/"):
                await conn.enable_features()
            # A setting a flag brings is refused meanwhile, saying what to enable.
            with pytest.raises(InvalidArgument, match="baton feature enable queue_expiry"):
                await conn.declare_queue("expiring", expires=60)
        # And over AMQP: x-expires (Celery's reply queues) is refused, saying the same.
        amqp = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", amqp_port(new2), connection_attempts=1))
        try:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                amqp.channel().queue_declare("pidbox", arguments={"x-expires": 10000})
            assert refused.value.reply_code == 406
            assert "enable it with 'baton feature enable queue_expiry'" in \
                refused.value.reply_text
        finally:
            amqp.close()
        # The rolling upgrade: each old broker restarts on this build, same data dir.
        for b in (old1, old3):
            b.stop()
            b.baton = None
            b.start()
        await equal_digests([old1, new2, old3])
        async with await clients.connect(old3.address) as conn:
            assert await conn.enable_features() == list(FEATURES)
            assert await conn.enable_features() == []  # once enabled, it stays
            assert (await conn.declare_queue("expiring", expires=60))["created"]
        for b in (old1, new2, old3):
            rows = {r["name"]: r for r in await _features(b.address)}
            assert rows[FLAG]["state"] == "enabled", b.data_dir.name
        # Nothing was lost across the restarts: the rest of the messages are there.
        rest = await _consume(new2.address, "q", 40)
        assert set(rest) == {b"c-%d" % i for i in range(40)}
        await _publish(old1.address, "q", 5, "d")  # records in the new format now
        assert len(await _consume(old3.address, "q", 5)) == 5
        await equal_digests([old1, new2, old3])
        # An old broker cannot join any more: the member it asks names the flag, and so
        # does the leader's log; it never becomes a member.
        marker, proc = late.launch()
        seen = await eventually(
            lambda: now(late.output_since(marker)), "the old joiner told why it is refused",
            until=lambda out: FLAG in out, timeout=60,
        )
        # It lacks every flag: the refusal names them all (sorted).
        assert re.search(rf"feature flag\(s\) {', '.join(sorted(FEATURES))} enabled", seen), seen
        assert proc.poll() is None or proc.returncode != 0
        keys = [i["node_id"] for i in (await topology(new2.address))["instances"]]
        assert "n4" not in keys
        assert not _diverged(old1, new2, old3)
    finally:
        for b in everyone:
            b.stop()


async def _features(address: str) -> list[dict[str, object]]:
    async with await clients.connect(address) as conn:
        return await conn.list_features()


async def test_a_downgrade_after_a_flag_is_refused_and_the_broker_comes_back_on_the_new_build(
    tmp_path: Path, previous_build: Path
) -> None:
    log_url = f"file:{tmp_path / 'log'}"
    a = BrokerProcess(tmp_path / "n1", log_url, "n1")
    b = BrokerProcess(tmp_path / "n2", log_url, "n2")
    try:
        a.start()  # a new cluster: every flag enabled at once
        b.start()
        await _publish(a.address, "q", 20, "x")
        assert {r["state"] for r in await _features(b.address)} == {"enabled"}
        b.stop()
        b.baton = previous_build  # the operator tries the old build on b's data dir
        marker, proc = b.launch()
        await eventually(
            lambda: now(a.output()), "the leader says the old runtime is refused",
            until=lambda out: re.search(rf"n2/\w+.* is refused .*{FLAG}", out) is not None,
            timeout=60,
        )
        assert proc.poll() is None  # it waits to be admitted, and never is
        b.stop()
        b.baton = None
        before = len(b.log_path.read_bytes())
        b.start()  # the new build again: the old run's state is not trusted
        assert b"starts again as a new broker" in b.log_path.read_bytes()[before:]
        assert len(await _consume(b.address, "q", 20)) == 20
        await equal_digests([a, b])
    finally:
        a.stop()
        b.stop()


async def test_a_record_of_an_unknown_type_stops_every_broker_that_meets_it(
    tmp_path: Path,
) -> None:
    log_url = f"file:{tmp_path / 'log'}"
    brokers = [BrokerProcess(tmp_path / f"n{i}", log_url, f"n{i}") for i in (1, 2)]
    try:
        for br in brokers:
            br.start()
        await _publish(brokers[0].address, "q", 3, "x")
        log = await open_log(log_url)
        try:
            bad = await log.append([msgpack.packb([MAX_FORMAT, "n9", "r9", 1, 0, 99, "new"])])
        finally:
            await log.close()
        for br in brokers:
            await eventually(
                lambda br=br: now(br.output()), f"{br.data_dir.name} stops loudly",
                until=lambda out: f"UNREADABLE RECORD at log offset {bad}" in out, timeout=20,
            )
            top = await topology(br.address)
            assert top["healthy"] is False and top["applied"] < bad
        async with await clients.connect(brokers[1].address) as conn:
            with pytest.raises(clients.BatonError, match="cannot read"):
                await asyncio.wait_for(conn.publish("q", b"after"), 10)
    finally:
        for br in brokers:
            br.stop()
