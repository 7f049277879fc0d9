"""Environments of every (mis)behaviour, for the protocol checks of `reproduce --env`.

``make(**params)`` (``--env edge_envs:make --env-param KEY=VALUE``, the tests directory on
the path) builds a small env that behaves like examples/my_env.py, unless a parameter says
otherwise: sizes of any value (``vocab_size``, ``action_tokens``, ``max_turns`` are set as
given), observations of ``obs_len`` tokens, a ``done``, reward, observation or result of
the wrong kind, an exception in ``reset``/``step``/the factory, an episode that never ends,
and an env that raises only from a task index on (so only mid-run, not in the up-front
probe, which plays the first tasks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

ANSWER = 1


class EdgeEnv:
    def __init__(
        self,
        vocab_size: Any = 8,
        action_tokens: Any = 2,
        max_turns: Any = 4,
        obs_len: int = 1,
        done_kind: str = "bool",
        reward_kind: str = "float",
        obs_kind: str = "list",
        reset_kind: str = "list",
        result_kind: str = "triple",
        raise_in: str | None = None,
        raise_from_index: int = 0,
        never_done: bool = False,
        version: Any = None,
    ) -> None:
        if raise_in == "init":
            raise RuntimeError("the factory failed")
        self.vocab_size, self.action_tokens, self.max_turns = vocab_size, action_tokens, max_turns
        self.obs_len, self.done_kind, self.reward_kind, self.obs_kind = obs_len, done_kind, reward_kind, obs_kind
        self.reset_kind, self.result_kind, self.raise_in = reset_kind, result_kind, raise_in
        self.raise_from_index, self.never_done = raise_from_index, never_done
        if version is not None:
            self.version = version
        self._seed, self._turn = 0, 0

    def _raises(self, where: str) -> bool:
        return self.raise_in == where and self._seed % 2**32 >= self.raise_from_index

    def reset(self, seed: int) -> Any:
        self._seed, self._turn = seed, 0
        if self._raises("reset"):
            raise ValueError("cannot reset")
        if self.reset_kind == "empty":
            return []
        if self.reset_kind == "none":
            return None
        return [2 + seed % 3]

    def step(self, action: Sequence[int]) -> Any:
        self._turn += 1
        if self._raises("step"):
            return 1 // 0
        done = (not self.never_done) and (self._turn >= int(self.max_turns) or action[0] == ANSWER)
        reward = 1.0 if done and action[-1] == self._seed % 2 else 0.0
        observation: Any = [3] * int(self.obs_len)
        kinds = {
            "floats": [0.5] * int(self.obs_len),
            "negative": [-1],
            "too_big": [10**6],
            "nested": [[1, 2]],
            "none": None,
            "str": "abc",
            "array": np.full(int(self.obs_len), 3, dtype=np.int64),
            "2d": np.zeros((2, 2), dtype=np.int64),
        }
        observation = kinds.get(self.obs_kind, observation)
        rewards = {"str": "1.0", "nan": float("nan"), "inf": float("inf"), "none": None, "list": [reward]}
        rewards |= {"bool": True, "huge": 10**400, "numpy": np.float32(reward), "int": int(reward)}
        reward = rewards.get(self.reward_kind, reward)
        dones = {"array": np.array([done, done]), "int": int(done), "str": "no", "none": None, "numpy": np.bool_(done)}
        done = dones.get(self.done_kind, done)
        if self.result_kind == "pair":
            return observation, reward
        if self.result_kind == "list":
            return [observation, reward, done]
        return observation, reward, done


def make(**params: Any) -> EdgeEnv:
    return EdgeEnv(**params)
