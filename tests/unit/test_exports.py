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
    import batonmq.clients.consumer
    import batonmq.clients.sync
    import batonmq.clients.topology
    import batonmq.clients.watch

    for name in ("connect", "Connection", "Consumer", "Message", "sync", "BatonError",
                 "Topology", "TopologyEvent", "TopologyEventType", "TopologyWatch"):
        assert name in clients.__all__, name
        assert hasattr(clients, name), name
    assert clients.Topology is clients.topology.Topology
    assert clients.TopologyEvent is clients.topology.TopologyEvent
    assert clients.TopologyWatch is clients.watch.TopologyWatch
    assert isinstance(clients.sync, types.ModuleType) and clients.sync.__name__ == "batonmq.clients.sync"
    assert callable(clients.sync.connect)
    assert callable(clients.connect)
    assert clients.connect is clients.client.connect
    assert clients.Connection is clients.client.Connection
    assert clients.Consumer is clients.consumer.Consumer
    assert clients.Message is clients.consumer.Message
    # The names the facade module always had stay importable from it.
    for name in ("connect", "Connection", "Consumer", "Message", "TopologyWatch"):
        assert getattr(clients.client, name) is getattr(clients, name), name
    assert callable(clients.client.parse_addresses) and clients.client.DEFAULT_PORT == 5671
    assert isinstance(clients.BatonError, type) and issubclass(clients.BatonError, Exception)
    # Every exported error class is a BatonError and the same object as in clients.errors.
    for name in clients.__all__:
        obj = getattr(clients, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, clients.BatonError), name
            assert getattr(clients.errors, name) is obj, name
    for name in ("QueueFull", "QueueNotFound", "QueueExists", "InvalidArgument", "Timeout", "ConnectionClosed"):
        assert issubclass(getattr(clients, name), clients.BatonError), name


def test_clients_names_are_the_objects_of_their_defining_modules() -> None:
    """``from batonmq import clients`` is the entry point: each name of its ``__all__``
    is the very object its defining module holds, wherever that module now is."""
    from batonmq import clients
    from batonmq.clients import wire

    constants = {"PROTOCOL_VERSION": wire}
    for name in clients.__all__:
        obj = getattr(clients, name)
        if isinstance(obj, types.ModuleType):
            assert obj.__name__ == f"batonmq.clients.{name}", name
            assert sys.modules[obj.__name__] is obj, name
        elif name in constants:
            assert getattr(constants[name], name) == obj, name
        else:
            home = getattr(obj, "__module__", None)
            assert isinstance(home, str), f"{name} has no defining module"
            assert home.startswith(("batonmq.clients.", "batonmq.cluster.errors")), (name, home)
            assert getattr(importlib.import_module(home), name) is obj, (name, home)


def test_clients_star_import_is_all() -> None:
    namespace: dict[str, object] = {}
    exec("from batonmq.clients import *", namespace)
    from batonmq import clients

    assert set(namespace) - {"__builtins__"} == set(clients.__all__)
    assert isinstance(namespace["sync"], types.ModuleType)
    assert callable(getattr(namespace["sync"], "connect"))


def test_importing_clients_stays_cheap() -> None:
    """The package must not load the Spark source, the import-entries pipeline or pyspark."""
    code = (
        "import sys; from batonmq import clients; "
        "print('\\n'.join(sorted(sys.modules)))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
        cwd="/", timeout=60,
    )
    assert r.returncode == 0, r.stderr
    loaded = set(r.stdout.split())
    heavy = sorted(
        m for m in loaded
        if m.split(".")[0] in ("pyspark", "pyarrow", "pandas")
        or m in ("batonmq.clients.spark", "batonmq.clients.import_entries")
    )
    assert not heavy, f"importing batonmq.clients loads {heavy}"
