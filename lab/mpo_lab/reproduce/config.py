"""The reproduction's configurations: arms, budgets, models and tasks (frozen).

Every arm of one configuration trains with the same budget (episodes per update, group
size, updates, epochs, minibatch, learning rate, clip, entropy bonus, model, task): an
arm fixes only the advantage estimator and its knobs, the importance-sampling ratio and
the advantage scale. Arms that ablate one knob of MPO differ from MPO in that knob alone
(``lab/tests/test_reproduce.py`` checks it).

Table 1's arms run on every task (keys ``<prefix><method>``, :data:`TASK_PREFIX`); MPO's
public relatives, the β sweep, the (λ, λ_intra) grid and the advantage-scale ablation on the
main task. Every arm starts from the base policy of its (task, seed) and every critic arm from
the same warmed-up critic (:class:`BasePolicy`, :class:`CriticWarmup`, :mod:`.base`).

The committed configurations themselves are in :mod:`.presets`. The advantage scale is one
rule for every arm: :data:`ADVANTAGE_SCALE_RULE` says it and why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mpo_rs.exceptions import InvalidConfigError, InvalidOptionError
from mpo_rs.options import CRITIC_FREE_FAMILIES, Estimator

from ..seeds import check_run_seeds
from .sources import Demonstrator, SavedPolicy
from .tasks import (
    CONTROL_TASKS,
    MAIN_TASK,
    PREMISE_TASKS,
    TASK_PREFIX,
    VARIANT,
    registry_name,
    state_anchor,
    task_prefix,
)

__all__ = [
    "ARMS",
    "CONTROL_TASKS",
    "MAIN_TASK",
    "PREMISE_TASKS",
    "TABLE1_TASKS",
    "TASK_PREFIX",
    "VARIANT",
    "Arm",
    "BasePolicy",
    "Budget",
    "CriticWarmup",
    "ModelSpec",
    "ReproduceConfig",
    "TaskSpec",
    "gigpo_arm",
    "registry_name",
    "relatives_arms",
    "table1_arms",
    "task_prefix",
]

ADVANTAGE_SCALE_RULE = (
    "No arm's advantages are rescaled by statistics of the batch: GRPO and GSPO keep their defining "
    "(score - group mean) / group std (a group whose rollouts all score the same contributes 0); PPO and "
    "MPO use their advantages in reward units. Batch whitening over the policy tokens (verl's default for "
    "GAE) is the ablation of the `scale` study. The rule was fixed after a pilot (seed 0, an earlier budget "
    "of 120 updates x 32 episodes and 2 epochs, before the final runs) in which PPO and MPO, whitened, never solved a held-out task while GRPO reached 0.83 and the "
    "same arms unwhitened reached 0.25; the final runs use other seeds."
)
"""The advantage-scale rule, as the report states it."""

# The knobs an arm's configuration hash has always recorded, with the values an estimator that
# lacks one was recorded with: the hash of an unchanged arm stays what it was, so earlier
# outputs resume and the committed runs stay the committed configuration's.
_RECORDED_KNOBS = {"lam": None, "lam_intra": 0.95, "beta": 1.0, "lam_critic": 1.0, "high_level_gamma": None}


@dataclass(frozen=True)
class Arm:
    """One method: what the learner estimates and how it weighs the tokens."""

    key: str
    """Unique id (file names, tables)."""
    label: str
    """Name in tables and figures."""
    study: str
    """The study the arm belongs to: ``table1`` (Table 1's arms, on every task), ``relatives``
    (MPO's public relatives), ``beta``, ``lambda`` or ``scale`` (on the main task), ``gigpo``
    or ``ladder``: the arms a figure shows together."""
    task: str
    """Registry name of the environment (``mpo_lab.envs.make``)."""
    estimator: Estimator
    """The advantage estimator with its options, as the learner takes it (unset options take the
    options table's defaults)."""
    ratio: str
    """Importance-sampling ratio: ``token``, ``turn`` or ``sequence`` (GSPO)."""
    whiten: bool = False
    """Whiten the advantages over the policy tokens, as verl does for GAE (the ``scale`` ablation)."""
    critic: str = "learned"
    """Where a critic arm's values come from: ``learned`` (the warmed-up value head, trained
    with the policy) or ``reference`` (the on-policy reference critic of a built-in task,
    :class:`~mpo_lab.reproduce.reference.OnPolicyReference`: a critic of known quality)."""
    critic_ev: float | None = None
    """With ``critic="reference"``: the reference degraded so that its explained variance is
    this fraction of the reference's (the critic-quality ladder); None: the reference itself."""

    def __post_init__(self) -> None:
        if self.whiten and not self.trains_critic:
            raise InvalidConfigError(f"Arm {self.key}: GRPO arms scale by the group std or not at all")
        if self.critic not in CRITIC_SOURCES:
            raise InvalidConfigError(
                f"Arm {self.key}: critic must be one of {', '.join(CRITIC_SOURCES)}, got {self.critic!r}"
            )
        if self.critic != "learned" and not self.trains_critic:
            raise InvalidConfigError(f"Arm {self.key}: a group estimator reads no values, so it takes no critic")
        if self.critic_ev is not None and (self.critic != "reference" or not 0.0 <= self.critic_ev <= 1.0):
            raise InvalidConfigError(
                f"Arm {self.key}: critic_ev is a fraction in [0, 1] of the reference critic's explained variance "
                f"(critic='reference'), got {self.critic_ev!r} with critic={self.critic!r}"
            )

    @property
    def trains_critic(self) -> bool:
        """Whether the arm's advantages need a critic (all but GRPO's and GiGPO's families)."""
        return self.estimator.family not in CRITIC_FREE_FAMILIES

    @property
    def learns_critic(self) -> bool:
        """Whether the arm trains the value head (and so starts from the critic warm-up)."""
        return self.trains_critic and self.critic == "learned"

    @property
    def critic_kind(self) -> str:
        """The run table's ``critic`` column: ``none`` (a group estimator), ``learned``,
        ``reference`` or ``reference+noise`` (a rung of the critic-quality ladder)."""
        if not self.trains_critic:
            return "none"
        if self.critic == "reference" and self.critic_ev is not None and self.critic_ev < 1.0:
            return "reference+noise"
        return self.critic

    @property
    def method(self) -> str:
        """The estimator's name as the hash and the page record it: ``grpo`` for the group
        family, else the estimator's own name."""
        return "grpo" if self.estimator.family == "group" else self.estimator.name

    @property
    def advantage_scale(self) -> str:
        """``group-std`` (GRPO), ``whiten`` or ``none``, as the page names the scale."""
        if self.whiten:
            return "whiten"
        return "group-std" if self.estimator.name == "grpo" else "none"

    def identity(self) -> dict[str, Any]:
        """What the configuration hash records of the arm: its names, the estimator's name
        (``grpo`` for the group family) and the knobs of :data:`_RECORDED_KNOBS`, the ratio and
        the advantage scale."""
        options = self.estimator.options
        knobs = {name: options.get(name, recorded) for name, recorded in _RECORDED_KNOBS.items()}
        if self.estimator.name == "bilevel":
            knobs["lam_critic"] = 1.0  # RAGEN's returns are A + V: the bi-level row has no lam_critic
        out = {
            "key": self.key,
            "label": self.label,
            # The study under its old key name: the hashes of committed runs depend on it.
            "family": self.study,
            "task": self.task,
            "estimator": self.method,
            "ratio": self.ratio,
            "advantage_scale": self.advantage_scale,
            **knobs,
        }
        if self.critic != "learned":  # recorded only where set: the learned critic's hashes stay
            out |= {"critic": self.critic, "critic_ev": self.critic_ev}
        if self.estimator.family == "gigpo":  # no committed arm is one: its options, anchor included
            out["options"] = dict(sorted(options.items()))
        return out


CRITIC_SOURCES = ("learned", "reference")
"""Where a critic arm's values come from (:attr:`Arm.critic`)."""


def _mpo(key: str, label: str, study: str, task: str = MAIN_TASK, ratio: str = "turn", **knobs: Any) -> Arm:
    """An MPO arm: MAE with (λ, λ_intra, β) = (0.8, 0.95, 1) unless ``knobs`` say otherwise."""
    whiten = knobs.pop("whiten", False)
    options = {"lam": 0.8, "lam_intra": 0.95, "beta": 1.0, "lam_critic": 1.0} | knobs
    return Arm(key, label, study, task, Estimator("mae", **options), ratio, whiten)


_PPO = Estimator("gae", lam=0.95, lam_critic=1.0)
"""PPO's token GAE: λ = 0.95, Monte-Carlo critic targets (λ_critic = 1), as every critic's."""


def table1_arms(task: str) -> tuple[Arm, ...]:
    """Table 1's arms (GRPO, GSPO, PPO, MPO w/ token IS, MPO) on ``task`` (a variant too)."""
    p = task_prefix(task)
    return (
        Arm(f"{p}grpo", "GRPO", "table1", task, Estimator("grpo"), "token"),
        Arm(f"{p}gspo", "GSPO", "table1", task, Estimator("grpo"), "sequence"),
        Arm(f"{p}ppo", "PPO", "table1", task, _PPO, "token"),
        _mpo(f"{p}mpo_token_is", "MPO w/ token IS", "table1", task, ratio="token"),
        _mpo(f"{p}mpo", "MPO", "table1", task),
    )


def gigpo_arm(task: str) -> Arm:
    """GiGPO on ``task``: verl-agent's defaults (gamma 0.95, mean_norm, step weight 1), anchors
    on the environment's state (:func:`~.tasks.state_anchor`), token ratio, no critic."""
    return Arm(
        f"{task_prefix(task)}gigpo", "GiGPO", "gigpo", task, Estimator("gigpo", anchor=state_anchor(task)), "token"
    )


def relatives_arms(task: str) -> tuple[Arm, ...]:
    """MPO's public relatives (AReaL's turn-level GAE, RAGEN's bi-level GAE) on ``task``: what a user
    could use instead (docs/spec.md, "Turn-level estimators of other projects")."""
    p = task_prefix(task)
    # AReaL's turn-level GAE (gae_timestep_unit "turn"): gamma*lambda once per turn, the value at
    # the turn's first token, broadcast -- MAE with beta = 0 -- under a token ratio. It differs from
    # MPO in beta and the ratio, and from the beta = 0 arm in the ratio alone.
    out = [_mpo(f"{p}areal_turn_gae", "turn-level GAE (AReaL)", "relatives", task, beta=0.0, ratio="token")]
    # RAGEN's bi-level GAE: a turn-level GAE (high_level_gamma), then a token GAE inside each turn
    # from the turn's return; not mean-preserving. lam = high_level_gamma = 0.95 as RAGEN's and
    # VAGEN's scripts set them, gamma the table's default. RAGEN whitens the advantages over the
    # batch; here, by the one advantage-scale rule, they stay in reward units.
    bilevel = Estimator("bilevel", lam=0.95, high_level_gamma=0.95)
    out.append(Arm(f"{p}ragen_bilevel", "bi-level GAE (RAGEN)", "relatives", task, bilevel, "token"))
    return tuple(out)


TABLE1_TASKS = ("search", "multi_hop", "frozen_lake", "key_door", "guess_number")
"""The tasks of the committed configurations' Table 1, in their arms' order (their hashes name
it). A premise task added since (Sokoban) is trained through a candidate
(:func:`~mpo_lab.reproduce.gates.candidate`) until a configuration of its own lists it."""


def _arms() -> tuple[Arm, ...]:
    table1 = tuple(arm for task in TABLE1_TASKS for arm in table1_arms(task))
    relatives = relatives_arms(MAIN_TASK)
    # beta = 1 and (lam, lam_intra) = (0.80, 0.95) are the MPO arm itself (on the main task).
    beta = tuple(_mpo(f"mpo_beta{b:g}", f"MPO β={b:g}", "beta", beta=b) for b in (0.0, 0.5, 1.5, 2.0))
    grid = tuple(
        _mpo(
            f"mpo_lam{lam:g}_{intra:g}",
            f"MPO (λ, λ_intra)=({lam:.2f}, {intra:.2f})",
            "lambda",
            lam=lam,
            lam_intra=intra,
        )
        for lam, intra in ((0.60, 0.95), (0.85, 0.95), (0.80, 0.90), (0.80, 1.00))
    )
    # The advantage scale: the critic-based arms of Table 1, whitened over the batch as verl does.
    scale = (
        Arm("ppo_whiten", "PPO, whitened", "scale", MAIN_TASK, _PPO, "token", whiten=True),
        _mpo("mpo_whiten", "MPO, whitened", "scale", whiten=True),
    )
    return table1 + relatives + beta + grid + scale


ARMS: tuple[Arm, ...] = _arms()
"""Every arm, in report order."""

BETA_SWEEP = {0.0: "mpo_beta0", 0.5: "mpo_beta0.5", 1.0: "mpo", 1.5: "mpo_beta1.5", 2.0: "mpo_beta2"}
"""β (Table 3) -> arm key; β = 1 is the MPO arm (the main task)."""
LAMBDA_GRID = {
    (0.80, 0.95): "mpo",
    (0.60, 0.95): "mpo_lam0.6_0.95",
    (0.85, 0.95): "mpo_lam0.85_0.95",
    (0.80, 0.90): "mpo_lam0.8_0.9",
    (0.80, 1.00): "mpo_lam0.8_1",
}
"""(λ, λ_intra) (Table 2) -> arm key; (0.80, 0.95) is the MPO arm (the main task)."""


@dataclass(frozen=True)
class Budget:
    """What every arm gets: the same samples, gradient steps and hyper-parameters."""

    updates: int
    tasks_per_update: int
    """Task seeds per update; each is played ``group_size`` times (a GRPO group)."""
    group_size: int
    ppo_epochs: int
    minibatch_size: int
    """Trajectories per optimizer step."""
    lr: float
    """Adam, for the policy and the critic."""
    clip: float
    """PPO clip range, both sides."""
    entropy_coef: float
    max_grad_norm: float
    eval_every: int
    """Evaluate on held-out seeds every this many updates (and after the last one)."""
    eval_tasks: int
    eval_samples: int
    """Rollouts per held-out task at temperature 1 (pass@k for k up to this)."""
    diagnose_tasks: int
    """Held-out tasks rolled out at the end with the critic's values (the diagnosis log)."""
    critic_lr: float | None = None
    """Adam's learning rate for the critic (its warm-up too); None = ``lr``."""
    final_eval_tasks: int | None = None
    """Distinct held-out tasks of the last evaluation (each ``eval_samples`` times); None = ``eval_tasks``."""

    @property
    def critic_learning_rate(self) -> float:
        return self.lr if self.critic_lr is None else self.critic_lr

    @property
    def episodes_per_update(self) -> int:
        return self.tasks_per_update * self.group_size


@dataclass(frozen=True)
class BasePolicy:
    """Where every arm of a seed starts: the policy behaviour-cloned from a noisy oracle
    (:class:`mpo_lab.envs.premise.NoisyOracle`: each turn's action replaced with probability eps
    by a random one, well formed with probability ``well_formed``). One per (task, seed), shared
    by every arm of the seed (:mod:`mpo_lab.reproduce.base`)."""

    noise: tuple[tuple[str, float], ...]
    """Task -> eps of the demonstrations (measured for the clone's success: docs/envs.md)."""
    episodes: int
    """Noisy-oracle demonstrations per (task, seed)."""
    steps: int
    """Optimizer steps of behaviour cloning (cross-entropy on the policy tokens)."""
    batch_size: int
    """Demonstrations per step."""
    lr: float
    well_formed: float = 0.5
    """Of the replaced turns, the share drawn among well-formed actions (the rest: K uniform tokens)."""
    source: Demonstrator | SavedPolicy | None = None
    """None: each task's noisy oracle; else a user env's demonstrator or saved policy (:mod:`.sources`)."""
    cloning: tuple[tuple[str, int, int], ...] = ()
    """Task -> (episodes, steps) where a task's cloning is not ``episodes`` and ``steps``: long
    turns need more demonstrations and steps for the clone to imitate (docs/instrument.md)."""

    def sizes(self, task: str) -> tuple[int, int]:
        """The task's demonstrations and cloning steps (a variant without its own: its environment's)."""
        sizes = {name: (episodes, steps) for name, episodes, steps in self.cloning}
        return sizes.get(task, sizes.get(registry_name(task), (self.episodes, self.steps)))

    def eps(self, task: str) -> float:
        """The task's noise; a variant (``search@think16``) without its own, its environment's."""
        noise = dict(self.noise)
        for name in (task, registry_name(task)):
            if name in noise:
                return noise[name]
        raise InvalidConfigError(f"BasePolicy: no noise level for task {task!r}; it has {[n for n, _ in self.noise]}")


@dataclass(frozen=True)
class CriticWarmup:
    """VAPO's value pretraining: before RL the critic (the base's trunk, a zero value head) is
    fitted to the Monte-Carlo returns of base-policy rollouts at ``Budget.critic_lr``; one per
    (task, seed), shared by every critic arm of the seed."""

    episodes: int
    """Base-policy rollouts fitted (tasks x the budget's group size)."""
    steps: int
    """Critic optimizer steps (Adam, a fresh one; the RL critic optimizer starts afresh too)."""
    batch_size: int
    """Trajectories per step, drawn at random without replacement within a step."""


BASE_BAND = (0.10, 0.25)
"""The held-out success the base policies are set for (the paper's base models: 9-25%)."""


@dataclass(frozen=True)
class ModelSpec:
    """The policy (``TinyCausalLM``); the critic is a copy with a scalar head."""

    width: int
    layers: int
    heads: int


@dataclass(frozen=True)
class TaskSpec:
    name: str
    """A registry name (``mpo_lab.envs.make``), optionally with a variant's label after
    :data:`VARIANT` (``search@think16``: the same environment with this spec's parameters,
    beside ``search`` in one configuration), or a user env's ``module:factory``."""
    params: tuple[tuple[str, Any], ...] = ()
    code: str | None = None
    """A user env's code identity (:func:`mpo_lab.reproduce.env.env_code`: its modules'
    sources and the version it declares); None for the built-in tasks, which are the
    package's own code."""

    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    def identity(self) -> dict[str, Any]:
        """What the hashes record of the task: name, parameters and, for a user env, its code
        (a built-in task has no ``code`` key, so its hashes are those it always had)."""
        out = dataclasses.asdict(self)
        if self.code is None:
            del out["code"]
        return out


@dataclass(frozen=True)
class ReproduceConfig:
    name: str
    seeds: int
    budget: Budget
    model: ModelSpec
    tasks: tuple[TaskSpec, ...]
    device: str = "cpu"
    workers: int = 2
    arms: tuple[Arm, ...] = field(default=ARMS)
    first_seed: int = 0
    """Runs use seeds first_seed, ..., first_seed + seeds - 1 (FULL skips the pilot's seeds)."""
    base: BasePolicy | None = None
    """The base policies every arm starts from; None = from a random initialisation."""
    warmup: CriticWarmup | None = None
    """The critic warm-up of every arm that trains a critic; None = none (a zero value head)."""
    plan: str = "paper"
    """The analysis plan its runs follow (:data:`mpo_lab.reproduce.plan.PLANS`): ``paper`` (the
    paper's claims on Table 1's tasks) or ``instrument`` (the gated tasks' comparisons)."""

    def __post_init__(self) -> None:
        check_run_seeds(self.first_seed, self.seeds)  # every accepted seed's tasks stay apart

    @property
    def seed_list(self) -> tuple[int, ...]:
        return tuple(range(self.first_seed, self.first_seed + self.seeds))

    def task(self, name: str) -> TaskSpec:
        for spec in self.tasks:
            if spec.name == name:
                return spec
        raise KeyError(f"configuration {self.name!r} has no task {name!r}")

    def arm(self, key: str) -> Arm:
        for arm in self.arms:
            if arm.key == key:
                return arm
        raise KeyError(f"configuration {self.name!r} has no arm {key!r}")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["budget"]["final_eval_tasks"] is None:  # unset: the hash a configuration always had
            del out["budget"]["final_eval_tasks"]
        if self.base is not None and self.base.source is None:  # the oracles': the hashes they had
            del out["base"]["source"]
        if self.base is not None and not self.base.cloning:  # set only where a task's differs
            del out["base"]["cloning"]
        if self.plan == "paper":  # the plan the committed configurations always followed
            del out["plan"]
        out["tasks"] = [task.identity() for task in self.tasks]
        out["arms"] = [arm.identity() for arm in self.arms]
        return out

    def config_hash(self) -> str:
        """sha256 (12 hex digits) of the configuration: every field but ``workers`` (which
        only schedules the runs), a user env's code identity with its task
        (:meth:`TaskSpec.identity`). It does not cover mpo_rs's own code or its dependencies'."""
        payload = self.to_dict()
        payload.pop("workers")
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def with_arms(self, keys: Sequence[str]) -> ReproduceConfig:
        """Only the arms ``keys`` (a sequence of arm keys), in this configuration's order;
        an unknown key is an InvalidOptionError naming the known ones."""
        known = [arm.key for arm in self.arms]
        unknown = [key for key in keys if key not in known]
        if unknown or not keys:
            raise InvalidOptionError(
                f"unknown arm(s) {', '.join(map(repr, unknown)) or '(none given)'}; known: {', '.join(known)}"
            )
        return dataclasses.replace(self, arms=tuple(arm for arm in self.arms if arm.key in set(keys)))

    def with_overrides(self, **changes: Any) -> ReproduceConfig:
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
