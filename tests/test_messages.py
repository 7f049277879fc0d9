"""Messages a person can act on: misspelt names get a suggestion (flags, estimators,
options and columns, one rule, mpo-core's ``closest``, from the command line, the Python
API and the Arrow path), and a comparison says which way it goes in words."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mpo_rs
from mpo_rs._native import closest_name
from mpo_rs.cli import main


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_closest_name_is_the_core_rule() -> None:
    assert closest_name("lamb", ["lam", "lam_intra", "beta"]) == "lam"
    assert closest_name("--lam_intra", ["--lam", "--lam-intra"]) == "--lam-intra"
    assert closest_name("ppo", ["mae", "gae", "grpo", "drgrpo", "rloo", "bilevel"]) is None


def test_a_misspelt_flag_names_the_subcommand_help_and_the_likely_flag(capsys, tmp_path) -> None:
    err = _usage_error(capsys, ["advantages", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--lam_intra", "0.9"])
    assert err.startswith("mpo-rs advantages: error: unrecognized arguments: --lam_intra 0.9"), err
    assert "did you mean --lam-intra?" in err and "(see `mpo-rs advantages --help`)" in err, err
    err = _usage_error(capsys, ["diagnose", str(tmp_path / "in"), "--value-col", "v"])
    assert "mpo-rs diagnose: error: unrecognized arguments" in err and "did you mean --values-col?" in err, err
    assert "(see `mpo-rs diagnose --help`)" in err
    # Far from every flag: no guess, still the subcommand's help.
    err = _usage_error(capsys, ["advantages", "in", "-o", "out", "--temperature", "1"])
    assert "did you mean" not in err and "(see `mpo-rs advantages --help`)" in err, err


def test_a_misspelt_choice_suggests_the_likely_one(capsys) -> None:
    err = _usage_error(capsys, ["advantages", "in", "-o", "out", "--estimator", "maee"])
    assert "invalid choice: 'maee'" in err and "did you mean mae?" in err, err


def test_a_misspelt_estimator_or_option_suggests_the_likely_one() -> None:
    with pytest.raises(mpo_rs.InvalidOptionError, match=r"unknown estimator `bilevl` \(did you mean `bilevel`\?\)"):
        mpo_rs.Estimator("bilevl")
    with pytest.raises(
        mpo_rs.InvalidOptionError, match=r"`lam_intr` is not an option .* \(did you mean `lam_intra`\?\)"
    ):
        mpo_rs.Estimator("mae", lam_intr=0.9)
    with pytest.raises(mpo_rs.InvalidOptionError) as e:
        mpo_rs.Estimator("ppo")
    assert "did you mean" not in str(e.value)


def test_a_misspelt_column_suggests_the_likely_one(tmp_path, capsys) -> None:
    log = tmp_path / "log.parquet"
    table = pa.table(
        {
            "loss_mask": pa.array([[1, 1, 0, 1]], pa.list_(pa.int8())),
            "values": pa.array([[0.0, 0.1, 0.2, 0.3]], pa.list_(pa.float32())),
            "score": pa.array([1.0], pa.float32()),
        }
    )
    pq.write_table(table, log)
    code = main(["advantages", str(log), "-o", str(tmp_path / "out.parquet"), "--values-col", "value"])
    err = capsys.readouterr().err
    assert code == 1 and "missing column `value` (did you mean `values`? columns are:" in err, err


def test_a_misspelt_column_gets_the_input_s_likely_one_from_arrow_and_diagnose(tmp_path, capsys) -> None:
    from mpo_rs.arrow import with_advantages

    table = pa.table(
        {
            "loss_mask": pa.array([[1, 1, 0, 1]], pa.list_(pa.int8())),
            "values": pa.array([[0.0, 0.1, 0.2, 0.3]], pa.list_(pa.float32())),
            "score": pa.array([1.0], pa.float32()),
        }
    )
    with pytest.raises(mpo_rs.InvalidBatchError) as e:
        with_advantages(table, values_col="value")
    message = str(e.value)
    assert "missing column `value` (did you mean `values`? the input's columns are: loss_mask, values, score)" in (
        message
    ), message
    log = tmp_path / "log.parquet"
    pq.write_table(table, log)
    assert main(["diagnose", str(log), "--values-col", "value"]) == 1
    err = capsys.readouterr().err
    assert "missing column `value` (did you mean `values`? columns are: loss_mask, values, score)" in err, err
