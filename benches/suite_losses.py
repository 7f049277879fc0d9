"""Losses suite: forward + backward of the turn-IS policy loss (MPO) against token-level
PPO, on padded (B, L) agentic rows (the mask builder of `bench_losses.py`).

Rows: `mpo_rs.torch.losses.policy_loss` with a token, turn (product and geometric mean, padded
and flat + token_turn) and sequence ratio, and verl 0.9.1 `compute_policy_loss_vanilla`
(token PPO with dual clip c = 3), which is first checked against mpo_rs's token ratio with
`dual_clip=3`: same loss and same gradient. Target (issue of the losses): turn IS ≤ 1.3×
token PPO.

    python benches/suite_losses.py [--quick] [--json PATH]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Case, PeerMissing, assert_close, import_peer, log, suite_main, time_cases, versions

TOKEN_PPO = "mpo_rs token ratio (PPO)"
TURN = "mpo_rs turn ratio, product (MPO)"
VERL_PPO = "verl 0.9.1 compute_policy_loss_vanilla (token PPO, dual clip 3)"
DUAL_CLIP = 3.0


def run(quick: bool) -> dict[str, Any]:
    torch = import_peer("torch")  # the losses need torch; without it the suite cannot run
    from bench_losses import multi_turn_mask

    from mpo_rs import segment_turns
    from mpo_rs.torch import losses

    batch, length, repeats = (16, 1024, 5) if quick else (64, 4096, 15)
    torch.manual_seed(0)
    mask_np = multi_turn_mask(batch, length, seed=0)
    mask = torch.from_numpy(mask_np)
    old = -torch.rand(batch, length) * 3
    new_init = old + 0.05 * torch.randn(batch, length)
    adv = torch.randn(batch, length)
    offsets = np.arange(batch + 1, dtype=np.int64) * length
    token_turn = segment_turns(mask_np.reshape(-1), offsets).token_turn

    def fwd_bwd(loss_of: Callable[[Any], Any], flat: bool = False) -> Callable[[], Any]:
        def step() -> Any:
            log_prob = (new_init.reshape(-1) if flat else new_init).detach().requires_grad_()
            loss_of(log_prob).backward()
            return log_prob.grad

        return step

    def ours(**kw: Any) -> Callable[[Any], Any]:
        return lambda lp: losses.policy_loss(lp, old, adv, mask, **kw)[0]

    cases = [
        Case(TOKEN_PPO, fwd_bwd(ours(ratio="token")), "padded (B, L)"),
        Case(TURN, fwd_bwd(ours(ratio="turn")), "padded (B, L)", TOKEN_PPO),
        Case(
            "mpo_rs turn ratio, geometric mean",
            fwd_bwd(ours(ratio="turn", turn_ratio="geo_mean")),
            "padded (B, L)",
            TOKEN_PPO,
        ),
        Case(
            "mpo_rs turn ratio, flat + token_turn",
            fwd_bwd(
                lambda lp: losses.policy_loss(
                    lp, old.reshape(-1), adv.reshape(-1), mask.reshape(-1), token_turn=token_turn
                )[0],
                flat=True,
            ),
            "flat (T,) + token_turn",
            TOKEN_PPO,
        ),
        Case("mpo_rs sequence ratio (GSPO-token)", fwd_bwd(ours(ratio="sequence")), "padded (B, L)", TOKEN_PPO),
    ]
    checks, skipped = [], []
    try:
        core_algos = import_peer("verl.trainer.ppo.core_algos")
        omegaconf = import_peer("omegaconf")
        config = omegaconf.OmegaConf.create(
            {
                "clip_ratio": 0.2,
                "clip_ratio_low": None,
                "clip_ratio_high": None,
                "clip_ratio_c": DUAL_CLIP,
                "global_batch_info": {},
            }
        )
        mask_f = mask.float()
        verl_step = fwd_bwd(
            lambda lp: core_algos.compute_policy_loss_vanilla(old, lp, adv, mask_f, "token-mean", config)[0]
        )
        ours_step = fwd_bwd(ours(ratio="token", dual_clip=DUAL_CLIP))
        checks.append(
            assert_close(
                VERL_PPO,
                "gradient w.r.t. log π of token PPO (token-mean, clip 0.2, dual clip 3)",
                verl_step(),
                ours_step(),
                rtol=1e-5,
                atol=1e-9,
            )
        )
        cases.append(Case(VERL_PPO, verl_step, "padded (B, L)", TURN))
    except (PeerMissing, AssertionError) as err:
        skipped.append({"peer": VERL_PPO, "reason": str(err).strip().splitlines()[0]})
    log(f"losses: B={batch}, L={length}, timing")
    rows = time_cases(cases, repeats)
    return {
        "suite": "losses",
        "title": "Policy losses: turn IS against token PPO (forward + backward)",
        "shape": {
            "batch": batch,
            "length": length,
            "policy_tokens": int(mask_np.sum()),
            "turns": int(token_turn.max()) + 1,
            "dtype": "float32",
            "device": "cpu",
            "torch_threads": torch.get_num_threads(),
        },
        "repeats": repeats,
        "rows": rows,
        "checks": checks,
        "skipped": skipped,
        "target": {"text": "turn IS ≤ 1.3× token PPO", "baseline": TOKEN_PPO, "case": TURN, "limit": 1.3},
        "versions": versions("torch", "verl"),
    }


if __name__ == "__main__":
    suite_main(run, __doc__)
