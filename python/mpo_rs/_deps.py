"""Optional dependencies: one typed error, one line naming the extra that installs them.

``import mpo_rs`` needs only numpy. Every other dependency belongs to an extra of the
``mpo-rs`` package (pyproject.toml); a module or command that needs one raises
:class:`MissingDependencyError` when it is not installed, with a message such as
"`mpo_rs.torch` needs torch: pip install 'mpo-rs[torch]'".
"""

from __future__ import annotations

from ._native import MissingDependencyError  # created with the other exceptions, in Rust

__all__ = ["MissingDependencyError", "missing", "require"]


def missing(feature: str, extra: str, error: ModuleNotFoundError) -> MissingDependencyError:
    """The error to raise for ``feature`` when importing one of its dependencies failed with
    ``error``; ``extra`` is the package extra that installs it."""
    name = (error.name or "").split(".")[0] or "a dependency"
    return MissingDependencyError(f"`{feature}` needs {name}: pip install 'mpo-rs[{extra}]'", name=error.name)


def require(module: str, feature: str, extra: str) -> None:
    """Imports ``module`` (and so checks it is there) or raises MissingDependencyError.
    For a check before any work; the caller imports the module where it uses it."""
    import importlib

    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise missing(feature, extra, e) from None
