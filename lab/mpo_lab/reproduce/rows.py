"""The results table's rows: one per run, its final numbers (:func:`summarize_run`), and the
lookups by arm and seed every later layer reads them through."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .config import ARMS, VARIANT, ReproduceConfig


def arm_labels(config: ReproduceConfig) -> dict[str, str]:
    """Arm key -> label, for the configuration's arms and every committed one."""
    return {arm.key: arm.label for arm in (*ARMS, *config.arms)}


def task_title(name: str) -> str:
    """A task's name on the page: the class of a registry name (KeyDoor; a variant's label
    after it, ``Search (think16)``), else the user's ``module:factory``."""
    from ..envs import ENVIRONMENTS

    base, _, variant = name.partition(VARIANT)
    cls = ENVIRONMENTS.get(base)
    if cls is None:
        return f"`{name}`"
    return f"{cls.__name__} ({variant})" if variant else cls.__name__


def nanmean(xs: Sequence[float]) -> float:
    a = np.asarray(xs, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else math.nan


def summarize_run(run: dict[str, Any]) -> dict[str, Any]:
    """One row of the results table: the run's final numbers."""
    curve, evals = run["curve"], run["evals"]
    tail = curve[-max(1, len(curve) // 10) :]
    last = evals[-1]
    row: dict[str, Any] = {
        "arm": run["arm"],
        "seed": run["seed"],
        "final_success": last["success"],
        # The update-0 evaluation is the base policy's, the same for every arm of a seed: left
        # out, so it does not dilute the differences between arms.
        "auc_success": nanmean([e["success"] for e in evals if e.get("update", 1.0) > 0] or [last["success"]]),
        "final_eval_turns": last["turns"],
        "final_train_success": nanmean([c["success"] for c in tail]),
        "final_explained_variance": nanmean([c["explained_variance"] for c in tail]),
        "initial_entropy": curve[0]["entropy"] if curve else math.nan,
        "final_entropy": nanmean([c["entropy"] for c in tail]),
        "final_turns": nanmean([c["turns"] for c in tail]),
        "final_response_length": nanmean([c["response_length"] for c in tail]),
        "sample_s_per_update": nanmean([c["sample_s"] for c in curve]),
        "step_s_per_update": nanmean([c["step_s"] for c in curve]),
        "wall_s": run["wall_s"],
        "critic_trained": bool(run.get("critic_trained", True)),
    }
    base, warmup = run.get("base") or {}, run.get("warmup") or {}
    row["base_success"] = base.get("held_out_success", math.nan)
    row["warmup_explained_variance"] = warmup.get("explained_variance", math.nan)
    row["entropy_drop"] = row["initial_entropy"] - row["final_entropy"]
    for key, value in last.items():
        if key.startswith("pass@"):
            row["final_" + key] = value
    diag = run.get("diagnosis") or {}
    row["between_share"] = diag.get("median_between_share", math.nan)
    row["between_gt_within"] = diag.get("fraction_between_gt_within", math.nan)
    for key in list(row):
        if row[key] is None:
            row[key] = math.nan
    return row


def arm_columns(config: ReproduceConfig, key: str) -> dict[str, Any]:
    """The run table's columns that say what ran: ``task``, ``critic`` (``none``, ``learned``,
    ``reference``, ``reference+noise``), ``critic_ev_target`` (the critic-quality ladder's
    fraction of the reference's explained variance; NaN elsewhere) and ``think_tokens`` (the
    task's thinking tokens per turn; 0 without)."""
    try:
        arm = config.arm(key)
    except KeyError:
        return {}
    params = config.task(arm.task).kwargs() if any(t.name == arm.task for t in config.tasks) else {}
    return {
        "task": arm.task,
        "critic": arm.critic_kind,
        "critic_ev_target": math.nan if arm.critic_ev is None else float(arm.critic_ev),
        "think_tokens": int(params.get("think_tokens", 0)),
    }


def by_arm(rows: list[dict[str, Any]], metric: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for row in rows:
        out.setdefault(row["arm"], []).append(float(row.get(metric, math.nan)))
    return out


def by_seed(rows: list[dict[str, Any]], metric: str, arm: str) -> dict[int, float]:
    return {int(r["seed"]): float(r.get(metric, math.nan)) for r in rows if r["arm"] == arm}


def nanmedian(xs: Sequence[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return float(np.median(finite)) if finite else math.nan
