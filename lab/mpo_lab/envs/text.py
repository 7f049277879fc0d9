"""Plug a text environment into the token protocol through a tokenizer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from mpo_rs.exceptions import InvalidConfigError

from .protocol import check_action, check_param, check_running, check_seed

__all__ = ["TextEnv", "TokenizedTextEnv"]


@runtime_checkable
class TextEnv(Protocol):
    """A multi-turn environment that speaks text: ``reset(seed) -> prompt`` and
    ``step(reply) -> (observation, reward, done)``."""

    def reset(self, seed: int) -> str: ...

    def step(self, reply: str) -> tuple[str, float, bool]: ...


class TokenizedTextEnv:
    """A :class:`TextEnv` seen as a :class:`~mpo_lab.envs.MultiTurnEnv`.

    ``encode(text) -> list[int]`` turns the env's text into observation tokens;
    ``decode(tokens) -> str`` turns the policy's K tokens into the reply (a tokenizer's
    ``decode`` can drop padding or cut at a stop token here). The episode is cut, with
    ``done=True``, after ``max_turns`` turns if the text env has not ended it.
    """

    def __init__(
        self,
        text_env: TextEnv,
        encode: Callable[[str], Sequence[int]],
        decode: Callable[[list[int]], str],
        vocab_size: int,
        action_tokens: int,
        max_turns: int,
    ) -> None:
        if not isinstance(text_env, TextEnv):
            raise InvalidConfigError(f"TokenizedTextEnv: {type(text_env).__name__} has no reset(seed) / step(reply)")
        self.text_env = text_env
        self.encode = encode
        self.decode = decode
        self.vocab_size = check_param("TokenizedTextEnv", "vocab_size", vocab_size, 1)
        self.action_tokens = check_param("TokenizedTextEnv", "action_tokens", action_tokens, 1)
        self.max_turns = check_param("TokenizedTextEnv", "max_turns", max_turns, 1)
        self.name = f"TokenizedTextEnv({type(text_env).__name__})"
        self._turn = 0
        self._done = True

    def _tokens(self, text: str) -> list[int]:
        tokens = [int(t) for t in self.encode(text)]
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidConfigError(
                f"{self.name} turn {self._turn}: the tokenizer produced ids {bad[:5]} outside [0, {self.vocab_size})"
            )
        return tokens

    def reset(self, seed: int) -> list[int]:
        seed = check_seed(self.name, seed)
        self._turn = 0
        self._done = False
        return self._tokens(self.text_env.reset(seed))

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        check_running(self.name, self._turn, self._done)
        tokens = check_action(self.name, self._turn, action, self.action_tokens, self.vocab_size)
        text, reward, done = self.text_env.step(self.decode(tokens))
        self._turn += 1
        observation = self._tokens(text)
        if self._turn >= self.max_turns:
            done = True
        self._done = bool(done)
        return observation, float(reward), self._done
