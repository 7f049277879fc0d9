"""A/B of two builds of mpo_rs in one run: instructions (callgrind; the same count whatever
else the machine is doing) and interleaved wall-clock medians, for the estimator calls and
`mpo-rs advantages` on one Parquet log.

    python benches/ab_packages.py --old DIR --new DIR [--parquet FILE] [--no-callgrind]
    python benches/ab_packages.py --old DIR --new DIR --small 16 64   # per-call overhead

DIR is a directory holding an importable `mpo_rs` (an unpacked wheel, or a checkout's
`python/` with its built extension). The default calls run on 512 trajectories (~300k
tokens) and one Parquet log; ``--small N ...`` runs instead each family's public function
(mae, gae, bilevel, group) on online steps of N short trajectories (~60 tokens, 12-token
turns), where the fixed cost of a call shows. Instructions are the median of
``--callgrind-rounds`` interleaved counts per side. Figures: docs/architecture.md ("The
redesign's A/B" and after).
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

# The child: builds a seeded batch (SIZE 0: 512 trajectories, ~300k tokens, 60-token turns;
# else SIZE trajectories of 24-96 tokens, 12-token turns), then runs WHAT `n` times after
# one warm-up call. Both builds accept these calls unchanged.
CHILD = r"""
import json, os, sys, time
import numpy as np
import mpo_rs
from mpo_rs import estimators as E
from mpo_rs.cli import main as cli_main
what, n, parquet, out, threads, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
mpo_rs.set_num_threads(threads)
rng = np.random.default_rng(size)
n_traj, (low, high), turn = (size, (24, 96), 12) if size else (512, (240, 960), 60)
lengths = rng.integers(low, high, size=n_traj)
offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
mask = (np.concatenate([np.arange(n_) for n_ in lengths]) // turn) % 2 == 0
values = rng.standard_normal(int(offsets[-1])).astype(np.float32)
scores = rng.integers(0, 2, size=n_traj).astype(np.float32)
groups = np.repeat(np.arange(n_traj // 4), 4).astype(np.int64)
calls = {
    "mae": lambda: E.mae_advantages(values, mask, offsets, scores=scores),
    "gae": lambda: E.gae_advantages(values, mask, offsets, scores=scores),
    "bilevel": lambda: E.bilevel_advantages(values, mask, offsets, scores=scores),
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
SMALL_CALLS = ("grpo", "mae", "gae", "bilevel")


def child(
    pkg: str, what: str, n: int, parquet: str, threads: int, valgrind: bool, size: int = 0
) -> tuple[float, int | None]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-c", CHILD, what, str(n), parquet, out, str(threads), str(size)]
        if valgrind:
            # Fair scheduling hands the one lock valgrind runs threads under in a fixed order, so
            # the pool's hand-over to its worker costs the same instructions run after run.
            cmd = ["valgrind", "--tool=callgrind", "--fair-sched=yes", "--callgrind-out-file=/dev/null", *cmd]
        # One BLAS thread (idle OpenBLAS workers would add their spinning to the count) and
        # one hash seed (dict layouts, hence instruction counts, vary with it).
        env = {**os.environ, "PYTHONPATH": pkg, "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=out)
    ir = re.search(r"Collected : (\d+)", done.stderr)
    return float(done.stdout.strip().splitlines()[-1]), int(ir.group(1)) if ir else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--parquet", help="a rollout log (default: a ~10 MB synthetic one)")
    ap.add_argument(
        "--small", type=int, nargs="+", metavar="N", help="trajectories per small batch (per-call overhead)"
    )
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of wall-clock timing")
    ap.add_argument("--callgrind-rounds", type=int, default=3, help="interleaved counts per side (median)")
    ap.add_argument("--no-callgrind", action="store_true")
    args = ap.parse_args()
    sides = {"old": str(Path(args.old).resolve()), "new": str(Path(args.new).resolve())}
    tmp = tempfile.mkdtemp(prefix="ab-")
    parquet = args.parquet
    if parquet is None and not args.small:
        parquet = os.path.join(tmp, "log.parquet")
        subprocess.run(
            [sys.executable, "-c", "import sys; from mpo_rs.synthetic import flat_batches, write_parquet; "
             "write_parquet(sys.argv[1], flat_batches(600, 200, seed=1), row_group_rows=200)", parquet],
            env={**os.environ, "PYTHONPATH": sides["new"]}, check=True,
        )  # fmt: skip
    # (call, trajectories or 0 for the large batch, calls counted under callgrind, calls timed)
    cases = (
        [(what, size, 200, 200) for size in args.small for what in SMALL_CALLS]
        if args.small
        else [(what, 0, 2, 3) if what.startswith("parquet") else (what, 0, 10, 20) for what in CALLS]
    )
    result: dict[str, dict[str, float]] = {}
    for what, size, reps, _ in cases if not args.no_callgrind and shutil.which("valgrind") else ():
        name = f"{what}@{size}" if size else what
        counts: dict[str, list[int]] = {s: [] for s in sides}
        for r in range(args.callgrind_rounds):
            for s, p in sides.items() if r % 2 == 0 else reversed(sides.items()):
                calls, base = (child(p, what, k, parquet or "", 1, True, size)[1] for k in (reps, 0))
                counts[s].append(calls - base)  # type: ignore[operator]
        ir = {s: statistics.median(c) for s, c in counts.items()}
        result.setdefault(name, {}).update(
            {
                "instructions old": ir["old"] / reps,
                "instructions new": ir["new"] / reps,
                "instructions new/old": ir["new"] / ir["old"],
            }
        )
        print(
            f"{name:12s} instructions per call: old {ir['old'] / reps:,.0f}  new {ir['new'] / reps:,.0f}  new/old {ir['new'] / ir['old']:.3f}"
        )
    for what, size, _, timed in cases:
        name = f"{what}@{size}" if size else what
        best: dict[str, list[float]] = {s: [] for s in sides}
        for r in range(args.rounds):
            order = list(sides.items()) if r % 2 == 0 else list(reversed(sides.items()))
            for s, p in order:
                best[s].append(child(p, what, timed, parquet or "", os.cpu_count() or 1, False, size)[0])
        o, n = statistics.median(best["old"]), statistics.median(best["new"])
        result.setdefault(name, {}).update({"wall old s": o, "wall new s": n, "wall new/old": n / o})
        print(
            f"{name:12s} wall (median of {args.rounds} interleaved rounds' best): old {o * 1e6:.1f} µs  new {n * 1e6:.1f} µs  new/old {n / o:.3f}"
        )
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
