"""Compatibility module: the learner lives in :mod:`mpo_rs.torch.learner` and its batch in
:mod:`mpo_rs.torch.batch` (needs torch)."""

from __future__ import annotations

from ._deps import missing

try:
    import torch  # noqa: F401
except ModuleNotFoundError as _e:
    raise missing("mpo_rs.learner", "torch", _e) from None

from .torch.learner import *  # noqa: F403
from .torch.learner import __all__ as __all__
