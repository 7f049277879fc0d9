"""Runs every benchmark suite, each in its own process, and writes the report page with
its plots: docs/benchmarks.md and docs/img/*.png (a re-run overwrites them). Each suite's
JSON result is kept under build/bench-results/.

    python benches/run_all.py                 # what `make bench` runs
    python benches/run_all.py --quick         # small sizes, to build/bench-quick/
    python benches/run_all.py --only gae,group
    python benches/run_all.py --from-results  # redraw the page from the kept JSON

Run it with the benchmark environment's Python (.venv-bench, see benches/setup_env.sh) so
that the peers are importable; a peer that is missing is reported as not run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import report  # noqa: E402

SUITES = {
    "gae": "suite_gae.py",
    "group": "suite_group.py",
    "scaling": "suite_scaling.py",
    "losses": "suite_losses.py",
    "parquet": "suite_parquet.py",
}


def run_suite(script: str, json_path: str, quick: bool) -> tuple[int, str]:
    """Runs one suite; its progress (stderr) is echoed live and also kept for the report."""
    cmd = [sys.executable, os.path.join(HERE, script), "--json", json_path] + (["--quick"] if quick else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        sys.stderr.write(line)
        lines.append(line)
    return proc.wait(), "".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke run)")
    ap.add_argument(
        "--out", help="the page to write (default: docs/benchmarks.md, or build/bench-quick/benchmarks.md with --quick)"
    )
    ap.add_argument("--only", help="comma-separated suites to run: " + ",".join(SUITES))
    ap.add_argument(
        "--results", help="where each suite's JSON is kept (default: build/bench-results, or build/bench-quick/results)"
    )
    ap.add_argument(
        "--from-results", action="store_true", help="run nothing: rewrite the page and plots from the kept JSON"
    )
    args = ap.parse_args()
    root = os.path.dirname(HERE)
    out = args.out or os.path.join(root, "build/bench-quick/benchmarks.md" if args.quick else "docs/benchmarks.md")
    results_dir = args.results or os.path.join(
        root, "build/bench-quick/results" if args.quick else "build/bench-results"
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    os.makedirs(results_dir, exist_ok=True)
    chosen = args.only.split(",") if args.only else list(SUITES)
    results, failures = {}, {}
    for key in chosen:
        json_path = os.path.join(results_dir, key + ".json")
        if not args.from_results:
            print(f"== suite {key}", file=sys.stderr, flush=True)
            start = time.perf_counter()
            if os.path.exists(json_path):
                os.remove(json_path)  # a failed suite must not leave an old result behind
            code, errors = run_suite(SUITES[key], json_path, args.quick)
            print(f"== suite {key}: exit {code} after {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
            if code != 0:
                failures[key] = errors
                continue
        if os.path.exists(json_path):
            with open(json_path) as f:
                results[key] = json.load(f)
    command = "make bench-quick (benches/run_all.py --quick)" if args.quick else "make bench (benches/run_all.py)"
    report.write_report(
        results, out, os.path.join(os.path.dirname(out), "img"), command=command, quick=args.quick, failures=failures
    )
    print(f"wrote {os.path.relpath(out, root)}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
