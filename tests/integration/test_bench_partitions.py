"""The partitioned file log benchmark (``python -m batonmq.loadtest.bench_partitions``) with tiny
numbers: every run counts what it appended, checks each partition's end offset against it, and
the stalled partition appends nothing while the others go on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batonmq.loadtest import bench_partitions


def test_the_partitions_benchmark_counts_every_record_and_shows_a_stalled_partition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "figures.json"
    code = bench_partitions.main([
        "--records", "40", "--batch", "4", "--size", "16", "--seconds", "1.5",
        "--stall", "--dir", str(tmp_path / "logs"), "--json", str(out),
    ])
    assert code == 0
    figures = json.loads(out.read_text())
    assert figures["ok"] is True
    one, four = figures["runs"]
    assert (one["partitions"], one["writers"], four["partitions"], four["writers"]) == (1, 1, 4, 4)
    # Bounded by --records: each writer appended exactly 40, each partition holds them.
    assert one["per_partition_records"] == [40] and four["per_partition_records"] == [40] * 4
    for run in (one, four):
        assert run["ok"] is True and run["records"] == sum(run["per_partition_records"])
        assert run["records_per_s"] > 0 and all(x > 0 for x in run["per_partition"])
    # The logs are really there, on disk, as a set of partitions.
    assert sorted(p.name for p in (tmp_path / "logs" / "scale-1").iterdir() if p.is_dir()) == [
        "partition-1", "partition-2", "partition-3"
    ]
    stall = figures["stall"]
    assert stall["ok"] is True and stall["stalled_partition"] == 1
    assert stall["baseline"]["per_partition_records"][1] == 40
    assert stall["stalled"]["per_partition_records"][1] == 0
    assert [n for k, n in enumerate(stall["stalled"]["per_partition_records"]) if k != 1] == [40] * 3
    printed = capsys.readouterr().out
    assert "1 partition(s), 1 writer(s):" in printed and "4 partition(s), 4 writer(s):" in printed
    assert "partition 1 stalled: the others kept" in printed and printed.rstrip().endswith("ok")


def test_the_partitions_benchmark_refuses_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_partitions.main(["--partitions", "0"])
    assert exited.value.code == 2
    assert "must be positive" in capsys.readouterr().err
