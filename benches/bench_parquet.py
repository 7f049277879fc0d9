"""Parquet -> Parquet throughput of `mpo-rs advantages` against the I/O floor, and its
peak resident memory against the file size.

The floor is what the tool cannot avoid: pyarrow, in its own process, decoding the same
input (every column, row group by row group) and encoding the same output (the tool's own
output file, decoded beforehand and not timed) with the same codec and the same columns
dictionary-encoded, then fsyncing it -- everything except the advantage computation. Both sides use every core. Each size is
measured `--repeat` times alternating tool and floor; times are the best of the repeats,
memory the worst. ratio = tool time / floor time (target <= 1.25).

    python benches/bench_parquet.py            # ~65 MB, ~265 MB, ~1 GB logs
    python benches/bench_parquet.py --quick    # ~25 MB and ~100 MB

Logs come from `mpo_rs.demo.write_rollout_log` (~3,500 tokens per row, ~8 turns) and are
kept under --dir for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

# The tool through its console entry point, timed inside the process so interpreter
# start-up is left out on both sides. process_time() is the CPU of all threads.
TOOL = r"""
import json, sys, time
from mpo_rs import cli
t0, c0 = time.perf_counter(), time.process_time()
code = cli.main(sys.argv[1:])
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}))
sys.exit(code)
"""

FLOOR = r"""
import json, os, sys, time
import pyarrow.parquet as pq
src, produced, dst = sys.argv[1:4]
fi, fo = pq.ParquetFile(src), pq.ParquetFile(produced)
wall = cpu = 0.0
for g in range(fi.num_row_groups):
    t0, c0 = time.perf_counter(), time.process_time()
    fi.read_row_group(g)
    wall += time.perf_counter() - t0; cpu += time.process_time() - c0
codec = fi.metadata.row_group(0).column(0).compression.lower()
# The same encodings as the tool's output: a dictionary exactly where it used one.
first = fo.metadata.row_group(0)
dictionary = sorted({
    first.column(i).path_in_schema.split(".")[0]
    for i in range(first.num_columns)
    if {"RLE_DICTIONARY", "PLAIN_DICTIONARY"} & set(first.column(i).encodings)
})
writer = None
for g in range(fo.num_row_groups):
    table = fo.read_row_group(g)  # not timed: the floor writes exactly what the tool wrote
    t0, c0 = time.perf_counter(), time.process_time()
    if writer is None:
        writer = pq.ParquetWriter(dst, table.schema, compression=codec, use_dictionary=dictionary)
    writer.write_table(table, row_group_size=table.num_rows)
    wall += time.perf_counter() - t0; cpu += time.process_time() - c0
    del table
t0, c0 = time.perf_counter(), time.process_time()
writer.close()
fd = os.open(dst, os.O_RDONLY); os.fsync(fd); os.close(fd)
wall += time.perf_counter() - t0; cpu += time.process_time() - c0
print(json.dumps({"wall": wall, "cpu": cpu}))
"""


def measure(cmd: list[str]) -> tuple[str, float, float]:
    """Runs `cmd` in a fresh child and returns (stdout, wall seconds, its peak RSS in MB).
    os.wait4 gives the rusage of that one child (RUSAGE_CHILDREN would be the maximum
    over every child so far)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:5])} ... exited with {proc.returncode}")
    return out, wall, usage.ru_maxrss / 1024  # Linux reports KiB


def ensure_log(path: Path, rows: int) -> None:
    import pyarrow.parquet as pq

    from mpo_rs.demo import write_rollout_log

    try:
        if pq.ParquetFile(path).metadata.num_rows == rows:
            return
    except Exception:
        pass
    print(f"generating {path} ({rows:,} rows) ...", file=sys.stderr, flush=True)
    write_rollout_log(path, rows, seed=rows)


def bench_one(path: Path, repeat: int) -> dict[str, float]:
    import pyarrow.parquet as pq

    out = path.with_name(path.stem + "-out.parquet")
    floor_out = path.with_name(path.stem + "-floor.parquet")
    runs: dict[str, list[float]] = {
        k: [] for k in ("tool_s", "tool_cpu", "tool_rss", "floor_s", "floor_cpu", "floor_rss")
    }
    for _ in range(repeat):
        out.unlink(missing_ok=True)  # each side writes a new file, nothing to replace
        stdout, _, rss = measure([sys.executable, "-c", TOOL, "advantages", str(path), "-o", str(out), "--quiet"])
        t = json.loads(stdout.strip().splitlines()[-1])
        runs["tool_s"].append(t["wall"])
        runs["tool_cpu"].append(t["cpu"])
        runs["tool_rss"].append(rss)
        floor_out.unlink(missing_ok=True)
        stdout, _, rss = measure([sys.executable, "-c", FLOOR, str(path), str(out), str(floor_out)])
        f = json.loads(stdout)
        runs["floor_s"].append(f["wall"])
        runs["floor_cpu"].append(f["cpu"])
        runs["floor_rss"].append(rss)
    meta = pq.ParquetFile(path).metadata
    tokens = sum(
        meta.row_group(g).column(c).num_values
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
        if meta.row_group(g).column(c).path_in_schema.startswith("loss_mask")
    )
    result = {
        "rows": meta.num_rows,
        "tokens": tokens,
        "in_mb": path.stat().st_size / 1e6,
        "out_mb": out.stat().st_size / 1e6,
        **{k: (max(v) if k.endswith("rss") else min(v)) for k, v in runs.items()},
    }
    out.unlink(missing_ok=True)
    floor_out.unlink(missing_ok=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two small logs (~25 and ~100 MB)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per size (3)")
    parser.add_argument("--dir", default="demo-data/bench", help="where logs are kept")
    args = parser.parse_args()
    sizes = [1024, 4096] if args.quick else [2560, 10240, 40960]
    repeat = args.repeat or 3
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)

    rows = []
    for n in sizes:
        path = d / f"rollouts-{n}.parquet"
        ensure_log(path, n)
        print(f"measuring {path} x{repeat} ...", file=sys.stderr, flush=True)
        rows.append(bench_one(path, repeat))

    import pyarrow

    from mpo_rs import __version__

    print(
        f"\n`mpo-rs advantages` (MAE) vs the I/O floor -- {os.cpu_count()} cores, "
        f"{platform.machine()}, mpo-rs {__version__}, pyarrow {pyarrow.__version__}; "
        f"best of {repeat} (time), worst of {repeat} (memory)\n"
    )
    print(
        "| input MB | rows | tokens | output MB | mpo-rs s | floor s | ratio | mpo-rs CPU s "
        "| floor CPU s | CPU ratio | mpo-rs Mtok/s | mpo-rs peak RSS MB | floor peak RSS MB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['in_mb']:.0f} | {r['rows']:,} | {r['tokens'] / 1e6:.1f}M | {r['out_mb']:.0f} "
            f"| {r['tool_s']:.2f} | {r['floor_s']:.2f} | {r['tool_s'] / r['floor_s']:.2f} "
            f"| {r['tool_cpu']:.2f} | {r['floor_cpu']:.2f} | {r['tool_cpu'] / r['floor_cpu']:.2f} "
            f"| {r['tokens'] / r['tool_s'] / 1e6:.1f} | {r['tool_rss']:.0f} | {r['floor_rss']:.0f} |"
        )
    print(
        "\nmpo-rs: the whole run (open, decode, compute, encode, fsync, rename) timed inside "
        "the process. floor: pyarrow decoding the same input plus encoding and fsyncing the "
        "same output. CPU s: all threads. Peak RSS: the whole process (interpreter "
        "included), from wait4."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
