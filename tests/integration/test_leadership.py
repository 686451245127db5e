"""Service leadership end to end (docs/design.md §7): client sessions on different brokers of a
real three-broker cluster compete for a service; kill -9, disconnects and admin
handovers move the leadership, with growing fencing tokens."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from batonmq import clients
from batonmq.cluster.errors import InvalidArgument, Timeout
from batonmq.clients.leadership import ServiceInfo, Term
from tests.helpers import eventually, eventually_sync
from tests.integration.conftest import REPO, BrokerProcess

SERVICE = "import-entries"


async def _wait_leading(term: Term, enter: "asyncio.Task[Term]", seconds: float) -> float:
    """Wait until ``enter`` (the term's __aenter__) returns; the seconds it took."""
    start = time.monotonic()
    got = await asyncio.wait_for(enter, seconds)
    assert got is term and term.leading
    return time.monotonic() - start


async def _info_when(
    conn: clients.Connection, check: "Callable[[ServiceInfo | None], bool]", seconds: float = 10,
    service: str = SERVICE,
) -> ServiceInfo | None:
    """The service as ``conn``'s broker applied it, once ``check`` holds (brokers apply
    the log independently: one may be a few events behind another)."""
    return await eventually(
        lambda: conn.service_leader(service), f"service {service!r} on {conn.address}",
        timeout=seconds, until=check,
    )


async def _still_waiting(enter: "asyncio.Task[Term]", seconds: float = 0.5) -> None:
    """The candidacy is still waiting after ``seconds``: time passing is the point."""
    await asyncio.sleep(seconds)
    assert not enter.done(), "a second session got the term while the first held it"


async def test_kill9_of_the_leaders_broker_moves_the_term(cluster: list[BrokerProcess]) -> None:
    b1, b2, b3 = cluster
    # conn1 fails over (to b3) when b1 dies; its term must be lost all the same.
    conn1 = await clients.connect([b1.address, b3.address], failover=True)
    conn2 = await clients.connect(b2.address)
    # conn3 waits on b1 too; it fails over to b2 and runs again there.
    conn3 = await clients.connect([b1.address, b2.address], failover=True)
    try:
        async with conn1.lead(SERVICE, timeout=10) as t1:
            assert t1.token >= 0 and t1.candidate.startswith("node-1/")
            term2 = conn2.lead(SERVICE)
            enter2 = asyncio.ensure_future(term2.__aenter__())
            # Runs second: a candidate on b2 before term3 asks (the order is checked below).
            await _info_when(conn2, lambda i: i is not None and term2.candidate in i.candidates)
            await _still_waiting(enter2)
            term3 = conn3.lead(SERVICE)
            enter3 = asyncio.ensure_future(term3.__aenter__())
            info = await _info_when(conn2, lambda i: i is not None and len(i.candidates) == 3)
            assert info is not None and info.leader == t1.candidate and info.token == t1.token
            assert info.candidates[1] == term2.candidate
            assert info.candidates[2].startswith("node-1/")

            b1.kill9()
            took = await _wait_leading(term2, enter2, 20)
            print(f"kill -9 of the leader's broker: next term after {took:.2f}s")
            assert term2.token > t1.token
            await asyncio.wait_for(t1.lost.wait(), 10)  # the failover ended the session
            assert not t1.leading
            assert conn1.failovers == 1
            # conn1's new broker shows conn2's term too (once it applied the view change).
            info = await _info_when(conn1, lambda i: i is not None and i.token == term2.token)
            assert info is not None and info.leader == term2.candidate
            assert info.token == term2.token
            assert all(not c.startswith("node-1/") for c in info.candidates)
        # conn3 waited through its failover: it runs on b2 now, and leads next.
        assert conn3.failovers == 1 and not enter3.done()
        assert term3.candidate.startswith("node-2/")
        await term2.__aexit__(None, None, None)
        await _wait_leading(term3, enter3, 10)
        assert term3.token > term2.token
        await term3.__aexit__(None, None, None)
    finally:
        await conn1.close()
        await conn2.close()
        await conn3.close()
    # The surviving replicas agree on the service state (once both applied the resigns).
    async with await clients.connect(b3.address) as c3, await clients.connect(b2.address) as c2:

        async def both() -> tuple[list[ServiceInfo], list[ServiceInfo]]:
            return await c3.services(), await c2.services()

        await eventually(both, "no service left on b3 and b2", until=lambda ss: ss == ([], []))


async def test_disconnect_hands_over_and_handover_waits_for_the_block(
    cluster: list[BrokerProcess],
) -> None:
    b1, b2, b3 = cluster
    conn1 = await clients.connect(b1.address)
    conn2 = await clients.connect(b2.address)
    admin = await clients.connect(b3.address)
    conn4 = await clients.connect(b3.address)
    try:
        # 1. A session that disconnects while leading: the next one leads at once.
        t1 = conn1.lead(SERVICE)
        await t1.__aenter__()
        term2 = conn2.lead(SERVICE)
        enter2 = asyncio.ensure_future(term2.__aenter__())
        await _still_waiting(enter2, 0.3)
        await conn1.close()  # no resign sent: the broker resigns for the session
        took = await _wait_leading(term2, enter2, 10)
        assert t1.lost.is_set() and term2.token > t1.token
        assert took < 3, f"hand over after a disconnect took {took:.2f}s"

        # 2. An admin handover waits until the leader leaves its block.
        term4 = conn4.lead(SERVICE)
        enter4 = asyncio.ensure_future(term4.__aenter__())
        await _info_when(admin, lambda i: i is not None and term4.candidate in i.candidates)
        handover = asyncio.ensure_future(admin.handover(SERVICE, timeout=20))
        await asyncio.wait_for(term2.handover_requested.wait(), 10)
        assert term2.leading  # still its term: it finishes its work first
        await asyncio.sleep(0.5)  # time passes: the handover waits all the same
        assert not handover.done() and not enter4.done()
        await term2.__aexit__(None, None, None)  # the work is done: leave the block
        done = await asyncio.wait_for(handover, 10)
        await _wait_leading(term4, enter4, 10)
        assert done.leader == term4.candidate and done.token == term4.token
        assert done.previous == term2.candidate and done.token > term2.token
        assert term2.lost.is_set()

        # 3. A handover the leader does not act on times out; it still leads.
        term5 = conn2.lead(SERVICE)
        enter5 = asyncio.ensure_future(term5.__aenter__())
        await _info_when(admin, lambda i: i is not None and term5.candidate in i.candidates)
        with pytest.raises(Timeout):
            await admin.handover(SERVICE, timeout=0.5)
        assert term4.leading and term4.handover_requested.is_set() and not enter5.done()
        # ... and one naming the waiting candidate's node completes when it leaves.
        named = asyncio.ensure_future(admin.handover(SERVICE, to="node-2", timeout=10))
        await _info_when(admin, lambda i: i is not None and i.handover_to == term5.candidate)
        await term4.__aexit__(None, None, None)
        done = await asyncio.wait_for(named, 10)
        await _wait_leading(term5, enter5, 10)
        assert done.leader == term5.candidate

        # 4. Bad requests are clear errors.
        with pytest.raises(InvalidArgument):
            await admin.handover("no-such-service", timeout=1)
        with pytest.raises(InvalidArgument, match="nobody to hand over to"):
            await admin.handover(SERVICE, timeout=1)
        with pytest.raises(InvalidArgument, match="already runs"):
            async with conn2.lead(SERVICE):
                pass
        with pytest.raises(Timeout):
            async with conn4.lead(SERVICE, timeout=0.5):
                pass
        # The timed-out candidacy was withdrawn.
        info = await _info_when(admin, lambda i: i is not None and len(i.candidates) == 1)
        assert info is not None and info.candidates == (term5.candidate,)
        await term5.__aexit__(None, None, None)
        assert await _info_when(admin, lambda i: i is None) is None
    finally:
        for c in (conn1, conn2, admin, conn4):
            await c.close()


def _baton(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batonmq.broker", *args], capture_output=True, text=True, cwd=REPO,
        timeout=60,
    )


async def test_broker_level_candidates_cli_and_restart(tmp_path: Path) -> None:
    log = f"file:{tmp_path / 'log'}"
    a = BrokerProcess(tmp_path / "a", log_url=log, node_id="a", extra=["--service", "cron"])
    b = BrokerProcess(tmp_path / "b", log_url=log, node_id="b", extra=["--service", "cron"])
    try:
        a.start()
        b.start()
        async with await clients.connect(b.address) as conn:
            # b's candidacy is appended once it joined.
            info = await _info_when(conn, lambda i: i is not None and len(i.candidates) == 2,
                                    service="cron")
            assert info is not None and info.leader is not None
            assert info.leader.startswith("a/") and info.candidates[1].startswith("b/")
            first = info.token
            assert first is not None

            out = _baton("services", "--broker", a.address, "-v")
            assert out.returncode == 0, out.stderr
            assert "cron" in out.stdout and info.leader in out.stdout
            # A broker leader has no running work: it hands over at once, runs again.
            out = _baton("handover", "cron", "--broker", a.address, "--timeout", "10")
            assert out.returncode == 0, out.stderr
            assert "b/" in out.stdout
            # b applies the new term a little after a answered.
            info = await _info_when(
                conn, lambda i: i is not None and i.leader is not None and i.leader.startswith("b/"),
                service="cron",
            )
            assert info is not None and info.leader is not None and info.leader.startswith("b/")
            assert info.token is not None and info.token > first
            second = info.token
            out = _baton("handover", "nope", "--broker", a.address)
            assert out.returncode == 1 and "has no leader" in out.stderr

        # b restarts (new runtime): its old candidacy ends with it; a leads again.
        b.terminate()
        b.restart()
        async with await clients.connect(b.address) as conn:
            info = await _info_when(
                conn,
                lambda i: i is not None and len(i.candidates) == 2 and i.leader is not None
                and i.leader.startswith("a/"),
                service="cron",
            )
            assert info is not None and info.leader is not None and info.leader.startswith("a/")
            assert info.token is not None and info.token > second
            async with await clients.connect(a.address) as conn_a:

                async def both() -> tuple[list[ServiceInfo], list[ServiceInfo]]:
                    return await conn_a.services(), await conn.services()

                # Once a has applied what b has.
                await eventually(both, "a and b to list the same services",
                                 until=lambda ss: ss[0] == ss[1])
                assert await conn_a.services() == await conn.services()
    finally:
        a.stop()
        b.stop()


def test_sync_client_leads_and_hands_over(broker: BrokerProcess) -> None:
    import threading

    got: list[int] = []
    with clients.sync.connect(broker.address) as c1, clients.sync.connect(broker.address) as c2:
        with c1.lead("svc", timeout=10) as t1:
            assert t1.leading and t1.token >= 0 and not t1.lost.is_set()

            def second() -> None:
                with c2.lead("svc", timeout=20) as t2:
                    got.append(t2.token)

            th = threading.Thread(target=second)
            th.start()
            info = eventually_sync(
                lambda: c1.service_leader("svc"), "a second candidate for svc",
                until=lambda i: i is not None and len(i.candidates) == 2,
            )
            assert info is not None and info.leader == t1.candidate
            done: list[clients.HandoverResult] = []
            admin = threading.Thread(target=lambda: done.append(c1.handover("svc", timeout=20)))
            admin.start()
            assert t1.handover_requested.wait(10)  # a threading.Event in the blocking client
            assert not done and not got
        assert t1.lost.is_set()
        admin.join(20)
        th.join(20)
        assert done and got and done[0].token == got[0] > t1.token
        assert c1.services() == []  # the second left its block: nobody runs any more
