"""Deprecated second name of :mod:`mpo_rs.torch.losses` (needs torch): importing it warns
(``DeprecationWarning``) and gives the same objects. Import ``mpo_rs.torch.losses``."""

from __future__ import annotations

import warnings

from ._deps import missing

warnings.warn(
    "mpo_rs.losses is deprecated: import mpo_rs.torch.losses (the same names)", DeprecationWarning, stacklevel=2
)

try:
    import torch  # noqa: F401
except ModuleNotFoundError as _e:
    raise missing("mpo_rs.losses", "torch", _e) from None

from .torch.losses import *  # noqa: E402, F403
from .torch.losses import __all__ as __all__  # noqa: E402
