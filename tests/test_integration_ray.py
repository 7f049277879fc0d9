"""mpo_rs.integrations.ray on a local Ray cluster started here, against the single-machine
`mpo-rs advantages` output. Skipped when Ray Data is absent."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import mpo_rs  # noqa: E402
from mpo_rs import _native, synthetic  # noqa: E402
from mpo_rs.arrow import OUTPUT_COLUMNS, with_advantages  # noqa: E402
from mpo_rs.cli import main as mpo_rs_cli  # noqa: E402
from mpo_rs.integrations import ray as mpo_ray  # noqa: E402

N_GROUPS = 7

# Ray's own DataContext emits deprecation warnings about its internal settings.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()


def rollout_table(seed: int, rows: int, first_row: int, string_groups: bool) -> pa.Table:
    """Agent rollouts (mpo_rs.synthetic): LLM turns and tool outputs, some rows empty or
    without policy tokens or ending on a tool output, a terminal reward plus per-token
    shaping, group ids that repeat across the whole log (so every group spans files and
    blocks)."""
    batch = synthetic.flat_batch(
        rows,
        seed=seed,
        first_row=first_row,
        turns=(0, 6),
        turn_len=(1, 6),
        obs_len=(1, 4),
        prompt_len=(0, 3),
        tail_len=(0, 3),
        groups="interleaved",
        n_groups=N_GROUPS,
        values="normal",
        score_levels=3,
        reward_noise=0.01,
        tokens=True,
    )
    table = synthetic.to_arrow(batch, string_groups=string_groups).drop_columns(["old_logprobs"])
    return table.rename_columns(["row_id" if n == "trajectory_id" else n for n in table.column_names])


@pytest.fixture(scope="module")
def log_dirs(tmp_path_factory) -> dict[bool, Path]:
    """Per kind of group id (False: ints, True: strings), three Parquet files of two row
    groups each."""
    dirs = {}
    for string_groups in (False, True):
        root = tmp_path_factory.mktemp("logs") / "in"
        root.mkdir()
        first = 0
        for i, rows in enumerate((23, 31, 17)):
            table = rollout_table(100 + i, rows, first, string_groups=string_groups)
            pq.write_table(table, root / f"part-{i}.parquet", row_group_size=12)
            first += rows
        dirs[string_groups] = root
    return dirs


def read_sorted(path: Path) -> pa.Table:
    return pq.read_table(path).sort_by("row_id")


def assert_same_log(got: pa.Table, want: pa.Table, exact: bool) -> None:
    assert got.num_rows == want.num_rows
    for name in OUTPUT_COLUMNS:
        assert got.schema.field(name) == want.schema.field(name), name
    for name in want.column_names:
        a, b = got.column(name).combine_chunks(), want.column(name).combine_chunks()
        if name not in OUTPUT_COLUMNS or name == "turn_index" or exact:
            assert a.equals(b), name
        else:
            # Group statistics are summed per block, then merged: equal up to float64
            # rounding, so at most an ulp apart after the float32 cast.
            assert a.offsets.equals(b.offsets), name
            np.testing.assert_allclose(a.flatten().to_numpy(), b.flatten().to_numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("estimator", "reward_flag", "string_groups"),
    [
        ("mae", "--rewards-col", False),
        ("gae", "--score-col", False),
        ("grpo", "--rewards-col", True),
        ("rloo", "--score-col", False),
        ("drgrpo", "--score-col", True),
    ],
)
def test_ray_equals_the_single_machine_tool(cluster, log_dirs, tmp_path, estimator, reward_flag, string_groups):
    log_dir = log_dirs[string_groups]
    reward_col = "rewards" if reward_flag == "--rewards-col" else "score"
    single = tmp_path / "single"
    assert (
        mpo_rs_cli(
            ["advantages", str(log_dir), "-o", str(single), "--estimator", estimator, reward_flag, reward_col, "-q"]
        )
        == 0
    )
    distributed = tmp_path / "ray"
    keyword = {"rewards_col": reward_col} if reward_col == "rewards" else {"score_col": reward_col}
    # Small map batches: no batch holds a whole group.
    mpo_ray.advantages_parquet(log_dir, distributed, estimator=estimator, batch_size=5, **keyword)
    assert_same_log(read_sorted(distributed), read_sorted(single), exact=estimator in ("mae", "gae"))


def test_group_statistics_merge_across_blocks(cluster):
    table = rollout_table(7, 60, 0, string_groups=False)
    dataset = ray.data.from_arrow(table).repartition(5)
    stats = mpo_ray.group_statistics(dataset, rewards_col="rewards")
    scores = np.array([sum(np.float64(r) for r in row) for row in table["rewards"].to_pylist()], np.float32)
    groups = table["group_id"].to_numpy()
    assert stats["group"].to_pylist() == list(range(N_GROUPS))
    for g in range(N_GROUPS):
        member = scores[groups == g].astype(np.float64)
        assert stats["count"][g].as_py() == member.size
        assert stats["sum"][g].as_py() == pytest.approx(member.sum(), rel=1e-12)
        assert stats["m2"][g].as_py() == pytest.approx(((member - member.mean()) ** 2).sum(), rel=1e-9, abs=1e-12)

    annotated = mpo_ray.add_advantages(dataset, estimator="grpo", rewards_col="rewards", batch_size=4)
    got = pa.concat_tables(ray.get(annotated.to_arrow_refs())).sort_by("row_id")
    want = with_advantages(table, estimator="grpo", rewards_col="rewards")
    assert_same_log(got, want, exact=False)
    # Not the per-block answer: the groups really do span the blocks.
    per_block = with_advantages(table.slice(0, 12), estimator="grpo", rewards_col="rewards")
    first_rows = got.slice(0, 12)
    assert not np.allclose(
        per_block["advantages"].combine_chunks().flatten().to_numpy(),
        first_rows["advantages"].combine_chunks().flatten().to_numpy(),
    )


def test_bad_options_and_columns_fail_on_the_driver(cluster):
    dataset = ray.data.from_arrow(rollout_table(8, 10, 0, string_groups=False))
    with pytest.raises(_native.InvalidOptionError, match="`beta` does not apply to the gae"):
        mpo_ray.add_advantages(dataset, estimator="gae", beta=0.5)
    with pytest.raises(_native.InvalidOptionError, match="unknown estimator `ppo`"):
        mpo_ray.add_advantages(dataset, estimator="ppo")
    with pytest.raises(mpo_rs.InvalidBatchError, match="missing column `critic`"):
        mpo_ray.add_advantages(dataset, estimator="mae", values_col="critic")


def test_bad_data_in_a_block_raises_a_named_error(cluster):
    table = rollout_table(9, 12, 0, string_groups=False)
    rewards = table["rewards"].to_pylist()
    masks = table["loss_mask"].to_pylist()
    row = next(i for i, m in enumerate(masks) if m and not all(m))
    rewards[row][masks[row].index(False)] = 1.0  # a reward on a tool-output token
    table = table.set_column(table.column_names.index("rewards"), "rewards", pa.array(rewards, pa.list_(pa.float32())))
    dataset = ray.data.from_arrow(table)
    with pytest.raises(Exception, match="rewards must be 0 where the mask is 0") as info:
        mpo_ray.add_advantages(dataset, estimator="rloo", rewards_col="rewards")
    assert isinstance(info.value, mpo_rs.InvalidBatchError) or "InvalidBatchError" in str(info.value)


def test_observation_rewards_credit_as_with_advantages(cluster):
    # Issue 20, item 8: the option of the single-machine tools, in the statistics pass too.
    from mpo_rs.arrow import with_advantages

    table = rollout_table(9, 12, 0, string_groups=False)
    rewards = table["rewards"].to_pylist()
    masks = table["loss_mask"].to_pylist()
    row = next(i for i, m in enumerate(masks) if m and not all(m))
    rewards[row][masks[row].index(False)] = 1.0
    table = table.set_column(table.column_names.index("rewards"), "rewards", pa.array(rewards, pa.list_(pa.float32())))
    for estimator in ("rloo", "mae"):
        annotated = mpo_ray.add_advantages(
            ray.data.from_arrow(table), estimator=estimator, rewards_col="rewards", observation_rewards="credit"
        )
        got = pa.concat_tables(ray.get(annotated.to_arrow_refs())).sort_by("row_id")
        want = with_advantages(table, estimator=estimator, rewards_col="rewards", observation_rewards="credit")
        assert got["advantages"].to_pylist() == want.sort_by("row_id")["advantages"].to_pylist()
    with pytest.raises(_native.InvalidOptionError, match="unknown observation_rewards='keep'"):
        mpo_ray.add_advantages(ray.data.from_arrow(table), observation_rewards="keep")


def test_the_example_script_writes_what_the_single_machine_tool_writes(cluster, log_dirs, tmp_path):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "ray_advantages.py"
    spec = importlib.util.spec_from_file_location("ray_advantages_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    log_dir = log_dirs[False]
    out = tmp_path / "example"
    assert (
        example.main([str(log_dir), str(out), "--estimator", "rloo", "--rewards-col", "rewards", "--batch-size", "8"])
        == 0
    )
    single = tmp_path / "single"
    assert (
        mpo_rs_cli(
            ["advantages", str(log_dir), "-o", str(single), "--estimator", "rloo", "--rewards-col", "rewards", "-q"]
        )
        == 0
    )
    assert_same_log(read_sorted(out), read_sorted(single), exact=False)


# --- issue 18: the table's options and the group-id rule, as the CLI ---------------------


def test_ray_takes_every_option_of_the_table_and_an_estimator(cluster):
    table = rollout_table(11, 24, 0, string_groups=False)
    dataset = ray.data.from_arrow(table)
    cases = [
        ({"estimator": "gae", "length_adaptive_alpha": 0.05}, {"estimator": "gae", "length_adaptive_alpha": 0.05}),
        ({"estimator": "grpo", "norm_std": False}, {"estimator": "drgrpo"}),
        ({"estimator": "grpo", "leave_one_out": True}, {"estimator": "rloo"}),
        ({"estimator": mpo_rs.Estimator("mae", lam=0.7)}, {"estimator": "mae", "lam": 0.7}),
    ]
    for ray_kw, local_kw in cases:
        got = pa.concat_tables(
            ray.get(mpo_ray.add_advantages(dataset, rewards_col="rewards", **ray_kw).to_arrow_refs())
        ).sort_by("row_id")
        want = with_advantages(table, rewards_col="rewards", **local_kw)
        assert_same_log(got, want, exact=local_kw["estimator"] in ("mae", "gae"))


def test_ray_refuses_a_misspelt_option_as_invalid_option_error(cluster, tmp_path):
    dataset = ray.data.from_arrow(rollout_table(12, 6, 0, string_groups=False))
    for value in (0.9, None):
        with pytest.raises(mpo_rs.InvalidOptionError, match="`lamb` is not an option of the mae estimator"):
            mpo_ray.add_advantages(dataset, lamb=value)
        with pytest.raises(mpo_rs.InvalidOptionError, match="`lamb` is not an option of the mae estimator"):
            mpo_ray.advantages_parquet(tmp_path / "none", tmp_path / "out", lamb=value)


def _mixed_log(root: Path, second: pa.Array) -> None:
    root.mkdir()
    for name, ids in (("a", pa.array([1, 2, 1], pa.int64())), ("b", second)):
        n = len(ids)
        table = pa.table(
            {
                "group_id": ids,
                "score": pa.array(np.arange(n), pa.float32()),
                "loss_mask": pa.array([[1]] * n, pa.list_(pa.int8())),
                "values": pa.array([[0.0]] * n, pa.list_(pa.float32())),
            }
        )
        pq.write_table(table, root / f"{name}.parquet")


def test_ray_refuses_string_ids_beside_int_ids_as_the_cli_does(cluster, tmp_path):
    # Int-id files beside string-id files failed in Ray with Arrow's schema-merge error while
    # the CLI accepted them; both refuse them now, with the same typed error naming the files.
    root = tmp_path / "in"
    _mixed_log(root, pa.array(["1", "2", "2"]))
    pattern = r"string group ids in \S*b.parquet but number ids in \S*a.parquet"
    with pytest.raises(mpo_rs.InvalidBatchError, match=pattern):
        mpo_ray.advantages_parquet(root, tmp_path / "ray", estimator="grpo")
    with pytest.raises(mpo_rs.InvalidBatchError, match=pattern):
        mpo_rs.arrow.advantages_parquet(root, tmp_path / "single", estimator="grpo")
    assert mpo_rs_cli(["advantages", str(root), "-o", str(tmp_path / "single"), "--estimator", "rloo"]) == 1


def test_ray_and_the_cli_agree_on_int_beside_float_ids(cluster, tmp_path):
    root = tmp_path / "in"
    _mixed_log(root, pa.array([2.0, 1.0, 0.5]))
    single = tmp_path / "single"
    assert mpo_rs_cli(["advantages", str(root), "-o", str(single), "--estimator", "drgrpo", "-q"]) == 0
    mpo_ray.advantages_parquet(root, tmp_path / "ray", estimator="drgrpo")
    got = sorted(map(tuple, read_sorted_pairs(tmp_path / "ray")))
    want = sorted(map(tuple, read_sorted_pairs(single)))
    assert got == want


def read_sorted_pairs(path: Path) -> list[tuple[float, float, float]]:
    """(group id by value, score, advantage) of every row, file by file (the files' id
    types differ)."""
    rows = []
    for file in sorted(path.rglob("*.parquet")):
        t = pq.read_table(file, columns=["group_id", "score", "advantages"])
        ids = [float(x) for x in t["group_id"].to_pylist()]
        rows += zip(ids, t["score"].to_pylist(), [a[0] for a in t["advantages"].to_pylist()], strict=True)
    return rows


def test_ray_blocks_of_int_ids_beyond_2_53_beside_float_ids_are_refused(cluster):
    mask = pa.array([[1], [1]], pa.list_(pa.int8()))
    ints = pa.table(
        {
            "group_id": pa.array([2**53, 2**53 + 1], pa.int64()),
            "score": pa.array([1.0, 2.0], pa.float32()),
            "loss_mask": mask,
        }
    )
    floats = pa.table(
        {"group_id": pa.array([0.5, 2.0**53]), "score": pa.array([3.0, 4.0], pa.float32()), "loss_mask": mask}
    )
    # Two blocks of a Ray dataset, each with its own id type; the merged table had two rows
    # keyed by the float 2**53. Refused now, naming the blocks as the dataset numbers them.
    dataset = ray.data.from_arrow([ints, floats])
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"9007199254740993 in block 0 .*block 1 holds float ids"):
        mpo_ray.group_statistics(dataset, score_col="score")


def test_ray_accepts_or_refuses_an_option_like_numpy(cluster) -> None:
    """A few values of each kind through the Ray adapter (each call runs a Ray job)."""
    from test_fuzz_options import GROUPS, MASK, OFFSETS, SCORES, VALUES_FLAT, numpy_call, outcome

    def lists(x: np.ndarray) -> Any:
        return pa.ListArray.from_arrays(pa.array(OFFSETS.astype(np.int32)), pa.array(x))

    table = pa.table({"loss_mask": lists(MASK), "values": lists(VALUES_FLAT), "score": SCORES, "group_id": GROUPS})
    cases = [
        ("mae", {"lam": 0.9}),
        ("mae", {"lam": 1.5}),
        ("mae", {"lam": math.nan}),
        ("mae", {"lam": "0.9"}),
        ("mae", {"lamb": None}),
        ("mae", {"lamb": 0.9}),
        ("gae", {"length_adaptive_alpha": 2.0}),
        ("gae", {"length_adaptive_alpha": -1.0}),
        ("grpo", {"norm_std": False}),
        ("grpo", {"leave_one_out": True}),
        ("grpo", {"norm_std": "false"}),
        ("grpo", {"eps": 0.0}),
    ]
    for name, options in cases:

        def through_ray(name: str = name, options: dict[str, Any] = options) -> Any:
            return mpo_ray.add_advantages(ray.data.from_arrow(table), estimator=name, **options).materialize()

        assert outcome(through_ray) == outcome(numpy_call(name, options)), (name, options)


def test_ray_never_writes_into_a_directory_that_holds_anything(cluster, log_dirs, tmp_path):
    # Ray's write_parquet adds its files beside what is there: into a directory holding a
    # raw log, into the input itself, or a second time into an earlier output, so a later
    # read would mix them. All are refused before anything is read, and nothing is touched.
    source = log_dirs[False]
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "raw.parquet").write_bytes(b"someone's log")
    cases = {
        foreign: "is not empty",
        source: "is INPUT",
        source / "out": "inside the INPUT directory",
        foreign / "raw.parquet": "is a file",
    }
    for output, message in cases.items():
        with pytest.raises(mpo_rs.InvalidOptionError, match=message):
            mpo_ray.advantages_parquet(source, output)
    assert (foreign / "raw.parquet").read_bytes() == b"someone's log"
    assert not (source / "out").exists()
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before
    empty = tmp_path / "empty"
    empty.mkdir()
    mpo_ray.advantages_parquet(source, empty)
    first = sorted(p.name for p in empty.iterdir())
    assert first
    with pytest.raises(mpo_rs.InvalidOptionError, match="is not empty"):
        mpo_ray.advantages_parquet(source, empty)
    assert sorted(p.name for p in empty.iterdir()) == first


@pytest.mark.parametrize("estimator", ["mae", "grpo"])
def test_ray_refuses_an_input_listed_twice_through_a_link(cluster, log_dirs, tmp_path, estimator):
    # A symlink beside its target was read twice by Ray for mae/gae (the footer checks that
    # caught it ran for the group estimators only).
    source = log_dirs[False]
    link = tmp_path / "again.parquet"
    link.symlink_to(source / "part-0.parquet")
    with pytest.raises(mpo_rs.InvalidOptionError, match="are the same file"):
        mpo_ray.advantages_parquet([source, link], tmp_path / "out", estimator=estimator)
    assert not (tmp_path / "out").exists()


def _with_turn_rewards_and_flags(seed: int, rows: int) -> pa.Table:
    """A rollout table whose reward is one value per turn (a `turn_rewards` list column, no
    token rewards or score) and with a `truncated` flag per row."""
    table = rollout_table(seed, rows, 0, string_groups=False)
    rng = np.random.default_rng(seed)
    per_turn = []
    for mask in table.column("loss_mask").to_pylist():
        starts = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
        per_turn.append([float(x) for x in rng.normal(size=starts).astype(np.float32)])
    keep = [n for n in table.column_names if n not in ("rewards", "score")]
    table = table.select(keep).append_column("turn_rewards", pa.array(per_turn, pa.list_(pa.float32())))
    return table.append_column("truncated", pa.array(rng.random(rows) < 0.5))


@pytest.mark.parametrize("estimator", ["mae", "gae", "grpo", "rloo"])
def test_ray_takes_per_turn_rewards_and_truncation_as_one_machine_does(cluster, estimator):
    # The Ray adapter refused per-turn rewards (issue 20 item 4) and read no truncation flag
    # by name; both now go through the same column rule as mpo_rs.arrow, across blocks.
    table = _with_turn_rewards_and_flags(31, 40)
    names = {"turn_rewards_col": "turn_rewards"}
    if estimator in ("mae", "gae"):
        names["truncated_col"] = "truncated"
    want = with_advantages(table, estimator=estimator, **names)
    dataset = ray.data.from_arrow(table).repartition(4)
    got = mpo_ray.add_advantages(dataset, estimator=estimator, batch_size=7, **names).to_arrow_refs()
    got_table = pa.concat_tables(ray.get(got)).sort_by("row_id")
    assert_same_log(got_table, want.sort_by("row_id"), exact=estimator in ("mae", "gae"))
    # The default rule finds the per-turn column by name (no rewards or score column).
    found = pa.concat_tables(ray.get(mpo_ray.add_advantages(dataset, estimator=estimator).to_arrow_refs()))
    default = with_advantages(table, estimator=estimator).sort_by("row_id")
    assert_same_log(found.sort_by("row_id"), default, exact=estimator in ("mae", "gae"))


@pytest.mark.parametrize("norm_std", [False, True])
def test_ray_gigpo_annotates_each_group_whole_as_one_machine_does(cluster, norm_std):
    table = rollout_table(13, 60, 0, string_groups=True)
    # Several blocks: every group spans them before the shuffle.
    dataset = ray.data.from_arrow([table.slice(0, 25), table.slice(25, 20), table.slice(45)])
    got = pa.concat_tables(
        ray.get(
            mpo_ray.add_advantages(dataset, estimator="gigpo", rewards_col="rewards", norm_std=norm_std).to_arrow_refs()
        )
    ).sort_by("row_id")
    want = with_advantages(table, estimator="gigpo", rewards_col="rewards", norm_std=norm_std)
    assert_same_log(got, want, exact=False)  # a group's rows in Ray's order: sums may differ by rounding
    # No anchor column: refused on the driver, naming both.
    with pytest.raises(mpo_rs.InvalidBatchError, match=r"missing column `turn_state_ids` or `token_ids`"):
        mpo_ray.add_advantages(ray.data.from_arrow(table.drop_columns(["token_ids"])), estimator="gigpo")
