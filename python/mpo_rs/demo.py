"""``python -m mpo_rs.demo``: the main job on a realistic synthetic rollout log.

Makes (or reuses) ``demo-data/rollouts.parquet`` -- a few hundred MB of multi-turn agent
trajectories, one row per trajectory: a ~400-token task prompt, ~8 turns of ~120 policy
tokens each separated by ~300-token tool observations, critic values on every token, a
0/1 outcome on the last policy token, and 8 rollouts per prompt -- then runs
``mpo-rs advantages`` on it and prints the summary and a few rows of the result.

:func:`write_rollout_log` is also what the Parquet benchmark and tests generate logs with.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 151_936
ROLLOUTS_PER_PROMPT = 8


def _chunk(rng: np.random.Generator, rows: int, first_row: int, mean_turns: float) -> dict[str, Any]:
    """Flat columns and offsets for `rows` trajectories."""
    lo = max(1, int(round(mean_turns)) - 2)
    turns = rng.integers(lo, lo + 5, size=rows)  # mean ~ mean_turns
    seg_lengths: list[np.ndarray] = []
    seg_policy: list[np.ndarray] = []
    for t in turns:
        # prompt, then (policy, observation) * (t - 1), then a final policy turn
        policy = np.clip(rng.normal(120, 45, size=t), 8, 400).astype(np.int64)
        obs = np.clip(rng.lognormal(np.log(260), 0.6, size=t - 1), 20, 2000).astype(np.int64)
        prompt = np.clip(rng.normal(400, 80, size=1), 100, 800).astype(np.int64)
        lengths = np.empty(2 * t, dtype=np.int64)
        lengths[0] = prompt[0]
        lengths[1::2] = policy
        lengths[2::2] = obs
        kinds = np.zeros(2 * t, dtype=bool)
        kinds[1::2] = True
        seg_lengths.append(lengths)
        seg_policy.append(kinds)
    lengths = np.concatenate(seg_lengths)
    kinds = np.concatenate(seg_policy)
    row_tokens = np.array([s.sum() for s in seg_lengths], dtype=np.int64)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(row_tokens, out=offsets[1:])
    n = int(offsets[-1])

    mask = np.repeat(kinds, lengths)
    prompt_ids = (first_row + np.arange(rows)) // ROLLOUTS_PER_PROMPT
    difficulty = (prompt_ids * 2654435761 + 12345) % 1000 / 1000.0  # shared by a prompt's rollouts
    scores = (rng.random(rows) > difficulty).astype(np.float32)
    # The critic's estimate of success moves towards the outcome from turn to turn and
    # wobbles a little inside a turn.
    segment_values = np.empty(lengths.size)
    k = 0
    for row, segs in enumerate(seg_lengths):
        v = np.clip(rng.normal(0.5, 0.15), 0.0, 1.0)
        steps = rng.normal(0.0, 0.07, size=segs.size)
        for i in range(segs.size):
            v = min(1.0, max(0.0, v + 0.25 * (scores[row] - v) + steps[i]))
            segment_values[k] = v
            k += 1
    values = (np.repeat(segment_values, lengths) + rng.normal(0.0, 0.02, size=n)).astype(np.float32)
    rewards = np.zeros(n, dtype=np.float32)
    rewards[offsets[1:] - 1] = scores  # every trajectory ends with a policy turn
    logprobs = np.where(mask, -rng.exponential(0.35, size=n), 0.0).astype(np.float32)
    token_ids = (rng.pareto(1.2, size=n) * 50).astype(np.int64) % VOCAB
    return {
        "offsets": offsets,
        "trajectory_id": first_row + np.arange(rows, dtype=np.int64),
        "group_id": prompt_ids.astype(np.int64),
        "score": scores,
        "token_ids": token_ids.astype(np.int32),
        "loss_mask": mask,
        "values": values,
        "rewards": rewards,
        "old_logprobs": logprobs,
    }


def write_rollout_log(
    path: str | os.PathLike[str],
    rows: int,
    *,
    seed: int = 0,
    row_group_rows: int = 1024,
    mean_turns: float = 8.0,
    compression: str = "snappy",
) -> dict[str, int]:
    """Writes a synthetic rollout log of `rows` trajectories to `path` (atomically) and
    returns its row and token counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    rng = np.random.default_rng(seed)
    tmp = path.with_name(f".{path.name}.partial")
    tokens = 0
    writer = None
    try:
        for first in range(0, rows, row_group_rows):
            c = _chunk(rng, min(row_group_rows, rows - first), first, mean_turns)
            offsets = pa.array(c["offsets"].astype(np.int32))
            table = pa.table(
                {
                    "trajectory_id": c["trajectory_id"],
                    "group_id": c["group_id"],
                    "score": c["score"],
                    **{
                        name: pa.ListArray.from_arrays(offsets, pa.array(c[name]))
                        for name in ("token_ids", "loss_mask", "values", "rewards", "old_logprobs")
                    },
                }
            )
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema, compression=compression)
            writer.write_table(table, row_group_size=table.num_rows)
            tokens += int(c["offsets"][-1])
        if writer is not None:
            writer.close()
            writer = None
        os.replace(tmp, path)
    finally:
        if writer is not None:
            writer.close()
        tmp.unlink(missing_ok=True)
    return {"rows": rows, "tokens": tokens}


def _readable(path: Path) -> bool:
    try:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows > 0
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
        print("`mpo_rs.demo` needs pyarrow: pip install 'mpo-rs[arrow]'", file=sys.stderr)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
