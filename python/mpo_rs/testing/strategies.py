"""Hypothesis strategies for random multi-turn batches, in the layouts trainers hold.

A :class:`Batch` is the flat layout of docs/spec.md ("Batch layout"): N trajectories laid
end to end, ``offsets`` cutting them, ``mask`` marking the policy's tokens; each maximal
run of policy tokens is a turn. With it come values (NaN on non-policy tokens: they are
never to be read), token rewards, per-trajectory scores and, when asked for, per-turn
rewards, truncation flags, group ids and anchor states. :func:`to_padded` lays a batch out
as the padded ``(B, L)`` tensors of verl, TRL and OpenRLHF (left or right padding, the mask
under each framework's name) and :func:`from_padded` reads a padded result back.

* :func:`batches` -- flat batches, with size knobs and the optional fields;
* :func:`group_batches` -- batches for the group estimators (scores, group ids);
* :func:`padded_batches` -- ``(Batch, PaddedBatch)`` pairs;
* :func:`trajectory` and :func:`edge_trajectory` -- one trajectory's mask, random or one of
  the edge layouts (:data:`EDGE_LAYOUTS`): one-token turns, an observation-only row, a
  trajectory ending on an observation, an empty one;
* :data:`mae_params`, :data:`gae_params` -- the estimators' options, γ and λ below 1
  included.

Importing it registers the hypothesis profiles ``mpo-rs-ci`` (deterministic, for CI) and
``mpo-rs-fuzz`` (:func:`hypothesis_settings`). Needs the ``testing`` extra (hypothesis); without it, importing this module raises
:class:`mpo_rs.MissingDependencyError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .._deps import needs
from ..exceptions import InvalidBatchError, InvalidOptionError

with needs("mpo_rs.testing.strategies", "testing"):
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st

__all__ = [
    "EDGE_LAYOUTS",
    "MASK_NAMES",
    "PROFILES",
    "Batch",
    "PaddedBatch",
    "batches",
    "edge_trajectory",
    "finite",
    "from_padded",
    "gae_params",
    "group_batches",
    "hypothesis_settings",
    "mae_params",
    "padded_batches",
    "to_padded",
    "trajectory",
]

PROFILES: dict[str, dict[str, Any]] = {
    "ci": {"max_examples": 40, "derandomize": True},
    "fuzz": {"max_examples": 1000, "derandomize": False},
}
"""The examples per invariant and whether they are the same on every run, per profile."""

PROFILE_ENV = "MPO_RS_TESTING_PROFILE"


def hypothesis_settings(profile: str = "ci", max_examples: int | None = None) -> settings:
    """The hypothesis settings of a profile of :data:`PROFILES` (no deadline, no example
    database, every health check off: the function under test may be slow)."""
    if profile not in PROFILES:
        raise InvalidOptionError(f"unknown profile {profile!r}; the profiles are: {', '.join(PROFILES)}")
    p = PROFILES[profile]
    return settings(
        max_examples=max_examples or p["max_examples"],
        derandomize=p["derandomize"],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
    )


for _name in PROFILES:
    settings.register_profile(f"mpo-rs-{_name}", hypothesis_settings(_name))


F32 = npt.NDArray[np.float32]
Draw = Callable[[st.SearchStrategy[Any]], Any]


@dataclass
class Batch:
    """A flat multi-turn batch (docs/spec.md, "Batch layout")."""

    values: F32
    """float32 per token; NaN on non-policy tokens (never read)."""
    mask: npt.NDArray[np.bool_]
    """bool per token: the policy produced it."""
    offsets: npt.NDArray[np.int64]
    """int64, N + 1: trajectory j is ``offsets[j]:offsets[j+1]``."""
    rewards: F32
    """float32 per token, 0 off-policy."""
    scores: F32
    """float32 per trajectory (the other reward source)."""
    turn_rewards: list[list[float]] | None = None
    """One reward per turn of each trajectory (the third reward source), when drawn."""
    truncated: npt.NDArray[np.bool_] | None = None
    """bool per trajectory: cut off before its end (bootstraps), when drawn."""
    group_ids: npt.NDArray[np.int64] | None = None
    """int64 per trajectory: rollouts of one prompt share an id, when drawn."""
    turn_state_ids: list[list[int]] | None = None
    """One anchor-state id per turn of each trajectory (GiGPO), when drawn."""

    @property
    def n(self) -> int:
        """The number of trajectories."""
        return len(self.offsets) - 1

    def turn_counts(self) -> list[int]:
        """The number of turns of each trajectory."""
        counts = []
        for j in range(self.n):
            m = self.mask[self.offsets[j] : self.offsets[j + 1]]
            counts.append(int(np.count_nonzero(m[1:] & ~m[:-1]) + (m.size > 0 and m[0])))
        return counts

    def turn_ends(self) -> list[list[int]]:
        """The flat index one past each turn's last token, per trajectory."""
        out: list[list[int]] = []
        for j in range(self.n):
            lo, hi = int(self.offsets[j]), int(self.offsets[j + 1])
            m = self.mask
            out.append([q + 1 for q in range(lo, hi) if m[q] and (q + 1 == hi or not m[q + 1])])
        return out

    def with_turn_rewards_as_tokens(self) -> Batch:
        """The same batch with ``turn_rewards`` placed as token rewards on each turn's last
        token (how a token-reward trainer holds them; docs/estimators.md)."""
        if self.turn_rewards is None:
            return self
        rewards = np.zeros_like(self.rewards)
        for ends, rs in zip(self.turn_ends(), self.turn_rewards, strict=True):
            for end, r in zip(ends, rs, strict=True):
                rewards[end - 1] = r
        return replace(self, rewards=rewards, turn_rewards=None)


finite = st.floats(-4, 4, allow_nan=False, width=32)
"""A moderate float32: rewards, values and scores."""

# Scores on a grid of quarters: group statistics of float32 scores that differ by a few
# ulps are ill-conditioned (a std near 0), which tests rounding, not an estimator.
grid = st.integers(-8, 8).map(lambda k: k / 4)

EDGE_LAYOUTS: dict[str, list[int]] = {
    "empty": [],
    "observation-only": [0, 0, 0],
    "one-token-turns": [0, 1, 0, 1, 0, 1],
    "ends-on-observation": [0, 1, 1, 0, 0],
    "starts-on-policy": [1, 1, 0, 1],
    "single-token": [1],
}
"""The edge layouts :func:`edge_trajectory` draws from: each a mask (1 policy, 0 not)."""


@st.composite
def trajectory(draw: Draw, max_runs: int = 6, max_run: int = 6) -> list[int]:
    """A mask: alternating observation and policy runs, possibly none (an empty
    trajectory), starting on either."""
    mask: list[int] = []
    policy = draw(st.booleans())
    for _ in range(draw(st.integers(0, max_runs))):
        mask += [int(policy)] * draw(st.integers(1, max_run))
        policy = not policy
    return mask


def edge_trajectory() -> st.SearchStrategy[list[int]]:
    """One of :data:`EDGE_LAYOUTS`."""
    return st.sampled_from(list(EDGE_LAYOUTS.values()))


@st.composite
def batches(
    draw: Draw,
    max_traj: int = 6,
    dense_rewards: bool | None = None,
    *,
    min_traj: int = 0,
    max_runs: int = 6,
    max_run: int = 6,
    edges: bool = False,
    turn_rewards: bool = False,
    truncation: bool = False,
    groups: int | None = None,
    anchors: int | None = None,
    min_policy: int = 0,
) -> Batch:
    """A flat batch of ``min_traj`` to ``max_traj`` trajectories, each of up to ``max_runs``
    alternating runs of up to ``max_run`` tokens.

    ``dense_rewards``: a reward on every policy token (True), one terminal reward on each
    trajectory's last policy token (False), either (None). ``edges``: a trajectory is one
    of :data:`EDGE_LAYOUTS` a third of the time. ``turn_rewards``: also draw one reward per
    turn. ``truncation``: draw truncation flags. ``groups``: draw group ids from a range
    of ``2 * groups`` ids, so some ids name no trajectory and some groups are singletons
    (and with ``edges``, some hold only trajectories without a policy token). ``anchors``:
    draw one anchor-state id per turn from ``range(anchors)``. ``min_policy``: a batch with
    fewer policy tokens gets one more trajectory, a turn of the missing ones (for a function
    that refuses smaller batches, such as a whitening one).
    """
    one = st.one_of(trajectory(max_runs, max_run), edge_trajectory()) if edges else trajectory(max_runs, max_run)
    masks = draw(st.lists(one, min_size=min_traj, max_size=max_traj))
    missing = min_policy - sum(sum(m) for m in masks)
    if missing > 0:
        masks.append([1] * missing)
    mask = np.array([m for traj in masks for m in traj], dtype=bool)
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in masks])]).astype(np.int64)
    n_tok = len(mask)
    values = np.array(draw(st.lists(finite, min_size=n_tok, max_size=n_tok)), dtype=np.float32)
    values[~mask] = np.nan
    dense = draw(st.booleans()) if dense_rewards is None else dense_rewards
    if dense:
        rewards = np.array(draw(st.lists(finite, min_size=n_tok, max_size=n_tok)), dtype=np.float32)
        rewards[~mask] = 0.0
    else:  # one terminal reward on each trajectory's last policy token
        rewards = np.zeros(n_tok, dtype=np.float32)
        for j in range(len(masks)):
            pol = np.flatnonzero(mask[offsets[j] : offsets[j + 1]])
            if pol.size:
                rewards[offsets[j] + pol[-1]] = draw(finite)
    scores = np.array(draw(st.lists(finite, min_size=len(masks), max_size=len(masks))), dtype=np.float32)
    b = Batch(values, mask, offsets, rewards, scores)
    counts = b.turn_counts()
    if turn_rewards:
        b.turn_rewards = [draw(st.lists(finite, min_size=k, max_size=k)) for k in counts]
    if truncation:
        b.truncated = np.array(draw(st.lists(st.booleans(), min_size=b.n, max_size=b.n)), dtype=bool)
    if groups is not None:
        ids = draw(st.lists(st.integers(0, 2 * max(groups, 1) - 1), min_size=b.n, max_size=b.n))
        b.group_ids = np.array(ids, dtype=np.int64)
    if anchors is not None:
        b.turn_state_ids = [draw(st.lists(st.integers(0, max(anchors, 1) - 1), min_size=k, max_size=k)) for k in counts]
    return b


@st.composite
def group_batches(draw: Draw, max_traj: int = 8, groups: int = 3, edges: bool = True, min_group: int = 1) -> Batch:
    """A batch for the group estimators: group ids, and each trajectory's score (on the grid
    of quarters) as its one token reward on its last policy token; a trajectory without a
    policy token scores 0 (a padded trainer's row sum). ``min_group``: every group has at
    least that many trajectories (2: no group of one, as GRPO is run)."""
    b: Batch = draw(
        batches(
            max(max_traj, min_group),
            dense_rewards=False,
            edges=edges,
            groups=groups,
            max_runs=4,
            max_run=3,
            min_traj=min_group if min_group > 1 else 0,
        )
    )
    if min_group > 1 and b.n:
        k = draw(st.integers(1, b.n // min_group))
        order = draw(st.permutations(list(range(b.n))))
        b.group_ids = np.array([2 * (order[j] % k) + 1 for j in range(b.n)], dtype=np.int64)
    b.rewards[:] = 0.0
    for j in range(b.n):
        pol = np.flatnonzero(b.mask[b.offsets[j] : b.offsets[j + 1]])
        b.scores[j] = draw(grid) if pol.size else 0.0
        if pol.size:
            b.rewards[b.offsets[j] + pol[-1]] = b.scores[j]
    return b


MASK_NAMES: dict[str, str] = {
    "verl": "response_mask",
    "trl": "completion_mask",
    "openrlhf": "action_mask",
}
"""The name each framework gives the policy-token mask of its padded batch."""


@dataclass
class PaddedBatch:
    """A batch laid out as ``(B, L)`` rows, one per trajectory, padded on one side."""

    token_level_rewards: F32
    values: F32
    """The values, with ``fill`` on non-policy tokens and padding."""
    mask: npt.NDArray[np.bool_]
    """The policy tokens (verl's ``response_mask``: see :data:`MASK_NAMES`)."""
    attention_mask: npt.NDArray[np.bool_]
    """The tokens of the trajectory (not padding)."""
    rows: npt.NDArray[np.int64]
    """Per flat token of the batch: its row."""
    cols: npt.NDArray[np.int64]
    """Per flat token of the batch: its column."""
    padding_side: Literal["left", "right"] = "right"
    extra: dict[str, Any] = field(default_factory=dict)

    def named(self, framework: str) -> dict[str, Any]:
        """The arrays under ``framework``'s names (a key of :data:`MASK_NAMES`)."""
        return {
            "token_level_rewards": self.token_level_rewards,
            "values": self.values,
            MASK_NAMES[framework]: self.mask,
            "attention_mask": self.attention_mask,
        }


def to_padded(
    b: Batch, *, padding_side: Literal["left", "right"] = "right", extra: int = 0, fill: float = 0.0
) -> PaddedBatch:
    """``b`` as padded ``(N, L)`` rows, L the longest trajectory plus ``extra`` columns of
    padding; ``fill`` is the value on padding and on the tokens whose value is NaN (the
    non-policy tokens: a padded trainer holds some finite number there)."""
    lengths = np.diff(b.offsets)
    width = int(lengths.max(initial=0)) + extra
    rows = np.repeat(np.arange(b.n, dtype=np.int64), lengths)
    within = np.arange(len(b.mask), dtype=np.int64) - np.repeat(b.offsets[:-1], lengths)
    cols = within + (width - lengths[rows] if padding_side == "left" else 0)
    shape = (b.n, width)
    mask = np.zeros(shape, bool)
    attention = np.zeros(shape, bool)
    values = np.full(shape, fill, np.float32)
    rewards = np.zeros(shape, np.float32)
    mask[rows, cols] = b.mask
    attention[rows, cols] = True
    values[rows, cols] = np.where(np.isnan(b.values), np.float32(fill), b.values)
    rewards[rows, cols] = b.rewards
    return PaddedBatch(rewards, values, mask, attention, rows, cols, padding_side)


def from_padded(array: Any, padded: PaddedBatch) -> npt.NDArray[np.float64]:
    """A padded ``(B, L)`` result (numpy, or anything ``np.asarray`` reads, a CPU tensor)
    read back as one float64 per flat token of the batch."""
    a = np.asarray(array, dtype=np.float64)
    if a.shape != padded.mask.shape:
        raise InvalidBatchError(
            f"a padded result has shape {a.shape}, expected {padded.mask.shape} (the batch's (B, L))"
        )
    return a[padded.rows, padded.cols]


@st.composite
def padded_batches(
    draw: Draw, max_traj: int = 6, sides: Sequence[Literal["left", "right"]] = ("right", "left"), max_extra: int = 3
) -> tuple[Batch, PaddedBatch]:
    """A flat batch and its padded layout: a padding side of ``sides``, up to
    ``max_extra`` extra columns, a random finite fill on non-policy tokens."""
    b = draw(batches(max_traj, edges=True))
    side = draw(st.sampled_from(list(sides)))
    return b, to_padded(b, padding_side=side, extra=draw(st.integers(0, max_extra)), fill=draw(finite))


unit = st.floats(0.0, 1.0)
mae_params = st.fixed_dictionaries(
    {
        "lam": unit,
        "lam_intra": unit,
        "beta": st.floats(0.0, 2.0),
        "gamma": st.floats(0.05, 1.0),
        "lam_critic": unit,
    }
)
"""MAE's options: λ, λ_intra, β, γ and λ_critic over their domains."""
gae_params = st.fixed_dictionaries({"gamma": st.floats(0.05, 1.0), "lam": unit, "lam_critic": unit})
"""Token GAE's options: γ, λ and λ_critic over their domains."""
