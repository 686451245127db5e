"""Clock faults: a broker whose wall clock jumps (libfaketime) keeps message TTL right:
a step forwards expires nothing early, a step backwards does not stop expiry."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batonmq import clients
from tests.helpers import eventually
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def faketime_env(stamp: Path) -> dict[str, str]:
    """Run under libfaketime with the offset in ``stamp`` (re-read every second); the
    monotonic clock stays real, as with an NTP step (docs/loadtest.md "Clock faults")."""
    if not LIBFAKETIME.exists() and shutil.which("faketime") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("libfaketime is missing: CI installs it (apt-get install faketime)")
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    stamp.write_text("+0\n")
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME_TIMESTAMP_FILE": str(stamp),
        "FAKETIME_CACHE_DURATION": "1",
        "DONT_FAKE_MONOTONIC": "1",
    }


def faked_offset(env: dict[str, str]) -> float:
    """How far a process under ``env`` sees the wall clock from ours, in seconds."""
    before = time.time()
    out = subprocess.run([sys.executable, "-c", "import time; print(time.time())"],
                         env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return float(out.stdout) - before


async def test_a_wall_clock_jump_neither_expires_early_nor_stops_ttl(tmp_path: Path) -> None:
    stamp = tmp_path / "faketime"
    env = faketime_env(stamp)
    broker = BrokerProcess(tmp_path / "node-1", node_id="node-1", env=env)
    try:
        broker.start()
        async with await clients.connect(broker.address) as conn:
            await conn.declare_queue("slow", message_ttl=120.0)
            await conn.declare_queue("fast", message_ttl=1.0)
            await conn.publish_batch("slow", [b"m%d" % i for i in range(100)])

            stamp.write_text("+600\n")  # ten minutes forwards
            assert faked_offset(env) > 590
            time.sleep(2.5)  # pacing: libfaketime re-reads the stamp every second
            stats = await conn.queue_stats("slow")
            assert stats["ready"] == 100 and stats["expired"] == 0, stats

            stamp.write_text("-600\n")  # and ten minutes backwards
            assert faked_offset(env) < -590
            time.sleep(2.5)
            await conn.publish_batch("fast", [b"f%d" % i for i in range(10)])

            async def expired() -> bool:
                return (await conn.queue_stats("fast"))["expired"] == 10

            await eventually(expired, "the 1 s TTL to expire the messages", timeout=15)
            stats = await conn.queue_stats("slow")
            assert stats["ready"] == 100 and stats["expired"] == 0, stats
    finally:
        broker.stop()
