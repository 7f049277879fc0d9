"""A base policy of the user's own for a user env, and what every run says of its base.

A built-in task's arms start from a policy behaviour-cloned from the task's noisy oracle
(:mod:`.base`). A user env has no oracle, so its arms start from a random initialisation
unless the user gives one of:

- a **demonstrator** (``--demonstrator module:callable``, :func:`demonstrator_source`):
  ``demonstrator(observations) -> action`` (:class:`~mpo_lab.reproduce.sources.Demonstrator`);
  the base is cloned from its episodes exactly as a built-in task's is from its noisy
  oracle's (the budget's :class:`~mpo_lab.reproduce.config.BasePolicy` settings);
- a **saved policy** (``--base-policy PATH``, :func:`saved_policy_source`): a file of the
  run's model (:class:`~mpo_lab.reproduce.sources.SavedPolicy`), such as one reproduce wrote
  under ``OUT/base/``; every seed starts from it.

Either is identified in the configuration (the demonstrator's code, the file's sha256), so
an output directory resumes only runs of the same base, and a base made from an edited
demonstrator or a changed file is refused, never served from a cache.
:func:`base_description` is the line the console, results.json and the page say of a task's
base. Numpy only at import.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mpo_rs.exceptions import InvalidConfigError, InvalidOptionError

from ..envs.protocol import check_action
from .config import BasePolicy, ReproduceConfig
from .env import callable_spec, load_callable, source_digest
from .sources import Demonstrator, SavedPolicy

__all__ = [
    "SCRATCH",
    "base_description",
    "base_lines",
    "demonstrator_episodes",
    "demonstrator_source",
    "file_digest",
    "load_demonstrator",
    "saved_policy_source",
    "user_base",
]

SCRATCH = "none: a random initialisation"
"""What a task's base is when its arms start from scratch."""


def _code(spec: str, fn: Callable[..., Any]) -> str:
    """The demonstrator's code identity: the modules that name and define it, its ``version``."""
    modules = sorted({spec.partition(":")[0], getattr(fn, "__module__", None) or ""} - {""})
    parts: list[Any] = [[name, source_digest(name)] for name in modules]
    version = getattr(fn, "version", None)
    if version is not None:
        parts.append(["version", repr(version)])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def demonstrator_source(demonstrator: str | Callable[..., Any]) -> Demonstrator:
    """The demonstrator ``module:callable`` (or a module-level callable) names, identified.
    Raises InvalidConfigError, one line."""
    spec = callable_spec(demonstrator, "demonstrator")
    return Demonstrator(spec, _code(spec, load_callable(spec, "demonstrator")))


def load_demonstrator(source: Demonstrator) -> Callable[..., Any]:
    """The demonstrator's callable; refused when its code is no longer the configuration's."""
    fn = load_callable(source.spec, "demonstrator")
    if _code(source.spec, fn) != source.code:
        raise InvalidConfigError(
            f"demonstrator {source.spec!r}: its code is {_code(source.spec, fn)}, not the {source.code} this "
            "configuration was made with (its module's source or declared version changed since); start the run again"
        )
    return fn


def file_digest(path: str | Path, what: str = "base policy") -> str:
    """The sha256 (12 hex digits) of a file. Raises InvalidOptionError when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    except IsADirectoryError:
        raise InvalidOptionError(f"{what} {str(path)!r}: a directory, not a policy file") from None
    except OSError as e:
        raise InvalidOptionError(f"{what} {str(path)!r}: cannot be read ({e.strerror or e})") from None


def saved_policy_source(path: str | Path) -> SavedPolicy:
    """The policy file ``path``, identified by its digest. Raises InvalidOptionError."""
    return SavedPolicy(str(path), file_digest(path))


def user_base(
    budget_base: BasePolicy | None,
    demonstrator: str | Callable[..., Any] | None,
    base_policy: str | Path | None,
) -> BasePolicy | None:
    """A user env's base settings: the budget's cloning settings with the demonstrator or the
    saved policy as their source (no noise: that is the oracles'), or None (from scratch)
    when neither is given. Raises InvalidOptionError (both given, an unreadable file) or
    InvalidConfigError (a demonstrator that does not load)."""
    if demonstrator is not None and base_policy is not None:
        raise InvalidOptionError(
            "demonstrator (--demonstrator) and base_policy (--base-policy) are two bases; give one"
        )
    if demonstrator is None and base_policy is None:
        return None
    assert budget_base is not None, "every committed configuration has base settings"
    source = demonstrator_source(demonstrator) if demonstrator is not None else saved_policy_source(str(base_policy))
    return dataclasses.replace(budget_base, noise=(), source=source)


def _takes_rng(fn: Callable[..., Any]) -> bool:
    try:
        parameter = inspect.signature(fn).parameters.get("rng")
    except (TypeError, ValueError):  # a callable without a signature: observations only
        return False
    return parameter is not None and parameter.kind is not inspect.Parameter.POSITIONAL_ONLY


def demonstrator_episodes(
    env: Any, source: Demonstrator, seeds: range, rng: np.random.Generator
) -> tuple[list[int], list[bool], list[int], list[float]]:
    """One episode of the demonstrator per task seed on ``env``, flat in the sampler's layout
    (:class:`~mpo_lab.reproduce.base.Demonstrations`: token ids, the policy-token mask, the
    offsets, the scores). Its actions are checked as a policy's; an exception it raises is
    an InvalidConfigError naming it, the task seed and the turn."""
    demonstrate = load_demonstrator(source)
    extra = {"rng": rng} if _takes_rng(demonstrate) else {}
    name = f"demonstrator {source.spec!r}"
    tokens: list[int] = []
    mask: list[bool] = []
    offsets = [0]
    scores = []
    for seed in seeds:
        observation = list(env.reset(seed))
        observations = [observation]
        tokens += observation
        mask += [False] * len(observation)
        score = 0.0
        for turn in range(int(env.max_turns)):
            try:
                raw = demonstrate([list(o) for o in observations], **extra)
            except Exception as e:  # the user's code failed: one line, typed
                said = " ".join(str(e).split())
                raise InvalidConfigError(
                    f"{name}: calling it on task seed {seed}, turn {turn} failed: {type(e).__name__}: {said}"
                ) from None
            action = check_action(name, turn, raw, int(env.action_tokens), int(env.vocab_size))
            tokens += action
            mask += [True] * len(action)
            observation, reward, done = env.step(action)
            score += float(reward)
            if done:
                break
            observation = list(observation)
            observations.append(observation)
            tokens += observation
            mask += [False] * len(observation)
        offsets.append(len(tokens))
        scores.append(score)
    return tokens, mask, offsets, scores


def base_description(config: ReproduceConfig, task: str) -> str:
    """Where the arms of ``task`` start, in words: ``cloned from the built-in noisy oracle
    (eps 0.1)``, ``cloned from demonstrator m:f``, ``loaded from FILE`` or :data:`SCRATCH`."""
    base = config.base
    if base is None:
        return SCRATCH
    if base.source is not None:
        return base.source.describe()
    return f"cloned from the built-in noisy oracle (eps {base.eps(task):g})"


def base_lines(config: ReproduceConfig) -> list[str]:
    """The console's lines on where the arms start: one per task; from scratch, how to give a base."""
    out = []
    for spec in config.tasks:
        line = f"{spec.name}: base policy {base_description(config, spec.name)}"
        if config.base is None:
            line += (
                ": every arm starts from scratch (give --demonstrator or --base-policy, or demonstrator= or "
                "base_policy= to compare, for a base policy of your own)"
            )
        out.append(line)
    return out
