"""The variance decomposition of a critic's values, in memory: ``value_structure`` and
``summarize(vs, outcome=None)``. Kept for its import path; the code lives in
:mod:`mpo_rs.diagnose.summary`."""

from __future__ import annotations

from .diagnose.summary import ValueStructure, value_structure
from .diagnose.summary import summarize_value_structure as summarize

__all__ = ["ValueStructure", "summarize", "value_structure"]
