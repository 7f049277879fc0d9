"""The options table (Rust) and what it drives: ``mpo_rs.Estimator``, the keywords of the
numpy and Arrow entry points, the flags of ``mpo-rs advantages``, and one exception type
per mistake from all of them."""

from __future__ import annotations

import copy
import itertools
import pickle

import numpy as np
import pytest

import mpo_rs
from mpo_rs import Estimator, InvalidOptionError, MpoError, cli, options

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

MASK = np.array([1, 1, 0, 1, 1, 1, 1, 0, 1], bool)
VALUES = np.linspace(0.1, 0.9, 9).astype(np.float32)
REWARDS = np.array([0, 0, 0, 0, 0, 1, 0, 0, 0.5], np.float32)
OFFSETS = np.array([0, 3, 6, 9], np.int64)
SCORES = np.array([1.0, 0.0, 0.5], np.float32)
GROUPS = np.array([0, 0, 0])
TABLE = Estimator.option_table()


TOKENS = np.arange(len(MASK)) % 2


def log_table():
    lists = lambda x: pa.array([x[a:b].tolist() for a, b in itertools.pairwise(OFFSETS)])  # noqa: E731
    columns = {"loss_mask": lists(MASK), "values": lists(VALUES), "rewards": lists(REWARDS), "group_id": GROUPS}
    return pa.table({**columns, "token_ids": lists(TOKENS)})


def numpy_call(estimator, **options):
    """The numpy function of the estimator's family, called with keyword options."""
    family = (estimator if isinstance(estimator, Estimator) else Estimator(estimator)).family
    if family == "mae":
        return mpo_rs.mae_advantages(VALUES, MASK, OFFSETS, rewards=REWARDS, estimator=estimator, **options).advantages
    if family == "gae":
        return mpo_rs.gae_advantages(VALUES, MASK, OFFSETS, rewards=REWARDS, estimator=estimator, **options).advantages
    if family == "bilevel":
        return mpo_rs.bilevel_advantages(
            VALUES, MASK, OFFSETS, rewards=REWARDS, estimator=estimator, **options
        ).advantages
    if family == "gigpo":
        return mpo_rs.gigpo_advantages(
            MASK, OFFSETS, group_ids=GROUPS, rewards=REWARDS, token_ids=TOKENS, estimator=estimator, **options
        ).advantages
    return mpo_rs.group_advantages(SCORES, GROUPS, estimator=estimator, **options)


def cli_exit(tmp_path, *flags):
    path = tmp_path / "in.parquet"
    if not path.exists():
        pq.write_table(log_table(), path)
    out = tmp_path / "out.parquet"
    code = cli.main(["advantages", str(path), "-o", str(out), "-q", *flags])
    return code, out


# --------------------------------------------------------------------------- Estimator


def test_defaults_come_from_the_table():
    mae = Estimator("mae")
    assert mae.name == "mae" and mae.family == "mae"
    assert mae.options == {"lam": 0.8, "lam_intra": 0.95, "beta": 1.0, "gamma": 1.0, "lam_critic": 1.0}
    assert Estimator("gae").options == {"lam": 0.95, "gamma": 1.0, "lam_critic": 1.0, "length_adaptive_alpha": None}
    assert Estimator("grpo").options == {"eps": 1e-6, "norm_std": True, "leave_one_out": False}
    assert Estimator("drgrpo").options == {} and Estimator("rloo").family == "group"
    assert Estimator.names() == ("mae", "gae", "grpo", "drgrpo", "rloo", "bilevel", "gigpo") == mpo_rs.arrow.ESTIMATORS
    assert Estimator("bilevel").options == {"lam": 1.0, "gamma": 1.0, "high_level_gamma": 0.95}
    for row in TABLE:
        for name, default in row["defaults"].items():
            assert Estimator(name).options[row["name"]] == default


def test_default_and_family_estimators_read_the_table():
    for row in TABLE:
        for name, value in row["defaults"].items():
            assert options.default(name, row["name"]) == value
    with pytest.raises(KeyError):
        options.default("grpo", "lam")
    with pytest.raises(InvalidOptionError):
        options.default("vapo", "lam")
    families = options.family_estimators()
    assert families == ("mae", "gae", "grpo", "bilevel", "gigpo")
    assert [Estimator(name).family for name in families] == ["mae", "gae", "group", "bilevel", "gigpo"]


def test_overrides_replace_repr_eq_hash():
    est = Estimator("mae", lam=0.9, beta=0.5)
    assert est.options["lam"] == 0.9 and est.options["lam_intra"] == 0.95
    assert repr(est) == "Estimator('mae', lam=0.9, lam_intra=0.95, beta=0.5, gamma=1.0, lam_critic=1.0)"
    assert est == Estimator("mae", beta=0.5, lam=0.9) and hash(est) == hash(Estimator("mae", beta=0.5, lam=0.9))
    assert est != Estimator("mae") and est != "mae"
    assert est.replace(beta=1.0) == Estimator("mae", lam=0.9)
    assert est.options["beta"] == 0.5  # frozen: replace made a copy
    with pytest.raises(AttributeError):
        est.name = "gae"  # type: ignore[misc]
    assert Estimator("mae", lam=None) == Estimator("mae")  # None: the default
    assert len({Estimator("grpo"), Estimator("grpo", eps=1e-6), Estimator("rloo")}) == 2


@pytest.mark.parametrize(
    "est",
    [
        Estimator("mae", lam=0.9),
        Estimator("gae", length_adaptive_alpha=0.05),
        Estimator("rloo"),
        Estimator("gigpo", anchor="prefix"),
    ],
)
def test_pickles_and_copies(est):
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.loads(pickle.dumps(est, protocol))
        assert again == est and type(again) is Estimator and again.name == est.name
    assert copy.deepcopy(est) == est


def test_option_table_rows():
    names = [row["name"] for row in TABLE]
    assert names[:5] == ["lam", "lam_intra", "beta", "gamma", "lam_critic"]
    assert {"eps", "norm_std", "leave_one_out", "length_adaptive_alpha"} <= set(names)
    for row in TABLE:
        assert row["kind"] in ("float", "optional float", "bool", "choice") and row["doc"] and row["domain"]
        assert bool(row["choices"]) == (row["kind"] == "choice")
        assert set(row["estimators"]) == set(row["defaults"]) and set(row["estimators"]) <= set(Estimator.names())


# --------------------------------------------------------------------------- every entry point takes every row


@pytest.mark.parametrize("row", TABLE, ids=[row["name"] for row in TABLE])
def test_every_row_is_a_keyword_an_arrow_option_and_a_cli_flag(row, tmp_path):
    help_text = cli._parser()._subparsers._group_actions[0].choices["advantages"].format_help()
    flag = "--" + row["name"].replace("_", "-")
    assert flag in help_text
    for name in row["estimators"]:
        value = {"float": 0.5, "optional float": 0.5, "bool": False, "choice": "prefix"}[row["kind"]]
        if row["name"] == "leave_one_out":
            value = True
        # GiGPO's default divides by no std, so its eps is read only beside norm_std=True.
        needs = {"norm_std": True} if (name, row["name"]) == ("gigpo", "eps") else {}
        given = {row["name"]: value, **needs}
        expected = Estimator(name, **given)
        # numpy: the keyword is accepted and means what the Estimator means, bit for bit.
        by_keyword = numpy_call(name, **given)
        np.testing.assert_array_equal(by_keyword, numpy_call(expected))
        cli_flag = flag if row["kind"] != "bool" else (flag if value else "--no-" + flag[2:])
        args = [cli_flag] if row["kind"] == "bool" else [cli_flag, str(value)]
        args += ["--norm-std"] if needs else []
        # Arrow: the same keyword.
        arrow = mpo_rs.arrow.with_advantages(log_table(), estimator=name, **given)
        by_estimator = mpo_rs.arrow.with_advantages(log_table(), estimator=expected)
        assert arrow.equals(by_estimator)
        # CLI: the generated flag gives the same columns.
        code, out = cli_exit(tmp_path, "--estimator", name, *args)
        assert code == 0
        got = pq.read_table(out)
        assert got.column("advantages").equals(by_estimator.column("advantages"))


def test_keyword_calls_equal_estimator_calls():
    a = mpo_rs.mae_advantages(VALUES, MASK, OFFSETS, rewards=REWARDS, lam=0.9, beta=0.5)
    b = mpo_rs.mae_advantages(VALUES, MASK, OFFSETS, rewards=REWARDS, estimator=Estimator("mae", lam=0.9, beta=0.5))
    np.testing.assert_array_equal(a.advantages, b.advantages)
    # A keyword with an Estimator overrides its value.
    c = mpo_rs.mae_advantages(VALUES, MASK, OFFSETS, rewards=REWARDS, estimator=Estimator("mae", lam=0.9), beta=0.5)
    np.testing.assert_array_equal(a.advantages, c.advantages)
    np.testing.assert_array_equal(
        mpo_rs.group_advantages(SCORES, GROUPS, norm_std=False),
        mpo_rs.group_advantages(SCORES, GROUPS, estimator="drgrpo"),
    )


# --------------------------------------------------------------------------- one mistake, one type


MISTAKES = [
    ("mae", {"lam": 1.5}, r"`lam` = 1.5 is out of range: it must be in \[0, 1\]"),
    ("grpo", {"eps": 0.0}, r"`eps` = 0 is out of range: it must be in \(0, inf\)"),
    ("ppo", {}, r"unknown estimator `ppo`; choose one of mae, gae, grpo, drgrpo, rloo"),
    ("gae", {"beta": 0.5}, r"`beta` does not apply to the gae estimator; its options are lam, gamma, lam_critic"),
    ("drgrpo", {"eps": 0.1}, r"`eps` does not apply to the drgrpo estimator; it takes none"),
]


@pytest.mark.parametrize("name, options, pattern", MISTAKES)
def test_the_same_mistake_raises_the_same_type_everywhere(name, options, pattern, tmp_path):
    with pytest.raises(InvalidOptionError, match=pattern):
        Estimator(name, **options)
    fn = {"mae": mpo_rs.mae_advantages, "gae": mpo_rs.gae_advantages}.get(name)
    if fn is not None:
        with pytest.raises(InvalidOptionError, match=pattern):
            fn(VALUES, MASK, OFFSETS, rewards=REWARDS, estimator=name, **options)
    else:
        with pytest.raises(InvalidOptionError, match=pattern):
            mpo_rs.group_advantages(SCORES, GROUPS, estimator=name, **options)
    with pytest.raises(InvalidOptionError, match=pattern):
        mpo_rs.arrow.with_advantages(log_table(), estimator=name, **options)
    with pytest.raises(InvalidOptionError, match=pattern):
        mpo_rs.arrow.advantages_parquet(tmp_path / "none.parquet", tmp_path / "o.parquet", estimator=name, **options)
    if name in Estimator.names():
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
        code, _ = cli_exit(tmp_path, "--estimator", name, *flags)
        assert code == cli.EXIT_USAGE


def test_a_misspelt_keyword_names_it_and_lists_the_options():
    with pytest.raises(
        InvalidOptionError,
        match=r"`lamda` is not an option of the mae estimator \(did you mean `lam`\?\); its options are lam, ",
    ):
        mpo_rs.mae_advantages(VALUES, MASK, OFFSETS, rewards=REWARDS, lamda=0.9)
    with pytest.raises(InvalidOptionError, match=r"`nrom_std` is not an option of the grpo estimator"):
        mpo_rs.group_advantages(SCORES, GROUPS, nrom_std=False)
    with pytest.raises(InvalidOptionError, match=r"`lam` takes a float"):
        Estimator("mae", lam="0.9")
    with pytest.raises(InvalidOptionError, match=r"`norm_std` takes a bool"):
        Estimator("grpo", norm_std="no")
    assert (
        Estimator("grpo", norm_std=0)
        == Estimator("grpo", norm_std=np.bool_(False))
        == Estimator("grpo", norm_std=False)
    )


def test_an_estimator_of_another_family_is_refused():
    with pytest.raises(InvalidOptionError, match="mae_advantages computes the mae estimator; got the gae estimator"):
        mpo_rs.mae_advantages(VALUES, MASK, OFFSETS, rewards=REWARDS, estimator="gae")
    with pytest.raises(InvalidOptionError, match="group_advantages computes the group"):
        mpo_rs.group_advantages(SCORES, GROUPS, estimator=Estimator("mae"))


def test_cli_eps(tmp_path):
    code, out = cli_exit(tmp_path, "--estimator", "grpo", "--eps", "0.001")
    assert code == 0
    expected = mpo_rs.arrow.with_advantages(log_table(), estimator="grpo", eps=1e-3)
    assert pq.read_table(out).column("advantages").equals(expected.column("advantages"))
    assert cli_exit(tmp_path, "--estimator", "grpo", "--eps", "0")[0] == cli.EXIT_USAGE


# --------------------------------------------------------------------------- the hierarchy


def test_hierarchy_and_names():
    import mpo_rs.exceptions as ex

    for name in ex.__all__:
        cls = getattr(ex, name)
        assert getattr(mpo_rs, name) is cls
        if name != "MissingDependencyError":
            assert issubclass(cls, MpoError) and issubclass(cls, ValueError)
            assert cls.__module__ == "mpo_rs.exceptions"
            assert str(cls) == f"<class 'mpo_rs.exceptions.{name}'>"
    assert issubclass(mpo_rs.MissingDependencyError, ImportError)
    assert mpo_rs.arrow.InvalidOptionError is InvalidOptionError
    assert mpo_rs._native.InvalidBatchError is mpo_rs.InvalidBatchError


# --------------------------------------------------------------------------- issue 18 item 5 / defect 10


def test_a_huge_int_option_is_out_of_range_with_a_short_message():
    with pytest.raises(InvalidOptionError) as info:
        Estimator("mae", lam=10**400)
    message = str(info.value)
    assert "`lam` = 1000" in message and "out of range" in message and "not representable as a float" in message
    assert "takes a float, got int" not in message and len(message) < 200


def test_the_name_may_be_given_as_a_keyword():
    assert Estimator(name="mae") == Estimator("mae")
    assert Estimator(name="gae", lam=0.9) == Estimator("gae", lam=0.9)


@pytest.mark.parametrize("call", ["estimator", "numpy", "numpy_estimator", "arrow", "arrow_estimator", "replace"])
def test_a_misspelt_option_set_to_none_is_refused(call):
    pattern = r"`lamb` is not an option of the mae estimator"
    with pytest.raises(InvalidOptionError, match=pattern):
        if call == "estimator":
            Estimator("mae", lamb=None)
        elif call == "numpy":
            mpo_rs.mae_advantages(VALUES, MASK, OFFSETS, rewards=REWARDS, lamb=None)
        elif call == "numpy_estimator":
            mpo_rs.mae_advantages(VALUES, MASK, OFFSETS, rewards=REWARDS, estimator=Estimator("mae"), lamb=None)
        elif call == "arrow":
            mpo_rs.arrow.with_advantages(log_table(), lamb=None)
        elif call == "arrow_estimator":
            mpo_rs.arrow.with_advantages(log_table(), estimator=Estimator("mae", lam=0.5), lamb=None)
        else:
            Estimator("mae").replace(lamb=None)
    # None for an option of the table still means its default (or, with an Estimator, its value).
    assert Estimator("mae", lam=None) == Estimator("mae")
    assert options.resolve(Estimator("mae", lam=0.5), {"lam": None}, "mae") == Estimator("mae", lam=0.5)


@pytest.mark.parametrize("flag", [{"leave_one_out": True}, {"norm_std": False}])
def test_grpo_refuses_an_eps_it_would_ignore(flag, tmp_path):
    (key, value) = next(iter(flag.items()))
    pattern = rf"`eps` does not apply to the grpo estimator with {key}={str(value).lower()}"
    with pytest.raises(InvalidOptionError, match=pattern):
        Estimator("grpo", eps=1e-3, **flag)
    with pytest.raises(InvalidOptionError, match=pattern):
        mpo_rs.group_advantages(SCORES, GROUPS, eps=1e-6, **flag)
    with pytest.raises(InvalidOptionError, match=pattern):
        Estimator("grpo", eps=1e-3).replace(**flag)
    cli_flag = "--leave-one-out" if key == "leave_one_out" else "--no-norm-std"
    assert cli_exit(tmp_path, "--estimator", "grpo", cli_flag, "--eps", "0.001")[0] == cli.EXIT_USAGE
    # Without eps the estimator is fine, replaces and pickles (its eps is the default).
    est = Estimator("grpo", **flag)
    assert pickle.loads(pickle.dumps(est)) == est
    assert Estimator("grpo").replace(**flag) == est
    np.testing.assert_array_equal(
        mpo_rs.group_advantages(SCORES, GROUPS, **flag),
        mpo_rs.group_advantages(SCORES, GROUPS, estimator="rloo" if key == "leave_one_out" else "drgrpo"),
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [("lam", "0.9"), ("norm_std", "false"), ("norm_std", "true"), ("length_adaptive_alpha", "0.05"), ("eps", b"1")],
)
def test_strings_are_refused_for_every_kind_naming_the_key(key, value):
    name = next(row for row in TABLE if row["name"] == key)["estimators"][0]
    with pytest.raises(InvalidOptionError, match=rf"`{key}` takes a .*got the string .*strings are not converted"):
        Estimator(name, **{key: value})


# --------------------------------------------------------------------------- the column spec


def test_the_column_spec_comes_from_rust_and_every_entry_point_reads_it():
    import inspect

    from mpo_rs import _native, columns
    from mpo_rs.diagnose import read

    spec = _native.column_spec()
    assert [r["name"] for r in spec][:6] == ["mask", "values", "rewards", "score", "group", "step"]
    assert {r["role"] for r in spec} == {"input", "optional", "named", "output"}
    assert all(set(r) == {"name", "default", "type", "role", "doc"} and r["doc"] for r in spec)
    assert (
        columns.OUTPUT_COLUMNS
        == mpo_rs.arrow.OUTPUT_COLUMNS
        == ("advantages", "returns", "turn_index", "turn_advantages")
    )
    defaults = {"mask_col": columns.MASK, "values_col": columns.VALUES, "group_col": columns.GROUP}
    for fn in (mpo_rs.arrow.with_advantages, mpo_rs.arrow.advantages_parquet, read.diagnose_logs):
        for key, value in defaults.items():
            if key in inspect.signature(fn).parameters:
                assert inspect.signature(fn).parameters[key].default == value, (fn, key)
    args = cli._parser().parse_args(["advantages", "in", "-o", "out"])
    assert (args.mask_col, args.values_col, args.group_col, args.rewards_col, args.score_col) == (
        "loss_mask",
        "values",
        "group_id",
        None,
        None,
    )
    args = cli._parser().parse_args(["diagnose", "in"])
    assert (args.mask_col, args.values_col, args.step_col) == ("loss_mask", "values", None)


def test_every_exception_class_is_created_once_in_the_extension():
    import mpo_rs.exceptions as ex
    from mpo_rs import _deps, _native

    for name in ex.__all__:
        assert getattr(ex, name) is getattr(_native, name), name
    assert _deps.MissingDependencyError is ex.MissingDependencyError
    assert issubclass(ex.MissingDependencyError, ModuleNotFoundError)
    err = ex.MissingDependencyError("`x` needs y: pip install 'mpo-rs[y]'", name="y")
    assert err.name == "y"
    assert pickle.loads(pickle.dumps(ex.InvalidConfigError("bad"))).args == ("bad",)


def test_columns_are_the_column_spec_and_the_keywords_build_them(tmp_path):
    from mpo_rs import Columns, _native

    spec = [r["name"] for r in _native.column_spec() if r["role"] != "output" and r["name"] != "step"]
    assert list(Columns().chosen()) == spec
    assert Columns() == Columns(mask="loss_mask", values="values", group="group_id")
    assert Columns().keywords("mask", "score") == {"mask_col": "loss_mask", "score_col": None}
    table = log_table().rename_columns(["m", "v", "r", "g", "token_ids"])
    by_value = mpo_rs.arrow.with_advantages(table, columns=Columns(mask="m", values="v", rewards="r", group="g"))
    by_keywords = mpo_rs.arrow.with_advantages(table, mask_col="m", values_col="v", rewards_col="r", group_col="g")
    assert by_value.equals(by_keywords)
    with pytest.raises(InvalidOptionError, match=r"not both \(`mask_col` with `columns`\)"):
        mpo_rs.arrow.with_advantages(table, columns=Columns(mask="m"), mask_col="m")
    with pytest.raises(InvalidOptionError, match="the mask column must be a column name, got None"):
        Columns(mask=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match=r"`columns` must be an mpo_rs\.Columns, got dict"):
        mpo_rs.arrow.with_advantages(table, columns={"mask": "m"})
    pq.write_table(table, tmp_path / "in.parquet")
    mpo_rs.arrow.advantages_parquet(
        tmp_path / "in.parquet", tmp_path / "out.parquet", columns=Columns(mask="m", values="v", rewards="r", group="g")
    )
    assert pq.read_table(tmp_path / "out.parquet").column("advantages").equals(by_value.column("advantages"))
