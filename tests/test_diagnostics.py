"""Value-structure diagnostics (docs/diagnostics.md): the variance decomposition and boundary jumps."""

from __future__ import annotations

import numpy as np
from hypothesis import given

from mpo_rs.diagnose import summarize_value_structure as summarize
from mpo_rs.diagnose import value_structure
from mpo_rs.testing import reference as ref
from mpo_rs.testing.strategies import batches


@given(batches())
def test_between_plus_within_is_the_total_variance(b):
    vs = value_structure(b.values, b.mask, b.offsets)
    np.testing.assert_allclose(vs.between + vs.within, vs.total, rtol=1e-9, atol=1e-12)
    turns = ref.segment(b.mask.tolist(), b.offsets.tolist())
    for j in range(b.n):
        tids = range(turns.traj_offsets[j], turns.traj_offsets[j + 1])
        seg = [b.values[turns.starts[t] : turns.ends[t]].astype(np.float64) for t in tids]
        if not seg:
            assert vs.total[j] == 0
            continue
        allv = np.concatenate(seg)
        # independent formulas: numpy's population variance, and the weighted turn means
        assert np.isclose(vs.total[j], allv.var(), rtol=1e-9, atol=1e-12)
        between = sum(len(s) * (s.mean() - allv.mean()) ** 2 for s in seg) / len(allv)
        assert np.isclose(vs.between[j], between, rtol=1e-9, atol=1e-12)
        for k, t in enumerate(tids):
            if k + 1 < len(seg):
                assert vs.jumps[t] == np.float32(seg[k + 1][0] - seg[k][-1])
            else:
                assert np.isnan(vs.jumps[t])


def test_hand_made_shares():
    # three turns whose values are constant inside each turn: share 1
    v = np.array([0, 0, 9, 0.5, 0.5, 9, 1, 1], np.float32)
    m = np.array([1, 1, 0, 1, 1, 0, 1, 1], bool)
    vs = value_structure(v, m, [0, 8])
    assert vs.between_share.tolist() == [1.0]
    # one turn: share 0; constant values: NaN share
    vs = value_structure(np.array([0, 1, 5, 5], np.float32), np.ones(4, bool), [0, 2, 4])
    assert vs.between_share[0] == 0.0 and np.isnan(vs.between_share[1])
    s = summarize(value_structure(v, m, [0, 8]), outcome=[1.0])
    assert s["all"]["median_between_share"] == 1.0
    assert s["rows"] == 1 and s["excluded_fewer_than_two_turns_or_constant"] == 0
    assert s["by_outcome"]["success (outcome > 0)"]["fraction_between_gt_within"] == 1.0
    assert s["by_outcome"]["failure (outcome <= 0)"]["trajectories"] == 0
    # policy tokens only: turn values 0, 0.5, 1, so two jumps of +0.5
    assert s["all"]["jumps"] == 2 and s["all"]["median_abs_jump"] == 0.5 and s["all"]["jump_quantiles"]["0.5"] == 0.5
    assert "by_outcome" not in summarize(value_structure(v, m, [0, 8]))
