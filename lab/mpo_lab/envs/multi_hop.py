"""Multi-hop lookup: follow a chain of links; a wrong hop shows up as a dead end one turn later."""

from __future__ import annotations

from collections.abc import Sequence

from mpo_rs.exceptions import InvalidConfigError, InvalidRolloutError

from .protocol import SeedStream, check_action, check_levels, check_param, check_running, check_seed

__all__ = ["MultiHop"]

# Fixed ids; entities follow, then answers.
QUESTION, PAGE, LINKS, DEAD_END, FACT, NOT_FOUND, ERROR, LOOKUP, ANSWER, END = range(10)
FIRST_ENTITY = 10


class MultiHop:
    """Answer a question whose answer sits ``hops`` links away from the entity it names.

    Ids: ``question page links dead_end fact not_found error lookup answer end``, then
    ``ent0 ..`` (``num_entities``) and ``ans0 ..`` (``num_answers``) (and ``level0 ..`` with
    ``hop_choices``).

    - With ``hop_choices`` (a spread of difficulty visible in the prompt, as multi-hop
      benchmarks mix two-hop and four-hop questions) the seed first draws a level ``l``
      uniformly, the task's chain has ``hop_choices[l]`` hops and the first observation is
      ``[question, n_0, level_l]``; ``hops`` is then the longest of them. Without it every
      task has ``hops`` hops and the draws are what they always were.

    - Drawn from the seed: a chain of distinct entities ``n_0 .. n_hops``, a decoy ``d_i`` beside
      each ``n_i`` (``i >= 1``), the order in which each pair is listed, and the answer.
      The first observation is ``[question, n_0]``.
    - A turn is exactly three tokens, a tool call: ``[lookup, ent_e, end]`` or
      ``[answer, ans_j, end]``. Anything else is malformed: the observation is ``[error]`` and
      the turn is spent.
    - Only entities already seen (``n_0`` and those listed in links) can be looked up; another
      gives ``[not_found, ent_e]``. Looking up ``n_i`` (``i < hops``) gives ``[page, n_i, links,
      x, y]`` with ``{x, y} = {n_{i+1}, d_{i+1}}``; looking up a decoy gives ``[page, d_i,
      dead_end]`` (the wrong hop is found out one turn after it was taken, and the other link
      must be followed instead); looking up ``n_hops`` gives ``[page, n_hops, fact, ans_z]``.
    - ``[answer, ans_j, end]`` ends the episode with reward 1.0 if ``j`` is the answer, else 0.0;
      after ``max_turns`` turns without an answer it ends with 0.0. The observation returned
      with ``done`` is empty.

    The oracle follows the first listed link and backtracks to the other after a dead end:
    ``hops + 2`` turns plus one per decoy taken, at most ``oracle_turns() = 2 * hops + 2``.
    No policy can tell the link from the decoy before looking, so with a budget below that
    the dead ends decide: the default (5 hops, 9 turns) leaves room for two, and the oracle
    succeeds with probability P(at most 2 of 5 fair coins) = 1/2.
    """

    name = "multi_hop"

    def __init__(
        self,
        hops: int = 5,
        max_turns: int = 9,
        num_entities: int = 12,
        num_answers: int = 4,
        hop_choices: Sequence[int] | None = None,
    ) -> None:
        self.hop_choices = check_levels(
            "MultiHop", "hop_choices", hop_choices, "hop counts", lambda n, h: check_param("MultiHop", n, h, 1)
        )
        self.hops = check_param("MultiHop", "hops", hops if self.hop_choices is None else max(self.hop_choices), 1)
        self.task_hops = self.hops
        """The hops of the task drawn by the last ``reset`` (``hops`` without ``hop_choices``)."""
        self.max_turns = check_param("MultiHop", "max_turns", max_turns, 2)
        self.num_entities = check_param("MultiHop", "num_entities", num_entities, 1)
        self.num_answers = check_param("MultiHop", "num_answers", num_answers, 2)
        if self.num_entities < 2 * self.hops + 1:
            raise InvalidConfigError(
                f"MultiHop: num_entities must be >= 2 * hops + 1 = {2 * self.hops + 1}, got {self.num_entities}"
            )
        self.action_tokens = 3
        self.first_answer = FIRST_ENTITY + self.num_entities
        self.first_level = self.first_answer + self.num_answers
        self.vocab_size = self.first_level + len(self.hop_choices or ())
        self.token_names = (
            ["question", "page", "links", "dead_end", "fact", "not_found", "error", "lookup", "answer", "end"]
            + [f"ent{e}" for e in range(self.num_entities)]
            + [f"ans{j}" for j in range(self.num_answers)]
            + [f"level{i}" for i in range(len(self.hop_choices or ()))]
        )
        self.chain: list[int] = []
        self.decoys: list[int] = []
        self.hidden: int | None = None
        self._pairs: list[tuple[int, int]] = []
        self._seen: set[int] = set()
        self._turn = 0
        self._done = True

    def __repr__(self) -> str:
        spread = "" if self.hop_choices is None else f", hop_choices={list(self.hop_choices)}"
        return (
            f"MultiHop(hops={self.hops}, max_turns={self.max_turns}, num_entities={self.num_entities}, "
            f"num_answers={self.num_answers}{spread})"
        )

    def well_formed_actions(self) -> list[tuple[int, int, int]]:
        """Every well-formed action: the lookups, then the answers."""
        return [(LOOKUP, FIRST_ENTITY + e, END) for e in range(self.num_entities)] + [
            (ANSWER, self.first_answer + j, END) for j in range(self.num_answers)
        ]

    def oracle_turns(self) -> int:
        """The most turns the oracle needs: ``2 * hops + 2``."""
        return 2 * self.hops + 2

    def reset(self, seed: int) -> list[int]:
        stream = SeedStream(check_seed("MultiHop", seed))
        level = None if self.hop_choices is None else stream.below(len(self.hop_choices))
        hops = self.task_hops = self.hops if level is None else self.hop_choices[level]  # type: ignore[index]
        pool = list(range(FIRST_ENTITY, FIRST_ENTITY + self.num_entities))
        drawn = []
        for _ in range(2 * hops + 1):  # a partial Fisher-Yates shuffle
            drawn.append(pool.pop(stream.below(len(pool))))
        self.chain = drawn[: hops + 1]
        self.decoys = [-1, *drawn[hops + 1 :]]  # decoys[i] sits beside chain[i], i >= 1
        self._pairs = []
        for i in range(1, hops + 1):
            pair = (self.chain[i], self.decoys[i])
            self._pairs.append(pair if stream.below(2) == 0 else (pair[1], pair[0]))
        self.hidden = stream.below(self.num_answers)
        self._seen = {self.chain[0]}
        self._turn = 0
        self._done = False
        return [QUESTION, self.chain[0]] + ([] if level is None else [self.first_level + level])

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        check_running("MultiHop", self._turn, self._done)
        command, content, end = check_action("MultiHop", self._turn, action, self.action_tokens, self.vocab_size)
        self._turn += 1
        if end == END and command == ANSWER and self.first_answer <= content < self.first_level:
            self._done = True
            return [], 1.0 if content - self.first_answer == self.hidden else 0.0, True
        observation = [ERROR]
        if end == END and command == LOOKUP and FIRST_ENTITY <= content < self.first_answer:
            observation = self._lookup(content)
        if self._turn == self.max_turns:
            self._done = True
            return [], 0.0, True
        return observation, 0.0, False

    def _lookup(self, entity: int) -> list[int]:
        if entity not in self._seen:
            return [NOT_FOUND, entity]
        if entity in self.decoys:
            return [PAGE, entity, DEAD_END]
        depth = self.chain.index(entity)
        if depth == self.task_hops:
            return [PAGE, entity, FACT, self.first_answer + self.hidden]  # type: ignore[operator]
        x, y = self._pairs[depth]
        self._seen.update((x, y))
        return [PAGE, entity, LINKS, x, y]

    def chance_success(self) -> float:
        """Success rate of a policy drawing every token uniformly from the vocabulary, exact:
        what it has read does not change what it writes, so each turn answers with probability
        ``a = num_answers / V**3`` and rightly with ``1 / V**3``; the success is ``(1/V**3) *
        sum_{t < max_turns} (1 - a)**t``."""
        v3 = float(self.vocab_size) ** 3
        answer = self.num_answers / v3
        return sum((1.0 - answer) ** t for t in range(self.max_turns)) / v3

    def oracle_action(self, observations: Sequence[Sequence[int]]) -> list[int]:
        """The oracle's action for the turn after ``observations`` (the observations so far,
        starting with the first): answer once the fact is known; else look up the first
        listed link of the deepest entity known to be on the chain, or the other link after
        a dead end. Works from any history."""
        turn = len(observations) - 1
        if not 0 <= turn < self.max_turns:
            raise InvalidRolloutError(
                f"MultiHop.oracle_action: {len(observations)} observations, expected 1..{self.max_turns}"
            )
        first = list(observations[0])
        if (
            len(first) != (2 if self.hop_choices is None else 3)
            or first[0] != QUESTION
            or not FIRST_ENTITY <= first[1] < self.first_answer
        ):
            raise InvalidRolloutError(f"MultiHop.oracle_action: unexpected first observation {first}")
        links: dict[int, tuple[int, int]] = {}
        dead: set[int] = set()
        for observation in observations[1:]:
            if len(observation) >= 3 and observation[0] == PAGE:
                if observation[2] == FACT:
                    return [ANSWER, observation[3], END]
                if observation[2] == LINKS:
                    links[observation[1]] = (observation[3], observation[4])
                elif observation[2] == DEAD_END:
                    dead.add(observation[1])
        node = first[1]
        while node in links:
            x, y = links[node]
            if x in links or y in links:  # one link was followed and is on the chain
                node = x if x in links else y
                continue
            return [LOOKUP, y if x in dead else x, END]
        return [LOOKUP, node, END]
