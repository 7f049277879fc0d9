"""Where a user env's base policy comes from, as the configuration records it: a
demonstrator of the user's (:class:`Demonstrator`, cloned as the built-in tasks' noisy
oracles are) or a saved policy file (:class:`SavedPolicy`). A built-in task's base is
cloned from its own noisy oracle (``BasePolicy.source`` None); a user env without either
starts from a random initialisation (``ReproduceConfig.base`` None).

Plain data, no imports from the package: :mod:`.config` holds them in
:attr:`~mpo_lab.reproduce.config.BasePolicy.source`; :mod:`.userbase` finds and checks them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Demonstrator", "SavedPolicy"]


@dataclass(frozen=True)
class Demonstrator:
    """``demonstrator(observations) -> action``: the observations so far (the prompt first,
    lists of token ids, as the built-in envs' ``oracle_action`` takes them) to the next
    turn's ``action_tokens`` token ids; with a keyword parameter ``rng`` it is also given a
    ``numpy.random.Generator`` seeded per (task, seed), for a demonstrator that draws."""

    spec: str
    """``module:callable``."""
    code: str
    """The sha256 (12 hex digits) of the source files of the modules that name and define
    it, and of the ``version`` it may declare: an edited demonstrator is another base."""

    def describe(self) -> str:
        return f"cloned from demonstrator {self.spec}"


@dataclass(frozen=True)
class SavedPolicy:
    """A policy file: what ``torch.save`` wrote of the run's ``TinyCausalLM`` state dict,
    bare or as reproduce writes its base policies (``OUT/base/<task>-seed<seed>.pt``, a dict
    whose ``"state"`` is the state dict). Every seed starts from it."""

    path: str
    """As the user gave it."""
    digest: str
    """The sha256 (12 hex digits) of the file: another file is another base."""

    def describe(self) -> str:
        return f"loaded from {self.path}"
