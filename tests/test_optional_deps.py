"""Every optional dependency missing gives one line naming the extra that installs it,
never a traceback from the command line (issue 11). Each case hides modules in a fresh
interpreter (``sys.modules[name] = None`` makes ``import name`` fail as if absent)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from mpo_rs import _deps
from mpo_rs._deps import install_hint

OPTIONAL = ("torch", "pyarrow", "polars", "matplotlib", "ray", "verl")

# What the child runs after hiding: import the module (and call what needs the dependency
# lazily), then print the error's type, ImportError-ness and message as JSON.
_CHILD = textwrap.dedent(
    """
    import json, sys
    for name in sys.argv[1].split(","):
        sys.modules[name] = None
    try:
        exec(sys.argv[2])
    except Exception as e:
        from mpo_rs import MissingDependencyError
        print(json.dumps({"type": type(e).__name__, "typed": isinstance(e, MissingDependencyError),
                          "import_error": isinstance(e, ImportError), "message": str(e)}))
    else:
        print(json.dumps(None))
    """
)


def _child(hidden: tuple[str, ...], code: str) -> dict | None:
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, ",".join(hidden), code], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "hidden, code, feature, extra",
    [
        (("torch",), "import mpo_rs.torch.losses", "mpo_rs.torch", "torch"),
        (("torch",), "import mpo_rs.torch", "mpo_rs.torch", "torch"),
        (("torch",), "import mpo_rs.torch.learner", "mpo_rs.torch", "torch"),
        (("ray",), "import mpo_rs.integrations.ray", "mpo_rs.integrations.ray", "ray"),
        (("pyarrow",), "import mpo_rs.integrations.ray", "mpo_rs.integrations.ray", "ray"),
        (("verl",), "import mpo_rs.integrations.verl", "mpo_rs.integrations.verl", "verl"),
        (("torch",), "import mpo_rs.integrations.verl", "mpo_rs.integrations.verl", "verl"),
        (("trl",), "import mpo_rs.integrations.trl", "mpo_rs.integrations.trl", "trl"),
        (("torch",), "import mpo_rs.integrations.trl", "mpo_rs.integrations.trl", "trl"),
        (("torch",), "import mpo_rs.integrations.openrlhf", "mpo_rs.integrations.openrlhf", "openrlhf"),
        (("pyarrow", "polars"), "import mpo_rs.arrow as a; a.with_advantages({'x': [1]})", "mpo_rs.arrow", "arrow"),
        (("pyarrow",), "from mpo_rs.diagnose import diagnose_logs; diagnose_logs('x')", "mpo-rs diagnose", "arrow"),
        (("hypothesis",), "import mpo_rs.testing.strategies", "mpo_rs.testing.strategies", "testing"),
        (("hypothesis",), "import mpo_rs.testing.invariants", "mpo_rs.testing.strategies", "testing"),
        (("hypothesis",), "from mpo_rs.testing import check_advantages", "mpo_rs.testing", "testing"),
    ],
)
def test_a_missing_dependency_is_one_typed_line_naming_the_extra(hidden, code, feature, extra):
    got = _child(hidden, code)
    assert got is not None, f"{code} worked with {hidden} hidden"
    assert got["typed"] and got["import_error"], got
    message = got["message"]
    assert "\n" not in message
    assert message == f"`{feature}` needs {hidden[0]}: {install_hint(extra)}", message


def test_the_kit_reference_needs_no_hypothesis_and_the_core_never_imports_it():
    code = (
        "import sys, mpo_rs, mpo_rs.cli; from mpo_rs.testing import reference; "
        "assert reference.group([1.0, 2.0], [0, 0], norm_std=False) == [-0.5, 0.5]"
    )
    assert _child(("hypothesis",), code) is None


def test_the_core_needs_none_of_them():
    code = (
        "import numpy as np, mpo_rs; "
        "mpo_rs.mae_advantages(np.zeros(4, np.float32), np.ones(4, np.uint8), np.array([0, 4]), scores=np.ones(1))"
    )
    assert _child(OPTIONAL, code) is None


def _cli(hidden: tuple[str, ...], *args: str) -> subprocess.CompletedProcess[str]:
    script = (
        "import sys\n"
        f"for name in {hidden!r}: sys.modules[name] = None\n"
        "from mpo_rs.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def log(tmp_path):
    pytest.importorskip("pyarrow")
    from mpo_rs.demo import write_rollout_log

    path = tmp_path / "log.parquet"
    write_rollout_log(path, 8, row_group_rows=4, seed=1)
    return path


def test_the_cli_without_pyarrow_says_so_in_one_line_before_reading(log, tmp_path):
    r = _cli(("pyarrow", "polars"), "diagnose", str(log), "-o", str(tmp_path / "report"))
    assert r.returncode == 1, r
    assert r.stderr == f"mpo-rs: error: `mpo-rs diagnose` needs pyarrow: {install_hint('arrow')}\n", r.stderr
    assert not (tmp_path / "report").exists()


def test_advantages_needs_neither_pyarrow_nor_polars(log, tmp_path):
    r = _cli(
        ("pyarrow", "polars", "torch", "matplotlib"), "advantages", str(log), "-o", str(tmp_path / "o.parquet"), "-q"
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert (tmp_path / "o.parquet").exists()


def test_diagnose_without_matplotlib_writes_the_summary_and_says_which_extra(log, tmp_path):
    out = tmp_path / "report"
    r = _cli(("matplotlib",), "diagnose", str(log), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "figures skipped" in r.stderr and install_hint("plot") in r.stderr
    assert sorted(p.name for p in out.iterdir()) == [".mpo-rs-output", "summary.json"]  # the report's marker


class _Dist:
    def __init__(self, record: str | None) -> None:
        self.record = record

    def read_text(self, name: str) -> str | None:
        return self.record if name == "direct_url.json" else None


@pytest.mark.parametrize(
    "record, expected",
    [
        # From a wheel file: the same file with the extra.
        ('{"url": "file://WHEEL", "archive_info": {}}', "pip install 'WHEEL[torch]'"),
        # From a checkout, editable (maturin develop, pip install -e): the checkout, -e kept.
        ('{"url": "file://DIR", "dir_info": {"editable": true}}', "pip install -e 'DIR[torch]'"),
        ('{"url": "file://DIR", "dir_info": {}}', "pip install 'DIR[torch]'"),
        # A source that is gone is named by what it was; no record: an index install.
        ('{"url": "file:///nowhere/mpo_rs.whl", "archive_info": {}}', f"pip install '{_deps.GONE}[torch]'"),
        (None, "pip install 'mpo-rs[torch]'"),
    ],
)
def test_the_hint_installs_the_extra_from_where_the_package_came_from(record, expected, tmp_path, monkeypatch):
    wheel = tmp_path / "mpo_rs-0.1.0-cp311-abi3-manylinux_2_34_x86_64.whl"
    wheel.write_bytes(b"")
    if record is not None:
        record = record.replace("WHEEL", str(wheel)).replace("DIR", str(tmp_path))
    monkeypatch.setattr(_deps.metadata, "distribution", lambda name: _Dist(record))
    assert _deps.install_hint("torch") == expected.replace("WHEEL", str(wheel)).replace("DIR", str(tmp_path))


def test_a_command_of_a_package_not_installed_is_one_line_naming_it(monkeypatch, capsys):
    from mpo_rs import cli

    monkeypatch.setattr(cli, "added_commands", dict)  # as without the lab
    assert cli.main(["reproduce", "--quick"]) == 1
    err = capsys.readouterr().err
    assert err == f"mpo-rs: error: `mpo-rs reproduce` is not installed: it comes with {cli.PROVIDERS['reproduce']}\n"
