"""The node driver on the reference store and the memory / file logs.

Not the pure core, so no fakes: the store is :class:`MemoryStore` (it passes the same
contract suite as the broker's RocksStore, tests/contract/test_store.py), closed and
reopened for a restart; the logs are real backends. Brokers restarting on RocksStore are
tests/integration/test_guarantees.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from batonmq.cluster.results import Declared, Enqueued
from batonmq.cluster.errors import InvalidArgument, LogUnavailable, QueueNotFound
from batonmq.cluster.events import Accept, Acquire, Candidate, DeclareQueue, Enqueue, Interest
from batonmq.cluster.log import open_log
from batonmq.cluster.log.memory import MemoryLog
from batonmq.cluster.node import Node
from batonmq.cluster.effects import Acquired, Effect
from batonmq.cluster.state import State
from batonmq.store.memory import MemoryStore


async def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait until ``check()`` holds, looking again every millisecond or so (the node
    runs meanwhile); fail the test if it does not within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.001)


async def _node(name: str, log_url: str, store: MemoryStore | None = None) -> Node:
    """A started node on ``store`` (a new one if None)."""
    log = await open_log(log_url)
    node = Node(name, log, store if store is not None else MemoryStore())
    await node.start()
    return node


def _reopen(node: Node) -> MemoryStore:
    """The store of a node that closed it, opened again (the broker restarts)."""
    assert isinstance(node.store, MemoryStore)
    return node.store.reopen()


async def _close(node: Node) -> None:
    await node.leave()
    await node.stop()
    await node.log.close()
    node.store.close()


async def test_commands_complete_with_results() -> None:
    node = await _node("a", "memory:")
    try:
        assert await node.submit(DeclareQueue("q")) == Declared(created=True)
        r = await node.submit(Enqueue("q", ((b"x", {"h": 1}), (b"y", {}))))
        assert r == Enqueued(first_position=0, count=2)
        with pytest.raises(QueueNotFound):
            await node.submit(Enqueue("missing", ((b"x", {}),)))
        msgs = node.store.get_messages(node.state.queues["q"].qid, [0, 1, 2])
        assert [m.body if m else None for m in msgs] == [b"x", b"y", None]
        assert msgs[0] is not None and msgs[0].headers == {"h": 1}
    finally:
        await _close(node)


async def test_an_event_written_but_not_readable_fails_its_command_and_nothing_else() -> None:
    """A record every replica skips as malformed (here a TTL the codec refuses, which
    only a caller bypassing the session's checks can submit) must fail its command at
    once: before, its future never resolved and the client waited forever."""
    node = await _node("a", "memory:")
    try:
        await node.submit(DeclareQueue("q"))
        with pytest.raises(InvalidArgument, match="cannot be applied.*ttls"):
            await asyncio.wait_for(node.submit(Enqueue("q", ((b"x", {}),), ttls=(-5,))), 10)
        assert node.state.ignored.get("malformed") == 1
        ok = await node.submit(Enqueue("q", ((b"y", {}),)))  # the next one is applied
        assert ok == Enqueued(first_position=0, count=1)
    finally:
        await _close(node)


async def test_restart_resumes_from_applied_offset(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'log'}"
    node = await _node("a", url)
    await node.submit(DeclareQueue("q"))
    for i in range(5):
        await node.submit(Enqueue("q", tuple((b"%d" % (i * 10 + j), {}) for j in range(10))))
    seen: list[Acquired] = []
    node.listener = lambda effects: seen.extend(e for e in effects if isinstance(e, Acquired))
    consumer = node.key + "/1"
    await node.submit(Interest("q", True))
    await node.submit(Acquire("q", consumer, 20))
    held = seen[0].positions
    await node.submit(Accept("q", consumer, tuple(held[:10])))
    digest, applied = node.state.digest(), node.state.applied
    await _close(node)

    store = _reopen(node)
    assert store.load().applied == node.state.applied  # where the next start resumes
    again = await _node("a", url, store)
    try:
        q = again.state.queues["q"]
        # Accepted messages stay gone; the 10 still held by the old runtime's
        # consumer came back, with a raised delivery count, when the view dropped
        # that runtime (it left cleanly, so at once).
        assert q.next_pos == 50 and len(q.acquired) == 0 and q.ready == 40
        assert q.counts == {p: 1 for p in held[10:]}
        assert again.state.applied > applied
        bodies = again.store.get_messages(q.qid, list(range(50)))
        assert [m is None for m in bodies[:10]] == [True] * 10
        assert all(m is not None for m in bodies[10:])
        assert digest != again.state.digest()  # the view change changed it
        assert again.state.membership.members == [again.key]
    finally:
        await _close(again)


async def test_two_replicas_on_one_log_have_equal_digests(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'log'}"
    a = await _node("a", url)
    b = await _node("b", url)
    try:
        await a.submit(DeclareQueue("q", delivery_limit=2))
        futs = [
            n.submit(Enqueue("q", ((b"m%d" % i, {}),))) for i in range(50) for n in (a, b)
        ]
        await asyncio.gather(*futs)
        assert a.state.membership.members == [a.key, b.key]  # new members at the end
        assert a.state.membership.leader() == a.key
        await b.submit(Interest("q", True))
        await b.submit(Acquire("q", b.key + "/1", 7))
        end = await a.log.end_offset()
        for n in (a, b):
            while n.state.applied < end - 1:
                await asyncio.wait_for(n.applied_event.wait(), 5)
        assert a.state.queues["q"].next_pos == 100
        await eventually(  # heartbeats go on: compare at one offset
            lambda: a.state.applied == b.state.applied and a.state.digest() == b.state.digest(),
            "equal digests at one offset",
        )
    finally:
        await _close(a)
        await _close(b)


async def test_effects_reach_the_listener_after_the_store() -> None:
    node = await _node("a", "memory:")
    try:
        bodies: list[bytes] = []

        def listener(effects: list[Effect]) -> None:
            for e in effects:
                if isinstance(e, Acquired):
                    for m in node.store.get_messages(e.qid, e.positions):
                        assert m is not None  # already written when the listener runs
                        bodies.append(m.body)

        node.listener = listener
        await node.submit(DeclareQueue("q"))
        # Enqueue and acquire land in one log batch: the body must still be readable.
        await node.submit(Interest("q", True))
        f1 = node.submit(Enqueue("q", ((b"same-batch", {}),)))
        f2 = node.submit(Acquire("q", node.key + "/1", 1))
        await asyncio.gather(f1, f2)
        assert bodies == [b"same-batch"]
    finally:
        await _close(node)


async def test_a_failing_log_read_is_retried_not_fatal() -> None:
    """A read error (here: the log fails its first read) stalls applying; the node
    reports unhealthy, retries from the applied offset, and completes the command."""
    log = await open_log("memory:")
    real_read = log.read
    calls = {"n": 0}

    def flaky_read(start: int, *, max_batch: int = 1024):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("disk went away")
        return real_read(start, max_batch=max_batch)

    log.read = flaky_read  # type: ignore[method-assign]
    node = Node("a", log, MemoryStore())
    await asyncio.wait_for(node.start(), 10)
    try:
        assert calls["n"] == 2 and node.healthy
        assert await node.submit(DeclareQueue("q")) == Declared(created=True)
    finally:
        await _close(node)


class _DownLog(MemoryLog):
    """A memory log whose appends fail with LogUnavailable while ``down`` (Kafka gone)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.failed = 0

    async def append(self, records: Sequence[bytes]) -> int:
        if self.down:
            self.failed += 1
            raise LogUnavailable("Kafka at 127.0.0.1:9 unreachable")
        return await super().append(records)


async def test_appends_wait_out_an_unavailable_log() -> None:
    """While the log cannot be written, commands wait in the outbox and are appended
    once it works again: confirmed late, not failed, and applied once."""
    log = _DownLog()
    node = Node("a", log, MemoryStore())
    await asyncio.wait_for(node.start(), 10)
    try:
        await node.submit(DeclareQueue("q"))
        log.down = True
        futs = [node.submit(Enqueue("q", ((b"m%d" % i, {}),))) for i in range(20)]
        await eventually(lambda: log.failed >= 3, "three failed appends")
        assert not any(f.done() for f in futs) and not node.healthy
        assert [r for _, _, r in node.store.outbox_load()]  # the publishes are kept
        log.down = False
        results = await asyncio.wait_for(asyncio.gather(*futs), 10)
        assert sorted(r.first_position for r in results) == list(range(20))
        assert node.state.queues["q"].next_pos == 20
        assert node.store.outbox_load() == []  # on the log now: no longer kept
    finally:
        await _close(node)


class _CountingStore(MemoryStore):
    """Counts the writes to the store's outbox."""

    outbox_writes = 0

    def outbox_put(self, runtime: str, records: list[tuple[int, bytes]]) -> None:
        self.outbox_writes += 1
        super().outbox_put(runtime, records)


async def test_publishes_are_kept_in_the_store_only_while_the_log_fails() -> None:
    """While appends work the store's outbox is not written (two store writes per
    append); from the first failed append on, the waiting publishes are kept."""
    log = _DownLog()
    store = _CountingStore()
    node = Node("a", log, store)
    await asyncio.wait_for(node.start(), 10)
    try:
        await node.submit(DeclareQueue("q"))
        for i in range(5):
            await node.submit(Enqueue("q", ((b"m%d" % i, {}),)))
        assert store.outbox_writes == 0
        log.down = True
        futs = [node.submit(Enqueue("q", ((b"w%d" % i, {}),))) for i in range(3)]
        await eventually(lambda: log.failed >= 2, "two failed appends")
        assert sorted(r for _, _, r in store.outbox_load())  # the waiting publishes are kept
        log.down = False
        await asyncio.wait_for(asyncio.gather(*futs), 10)
        assert store.outbox_load() == []
    finally:
        await _close(node)


async def test_a_full_outbox_refuses_at_once() -> None:
    log = _DownLog()
    node = Node("a", log, MemoryStore(), max_outbox=5)
    await asyncio.wait_for(node.start(), 10)
    try:
        await node.submit(DeclareQueue("q"))
        log.down = True
        futs = [node.submit(Enqueue("q", ((b"first", {}),)))]
        await eventually(lambda: log.failed >= 1, "a failed append")
        futs += [node.submit(Enqueue("q", ((b"m", {}),))) for _ in range(10)]
        refused = [f for f in futs if f.done()]
        assert refused and all(isinstance(f.exception(), LogUnavailable) for f in refused)
        assert "Kafka at 127.0.0.1:9 unreachable" in str(refused[-1].exception())
        log.down = False
        await asyncio.wait_for(asyncio.gather(*(f for f in futs if f not in refused)), 10)
    finally:
        await _close(node)


async def test_kept_publishes_are_published_at_the_next_start() -> None:
    """A broker dies while its publishes wait for the log: its next start publishes
    them (the clients got no confirm, so this is at-least-once for them)."""
    log = _DownLog()
    store = MemoryStore()
    node = Node("a", log, store, heartbeat_ms=50)
    await asyncio.wait_for(node.start(), 10)
    await node.submit(DeclareQueue("q"))
    log.down = True
    pending = [node.submit(Enqueue("q", ((b"kept-%d" % i, {}),))) for i in range(3)]
    await eventually(lambda: log.failed >= 2, "two failed appends")
    for t in node._tasks:  # the process dies: no leave, no stop
        t.cancel()
    await asyncio.gather(*node._tasks, return_exceptions=True)
    for f in pending:
        f.cancel()
    store.close()
    log.down = False

    again = Node("a", log, store.reopen(), heartbeat_ms=50)
    await asyncio.wait_for(again.start(), 20)
    try:
        while again.state.queues["q"].next_pos < 3:
            await asyncio.wait_for(again.applied_event.wait(), 5)
        q = again.state.queues["q"]
        bodies = [m.body for m in again.store.get_messages(q.qid, [0, 1, 2]) if m]
        assert sorted(bodies) == [b"kept-0", b"kept-1", b"kept-2"]
        # Once the outbox is empty every publish taken again is on the log; all of the
        # log applied, each kept publish was enqueued once.
        await eventually(lambda: again.store.outbox_load() == [], "the outbox emptied")
        end = await log.end_offset()
        await eventually(lambda: again.state.applied >= end - 1, f"offset {end - 1} applied")
        assert q.next_pos == 3
    finally:
        await _close(again)


async def test_publish_keys_survive_a_restart(tmp_path: Path) -> None:
    """The key memory is stored key by key; a re-sent publish after a restart of the
    broker is still recognised (and the forgotten keys leave the store)."""
    url = f"file:{tmp_path / 'log'}"
    node = Node("a", await open_log(url), MemoryStore())
    node.state.key_memory = 3
    await node.start()
    await node.submit(DeclareQueue("q"))
    for i in range(5):
        await node.submit(Enqueue("q", ((b"m%d" % i, {}),), ((f"k{i}", 1),)))
    await _close(node)
    store = _reopen(node)
    assert [e[2] for e in store.load().keys] == ["k2", "k3", "k4"]
    store.close()

    again = Node("a", await open_log(url), store.reopen())
    again.state.key_memory = 3
    await again.start()
    try:
        r = await again.submit(Enqueue("q", ((b"m4", {}),), (("k4", 1),)))
        assert r.first_position == 4 and again.state.queues["q"].next_pos == 5
    finally:
        await _close(again)


async def test_service_leadership_survives_a_restart(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'log'}"
    a = await _node("a", url)
    b = await _node("b", url)
    try:
        first = await a.submit(Candidate("svc", a.key))
        await b.submit(Candidate("svc", b.key + "/s1"))
        await b.submit(Candidate("other", b.key))
        assert first.leader == a.key
        await _close(b)
        # What the store kept is the service state b had applied when it stopped (docs/
        # design.md §9); taken after the close, as b may apply more records until then.
        kept = b.state.services.snapshot()
        store = _reopen(b)
        loaded = store.load()
        store.close()
        restored = State()
        assert loaded.meta is not None
        restored.restore_meta(loaded.meta)
        assert restored.services.snapshot() == kept
        assert restored.services.get("svc").candidates == [a.key, b.key + "/s1"]  # type: ignore[union-attr]

        b = await _node("b", url, store.reopen())
        end = await a.log.end_offset()
        for n in (a, b):
            while n.state.applied < end - 1:
                await asyncio.wait_for(n.applied_event.wait(), 5)
        # The old runtime left: its candidacies went with it, on both replicas.
        assert b.state.services.get("svc").candidates == [a.key]  # type: ignore[union-attr]
        assert b.state.services.get("other") is None
        # Heartbeats go on meanwhile: compare the replicas once both stand at one offset.
        await eventually(
            lambda: a.state.applied == b.state.applied and a.state.digest() == b.state.digest(),
            "equal digests at one offset",
        )
    finally:
        await _close(a)
        await _close(b)


async def test_a_corrupt_record_stops_applying_once_loudly_and_repair_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import struct

    from batonmq.cluster import applier as applier_mod
    from batonmq.cluster.codec import decode
    from batonmq.cluster.log import filecheck
    from tests.helpers import collect

    # Small segments: the damage is in an older one (in the last one, opening the log
    # fails at once, naming the same tools).
    url = f"file:{tmp_path / 'log'}?segment_bytes=256"
    node = await _node("a", url)
    await node.submit(DeclareQueue("q"))
    await node.submit(Enqueue("q", tuple((b"a%d" % i, {}) for i in range(10))))
    await node.submit(Interest("q", True))  # the record that will be damaged
    await node.submit(Enqueue("q", tuple((b"b%d" % i, {}) for i in range(10))))
    await node.submit(DeclareQueue("pad"))
    for _ in range(4):  # more segments after the damaged one
        await node.submit(Enqueue("pad", ((bytes(300), {}),)))
    await _close(node)
    log = await open_log(url)
    records = await collect(log, 0, await log.end_offset())
    await log.close()
    bad = next(o for o, r in records if isinstance(decode(r)[1], Interest))
    seg = [p for p in sorted((tmp_path / "log").glob("*.seg")) if int(p.stem) <= bad][-1]
    assert seg != sorted((tmp_path / "log").glob("*.seg"))[-1]
    data = bytearray(seg.read_bytes())
    pos = sum(16 + len(r) for o, r in records if int(seg.stem) <= o < bad)  # header: 16 bytes
    assert struct.unpack_from(">IQ", data, pos)[1] == bad
    data[pos + 16] ^= 0xFF  # a payload byte of the Interest record
    seg.write_bytes(bytes(data))

    # A broker replaying this log stops at the corrupt record: it says so once, names
    # the place and the tools, reports it, and does not retry in a loop.
    caplog.set_level(logging.CRITICAL, logger="baton.node")
    log = await open_log(url)
    reads: list[int] = []
    real_read = log.read

    def counting_read(start: int, **kw: int) -> object:
        reads.append(start)
        return real_read(start, **kw)

    monkeypatch.setattr(log, "read", counting_read)
    stuck = Node("b", log, MemoryStore(), join="replay")
    starting = asyncio.create_task(stuck.start())
    try:
        await eventually(lambda: bool(stuck.health.problem), "the corruption reported", 20)
        assert not stuck.healthy and f"offset {bad}" in stuck.health.problem
        assert stuck.state.applied == bad - 1
        # Time passing on purpose: nothing is retried within the recheck interval.
        await asyncio.sleep(1.5)
        assert len(reads) == 1 and applier_mod.CORRUPT_RECHECK_S >= 10
        critical = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
        assert len(critical) == 1, critical
        assert "baton log verify" in critical[0] and seg.name in critical[0]
    finally:
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await starting
        await stuck.stop()
        await log.close()

    done = filecheck.repair(str(tmp_path / "log"))
    assert done.placeholders == 1
    again = await _node("c", url)  # an empty store: replays from 0
    try:
        q = again.state.queues["q"]
        assert q.ready == 20 and q.next_pos == 20  # every confirmed message is kept
        assert again.state.ignored.get("malformed") == 1
        assert again.healthy and not again.health.problem
    finally:
        await _close(again)


async def test_appends_to_a_log_whose_last_segment_is_corrupt_fail_and_say_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import struct
    import zlib

    from batonmq.cluster.errors import LogCorrupt

    # Few heartbeats: the test appends the damaged records at the log's end itself.
    node = Node("a", await open_log(f"file:{tmp_path / 'log'}"), MemoryStore(),
                heartbeat_ms=20_000)
    await node.start()
    try:
        await node.submit(DeclareQueue("q"))
        end = await node.log.end_offset()
        # Another writer's batch, damaged on disk: a bad record with a valid one after it.
        bad = struct.pack(">IQI", 3, end, 12345) + b"abc"
        good = struct.pack(">IQI", 3, end + 1, zlib.crc32(b"def")) + b"def"
        seg = sorted((tmp_path / "log").glob("*.seg"))[-1]
        with seg.open("ab") as f:
            f.write(bad + good)
        caplog.set_level(logging.CRITICAL, logger="baton.node")
        for name in ("r", "s", "t"):
            with pytest.raises(LogCorrupt, match="baton log verify"):
                await asyncio.wait_for(node.submit(DeclareQueue(name)), 10)
        assert not node.healthy and "log corrupt" in node.health.problem
        appends = [r.getMessage() for r in caplog.records
                   if r.levelno == logging.CRITICAL and "cannot append" in r.getMessage()]
        assert len(appends) == 1, appends  # said once, not per failed command
    finally:
        await node.stop()
        await node.log.close()
        node.store.close()


@pytest.mark.parametrize("linger_us, appends", [(0, 2), (200_000, 1)])
async def test_append_linger_gathers_what_comes_meanwhile(linger_us: int, appends: int) -> None:
    """``append_linger_us``: the appender waits that long before taking a batch, so an
    event submitted meanwhile shares the first one's append."""
    node = Node("a", MemoryLog(), MemoryStore(), append_linger_us=linger_us)
    assert node.appender.linger_us == linger_us
    node.appender.linger_us = 0  # the declare alone: a linger would gather nothing
    await node.start()
    try:
        await node.submit(DeclareQueue("q"))
        node.appender.linger_us = linger_us
        took: list[float] = []
        node.appender.append_observer = took.append
        first = node.submit(Enqueue("q", ((b"1", {}),)))
        if linger_us:
            await asyncio.sleep(0.02)  # well inside the linger
        else:
            await asyncio.wait_for(asyncio.shield(first), 10)  # its append is done
        second = node.submit(Enqueue("q", ((b"2", {}),)))
        assert await asyncio.wait_for(asyncio.gather(first, second), 10) == [
            Enqueued(0, 1), Enqueued(1, 1)
        ]
        assert len(took) == appends
    finally:
        await _close(node)


async def test_a_linger_that_gathers_nothing_turns_lingering_off_for_a_while() -> None:
    """One command at a time: the next event waits for this one, so a linger only
    delays it. After one that gathered nothing, the appender appends at once (for
    LINGER_RETRY_S), then tries a linger again."""
    from batonmq.cluster import appender as appender_mod

    node = Node("a", MemoryLog(), MemoryStore(), append_linger_us=50_000)
    await node.start()
    try:
        await node.submit(DeclareQueue("q"))  # the first append tries a linger
        loop = asyncio.get_running_loop()
        retry_at = loop.time() + appender_mod.LINGER_RETRY_S  # (it was turned off before)
        tried = node.appender.lingers
        assert tried >= 1
        for i in range(5):  # one at a time, well within LINGER_RETRY_S of 0.5 s
            await node.submit(Enqueue("q", ((b"%d" % i, {}),)))
        assert node.appender.lingers == tried
        assert loop.time() < retry_at, "the test was too slow to show it"
        await eventually(lambda: loop.time() >= retry_at, "the time to try again", 5)
        await node.submit(Enqueue("q", ((b"again", {}),)))
        assert node.appender.lingers == tried + 1
    finally:
        await _close(node)
