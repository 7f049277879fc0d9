"""Where every arm of a seed starts: its base policy and its warmed-up critic (needs torch).

"Start where the paper starts": the paper's policies are base models that already succeed
9-25% of the time, and its critic is pretrained (VAPO's value pretraining). Here, per (task,
seed):

- the **base policy** is the run's ``TinyCausalLM`` (same architecture, same initialisation
  ``torch.manual_seed(seed)``) behaviour-cloned -- cross-entropy on the policy tokens -- on
  rollouts of a noisy oracle (:class:`mpo_lab.envs.premise.NoisyOracle`), the noise set per
  task in :class:`~mpo_lab.reproduce.config.BasePolicy` so its held-out success is in
  :data:`~mpo_lab.reproduce.config.BASE_BAND`;
- the **warmed-up critic** is :func:`~mpo_rs.torch.critic.value_head_critic` of the base
  policy fitted to the Monte-Carlo returns of base-policy rollouts
  (:class:`~mpo_lab.reproduce.config.CriticWarmup`), for the arms that train a critic.

Both are made once and saved under the run directory, ``OUT/base/<task>-seed<seed>.pt``
and ``OUT/base/<task>-seed<seed>-critic.pt``, with the hash of everything that decides them
(:func:`base_key`, :func:`critic_key`); every arm of the seed loads the same weights, and a
resumed run takes them as they are. A file of other settings is made again.

A user env's base (:mod:`.userbase`) is cloned the same way from the user's demonstrator,
or loaded from the user's policy file (:func:`load_policy_file`; its held-out success is
measured as a cloned base's); the base file of a (task, seed) records the model it is of
(``"model"``: :func:`architecture`), so a later run can be given it.

Task seeds. The demonstrations, the warm-up's rollouts and the held-out tasks (on which
the base success and the warm-up's explained variance are measured) are
:func:`~mpo_lab.seeds.task_seeds` of their own purposes: apart from each other and
from every run's training tasks by construction.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np

from mpo_rs.outputs import write_file

from .._deps import needs

with needs("mpo_lab.reproduce.base"):
    import torch
    from torch import nn

from mpo_rs.exceptions import InvalidConfigError, InvalidOptionError
from mpo_rs.torch.batching import pad_rows
from mpo_rs.torch.critic import value_head_critic
from mpo_rs.torch.losses import value_loss
from mpo_rs.torch.metrics import explained_variance
from mpo_rs.torch.model_io import token_log_probs, token_values

from ..envs.premise import NoisyOracle, belief_model
from ..seeds import HELD_OUT, Stream, task_seeds
from ..train.models import TinyCausalLM
from ..train.sampler import sample
from .config import ReproduceConfig
from .env import make_env, model_max_len
from .sources import Demonstrator, SavedPolicy
from .userbase import base_description, demonstrator_episodes, file_digest

__all__ = [
    "BASE_DIR",
    "architecture",
    "base_key",
    "base_path",
    "base_policy",
    "behaviour_clone",
    "calibrate",
    "critic_key",
    "critic_path",
    "demonstrations",
    "held_out_success",
    "is_cached",
    "load_policy_file",
    "new_policy",
    "policy_rollouts",
    "warm_critic",
]

BASE_DIR = "base"


# --------------------------------------------------------------------------- the model


def new_policy(config: ReproduceConfig, task: str, seed: int) -> TinyCausalLM:
    """The run's policy at its random initialisation (``torch.manual_seed(seed)``): the
    architecture every arm of ``config`` on ``task`` trains."""
    spec = config.task(task)
    probe = make_env(spec)
    torch.manual_seed(Stream.weights(seed))
    model = config.model
    return TinyCausalLM(
        int(probe.vocab_size),
        width=model.width,
        layers=model.layers,
        heads=model.heads,
        max_len=model_max_len(spec, probe),
    ).to(torch.device(config.device))


# --------------------------------------------------------------------------- demonstrations and cloning


@dataclasses.dataclass
class Demonstrations:
    """Episodes flat token by token, in the sampler's layout (prompt, then per turn the K
    action tokens and the observation; the observation that comes with ``done`` left out)."""

    token_ids: np.ndarray
    mask: np.ndarray
    offsets: np.ndarray
    scores: np.ndarray

    @property
    def n(self) -> int:
        return int(self.offsets.shape[0] - 1)


def demonstrations(env: Any, oracle: NoisyOracle, seeds: range, rng: np.random.Generator) -> Demonstrations:
    """One noisy-oracle episode per task seed on the real environment."""
    model = oracle.model
    tokens: list[int] = []
    mask: list[bool] = []
    offsets = [0]
    scores = []
    for seed in seeds:
        observation = env.reset(seed)
        belief = model.initial(observation)
        tokens += observation
        mask += [False] * len(observation)
        score = 0.0
        for _ in range(model.T):
            action = oracle.act(belief, rng)
            tokens += action
            mask += [True] * len(action)
            observation, reward, done = env.step(list(action))
            score += float(reward)
            if done:
                break
            tokens += observation
            mask += [False] * len(observation)
            belief = model.update(belief, action, observation)
        offsets.append(len(tokens))
        scores.append(score)
    return Demonstrations(
        np.asarray(tokens, np.int64), np.asarray(mask, bool), np.asarray(offsets, np.int64), np.asarray(scores)
    )


def behaviour_clone(
    policy: nn.Module, demos: Demonstrations, *, steps: int, batch_size: int, lr: float, rng: np.random.Generator
) -> list[float]:
    """``steps`` Adam steps of the mean cross-entropy of the policy tokens of ``batch_size``
    demonstrations drawn at random (without replacement within a step); the losses."""
    device = next(policy.parameters()).device
    optimizer = torch.optim.Adam(policy.parameters(), lr)
    flat = {"token_ids": demos.token_ids, "mask": demos.mask}
    losses = []
    for _ in range(steps):
        rows = rng.choice(demos.n, size=min(batch_size, demos.n), replace=False)
        padded = pad_rows(flat, demos.offsets, rows)
        ids = torch.from_numpy(padded.arrays["token_ids"]).to(device)
        attention = torch.from_numpy(padded.arrays["attention_mask"]).to(device)
        on_policy = torch.from_numpy(padded.arrays["mask"]).to(device)
        log_probs = token_log_probs(policy, ids, attention)
        loss = -(log_probs * on_policy).sum() / on_policy.sum().clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


@torch.no_grad()
def held_out_success(policy: nn.Module, config: ReproduceConfig, task: str, seed: int, episodes: int) -> float:
    """The policy's success at temperature 1 on ``episodes`` held-out tasks (one rollout each)."""
    spec = config.task(task)
    device = torch.device(config.device)
    gen = torch.Generator(device=device).manual_seed(Stream.base_success(seed))
    was_training = policy.training
    policy.eval()
    out = sample(
        policy,
        lambda: make_env(spec),
        seeds=task_seeds(HELD_OUT, None, 0, episodes),
        generator=gen,
        device=device,
    )
    policy.train(was_training)
    return float(out.stats.success.mean())


# --------------------------------------------------------------------------- caching


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


def base_key(config: ReproduceConfig, task: str, seed: int) -> str:
    """The hash of what decides a base policy: the task, the model, the device, the base
    settings (with a user's demonstrator's code or policy file's digest) and the seed (not
    the arms or the RL budget). With ``base=None`` it names the random initialisation the
    arms start from (what a warm-up without a base policy fits)."""
    return _digest(
        {
            "task": config.task(task).identity(),
            "model": dataclasses.asdict(config.model),
            "device": config.device,
            "base": config.to_dict()["base"],  # a user's base: its source's code or digest too
            "seed": seed,
        }
    )


def critic_key(config: ReproduceConfig, task: str, seed: int) -> str:
    """The hash of what decides a warmed-up critic: its base policy's, the warm-up, the
    critic's learning rate, the gradient clip and the group size."""
    if config.warmup is None:
        raise InvalidConfigError(f"configuration {config.name!r} has no critic warm-up (warmup=None)")
    b = config.budget
    return _digest(
        {
            "base": base_key(config, task, seed),
            "warmup": dataclasses.asdict(config.warmup),
            "critic_lr": b.critic_learning_rate,
            "max_grad_norm": b.max_grad_norm,
            "group_size": b.group_size,
        }
    )


def base_path(out_dir: str | Path, task: str, seed: int) -> Path:
    return Path(out_dir) / BASE_DIR / f"{task}-seed{seed}.pt"


def critic_path(out_dir: str | Path, task: str, seed: int) -> Path:
    return Path(out_dir) / BASE_DIR / f"{task}-seed{seed}-critic.pt"


def _load(path: Path | None, key: str) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):
        return None  # absent, torn or not ours: made again
    return saved if isinstance(saved, dict) and saved.get("key") == key else None


def _save(path: Path, saved: dict[str, Any]) -> None:
    """Whole or not at all and never through a link (``OUT/<BASE_DIR>/NAME``: rust/logs/src/atomic.rs)."""
    buf = io.BytesIO()
    torch.save(saved, buf)
    write_file(path, buf.getvalue(), root=path.parents[1])


def is_cached(config: ReproduceConfig, task: str, seed: int, out_dir: str | Path, *, critic: bool) -> bool:
    """Whether ``out_dir`` holds the base policy (and with ``critic`` the warmed-up critic) of
    (``task``, ``seed``) for ``config``'s settings."""
    if config.base is not None and _load(base_path(out_dir, task, seed), base_key(config, task, seed)) is None:
        return False
    if critic and config.warmup is not None:
        return _load(critic_path(out_dir, task, seed), critic_key(config, task, seed)) is not None
    return True


# --------------------------------------------------------------------------- the two products


def base_policy(
    config: ReproduceConfig, task: str, seed: int, out_dir: str | Path | None = None
) -> tuple[TinyCausalLM, dict[str, Any]]:
    """The base policy of (``task``, ``seed``) and what was measured making it (``source``:
    :func:`~mpo_lab.reproduce.userbase.base_description`; ``eps`` for an oracle's clone,
    ``demo_success``, ``bc_loss_first``/``last`` for a clone; ``held_out_success``, ``bc_s``), from
    ``out_dir``'s cache when it holds it for the same settings, else made (and saved there)."""
    if config.base is None:
        raise InvalidConfigError(f"configuration {config.name!r} has no base policies (base=None)")
    key = base_key(config, task, seed)
    path = None if out_dir is None else base_path(out_dir, task, seed)
    policy = new_policy(config, task, seed)
    saved = _load(path, key)
    if saved is None:
        saved = _make_base(policy, config, task, seed)
        saved["key"] = key
        source = config.base.source
        # Never over the user's own file (a base file of an earlier run in the same OUT).
        if path is not None and not (isinstance(source, SavedPolicy) and _same_file(path, source.path)):
            _save(path, saved)
    policy.load_state_dict(saved["state"])
    return policy, dict(saved["info"])


def _same_file(a: str | Path, b: str | Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def _make_base(policy: TinyCausalLM, config: ReproduceConfig, task: str, seed: int) -> dict[str, Any]:
    assert config.base is not None
    base = config.base
    started, cpu = time.perf_counter(), time.process_time()
    info: dict[str, Any] = {"task": task, "seed": seed, "source": base_description(config, task)}
    if isinstance(base.source, SavedPolicy):
        load_policy_file(policy, base.source)
        info["file_digest"] = base.source.digest
    else:
        env = make_env(config.task(task))
        rng = np.random.default_rng(Stream.demonstrations(seed))
        episodes, steps = base.sizes(task)
        seeds = task_seeds("demo", seed, 0, episodes)
        if isinstance(base.source, Demonstrator):
            tokens, mask, offsets, scores = demonstrator_episodes(env, base.source, seeds, rng)
            demos = Demonstrations(
                np.asarray(tokens, np.int64), np.asarray(mask, bool), np.asarray(offsets, np.int64), np.asarray(scores)
            )
        else:
            info["eps"] = eps = base.eps(task)
            demos = demonstrations(env, NoisyOracle(belief_model(env), eps, base.well_formed), seeds, rng)
        losses = behaviour_clone(policy, demos, steps=steps, batch_size=base.batch_size, lr=base.lr, rng=rng)
        info |= {
            "demo_success": float(demos.scores.mean()),
            "bc_loss_first": losses[0] if losses else float("nan"),
            "bc_loss_last": float(np.mean(losses[-max(1, len(losses) // 10) :])) if losses else float("nan"),
        }
    info |= {"bc_s": time.perf_counter() - started, "bc_cpu_s": time.process_time() - cpu}
    episodes = config.budget.eval_tasks * config.budget.eval_samples
    info |= {"held_out_episodes": episodes, "held_out_success": held_out_success(policy, config, task, seed, episodes)}
    state = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
    return {"state": state, "info": info, "model": architecture(policy)}


# --------------------------------------------------------------------------- a policy file of the user's


ARCHITECTURE = ("vocab_size", "width", "layers", "heads", "max_len")
"""The sizes a policy file is checked on (heads only where the file records them)."""


def architecture(policy: TinyCausalLM) -> dict[str, int]:
    """What a policy file must match: the model's sizes (its vocabulary is the env's)."""
    heads = int(getattr(policy.blocks[0], "heads", 0)) if len(policy.blocks) else 0
    return {
        "vocab_size": int(policy.vocab_size),
        "width": int(policy.width),
        "layers": len(policy.blocks),
        "heads": heads,
        "max_len": int(policy.max_len),
    }


_SIZES = {"vocab_size": ("embed.weight", 0), "width": ("embed.weight", 1), "max_len": ("position.weight", 0)}
"""The sizes a state dict shows: (parameter, dimension)."""


def _file_sizes(state: dict[str, Any], record: Any) -> dict[str, int]:
    """The sizes of the model a state dict is of: the record the file may hold, else what its tensors show."""
    sizes = {k: int(v) for k, v in record.items() if k in ARCHITECTURE} if isinstance(record, dict) else {}
    for name, (key, dim) in _SIZES.items():
        if name not in sizes and key in state and state[key].dim() > dim:
            sizes[name] = int(state[key].shape[dim])
    blocks = {key.split(".")[1] for key in state if key.startswith("blocks.")}
    if "layers" not in sizes and blocks:
        sizes["layers"] = len(blocks)
    return sizes


def load_policy_file(policy: TinyCausalLM, source: SavedPolicy) -> None:
    """Loads the user's policy file into ``policy`` (the run's model). The file is what
    ``torch.save`` wrote of a ``TinyCausalLM`` state dict, bare or under ``"state"`` (as
    reproduce writes ``OUT/base/<task>-seed<seed>.pt``, with the model's sizes under
    ``"model"``). Raises InvalidOptionError naming the file: unreadable, changed since the
    configuration was made, not such a file, or of another model (the sizes that differ:
    the vocabulary, the width, the layers, the heads or the positions)."""
    name = f"base policy {source.path!r}"
    digest = file_digest(source.path)
    if digest != source.digest:
        raise InvalidOptionError(
            f"{name}: its sha256 is {digest}, not the {source.digest} this configuration was made with (the file "
            "changed since); start the run again"
        )
    try:
        saved = torch.load(source.path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise InvalidOptionError(
            f"{name}: not a policy file torch.save wrote ({type(e).__name__}: {first[:120]})"
        ) from None
    wrapped = isinstance(saved, dict) and isinstance(saved.get("state"), dict)
    state = saved["state"] if wrapped else saved
    if (
        not isinstance(state, dict)
        or not state
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
    ):
        raise InvalidOptionError(
            f"{name}: holds a {type(state).__name__}, not a state dict (parameter names to tensors, bare or under "
            "'state' as reproduce writes its base policies)"
        )
    want = architecture(policy)
    found = _file_sizes(state, saved.get("model") if wrapped else None)
    differs = [
        f"{k} {found[k]} in the file, {want[k]} in this run's" for k in ARCHITECTURE if found.get(k, want[k]) != want[k]
    ]
    if not differs:
        mine = policy.state_dict()
        missing = sorted(set(mine) - set(state))
        extra = sorted(set(state) - set(mine))
        shapes = [k for k in mine if k in state and tuple(state[k].shape) != tuple(mine[k].shape)]
        for label, keys in (("missing", missing), ("not of this model", extra), ("of another shape", shapes)):
            if keys:
                differs.append(
                    f"{len(keys)} parameter(s) {label}: {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}"
                )
    if differs:
        raise InvalidOptionError(
            f"{name}: a policy of another model than this run's ({want['vocab_size']} token ids, width "
            f"{want['width']}, {want['layers']} layers, {want['heads']} heads, {want['max_len']} positions): "
            + "; ".join(differs)
        )
    policy.load_state_dict(state)


def warm_critic(
    config: ReproduceConfig, task: str, seed: int, policy: nn.Module, out_dir: str | Path | None = None
) -> tuple[nn.Module, dict[str, Any]]:
    """The critic every critic arm of (``task``, ``seed``) starts from:
    ``value_head_critic(policy)`` (``policy`` is the base policy) fitted to the Monte-Carlo
    returns of base-policy rollouts, with what was measured (``explained_variance`` on held-out
    base rollouts after the warm-up, ``train_explained_variance``, ``warmup_s``); cached in
    ``out_dir`` like the base policy."""
    if config.warmup is None:
        raise InvalidConfigError(f"configuration {config.name!r} has no critic warm-up (warmup=None)")
    key = critic_key(config, task, seed)
    path = None if out_dir is None else critic_path(out_dir, task, seed)
    critic = value_head_critic(policy)
    saved = _load(path, key)
    if saved is None:
        saved = _make_critic(critic, policy, config, task, seed)
        saved["key"] = key
        if path is not None:
            _save(path, saved)
    critic.load_state_dict(saved["state"])
    return critic, dict(saved["info"])


def policy_rollouts(
    policy: nn.Module, config: ReproduceConfig, task: str, purpose: str, run_seed: int | None, episodes: int, seed: int
) -> Any:
    """Rollouts of ``policy``: ``episodes // group_size`` tasks of ``purpose`` (of
    ``run_seed``; None for the held-out tasks), each ``group_size`` times."""
    spec = config.task(task)
    device = torch.device(config.device)
    group = config.budget.group_size
    seeds = task_seeds(purpose, run_seed, 0, max(1, episodes // group))
    gen = torch.Generator(device=device).manual_seed(Stream.policy_rollouts(seed, seeds.start))
    was_training = policy.training
    policy.eval()
    with torch.no_grad():
        out = sample(
            policy,
            lambda: make_env(spec),
            seeds=seeds,
            group_size=group,
            generator=gen,
            device=device,
        )
    policy.train(was_training)
    return out.batch


def _returns(batch: Any) -> np.ndarray:
    """Monte-Carlo returns with gamma = 1: every token's is its trajectory's score (the
    tasks' one reward is terminal)."""
    return np.repeat(batch.trajectory_scores(), np.diff(batch.offsets)).astype(np.float32)


@torch.no_grad()
def _explained_variance(critic: nn.Module, batch: Any, device: torch.device, rows: int) -> float:
    values = np.zeros(batch.token_ids.shape[0], np.float32)
    for lo in range(0, batch.n_trajectories, rows):
        padded = pad_rows(
            {"token_ids": batch.token_ids}, batch.offsets, np.arange(lo, min(lo + rows, batch.n_trajectories))
        )
        ids = torch.from_numpy(padded.arrays["token_ids"]).to(device)
        v = token_values(critic, ids, torch.from_numpy(padded.arrays["attention_mask"]).to(device)).cpu().numpy()
        values[padded.positions] = v[padded.valid]
    return explained_variance(values[batch.mask], _returns(batch)[batch.mask])


def _make_critic(critic: nn.Module, policy: nn.Module, config: ReproduceConfig, task: str, seed: int) -> dict[str, Any]:
    assert config.warmup is not None
    warmup, budget = config.warmup, config.budget
    started, cpu = time.perf_counter(), time.process_time()
    device = torch.device(config.device)
    batch = policy_rollouts(policy, config, task, "warmup", seed, warmup.episodes, seed)
    flat = {"token_ids": batch.token_ids, "mask": batch.mask, "returns": _returns(batch)}
    optimizer = torch.optim.Adam(critic.parameters(), budget.critic_learning_rate)
    rng = np.random.default_rng(Stream.warmup_minibatches(seed))
    losses = []
    for _ in range(warmup.steps):
        rows = rng.choice(batch.n_trajectories, size=min(warmup.batch_size, batch.n_trajectories), replace=False)
        padded = pad_rows(flat, batch.offsets, rows)
        dev = {k: torch.from_numpy(v).to(device) for k, v in padded.arrays.items()}
        v = token_values(critic, dev["token_ids"], dev["attention_mask"])
        loss, _ = value_loss(v, v.detach(), dev["returns"], dev["mask"], clip=None)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        if budget.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(critic.parameters(), budget.max_grad_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
    warmup_s, warmup_cpu_s = time.perf_counter() - started, time.process_time() - cpu
    held_out = policy_rollouts(policy, config, task, HELD_OUT, None, warmup.episodes, seed + 1)
    info = {
        "task": task,
        "seed": seed,
        "episodes": batch.n_trajectories,
        "steps": warmup.steps,
        "critic_lr": budget.critic_learning_rate,
        "rollout_success": float(batch.trajectory_scores().mean()),
        "loss_first": losses[0] if losses else float("nan"),
        "loss_last": float(np.mean(losses[-max(1, len(losses) // 10) :])) if losses else float("nan"),
        "train_explained_variance": _explained_variance(critic, batch, device, budget.minibatch_size),
        "explained_variance": _explained_variance(critic, held_out, device, budget.minibatch_size),
        "warmup_s": warmup_s,
        "warmup_cpu_s": warmup_cpu_s,
    }
    return {"state": {k: v.detach().cpu() for k, v in critic.state_dict().items()}, "info": info}


# --------------------------------------------------------------------------- choosing the noise


def calibrate(
    config: ReproduceConfig, task: str, eps_values: list[float], seeds: tuple[int, ...], episodes: int = 256
) -> list[dict[str, Any]]:
    """The measurement behind ``BasePolicy.noise``: for each eps, the base policies of
    ``seeds`` made with ``config``'s settings (nothing cached) and their held-out success on
    ``episodes`` tasks. Pick the eps whose success sits inside ``BASE_BAND`` for every seed."""
    if config.base is None:
        raise InvalidConfigError(f"configuration {config.name!r} has no base policies (base=None)")
    out = []
    for eps in eps_values:
        noise = tuple((name, eps if name == task else e) for name, e in config.base.noise)
        trial = dataclasses.replace(config, base=dataclasses.replace(config.base, noise=noise))
        for seed in seeds:
            policy, info = base_policy(trial, task, seed)
            out.append({**info, "held_out_success": held_out_success(policy, trial, task, seed, episodes)})
    return out
