"""A replicated cluster: three real brokers on one shared log: a file: log, and
for the tests on `any_cluster` also a topic on a real Kafka broker.

Default timeouts (heartbeat 500 ms, suspicion after 6 beats of another member).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from batonmq import clients
from batonmq.cluster.errors import BatonError
from tests.helpers import equal_digests, eventually, now, topology
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration


class Deliveries:
    """Who got which position, to check that no message is with two consumers."""

    def __init__(self) -> None:
        self.holder: dict[int, str] = {}  # position -> consumer holding it now
        self.done: set[int] = set()  # acks confirmed
        self.acking: dict[int, str] = {}  # ack sent, confirmation not yet received
        self.uncertain: set[int] = set()  # ack sent to a broker that died before confirming
        self.by: dict[str, int] = {}  # deliveries per consumer
        self.violations: list[str] = []
        self.counts: dict[int, int] = {}
        self.fenced: set[str] = set()  # consumers whose broker is paused / dropped
        self.stale: dict[int, str] = {}  # position -> fenced consumer that was handed it
        self.acked_by: dict[int, str] = {}

    def got(self, who: str, msg: clients.Message) -> None:
        if who in self.fenced:
            # The cluster dropped this consumer's broker, so what it holds was given
            # back; the client library may still hand out what it had buffered before
            # it learns so (no lease can prevent that). Such a message must not be
            # acked by it: checked at the end.
            self.stale[msg.position] = who
            self.by[who] = self.by.get(who, 0) + 1
            return
        other = self.holder.get(msg.position)
        if other is not None and other != who and other not in self.fenced:
            # (What a fenced consumer held was given back at the view change, which
            # the test sees only a little later: not a violation, but that consumer
            # must not be able to ack it any more, checked in acked().)
            self.violations.append(f"{msg.position} with {other} and {who}")
        if msg.position in self.done:
            self.violations.append(f"{msg.position} delivered after its ack was confirmed")
        self.holder[msg.position] = who
        self.counts[msg.position] = msg.delivery_count
        self.by[who] = self.by.get(who, 0) + 1

    def acked(self, position: int, who: str = "") -> None:
        if position in self.done:
            self.violations.append(f"{position} accepted twice (by {self.acked_by[position]} and {who})")
        holder = self.holder.get(position)
        if holder is not None and holder != who:
            self.violations.append(f"{position} acked by {who} while {holder} held it")
        self.acked_by[position] = who
        self.holder.pop(position, None)
        self.acking.pop(position, None)
        self.done.add(position)

    def lost(self, who: str) -> None:
        """A consumer's broker died: what it held may go to others now, and an ack
        it sent without a confirmation may or may not have been applied."""
        for p in [p for p, h in self.holder.items() if h == who]:
            del self.holder[p]
        for p in [p for p, h in self.acking.items() if h == who]:
            del self.acking[p]
            self.uncertain.add(p)

    def settled(self) -> int:
        """Positions whose ack was confirmed, or may have been applied by a dead broker."""
        return len(self.done | self.uncertain)


async def consume(address: str, queue: str, who: str, log: Deliveries, stop: asyncio.Event,
                  prefetch: int = 50) -> None:
    try:
        async with await clients.connect(address) as conn:
            async with conn.consume(queue, prefetch=prefetch) as consumer:
                while not stop.is_set():
                    msg = await consumer.get(timeout=0.2)
                    if msg is None:
                        continue
                    log.got(who, msg)
                    log.acking[msg.position] = who
                    await msg.ack(confirm=True)
                    log.acked(msg.position, who)
    except BatonError:
        log.lost(who)


async def hoard(address: str, queue: str, who: str, log: Deliveries, let_go: asyncio.Event,
                stop: asyncio.Event) -> None:
    """A consumer that holds what it gets, unacked, until ``let_go``; then acks like
    :func:`consume`. What it holds when its broker dies must come back to the queue."""
    held: list[clients.Message] = []
    try:
        async with await clients.connect(address) as conn:
            async with conn.consume(queue, prefetch=10) as consumer:
                while not stop.is_set():
                    msg = await consumer.get(timeout=0.2)
                    if msg is not None:
                        log.got(who, msg)
                        held.append(msg)
                    if not let_go.is_set():
                        continue
                    for m in held:
                        log.acking[m.position] = who
                        await m.ack(confirm=True)
                        log.acked(m.position, who)
                    held.clear()
    except BatonError:
        log.lost(who)


async def test_consumers_on_two_brokers_share_a_queue(any_cluster: list[BrokerProcess]) -> None:
    cluster = any_cluster
    n1, n2, n3 = cluster
    top = await topology(n1.address)
    # (node-2 and node-3 join together: either may be first in the view after node-1.)
    leads = {i["node_id"]: i["leader"] for i in top["instances"]}
    assert leads == {"node-1": True, "node-2": False, "node-3": False}, top["instances"]
    assert top["instances"][0]["node_id"] == "node-1"  # the first member of the view leads
    async with await clients.connect(n1.address) as conn:
        await conn.declare_queue("shared")
        await conn.publish_batch("shared", [b"%d" % i for i in range(1500)])
    log, stop = Deliveries(), asyncio.Event()
    tasks = [
        asyncio.create_task(consume(n2.address, "shared", "c2", log, stop)),
        asyncio.create_task(consume(n3.address, "shared", "c3", log, stop)),
    ]
    await eventually(lambda: now(len(log.done)), "all 1500 consumed", timeout=60,
                     until=lambda n: n == 1500)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert log.violations == []
    assert log.done == set(range(1500))
    assert log.by.get("c2", 0) > 0 and log.by.get("c3", 0) > 0, log.by  # both consumers got some
    await equal_digests(cluster)


async def test_kill9_of_the_owner_moves_the_queue_within_5s(
    any_cluster: list[BrokerProcess],
) -> None:
    cluster = any_cluster
    n1, n2, n3 = cluster
    total = 4000
    async with await clients.connect(n1.address) as conn:
        await conn.declare_queue("busy")
        await conn.publish_batch("busy", [b"%d" % i for i in range(total)])
    log, stop, let_go = Deliveries(), asyncio.Event(), asyncio.Event()
    consumers = {
        "c2": asyncio.create_task(consume(n2.address, "busy", "c2", log, stop)),
        "c3": asyncio.create_task(consume(n3.address, "busy", "c3", log, stop)),
        "h2": asyncio.create_task(hoard(n2.address, "busy", "h2", log, let_go, stop)),
        "h3": asyncio.create_task(hoard(n3.address, "busy", "h3", log, let_go, stop)),
    }
    await eventually(lambda: now(len(log.done)), "500 consumed", timeout=60, until=lambda n: n >= 500)
    await eventually(lambda: now(dict(log.by)), "both hoarders hold messages", timeout=30,
                     until=lambda by: by.get("h2", 0) >= 5 and by.get("h3", 0) >= 5)
    async with await clients.connect(n1.address) as conn:
        owner = (await conn.queue_stats("busy"))["owner"]
    victim = n2 if owner.startswith("node-2/") else n3
    survivor = "c3" if victim is n2 else "c2"
    # Held by the victim's hoarder, never acked: these must come back, counted.
    hoarded = {p for p, h in log.holder.items() if h == ("h2" if victim is n2 else "h3")}
    victim.kill9()
    let_go.set()
    killed_at = time.monotonic()
    side = (survivor, "h" + survivor[1:])
    before = sum(log.by.get(who, 0) for who in side)

    async def survivor_delivers() -> bool:
        return sum(log.by.get(who, 0) for who in side) > before + 10

    await eventually(survivor_delivers, "the survivor delivers again", timeout=15)
    took = time.monotonic() - killed_at
    assert took < 5.0, f"took {took:.1f}s after kill -9 of the owner"
    await eventually(lambda: now(log.settled()), "every message consumed", timeout=90,
                     until=lambda n: n == total)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*consumers.values()), 10)
    assert log.violations == []
    # Every confirmed message was consumed; the only ones not seen acked are those
    # whose ack reached the log just before the broker died (the log says: accepted).
    assert log.done | log.uncertain == set(range(total)), "a confirmed message was lost"
    assert len(log.uncertain) <= 50
    async with await clients.connect(n1.address) as conn:
        stats = await conn.queue_stats("busy")
    assert (stats["accepted"], stats["ready"], stats["acquired"]) == (total, 0, 0)
    # What the killed broker's consumer held unacked came back with a raised count.
    assert hoarded and hoarded <= log.done
    assert all(log.counts[p] >= 1 for p in hoarded), {p: log.counts[p] for p in hoarded}
    # The killed broker, restarted, rejoins at the end of the view and catches up.
    victim.restart()
    top = await topology(victim.address)
    assert top["member"] and top["instances"][-1]["node_id"] == victim.node_id
    assert time.monotonic() - killed_at < 120
    await equal_digests(cluster)


async def test_leader_is_stable_and_observers_never_lead(
    cluster: list[BrokerProcess], tmp_path: Path
) -> None:
    n1, n2, n3 = cluster
    observer = BrokerProcess(
        tmp_path / "obs", log_url=n1.log_url, node_id="obs", extra=["--role", "observer",
                                                                      "--property", "zone=b"]
    )
    observer.start()
    try:
        top = await topology(observer.address)
        obs = [i for i in top["instances"] if i["node_id"] == "obs"][0]
        assert (obs["role"], obs["leader"], obs["properties"]) == ("observer", False, {"zone": "b"})
        assert top["leader"].startswith("node-1/")
        view = top["view"]
        # Killing a non-leader does not move the leader.
        n3.kill9()

        async def n3_gone() -> bool:
            t = await topology(n1.address)
            return "node-3" not in [i["node_id"] for i in t["instances"]]

        await eventually(n3_gone, "node-3 dropped", timeout=15)
        top = await topology(n2.address)
        assert top["leader"].startswith("node-1/") and top["view"] > view
        # Killing the leader makes the next voter leader — never the observer.
        n1.kill9()

        async def n2_leads() -> bool:
            t = await topology(n2.address)
            return bool(t["leader"]) and t["leader"].startswith("node-2/")

        await eventually(n2_leads, "node-2 leads", timeout=15)
        top = await topology(observer.address)
        assert [i["node_id"] for i in top["instances"]] == ["node-2", "obs"]
        # The observer still serves clients.
        async with await clients.connect(observer.address) as conn:
            await conn.declare_queue("via-observer")
            assert await conn.publish("via-observer", b"x") == 0
        # With node-2 gone too, the observer stays a member and never becomes leader.
        n2.kill9()
        # Not a wait for something: four seconds (eight heartbeats, past the suspicion
        # time) pass alone, and the observer must not have made itself leader.
        await asyncio.sleep(4)
        top = await topology(observer.address)
        assert top["leader"] is None or not top["leader"].startswith("obs/")
    finally:
        observer.stop()


async def test_a_duplicate_node_id_is_refused(cluster: list[BrokerProcess], tmp_path: Path) -> None:
    twin = BrokerProcess(tmp_path / "twin", log_url=cluster[0].log_url, node_id="node-2")
    try:
        with pytest.raises(RuntimeError, match="in use by a running broker"):
            twin.start(timeout=20)
        # Refused before it took in the cluster's state, not after a whole update.
        assert "join: index from" not in twin.output(), twin.output()
    finally:
        twin.stop()
    top = await topology(cluster[1].address)
    assert sorted(i["node_id"] for i in top["instances"]) == ["node-1", "node-2", "node-3"]


async def test_a_paused_broker_is_fenced_and_rejoins(cluster: list[BrokerProcess]) -> None:
    n1, n2, n3 = cluster
    total = 3000
    async with await clients.connect(n1.address) as conn:
        await conn.declare_queue("paused")
        await conn.publish_batch("paused", [b"%d" % i for i in range(total)])
    log, stop = Deliveries(), asyncio.Event()
    tasks = [
        asyncio.create_task(consume(n2.address, "paused", "c2", log, stop)),
        asyncio.create_task(consume(n3.address, "paused", "c3", log, stop)),
    ]
    await eventually(lambda: now(len(log.done)), "300 consumed", timeout=60, until=lambda n: n >= 300)
    view = (await topology(n1.address))["view"]
    log.fenced.add("c2")
    n2.pause()
    # While node-2 is stopped its consumer can do nothing; the view drops it.
    async def dropped() -> bool:
        t = await topology(n1.address)
        return "node-2" not in [i["node_id"] for i in t["instances"]]

    await eventually(dropped, "node-2 dropped from the view", timeout=15)
    # Its consumer's messages were released: it must count as gone for the check.
    log.lost("c2")
    # The fault, not a wait: node-2 stays stopped a while longer while node-3 goes on.
    await asyncio.sleep(1)
    n2.resume()

    async def rejoined() -> bool:
        t = await topology(n1.address)
        return [i["node_id"] for i in t["instances"]] == ["node-1", "node-3", "node-2"]

    await eventually(rejoined, "node-2 rejoined at the end", timeout=20)
    assert (await topology(n2.address))["view"] > view + 1
    await eventually(lambda: now(log.settled()), "every message consumed", timeout=90,
                     until=lambda n: n == total)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert log.violations == [], log.violations[:5]
    assert log.done | log.uncertain == set(range(total))
    # What the fenced consumer saw after the view dropped its broker, it could not ack
    # (its broker's Accept was fenced), so each of those went to a live consumer.
    late = {p: log.acked_by.get(p) for p in log.stale if log.acked_by.get(p) == "c2"}
    assert late == {}, late
    await equal_digests(cluster)
