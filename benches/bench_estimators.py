"""Token GAE and MAE on a realistic agentic batch against the tools people use today.

A thin entry point over the GAE suite (`suite_gae.py`): prints its table, the equality of
work it checked first, and the estimator targets (token GAE ≥ 2× faster and MAE no slower
than stateset-rl-core, MAE within 3× the memory floor). `make bench` runs every suite and
writes docs/benchmarks.md (`run_all.py`).

    python benches/bench_estimators.py [--quick] [--json PATH]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import suite_main
from suite_gae import run

if __name__ == "__main__":
    suite_main(run, __doc__)
