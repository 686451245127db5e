"""The shape of the import graph: a pure core, a client free of the broker, no cycles.

The graph is read from the sources with :mod:`ast`, so it sees every import: those at
the top of a module, those inside functions and those behind ``if TYPE_CHECKING:`` (a
cycle hidden there is still a cycle in the design, and a change away from becoming a
real one). An import of a submodule does not count as an import of its parent
package's ``__init__``: a package that names its children lazily (a registry) is not
a cycle.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "cluster", "store", "clients", "loadtest")


def _modules() -> dict[str, Path]:
    """Every module of the batonmq packages, by its installed name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(["batonmq", *parts])] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module name -> the batonmq modules it imports anywhere in its source."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    child = f"{base}.{alias.name}"
                    targets.append(child if child in modules else base)
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_graph_sees_imports_in_functions_and_type_checking_blocks() -> None:
    # The checker must be able to fail: a made-up cycle through a function-level import
    # and a TYPE_CHECKING import is found.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    real = import_graph()
    assert "batonmq.cluster.state" in real["batonmq.cluster.node"]


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (break them with a narrow interface):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def _loaded_after(statement: str) -> set[str]:
    code = (
        "import sys; before = set(sys.modules); "
        f"{statement}; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
        cwd="/", timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_the_state_machine_loads_no_io_and_no_client() -> None:
    loaded = _loaded_after("import batonmq.cluster.state")
    assert "batonmq.cluster.state" in loaded
    io = sorted(m for m in loaded if m.split(".")[0] in ("asyncio", "socket", "ssl", "selectors"))
    assert not io, f"importing the state machine loads I/O modules: {io}"
    client = sorted(m for m in loaded if m.startswith("batonmq.clients"))
    assert not client, f"importing the state machine loads client modules: {client}"
    other = sorted(m for m in loaded if m.startswith(("batonmq.broker", "batonmq.store")))
    assert not other, other


# The leaves of the core that the client shares: the errors and the command results.
CLIENT_SHARED = ("batonmq.cluster.errors", "batonmq.cluster.results")


def test_the_client_loads_no_broker_store_or_core_beyond_the_shared_leaves() -> None:
    loaded = _loaded_after("from batonmq import clients")
    assert "batonmq.clients.client" in loaded
    bad = sorted(
        m for m in loaded
        if m.startswith(("batonmq.broker", "batonmq.store", "batonmq.loadtest"))
        or (m.startswith("batonmq.cluster.") and m not in CLIENT_SHARED)
    )
    assert not bad, f"importing the client loads the broker side: {bad}"


def test_the_shared_leaves_import_no_other_batonmq_module() -> None:
    graph = import_graph()
    assert graph["batonmq.cluster.errors"] == set()
    assert graph["batonmq.cluster.results"] <= {"batonmq.cluster.errors"}
    loaded = _loaded_after("import batonmq.cluster.results")
    assert {m for m in loaded if m.startswith("batonmq.")} <= {
        "batonmq.cluster", *CLIENT_SHARED
    }
