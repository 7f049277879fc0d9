"""The benchmark page's PNG plots (matplotlib, imported when a plot is drawn); each
returns False, drawing nothing, when its results are missing."""

from __future__ import annotations

import os
from typing import Any

from formatting import fmt_speedup, row_groups, short


def line_style(name: str) -> dict[str, Any]:
    """Floors grey and dashed (dotted: preallocated), mpo_rs bold, peers thin."""
    if name.startswith("memory floor"):
        return {"color": "gray", "ls": ":" if "preallocated" in name else "--", "marker": "o", "ms": 3, "lw": 1.3}
    return {"marker": "o", "ms": 4, "lw": 2.4 if name.startswith("mpo_rs") else 1.3}


def plot_speedups(results: dict[str, dict[str, Any]], path: str) -> bool:
    import matplotlib.pyplot as plt

    bars = []  # (label, peer time / mpo_rs time)
    for key in ("gae", "group", "losses"):
        res = results.get(key)
        if not res or "rows" not in res:
            continue
        for run_rows in row_groups(res):
            med = {r["name"]: r["median_s"] for r in run_rows}
            for r in run_rows:
                if r["baseline"] and r["baseline"] in med and not r["name"].startswith("mpo_rs"):
                    bars.append((f"{r['name']}\nvs {short(r['baseline'])}", r["median_s"] / med[r["baseline"]]))
    if not bars:
        return False
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(bars) + 1.5))
    labels, values = zip(*reversed(bars), strict=True)
    colors = ["tab:green" if v >= 1 else "tab:red" for v in values]
    ax.barh(range(len(bars)), values, color=colors)
    ax.set_yticks(range(len(bars)), labels, fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1, color="black", lw=0.8)
    for i, v in enumerate(values):
        ax.text(v, i, f" {fmt_speedup(v)}", va="center", fontsize=8)
    ax.set_xlabel("peer time / mpo_rs time (log scale; > 1: mpo_rs is faster)")
    ax.set_title("Speed-up of mpo_rs over each peer (same batch, same run)")
    ax.set_xlim(min(values) / 2, max(values) * 8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_throughput(scaling: dict[str, Any], path: str) -> bool:
    import matplotlib.pyplot as plt

    if not scaling.get("tokens"):
        return False
    fig, ax = plt.subplots(figsize=(10.5, 5.5))
    names = list(dict.fromkeys(p["name"] for p in scaling["tokens"]))
    for name in names:
        pts = sorted((p["tokens"], p["tokens"] / p["median_s"]) for p in scaling["tokens"] if p["name"] == name)
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, label=short(name), **line_style(name))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens per batch (observations included)")
    ax.set_ylabel("tokens per second")
    ax.set_title("Throughput vs batch size (token GAE / MAE)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_shapes(scaling: dict[str, Any], path: str) -> bool:
    import matplotlib.pyplot as plt

    if not scaling.get("turns") or not scaling.get("turn_len"):
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, key, label in (
        (axes[0], "turns", "turns per trajectory (mean)"),
        (axes[1], "turn_len", "turn length, tokens (mean)"),
    ):
        for name in dict.fromkeys(p["name"] for p in scaling[key]):
            pts = sorted((p[key], p["median_s"] / p["tokens"] * 1e9) for p in scaling[key] if p["name"] == name)
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, label=short(name), **line_style(name))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("nanoseconds per token")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Cost per token vs batch shape (about {int(scaling['config']['shape_tokens']):,} tokens per batch)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_memory(scaling: dict[str, Any], path: str) -> bool:
    import matplotlib.pyplot as plt

    mem = [m for m in scaling.get("memory", []) if "tokens" in m]
    if not mem:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(mem) + 1.5))
    labels = [short(m["name"]) for m in mem][::-1]
    layout = [m["layout_bytes"] / m["tokens"] for m in mem][::-1]
    call = [m["call_bytes"] / m["tokens"] for m in mem][::-1]
    ax.barh(range(len(mem)), layout, color="tab:orange", label="building the peer's input layout")
    ax.barh(range(len(mem)), call, left=layout, color="tab:blue", label="one call (peak, outputs included)")
    ax.set_yticks(range(len(mem)), labels, fontsize=9)
    ax.set_xlabel("bytes per token of the batch")
    ax.set_title(f"Peak memory added on top of the flat batch ({mem[0]['tokens']:,} tokens)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_plots(results: dict[str, dict[str, Any]], img_dir: str) -> dict[str, bool]:
    """Every plot of the page into ``img_dir``: which of them were drawn."""
    os.makedirs(img_dir, exist_ok=True)
    scaling = results.get("scaling", {})
    return {
        "speedup": plot_speedups(results, os.path.join(img_dir, "speedup.png")),
        "throughput": plot_throughput(scaling, os.path.join(img_dir, "throughput.png")),
        "shapes": plot_shapes(scaling, os.path.join(img_dir, "shapes.png")),
        "memory": plot_memory(scaling, os.path.join(img_dir, "memory.png")),
    }
