"""The formatting the benchmark page and its plots share: times, ratios, sizes, short
labels, markdown tables and the reading of a suite's timed rows."""

from __future__ import annotations

from typing import Any

from labels import MPO_GAE_UNIT


def fmt_s(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:,.0f}"


def fmt_ratio(x: float) -> str:
    return f"{x:.2g}" if x < 0.1 else f"{x:.2f}"


def fmt_speedup(x: float) -> str:
    return f"{x:,.0f}×" if x >= 100 else f"{x:.1f}×" if x >= 10 else f"{x:.2f}×"


def fmt_bytes(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


def short(name: str) -> str:
    """Short labels for plot legends and wide tables."""
    for prefix, label in (
        ("memory floor: copy 2 inputs to 2 new", "floor (new arrays)"),
        ("memory floor: copy 2 inputs into", "floor (preallocated)"),
        ("mpo_rs.gae_advantages + whitening", "mpo_rs GAE + whitening"),
        (MPO_GAE_UNIT, "mpo_rs GAE (γ=λ=1)"),
        ("mpo_rs.gae_advantages", "mpo_rs GAE"),
        ("mpo_rs.mae_advantages", "mpo_rs MAE"),
        ("verl 0.9.1 compute_gae", "verl GAE"),
        ("torchrl", "torchrl GAE"),
        ("stateset-rl-core batch_compute_gae", "stateset GAE"),
        ("numpy reverse loop", "numpy loop"),
        ("numpy reverse cumsum", "numpy cumsum (γ=λ=1)"),
        ("NeMo-RL-style", "NeMo-RL-style (γ=λ=1)"),
        ("slime-style", "slime-style (γ=λ=1)"),
        ("scipy.signal.lfilter", "scipy lfilter"),
    ):
        if name.startswith(prefix):
            return label
    return name


def table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def medians(result: dict[str, Any]) -> dict[str, float]:
    return {r["name"]: r["median_s"] for r in result.get("rows", [])}


def row_groups(result: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The suite's timed runs: its main rows, and the γ = λ = 1 rows of the GAE suite (timed
    in a run of their own; a peer's baseline is always in its own run)."""
    return [result.get("rows", [])] + ([result["unit"]["rows"]] if "unit" in result else [])


def best_speedup(rows: list[dict[str, Any]]) -> tuple[str, float] | None:
    """The peer that mpo_rs beats by most in one run: (name, peer time / mpo_rs time)."""
    by_name = {r["name"]: r for r in rows}
    found = [
        (r["name"], r["median_s"] / by_name[r["baseline"]]["median_s"])
        for r in rows
        if r["baseline"] in by_name and not r["name"].startswith("mpo_rs")
    ]
    return max(found, key=lambda x: x[1]) if found else None
