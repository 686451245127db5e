"""A log cut short under running brokers (a segment truncated) is loud, not silent
(docs/operations.md "A log cut short"): health false with both offsets, /readyz 503,
``baton health`` fails, baton_log_cut 1, one ERROR line naming ``baton log verify``, and
commands fail at once instead of timing out. A real broker, its real file log."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from batonmq import clients
from tests.helpers import eventually_sync
from tests.integration.conftest import BrokerProcess, partitions_under_test
from tests.integration.test_admin import GUEST_BASIC, admin_of, metric_samples
from tests.integration.test_cli import baton


def _get(url: str) -> tuple[int, str]:
    # The default guest, from loopback (docs/admin.md "Logging in").
    request = urllib.request.Request(url, headers={"Authorization": GUEST_BASIC})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_truncated_segment_makes_the_broker_unhealthy_and_loud(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b", extra=["--admin-listen", "127.0.0.1:0"])
    b.start()
    try:
        admin = admin_of(b)
        with clients.sync.connect(b.address) as conn:
            conn.declare_queue("q")
            for i in range(300):
                conn.publish("q", b"x" * 512)
            where = conn.queue_stats("q")["partition"]
        assert _get(f"{admin}/readyz")[0] == 200
        # The queue's log: the log itself, or on a split log its data partition's.
        log_dir = b.data_dir / "log"
        if partitions_under_test() > 1:
            log_dir = log_dir / f"partition-{where}"
        segments = sorted(log_dir.glob("*.seg"))
        assert segments, list(log_dir.iterdir())
        last = segments[-1]
        os.truncate(last, last.stat().st_size // 2)

        def readyz() -> dict[str, object] | None:
            status, body = _get(f"{admin}/readyz")
            return json.loads(body) if status == 503 else None

        ready = eventually_sync(readyz, "/readyz answers 503", timeout=20, context=b.output)
        assert ready is not None
        reasons = " ".join(map(str, ready["reasons"]))  # type: ignore[arg-type]
        assert "below offset" in reasons and "baton log verify" in reasons, ready
        metrics = _get(f"{admin}/metrics")[1]
        assert metric_samples(metrics, "baton_healthy") == {"": 0.0}
        assert metric_samples(metrics, "baton_log_cut") == {"": 1.0}
        r = baton("health", "--broker", b.address)
        assert r.returncode != 0, r.stdout + r.stderr
        out = b.output()
        lines = [l for l in out.splitlines() if "LOG CUT" in l]
        assert len(lines) == 1 and "ERROR" in lines[0] and "baton log verify" in lines[0], lines
        # Commands fail at once, saying why, instead of timing out.
        with clients.sync.connect(b.address, timeout=10) as conn:
            with pytest.raises(clients.LogCorrupt, match="below offset"):
                conn.publish("q", b"after the cut")
        # Still unhealthy later: it does not go back to ready on its own.
        assert _get(f"{admin}/readyz")[0] == 503
        assert "Traceback" not in b.output()
    finally:
        b.stop()
