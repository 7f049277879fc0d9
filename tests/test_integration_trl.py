"""MPO in TRL's GRPOTrainer, end to end: a tiny randomly initialised Llama, a two-turn tool
environment through TRL's ``rollout_func`` / ``env_mask`` path, a few optimizer steps on the
CPU; the advantages the trainer used equal ``mpo_rs``'s on the same batch.

The recipe itself is ``examples/trl_mpo.py`` (docs/integrations.md, "TRL"): this test
imports it. Skipped when trl is not installed (``make test`` installs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("datasets")
trl = pytest.importorskip("trl", reason="trl is not installed (the `trl` extra; make test installs it)")

import torch  # noqa: E402

import mpo_rs  # noqa: E402
from mpo_rs import Estimator, InvalidOptionError  # noqa: E402
from mpo_rs.integrations import trl as mpo_trl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import trl_mpo  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    # TRL's experimental-feature notices and transformers' deprecations are TRL's own.
    "ignore::UserWarning",
    "ignore::FutureWarning",
    "ignore::DeprecationWarning",
)


class Recorder:
    """A rollout log (the ``append_padded`` contract of mpo_rs.rollout_log) that keeps the batches."""

    def __init__(self) -> None:
        self.batches: list[dict] = []

    def append_padded(self, **batch) -> None:
        self.batches.append(batch)


def _expected_critic_free(last: mpo_trl.MPOBatch, estimator: Estimator, baseline: Estimator) -> np.ndarray:
    """The advantages from mpo_rs directly: the group baseline as each row's value, MAE over
    the loss mask's turns with the score on the last policy token, times the group scale."""
    mask = last.loss_mask.cpu().numpy().astype(np.uint8)
    rows, cols = mask.shape
    scores = last.scores
    ids = last.group_ids
    per_row = mpo_rs.group_advantages(scores, ids, estimator=baseline)
    # Baseline b_j with per_row_j = (s_j - b_j) * scale_j: recover both from the group.
    out = np.zeros((rows, cols), dtype=np.float32)
    for g in np.unique(ids):
        members = np.flatnonzero(ids == g)
        s = scores[members].astype(np.float64)
        b = s.mean()
        scale = 1.0 / (s.std(ddof=1) + baseline.options["eps"]) if baseline.options.get("norm_std") else 1.0
        values = np.repeat(np.full(len(members), b, dtype=np.float32), cols)
        offsets = np.arange(len(members) + 1, dtype=np.int64) * cols
        r = mpo_rs.mae_advantages(
            values, mask[members].reshape(-1), offsets, scores=scores[members], estimator=estimator
        )
        out[members] = r.advantages.reshape(len(members), cols) * np.float32(scale)
        np.testing.assert_allclose(per_row[members], (s - b) * scale, rtol=1e-5, atol=1e-6)
    return out


def test_trl_recipe_trains_with_mpo_advantages(tmp_path: Path) -> None:
    log = Recorder()
    trainer = trl_mpo.build_trainer(tmp_path, rollout_log=log, max_steps=3)
    seen: list[mpo_trl.MPOBatch] = []
    original = trainer._generate_and_score_completions

    def capture(inputs):
        out = original(inputs)
        assert trainer.mpo_last is not None
        seen.append(trainer.mpo_last)
        assert out["advantages"] is trainer.mpo_last.advantages or torch.equal(
            out["advantages"], trainer.mpo_last.advantages
        )
        return out

    trainer._generate_and_score_completions = capture
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 3
    assert seen, "the trainer generated no batch"
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.model.parameters(), strict=True))

    for last in seen:
        mask = last.loss_mask.cpu().numpy()
        # Two turns per completion: the tool result (env_mask 0) splits the completion.
        turns = mpo_rs.segment_turns(
            mask.reshape(-1).astype(np.uint8), np.arange(mask.shape[0] + 1, dtype=np.int64) * mask.shape[1]
        )
        assert np.all(np.diff(turns.traj_offsets) == 2)
        expected = _expected_critic_free(last, trainer.mpo_estimator, trainer.mpo_baseline)
        np.testing.assert_array_equal(last.advantages.cpu().numpy(), expected)
        assert np.all(last.advantages.cpu().numpy()[mask == 0] == 0)
    assert len(log.batches) == len(seen)
    assert {k for k in log.batches[0]} == {
        "input_ids",
        "loss_mask",
        "attention_mask",
        "values",
        "token_rewards",
        "scores",
        "group_ids",
        "step",
    }
