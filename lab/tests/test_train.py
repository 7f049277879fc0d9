"""The lab trains with the library's pieces (one gather, one explained variance), and its
tiny model refuses bad sizes with typed errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mpo_rs.exceptions import InvalidOptionError, InvalidRolloutError  # noqa: E402


def test_the_runs_use_the_library_gather_and_metric():
    from mpo_lab.reproduce import run
    from mpo_rs.torch import metrics
    from mpo_rs.torch.batching import pad_rows

    assert run.pad_rows is pad_rows  # the critic passes of the runs gather as the learner does
    assert run.explained_variance is metrics.explained_variance


def test_tiny_model_errors_are_typed():
    from mpo_lab.train.models import TinyCausalLM

    with pytest.raises(InvalidOptionError, match="`width` must be a positive integer"):
        TinyCausalLM(8, width=True)
    with pytest.raises(InvalidOptionError, match="multiple of `heads`"):
        TinyCausalLM(8, width=10, heads=3)
    with pytest.raises(InvalidRolloutError, match=r"`input_ids` must be \(B, L\)"):
        TinyCausalLM(8, width=8)(torch.zeros(4, dtype=torch.long))
