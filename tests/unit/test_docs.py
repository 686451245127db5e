"""The docs' generated parts and reference tables are in sync with the code."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from dataclasses import MISSING
from pathlib import Path
from types import ModuleType

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _gen_transitions() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_transitions", DOCS / "gen_transitions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_events_md_transitions_diagram_is_current() -> None:
    problem = _gen_transitions().check(str(DOCS / "events.md"))
    assert problem is None, problem


def test_protocol_md_lists_every_frame_with_its_op_code() -> None:
    from batonmq.clients.wire import FRAME_TYPES

    text = (DOCS / "protocol.md").read_text()
    missing = [
        f"{op} {cls.__name__}"
        for op, cls in sorted(FRAME_TYPES.items())
        if f"| {op} | `{cls.__name__}` |" not in text
    ]
    assert not missing, f"frames not in the docs/protocol.md table: {missing}"


# --- reference tables that must match the code ------------------------------------------

CLUSTER = DOCS.parent / "cluster"


def _row(text: str, op: int, name: str) -> list[str]:
    """The cells of the one table row ``| op | `name` | ...`` (asserts there is exactly one)."""
    rows = [line for line in text.splitlines() if line.startswith(f"| {op} | `{name}` |")]
    assert len(rows) == 1, f"{len(rows)} table rows for {op} {name}, want 1"
    return rows[0].split(" | ")


def _fields(cell: str) -> list[tuple[str, bool]]:
    """(name, has a default) of each ``name: type [= default]`` in a table cell's code
    spans; brackets nest (``[[body: bin, headers: map], ...]`` is one field's type)."""
    spans = [s for s in re.findall(r"`([^`]*)`", cell) if re.match(r"\w+:", s)]
    out: list[tuple[str, bool]] = []
    for span in spans:
        depth, part = 0, ""
        for ch in span + ",":
            if ch == "," and depth == 0:
                name, _, rest = part.strip().partition(":")
                out.append((name, _top_eq(rest)))
                part = ""
                continue
            depth += 1 if ch == "[" else -1 if ch == "]" else 0
            part += ch
    return out


def _top_eq(rest: str) -> bool:
    """Is there an ``=`` outside brackets in a field's type text?"""
    depth = 0
    for ch in rest:
        depth += 1 if ch == "[" else -1 if ch == "]" else 0
        if ch == "=" and depth == 0:
            return True
    return False


def _dataclass_fields(cls: type) -> list[tuple[str, bool]]:
    return [
        (f.name, f.default is not MISSING or f.default_factory is not MISSING)
        for f in dataclasses.fields(cls)
    ]


def test_protocol_md_frame_fields_match_the_frame_classes() -> None:
    from batonmq.clients.wire import FRAME_TYPES

    text = (DOCS / "protocol.md").read_text()
    wrong = []
    for op, cls in sorted(FRAME_TYPES.items()):
        documented = _fields(_row(text, op, cls.__name__)[3])
        if documented != _dataclass_fields(cls):
            wrong.append(f"{cls.__name__}: docs {documented}, code {_dataclass_fields(cls)}")
    assert not wrong, "docs/protocol.md frame fields differ from clients/wire.py:\n" + "\n".join(wrong)


def test_events_md_event_fields_match_the_event_classes() -> None:
    from batonmq.cluster.events import EVENT_TYPES

    text = (DOCS / "events.md").read_text()
    wrong = []
    for op, cls in sorted(EVENT_TYPES.items()):
        documented = _fields(_row(text, op, cls.__name__)[2])
        if documented != _dataclass_fields(cls):
            wrong.append(f"{cls.__name__}: docs {documented}, code {_dataclass_fields(cls)}")
    assert not wrong, "docs/events.md event fields differ from cluster/events.py:\n" + "\n".join(wrong)


def test_events_md_ignored_table_lists_every_reason_the_code_counts() -> None:
    # Every module of the cluster package, so the check survives code moving between them.
    counted = {
        reason
        for path in CLUSTER.rglob("*.py")
        for reason in re.findall(r"(?<![\w])_?ignore\(\s*\"([^\"]+)\"", path.read_text())
    }
    assert counted, "found no ignore(\"reason\") call in cluster/: update this test"
    text = (DOCS / "events.md").read_text()
    section = text.split("## What `State.ignored` counts", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([\w-]+)` \|", section, re.MULTILINE))
    assert counted - documented == set(), f"reasons not in the events.md table: {sorted(counted - documented)}"
    assert documented - counted == set(), f"reasons the code no longer counts: {sorted(documented - counted)}"


def test_design_md_module_map_names_every_module() -> None:
    text = (DOCS / "design.md").read_text()
    start = text.index("### Module map")
    section = text[start : text.index("\n### ", start + 1)]
    repo = DOCS.parent
    missing = []
    for package in ("broker", "cluster", "store", "clients", "loadtest"):
        for path in sorted((repo / package).rglob("*.py")):
            if path.parent != repo / package:
                named = f"`{path.parent.name}/`" in section  # a subpackage, named as a whole
            elif path.name.startswith("bench_"):
                named = "bench_*.py" in section
            elif path.name == "__init__.py" and package in ("broker", "cluster", "loadtest"):
                named = True  # their __init__ only names the package
            else:
                named = f"{path.name}`" in section
            if not named:
                missing.append(str(path.relative_to(repo)))
    assert not missing, f"docs/design.md's module map does not name: {missing}"
