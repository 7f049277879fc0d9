"""rlox 1.2 (a Rust GAE on PyPI) as a native GAE peer beside stateset-rl-core, in two views,
on the GAE suite's batch (benches/suite_gae.py: 1,000 multi-turn trajectories), one run with
the cases interleaved:

* **kernel**: each peer gets the compacted policy-token batch in its own layout, built before
  timing (rlox ``compute_gae``: every policy token in one float64 sequence with done flags at
  each trajectory's last policy token; stateset-rl-core ``batch_compute_gae``: one float64
  array per trajectory), against ``mpo_rs.gae_advantages`` on the flat tokens with the mask
  (observations included, nothing prepared);
* **whole job**: from the multi-turn batch as mpo_rs takes it (flat float32 tokens, mask,
  offsets) to per-token float32 advantages and returns, 0 on observation tokens: the peer's
  compaction to its layout and the scatter back are timed with its kernel.

Shared semantics checked before timing: token GAE over the policy tokens, observation
tokens skipped, each trajectory's end bootstrapping from 0 (γ = 1, λ = 0.95, returns =
advantages + values).

    python benches/bench_rlox.py                            # the GAE suite's batch
    python benches/bench_rlox.py --quick                    # small (seconds)
    python benches/bench_rlox.py --docs docs/benchmarks.md  # also rewrite the page's section
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

import mpo_rs

SECTION = "## rlox: a native GAE peer"
GAMMA, LAM = 1.0, 0.95
MPO = "mpo_rs.gae_advantages"


def mpo(b: common.FlatBatch) -> tuple[np.ndarray, np.ndarray]:
    r = mpo_rs.gae_advantages(b.values, b.mask, b.offsets, rewards=b.rewards, gamma=GAMMA, lam=LAM, lam_critic=LAM)
    return r.advantages, r.returns


def rlox_layout(b: common.FlatBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """rlox's input: every policy token in one float64 sequence, done at each trajectory's
    last policy token."""
    values, rewards, last = b.policy_flat()
    return rewards.astype(np.float64), values.astype(np.float64), last.astype(np.float64)


def rlox_job(rlox: Any, b: common.FlatBatch) -> tuple[np.ndarray, np.ndarray]:
    """The whole job through rlox: compact, compute, scatter back to float32 tokens."""
    rewards, values, dones = rlox_layout(b)
    adv, ret = rlox.compute_gae(rewards, values, dones, 0.0, GAMMA, LAM)
    out_adv = np.zeros(b.n_tokens, np.float32)
    out_ret = np.zeros(b.n_tokens, np.float32)
    out_adv[b.mask] = adv
    out_ret[b.mask] = ret
    return out_adv, out_ret


def stateset_job(stateset: Any, b: common.FlatBatch) -> tuple[np.ndarray, np.ndarray]:
    rs, vs = b.policy_only()
    adv = np.concatenate(stateset.batch_compute_gae(rs, vs, GAMMA, LAM)) if rs else np.zeros(0)
    out_adv = np.zeros(b.n_tokens, np.float32)
    out_adv[b.mask] = adv
    out_ret = out_adv + np.where(b.mask, b.values, 0).astype(np.float32)
    return out_adv, out_ret


def measure(b: common.FlatBatch, repeats: int) -> dict[str, Any]:
    rlox = common.import_peer("rlox")
    stateset = common.import_peer("stateset_rl_core")
    want_adv, want_ret = mpo(b)
    checks = []
    layout = rlox_layout(b)
    adv, ret = rlox.compute_gae(*layout, 0.0, GAMMA, LAM)
    checks.append(common.assert_close("rlox compute_gae", "advantages on policy tokens", adv, want_adv[b.mask]))
    checks.append(common.assert_close("rlox compute_gae", "returns on policy tokens", ret, want_ret[b.mask]))
    rs, vs = b.policy_only()
    adv_s = np.concatenate(stateset.batch_compute_gae(rs, vs, GAMMA, LAM))
    checks.append(
        common.assert_close(
            "stateset-rl-core batch_compute_gae", "advantages on policy tokens", adv_s, want_adv[b.mask]
        )
    )
    for name, job in (("rlox", lambda: rlox_job(rlox, b)), ("stateset", lambda: stateset_job(stateset, b))):
        got_adv, got_ret = job()
        checks.append(common.assert_close(f"{name} whole job", "advantages, every token", got_adv, want_adv))
        checks.append(common.assert_close(f"{name} whole job", "returns, every token", got_ret, want_ret))
    cases = {
        MPO: lambda: mpo(b),
        "rlox compute_gae (kernel)": lambda: rlox.compute_gae(*layout, 0.0, GAMMA, LAM),
        "stateset-rl-core batch_compute_gae (kernel)": lambda: stateset.batch_compute_gae(rs, vs, GAMMA, LAM),
        "rlox whole job (compact + compute_gae + scatter)": lambda: rlox_job(rlox, b),
        "stateset-rl-core whole job (compact + batch_compute_gae + scatter)": lambda: stateset_job(stateset, b),
    }
    times = common.interleaved_times(cases, repeats)
    return {
        "tokens": b.n_tokens,
        "policy_tokens": b.n_policy_tokens,
        "trajectories": b.n_trajectories,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "min_s": {k: min(v) for k, v in times.items()},
        "runs": {k: len(v) for k, v in times.items()},
        "checks": checks,
        "versions": common.versions("rlox", "stateset-rl-core", "numpy"),
    }


def section(r: dict[str, Any], date: str, load: tuple[float, float], argv: list[str]) -> str:
    command = " ".join(["python benches/bench_rlox.py", *argv])
    med, mins = r["median_s"], r["min_s"]
    v = r["versions"]
    lines = [
        SECTION,
        "",
        f"_Written by `{command}` on {date}; {common.machine()}; rlox {v['rlox']}, stateset-rl-core "
        f"{v['stateset-rl-core']}. Load average (1 min) at the start {load[0]:.1f}, at the end {load[1]:.1f} on "
        f"{os.cpu_count()} cores: the machine was shared with other work, so absolute times are noisy; the ratios "
        "compare cases of one run, interleaved._",
        "",
        f"The GAE suite's batch: {r['trajectories']:,} trajectories, {r['tokens']:,} tokens, "
        f"{r['policy_tokens']:,} of them policy tokens; γ = 1, λ = 0.95.",
        "",
        "| implementation | view | median ms | min ms | runs | mpo_rs / this (medians) | (minimums) | this / mpo_rs |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    views = {
        MPO: "flat tokens + mask + offsets, nothing prepared",
        "rlox compute_gae (kernel)": "policy tokens as one float64 sequence + done flags, built before timing",
        "stateset-rl-core batch_compute_gae (kernel)": "policy tokens, one float64 array per trajectory, built before timing",
        "rlox whole job (compact + compute_gae + scatter)": "from the flat batch to float32 tokens",
        "stateset-rl-core whole job (compact + batch_compute_gae + scatter)": "from the flat batch to float32 tokens",
    }
    for name, view in views.items():
        ratio = "—" if name == MPO else f"{med[MPO] / med[name]:.2g}"
        ratio_min = "—" if name == MPO else f"{mins[MPO] / mins[name]:.2g}"
        speedup = "—" if name == MPO else f"{med[name] / med[MPO]:.3g}×"
        lines.append(
            f"| {name} | {view} | {1e3 * med[name]:.3g} | {1e3 * mins[name]:.3g} | {r['runs'][name]} "
            f"| {ratio} | {ratio_min} | {speedup} |"
        )
    worst = max(c["max_abs_err"] for c in r["checks"])
    lines += [
        "",
        "Equal outputs are checked before timing (rlox's advantages and returns, stateset-rl-core's advantages, "
        f"on the policy tokens and, for the whole jobs, on every token; largest difference {worst:.1e}). rlox "
        "computes in float64 from float64 inputs; its batched float32 entry (`compute_gae_batched_f32`) takes "
        "equal-length environments only, which ragged trajectories are not.",
        "",
    ]
    return "\n".join(lines)


def run(quick: bool, repeats: int) -> dict[str, Any]:
    return measure(common.make_batch(n_traj=100) if quick else common.make_batch(), repeats)


def main() -> None:
    before = ("## Reproduction harness A/B", "## Reproduce")
    common.section_main(__doc__.splitlines()[0], run, section, SECTION, before)


if __name__ == "__main__":
    main()
