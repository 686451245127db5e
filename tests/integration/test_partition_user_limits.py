"""A user's max_queues on a log of a control partition and four data partitions
(docs/design.md §16, docs/security.md "Per-user limits"), real brokers: the user's queues
are spread over the data partitions and counted on control, in its log order, through
whichever broker they are declared; a deleted queue stops counting."""

from __future__ import annotations

import pytest

from batonmq import clients
from batonmq.cluster.errors import LimitExceeded
from tests.helpers import eventually
from tests.integration.conftest import BrokerProcess
from tests.integration.test_partition_dead_letters import two  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration


async def test_a_users_queue_limit_holds_over_partitions_and_brokers(
    two: list[BrokerProcess],
) -> None:
    async with await clients.connect(two[0].address, timeout=5) as admin:
        await admin.put_user("alice", "alice-pw")
        await admin.set_permissions("alice", configure=".*", write=".*", read=".*")
        await admin.set_user_limits("alice", max_queues=3)
    urls = [f"baton://alice:alice-pw@{b.address}" for b in two]
    async with await clients.connect(urls[0], timeout=5) as a0, \
            await clients.connect(urls[1], timeout=5) as a1:
        await a0.declare_queue("q1")
        await a1.declare_queue("q2")
        await a0.declare_queue("q3", partition=4)
        where = {(await a0.queue_stats(n))["partition"] for n in ("q1", "q2", "q3")}
        assert len(where) == 3  # on three partitions, counted together
        for conn, name in ((a0, "q4"), (a1, "q4"), (a1, "q5")):
            with pytest.raises(LimitExceeded, match=r"user 'alice' has 3 queues.*max_queues 3"):
                await conn.declare_queue(name)
        assert not (await a1.declare_queue("q2"))["created"]  # one it has: no new queue
        # A deleted queue no longer counts, once control has applied its release.
        await a1.delete_queue("q1")

        async def declare() -> bool:
            try:
                created: bool = (await a0.declare_queue("q4"))["created"]
                return created
            except LimitExceeded:
                return False

        await eventually(declare, "q4 declared once q1 is released", timeout=20)
        with pytest.raises(LimitExceeded):
            await a1.declare_queue("q5")
