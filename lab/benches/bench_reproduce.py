"""A/B of the reproduction harness in one run: the same arms, budget and seed trained by the
harness of an old commit and by this tree, interleaved, each run in a fresh process with one
torch thread; reports updates per second and the ratio, i.e. the factor in runs per hour.

    python lab/benches/bench_reproduce.py                           # MPO and GRPO on KeyDoor, the old FULL budget
    python lab/benches/bench_reproduce.py --updates 2 --rounds 1    # a smoke check (seconds)
    python lab/benches/bench_reproduce.py --docs docs/benchmarks.md # also rewrite the page's section

"Old" is commit 776ec09 (the harness issue 19 measured: 0.43 s per update), unpacked with
`git archive` into a temporary directory and run with this tree's built extension copied in
(its Python calls the extension's API of that time; pass --old-python DIR for another
build). Both sides get the budget, model and task of the OLD tree's FULL configuration
(read from the old tree; with --updates N, N updates and, unless --eval-every is given, an
evaluation every `eval_every` updates as configured), and run `run_one(config, arm, seed)`:
the sampler, the critic's values pass, the learner step and the evaluations, as one run of
`mpo-rs reproduce` does (no rollout log). A run's wall time excludes the imports. The
ratio is new updates/s over old updates/s of medians over the interleaved rounds (their
order alternates each round, so load drifts hit both alike); the CPU-time ratio stands
beside it (other load inflates wall time more than CPU time). Figures are in
docs/benchmarks.md ("Reproduction harness A/B").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The library's bench helpers (benches/common.py of the repository).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benches"))
import common

ROOT = Path(__file__).resolve().parents[1]
OLD_COMMIT = "776ec09"
SECTION = "## Reproduction harness A/B"

# The child: builds the configuration from the given budget/model/task fields (those its
# own Budget has), trains one run and prints its timings as JSON.
CHILD = r"""
import dataclasses, json, sys, time
import torch
torch.set_num_threads(1)
from mpo_lab.reproduce.config import ModelSpec
from mpo_lab.reproduce.presets import FULL
from mpo_lab.reproduce.run import run_one
spec = json.loads(sys.argv[1])
budget = dataclasses.replace(FULL.budget, **{k: v for k, v in spec["budget"].items() if hasattr(FULL.budget, k)})
task = dataclasses.replace(FULL.task(spec["task"]["name"]), params=tuple(tuple(p) for p in spec["task"]["params"]))
others = tuple(t for t in FULL.tasks if t.name != task.name)
# Both sides start from a random initialisation, the old harness's protocol: the new one's base
# policies and critic warm-ups are made once per (task, seed) and shared by all its arms (their
# cost is reported apart, from the full run's log), not once per run.
scratch = {"base": None, "warmup": None} if hasattr(FULL, "base") else {}
config = dataclasses.replace(FULL, budget=budget, model=ModelSpec(**spec["model"]), tasks=(task, *others), **scratch)
cpu = time.process_time()
result = run_one(config, spec["arm"], spec["seed"])
curve = result["curve"]
mean = lambda key: sum(c.get(key, 0.0) for c in curve) / max(len(curve), 1)
print(json.dumps({
    "wall_s": result["wall_s"], "cpu_s": time.process_time() - cpu, "updates": len(curve),
    "sample_s": mean("sample_s"), "values_s": mean("values_s"), "step_s": mean("step_s"),
    "final_success": result["evals"][-1]["success"],
    "unknown_budget_fields": sorted(k for k in spec["budget"] if not hasattr(FULL.budget, k)),
    "own_budget_fields": sorted(k for k in dataclasses.asdict(FULL.budget) if k not in spec["budget"]),
}))
"""

# Reads the old tree's FULL configuration: the budget both sides get.
READ_FULL = r"""
import dataclasses, json, sys
from mpo_lab.reproduce.presets import FULL
arm = FULL.arm(sys.argv[1])
task = FULL.task(arm.task)
print(json.dumps({"budget": dataclasses.asdict(FULL.budget), "model": dataclasses.asdict(FULL.model),
                  "task": {"name": task.name, "params": [list(p) for p in task.params]}}))
"""


def unpack_old(commit: str, into: Path) -> Path:
    """``python/`` of ``commit`` with this tree's extension copied in."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "python"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    for ext in (ROOT / "python" / "mpo_rs").glob("_native*"):
        if ext.suffix in (".so", ".pyd"):
            shutil.copy2(ext, into / "python" / "mpo_rs" / ext.name)
    return into / "python"


def child(pythonpath: str, code: str, *args: str, nice: int) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", code, *args]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    with tempfile.TemporaryDirectory() as cwd:  # nothing the runs write lands in the tree
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=cwd)
    if done.returncode:
        raise SystemExit(f"child failed ({pythonpath}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def render(results: dict, meta: dict) -> str:
    lines = [
        SECTION,
        "",
        f"_Written by `python lab/benches/bench_reproduce.py{meta['argv']}` on {meta['date']}: "
        f"old = commit {meta['old']}, new = this tree; budget, model and task of the old FULL configuration "
        f"({meta['updates']} updates, {meta['episodes']} episodes per update, eval every {meta['eval_every']}); "
        f"seed {meta['seed']}; one torch thread; median of {meta['rounds']} interleaved rounds. "
        f"Load average (1 min) at the start {meta['load_start']:.1f}, at the end {meta['load_end']:.1f} "
        f"on {os.cpu_count()} cores"
        + (
            " (above the core count, other work shared the CPUs: wall times are inflated and noisier, CPU times "
            "less so)._"
            if max(meta["load_start"], meta["load_end"]) > (os.cpu_count() or 1)
            else " (the benchmark's one process and little else)._"
        ),
        "",
        "| arm | old s/update | new s/update | old: sample / values / step s | new: sample / values / step s "
        "| new/old updates per s (wall) | (CPU time) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for arm, r in results.items():
        split = {
            side: " / ".join(f"{r[f'{side}_{k}']:.3f}" for k in ("sample_s", "values_s", "step_s"))
            for side in ("old", "new")
        }
        lines.append(
            f"| {arm} | {r['old_s_per_update']:.3f} | {r['new_s_per_update']:.3f} | {split['old']} | {split['new']} | "
            f"**{r['speedup_wall']:.2f}×** | {r['speedup_cpu']:.2f}× |"
        )
    lines += [
        "",
        "s/update is a run's wall time (evaluations included, imports not) over its updates; the "
        "speed-up in updates per second is the factor in runs per hour. Both sides start from a random "
        "initialisation, the old harness's protocol: the new one's base policies and critic warm-ups are "
        "made once per (task, seed) and shared by every arm of it, so they are not a per-run cost (the full "
        "run states their time). What changed: "
        'lab/docs/sampler.md ("Speed") and lab/mpo_lab/reproduce/run.py (critic-free arms train no critic).',
        "",
    ]
    return "\n".join(lines)


def _shown_arguments(argv: list[str]) -> list[str]:
    """The arguments that decide the measurement (not where its output goes)."""
    shown, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--docs", "--json"):
            skip = True
        elif not a.startswith(("--docs=", "--json=")):
            shown.append(a)
    return shown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default="mpo,grpo", help="arm keys of the FULL configuration (default: mpo,grpo)")
    ap.add_argument("--old", default=OLD_COMMIT, help=f"the old commit (default {OLD_COMMIT})")
    ap.add_argument("--old-python", help="a directory with an importable old mpo_rs instead of --old")
    ap.add_argument("--updates", type=int, help="updates per run (default: the old FULL budget's)")
    ap.add_argument("--eval-every", type=int, help="evaluate every N updates (default: the budget's)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (one old and one new run per arm)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nice", type=int, default=0, help="run the children under `nice -n N`")
    ap.add_argument("--docs", metavar="PAGE", help="rewrite the section of this page (docs/benchmarks.md)")
    ap.add_argument("--json", metavar="FILE", help="also write the results here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-reproduce-"))
    try:
        old = args.old_python or str(unpack_old(args.old, tmp))
        sides = {"old": str(Path(old).resolve()), "new": str(ROOT / "python")}
        load_start = load_average()
        results: dict[str, dict] = {}
        meta: dict = {}
        for arm in args.arms.split(","):
            spec = child(sides["old"], READ_FULL, arm, nice=0)
            spec["budget"]["updates"] = args.updates or spec["budget"]["updates"]
            if args.eval_every:
                spec["budget"]["eval_every"] = args.eval_every
            spec.update(arm=arm, seed=args.seed)
            b = spec["budget"]
            meta = {"updates": b["updates"], "episodes": b["tasks_per_update"] * b["group_size"],
                    "eval_every": b["eval_every"]}  # fmt: skip
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            for r in range(args.rounds):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for side in order:
                    runs[side].append(child(sides[side], CHILD, json.dumps(spec), nice=args.nice))
                    last = runs[side][-1]
                    print(
                        f"{arm} round {r} {side}: {last['wall_s'] / last['updates']:.3f} s/update "
                        f"(sample {last['sample_s']:.3f}, values {last['values_s']:.3f}, step {last['step_s']:.3f})",
                        flush=True,
                    )
            for side in ("old", "new"):
                if runs[side][0]["unknown_budget_fields"] or runs[side][0]["own_budget_fields"]:
                    print(f"note: {side} budget fields not in the old FULL: {runs[side][0]['own_budget_fields']}; "
                          f"old fields it lacks: {runs[side][0]['unknown_budget_fields']}")  # fmt: skip
            med = {
                side: {key: statistics.median(x[key] / x["updates"] for x in runs[side]) for key in ("wall_s", "cpu_s")}
                for side in runs
            }
            new = runs["new"]
            results[arm] = {
                "old_s_per_update": med["old"]["wall_s"],
                "new_s_per_update": med["new"]["wall_s"],
                **{
                    f"{side}_{key}": statistics.median(x[key] for x in runs[side])
                    for side in ("old", "new")
                    for key in ("sample_s", "values_s", "step_s")
                },
                "speedup_wall": med["old"]["wall_s"] / med["new"]["wall_s"],
                "speedup_cpu": med["old"]["cpu_s"] / med["new"]["cpu_s"],
                "same_final_success": [
                    o["final_success"] == n["final_success"] for o, n in zip(runs["old"], new, strict=True)
                ],
            }
            print(f"{arm}: new/old updates per second {results[arm]['speedup_wall']:.2f}x wall, "
                  f"{results[arm]['speedup_cpu']:.2f}x CPU time", flush=True)  # fmt: skip
        meta.update(
            argv="".join(f" {a}" for a in _shown_arguments(sys.argv[1:])),
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), old=args.old if not args.old_python else old,
            seed=args.seed, rounds=args.rounds, load_start=load_start, load_end=load_average(),
        )  # fmt: skip
        print(json.dumps({"meta": meta, "results": results}))
        if args.json:
            Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
        if args.docs:
            common.write_section(args.docs, render(results, meta), SECTION, before=("## Reproduce",))
            print(f"wrote the section of {args.docs}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
