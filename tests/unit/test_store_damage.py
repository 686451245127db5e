"""A damaged rocksdict store is found at open and set aside, never served from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batonmq.cluster.errors import StoreCorrupt
from batonmq.store.rocks import RocksStore


def _filled(path: Path, n: int = 20_000) -> None:
    """A store with ``n`` messages in SST files (closed: flushed)."""
    store = RocksStore(str(path))
    store.put_ident("node_id", "node-7")
    batch = store.batch()
    batch.put_messages(1, 0, tuple((os.urandom(100), {}) for _ in range(n)), 1, 1)
    store.commit(batch, 41)
    store.close()


def _sst(path: Path) -> Path:
    ssts = sorted(path.glob("*.sst"), key=lambda p: p.stat().st_mtime)
    assert ssts, list(path.iterdir())
    return ssts[-1]


def test_a_whole_store_opens_checked_in_place(tmp_path: Path) -> None:
    _filled(tmp_path / "store")
    opened = RocksStore.open_checked(str(tmp_path / "store"))
    try:
        assert opened.damaged is None and opened.reason == ""
        assert opened.store.load().applied == 41
        assert opened.store.verify() > 20_000
    finally:
        opened.store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_flipped_bytes_in_an_sst_are_found_and_the_store_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _filled(path)
    sst = _sst(path)
    size = sst.stat().st_size
    with open(sst, "r+b") as f:
        f.seek(size // 2)
        chunk = f.read(16)
        f.seek(size // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))

    # A plain open does not notice (the block is read later) ...
    plain = RocksStore(str(path))
    try:
        with pytest.raises(StoreCorrupt, match="checksum"):
            plain.verify()
    finally:
        plain.close(flush=False)

    # ... the checked open reads everything once, and moves the store aside.
    opened = RocksStore.open_checked(str(path))
    try:
        assert opened.damaged is not None and "checksum" in opened.reason
        assert Path(opened.damaged).name.startswith("store.damaged-")
        assert (Path(opened.damaged) / sst.name).exists()  # kept for a post-mortem
        assert opened.node_id == "node-7"  # read through a block that passed its checksum
        fresh = opened.store.load()
        assert fresh.applied == -1 and not fresh.queues  # empty: the broker joins afresh
        assert opened.store.verify() == 0
    finally:
        opened.store.close()


def test_a_truncated_sst_fails_the_open_and_the_store_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _filled(path)
    sst = _sst(path)
    with open(sst, "r+b") as f:
        f.truncate(sst.stat().st_size // 3)

    with pytest.raises(StoreCorrupt):
        RocksStore(str(path))
    opened = RocksStore.open_checked(str(path))
    try:
        assert opened.damaged is not None and opened.node_id is None
        assert opened.store.load().applied == -1
    finally:
        opened.store.close()
    assert len(list(tmp_path.glob("store.damaged-*"))) == 1


def test_damage_in_the_block_of_the_node_id_is_set_aside_without_it(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _filled(path)
    sst = _sst(path)
    with open(sst, "r+b") as f:  # the first data block: "a" (applied) and "i" (identity)
        f.seek(40)
        chunk = f.read(16)
        f.seek(40)
        f.write(bytes(b ^ 0xFF for b in chunk))
    plain = RocksStore(str(path))
    try:
        with pytest.raises(StoreCorrupt):
            plain.get_ident("node_id")
    finally:
        plain.close(flush=False)
    opened = RocksStore.open_checked(str(path))
    try:
        assert opened.damaged is not None and opened.node_id is None
        assert opened.store.load().applied == -1
    finally:
        opened.store.close()


def test_a_damaged_store_whose_close_fails_is_still_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # RocksDB can fail the close of a damaged database too (e.g. flushing over a broken
    # file): the broker must still set it aside and start afresh, not stop on the error.
    path = tmp_path / "store"
    _filled(path)
    sst = _sst(path)
    with open(sst, "r+b") as f:
        f.seek(sst.stat().st_size // 2)
        f.write(b"\xff" * 16)
    real_close = RocksStore.close

    def failing_close(self: RocksStore, flush: bool = True) -> None:
        real_close(self, flush)
        if Path(self.path) == path and not flush:
            raise RuntimeError("Corruption: block checksum mismatch")

    monkeypatch.setattr(RocksStore, "close", failing_close)
    opened = RocksStore.open_checked(str(path))
    try:
        assert opened.damaged is not None and (Path(opened.damaged) / sst.name).exists()
        assert opened.store.load().applied == -1
    finally:
        opened.store.close()
