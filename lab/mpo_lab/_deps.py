"""The lab's dependencies: torch, pyarrow and matplotlib come with ``mpo-rs[torch,arrow,plot]``,
which ``pip install ./lab`` installs. A module that needs one imports it inside
``with needs(feature):``, so that a lab installed without them (``--no-deps``) names what is
missing in one line, and the numpy-only modules (configurations, plans, statistics, pages
from committed records) still import."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from mpo_rs import MissingDependencyError

__all__ = ["needs", "require_all"]

INSTALL = "pip install 'mpo-rs[torch,arrow,plot]' (or reinstall the lab: pip install ./lab)"


def _error(feature: str, errors: Sequence[ModuleNotFoundError], install: str = INSTALL) -> MissingDependencyError:
    names = ", ".join(dict.fromkeys((e.name or "").split(".")[0] or "a dependency" for e in errors))
    return MissingDependencyError(f"`{feature}` needs {names}: {install}", name=errors[0].name)


@contextmanager
def needs(feature: str, install: str = INSTALL) -> Iterator[None]:
    """Turns a failed import inside the block into one MissingDependencyError line that
    ends with ``install``, the command that adds what is missing."""
    try:
        yield
    except ModuleNotFoundError as e:
        raise _error(feature, [e], install) from None


def require_all(feature: str, modules: Sequence[str]) -> None:
    """Imports each of ``modules`` (a check before any work); one error names every absent one."""
    absent: list[ModuleNotFoundError] = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            absent.append(e)
    if absent:
        raise _error(feature, absent)
