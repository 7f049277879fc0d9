"""``python -m mpo_rs.demo``: the main job on a realistic synthetic rollout log.

Makes (or reuses) ``demo-data/rollouts.parquet`` -- a few hundred MB of multi-turn agent
trajectories, one row per trajectory: a ~400-token task prompt, ~8 turns of ~120 policy
tokens each separated by ~300-token tool observations, critic values on every token, a
0/1 outcome on the last policy token, and 8 rollouts per prompt -- then runs
``mpo-rs advantages`` on it and prints the summary and a few rows of the result.

:func:`write_rollout_log` (over :mod:`mpo_rs.synthetic`) is also what the Parquet benchmark and
tests generate logs with.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from . import synthetic


def write_rollout_log(
    path: str | os.PathLike[str],
    rows: int,
    *,
    seed: int = 0,
    row_group_rows: int = 1024,
    mean_turns: float = 8.0,
    compression: str = "snappy",
) -> dict[str, int]:
    """Writes a synthetic rollout log of `rows` trajectories to `path` (atomically), one
    row group of `row_group_rows` generated at a time, and returns its row and token
    counts. The shape is :data:`mpo_rs.synthetic.DEMO` with ~`mean_turns` turns."""
    lo = max(1, round(mean_turns) - 2)
    shape = {**synthetic.DEMO, "turns": (lo, lo + 4)}
    written = synthetic.write_parquet(
        path, synthetic.flat_batches(rows, row_group_rows, seed=seed, **shape), compression=compression
    )
    return {"rows": written.rows, "tokens": written.tokens}


def _readable(path: Path) -> bool:
    try:
        import pyarrow.parquet as pq

        return bool(pq.ParquetFile(path).metadata.num_rows > 0)
    except Exception:
        return False


def _show_rows(path: Path, n: int) -> None:
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    t = f.read_row_group(
        0,
        columns=["trajectory_id", "group_id", "score", "loss_mask", "advantages", "turn_advantages"],
    ).slice(0, n)
    print(f"\nfirst {t.num_rows} rows of {path} (advantages over policy tokens only):")
    header = f"{'traj':>5} {'group':>5} {'score':>5} {'tokens':>6} {'policy':>6} {'turns':>5}  {'adv mean':>8} {'adv std':>7}  turn_advantages"
    print(header)
    print("-" * len(header))
    for row in t.to_pylist():
        mask = np.asarray(row["loss_mask"], dtype=bool)
        adv = np.asarray(row["advantages"], dtype=np.float32)[mask]
        turn = row["turn_advantages"]
        shown = " ".join(f"{a:+.2f}" for a in turn[:6]) + (" ..." if len(turn) > 6 else "")
        print(
            f"{row['trajectory_id']:>5} {row['group_id']:>5} {row['score']:>5.0f} {mask.size:>6} "
            f"{int(mask.sum()):>6} {len(turn):>5}  {adv.mean():>+8.3f} {adv.std():>7.3f}  {shown}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpo_rs.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="demo-data", help="where the log is made or reused (demo-data)")
    parser.add_argument("--rows", type=int, default=10_240, help="trajectories to generate (10240 ~ 300 MB)")
    parser.add_argument("--estimator", default="mae", help="passed to mpo-rs advantages (mae)")
    parser.add_argument("--show", type=int, default=8, help="rows of the result to print")
    args = parser.parse_args(argv)

    try:
        import pyarrow  # noqa: F401
    except ImportError:
        from ._deps import install_hint

        print(f"`mpo_rs.demo` needs pyarrow: {install_hint('arrow')}", file=sys.stderr)
        return 1
    from . import cli

    data = Path(args.dir)
    data.mkdir(parents=True, exist_ok=True)
    log = data / "rollouts.parquet"
    out = data / "rollouts-advantages.parquet"
    if _readable(log):
        print(f"reusing {log} ({log.stat().st_size / 1e6:.0f} MB); delete it to regenerate")
    else:
        print(f"generating {log}: {args.rows:,} trajectories of ~8 turns ...", flush=True)
        t0 = time.perf_counter()
        made = write_rollout_log(log, args.rows)
        print(
            f"generated {log}: {made['rows']:,} rows, {made['tokens']:,} tokens, "
            f"{log.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s"
        )
    cmd = ["advantages", str(log), "-o", str(out), "--estimator", args.estimator]
    print(f"\n$ mpo-rs {' '.join(cmd)}", flush=True)
    code = cli.main(cmd)
    if code != 0:
        return code
    print(f"output: {out.stat().st_size / 1e6:.0f} MB")
    _show_rows(out, args.show)
    print(
        f"\n{log} is synthetic: its critic values were made to move at turn boundaries (mpo_rs.synthetic), "
        "so `mpo-rs diagnose` on it reads them as living on turns by construction; on a log of your own the "
        "same command says whether your critic's do."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
