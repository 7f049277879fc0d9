"""Optional dependencies: one typed error, one line naming the extra that installs them.

``import mpo_rs`` needs only numpy. Every other dependency belongs to an extra of the
``mpo-rs`` package (pyproject.toml); a module or command that needs one raises
:class:`MissingDependencyError` when it is not installed, with a message such as
"`mpo_rs.torch` needs torch: pip install '/path/to/mpo_rs-0.1.0-cp311-abi3-….whl[torch]'".

The command names where this installation came from (:func:`install_hint`), since the
package is installed from a wheel file or a checkout, not by name from an index.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from urllib.parse import unquote, urlparse

from ._native import MissingDependencyError  # created with the other exceptions, in Rust

__all__ = ["MissingDependencyError", "install_hint", "missing", "needs", "require", "require_all"]

DISTRIBUTION = "mpo-rs"


def _installed_from() -> tuple[str, bool] | None:
    """The local wheel file or directory this installation was made from and whether it is
    an editable install, from the record pip (and maturin) leave in the package's metadata
    (direct_url.json, PEP 610); None without a record of a local source (an index install).
    A source that is no longer there is named by what it was."""
    try:
        record = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        info = json.loads(record) if record else None
    except (metadata.PackageNotFoundError, ValueError):
        return None
    if not isinstance(info, dict) or not str(info.get("url", "")).startswith("file:"):
        return None
    path = unquote(urlparse(info["url"]).path)
    editable = bool(isinstance(info.get("dir_info"), dict) and info["dir_info"].get("editable"))
    return (path if os.path.exists(path) else GONE, editable)


GONE = "<the wheel or checkout mpo_rs was installed from>"


def install_hint(extra: str) -> str:
    """The pip command that adds ``extra`` (one, or several comma-separated) to this
    installation: the same wheel file or checkout with the extra (``-e`` kept for an
    editable checkout), else the project's name."""
    source = _installed_from()
    if source is None:
        return f"pip install {shlex.quote(f'{DISTRIBUTION}[{extra}]')}"
    path, editable = source
    return f"pip install {'-e ' if editable else ''}{shlex.quote(f'{path}[{extra}]')}"


def missing(feature: str, extra: str, error: ModuleNotFoundError) -> MissingDependencyError:
    """The error to raise for ``feature`` when importing one of its dependencies failed with
    ``error``; ``extra`` is the package extra that installs it."""
    name = (error.name or "").split(".")[0] or "a dependency"
    return MissingDependencyError(f"`{feature}` needs {name}: {install_hint(extra)}", name=error.name)


@contextmanager
def needs(feature: str, extra: str) -> Iterator[None]:
    """Guards a module's imports of an optional dependency: ``with needs(feature, extra):``
    around them turns a failed import into :func:`missing`'s error (no traceback chain)."""
    try:
        yield
    except ModuleNotFoundError as e:
        raise missing(feature, extra, e) from None


def require(module: str, feature: str, extra: str) -> None:
    """Imports ``module`` (and so checks it is there) or raises MissingDependencyError.
    For a check before any work; the caller imports the module where it uses it."""
    require_all(feature, [(module, extra)])


def require_all(feature: str, needs: Sequence[tuple[str, str]]) -> None:
    """:func:`require` for several ``(module, extra)`` pairs at once: one error naming every
    missing module and one command installing all their extras, so a user installs once."""
    import importlib

    absent: list[tuple[ModuleNotFoundError, str]] = []
    for module, extra in needs:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            absent.append((e, extra))
    if len(absent) == 1:
        raise missing(feature, absent[0][1], absent[0][0])
    if absent:
        names = ", ".join((e.name or "").split(".")[0] or "a dependency" for e, _ in absent)
        extras = ",".join(dict.fromkeys(extra for _, extra in absent))
        raise MissingDependencyError(f"`{feature}` needs {names}: {install_hint(extras)}", name=absent[0][0].name)
