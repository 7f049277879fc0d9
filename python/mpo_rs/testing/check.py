"""``check_advantages``: put a trainer's advantage function to the invariants its estimator implies.

The function is called through a convention (:mod:`mpo_rs.testing.conventions`) on
batches hypothesis draws for the estimator (:data:`mpo_rs.testing.invariants.ESTIMATORS`);
every invariant the estimator implies is run as its own hypothesis search, and a failure
is shrunk to a small batch. The result is a :class:`Report`: per invariant, held over N
examples, or failed with the shrunk counterexample.

Two hypothesis profiles (registered by :mod:`mpo_rs.testing.strategies`): ``mpo-rs-ci``
(deterministic: the same examples on every run, no example database; ``PROFILES``) and
``mpo-rs-fuzz`` (many random examples). ``check_advantages(profile=...)`` takes ``"ci"`` or ``"fuzz"``; the environment
variable ``MPO_RS_TESTING_PROFILE`` sets the default (``make fuzz`` sets ``fuzz``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .._deps import needs
from ..exceptions import InvalidOptionError
from .conventions import Convention, Layout, Outcome, resolve_convention
from .invariants import ESTIMATORS, INVARIANTS, Context, InvariantViolation, Subject, Tolerance, _fail
from .strategies import PROFILE_ENV, PROFILES, Batch, hypothesis_settings

with needs("mpo_rs.testing", "testing"):
    from hypothesis import assume, given, settings
    from hypothesis import strategies as st
    from hypothesis.errors import HypothesisException, Unsatisfiable

__all__ = ["PROFILES", "InvariantResult", "Report", "check_advantages", "hypothesis_settings"]


@dataclass(frozen=True)
class InvariantResult:
    """One invariant's outcome: ``held`` over ``examples`` batches, ``failed`` with the
    shrunk ``counterexample``, or ``unsatisfied`` (no drawn batch applied)."""

    name: str
    section: str
    status: Literal["held", "failed", "unsatisfied"]
    examples: int
    seconds: float
    counterexample: str | None = None

    def line(self) -> str:
        """One line: the name, the status and the number of examples."""
        if self.status == "held":
            return f"{self.name}: held over {self.examples} examples ({self.seconds:.1f} s)"
        if self.status == "unsatisfied":
            return f"{self.name}: no applicable batch drawn ({self.seconds:.1f} s)"
        return f"{self.name}: FAILED ({self.seconds:.1f} s)"


@dataclass
class Report:
    """What :func:`check_advantages` found; ``str(report)`` prints it, counterexamples included."""

    function: str
    convention: str
    estimator: str
    results: list[InvariantResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every invariant held (or had no applicable batch)."""
        return all(r.status != "failed" for r in self.results)

    @property
    def failures(self) -> list[InvariantResult]:
        return [r for r in self.results if r.status == "failed"]

    def __getitem__(self, name: str) -> InvariantResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def __str__(self) -> str:
        head = f"{self.function} as {self.estimator} ({self.convention} convention):"
        lines = [head, *(f"  {r.line()}" for r in self.results)]
        for r in self.failures:
            lines += ["", f"counterexample for {r.name}:", r.counterexample or ""]
        return "\n".join(lines)

    def raise_if_failed(self) -> None:
        """Raises AssertionError with the report when an invariant failed (for pytest)."""
        if not self.ok:
            raise AssertionError(str(self))


def _name_of(fn: Callable[..., Any] | str, what: str) -> str:
    if isinstance(fn, str):
        return fn
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', what)}"


def bind(
    fn: Callable[..., Any], convention: str | Convention, call_options: Mapping[str, Any] | None = None
) -> Subject:
    """The function under test as a :data:`~mpo_rs.testing.invariants.Subject`: called
    through ``convention``, with ``call_options`` added to every call."""
    conv = resolve_convention(convention)
    fixed = dict(call_options or {})

    def subject(b: Batch, options: Mapping[str, Any], layout: Layout) -> Outcome:
        return conv(fn, b, {**options, **fixed}, layout)

    return subject


def _run_one(
    subject: Subject,
    name: str,
    estimator: str,
    s: settings,
    tolerance: Tolerance,
    where: Callable[[Batch], bool] | None,
    drawn: st.SearchStrategy[Batch] | None = None,
) -> InvariantResult:
    spec, inv = ESTIMATORS[estimator], INVARIANTS[name]
    passed = 0
    start = time.monotonic()

    @s
    @given(spec.batches if drawn is None else drawn, spec.options, st.data())
    def run(b: Batch, opts: dict[str, Any], data: st.DataObject) -> None:
        nonlocal passed
        assume(where is None or where(b))
        if name != "turn-reward-placement":  # the only check that reads them
            b = replace(b, turn_rewards=None)
        ctx = Context(subject, spec, data.draw, tolerance, inv)
        try:
            inv.check(ctx, b, dict(opts))
        except (InvariantViolation, HypothesisException):
            raise
        except Exception as e:
            raise _fail(ctx, b, opts, f"the function raised {type(e).__name__}: {e}", []) from e
        passed += 1

    try:
        run()
    except InvariantViolation as e:
        return InvariantResult(name, inv.section, "failed", passed, time.monotonic() - start, str(e))
    except Unsatisfiable:
        return InvariantResult(name, inv.section, "unsatisfied", 0, time.monotonic() - start)
    except HypothesisException as e:  # e.g. Flaky: the function is not deterministic
        message = f"{name}: hypothesis stopped: {type(e).__name__}: {e}"
        return InvariantResult(name, inv.section, "failed", passed, time.monotonic() - start, message)
    return InvariantResult(name, inv.section, "held", passed, time.monotonic() - start)


def check_advantages(
    fn: Callable[..., Any],
    *,
    convention: str | Convention = "flat",
    estimator: str = "gae",
    invariants: Iterable[str] | None = None,
    profile: str | None = None,
    max_examples: int | None = None,
    tolerance: Tolerance | None = None,
    call_options: Mapping[str, Any] | None = None,
    where: Callable[[Batch], bool] | None = None,
    batches: st.SearchStrategy[Batch] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Checks ``fn`` against the invariants ``estimator`` implies and returns a :class:`Report`.

    ``convention``: a name of :data:`~mpo_rs.testing.conventions.CONVENTIONS` (``flat``,
    ``flat-group``, ``padded``, ``verl-gae``, ``verl-group``, ``verl-reinforce``) or an
    adapter of one's own. ``estimator``: what ``fn`` computes, a key of
    :data:`~mpo_rs.testing.invariants.ESTIMATORS` (``gae``, ``mae``, ``reinforce``,
    ``grpo``, ``drgrpo``, ``rloo``); its options (γ and λ, below 1 included) are drawn and passed to ``fn`` as
    keywords. ``invariants``: a subset of the estimator's (default: all of them).
    ``profile``: ``"ci"`` (deterministic, the default) or ``"fuzz"``; ``max_examples``
    overrides the profile's number of examples per invariant. ``tolerance``: how close
    ``fn``'s numbers must be to the reference's (default 1e-4 relative, 1e-3 absolute).
    ``call_options``: fixed keywords added to every call of ``fn``. ``where``: only
    batches for which it is true are drawn (say ``lambda b: b.mask.sum() >= 2`` for a
    function that refuses smaller ones). ``batches``: the strategy that draws them instead
    of the estimator's (:mod:`mpo_rs.testing.strategies`: say ``group_batches(min_group=2)``
    for no group of one, or ``batches(12, max_run=20)`` for larger ones). ``progress``: called with a line before each
    invariant.
    """
    if estimator not in ESTIMATORS:
        raise InvalidOptionError(f"unknown estimator {estimator!r}; the kit knows: {', '.join(ESTIMATORS)}")
    implied = ESTIMATORS[estimator].invariants
    names = list(implied if invariants is None else invariants)
    for name in names:
        if name not in implied:
            raise InvalidOptionError(
                f"invariant {name!r} does not apply to the {estimator} estimator; its invariants: {', '.join(implied)}"
            )
    s = hypothesis_settings(profile or os.environ.get(PROFILE_ENV, "ci"), max_examples)
    subject = bind(fn, convention, call_options)
    report = Report(_name_of(fn, "fn"), _name_of(convention, "convention"), estimator)
    for i, name in enumerate(names):
        if progress is not None:
            progress(f"checking {name} ({i + 1}/{len(names)})")
        report.results.append(_run_one(subject, name, estimator, s, tolerance or Tolerance(), where, batches))
    return report
