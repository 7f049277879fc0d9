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
    # transformers 5.24 deprecates the gradient_checkpointing* names that trl 1.16 still uses.
    r"ignore:`\w*gradient_checkpointing\w*` is deprecated:FutureWarning",
    # TRL's notices that rollout_func and environment_factory are experimental (used on purpose).
    "ignore:You are using 'rollout_func', which is an experimental feature:UserWarning",
    "ignore:You are using 'environment_factory', which is an experimental feature:UserWarning",
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


def _train_once(trainer) -> tuple[mpo_trl.MPOBatch, np.ndarray, np.ndarray]:
    """Trains ``trainer``; its last batch, with the loss mask flat and the rows' offsets."""
    trainer.train()
    last = trainer.mpo_last
    assert last is not None
    mask = last.loss_mask.cpu().numpy().astype(np.uint8)
    rows, cols = mask.shape
    return last, mask.reshape(-1), np.arange(rows + 1, dtype=np.int64) * cols


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
    for batch, last in zip(log.batches, seen, strict=True):
        assert torch.equal(batch["loss_mask"], last.loss_mask)
        np.testing.assert_array_equal(batch["scores"], last.scores)
    # Group ids in the log are unique over the run: one group per prompt of each batch.
    logged = np.concatenate([b["group_ids"] for b in log.batches])
    assert len(np.unique(logged)) == sum(len(np.unique(last.group_ids)) for last in seen)
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


def test_trl_mae_at_lam_1_beta_0_is_trls_grpo(tmp_path: Path) -> None:
    """With lam=1, beta=0 and TRL's eps (1e-4) in the baseline, MPO's per-token advantages
    are TRL's own GRPO advantages on every policy token; TRL's loss (turn_ratio=None) trains."""
    trainer = trl_mpo.build_trainer(
        tmp_path,
        max_steps=2,
        estimator=Estimator("mae", lam=1.0, beta=0.0),
        baseline=Estimator("grpo", eps=1e-4),
        turn_ratio=None,
    )
    trainer.train()
    last = trainer.mpo_last
    assert last is not None
    mask = last.loss_mask.cpu().numpy() == 1
    grpo = last.grpo_advantages.cpu().numpy()[:, None] * np.ones(mask.shape, dtype=np.float32)
    np.testing.assert_allclose(last.advantages.cpu().numpy()[mask], grpo[mask], rtol=1e-5, atol=1e-6)


def test_trl_settings_mpo_cannot_carry_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="MAE estimator"):
        trl_mpo.build_trainer(tmp_path, estimator="gae")
    with pytest.raises(InvalidOptionError, match="group estimator"):
        trl_mpo.build_trainer(tmp_path, baseline="mae")
    with pytest.raises(InvalidOptionError, match="turn_ratio"):
        trl_mpo.build_trainer(tmp_path, turn_ratio="sum")
    with pytest.raises(InvalidOptionError, match="append_padded"):
        trl_mpo.build_trainer(tmp_path, rollout_log=object())
    with pytest.raises(InvalidOptionError, match="lam_intra"):
        trl_mpo.build_trainer(tmp_path, estimator=Estimator("mae", lam_intra=1.5))


def test_trl_turn_ratio_loss_refuses_loss_types_it_does_not_reduce(tmp_path: Path, monkeypatch) -> None:
    real = trl_mpo.GRPOConfig

    def config(**kwargs):
        return real(**{**kwargs, "loss_type": "cispo"})

    monkeypatch.setattr(trl_mpo, "GRPOConfig", config)
    with pytest.raises(InvalidOptionError, match="loss_type='cispo'"):
        trl_mpo.build_trainer(tmp_path)
    trl_mpo.build_trainer(tmp_path, turn_ratio=None)  # TRL's own loss takes any loss_type


def test_trl_values_from_a_value_model_go_to_mae(tmp_path: Path) -> None:
    """A trainer with a critic overrides mpo_values; MAE then uses the values (no baseline)."""

    class WithCritic(mpo_trl.MPOGRPOTrainer):
        def mpo_values(self, output):
            ids = output["completion_ids"]
            return (ids.float() % 3) / 3.0  # a stand-in value head: any (B, C) tensor

    trainer = trl_mpo.build_trainer(tmp_path, max_steps=1)
    trainer.__class__ = WithCritic
    last, mask, offsets = _train_once(trainer)
    assert last.values is not None
    direct = mpo_rs.mae_advantages(
        last.values.cpu().numpy().astype(np.float32).reshape(-1),
        mask,
        offsets,
        scores=last.scores,
        estimator=trainer.mpo_estimator,
    )
    np.testing.assert_array_equal(last.advantages.cpu().numpy().reshape(-1), direct.advantages)


@pytest.mark.parametrize("loss_type", sorted(mpo_trl.LOSS_AGGREGATIONS))
def test_trl_turn_ratio_loss_at_ratio_1_is_trls_loss(tmp_path: Path, loss_type: str) -> None:
    """Before the first update the old log-probs are the current ones, every ratio is 1 and
    the turn-ratio loss must be TRL's own loss for the same advantages: the reduction and
    TRL's normaliser of each loss_type carried over (and a gradient that matches)."""
    trainer = trl_mpo.build_trainer(tmp_path, max_steps=1)
    trainer.loss_type = loss_type
    checked: list[tuple[float, float]] = []
    original = trainer._compute_loss

    def compare(model, inputs):
        if not checked:
            ours = mpo_trl.MPOGRPOTrainer._compute_loss(trainer, model, inputs)
            theirs = trl.GRPOTrainer._compute_loss(trainer, model, inputs)
            ours_grad = torch.autograd.grad(ours, [p for p in model.parameters() if p.requires_grad])
            theirs_grad = torch.autograd.grad(theirs, [p for p in model.parameters() if p.requires_grad])
            checked.append((float(ours.detach()), float(theirs.detach())))
            for a, b in zip(ours_grad, theirs_grad, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        return original(model, inputs)

    trainer._compute_loss = compare
    trainer.train()
    assert checked
    ours, theirs = checked[0]
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7)


def _byte_tokenizer_with_qwen3_template():
    """A byte-level tokenizer (any text round-trips) with Qwen3's special tokens and TRL's
    shipped Qwen3 chat template, which TRL knows how to parse tool calls from."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen3_chat_template

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    special = [
        "<|im_start|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
    ]
    tokenizer.add_special_tokens({"additional_special_tokens": special})
    tokenizer.chat_template = qwen3_chat_template
    return tokenizer


def _scripted_llama(tokenizer, seed: int = 0):
    """A randomly initialised Llama whose sampling is scripted (a random model never writes
    a well-formed tool call): first it calls ``lookup`` with a random key, after the tool's
    response it answers two random letters. Its forward pass (the log-probs the loss
    trains) is the real model's."""
    import random

    from transformers import LlamaForCausalLM

    rng = random.Random(seed)

    class ScriptedLlama(LlamaForCausalLM):
        def generate(self, input_ids=None, attention_mask=None, **kwargs):
            rows = []
            for r in range(input_ids.shape[0]):
                context = tokenizer.decode(input_ids[r][attention_mask[r].bool()])
                if "<tool_response>" in context:
                    text = rng.choice("ab") + rng.choice("ab") + "<|im_end|>"
                else:
                    key = rng.choice("xy")
                    text = (
                        '<tool_call>\n{"name": "lookup", "arguments": {"key": "' + key + '"}}\n</tool_call><|im_end|>'
                    )
                rows.append(tokenizer(text, add_special_tokens=False)["input_ids"])
            width = input_ids.shape[1] + max(map(len, rows))
            out = torch.full((input_ids.shape[0], width), tokenizer.pad_token_id, dtype=input_ids.dtype)
            out[:, : input_ids.shape[1]] = input_ids
            for r, ids in enumerate(rows):
                out[r, input_ids.shape[1] : input_ids.shape[1] + len(ids)] = torch.tensor(ids)
            return out.to(input_ids.device)

    torch.manual_seed(seed)
    config = trl_mpo.tiny_llama_config(
        len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_position_embeddings=2048,
    )
    return ScriptedLlama(config)


def test_trl_environment_factory_tool_mask_gives_the_turns(tmp_path: Path) -> None:
    """TRL's own tool loop (environment_factory, Qwen3's template, TRL's response parser):
    the tool response is 0 in TRL's tool mask, so each completion is two turns, and the
    advantages equal mpo_rs's on the captured batch."""
    tokenizer = _byte_tokenizer_with_qwen3_template()
    trainer = trl_mpo.build_environment_trainer(_scripted_llama(tokenizer), tokenizer, tmp_path)
    seen: list[mpo_trl.MPOBatch] = []
    original = trainer._generate_and_score_completions

    def capture(inputs):
        out = original(inputs)
        assert "tool_mask" in out, "TRL's tool loop produced no tool mask"
        seen.append(trainer.mpo_last)
        return out

    trainer._generate_and_score_completions = capture
    trainer.train()
    assert seen
    for last in seen:
        mask = last.loss_mask.cpu().numpy()
        rows, cols = mask.shape
        turns = mpo_rs.segment_turns(mask.reshape(-1).astype(np.uint8), np.arange(rows + 1, dtype=np.int64) * cols)
        assert np.all(np.diff(turns.traj_offsets) == 2)
        expected = _expected_critic_free(last, trainer.mpo_estimator, trainer.mpo_baseline)
        np.testing.assert_array_equal(last.advantages.cpu().numpy(), expected)
    assert any(last.scores.std() > 0 for last in seen)


def test_trl_a_completion_without_reward_is_refused_naming_it(tmp_path: Path, monkeypatch) -> None:
    """TRL gives a completion every reward function scored None advantage 0 and leaves it out
    of its group's baseline; MPO needs every score of a group, so it refuses the batch."""

    scored = trl_mpo.reward

    def reward(completion_ids, **kwargs):
        return [None, *scored(completion_ids[1:])]

    monkeypatch.setattr(trl_mpo, "reward", reward)
    trainer = trl_mpo.build_trainer(tmp_path, max_steps=1)
    with pytest.raises(mpo_rs.InvalidBatchError, match="completion 0 of the batch has no reward"):
        trainer.train()


def test_trl_gigpo_baseline_is_mpo_rs_gigpo_on_the_completions(tmp_path: Path) -> None:
    """baseline="gigpo": the trainer's advantages are GiGPO's over the completions (scores on
    their last turn, anchor states hashed from the completion token ids)."""
    trainer = trl_mpo.build_trainer(tmp_path, max_steps=1, baseline=Estimator("gigpo", gamma=0.9))
    assert trainer.mpo_baseline == Estimator("gigpo", gamma=0.9)
    last, mask, offsets = _train_once(trainer)
    assert last.token_ids is not None
    want = mpo_rs.gigpo_advantages(
        mask,
        offsets,
        group_ids=last.group_ids,
        scores=last.scores,
        token_ids=last.token_ids.cpu().numpy().reshape(-1),
        gamma=0.9,
    )
    np.testing.assert_array_equal(last.advantages.cpu().numpy().reshape(-1), want.advantages)
    with pytest.raises(InvalidOptionError, match="baseline"):
        trl_mpo.build_trainer(tmp_path, max_steps=1, baseline=Estimator("mae"))
