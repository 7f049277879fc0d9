"""The gates a task passes before a comparison of arms on it counts.

A comparison between arms that did not learn, on a task whose values no critic could
predict, says nothing about credit assignment. So a task is first measured on gates of its
own, fixed before any pilot that they judge (:data:`GATES`, defined in :mod:`.gate_rules` with
the measurements and :func:`judge`, and registered in the analysis plan), on seeds of the pilot:

- **learning**: GRPO and PPO each beat their base policy, final held-out success minus the
  base's, paired by seed, with a 95% lower bound of at least ``learning_lower_bound``;
- **exploration**: the base's per-token entropy on policy tokens (the sampled tokens' mean
  -log pi, as the learning curves report it; with thinking tokens, on the tool call's tokens
  only, :func:`call_tokens`) is at least ``base_entropy``, and at least
  ``distinct_groups`` of the GRPO groups at update 0 (the budget's group size, rollouts of
  one task) have outcomes that are not all the same;
- **predictability**: the task's *critic ceiling* -- the cross-fitted explained variance of
  the on-policy reference critic (:mod:`.reference`) on the base's rollouts -- is at least
  ``critic_ceiling`` on a premise task, and the learned critics reach at least
  ``learned_share_of_ceiling`` of it after the warm-up and at the end of training;
- **premise on the real base**: the median between-turn share of the reference critic's
  values on the base's rollouts is at least ``premise_share`` on a premise task and below
  ``control_share`` on the negative control.

``mpo-lab gates`` measures the base-policy gates of the tasks of a
configuration on the pilot's seeds, and the learning and learned-critic gates from a pilot's
``results.json``; docs/instrument.md has its output. Its ``--json`` file is what
``mpo-rs reproduce --gates FILE`` reads (:mod:`.gating`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mpo_rs.outputs import write_file

from .gate_rules import GATES, Gates, base_measurement, gates_table, judge, learning_measurement

__all__ = ["candidate", "gates_payload", "main"]  # the rules themselves: .gate_rules


def candidate(
    config: Any,
    only: Sequence[str] | None,
    params: Mapping[str, Any],
    *,
    base_eps: float | None = None,
    lr: float | None = None,
    base_episodes: int | None = None,
    base_steps: int | None = None,
    updates: int | None = None,
    model: str | None = None,
    ladder: bool = False,
    gigpo: bool = False,
    add: Sequence[str] | None = None,
    gates: Gates = GATES,
) -> Any:
    """``config`` restricted to the tasks ``only`` (all: None), with ``params`` set on them,
    and to the arms the gates read (:attr:`Gates.learning_arms`, :attr:`Gates.critic_arms`);
    ``base_eps`` the noise of their base policies' demonstrations, ``base_episodes`` and
    ``base_steps`` their number and the cloning's optimizer steps, ``lr`` every arm's (and
    the critic's) learning rate, ``updates`` every arm's updates, ``model`` the policy's and
    critic's size as ``WIDTHxLAYERSxHEADS`` (``128x2x4``); ``ladder`` adds the
    critic-quality ladder's arms (:func:`~mpo_lab.reproduce.ladder.ladder_arms`) on each task,
    ``gigpo`` GiGPO (:func:`~mpo_lab.reproduce.config.gigpo_arm`); ``add`` tasks ``config`` does
    not have (a premise task not in a committed configuration), with Table 1's arms and
    ``base_eps`` as their demonstrations' noise."""
    from mpo_rs.exceptions import InvalidOptionError

    from .config import TaskSpec, gigpo_arm, table1_arms, task_prefix
    from .ladder import ladder_arms

    have = {spec.name for spec in config.tasks}
    new = [name for name in add or () if name not in have]
    if new:
        if base_eps is None or config.base is None:
            raise InvalidOptionError(f"added task(s) {new} need --base-eps: their base policies' noise")
        noise = config.base.noise + tuple((name, base_eps) for name in new)
        config = dataclasses.replace(
            config,
            tasks=config.tasks + tuple(TaskSpec(name) for name in new),
            arms=config.arms + tuple(arm for name in new for arm in table1_arms(name)),
            base=dataclasses.replace(config.base, noise=noise),
        )
    if config.base is not None:
        base: dict[str, Any] = {"episodes": base_episodes, "steps": base_steps}
        if base_eps is not None:
            base["noise"] = tuple((t, base_eps if not only or t in only else e) for t, e in config.base.noise)
        changed = {k: v for k, v in base.items() if v is not None}
        config = dataclasses.replace(config, base=dataclasses.replace(config.base, **changed))
    if updates is not None:
        config = dataclasses.replace(config, budget=dataclasses.replace(config.budget, updates=updates))
    if lr is not None:
        config = dataclasses.replace(config, budget=dataclasses.replace(config.budget, lr=lr, critic_lr=lr))
    if model is not None:
        config = dataclasses.replace(config, model=_model_spec(model))

    tasks = []
    for spec in config.tasks:
        if only and spec.name not in only:
            continue
        merged = dict(spec.params) | dict(params)
        tasks.append(TaskSpec(spec.name, tuple(sorted((k, _frozen(v)) for k, v in merged.items()))))
    names = {spec.name for spec in tasks}
    wanted = set(gates.learning_arms) | set(gates.critic_arms)
    arms = tuple(a for a in config.arms if a.task in names and a.key[len(task_prefix(a.task)) :] in wanted)
    if ladder:
        arms += tuple(arm for name in sorted(names) for arm in ladder_arms(name))
    if gigpo:
        arms += tuple(gigpo_arm(name) for name in sorted(names))
    return dataclasses.replace(config, name=f"{config.name}-gates", tasks=tuple(tasks), arms=arms)


def _model_spec(text: str) -> Any:
    """``WIDTHxLAYERSxHEADS`` as a :class:`~mpo_lab.reproduce.config.ModelSpec`."""
    from mpo_rs.exceptions import InvalidOptionError

    from .config import ModelSpec

    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise InvalidOptionError(f"model: expected WIDTHxLAYERSxHEADS of positive integers (128x2x4), got {text!r}")
    width, layers, heads = map(int, parts)
    if width % heads:
        raise InvalidOptionError(f"model: the width {width} must be a multiple of the heads {heads}")
    return ModelSpec(width=width, layers=layers, heads=heads)


def gates_payload(config_name: str, tasks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``--json`` writes (and ``mpo-rs reproduce --gates`` reads,
    :func:`~mpo_lab.reproduce.gating.read_gates_file`): the configuration's name, the thresholds
    (:data:`GATES`) and per task its ``task``, ``params``, ``role``, ``base`` (its
    :func:`base_measurement` per seed) and ``learned`` (:func:`learning_measurement`, or None)."""
    return {"config": config_name, "gates": dataclasses.asdict(GATES), "tasks": list(tasks)}


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def main(argv: Sequence[str] | None = None, prog: str = "mpo-lab gates") -> int:
    from .config import task_prefix
    from .presets import CONFIGS
    from .tasks import task_role

    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--config", default="pilot", choices=sorted(CONFIGS), help="whose tasks, base policies and seeds")
    p.add_argument("--seeds", type=int, default=2, help="base policies measured per task (the configuration's first)")
    p.add_argument("--tasks", type=int, default=64, help="tasks per measurement")
    p.add_argument("--group", type=int, default=16, help="rollouts per task")
    p.add_argument("--results", type=Path, help="a finished run's results.json for the learning gates")
    p.add_argument("--only", nargs="*", help="these tasks only")
    p.add_argument("--task-param", action="append", default=[], metavar="KEY=JSON", help="a parameter of the tasks")
    p.add_argument(
        "--train",
        type=Path,
        metavar="OUT",
        help="first train the arms the gates read on every seed of the configuration, into OUT (resumable)",
    )
    p.add_argument("--base-eps", type=float, help="the demonstrations' noise of the tasks' base policies")
    p.add_argument("--lr", type=float, help="every arm's and critic's learning rate")
    p.add_argument("--base-episodes", type=int, help="the demonstrations each base policy is cloned from")
    p.add_argument("--base-steps", type=int, help="the optimizer steps of each base policy's cloning")
    p.add_argument("--updates", type=int, help="every arm's updates")
    p.add_argument("--model", help="the policy's and critic's size, WIDTHxLAYERSxHEADS (default: the configuration's)")
    p.add_argument("--ladder", action="store_true", help="also train the critic-quality ladder's arms on each task")
    p.add_argument("--gigpo", action="store_true", help="also train GiGPO on each task")
    p.add_argument("--add-task", action="append", default=[], metavar="TASK", help="a task the configuration lacks")
    p.add_argument("--arms", help="train only these of the candidate's arms (comma-separated keys)")
    p.add_argument(
        "--train-seeds",
        type=int,
        metavar="N",
        help="train on the configuration's first seed and the N-1 after it (default: its own count)",
    )
    p.add_argument("--cache", type=Path, help="keep the base policies here (a rerun takes them)")
    p.add_argument("--json", type=Path, help="also write the measurements here (after each task)")
    args = p.parse_args(argv)
    params = {k: json.loads(v) for k, _, v in (pair.partition("=") for pair in args.task_param)}
    config = CONFIGS[args.config]
    changes = {
        "base_eps": args.base_eps,
        "lr": args.lr,
        "base_episodes": args.base_episodes,
        "base_steps": args.base_steps,
        "updates": args.updates,
        "model": args.model,
        "ladder": args.ladder or None,
        "gigpo": args.gigpo or None,
        "add": args.add_task or None,
    }
    if params or args.train or any(v is not None for v in changes.values()):
        config = candidate(config, args.only, params, **changes)
    if args.arms:
        config = config.with_arms(args.arms.split(","))
    if args.train_seeds is not None:
        config = dataclasses.replace(config, seeds=args.train_seeds)  # validated by the config
    rows = json.loads(args.results.read_text())["runs"] if args.results else None
    if args.train:
        from .api import run_config

        def note(line: str) -> None:
            print(line, file=sys.stderr, flush=True)

        # The base policies' gates are measured below, with this command's own sizes.
        rows = run_config(config, args.train, note=note, measure_gates=False).results["runs"]
        args.cache = args.cache or args.train  # the runs' base policies, made once
    judged, record = {}, []
    for spec in config.tasks:
        if args.only and spec.name not in args.only:
            continue
        role = task_role(spec.name)
        base = []
        for s in config.seed_list[: args.seeds]:
            base.append(base_measurement(config, spec.name, s, tasks=args.tasks, group=args.group, cache=args.cache))
            print(f"{spec.name} seed {s}: {json.dumps(base[-1])}", file=sys.stderr, flush=True)
        learned = learning_measurement(rows, task_prefix(spec.name)) if rows is not None else None
        judged[spec.name] = judge(role, base, learned)
        record.append({"task": spec.name, "params": dict(spec.params), "role": role, "base": base, "learned": learned})
        if args.json:
            write_file(args.json, json.dumps(gates_payload(config.name, record), indent=1, default=str))
    print(gates_table(judged))
    return 0
