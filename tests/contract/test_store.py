"""The store's conformance suite (docs/design.md §9): every backend passes all of it.

Adding a backend is one subclass of :class:`StoreContract` that says how to open a fresh
store at a place (``make``) and how to open it again there after ``close`` (``restart``,
a broker's restart).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from batonmq.cluster.errors import StoreError
from batonmq.store import Loaded, Store, StoredMessage, merge_headers
from batonmq.store.memory import MemoryStore
from batonmq.store.rocks import RocksStore

Q, OTHER = 7, 8  # queue ids


def put(store: Store, qid: int, first: int, bodies: list[bytes], *, applied: int,
        enqueued_at: int = 100, publish_time: int = 50, headers: dict[str, Any] | None = None) -> None:
    """Commit one batch storing ``bodies`` at first, first+1, ..."""
    batch = store.batch()
    batch.put_messages(qid, first, tuple((b, dict(headers or {})) for b in bodies), enqueued_at, publish_time)
    store.commit(batch, applied)


def bodies(store: Store, qid: int, positions: list[int]) -> list[bytes | None]:
    return [m.body if m else None for m in store.get_messages(qid, positions)]


def record(body: bytes, headers: dict[str, Any], enqueued_at: int, publish_time: int) -> bytes:
    """A message in the stores' shared encoding (what a joiner receives from a member)."""
    return msgpack.packb((enqueued_at, publish_time, headers, body), use_bin_type=True)


class StoreContract:
    """The behaviour every backend must have. Subclasses provide ``make`` and ``restart``."""

    def make(self, where: Path) -> Store:
        """Open the store living at ``where`` (a fresh one the first time)."""
        raise NotImplementedError

    def restart(self, closed: Store, where: Path) -> Store:
        """The store at ``where`` opened again after ``closed`` (its last opening) closed."""
        raise NotImplementedError

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Store]:
        opened = self.make(tmp_path)
        yield opened
        opened.close()

    # ---- batches and the applied offset ----

    def test_a_new_store_is_empty(self, store: Store) -> None:
        assert store.load() == Loaded(applied=-1, meta=None, queues={}, keys=[])
        assert store.outbox_load() == []
        assert store.get_ident("node") is None
        assert store.get_messages(Q, [0, 1]) == [None, None]
        assert store.scan(Q, 0, 10) == []
        assert store.read_range(Q, 0, 10, 10, 1 << 20) == []

    def test_commit_writes_the_batch_with_its_applied_offset(self, store: Store) -> None:
        batch = store.batch()
        batch.put_messages(Q, 3, ((b"a", {"h": 1}), (b"b", {})), 1000, 900)
        batch.put_queue("q", [Q, 5, [1, 2]])
        batch.put_meta(["meta", 1])
        batch.put_keys([(1, Q, "k1", 3, 9000)], range(0))
        # Nothing of the batch is visible before its commit.
        assert store.get_messages(Q, [3, 4]) == [None, None]
        assert store.load() == Loaded()
        store.commit(batch, 41)
        a, b = store.get_messages(Q, [3, 4])
        assert a is not None and b is not None
        assert (a.body, a.headers, a.enqueued_at, a.publish_time) == (b"a", {"h": 1}, 1000, 900)
        assert (b.body, b.headers, b.enqueued_at, b.publish_time) == (b"b", {}, 1000, 900)
        assert store.load() == Loaded(applied=41, meta=["meta", 1], queues={"q": [Q, 5, [1, 2]]},
                                      keys=[(1, Q, "k1", 3, 9000)])

    def test_each_commit_sets_the_applied_offset(self, store: Store) -> None:
        put(store, Q, 0, [b"x"], applied=5)
        store.commit(store.batch(), 6)  # an empty batch still moves the offset
        assert store.load().applied == 6
        put(store, Q, 1, [b"y"], applied=9)
        assert store.load().applied == 9
        assert bodies(store, Q, [0, 1]) == [b"x", b"y"]

    def test_an_uncommitted_batch_changes_nothing(self, store: Store) -> None:
        put(store, Q, 0, [b"kept"], applied=1)
        dropped = store.batch()
        dropped.put_messages(Q, 1, ((b"lost", {}),), 1, 1)
        dropped.remove(Q, [0])
        dropped.put_meta(["lost"])
        put(store, Q, 2, [b"later"], applied=2)
        assert bodies(store, Q, [0, 1, 2]) == [b"kept", None, b"later"]
        assert store.load() == Loaded(applied=2)

    def test_a_batch_takes_effect_in_the_order_of_its_changes(self, store: Store) -> None:
        put(store, Q, 0, [b"p0", b"p1", b"p2", b"p3"], applied=0)
        batch = store.batch()
        batch.put_messages(Q, 10, ((b"put-then-removed", {}),), 1, 1)
        batch.remove(Q, [10])
        batch.remove(Q, [0])
        batch.put_messages(Q, 0, ((b"removed-then-put", {}),), 1, 1)
        batch.remove_range(Q, 1, 3)
        batch.put_messages(Q, 2, ((b"range-then-put", {}),), 1, 1)
        batch.put_messages(Q, 3, ((b"replaced", {}),), 1, 1)
        batch.put_queue("q", ["first"])
        batch.put_queue("q", None)
        batch.put_queue("r", None)
        batch.put_queue("r", ["second"])
        store.commit(batch, 1)
        assert bodies(store, Q, [0, 1, 2, 3, 10]) == [b"removed-then-put", None, b"range-then-put", b"replaced", None]
        assert store.load().queues == {"r": ["second"]}

    # ---- restart ----

    def test_what_was_committed_survives_a_restart(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        batch = store.batch()
        batch.put_messages(Q, 0, ((b"a", {"h": "v"}), (b"b", {})), 10, 9)
        batch.put_queue("q", [Q, {"1": 2}])
        batch.put_meta([1, 2, 3])
        batch.put_keys([(4, Q, "k4", 0, -1), (5, Q, "k5", 1, -1)], range(0))
        store.commit(batch, 12)
        store.outbox_put("r1", [(1, b"rec-1"), (2, b"rec-2")])
        store.put_ident("node", "n1")
        lost = store.batch()  # never committed: gone with the process
        lost.put_messages(Q, 2, ((b"lost", {}),), 10, 9)
        loaded = store.load()
        store.close()

        again = self.restart(store, tmp_path)
        try:
            assert again.load() == loaded
            assert loaded == Loaded(applied=12, meta=[1, 2, 3], queues={"q": [Q, {"1": 2}]},
                                    keys=[(4, Q, "k4", 0, -1), (5, Q, "k5", 1, -1)])
            msgs = again.get_messages(Q, [0, 1, 2])
            assert [(m.body, m.headers, m.enqueued_at, m.publish_time) if m else None for m in msgs] == [
                (b"a", {"h": "v"}, 10, 9), (b"b", {}, 10, 9), None]
            assert again.outbox_load() == [("r1", 1, b"rec-1"), ("r1", 2, b"rec-2")]
            assert again.get_ident("node") == "n1"
            put(again, Q, 2, [b"after"], applied=13)  # and it goes on from there
            assert again.load().applied == 13 and bodies(again, Q, [2]) == [b"after"]
        finally:
            again.close()

    # ---- messages ----

    def test_remove_forgets_those_positions_only(self, store: Store) -> None:
        put(store, Q, 0, [b"0", b"1", b"2", b"3"], applied=0)
        put(store, OTHER, 0, [b"other"], applied=1)
        batch = store.batch()
        batch.remove(Q, [1, 3, 99])  # 99 holds nothing: ignored
        store.commit(batch, 2)
        assert bodies(store, Q, [0, 1, 2, 3]) == [b"0", None, b"2", None]
        assert bodies(store, OTHER, [0]) == [b"other"]

    def test_remove_range_forgets_lo_up_to_hi(self, store: Store) -> None:
        put(store, Q, 0, [b"%d" % i for i in range(8)], applied=0)
        put(store, OTHER, 0, [b"o%d" % i for i in range(8)], applied=1)
        batch = store.batch()
        batch.remove_range(Q, 2, 5)
        store.commit(batch, 2)
        assert bodies(store, Q, list(range(8))) == [b"0", b"1", None, None, None, b"5", b"6", b"7"]
        assert None not in bodies(store, OTHER, list(range(8)))

    def test_remove_range_in_a_batch_covers_its_own_puts(self, store: Store) -> None:
        batch = store.batch()
        batch.put_messages(Q, 0, tuple((b"%d" % i, {}) for i in range(4)), 1, 1)
        batch.remove_range(Q, 1, 3)
        store.commit(batch, 0)
        assert bodies(store, Q, [0, 1, 2, 3]) == [b"0", None, None, b"3"]

    def test_move_merges_headers_and_resets_the_enqueue_time(self, store: Store) -> None:
        put(store, Q, 4, [b"body"], applied=0, enqueued_at=100, publish_time=50,
            headers={"keep": 1, "over": "old"})
        batch = store.batch()
        assert batch.move(Q, 4, OTHER, 0, {"over": "new", "x-death": 1}, 200) is True
        store.commit(batch, 1)
        assert store.get_messages(Q, [4]) == [None]
        (moved,) = store.get_messages(OTHER, [0])
        assert moved is not None
        assert moved.body == b"body" and moved.publish_time == 50 and moved.enqueued_at == 200
        assert moved.headers == {"keep": 1, "over": "new", "x-death": 1}

    def test_move_with_keep_copies_and_a_last_move_takes_the_source(self, store: Store) -> None:
        put(store, Q, 2, [b"body"], applied=0, enqueued_at=100, publish_time=50,
            headers={"h": 0})
        batch = store.batch()
        # A dead letter routed to three queues: two copies, then the move.
        assert batch.move(Q, 2, OTHER, 0, {"x": 1}, 200, keep=True) is True
        assert batch.move(Q, 2, OTHER, 1, {"x": 1}, 200, keep=True) is True
        assert batch.move(Q, 2, Q, 7, {"x": 1}, 200) is True
        store.commit(batch, 1)
        assert bodies(store, Q, [2, 7]) == [None, b"body"]
        assert bodies(store, OTHER, [0, 1]) == [b"body", b"body"]
        for m in store.get_messages(OTHER, [0, 1]) + store.get_messages(Q, [7]):
            assert m is not None and m.headers == {"h": 0, "x": 1} and m.enqueued_at == 200
        # A copy of a message put in the same batch, which stays where it is.
        batch = store.batch()
        batch.put_messages(Q, 10, ((b"fresh", {}),), 1, 1)
        assert batch.move(Q, 10, OTHER, 5, {}, 3, keep=True) is True
        assert batch.move(Q, 11, OTHER, 6, {}, 3, keep=True) is False  # none there
        store.commit(batch, 2)
        assert bodies(store, Q, [10]) == [b"fresh"] and bodies(store, OTHER, [5, 6]) == [b"fresh", None]

    def test_move_sets_defaults_only_where_the_message_has_no_such_header(
        self, store: Store
    ) -> None:
        put(store, Q, 0, [b"once", b"twice"], applied=0)
        batch = store.batch()
        first = {"x-first": "a", "x-other": 1}
        assert batch.move(Q, 0, OTHER, 0, {"x-last": "a"}, 5, defaults=first) is True
        store.commit(batch, 1)
        batch = store.batch()  # moved on again: its first header stays, the last one moves
        assert batch.move(OTHER, 0, Q, 7, {"x-last": "b"}, 6, defaults={"x-first": "b"}) is True
        store.commit(batch, 2)
        (m,) = store.get_messages(Q, [7])
        assert m is not None and m.headers == {"x-first": "a", "x-other": 1, "x-last": "b"}

    def test_move_finds_a_message_put_in_the_same_batch(self, store: Store) -> None:
        batch = store.batch()
        batch.put_messages(Q, 0, ((b"fresh", {"a": 1}),), 100, 50)
        assert batch.move(Q, 0, OTHER, 3, {"b": 2}, 300) is True
        assert batch.move(OTHER, 3, Q, 9, {}, 400) is True  # moved on again
        store.commit(batch, 0)
        assert bodies(store, Q, [0, 9]) == [None, b"fresh"]
        assert store.get_messages(OTHER, [3]) == [None]
        (m,) = store.get_messages(Q, [9])
        assert m is not None and m.headers == {"a": 1, "b": 2} and m.enqueued_at == 400

    def test_move_of_a_missing_message_returns_false_and_writes_nothing(self, store: Store) -> None:
        put(store, Q, 0, [b"only"], applied=0)
        batch = store.batch()
        assert batch.move(Q, 5, OTHER, 0, {"h": 1}, 1) is False
        removed = store.batch()
        removed.remove(Q, [0])
        assert removed.move(Q, 0, OTHER, 1, {}, 1) is False  # removed earlier in the batch
        store.commit(batch, 1)
        store.commit(removed, 2)
        assert store.get_messages(OTHER, [0, 1]) == [None, None]
        assert store.scan(OTHER, 0, 10) == []

    def test_put_raw_stores_a_record_of_another_store(self, store: Store, tmp_path: Path) -> None:
        put(store, Q, 0, [b"donor"], applied=0, enqueued_at=11, publish_time=10, headers={"h": 1})
        reader = store.reader()
        raw = reader.get_raw(Q, 0)
        reader.close()
        assert raw is not None
        assert raw == record(b"donor", {"h": 1}, 11, 10)  # the one encoding of every backend
        joiner = self.make(tmp_path / "joiner")
        try:
            batch = joiner.batch()
            batch.put_raw(Q, 0, raw)
            batch.put_raw(OTHER, 6, merge_headers(raw, {"x": 2}, 20))
            joiner.commit(batch, 0)
            assert joiner.get_messages(Q, [0]) == store.get_messages(Q, [0])
            (m,) = joiner.get_messages(OTHER, [6])
            assert m == StoredMessage(b"donor", {"h": 1, "x": 2}, 10, 20, len(record(b"donor", {"h": 1, "x": 2}, 20, 10)))
        finally:
            joiner.close()

    def test_drop_queue_forgets_every_message_of_that_queue(self, store: Store) -> None:
        far = 1 << 40
        for qid in (Q - 1, Q, Q + 1):
            put(store, qid, 0, [b"a", b"b"], applied=qid)
            put(store, qid, far, [b"far"], applied=qid)
        batch = store.batch()
        batch.put_messages(Q, 5, ((b"same batch", {}),), 1, 1)
        batch.drop_queue(Q)
        store.commit(batch, 20)
        assert store.get_messages(Q, [0, 1, 5, far]) == [None] * 4
        assert store.scan(Q, 0, 10) == []
        for qid in (Q - 1, Q + 1):
            assert bodies(store, qid, [0, 1, far]) == [b"a", b"b", b"far"]

    # ---- snapshots and publish keys ----

    def test_the_exchanges_snapshot_is_kept_apart_and_replaced(self, store: Store) -> None:
        assert store.load().exchanges is None
        batch = store.batch()
        batch.put_meta([1])
        batch.put_exchanges([["x", "fanout", True, False, False, {"a": 1}, "n/r", [["q", "", {}]]]])
        store.commit(batch, 0)
        batch = store.batch()
        batch.put_meta([2])  # a batch that does not change the exchanges
        store.commit(batch, 1)
        loaded = store.load()
        assert loaded.meta == [2]
        assert loaded.exchanges == [["x", "fanout", True, False, False, {"a": 1}, "n/r", [["q", "", {}]]]]
        batch = store.batch()
        batch.put_exchanges([])
        store.commit(batch, 2)
        assert store.load().exchanges == []
        store.reset()
        assert store.load().exchanges is None

    def test_queue_and_meta_snapshots_are_replaced_and_deleted(self, store: Store) -> None:
        batch = store.batch()
        batch.put_queue("a", [1, (2, 3), {4: "int key"}])
        batch.put_queue("b", ["b1"])
        batch.put_queue("é/ü", ["unicode"])
        batch.put_meta(["m1"])
        store.commit(batch, 0)
        # Saved as msgpack: a tuple comes back a list, an int map key stays an int.
        assert store.load().queues == {"a": [1, [2, 3], {4: "int key"}], "b": ["b1"], "é/ü": ["unicode"]}
        batch = store.batch()
        batch.put_queue("a", None)
        batch.put_queue("b", ["b2"])
        batch.put_queue("never", None)
        batch.put_meta(["m2"])
        store.commit(batch, 1)
        loaded = store.load()
        assert loaded.queues == {"b": ["b2"], "é/ü": ["unicode"]}
        assert loaded.meta == ["m2"]

    def test_many_batches_of_keys_and_a_moving_floor_load_as_the_memory_holds_them(
        self, tmp_path: Path
    ) -> None:
        """As the applier uses it: each commit stores the keys remembered since the last
        one and forgets those below the memory's floor (in seq order, through many
        blocks); a restart loads exactly the keys at and above the floor."""
        import random

        rng = random.Random(5)
        store = self.make(tmp_path)
        seq = floor = 0
        kept: dict[int, tuple[int, int, str, int, int]] = {}
        for offset in range(300):
            new = []
            for _ in range(rng.randrange(0, 120)):
                new.append((seq, seq % 3, f"{seq:016x}:{seq + 1:x}", seq, 1000 + seq))
                seq += 1
            new_floor = max(floor, seq - rng.randrange(500, 9000))
            batch = store.batch()
            batch.put_keys(new, range(floor, new_floor))
            store.commit(batch, offset)
            kept.update((e[0], e) for e in new)
            for s in range(floor, new_floor):
                kept.pop(s, None)
            floor = new_floor
        assert floor > 2 * 4096  # the floor passed many blocks
        expected = [kept[s] for s in sorted(kept)]
        assert store.load().keys == expected
        store.close()
        again = self.restart(store, tmp_path)
        try:
            assert again.load().keys == expected
        finally:
            again.close()

    def test_publish_keys_are_kept_in_seq_order_until_forgotten(self, store: Store) -> None:
        batch = store.batch()
        batch.put_keys(
            [(300, Q, "k300", 9, 5000), (2, Q, "k2", 1, -1), (1 << 33, OTHER, "big", 0, 7)],
            range(0),
        )
        batch.put_keys([(1, Q, "k1", 0, 4000)], range(0))
        store.commit(batch, 0)
        assert store.load().keys == [
            (1, Q, "k1", 0, 4000), (2, Q, "k2", 1, -1), (300, Q, "k300", 9, 5000),
            (1 << 33, OTHER, "big", 0, 7),
        ]
        batch = store.batch()
        # k3 is saved and forgotten in one call: forgotten. k300 is kept (outside the range).
        batch.put_keys([(3, Q, "k3", 2, 1), (301, Q, "k301", 10, 1)], range(0, 4))
        store.commit(batch, 1)
        assert store.load().keys == [
            (300, Q, "k300", 9, 5000), (301, Q, "k301", 10, 1), (1 << 33, OTHER, "big", 0, 7),
        ]

    # ---- outbox and identity ----

    def test_outbox_put_remove_load(self, store: Store) -> None:
        store.outbox_put("r1", [(3, b"r1-3"), (1, b"r1-1")])
        store.outbox_put("r2", [(1, b"r2-1")])
        store.outbox_put("r1", [(2, b"r1-2"), (1 << 40, b"r1-big")])
        store.outbox_put("r1", [(3, b"r1-3 again")])  # a kept seq is replaced
        store.outbox_put("r1", [])
        by_runtime: dict[str, list[tuple[int, bytes]]] = {}
        for runtime, seq, rec in store.outbox_load():
            by_runtime.setdefault(runtime, []).append((seq, rec))
        assert by_runtime == {
            "r1": [(1, b"r1-1"), (2, b"r1-2"), (3, b"r1-3 again"), (1 << 40, b"r1-big")],
            "r2": [(1, b"r2-1")],
        }
        runtimes = [runtime for runtime, _, _ in store.outbox_load()]
        assert runtimes in (["r1"] * 4 + ["r2"], ["r2"] + ["r1"] * 4)  # grouped by runtime
        store.outbox_remove("r1", [1, 3, 99])
        store.outbox_remove("nobody", [1])
        assert store.outbox_load() == [("r1", 2, b"r1-2"), ("r1", 1 << 40, b"r1-big"), ("r2", 1, b"r2-1")]
        store.outbox_remove("r1", [2, 1 << 40])
        store.outbox_remove("r2", [1])
        assert store.outbox_load() == []

    def test_outbox_is_not_part_of_the_replicated_state(self, store: Store) -> None:
        store.outbox_put("r", [(1, b"kept")])
        put(store, Q, 0, [b"m"], applied=3)
        assert store.load().applied == 3  # an outbox write is not a commit
        store.outbox_put("r", [(2, b"more")])
        assert store.load() == Loaded(applied=3)

    def test_identity_values(self, store: Store) -> None:
        assert store.get_ident("node") is None
        store.put_ident("node", "n-1")
        store.put_ident("cluster", "c-ü")
        store.put_ident("node", "n-2")
        store.put_ident("update", "")
        assert (store.get_ident("node"), store.get_ident("cluster"), store.get_ident("update")) == ("n-2", "c-ü", "")
        assert store.get_ident("other") is None
        assert store.load() == Loaded()  # not part of the replicated state

    # ---- reads ----

    def test_get_messages_answers_each_position_in_the_order_asked(self, store: Store) -> None:
        put(store, Q, 0, [b"0", b"1", b"2"], applied=0, enqueued_at=5, publish_time=4, headers={"h": [1]})
        assert store.get_messages(Q, []) == []
        assert bodies(store, Q, [2, 7, 0, 2]) == [b"2", None, b"0", b"2"]
        assert store.get_messages(OTHER, [0]) == [None]
        (m,) = store.get_messages(Q, [1])
        assert m == StoredMessage(b"1", {"h": [1]}, 4, 5, len(record(b"1", {"h": [1]}, 5, 4)))

    def test_scan_lists_positions_in_order_from_start(self, store: Store) -> None:
        positions = [2, 10, 255, 256, 65_536, 1 << 40]  # ordered as numbers, not as text
        for i, pos in enumerate(reversed(positions)):
            put(store, Q, pos, [b"m"], applied=i, enqueued_at=1000 + pos)
        put(store, Q - 1, 1000, [b"below"], applied=10)
        put(store, Q + 1, 0, [b"above"], applied=11)
        every = [(p, 1000 + p) for p in positions]
        assert store.scan(Q, 0, 100) == every
        assert store.scan(Q, 10, 100) == every[1:]  # start is included
        assert store.scan(Q, 11, 100) == every[2:]  # a start in a gap begins at the next one
        assert store.scan(Q, 0, 3) == every[:3]
        assert store.scan(Q, 256, 1) == [(256, 1256)]
        assert store.scan(Q, 0, 0) == []
        assert store.scan(Q, (1 << 40) + 1, 10) == []

    def test_read_range_respects_end_and_limit(self, store: Store) -> None:
        put(store, Q, 0, [b"m%d" % i for i in range(6)], applied=0)
        put(store, Q, 10, [b"m10"], applied=1)
        put(store, OTHER, 3, [b"other"], applied=2)
        big = 1 << 30

        def positions(start: int, end: int, limit: int) -> list[int]:
            return [p for p, _ in store.read_range(Q, start, end, limit, big)]

        assert positions(0, 100, 100) == [0, 1, 2, 3, 4, 5, 10]
        assert positions(2, 5, 100) == [2, 3, 4]  # end is excluded
        assert positions(4, 11, 100) == [4, 5, 10]  # gaps are skipped
        assert positions(0, 100, 2) == [0, 1]
        assert positions(6, 10, 100) == []
        assert positions(3, 3, 100) == [] and positions(5, 2, 100) == []
        assert positions(0, 100, 0) == []
        ((pos, m),) = store.read_range(Q, 3, 4, 10, big)
        assert pos == 3 and m.body == b"m3" and m == store.get_messages(Q, [3])[0]

    def test_read_range_stops_after_the_message_that_reaches_max_bytes(self, store: Store) -> None:
        put(store, Q, 0, [b"x" * 100, b"y" * 100, b"z" * 100, b"w" * 100], applied=0)
        first = store.get_messages(Q, [0])[0]
        assert first is not None
        size = first.size
        assert size > 100  # the record's bytes: body, headers and more

        def positions(max_bytes: int) -> list[int]:
            rows = store.read_range(Q, 0, 10, 10, max_bytes)
            assert all(m.size == size for _, m in rows)
            return [p for p, _ in rows]

        assert positions(2 * size) == [0, 1]  # the second brings the total to max_bytes
        assert positions(2 * size + 1) == [0, 1, 2]  # below it after two: a third comes
        assert positions(2 * size - 1) == [0, 1]
        assert positions(1) == [0]  # one message larger than max_bytes still comes
        assert positions(0) == []
        assert positions(4 * size) == [0, 1, 2, 3]

    def test_a_reader_sees_the_store_as_it_was(self, store: Store) -> None:
        put(store, Q, 0, [b"a", b"b"], applied=0)
        reader = store.reader()
        batch = store.batch()
        batch.remove(Q, [0])
        batch.put_messages(Q, 1, ((b"b2", {}),), 100, 50)
        batch.put_messages(Q, 2, ((b"c", {}),), 100, 50)
        store.commit(batch, 1)
        try:
            assert reader.get_raw(Q, 0) == record(b"a", {}, 100, 50)
            assert reader.get_raw(Q, 1) == record(b"b", {}, 100, 50)
            assert reader.get_raw(Q, 2) is None
            assert reader.get_raw(OTHER, 0) is None
        finally:
            reader.close()
        later = store.reader()
        try:
            assert later.get_raw(Q, 0) is None
            assert later.get_raw(Q, 1) == record(b"b2", {}, 100, 50)
            assert later.get_raw(Q, 2) == record(b"c", {}, 100, 50)
        finally:
            later.close()

    # ---- reset and close ----

    def test_reset_forgets_the_replicated_state_but_keeps_identity_and_outbox(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        batch = store.batch()
        batch.put_messages(Q, 0, ((b"m", {}),), 1, 1)
        batch.put_queue("q", ["snap"])
        batch.put_meta(["meta"])
        batch.put_keys([(1, Q, "k", 0, -1)], range(0))
        store.commit(batch, 30)
        store.put_ident("node", "n1")
        store.outbox_put("r", [(1, b"rec")])
        store.reset()
        assert store.load() == Loaded()
        assert store.get_messages(Q, [0]) == [None] and store.scan(Q, 0, 10) == []
        assert store.get_ident("node") == "n1"
        assert store.outbox_load() == [("r", 1, b"rec")]
        put(store, Q, 0, [b"new"], applied=0)  # applying starts again
        store.close()
        again = self.restart(store, tmp_path)
        try:
            assert again.load() == Loaded(applied=0)
            assert bodies(again, Q, [0]) == [b"new"]
            assert again.get_ident("node") == "n1" and again.outbox_load() == [("r", 1, b"rec")]
        finally:
            again.close()

    def test_a_closed_store_refuses_writes_and_reads(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        put(store, Q, 0, [b"m"], applied=4)
        batch = store.batch()
        batch.put_messages(Q, 1, ((b"too late", {}),), 1, 1)
        store.close()
        with pytest.raises(StoreError):
            store.commit(batch, 5)
        with pytest.raises(StoreError):
            store.reset()
        with pytest.raises(StoreError):
            store.outbox_put("r", [(1, b"rec")])
        with pytest.raises(StoreError):
            store.outbox_remove("r", [1])
        with pytest.raises(StoreError):
            store.put_ident("node", "n")
        for read in (
            store.load,
            store.outbox_load,
            store.reader,
            lambda: store.get_messages(Q, [0]),
            lambda: store.scan(Q, 0, 10),
            lambda: store.read_range(Q, 0, 10, 10, 1000),
            lambda: store.get_ident("node"),
        ):
            with pytest.raises(Exception):  # StoreError, or the backend's own error
                read()
        again = self.restart(store, tmp_path)
        try:
            assert again.load() == Loaded(applied=4)
            assert bodies(again, Q, [0, 1]) == [b"m", None]
            assert again.outbox_load() == [] and again.get_ident("node") is None
        finally:
            again.close()


class TestMemoryStore(StoreContract):
    def make(self, where: Path) -> Store:
        return MemoryStore()

    def restart(self, closed: Store, where: Path) -> Store:
        assert isinstance(closed, MemoryStore)
        return closed.reopen()

    def test_an_open_store_cannot_be_reopened(self) -> None:
        store = MemoryStore()
        with pytest.raises(StoreError):
            store.reopen()
        store.close()
        again = store.reopen()
        with pytest.raises(StoreError):  # one open store on the same contents at a time
            store.reopen()
        again.close()
        store.reopen().close()


class TestRocksStore(StoreContract):
    def make(self, where: Path) -> Store:
        return RocksStore(str(where / "store"))

    def restart(self, closed: Store, where: Path) -> Store:
        return RocksStore(str(where / "store"))

    def test_an_open_store_cannot_be_opened_again(self, store: Store, tmp_path: Path) -> None:
        with pytest.raises(StoreError, match="another broker"):
            RocksStore(str(tmp_path / "store"))

    def test_keys_stored_before_the_dedupe_window_load_without_an_expiry(
        self, tmp_path: Path
    ) -> None:
        store = RocksStore(str(tmp_path / "old"))
        store.commit(store.batch(), 0)
        store.close()
        from rocksdict import Rdict

        db = Rdict(str(tmp_path / "old"))  # as an older broker wrote it: no expiry
        db[b"k" + (1).to_bytes(8, "big")] = msgpack.packb([Q, "k", 0])
        db.close()
        again = RocksStore(str(tmp_path / "old"))
        try:
            assert again.load().keys == [(1, Q, "k", 0, -1)]
        finally:
            again.close()

    def test_keys_stored_one_by_one_by_an_older_broker_are_read_and_forgotten(
        self, tmp_path: Path
    ) -> None:
        """Older brokers stored each publish key as its own record: a store they wrote
        loads those keys before the blocks written since, and forgets them by the
        floor like the others."""
        from rocksdict import Options, Rdict

        db = Rdict(str(tmp_path / "old"), Options(raw_mode=True))
        for seq in range(10):
            db[b"k" + seq.to_bytes(8, "big")] = msgpack.packb([Q, f"old{seq}", seq, 99])
        db.close()
        store = RocksStore(str(tmp_path / "old"))
        try:
            batch = store.batch()
            batch.put_keys([(10, Q, "new10", 10, 99), (11, Q, "new11", 11, 99)], range(0, 8))
            store.commit(batch, 1)
            assert store.load().keys == [
                (8, Q, "old8", 8, 99), (9, Q, "old9", 9, 99),
                (10, Q, "new10", 10, 99), (11, Q, "new11", 11, 99),
            ]
            batch = store.batch()
            batch.put_keys([], range(8, 5000))  # far enough to delete the old records
            store.commit(batch, 2)
            assert store.load().keys == []
        finally:
            store.close()
        db = Rdict(str(tmp_path / "old"), Options(raw_mode=True))
        try:
            assert [k for k in db.keys() if k[:1] in (b"k", b"j")] == []
        finally:
            db.close()
