"""Forward+backward time of the turn-IS policy loss against token-level PPO.

Both run through ``mpo_rs.torch.losses.policy_loss`` on the same tensors (same aggregation, same
metrics), interleaved repeat by repeat so that drifts in machine load hit both alike; the
figure is the ratio of medians measured in this one run. Target: turn IS <= 1.3x PPO.

    python benches/bench_losses.py            # B=64, L=4096, 25 repeats
    python benches/bench_losses.py --quick    # B=16, L=1024, 5 repeats
    python benches/bench_losses.py --device cuda
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import common
import numpy as np
import torch

from mpo_rs import segment_turns
from mpo_rs.torch import losses


def multi_turn_mask(batch: int, length: int, seed: int) -> np.ndarray:
    """Agent-like rows: a prompt, then alternating assistant turns and tool outputs, then
    right padding; rows end at different lengths."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((batch, length), dtype=bool)
    for row in range(batch):
        used = min(length, int(rng.integers(length // 2, length + 1)))
        pos = int(rng.integers(64, max(65, length // 8)))  # prompt
        while pos < used:
            turn = int(rng.integers(16, 400))
            mask[row, pos : min(pos + turn, used)] = True
            pos += turn + int(rng.integers(8, 300))  # observation
    return mask


def time_fwd_bwd(step: Callable[[], torch.Tensor], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = common.QuickParser(__doc__)
    parser.size("batch", 16, 64)
    parser.size("length", 1024, 4096)
    parser.size("repeats", 5, 25)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse()
    batch, length, repeats, device = args.batch, args.length, args.repeats, args.device
    dtype = getattr(torch, args.dtype)

    torch.manual_seed(0)
    mask_np = multi_turn_mask(batch, length, seed=0)
    mask = torch.from_numpy(mask_np).to(device)
    old = (-torch.rand(batch, length) * 3).to(device)
    new_init = (old.cpu() + 0.05 * torch.randn(batch, length)).to(device, dtype)
    adv = torch.randn(batch, length).to(device)
    offsets = np.arange(batch + 1, dtype=np.int64) * length
    token_turn = segment_turns(mask_np.reshape(-1), offsets).token_turn
    n_turns = int(mask_np[:, 0].sum() + (mask_np[:, 1:] & ~mask_np[:, :-1]).sum())

    def case(**kw: object) -> Callable[[], torch.Tensor]:
        def step() -> torch.Tensor:
            log_prob = new_init.detach().requires_grad_()
            return losses.policy_loss(log_prob, old, adv, mask, **kw)[0]  # type: ignore[arg-type]

        return step

    def flat_turn() -> torch.Tensor:
        log_prob = new_init.detach().reshape(-1).requires_grad_()
        return losses.policy_loss(log_prob, old.reshape(-1), adv.reshape(-1), mask.reshape(-1), token_turn=token_turn)[
            0
        ]

    cases: dict[str, Callable[[], torch.Tensor]] = {
        "token (PPO)": case(ratio="token"),
        "turn, product (MPO)": case(ratio="turn"),
        "turn, geo_mean": case(ratio="turn", turn_ratio="geo_mean"),
        "turn, flat + token_turn": flat_turn,
        "sequence (GSPO-token)": case(ratio="sequence"),
    }
    for step in cases.values():  # warm-up: allocator, kernels
        time_fwd_bwd(step, device)
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for rep in range(repeats):
        # Rotate the order so no case always runs right after the same neighbour.
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            times[name].append(time_fwd_bwd(cases[name], device))

    base = statistics.median(times["token (PPO)"])
    print(
        f"B={batch}, L={length}, {int(mask_np.sum())} policy tokens in {n_turns} turns, "
        f"{args.dtype} on {device} ({torch.get_num_threads()} threads), median of {repeats}\n"
    )
    print("| loss | fwd+bwd ms (median) | fwd+bwd ms (min) | vs token PPO (medians) |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med * 1e3:.2f} | {min(ts) * 1e3:.2f} | {med / base:.2f}x |")
    ratio = statistics.median(times["turn, product (MPO)"]) / base
    print(f"\nturn IS / token PPO = {ratio:.2f}x (target <= 1.3x): {'OK' if ratio <= 1.3 else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
