"""mpo_rs.rollout_log.RolloutLogWriter: training batches appended to Parquet in the schema of
`mpo-rs advantages` and `mpo-rs diagnose`, atomically per file, rotating by size."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import mpo_rs  # noqa: E402
from mpo_rs import InvalidBatchError, InvalidOptionError, synthetic  # noqa: E402
from mpo_rs.arrow import advantages_parquet  # noqa: E402
from mpo_rs.cli import main as cli_main  # noqa: E402
from mpo_rs.rollout_log import COLUMNS, LOG_METADATA_KEY, RolloutLogWriter  # noqa: E402

AGENT = dict(turns=(2, 4), turn_len=(1, 6), obs_len=(1, 5), prompt_len=(1, 4), values="critic", tokens=True)


def batch(n: int = 24, seed: int = 0, **kw) -> synthetic.FlatBatch:
    return synthetic.flat_batch(n, seed=seed, **{**AGENT, **kw})


def append(writer: RolloutLogWriter, b: synthetic.FlatBatch, step: int, **kw) -> None:
    writer.append_flat(**b.log_columns(), step=step, **kw)


def read_log(directory: Path) -> pa.Table:
    files = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
    return pa.concat_tables([pq.read_table(p) for p in files])


def visible(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


# --------------------------------------------------------------------------- round trip


def test_flat_batches_round_trip_with_the_schema_the_tools_read(tmp_path):
    b = batch()
    with RolloutLogWriter(tmp_path / "log") as w:
        append(w, b, step=7)
    assert [p.name for p in w.files] == ["part-000000-step-000007.parquet"]
    table = read_log(tmp_path / "log")
    assert table.column_names == ["token_ids", "loss_mask", "values", "rewards", "score", "group_id", "step"]
    assert table.schema.field("loss_mask").type == pa.list_(pa.bool_())
    assert table.schema.field("token_ids").type == pa.list_(pa.int32())
    assert json.loads(table.schema.metadata[LOG_METADATA_KEY])["columns"] == dict(COLUMNS)
    expected = synthetic.to_arrow(b)
    for name in ("token_ids", "loss_mask", "values", "rewards", "score", "group_id"):
        assert table.column(name).to_pylist() == expected.column(name).to_pylist(), name
    assert table.column("step").to_pylist() == [7] * b.n_trajectories
    assert w.rows_written == w.rows_appended == b.n_trajectories


def test_advantages_of_the_written_log_equal_those_computed_on_the_batch(tmp_path):
    b = batch(40, seed=3)
    with RolloutLogWriter(tmp_path / "log") as w:
        append(w, b, step=0)
    advantages_parquet(tmp_path / "log", tmp_path / "out")
    out = read_log(tmp_path / "out")
    direct = mpo_rs.mae_advantages(b.values, b.mask, b.offsets, rewards=b.rewards)
    got = np.concatenate([np.asarray(x, np.float32) for x in out.column("advantages").to_pylist()])
    np.testing.assert_array_equal(got, direct.advantages)
    # The group estimators read group_id and score.
    assert (
        cli_main(["advantages", str(tmp_path / "log"), "-o", str(tmp_path / "grpo"), "--estimator", "grpo", "-q"]) == 0
    )
    group = mpo_rs.group_advantages(b.scores, b.group_ids)
    got = np.asarray(
        [row[0] if row else np.nan for row in read_log(tmp_path / "grpo").column("turn_advantages").to_pylist()]
    )
    has_turn = np.diff(b.offsets) > 0
    np.testing.assert_allclose(got[has_turn], np.asarray(group)[has_turn], rtol=1e-6)


def test_diagnose_reads_the_log_in_process_and_splits_by_step(tmp_path, capsys):
    with RolloutLogWriter(tmp_path / "log") as w:
        for step in range(3):
            append(w, batch(16, seed=step), step=step)
    report = tmp_path / "report"
    assert cli_main(["diagnose", str(tmp_path / "log"), "-o", str(report)]) == 0
    summary = json.loads((report / "summary.json").read_text())
    assert summary["rows"] == 48
    assert sorted(summary["by_step"]) == ["0", "1", "2"]
    assert "step" in capsys.readouterr().out


# --------------------------------------------------------------------------- padded


def padded_inputs(b: synthetic.FlatBatch, side: str, extra: int = 3):
    """(B, L) rows of the batch, padded on `side` ("left", "right" or "both"), with garbage
    token ids and values in the padding."""
    lengths = np.diff(b.offsets)
    rows, width = b.n_trajectories, int(lengths.max()) + extra
    ids = np.full((rows, width), 99, np.int64)
    mask = np.zeros((rows, width), np.int64)
    values = np.full((rows, width), np.nan, np.float32)
    rewards = np.zeros((rows, width), np.float32)
    attention = np.zeros((rows, width), np.int64)
    for j in range(rows):
        n = int(lengths[j])
        start = {"left": width - n, "right": 0, "both": (width - n) // 2}[side]
        sl = slice(b.offsets[j], b.offsets[j + 1])
        cols = slice(start, start + n)
        ids[j, cols], mask[j, cols], values[j, cols], rewards[j, cols] = (
            b.token_ids[sl],
            b.mask[sl],
            b.values[sl],
            b.rewards[sl],
        )
        attention[j, cols] = 1
    return ids, mask, attention, values, rewards


@pytest.mark.parametrize("side", ["left", "right", "both"])
def test_left_and_right_padded_rows_are_written_as_their_tokens(tmp_path, side):
    torch = pytest.importorskip("torch")
    b = batch(12, seed=5)
    ids, mask, attention, values, rewards = padded_inputs(b, side)
    with RolloutLogWriter(tmp_path / side) as w:
        w.append_padded(
            input_ids=torch.from_numpy(ids),
            loss_mask=torch.from_numpy(mask),
            attention_mask=torch.from_numpy(attention),
            values=torch.from_numpy(values).to(torch.bfloat16).float(),  # a tensor, as a trainer holds it
            token_rewards=rewards,
            scores=torch.from_numpy(b.scores),
            group_ids=[f"uid-{g}" for g in b.group_ids],
            step=1,
        )
    table = read_log(tmp_path / side)
    expected = synthetic.to_arrow(b)
    for name in ("token_ids", "loss_mask", "rewards"):
        assert table.column(name).to_pylist() == expected.column(name).to_pylist(), name
    bf16 = torch.from_numpy(b.values).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(np.concatenate(table.column("values").to_numpy()), bf16)
    assert table.column("group_id").to_pylist() == [f"uid-{g}" for g in b.group_ids]


def test_padded_rows_without_attention_mask_are_whole_rows(tmp_path):
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    mask = np.array([[0, 1, 1], [0, 0, 1]])
    with RolloutLogWriter(tmp_path / "log") as w:
        w.append_padded(input_ids=ids, loss_mask=mask, scores=np.array([1.0, 0.0]), step=0)
    table = read_log(tmp_path / "log")
    assert table.column_names == ["token_ids", "loss_mask", "score", "step"]
    assert table.column("token_ids").to_pylist() == [[1, 2, 3], [4, 5, 6]]
    # Group ids as Python ints in an object array (as a list of uids might be) are integers.
    with RolloutLogWriter(tmp_path / "groups") as w:
        w.append_padded(input_ids=ids, loss_mask=mask, group_ids=np.array([3, 4], dtype=object), step=0)
    assert read_log(tmp_path / "groups").schema.field("group_id").type == pa.int64()


# --------------------------------------------------------------------------- files


def test_files_rotate_by_size_and_the_directory_reads_as_one_log(tmp_path):
    log = tmp_path / "log"
    batches = [batch(64, seed=s) for s in range(6)]
    with RolloutLogWriter(log, max_file_bytes=20_000, row_group_bytes=10_000) as w:
        for step, b in enumerate(batches):
            append(w, b, step=step)
    names = visible(log)
    assert len(names) >= 3 and names == [p.name for p in w.files]
    assert [int(n.split("-")[1]) for n in names] == list(range(len(names)))
    for path in w.files[:-1]:
        assert path.stat().st_size >= 20_000
    whole = read_log(log)
    assert whole.column("step").to_pylist() == [s for s, b in enumerate(batches) for _ in range(b.n_trajectories)]
    advantages_parquet(log, tmp_path / "out")
    got = np.concatenate(read_log(tmp_path / "out").column("advantages").to_numpy())
    flat = synthetic.FlatBatch(
        values=np.concatenate([b.values for b in batches]),
        mask=np.concatenate([b.mask for b in batches]),
        offsets=np.concatenate(
            [[0]] + [b.offsets[1:] + sum(x.n_tokens for x in batches[:i]) for i, b in enumerate(batches)]
        ),
        rewards=np.concatenate([b.rewards for b in batches]),
        scores=np.concatenate([b.scores for b in batches]),
        group_ids=np.concatenate([b.group_ids for b in batches]),
    )
    direct = mpo_rs.mae_advantages(flat.values, flat.mask, flat.offsets, rewards=flat.rewards)
    np.testing.assert_array_equal(got, direct.advantages)


def test_a_reopened_log_continues_its_numbering_and_keeps_its_columns(tmp_path):
    log = tmp_path / "log"
    with RolloutLogWriter(log) as w:
        append(w, batch(8), step=0)
    with RolloutLogWriter(log) as w2:
        append(w2, batch(8, seed=1), step=1)
    assert visible(log) == ["part-000000-step-000000.parquet", "part-000001-step-000001.parquet"]
    w3 = RolloutLogWriter(log)
    b = batch(8, seed=2)
    with pytest.raises(InvalidBatchError, match="existing parts"):
        w3.append_flat(token_ids=b.token_ids, loss_mask=b.mask, offsets=b.offsets, step=2)  # no values, rewards, ...
    w3.close()
    assert len(visible(log)) == 2


def test_flush_finishes_the_current_file(tmp_path):
    w = RolloutLogWriter(tmp_path / "log")
    append(w, batch(8), step=0)
    assert visible(tmp_path / "log") == [] and w.rows_written == 0 and w.rows_appended == 8
    w.flush()
    assert visible(tmp_path / "log") == ["part-000000-step-000000.parquet"] and w.rows_written == 8
    w.flush()  # nothing new: no empty file
    append(w, batch(8), step=3)
    w.close()
    w.close()
    assert visible(tmp_path / "log")[-1] == "part-000001-step-000003.parquet"
    with pytest.raises(InvalidOptionError, match="closed"):
        append(w, batch(8), step=4)


@pytest.mark.parametrize(
    "name, content",
    [("notes.txt", b"hello"), ("part-000000-step-000000.parquet", None), ("_SUCCESS", b"")],
)
def test_a_directory_with_files_the_writer_did_not_write_is_refused(tmp_path, name, content):
    log = tmp_path / "log"
    log.mkdir()
    if content is None:  # a Parquet file under a part's name, but not ours
        pq.write_table(pa.table({"x": [1]}), log / name)
    else:
        (log / name).write_bytes(content)
    with pytest.raises(InvalidOptionError, match=re.escape(name)):
        RolloutLogWriter(log)
    assert visible(log) == [name]


def test_a_file_in_place_of_the_directory_is_refused(tmp_path):
    (tmp_path / "log").write_text("x")
    with pytest.raises(InvalidOptionError, match="not a directory"):
        RolloutLogWriter(tmp_path / "log")


def test_an_existing_part_is_never_overwritten(tmp_path):
    log = tmp_path / "log"
    w = RolloutLogWriter(log)
    # Another writer finishes part 0 first: ours takes the next number.
    with RolloutLogWriter(log) as other:
        append(other, batch(4, seed=9), step=0)
    before = (log / "part-000000-step-000000.parquet").read_bytes()
    append(w, batch(4), step=0)
    w.close()
    assert (log / "part-000000-step-000000.parquet").read_bytes() == before
    assert visible(log) == ["part-000000-step-000000.parquet", "part-000001-step-000000.parquet"]


def test_an_error_while_writing_a_part_removes_it_keeps_earlier_parts_and_closes_the_writer(tmp_path, monkeypatch):
    log = tmp_path / "log"
    w = RolloutLogWriter(log)
    append(w, batch(8), step=0)
    w.flush()
    first = (log / "part-000000-step-000000.parquet").read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full_disk)
    append(w, batch(8), step=1)  # buffered
    with pytest.raises(OSError, match="No space left"):
        w.flush()
    assert w.closed and visible(log) == ["part-000000-step-000000.parquet"]
    assert [p.name for p in log.iterdir() if p.name.startswith(".")] == []
    assert (log / "part-000000-step-000000.parquet").read_bytes() == first
    assert w.rows_written == 8 and w.rows_appended == 16
    with pytest.raises(InvalidOptionError, match=r"closed .*No space left"):
        append(w, batch(8), step=2)
    w.close()  # idempotent after the failure


_EXITING_CHILD = textwrap.dedent(
    """
    import os, sys
    from mpo_rs import synthetic
    from mpo_rs.rollout_log import RolloutLogWriter
    b = synthetic.flat_batch(16, seed=1, tokens=True)
    w = RolloutLogWriter(sys.argv[1])
    w.append_flat(token_ids=b.token_ids, loss_mask=b.mask, offsets=b.offsets, step=5)
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # a forked child's exit must not finish its parent's part
    os.waitpid(pid, 0)
    print(sorted(os.listdir(sys.argv[1])) == [] or sorted(os.listdir(sys.argv[1])), flush=True)
    # no close(): the interpreter's exit finishes the part
    """
)


def test_a_writer_never_closed_finishes_its_part_at_exit_in_its_own_process_only(tmp_path):
    log = tmp_path / "log"
    out = subprocess.run([sys.executable, "-c", _EXITING_CHILD, str(log)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "True"  # nothing visible after the fork's child exited
    assert visible(log) == ["part-000000-step-000005.parquet"]
    assert [p.name for p in log.iterdir() if p.name.startswith(".")] == []
    assert pq.read_table(log / visible(log)[0]).num_rows == 16


_KILLED_CHILD = textwrap.dedent(
    """
    import sys
    from mpo_rs import synthetic
    from mpo_rs.rollout_log import RolloutLogWriter
    b = synthetic.flat_batch(256, seed=1, turns=(2, 4), turn_len=(20, 60), obs_len=(10, 40), values="critic", tokens=True)
    w = RolloutLogWriter(sys.argv[1], max_file_bytes=400_000, row_group_bytes=100_000)
    step = 0
    while True:
        w.append_flat(**b.log_columns(), step=step)
        step += 1
        if w.files and step % 3 == 0:
            print(len(w.files), flush=True)
    """
)


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_kill_9_mid_write_leaves_no_partial_file_and_earlier_parts_intact(tmp_path, delay):
    log = tmp_path / "log"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(log)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        child.stdout.readline()  # at least one file finished, the next being written
        time.sleep(delay)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert child.stdout is not None
        child.stdout.close()
    names = visible(log)
    assert names and all(n.startswith("part-") for n in names)
    rows = 0
    for name in names:  # every visible part is complete: footer, rows, whole batches
        table = pq.read_table(log / name)
        assert table.num_rows % 256 == 0 and table.num_rows > 0
        rows += table.num_rows
    hidden = [p.name for p in log.iterdir() if p.name.startswith(".")]
    assert all(".mpo-rs-" in n and n.endswith(".tmp") for n in hidden), hidden
    # The tools skip the leftover temporary; a new writer continues after the finished parts.
    assert cli_main(["advantages", str(log), "-o", str(tmp_path / "out"), "-q"]) == 0
    assert read_log(tmp_path / "out").num_rows == rows
    with RolloutLogWriter(log) as w:
        append(w, batch(4), step=1000)
    assert w.files[0].name == f"part-{len(names):06d}-step-001000.parquet"


_PAUSED_CHILD = textwrap.dedent(
    """
    import sys, time
    from mpo_rs import synthetic
    from mpo_rs.rollout_log import RolloutLogWriter
    b = synthetic.flat_batch(64, seed=1, turns=(2, 4), turn_len=(20, 60), obs_len=(10, 40), values="critic", tokens=True)
    w = RolloutLogWriter(sys.argv[1], max_file_bytes=10**9, row_group_bytes=1)
    kw = dict(token_ids=b.token_ids, loss_mask=b.mask, offsets=b.offsets, values=b.values, rewards=b.rewards,
              scores=b.scores, group_ids=b.group_ids)
    w.append_flat(**kw, step=0)
    w.flush()                      # part 0 finished
    w.append_flat(**kw, step=1)    # a row group written into part 1's temporary
    w.append_flat(**kw, step=2)
    print(len(w.files), w.rows_appended, flush=True)
    time.sleep(60)
    """
)


def test_kill_9_with_a_part_half_written_loses_exactly_the_rows_since_the_last_finished_part(tmp_path):
    log = tmp_path / "log"
    child = subprocess.Popen([sys.executable, "-c", _PAUSED_CHILD, str(log)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["1", "192"]
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert child.stdout is not None
        child.stdout.close()
    (temp,) = [p for p in log.iterdir() if p.name.startswith(".")]
    assert temp.name.startswith(".part-000001-step-000001.parquet.mpo-rs-") and temp.stat().st_size > 0
    assert visible(log) == ["part-000000-step-000000.parquet"]
    assert pq.read_table(log / visible(log)[0]).num_rows == 64  # the 128 rows of steps 1-2 are lost
    assert cli_main(["diagnose", str(log)]) == 0


# --------------------------------------------------------------------------- errors


def test_bad_inputs_raise_typed_errors_naming_the_argument(tmp_path):
    w = RolloutLogWriter(tmp_path / "log")
    ids = np.arange(6).reshape(2, 3)
    mask = np.array([[0, 1, 1], [0, 1, 0]])

    def padded(**kw):
        args = dict(input_ids=ids, loss_mask=mask, scores=np.ones(2), step=0)
        w.append_padded(**{**args, **kw})

    cases = [
        (dict(input_ids=np.arange(6)), "`input_ids` must be \\(B, L\\)"),
        (dict(input_ids=ids.astype(np.float32)), "`input_ids` must hold integer"),
        (dict(input_ids=-ids), "`input_ids` holds -1 at row 0, token 1"),
        (dict(loss_mask=mask[:, :2]), "`loss_mask` has shape"),
        (dict(loss_mask=mask * 2), "`loss_mask` must hold only 0 and 1; found 2 at row 0, column 1"),
        (
            dict(attention_mask=np.array([[1, 1, 1], [1, 1, 0]]), loss_mask=np.array([[0, 1, 1], [0, 1, 1]])),
            "`loss_mask` is nonzero .* row 1, column 2, where `attention_mask` is 0",
        ),
        (
            dict(
                attention_mask=np.array([[1, 1, 0], [1, 1, 1]]),
                loss_mask=np.array([[0, 1, 0], [0, 1, 0]]),
                token_rewards=np.array([[0, 0, 1.0], [0, 1.0, 0]]),
            ),
            "`token_rewards` is nonzero \\(1.0\\) at row 0, column 2",
        ),
        (dict(values=np.array([[0, np.nan, 0], [0, 0, 0]])), "`values` holds nan on a policy token at row 0, token 1"),
        (dict(values=np.array([[np.nan, 0, 0], [0, 0, 0]])), None),  # off-policy NaN: never read, fine
        (dict(token_rewards=np.array([[0, 0, np.inf], [0, 0, 0]])), "`token_rewards` holds inf at row 0, token 2"),
        (dict(values=np.array([[0, 1e300, 0], [0, 0, 0]])), "`values` holds 1e\\+300"),
        (dict(scores=np.ones(3)), "`scores` has shape \\(3,\\), expected \\(2,\\)"),
        (dict(scores=np.array([1.0, np.nan])), "`scores` holds nan at row 1"),
        (dict(group_ids=np.array([0.5, 1.5])), "`group_ids` must be integers or strings"),
        (dict(group_ids=np.array(["a", 3], dtype=object)), "`group_ids` mixes integers and strings \\(row 1 holds 3"),
        (dict(group_ids=np.array(["a", None], dtype=object)), "`group_ids` must be all integers or all strings; row 1"),
        (dict(step=1.5), "`step` must be an integer"),
        (dict(step=True), "`step` must be an integer"),
        (dict(values=[["a", "b", "c"], ["d", "e", "f"]]), "`values` must be real numbers"),
    ]
    for kw, message in cases:
        if message is None:
            padded(**kw)
            continue
        with pytest.raises(InvalidBatchError, match=message):
            padded(**kw)
    assert w.rows_appended == 2  # only the valid call appended
    with pytest.raises(InvalidBatchError, match="`offsets` must start at 0"):
        w.append_flat(token_ids=np.arange(4), loss_mask=np.ones(4), offsets=np.array([0, 2, 5]), step=0)
    with pytest.raises(InvalidBatchError, match="`offsets` must be a 1-D integer"):
        w.append_flat(token_ids=np.arange(4), loss_mask=np.ones(4), offsets=np.array([0.0, 4.0]), step=0)
    with pytest.raises(InvalidBatchError, match="`values` has shape \\(3,\\), expected \\(4,\\)"):
        w.append_flat(token_ids=np.arange(4), loss_mask=np.ones(4), offsets=np.array([0, 4]), values=np.ones(3), step=0)
    # A batch with other optional columns than the first one is refused by name.
    with pytest.raises(InvalidBatchError, match="earlier batches"):
        padded(scores=None, token_rewards=np.zeros((2, 3)))
    w.close()


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(max_file_bytes=0), "`max_file_bytes` must be a positive integer"),
        (dict(max_file_bytes=1.5), "`max_file_bytes`"),
        (dict(row_group_bytes=-1), "`row_group_bytes`"),
        (dict(compression="zip"), "`compression` 'zip'"),
        (dict(columns={"mask": "m"}), "unknown role 'mask'"),
        (dict(columns={"values": "loss_mask"}), "two roles one name"),
    ],
)
def test_bad_settings_raise_invalid_option_error(tmp_path, kw, message):
    with pytest.raises(InvalidOptionError, match=message):
        RolloutLogWriter(tmp_path / "log", **kw)


@pytest.mark.parametrize("codec", ["none", "snappy", "lz4", "gzip"])
def test_every_codec_pyarrow_writes_reads_back(tmp_path, codec):
    b = batch(8)
    with RolloutLogWriter(tmp_path / "log", compression=codec) as w:
        append(w, b, step=0)
    assert read_log(tmp_path / "log").column("values").to_pylist() == synthetic.to_arrow(b).column("values").to_pylist()


def test_renamed_columns_are_what_the_tools_are_told(tmp_path):
    b = batch(8)
    with RolloutLogWriter(tmp_path / "log", columns={"loss_mask": "response_mask", "values": "critic"}) as w:
        append(w, b, step=0)
    assert cli_main(
        ["advantages", str(tmp_path / "log"), "-o", str(tmp_path / "out"), "--mask-col", "response_mask",
         "--values-col", "critic", "-q"]
    ) == 0  # fmt: skip


def test_without_pyarrow_the_writer_names_the_extra():
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from mpo_rs.rollout_log import RolloutLogWriter\n"
        "try:\n    RolloutLogWriter('x')\n"
        "except Exception as e:\n"
        "    from mpo_rs import MissingDependencyError\n"
        "    print(isinstance(e, MissingDependencyError), e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    from mpo_rs._deps import install_hint

    assert out.stdout.strip() == f"True `mpo_rs.rollout_log` needs pyarrow: {install_hint('arrow')}"
