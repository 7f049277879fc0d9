"""Fuzzing `mpo-rs reproduce`: stops in every phase of a run, and random user envs.

- **Stops** (:func:`test_stops_in_every_phase_end_promptly_and_leave_no_worker`): the
  console script (`--quick --workers 2`, two arms, two seeds) is stopped by Ctrl-C to its
  process group, SIGTERM or SIGHUP at a random moment of one of its phases -- the base
  policies being built (in the workers), the RL runs (in the workers), the report (in the
  main process) -- ``MPO_FUZZ_STOPS`` times (3 in the normal suite; ``make fuzz``: 60).
  Each stop ends the command within 30 s (a hard deadline: a hang fails), with exit code
  128 + the signal (or 0 when it had just finished), one line, no traceback, and no worker
  process left.
- **Random envs** (:func:`test_a_random_env_runs_or_is_refused_with_one_typed_line`,
  hypothesis, ``MPO_FUZZ_EXAMPLES``): wrong types, huge sizes, raising, never ending. Each
  is refused up front with one typed line naming the env, or accepted; an accepted one's
  rollouts then run (an episode that never ends is cut off at ``max_turns``) or stop with
  one typed line.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpo_rs.exceptions import MpoError

TESTS = Path(__file__).resolve().parent
STOPS = int(os.environ.get("MPO_FUZZ_STOPS", "3"))
EXAMPLES = int(os.environ.get("MPO_FUZZ_EXAMPLES", "0"))
CONSOLE = "import sys\nfrom mpo_rs_cli import main\nsys.exit(main())"
ARGS = ["reproduce", "--quick", "--arms", "mpo,grpo", "--seeds", "2", "--workers", "2"]


def _default_signals() -> None:  # a background job's parent ignores SIGINT; undo it
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _start(out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CONSOLE, *ARGS, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_signals,
        start_new_session=True,
    )


def _workers_left(pid: int, timeout: float = 5.0) -> list[int]:
    from test_reproduce_edges import _workers_of

    deadline = time.monotonic() + timeout
    while (left := _workers_of(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the workers through /proc")
def test_stops_in_every_phase_end_promptly_and_leave_no_worker(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    from stops import Lines, wait

    # A finished output: copied without its runs it starts at the RL runs (the base policies
    # are kept), copied whole it goes straight to the report.
    template = tmp_path / "template"
    done = subprocess.run(
        [sys.executable, "-c", CONSOLE, *ARGS, "--out", str(template)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    rng = np.random.default_rng(int(os.environ.get("FUZZ_SEED", "0")))
    phases = {
        # phase: (how the output starts, the line after which the phase begins, seconds it lasts at least)
        "base policies": (None, "configuration (", 2.0),
        "runs": ("runs", "configuration (", 3.0),
        "report": ("whole", "resuming: 4 of 4", 2.0),
    }
    outcomes: dict[tuple[str, int], int] = {}
    for i in range(STOPS):
        phase = list(phases)[i % len(phases)]
        start, after, lasts = phases[phase]
        out = tmp_path / f"stop{i}"
        if start == "runs":
            shutil.copytree(template, out, ignore=shutil.ignore_patterns("runs"))
        elif start == "whole":
            shutil.copytree(template, out)
        sig = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)[(i // len(phases)) % 3]
        proc = _start(out)
        assert proc.stderr is not None
        lines = Lines(proc.stderr)
        try:
            assert lines.until(lambda line, after=after: after in line, timeout=300) is not None, "".join(lines.seen)
            time.sleep(float(rng.uniform(0.0, lasts)))
            if sig == signal.SIGINT:
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole process group
            else:
                proc.send_signal(sig)
            stopped = time.monotonic()
            code = wait(proc, timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        rest = lines.rest(timeout=30)
        proc.stderr.close()
        assert time.monotonic() - stopped < 30
        assert code in (0, 128 + sig), (phase, sig, code, "".join(lines.seen))
        assert "Traceback" not in rest and "Exception ignored" not in rest, (phase, sig, rest)
        if code:
            last = [line for line in rest.splitlines() if line.startswith("mpo-rs: error: ")]
            assert len(last) == 1, (phase, sig, rest)
        assert _workers_left(proc.pid) == [], (phase, sig)
        outcomes[phase, code] = outcomes.get((phase, code), 0) + 1
    print(f"{STOPS} stops: {outcomes}")


# --------------------------------------------------------------------------- random envs


SIZES = st.one_of(
    st.integers(-2, 12),
    st.sampled_from([10**13, 2**63, 10**23, 2**18 + 1, 5000]),
    st.sampled_from([True, "8", 2.0, None, [4]]),
)
ENV_PARAMS = st.fixed_dictionaries(
    {},
    optional={
        "vocab_size": SIZES,
        "action_tokens": SIZES,
        "max_turns": SIZES,
        "obs_len": st.sampled_from([0, 1, 3, 100, 700, 5000]),
        "done_kind": st.sampled_from(["bool", "array", "int", "str", "none", "numpy"]),
        "reward_kind": st.sampled_from(["float", "str", "nan", "inf", "none", "list", "bool", "huge", "numpy", "int"]),
        "obs_kind": st.sampled_from(["list", "floats", "negative", "too_big", "nested", "none", "str", "array", "2d"]),
        "reset_kind": st.sampled_from(["list", "empty", "none"]),
        "result_kind": st.sampled_from(["triple", "pair", "list"]),
        "raise_in": st.sampled_from([None, "reset", "step", "init"]),
        "raise_from_index": st.sampled_from([0, 1, 6]),
        "never_done": st.booleans(),
    },
)


def _one_typed_line(e: BaseException) -> None:
    assert isinstance(e, MpoError), f"{type(e).__name__}: {e}"
    assert "\n" not in str(e) and "edge_envs:make" in str(e), str(e)


@settings(max_examples=EXAMPLES or 40, deadline=None)
@given(params=ENV_PARAMS)
def test_a_random_env_runs_or_is_refused_with_one_typed_line(params: dict, monkeypatch_module: None) -> None:
    torch = pytest.importorskip("torch")
    from mpo_lab.reproduce.api import build_config
    from mpo_lab.reproduce.base import new_policy
    from mpo_lab.reproduce.env import make_env
    from mpo_lab.seeds import task_seeds
    from mpo_lab.train.sampler import sample

    try:
        config = build_config("edge_envs:make", env_params=params, arms=["grpo"], budget="quick")
    except Exception as e:  # refused up front: one typed line naming the env
        _one_typed_line(e)
        return
    task = config.tasks[0]
    policy = new_policy(config, task.name, 0)
    try:
        out = sample(
            policy,
            lambda: make_env(task),
            seeds=task_seeds("train", 0, 4, 2),
            group_size=2,
            generator=torch.Generator().manual_seed(0),
        )
    except Exception as e:  # only a task beyond the probe's may fail, with one typed line
        _one_typed_line(e)
        return
    assert (out.stats.turns <= make_env(task).max_turns).all()  # never-ending episodes are cut off


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(TESTS))
    yield
    mp.undo()
