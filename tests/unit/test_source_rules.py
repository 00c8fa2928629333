"""Rules the source tree keeps: short functions, no formatter opt-outs, no module of
ours outside the one ``dstltree`` namespace, no references to documents outside the
repository."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = (
    "aggregator",
    "bench",
    "cli",
    "client",
    "coordinator",
    "demo",
    "simulations",
    "sparkplug",
    "storage",
    "topology",
    "dstltree",
)
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    files = list((ROOT / "dstltree").glob("*.py"))  # the root module; the rest are links
    for part in PARTS[:-1]:
        files += (ROOT / part).rglob("*.py")
    return sorted(files)


def _function_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, without its signature (declarations) or docstring."""
    body = fn.body
    first = body[0]
    if len(body) > 1 and isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        body = body[1:]
    assert fn.end_lineno is not None
    return fn.end_lineno - body[0].lineno + 1


def test_sources_found() -> None:
    names = {p.relative_to(ROOT).parts[0] for p in _sources()}
    assert names == set(PARTS)


def test_no_long_functions() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = _function_lines(node)
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions longer than 60 lines:\n" + "\n".join(long)


@pytest.mark.parametrize(
    "pattern", [r"#\s*fmt:\s*(skip|off)", r"\.\./shared/", r"\bDESIGN\.md\b", r"\bissue \d+\b"]
)
def test_no_forbidden_text(pattern: str) -> None:
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _sources()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(pattern, line)
    ]
    assert not hits, f"{pattern!r} found in:\n" + "\n".join(hits)


def test_only_the_namespace_imports() -> None:
    """Every import of our own code goes through ``dstltree.``."""
    ours = set(PARTS) - {"dstltree"}
    bad = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] in ours
            ]
    assert not bad, "\n".join(bad)


def test_no_class_name_defined_twice() -> None:
    seen: dict[str, list[str]] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    twice = {name: places for name, places in seen.items() if len(places) > 1}
    assert not twice, twice
