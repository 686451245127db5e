"""The import-entries pipeline's pure parts: the generator makes unique, realistic
entries with a share of invalid ones, validation tells them apart with a reason, and
the checkpoint reader finds the committed position."""

from __future__ import annotations

import json
from pathlib import Path

from batonmq.clients.import_entries import ENTRY_TYPES, committed_position, generate, validate

__all__: list[str] = []


def test_generated_entries_validate_as_generated() -> None:
    entries = list(generate(2000, run="t", invalid_ratio=0.02, seed=3))
    assert len(entries) == 2000
    invalid = [body for body, ok in entries if not ok]
    assert len(invalid) == 40
    keys = set()
    for body, ok in entries:
        row, why = validate(body)
        assert (row is not None) == ok, (body, why)
        if row is not None:
            assert why is None and row.type in ENTRY_TYPES
            keys.add(row.key)
            if row.type in ("order", "payment"):
                assert row.amount is not None and row.currency in ("EUR", "USD", "GBP")
        else:
            assert why
    assert len(keys) == 1960  # unique keys
    reasons = {validate(b)[1].split(" ")[0] for b in invalid}  # type: ignore[union-attr]
    assert len(reasons) >= 5  # each kind of mistake shows up


def test_validation_reasons() -> None:
    good = {
        "type": "payment", "key": "p-1", "version": 1, "occurred_at": "2025-01-02T03:04:05Z",
        "payload": {"order": "o-1", "amount": 3.5, "currency": "EUR", "method": "card"},
    }
    row, why = validate(json.dumps(good).encode())
    assert why is None and row is not None and row.amount == 3.5
    assert row.occurred_at.isoformat() == "2025-01-02T03:04:05+00:00"
    cases = {
        b"\xff\xfe": "not JSON",
        b"[1, 2]": "not a JSON object",
        json.dumps({**good, "type": "refund"}).encode(): "unknown type",
        json.dumps({**good, "key": ""}).encode(): "missing or bad key",
        json.dumps({**good, "version": True}).encode(): "version",
        json.dumps({**good, "occurred_at": "soon"}).encode(): "not ISO 8601",
        json.dumps({**good, "payload": {**good["payload"], "amount": 0}}).encode(): "out of range",  # type: ignore[dict-item]
        json.dumps({**good, "payload": {**good["payload"], "method": "cash"}}).encode(): "method",  # type: ignore[dict-item]
    }
    for body, expected in cases.items():
        row, why = validate(body)
        assert row is None and why is not None and expected in why, (body, why)


def test_committed_position_reads_the_last_committed_batch(tmp_path: Path) -> None:
    assert committed_position(str(tmp_path)) is None
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for n, pos in ((0, 100), (1, 250), (2, 400)):
        (tmp_path / "offsets" / str(n)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"position":{pos}}}')
    assert committed_position(str(tmp_path)) is None  # nothing committed yet
    (tmp_path / "commits" / "0").write_text("v1\n{}")
    (tmp_path / "commits" / "1").write_text("v1\n{}")
    assert committed_position(f"file:{tmp_path}") == 250  # batch 2 is planned, not committed
