"""Membership edge cases with observers, on real broker processes (docs/design.md §7, §8).

- An observer started first on an empty log cannot form a cluster (observers never
  propose): it says it waits for a voter, and the first voter started after it must form
  the cluster instead of asking the observer, which does not serve yet, for an update.
- An observer left with no live voter shows no leader, says why, and reports itself
  unhealthy until a voter is back.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from batonmq import clients
from batonmq.cluster.errors import QueueNotFound
from tests.helpers import eventually, eventually_sync, topology
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration


def _observer(tmp_path: Path, url: str) -> BrokerProcess:
    return BrokerProcess(tmp_path / "obs", log_url=url, node_id="obs",
                         extra=["--role", "observer"])


async def test_an_observer_started_first_waits_and_the_first_voter_forms_the_cluster(
    tmp_path: Path,
) -> None:
    url = f"file:{tmp_path / 'shared-log'}"
    observer = _observer(tmp_path, url)
    voter = BrokerProcess(tmp_path / "node-1", log_url=url, node_id="node-1")
    loop = asyncio.get_running_loop()
    # The observer's start returns only once it is a member, which needs a voter: run it
    # aside while the voter starts.
    observer_started = loop.run_in_executor(None, lambda: observer.start(timeout=60))
    try:
        eventually_sync(
            lambda: "waiting for a voter" in observer.log_path.read_text(errors="replace"),
            "the observer says it waits for a voter", timeout=20,
            ignore=(FileNotFoundError,),  # its output file is made as it starts
        )
        voter.start(timeout=30)
        await asyncio.wait_for(observer_started, 60)
        for b in (voter, observer):
            top = await topology(b.address)
            assert top["member"] and top["healthy"], top
            assert top["leader"] is not None and top["leader"].startswith("node-1/"), top
            assert sorted(i["node_id"] for i in top["instances"]) == ["node-1", "obs"]
        # The voter formed it by replaying the log, without asking the observer (which
        # did not serve yet) for an update.
        assert "replaying the log from offset 0" in voter.output(), voter.output()
        assert "no update from" not in voter.output(), voter.output()
        async with await clients.connect(observer.address) as conn:
            await conn.declare_queue("after-forming")
            assert await conn.publish("after-forming", b"x") == 0
        async with await clients.connect(voter.address) as conn:
            await eventually(lambda: conn.queue_stats("after-forming"), "the voter has it",
                             until=lambda st: st["ready"] == 1, ignore=(QueueNotFound,))
    finally:
        observer.stop()
        voter.stop()
        try:
            await asyncio.wait_for(observer_started, 30)
        except Exception:
            pass  # already reported above, or the observer never started


async def test_an_observer_without_a_live_voter_shows_no_leader_and_is_unhealthy(
    tmp_path: Path,
) -> None:
    url = f"file:{tmp_path / 'shared-log'}"
    voter = BrokerProcess(tmp_path / "node-1", log_url=url, node_id="node-1")
    observer = _observer(tmp_path, url)
    try:
        voter.start()
        observer.start()
        top = await topology(observer.address)
        assert top["leader"].startswith("node-1/") and top["healthy"], top
        assert top["status"] == "ok", top
        voter.kill9()

        async def alone() -> dict[str, object]:
            return await topology(observer.address)

        top = await eventually(alone, "the observer sees no live voter", timeout=20,
                               until=lambda t: t["status"] == "no live voter")
        assert top["leader"] is None, top
        assert not any(i["leader"] for i in top["instances"]), top
        assert top["healthy"] is False, top
        assert "no live voter" in observer.output()
        # A voter back (a new runtime of node-1) forms a new view with the observer.
        voter.restart()
        top = await eventually(alone, "the observer sees the voter back", timeout=30,
                               until=lambda t: t["status"] == "ok")
        assert top["leader"].startswith("node-1/") and top["healthy"], top
    finally:
        observer.stop()
        voter.stop()
