"""Search: the answer arrives only in the results of tool calls, as noisy hints."""

from __future__ import annotations

from collections.abc import Sequence

from mpo_rs.exceptions import InvalidRolloutError

from .protocol import (
    SeedStream,
    check_action,
    check_levels,
    check_param,
    check_probability,
    check_running,
    check_seed,
    uniform,
)

__all__ = ["Search"]

# Fixed ids; topics follow, then answers.
QUESTION, RESULT, NONE, ERROR, SEARCH, ANSWER, END = range(7)
FIRST_TOPIC = 7


class Search:
    """Find the answer to a question by searching; a search returns noisy hints, or nothing.

    Ids: ``question result none error search answer end``, then ``topic0 ..`` and ``ans0 ..``
    (and ``level0 ..`` with ``hit_probs``, then ``think0 ..`` with ``think_tokens``).

    - The first observation is ``[question, topic_k]``; the topic and the hidden answer
      (uniform in ``[0, num_answers)``) are drawn from the seed. With ``hit_probs`` (a
      spread of difficulty visible in the prompt, as real benchmarks have easy and hard
      questions) the seed then draws a level ``l`` uniformly, the first observation is
      ``[question, topic_k, level_l]`` and the task's hit probability is ``hit_probs[l]``;
      without it every task has ``hit_prob`` and the draws are what they always were.
    - A turn is exactly three tokens, a tool call: ``[search, topic_j, end]`` or
      ``[answer, ans_j, end]``. Anything else is malformed: the observation is ``[error]``
      and the turn is spent. With ``think_tokens=F`` (long turns, as an LLM agent's are) every
      turn first holds F free "thinking" tokens, each one of the ``think_vocab`` ids
      ``think0 ..``, which the environment reads and ignores, then the tool call: a turn of
      ``F + 3`` tokens; a non-thinking token among the first F makes the turn malformed.
    - ``[search, topic_j, end]`` returns ``[result, topic_j, x, y]`` with probability
      ``hit_prob`` when ``topic_j`` is the question's topic: two candidate answers, the right
      one and a distractor drawn uniformly from the others, in random order (a noisy hint).
      Otherwise -- a miss, or another topic -- it returns ``[result, topic_j, none]``. Each
      search draws afresh.
    - ``[answer, ans_j, end]`` ends the episode: reward 1.0 if ``ans_j`` is the hidden answer,
      else 0.0. After ``max_turns`` turns without an answer the episode ends with reward 0.0.
      The observation returned with ``done`` is empty.

    The hints are the only source of the answer: it is among the candidates every hit
    names, uniformly so. The oracle searches the question's topic until one candidate is
    left, then answers it; at the last turn it answers the lowest candidate left (``ans0``
    without a hit). No policy does better, yet with few hits it must guess.
    """

    name = "search"

    def __init__(
        self,
        max_turns: int = 10,
        num_topics: int = 4,
        num_answers: int = 16,
        hit_prob: float = 0.1,
        hit_probs: Sequence[float] | None = None,
        think_tokens: int = 0,
        think_vocab: int = 4,
    ) -> None:
        self.max_turns = check_param("Search", "max_turns", max_turns, 2)
        self.num_topics = check_param("Search", "num_topics", num_topics, 1)
        self.num_answers = check_param("Search", "num_answers", num_answers, 2)
        self.hit_prob = check_probability("Search", "hit_prob", hit_prob)
        self.hit_probs = check_levels(
            "Search", "hit_probs", hit_probs, "probabilities", lambda n, p: check_probability("Search", n, p)
        )
        self.think_tokens = check_param("Search", "think_tokens", think_tokens, 0)
        self.think_vocab = check_param("Search", "think_vocab", think_vocab, 1)
        self.action_tokens = self.think_tokens + 3
        self.first_answer = FIRST_TOPIC + self.num_topics
        self.first_level = self.first_answer + self.num_answers
        self.first_think = self.first_level + len(self.hit_probs or ())
        thinking = self.think_vocab if self.think_tokens else 0  # no thinking ids without thinking
        self.think_ids = range(self.first_think, self.first_think + thinking)
        """The thinking tokens' ids (empty without ``think_tokens``)."""
        self.vocab_size = self.first_think + thinking
        self.token_names = (
            ["question", "result", "none", "error", "search", "answer", "end"]
            + [f"topic{k}" for k in range(self.num_topics)]
            + [f"ans{j}" for j in range(self.num_answers)]
            + [f"level{i}" for i in range(len(self.hit_probs or ()))]
            + [f"think{i}" for i in range(thinking)]
        )
        self.topic: int | None = None
        self.hidden: int | None = None
        self.level: int | None = None
        """The task's difficulty level (an index into ``hit_probs``; None without them)."""
        self._stream = SeedStream(0)
        self._turn = 0
        self._done = True

    def __repr__(self) -> str:
        spread = "" if self.hit_probs is None else f", hit_probs={self.hit_probs}"
        think = "" if not self.think_tokens else f", think_tokens={self.think_tokens}, think_vocab={self.think_vocab}"
        return (
            f"Search(max_turns={self.max_turns}, num_topics={self.num_topics}, "
            f"num_answers={self.num_answers}, hit_prob={self.hit_prob}{spread}{think})"
        )

    def task_hit_prob(self, level: int | None) -> float:
        """The hit probability of a task of ``level`` (None: ``hit_prob``)."""
        return self.hit_prob if level is None or self.hit_probs is None else self.hit_probs[level]

    def well_formed_actions(self) -> list[tuple[int, int, int]]:
        """Every well-formed tool call: the searches, then the answers (with ``think_tokens``
        a well-formed action is that many thinking tokens, then one of these)."""
        return [(SEARCH, FIRST_TOPIC + k, END) for k in range(self.num_topics)] + [
            (ANSWER, self.first_answer + j, END) for j in range(self.num_answers)
        ]

    def reset(self, seed: int) -> list[int]:
        self._stream = SeedStream(check_seed("Search", seed))
        self.topic = self._stream.below(self.num_topics)
        self.hidden = self._stream.below(self.num_answers)
        self.level = None if self.hit_probs is None else self._stream.below(len(self.hit_probs))
        self._turn = 0
        self._done = False
        if self.level is None:
            return [QUESTION, FIRST_TOPIC + self.topic]
        return [QUESTION, FIRST_TOPIC + self.topic, self.first_level + self.level]

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        check_running("Search", self._turn, self._done)
        tokens = check_action("Search", self._turn, action, self.action_tokens, self.vocab_size)
        thought = all(token in self.think_ids for token in tokens[: self.think_tokens])
        command, content, end = tokens[self.think_tokens :]
        self._turn += 1
        if not thought:
            command = ERROR  # a non-thinking token where a thought goes: malformed
        if end == END and command == ANSWER and self.first_answer <= content < self.first_level:
            self._done = True
            return [], 1.0 if content - self.first_answer == self.hidden else 0.0, True
        observation = [ERROR]
        if end == END and command == SEARCH and FIRST_TOPIC <= content < self.first_answer:
            observation = [RESULT, content, NONE]
            if content - FIRST_TOPIC == self.topic and uniform(self._stream) < self.task_hit_prob(self.level):
                distractor = self._stream.below(self.num_answers - 1)
                distractor += distractor >= self.hidden  # type: ignore[operator]
                pair = [self.first_answer + self.hidden, self.first_answer + distractor]  # type: ignore[operator]
                if self._stream.below(2):
                    pair.reverse()
                observation = [RESULT, content, *pair]
        if self._turn == self.max_turns:
            self._done = True
            return [], 0.0, True
        return observation, 0.0, False

    def chance_success(self) -> float:
        """Success rate of a policy drawing every token uniformly from the vocabulary,
        computed exactly: its thoughts are all thinking tokens with probability
        ``h = (think_vocab / V)**think_tokens`` (1 without thinking), so a turn answers with
        probability ``a = h * num_answers / V**3``, rightly with ``h / V**3``, and the success
        is ``(h/V**3) * sum_{t < max_turns} (1 - a)**t``."""
        v3 = float(self.vocab_size) ** 3
        h = (len(self.think_ids) / float(self.vocab_size)) ** self.think_tokens
        answer = h * self.num_answers / v3
        return h * sum((1.0 - answer) ** t for t in range(self.max_turns)) / v3

    def candidates(self, observations: Sequence[Sequence[int]]) -> list[int]:
        """The answer indices every hit for the question's topic named (all before a hit)."""
        left = set(range(self.num_answers))
        topic = observations[0][1] if len(observations[0]) == self._first_length() else None
        for observation in observations[1:]:
            if len(observation) == 4 and observation[0] == RESULT and observation[1] == topic:
                left &= {observation[2] - self.first_answer, observation[3] - self.first_answer}
        return sorted(left)

    def oracle_action(self, observations: Sequence[Sequence[int]]) -> list[int]:
        """The best action for the turn after ``observations`` (the observations so far,
        starting with the first): search the question's topic until one candidate is left and
        answer it; at the last turn answer the lowest candidate left. Works from any history."""
        turn = len(observations) - 1
        if not 0 <= turn < self.max_turns:
            raise InvalidRolloutError(
                f"Search.oracle_action: {len(observations)} observations, expected 1..{self.max_turns}"
            )
        first = list(observations[0])
        if (
            len(first) != self._first_length()
            or first[0] != QUESTION
            or not FIRST_TOPIC <= first[1] < self.first_answer
        ):
            raise InvalidRolloutError(f"Search.oracle_action: unexpected first observation {first}")
        left = self.candidates(observations)
        thought = [self.first_think] * self.think_tokens  # the oracle thinks think0 throughout
        if len(left) == 1 or turn == self.max_turns - 1:
            return [*thought, ANSWER, self.first_answer + left[0], END]
        return [*thought, SEARCH, first[1], END]

    def _first_length(self) -> int:
        return 2 if self.hit_probs is None else 3
