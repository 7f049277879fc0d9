"""Deprecated second name of :mod:`mpo_rs.torch.learner` (needs torch): importing it warns
(``DeprecationWarning``) and gives the same objects. Import ``mpo_rs.torch.learner``."""

from __future__ import annotations

import warnings

from ._deps import missing

warnings.warn(
    "mpo_rs.learner is deprecated: import mpo_rs.torch.learner (the same names)", DeprecationWarning, stacklevel=2
)

try:
    import torch  # noqa: F401
except ModuleNotFoundError as _e:
    raise missing("mpo_rs.learner", "torch", _e) from None

from .torch.learner import *  # noqa: E402, F403
from .torch.learner import __all__ as __all__  # noqa: E402
