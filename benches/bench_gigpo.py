"""GiGPO: mpo_rs against a Python dictionary-of-groups implementation in verl-agent's style,
on the same batch, in one run (cases interleaved, their order rotating each round).

The peer is written here from verl-agent's description of its ``core_gigpo.py`` (not
copied): one row per environment step (a turn) with its reward, trajectory, group (``uid``)
and anchor state; the discounted step returns by a Python loop over each trajectory's steps;
the episode baseline from a dict ``uid -> [episode returns]``; the step groups a dict keyed
by ``(uid, anchor)``; means and stds per group with numpy; the per-step advantage broadcast
over a padded ``(steps, max turn length)`` response mask. Its inputs are built before timing
in that layout (one row per step, as verl-agent's batch holds them); mpo_rs takes the flat
tokens, mask and offsets of the same trajectories with one anchor id per turn and does the
segmentation itself. Both use this project's conventions (each trajectory counts once in
its group's episode baseline, a group of one gets 0; docs/estimators.md, "GiGPO"), and the
peer's per-token output is checked against mpo_rs's before timing.

Anchor states: per turn k of a trajectory one of three states of that turn (so step groups
have several members, as repeated states do in ALFWorld or WebShop); one reward per turn.

    python benches/bench_gigpo.py                       # an online step and a large log
    python benches/bench_gigpo.py --quick               # small sizes (seconds)
    python benches/bench_gigpo.py --docs docs/benchmarks.md   # also rewrite the page's section
"""

from __future__ import annotations

import os
import statistics
import sys
from collections import defaultdict
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

import mpo_rs
from mpo_rs import synthetic

SECTION = "## GiGPO against a dictionary-of-groups implementation"
GAMMA, EPS, STEP_WEIGHT = 0.95, 1e-6, 1.0

# (label, trajectories, turns, policy tokens per turn, observation tokens per turn)
SIZES = [
    ("one online step", 256, 16, 48, 96),
    ("a large log", 16_384, 16, 24, 48),
]
QUICK_SIZES = [("one online step (quick)", 64, 8, 16, 32)]


class Batch:
    """One batch in both layouts: mpo_rs's flat tokens and verl-agent's step rows."""

    def __init__(self, n: int, turns: int, turn_len: int, obs_len: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        b = synthetic.flat_batch(n, seed=rng, turns=(turns, turns), turn_len=turn_len, obs_len=obs_len, group_size=8)
        self.mask, self.offsets, self.group_ids = b.mask, b.offsets, b.group_ids
        t = mpo_rs.segment_turns(self.mask, self.offsets)
        self.turns = t
        n_turns = t.starts.shape[0]
        per_traj = np.diff(t.traj_offsets)
        self.turn_traj = np.repeat(np.arange(n), per_traj)
        k = np.arange(n_turns) - np.repeat(t.traj_offsets[:-1], per_traj)  # turn index in its trajectory
        self.anchors = (k * 3 + rng.integers(0, 3, n_turns)).astype(np.int64)
        self.turn_rewards = rng.integers(-2, 3, n_turns).astype(np.float32) / 2
        self.n_tokens = int(self.mask.shape[0])
        self.n_turns = int(n_turns)
        # verl-agent's layout: one row per step, its response mask padded to the longest turn.
        lengths = (t.ends - t.starts).astype(np.int64)
        self.step_mask = (np.arange(lengths.max(initial=1))[None, :] < lengths[:, None]).astype(np.float32)
        self.uid = [f"uid-{g}" for g in self.group_ids]  # verl's uids are strings
        self.traj_uid = [f"traj-{j}" for j in range(n)]

    def mpo(self) -> np.ndarray:
        return mpo_rs.gigpo_advantages(
            self.mask,
            self.offsets,
            group_ids=self.group_ids,
            turn_rewards=self.turn_rewards,
            turn_state_ids=self.anchors,
            gamma=GAMMA,
            step_weight=STEP_WEIGHT,
        ).advantages

    def steps(self) -> dict[str, Any]:
        """The peer's inputs, per step (built before timing)."""
        return {
            "rewards": self.turn_rewards.tolist(),
            "traj": [self.traj_uid[j] for j in self.turn_traj],
            "uid": [self.uid[j] for j in self.turn_traj],
            "anchor": self.anchors.tolist(),
            "mask": self.step_mask,
        }


def dict_of_groups_gigpo(
    rewards: list[float], traj: list[str], uid: list[str], anchor: list[Any], mask: np.ndarray
) -> np.ndarray:
    """GiGPO over step rows with dictionaries of groups and Python loops (verl-agent's
    style): returns the (steps, L) per-token advantages."""
    n = len(rewards)
    # Discounted step returns, trajectory by trajectory (steps in order within each).
    steps_of: dict[str, list[int]] = defaultdict(list)
    for i in range(n):
        steps_of[traj[i]].append(i)
    step_return = [0.0] * n
    episode_return: dict[str, float] = {}
    group_of: dict[str, str] = {}
    for t, idx in steps_of.items():
        running = 0.0
        for i in reversed(idx):
            running = rewards[i] + GAMMA * running
            step_return[i] = running
        episode_return[t] = sum(rewards[i] for i in idx)
        group_of[t] = uid[idx[0]]
    # Episode baseline: uid -> the returns of its trajectories (each once).
    id2score: dict[str, list[float]] = defaultdict(list)
    for t, r in episode_return.items():
        id2score[group_of[t]].append(r)
    id2mean = {k: float(np.mean(v)) for k, v in id2score.items()}
    episode_adv = {
        t: (r - id2mean[group_of[t]]) if len(id2score[group_of[t]]) > 1 else 0.0 for t, r in episode_return.items()
    }
    # Step groups: (uid, anchor) -> the steps that start from that state.
    step_groups: dict[tuple[str, Any], list[int]] = defaultdict(list)
    for i in range(n):
        step_groups[(uid[i], anchor[i])].append(i)
    scores = np.zeros(n, dtype=np.float32)
    for idx in step_groups.values():
        returns = [step_return[i] for i in idx]
        mean = float(np.mean(returns))
        for i, g in zip(idx, returns, strict=True):
            step_adv = g - mean if len(idx) > 1 else 0.0
            scores[i] = episode_adv[traj[i]] + STEP_WEIGHT * step_adv
    return scores[:, None] * mask


def measure(label: str, n: int, turns: int, turn_len: int, obs_len: int, repeats: int) -> dict[str, Any]:
    b = Batch(n, turns, turn_len, obs_len)
    steps = b.steps()
    want = b.mpo()
    got = dict_of_groups_gigpo(**steps)
    check = common.assert_close(
        "dict-of-groups GiGPO", "per-token advantages", got[b.step_mask > 0], want[b.mask], rtol=1e-5, atol=1e-5
    )
    common.log(
        f"{label}: {n} trajectories, {b.n_turns} turns, {b.n_tokens:,} tokens; equal ({check['max_abs_err']:.1e})"
    )
    times = common.interleaved_times(
        {"mpo_rs": b.mpo, "dict-of-groups": lambda: dict_of_groups_gigpo(**steps)}, repeats, seconds_per_case=20
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    mins = {k: min(v) for k, v in times.items()}
    return {
        "label": label,
        "trajectories": n,
        "turns": b.n_turns,
        "tokens": b.n_tokens,
        "median_s": med,
        "min_s": mins,
        "runs": {k: len(v) for k, v in times.items()},
        "max_abs_err": check["max_abs_err"],
    }


def section(rows: list[dict[str, Any]], date: str, load: tuple[float, float], argv: list[str]) -> str:
    command = " ".join(["python benches/bench_gigpo.py", *argv])
    lines = [
        SECTION,
        "",
        f"_Written by `{command}` on {date}; {common.machine()}. Load average (1 min) at the start "
        f"{load[0]:.1f}, at the end {load[1]:.1f} on {os.cpu_count()} cores: the machine was shared with other "
        "work, so absolute times are noisy; the ratios compare cases of one run, interleaved._",
        "",
        "| batch | trajectories × turns | tokens | mpo_rs ms (median / min) | dict-of-groups ms (median / min) "
        "| runs | dict / mpo_rs (medians) | (minimums) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        m, p = r["median_s"], r["min_s"]
        lines.append(
            f"| {r['label']} | {r['trajectories']:,} × {r['turns'] // max(r['trajectories'], 1)} | {r['tokens']:,} "
            f"| {1e3 * m['mpo_rs']:.3g} / {1e3 * p['mpo_rs']:.3g} "
            f"| {1e3 * m['dict-of-groups']:.4g} / {1e3 * p['dict-of-groups']:.4g} "
            f"| {r['runs']['mpo_rs']} / {r['runs']['dict-of-groups']} "
            f"| **{m['dict-of-groups'] / m['mpo_rs']:.3g}×** | {p['dict-of-groups'] / p['mpo_rs']:.3g}× |"
        )
    lines += [
        "",
        "mpo_rs: `mpo_rs.gigpo_advantages` on the flat tokens (mask, offsets, group ids, one reward and one "
        "anchor id per turn), segmentation included. The peer: benches/bench_gigpo.py's `dict_of_groups_gigpo`, "
        "written from verl-agent's description (one row per step, dicts of groups, Python loops, numpy means), "
        "given its step rows and padded step mask built before timing. Equal per-token advantages are checked "
        "first (largest difference "
        + ", ".join(f"{r['max_abs_err']:.1e}" for r in rows)
        + "); γ = 0.95, w = 1, mean_norm. Anchors: one of three states per turn index, so step groups have "
        "several members.",
        "",
    ]
    return "\n".join(lines)


def run(quick: bool, repeats: int) -> list[dict[str, Any]]:
    return [measure(*size, repeats=repeats) for size in (QUICK_SIZES if quick else SIZES)]


def main() -> None:
    before = ("## rlox: a native GAE peer", "## Reproduction harness A/B", "## Reproduce")
    common.section_main(__doc__.splitlines()[0], run, section, SECTION, before)


if __name__ == "__main__":
    main()
