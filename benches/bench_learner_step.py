"""Learner step time split: advantage estimation (the Rust core), forward, backward and
optimizer, as shares of one `Learner.step`, for each estimator on the same sampled batch.

The batch is KeyDoor rollouts (the reproduction's task, 8 turns x 16 tokens) of a
TinyCausalLM policy with a value-head critic; every estimator steps a fresh copy of the
same models on it, `--repeats` times, and the split is the median of the learner's own
`timing/*_s` metrics. Estimation must stay under 5% of a step: the script exits 1 when it
does not.

    python benches/bench_learner_step.py                 # 64 episodes, width 64, 2 layers, CPU
    python benches/bench_learner_step.py --quick         # 16 episodes, 4 turns x 4 tokens
    python benches/bench_learner_step.py --device cuda --episodes 256 --width 128 --layers 4
"""

from __future__ import annotations

import copy
import statistics
import sys

import common
import torch

from mpo_lab.envs import make
from mpo_lab.train.models import TinyCausalLM
from mpo_lab.train.sampler import sample
from mpo_rs.torch.critic import value_head_critic
from mpo_rs.torch.learner import Learner, LearnerConfig

PHASES = ("estimation", "forward", "backward", "optimizer")
LIMIT = 0.05


def main() -> int:
    parser = common.QuickParser(__doc__)
    parser.size("episodes", 16, 64, "tasks x group size 4")
    parser.size("turns", 4, 8)
    parser.size("tokens", 4, 16)
    parser.size("repeats", 3, 5)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse()
    episodes, turns, tokens, repeats, device = args.episodes, args.turns, args.tokens, args.repeats, args.device

    env = lambda: make("key_door", max_turns=turns, action_tokens=tokens)  # noqa: E731
    torch.manual_seed(0)
    policy = TinyCausalLM(env().vocab_size, width=args.width, layers=args.layers).to(device)
    critic = value_head_critic(policy)
    batch = sample(policy, env, range(episodes // 4), group_size=4, device=device,
                   generator=torch.Generator(device=device).manual_seed(0)).batch  # fmt: skip
    print(
        f"{batch.n_trajectories} KeyDoor episodes ({turns} turns x {tokens} tokens, {batch.token_ids.size} tokens), "
        f"width {args.width}, {args.layers} layers, {device} ({torch.get_num_threads()} threads), "
        f"median of {repeats} steps (1 epoch, minibatch = the batch)\n"
    )
    print("| estimator | step (ms) | " + " | ".join(PHASES) + " | other |")
    print("|---|---:|" + "---:|" * (len(PHASES) + 1))
    worst = 0.0
    for estimator in ("grpo", "gae", "mae"):
        splits: dict[str, list[float]] = {p: [] for p in (*PHASES, "step")}
        for rep in range(repeats + 1):  # the first is a warm-up
            p, c = copy.deepcopy(policy), copy.deepcopy(critic)
            learner = Learner(
                p, torch.optim.Adam(p.parameters(), 1e-3),
                LearnerConfig(estimator=estimator, minibatch_size=batch.n_trajectories),
                critic=c, critic_optimizer=torch.optim.Adam(c.parameters(), 1e-3),
            )  # fmt: skip
            metrics = learner.step(batch)
            if rep:
                for phase in splits:
                    splits[phase].append(metrics[f"timing/{phase}_s"])
        step = statistics.median(splits["step"])
        shares = {phase: statistics.median(splits[phase]) / step for phase in PHASES}
        worst = max(worst, shares["estimation"])
        other = 1.0 - sum(shares.values())
        cells = " | ".join(f"{100 * shares[p]:.1f}%" for p in PHASES)
        print(f"| {estimator} | {1000 * step:.1f} | {cells} | {100 * other:.1f}% |")
    verdict = "ok" if worst < LIMIT else "OVER"
    print(f"\nestimation: at most {100 * worst:.2f}% of a step (limit {100 * LIMIT:.0f}%): {verdict}")
    return 0 if worst < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
