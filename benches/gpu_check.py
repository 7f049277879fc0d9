"""A short prepared GPU check (a few minutes on one GPU): the torch side on CUDA against
the CPU, and the reproduction's GPU configuration for a few updates.

1. losses: `policy_loss` (turn, token and sequence ratios) and `value_loss` on CUDA equal
   the CPU results (1e-5);
2. learner: one `Learner.step` per estimator on CUDA, metrics finite, and the time split
   (estimation must stay under 5% of a step);
3. sampler: the GPU configuration's model and task (KeyDoor, 16 turns), 256 episodes,
   tokens/s with the KV cache and recomputing the prefix, and the recorded log-probs equal
   the learner's recomputation (1e-4 on the GPU's kernels);
4. reproduce: `run_one` of MPO and GRPO in the GPU configuration with 3 updates.

    python benches/gpu_check.py            # writes gpu_check.json into $OUT (or the current directory)
    python benches/gpu_check.py --cpu      # the same on the CPU: a dry run of the script (slow)

Exits 1 when a check fails; every result is in the JSON either way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from mpo_lab.envs import make
from mpo_lab.reproduce.presets import GPU
from mpo_lab.reproduce.run import run_one
from mpo_lab.train.models import TinyCausalLM
from mpo_lab.train.sampler import sample
from mpo_rs.torch.critic import value_head_critic
from mpo_rs.torch.learner import Learner, LearnerConfig, token_log_probs
from mpo_rs.torch.losses import policy_loss, value_loss

CUDA = torch.device("cuda")  # `--cpu` points it at the CPU: a dry run of this script without a GPU
TASKS = 64  # sampler tasks (x 4 episodes); the dry run uses 4


def _sync() -> None:
    if CUDA.type == "cuda":
        torch.cuda.synchronize()


def check_losses() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    b, length = 32, 96
    mask = torch.rand(b, length, generator=gen) < 0.6
    lp = -torch.rand(b, length, generator=gen)
    old = lp + 0.05 * torch.randn(b, length, generator=gen)
    adv = torch.randn(b, length, generator=gen)
    out: dict[str, Any] = {}
    for ratio in ("turn", "token", "sequence"):
        cpu, _ = policy_loss(lp, old, adv, mask, ratio=ratio)
        gpu, _ = policy_loss(lp.to(CUDA), old.to(CUDA), adv.to(CUDA), mask.to(CUDA), ratio=ratio)
        out[f"policy_loss_{ratio}_abs_diff"] = abs(float(cpu) - float(gpu))
    v, ov, ret = torch.randn(b, length, generator=gen), torch.randn(b, length, generator=gen), torch.randn(b, length)
    cpu, _ = value_loss(v, ov, ret, mask, clip=0.5)
    gpu, _ = value_loss(v.to(CUDA), ov.to(CUDA), ret.to(CUDA), mask.to(CUDA), clip=0.5)
    out["value_loss_abs_diff"] = abs(float(cpu) - float(gpu))
    out["ok"] = all(x < 1e-5 for k, x in out.items() if k.endswith("_diff"))
    return out


def _model(vocab: int) -> torch.nn.Module:
    torch.manual_seed(0)
    m = GPU.model
    return TinyCausalLM(vocab, width=m.width, layers=m.layers, heads=m.heads, max_len=1024).to(CUDA)


def check_learner() -> dict[str, Any]:
    env = lambda: make("key_door", **GPU.task("key_door").kwargs())  # noqa: E731
    policy = _model(env().vocab_size)
    critic = value_head_critic(policy)
    batch = sample(policy, env, range(TASKS // 2), group_size=4, device=CUDA,
                   generator=torch.Generator(device=CUDA).manual_seed(0)).batch  # fmt: skip
    out: dict[str, Any] = {"tokens": int(batch.token_ids.size)}
    ok = True
    for estimator in ("grpo", "gae", "mae"):
        learner = Learner(
            policy, torch.optim.Adam(policy.parameters(), 1e-4), LearnerConfig(estimator=estimator, minibatch_size=64),
            critic=critic, critic_optimizer=torch.optim.Adam(critic.parameters(), 1e-4),
        )  # fmt: skip
        learner.step(batch)  # warm-up
        metrics = learner.step(batch)
        step = metrics["timing/step_s"]
        split = {p: metrics[f"timing/{p}_s"] / step for p in ("estimation", "forward", "backward", "optimizer")}
        finite = all(isinstance(v, float) and (v == v or k.endswith("explained_variance")) for k, v in metrics.items())
        out[estimator] = {"step_s": step, "shares": split, "finite": finite}
        ok &= finite and split["estimation"] < 0.05
    out["ok"] = ok
    return out


def check_sampler() -> dict[str, Any]:
    env = lambda: make("key_door", **GPU.task("key_door").kwargs())  # noqa: E731
    policy = _model(env().vocab_size).eval()
    out: dict[str, Any] = {}
    for use_cache in (True, False):
        sample(policy, env, range(4), group_size=4, device=CUDA, use_cache=use_cache)  # warm-up
        _sync()
        t0 = time.perf_counter()
        rollouts = sample(policy, env, range(TASKS), group_size=4, device=CUDA, use_cache=use_cache,
                          generator=torch.Generator(device=CUDA).manual_seed(0))  # fmt: skip
        _sync()
        seconds = time.perf_counter() - t0
        out["cache" if use_cache else "recompute"] = float(rollouts.stats.response_tokens.sum()) / seconds
        if use_cache:
            batch = rollouts.batch
    out["cache_over_recompute"] = out["cache"] / out["recompute"]
    # The learner's recomputation of the first 16 episodes, right-padded.
    n = min(16, batch.n_trajectories)
    ends = batch.offsets[: n + 1]
    width = int((ends[1:] - ends[:-1]).max())
    ids = torch.zeros(n, width, dtype=torch.long)
    att = torch.zeros(n, width, dtype=torch.long)
    for i in range(n):
        row = torch.from_numpy(batch.token_ids[ends[i] : ends[i + 1]])
        ids[i, : row.numel()], att[i, : row.numel()] = row, 1
    with torch.no_grad():
        lp = token_log_probs(policy, ids.to(CUDA), att.to(CUDA)).cpu()
    worst = 0.0
    for i in range(n):
        length = int(ends[i + 1] - ends[i])
        mask = torch.from_numpy(batch.mask[ends[i] : ends[i + 1]])
        rec = torch.from_numpy(batch.old_log_probs[ends[i] : ends[i + 1]])
        worst = max(worst, float((lp[i, :length] - rec).abs()[mask].max()))
    out["log_prob_max_abs_diff"] = worst
    out["ok"] = worst < 1e-4
    return out


def check_reproduce() -> dict[str, Any]:
    small = CUDA.type == "cpu"
    budget = dataclasses.replace(
        GPU.budget, updates=1 if small else 3, eval_every=2, eval_tasks=8, diagnose_tasks=8,
        tasks_per_update=4 if small else GPU.budget.tasks_per_update,
    )  # fmt: skip
    # The base policy and the critic warm-up run on the device too, a few steps of each.
    assert GPU.base is not None and GPU.warmup is not None
    base = dataclasses.replace(GPU.base, episodes=64, steps=4 if small else 20)
    warmup = dataclasses.replace(GPU.warmup, episodes=64, steps=4 if small else 20)
    config = dataclasses.replace(GPU, budget=budget, seeds=1, device=CUDA.type, base=base, warmup=warmup)
    out: dict[str, Any] = {}
    for arm in ("mpo", "grpo"):
        r = run_one(config, arm, 0)
        out[arm] = {"wall_s": r["wall_s"], "last": r["curve"][-1], "eval": r["evals"][-1],
                    "base": r["base"], "warmup": r["warmup"]}  # fmt: skip
    out["ok"] = True
    return out


def main() -> int:
    global CUDA, TASKS
    if "--cpu" in sys.argv[1:]:
        CUDA, TASKS = torch.device("cpu"), 4
    elif not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device", file=sys.stderr)
        return 1
    name = torch.cuda.get_device_name(0) if CUDA.type == "cuda" else "cpu (dry run)"
    results: dict[str, Any] = {"device": name, "torch": torch.__version__}
    ok = True
    for name, check in (("losses", check_losses), ("learner", check_learner), ("sampler", check_sampler),
                        ("reproduce", check_reproduce)):  # fmt: skip
        t0 = time.perf_counter()
        try:
            results[name] = check()
        except Exception:
            results[name] = {"ok": False, "error": traceback.format_exc()}
        results[name]["seconds"] = time.perf_counter() - t0
        ok &= bool(results[name]["ok"])
        print(f"{name}: {'ok' if results[name]['ok'] else 'FAILED'} ({results[name]['seconds']:.1f} s)", flush=True)
    path = Path(os.environ.get("OUT", ".")) / "gpu_check.json"
    path.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
