"""Format versions and feature flags (cluster/features.py): the record formats, enabling a
flag only when every live runtime supports it, refusing runtimes that lack an enabled flag,
snapshots that say their format, and a record this build cannot read stopping the applier
loudly instead of being skipped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from batonmq.cluster import codec, snapshot
from batonmq.cluster.codec import EventEncoder, MalformedEvent, UnreadableRecord, decode
from batonmq.cluster.effects import Completed
from batonmq.cluster.errors import InvalidArgument, ShuttingDown
from batonmq.cluster.events import DeclareQueue, EnableFeatures, Enqueue, Heartbeat, Origin
from batonmq.cluster.features import ANNOUNCE, FEATURES, MAX_FORMAT, VERSION
from batonmq.cluster.log import open_log
from batonmq.cluster.node import Node
from batonmq.cluster.snapshot import FormatUnsupported
from batonmq.cluster.state import State
from batonmq.store.memory import MemoryStore
from tests.unit.test_membership import Cluster

ALL = tuple(FEATURES)
FLAGS = {ANNOUNCE: sorted(FEATURES)}


def test_the_build_version_is_the_package_version() -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'\nversion = "{VERSION}"\n' in pyproject
    changelog = (Path(__file__).resolve().parents[2] / "docs" / "changelog.md").read_text()
    assert f"## {VERSION}" in changelog, "every version has a changelog entry"
    for f in FEATURES.values():
        assert f.name in changelog, f"the changelog names the flag {f.name}"


# -- records ---------------------------------------------------------------------------------


def test_format_1_records_have_no_mark_and_later_ones_start_with_their_format() -> None:
    origin, event = Origin("n", "r", 7, 1234), DeclareQueue("q")
    v1 = EventEncoder(1).encode(origin, event)
    v2 = EventEncoder(2).encode(origin, event)
    assert msgpack.unpackb(v1)[0] == "n"  # what builds before feature flags write and read
    assert msgpack.unpackb(v2)[0] == 2
    assert decode(v1) == decode(v2) == (origin, event)
    beat = Heartbeat("voter", "addr", {})
    assert EventEncoder(2).encode(origin, beat) == EventEncoder(1).encode(origin, beat)


def test_a_format_above_this_build_s_or_an_unknown_op_code_is_unreadable_not_malformed() -> None:
    newer = msgpack.packb([MAX_FORMAT + 1, "n", "r", 1, 0, 1, "q"])
    with pytest.raises(UnreadableRecord, match=f"format {MAX_FORMAT + 1}"):
        decode(newer)
    unknown_op = msgpack.packb(["n", "r", 1, 0, 99])
    with pytest.raises(UnreadableRecord, match="op-code 99"):
        decode(unknown_op)
    with pytest.raises(UnreadableRecord, match="op-code 99"):
        decode(msgpack.packb([2, "n", "r", 1, 0, 99]))
    # Damage is still malformed (skipped alike everywhere): a mark below 2, a bad envelope.
    for bad in ([1, "n", "r", 1, 0, 1, "q"], [2, 5, "r", 1, 0, 1, "q"], [2, "n"]):
        with pytest.raises(MalformedEvent):
            decode(msgpack.packb(bad))


# -- enabling, in log order ------------------------------------------------------------------


def _beat(c: Cluster, who: str, flags: dict[str, Any] | None = FLAGS) -> Completed:
    done = c.apply(who, Heartbeat("voter", f"addr-{who}", dict(flags or {})))
    c.duties()
    return done


def test_a_flag_is_enabled_only_once_every_live_runtime_announces_it() -> None:
    c = Cluster()
    _beat(c, "a/1")
    _beat(c, "b/1", flags=None)  # a build from before feature flags
    assert c.state.membership.members == ["a/1", "b/1"]
    # An older replica of the same log cannot decode the record and skips it as malformed.
    old = Cluster()
    _beat(old, "a/1")
    _beat(old, "b/1", flags=None)
    applied = c.state.applied
    done = c.apply("a/1", EnableFeatures(ALL))
    assert isinstance(done.error, InvalidArgument) and "b/1" in str(done.error)
    assert not c.state.features.enabled
    old.seqs["a/1"] += 1
    old.offset += 1
    old.state.skip_malformed(old.offset)
    # Skipped as the older build skips it: the same counts and sequence numbers, so the
    # replicas keep one digest.
    assert c.state.ignored["malformed"] == 1 and c.state.applied == applied + 1
    assert c.state.digest() == old.state.digest()
    # b upgraded: its new runtime announces the flags; the old one is dropped.
    _beat(c, "b/2")
    for _ in range(7):
        _beat(c, "a/1")
        _beat(c, "b/2")
    assert "b/1" not in c.state.membership.members
    done = c.apply("a/1", EnableFeatures(ALL))
    assert done.error is None and done.result is not None
    assert done.result.enabled == list(ALL) and done.result.format == MAX_FORMAT
    assert set(c.state.features.enabled) == set(ALL) and c.state.features.format == MAX_FORMAT
    again = c.apply("a/1", EnableFeatures(ALL))
    assert again.error is None and again.result is not None and again.result.enabled == []


def test_a_member_lacking_a_flag_blocks_it_and_unknown_flags_are_refused() -> None:
    c = Cluster()
    _beat(c, "a/1")
    _beat(c, "b/1", flags={ANNOUNCE: []})  # a build with flags, but not this one's
    done = c.apply("a/1", EnableFeatures(ALL))
    assert isinstance(done.error, InvalidArgument)
    assert "b/1" in str(done.error) and ALL[0] in str(done.error)
    assert c.state.ignored["unsupported-feature"] == 1 and not c.state.features.enabled
    done = c.apply("a/1", EnableFeatures(("no_such_flag",)))
    assert isinstance(done.error, InvalidArgument) and "no_such_flag" in str(done.error)


def test_once_enabled_a_runtime_lacking_the_flag_is_refused_from_the_view() -> None:
    c = Cluster()
    _beat(c, "a/1")
    assert c.apply("a/1", EnableFeatures(ALL)).error is None
    _beat(c, "old/1", flags=None)
    _beat(c, "other/1", flags={ANNOUNCE: []})
    _beat(c, "new/1")
    ms = c.state.membership
    assert ms.members == ["a/1", "new/1"]
    for key in ("old/1", "other/1"):
        assert ALL[0] in ms.refused[key] and "upgrade" in ms.refused[key]
    assert "before 0.2.0" in ms.refused["old/1"]


# -- snapshots -------------------------------------------------------------------------------


def test_snapshots_keep_format_1_until_a_flag_is_enabled_then_say_their_format() -> None:
    c = Cluster()
    _beat(c, "a/1")
    meta = snapshot.meta_snapshot(c.state)
    assert len(meta) == 9  # what builds before feature flags write and read
    assert len(c.state.full_snapshot()[0]) == 10
    c.apply("a/1", EnableFeatures(ALL))
    meta = snapshot.meta_snapshot(c.state)
    assert len(meta) == 11 and meta[9] is None and meta[10][0] == MAX_FORMAT
    full = c.state.full_snapshot()
    assert full[0][9] is not None and full[0][10] == meta[10]  # the exchanges, then flags
    copy = State(6)
    copy.install(full)
    assert copy.features.enabled == c.state.features.enabled
    assert copy.digest() == c.state.digest()


def test_a_snapshot_with_a_flag_or_format_this_build_lacks_is_refused_naming_it() -> None:
    c = Cluster()
    _beat(c, "a/1")
    c.apply("a/1", EnableFeatures(ALL))
    meta = snapshot.meta_snapshot(c.state)
    newer = meta[:10] + [[MAX_FORMAT, meta[10][1] + [["from_the_future", 99]]]]
    with pytest.raises(FormatUnsupported, match="from_the_future"):
        State(6).restore_meta(newer)
    later = meta[:10] + [[MAX_FORMAT + 1, meta[10][1]]]
    with pytest.raises(FormatUnsupported, match=f"format {MAX_FORMAT + 1}"):
        State(6).restore_meta(later)


# -- the node: a new cluster, announcing, and what it cannot read ------------------------------


async def _until(check: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def _started(url: str, announce: list[str] | None = None) -> AsyncIterator[Node]:
    """A started node on the file log at ``url`` (announcing ``announce``, if given, as
    its build's flags); stopped, with its log closed, at the end."""
    log = await open_log(url)
    node = Node("a", log, MemoryStore())
    if announce is not None:
        node.properties[ANNOUNCE] = announce
    try:
        await node.start()
        yield node
    finally:
        await node.stop()
        await log.close()


async def test_a_new_cluster_enables_every_flag_and_writes_the_new_format(tmp_path: Path) -> None:
    async with _started(f"file:{tmp_path / 'log'}") as node:
        log = node.log
        await _until(lambda: set(node.state.features.enabled) == set(ALL), "flags enabled")
        await node.submit(DeclareQueue("q"))
        end = await log.end_offset()
        records: list[tuple[int, bytes]] = []
        async for batch in log.read(0):
            records += batch
            if records[-1][0] >= end - 1:
                break
        firsts = {type(decode(r)[1]).__name__: msgpack.unpackb(r)[0] for _, r in records}
        assert firsts["DeclareQueue"] == MAX_FORMAT
        # Heartbeats stay in format 1, so that a broker of any build sees who is alive.
        assert firsts["Heartbeat"] == "a"
        assert node.store.get_ident("format") == str(MAX_FORMAT)


async def test_a_record_this_build_cannot_read_stops_applying_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"file:{tmp_path / 'log'}"
    async with _started(url) as node:
        await node.submit(DeclareQueue("q"))
        writer = await open_log(url)
        bad = msgpack.packb([MAX_FORMAT, "z", "r", 1, 0, 99, "from a newer build"])
        first = await writer.append([
            codec.encode(Origin("z", "r0", 1, 0), Heartbeat("voter", "x", {})),
            bad,
            codec.encode(Origin("z", "r0", 2, 0), Heartbeat("voter", "x", {})),
        ])
        await writer.close()
        await _until(lambda: node.applier.unreadable is not None, "applying stopped")
        assert node.applier.unreadable is not None
        assert node.applier.unreadable[0] == first + 1
        assert node.state.applied == first  # the record before it, not past it
        assert not node.healthy and "cannot read" in node.health.problem
        crit = [r for r in caplog.records if r.levelno == logging.CRITICAL]
        assert len(crit) == 1 and f"offset {first + 1}" in crit[0].getMessage()
        assert "malformed" not in node.state.ignored  # never skipped
        with pytest.raises(ShuttingDown, match="cannot read"):
            await node.submit(Enqueue("q", ((b"x", {}),)))


async def test_a_flag_this_build_does_not_know_enabled_by_the_rule_stops_applying(
    tmp_path: Path,
) -> None:
    """Every live runtime announces a flag this build lacks (here, this node itself claims
    a newer build's flag): the rule enables it on every replica that knows it, so one that
    does not must stop before the record, not go on without it."""
    newer = sorted(FEATURES) + ["from_a_newer_build"]
    async with _started(f"file:{tmp_path / 'log'}", announce=newer) as node:
        await _until(lambda: bool(node.state.features.enabled), "this build's flags enabled")
        await _until(
            lambda: "from_a_newer_build" in (node.state.supported(node.key) or ()),
            "the newer flag announced",
        )
        fut = node.submit(EnableFeatures(("from_a_newer_build",)))
        await _until(lambda: node.applier.unreadable is not None, "applying stopped")
        assert node.applier.unreadable is not None
        assert "from_a_newer_build" in node.applier.unreadable[1]
        assert "from_a_newer_build" not in node.state.features.enabled
        with pytest.raises(ShuttingDown):
            await fut


async def test_a_restart_on_a_store_an_older_build_wrote_after_a_flag_starts_again_as_new(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"file:{tmp_path / 'log'}"
    log = await open_log(url)
    node = Node("a", log, MemoryStore())
    await node.start()
    await _until(lambda: bool(node.state.features.enabled), "flags enabled")
    await node.submit(DeclareQueue("q"))
    await node.stop()
    await log.close()
    store = node.store
    assert isinstance(store, MemoryStore)
    store.close()
    store = store.reopen()
    # A build from before flags ran here meanwhile: it rewrote the meta snapshot in
    # format 1 (it cannot keep what it does not know) and left the format mark.
    loaded = store.load()
    assert loaded.meta is not None and len(loaded.meta) == 11
    batch = store.batch()
    batch.put_meta(loaded.meta[:9])
    store.commit(batch, loaded.applied)
    log = await open_log(url)
    again = Node("a", log, store)
    try:
        with caplog.at_level(logging.WARNING):
            await again.start()
        assert any("starts again as a new broker" in r.getMessage()
                   and f"cannot read format {MAX_FORMAT}" in r.getMessage() for r in caplog.records)
        # It replayed the log (no other member): the flags and the queue are back.
        assert set(again.state.features.enabled) == set(ALL) and "q" in again.state.queues
    finally:
        await again.stop()
        await log.close()


def test_a_store_of_a_newer_format_is_refused_with_a_clear_line() -> None:
    store = MemoryStore()
    store.put_ident("format", str(MAX_FORMAT + 1))

    async def start() -> None:
        log = await open_log("memory:")
        try:
            await Node("a", log, store).start(timeout=2)
        finally:
            await log.close()

    with pytest.raises(FormatUnsupported, match=f"format {MAX_FORMAT + 1}.*downgrade"):
        asyncio.run(start())
