"""From a training run to "does my critic's value live on turns?".

Trains a tiny randomly initialised policy and critic for a few updates on a built-in
multi-turn task (mpo_lab.envs) with the project's learner, logs every training batch with
mpo_rs.rollout_log.RolloutLogWriter -- the (B, L) tensors a trainer holds, critic values
included -- then runs ``mpo-rs diagnose`` on the log and prints the decision.

    python examples/rollout_log_diagnose.py                    # ~5 updates, < 1 minute on CPU
    python examples/rollout_log_diagnose.py --env search --updates 40 --out runs/demo

The same two steps on a real run: log with RolloutLogWriter (or the verl hook,
``algorithm.mpo.rollout_log_dir=DIR``), then ``mpo-rs diagnose DIR -o REPORT``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mpo_lab.envs import make
from mpo_lab.train.models import TinyCausalLM
from mpo_lab.train.sampler import sample
from mpo_rs.cli import main as mpo_rs_cli
from mpo_rs.diagnose.summary import ON_TURNS_SHARE, share_reading
from mpo_rs.rollout_log import RolloutLogWriter
from mpo_rs.torch.critic import value_head_critic
from mpo_rs.torch.learner import Learner, LearnerConfig, token_values


def padded(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, loss_mask) as right-padded (B, L) tensors."""
    lengths = np.diff(batch.offsets)
    width = int(lengths.max())
    valid = np.arange(width)[None, :] < lengths[:, None]
    index = np.where(valid, batch.offsets[:-1, None] + np.arange(width)[None, :], 0)
    ids = np.where(valid, batch.token_ids[index], 0)
    mask = valid & batch.mask[index]
    return torch.from_numpy(ids), torch.from_numpy(valid.astype(np.int64)), torch.from_numpy(mask)


def train_and_log(env: str, updates: int, tasks: int, group_size: int, log_dir: Path, seed: int) -> list[float]:
    """Trains ``updates`` steps, appending each batch to ``log_dir``; returns the success rates."""
    probe = make(env)
    torch.manual_seed(seed)
    max_len = 1 + probe.max_turns * (probe.action_tokens + 8) + 64
    policy = TinyCausalLM(probe.vocab_size, width=32, layers=1, heads=2, max_len=max(256, max_len))
    critic = value_head_critic(policy)
    learner = Learner(
        policy,
        torch.optim.Adam(policy.parameters(), 3e-3),
        LearnerConfig(),
        critic=critic,
        critic_optimizer=torch.optim.Adam(critic.parameters(), 3e-3),
    )
    generator = torch.Generator().manual_seed(seed)
    success = []
    with RolloutLogWriter(log_dir) as log:
        for step in range(updates):
            seeds = range(step * tasks, (step + 1) * tasks)
            rollouts = sample(policy, lambda: make(env), seeds=seeds, group_size=group_size, generator=generator)
            batch = rollouts.batch
            ids, attention, mask = padded(batch)
            with torch.no_grad():
                values = token_values(critic, ids, attention)  # V(tokens < q), as the learner uses
            scores = batch.trajectory_scores()
            # What a trainer holds each step: (B, L) tensors. One row = one trajectory.
            log.append_padded(
                input_ids=ids,
                loss_mask=mask,
                attention_mask=attention,
                values=values,
                scores=scores,
                group_ids=batch.group_ids,
                step=step,
            )
            learner.step(dataclasses.replace(batch, values=values.numpy()[attention.numpy().astype(bool)]))
            success.append(float(rollouts.stats.success.mean()))
            print(f"step {step}: success {success[-1]:.2f}, {batch.n_trajectories} trajectories logged")
    print(f"log: {', '.join(p.name for p in log.files)} ({log.rows_written} rows)")
    return success


def decision(summary: dict[str, Any]) -> str:
    """The answer to "does my critic's value live on turns?", from diagnose's summary.json."""
    block = summary["all"]
    share, between_wins = block["median_between_share"], block["fraction_between_gt_within"]
    if share is None:
        return (
            "undecided: no trajectory with two or more turns and varying values "
            f"({summary['excluded_fewer_than_two_turns_or_constant']} of {summary['rows']} excluded)"
        )
    # diagnose's own reading and threshold, so the example and the tool never disagree.
    answer = "YES, the critic's value lives on turns" if share >= ON_TURNS_SHARE else "NO, not clearly on turns"
    return (
        f"{answer}: {share_reading(share)}; between > within in {between_wins:.1%} "
        f"of {block['trajectories']} trajectories"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="guess_number", help="a built-in task (mpo_lab.envs): guess_number, search, ...")
    p.add_argument("--updates", type=int, default=5)
    p.add_argument("--tasks", type=int, default=8, help="task seeds per update")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="keep the log and the report here (default: a temporary)")
    args = p.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        log_dir, report = out / "rollout-log", out / "report"
        train_and_log(args.env, args.updates, args.tasks, args.group_size, log_dir, args.seed)
        code = mpo_rs_cli(["diagnose", str(log_dir), "-o", str(report)])
        if code != 0:
            return code
        summary = json.loads((report / "summary.json").read_text())
        by_step = summary.get("by_step", {})
        trend = ", ".join(
            f"{s}: {b['median_between_share']:.2f}" if b["median_between_share"] is not None else f"{s}: -"
            for s, b in by_step.items()
        )
        print(f"median between-turn share by step: {trend}")
        print("does my critic's value live on turns? " + decision(summary))
        if args.out is not None:
            print(f"report: {report}")
        else:  # the paths printed above are inside the temporary directory, removed now
            print("the log and the report were written to a temporary directory, now removed: --out DIR keeps them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
