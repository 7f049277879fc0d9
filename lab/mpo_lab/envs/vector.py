"""A batch of environments stepped together, finished ones skipped."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from mpo_rs.exceptions import InvalidConfigError, InvalidRolloutError, MpoError

from .protocol import MultiTurnEnv, check_action, check_seed

__all__ = ["VectorEnv"]


class VectorEnv:
    """``n`` environments of one shape (vocabulary, K, turn budget) stepped as a batch.

    ``VectorEnv(make_env, n)`` calls ``make_env()`` n times; ``VectorEnv(envs)`` takes a list
    of distinct environment objects. Rollouts of one task (a GRPO group) are copies reset
    with the same seed.
    """

    def __init__(self, make_env: Callable[[], MultiTurnEnv] | Sequence[MultiTurnEnv], n: int | None = None) -> None:
        if callable(make_env):
            if n is None or isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InvalidConfigError(f"VectorEnv: n must be an int >= 1, got {n!r}")
            envs = [make_env() for _ in range(n)]
        else:
            if n is not None and n != len(make_env):
                raise InvalidConfigError(f"VectorEnv: n = {n} but {len(make_env)} environments were given")
            envs = list(make_env)
            if not envs:
                raise InvalidConfigError("VectorEnv: no environments given")
        if len({id(env) for env in envs}) != len(envs):
            raise InvalidConfigError(
                "VectorEnv: the environments must be distinct objects (make_env returned one twice)"
            )
        for i, env in enumerate(envs):
            if not isinstance(env, MultiTurnEnv):
                raise InvalidConfigError(
                    f"VectorEnv: env {i} ({type(env).__name__}) lacks the MultiTurnEnv protocol "
                    "(vocab_size, action_tokens, max_turns, reset, step)"
                )
            shape = (env.vocab_size, env.action_tokens, env.max_turns)
            first = (envs[0].vocab_size, envs[0].action_tokens, envs[0].max_turns)
            if shape != first:
                raise InvalidConfigError(
                    f"VectorEnv: env {i} has (vocab_size, action_tokens, max_turns) = {shape}, env 0 has {first}"
                )
        self.envs = envs
        self.vocab_size: int = envs[0].vocab_size
        self.action_tokens: int = envs[0].action_tokens
        self.max_turns: int = envs[0].max_turns
        self._done = np.ones(len(envs), dtype=np.bool_)
        self._turns = np.zeros(len(envs), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.envs)

    @property
    def done(self) -> npt.NDArray[np.bool_]:
        """bool[n]: True where no episode is running (finished, or never reset)."""
        return self._done.copy()

    @property
    def turns(self) -> npt.NDArray[np.int64]:
        """int64[n]: turns taken in the current episodes."""
        return self._turns.copy()

    def reset(self, seeds: Sequence[int]) -> list[list[int]]:
        """Reset env i with ``seeds[i]``; return the n first observations.

        All or nothing, like :meth:`step`: every seed is checked (a non-negative int, the
        protocol's rule) before any env is reset, so a refused call leaves every env and
        episode as it was. Should an env's own ``reset`` still fail, the envs before it are
        already reset: then no episode counts as running (``done`` is all True) until a
        reset succeeds, so the next ``step`` cannot mix new episodes with old ones.
        """
        if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__len__"):
            raise InvalidConfigError(
                f"VectorEnv.reset: seeds must be a sequence of {len(self.envs)} ints, got {type(seeds).__name__}"
            )
        if len(seeds) != len(self.envs):
            raise InvalidConfigError(f"VectorEnv.reset: {len(seeds)} seeds for {len(self.envs)} environments")
        checked = [
            check_seed(f"VectorEnv env {i}: {type(env).__name__}", seed)
            for i, (env, seed) in enumerate(zip(self.envs, seeds, strict=True))
        ]
        observations = []
        for i, (env, seed) in enumerate(zip(self.envs, checked, strict=True)):
            try:
                observations.append(list(env.reset(seed)))
            except Exception as error:
                self._done[:] = True
                self._turns[:] = 0
                if isinstance(error, MpoError):  # keep mpo_rs's type, name the env
                    raise type(error)(f"VectorEnv env {i}: {error}") from error
                error.add_note(
                    f"raised by VectorEnv env {i} ({type(env).__name__}).reset({seed}); no episode is running"
                )
                raise
        self._done[:] = False
        self._turns[:] = 0
        return observations

    def step(
        self, actions: Sequence[Sequence[int] | None] | npt.NDArray[np.integer]
    ) -> tuple[list[list[int]], npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """Step every running env; skip finished ones.

        ``actions`` is a list with one entry per env — the K tokens for a running env,
        None for a finished one — or an int array of shape ``(n, K)`` whose rows for finished
        envs are ignored (for samplers that generate every row in lockstep). A finished env
        returns an empty observation, reward 0 and done True.

        Returns ``(observations, rewards float32[n], dones bool[n])``.
        """
        n = len(self.envs)
        lockstep = isinstance(actions, np.ndarray)
        rows: Sequence[Sequence[int] | None]
        if isinstance(actions, np.ndarray):
            if actions.ndim != 2 or actions.shape[0] != n:
                raise InvalidRolloutError(
                    f"VectorEnv.step: an action array must have shape ({n}, K), got {actions.shape}"
                )
            if actions.dtype.kind not in "iu":
                raise InvalidRolloutError(
                    f"VectorEnv.step: action token ids must be integers, got dtype {actions.dtype}"
                )
            rows = actions.tolist()  # one conversion for the batch; each row is then checked as a list
        else:
            rows = actions
        if len(rows) != n:
            raise InvalidRolloutError(f"VectorEnv.step: {len(rows)} actions for {n} environments")
        # Check every action before stepping any env, so a bad batch changes nothing.
        checked: list[list[int] | None] = []
        for i, action in enumerate(rows):
            if self._done[i]:
                if action is not None and not lockstep:
                    raise InvalidRolloutError(
                        f"VectorEnv.step: env {i} has no episode running; its action must be None"
                    )
                checked.append(None)
                continue
            if action is None:
                raise InvalidRolloutError(
                    f"VectorEnv.step: env {i} is running (turn {self._turns[i]}); its action is None"
                )
            name = f"VectorEnv env {i} ({type(self.envs[i]).__name__})"
            checked.append(check_action(name, int(self._turns[i]), action, self.action_tokens, self.vocab_size))
        observations: list[list[int]] = []
        rewards = np.zeros(n, dtype=np.float32)
        for i, (env, action) in enumerate(zip(self.envs, checked, strict=True)):
            if action is None:
                observations.append([])
                continue
            observation, reward, done = env.step(action)
            self._turns[i] += 1
            if self._turns[i] >= self.max_turns and not done:
                raise InvalidRolloutError(f"VectorEnv env {i}: not done after max_turns = {self.max_turns} turns")
            observations.append(list(observation))
            rewards[i] = reward
            self._done[i] = bool(done)
        return observations, rewards, self._done.copy()
