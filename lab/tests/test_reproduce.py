"""`mpo-rs reproduce`: the quick configuration end to end (every arm runs, every file is
written, the metrics are finite where they are defined -- not the ordering), pass@k and the
explained variance, the equal-budget invariants of the committed configurations, and its
output rule and stops. Its statistics are lab/tests/test_reproduce_stats.py; its page,
lab/tests/test_reproduce_page.py."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_reproduce_page import _table

from mpo_lab.reproduce import ARMS, CONFIGS, FULL, GPU, PILOT, QUICK
from mpo_lab.reproduce.config import BETA_SWEEP, LAMBDA_GRID, MAIN_TASK, TASK_PREFIX
from mpo_lab.reproduce.stats import (
    INCONCLUSIVE,
    NO_VERDICT,
    NOT_REPRODUCED,
    REPRODUCED,
)
from mpo_rs.exceptions import InvalidOptionError

# --------------------------------------------------------------------------- pass@k, EV

torch = pytest.importorskip("torch")


def test_pass_at_k_brute_force():
    from mpo_lab.reproduce.run import pass_at_k

    rng = np.random.default_rng(0)
    successes = rng.random((6, 4)) < 0.4
    for k in (1, 2, 3, 4):
        expected = np.mean(
            [np.mean([row[list(c)].any() for c in itertools.combinations(range(4), k)]) for row in successes]
        )
        assert pass_at_k(successes, k) == pytest.approx(expected)
    with pytest.raises(InvalidOptionError):
        pass_at_k(successes, 5)


def test_explained_variance_nan_when_returns_constant():
    from mpo_lab.reproduce.run import explained_variance

    assert math.isnan(explained_variance(np.array([0.1, 0.3]), np.array([1.0, 1.0])))
    assert math.isnan(explained_variance(np.zeros(0), np.zeros(0)))
    assert explained_variance(np.array([0.0, 1.0]), np.array([0.0, 1.0])) == 1.0
    assert explained_variance(np.zeros(2), np.array([0.0, 1.0])) == 0.0


# --------------------------------------------------------------------------- configurations

KNOBS = {"estimator", "ratio", "advantage_scale"}  # the estimator carries its options


def _learner_fields(arm, config):
    from mpo_lab.reproduce.run import learner_config

    return dataclasses.asdict(learner_config(arm, config, seed=0))


@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))
def test_arms_differ_only_in_their_knobs(config):
    by_key = {arm.key: arm for arm in config.arms}
    assert len(by_key) == len(config.arms)
    reference = _learner_fields(by_key["mpo"], config)
    for arm in config.arms:
        fields = _learner_fields(arm, config)
        differ = {k for k in fields if fields[k] != reference[k]}
        assert differ <= KNOBS, (arm.key, differ)  # same budget: epochs, minibatch, clip, ...
    if config.plan == "instrument":
        # Each task's MPO w/ token IS differs from its MPO in the ratio alone; a ladder arm from
        # the learned-critic arm of its method in the critic alone.
        for arm in config.arms:
            base_key = arm.key.split("_ref")[0]
            if arm.study == "ladder":
                own, other = by_key[base_key].identity(), arm.identity()
                changed = {k for k in other if own.get(k) != other[k]} - {"key", "label", "family"}
                assert changed == ({"critic"} if arm.critic_ev is None else {"critic", "critic_ev"}), arm.key
            elif arm.key.endswith("mpo_token_is"):
                own, other = by_key[arm.key[: -len("_token_is")]].identity(), arm.identity()
                assert {k for k in own if own[k] != other[k]} - {"key", "label", "family"} == {"ratio"}
        return
    mpo = by_key["mpo"].identity()

    # The identity's "family" key is the arm's study (Arm.study), under the name committed hashes keep.
    def ablated(key):
        other = by_key[key].identity()
        return {k for k in mpo if mpo[k] != other[k]} - {"key", "label", "family"}

    assert ablated("mpo_token_is") == {"ratio"}
    for b, key in BETA_SWEEP.items():
        assert ablated(key) == (set() if b == 1.0 else {"beta"})
        assert by_key[key].estimator.options["beta"] == b
    for (lam, intra), key in LAMBDA_GRID.items():
        assert ablated(key) <= {"lam", "lam_intra"}
        assert (by_key[key].estimator.options["lam"], by_key[key].estimator.options["lam_intra"]) == (lam, intra)
    for task in ("multi_hop", "frozen_lake", "key_door", "guess_number"):  # Table 1 on every task
        prefix = TASK_PREFIX[task]
        for key in ("grpo", "gspo", "ppo", "mpo_token_is", "mpo"):
            other = by_key[prefix + key].identity()
            main = by_key[key].identity()
            assert {k for k in main if main[k] != other[k]} - {"key", "label", "family"} == {"task"}
    # The relatives: AReaL's turn-level GAE is the beta = 0 arm under a token ratio.
    assert ablated("areal_turn_gae") == {"beta", "ratio"}
    areal, beta0 = by_key["areal_turn_gae"].identity(), by_key["mpo_beta0"].identity()
    assert {k for k in areal if areal[k] != beta0[k]} - {"key", "label", "family"} == {"ratio"}
    if "ragen_bilevel" in by_key:
        ragen = by_key["ragen_bilevel"]
        assert (ragen.estimator.name, ragen.ratio, ragen.advantage_scale) == ("bilevel", "token", "none")
    assert ablated("mpo_whiten") == {"advantage_scale"}
    ppo, ppo_whiten = by_key["ppo"].identity(), by_key["ppo_whiten"].identity()
    assert {k for k in ppo if ppo[k] != ppo_whiten[k]} - {"key", "label", "family"} == {"advantage_scale"}
    # One advantage-scale rule: no arm of the headline comparison whitens over the batch.
    assert {a.advantage_scale for a in config.arms if a.study != "scale"} <= {"group-std", "none"}
    assert {a.advantage_scale for a in config.arms if a.study == "scale"} == {"whiten"}
    for key in ("grpo", "gspo", "ppo", "mpo_token_is"):
        assert by_key[key].task == MAIN_TASK == "search" and by_key[key].identity()["lam_critic"] == 1.0
    assert (by_key["grpo"].ratio, by_key["gspo"].ratio, by_key["ppo"].ratio) == ("token", "sequence", "token")
    assert by_key["ppo"].estimator.name == "gae" and by_key["ppo"].advantage_scale == "none"
    assert by_key["grpo"].advantage_scale == by_key["gspo"].advantage_scale == "group-std"


def test_committed_configurations():
    assert FULL.seeds >= 4 and GPU.seeds >= 5 and QUICK.seeds >= 1
    assert FULL.config_hash() != QUICK.config_hash()
    assert FULL.config_hash() == dataclasses.replace(FULL, workers=7).config_hash()  # scheduling only
    # The reported task is KeyDoor with its defaults: T·K >= 100 policy tokens.
    from mpo_lab.envs import make

    door = make("key_door", **FULL.task("key_door").kwargs())
    assert door.max_turns * door.action_tokens >= 100
    gpu_door = make("key_door", **GPU.task("key_door").kwargs())
    assert gpu_door.max_turns > door.max_turns and GPU.model.width > FULL.model.width and GPU.device == "cuda"
    assert {a.study for a in ARMS} == {"table1", "relatives", "beta", "lambda", "scale"}
    assert {a.task for a in ARMS} == {spec.name for spec in FULL.tasks}
    # The pilot that fixed the advantage-scale rule ran seed 0; the sizing pilot runs seeds of its own.
    assert 0 not in FULL.seed_list and not set(FULL.seed_list) & set(PILOT.seed_list)
    assert dataclasses.replace(PILOT, name="full", seeds=FULL.seeds, first_seed=1) == FULL


# --------------------------------------------------------------------------- end to end


def test_usage_errors(capsys):
    from mpo_rs.cli import main

    assert main(["reproduce", "--quick", "--docs", "docs"]) == 2
    assert "--docs" in capsys.readouterr().err
    assert main(["reproduce", "--quick", "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
    assert main(["reproduce", "--docs", "docs"]) == 2  # the default budget is quick, not the page's run
    assert "--config instrument" in capsys.readouterr().err
    assert main(["reproduce", "--budget", "full", "--docs", "docs"]) == 2  # the paper's run: its page is a record
    assert "--config instrument" in capsys.readouterr().err


def test_the_default_budget_finishes_in_minutes(monkeypatch, tmp_path: Path):
    """`mpo-rs reproduce` without --budget runs the quick budget (the full run is asked for)."""
    from mpo_lab.reproduce import command

    seen = {}

    def fake_build_config(env, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(command, "build_config", fake_build_config)
    with pytest.raises(SystemExit):
        command.run(
            argparse.Namespace(
                quick=False,
                budget=None,
                docs=None,
                env=None,
                env_param=[],
                arms=None,
                seeds=None,
                first_seed=None,
                device="cpu",
                workers=1,
                out=tmp_path,
                overwrite=False,
                demonstrator=None,
                base_policy=None,
            )
        )
    assert seen["budget"] == "quick"


def test_quick_end_to_end(tmp_path: Path, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("matplotlib")
    from mpo_rs.cli import main

    out = tmp_path / "quick"
    assert main(["reproduce", "--quick", "--out", str(out), "--workers", "2"]) == 0
    assert str(out / "reproduction.md") in capsys.readouterr().out
    for name in (
        "results.json",
        "runs.parquet",
        "curves.parquet",
        "evals.parquet",
        "reproduction.md",
        "img/curves_search_table1.png",
        "img/curves_search_relatives.png",
        "img/curves_search_scale.png",
        "img/curves_multi_hop_table1.png",
        "img/curves_frozen_lake_table1.png",
        "img/curves_key_door_table1.png",
        "img/curves_guess_number_table1.png",
        "img/final_success.png",
        "img/confirmatory.png",
        "diagnosis/mpo/summary.json",
        "diagnosis/ppo/summary.json",
    ):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name

    runs = pq.read_table(out / "runs.parquet").to_pylist()
    assert sorted(r["arm"] for r in runs) == sorted(a.key for a in QUICK.arms)  # every arm ran
    assert {r["config_hash"] for r in runs} == {QUICK.config_hash()}
    for r in runs:
        for metric in (
            "final_success",
            "auc_success",
            "final_entropy",
            "final_turns",
            "final_response_length",
            "final_pass@1",
            "wall_s",
        ):
            assert math.isfinite(r[metric]), (r["arm"], metric)
        assert 0.0 <= r["final_success"] <= 1.0
        ev = r["final_explained_variance"]
        assert math.isnan(ev) or -10.0 < ev <= 1.0, (r["arm"], ev)  # NaN when undefined, never -1e7
        assert r["critic_trained"] or not QUICK.arm(r["arm"]).trains_critic
        assert (out / "rollouts" / f"{r['arm']}-seed0.parquet").is_file()

    curves = pq.read_table(out / "curves.parquet").to_pydict()
    per_arm = {a: curves["arm"].count(a) for a in set(curves["arm"])}
    assert per_arm == {a.key: QUICK.budget.updates for a in QUICK.arms}
    for name in ("success", "entropy", "turns", "response_length", "sample_s", "step_s"):
        assert all(math.isfinite(x) for x in curves[name]), name

    results = json.loads((out / "results.json").read_text())
    assert results["config_hash"] == QUICK.config_hash()
    assert [c["number"] for c in results["claims"]] == list(range(1, 10))
    assert {c["verdict"] for c in results["claims"]} <= {REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NO_VERDICT}
    # The run measured its own base policies' gates (one seed, a few rollouts: the smoke test's),
    # and one seed bounds no learning gate, so nothing gets a verdict.
    gates = results["gates"]
    assert gates["source"] == "run" and gates["size"]["seeds"] == [QUICK.first_seed]
    assert set(gates["tasks"]) == {spec.name for spec in QUICK.tasks}
    assert all(len(t["base"]) == 1 and not t["counts"] for t in gates["tasks"].values())
    assert {c["verdict"] for c in results["confirmatory_comparisons"]} == {NO_VERDICT}
    page = (out / "reproduction.md").read_text()
    assert "| # | the paper |" in page and "img/final_success.png" in page
    assert "## Gates" in page and "measured on this run's own seeds, not a pilot's" in page
    # The page is a function of results.json: it renders again from it alone.
    from mpo_lab.reproduce.report import page_from_results

    figures = [(f["title"], f["path"], f["caption"]) for f in results["figures"]]
    assert page_from_results(results, QUICK, figures) == page
    for arm in QUICK.arms:
        assert arm.label in page
    # The smoke test's page says what it is and repeats nothing that holds only for the full run.
    assert page.splitlines()[0] == "# Reproduction of the MPO paper's claims at toy scale (smoke test)"
    assert "**This is a smoke test**" in page and "decide nothing" in page
    for full_only in ("these are the final seeds", "(this configuration)", "`make reproduce` rewrites"):
        assert full_only not in page, full_only
    assert "Rerun: `mpo-rs reproduce --quick --out DIR`" in page
    # A summary at the top: the bottom line, the estimates per task, the confirmatory comparisons' verdicts, caveats.
    summary = page.split("## Summary\n\n", 1)[1].split("\nConfiguration **quick**", 1)[0]
    assert page.index("## Summary") < page.index("## Claims")
    assert summary.startswith("**Bottom line.** ")
    assert [r[0] for r in _table(summary, "| task | chance | seeds |")] == [
        "Search", "MultiHop", "FrozenLake", "KeyDoor", "GuessNumber"
    ]  # fmt: skip
    verdicts = _table(summary, "| task | comparison |")
    for what in ("MPO - GRPO", "MPO - GSPO", "MPO - PPO", "MPO - MPO w/ token IS"):
        assert ["Search", what] in [r[:2] for r in verdicts]  # Table 1's comparisons: on every task
        assert ["GuessNumber", what] in [r[:2] for r in verdicts]
    caveats = [line for line in summary.splitlines() if line.startswith("- **")]
    assert len(caveats) == len(QUICK.tasks) and all("one seed per arm" in c for c in caveats)
    assert results["summary"] == summary.strip()

    # With a docs directory (the committed page's place; the command allows it for the instrument
    # only), resuming the finished run writes the page, its figures and its tables there, and the
    # page renders again from the tables it wrote.
    from mpo_lab.reproduce.api import run_config
    from mpo_lab.reproduce.report import DOCS_TABLES, docs_figure

    docs = tmp_path / "docs"
    run_config(QUICK, out, docs=docs)
    for name in DOCS_TABLES:
        assert (docs / "full" / name).read_bytes() == (out / name).read_bytes(), name
    for f in results["figures"]:
        assert (docs / docs_figure(f["path"])).is_file(), f["path"]
    written = json.loads((docs / "full" / "results.json").read_text())
    figures = [(f["title"], docs_figure(f["path"]), f["caption"]) for f in written["figures"]]
    assert page_from_results(written, QUICK, figures, docs_dir=docs) == (docs / "reproduction.md").read_text()


# --------------------------------------------------------------------------- output and stops


def test_out_that_is_not_an_earlier_output_is_refused(tmp_path: Path, capsys):
    """`reproduce --quick --out docs` replaced the committed page: a non-empty --out that
    `reproduce` did not write is refused, and nothing in it changes."""
    from mpo_rs.cli import main

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "reproduction.md").write_text("the committed page")
    assert main(["reproduce", "--quick", "--out", str(docs)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "--overwrite" in err, err
    assert [p.name for p in docs.iterdir()] == ["reproduction.md"]
    assert (docs / "reproduction.md").read_text() == "the committed page"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["reproduce", "--quick", "--out", str(a_file)]) == 2
    assert a_file.read_text() == "x"


def test_out_of_another_configuration_is_refused(tmp_path: Path, capsys):
    from mpo_lab.reproduce.output import claim_output_dir
    from mpo_rs.cli import main

    out = tmp_path / "out"
    claim_output_dir(out, "0123456789ab", overwrite=False)
    (out / "results.json").write_text("{}")
    assert main(["reproduce", "--quick", "--out", str(out)]) == 2
    assert "configuration" in capsys.readouterr().err
    assert (out / "results.json").read_text() == "{}"


def _console_reproduce(out: Path, *extra: str) -> subprocess.Popen[str]:
    def default_signals() -> None:  # a background job's parent ignores SIGINT; undo it
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)

    script = "import sys\nfrom mpo_rs_cli import main\nsys.exit(main())"
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            script,
            "reproduce",
            "--quick",
            "--arms",
            STOP_ARMS,
            "--seeds",
            "4",
            "--workers",
            "2",
            "--out",
            str(out),
            *extra,
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=default_signals,
        start_new_session=True,
    )


# Three of the main task's arms on four seeds: twelve runs, so a stop after the third lands
# with runs still queued, and the resume that finishes them takes seconds, not minutes.
STOP_ARMS = "grpo,ppo,mpo"


@pytest.mark.parametrize("how", ["ctrl-c to the process group", "SIGTERM to the process"])
def test_a_stop_is_prompt_keeps_finished_runs_and_resumes(tmp_path: Path, how: str):
    """`reproduce --workers 2` ignored SIGTERM/SIGINT and ran every queued run to the end,
    then wrote nothing. A stop ends it within seconds with one line (no worker
    traceback), keeps the finished runs, and the same command resumes from them."""
    pytest.importorskip("matplotlib")
    from stops import Lines, wait

    out = tmp_path / "out"
    proc = _console_reproduce(out)
    assert proc.stderr is not None
    lines = Lines(proc.stderr)  # every read and wait below has a deadline: a hang fails the test
    try:
        lines.until(lambda line: line.startswith("mpo-rs: run 3/"), timeout=300)
    except AssertionError:
        proc.kill()
        raise
    assert proc.poll() is None, "".join(lines.seen)
    started = time.monotonic()
    if how.startswith("ctrl-c"):
        os.killpg(proc.pid, signal.SIGINT)
        code = 128 + signal.SIGINT
    else:
        proc.send_signal(signal.SIGTERM)
        code = 128 + signal.SIGTERM
    wait(proc, timeout=30)
    rest = lines.rest(timeout=30)
    proc.stderr.close()
    assert time.monotonic() - started < 5.0
    assert proc.returncode == code, rest
    assert "Traceback" not in rest
    last = [line for line in rest.splitlines() if not line.startswith("mpo-rs: run ")]
    assert len(last) == 1 and last[0].startswith("mpo-rs: error: stopped: "), rest
    kept = int(re.search(r"stopped: (\d+) of (\d+) runs", last[0]).group(1))  # type: ignore[union-attr]
    saved = sorted((out / "runs").glob("*.json"))
    assert len(saved) == kept >= 3
    assert not (out / "reproduction.md").exists()

    proc = _console_reproduce(out)
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    runs = 4 * len(STOP_ARMS.split(","))
    assert f"resuming: {kept} of {runs} runs already finished" in err
    assert len(list((out / "runs").glob("*.json"))) == runs
    assert (out / "reproduction.md").is_file()
