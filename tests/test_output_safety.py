"""The output-safety rule's report directories from Python (`mpo_rs._native.check_output_dir`,
`claim_output_dir`, `output_dir_marker`; rust/logs/src/safety.rs), as `mpo-rs diagnose -o`
and `mpo-rs reproduce --out` use them. The rule for `advantages` is tested through the CLI
in tests/test_cli.py."""

from __future__ import annotations

import os

import pytest

from mpo_rs import InvalidOptionError, _native


def test_a_report_directory_records_its_tool_and_configuration(tmp_path):
    out = tmp_path / "runs" / "out"  # parents are created
    assert _native.check_output_dir(out, "reproduce") is None
    assert not out.exists(), "a check writes nothing"
    assert _native.claim_output_dir(out, "reproduce", "3fa2c1d4e5f6") is None
    assert _native.output_dir_marker(out) == ("reproduce", "3fa2c1d4e5f6")
    (out / "results.json").write_text("{}")
    # The same tool again: allowed, and told the configuration it made the output with.
    assert _native.check_output_dir(out, "reproduce") == "3fa2c1d4e5f6"
    assert _native.claim_output_dir(out, "reproduce", "000000000000") == "3fa2c1d4e5f6"
    assert _native.output_dir_marker(out) == ("reproduce", "000000000000")
    assert (out / "results.json").read_text() == "{}", "claiming deletes nothing"
    assert sorted(p.name for p in out.iterdir()) == [".mpo-rs-output", "results.json"]


def test_a_directory_that_is_not_the_tools_is_refused_unless_asked_for(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "reproduction.md").write_text("the committed page")
    with pytest.raises(InvalidOptionError, match=r"^--out .*docs is not empty and was not written by mpo-rs reproduce"):
        _native.check_output_dir(docs, "reproduce", label="--out")
    with pytest.raises(InvalidOptionError, match=r"reproduction\.md"):
        _native.claim_output_dir(docs, "reproduce", "abc")
    assert sorted(p.name for p in docs.iterdir()) == ["reproduction.md"]
    assert _native.claim_output_dir(docs, "reproduce", "abc", overwrite=True) is None
    assert _native.output_dir_marker(docs) == ("reproduce", "abc")
    # Another tool's output is refused the same way.
    with pytest.raises(InvalidOptionError, match="is the output of mpo-rs reproduce, not of mpo-rs diagnose"):
        _native.claim_output_dir(docs, "diagnose")


def test_what_is_not_a_directory_and_bad_arguments_are_usage_errors(tmp_path):
    (tmp_path / "file").write_text("keep")
    with pytest.raises(InvalidOptionError, match="is a file, and a report is a directory"):
        _native.claim_output_dir(tmp_path / "file", "diagnose", overwrite=True)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InvalidOptionError, match="is a FIFO"):
        _native.check_output_dir(tmp_path / "fifo", "diagnose", overwrite=True)
    with pytest.raises(InvalidOptionError, match="unknown report tool `advantages`; choose one of diagnose, reproduce"):
        _native.check_output_dir(tmp_path / "new", "advantages")
    for bad in ("", "two words", "x" * 129):
        with pytest.raises(InvalidOptionError, match="configuration id"):
            _native.claim_output_dir(tmp_path / "new", "reproduce", bad)
    assert not (tmp_path / "new").exists()
    assert _native.output_dir_marker(tmp_path / "file") is None
    assert _native.output_dir_marker(tmp_path / "missing") is None
