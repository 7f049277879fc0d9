"""The plug-in's advantage estimators, on verl's padded ``(B, L)`` tensors through
:mod:`mpo_rs.torch` (one trajectory per row; ``response_mask`` 1 on LLM tokens, 0 on tool
/ observation tokens and padding)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch import Tensor

from ... import estimators
from ...exceptions import InvalidBatchError
from ...torch import critic_free, padded
from .config import EstimatorOptions, estimator_options
from .values_hook import critic_values, hooked_batch

__all__ = [
    "compute_gae_advantage_return",
    "compute_mpo_bilevel_gae_advantage",
    "compute_mpo_gae_advantage",
    "compute_mpo_gigpo_advantage",
    "compute_mpo_grpo_advantage",
    "compute_mpo_mae_advantage",
    "compute_mpo_mae_grpo_advantage",
    "compute_mpo_mae_rloo_advantage",
    "compute_mpo_rloo_advantage",
    "observation_ids",
]


class _CriticEstimator:
    """An advantage estimator of the plug-in that reads the critic's ``values``, in verl's
    signature: the critic estimator ``name`` (the options of ``config`` resolved once, one
    call of :func:`mpo_rs.torch.padded.advantages` with ``observation_rewards``), named and
    documented as users and verl's registry see it."""

    def __init__(self, name: str, observation_rewards: str, doc: str) -> None:
        self.name = name
        self.observation_rewards = observation_rewards
        self.__name__ = self.__qualname__ = f"compute_{name}_advantage"
        self.__doc__ = doc

    def __call__(
        self,
        token_level_rewards: Tensor,
        response_mask: Tensor,
        config: Any = None,
        index: Any = None,
        values: Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]:
        values = critic_values(values, self.name)
        options = estimator_options(self.name, config)
        advantages, returns = padded.advantages(
            response_mask,
            token_level_rewards,
            values=values,
            observation_rewards=self.observation_rewards,
            whiten=options.whiten,
            estimator=options.estimator,
        )
        assert returns is not None  # a critic estimator's
        return advantages, returns


# lam_critic = lam (the config's): verl's returns = advantages + values.
compute_mpo_gae_advantage = _CriticEstimator(
    "mpo_gae",
    "drop",
    """``mpo_gae``: token GAE over the LLM tokens of each row, observation tokens skipped,
    as verl's ``compute_gae_advantage_return`` (``algorithm.gamma``, ``algorithm.lam``;
    returns = unwhitened advantages + values; advantages whitened unless
    ``algorithm.mpo.whiten=false``). Rewards on observation tokens are ignored, as verl's
    loop ignores them. Advantages and returns are 0 off the LLM tokens.
    """,
)

compute_mpo_mae_advantage = _CriticEstimator(
    "mpo_mae",
    "credit",
    """``mpo_mae``: multiscale advantage estimation with the critic's values.

    A turn is a run of LLM tokens in a row. Options from ``algorithm.mpo`` (:class:`MPOOptions`)
    and ``algorithm.gamma`` (discount per interaction). A reward on an observation token is
    credited to the LLM token before it. Returns are the critic's targets (``lam_critic``).
    """,
)

compute_mpo_bilevel_gae_advantage = _CriticEstimator(
    "mpo_bilevel_gae",
    "credit",
    """``mpo_bilevel_gae``: RAGEN's bi-level GAE with the critic's values, turns from the
    mask (``algorithm.gamma``, ``algorithm.lam``, ``algorithm.high_level_gamma``;
    advantages whitened unless ``algorithm.mpo.whiten=false``, as RAGEN whitens them;
    returns = unwhitened advantages + values). A reward on an observation token is credited
    to the LLM token before it (the end of the turn it answers).
    """,
)


def _group_ids(index: Any, rows: int, estimator: str) -> np.ndarray:
    if index is None:
        raise InvalidBatchError(
            f"advantage estimator {estimator!r} needs the group ids verl passes as `index` "
            "(non_tensor_batch['uid']), one per row"
        )
    # Dense codes by the group-id rule of `group_advantages` (estimators.group_codes).
    codes, _ = estimators.group_codes(index)
    if codes.shape[0] != rows:
        raise InvalidBatchError(f"`index` has {codes.shape[0]} group ids, expected {rows} (one per row)")
    return codes


def _rows(response_mask: Tensor) -> int:
    if not isinstance(response_mask, Tensor):
        raise InvalidBatchError(f"`response_mask` must be a torch.Tensor, got {type(response_mask).__name__}")
    return int(response_mask.shape[0]) if response_mask.dim() > 0 else 0


# How a critic-free estimator of the plug-in computes its (B, L) advantages from its
# options, the rewards, the mask and the rows' dense group ids.
_Grouped = Callable[[EstimatorOptions, Tensor, Tensor, np.ndarray], Tensor]


def _with_groups(name: str, advantages: _Grouped) -> Callable[..., tuple[Tensor, Tensor]]:
    """A critic-free estimator in verl's signature: the options of ``config`` resolved once,
    the group ids read from ``index``; its advantages are its returns too (as verl's)."""

    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        config: Any = None,
        index: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]:
        options = estimator_options(name, config)
        out = advantages(options, token_level_rewards, response_mask, _group_ids(index, _rows(response_mask), name))
        return out, out

    return estimator


def _group_baseline(options: EstimatorOptions, rewards: Tensor, mask: Tensor, ids: np.ndarray) -> Tensor:
    out, _ = padded.advantages(mask, rewards, group_ids=ids, whiten=options.whiten, estimator=options.estimator)
    return out


def _mae_over_group_baseline(options: EstimatorOptions, rewards: Tensor, mask: Tensor, ids: np.ndarray) -> Tensor:
    group = options.group
    assert group is not None
    batch = padded.PaddedBatch.of(mask, like=rewards)
    baseline, row_scale = critic_free.row_baselines(batch.row_scores(rewards), ids, group)
    advantages = critic_free.mae_over_baselines(
        batch, baseline, row_scale, options.estimator, rewards=batch.policy_rewards(rewards, "credit")
    )
    return batch.padded(batch.whitened(advantages) if options.whiten else advantages)


_grpo = _with_groups("mpo_grpo", _group_baseline)
_rloo = _with_groups("mpo_rloo", _group_baseline)


def compute_mpo_grpo_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: Any = None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """``mpo_grpo``: (score - group mean) / (group std + eps), or Dr. GRPO's score - group mean
    with ``algorithm.norm_adv_by_std_in_grpo=false``; broadcast to the row's LLM tokens.
    A group of one gets 0 (verl's ``grpo`` gives it its raw score)."""
    return _grpo(token_level_rewards, response_mask, config, index, **kwargs)


def compute_mpo_rloo_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: Any = None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """``mpo_rloo``: score - mean of the other rollouts of the group, as verl's ``rloo``.
    A group of one gets 0 (verl's ``rloo`` gives it its raw score)."""
    return _rloo(token_level_rewards, response_mask, config, index, **kwargs)


_mae_grpo = _with_groups("mpo_mae_grpo", _mae_over_group_baseline)
_mae_rloo = _with_groups("mpo_mae_rloo", _mae_over_group_baseline)


def compute_mpo_mae_grpo_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: Any = None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """``mpo_mae_grpo``: critic-free MAE. The value of every token of a row is its group's
    mean score; advantages are divided by (group std + eps) unless
    ``algorithm.norm_adv_by_std_in_grpo=false``. With ``algorithm.mpo.lam=1`` and
    ``beta=0`` (and an outcome reward) this is GRPO. A group of one gets 0."""
    return _mae_grpo(token_level_rewards, response_mask, config, index, **kwargs)


def compute_mpo_mae_rloo_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: Any = None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """``mpo_mae_rloo``: critic-free MAE with each row's value the mean score of the other
    rollouts of its group. With ``lam=1``, ``beta=0`` this is RLOO. A group of one gets 0."""
    return _mae_rloo(token_level_rewards, response_mask, config, index, **kwargs)


def compute_mpo_gigpo_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    config: Any = None,
    index: Any = None,
    anchor_obs: Any = None,
    token_ids: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """``mpo_gigpo``: GiGPO (verl-agent's ``gigpo``; docs/estimators.md, "GiGPO") over the
    plug-in's rows, one trajectory per row and its turns the runs of LLM tokens: the episode
    baseline over the rows of one ``uid`` group plus the step baseline over the group's
    turns that start from the same anchor state, ``A_E + w * A_S`` on each turn's tokens.

    Anchor states: verl-agent's ``anchor_obs`` (``non_tensor_batch["anchor_obs"]``: one
    observation per row whose row is one turn, else a sequence of one observation per turn),
    each observation hashed to a 64-bit id (equal observations, one id); else the rows'
    token ids (``batch["responses"]``, aligned with ``response_mask``), hashed per
    ``algorithm.mpo.anchor``. Inside verl's ``compute_advantage`` the values hook hands the
    batch over; called directly, pass ``anchor_obs=`` or ``token_ids=``. A reward on an
    observation token is credited to the LLM token before it. No critic: the advantages are
    the returns too."""
    name = "mpo_gigpo"
    options = estimator_options(name, config)
    ids = _group_ids(index, _rows(response_mask), name)
    data = hooked_batch()
    if anchor_obs is None and token_ids is None and data is not None:
        anchor_obs = data.non_tensor_batch.get("anchor_obs")
        if anchor_obs is None and "responses" in data.batch.keys():
            token_ids = data.batch["responses"]
    if anchor_obs is not None:
        anchors: dict[str, Any] = {"turn_state_ids": observation_ids(anchor_obs, response_mask)}
    elif token_ids is not None:
        anchors = {"token_ids": token_ids}
    else:
        raise InvalidBatchError(
            f"advantage estimator {name!r} needs anchor states: verl-agent's non_tensor_batch['anchor_obs'] or "
            "the rows' token ids (batch['responses']); called outside verl's compute_advantage, pass "
            "anchor_obs= or token_ids="
        )
    out, _ = padded.advantages(
        response_mask,
        token_level_rewards,
        group_ids=ids,
        observation_rewards="credit",
        whiten=options.whiten,
        estimator=options.estimator,
        **anchors,
    )
    return out, out


def observation_ids(anchor_obs: Any, response_mask: Tensor) -> list[list[int]]:
    """One int64 id per turn of each row from verl-agent's ``anchor_obs``: a row with one
    turn takes its observation as it is, a row with several a sequence of one per turn.
    Ids are dense, in order of first appearance, and keyed by the observations' content
    (:func:`observation_key`): equal observations get one id, distinct ones distinct ids
    (no hash, no ``repr``, which numpy abbreviates for arrays over 1,000 elements)."""
    mask = response_mask.detach().cpu().numpy() != 0
    starts = mask.copy()
    starts[:, 1:] &= ~mask[:, :-1]
    counts = starts.sum(axis=1)
    if len(anchor_obs) != len(counts):
        raise InvalidBatchError(f"`anchor_obs` has {len(anchor_obs)} entries, expected {len(counts)} (one per row)")
    table: dict[bytes, int] = {}
    out = []
    for row, (obs, turns) in enumerate(zip(anchor_obs, counts, strict=True)):
        many = isinstance(obs, (list, tuple)) or (isinstance(obs, np.ndarray) and obs.dtype == object)
        per_turn = [] if turns == 0 else list(obs) if many and turns != 1 else [obs]
        if len(per_turn) != turns:
            raise InvalidBatchError(
                f"row {row}: `anchor_obs` gives {len(per_turn)} observation(s) but the row has {turns} turns "
                "(runs of response_mask == 1): one observation for a one-turn row, else one per turn"
            )
        ids = []
        for turn, o in enumerate(per_turn):
            key = observation_key(o, f"row {row}, turn {turn}")
            ids.append(table.setdefault(key, len(table)))
        out.append(ids)
    return out


def observation_key(obs: Any, where: str) -> bytes:
    """An observation's content as bytes, equal exactly when the observations are equal:
    each value tagged with its kind and length-prefixed, so no two contents share a key.
    Strings (UTF-8), bytes, None, bools, ints and floats (by value, each of its kind);
    numpy arrays and CPU tensors by dtype, shape and elements (an object array element by
    element); lists, tuples and dicts (their items in sorted key order) by their elements.
    Anything else raises ``InvalidBatchError`` naming ``where``: its ``repr`` or bytes may
    hold an address, splitting equal observations."""
    parts: list[bytes] = []
    _encode(obs, parts, where)
    return b"".join(parts)


def _tagged(parts: list[bytes], tag: bytes, data: bytes) -> None:
    parts += [tag, len(data).to_bytes(8, "little"), data]


def _encode(obs: Any, parts: list[bytes], where: str) -> None:
    if isinstance(obs, Tensor):
        obs = obs.detach().cpu().numpy()
    if isinstance(obs, np.generic) and obs.dtype != object:
        obs = obs.item()
    if not _encode_scalar(obs, parts):
        _encode_container(obs, parts, where)


def _encode_scalar(obs: Any, parts: list[bytes]) -> bool:
    """Encodes a scalar observation (None, str, bytes, bool, int, float); False otherwise."""
    if obs is None:
        parts.append(b"n")
    elif isinstance(obs, str):
        _tagged(parts, b"s", obs.encode("utf-8", "surrogatepass"))
    elif isinstance(obs, (bytes, bytearray)):
        _tagged(parts, b"b", bytes(obs))
    elif isinstance(obs, bool):
        parts.append(b"T" if obs else b"F")
    elif isinstance(obs, int):
        _tagged(parts, b"i", str(obs).encode())
    elif isinstance(obs, float):
        _tagged(parts, b"f", (obs + 0.0).hex().encode())  # -0.0 == 0.0
    else:
        return False
    return True


def _encode_container(obs: Any, parts: list[bytes], where: str) -> None:
    if isinstance(obs, np.ndarray) and obs.dtype != object:
        _tagged(parts, b"a", f"{obs.dtype.str}{obs.shape}".encode())
        _tagged(parts, b"d", np.ascontiguousarray(obs).tobytes())
    elif isinstance(obs, np.ndarray):
        _tagged(parts, b"o", str(obs.shape).encode())
        for x in obs.reshape(-1):
            _encode(x, parts, where)
    elif isinstance(obs, (list, tuple)):
        _tagged(parts, b"l" if isinstance(obs, list) else b"t", str(len(obs)).encode())
        for x in obs:
            _encode(x, parts, where)
    elif isinstance(obs, dict):
        items = sorted((observation_key(k, where), v) for k, v in obs.items())
        _tagged(parts, b"m", str(len(items)).encode())
        for k, v in items:
            _tagged(parts, b"k", k)
            _encode(v, parts, where)
    else:
        raise InvalidBatchError(
            f"`anchor_obs` at {where} is a {type(obs).__name__}: observations must be strings, bytes, numbers, "
            "numpy arrays or tensors, or lists, tuples and dicts of them (compared by content)"
        )


def compute_gae_advantage_return(
    token_level_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Same signature and results (on LLM tokens) as verl's
    ``core_algos.compute_gae_advantage_return``, computed by ``mpo_gae``: a replacement for
    code that calls verl's function directly."""
    config = {"gamma": gamma, "lam": lam}  # judged by the options table, as from verl's config
    return compute_mpo_gae_advantage(token_level_rewards, response_mask, config, values=values)
