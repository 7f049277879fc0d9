"""`mpo-rs advantages` on bad input and bad usage: every bad column, row, file, page checksum,
option and path combination is one line naming what and where, with exit code 1 for the data and
2 for the usage."""

from __future__ import annotations

import os
import shutil
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import test_cli  # noqa: E402
from test_cli import make_log, ok, run_cli, table_of  # noqa: E402

# test_cli.py's log and its Parquet file (module-scoped fixtures, found here by name).
log, log_file = test_cli.log, test_cli.log_file


def _write_bad(tmp_path: Path, name: str, table: pa.Table, **kw) -> Path:
    path = tmp_path / name
    pq.write_table(table, path, row_group_size=10, **kw)
    return path


def _with_column(table: pa.Table, name: str, column) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, column)


def _bad_inputs(tmp_path: Path):
    log = make_log(30, seed=3)
    t = table_of(log)
    off = log["offsets"]
    rows = lambda a: [list(map(float, a[x:y])) for x, y in pairwise(off)]  # noqa: E731
    values = rows(log["values"])
    f32 = pa.list_(pa.float32())

    null_list = list(values)
    null_list[14] = None
    null_elem = [list(v) for v in values]
    null_elem[23][1 if len(null_elem[23]) > 1 else 0] = None
    token = 1 if len(values[23]) > 1 else 0
    short = [list(v) for v in values]
    short[17] = short[17] + [0.0]
    masks = [list(map(int, log["mask"][x:y])) for x, y in pairwise(off)]
    masks[25][0] = 7
    nan = [list(v) for v in values]
    q = int(np.flatnonzero(log["mask"][off[12] : off[13]])[0])
    nan[12][q] = float("nan")
    obs = [list(v) for v in rows(log["rewards"])]
    zero_at = np.flatnonzero(log["mask"][off[8] : off[9]] == 0)
    scores = log["scores"].copy().astype(object)
    scores[21] = None

    cases = [
        (
            "null list",
            _with_column(t, "values", pa.array(null_list, f32)),
            [],
            r"row group 1: row 14, column `values`: null list",
        ),
        (
            "null element",
            _with_column(t, "values", pa.array(null_elem, f32)),
            [],
            rf"row group 2: row 23, column `values`: null element at token {token}",
        ),
        (
            "lengths",
            _with_column(t, "values", pa.array(short, f32)),
            [],
            r"row group 1: row 17: column `values` has \d+ tokens but `loss_mask` has \d+",
        ),
        (
            "mask value",
            _with_column(t, "loss_mask", pa.array(masks, pa.list_(pa.int32()))),
            [],
            r"row group 2: row 25, column `loss_mask`: the mask must hold 0 or 1, found 7 at token 0",
        ),
        (
            "nan",
            _with_column(t, "values", pa.array(nan, f32)),
            [],
            rf"row group 1: row 12, column `values`: NaN is not finite at token {q}",
        ),
        ("missing", t.drop_columns(["values"]), [], r"missing column `values`"),
        (
            "type",
            _with_column(t, "values", pa.array([["a"]] * 30)),
            [],
            r"column `values` has type .*, expected list<float or integer>",
        ),
        (
            "null score",
            _with_column(t.drop_columns(["rewards"]), "score", pa.array(list(scores), pa.float32())),
            ["--estimator", "grpo"],
            r"row group 2: row 21, column `score`: null value",
        ),
    ]
    if zero_at.size:
        obs[8][int(zero_at[0])] = 0.5
        cases.append(
            (
                "observation reward",
                _with_column(t, "rewards", pa.array(obs, f32)),
                [],
                rf"row group 0: row 8, column `rewards`: reward 0.5 at observation token {int(zero_at[0])}",
            )
        )
    for name, table, extra, pattern in cases:
        yield name, _write_bad(tmp_path, name.replace(" ", "-") + ".parquet", table), extra, pattern


def test_each_bad_input_is_one_line_naming_file_row_group_row_and_column(tmp_path):
    import re

    for name, path, extra, pattern in _bad_inputs(tmp_path):
        out = tmp_path / "out.parquet"
        r = run_cli("advantages", path, "-o", out, *extra)
        assert r.returncode == 1, (name, r.stderr)
        assert r.stdout == "" and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (name, r.stderr)
        assert r.stderr.startswith(f"mpo-rs: error: {path}"), (name, r.stderr)
        assert re.search(pattern, r.stderr), (name, r.stderr)
        assert not out.exists(), name


def test_corrupt_truncated_and_missing_files(log_file, tmp_path):
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 this is not parquet at all")
    cut = tmp_path / "cut.parquet"
    data = log_file.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    bad_page = tmp_path / "bad-page.parquet"
    mangled = bytearray(data)
    mangled[200:4000] = os.urandom(3800)  # inside the first column chunks
    bad_page.write_bytes(bytes(mangled))
    for path, pattern in [
        (garbage, "cannot read Parquet"),
        (cut, "cannot read Parquet"),
        (bad_page, r"row group 0: column `\w+`: cannot read Parquet"),
        (tmp_path / "missing.parquet", "cannot open input"),
    ]:
        r = run_cli("advantages", path, "-o", tmp_path / "out.parquet")
        assert r.returncode == 1, r.stderr
        assert r.stderr.count("\n") == 1 and str(path) in r.stderr, r.stderr
        assert pattern in r.stderr or __import__("re").search(pattern, r.stderr), r.stderr
    assert not (tmp_path / "out.parquet").exists()


def _flip_inside_a_data_page(src: Path, dst: Path, column: str) -> None:
    """Copies `src` to `dst` with 4 bytes of `column`'s last data page in row group 0
    inverted: its payload, not a header and not the footer."""
    md = pq.ParquetFile(src).metadata.row_group(0)
    chunk = next(md.column(j) for j in range(md.num_columns) if md.column(j).path_in_schema.split(".")[0] == column)
    assert not chunk.has_dictionary_page
    end = chunk.data_page_offset + chunk.total_compressed_size
    data = bytearray(src.read_bytes())
    data[end - 8 : end - 4] = bytes(b ^ 0xFF for b in data[end - 8 : end - 4])
    dst.write_bytes(bytes(data))


@pytest.mark.parametrize("estimator", ["mae", "grpo"])
def test_page_checksums_are_verified(log, tmp_path, estimator):
    src = tmp_path / "crc.parquet"
    # Plain, uncompressed pages: a flipped byte changes a value and nothing else notices.
    pq.write_table(table_of(log, slice(0, 60)), src, write_page_checksum=True, compression="NONE", use_dictionary=False)
    out = tmp_path / "out.parquet"
    ok("advantages", src, "-o", out, "-q", "--estimator", estimator)
    before = out.read_bytes()
    column = "values" if estimator == "mae" else "score"
    bad = tmp_path / "bad.parquet"
    _flip_inside_a_data_page(src, bad, column)
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        pq.read_table(bad, page_checksum_verification=True)
    r = run_cli("advantages", bad, "-o", out, "--estimator", estimator)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert f"{bad}: row group 0: column `{column}`: cannot read Parquet" in r.stderr, r.stderr
    assert "CRC checksum mismatch" in r.stderr, r.stderr
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.parquet", "crc.parquet", "out.parquet"]


@pytest.mark.parametrize(
    "args, pattern",
    [
        ([], "required"),
        (["advantages", "IN"], "the following arguments are required: -o/--output"),
        (["advantages", "IN", "-o", "OUT", "--estimator", "ppo"], "invalid choice: 'ppo'"),
        (["advantages", "IN", "-o", "OUT", "--lam", "x"], "invalid float value"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, pattern):
    r = run_cli(*args)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and pattern in r.stderr, r.stderr


@pytest.mark.parametrize(
    "extra, pattern",
    [
        (["--estimator", "gae", "--beta", "0.5"], "`beta` does not apply to the gae estimator"),
        (["--estimator", "grpo", "--lam", "0.5"], "`lam` does not apply to the grpo estimator"),
        (["--lam", "2"], "`lam` = 2 is out of range"),
        (["--gamma", "nan"], "`gamma` = NaN is out of range"),
        (["--rewards-col", "rewards", "--score-col", "score"], "not both"),
    ],
)
def test_unusable_options_exit_2(log_file, tmp_path, extra, pattern):
    r = run_cli("advantages", log_file, "-o", tmp_path / "o.parquet", *extra)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and pattern in r.stderr, r.stderr


def test_path_combinations_exit_2(log_file, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(log_file, src / "a.parquet")
    (tmp_path / "file.parquet").write_bytes(b"x")
    for out, pattern in [
        (src / "out", "inside the INPUT directory"),
        (tmp_path, "is inside OUTPUT"),
        (tmp_path / "file.parquet", "OUTPUT must be a directory"),
    ]:
        r = run_cli("advantages", src, "-o", out)
        assert r.returncode == 2 and pattern in r.stderr, r.stderr
    r = run_cli("advantages", log_file, "-o", src)
    assert r.returncode == 2 and "OUTPUT must be a file path" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_cli("advantages", empty, "-o", tmp_path / "o")
    assert r.returncode == 2 and "holds no .parquet files" in r.stderr
