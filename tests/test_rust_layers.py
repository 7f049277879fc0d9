"""The modules of the pure-Rust crate ``rust/logs`` form a DAG: none refers (``crate::x``,
in a ``use`` or a path, tests included; comments aside) to one that refers back to it. The
files below a module's folder (``groups/tests.rs``) count as that module."""

from __future__ import annotations

import re
from pathlib import Path

from test_layers import _cycle

CRATE = Path(__file__).resolve().parents[1] / "rust" / "logs" / "src"


def _graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in CRATE.glob("*.rs") if p.stem != "lib"}
    graph = {}
    for name, path in modules.items():
        # The files below `name/` (its tests, its submodules) are part of the module.
        files = [path, *sorted((CRATE / name).rglob("*.rs"))]
        lines = (line for file in files for line in file.read_text().splitlines())
        code = "\n".join(line for line in lines if not line.lstrip().startswith("//"))
        used = set(re.findall(r"\bcrate::(\w+)", code))
        used |= {m.strip() for group in re.findall(r"\bcrate::\{([^}]*)\}", code) for m in group.split(",")}
        graph[name] = (used & set(modules)) - {name}
    return graph


def test_the_crate_has_the_modules_it_is_read_for():
    graph = _graph()
    assert {"schema", "observation", "relocate", "annotate", "paths", "safety", "listing"} <= set(graph)
    assert "observation" in graph["schema"] and "listing" in graph["safety"]


def test_no_import_circle_among_the_modules_of_rust_logs():
    graph = _graph()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
