"""The plug-in's names, its errors and the options it reads from verl's config.

Every estimator option is judged by the Rust options table (``mpo_rs.Estimator``): this
module only says which config key feeds which option of which table estimator, and names
the key when the table refuses a value. Nothing here converts a value (a string such as
``"false"`` or ``"0.9"``, as a YAML override may produce, is refused like any other value
of the wrong kind) or declares a default the table owns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from ...exceptions import InvalidConfigError, InvalidOptionError, MissingCriticValuesError
from ...options import Estimator, default

__all__ = [
    "BATCH_ESTIMATORS",
    "CRITIC_ESTIMATORS",
    "CRITIC_FREE_ESTIMATORS",
    "ESTIMATORS",
    "LOSS_MODES",
    "SESSION_GROUPED_ESTIMATORS",
    "VERL_DEFAULTS",
    "EstimatorOptions",
    "InvalidConfigError",
    "MPOOptions",
    "MissingCriticValuesError",
    "config_get",
    "estimator_options",
]

CRITIC_ESTIMATORS = ("mpo_gae", "mpo_mae", "mpo_bilevel_gae")
CRITIC_FREE_ESTIMATORS = ("mpo_grpo", "mpo_rloo", "mpo_mae_grpo", "mpo_mae_rloo", "mpo_gigpo")
ESTIMATORS = CRITIC_ESTIMATORS + CRITIC_FREE_ESTIMATORS
LOSS_MODES = ("mpo", "mpo_geo_mean")

# Plug-in estimator -> the verl estimator whose multi-output session grouping it gets in the
# v1 trainer. verl 0.9.1's compute_advantage_for_multi_trajectories groups `{uid}_{session}`
# outputs only for "grpo": it scores each session by its final output and gives that row's
# advantage to every output of the session, which is right only for one advantage per row.
SESSION_GROUPED_ESTIMATORS = {"mpo_grpo": "grpo"}

VERL_DEFAULTS: dict[str, Any] = {"gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True}
"""verl's own defaults (its ``AlgoConfig``) of the ``algorithm`` keys the plug-in reads,
used when a key is absent or null."""

# The plug-in estimators that read the batch beyond verl's arguments (the values hook
# exposes it to them during the call): mpo_gigpo's anchor states.
BATCH_ESTIMATORS = ("mpo_gigpo",)

# The table estimator that owns each `algorithm.mpo` option (where its default lives).
_OWNER = {"lam": "mae", "lam_intra": "mae", "beta": "mae", "lam_critic": "mae", "eps": "grpo", "anchor": "gigpo"}


@dataclass(frozen=True)
class MPOOptions:
    """The ``algorithm.mpo`` section as written (all keys optional; None, or absent, means
    the default of the Rust options table, ``mpo_rs.Estimator``). Values are judged by the
    estimator that uses them (:func:`estimator_options`), which raises
    ``mpo_rs.InvalidOptionError`` naming the key; an estimator refuses a non-default value of
    an option it does not use."""

    lam: Any = None
    """MAE family: turn-scale lambda (credit decays once per interaction)."""
    lam_intra: Any = None
    """MAE family: token lambda inside a turn."""
    beta: Any = None
    """MAE family: weight of the centred intra-turn refinement (0 = one advantage per turn)."""
    lam_critic: Any = None
    """``mpo_mae``: lambda of the critic's value targets (1 = discounted Monte-Carlo return)."""
    eps: Any = None
    """GRPO-scaled estimators (``mpo_grpo``, ``mpo_mae_grpo`` with
    ``algorithm.norm_adv_by_std_in_grpo=true``, ``mpo_gigpo`` in ``mean_std_norm``): added to
    the std before dividing."""
    anchor: Any = None
    """``mpo_gigpo`` without ``anchor_obs``: how turns' token ids are read as anchor states,
    ``"observation"`` (the tokens since the previous turn) or ``"prefix"`` (every token
    before the turn)."""
    whiten: Any = None
    """Whiten advantages over the batch's LLM tokens (verl's ``masked_whiten`` formula): true,
    false, or None = the estimator's default (on for ``mpo_gae``, as verl's ``gae``; off
    otherwise)."""
    rollout_log_dir: Any = None
    """Not an estimator option: a directory to which every training batch is appended as
    Parquet (``mpo_rs.integrations.verl.rollout_log``); None = no log (or
    ``$MPO_RS_VERL_ROLLOUT_LOG_DIR``)."""

    def __post_init__(self) -> None:
        # Not judged by an estimator: checked here, where every reader of the section goes.
        value = self.rollout_log_dir
        if value is not None and (isinstance(value, bytes) or not isinstance(value, (str, os.PathLike))):
            raise InvalidOptionError(
                "`algorithm.mpo.rollout_log_dir` must be a directory path (a string) or null, got "
                f"{type(value).__name__} {value!r}"
            )

    @classmethod
    def from_config(cls, config: Any) -> MPOOptions:
        """The section of ``config`` (the ``algorithm`` config); refuses an unknown key."""
        return cls(**config_section(config, "mpo", {f.name for f in fields(cls)}))


@dataclass(frozen=True)
class EstimatorOptions:
    """What a plug-in estimator computes with, read from verl's ``algorithm`` config."""

    estimator: Estimator
    """The table estimator (``gae``, ``mae``, ``bilevel`` or ``grpo``) with its options."""
    group: Estimator | None
    """The critic-free MAE estimators' group baseline (a ``grpo`` estimator), else None."""
    whiten: bool


class _Reader:
    """Reads the keys one plug-in estimator uses and builds its table estimators, naming the
    config key of a value the table refuses; remembers the ``algorithm.mpo`` options used."""

    def __init__(self, name: str, config: Any) -> None:
        self.name = name
        self.config = config
        self.section = MPOOptions.from_config(config)
        self.used: set[str] = set()

    def verl(self, key: str) -> tuple[str, Any]:
        """``algorithm.<key>``: verl's own key, its default when absent or null."""
        value = config_get(self.config, key, None)
        return f"algorithm.{key}", VERL_DEFAULTS[key] if value is None else value

    def mpo(self, option: str) -> tuple[str, Any]:
        """``algorithm.mpo.<option>`` (None: the table's default)."""
        self.used.add(option)
        return f"algorithm.mpo.{option}", getattr(self.section, option)

    def build(self, family: str, **options: tuple[str, Any]) -> Estimator:
        """``Estimator(family, option=value, ...)`` from ``option=(config key, value)``
        pairs, None values left at the table's default. Each value is judged alone first,
        so that a refusal names its key."""
        given = {option: value for option, (_, value) in options.items() if value is not None}
        for option, value in given.items():
            try:
                Estimator(family, **{option: value})
            except InvalidOptionError as e:
                # A value refused alone may be taken beside the others (gigpo's eps needs
                # norm_std=True); if the whole is refused too, name this key.
                if _accepted(family, given):
                    continue
                key = options[option][0]
                raise InvalidOptionError(f"`{key}` (adv_estimator {self.name}): {e}") from None
        try:
            return Estimator(family, **given)
        except InvalidOptionError as e:
            keys = ", ".join(f"`{options[option][0]}`" for option in given)
            raise InvalidOptionError(f"{keys} (adv_estimator {self.name}): {e}") from None

    def norm_std(self) -> tuple[str, bool]:
        """``algorithm.norm_adv_by_std_in_grpo`` as the table reads ``norm_std``."""
        key, value = self.verl("norm_adv_by_std_in_grpo")
        return key, bool(self.build("grpo", norm_std=(key, value)).options["norm_std"])

    def whiten(self, default: bool) -> bool:
        value = self.section.whiten
        if value is None:
            return default
        if not isinstance(value, bool):
            raise InvalidOptionError(
                f"`algorithm.mpo.whiten` (adv_estimator {self.name}) must be true, false or null, got "
                f"{type(value).__name__} {value!r}"
            )
        return value

    def refuse_unused(self, why: dict[str, str]) -> None:
        """Refuses a non-default value of an ``algorithm.mpo`` option this estimator does
        not use; ``why`` says, per option, why it does not apply."""
        for option in _OWNER:
            if option in self.used:
                continue
            value = getattr(self.section, option)
            if value is None:
                continue
            table_default = default(_OWNER[option], option)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == table_default:
                continue  # a shared config may spell out a default
            used = ", ".join(sorted(self.used | {"whiten"}))
            raise InvalidOptionError(
                f"`algorithm.mpo.{option}` = {value!r} does not apply to adv_estimator {self.name} "
                f"({why.get(option, 'it has no such option')}); it reads algorithm.mpo.{{{used}}}. "
                f"Remove the key (or set it to its default, {table_default!r})"
            )


def _accepted(family: str, options: dict[str, Any]) -> bool:
    try:
        Estimator(family, **options)
    except InvalidOptionError:
        return False
    return True


def estimator_options(name: str, config: Any) -> EstimatorOptions:
    """The options of plug-in estimator ``name`` (one of :data:`ESTIMATORS`) in verl's
    ``algorithm`` config (``config``: a DictConfig, a verl dataclass config or a dict):

    ========================  ==========================================================
    ``mpo_gae``               ``gae`` with ``gamma``, ``lam`` = ``lam_critic`` from
                              ``algorithm.gamma`` / ``algorithm.lam``
    ``mpo_mae``               ``mae`` with ``algorithm.gamma`` and ``algorithm.mpo.lam``,
                              ``lam_intra``, ``beta``, ``lam_critic``
    ``mpo_grpo``              ``grpo`` with ``norm_std`` from
                              ``algorithm.norm_adv_by_std_in_grpo`` and, when it is true,
                              ``algorithm.mpo.eps``
    ``mpo_rloo``              ``grpo`` with ``leave_one_out``
    ``mpo_mae_grpo``          ``mae`` (``algorithm.gamma``, ``algorithm.mpo.lam``,
                              ``lam_intra``, ``beta``) over ``mpo_grpo``'s group baseline
    ``mpo_mae_rloo``          the same over ``mpo_rloo``'s
    ``mpo_bilevel_gae``       ``bilevel`` with ``gamma``, ``lam`` from ``algorithm.gamma`` /
                              ``algorithm.lam`` and ``high_level_gamma`` from
                              ``algorithm.high_level_gamma`` (RAGEN's keys; absent or null:
                              the table's 0.95)
    ``mpo_gigpo``             ``gigpo`` with ``algorithm.gamma``, verl-agent's
                              ``algorithm.gigpo.step_advantage_w`` (``step_weight``) and
                              ``algorithm.gigpo.mode`` (``mean_norm``, its default, or
                              ``mean_std_norm``: ``norm_std``), ``algorithm.mpo.eps`` and
                              ``algorithm.mpo.anchor``
    ========================  ==========================================================

    ``algorithm.mpo.whiten`` applies to all. Raises ``mpo_rs.InvalidOptionError`` naming the
    key for a value the table refuses (a string included), an unknown ``algorithm.mpo`` key,
    or a non-default value of an ``algorithm.mpo`` option the estimator does not use. verl's
    own keys are read only by the estimators that use them, as verl's estimators do.
    """
    if name not in ESTIMATORS:
        raise InvalidConfigError(f"unknown plug-in estimator {name!r}; known: {', '.join(ESTIMATORS)}")
    read = _Reader(name, config)
    # verl's gae and RAGEN's bi-level GAE whiten their advantages.
    whiten = read.whiten(default=name in ("mpo_gae", "mpo_bilevel_gae"))
    group: Estimator | None = None
    no_eps = "it does not divide by the group std"
    if name == "mpo_gae":
        key, lam = read.verl("lam")
        estimator = read.build("gae", gamma=read.verl("gamma"), lam=(key, lam), lam_critic=(key, lam))
        read.refuse_unused(dict.fromkeys(_OWNER, "it is token GAE: its lambda is algorithm.lam, as for verl's gae"))
    elif name == "mpo_bilevel_gae":
        high = ("algorithm.high_level_gamma", config_get(config, "high_level_gamma", None))
        estimator = read.build("bilevel", gamma=read.verl("gamma"), lam=read.verl("lam"), high_level_gamma=high)
        read.refuse_unused(
            dict.fromkeys(
                _OWNER, "it is RAGEN's bi-level GAE: algorithm.gamma, algorithm.lam, algorithm.high_level_gamma"
            )
        )
    elif name == "mpo_mae":
        mae = {o: read.mpo(o) for o in ("lam", "lam_intra", "beta", "lam_critic")}
        estimator = read.build("mae", gamma=read.verl("gamma"), **mae)
        read.refuse_unused({"eps": "it has no group baseline"})
    elif name == "mpo_gigpo":
        estimator = _gigpo(read, config)
        read.refuse_unused(dict.fromkeys(("lam", "lam_intra", "beta", "lam_critic"), "it is not an MAE estimator"))
    elif name in ("mpo_grpo", "mpo_rloo"):
        estimator = _group(read, leave_one_out=name == "mpo_rloo")
        read.refuse_unused(
            {"eps": no_eps} | dict.fromkeys(("lam", "lam_intra", "beta", "lam_critic"), "it is not an MAE estimator")
        )
    else:
        mae = {o: read.mpo(o) for o in ("lam", "lam_intra", "beta")}
        estimator = read.build("mae", gamma=read.verl("gamma"), **mae)
        group = _group(read, leave_one_out=name == "mpo_mae_rloo")
        read.refuse_unused({"eps": no_eps, "lam_critic": "it has no critic"})
    return EstimatorOptions(estimator, group, whiten)


# verl-agent's `algorithm.gigpo.mode` values, as the table's norm_std.
_GIGPO_MODES = {"mean_norm": False, "mean_std_norm": True}


def _gigpo(read: _Reader, config: Any) -> Estimator:
    """GiGPO with verl-agent's keys (``algorithm.gigpo.step_advantage_w``, ``.mode``) beside
    ``algorithm.gamma`` and ``algorithm.mpo.eps`` / ``.anchor``."""
    section = config_section(config, "gigpo", {"step_advantage_w", "mode"})
    mode = section.get("mode")
    if mode is not None and mode not in _GIGPO_MODES:
        raise InvalidOptionError(
            f"`algorithm.gigpo.mode` (adv_estimator {read.name}) must be one of "
            f"{', '.join(map(repr, _GIGPO_MODES))}, got {mode!r}"
        )
    norm_std = None if mode is None else _GIGPO_MODES[mode]
    return read.build(
        "gigpo",
        gamma=read.verl("gamma"),
        step_weight=("algorithm.gigpo.step_advantage_w", section.get("step_advantage_w")),
        norm_std=("algorithm.gigpo.mode", norm_std),
        eps=read.mpo("eps"),
        anchor=read.mpo("anchor"),
    )


def _group(read: _Reader, leave_one_out: bool) -> Estimator:
    """The group estimator: RLOO's leave-one-out mean, or GRPO's group mean scaled by
    1 / (std + ``algorithm.mpo.eps``) unless ``algorithm.norm_adv_by_std_in_grpo=false``
    (Dr. GRPO)."""
    if leave_one_out:
        return read.build("grpo", leave_one_out=("adv_estimator", True))
    key, norm_std = read.norm_std()
    if not norm_std:
        return read.build("grpo", norm_std=(key, False))
    return read.build("grpo", norm_std=(key, True), eps=read.mpo("eps"))


def config_section(config: Any, key: str, known: set[str]) -> dict[str, Any]:
    """The section ``algorithm.<key>`` of ``config`` as a dict (empty when absent or null),
    for every section the plug-in reads: a key it does not know is refused, naming it,
    rather than silently leaving its option at the default."""
    section = config_get(config, key, None)
    if section is None:
        return {}
    try:
        given = dict(section.items())
    except AttributeError:
        raise InvalidConfigError(
            f"`algorithm.{key}` must be a mapping of options, got {type(section).__name__}"
        ) from None
    unknown = sorted(set(given) - known, key=str)
    if unknown:
        raise InvalidOptionError(
            f"unknown `algorithm.{key}` option(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}"
        )
    return given


def config_get(config: Any, key: str, default: Any) -> Any:
    """``config[key]`` for an OmegaConf DictConfig, a verl dataclass config or a dict."""
    if config is None:
        return default
    get = getattr(config, "get", None)
    if callable(get):
        return get(key, default)
    return getattr(config, key, default)
