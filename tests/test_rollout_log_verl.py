"""The verl rollout-log hook (mpo_rs.integrations.verl.rollout_log) on hand-built DataProtos."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402

from mpo_rs import InvalidBatchError, InvalidOptionError  # noqa: E402
from mpo_rs.cli import main as cli_main  # noqa: E402
from mpo_rs.integrations import verl as plugin  # noqa: E402
from mpo_rs.integrations.verl import rollout_log  # noqa: E402
from mpo_rs.rollout_log import RolloutLogWriter  # noqa: E402

PROMPT, RESPONSE = 6, 20


def verl_batch(seed: int, rows: int = 8, step: int | None = 3) -> DataProto:
    """What verl's trainer holds at compute_advantage: left-padded prompts and right-padded
    multi-turn responses (LLM turns, tool outputs with response_mask 0, then padding),
    critic values, an outcome reward on each row's last LLM token, uids in groups of 4."""
    rng = np.random.default_rng(seed)
    prompt_len = rng.integers(2, PROMPT + 1, rows)
    response_mask = np.zeros((rows, RESPONSE), np.int64)
    response_attention = np.zeros((rows, RESPONSE), np.int64)
    for b in range(rows):
        pos, end = 0, int(rng.integers(RESPONSE // 2, RESPONSE + 1))
        last = 0
        while pos < end:
            turn = int(rng.integers(1, 5))
            response_mask[b, pos : min(pos + turn, end)] = 1
            last = min(pos + turn, end) - 1
            pos += turn + int(rng.integers(1, 4))
        response_attention[b, : last + 1] = 1
    prompt_attention = (np.arange(PROMPT)[None, :] >= PROMPT - prompt_len[:, None]).astype(np.int64)
    responses = rng.integers(1, 1000, (rows, RESPONSE)) * response_attention
    prompts = rng.integers(1, 1000, (rows, PROMPT)) * prompt_attention
    scores = np.zeros((rows, RESPONSE), np.float32)
    last_llm = RESPONSE - 1 - np.argmax(response_mask[:, ::-1], axis=1)
    scores[np.arange(rows), last_llm] = rng.integers(0, 2, rows)
    kl = (0.01 * rng.standard_normal((rows, RESPONSE)) * response_mask).astype(np.float32)
    values = rng.standard_normal((rows, RESPONSE)).astype(np.float32) * response_attention
    tensors = {
        "prompts": torch.from_numpy(prompts),
        "responses": torch.from_numpy(responses),
        "input_ids": torch.from_numpy(np.concatenate([prompts, responses], axis=1)),
        "attention_mask": torch.from_numpy(np.concatenate([prompt_attention, response_attention], axis=1)),
        "response_mask": torch.from_numpy(response_mask),
        "values": torch.from_numpy(values),
        "token_level_scores": torch.from_numpy(scores),
        "token_level_rewards": torch.from_numpy(scores + kl),
    }
    uid = np.array([f"prompt-{seed}-{b // 4}" for b in range(rows)], dtype=object)
    meta = {} if step is None else {"global_steps": step}
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid}, meta_info=meta)


def read(directory) -> pa.Table:
    files = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
    return pa.concat_tables([pq.read_table(p) for p in files])


def test_log_batch_writes_prompt_and_response_tokens_with_the_masks_values_and_rewards(tmp_path):
    data = verl_batch(0)
    with RolloutLogWriter(tmp_path / "log") as w:
        rollout_log.log_batch(w, data)
    table = read(tmp_path / "log")
    b = data.batch
    attention = b["attention_mask"].bool()
    for row in range(len(data)):
        keep = attention[row]
        assert table.column("token_ids")[row].as_py() == b["input_ids"][row][keep].tolist()
        mask = torch.cat([torch.zeros(PROMPT, dtype=torch.int64), b["response_mask"][row]])[keep]
        assert table.column("loss_mask")[row].as_py() == mask.bool().tolist()
        values = torch.cat([torch.zeros(PROMPT), b["values"][row]])[keep]
        assert table.column("values")[row].as_py() == values.tolist()
        rewards = torch.cat([torch.zeros(PROMPT), b["token_level_rewards"][row]])[keep]
        assert table.column("rewards")[row].as_py() == rewards.tolist()
        assert table.column("score")[row].as_py() == float(b["token_level_scores"][row].sum())
    assert table.column("group_id").to_pylist() == list(data.non_tensor_batch["uid"])
    assert table.column("step").to_pylist() == [3] * len(data)


def test_compute_advantage_logs_each_step_when_the_config_names_a_directory(tmp_path):
    ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")
    plugin.install_values_hook()
    log = tmp_path / "log"
    config = OmegaConf.create({"gamma": 1.0, "lam": 0.95, "mpo": {"lam": 0.8, "rollout_log_dir": str(log)}})
    outs = [
        ray_trainer.compute_advantage(verl_batch(s, step=s + 1), adv_estimator="mpo_mae", config=config)
        for s in range(2)
    ]
    rollout_log.writer_for(log).close()  # what the interpreter's exit does
    table = read(log)
    assert table.column("step").to_pylist() == [1] * 8 + [2] * 8
    # `mpo-rs advantages` on the log gives the advantages the plug-in trained with.
    assert cli_main(["advantages", str(log), "-o", str(tmp_path / "adv"), "--lam", "0.8", "-q"]) == 0
    got = read(tmp_path / "adv")
    for k, out in enumerate(outs):
        b = out.batch
        keep = b["attention_mask"].bool()
        for row in range(len(out)):
            adv = torch.cat([torch.zeros(PROMPT), b["advantages"][row]])[keep[row]]
            mask = torch.cat([torch.zeros(PROMPT, dtype=torch.bool), b["response_mask"][row].bool()])[keep[row]]
            logged = torch.tensor(got.column("advantages")[8 * k + row].as_py())
            torch.testing.assert_close(logged[mask], adv[mask], rtol=1e-5, atol=1e-6)
    # Without the key (and without the environment variable) nothing is logged.
    plain = OmegaConf.create({"gamma": 1.0, "lam": 0.95, "mpo": {"lam": 0.8}})
    ray_trainer.compute_advantage(verl_batch(5), adv_estimator="mpo_mae", config=plain)
    assert sorted(p.name for p in log.iterdir() if not p.name.startswith(".")) == ["part-000000-step-000001.parquet"]


def test_the_environment_variable_enables_the_log_and_counts_steps_without_global_steps(tmp_path, monkeypatch):
    ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")
    plugin.install_values_hook()
    log = tmp_path / "env-log"
    monkeypatch.setenv(plugin.ROLLOUT_LOG_ENV, str(log))
    config = OmegaConf.create({"gamma": 1.0, "lam": 1.0})
    for s in range(3):
        ray_trainer.compute_advantage(verl_batch(s, step=None), adv_estimator="mpo_grpo", config=config)
    rollout_log.writer_for(log).close()
    table = read(log)
    assert table.column("step").to_pylist() == [1] * 8 + [2] * 8 + [3] * 8
    assert cli_main(["diagnose", str(log)]) == 0


def test_a_batch_without_responses_or_step_is_refused_by_name(tmp_path):
    with RolloutLogWriter(tmp_path / "log") as w:
        data = verl_batch(0, step=None)
        with pytest.raises(InvalidBatchError, match="global_steps"):
            rollout_log.log_batch(w, data)
        bare = DataProto.from_dict(tensors={"response_mask": torch.ones(2, 3)})
        with pytest.raises(InvalidBatchError, match="no `responses`"):
            rollout_log.log_batch(w, bare, step=0)
    # A foreign directory is refused when the first batch is logged, naming the file.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(InvalidOptionError, match=r"notes\.txt"):
        rollout_log.writer_for(tmp_path / "other")


def test_verls_mpo_loss_reports_the_turn_ratio_statistics_of_policy_loss():
    from verl.workers.config import ActorConfig

    from mpo_rs.torch import losses

    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
        clip_ratio_low=0.15, clip_ratio_high=0.3, clip_ratio_c=3.0,
    )  # fmt: skip
    torch.manual_seed(0)
    new = torch.randn(4, 24, dtype=torch.float64)
    old = new + 0.3 * torch.randn(4, 24, dtype=torch.float64)
    mask = (torch.rand(4, 24) > 0.4).long()
    adv = torch.randn(4, 24, dtype=torch.float64)
    for mode in ("mpo", "mpo_geo_mean"):
        loss_fn = core_algos.get_policy_loss_fn(mode)
        _, metrics = loss_fn(old, new, adv, mask, "token-mean", config)
        _, want = losses.policy_loss(new, old, adv, mask.bool(), clip_low=0.15, clip_high=0.3)
        for name in losses.TURN_RATIO_STATISTICS:
            assert metrics[f"actor/{name}"] == pytest.approx(float(want[name]), rel=1e-6), name
