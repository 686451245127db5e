"""The web console's files ship with the package and are safe to serve."""

from __future__ import annotations

import fnmatch
import importlib.resources
import re
import tomllib
from pathlib import Path

import pytest

from batonmq.broker.admin import CONSOLE_FILES, console_file

ROOT = Path(__file__).resolve().parents[2]


def test_every_console_file_is_found_through_importlib_resources() -> None:
    folder = importlib.resources.files("batonmq.broker").joinpath("console")
    for name in CONSOLE_FILES:
        assert folder.joinpath(name).is_file(), name
        assert console_file(name) == folder.joinpath(name).read_bytes()
        assert len(console_file(name)) > 500, f"{name} looks empty"
    with pytest.raises(KeyError):
        console_file("../admin.py")


def test_package_data_names_every_console_file() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["batonmq.broker"]
    for name in CONSOLE_FILES:
        assert any(fnmatch.fnmatch(f"console/{name}", p) for p in patterns), (name, patterns)


def test_the_page_loads_nothing_from_elsewhere() -> None:
    html = console_file("index.html").decode()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert "/console/console.js" in refs and "/console/console.css" in refs
    assert all(r.startswith("/") for r in refs), refs  # this listener only
    css = console_file("console.css").decode()
    assert "url(" not in css and "@import" not in css


def test_the_script_never_writes_html() -> None:
    """Names are user input: the console puts them in the page as text only."""
    js = console_file("console.js").decode()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in js, sink
    assert "textContent" in js
