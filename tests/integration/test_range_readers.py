"""Range readers against real brokers (docs/design.md §11, docs/protocol.md "Range readers"):
Reserve keeps consumers away, ReadRange reads without acquiring, from any broker of a
cluster, and AcceptThrough accepts what the reader committed."""

from __future__ import annotations

import asyncio

import pytest

from batonmq import clients
from batonmq.broker.ranges import READ_RANGE_WAIT
from batonmq.cluster.errors import InvalidArgument, NotReplica, QueueReserved
from tests.helpers import eventually, wait_stats
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration


async def test_reserve_read_range_accept_through(broker: BrokerProcess) -> None:
    async with await clients.connect(broker.address) as conn:
        await conn.declare_queue("q")
        await conn.publish_batch("q", [(b"m%d" % i, {"i": i}) for i in range(100)])
        async with conn.consume("q", prefetch=10) as consumer:
            got = await consumer.get_many(10, timeout=5)
            assert got and got[0].position == 0
            reserved = await conn.reserve("q", "reader")
            assert reserved["reserved_by"] == "reader" and reserved["acquired"] == 10
            # What consumers took before stays theirs; they settle it.
            for m in got:
                await m.ack(confirm=True)
            await consumer.cancel()
        reserved = await conn.reserve("q", "reader")
        assert reserved["acquired"] == 0 and reserved["next_position"] == 100
        # No consumer gets anything while the reservation lasts.
        async with conn.consume("q", prefetch=10) as consumer:
            assert await consumer.get(timeout=0.7) is None
        stats = await conn.queue_stats("q")
        assert stats["reserved_by"] == "reader" and stats["acquired"] == 0

        messages, nxt = await conn.read_range("q", 0, 100, limit=30)
        acked = {m.position for m in got}
        expected = [p for p in range(100) if p not in acked]
        assert [m[0] for m in messages] == expected[:30]
        assert nxt == messages[-1][0] + 1
        position, body, headers, publish_time = messages[0]
        assert body == b"m%d" % position and headers == {"i": position} and publish_time > 0
        rest, end = await conn.read_range("q", nxt, 100)
        assert end == 100 and [m[0] for m in rest] == expected[30:]
        # Reading does not take anything: the same range again gives the same messages.
        again, _ = await conn.read_range("q", 0, 100)
        assert [m[0] for m in again] == expected

        with pytest.raises(QueueReserved):
            await conn.reserve("q", "someone-else")
        with pytest.raises(QueueReserved):
            await conn.accept_through("q", 50, "someone-else")
        with pytest.raises(InvalidArgument):
            await conn.read_range("q", 10, 5)

        assert await conn.accept_through("q", 50, "reader") == len([p for p in expected if p < 50])
        assert await conn.accept_through("q", 50, "reader") == 0  # idempotent
        left, _ = await conn.read_range("q", 0, 100)
        assert [m[0] for m in left] == list(range(50, 100))
        assert (await conn.queue_stats("q"))["head"] == 50

        # Ending the reservation hands the rest back to consumers.
        await conn.reserve("q", None)
        async with conn.consume("q", prefetch=100) as consumer:
            rest_msgs = await consumer.get_many(100, timeout=5)
            while len(rest_msgs) < 50:
                more = await consumer.get_many(100, timeout=5)
                assert more, "consumer got nothing after the reservation ended"
                rest_msgs += more
            assert sorted(m.position for m in rest_msgs) == list(range(50, 100))


async def test_any_broker_answers_a_range_the_same(cluster: list[BrokerProcess]) -> None:
    addresses = [b.address for b in cluster]
    async with await clients.connect(addresses[0]) as first:
        await first.declare_queue("q")
        await first.reserve("q", "reader")
        positions = await first.publish_batch("q", [b"x%d" % i for i in range(500)])
        end = positions[-1] + 1
        answers = []
        for address in addresses:
            async with await clients.connect(address) as conn:
                # Straight after the publish: a lagging broker waits until it applied it.
                messages, nxt = await conn.read_range("q", 0, end)
                assert nxt == end
                answers.append([(m[0], m[1]) for m in messages])
        assert answers[0] == answers[1] == answers[2]
        assert [p for p, _ in answers[0]] == positions
        await first.accept_through("q", 250, "reader")
        async with await clients.connect(addresses[2]) as conn:
            # node-3 applies the accept a little later.
            messages, _ = await eventually(
                lambda: conn.read_range("q", 0, end), "node-3 to apply the accept",
                until=lambda r: bool(r[0]) and r[0][0][0] == 250,
            )
            assert [m[0] for m in messages] == positions[250:]


async def test_a_stale_terms_commit_is_refused_after_a_handover(
    cluster: list[BrokerProcess],
) -> None:
    """Two range readers of one queue, each running for the leadership of a service (the
    import-entries pipeline's standby set-up): the first leads and commits with its term's
    token; after a handover the second leads. The first one's late commit (a driver that
    was paused meanwhile) carries the old token and is refused, so nothing it read past
    the new leader's commits is accepted twice or out of turn (docs/spark.md, "Fencing")."""
    b1, b2, b3 = cluster
    service, holder = "import-entries", "spark:entries"
    a = await clients.connect(b1.address)
    b = await clients.connect(b2.address)
    admin = await clients.connect(b3.address)
    try:
        await admin.declare_queue("entries")
        await admin.publish_batch("entries", [b"e%d" % i for i in range(100)])
        term_a = a.lead(service)
        await term_a.__aenter__()
        await a.reserve("entries", holder, service=service, token=term_a.token)
        assert await a.accept_through("entries", 30, holder, service=service,
                                      token=term_a.token) == 30
        term_b = b.lead(service)
        entering_b = asyncio.ensure_future(term_b.__aenter__())

        async def candidates() -> int:
            return sum(len(i.candidates) for i in await admin.services() if i.service == service)

        await eventually(candidates, "B is a candidate too", until=lambda n: n == 2)
        handover = asyncio.ensure_future(admin.handover(service, timeout=20))
        await asyncio.wait_for(term_a.handover_requested.wait(), 10)
        await term_a.__aexit__(None, None, None)  # A's work is done: its term ends
        done = await asyncio.wait_for(handover, 10)
        await asyncio.wait_for(entering_b, 10)
        assert done.token == term_b.token > term_a.token
        # B takes the reservation over under its term (same holder) and commits.
        await b.reserve("entries", holder, service=service, token=term_b.token)
        assert await b.accept_through("entries", 60, holder, service=service,
                                      token=term_b.token) == 30
        # A's late commit, through any broker, is refused: its term is over.
        for conn in (a, admin):
            with pytest.raises(clients.StaleToken, match=f"token is {term_b.token}"):
                await conn.accept_through("entries", 90, holder, service=service,
                                          token=term_a.token)
        with pytest.raises(clients.StaleToken):
            await a.reserve("entries", holder, service=service, token=term_a.token)
        # b3 applied B's commit: its own refused one came later in the log.
        stats = await admin.queue_stats("entries")
        assert (stats["accepted"], stats["ready"], stats["head"]) == (60, 40, 60), stats
        # The new term goes on committing.
        assert await b.accept_through("entries", 100, holder, service=service,
                                      token=term_b.token) == 40
        await term_b.__aexit__(None, None, None)
    finally:
        for conn in (a, b, admin):
            await conn.close()


async def test_a_leader_cut_off_by_a_paused_broker_cannot_commit_late(
    cluster: list[BrokerProcess],
) -> None:
    """The leader's session lives on a broker that is paused (SIGSTOP): the view drops that
    broker, the standby gets the next term. The old leader's commits go through another
    broker (as the Spark driver's own connection does) and are refused from then on."""
    b1, b2, b3 = cluster
    service, holder = "import-entries", "spark:entries"
    a = await clients.connect(b1.address)  # the old leader's session
    a_commits = await clients.connect(b3.address)  # its driver's connection for commits
    b = await clients.connect(b2.address)
    try:
        await a_commits.declare_queue("entries")
        await a_commits.publish_batch("entries", [b"e%d" % i for i in range(50)])
        term_a = a.lead(service)
        await term_a.__aenter__()
        await a_commits.reserve("entries", holder, service=service, token=term_a.token)
        assert await a_commits.accept_through("entries", 10, holder, service=service,
                                              token=term_a.token) == 10
        term_b = b.lead(service)
        entering_b = asyncio.ensure_future(term_b.__aenter__())
        b1.pause()
        try:
            await asyncio.wait_for(entering_b, 20)  # the view dropped b1: B's term
            assert term_b.token > term_a.token
            with pytest.raises(clients.StaleToken):
                await a_commits.accept_through("entries", 40, holder, service=service,
                                               token=term_a.token)
            assert await b.accept_through("entries", 20, holder, service=service,
                                          token=term_b.token) == 10
        finally:
            b1.resume()
        # (b3 answers from what it applied: B's commit went through b2.)
        await wait_stats(a_commits, "entries", accepted=20, head=20, ready=30)
        await term_b.__aexit__(None, None, None)
    finally:
        for conn in (a, a_commits, b):
            await conn.close()


async def test_a_waiting_read_on_a_broker_that_leaves_the_group_names_the_replicas(
    grouped: list[BrokerProcess],
) -> None:
    """A ReadRange waits on a replica for positions not written yet, and the partition
    moves off that broker meanwhile: the read is answered NotReplica (the client's
    routing sends it on), not held until its Timeout (docs/design.md §11)."""
    from tests.integration.test_cli import baton
    from tests.integration.test_partition_moves import _groups

    groups = await _groups(grouped[0].address)
    by_node = {b.node_id: b for b in grouped}
    source = by_node[groups[1]["replicas"][0]]
    target = next(b for b in grouped if b.node_id not in groups[1]["replicas"])
    # route=False: the raw answer of the broker asked, not the routed retry.
    async with await clients.connect(source.address, timeout=5, route=False) as conn:
        await conn.declare_queue("q", partition=1)
        await conn.publish_batch("q", [b"m%d" % i for i in range(10)])
        await conn.reserve("q", "reader")
        assert (await conn.read_range("q", 0, 10))[1] == 10
        started = asyncio.get_running_loop().time()
        waiting = asyncio.ensure_future(conn.read_range("q", 0, 20))  # 10..19: not yet
        r = await asyncio.to_thread(
            baton, "partitions", "move", "1", "--from", source.node_id, "--to", target.node_id,
            "--wait", "--timeout", "60", "--broker", grouped[0].address, timeout=90,
        )
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert asyncio.get_running_loop().time() - started < READ_RANGE_WAIT, (
            "the move took longer than a read waits: nothing shown")
        with pytest.raises(NotReplica, match=target.address):
            await waiting
    # Routed (the default), the same read goes to the new replicas.
    async with await clients.connect(source.address, timeout=5) as conn:
        await conn.publish_batch("q", [b"m%d" % i for i in range(10, 20)])
        messages, nxt = await conn.read_range("q", 0, 20)
        assert nxt == 20 and [m[1] for m in messages] == [b"m%d" % i for i in range(20)]
