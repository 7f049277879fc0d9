"""The house's two floors, read from the source: the library (``python/mpo_rs``) never
imports the lab (``lab/mpo_lab``); the lab uses only the library's public names; the lab's
packages stand in layers (``cli`` → ``reproduce`` → ``train`` → ``envs`` → ``seeds``), each
importing only those below it; and ``mpo-rs advantages`` loads no lab module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "python" / "mpo_rs"
LAB = ROOT / "lab" / "mpo_lab"

# A lab package may import those after it in this order, never one before it (the sampler in
# train/ plays the envs' one protocol, envs.protocol.MultiTurnEnv).
LAB_LAYERS = ("cli", "reproduce", "train", "envs", "seeds", "_deps")


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as the list of its nodes, or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _absolute_imports(path: Path, root: Path) -> set[str]:
    """The modules ``path`` (a module of the package at ``root``) imports anywhere in it, as
    absolute dotted names (relative imports resolved; ``from x import y`` gives ``x.y`` too)."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    package = parts[:-1]  # a module's package; an __init__'s is its own
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def _modules(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_library_never_imports_the_lab():
    offenders = {
        str(p.relative_to(ROOT)): sorted(m for m in _absolute_imports(p, LIBRARY) if m.split(".")[0] == "mpo_lab")
        for p in _modules(LIBRARY)
    }
    assert not {k: v for k, v in offenders.items() if v}
    assert "mpo_lab" not in (ROOT / "python" / "mpo_rs_cli.py").read_text()


def test_the_lab_uses_only_public_library_names():
    private = {}
    for p in _modules(LAB):
        names = [m for m in _absolute_imports(p, LAB) if m.split(".")[0] == "mpo_rs"]
        bad = sorted(m for m in names if any(part.startswith("_") for part in m.split(".")[1:]))
        if bad:
            private[str(p.relative_to(ROOT))] = bad
    assert not private


def test_the_lab_packages_stand_in_layers():
    wrong = {}
    for p in _modules(LAB):
        top = p.relative_to(LAB).parts[0].removesuffix(".py")
        if top not in LAB_LAYERS:
            continue
        used = {m.split(".")[1] for m in _absolute_imports(p, LAB) if m.startswith("mpo_lab.")}
        above = sorted(u for u in used if u in LAB_LAYERS and LAB_LAYERS.index(u) < LAB_LAYERS.index(top))
        if above:
            wrong[str(p.relative_to(ROOT))] = above
    assert not wrong


def test_mpo_rs_advantages_loads_no_lab_module(tmp_path):
    # The command's whole import closure, as `mpo-rs advantages --help` loads it.
    code = (
        "import sys\n"
        "from mpo_rs.cli import main\n"
        "try:\n    main(['advantages', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mpo_lab', 'torch', 'matplotlib')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_losses_do_not_load_the_training_loop():
    code = "import sys\nfrom mpo_rs.torch import policy_loss\nprint('mpo_rs.torch.learner' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
