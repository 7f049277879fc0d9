"""Sampler throughput: generated tokens per second with the KV cache against recomputing
the whole prefix every step (`mpo_lab.train.sampler.sample`, use_cache=True / False).

Both run the same policy on the same episodes (same generator seed, so the same tokens),
interleaved repeat by repeat so that drifts in machine load hit both alike; the figure is
the ratio of median tokens/s measured in this one run. The environment is a copy task
with observations of varying length, so the cache run has holes to mask.

    python lab/benches/bench_sampler.py                  # TinyCausalLM and tiny Llama, 64 episodes x 8 turns x 8 tokens
    python lab/benches/bench_sampler.py --quick          # 16 episodes x 4 turns x 4 tokens
    python lab/benches/bench_sampler.py --device cuda --episodes 256 --turns 16
"""

from __future__ import annotations

import os
import statistics
import sys
import time

# The library's bench helpers (benches/common.py of the repository).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benches"))
import common
import numpy as np
import torch

from mpo_lab.train.models import TinyCausalLM, tiny_hf_model
from mpo_lab.train.sampler import sample

VOCAB = 32


class CopyEnv:
    """Shows 2..6 random tokens per turn; reward 1 if the last action starts with the last shown token."""

    vocab_size = VOCAB

    def __init__(self, action_tokens: int, turns: int) -> None:
        self.action_tokens, self.max_turns = action_tokens, turns

    def reset(self, seed: int) -> list[int]:
        self.rng = np.random.default_rng(seed)
        self.turn = 0
        return self._observation()

    def _observation(self) -> list[int]:
        self.shown = self.rng.integers(1, VOCAB, int(self.rng.integers(2, 7))).tolist()
        return self.shown

    def step(self, action: list[int]) -> tuple[list[int], float, bool]:
        self.turn += 1
        done = self.turn >= self.max_turns
        reward = float(done and bool(action) and action[0] == self.shown[-1])
        return self._observation(), reward, done


def main() -> None:
    parser = common.QuickParser(__doc__)
    parser.size("episodes", 16, 64, "B = tasks x group size")
    parser.size("turns", 4, 8)
    parser.size("tokens", 4, 8, "K, tokens per turn")
    parser.size("repeats", 2, 5)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--models", default="tiny,llama", help="comma-separated: tiny, llama, gpt2")
    args = parser.parse()
    episodes, turns, tokens, repeats, device = args.episodes, args.turns, args.tokens, args.repeats, args.device
    group = 4
    seeds = list(range(max(1, episodes // group)))

    print(
        f"{len(seeds) * group} episodes ({len(seeds)} tasks x {group}), {turns} turns x {tokens} tokens, "
        f"observations of 2-6 tokens; width {args.width}, {args.layers} layers; {device} "
        f"({torch.get_num_threads()} threads), median of {repeats}\n"
    )
    print("| model | KV cache tokens/s | recompute tokens/s | cache / recompute |")
    print("|---|---:|---:|---:|")
    for kind in args.models.split(","):
        torch.manual_seed(0)
        if kind == "tiny":
            policy = TinyCausalLM(VOCAB, width=args.width, layers=args.layers)
        else:
            policy = tiny_hf_model(VOCAB, kind=kind, width=args.width, layers=args.layers)
        policy.to(device).eval()

        def run(use_cache: bool, policy: torch.nn.Module = policy) -> tuple[float, np.ndarray]:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = sample(policy, lambda: CopyEnv(tokens, turns), seeds, group_size=group, use_cache=use_cache,
                         generator=torch.Generator().manual_seed(0))  # fmt: skip
            seconds = time.perf_counter() - start
            return float(out.stats.response_tokens.sum()) / seconds, out.batch.token_ids

        run(True), run(False)  # warm-up
        rates: dict[bool, list[float]] = {True: [], False: []}
        same_tokens = True
        for rep in range(repeats):
            order = (True, False) if rep % 2 == 0 else (False, True)
            outs = {}
            for use_cache in order:
                rate, outs[use_cache] = run(use_cache)
                rates[use_cache].append(rate)
            same_tokens &= np.array_equal(outs[True], outs[False])
        cached, recomputed = statistics.median(rates[True]), statistics.median(rates[False])
        note = "" if same_tokens else " (tokens differed!)"
        print(f"| {kind} | {cached:,.0f} | {recomputed:,.0f} | {cached / recomputed:.2f}x{note} |")


if __name__ == "__main__":
    main()
