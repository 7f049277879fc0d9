"""Throughput of mpo_rs.rollout_log.RolloutLogWriter on a trainer-sized batch.

256 agent trajectories of ~3,500 tokens (synthetic.DEMO: prompt, ~8 turns, tool outputs,
token ids, critic values) appended ``--steps`` times, as padded (256, L) torch tensors
(append_padded, right padding, attention mask) and in the flat layout (append_flat); the
time includes finishing the files (footer, fsync, rename). MB/s counts the decoded bytes
appended (token ids int32, mask 1 byte, values and rewards float32 per token).

    python benches/bench_rollout_log.py [--steps 8] [--compression zstd]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from mpo_rs import synthetic
from mpo_rs.rollout_log import RolloutLogWriter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--compression", default="zstd")
    args = p.parse_args()
    import torch

    b = synthetic.flat_batch(args.rows, seed=0, **synthetic.DEMO)
    assert b.token_ids is not None
    values, rewards, mask = b.padded()
    rows, cols = b.padded_index()
    ids = np.zeros(mask.shape, np.int64)
    ids[rows, cols] = b.token_ids
    attention = np.zeros(mask.shape, np.int64)
    attention[rows, cols] = 1
    padded = {
        "input_ids": torch.from_numpy(ids),
        "loss_mask": torch.from_numpy(mask).long(),
        "attention_mask": torch.from_numpy(attention),
        "values": torch.from_numpy(values),
        "token_rewards": torch.from_numpy(rewards),
        "scores": torch.from_numpy(b.scores),
        "group_ids": torch.from_numpy(b.group_ids),
    }
    decoded = b.n_tokens * (4 + 1 + 4 + 4) * args.steps
    print(f"batch: {b.n_trajectories} rows x {b.n_tokens / b.n_trajectories:,.0f} tokens (padded {mask.shape}), "
          f"{args.steps} steps, {decoded / 1e6:,.0f} MB decoded, {args.compression}")  # fmt: skip

    def run(form: str, steps: int) -> tuple[float, int, int]:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            with RolloutLogWriter(Path(tmp) / "log", compression=args.compression) as w:
                for step in range(steps):
                    if form == "padded":
                        w.append_padded(**padded, step=step)
                    else:
                        w.append_flat(**b.log_columns(), step=step)
            seconds = time.perf_counter() - start
            return seconds, len(w.files), sum(f.stat().st_size for f in w.files)

    run("flat", 1)  # one-time costs (imports, codec set-up) out of the figures
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(3):  # best of 3, alternating
        for form in ("padded", "flat"):
            result = run(form, args.steps)
            if form not in best or result[0] < best[form][0]:
                best[form] = result
    for form, (seconds, files, size) in best.items():
        n = args.rows * args.steps
        print(f"{form:>6}: {seconds:6.2f} s  {decoded / seconds / 1e6:7.1f} MB/s  {n / seconds:8.0f} rows/s  "
              f"{b.n_tokens * args.steps / seconds / 1e6:5.1f} Mtok/s  files {files}, {size / 1e6:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
