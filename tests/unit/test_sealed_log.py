"""The sealed log's keys and records (docs/log-sealing.md): what opens, what does not,
rotation by the key file, and two nodes on one sealed log skipping a foreign writer's
records the same way."""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path

import pytest

from batonmq.cluster.codec import encode
from batonmq.cluster.errors import InvalidArgument, LogUnavailable
from batonmq.cluster.events import DeclareQueue, Enqueue, Origin
from batonmq.cluster.log import UNOPENED
from batonmq.cluster.log.memory import MemoryLog
from batonmq.cluster.log.sealed import KeyFile, KeyRing, SealedLog, log_context
from batonmq.cluster.node import Node
from batonmq.store.memory import MemoryStore
from tests.helpers import eventually, now


def secret(c: bytes) -> str:
    return base64.b64encode(c * 32).decode()


def write_keys(path: Path, *entries: str, context: str | None = None) -> str:
    head = f'context = "{context}"\n' if context is not None else ""
    path.write_text(head + "".join(entries))
    # A new mtime even on a coarse clock: the poll compares mtimes.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    return str(path)


def key(key_id: str, c: bytes, extra: str = "") -> str:
    return f'[[key]]\nid = "{key_id}"\nsecret = "{secret(c)}"\n{extra}'


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def sealed(inner: MemoryLog, path: str, clock: Clock | None = None) -> SealedLog:
    return SealedLog(inner, KeyFile(path, clock or Clock()))


def test_round_trip_and_record_format(tmp_path: Path) -> None:
    log = sealed(MemoryLog("orders"), write_keys(tmp_path / "k", key("k1", b"a")))
    records = log.seal([b"one", b"", b"three" * 100])
    assert all(r.startswith(b"\xc1S\x01\x02k1") for r in records)
    assert len({r[6:18] for r in records}) == 3  # a fresh nonce per record
    assert [log.open(r) for r in records] == [b"one", b"", b"three" * 100]


def test_what_does_not_open_is_unopened(tmp_path: Path) -> None:
    mine = sealed(MemoryLog("orders"), write_keys(tmp_path / "a", key("k1", b"a")))
    theirs = sealed(MemoryLog("orders"), write_keys(tmp_path / "b", key("k1", b"b")))
    other_log = sealed(MemoryLog("billing"), write_keys(tmp_path / "c", key("k1", b"a")))
    record = mine.seal([b"body"])[0]
    flipped = record[:-1] + bytes([record[-1] ^ 1])
    assert theirs.open(record) == UNOPENED  # same id, other secret
    assert other_log.open(record) == UNOPENED  # another log's context: no replay there
    for bad in (flipped, b"plain", b"", record[:20], b"\xc1S\x02" + record[3:]):
        assert mine.open(bad) == UNOPENED
    assert mine.unopened == 5 and theirs.unopened == 1


def test_context_from_the_key_file_wins(tmp_path: Path) -> None:
    path = write_keys(tmp_path / "k", key("k1", b"a"), context="prod")
    a, b = sealed(MemoryLog("x"), path), sealed(MemoryLog("y"), path)
    assert b.open(a.seal([b"m"])[0]) == b"m"
    assert log_context("kafka://h:1,h:2/topic-a?replication_factor=3") == "topic-a"
    assert log_context("file:/var/lib/baton/log/") == "log"


def test_rotation_by_not_before_and_not_after(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    path = write_keys(
        tmp_path / "k",
        key("old", b"o", "not_after = 3000\n"),
        key("new", b"n", "not_before = 2000\n"),
    )
    log = sealed(MemoryLog("q"), path, clock)
    first = log.seal([b"1"])[0]
    assert first[4:7] == b"old"
    clock.t = 2000.0
    second = log.seal([b"2"])[0]
    assert second[4:7] == b"new"
    assert [log.open(first), log.open(second)] == [b"1", b"2"]
    clock.t = 3000.0  # old retired: its records no longer open
    assert log.open(first) == UNOPENED and log.open(second) == b"2"


def test_no_key_may_seal_is_log_unavailable(tmp_path: Path) -> None:
    log = sealed(
        MemoryLog("q"), write_keys(tmp_path / "k", key("k", b"a", "not_before = 5e9\n"))
    )
    with pytest.raises(LogUnavailable, match="may seal now"):
        log.seal([b"x"])


def test_unknown_key_id_reads_the_file_again(tmp_path: Path) -> None:
    path_a = tmp_path / "a"
    a = sealed(MemoryLog("q"), write_keys(path_a, key("k1", b"a"), key("k2", b"b")))
    path_b = tmp_path / "b"
    b = sealed(MemoryLog("q"), write_keys(path_b, key("k1", b"a")))
    record = a.seal([b"new key"])[0]
    # b's file gets k2 a moment later; b has not polled yet (once a second at most).
    write_keys(path_b, key("k1", b"a"), key("k2", b"b"))
    assert b.open(record) == b"new key"


def test_an_edit_gone_bad_keeps_the_keys(tmp_path: Path) -> None:
    path = tmp_path / "k"
    log = sealed(MemoryLog("q"), write_keys(path, key("k1", b"a")))
    write_keys(path, "[[key]\nbroken")
    assert not log.keys.reload()
    assert log.open(log.seal([b"still"])[0]) == b"still"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "at least one"),
        ("[[key]\n", "not valid TOML"),
        ('colour = "red"\n', "unknown key"),
        ('[[key]]\nsecret = "' + secret(b"a") + '"\n', "id must be"),
        ('[[key]]\nid = "k"\n', "secret must be a base64"),
        ('[[key]]\nid = "k"\nsecret = "!!!"\n', "not base64"),
        ('[[key]]\nid = "k"\nsecret = "' + base64.b64encode(b"short").decode() + '"\n', "16 bytes"),
        (key("k", b"a", 'not_after = "soon"\n'), "not_after must be"),
        (key("k", b"a", "not_after = 2026-11-24T00:00:00\n"), "not_after must be"),
        (key("k", b"a", "size = 3\n"), "unknown field"),
        (key("k", b"a") + key("k", b"b"), "appears twice"),
    ],
)
def test_bad_key_files_are_invalid(text: str, complaint: str) -> None:
    with pytest.raises(InvalidArgument, match=complaint):
        KeyRing.parse(text)


def test_missing_key_file_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cannot read log key file"):
        KeyFile(str(tmp_path / "nope"))


async def test_nodes_skip_a_foreign_writers_records_alike(tmp_path: Path) -> None:
    """Two keyed nodes share a log; a writer with another key appends to it. Both
    count its records ``unopened`` at the same offsets, apply nothing of them, and go
    on applying the keyed records after them."""
    shared = MemoryLog("shared")
    path = write_keys(tmp_path / "k", key("k1", b"a"))
    nodes = [Node(n, SealedLog(shared, KeyFile(path)), MemoryStore()) for n in ("a", "b")]
    for node in nodes:
        await node.start()
    try:
        await nodes[0].submit(DeclareQueue("q"))
        intruder = SealedLog(shared, KeyFile(write_keys(tmp_path / "x", key("k1", b"x"))))
        forged = encode(Origin("a", nodes[0].runtime_id, 10_000, 0), Enqueue("q", ((b"evil", {}),)))
        await intruder.append([forged, forged])
        await shared.append([forged])  # not sealed at all
        await nodes[1].submit(Enqueue("q", ((b"good", {}),)))
        end = await shared.end_offset() - 1

        def caught_up() -> bool:
            return all(n.state.applied >= end for n in nodes)

        await eventually(lambda: now(caught_up()), "both nodes apply past the foreign records")
        for node in nodes:
            assert node.state.ignored.get("unopened") == 3
            assert node.state.queues["q"].ready == 1
        await eventually(  # heartbeats go on: compare the replicas at one offset
            lambda: now(nodes[0].state.applied == nodes[1].state.applied
                        and nodes[0].state.digest() == nodes[1].state.digest()),
            "equal digests at one offset",
        )
    finally:
        for node in nodes:
            await node.leave()
            await node.stop()
            node.store.close()
        await shared.close()


def test_records_of_ever_new_foreign_key_ids_do_not_reread_the_key_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Records naming thousands of key ids this broker does not have: the key file is
    read again (with its INFO line) only when it changed, not per record past the first
    1,024 ids; a key added to the file is still found at its first record."""
    path = write_keys(tmp_path / "k", key("k1", b"a"))
    mine = sealed(MemoryLog("orders"), path)
    record = mine.seal([b"body"])[0]
    assert record[3] == 2 and record[4:6] == b"k1"
    caplog.set_level(logging.INFO, logger="batonmq.cluster.log.sealed")
    rings = {id(mine.keys.ring)}
    for i in range(3000):
        foreign = b"\xc1S\x01\x05" + f"x{i:04x}".encode() + record[6:]
        assert mine.open(foreign) == UNOPENED
        rings.add(id(mine.keys.ring))
    assert len(rings) == 1  # never read again: the file did not change
    assert not [r for r in caplog.records if "read: keys" in r.getMessage()]
    # A key another broker's file got first: added here, found at its first record.
    write_keys(tmp_path / "k", key("k1", b"a"), key("k2", b"b"))
    theirs = sealed(MemoryLog("orders"), write_keys(tmp_path / "t", key("k2", b"b")))
    assert mine.open(theirs.seal([b"new key"])[0]) == b"new key"
    assert len([r for r in caplog.records if "read: keys" in r.getMessage()]) == 1
