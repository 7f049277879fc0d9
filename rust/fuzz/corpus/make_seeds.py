"""Writes the Parquet seed corpus of the fuzzers (rust/fuzz/corpus/parquet/).

    python rust/fuzz/corpus/make_seeds.py

Small files (a few KB), written by pyarrow -- a different Parquet writer from the Rust
one the tool uses -- in the shapes real rollout logs come in, and broken ones. The name
says what `mpo-rs advantages` must do with an untouched file, whatever the estimator
(mae, gae, grpo, rloo):

- ``good-*``: succeed, and round-trip (every input row and column unchanged);
- ``bad-*``: fail with a data error (wrong types, missing columns, bad values, nulls);
- ``corrupt-*``: fail with a "cannot read Parquet" error (truncated, damaged footer).

The fuzz driver mutates all of them (truncation, footer and magic damage, bit flips,
splices); the cargo-fuzz targets start from them. Deterministic: same data every run.
"""

from __future__ import annotations

import io
import math
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OUT = Path(__file__).resolve().parent / "parquet"


def rollouts(n: int, seed: int) -> list[dict]:
    """n trajectories of alternating observation/policy runs, a terminal reward."""
    rng = random.Random(seed)
    rows = []
    for j in range(n):
        mask: list[int] = []
        for _ in range(rng.randint(1, 3)):
            mask += [0] * rng.randint(0, 3) + [1] * rng.randint(1, 4)
        values = [round(rng.uniform(-1, 1), 3) for _ in mask]
        score = float(rng.randint(0, 1))
        rewards = [0.0] * len(mask)
        rewards[max(q for q, m in enumerate(mask) if m)] = score
        rows.append(dict(mask=mask, values=values, rewards=rewards, score=score,
                         group=f"prompt-{j % 3}", tokens=[rng.randint(0, 50000) for _ in mask]))
    return rows


def edge_rows() -> list[dict]:
    """Empty rows, all-observation rows, one-token turns, long turns."""
    masks = [[], [0, 0, 0], [1], [1, 0, 1, 0, 1], [1] * 12, [0, 1, 1, 1, 0], [1, 1, 0, 0]]
    rows = []
    for j, mask in enumerate(masks):
        values = [0.25 * (q % 5) - 0.5 for q in range(len(mask))]
        rewards = [0.0] * len(mask)
        policy = [q for q, m in enumerate(mask) if m]
        score = float(j % 2)
        if policy:
            rewards[policy[-1]] = score
        rows.append(dict(mask=mask, values=values, rewards=rewards, score=score,
                         group=f"g{j % 2}", tokens=list(range(len(mask)))))
    return rows


def table(rows: list[dict], *, mask_type=pa.list_(pa.bool_()), values_type=pa.list_(pa.float32()),
          rewards_type: pa.DataType | None = pa.list_(pa.float32()), score_type=pa.float32(),
          group_type=pa.string(), drop: tuple[str, ...] = ()) -> pa.Table:
    item = mask_type.value_type
    conv = bool if pa.types.is_boolean(item) else float if pa.types.is_floating(item) else int
    cols = {
        "id": pa.array(range(len(rows)), pa.int64()),
        "loss_mask": pa.array([[conv(m) for m in r["mask"]] for r in rows], mask_type),
        "values": pa.array([r["values"] for r in rows], values_type),
        "score": pa.array([r["score"] for r in rows], score_type),
        "group_id": pa.array([r["group"] if pa.types.is_string(group_type) else int(r["group"][-1])
                              for r in rows], group_type),
        "token_ids": pa.array([r["tokens"] for r in rows], pa.list_(pa.int32())),
    }
    if rewards_type is not None:
        cols["rewards"] = pa.array([r["rewards"] for r in rows], rewards_type)
    return pa.table({k: v for k, v in cols.items() if k not in drop})


def write(name: str, t: pa.Table, **kw) -> bytes:
    buf = io.BytesIO()
    pq.write_table(t, buf, **kw)
    data = buf.getvalue()
    (OUT / name).write_bytes(data)
    return data


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.parquet"):
        old.unlink()
    base = rollouts(12, seed=1)

    # ---- good: the shapes real logs come in
    good = write("good-list-bool-f32-snappy.parquet", table(base), row_group_size=5, compression="snappy")
    write("good-large-list-int8-f64-zstd.parquet",
          table(rollouts(10, seed=2), mask_type=pa.large_list(pa.int8()), values_type=pa.large_list(pa.float64()),
                rewards_type=None, score_type=pa.float64(), group_type=pa.int64()),
          compression="zstd", data_page_version="2.0", row_group_size=4)
    write("good-checksums-gzip-small-pages.parquet",
          table(rollouts(10, seed=3), mask_type=pa.list_(pa.uint8())),
          compression="gzip", write_page_checksum=True, data_page_size=64, row_group_size=10)
    write("good-edge-rows-brotli.parquet", table(edge_rows()), compression="brotli", row_group_size=3)
    write("good-uncompressed-plain.parquet", table(rollouts(8, seed=4), values_type=pa.list_(pa.float64())),
          compression="none", use_dictionary=False, write_statistics=False)
    write("good-lz4-dictionary-groups.parquet",
          table(rollouts(9, seed=5)).set_column(4, "group_id", pa.array([f"p{j % 2}" for j in range(9)]).dictionary_encode()),
          compression="lz4")
    write("good-no-rows.parquet", table([]))
    write("good-score-int-mask-int64.parquet",
          table(rollouts(6, seed=6), mask_type=pa.list_(pa.int64()), rewards_type=None, score_type=pa.int32()))

    # ---- bad: readable files whose columns the tool must refuse, with every estimator
    write("bad-mask-float.parquet", table(base, mask_type=pa.list_(pa.float32())))
    write("bad-mask-not-a-list.parquet", table(base).set_column(1, "loss_mask", pa.array([1.0] * len(base))))
    write("bad-rewards-string.parquet",
          table(base).set_column(6, "rewards", pa.array([[str(x) for x in r["rewards"]] for r in base])))
    write("bad-no-reward-column.parquet", table(base, rewards_type=None, drop=("score",)))
    write("bad-no-mask-column.parquet", table(base, drop=("loss_mask",)))
    write("bad-score-string.parquet", table(base, rewards_type=None).set_column(
        3, "score", pa.array([str(r["score"]) for r in base])))
    mask2 = [dict(r, mask=[2 if m else 0 for m in r["mask"]]) for r in base]
    write("bad-mask-value-2.parquet", table(mask2, mask_type=pa.list_(pa.int8())))
    nan = [dict(r, rewards=[math.nan if m else 0.0 for m in r["mask"]]) for r in base]
    write("bad-rewards-nan.parquet", table(nan))
    obs = [dict(r, rewards=[0.5 if not m else x for m, x in zip(r["mask"], r["rewards"])]) for r in base]
    write("bad-observation-reward.parquet", table([r for r in obs if 0 in r["mask"]]))
    short = [dict(r, rewards=r["rewards"] + [0.0]) for r in base]
    write("bad-rewards-length.parquet", table(short))
    nulls = table(base).set_column(1, "loss_mask", pa.array([None] + [[bool(m) for m in r["mask"]] for r in base[1:]], pa.list_(pa.bool_())))
    write("bad-null-mask-row.parquet", nulls)
    null_el = [dict(r, rewards=[None] + r["rewards"][1:]) for r in base]
    write("bad-null-reward-element.parquet", table(null_el))
    write("bad-output-column-exists.parquet", table(base).append_column("advantages", pa.array([[0.0]] * len(base))))

    # ---- corrupt: the good file broken where a reader first looks
    n = len(good)
    footer_len = int.from_bytes(good[n - 8 : n - 4], "little")
    corrupt = {
        "corrupt-empty.parquet": b"",
        "corrupt-magic-only.parquet": b"PAR1PAR1",
        "corrupt-truncated-half.parquet": good[: n // 2],
        "corrupt-truncated-footer.parquet": good[: n - 8 - footer_len // 2],
        "corrupt-no-trailing-magic.parquet": good[:-4] + b"PAR0",
        "corrupt-footer-length-huge.parquet": good[: n - 8] + (2**31 - 1).to_bytes(4, "little") + b"PAR1",
        "corrupt-footer-length-zero.parquet": good[: n - 8] + (0).to_bytes(4, "little") + b"PAR1",
        "corrupt-not-parquet.parquet": b"PK\x03\x04 this is a zip header, not a Parquet file\n" * 4,
    }
    for name, data in corrupt.items():
        (OUT / name).write_bytes(data)
    total = sum(p.stat().st_size for p in OUT.glob("*.parquet"))
    print(f"wrote {len(list(OUT.glob('*.parquet')))} seed files, {total} bytes, to {OUT.name}/")


if __name__ == "__main__":
    main()
