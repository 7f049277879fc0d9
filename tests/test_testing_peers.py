"""The kit run on the peers' advantage functions as they are released (docs/testing.md,
"The peers"): each peer's row of the table there is what this run finds, so the table is
checked against a fresh run, not written by hand. A peer that is not installed is skipped
with the reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mpo_rs.testing import check_advantages
from mpo_rs.testing.invariants import ESTIMATORS
from mpo_rs.testing.strategies import batches, group_batches

DOCS = Path(__file__).resolve().parent.parent / "docs" / "testing.md"

# verl's masked_whiten refuses a batch of one policy token, and its GAE loop stacks nothing
# on a batch of width 0: real batches are larger, so the kit draws them larger.
TWO_TOKENS = {"batches": batches(4, edges=True, max_runs=5, max_run=4, turn_rewards=True, min_policy=2)}


# Every prompt sampled twice or more, as GRPO is run.
GROUPS_OF_2 = {"batches": group_batches(min_group=2)}


def _verl() -> Any:
    pytest.importorskip("torch", reason="verl's advantages need torch")
    return pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed")


def _unwhitened(fn: Callable[..., Any]) -> Callable[..., Any]:
    """verl's GAE read before its whitening: advantages = returns − values."""

    def gae(token_level_rewards: Any, values: Any, response_mask: Any, **options: Any) -> Any:
        _, returns = fn(token_level_rewards, values, response_mask, **options)
        return returns - values, returns

    return gae


def _returns(fn: Callable[..., Any]) -> Callable[..., Any]:
    """verl's REINFORCE++ read before its whitening: its returns as the advantages."""

    def reinforce(token_level_rewards: Any, response_mask: Any, **options: Any) -> Any:
        _, returns = fn(token_level_rewards, response_mask, **options)
        return returns, returns

    return reinforce


# (row name, estimator, convention, the function given verl's core_algos, check_advantages' keywords)
PEERS: list[tuple[str, str, str, Callable[[Any], Any], dict[str, Any]]] = [
    (
        "verl 0.9.1 compute_gae_advantage_return",
        "gae",
        "verl-gae",
        lambda ca: ca.compute_gae_advantage_return,
        TWO_TOKENS,
    ),
    (
        "verl 0.9.1 compute_gae_advantage_return, returns − values",
        "gae",
        "verl-gae",
        lambda ca: _unwhitened(ca.compute_gae_advantage_return),
        TWO_TOKENS,
    ),
    (
        "verl 0.9.1 compute_grpo_outcome_advantage",
        "grpo",
        "verl-group",
        lambda ca: ca.compute_grpo_outcome_advantage,
        {},
    ),
    (
        "verl 0.9.1 compute_grpo_outcome_advantage, groups of 2+",
        "grpo",
        "verl-group",
        lambda ca: ca.compute_grpo_outcome_advantage,
        GROUPS_OF_2,
    ),
    (
        "verl 0.9.1 compute_grpo_outcome_advantage (Dr. GRPO), groups of 2+",
        "drgrpo",
        "verl-group",
        lambda ca: ca.compute_grpo_outcome_advantage,
        {**GROUPS_OF_2, "call_options": {"norm_adv_by_std_in_grpo": False}},
    ),
    (
        "verl 0.9.1 compute_reinforce_plus_plus_outcome_advantage",
        "reinforce",
        "verl-reinforce",
        lambda ca: ca.compute_reinforce_plus_plus_outcome_advantage,
        TWO_TOKENS,
    ),
    (
        "verl 0.9.1 compute_reinforce_plus_plus_outcome_advantage, returns",
        "reinforce",
        "verl-reinforce",
        lambda ca: _returns(ca.compute_reinforce_plus_plus_outcome_advantage),
        TWO_TOKENS,
    ),
    (
        "verl 0.9.1 compute_rloo_outcome_advantage",
        "rloo",
        "verl-group",
        lambda ca: ca.compute_rloo_outcome_advantage,
        {},
    ),
    (
        "verl 0.9.1 compute_rloo_outcome_advantage, groups of 2+",
        "rloo",
        "verl-group",
        lambda ca: ca.compute_rloo_outcome_advantage,
        GROUPS_OF_2,
    ),
]

ALL = [name for spec in ESTIMATORS.values() for name in spec.invariants]
COLUMNS = list(dict.fromkeys(ALL))


def table_row(name: str, report: Any) -> str:
    """The row of docs/testing.md's peer table for one report: one cell per invariant."""
    cells = []
    for inv in COLUMNS:
        try:
            cells.append({"held": "holds", "failed": "**fails**", "unsatisfied": "n/a"}[report[inv].status])
        except KeyError:
            cells.append("\u2013")  # an en dash: the invariant does not apply
    return f"| {name} | " + " | ".join(cells) + " |"


@pytest.mark.parametrize("name, estimator, convention, get, kwargs", PEERS, ids=[p[0] for p in PEERS])
def test_the_peer_table_row_is_what_the_kit_finds(name, estimator, convention, get, kwargs):
    fn = get(_verl())
    report = check_advantages(fn, convention=convention, estimator=estimator, **kwargs)
    row = table_row(name, report)
    assert row in DOCS.read_text(), f"docs/testing.md lacks (or has another) row:\n{row}\n\n{report}"


def test_the_peers_not_installed_are_named_in_the_docs():
    text = DOCS.read_text()
    for peer in ("torchrl", "AgileRL", "stateset-rl-core", "rlox"):
        assert peer in text
