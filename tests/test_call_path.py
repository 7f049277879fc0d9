"""The one call path (``mpo_rs.advantages``, ``mpo_rs.torch.padded.advantages``) and the
functions of each family, its aliases: their outputs are pinned bitwise (sha256 of the
arrays, taken from the family functions before they became aliases) and equal each other."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import mpo_rs
from mpo_rs import Estimator, InvalidBatchError, InvalidOptionError, MissingCriticValuesError

torch = pytest.importorskip("torch")
from mpo_rs.torch import padded  # noqa: E402

PINNED = {
    "np mae scores": "8906dd652f3384603218aa00240ae8ad",
    "np mae rewards": "1fd3b85f63af5ea801c5357a0f0bb7d6",
    "np mae turn_rewards": "790e783688edb3dc525c64d719e37c44",
    "np mae truncated": "c7f11d3bf2f8a71b817cc852d9e92a88",
    "np gae scores": "9e034a3b849bd01e77d8f7fbec832efb",
    "np gae rewards": "b8ecc265905973a5acab4b1822841e92",
    "np gae turn_rewards": "52008193b6ac48afd6043665190ec165",
    "np gae truncated": "48a0e8cbaa02ec49d678531817eb4b48",
    "np bilevel scores": "2a6047059d19c8dbf16599b2c79180e2",
    "np bilevel rewards": "8c3d609a2ad8382482f25d54806ba6f4",
    "np bilevel turn_rewards": "9d9451cf085f055c33f01df9a064482d",
    "np mae options": "8a7c29ba8d10c8943e74ceb9b38732fc",
    "np gae alpha": "61de2b2e46ae0cabb763e3aefd133fa1",
    "np bilevel options": "f5118c2ebbcec52f4717e5c36c6992b3",
    "np grpo": "e4e9a3558945bc7822f64ffc3c53b621",
    "np drgrpo": "831331dc385ab26abe71b89de7419a5b",
    "np rloo": "21c014b74e874b066c1f60164a0e4080",
    "torch mae rewards": "2c1cca2c9f982ee579bcb45a4c807200",
    "torch mae credit whiten": "4265d2a3e1d28a9253c5dcd250ca28be",
    "torch mae scores": "15f7a06dad00564f0f50a00860c04445",
    "torch gae rewards": "b8ecc265905973a5acab4b1822841e92",
    "torch gae credit whiten": "82ae804d3f7b10fcfa90fb62c6f3b359",
    "torch gae scores": "9e034a3b849bd01e77d8f7fbec832efb",
    "torch bilevel rewards": "46671a68b5a4f155820de5b4371ab0b3",
    "torch bilevel credit whiten": "ed7482373de71b94e4c006af1fa213f8",
    "torch bilevel scores": "3e31f4a7e649ae99d6e2989c04a37c91",
    "torch mae truncated": "50f3c8c89ab1db7f3ad3715d8a86c4bb",
    "torch grpo": "8e70ea6bd8cd23697e7de6fda2751b9a",
    "torch grpo whiten scores": "74fad086457f22869a2d7e043689371b",
    "torch rloo": "74b14dbfbd6b81fab76f841e34297ca9",
    "torch rloo whiten scores": "3deda129c7becf261c751a2db902452b",
}


def batch():
    rng = np.random.default_rng(28)
    n, L = 12, 40
    mask = (rng.random((n, L)) < 0.6).astype(np.uint8)
    mask[:, 0] = 1
    rewards = (rng.standard_normal((n, L)) * mask).astype(np.float32)
    values = rng.standard_normal((n, L)).astype(np.float32)
    scores = rng.standard_normal(n).astype(np.float32)
    truncated = rng.random(n) < 0.5
    groups = np.repeat(np.arange(3), 4)
    return mask, rewards, values, scores, truncated, groups


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        h.update(str(a.dtype).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:32]


def digests():
    mask, rewards, values, scores, truncated, groups = batch()
    n, L = mask.shape
    offsets = np.arange(n + 1, dtype=np.int64) * L
    fm, fr, fv = mask.reshape(-1), rewards.reshape(-1), values.reshape(-1)
    turns = mpo_rs.segment_turns(fm, offsets)
    per_traj = np.diff(turns.traj_offsets)
    rng = np.random.default_rng(5)
    turn_rewards = [rng.standard_normal(int(k)).astype(np.float32) for k in per_traj]
    tsum = np.array([t.sum() for t in turn_rewards], np.float32)

    def res(r):
        return [getattr(r, k) for k in ("advantages", "returns", "turn_advantages") if hasattr(r, k)]

    out = {}
    for est in ("mae", "gae", "bilevel"):
        f = getattr(mpo_rs, f"{est}_advantages")
        out[f"np {est} scores"] = res(f(fv, fm, offsets, scores=scores))
        out[f"np {est} rewards"] = res(f(fv, fm, offsets, rewards=fr))
        out[f"np {est} turn_rewards"] = res(f(fv, fm, offsets, turn_rewards=turn_rewards, check_scores=tsum))
        if est != "bilevel":
            out[f"np {est} truncated"] = res(f(fv, fm, offsets, rewards=fr, truncated=truncated))
    out["np mae options"] = res(mpo_rs.mae_advantages(fv, fm, offsets, scores=scores, lam=0.7, beta=0.5, gamma=0.9))
    out["np gae alpha"] = res(mpo_rs.gae_advantages(fv, fm, offsets, scores=scores, length_adaptive_alpha=0.05))
    out["np bilevel options"] = res(
        mpo_rs.bilevel_advantages(fv, fm, offsets, scores=scores, high_level_gamma=0.8, lam=0.9)
    )
    for est in ("grpo", "drgrpo", "rloo"):
        out[f"np {est}"] = [mpo_rs.group_advantages(scores, groups, estimator=est)]
    tm, tr, tv = torch.from_numpy(mask.astype(bool)), torch.from_numpy(rewards), torch.from_numpy(values)
    tro = tr.clone()
    tro[:, -1] += 0.5  # rewards on observation tokens
    for est in ("mae", "gae", "bilevel"):
        f = getattr(padded, f"{est}_advantages")
        out[f"torch {est} rewards"] = list(f(tv, tm, tr))
        out[f"torch {est} credit whiten"] = list(f(tv, tm, tro, observation_rewards="credit", whiten=True))
        out[f"torch {est} scores"] = list(f(tv, tm, scores=torch.from_numpy(scores)))
    out["torch mae truncated"] = list(padded.mae_advantages(tv, tm, tr, truncated=torch.from_numpy(truncated)))
    for est in ("grpo", "rloo"):
        out[f"torch {est}"] = [padded.group_advantages(tr, tm, groups, estimator=est)]
        out[f"torch {est} whiten scores"] = [
            padded.group_advantages(None, tm, groups, scores=scores, whiten=True, estimator=est)
        ]
    return {k: digest(*v) for k, v in out.items()}, out


def test_every_layer_is_bitwise_what_it_was():
    got, _ = digests()
    assert got == PINNED


def test_the_one_entry_equals_each_family_function():
    mask, rewards, values, scores, _, groups = batch()
    n, length = mask.shape
    offsets = np.arange(n + 1, dtype=np.int64) * length
    fm, fr, fv = mask.reshape(-1), rewards.reshape(-1), values.reshape(-1)
    for name in ("mae", "gae", "bilevel"):
        alias = getattr(mpo_rs, f"{name}_advantages")(fv, fm, offsets, rewards=fr, lam=0.9)
        one = mpo_rs.advantages(fm, offsets, values=fv, rewards=fr, estimator=name, lam=0.9)
        assert one.estimator == Estimator(name, lam=0.9)
        assert one.advantages.tobytes() == alias.advantages.tobytes()
        assert one.returns is not None and one.returns.tobytes() == alias.returns.tobytes()
        assert one.per_trajectory is None
        if name == "gae":
            assert one.turns is None and one.turn_advantages is None
        else:
            assert one.turn_advantages is not None and one.turn_advantages.tobytes() == alias.turn_advantages.tobytes()
    for name in ("grpo", "drgrpo", "rloo"):
        one = mpo_rs.advantages(fm, offsets, scores=scores, group_ids=groups, estimator=name)
        per = mpo_rs.group_advantages(scores, groups, estimator=name)
        assert one.per_trajectory is not None and one.per_trajectory.tobytes() == per.tobytes()
        assert one.advantages.tobytes() == mpo_rs.broadcast_to_tokens(per, fm, offsets).tobytes()
        assert one.returns is None and one.turns is None
        t_adv, t_ret = padded.advantages(
            torch.from_numpy(mask), torch.from_numpy(rewards), group_ids=groups, estimator=name
        )
        assert t_ret is None
        assert torch.equal(
            t_adv, padded.group_advantages(torch.from_numpy(rewards), torch.from_numpy(mask), groups, estimator=name)
        )


def test_the_one_entry_refuses_what_the_estimator_lacks_or_would_not_read():
    mask, rewards, values, scores, truncated, groups = batch()
    n, length = mask.shape
    offsets = np.arange(n + 1, dtype=np.int64) * length
    fm, fr, fv = mask.reshape(-1), rewards.reshape(-1), values.reshape(-1)
    with pytest.raises(MissingCriticValuesError, match="the mae estimator needs the critic's `values`"):
        mpo_rs.advantages(fm, offsets, rewards=fr)
    with pytest.raises(InvalidOptionError, match="`truncated` does not apply to the bilevel estimator"):
        mpo_rs.advantages(fm, offsets, values=fv, rewards=fr, truncated=truncated, estimator="bilevel")
    with pytest.raises(InvalidOptionError, match="`group_ids` do not apply to the gae estimator"):
        mpo_rs.advantages(fm, offsets, values=fv, rewards=fr, group_ids=groups, estimator="gae")
    with pytest.raises(InvalidOptionError, match="`values` does not apply to the group estimators"):
        mpo_rs.advantages(fm, offsets, values=fv, scores=scores, group_ids=groups, estimator="grpo")
    with pytest.raises(InvalidBatchError, match="the group estimators need `group_ids`"):
        mpo_rs.advantages(fm, offsets, scores=scores, estimator="rloo")
    with pytest.raises(InvalidBatchError, match="read one score per trajectory: give `scores`"):
        mpo_rs.advantages(fm, offsets, rewards=fr, group_ids=groups, estimator="grpo")
    with pytest.raises(InvalidBatchError, match=r"`group_ids` has length 3, expected 12 \(one per trajectory\)"):
        mpo_rs.advantages(fm, offsets, scores=scores, group_ids=[0, 1, 2], estimator="grpo")
    with pytest.raises(InvalidOptionError, match="bilevel_advantages computes the bilevel estimator; got the gae"):
        mpo_rs.bilevel_advantages(fv, fm, offsets, rewards=fr, estimator="gae")
    with pytest.raises(MissingCriticValuesError, match="the gae estimator needs the critic's `values`"):
        padded.advantages(torch.from_numpy(mask), torch.from_numpy(rewards), estimator="gae")
