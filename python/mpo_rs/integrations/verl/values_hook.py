"""The values hook: lets the plug-in's critic estimators read the critic's values inside
verl (and ``mpo_gigpo`` the batch's anchor states), and the v1 trainer group multi-output
sessions for ``mpo_grpo`` as for ``grpo``.

verl's ``compute_advantage`` passes ``values`` only to its built-in ``gae``; the hook wraps
it (and the v1 trainer's ``compute_advantage_for_multi_trajectories``) through an import
hook, so that nothing is imported, and nothing costs, in processes that never train.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from torch import Tensor

from .config import BATCH_ESTIMATORS, CRITIC_ESTIMATORS, SESSION_GROUPED_ESTIMATORS, MissingCriticValuesError
from .rollout_log import after_compute_advantage

__all__ = ["VALUES_HOOK_ENV", "critic_values", "hooked_batch", "install_values_hook"]

VALUES_HOOK_ENV = "MPO_RS_VERL_VALUES_HOOK"

_RAY_TRAINER = "verl.trainer.ppo.ray_trainer"
_V1_UTILS = "verl.trainer.ppo.v1.utils"

# Set by the compute_advantage wrapper for the duration of one call (see install_values_hook).
_CRITIC_VALUES: contextvars.ContextVar[Tensor | None] = contextvars.ContextVar(
    "mpo_rs_verl_critic_values", default=None
)


# Set by the compute_advantage wrapper, for the estimators of BATCH_ESTIMATORS, to the DataProto
# of the call (verl passes them only its tensors `token_level_rewards` and `response_mask`).
_BATCH: contextvars.ContextVar[Any] = contextvars.ContextVar("mpo_rs_verl_batch", default=None)


def hooked_batch() -> Any:
    """The ``DataProto`` of the ``compute_advantage`` call in progress, for an estimator of
    :data:`BATCH_ESTIMATORS`; None outside one (or without the hook)."""
    return _BATCH.get()


# Set by the compute_advantage_for_multi_trajectories wrapper to the plug-in estimator that
# verl's session grouping, run for the mirrored name, must call instead (see install_values_hook).
_SESSION_ESTIMATOR: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mpo_rs_verl_session_estimator", default=None
)


def critic_values(values: Tensor | None, estimator: str) -> Tensor:
    """``values`` if given, else the values the hook exposes for this call, else an error
    that says how to get them."""
    if values is not None:
        return values
    hooked = _CRITIC_VALUES.get()
    if hooked is not None:
        return hooked
    raise MissingCriticValuesError(
        f"advantage estimator {estimator!r} needs critic values, and verl passes `values` only "
        "to its own 'gae'. Set `critic.enable=True` (verl runs the critic by default only for "
        "adv_estimator=gae) and keep the mpo_rs values hook installed: it is installed when verl "
        f"loads the mpo_rs plug-in unless {VALUES_HOOK_ENV}=0, or call "
        "mpo_rs.integrations.verl.install_values_hook(). When calling the estimator directly, "
        "pass values=<(batch, response_length) tensor>."
    )


def _wrap_compute_advantage(original: Callable[..., Any]) -> Callable[..., Any]:
    """verl's ``compute_advantage``, which for the critic estimators makes the batch's
    ``values`` visible to them for the duration of the call, and inside a session-grouped
    multi-trajectory call runs the plug-in estimator where verl asks for the one it mirrors.
    Everything else is verl's."""

    @functools.wraps(original)
    def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
        out = _compute_advantage(data, adv_estimator, *args, **kwargs)
        # The rollout log (off unless configured) records the batch the estimator saw.
        after_compute_advantage(out, kwargs.get("config", args[4] if len(args) > 4 else None))
        return out

    def _compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(adv_estimator, "value", adv_estimator)
        session = _SESSION_ESTIMATOR.get()
        if session is not None and name == SESSION_GROUPED_ESTIMATORS[session]:
            _SESSION_ESTIMATOR.set(None)  # consumed: the wrapper below checks it was
            adv_estimator = name = session
        if name in BATCH_ESTIMATORS:
            batch_token = _BATCH.set(data)
            try:
                return original(data, adv_estimator, *args, **kwargs)
            finally:
                _BATCH.reset(batch_token)
        if name not in CRITIC_ESTIMATORS:
            return original(data, adv_estimator, *args, **kwargs)
        batch = data.batch
        values = batch["values"] if "values" in batch.keys() else None
        token = _CRITIC_VALUES.set(values)
        try:
            return original(data, adv_estimator, *args, **kwargs)
        finally:
            _CRITIC_VALUES.reset(token)

    compute_advantage.__mpo_rs_values_hook__ = True  # type: ignore[attr-defined]
    return compute_advantage


def _wrap_multi_trajectories(original: Callable[..., Any]) -> Callable[..., Any]:
    """verl's v1 ``compute_advantage_for_multi_trajectories``, which for a session-grouped
    plug-in estimator runs verl's own session grouping (taken only for the mirrored name) with
    the plug-in estimator computing the sessions' final outputs. Everything else is verl's."""

    @functools.wraps(original)
    def compute_advantage_for_multi_trajectories(
        data: Any, batch_keys: Any, adv_estimator: Any, *args: Any, **kwargs: Any
    ) -> Any:
        name = getattr(adv_estimator, "value", adv_estimator)
        mirrored = SESSION_GROUPED_ESTIMATORS.get(name)
        if mirrored is None:
            return original(data, batch_keys, adv_estimator, *args, **kwargs)
        token = _SESSION_ESTIMATOR.set(name)
        try:
            out = original(data, batch_keys, mirrored, *args, **kwargs)
            if _SESSION_ESTIMATOR.get() is not None:
                # verl's grouping ran its own estimator: refuse its result rather than pass it off.
                raise RuntimeError(
                    f"verl's compute_advantage_for_multi_trajectories did not call the mpo_rs-hooked "
                    f"compute_advantage, so {name!r} could not be grouped by session; call "
                    "mpo_rs.integrations.verl.install_values_hook() before verl.trainer.ppo.v1 is imported"
                )
            return out
        finally:
            _SESSION_ESTIMATOR.reset(token)

    compute_advantage_for_multi_trajectories.__mpo_rs_values_hook__ = True  # type: ignore[attr-defined]
    return compute_advantage_for_multi_trajectories


def _patch(module: ModuleType, attribute: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(module, attribute)
    if getattr(original, "__mpo_rs_values_hook__", False):
        return
    wrapped = wrap(original)
    setattr(module, attribute, wrapped)
    # Modules that already ran `from ... import <attribute>` hold their own binding
    # (verl.trainer.ppo.v1.utils does for compute_advantage); later imports read the patched one.
    for name, other in list(sys.modules.items()):
        if name.startswith("verl.") and getattr(other, attribute, None) is original:
            setattr(other, attribute, wrapped)


def _patch_compute_advantage(ray_trainer: ModuleType) -> None:
    _patch(ray_trainer, "compute_advantage", _wrap_compute_advantage)


def _patch_multi_trajectories(v1_utils: ModuleType) -> None:
    _patch(v1_utils, "compute_advantage_for_multi_trajectories", _wrap_multi_trajectories)


# Module -> (the function patched in it, the patch), applied right after the module executes.
_PATCHES: dict[str, tuple[str, Callable[[ModuleType], None]]] = {
    _RAY_TRAINER: ("compute_advantage", _patch_compute_advantage),
    _V1_UTILS: ("compute_advantage_for_multi_trajectories", _patch_multi_trajectories),
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Patches verl's ``ray_trainer`` and v1 ``utils`` modules right after each executes, so
    that the hook costs nothing (and imports nothing) in processes that never train."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, _PATCHES[fullname][1])
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.patch(module)
        if _all_patched():
            _remove_import_patcher()

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package, ...
        return getattr(self.loader, name)


def _all_patched() -> bool:
    for name, (attribute, _) in _PATCHES.items():
        fn = getattr(sys.modules.get(name), attribute, None)
        if not getattr(fn, "__mpo_rs_values_hook__", False):
            return False
    return True


def _is_import_patcher(finder: object) -> bool:
    # By name, so that a patcher left by an earlier import of this module counts too.
    kind = type(finder)
    return kind.__name__ == "_PatchAfterImport" and kind.__module__ == __name__


def _remove_import_patcher() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not _is_import_patcher(f)]


def install_values_hook() -> None:
    """Lets ``mpo_gae`` and ``mpo_mae`` read the critic's values inside verl (and
    ``mpo_gigpo`` the batch's ``anchor_obs`` or ``responses``), and makes the v1 trainer
    group multi-output sessions for ``mpo_grpo`` as it does for ``grpo``.

    verl's ``compute_advantage`` (``verl.trainer.ppo.ray_trainer``) passes ``values`` only to
    its built-in ``gae``. This wraps it: for the mpo_rs critic estimators the wrapper exposes
    ``data.batch["values"]`` to the estimator for the duration of the call and otherwise
    calls verl's function unchanged. It also wraps the v1 trainer's
    ``compute_advantage_for_multi_trajectories`` (``verl.trainer.ppo.v1.utils``), which groups
    sessions only for ``grpo``: for the estimators in :data:`SESSION_GROUPED_ESTIMATORS` it
    runs verl's grouping for the mirrored name with the plug-in estimator in its place.
    Idempotent; a module not imported yet is patched when it is (nothing is imported here).
    The plug-in calls this on import unless ``MPO_RS_VERL_VALUES_HOOK=0``. The critic must
    run: ``critic.enable=True``.
    """
    pending = False
    for name, (attribute, patch) in _PATCHES.items():
        module = sys.modules.get(name)
        if module is not None and hasattr(module, attribute):
            patch(module)
        else:
            pending = True
    if pending and not any(_is_import_patcher(f) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
