"""Append MPO advantages to a directory of Parquet rollout logs with Ray Data.

The same job as ``mpo-rs advantages``, spread over a Ray cluster: every node reads its
share of the files, the Rust core annotates Arrow batches in place, and the rows are
written back as Parquet under OUTPUT. Group baselines (grpo, drgrpo, rloo) whose groups
are scattered over files are handled with a statistics pass first.

    # on this machine (a local Ray instance is started)
    python examples/ray_advantages.py logs/ annotated/ --estimator mae

    # on a running cluster (`ray start --head` / `ray start --address=...` on the nodes);
    # paths must be reachable from every node: shared storage or s3:// / gs:// URIs
    python examples/ray_advantages.py s3://bucket/rollouts s3://bucket/annotated \\
        --address auto --estimator grpo --score-col score

Needs mpo_rs with the ``ray`` extra on every node (README.md, "Installing").
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import ray
import ray.data

from mpo_rs import columns
from mpo_rs.cli import add_option_flags, option_args
from mpo_rs.integrations.ray import advantages_parquet
from mpo_rs.options import ESTIMATORS, option_names

# advantages_parquet takes every option of the table, as the other entry points do.
OPTIONS = list(option_names())
COLUMNS = ("mask", "values", "rewards", "score", "group")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", help="a Parquet file, a directory of them, or a URI")
    parser.add_argument("output", help="directory to write the annotated Parquet files to")
    parser.add_argument("--estimator", choices=ESTIMATORS, default="mae")
    add_option_flags(parser.add_argument_group("estimator options (defaults: the estimator's own)"), OPTIONS)
    columns.add_flags(parser.add_argument_group("columns"), COLUMNS)
    parser.add_argument("--batch-size", type=int, default=None, help="rows per map_batches call (default: a block)")
    parser.add_argument("--address", default=None, help="Ray cluster address ('auto' to join a running one)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray instance")
    parser.add_argument(
        "--preserve-order", action="store_true", help="write rows in input order (slower: less overlap)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not ray.is_initialized():
        ray.init(address=args.address, num_cpus=args.num_cpus)
    if args.preserve_order:
        ray.data.DataContext.get_current().execution_options.preserve_order = True
    start = time.perf_counter()
    advantages_parquet(
        args.input,
        args.output,
        estimator=args.estimator,
        **option_args(args, OPTIONS),
        **columns.flag_keywords(args, COLUMNS),
        batch_size=args.batch_size,
    )
    print(f"wrote {args.output} ({args.estimator}) in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
