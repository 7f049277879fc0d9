"""``mpo-lab`` (and ``python -m mpo_lab``): the lab's command line, run with mpo-rs's stop handling."""

from __future__ import annotations

import sys

from mpo_rs_cli import console


def main() -> int:
    """Entry point of the ``mpo-lab`` console script; returns the exit code."""
    return console("mpo-lab", "mpo_lab.cli:main")


if __name__ == "__main__":
    sys.exit(main())
