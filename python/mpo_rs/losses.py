"""Compatibility module: the losses live in :mod:`mpo_rs.torch.losses` (needs torch)."""

from __future__ import annotations

from ._deps import missing

try:
    import torch  # noqa: F401
except ModuleNotFoundError as _e:
    raise missing("mpo_rs.losses", "torch", _e) from None

from .torch.losses import *  # noqa: F403
from .torch.losses import __all__ as __all__
