"""The gates in the analysis plan, in a run's results and on its page: the plan registers the
gates' thresholds, each built-in task's role and the equivalence margins; a comparison on a
task that does not pass its gates gets no verdict and no equivalence reading; an undecided one
on a gated task reads "equivalent within ±m" only when the TOST rejects (its 90% interval lies
inside the margin); a gates file round-trips into results.json and the page (numpy only)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from mpo_lab.reproduce.analysis import claims, confirmatory_comparisons
from mpo_lab.reproduce.gate_rules import GATES
from mpo_lab.reproduce.gates import gates_payload
from mpo_lab.reproduce.gating import gates_section, own_measurement_size, read_gates_file, withheld
from mpo_lab.reproduce.plan import PLAN, render_markdown
from mpo_lab.reproduce.presets import FULL, QUICK
from mpo_lab.reproduce.stats import INCONCLUSIVE, NO_VERDICT, REPRODUCED, combine, paired_diff_ci, t_quantile, tost_p
from mpo_lab.reproduce.tasks import TASK_PREFIX, task_role
from mpo_rs.exceptions import InvalidOptionError

DOCS = Path(__file__).resolve().parents[1] / "docs"
CONFIG = FULL.with_arms(["grpo", "ppo", "mpo"])  # Search's Table-1 arms: 4 confirmatory comparisons


# --------------------------------------------------------------------------- the plan


def test_the_plan_registers_the_gates_the_roles_and_the_margins():
    assert PLAN.gates is GATES  # read from the gates, never copied
    assert dict(PLAN.task_roles) == {
        "search": "premise",
        "multi_hop": "premise",
        "frozen_lake": "premise",
        "sokoban": "premise",
        "key_door": "control",
        "guess_number": "chance",
    }
    # The built-in tasks when the plan was committed: one added since is not in it (nor in its hash).
    assert [t for t, _ in PLAN.task_roles] == [t for t in TASK_PREFIX if t != "coin_collector"]
    assert task_role("coin_collector") == "premise" and PLAN.plan_hash() == "eea53a9931bd"
    assert task_role("search@think16") == "premise" and task_role("examples.my_env:make") == "user"
    assert (PLAN.margin("auc_success"), PLAN.margin("final_success")) == (0.03, 0.05)
    assert math.isnan(PLAN.margin("final_turns"))
    digest = PLAN.plan_hash()
    for change in (
        {"gates": dataclasses.replace(GATES, premise_share=0.7)},
        {"gates": dataclasses.replace(GATES, learning_arms=("grpo",))},
        {"task_roles": PLAN.task_roles[:-1]},
        {"equivalence_margins": (("auc_success", 0.02), ("final_success", 0.05))},
    ):
        assert dataclasses.replace(PLAN, **change).plan_hash() != digest, change
    assert dataclasses.replace(PLAN).plan_hash() == digest
    # The record states them from the plan's values, not from numbers typed twice.
    record = render_markdown()
    assert "±m, with m = 0.03 on `auc_success`, 0.05 on `final_success`" in record
    assert "between-turn share >= 0.8 on a premise task, < 0.5 on the negative control" in record
    other = render_markdown(dataclasses.replace(PLAN, gates=dataclasses.replace(GATES, premise_share=0.7)))
    assert "between-turn share >= 0.7 on a premise task" in other
    assert (DOCS / "analysis-plan.md").read_text() == record


# --------------------------------------------------------------------------- TOST


def _paired(d: np.ndarray):
    return paired_diff_ci(dict(enumerate(d)), dict.fromkeys(range(d.size), 0.0))


@pytest.mark.parametrize("n", [4, 12, 40])
def test_tost_rejects_exactly_when_the_90_percent_interval_lies_inside_the_margin(n):
    rng = np.random.default_rng(n)
    for _ in range(200):
        d = rng.normal(rng.uniform(-0.05, 0.05), rng.uniform(0.005, 0.08), n)
        p = _paired(d)
        se = float(d.std(ddof=1)) / math.sqrt(n)
        assert (p.high - p.low) / 2 == pytest.approx(t_quantile(n - 1) * se)
        low90, high90 = _ci90(d)
        inside = -0.03 < low90 and high90 < 0.03
        assert (tost_p(p.diff, p.low, p.high, p.n, 0.03) < 0.05) == inside


def _ci90(d: np.ndarray) -> tuple[float, float]:
    stats = pytest.importorskip("scipy.stats")
    return stats.t.interval(0.90, d.size - 1, loc=d.mean(), scale=stats.sem(d))


def test_tost_matches_scipys_two_one_sided_tests():
    stats = pytest.importorskip("scipy.stats")
    d = np.array([0.01, -0.02, 0.015, 0.0, 0.005, -0.01, 0.02, 0.0])
    lower = stats.ttest_1samp(d, -0.03, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, 0.03, alternative="less").pvalue
    p = _paired(d)
    assert tost_p(p.diff, p.low, p.high, p.n, 0.03) == pytest.approx(max(lower, upper), rel=1e-9)
    assert math.isnan(tost_p(0.0, math.nan, math.nan, 1, 0.03)) and math.isnan(tost_p(0.0, -1, 1, 5, math.nan))
    assert combine([NO_VERDICT, NO_VERDICT]) == NO_VERDICT and combine([NO_VERDICT, REPRODUCED]) == INCONCLUSIVE


# --------------------------------------------------------------------------- gates decide what counts


def _rows(mpo: float, ppo: float, grpo: float, base: float = 0.2, noise: float = 0.01, seeds: int = 12):
    """Search's three arms over ``seeds`` seeds: final and mean success ``value`` plus a small
    per-seed wobble, from a base policy at ``base``, critics at 0.35 explained variance."""
    rng = np.random.default_rng(0)
    rows = []
    for arm, value in (("mpo", mpo), ("ppo", ppo), ("grpo", grpo)):
        for seed in range(1, seeds + 1):
            x = value + noise * rng.standard_normal()
            rows.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "final_success": x,
                    "auc_success": x,
                    "base_success": base,
                    "warmup_explained_variance": 0.35,
                    "final_explained_variance": 0.35,
                    **dict.fromkeys(("final_entropy", "final_turns", "between_share"), math.nan),
                    "wall_s": 1.0,
                }
            )
    return rows


def _base(entropy: float = 0.5, share: float = 0.9) -> list[dict]:
    return [
        {"task": "search", "seed": s, "entropy": entropy, "distinct_groups": 0.6, "critic_ceiling": 0.5,
         "between_share": share}
        for s in (1001, 1002)
    ]  # fmt: skip


def _measured(base: list[dict] | None = None) -> dict:
    return {"source": "file", "file": "gates.json", "file_config": "pilot-gates", "tasks": {"search": {"base": base}}}


def test_a_task_that_passes_its_gates_keeps_its_verdicts_and_reads_equivalence_by_the_margin():
    rows = _rows(mpo=0.50, ppo=0.50, grpo=0.40)
    section = gates_section(CONFIG, rows, _measured(_base()))
    assert section["tasks"]["search"]["counts"] and section["tasks"]["search"]["withheld"] == ""
    comps = {(c.metric, c.b): c for c in confirmatory_comparisons(rows, [], CONFIG, withheld(section, CONFIG))}
    assert comps[("auc_success", "grpo")].verdict == REPRODUCED
    near = comps[("auc_success", "ppo")]
    assert near.verdict == INCONCLUSIVE and near.margin == 0.03 and near.p_tost < 0.05
    assert near.reading() == "equivalent within ±0.03"
    assert comps[("final_success", "ppo")].reading() == "equivalent within ±0.05"
    # A wide interval around the same difference: no difference shown, never equivalence.
    wide = _rows(mpo=0.50, ppo=0.50, grpo=0.40, noise=0.08)
    section = gates_section(CONFIG, wide, _measured(_base()))
    c = next(c for c in confirmatory_comparisons(wide, [], CONFIG, withheld(section, CONFIG)) if c.b == "ppo")
    assert c.verdict == INCONCLUSIVE and c.p_tost >= 0.05 and c.reading() == "no difference shown"


@pytest.mark.parametrize(
    ("rows", "base", "reason"),
    [
        (_rows(mpo=0.25, ppo=0.25, grpo=0.15), _base(), "the task fails the learning gate"),
        (_rows(mpo=0.50, ppo=0.50, grpo=0.40), _base(entropy=0.01), "the task fails the exploration gate"),
        (_rows(mpo=0.50, ppo=0.50, grpo=0.40), _base(share=0.6), "the task fails the premise gate"),
        (
            _rows(mpo=0.50, ppo=0.50, grpo=0.40),
            None,
            "its exploration, predictability and premise gates were not measured",
        ),
    ],
)
def test_a_task_that_fails_a_gate_gets_no_verdict_and_no_equivalence(rows, base, reason):
    section = gates_section(CONFIG, rows, _measured(base))
    assert not section["tasks"]["search"]["counts"] and section["tasks"]["search"]["withheld"] == reason
    gated = withheld(section, CONFIG)
    comps = confirmatory_comparisons(rows, [], CONFIG, gated)
    assert comps and all(c.verdict == NO_VERDICT and c.withheld == reason for c in comps)
    assert all(math.isnan(c.p_tost) and c.reading() == f"no verdict: {reason}" for c in comps)
    assert all(math.isfinite(c.p_holm) for c in comps)  # the numbers stay, for the record
    found = {c.number: c for c in claims(rows, CONFIG, gated)}
    assert found[2].verdict == NO_VERDICT and all(c.verdict == NO_VERDICT for c in found[2].comparisons)
    # Ungated (the statistics alone), the same rows decide MPO - GRPO; nothing reads as equivalence.
    ungated = confirmatory_comparisons(rows, [], CONFIG)
    assert next(c for c in ungated if c.b == "grpo").verdict == REPRODUCED
    assert all(math.isnan(c.p_tost) and not c.reading().startswith("equivalent") for c in ungated)


def test_a_task_missing_from_the_gates_is_not_measured():
    assert withheld(None, CONFIG)["search"] == "its gates were not measured"
    rows = _rows(mpo=0.5, ppo=0.5, grpo=0.4)
    assert all(c.verdict == NO_VERDICT for c in confirmatory_comparisons(rows, [], CONFIG, withheld(None, CONFIG)))


def test_the_quick_budget_measures_its_own_base_policies_cheaply():
    assert own_measurement_size(QUICK) == (1, QUICK.budget.eval_tasks, QUICK.budget.group_size)
    assert own_measurement_size(FULL) == (2, 64, 16)


# --------------------------------------------------------------------------- the gates file and the page


def test_a_gates_file_round_trips_into_the_results_and_the_page(tmp_path):
    from mpo_lab.reproduce.report import page_from_results

    spec = CONFIG.task("search")
    payload = gates_payload("pilot-gates", [{"task": "search", "params": dict(spec.params), "role": "premise",
                                             "base": _base(), "learned": None}])  # fmt: skip
    path = tmp_path / "gates.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    measured = read_gates_file(path, CONFIG)
    assert measured["source"] == "file" and measured["file"] == "gates.json"
    assert measured["tasks"]["search"]["base"] == _base()
    rows = _rows(mpo=0.50, ppo=0.50, grpo=0.40)
    section = gates_section(CONFIG, rows, measured)
    # results.json keeps the section; judged again from it, it is the same.
    again = json.loads(json.dumps(section))
    assert gates_section(CONFIG, rows, again) == again
    assert again["thresholds"] == json.loads(json.dumps(dataclasses.asdict(GATES)))
    assert [r["gate"] for r in again["tasks"]["search"]["judged"]] == [
        "learning", "exploration", "predictability", "premise"
    ]  # fmt: skip
    assert all(r["passed"] for r in again["tasks"]["search"]["judged"])

    results = {
        "runs": rows,
        "chance": {},
        "meta": {"wall_s": 60.0, "workers": 1, "started": "today", "resumed": 0},
        "gates": again,
        "confirmatory": {"plan_hash": PLAN.plan_hash()},
    }
    page = page_from_results(results, CONFIG, [])
    gates = page.split("\n## Gates\n", 1)[1].split("\n## ", 1)[0]
    assert page.index("## Summary") < page.index("## Gates") < page.index("## Claims")
    assert "read from the gates file `gates.json`" in gates and "Gated: Search." in gates
    assert "### Search (premise task)\n\nIts comparisons count.\n\n| gate | measured | threshold | passes |" in gates
    assert "| premise | between-turn share 0.90 | >= 0.8 | yes |" in gates
    assert "equivalent within ±0.03" in page and "read here by the current plan" not in page

    # A file that measured the task with other parameters measured another task.
    payload["tasks"][0]["params"] = {"hit_probs": [0.5]}
    path.write_text(json.dumps(payload))
    with pytest.raises(InvalidOptionError, match="measured with"):
        read_gates_file(path, CONFIG)
    path.write_text("{}")
    with pytest.raises(InvalidOptionError, match="not a gates file"):
        read_gates_file(path, CONFIG)


def test_the_paper_configurations_run_was_not_gated_so_its_page_gives_no_verdict():
    page = (DOCS / "paper" / "reproduction.md").read_text()
    bottom_line = page.split("## Summary\n\n", 1)[1].split("\n\n", 1)[0]
    assert "**none gets a verdict**" in bottom_line and "**reproduced**" not in bottom_line
    gates = page.split("\n## Gates\n", 1)[1].split("\n## ", 1)[0]
    assert "the exploration, predictability and premise gates were not measured for it" in gates
    assert "No task passes every gate, so no comparison on this page gets a verdict." in gates
    results = json.loads((DOCS / "paper" / "full" / "results.json").read_text())
    assert "gates" not in results  # the run's own record, unchanged


def test_reproduce_reads_a_gates_file_and_refuses_a_bad_one_before_running(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    pytest.importorskip("matplotlib")
    from mpo_rs.cli import main

    out = tmp_path / "out"
    argv = ["reproduce", "--quick", "--arms", "door_grpo,door_ppo,door_mpo", "--workers", "1", "--out", str(out)]
    assert main([*argv, "--gates", str(tmp_path / "missing.json")]) == 2
    assert "not a gates file" in capsys.readouterr().err and not out.exists()

    spec = QUICK.task("key_door")
    base = [{"task": "key_door", "seed": 0, "entropy": 0.4, "distinct_groups": 0.5, "critic_ceiling": 0.1,
             "between_share": 0.2}]  # fmt: skip
    path = tmp_path / "gates.json"
    path.write_text(json.dumps(gates_payload("pilot-gates", [{"task": "key_door", "params": dict(spec.params),
                                                               "role": "control", "base": base, "learned": None}])))  # fmt: skip
    assert main([*argv, "--gates", str(path)]) == 0
    results = json.loads((out / "results.json").read_text())
    gates = results["gates"]
    assert (gates["source"], gates["file"], gates["file_config"]) == ("file", "gates.json", "pilot-gates")
    door = gates["tasks"]["key_door"]
    assert door["role"] == "control" and door["base"] == base
    # Exploration and premise pass on the file's numbers; one seed bounds no learning: no verdict.
    assert [(r["gate"], r["passed"]) for r in door["judged"]] == [
        ("learning", None), ("exploration", True), ("premise", True)
    ]  # fmt: skip
    assert door["withheld"] == "its learning gate was not measured"
    assert {c["verdict"] for c in results["confirmatory_comparisons"]} == {NO_VERDICT}
    page = (out / "reproduction.md").read_text()
    assert "read from the gates file `gates.json`" in page and "### KeyDoor (negative control)" in page
