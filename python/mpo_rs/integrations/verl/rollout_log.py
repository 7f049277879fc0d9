"""Rollout logs from verl: each training batch, as the advantage estimator saw it, appended to
Parquet by :class:`mpo_rs.rollout_log.RolloutLogWriter` (readable by ``mpo-rs advantages``
and ``mpo-rs diagnose``).

Enabled by ``algorithm.mpo.rollout_log_dir=DIR`` (or, without touching the config, the
environment variable ``MPO_RS_VERL_ROLLOUT_LOG_DIR=DIR`` in the driver), it runs right after
verl's ``compute_advantage`` on the driver, through the plug-in's values hook
(:func:`mpo_rs.integrations.verl.install_values_hook`), so every step's batch is logged with
its critic values and rewards, whichever estimator trains. :func:`log_batch` does the same
for a ``DataProto`` from your own code.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ...exceptions import InvalidBatchError
from ...rollout_log import RolloutLogWriter
from .config import MPOOptions

__all__ = ["ROLLOUT_LOG_ENV", "after_compute_advantage", "log_batch", "rollout_log_dir", "writer_for"]

ROLLOUT_LOG_ENV = "MPO_RS_VERL_ROLLOUT_LOG_DIR"

_writers: dict[Path, RolloutLogWriter] = {}
_steps: dict[Path, int] = {}
_lock = threading.Lock()


def log_batch(writer: RolloutLogWriter, data: Any, *, step: int | None = None) -> None:
    """Appends a verl ``DataProto`` batch to ``writer``, one row per trajectory.

    Reads ``data.batch``: ``responses`` (B, R), ``response_mask`` (1 on LLM tokens; else
    derived from the response part of ``attention_mask``), and when present
    ``input_ids``/``attention_mask`` (B, P + R: the prompt is logged too, as observation
    tokens), ``values`` (B, R), ``token_level_rewards`` (else ``token_level_scores``) as the
    token rewards; the score of a row is the sum of its ``token_level_scores`` (the outcome,
    without a KL penalty) or of its rewards. ``data.non_tensor_batch["uid"]`` is the group
    id. ``step`` defaults to ``data.meta_info["global_steps"]``.
    """
    batch = data.batch
    keys = set(batch.keys())
    if "responses" not in keys:
        raise InvalidBatchError(f"rollout log: the DataProto has no `responses` (it has {', '.join(sorted(keys))})")
    responses = batch["responses"]
    width = responses.shape[1]
    attention = batch["attention_mask"] if "attention_mask" in keys else None
    if "response_mask" in keys:
        response_mask = batch["response_mask"]
    elif attention is not None:
        response_mask = attention[:, -width:]
    else:
        raise InvalidBatchError("rollout log: the DataProto has neither `response_mask` nor `attention_mask`")
    reward_key = next((k for k in ("token_level_rewards", "token_level_scores") if k in keys), None)
    token_rewards = None if reward_key is None else batch[reward_key]
    score_source = batch["token_level_scores"] if "token_level_scores" in keys else token_rewards
    scores = None if score_source is None else score_source.float().sum(dim=-1)
    values = batch["values"] if "values" in keys else None

    if "input_ids" in keys and attention is not None and batch["input_ids"].shape[1] >= width:
        input_ids = batch["input_ids"]
        prompt = input_ids.shape[1] - width
        loss_mask = _left_zeros(response_mask, prompt)
        values = None if values is None else _left_zeros(values, prompt)
        token_rewards = None if token_rewards is None else _left_zeros(token_rewards, prompt)
    else:
        input_ids = responses
        attention = None if attention is None else attention[:, -width:]
        loss_mask = response_mask
    if step is None:
        step = (getattr(data, "meta_info", None) or {}).get("global_steps")
        if step is None:
            raise InvalidBatchError("rollout log: no `step` given and the DataProto's meta_info has no `global_steps`")
    uid = (getattr(data, "non_tensor_batch", None) or {}).get("uid")
    writer.append_padded(
        input_ids=input_ids,
        loss_mask=loss_mask,
        attention_mask=attention,
        values=values,
        token_rewards=token_rewards,
        scores=scores,
        group_ids=None if uid is None else np.asarray([str(u) for u in uid], dtype=object),
        step=int(step),
    )


def _left_zeros(x: Any, columns: int) -> Any:
    """``x`` (B, R) with ``columns`` zero columns in front (the prompt's place)."""
    import torch

    return torch.cat([x.new_zeros((x.shape[0], columns)), x], dim=1)


def rollout_log_dir(config: Any) -> str | None:
    """``algorithm.mpo.rollout_log_dir`` if set, else ``$MPO_RS_VERL_ROLLOUT_LOG_DIR``, else None."""
    configured = MPOOptions.from_config(config).rollout_log_dir  # checked there
    if configured:
        return str(os.fspath(configured))
    return os.environ.get(ROLLOUT_LOG_ENV) or None


def writer_for(directory: str | os.PathLike[str]) -> RolloutLogWriter:
    """The process's writer for ``directory`` (created on first use, or after a close;
    closed at exit, which finishes its last file)."""
    path = Path(directory).absolute()
    with _lock:
        writer = _writers.get(path)
        if writer is None or writer.closed:
            writer = _writers[path] = RolloutLogWriter(path)
        return writer


def after_compute_advantage(data: Any, config: Any) -> None:
    """Called by the values hook after verl's ``compute_advantage``: logs ``data`` when a
    rollout-log directory is configured. The step is ``meta_info["global_steps"]`` when the
    batch carries it, else the count of batches logged in this process (from 1, as verl's
    global step)."""
    directory = rollout_log_dir(config)
    if directory is None:
        return
    writer = writer_for(directory)
    path = Path(directory).absolute()
    with _lock:
        _steps[path] = _steps.get(path, 0) + 1
        count = _steps[path]
    step = (getattr(data, "meta_info", None) or {}).get("global_steps", count)
    log_batch(writer, data, step=int(step))
