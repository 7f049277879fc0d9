"""Deprecated second name of the in-memory value-structure functions of
:mod:`mpo_rs.diagnose`: importing it warns (``DeprecationWarning``) and gives the same
objects. Import ``value_structure``, ``ValueStructure`` and ``summarize_value_structure``
(here ``summarize``) from ``mpo_rs.diagnose``."""

from __future__ import annotations

import warnings

warnings.warn(
    "mpo_rs.diagnostics is deprecated: import value_structure, ValueStructure and summarize_value_structure "
    "(formerly mpo_rs.diagnostics.summarize) from mpo_rs.diagnose",
    DeprecationWarning,
    stacklevel=2,
)

from .diagnose.summary import ValueStructure, value_structure  # noqa: E402
from .diagnose.summary import summarize_value_structure as summarize  # noqa: E402

__all__ = ["ValueStructure", "summarize", "value_structure"]
