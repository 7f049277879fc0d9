"""The gates' thresholds (:data:`GATES`, the analysis plan's), the measurements they read and
their judgement (:func:`judge`); :mod:`.gates` says what each gate measures and is the command
that measures them on a pilot. Numpy at import; :func:`base_measurement` needs torch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .rows import nanmean
from .stats import paired_diff_ci
from .tasks import task_role

__all__ = [
    "GATES",
    "GateResult",
    "Gates",
    "base_measurement",
    "call_tokens",
    "judge",
    "learning_measurement",
]


@dataclass(frozen=True)
class Gates:
    """The thresholds of the four gates (the module's docstring says what each measures)."""

    learning_lower_bound: float = 0.10
    base_entropy: float = 0.1
    distinct_groups: float = 0.30
    critic_ceiling: float = 0.3
    learned_share_of_ceiling: float = 0.5
    premise_share: float = 0.8
    control_share: float = 0.5
    learning_arms: tuple[str, ...] = ("grpo", "ppo")
    """The methods whose learning the learning gate asks for (arm keys of the main task; a
    task's arms carry its prefix)."""
    critic_arms: tuple[str, ...] = ("ppo", "mpo")
    """The arms whose learned critic the predictability gate reads."""


GATES = Gates()
"""The gates of the analysis plan."""


@dataclass(frozen=True)
class GateResult:
    gate: str
    measured: str
    threshold: str
    passed: bool | None
    """None where the gate does not apply to the task's role or was not measured."""


def base_measurement(
    config: Any, task: str, seed: int, *, tasks: int = 64, group: int = 16, cache: Path | None = None
) -> dict[str, Any]:
    """The base policy of (``task``, ``seed``) measured on ``tasks`` tasks of its critic
    warm-up's purpose, ``group`` rollouts each at temperature 1: ``success``, ``entropy``
    (mean -log pi of the sampled policy tokens), ``distinct_groups`` (the share of the
    tasks whose first ``config.budget.group_size`` rollouts -- a GRPO group -- do not all
    score the same) and the reference critic's ``explained_variance`` and
    ``median_between_share`` (:func:`~mpo_lab.reproduce.reference.reference_measurement`; NaN on a
    user's environment, which has no belief model to key it on).
    ``cache``: a directory that keeps the base policies (``OUT/base`` of a run's layout)."""
    import torch

    from ..seeds import Stream, task_seeds
    from ..train.sampler import sample
    from .base import base_policy
    from .env import make_env
    from .reference import reference_measurement

    spec = config.task(task)
    policy, info = base_policy(config, task, seed, cache)  # made once per cache, as a run's are
    seeds = task_seeds("warmup", seed, 0, tasks)
    gen = torch.Generator().manual_seed(Stream.gate_rollouts(seed))
    policy.eval()
    with torch.no_grad():
        out = sample(policy, lambda: make_env(spec), seeds=seeds, group_size=group, generator=gen)
    batch = out.batch
    scores = np.asarray(batch.trajectory_scores(), dtype=np.float64).reshape(tasks, group)
    grpo = scores[:, : config.budget.group_size]
    mask = np.asarray(batch.mask, dtype=bool)
    env = make_env(spec)
    # A user's environment has no belief model: its exploration is measured, not its critic ceiling.
    user = task_role(task) == "user"
    nan = {"explained_variance": math.nan, "median_between_share": math.nan, "keys": 0}
    reference = nan if user else reference_measurement(env, batch)
    calls = call_tokens(mask, np.asarray(batch.offsets), int(getattr(env, "think_tokens", 0)))
    return {
        "task": task,
        "seed": seed,
        "base_held_out_success": info.get("held_out_success", math.nan),
        "success": float(scores.mean()),
        "entropy": float(-np.asarray(batch.old_log_probs)[calls].mean()),
        "distinct_groups": float(np.mean(grpo.max(axis=1) != grpo.min(axis=1))),
        "critic_ceiling": reference["explained_variance"],
        "between_share": reference["median_between_share"],
        "reference_keys": reference["keys"],
    }


def call_tokens(mask: np.ndarray, offsets: np.ndarray, free: int) -> np.ndarray:
    """The policy tokens past the first ``free`` of their turn: the tool call's tokens where a
    turn opens with ``free`` thinking tokens (Search's ``think_tokens``), whose entropy is the
    thinking vocabulary's whatever the policy explores; every policy token when ``free`` is 0."""
    from mpo_rs.estimators import segment_turns

    mask = np.asarray(mask, dtype=bool)
    if not free:
        return mask
    turns = segment_turns(mask, offsets)
    position = np.arange(mask.size) - turns.starts[np.maximum(turns.token_turn, 0)]
    return mask & (position >= free)


def _prefixed(task_prefix: str, keys: Sequence[str]) -> list[str]:
    return [task_prefix + key for key in keys]


def learning_measurement(rows: Sequence[Mapping[str, Any]], task_prefix: str, gates: Gates = GATES) -> dict[str, Any]:
    """From a finished run's rows (``results.json``'s ``runs``): per learning arm, final minus
    base success paired by seed (``diff``, ``low``, ``high``, ``n``); per critic arm, the mean
    explained variance after the warm-up and at the end."""
    out: dict[str, Any] = {"learning": {}, "critics": {}}
    for key in _prefixed(task_prefix, gates.learning_arms):
        mine = [r for r in rows if r["arm"] == key]
        final = {int(r["seed"]): float(r["final_success"]) for r in mine}
        # A run that predates the base's measurement (no base_success) pairs with nothing.
        base = {int(r["seed"]): float(r.get("base_success", math.nan)) for r in mine}
        out["learning"][key] = paired_diff_ci(final, base)._asdict()
    for key in _prefixed(task_prefix, gates.critic_arms):
        mine = [r for r in rows if r["arm"] == key]
        out["critics"][key] = {
            "warmup": nanmean([float(r.get("warmup_explained_variance", math.nan)) for r in mine]),
            "end": nanmean([float(r["final_explained_variance"]) for r in mine]),
        }
    return out


def _ge(value: float, threshold: float) -> bool | None:
    return None if not math.isfinite(value) else value >= threshold


def judge(
    role: str, base: Sequence[Mapping[str, Any]], learned: Mapping[str, Any] | None, gates: Gates = GATES
) -> list[GateResult]:
    """The gates of one task: ``role`` is ``premise``, ``control`` (the negative control),
    ``chance`` (a control at chance) or ``user`` (a user's environment), the last two judged
    on learning and exploration only (:func:`~mpo_lab.reproduce.tasks.task_role`); ``base`` its
    :func:`base_measurement` per seed (empty: not measured); ``learned`` its
    :func:`learning_measurement` (None: not run). A gate that was not measured, or whose
    measurement has no bound (fewer than 2 paired seeds), has ``passed`` None: not passed."""
    entropy = nanmean([b["entropy"] for b in base])
    distinct = nanmean([b["distinct_groups"] for b in base])
    ceiling = nanmean([b["critic_ceiling"] for b in base])
    share = nanmean([b["between_share"] for b in base])

    def measured(text: str) -> str:
        return text if base else "not measured"

    out = []
    if learned is None:
        out.append(GateResult("learning", "not run", f"lower bound >= {gates.learning_lower_bound:+.2f}", None))
    else:
        lows = [v["low"] for v in learned["learning"].values()]
        text = ", ".join(
            f"{k} {v['diff']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}]" for k, v in learned["learning"].items()
        )
        bounded = bool(lows) and all(math.isfinite(x) for x in lows)
        learns = min(lows) >= gates.learning_lower_bound if bounded else None
        out.append(GateResult("learning", text, f"lower bound >= {gates.learning_lower_bound:+.2f}", learns))
    ok_entropy, ok_distinct = _ge(entropy, gates.base_entropy), _ge(distinct, gates.distinct_groups)
    out.append(
        GateResult(
            "exploration",
            measured(f"entropy {entropy:.3f}, distinct groups {distinct:.2f}"),
            f">= {gates.base_entropy:g} and >= {gates.distinct_groups:.2f}",
            None if ok_entropy is None or ok_distinct is None else ok_entropy and ok_distinct,
        )
    )
    if role == "premise":
        text = f"ceiling {ceiling:.3f}"
        ok = _ge(ceiling, gates.critic_ceiling)
        if learned is not None and ok is not None and math.isfinite(ceiling) and ceiling > 0:
            ratios = [min(c["warmup"], c["end"]) / ceiling for c in learned["critics"].values()]
            text += ", learned/ceiling " + ", ".join(f"{r:.2f}" for r in ratios)
            ok = ok and all(math.isfinite(r) and r >= gates.learned_share_of_ceiling for r in ratios)
        out.append(
            GateResult(
                "predictability",
                measured(text),
                f"ceiling >= {gates.critic_ceiling:g}, learned >= {gates.learned_share_of_ceiling:g} x ceiling",
                ok,
            )
        )
        out.append(
            GateResult(
                "premise",
                measured(f"between-turn share {share:.2f}"),
                f">= {gates.premise_share:g}",
                _ge(share, gates.premise_share),
            )
        )
    elif role == "control":
        passed = None if not math.isfinite(share) else share < gates.control_share
        out.append(
            GateResult("premise", measured(f"between-turn share {share:.2f}"), f"< {gates.control_share:g}", passed)
        )
    return out


def gates_table(judged: Mapping[str, list[GateResult]]) -> str:
    lines = ["| task | gate | measured | threshold | passes |", "|---|---|---|---|---|"]
    for task, results in judged.items():
        for r in results:
            passed = "—" if r.passed is None else ("yes" if r.passed else "**no**")
            lines.append(f"| {task} | {r.gate} | {r.measured} | {r.threshold} | {passed} |")
    return "\n".join(lines)
