"""A hypothesis fuzzer of the Python API's stateful objects (the fuzzer of the estimator calls is
tests/test_fuzz_api.py, whose settings and helpers it shares): LearnerConfig's fields give a config or an InvalidOptionError, and an accepted config
trains a step; GroupStatistics' scan and merge under random block splits and id types equal
a one-pass reference.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import warnings

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from test_fuzz_api import fuzz_settings

import mpo_rs

# ----------------------------------------------------------------- the learner's config

_HAS_TORCH = importlib.util.find_spec("torch") is not None

# Values of every kind a config file or a command line might hand over: numbers of both
# signs and none, non-finite, huge, bools, numpy scalars, strings, containers, objects.
_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.sampled_from([0, 1, 2, -1, 10**400, np.int64(4), np.True_, np.float32(0.5)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.5, -0.5, 2.5, math.nan, math.inf, -math.inf, 1e-300, 1e300]),
    st.sampled_from(["", "mae", "gae", "rloo", "vapo", "turn", "token", "whiten", "none", "product", "cpu", "1"]),
    st.sampled_from(["token-mean", "seq-mean-token-sum", "sequence", "geo_mean", "gpu0", "cpu:0"]),
    st.sampled_from([[], [1], {"lam": 0.9}, object(), b"mae", (0.2,)]),
)


def _learner_field_values():
    """Up to 4 fields, each set to a value it accepts or to anything (``_ANY_VALUE``)."""
    from mpo_rs.torch import learner_config as lc
    from mpo_rs.torch.losses import AGGREGATIONS, RATIO_MODES, TURN_RATIOS

    def unit(lo, hi):
        return st.floats(lo, hi, allow_nan=False)

    valid = {
        "estimator": st.one_of(
            st.sampled_from(mpo_rs.Estimator.names()),
            st.sampled_from([mpo_rs.Estimator(n) for n in mpo_rs.Estimator.names()]),
            st.builds(lambda lam, beta: mpo_rs.Estimator("mae", lam=lam, beta=beta), unit(0, 1), unit(0, 3)),
        ),
        "advantage_scale": st.sampled_from(lc.ADVANTAGE_SCALES),
        "ratio": st.sampled_from((None, *RATIO_MODES)),
        "turn_ratio": st.sampled_from(TURN_RATIOS),
        "clip_low": unit(0, 0.99),
        "clip_high": unit(0, 10),
        "dual_clip": st.one_of(st.none(), unit(1.01, 10)),
        "log_ratio_clamp": unit(0.01, 50),
        "agg": st.sampled_from(AGGREGATIONS),
        "value_clip": st.one_of(st.none(), unit(0.01, 10)),
        "entropy_coef": unit(-1, 1),
        "ppo_epochs": st.integers(1, 3),
        "minibatch_size": st.integers(1, 8),
        "micro_batch_size": st.one_of(st.none(), st.integers(1, 8)),
        "max_grad_norm": st.one_of(st.none(), unit(1e-3, 10)),
        "bf16": st.booleans(),
        "temperature": unit(0.1, 5),
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**64),
        "device": st.sampled_from([None, "cpu"]),
        "critic_epochs": st.one_of(st.none(), st.integers(1, 3)),
    }
    assert valid.keys() == {f.name for f in dataclasses.fields(lc.LearnerConfig)}
    return st.lists(st.sampled_from(sorted(valid)), max_size=4, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: st.one_of(valid[n], _ANY_VALUE) for n in names})
    )


@pytest.mark.skipif(not _HAS_TORCH, reason="needs torch")
@fuzz_settings
@given(data=st.data())
def test_learner_config_fields_give_a_config_or_an_invalid_option_error(data):
    """Random values per LearnerConfig field (wrong types, NaN, inf, negatives, bools): a
    valid config whose fields have their kinds, or InvalidOptionError, never another
    exception; an accepted config on the CPU also trains one step."""
    import torch

    from mpo_rs.torch.learner import Learner, LearnerConfig, RolloutBatch

    kwargs = data.draw(_learner_field_values(), label="fields")
    try:
        config = LearnerConfig(**kwargs)
    except mpo_rs.InvalidOptionError as e:
        assert "\n" not in str(e) and str(e), repr(e)
        event("refused")
        return
    event("accepted")
    assert isinstance(config.estimator, mpo_rs.Estimator)
    for name in ("ppo_epochs", "minibatch_size", "seed"):
        value = getattr(config, name)
        assert type(value) is int and value >= 0, (name, value)
    for name in ("micro_batch_size", "critic_epochs"):
        value = getattr(config, name)
        assert value is None or (type(value) is int and value >= 1), (name, value)
    for name in ("clip_low", "clip_high", "log_ratio_clamp", "entropy_coef", "temperature"):
        value = getattr(config, name)
        assert type(value) is float and math.isfinite(value), (name, value)
    for name in ("max_grad_norm", "value_clip", "dual_clip"):
        value = getattr(config, name)
        assert value is None or (type(value) is float and math.isfinite(value) and value > 0), (name, value)
    for name in ("bf16", "shuffle"):
        assert type(getattr(config, name)) is bool, name
    if config.device not in (None, "cpu") or max(config.ppo_epochs, config.critic_passes) > 3:
        return  # a device this machine may not have; 10**20 epochs are valid but endless
    torch.manual_seed(0)
    offsets = np.array([0, 3, 6, 9, 12])
    batch = RolloutBatch(
        token_ids=np.tile([0, 1, 2], 4),
        mask=np.tile([False, True, True], 4),
        offsets=offsets,
        scores=np.array([1.0, 0.0, 1.0, 0.5], np.float32),
        group_ids=[0, 0, 1, 1],
        values=np.zeros(12, np.float32),
    )

    class Policy(torch.nn.Module):  # logits (B, L, 4) from the token alone
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(4, 4)

        def forward(self, input_ids, attention_mask):
            return self.embed(input_ids)

    model = Policy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if config.critic_epochs is not None:  # the critic's passes, for a learner with no critic
        with pytest.raises(mpo_rs.InvalidOptionError, match="critic_epochs"):
            Learner(model, optimizer, config)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. bf16 autocast on a CPU without it
        metrics = Learner(model, optimizer, config).step(batch)
    assert all(isinstance(v, float) for v in metrics.values())


# --- GroupStatistics: scan and merge under random block splits and id types (issue 18) ---

_POOLS = {
    "int64": [0, 1, 2, -1, -7, 2**53, 2**53 + 1, 2**62],
    "uint64": [0, 1, 2, 7, 2**63, 2**64 - 1],
    "float64": [0.0, -0.0, 1.0, 2.0, 0.5, -7.0, 2.0**53, 1e20],
    "string": ["0", "1", "a", ""],
}


@st.composite
def _blocks(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(_POOLS)), min_size=1, max_size=5))
    blocks = []
    for kind in kinds:
        ids = draw(st.lists(st.sampled_from(_POOLS[kind]), max_size=6))
        scores = draw(st.lists(st.integers(-50, 50), min_size=len(ids), max_size=len(ids)))
        blocks.append((kind, ids, [s / 4 for s in scores]))
    return blocks


def _expected_refusal(blocks) -> str | None:
    """The group-id rule of docs/estimators.md, over the non-empty blocks: a pattern of the
    messages of the rules broken (any of them may be reported first), or None."""
    kinds = {kind for kind, ids, _ in blocks if ids}
    ints = [i for kind, ids, _ in blocks if kind in ("int64", "uint64") for i in ids]
    broken = []
    if "string" in kinds and kinds - {"string"}:
        broken.append("all numbers or all strings")
    if "float64" in kinds and any(float(i) != i for i in ints):
        broken.append("has no exact float64")
    if "float64" not in kinds and "int64" in kinds and any(i > 2**63 - 1 for i in ints):
        broken.append("beyond int64")
    return "|".join(broken) or None


@fuzz_settings
@given(_blocks())
def test_group_statistics_merge_equals_a_one_pass_reference(blocks):
    pa = pytest.importorskip("pyarrow")
    partials = []
    for kind, ids, scores in blocks:
        table = pa.table(
            {
                "g": pa.array(ids, {"string": pa.string()}.get(kind, getattr(pa, kind)())),
                "score": pa.array(scores, pa.float32()),
            }
        )
        stats = mpo_rs._native.GroupStatistics.scan(table, columns=mpo_rs.Columns(group="g", mask="m", score="score"))
        partials.append(pa.table(stats.to_arrow()))
    labels = [f"block {i}" for i in range(len(blocks))]
    refusal = _expected_refusal(blocks)
    if refusal is not None:
        with pytest.raises(mpo_rs.InvalidBatchError, match=refusal):
            mpo_rs._native.GroupStatistics.merge(partials, labels=labels)
        return
    merged = pa.table(mpo_rs._native.GroupStatistics.merge(partials, labels=labels).to_arrow())
    # The reference: one pass over every row, keys by exact value (Python's own rule: 1 ==
    # 1.0, 2**53 + 1 != 2.0**53), strings a kind of their own.
    ref_rows: dict[object, list[float]] = {}
    for kind, ids, scores in blocks:
        for i, s in zip(ids, scores, strict=True):
            key = ("s", i) if kind == "string" else ("n", i)
            ref_rows.setdefault(key, []).append(float(np.float32(s)))
    got = merged.to_pydict()
    assert len(got["group"]) == len(ref_rows), "one row per group, exact keys"
    assert got["group"] == sorted(got["group"])
    for g, n, total, m2 in zip(got["group"], got["count"], got["sum"], got["m2"], strict=True):
        member = ref_rows[("s", g) if isinstance(g, str) else ("n", g)]
        assert n == len(member)
        mean = math.fsum(member) / n
        assert total == pytest.approx(math.fsum(member), rel=1e-12, abs=1e-12)
        assert m2 == pytest.approx(math.fsum((x - mean) ** 2 for x in member), rel=1e-9, abs=1e-9)
    # A merged table merged alone is itself.
    again = pa.table(mpo_rs._native.GroupStatistics.merge([merged]).to_arrow())
    assert again.equals(merged)
