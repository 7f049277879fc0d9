"""Search: the answer arrives only in the results of tool calls, as noisy hints."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..exceptions import InvalidConfigError, InvalidRolloutError
from .protocol import SeedStream, check_action, check_param, check_seed

__all__ = ["Search", "check_probability", "uniform"]

# Fixed ids; topics follow, then answers.
QUESTION, RESULT, NONE, ERROR, SEARCH, ANSWER, END = range(7)
FIRST_TOPIC = 7


def check_probability(env_name: str, name: str, value: object) -> float:
    """A constructor parameter as a float in [0, 1], or an InvalidConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise InvalidConfigError(f"{env_name}: {name} must be a number in [0, 1], got {value!r}")
    return float(value)


def uniform(stream: SeedStream) -> float:
    """A float in [0, 1) from 53 bits of the stream."""
    return stream.below(1 << 53) / float(1 << 53)


class Search:
    """Find the answer to a question by searching; each search returns one noisy hint.

    Ids: ``question result none error search answer end``, then ``topic0 ..`` and ``ans0 ..``.

    - The first observation is ``[question, topic_k]``; the topic and the hidden answer
      (uniform in ``[0, num_answers)``) are drawn from the seed.
    - A turn is exactly three tokens, a tool call: ``[search, topic_j, end]`` or
      ``[answer, ans_j, end]``. Anything else is malformed: the observation is ``[error]``
      and the turn is spent.
    - ``[search, topic_j, end]`` returns ``[result, topic_j, hint]``: for the question's topic
      the hint is the answer with probability ``hint_accuracy`` and otherwise a uniformly
      random answer (which may be the right one too); for another topic the hint is ``none``.
      Each search draws a fresh hint.
    - ``[answer, ans_j, end]`` ends the episode: reward 1.0 if ``ans_j`` is the hidden answer,
      else 0.0. After ``max_turns`` turns without an answer the episode ends with reward 0.0.
      The observation returned with ``done`` is empty.

    Hints are the only source of the answer. After counts ``c_j`` of hint ``j`` the posterior
    of answer ``j`` is proportional to ``ratio() ** c_j``; the oracle searches on every turn
    but the last and then answers the most frequent hint (the lowest id among ties), which is
    the most probable answer: no policy does better, yet it fails when the hints mislead.
    """

    name = "search"

    def __init__(
        self, max_turns: int = 10, num_topics: int = 4, num_answers: int = 4, hint_accuracy: float = 0.3
    ) -> None:
        self.max_turns = check_param("Search", "max_turns", max_turns, 2)
        self.num_topics = check_param("Search", "num_topics", num_topics, 1)
        self.num_answers = check_param("Search", "num_answers", num_answers, 2)
        self.hint_accuracy = check_probability("Search", "hint_accuracy", hint_accuracy)
        self.action_tokens = 3
        self.first_answer = FIRST_TOPIC + self.num_topics
        self.vocab_size = self.first_answer + self.num_answers
        self.token_names = (
            ["question", "result", "none", "error", "search", "answer", "end"]
            + [f"topic{k}" for k in range(self.num_topics)]
            + [f"ans{j}" for j in range(self.num_answers)]
        )
        self.topic: int | None = None
        self.hidden: int | None = None
        self._stream = SeedStream(0)
        self._turn = 0
        self._done = True

    def __repr__(self) -> str:
        return (
            f"Search(max_turns={self.max_turns}, num_topics={self.num_topics}, "
            f"num_answers={self.num_answers}, hint_accuracy={self.hint_accuracy})"
        )

    def well_formed_actions(self) -> list[tuple[int, ...]]:
        """Every well-formed action: the searches, then the answers."""
        return [(SEARCH, FIRST_TOPIC + k, END) for k in range(self.num_topics)] + [
            (ANSWER, self.first_answer + j, END) for j in range(self.num_answers)
        ]

    def ratio(self) -> float:
        """How much one hint of ``j`` multiplies the odds of answer ``j``: P(hint j | answer j)
        over P(hint j | another answer)."""
        noise = (1.0 - self.hint_accuracy) / self.num_answers
        return math.inf if noise == 0.0 else (self.hint_accuracy + noise) / noise

    def reset(self, seed: int) -> list[int]:
        self._stream = SeedStream(check_seed("Search", seed))
        self.topic = self._stream.below(self.num_topics)
        self.hidden = self._stream.below(self.num_answers)
        self._turn = 0
        self._done = False
        return [QUESTION, FIRST_TOPIC + self.topic]

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        if self._done:
            raise InvalidRolloutError(
                f"Search turn {self._turn}: step() called with no episode running (it ended, or reset(seed) was never called)"
            )
        command, content, end = check_action("Search", self._turn, action, self.action_tokens, self.vocab_size)
        self._turn += 1
        if end == END and command == ANSWER and content >= self.first_answer:
            self._done = True
            return [], 1.0 if content - self.first_answer == self.hidden else 0.0, True
        observation = [ERROR]
        if end == END and command == SEARCH and FIRST_TOPIC <= content < self.first_answer:
            if content - FIRST_TOPIC != self.topic:
                observation = [RESULT, content, NONE]
            elif uniform(self._stream) < self.hint_accuracy:
                observation = [RESULT, content, self.first_answer + self.hidden]  # type: ignore[operator]
            else:
                observation = [RESULT, content, self.first_answer + self._stream.below(self.num_answers)]
        if self._turn == self.max_turns:
            self._done = True
            return [], 0.0, True
        return observation, 0.0, False

    def chance_success(self) -> float:
        """Success rate of a policy drawing every token uniformly from the vocabulary,
        computed exactly: a turn answers with probability ``a = num_answers / V**3``, rightly
        with ``1 / V**3``, so the success is ``(1/V**3) * sum_{t < max_turns} (1 - a)**t``."""
        v3 = float(self.vocab_size) ** 3
        answer = self.num_answers / v3
        return sum((1.0 - answer) ** t for t in range(self.max_turns)) / v3

    def hint_counts(self, observations: Sequence[Sequence[int]]) -> list[int]:
        """How often each answer came back as a hint for the question's topic."""
        counts = [0] * self.num_answers
        topic = observations[0][1] if len(observations[0]) == 2 else None
        for observation in observations[1:]:
            if len(observation) == 3 and observation[0] == RESULT and observation[1] == topic:
                if observation[2] >= self.first_answer:
                    counts[observation[2] - self.first_answer] += 1
        return counts

    def oracle_action(self, observations: Sequence[Sequence[int]]) -> list[int]:
        """The best action for the turn after ``observations`` (the observations so far,
        starting with the first): search the question's topic, and at the last turn answer
        the most frequent hint (lowest id among ties). Works from any history."""
        turn = len(observations) - 1
        if not 0 <= turn < self.max_turns:
            raise InvalidRolloutError(
                f"Search.oracle_action: {len(observations)} observations, expected 1..{self.max_turns}"
            )
        first = list(observations[0])
        if len(first) != 2 or first[0] != QUESTION or not FIRST_TOPIC <= first[1] < self.first_answer:
            raise InvalidRolloutError(f"Search.oracle_action: unexpected first observation {first}")
        if turn < self.max_turns - 1:
            return [SEARCH, first[1], END]
        counts = self.hint_counts(observations)
        return [ANSWER, self.first_answer + counts.index(max(counts)), END]
