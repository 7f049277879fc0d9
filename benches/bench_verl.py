"""verl's own GAE against the mpo_rs GAE registered in verl (``mpo_gae``), same run.

Both are called as verl calls them, on verl-shaped padded tensors: ``(B, L)`` float32
``token_level_rewards`` and ``values``, an int64 ``response_mask`` with several LLM turns
per row separated by tool outputs, right padding, one outcome reward on each row's last LLM
token. verl's ``compute_gae_advantage_return`` (a Python loop over the L columns) and
``get_adv_estimator_fn("mpo_gae")`` (the Rust core, plus the flattening and verl's
whitening) are first checked equal on the LLM tokens, then timed interleaved repeat by
repeat, so that load changes hit both alike. The figure is the ratio of the medians.

    python benches/bench_verl.py            # B=256, L=4096, 7 repeats
    python benches/bench_verl.py --quick    # B=32, L=1024, 3 repeats
    python benches/bench_verl.py --json out.json

Needs verl (``pip install --no-deps verl==0.9.1`` plus the modules its ``core_algos``
imports) and torch.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import common
import numpy as np
import torch


def multi_turn_mask(batch: int, length: int, seed: int) -> np.ndarray:
    """Rows of alternating LLM turns (1) and tool outputs (0), ending at different lengths,
    then right padding (0); the response starts with an LLM turn, as in verl."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((batch, length), dtype=np.int64)
    for row in range(batch):
        used = int(rng.integers(length // 2, length + 1))
        pos = 0
        while pos < used:
            turn = int(rng.integers(16, 400))
            mask[row, pos : min(pos + turn, used)] = 1
            pos += turn + int(rng.integers(8, 300))
    return mask


def make_batch(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed + 1)
    mask = multi_turn_mask(batch, length, seed)
    rewards = np.zeros((batch, length), dtype=np.float32)
    last = length - 1 - np.argmax(mask[:, ::-1], axis=1)
    rewards[np.arange(batch), last] = rng.integers(0, 2, batch)
    values = rng.standard_normal((batch, length)).astype(np.float32)
    return {
        "token_level_rewards": torch.from_numpy(rewards),
        "values": torch.from_numpy(values),
        "response_mask": torch.from_numpy(mask),
    }


def estimators(
    gamma: float, lam: float
) -> dict[str, Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]]:
    from verl.trainer.ppo import core_algos

    import mpo_rs.integrations.verl  # noqa: F401  (registers mpo_gae)

    registered = core_algos.get_adv_estimator_fn("mpo_gae")
    config = {"gamma": gamma, "lam": lam}

    def verl_gae(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return core_algos.compute_gae_advantage_return(
            token_level_rewards=b["token_level_rewards"],
            values=b["values"],
            response_mask=b["response_mask"],
            gamma=gamma,
            lam=lam,
        )

    def mpo_gae(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return registered(
            token_level_rewards=b["token_level_rewards"],
            response_mask=b["response_mask"],
            config=config,
            values=b["values"],
        )

    return {"verl compute_gae_advantage_return": verl_gae, "mpo_rs mpo_gae (registered)": mpo_gae}


def check_equal(
    cases: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]], batch: dict[str, torch.Tensor]
) -> None:
    (want_adv, want_ret), (adv, ret) = (fn(batch) for fn in cases.values())
    llm = batch["response_mask"].bool()
    torch.testing.assert_close(adv[llm], want_adv[llm], rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(ret[llm], want_ret[llm], rtol=1e-4, atol=1e-4)


def run(batch: int, length: int, repeats: int, gamma: float = 1.0, lam: float = 0.95) -> dict[str, Any]:
    data = make_batch(batch, length)
    cases = estimators(gamma, lam)
    check_equal(cases, data)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():  # interleaved: both see the same machine state
            start = time.perf_counter()
            fn(data)
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    verl_name, mpo_name = list(cases)
    import mpo_rs

    return {
        "batch": batch,
        "length": length,
        "llm_tokens": int(data["response_mask"].sum()),
        "repeats": repeats,
        "median_seconds": medians,
        "speedup": medians[verl_name] / medians[mpo_name],
        "torch_threads": torch.get_num_threads(),
        "mpo_rs_threads": mpo_rs.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
    }


def main() -> None:
    parser = common.QuickParser(__doc__, torch_options=False)
    parser.size("batch", 32, 256)
    parser.size("length", 1024, 4096)
    parser.size("repeats", 3, 7)
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    args = parser.parse()
    result = run(batch=args.batch, length=args.length, repeats=args.repeats)
    print(
        f"verl GAE, B={result['batch']} L={result['length']} ({result['llm_tokens']:,} LLM tokens), "
        f"median of {result['repeats']}, {result['cpus']} CPUs:"
    )
    for name, seconds in result["median_seconds"].items():
        print(f"  {name:<36} {seconds * 1e3:10.1f} ms")
    print(f"  speedup (verl / mpo_gae)             {result['speedup']:10.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
