"""The reproduction as a tool for your own task: :func:`compare` (``mpo-rs reproduce`` calls it).

``compare("examples.my_env:make", arms=("mpo", "ppo", "grpo"), seeds=3, budget="small")``
runs the reproduction's protocol -- the same arms, equal budgets, seeds shared across arms,
the paired analysis with Holm's correction -- on any environment that implements
:class:`~mpo_lab.envs.MultiTurnEnv`, and writes the same report (``reproduction.md``,
``results.json``, the tables and figures) in ``out``.

- The environment is ``"module:factory"`` (a callable returning a fresh env; ``env_params``
  are its keyword arguments), a module-level callable, or None for the built-in tasks.
  It travels to the worker processes by that name; the name, its parameters and its code
  identity are part of the configuration hash (:mod:`.env`), so an output directory resumes
  only the runs of the same env, unedited. It is checked before anything is written.
- A user env's arms start from a random initialisation unless ``demonstrator``
  (``"module:callable"`` or a module-level callable: ``demonstrator(observations) ->
  action``, cloned as the built-in tasks' bases are from their noisy oracles) or
  ``base_policy`` (a policy file, such as ``OUT/base/<task>-seed<seed>.pt`` of an earlier
  run) gives them a base policy (:mod:`.userbase`); the run says which, on the console and
  in ``results.json``'s ``base``.
- ``arms`` is a subset of the arm keys (:func:`~mpo_lab.reproduce.budgets.arm_keys`); ``budget`` one of
  :data:`~mpo_lab.reproduce.budgets.BUDGETS`
  (``quick``: a smoke test; ``small``: a quarter of the full run's updates, a first look;
  ``full``: the reported run's) or a :class:`~mpo_lab.reproduce.config.Budget`.

Numpy only at import; :func:`compare` needs torch, pyarrow and matplotlib.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpo_rs.exceptions import InvalidOptionError

from ..seeds import Stream, task_seeds
from .budgets import NAMED_CONFIGS, base_config, template_arms
from .config import Budget, ReproduceConfig
from .env import check_user_env, env_spec, make_env
from .presets import QUICK, get_config
from .sources import Demonstrator, SavedPolicy
from .userbase import base_lines, demonstrator_episodes, user_base

__all__ = ["CompareResult", "build_config", "compare", "default_out", "run_config"]


def _checked(arms: str | Sequence[str] | None, counts: Mapping[str, tuple[int | None, int]]) -> list[str] | None:
    """The one check of what a caller chooses (``compare``'s arguments and the command's
    flags alike): ``counts`` maps a name to (value, least); ``arms`` is a sequence of keys or
    "mpo,ppo" as the command line writes it. Returns the arm keys, None for all."""
    for name, (value, least) in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            flag = name.replace("_", "-")
            raise InvalidOptionError(f"{name} (--{flag}) must be an int >= {least}, got {value!r}")
    if arms is None:
        return None
    keys = [key.strip() for key in (arms.split(",") if isinstance(arms, str) else arms) if key.strip()]
    if not keys:
        raise InvalidOptionError("arms (--arms): give at least one arm key, e.g. mpo,ppo")
    return keys


def build_config(
    env: str | Callable[..., Any] | None = None,
    *,
    env_params: Mapping[str, Any] | None = None,
    arms: str | Sequence[str] | None = None,
    seeds: int | None = None,
    first_seed: int | None = None,
    budget: str | Budget = "full",
    device: str = "cpu",
    workers: int | None = None,
    demonstrator: str | Callable[..., Any] | None = None,
    base_policy: str | os.PathLike[str] | None = None,
    config_name: str | None = None,
) -> ReproduceConfig:
    """The configuration :func:`compare` runs: the committed one of ``budget`` (with no
    ``env`` and no other argument, exactly QUICK, FULL or GPU) or the committed configuration
    ``config_name`` (:data:`~mpo_lab.reproduce.budgets.NAMED_CONFIGS`), with the user env as its
    one task, the chosen arms, seeds and workers, and its base policy: cloned from
    ``demonstrator``, loaded from ``base_policy``, or none (a random initialisation). A user
    env is built once here, the demonstrator plays one episode and the policy file is loaded
    into the run's model, so a bad one fails before anything is written. Raises
    InvalidOptionError or InvalidConfigError."""
    keys = _checked(arms, {"seeds": (seeds, 1), "workers": (workers, 1), "first_seed": (first_seed, 0)})
    if config_name is None:
        start = base_config(budget, device)
    else:
        if env is not None or config_name not in NAMED_CONFIGS:
            raise InvalidOptionError(
                f"config: one of {', '.join(NAMED_CONFIGS)}, without an env; got {config_name!r}"
                + (" with an env" if env is not None else "")
            )
        start = get_config(config_name)
        if device != start.device:
            raise InvalidOptionError(f"config {config_name!r} runs on {start.device}, not {device}")
    # The seeds first: their range is checked (ReproduceConfig), and the env is tried on them.
    config = start.with_overrides(seeds=seeds, first_seed=first_seed, workers=workers)
    if env is not None:
        spec = env_spec(env)
        # Built and played once here, so a bad env fails before anything is written.
        task = check_user_env(spec, dict(env_params or {}), config.first_seed)
        template = template_arms(config)
        main_study = template["mpo"].study
        chosen = [a for a in template.values() if a.study == main_study] if keys is None else template.values()
        # A user env has no oracle to clone: its arms start from the user's demonstrator's clone,
        # the user's policy file or else the random initialisation (base=None); the critic
        # warm-up needs only the policy's rollouts, so it stays.
        base = user_base(config.base, demonstrator, None if base_policy is None else os.fspath(base_policy))
        config = dataclasses.replace(
            config, tasks=(task,), arms=tuple(dataclasses.replace(a, task=spec) for a in chosen), base=base
        )
        _try_base(config, spec)
    elif env_params:
        raise InvalidOptionError("env_params (--env-param) needs an env (--env module:factory)")
    elif demonstrator is not None or base_policy is not None:
        flag = "demonstrator (--demonstrator)" if demonstrator is not None else "base_policy (--base-policy)"
        raise InvalidOptionError(
            f"{flag} needs an env (--env module:factory): each built-in task clones its own noisy oracle"
        )
    if keys is not None:
        config = config.with_arms(keys)
    source = None if config.base is None else config.base.source
    main_demonstrator = isinstance(source, Demonstrator) and source.spec.startswith("__main__:")
    if env is not None and (env_spec(env).startswith("__main__:") or main_demonstrator):
        config = dataclasses.replace(config, workers=1)  # __main__ may not import in a worker
    return config


def _try_base(config: ReproduceConfig, task: str) -> None:
    """A user's base tried before anything is written: the demonstrator plays one episode,
    the policy file is loaded into the run's model (which needs torch)."""
    source = None if config.base is None else config.base.source
    if isinstance(source, SavedPolicy):
        from .base import load_policy_file, new_policy

        load_policy_file(new_policy(config, task, config.first_seed), source)
    elif source is not None:
        seeds = task_seeds("demo", config.first_seed, 0, 1)
        demonstrator_episodes(make_env(config.task(task)), source, seeds, np.random.default_rng(Stream.PROBES))


# --------------------------------------------------------------------------- running it


@dataclass
class CompareResult:
    """What :func:`compare` returns: where the report is, the configuration run, the
    results (``results.json``'s content) and the analysis plan's confirmatory comparisons, paired
    and Holm-corrected (:class:`~mpo_lab.reproduce.analysis.Comparison`: ``diff``, ``low``, ``high``,
    ``half_width``, ``n``, ``p_holm``, ``verdict``, Welch's interval beside them)."""

    out: Path
    config: ReproduceConfig
    results: dict[str, Any]
    confirmatory: list[Any]

    @property
    def page(self) -> Path:
        return self.out / "reproduction.md"


def default_out(config: ReproduceConfig) -> Path:
    """A new temporary directory for a quick run, else ``reproduce-out``."""
    if config.budget == QUICK.budget:
        return Path(tempfile.mkdtemp(prefix="mpo-reproduce-quick-"))
    return Path("reproduce-out")


def run_config(
    config: ReproduceConfig,
    out: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
    docs: str | os.PathLike[str] | None = None,
    note: Callable[[str], None] = lambda _: None,
    gates_file: str | os.PathLike[str] | None = None,
    measure_gates: bool = True,
) -> CompareResult:
    """Claims ``out`` for ``config``, runs every (arm, seed) it has not finished, and writes
    the report. The gates (:mod:`.gating`): the base policies' measurements are read from
    ``gates_file`` (the gates command's ``--json`` on a pilot) or, without one, measured on
    the run's own first seeds (unless ``measure_gates`` is False: the gates command, which
    measures them itself); a comparison on a task that does not pass them gets no verdict.
    Raises InvalidOptionError (usage), MissingDependencyError or OSError."""
    from .._deps import require_all

    require_all("reproduce", ["torch", "pyarrow", "matplotlib"])
    if config.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InvalidOptionError("--device cuda: torch sees no CUDA device")
    from .gating import measure_own, read_gates_file
    from .output import claim_output_dir
    from .report import write_report
    from .run import finished_runs, refuse_edited_env, run_all

    gates = read_gates_file(gates_file, config) if gates_file is not None else None  # before anything runs
    target = Path(out) if out is not None else default_out(config)
    if not overwrite:
        refuse_edited_env(config, target)  # before the claim, whose refusal would not say why
    claim_output_dir(target, config.config_hash(), overwrite=overwrite)
    resumed = len(finished_runs(config, target))  # their time is not in this start's wall time
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.perf_counter()
    note(
        f"{config.name} configuration ({config.config_hash()}): {len(config.arms)} arms x {config.seeds} seed(s), "
        f"{config.workers} worker(s), output in {target}"
    )
    for line in base_lines(config):
        note(line)
    runs = run_all(config, target, note=note)
    if gates is None and measure_gates:
        gates = measure_own(config, target, note=note)
    meta: dict[str, Any] = {
        "wall_s": time.perf_counter() - t0,
        "workers": config.workers,
        "started": started,
        "cpus": os.cpu_count(),
        "resumed": resumed,
    }
    results = write_report(runs, config, target, meta, docs_dir=docs, note=note, gates=gates)
    note(f"done in {meta['wall_s'] / 60:.1f} min")
    from .analysis import Comparison

    return CompareResult(target, config, results, [Comparison(**c) for c in results["confirmatory_comparisons"]])


def compare(
    env: str | Callable[..., Any] | None,
    *,
    env_params: Mapping[str, Any] | None = None,
    arms: str | Sequence[str] | None = None,
    seeds: int | None = None,
    first_seed: int | None = None,
    budget: str | Budget = "small",
    out: str | os.PathLike[str] | None = None,
    device: str = "cpu",
    workers: int | None = None,
    overwrite: bool = False,
    note: Callable[[str], None] = lambda _: None,
    demonstrator: str | Callable[..., Any] | None = None,
    base_policy: str | os.PathLike[str] | None = None,
    gates_file: str | os.PathLike[str] | None = None,
) -> CompareResult:
    """Does MPO help on my task? Trains ``arms`` on ``env`` from ``seeds`` seeds (the
    budget's default: 1 for quick, 5 otherwise) with equal budgets and writes the report in
    ``out`` (default: a temporary directory for quick, else ``reproduce-out``; an existing
    one must be empty or an earlier output of the same configuration, whose finished runs
    are resumed, unless ``overwrite``). ``gates_file``: the gates measured on a pilot
    (:func:`run_config`). Returns the paired results (:class:`CompareResult`).

    ``arms=None`` runs Table 1's arms on a user env (every arm with ``env=None``). Without
    ``demonstrator`` or ``base_policy`` a user env's arms start from a random
    initialisation. Raises InvalidConfigError (the env, the demonstrator), InvalidOptionError
    (an argument, the policy file), MissingDependencyError or OSError."""
    config = build_config(
        env,
        env_params=env_params,
        arms=arms,
        seeds=seeds,
        first_seed=first_seed,
        budget=budget,
        device=device,
        workers=workers,
        demonstrator=demonstrator,
        base_policy=base_policy,
    )
    return run_config(config, out, overwrite=overwrite, note=note, gates_file=gates_file)
