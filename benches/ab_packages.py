"""A/B of two builds of mpo_rs in one run: instructions (callgrind; the same count whatever
else the machine is doing) and interleaved wall-clock medians, for the estimator calls and
`mpo-rs advantages` on one Parquet log.

    python benches/ab_packages.py --old DIR --new DIR [--parquet FILE] [--no-callgrind]

DIR is a directory holding an importable `mpo_rs` (an unpacked wheel, or a checkout's
`python/` with its built extension). Used for the redesign (issue 12): old = the last commit
before it, new = main; figures in docs/benchmarks.md ("Redesign A/B").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# The child: builds a seeded batch (512 trajectories, ~300k tokens, 60-token turns), then
# runs WHAT `n` times after one warm-up call. Both builds accept these calls unchanged.
CHILD = r"""
import json, os, sys, time
import numpy as np
import mpo_rs
from mpo_rs import estimators as E
from mpo_rs.cli import main as cli_main
what, n, parquet, out, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
mpo_rs.set_num_threads(threads)
rng = np.random.default_rng(0)
lengths = rng.integers(240, 960, size=512)
offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
mask = (np.concatenate([np.arange(n_) for n_ in lengths]) // 60) % 2 == 0
values = rng.standard_normal(int(offsets[-1])).astype(np.float32)
scores = rng.integers(0, 2, size=512).astype(np.float32)
groups = np.repeat(np.arange(128), 4).astype(np.int64)
calls = {
    "mae": lambda: E.mae_advantages(values, mask, offsets, scores=scores),
    "gae": lambda: E.gae_advantages(values, mask, offsets, scores=scores),
    "grpo": lambda: E.group_advantages(scores, groups),
    "parquet_mae": lambda: cli_main(["advantages", parquet, "-o", os.path.join(out, "o.parquet"), "--estimator", "mae"]),
}
f = calls[what]
f()
times = []
for _ in range(n):
    t0 = time.perf_counter(); f(); times.append(time.perf_counter() - t0)
print(json.dumps(min(times) if times else 0.0))
"""
CALLS = ("mae", "gae", "grpo", "parquet_mae")


def child(pkg: str, what: str, n: int, parquet: str, threads: int, valgrind: bool) -> tuple[float, int | None]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-c", CHILD, what, str(n), parquet, out, str(threads)]
        if valgrind:
            cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd]
        env = {**os.environ, "PYTHONPATH": pkg}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=out)
    ir = re.search(r"Collected : (\d+)", done.stderr)
    return float(done.stdout.strip().splitlines()[-1]), int(ir.group(1)) if ir else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--parquet", help="a rollout log (default: a ~10 MB synthetic one)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-callgrind", action="store_true")
    args = ap.parse_args()
    sides = {"old": str(Path(args.old).resolve()), "new": str(Path(args.new).resolve())}
    tmp = tempfile.mkdtemp(prefix="ab-")
    parquet = args.parquet
    if parquet is None:
        parquet = os.path.join(tmp, "log.parquet")
        subprocess.run(
            [sys.executable, "-c", "import sys; from mpo_rs.synthetic import flat_batches, write_parquet; "
             "write_parquet(sys.argv[1], flat_batches(600, 200, seed=1), row_group_rows=200)", parquet],
            env={**os.environ, "PYTHONPATH": sides["new"]}, check=True,
        )  # fmt: skip
    result: dict[str, dict[str, float]] = {}
    if not args.no_callgrind and shutil.which("valgrind"):
        for what in CALLS:
            reps = 2 if what.startswith("parquet") else 10
            ir = {
                s: child(p, what, reps, parquet, 1, True)[1] - child(p, what, 0, parquet, 1, True)[1]
                for s, p in sides.items()
            }  # type: ignore[operator]
            result.setdefault(what, {})["instructions new/old"] = ir["new"] / ir["old"]
            print(
                f"{what:12s} instructions per call: old {ir['old'] / reps:,.0f}  new {ir['new'] / reps:,.0f}  new/old {ir['new'] / ir['old']:.3f}"
            )
    for what in CALLS:
        best: dict[str, list[float]] = {s: [] for s in sides}
        for r in range(args.rounds):
            order = list(sides.items()) if r % 2 == 0 else list(reversed(sides.items()))
            for s, p in order:
                best[s].append(
                    child(p, what, 3 if what.startswith("parquet") else 20, parquet, os.cpu_count() or 1, False)[0]
                )
        o, n = statistics.median(best["old"]), statistics.median(best["new"])
        result.setdefault(what, {})["wall new/old"] = n / o
        print(
            f"{what:12s} wall (median of {args.rounds} interleaved rounds' best): old {o * 1e3:.2f} ms  new {n * 1e3:.2f} ms  new/old {n / o:.3f}"
        )
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
