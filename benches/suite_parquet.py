"""Parquet suite: the rollout-log tool (advantage columns added to a Parquet file) against
the I/O floor. The measurement is `benches/bench_parquet.py`, written with the tool; this
suite runs it in its own process and keeps its printed report as it is.

    python benches/suite_parquet.py [--quick] [--json PATH]
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import log, suite_main

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_parquet.py")
TITLE = "Parquet rollout logs: throughput against the I/O floor"


def run(quick: bool) -> dict[str, Any]:
    if not os.path.exists(SCRIPT):
        return {"suite": "parquet", "title": TITLE, "skipped": "benches/bench_parquet.py is not in this checkout"}
    helptext = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True).stdout
    args = ["--quick"] if quick and "--quick" in helptext else []
    log(f"parquet: running bench_parquet.py {' '.join(args)}")
    proc = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench_parquet.py exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return {
        "suite": "parquet",
        "title": TITLE,
        "command": " ".join(["python benches/bench_parquet.py", *args]),
        "output": proc.stdout,
    }


if __name__ == "__main__":
    suite_main(run, __doc__)
