"""``mpo_rs.testing``: property-test any trainer's multi-turn advantages (docs/testing.md).

* :mod:`.reference` -- the executable spec: slow float64 estimators from the formulas
  (numpy only);
* :mod:`.strategies` -- hypothesis strategies for random multi-turn batches, flat and
  padded;
* :mod:`.invariants` -- the invariants of docs/spec.md as named checks with readable
  counterexamples; :mod:`.estimators` -- which of them each estimator implies;
* :mod:`.conventions` -- adapters that call a trainer's function (verl, flat, padded, one's own);
* :func:`check_advantages` -- runs them all on a function and returns a report.

Everything but :mod:`.reference` needs the ``testing`` extra (hypothesis); importing it
without raises :class:`mpo_rs.MissingDependencyError`. ``import mpo_rs`` never imports
hypothesis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .check import Report, check_advantages

__all__ = ["Report", "check_advantages"]


def __getattr__(name: str) -> Any:
    # Lazy, so `mpo_rs.testing.reference` imports without hypothesis.
    if name in __all__:
        from .._deps import needs

        with needs("mpo_rs.testing", "testing"):
            import hypothesis  # noqa: F401
        from . import check

        return getattr(check, name)
    raise AttributeError(f"module 'mpo_rs.testing' has no attribute {name!r}")
