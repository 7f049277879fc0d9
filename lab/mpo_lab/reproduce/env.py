"""The environment a reproduction task names: found, checked, identified and sized.

A task is a registry name (``mpo_lab.envs.make``) or a user's ``module:factory`` (its
parameters the factory's keyword arguments). A user env is of unknown quality, so:

- **Checked** (:func:`user_env`): every env the factory makes is wrapped in
  :class:`~mpo_lab.envs.protocol.CheckedEnv` (the protocol's sizes once, then each call's
  return types and an exception raised inside a call, one typed line naming the env, the
  call and the value). Before anything is written, :func:`check_user_env` adds
  reproduce's own limits (:data:`MAX_VOCAB`, :data:`MAX_EPISODE_TOKENS`) and plays
  :data:`PROBE_EPISODES` episodes of uniformly random actions, so a broken env fails there.
- **Identified** (:func:`env_code`): the sha256 of the source files of the modules that
  define the factory and the env's class, and of the ``version`` the env may declare. It
  goes into the task (:attr:`TaskSpec.code <mpo_lab.reproduce.config.TaskSpec.code>`), so
  into the configuration hash: the runs of an edited env are not resumed.
- **Sized** (:func:`model_max_len`): a user env's model has :data:`MAX_EPISODE_TOKENS`
  positions, so any episode the limit admits runs.

Numpy only at import.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mpo_rs.exceptions import InvalidConfigError

from ..envs.protocol import CheckedEnv
from ..seeds import HELD_OUT, Stream, task_seeds
from .config import TaskSpec, registry_name

__all__ = [
    "MAX_EPISODE_TOKENS",
    "MAX_VOCAB",
    "PROBE_EPISODES",
    "callable_spec",
    "check_user_env",
    "env_code",
    "env_spec",
    "load_callable",
    "load_env_factory",
    "make_env",
    "model_max_len",
    "source_digest",
    "task_chance",
    "user_env",
]

MAX_VOCAB = 1 << 18
"""The most token ids a user env may declare (2**18 = 262,144, above every common
tokenizer): the model's embedding and head are ``vocab_size x width``."""
MAX_EPISODE_TOKENS = 4096
"""The longest episode of a user env (prompt, actions and the observations the policy
reads), and so the positions of its model."""
PROBE_EPISODES = 4
"""Episodes of uniformly random actions played on held-out and on training tasks (each)
before a user env's run starts."""


_KINDS = {
    "env": ("factory", "examples.my_env:make", "a callable that returns a MultiTurnEnv"),
    "demonstrator": ("callable", "examples.my_env:demonstrate", "a callable that returns the next action"),
}
"""What a ``module:name`` spec names: (the name's role, an example, what it must be)."""


def _import(spec: str, module_name: str, what: str = "env") -> Any:
    # The current directory first on the path, as `python -m` has it, so `examples.my_env`
    # is found from a checkout; worker processes get the same path.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise InvalidConfigError(
                f"{what} {spec!r}: no module named {e.name!r} (run from the directory that holds it, or add it to "
                "PYTHONPATH)"
            ) from None
        raise InvalidConfigError(f"{what} {spec!r}: importing {module_name} failed: {e}") from None
    except Exception as e:  # the user's module failed while importing: one line, typed
        raise InvalidConfigError(f"{what} {spec!r}: importing {module_name} failed: {type(e).__name__}: {e}") from None


def load_callable(spec: str, what: str = "env") -> Callable[..., Any]:
    """The callable named by ``spec`` (``module:name``, the name may be dotted, e.g.
    ``pkg.envs:MyEnv.create``): an env factory (``what="env"``) or a demonstrator
    (``what="demonstrator"``). Raises InvalidConfigError with one line naming ``what`` when
    the spec is not of that form, the module does not import or has no such attribute, or
    it is not callable."""
    role, example, must = _KINDS[what]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr or any(not part.isidentifier() for part in attr.split(".")):
        raise InvalidConfigError(f"{what} {spec!r}: expected module:{role}, e.g. {example}")
    obj = _import(spec, module_name, what)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidConfigError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise InvalidConfigError(f"{what} {spec!r}: {attr} is a {type(obj).__name__}, not {must}")
    return obj  # type: ignore[no-any-return]


@functools.cache
def load_env_factory(spec: str) -> Callable[..., Any]:
    """The env factory named by ``spec`` (``module:factory``): :func:`load_callable`."""
    return load_callable(spec, "env")


def callable_spec(obj: str | Callable[..., Any], what: str = "env") -> str:
    """``module:name`` for a callable (it must be reachable by that name, which is how
    worker processes find it and what the configuration hash records); a string as given."""
    if isinstance(obj, str):
        return obj
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    spec = f"{module}:{qualname}"
    if not module or "<" in qualname:
        raise InvalidConfigError(
            f"{what} {obj!r} cannot be named as module:{_KINDS[what][0]} (a lambda or a local function); "
            "pass a function defined at the top of a module"
        )
    if load_callable(spec, what) is not obj:
        raise InvalidConfigError(f"{what} {obj!r}: {spec} names another object")
    return spec


def env_spec(env: str | Callable[..., Any]) -> str:
    """``module:factory`` for a callable (:func:`callable_spec`); a string as given."""
    return callable_spec(env, "env")


# --------------------------------------------------------------------------- identity


_SOURCES: dict[str, str] = {}
"""Module name -> sha256 of its source file, read once per process: the code this process
runs (a file edited later is another process's code)."""


def source_digest(module_name: str) -> str | None:
    """The sha256 of an imported module's source file (None for a module without one)."""
    if module_name not in _SOURCES:
        path = getattr(sys.modules.get(module_name), "__file__", None)
        if path is None:
            return None  # a built-in or namespace module: no file to read
        try:
            _SOURCES[module_name] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            _SOURCES[module_name] = "unreadable"
    return _SOURCES[module_name]


def env_code(spec: str, env: Any) -> str:
    """The identity of a user env's code (12 hex digits): the sha256 of the source files of
    the module ``spec`` names, the module that defines the factory and the one that defines
    the env's class, with the ``version`` the env may declare (any value, by its repr).
    Other modules they import, data files they read and mpo_rs itself are not covered."""
    raw = env.env if isinstance(env, CheckedEnv) else env
    factory = load_env_factory(spec)
    modules = sorted({spec.partition(":")[0], getattr(factory, "__module__", None) or "", type(raw).__module__} - {""})
    parts: list[Any] = [[name, source_digest(name)] for name in modules]
    version = getattr(raw, "version", None)
    if version is not None:
        parts.append(["version", repr(version)])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


# --------------------------------------------------------------------------- checks


def user_env(spec: str, params: Mapping[str, Any], code: str | None = None) -> CheckedEnv:
    """A fresh env of the user's factory, checked (:class:`CheckedEnv`, with reproduce's
    episode limit). With ``code``, an env whose code identity is another (edited since the
    configuration was made) is refused. Raises InvalidConfigError."""
    factory = load_env_factory(spec)
    try:
        raw = factory(**params)
    except Exception as e:  # a bad parameter, or the factory's own failure: one line, typed
        raise InvalidConfigError(
            f"env {spec!r}: calling it with {dict(params)} failed: {type(e).__name__}: {e}"
        ) from None
    env = CheckedEnv(raw, f"env {spec!r}", max_episode_tokens=MAX_EPISODE_TOKENS)
    if code is not None and env_code(spec, raw) != code:
        raise InvalidConfigError(
            f"env {spec!r}: its code is {env_code(spec, raw)}, not the {code} this configuration was made with "
            "(its module's source or declared version changed since); start the run again"
        )
    return env


def check_user_env(spec: str, params: Mapping[str, Any], first_seed: int = 0) -> TaskSpec:
    """The task of a user env, checked before anything is written: the protocol's sizes,
    reproduce's limits (:data:`MAX_VOCAB` token ids, an episode of ``max_turns`` turns
    within :data:`MAX_EPISODE_TOKENS` tokens) and :data:`PROBE_EPISODES` episodes of
    random actions on held-out tasks and on training tasks of run seed ``first_seed``
    (every call's return checked; an episode that never says done is cut off at
    ``max_turns``). Raises InvalidConfigError or InvalidRolloutError, one line."""
    env = user_env(spec, params)
    name = f"env {spec!r}"
    if env.vocab_size > MAX_VOCAB:
        raise InvalidConfigError(
            f"{name}: vocab_size {env.vocab_size} is more than reproduce's model takes ({MAX_VOCAB} = 2**18 ids)"
        )
    # An episode of max_turns turns holds at least the prompt, every action and an observation between turns.
    shortest = 1 + env.max_turns * env.action_tokens + (env.max_turns - 1)
    if shortest > MAX_EPISODE_TOKENS:
        raise InvalidConfigError(
            f"{name}: max_turns {env.max_turns} x action_tokens {env.action_tokens}: an episode that runs to "
            f"max_turns is at least {shortest} tokens, more than reproduce's model takes ({MAX_EPISODE_TOKENS}); "
            "lower max_turns or action_tokens"
        )
    rng = np.random.default_rng(Stream.PROBES)
    probes = [*task_seeds(HELD_OUT, None, 0, PROBE_EPISODES), *task_seeds("train", first_seed, 0, PROBE_EPISODES)]
    for seed in probes:
        env.reset(seed)
        for _ in range(env.max_turns):
            _, _, done = env.step(rng.integers(env.vocab_size, size=env.action_tokens).tolist())
            if done:
                break
    return TaskSpec(spec, tuple(sorted(params.items())), env_code(spec, env))


def make_env(task: TaskSpec) -> Any:
    """A fresh environment of ``task``: a registry name (``mpo_lab.envs.make``) or, when the
    name holds a colon, the user's factory called with the task's parameters (checked:
    :func:`user_env`)."""
    if ":" in task.name:
        return user_env(task.name, task.kwargs(), task.code)
    from ..envs import make

    return make(registry_name(task.name), **task.kwargs())


def model_max_len(task: TaskSpec, env: Any) -> int:
    """Positions of the policy of ``task``: :data:`MAX_EPISODE_TOKENS` for a user env (its
    observations may be of any length the limit admits); for a built-in task that declares its
    longest observation (``observation_tokens``: Sokoban's room, which is also its prompt) the
    prompt and every turn at that length, else the bound the committed runs were made with
    (observations of at most 8 tokens); 64 positions to spare."""
    if ":" in task.name:
        return MAX_EPISODE_TOKENS
    turns, action = int(env.max_turns), int(env.action_tokens)
    observation = getattr(env, "observation_tokens", None)
    if observation is not None:
        return max(256, (1 + turns) * int(observation) + turns * action + 64)
    return max(256, 1 + turns * (action + 8) + 64)


def task_chance(task: TaskSpec, episodes: int = 256) -> tuple[float, str]:
    """(chance success, how it was obtained) for ``task``: the env's ``chance_success()``
    when it has one (the built-in tasks' exact formulas), else the success rate of uniformly
    random tokens over ``episodes`` held-out tasks (a Monte-Carlo estimate)."""
    env = make_env(task)
    if callable(getattr(env, "chance_success", None)):
        return float(env.chance_success()), "exact"
    rng = np.random.default_rng(Stream.PROBES)
    wins = 0
    for seed in task_seeds(HELD_OUT, None, 0, episodes):
        env.reset(seed)
        score, done, turns = 0.0, False, 0
        while not done and turns < env.max_turns:
            _, reward, done = env.step(rng.integers(env.vocab_size, size=env.action_tokens).tolist())
            score += float(reward)
            turns += 1
        wins += score > 0
    return wins / episodes, f"uniformly random tokens, {episodes} episodes"
