"""Guess the number: higher/lower feedback, success within a turn budget."""

from __future__ import annotations

from collections.abc import Sequence

from mpo_rs.exceptions import InvalidRolloutError

from .protocol import SeedStream, check_action, check_param, check_running, check_seed

__all__ = ["GuessNumber"]


class GuessNumber:
    """Find a hidden integer in ``[0, num_values)`` within ``max_turns`` guesses.

    Ids ``0 .. num_values-1`` are the numbers; then come ``start``, ``lower``, ``higher``
    and ``nan`` (not a number), so ``vocab_size = num_values + 4``.

    - The first observation is ``[start]``; the hidden number is drawn from the seed.
    - Each turn the policy writes ``action_tokens`` tokens; the guess is the token at
      position 0 (the others do not matter).
    - A correct guess ends the episode with reward 1.0 and an empty observation. Otherwise
      the observation is ``[lower]`` (the hidden number is lower than the guess),
      ``[higher]``, or ``[nan]`` when the guess is not a number id; after the
      ``max_turns``-th wrong guess the episode ends with reward 0.0 and an empty observation.

    The number of turns is the policy's doing: binary search needs at most
    ``floor(log2(num_values)) + 1`` turns (5 for the default 16), a lucky guess one.
    """

    name = "guess_number"

    def __init__(self, num_values: int = 16, max_turns: int = 6, action_tokens: int = 2) -> None:
        self.num_values = check_param("GuessNumber", "num_values", num_values, 2)
        self.max_turns = check_param("GuessNumber", "max_turns", max_turns, 1)
        self.action_tokens = check_param("GuessNumber", "action_tokens", action_tokens, 1)
        n = self.num_values
        self.start, self.lower, self.higher, self.not_a_number = n, n + 1, n + 2, n + 3
        self.vocab_size = n + 4
        self.token_names = [str(v) for v in range(n)] + ["start", "lower", "higher", "nan"]
        self.decisive_positions = tuple((t, 0) for t in range(self.max_turns))
        self.hidden: int | None = None
        self._turn = 0
        self._done = True

    def __repr__(self) -> str:
        return (
            f"GuessNumber(num_values={self.num_values}, max_turns={self.max_turns}, action_tokens={self.action_tokens})"
        )

    def reset(self, seed: int) -> list[int]:
        self.hidden = SeedStream(check_seed("GuessNumber", seed)).below(self.num_values)
        self._turn = 0
        self._done = False
        return [self.start]

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        check_running("GuessNumber", self._turn, self._done)
        guess = check_action("GuessNumber", self._turn, action, self.action_tokens, self.vocab_size)[0]
        self._turn += 1
        if guess == self.hidden:
            self._done = True
            return [], 1.0, True
        if self._turn == self.max_turns:
            self._done = True
            return [], 0.0, True
        if guess >= self.num_values:
            return [self.not_a_number], 0.0, False
        return [self.lower if self.hidden < guess else self.higher], 0.0, False  # type: ignore[operator]

    def chance_success(self) -> float:
        """Success rate of a policy drawing every token uniformly from the vocabulary: each
        guess hits with probability ``1 / vocab_size``, independently, for up to
        ``max_turns`` guesses: ``1 - (1 - 1/vocab_size)**max_turns``."""
        return 1.0 - (1.0 - 1.0 / self.vocab_size) ** self.max_turns

    def oracle_turns(self) -> int:
        """The most turns binary search needs: ``floor(log2(num_values)) + 1``."""
        return self.num_values.bit_length()

    def oracle_action(self, observations: Sequence[Sequence[int]]) -> list[int]:
        """Binary search: the guess for the turn after ``observations`` (the observations so
        far, starting with the first), replaying the oracle's own earlier guesses. It
        succeeds on every seed when ``max_turns >= oracle_turns()``."""
        if not 1 <= len(observations) <= self.max_turns:
            raise InvalidRolloutError(
                f"GuessNumber.oracle_action: {len(observations)} observations, expected 1..{self.max_turns}"
            )
        low, high = 0, self.num_values - 1
        for observation in observations[1:]:
            guess = (low + high) // 2
            if list(observation) == [self.lower]:
                high = guess - 1
            elif list(observation) == [self.higher]:
                low = guess + 1
            else:
                raise InvalidRolloutError(f"GuessNumber.oracle_action: unexpected observation {list(observation)}")
        return [(low + high) // 2] + [self.start] * (self.action_tokens - 1)
