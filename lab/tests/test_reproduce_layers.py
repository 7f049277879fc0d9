"""``mpo_lab.reproduce`` is built in layers: no module imports one that (directly or through
others) imports it back, at module level or inside a function; none imports the console
script; none is over 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

from test_layers import _cycle  # the library's tests/, on the path (conftest.py)

PACKAGE = Path(__file__).resolve().parents[1] / "mpo_lab" / "reproduce"
MAX_LINES = 600


def _imports(path: Path) -> set[str]:
    """The modules of the package ``path`` imports, anywhere in it (``from .x import y``,
    ``from . import x``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(alias.name for alias in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return {name: _imports(path) & set(modules) for name, path in modules.items()}


def test_no_import_circle_in_the_package():
    graph = _graph()
    assert {"api", "report", "run", "config"} <= set(graph)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_no_module_imports_the_console_script():
    for path in PACKAGE.glob("*.py"):
        assert "mpo_rs_cli" not in path.read_text().replace("``mpo_rs_cli``", ""), path.name


def test_no_module_over_600_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("*.py")}
    assert max(sizes.values()) <= MAX_LINES, {k: v for k, v in sizes.items() if v > MAX_LINES}
