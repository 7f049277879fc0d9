"""mpo_lab: the experiments beside the mpo_rs library. Does MPO help, and when?

Layers (each imports only those below it, and the library only through its public names):

- :mod:`mpo_lab.cli`: the ``mpo-lab`` command line (and ``mpo-rs reproduce``);
- :mod:`mpo_lab.reproduce`: configurations, plans, gates, runs, statistics and pages;
- :mod:`mpo_lab.envs` (toy multi-turn tasks over token ids) and :mod:`mpo_lab.train` (the
  sampler, generation and tiny models that train on them);
- :mod:`mpo_lab.seeds`: every random stream of a run, derived in one place;
- ``mpo_rs``: the library (estimators, losses, the learner, diagnostics, output safety).

Importing ``mpo_lab`` imports nothing else, so the console script installs its stop
handlers first.
"""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # The version is read on first use: importing the package stays free of imports.
    if name == "__version__":
        from importlib import metadata

        try:
            return metadata.version("mpo-lab")
        except metadata.PackageNotFoundError:  # run from a checkout without installing
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
