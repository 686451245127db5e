"""A broker's Topology answer reuses the replica digest until the state moves: the console
polls it every 1.5 s and packing every queue's index each time is O(state)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batonmq.broker.config import BrokerConfig
from batonmq.broker.server import Broker
from batonmq.cluster.events import DeclareQueue, Enqueue
from batonmq.cluster.state import State


async def test_the_digest_is_computed_once_per_applied_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = Broker(BrokerConfig(data_dir=str(tmp_path / "d"), port=0, log_url="memory:"))
    await broker.start()
    try:
        calls: list[int] = []
        real = State.digest

        def counted(self: State) -> str:
            calls.append(self.applied)
            return real(self)

        monkeypatch.setattr(State, "digest", counted)
        node = broker.node
        async with node.apply_lock:  # no heartbeat moves the state between the answers
            first = broker.topology()
            again = broker.topology()
        assert first["digest"] == again["digest"] == real(node.state)
        assert len([c for c in calls if c == first["applied"]]) == 1, calls
        await node.submit(DeclareQueue("q"))
        await node.submit(Enqueue("q", ((b"x", {}),)))
        async with node.apply_lock:
            moved = broker.topology()
            assert moved["applied"] > first["applied"]
            assert moved["digest"] == real(node.state) != first["digest"]
    finally:
        await broker.stop()
