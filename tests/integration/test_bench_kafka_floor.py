"""The Kafka floor benchmark (``python -m batonmq.loadtest.bench_kafka_floor``) on the
test Kafka: both layers time every record they append, and read each one back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batonmq.loadtest import bench_kafka_floor


def test_the_kafka_floor_benchmark_times_every_record_of_both_layers(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "floor.json"
    bench_kafka_floor.main(
        ["--bootstrap", kafka_bootstrap, "--rate", "400", "--seconds", "1", "--json", str(out)]
    )
    figures = json.loads(out.read_text())
    assert figures["records"] == 400
    for layer in ("raw", "log"):
        for what in ("append", "visible"):
            f = figures[layer][what]
            assert f["n"] == 400, (layer, what, f)
            assert 0 < f["p50"] <= f["p90"] <= f["p99"] <= f["max"], (layer, what, f)
    printed = capsys.readouterr().out
    assert "raw: 400 records" in printed and "log: 400 records" in printed


def test_the_kafka_floor_benchmark_says_so_when_kafka_cannot_be_reached(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_kafka_floor.main(["--bootstrap", "127.0.0.1:1", "--rate", "10", "--seconds", "1"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "the raw layer failed" in err and "127.0.0.1" in err
    assert "Traceback" not in err
