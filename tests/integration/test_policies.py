"""Policies on real brokers (docs/operations.md "Policies"): ``baton policy set`` on one
broker is effective on every broker of a three-broker cluster, on queues that exist and
on queues declared later; the state machine enforces the effective settings; they survive
a restart and reach a broker that joins later; ``baton policy clear`` gives the declared settings back; a bad policy is one
clear line and writes nothing; only admins change policies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batonmq import clients
from batonmq.cluster.errors import AccessRefused, InvalidArgument, QueueFull
from tests.helpers import equal_digests, eventually, wait_stats
from tests.integration.conftest import BrokerProcess
from tests.integration.test_cli import baton
from tests.integration.test_join import join_done

pytestmark = pytest.mark.integration


def _ok(*args: str) -> str:
    r = baton(*args)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r.stdout + r.stderr


async def _effective(address: str, queue: str, **expected: object) -> None:
    async with await clients.connect(address) as conn:
        await wait_stats(conn, queue, timeout=15, **expected)


async def test_a_policy_set_on_one_broker_is_effective_on_every_broker_and_survives_restart(
    cluster: list[BrokerProcess], tmp_path: Path,
) -> None:
    one, two, three = cluster
    async with await clients.connect(two.address) as conn:
        await conn.declare_queue("jobs.old", max_length=50)
        await conn.declare_queue("other")
    said = _ok("policy", "set", "jobs", "--pattern", "^jobs\\.", "--priority", "1",
               "--definition", json.dumps({"max-length": 2, "delivery-limit": 3,
                                           "dead-letter": "jobs.dlq", "message-ttl": 600000}),
               "--broker", one.address)
    assert "policy jobs added; 1 queue(s) have a policy now" in said
    for b in cluster:
        await _effective(b.address, "jobs.old", policy="jobs", max_length=2, delivery_limit=3,
                         dead_letter="jobs.dlq", message_ttl_ms=600000)
        await _effective(b.address, "other", policy=None, max_length=None)
    # A queue declared later, on another broker, takes it at its declare.
    async with await clients.connect(three.address) as conn:
        await conn.declare_queue("jobs.new")
        await conn.declare_queue("jobs.dlq")
        # Effective everywhere, and what the state machine enforces.
        await conn.publish("jobs.new", b"1")
        await conn.publish("jobs.new", b"2")
        with pytest.raises(QueueFull, match="max_length 2"):
            await conn.publish("jobs.new", b"3")
        # Declaring it again as it was declared is no conflict.
        assert not (await conn.declare_queue("jobs.old", max_length=50))["created"]
    r = baton("policy", "list", "--json", "--broker", three.address)
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    assert listed == [{"name": "jobs", "pattern": "^jobs\\.", "apply_to": "queues",
                       "definition": {"dead-letter": "jobs.dlq", "delivery-limit": 3,
                                      "max-length": 2, "message-ttl": 600000},
                       "priority": 1}]
    table = _ok("queues", "--broker", one.address)
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:] if line.strip()}
    assert rows["jobs.new"][-1] == "jobs" and len(rows["other"]) == 5
    await equal_digests(cluster)

    # A restart derives the effective settings again from the replicated policies.
    two.terminate()
    two.restart()
    await _effective(two.address, "jobs.new", policy="jobs", max_length=2, dead_letter="jobs.dlq")
    await _effective(two.address, "jobs.old", policy="jobs", max_length=2)

    # A broker joining now installs a member's state (docs/design.md §8) and derives the
    # effective settings from the policies in it.
    four = BrokerProcess(tmp_path / "node-4", log_url=f"file:{tmp_path / 'shared-log'}",
                         node_id="node-4")
    four.start()
    try:
        await eventually(lambda: join_done(four.address), "node-4's join", timeout=30)
        await _effective(four.address, "jobs.new", policy="jobs", max_length=2)
        await _effective(four.address, "other", policy=None)
        await equal_digests([*cluster, four])
    finally:
        four.stop()

    said = _ok("policy", "clear", "jobs", "--broker", two.address)
    assert "policy jobs cleared; 0 queue(s) have a policy now" in said
    for b in cluster:
        await _effective(b.address, "jobs.old", policy=None, max_length=50, delivery_limit=20,
                         dead_letter=None, message_ttl_ms=None)
    async with await clients.connect(one.address) as conn:
        await conn.publish("jobs.new", b"3")  # no cap any more
    await equal_digests(cluster)


async def test_bad_policies_write_nothing_and_only_admins_change_them(
    broker: BrokerProcess,
) -> None:
    async with await clients.connect(broker.address) as admin:
        for pattern, definition, said in (
            ("(a|b)*)", {"max-length": 1}, "bad policy pattern"),
            ("(x*)*y", {"max-length": 1}, "nests a repetition"),
            ("x" * 300, {"max-length": 1}, "at most 255"),
            ("^q", {"max-length": -1}, "'max-length' must be an integer of 1 or more"),
            ("^q", {"ttl": 5}, "unknown policy key 'ttl'"),
            ("^q", {"retry": {"policy": "fixed"}}, "'retry.delay' must be an integer"),
        ):
            with pytest.raises(InvalidArgument, match=said):
                await admin.set_policy("p", pattern, definition)
        with pytest.raises(InvalidArgument, match="no policy 'p'"):
            await admin.clear_policy("p")
        assert await admin.list_policies() == []
        await admin.put_user("alice", "alice-pw")
        await admin.set_permissions("alice", configure=".*", write=".*", read=".*")
        done = await admin.set_policy("p", "^q", {"message-ttl": 1000}, priority=2)
        assert done.changed and done.queues == 0
    async with await clients.connect(f"baton://alice:alice-pw@{broker.address}") as alice:
        assert [p["name"] for p in await alice.list_policies()] == ["p"]  # reading is open
        with pytest.raises(AccessRefused, match="manage policies"):
            await alice.set_policy("p2", "^q", {"max-length": 1})
        with pytest.raises(AccessRefused, match="manage policies"):
            await alice.clear_policy("p")
        await alice.declare_queue("q1")
        stats = await eventually(lambda: alice.queue_stats("q1"), "q1's stats")
        assert (stats["policy"], stats["message_ttl_ms"]) == ("p", 1000)

