"""The columns of a rollout log, from the one column spec in Rust (``rust/logs`` schema).

:func:`mpo_rs._native.column_spec` gives one dict per column -- ``name`` (the key of its
option: ``mask`` is ``mask_col`` / ``--mask-col``), ``default`` (the column's default name),
``type``, ``role`` (``"input"``, ``"optional"``: read when present or named, ``"named"``:
read only when named, ``"output"``: appended) and ``doc``. Every entry point (``mpo_rs.arrow``, the ``mpo-rs`` command, the Ray
adapter, ``mpo-rs diagnose``) takes its default column names from here, as the estimator
options come from ``Estimator.option_table()``; none spells a column name of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ._native import InvalidBatchError, InvalidOptionError, MpoError, closest_name, column_spec

__all__ = [
    "COLUMN_SPEC",
    "GROUP",
    "MASK",
    "OUTPUT_COLUMNS",
    "REWARDS",
    "SCORE",
    "STEP",
    "TOKEN_IDS",
    "TRUNCATED",
    "TURN_REWARDS",
    "TURN_STATE_IDS",
    "VALUES",
    "Columns",
    "add_flags",
    "default",
    "flag",
    "flag_keywords",
    "keyword",
    "missing_column",
    "missing_column_error",
    "missing_column_hint",
    "row",
    "with_hint",
]

COLUMN_SPEC: tuple[dict[str, Any], ...] = column_spec()
"""The spec's rows, in its order."""

_BY_NAME = {r["name"]: r for r in COLUMN_SPEC}


def row(name: str) -> dict[str, Any]:
    """The spec's row of the column ``name`` (``"mask"``, ``"values"``, ...)."""
    return _BY_NAME[name]


def default(name: str) -> str:
    """The default column name of ``name`` (``default("mask")`` is ``"loss_mask"``)."""
    return str(_BY_NAME[name]["default"])


def flag(name: str) -> str:
    """The command-line flag of the column ``name`` (``--mask-col``)."""
    return f"--{name.replace('_', '-')}-col"


def keyword(name: str) -> str:
    """The Python keyword of the column ``name`` (``mask_col``)."""
    return f"{name}_col"


def missing_column(name: str, have: Sequence[str], whose: str = "") -> str:
    """The "missing column" message in the form the Rust layer writes it: the columns
    there are (``whose``: "the input's " where they are the input's own rather than those
    handed over), led by the likely meant one when ``name`` looks like its misspelling."""
    guess = closest_name(name, list(have))
    listed = ", ".join(have) if have else "none"
    return (
        f"missing column `{name}` ({'' if guess is None else f'did you mean `{guess}`? '}{whose}columns are: {listed})"
    )


def missing_column_hint(
    error: InvalidBatchError, chosen: Mapping[str, str | None], spell: Callable[[str], str] = keyword
) -> str | None:
    """The hint for a missing-column error (``error.missing``, the names none of which the
    input has): which option names the column to use instead (``spell`` turns the spec's
    name into :func:`keyword` or :func:`flag`). ``chosen`` maps the spec's names (``"mask"``)
    to the column names the run looked for, None for an optional column left to its default.
    None for any other error, or when the message names the options already."""
    wanted = error.missing or ()
    options = []
    for column in wanted:
        for name, chosen_name in chosen.items():
            if column == (chosen_name if chosen_name is not None else default(name)):
                options.append(f"{spell(name)}{'=' if spell is keyword else ' '}NAME")
                break
    message = str(error)
    if not options or all(o.split("=")[0].split(" ")[0] in message for o in options):
        return None  # none to name, or the message names them already
    return f"name the column to use with {' or '.join(options)}"


def missing_column_error(name: str, have: Sequence[str], where: str = "") -> InvalidBatchError:
    """The error for an input without the column ``name``, raised in Python as the Rust
    layer raises it: its message lists ``have`` (led by ``where``, a file), its ``column``
    and ``missing`` name it."""
    message = missing_column(name, have)
    error = InvalidBatchError(f"{where}: {message}" if where else message)
    error.column, error.missing = name, (name,)
    return error


_Error = TypeVar("_Error", bound=MpoError)


def with_hint(error: _Error, hint: str) -> _Error:
    """``error`` itself, its message followed by ``; hint`` (its attributes kept)."""
    error.args = (f"{error}; {hint}",)
    return error


MASK = default("mask")
VALUES = default("values")
REWARDS = default("rewards")
SCORE = default("score")
GROUP = default("group")
STEP = default("step")
TURN_REWARDS = default("turn_rewards")
TRUNCATED = default("truncated")
TURN_STATE_IDS = default("turn_state_ids")
TOKEN_IDS = default("token_ids")
OUTPUT_COLUMNS: tuple[str, ...] = tuple(str(r["default"]) for r in COLUMN_SPEC if r["role"] == "output")
"""The four columns the tools append, in order."""


def add_flags(
    group: argparse.ArgumentParser | argparse._ArgumentGroup,
    names: Sequence[str],
    helps: Mapping[str, str] | None = None,
) -> None:
    """One ``--NAME-col`` flag per column ``names`` of the spec, with its default name (the
    ``dest`` is ``NAME_col``); an optional column (rewards, score, step, ...) defaults to
    None, so the tool's own rule picks it when present; a "named" column (check_score) is
    read only when its flag is given. ``helps`` replaces a column's help line."""
    for name in names:
        r = row(name)
        help = (helps or {}).get(name)
        if help is None and r["role"] == "named":
            help = f"{r['doc']}, {r['type']} (default: none, read only when named)"
        if help is None:
            when = ", if present" if r["role"] == "optional" else ""
            help = f"{r['doc']}, {r['type']} (default: {r['default']}{when})"
        default = None if r["role"] in ("optional", "named") else r["default"]
        group.add_argument(flag(name), default=default, metavar="NAME", help=help.replace("%", "%%"))


def flag_keywords(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The column flags of :func:`add_flags` with the same ``names``, as parsed: the Python
    keywords (``mask_col``) to their values (None: an optional column not named)."""
    return {keyword(name): getattr(args, keyword(name)) for name in names}


@dataclasses.dataclass(frozen=True)
class Columns:
    """The columns of a rollout log the advantage tools read (``mpo_rs.arrow``, the Ray
    adapter, ``mpo-rs advantages``): one field per column of the spec but ``step`` (the
    diagnostics' alone), holding the column's name in the log. A column the spec always
    reads defaults to its default name; the others to None: read when present (``rewards``,
    ``score``, ``turn_rewards`` -- the first of them present is the reward signal --
    ``truncated``; gigpo's anchor states ``turn_state_ids``, else ``token_ids``) or only
    when named (``check_score``). The entry points also take the fields as keywords
    (``mask_col="m"``), which build a ``Columns``."""

    mask: str = MASK
    values: str = VALUES
    rewards: str | None = None
    score: str | None = None
    group: str = GROUP
    turn_rewards: str | None = None
    check_score: str | None = None
    truncated: str | None = None
    turn_state_ids: str | None = None
    token_ids: str | None = None

    def __post_init__(self) -> None:
        for name, value in self.chosen().items():
            if not (isinstance(value, str) or (value is None and row(name)["role"] != "input")):
                kind = "a column name" if row(name)["role"] == "input" else "a column name or None"
                raise InvalidOptionError(f"the {name} column must be {kind}, got {value!r:.80}")

    @classmethod
    def split(cls, columns: Columns | None, keywords: dict[str, Any]) -> tuple[Columns, dict[str, Any]]:
        """``columns`` (None: the defaults) with the column keywords of ``keywords``
        (``mask_col=...``; None: not given) applied, and the other keywords (the estimator's
        options). Columns given both ways are refused (:class:`mpo_rs.InvalidOptionError`)."""
        keys = {k for k in keywords if k.endswith("_col") and k.removesuffix("_col") in _FIELDS}
        given = {k.removesuffix("_col"): keywords[k] for k in keys if keywords[k] is not None}
        rest = {k: v for k, v in keywords.items() if k not in keys}
        if columns is None:
            return cls(**given), rest
        if not isinstance(columns, Columns):
            raise InvalidOptionError(f"`columns` must be an mpo_rs.Columns, got {type(columns).__name__}")
        if given:
            both = ", ".join(f"`{keyword(k)}`" for k in given)
            raise InvalidOptionError(f"give the columns as `columns=` or as keywords, not both ({both} with `columns`)")
        return columns, rest

    def chosen(self) -> dict[str, str | None]:
        """The spec's names to the names in the log (None: the column's default rule)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def keywords(self, *names: str) -> dict[str, Any]:
        """The columns as the public functions' keywords (``mask_col``), all or ``names``."""
        return {keyword(k): v for k, v in self.chosen().items() if not names or k in names}

    def refuse(self, *names: str, where: str) -> None:
        """Refuses (:class:`mpo_rs.InvalidOptionError`) a column of ``names`` that is set:
        ``where`` does not read it, and a setting must not be lost."""
        for name in names:
            if getattr(self, name) != getattr(_DEFAULT_COLUMNS, name):
                raise InvalidOptionError(f"{where} does not read the {name} column (`{keyword(name)}`)")


_FIELDS = frozenset(f.name for f in dataclasses.fields(Columns))
_DEFAULT_COLUMNS = Columns()
