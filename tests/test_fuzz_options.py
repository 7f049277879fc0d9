"""Option resolution through every adapter (issue 18, ``make fuzz``): the same estimator
option with the same value -- good, out of range, non-finite, huge, of the wrong kind, a
string, None, or under a misspelt name -- is accepted by every entry point or refused by
every one with ``InvalidOptionError``. The entry points: the numpy functions, Arrow
(``with_advantages``), the command line (where a flag can say the value), the padded torch
API, the learner's config (through the ``Estimator`` it takes), Ray (its own test, fewer
examples: each call starts a Ray job) and verl's ``algorithm`` config (MAE's options).

``make test`` runs the profile's examples; ``make fuzz`` sets ``MPO_FUZZ_EXAMPLES``.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mpo_rs
from mpo_rs import Estimator

EXAMPLES = int(os.environ.get("MPO_FUZZ_EXAMPLES", "0"))
fuzz_settings = settings(
    **({"max_examples": EXAMPLES} if EXAMPLES else {}),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

FAMILIES = ("mae", "gae", "grpo", "bilevel")
MISSPELT = ("lamb", "lambda_", "Beta", "norm-std", "foo")
OPTIONS = {name: [row["name"] for row in Estimator.option_table() if name in row["estimators"]] for name in FAMILIES}

# Every kind of value a config file, a command line or a careless call hands over.
VALUES = st.one_of(
    st.sampled_from([0.0, 0.5, 0.8, 1.0, 1.5, 2.0, -0.1, -0.0, 1e-300, 1e6, 3.5e38]),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-3, 3),
    st.sampled_from([10**400, -(10**400), 2**63]),
    st.booleans(),
    st.none(),
    st.sampled_from(["0.9", "false", "true", "", "nan"]),
    st.sampled_from([np.float32(0.9), np.float64(0.5), np.int64(1), np.bool_(True)]),
    st.sampled_from([[0.9], (0.5,), {"lam": 0.9}, complex(1, 0), b"1"]),
)

# One small batch for every adapter: 4 trajectories of 6 tokens, 2 turns each, 2 groups.
N, L = 4, 6
MASK = np.tile(np.array([0, 1, 1, 0, 1, 1], bool), N)
OFFSETS = np.arange(0, N * L + 1, L, dtype=np.int64)
VALUES_FLAT = np.linspace(0.0, 1.0, N * L, dtype=np.float32)
SCORES = np.array([1.0, 0.0, 1.0, 0.5], np.float32)
GROUPS = np.array([0, 0, 1, 1], np.int64)


OVERFLOW = "overflows float32"
"""An accepted option (a huge finite ``beta``) can make this batch's estimate overflow float32:
the batch is refused (InvalidBatchError), not the option, and only where an adapter computes."""


def outcome(call: Any) -> str:
    """``"ok"`` (the option accepted, the batch estimated or refused for overflowing), or the
    class of the exception the call raised."""
    try:
        call()
    except Exception as e:  # the point: which class, whatever it is
        if isinstance(e, mpo_rs.InvalidBatchError) and OVERFLOW in str(e):
            return "ok"
        return type(e).__name__
    return "ok"


def numpy_call(name: str, options: dict[str, Any]) -> Any:
    if name == "mae":
        return lambda: mpo_rs.mae_advantages(VALUES_FLAT, MASK, OFFSETS, scores=SCORES, **options)
    if name == "gae":
        return lambda: mpo_rs.gae_advantages(VALUES_FLAT, MASK, OFFSETS, scores=SCORES, **options)
    if name == "bilevel":
        return lambda: mpo_rs.bilevel_advantages(VALUES_FLAT, MASK, OFFSETS, scores=SCORES, **options)
    return lambda: mpo_rs.group_advantages(SCORES, GROUPS, **options)


def arrow_call(name: str, options: dict[str, Any]) -> Any:
    pa = pytest.importorskip("pyarrow")
    from mpo_rs.arrow import with_advantages

    def lists(x: np.ndarray) -> Any:
        return pa.ListArray.from_arrays(pa.array(OFFSETS.astype(np.int32)), pa.array(x))

    table = pa.table({"loss_mask": lists(MASK), "values": lists(VALUES_FLAT), "score": SCORES, "group_id": GROUPS})
    return lambda: with_advantages(table, estimator=name, **options)


def torch_call(name: str, options: dict[str, Any]) -> Any:
    torch = pytest.importorskip("torch")
    import mpo_rs.torch as mt

    values = torch.from_numpy(VALUES_FLAT.reshape(N, L))
    mask = torch.from_numpy(MASK.reshape(N, L).astype(np.int64))
    scores = torch.from_numpy(SCORES)
    if name == "mae":
        return lambda: mt.mae_advantages(values, mask, scores=scores, **options)
    if name == "gae":
        return lambda: mt.gae_advantages(values, mask, scores=scores, **options)
    if name == "bilevel":
        return lambda: mt.bilevel_advantages(values, mask, scores=scores, **options)
    return lambda: mt.group_advantages(None, mask, GROUPS, scores=scores, **options)


def learner_call(name: str, options: dict[str, Any]) -> Any:
    pytest.importorskip("torch")
    from mpo_rs.torch.learner import LearnerConfig

    return lambda: LearnerConfig(estimator=Estimator(name, **options))


def verl_call(name: str, options: dict[str, Any]) -> Any | None:
    """MAE's options as verl users write them: ``algorithm.gamma`` and ``algorithm.mpo.*``
    (verl's own ``algorithm.lam`` is GAE's, so MAE's lambda is ``algorithm.mpo.lam``);
    bi-level GAE's as RAGEN's users do: ``algorithm.gamma``, ``lam``, ``high_level_gamma``
    (anything else under ``algorithm.mpo``, which refuses an unknown key)."""
    if name not in ("mae", "bilevel"):
        return None
    pytest.importorskip("verl")
    from mpo_rs.integrations.verl.config import estimator_options

    if name == "bilevel":
        ragen: dict[str, Any] = {"mpo": {}}
        for key, value in options.items():
            if key in ("gamma", "lam", "high_level_gamma"):
                ragen[key] = value
            else:
                ragen["mpo"][key] = value
        return lambda: estimator_options("mpo_bilevel_gae", ragen)

    algorithm: dict[str, Any] = {"gamma": 1.0, "lam": 1.0, "mpo": {}}
    for key, value in options.items():
        if key == "gamma":
            algorithm["gamma"] = value
        else:
            algorithm["mpo"][key] = value
    return lambda: estimator_options("mpo_mae", algorithm)


def cli_flags(options: dict[str, Any]) -> list[str] | None:
    """The options as ``mpo-rs advantages`` flags, or None where no flag can say the value
    (a string, a container, None, a bool for a number)."""
    kinds = {row["name"]: row["kind"] for row in Estimator.option_table()}
    flags = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        kind = kinds.get(key)
        if kind is None:
            return None  # a misspelt flag is argparse's usage error; not this test's subject
        if kind == "bool" and isinstance(value, (bool, np.bool_)):
            flags.append(flag if value else "--no-" + flag[2:])
        elif (
            kind != "bool"
            and isinstance(value, (int, float, np.floating, np.integer))
            and not isinstance(value, (bool, np.bool_))
        ):
            text = str(int(value)) if isinstance(value, (int, np.integer)) else repr(float(value))
            flags.append(f"{flag}={text}")  # `--lam=-inf`: a value that starts with '-'
        else:
            return None
    return flags


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pq = pytest.importorskip("pyarrow.parquet")
    arrow = arrow_call("mae", {})  # noqa: F841 (imports pyarrow)
    import pyarrow as pa

    def lists(x: np.ndarray) -> Any:
        return pa.ListArray.from_arrays(pa.array(OFFSETS.astype(np.int32)), pa.array(x))

    path = tmp_path_factory.mktemp("options") / "log.parquet"
    pq.write_table(
        pa.table({"loss_mask": lists(MASK), "values": lists(VALUES_FLAT), "score": SCORES, "group_id": GROUPS}), path
    )
    return path


_runs = itertools.count()


@fuzz_settings
@given(
    name=st.sampled_from(FAMILIES),
    data=st.data(),
)
def test_every_adapter_accepts_or_refuses_an_option_alike(log_file: Path, name: str, data: st.DataObject) -> None:
    from mpo_rs.cli import main

    key = data.draw(st.sampled_from(OPTIONS[name] + list(MISSPELT)), label="option")
    value = data.draw(VALUES, label="value")
    options = {key: value}
    outcomes = {
        "numpy": outcome(numpy_call(name, options)),
        "arrow": outcome(arrow_call(name, options)),
        "torch": outcome(torch_call(name, options)),
        "learner": outcome(learner_call(name, options)),
    }
    verl = verl_call(name, options)
    if verl is not None:
        outcomes["verl"] = outcome(verl)
    flags = cli_flags(options)
    if flags is not None:
        out = log_file.parent / f"out-{next(_runs)}.parquet"
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                code = main(["advantages", str(log_file), "-o", str(out), "-q", "--estimator", name, *flags])
        except SystemExit as e:  # argparse's own usage errors
            code = int(e.code or 0)
        if code == 1 and OVERFLOW in stderr.getvalue():
            code = 0  # the option accepted, the batch refused (as OVERFLOW says)
        outcomes["cli"] = {0: "ok", 2: "InvalidOptionError"}.get(code, f"exit {code}")
    event(f"{name}: {'accepted' if outcomes['numpy'] == 'ok' else 'refused'}")
    assert len(set(outcomes.values())) == 1, (name, options, outcomes)
    assert outcomes["numpy"] in ("ok", "InvalidOptionError"), (name, options, outcomes)
    # A misspelt option is refused even when its value is None (it was accepted), and a
    # string is refused for every kind of option (no adapter converts one on its own).
    if key in MISSPELT or isinstance(value, (str, bytes)):
        assert outcomes["numpy"] == "InvalidOptionError", (name, options, outcomes)


def test_a_huge_finite_beta_is_accepted_and_the_batch_it_overflows_refused(log_file: Path) -> None:
    """The case the fuzzer found (beta = 9.9e39, here 1e300, which overflows this batch everywhere):
    every adapter accepts the option; those that compute on this batch refuse the batch, naming
    the overflow, and the CLI exits 1 with it."""
    from mpo_rs.cli import main

    options = {"beta": 1e300}
    for call in (numpy_call("mae", options), arrow_call("mae", options), torch_call("mae", options)):
        with pytest.raises(mpo_rs.InvalidBatchError, match=OVERFLOW):
            call()
    learner_call("mae", options)()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = main(
            [
                "advantages",
                str(log_file),
                "-o",
                str(log_file.parent / "huge-beta.parquet"),
                "-q",
                "--estimator",
                "mae",
                "--beta=1e300",
            ]
        )
    assert code == 1 and OVERFLOW in stderr.getvalue(), (code, stderr.getvalue())
