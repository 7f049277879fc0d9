"""What to do with a reward on an observation token (where the mask is 0).

The estimators refuse such a reward; a trainer that writes a trajectory's score into a
padded row's last column (a padding token) puts it exactly there. The choices and their
docs come from Rust (``mpo_rs._native.observation_rewards_spec()``, the table of
rust/logs/src/relocate.rs); ``observation_rewards=`` of :mod:`mpo_rs.arrow`,
:mod:`mpo_rs.diagnose` and :mod:`mpo_rs.torch`, and ``--observation-rewards`` of the
``mpo-rs`` command, all read them from here.
"""

from __future__ import annotations

from typing import Any

from . import _native
from .exceptions import InvalidOptionError

__all__ = ["DEFAULT", "OBSERVATION_REWARDS", "check", "flag_help"]

_SPEC: tuple[dict[str, Any], ...] = _native.observation_rewards_spec()

OBSERVATION_REWARDS: tuple[str, ...] = tuple(str(row["name"]) for row in _SPEC)
"""The choices: ``"error"`` (refuse it, the default), ``"drop"`` (ignore it), ``"credit"``
(move it to the last policy token before it in its row; dropped if there is none)."""

DEFAULT: str = OBSERVATION_REWARDS[0]


def check(value: object, name: str = "observation_rewards") -> str:
    """``value`` if it is one of :data:`OBSERVATION_REWARDS`, else ``InvalidOptionError``."""
    if not isinstance(value, str) or value not in OBSERVATION_REWARDS:
        raise InvalidOptionError(
            f"unknown {name}={value!r}; expected one of {', '.join(map(repr, OBSERVATION_REWARDS))}"
        )
    return value


def flag_help() -> str:
    """The help line of ``--observation-rewards``."""
    choices = "; ".join(f"{row['name']}: {row['doc']}" for row in _SPEC)
    return f"what to do with a token reward where the mask is 0 -- {choices} (default: {DEFAULT})"
