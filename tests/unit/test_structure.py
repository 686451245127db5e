"""Seams a newcomer can trust: no class reaches into another's private members, and no
module grows past ~800 lines without saying why.

A private member (``_name``) is the business of the class that defines it. Reading or
calling ``other._name`` from anywhere else couples two classes through an interface that
neither documents; give the other class a public method (or a narrow protocol) instead.
Allowed: ``self._x`` and ``cls._x``; ``other._x`` inside a class that itself defines
``_x`` (another instance of the same class); private names of imported modules
(``os._exit``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "cluster", "store", "clients", "loadtest")
MAX_LINES = 800
#: A module longer than MAX_LINES states why in a docstring paragraph starting so.
SIZE_REASON = "Size:"



def _sources() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))]


def _own_privates(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("_"):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
            and node.attr.startswith("_")
        ):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and node.id.startswith("_") and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def private_reaches(source: str) -> list[tuple[int, str]]:
    """Every ``x._name`` in ``source`` that touches another class's private member."""
    tree = ast.parse(source)
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
    hits: list[tuple[int, str]] = []

    def visit(node: ast.AST, allowed: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = _own_privates(child) if isinstance(child, ast.ClassDef) else allowed
            if (
                isinstance(child, ast.Attribute)
                and child.attr.startswith("_")
                and not child.attr.startswith("__")
                and child.attr not in inner
            ):
                value = child.value
                if not (isinstance(value, ast.Name) and (value.id in ("self", "cls") or value.id in modules)):
                    hits.append((child.lineno, ast.unparse(child)))
            visit(child, inner)

    visit(tree, set())
    return hits


def test_the_checker_finds_a_reach_and_allows_the_same_class() -> None:
    source = (
        "import os\n"
        "class A:\n"
        "    def __init__(self) -> None:\n"
        "        self._x = 1\n"
        "    def same(self, other: 'A') -> int:\n"
        "        os._exit\n"
        "        return other._x\n"
        "class B:\n"
        "    def peek(self, a: A) -> int:\n"
        "        return a._x\n"
    )
    assert private_reaches(source) == [(10, "a._x")]


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_class_touches_another_s_private_members(path: Path) -> None:
    name = str(path.relative_to(REPO))
    hits = private_reaches(path.read_text())
    assert not hits, f"{name} reaches into private members of other classes: {hits}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_is_long_without_a_reason(path: Path) -> None:
    name = str(path.relative_to(REPO))
    source = path.read_text()
    lines = len(source.splitlines())
    docstring = ast.get_docstring(ast.parse(source)) or ""
    if lines <= MAX_LINES or SIZE_REASON in docstring:
        return
    pytest.fail(
        f"{name} has {lines} lines (more than {MAX_LINES}): split it along its seams, "
        f"or say why not in a docstring paragraph starting {SIZE_REASON!r}"
    )

