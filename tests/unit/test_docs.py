"""The docs' generated parts are in sync with the code."""

from __future__ import annotations

import importlib.util
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
