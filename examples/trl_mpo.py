"""MPO in TRL (trl 1.16): a two-turn tool environment, trained with MPOGRPOTrainer.

A tiny randomly initialised Llama and a word-level tokenizer are built here, so the recipe
runs offline on a CPU in seconds (``python examples/trl_mpo.py``); for a real run, load your
model and tokenizer instead and keep the rest. ``tests/test_integration_trl.py`` runs this
file and checks that the advantages the trainer used equal mpo_rs's on the same batch.

Each completion is two turns of the policy around one tool call: the model writes a first
turn, the "tool" answers with a few tokens (``env_mask`` 0: not the policy's), the model
writes a second turn. TRL multiplies the completion mask by that mask, and each run of ones
of the product is one turn for MPO.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig

from mpo_rs import Estimator
from mpo_rs.integrations.trl import MPOGRPOTrainer

WORDS = [f"w{i}" for i in range(28)]
TURN_TOKENS = 3  # new tokens per policy turn


def tiny_model_and_tokenizer(seed: int = 0) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A randomly initialised 1-layer Llama and a word-level tokenizer (no download)."""
    vocab = {"<pad>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(seed)
    config = tiny_llama_config(len(vocab), pad_token_id=0, eos_token_id=1, max_position_embeddings=64)
    return LlamaForCausalLM(config), tokenizer


def tiny_llama_config(vocab_size: int, **settings: Any) -> LlamaConfig:
    """A 1-layer Llama of width 16 with no BOS token, which trains on a CPU in seconds;
    ``settings``: the rest of its ``LlamaConfig`` (the pad and EOS ids, the context length)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        bos_token_id=None,
        **settings,
    )


def tool(turn: list[int]) -> list[int]:
    """The environment: answers the first turn with 1 or 2 tokens that depend on it."""
    return [2 + sum(turn) % 5] * (1 + turn[-1] % 2)


def two_turn_rollout(prompts: list[Any], trainer: MPOGRPOTrainer) -> dict[str, list[Any]]:
    """TRL's ``rollout_func``: turn 1, the tool's answer, turn 2. ``env_mask`` is 1 on the
    policy's tokens and 0 on the tool's."""
    tokenizer = trainer.processing_class
    model = trainer.model
    out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    for prompt in prompts:
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        context = list(prompt_ids)
        completion: list[int] = []
        mask: list[int] = []
        for turn in range(2):
            with torch.no_grad():
                generated = model.generate(
                    torch.tensor([context], device=model.device),
                    max_new_tokens=TURN_TOKENS,
                    min_new_tokens=TURN_TOKENS,
                    do_sample=True,
                    pad_token_id=tokenizer.pad_token_id,
                )
            new = generated[0, len(context) :].tolist()
            completion += new
            mask += [1] * len(new)
            context += new
            if turn == 0:
                answer = tool(new)
                completion += answer
                mask += [0] * len(answer)
                context += answer
        completion.append(tokenizer.eos_token_id)  # the policy ends its second turn
        mask.append(1)
        out["prompt_ids"].append(prompt_ids)
        out["completion_ids"].append(completion)
        out["logprobs"].append([0.0] * len(completion))  # used by TRL only with vLLM
        out["env_mask"].append(mask)
    return out


def reward(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """The outcome: the share of the second turn's tokens with the parity of the tool's answer."""
    rewards = []
    for ids in completion_ids:
        answer = ids[TURN_TOKENS]
        rewards.append(sum((t - answer) % 2 == 0 for t in ids[-TURN_TOKENS - 1 : -1]) / TURN_TOKENS)
    return rewards


def cpu_trainer(
    model: Any,
    tokenizer: Any,
    dataset: Dataset,
    output_dir: Path | str,
    *,
    max_steps: int,
    max_completion_length: int,
    reward: Any,
    mpo: dict[str, Any],
    **route: Any,
) -> MPOGRPOTrainer:
    """MPOGRPOTrainer with TRL's configuration for a few small steps on the CPU, the same for
    both trainers: ``route`` is TRL's ``rollout_func`` or ``environment_factory``, ``mpo``
    MPOGRPOTrainer's own arguments."""
    args = GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=2,  # 2 completions per prompt: the group
        steps_per_generation=2,  # the second step reuses the batch: old log-probs differ
        max_completion_length=max_completion_length,
        max_steps=max_steps,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    return MPOGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        **route,
        **mpo,
    )


def build_trainer(output_dir: Path | str, *, rollout_log: Any = None, max_steps: int = 3, **mpo: Any) -> MPOGRPOTrainer:
    """The trainer: MPO's advantages (critic-free MAE over group-normalised scores) and the
    turn-ratio loss. ``mpo`` overrides MPOGRPOTrainer's own arguments."""
    model, tokenizer = tiny_model_and_tokenizer()
    dataset = Dataset.from_dict({"prompt": [" ".join(WORDS[i : i + 3]) for i in range(0, 24, 3)]})
    options: dict[str, Any] = {
        "estimator": Estimator("mae", lam=0.8, lam_intra=0.95, beta=1.0),
        "baseline": "grpo",  # critic-free: the group mean is the value, scaled by 1/(group std + eps)
        "turn_ratio": "product",  # or "geo_mean"; None keeps TRL's token ratio
        "rollout_log": rollout_log,  # e.g. mpo_rs.rollout_log's writer, or None
    }
    return cpu_trainer(
        model, tokenizer, dataset, output_dir, max_steps=max_steps, max_completion_length=16,
        reward=reward, rollout_func=two_turn_rollout, mpo={**options, **mpo},
    )  # fmt: skip


# --------------------------------------------------------------------------- tools: environment_factory


class LookupEnv:
    """TRL's ``environment_factory``: one instance per rollout; each public method is a tool
    the model may call (TRL renders it from the signature and docstring). TRL's tool loop
    sets the tool mask to 0 on each tool response, so a completion that calls the tool once
    has two turns."""

    def reset(self, **kwargs: Any) -> None:
        self.value: str | None = None

    def lookup(self, key: str) -> str:
        """Look up a key.

        Args:
            key: The key to look up.

        Returns:
            The value stored under the key.
        """
        self.value = "a" if key == "x" else "b"
        return self.value


def lookup_reward(completions: list[Any], environments: list[LookupEnv], **kwargs: Any) -> list[float]:
    """The share of the answer's first two characters that are the looked-up value."""
    rewards = []
    for completion, environment in zip(completions, environments, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        value = environment.value
        rewards.append(sum(ch == value for ch in (text or "")[:2]) / 2 if value else 0.0)
    return rewards


def build_environment_trainer(
    model: Any, tokenizer: Any, output_dir: Path | str, *, max_steps: int = 2, **mpo: Any
) -> MPOGRPOTrainer:
    """MPOGRPOTrainer on TRL's tool path: a chat model whose template supports tool calls
    (e.g. a Qwen3), conversational prompts and ``environment_factory``."""
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"look up q{i}"}] for i in range(8)]})
    options: dict[str, Any] = {"estimator": Estimator("mae", lam=0.8), "baseline": "grpo", "turn_ratio": "product"}
    return cpu_trainer(
        model, tokenizer, dataset, output_dir, max_steps=max_steps, max_completion_length=256,
        reward=lookup_reward, environment_factory=LookupEnv, mpo={**options, **mpo},
    )  # fmt: skip


if __name__ == "__main__":
    trainer = build_trainer(sys.argv[1] if len(sys.argv) > 1 else "trl-mpo-out")
    trainer.train()
    print("trained", trainer.state.global_step, "steps; last advantages:", trainer.mpo_last)
