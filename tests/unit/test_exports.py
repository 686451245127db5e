"""Guards the public surface of the packages: ``__all__`` is honest, the client contract
names exist, and importing the client library stays free of the broker side."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("package", [f"batonmq.{p}" for p in ("broker", "cluster", "store", "clients")])
def test_all_names_exist(package: str) -> None:
    mod = importlib.import_module(package)
    names = getattr(mod, "__all__", None)
    assert names is not None, f"{package} has no __all__"
    assert isinstance(names, (list, tuple))
    assert all(isinstance(n, str) for n in names)
    assert len(names) == len(set(names)), f"{package}.__all__ has duplicates"
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{package}.__all__ names missing attributes: {missing}"


def test_star_import_matches_all() -> None:
    for package in ("batonmq.broker", "batonmq.cluster", "batonmq.store", "batonmq.clients"):
        namespace: dict[str, object] = {}
        exec(f"from {package} import *", namespace)
        exported = set(namespace) - {"__builtins__"}
        assert exported == set(importlib.import_module(package).__all__), package


def test_clients_contract() -> None:
    from batonmq import clients
    import batonmq.clients.client
    import batonmq.cluster.errors
    import batonmq.clients.sync

    for name in ("connect", "Connection", "Consumer", "Message", "sync", "BatonError",
                 "Topology", "TopologyEvent", "TopologyEventType", "TopologyWatch"):
        assert name in clients.__all__, name
        assert hasattr(clients, name), name
    import batonmq.clients.topology

    assert clients.Topology is clients.topology.Topology
    assert clients.TopologyEvent is clients.topology.TopologyEvent
    assert clients.TopologyWatch is clients.client.TopologyWatch
    assert isinstance(clients.sync, types.ModuleType) and clients.sync.__name__ == "batonmq.clients.sync"
    assert callable(clients.sync.connect)
    assert callable(clients.connect)
    assert clients.connect is clients.client.connect
    assert clients.Connection is clients.client.Connection
    assert clients.Consumer is clients.client.Consumer
    assert clients.Message is clients.client.Message
    assert isinstance(clients.BatonError, type) and issubclass(clients.BatonError, Exception)
    # Every exported error class is a BatonError and the same object as in clients.errors.
    for name in clients.__all__:
        obj = getattr(clients, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, clients.BatonError), name
            assert getattr(clients.errors, name) is obj, name
    for name in ("QueueFull", "QueueNotFound", "QueueExists", "InvalidArgument", "Timeout", "ConnectionClosed"):
        assert issubclass(getattr(clients, name), clients.BatonError), name

