"""Turns the suites' JSON results into markdown sections and PNG plots.

`render_suite(result)` is one suite's section (what a suite prints when run alone);
`write_report(results, ...)` writes the whole page and its plots (`run_all.py` calls it;
the plots are drawn by `plots.py`, the shared formatting is `formatting.py`).
Every number shown comes from the results; ratios are taken between medians of one suite
run, never across runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from formatting import best_speedup, fmt_bytes, fmt_ratio, fmt_s, fmt_speedup, medians, row_groups, short, table
from labels import BANDWIDTH_FLOOR, FLOOR, MPO_GAE, MPO_GAE_WHITENED, MPO_MAE
from plots import write_plots

# Where each γ = λ = 1 baseline's idea comes from (the rows are written here, not copied).
UNIT_BASELINES = (
    "**Baselines at γ = λ = 1** (written for this benchmark from the peers' descriptions, not "
    "copied; each is checked against mpo_rs before timing). At γ = λ = 1 GAE is the reward-to-go "
    "minus the value, so vectorised trainers replace the token recurrence with cumulative sums. "
    "*NeMo-RL-style*: NVIDIA-NeMo/RL PR #4156 (`nemo_rl/algorithms/advantage_estimator.py`, "
    "`GeneralizedAdvantageEstimator`'s path for gae_gamma = gae_lambda = 1): on padded (B, L) rows "
    "with a binary response mask, a reverse cumulative sum of the masked rewards minus the value of "
    "the next valid token (a reverse running minimum of positions and a gather), which reproduces "
    "its loop's carry-forward over masked tokens. *slime-style*: THUDM/slime's chunked discounted "
    "scan (`slime/utils/ppo_utils.py`, `chunked_gae`, which issue #2229 / PR #2205 reuse for the "
    "REINFORCE++ returns): on padded policy-token rows, δ_t = r_t + V_{t+1} − V_t, a suffix sum "
    "inside each 128-token chunk as one matrix product with the triangular decay matrix (all ones at "
    "γλ = 1), and a Python recurrence that carries each chunk's total to the chunks before it. "
    "*numpy cumsum*: the same reward-to-go on mpo_rs's flat layout, one float64 reverse cumulative "
    "sum over the batch minus its value at each trajectory's end: the cheapest vectorised code a user "
    "can write without a native kernel."
)

RLOO_BASELINES = (
    "**RLOO baselines.** *verl 0.9.1 compute_rloo_vectorized_outcome_advantage* is verl-project/verl "
    'PR #3555 ("130 ms -> 6 ms"): it sums the token rewards to scores, maps the group ids with '
    "`np.unique`, and takes each group's size G and sum S with `bincount`: (G·r − S)/(G − 1). "
    "*torch RLOO from verl #3555's idea* is that formula written here in plain torch "
    "(scatter-add for G and S), given the per-trajectory scores and integer group ids as mpo_rs is, "
    "per trajectory and broadcast over the padded response mask."
)


# ---------------------------------------------------------------------------------------
# Sections


def comparison_table(result: dict[str, Any], run_rows: list[dict[str, Any]] | None = None) -> str:
    """One row per implementation; peers carry mpo_rs time / their time (same run), as a
    ratio of medians and, as a check against interference from other load, of minimums."""
    run_rows = result["rows"] if run_rows is None else run_rows
    by_name = {r["name"]: r for r in run_rows}
    rows = []
    for r in run_rows:
        base = by_name.get(r["baseline"] or "")
        if base:
            ratio = base["median_s"] / r["median_s"]
            cells = [
                short(base["name"]),
                fmt_ratio(ratio),
                fmt_ratio(base["min_s"] / r["min_s"]),
                fmt_speedup(1 / ratio),
            ]
        else:
            cells = ["—", "—", "—", "—"]
        rows.append([r["name"], r["layout"], fmt_s(r["median_s"]), fmt_s(r["min_s"]), str(r["repeats"]), *cells])
    header = [
        "implementation",
        "input layout",
        "median ms",
        "min ms",
        "runs",
        "compared with",
        "mpo_rs / this (medians)",
        "(minimums)",
        "this / mpo_rs",
    ]
    return table(header, rows, "llrrrlrrr")


def checks_table(checks: list[dict[str, Any]]) -> str:
    if not checks:
        return "_No peer could be checked._"
    rows = [
        [c.get("suite", ""), c["peer"], c["compared"], f"{c['values']:,}", f"{c['max_abs_err']:.1e}"] for c in checks
    ]
    return table(["suite", "peer", "compared with mpo_rs", "values", "max abs error"], rows, "lllrr")


def skipped_lines(skipped: list[dict[str, Any]]) -> str:
    return "\n".join(f"- **{s['peer']}** not run: {s['reason']}" for s in skipped)


def batch_line(batch: dict[str, Any]) -> str:
    return (
        f"{batch['trajectories']:,} trajectories, {batch['tokens']:,} tokens "
        f"({batch['policy_tokens']:,} policy tokens in {batch['turns']:,} turns; longest trajectory "
        f"{batch['max_trajectory_tokens']:,} tokens; groups of {batch['group_size']})"
    )


def render_gae(result: dict[str, Any]) -> str:
    med = medians(result)
    floors = []
    for name in (MPO_GAE, MPO_MAE):
        if name in med and FLOOR in med:
            floors.append(
                f"- {short(name)}: {med[name] / med[FLOOR]:.2f}× the memory floor with new arrays, {med[name] / med[BANDWIDTH_FLOOR]:.2f}× the floor into preallocated arrays"
            )
    targets = [
        f"- target: {t['target']}: {t['value']:.2f}×  {'ok' if t['ok'] else 'MISSED'}"
        + (f"  (ratio of minimums: {t['of_minimums']:.2f}×)" if "of_minimums" in t else "")
        for t in result["targets"]
    ]
    parts = [
        f"Batch: {batch_line(result['batch'])}. γ = {result['params']['gamma']}, λ = {result['params']['lam']}; "
        f"MAE with its {result['params']['mae']}. Median of up to {result['repeats']} interleaved runs.",
        comparison_table(result),
        "\n".join(floors),
        "Targets of the estimator work (GAE/MAE against stateset-rl-core and the floor), judged on medians:\n\n"
        + "\n".join(targets),
    ]
    if "unit" in result:
        unit = result["unit"]
        parts += [
            f"**γ = λ = 1 against the vectorised peers** (same batch, timed in a run of their own; "
            f"γ = {unit['params']['gamma']}, λ = {unit['params']['lam']}, mpo_rs with lam_critic = λ):",
            comparison_table(result, unit["rows"]),
            UNIT_BASELINES,
        ]
        lead, unit_lead = best_speedup(result["rows"]), best_speedup(unit["rows"])
        if lead and unit_lead:
            parts.append(
                f"- largest speed-up of mpo_rs at λ = {result['params']['lam']}: {fmt_speedup(lead[1])} "
                f"({short(lead[0])}); at γ = λ = 1 against the vectorised peers: {fmt_speedup(unit_lead[1])} "
                f"({short(unit_lead[0])})"
            )
    if result["skipped"]:
        parts.append(skipped_lines(result["skipped"]))
    return "\n\n".join(parts)


def render_group(result: dict[str, Any]) -> str:
    parts = [
        f"Batch: {batch_line(result['batch'])}; ε = {result['params']['eps']}. Median of up to {result['repeats']} interleaved runs.",
        comparison_table(result),
        RLOO_BASELINES,
    ]
    if result["skipped"]:
        parts.append(skipped_lines(result["skipped"]))
    return "\n\n".join(parts)


def render_losses(result: dict[str, Any]) -> str:
    shape, med, target = result["shape"], medians(result), result["target"]
    parts = [
        f"Shape: B = {shape['batch']}, L = {shape['length']} ({shape['policy_tokens']:,} policy tokens in {shape['turns']:,} turns), "
        f"{shape['dtype']} on {shape['device']} ({shape['torch_threads']} torch threads); forward + backward, median of {result['repeats']} interleaved runs.",
        comparison_table(result),
    ]
    if target["case"] in med and target["baseline"] in med:
        ratio = med[target["case"]] / med[target["baseline"]]
        parts.append(f"- target: {target['text']}: {ratio:.2f}×  {'ok' if ratio <= target['limit'] else 'MISSED'}")
    if result["skipped"]:
        parts.append(skipped_lines(result["skipped"]))
    return "\n\n".join(parts)


def render_parquet(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"_Not run: {result['skipped']}_"
    return f"Output of `{result['command']}` (its own format):\n\n" + result["output"].strip()


def render_scaling(result: dict[str, Any]) -> str:
    parts = []
    # Token sweep: throughput per implementation and size.
    sizes = sorted({p["tokens"] for p in result["tokens"]})
    names = list(dict.fromkeys(p["name"] for p in result["tokens"]))
    cell = {(p["name"], p["tokens"]): p for p in result["tokens"]}
    rows = []
    for n in sizes:
        row = [f"{n:,}"]
        for name in names:
            p = cell.get((name, n))
            row.append(f"{n / p['median_s'] / 1e6:,.1f}" if p else "—")
        rows.append(row)
    parts.append(
        "**Throughput, million tokens per second** (all tokens of the batch, observations included; — = not run, see below):\n\n"
        + table(["tokens"] + [short(n) for n in names], rows)
    )
    # Speed-up of mpo_rs GAE over each peer at each size.
    peer_names = [n for n in names if not n.startswith(("mpo_rs", "memory floor"))]
    rows = []
    for n in sizes:
        row = [f"{n:,}"]
        for name in peer_names:
            ours = cell.get((MPO_GAE_WHITENED if name.startswith("verl") else MPO_GAE, n))
            p = cell.get((name, n))
            row.append(fmt_ratio(ours["median_s"] / p["median_s"]) if p and ours else "—")
        rows.append(row)
    parts.append(
        "**mpo_rs GAE time / peer time** at each size (verl against mpo_rs GAE + whitening, since it whitens):\n\n"
        + table(["tokens"] + [short(n) for n in peer_names], rows)
    )
    if result["tokens_skipped"]:
        parts.append(
            "Not run:\n\n"
            + "\n".join(
                f"- {short(s['name'])} at {s['tokens']:,} tokens: {s['reason']}" for s in result["tokens_skipped"]
            )
        )
    # Threads.
    th = {r["name"]: r for r in result["threads"]}
    rows = []
    for est in ("mpo_rs.gae_advantages", "mpo_rs.mae_advantages"):
        one, two = th.get(f"{est}, 1 thread"), th.get(f"{est}, 2 threads")
        if one and two:
            rows.append(
                [
                    short(est),
                    fmt_s(one["median_s"]),
                    fmt_s(two["median_s"]),
                    f"{one['median_s'] / two['median_s']:.2f}×",
                ]
            )
    tokens = result["threads"][0]["tokens"] if result["threads"] else 0
    parts.append(
        f"**Threads** ({tokens:,} tokens; `mpo_rs.set_num_threads`):\n\n"
        + table(["estimator", "1 thread, ms", "2 threads, ms", "speed-up"], rows)
    )
    # Peak memory.
    rows = []
    floor = next((m for m in result["memory"] if m["name"] == result["floors"][0] and "tokens" in m), None)
    for m in result["memory"]:
        if "tokens" not in m:
            rows.append([m["name"], "—", "—", "—", m["skipped"]])
            continue
        per_token = (m["layout_bytes"] + m["call_bytes"]) / m["tokens"]
        vs_floor = (
            f"{(m['layout_bytes'] + m['call_bytes']) / floor['call_bytes']:.1f}×"
            if floor and floor["call_bytes"]
            else "—"
        )
        rows.append([m["name"], fmt_bytes(m["layout_bytes"]), fmt_bytes(m["call_bytes"]), f"{per_token:.1f}", vs_floor])
    probe_tokens = next((m["tokens"] for m in result["memory"] if "tokens" in m), 0)
    batch_bytes = next((m["batch_bytes"] for m in result["memory"] if "tokens" in m), 0)
    parts.append(
        f"**Peak memory** at {probe_tokens:,} tokens (the flat batch itself: {fmt_bytes(batch_bytes)}), each implementation in a fresh process: "
        "what building the peer's input layout adds, and the peak that one call adds, outputs included:\n\n"
        + table(["implementation", "input layout", "one call (peak)", "bytes / token", "× floor"], rows, "lrrrr")
    )
    # Shape sweeps.
    for key, label in (("turns", "turns per trajectory (mean)"), ("turn_len", "turn length (mean tokens)")):
        values = sorted({p[key] for p in result[key]})
        names = list(dict.fromkeys(p["name"] for p in result[key]))
        cell = {(p["name"], p[key]): p for p in result[key]}
        rows = [
            [str(v)]
            + [
                f"{cell[(n, v)]['median_s'] / cell[(n, v)]['tokens'] * 1e9:.2f}" if (n, v) in cell else "—"
                for n in names
            ]
            for v in values
        ]
        parts.append(
            f"**Nanoseconds per token vs {label}** (about {int(result['config']['shape_tokens']):,} tokens per batch):\n\n"
            + table([key] + [short(n) for n in names], rows)
        )
    return "\n\n".join(parts)


RENDERERS = {
    "gae": render_gae,
    "group": render_group,
    "losses": render_losses,
    "parquet": render_parquet,
    "scaling": render_scaling,
}


def render_suite(result: dict[str, Any]) -> str:
    return f"## {result['title']}\n\n" + RENDERERS[result["suite"]](result)


# ---------------------------------------------------------------------------------------
# The page


SUITE_ORDER = ("gae", "group", "scaling", "losses", "parquet")


def summary_table(results: dict[str, dict[str, Any]]) -> str:
    rows = []
    for key in ("gae", "group", "losses"):
        res = results.get(key)
        if not res or "rows" not in res:
            continue
        for run_rows in row_groups(res):
            by_name = {r["name"]: r for r in run_rows}
            for r in run_rows:
                base = by_name.get(r["baseline"] or "")
                if base and not r["name"].startswith("mpo_rs"):
                    ratio = base["median_s"] / r["median_s"]
                    rows.append(
                        [
                            r["name"],
                            base["name"],
                            fmt_ratio(ratio),
                            fmt_ratio(base["min_s"] / r["min_s"]),
                            fmt_speedup(1 / ratio),
                        ]
                    )
    return table(
        ["peer", "mpo_rs doing the same work", "mpo_rs / peer (medians)", "(minimums)", "peer / mpo_rs"], rows, "llrrr"
    )


KEPT_SECTIONS = (
    "## GiGPO against a dictionary-of-groups implementation",
    "## rlox: a native GAE peer",
    "## Reproduction harness A/B",
)
"""Sections other benchmarks write into the page (benches/bench_gigpo.py, bench_rlox.py and
bench_reproduce.py with --docs): a re-run of the suites keeps them as they are."""


def _kept_sections(md_path: str) -> list[str]:
    try:
        text = Path(md_path).read_text()
    except OSError:
        return []
    out = []
    for title in KEPT_SECTIONS:
        start = text.find(title + "\n")
        if start >= 0:
            end = text.find("\n## ", start + len(title))
            out += [text[start : end if end >= 0 else len(text)].rstrip("\n"), ""]
    return out


def write_report(
    results: dict[str, dict[str, Any]],
    md_path: str,
    img_dir: str,
    *,
    command: str,
    quick: bool,
    failures: dict[str, str],
) -> None:
    plots = write_plots(results, img_dir)
    rel = os.path.relpath(img_dir, os.path.dirname(os.path.abspath(md_path)))
    first = next(iter(results.values()), {})
    m = first.get("machine", {})
    versions: dict[str, str] = {}
    for res in results.values():
        versions.update(res.get("versions", {}))
    load_averages = ", ".join(
        f"{key} {res['load_average']:.1f}" for key, res in results.items() if "load_average" in res
    )
    out = [
        "# Benchmarks: mpo_rs against the tools people use today",
        "",
        f"_Generated by `{command}` on {first.get('date', '?')}{' (quick smoke run: small sizes, few repeats)' if quick else ''}. "
        "A re-run overwrites this page and the plots in `img/`, except the sections that "
        "`python benches/bench_gigpo.py`, `bench_rlox.py` and `bench_reproduce.py` write (GiGPO, rlox, "
        "Reproduction harness A/B), which a re-run keeps; nothing here is typed in by hand._",
        "",
        f"**Machine:** {m.get('cpu', '?')}, {m.get('logical_cores', '?')} logical cores, {m.get('memory_gib', '?')} GiB, {m.get('os', '?')}; "
        f"Python {m.get('python', '?')}; mpo_rs pool {m.get('mpo_rs_threads', '?')} threads, torch {m.get('torch_threads', '?')} threads. "
        f"Load average (1 min) when each suite started: {load_averages} "
        "(a load above the core count means other work shared the CPUs and times are noisier).",
        "",
        "**Versions:** " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".",
        "",
        "**How to read.** Every ratio is *mpo_rs time / peer time* for the same work on the same batch, "
        "both medians of one run in which the cases were interleaved (their order rotates each round, "
        "so load drifts hit all of them alike); below 1 means mpo_rs is faster, and *peer / mpo_rs* is "
        "the speed-up. The ratio of the minimum times stands beside it: other load only ever adds "
        "time, so where the two disagree the machine was busy (multi-threaded torch suffers most "
        "when a core is taken) and the minimums are the better guide. Before every timed call the caches are flushed (as in a training step, where the "
        "estimator runs after the model). Each peer gets the batch in its own native layout, built "
        "before timing and not counted (padded rows for verl, policy-token arrays for stateset-rl-core "
        "and scipy, one policy-token sequence with done flags for torchrl); mpo_rs takes the flat "
        "tokens with the mask, observations included. Each suite runs in its own process. Before "
        "timing, each peer's output is checked against mpo_rs on the semantics they share "
        "([equality checks](#equality-checks)); a peer that differs is not timed.",
        "",
        "## Summary",
        "",
        summary_table(results),
        "",
    ]
    if plots["speedup"]:
        out += [f"![speed-up of mpo_rs over each peer]({rel}/speedup.png)", ""]
    for key in SUITE_ORDER:
        if key in failures:
            out += [f"## Suite `{key}` failed", "", "```text", failures[key].strip()[-3000:], "```", ""]
        if key not in results:
            continue
        out += [render_suite(results[key]), ""]
        if key == "scaling":
            for name, alt in (
                ("throughput", "throughput vs tokens"),
                ("shapes", "cost per token vs turns and turn length"),
                ("memory", "peak memory per token"),
            ):
                if plots[name]:
                    out += [f"![{alt}]({rel}/{name}.png)", ""]
    checks = [{"suite": key, **c} for key in SUITE_ORDER for c in results.get(key, {}).get("checks", [])]
    out += [
        "## Equality checks",
        "",
        "What was compared before timing (tolerance: |peer − mpo_rs| ≤ 1e-3 + 1e-4·|mpo_rs|). "
        "verl 0.9.1's `compute_gae_advantage_return` whitens its advantages over the policy tokens "
        "(`masked_whiten`): its returns (advantages + values, before whitening) are compared directly "
        "and its advantages after the same whitening is applied to mpo_rs's output; the timed "
        "counterpart of verl is therefore *mpo_rs GAE + that whitening in numpy*. All GAE peers use "
        "returns = advantages + values, i.e. mpo_rs with `lam_critic = lam`. verl's group estimators "
        "treat a group of one differently (GRPO: score/(1+ε), RLOO: the score; mpo_rs: 0): the batch "
        "has no singleton groups.",
        "",
        checks_table(checks),
        "",
        *_kept_sections(md_path),
        "## Reproduce",
        "",
        "<!-- not run: the benchmarks themselves (tens of minutes) -->",
        "```bash",
        "make bench         # release build, peers in .venv-bench, every suite, this page",
        "make bench-quick   # the same on small sizes, written to build/bench-quick/",
        "python benches/suite_gae.py --quick   # one suite alone (also suite_group, suite_scaling, suite_losses)",
        "python benches/bench_gigpo.py --docs docs/benchmarks.md   # GiGPO against a dict-of-groups implementation",
        "python benches/bench_rlox.py --docs docs/benchmarks.md    # rlox 1.2 beside stateset-rl-core (kernel, whole job)",
        "```",
        "",
    ]
    with open(md_path, "w") as f:
        f.write("\n".join(out))
