"""One run of the reproduction: an arm trained from one seed (needs torch).

A run builds the policy (:class:`~mpo_lab.train.models.TinyCausalLM`) and a critic
(:func:`~mpo_rs.torch.critic.value_head_critic`); the critic is trained only by the arms
whose estimator reads its values (GAE, MAE): a critic-free arm (GRPO, GSPO) computes no
values and trains no critic, so its policy's updates are the same as with one, at about
half the learner's cost (its explained variance is NaN and its end-of-run rollout log
carries the untrained critic's zeros, ``critic_trained`` False). It then alternates
:func:`~mpo_lab.train.sampler.sample` and :meth:`Learner.step <mpo_rs.torch.learner.Learner.step>`. Every update logs success,
entropy, the critic's explained variance, turns and response length, advantage statistics
and timing; every ``eval_every`` updates the policy is evaluated on held-out seeds. At the
end, rollouts of held-out tasks with the critic's values are written as a Parquet
rollout log for ``mpo-rs diagnose``.

Seeds. Run seed s fixes the initial weights (``torch.manual_seed(s)``), the sampler's
generator and the training tasks; all arms share them, so arm differences are not
differences of luck in the draw of tasks. The task seeds of every purpose (training,
held-out) come from :func:`~mpo_lab.seeds.task_seeds`, whose layout keeps them
apart by construction: a held-out task is never a training task.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mpo_rs.outputs import table_bytes, write_file

from .._deps import needs

with needs("mpo_lab.reproduce.run"):
    import torch

from mpo_rs.exceptions import InvalidOptionError
from mpo_rs.options import CRITIC_FREE_FAMILIES
from mpo_rs.torch.batching import chunks, pad_rows
from mpo_rs.torch.critic import value_head_critic
from mpo_rs.torch.estimation import as_estimator
from mpo_rs.torch.learner import Learner, LearnerConfig, RolloutBatch, token_values
from mpo_rs.torch.metrics import explained_variance

from ..seeds import HELD_OUT, Stream, task_seeds
from ..train.sampler import sample
from .config import Arm, ReproduceConfig
from .env import make_env
from .reference import OnPolicyReference

__all__ = [
    "RUNS_DIR",
    "RunsStopped",
    "explained_variance",
    "finished_runs",
    "learner_config",
    "pass_at_k",
    "refuse_edited_env",
    "run_all",
    "run_file",
    "run_one",
]


def learner_config(arm: Arm, config: ReproduceConfig, seed: int) -> LearnerConfig:
    """The learner's configuration for ``arm``: the shared budget plus the arm's knobs
    (its estimator with its options, its ratio, whether it whitens)."""
    budget = config.budget
    return LearnerConfig(
        estimator=arm.estimator,
        ratio=arm.ratio,
        advantage_scale="whiten" if arm.whiten else "none",
        clip_low=budget.clip,
        clip_high=budget.clip,
        entropy_coef=budget.entropy_coef,
        ppo_epochs=budget.ppo_epochs,
        minibatch_size=budget.minibatch_size,
        max_grad_norm=budget.max_grad_norm,
        seed=seed,
    )


def pass_at_k(successes: np.ndarray, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) averaged over tasks; ``successes`` is
    ``(tasks, n)`` booleans with n >= k."""
    n = successes.shape[1]
    if not 1 <= k <= n:
        raise InvalidOptionError(f"pass@{k} needs 1 <= k <= n = {n}")
    c = successes.sum(axis=1)
    # 1 - C(n - c, k) / C(n, k), as a product to stay exact in floating point.
    fail = np.array([math.prod((n - ci - j) / (n - j) for j in range(k)) if n - ci >= k else 0.0 for ci in c])
    return float(np.mean(1.0 - fail))


@torch.no_grad()
def _values(critic: torch.nn.Module, batch: RolloutBatch, device: torch.device, rows_per_pass: int) -> np.ndarray:
    """V(tokens < q) for every flat token, from right-padded passes of the critic."""
    out = np.zeros(batch.token_ids.shape[0], np.float32)
    for rows in chunks(np.arange(batch.n_trajectories), rows_per_pass):
        padded = pad_rows({"token_ids": batch.token_ids}, batch.offsets, rows)
        ids = torch.from_numpy(padded.arrays["token_ids"]).to(device)
        v = token_values(critic, ids, torch.from_numpy(padded.arrays["attention_mask"]).to(device)).cpu().numpy()
        out[padded.positions] = v[padded.valid]
    return out


def _mc_returns(batch: RolloutBatch) -> np.ndarray:
    """The critic's targets with gamma = lam_critic = 1: every token's return is its
    trajectory's score (the tasks' one reward is terminal)."""
    return np.repeat(batch.trajectory_scores(), np.diff(batch.offsets)).astype(np.float32)


def _finite_or_nan(x: Any) -> float:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return math.nan
    return value if math.isfinite(value) else math.nan


def _evaluate(
    policy: torch.nn.Module,
    env_factory: Any,
    config: ReproduceConfig,
    device: torch.device,
    update: int,
    seed: int,
    tasks: int | None = None,
) -> dict[str, float]:
    """Held-out success at ``update``: ``tasks`` distinct held-out tasks (default the budget's
    ``eval_tasks``), each played ``eval_samples`` times at temperature 1."""
    budget = config.budget
    tasks = budget.eval_tasks if tasks is None else tasks
    gen = torch.Generator(device=device).manual_seed(Stream.evaluation(seed, update))
    seeds = task_seeds(HELD_OUT, None, 0, tasks)
    policy.eval()
    out = sample(policy, env_factory, seeds=seeds, group_size=budget.eval_samples, generator=gen, device=device)
    policy.train()
    success = out.stats.success.reshape(tasks, budget.eval_samples)
    row = {
        "update": float(update),
        "tasks": float(tasks),
        "success": float(success.mean()),
        "turns": float(out.stats.turns.mean()),
        "response_length": float(out.stats.response_tokens.mean()),
    }
    k = 1
    while k <= budget.eval_samples:
        row[f"pass@{k}"] = pass_at_k(success, k)
        k *= 2
    return row


def starting_models(
    config: ReproduceConfig, arm: Arm, seed: int, out_dir: str | Path | None = None
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The policy ``arm`` starts from -- the base policy of (task, seed) when the
    configuration has base policies (:mod:`.base`, cached in ``out_dir/base``), else the
    random initialisation ``torch.manual_seed(seed)`` -- and ``{"critic", "base",
    "warmup"}``: the critic (the warmed-up one for an arm that trains a critic when the
    configuration has a warm-up, else ``value_head_critic(policy)``, values 0) and what was
    measured making the two (None when not made)."""
    from .base import base_policy, new_policy, warm_critic

    base_info = warm_info = None
    if config.base is not None:
        policy, base_info = base_policy(config, arm.task, seed, out_dir)
    else:
        policy = new_policy(config, arm.task, seed)
    if config.warmup is not None and arm.learns_critic:
        critic, warm_info = warm_critic(config, arm.task, seed, policy, out_dir)
    else:
        critic = value_head_critic(policy)
    return policy, {"critic": critic, "base": base_info, "warmup": warm_info}


def prepare(config: ReproduceConfig, task: str, seed: int, out_dir: str | Path, critic: bool) -> dict[str, Any]:
    """Makes (or finds) the base policy of (``task``, ``seed``) (when the configuration has
    them) and, with ``critic``, its warmed-up critic under ``out_dir/base``; what was measured."""
    from .base import base_policy, new_policy, warm_critic

    started = time.perf_counter()
    if config.base is not None:
        policy, base_info = base_policy(config, task, seed, out_dir)
    else:
        policy, base_info = new_policy(config, task, seed), None
    warm_info = warm_critic(config, task, seed, policy, out_dir)[1] if critic and config.warmup is not None else None
    return {"task": task, "seed": seed, "base": base_info, "warmup": warm_info, "wall_s": time.perf_counter() - started}


def run_one(config: ReproduceConfig, arm_key: str, seed: int, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Trains ``arm_key`` from ``seed``; returns ``{"arm", "seed", "curve", "evals",
    "wall_s", "rollout_log"}`` (curve: one dict per update; evals: one per evaluation).
    With ``out_dir``, the end-of-run rollouts with critic values go to
    ``out_dir/rollouts/<arm>-seed<seed>.parquet``."""
    started = time.perf_counter()
    arm = config.arm(arm_key)
    budget = config.budget
    device = torch.device(config.device)
    task = config.task(arm.task)

    def env_factory() -> Any:
        return make_env(task)  # a registry name, or a user's module:factory

    # Every arm of the seed starts from the same policy (the base policy, or the same random
    # initialisation) and every critic arm from the same critic (warmed up, or a zero head).
    policy, start = starting_models(config, arm, seed, out_dir)
    critic = start.pop("critic")
    policy_opt = torch.optim.Adam(policy.parameters(), budget.lr)
    critic_opt = torch.optim.Adam(critic.parameters(), budget.critic_learning_rate)
    cfg = learner_config(arm, config, seed)
    # A group estimator never reads the values: no critic pass, no critic training (the
    # actor's updates do not depend on them, nor on the critic's, which shuffle apart). An arm
    # on the reference critic reads its values from the table and trains no value head.
    reference = _reference(config, arm, seed, policy) if arm.critic == "reference" else None
    critic_trained = as_estimator(cfg.estimator).family not in CRITIC_FREE_FAMILIES and reference is None
    if critic_trained:
        learner = Learner(policy, policy_opt, cfg, critic=critic, critic_optimizer=critic_opt)
    else:
        learner = Learner(policy, policy_opt, cfg)
    gen = torch.Generator(device=device).manual_seed(Stream.training(seed))

    curve: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []
    for update in range(budget.updates):
        if update % budget.eval_every == 0:
            evals.append(_evaluate(policy, env_factory, config, device, update, seed))
        t0 = time.perf_counter()
        rollouts = sample(
            policy,
            env_factory,
            seeds=task_seeds("train", seed, update * budget.tasks_per_update, budget.tasks_per_update),
            group_size=budget.group_size,
            generator=gen,
            device=device,
        )
        t1 = time.perf_counter()
        batch = rollouts.batch
        on_policy = batch.mask
        ev = math.nan
        if critic_trained or reference is not None:
            values = (
                reference.read_and_add(batch)
                if reference is not None
                else _values(critic, batch, device, budget.minibatch_size)
            )
            batch = dataclasses.replace(batch, values=values)
            ev = explained_variance(values[on_policy], _mc_returns(batch)[on_policy])
        t2 = time.perf_counter()
        metrics = learner.step(batch)
        t3 = time.perf_counter()
        stats = rollouts.stats
        row = {
            "update": float(update),
            "success": float(stats.success.mean()),
            # -mean log pi of the sampled tokens: an unbiased estimate of the policy's entropy.
            "entropy": float(-batch.old_log_probs[on_policy].mean()),  # type: ignore[index]
            "explained_variance": ev,
            "turns": float(stats.turns.mean()),
            "response_length": float(stats.response_tokens.mean()),
            "advantage_mean": _finite_or_nan(metrics.get("batch/advantage_mean")),
            "advantage_std": _finite_or_nan(metrics.get("batch/advantage_std")),
            "actor_loss": _finite_or_nan(metrics.get("actor/loss")),
            "clip_frac": _finite_or_nan(metrics.get("actor/clip_frac")),
            "sample_s": t1 - t0,
            "values_s": t2 - t1,
            "step_s": t3 - t2,
        }
        for name in (
            "actor/entropy",
            "advantages/abs_max",
            "critic/explained_variance",
            "timing/estimation_s",
            "timing/forward_s",
            "timing/backward_s",
            "timing/optimizer_s",
            "timing/step_s",
        ):
            if name in metrics:
                row[name.replace("/", "_")] = _finite_or_nan(metrics[name])
        curve.append(row)
    evals.append(_evaluate(policy, env_factory, config, device, budget.updates, seed, budget.final_eval_tasks))

    rollout_log = None
    if out_dir is not None:

        def value_source(batch: RolloutBatch) -> np.ndarray:
            if reference is not None:
                return reference.values(batch)
            return _values(critic, batch, device, budget.minibatch_size)

        rollout_log = _write_rollout_log(
            policy, value_source, env_factory, config, device, arm_key, seed, Path(out_dir)
        )
    return {
        "arm": arm_key,
        "seed": seed,
        "curve": curve,
        "evals": evals,
        "critic_trained": critic_trained,
        **start,
        "wall_s": time.perf_counter() - started,
        "rollout_log": rollout_log,
    }


def _reference(config: ReproduceConfig, arm: Arm, seed: int, policy: torch.nn.Module) -> OnPolicyReference:
    """The reference critic of an arm (``arm.critic == "reference"``), its table first fitted
    to the base policy's rollouts of the critic warm-up's tasks (as many episodes as the
    warm-up fits; a configuration without a warm-up: the budget's episodes per update)."""
    from .base import policy_rollouts

    episodes = config.warmup.episodes if config.warmup is not None else config.budget.episodes_per_update
    reference = OnPolicyReference(make_env(config.task(arm.task)), ev_fraction=arm.critic_ev, seed=seed)
    reference.add_base(policy_rollouts(policy, config, arm.task, "warmup", seed, episodes, seed))
    return reference


def _write_rollout_log(
    policy: torch.nn.Module,
    value_source: Callable[[RolloutBatch], np.ndarray],
    env_factory: Any,
    config: ReproduceConfig,
    device: torch.device,
    arm_key: str,
    seed: int,
    out_dir: Path,
) -> str:
    """Held-out rollouts of the final policy with the final critic's values (``value_source``
    of the batch), as a Parquet rollout log (the columns of ``mpo_rs.synthetic.to_arrow``)."""
    from mpo_rs.synthetic import FlatBatch, to_arrow

    budget = config.budget
    gen = torch.Generator(device=device).manual_seed(Stream.diagnosis(seed))
    seeds = task_seeds(HELD_OUT, None, 0, budget.diagnose_tasks)
    policy.eval()
    rollouts = sample(policy, env_factory, seeds=seeds, group_size=1, generator=gen, device=device)
    policy.train()
    batch = rollouts.batch
    values = value_source(batch)
    scores = batch.trajectory_scores().astype(np.float32)
    rewards = np.zeros(batch.token_ids.shape[0], np.float32)
    last_policy = [
        int(np.flatnonzero(batch.mask[lo:hi])[-1]) + lo
        for lo, hi in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)
    ]
    rewards[last_policy] = scores
    flat = FlatBatch(
        values=values,
        mask=batch.mask.astype(bool),
        offsets=batch.offsets.astype(np.int64),
        rewards=rewards,
        scores=scores,
        group_ids=np.arange(batch.n_trajectories, dtype=np.int64),
        token_ids=batch.token_ids.astype(np.int32),
        old_logprobs=batch.old_log_probs,
    )
    path = out_dir / "rollouts" / f"{arm_key}-seed{seed}.parquet"
    write_file(path, table_bytes(to_arrow(flat)), root=out_dir)  # never through a link
    return str(path)


RUNS_DIR = "runs"
"""Every finished run is saved at once as ``OUT/runs/<arm>-seed<seed>.json``; a later
``run_all`` with the same configuration hash takes them instead of training again."""


class RunsStopped(KeyboardInterrupt):
    """A stop request (Ctrl-C, SIGTERM, SIGHUP) ended :func:`run_all`; every run that had
    finished is saved under ``OUT/runs``. ``exit_code`` is 128 + the signal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def run_file(out_dir: str | Path, arm_key: str, seed: int) -> Path:
    return Path(out_dir) / RUNS_DIR / f"{arm_key}-seed{seed}.json"


def _save_run(out_dir: str | Path, config: ReproduceConfig, result: dict[str, Any]) -> None:
    """Writes one finished run whole or not at all, never through a link
    (rust/logs/src/atomic.rs), with the configuration hash and its task's identity (a user
    env's code with it)."""
    path = run_file(out_dir, result["arm"], result["seed"])
    task = config.task(config.arm(result["arm"]).task).identity()
    write_file(
        path, json.dumps({"config_hash": config.config_hash(), "task": task, **result}, allow_nan=True), root=out_dir
    )


def refuse_edited_env(config: ReproduceConfig, out_dir: str | Path) -> None:
    """Refuses (InvalidOptionError) to resume in ``out_dir`` the runs of a user env whose
    code changed: a saved run of one of ``config``'s (arm, seed) made with the same env
    and parameters but another code identity. Nothing is read beyond the first such file."""
    digest = config.config_hash()
    for arm in config.arms:
        task = config.task(arm.task)
        if task.code is None:
            continue
        for seed in config.seed_list:
            try:
                saved = json.loads(run_file(out_dir, arm.key, seed).read_text())
            except (OSError, ValueError):
                continue
            before = saved.get("task") if isinstance(saved, dict) else None
            if not isinstance(before, dict) or saved.get("config_hash") == digest:
                return
            if before.get("name") == task.name and before.get("code") != task.code:
                raise InvalidOptionError(
                    f"--out {out_dir} holds runs of env {task.name!r} made from other code ({before.get('code')}, now "
                    f"{task.code}: the source of its module or its declared version changed), which are not resumed; "
                    "choose a new --out, or restore the env's code to resume them"
                )
            return


def finished_runs(config: ReproduceConfig, out_dir: str | Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The runs of ``config`` already saved under ``out_dir`` (same configuration hash;
    a file that does not parse, or is of another configuration, is not used)."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    digest = config.config_hash()
    for arm in config.arms:
        for seed in config.seed_list:
            path = run_file(out_dir, arm.key, seed)
            try:
                saved = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(saved, dict):
                continue
            saved.pop("task", None)
            if saved.pop("config_hash", None) == digest and (saved.get("arm"), saved.get("seed")) == (arm.key, seed):
                found[arm.key, seed] = saved
    return found


def _worker_init() -> None:
    # One thread per worker: the runs are small and the processes share the cores.
    torch.set_num_threads(1)


def _job(args: tuple[ReproduceConfig, str, int, str]) -> dict[str, Any]:
    config, arm_key, seed, out_dir = args
    return run_one(config, arm_key, seed, out_dir)


def _stop_code(stop: BaseException) -> int:
    """128 + the signal of a stop request (SIGINT for Ctrl-C)."""
    return 128 + int(getattr(stop, "signum", signal.SIGINT))


def run_all(
    config: ReproduceConfig,
    out_dir: str | Path,
    *,
    workers: int | None = None,
    note: Any = lambda _: None,
) -> list[dict[str, Any]]:
    """Every (arm, seed) of ``config``, in ``workers`` processes (1: in this process);
    results in arm order, then seed order. The costliest task's runs are started first.

    Each run is saved under ``out_dir/runs`` as it finishes, and runs already saved there
    for the same configuration are taken as they are (a stopped run resumes). A stop
    request raises :class:`RunsStopped` within about a second: queued runs are cancelled,
    running ones killed, finished ones kept."""
    workers = config.workers if workers is None else workers
    if workers < 1:
        raise InvalidOptionError(f"workers must be at least 1, got {workers}")
    jobs = [(config, arm.key, seed, str(out_dir)) for arm in config.arms for seed in config.seed_list]
    done_before = finished_runs(config, out_dir)
    results: dict[int, dict[str, Any]] = {
        i: done_before[job[1], job[2]] for i, job in enumerate(jobs) if (job[1], job[2]) in done_before
    }
    if results:
        note(f"resuming: {len(results)} of {len(jobs)} runs already finished in {Path(out_dir) / RUNS_DIR}")
    cost = {spec.name: i for i, spec in enumerate(config.tasks)}  # config.tasks lists the costliest first
    order = sorted((i for i in range(len(jobs)) if i not in results), key=lambda i: cost[config.arm(jobs[i][1]).task])

    def finished(i: int, result: dict[str, Any]) -> None:
        _save_run(out_dir, config, result)
        results[i] = result
        note(f"run {len(results)}/{len(jobs)}: {jobs[i][1]} seed {jobs[i][2]} ({result['wall_s']:.0f} s)")

    try:
        if order:
            _prepare_all(config, out_dir, workers, note, {jobs[i][2] for i in order})
        if workers == 1 or config.device != "cpu" or len(order) <= 1:
            _run_here(config, jobs, order, finished)
        else:
            _run_in_pool(workers, jobs, order, finished)
    except KeyboardInterrupt as stop:  # Ctrl-C, or the console script's SIGTERM/SIGHUP (its signum)
        # Counted on disk: a stop that lands between a run's save and its count must not
        # undercount what the resume will find.
        kept = len(finished_runs(config, out_dir))
        raise RunsStopped(
            f"stopped: {kept} of {len(jobs)} runs finished and are kept in {Path(out_dir) / RUNS_DIR}; "
            "the same command resumes from them",
            _stop_code(stop),
        ) from None
    return [results[i] for i in range(len(jobs))]


def _prepare_job(args: tuple[ReproduceConfig, str, int, str, bool]) -> dict[str, Any]:
    return prepare(*args)


def _prepare_all(config: ReproduceConfig, out_dir: str | Path, workers: int, note: Any, seeds: set[int]) -> None:
    """The base policies (and warmed-up critics) the runs of ``seeds`` need, made before
    the runs -- in ``workers`` processes -- so that no two runs make the same one; those
    already under ``out_dir/base`` are kept."""
    from .base import is_cached

    needed: dict[tuple[str, int], bool] = {}
    for arm in config.arms:
        for seed in sorted(seeds):
            needed[arm.task, seed] = needed.get((arm.task, seed), False) or arm.learns_critic
    jobs = [
        (config, task, seed, str(out_dir), critic)
        for (task, seed), critic in needed.items()
        if (config.base is not None or (critic and config.warmup is not None))
        and not is_cached(config, task, seed, out_dir, critic=critic)
    ]
    if not jobs:
        return

    def made(i: int, result: dict[str, Any]) -> None:
        base, warm = result["base"], result["warmup"]
        parts = [] if base is None else [f"base policy held-out success {base['held_out_success']:.3f}"]
        if warm is not None:
            parts.append(f"critic warm-up explained variance {warm['explained_variance']:.2f}")
        note(f"{result['task']} seed {result['seed']}: {', '.join(parts)} ({result['wall_s']:.0f} s)")

    order = list(range(len(jobs)))
    if workers == 1 or config.device != "cpu" or len(jobs) <= 1:
        _run_here(config, jobs, order, made, _prepare_job)
    else:
        _run_in_pool(workers, jobs, order, made, _prepare_job)


def _run_here(config: ReproduceConfig, jobs: list[Any], order: list[int], finished: Any, fn: Any = None) -> None:
    fn = _job if fn is None else fn
    previous = torch.get_num_threads()
    if config.device == "cpu":
        torch.set_num_threads(1)
    try:
        for i in order:
            finished(i, fn(jobs[i]))
    finally:
        torch.set_num_threads(previous)


def _run_in_pool(workers: int, jobs: list[Any], order: list[int], finished: Any, fn: Any = None) -> None:
    from .pool import run_jobs  # worker processes that a stop always ends (its doc says how)

    run_jobs(_job if fn is None else fn, jobs, order, finished, workers, init=_worker_init)
