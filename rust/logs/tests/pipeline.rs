//! End-to-end runs of the Parquet pipeline on small generated logs.

// Helpers outside #[test] functions may unwrap too: a failed set-up fails the test.
#![allow(clippy::unwrap_used)]

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, AsArray, BooleanBuilder, Float32Builder, Int64Array, LargeListBuilder, ListBuilder, RecordBatch,
    StringArray,
};
use arrow::datatypes::{Float32Type, Int32Type};
use mpo_core::{GroupParams, MaeParams, Rewards};
use mpo_logs::{run, ColumnSpec, Estimator, Job, LogError, Tuning};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mpo-logs-it-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn unit(&mut self) -> f32 {
        (self.next() % 10_000) as f32 / 10_000.0
    }
}

/// Flat columns of a synthetic log, kept to compare against the core.
#[derive(Default, Clone)]
struct Log {
    offsets: Vec<i64>,
    mask: Vec<u8>,
    values: Vec<f32>,
    rewards: Vec<f32>,
    scores: Vec<f32>,
    groups: Vec<i64>,
}

impl Log {
    fn generate(rows: usize, seed: u64) -> Self {
        let mut rng = Lcg(seed);
        let mut log = Log { offsets: vec![0], ..Default::default() };
        for _ in 0..rows {
            let turns = 1 + rng.next() % 4;
            let start = log.mask.len();
            for _ in 0..turns {
                for _ in 0..rng.next() % 5 {
                    log.mask.push(0);
                }
                for _ in 0..1 + rng.next() % 6 {
                    log.mask.push(1);
                }
            }
            let end = log.mask.len();
            let score = (rng.next() % 2) as f32;
            for q in start..end {
                log.values.push(rng.unit());
                log.rewards.push(0.0);
                if q + 1 == end {
                    log.rewards[q] = score; // the last token is a policy token
                }
            }
            log.scores.push(score);
            log.groups.push((rng.next() % 7) as i64);
            log.offsets.push(end as i64);
        }
        log
    }

    fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    fn batch(&self, rows: std::ops::Range<usize>, large: bool) -> RecordBatch {
        fn list<B: arrow::array::ArrayBuilder>(
            large: bool,
            mut make: impl FnMut() -> B,
            mut fill: impl FnMut(&mut B, usize),
            rows: &std::ops::Range<usize>,
            offsets: &[i64],
        ) -> ArrayRef {
            if large {
                let mut b = LargeListBuilder::new(make());
                for j in rows.clone() {
                    (offsets[j] as usize..offsets[j + 1] as usize).for_each(|q| fill(b.values(), q));
                    b.append(true);
                }
                Arc::new(b.finish())
            } else {
                let mut b = ListBuilder::new(make());
                for j in rows.clone() {
                    (offsets[j] as usize..offsets[j + 1] as usize).for_each(|q| fill(b.values(), q));
                    b.append(true);
                }
                Arc::new(b.finish())
            }
        }
        let mask = list(large, BooleanBuilder::new, |b, q| b.append_value(self.mask[q] != 0), &rows, &self.offsets);
        let values = list(large, Float32Builder::new, |b, q| b.append_value(self.values[q]), &rows, &self.offsets);
        let rewards = list(large, Float32Builder::new, |b, q| b.append_value(self.rewards[q]), &rows, &self.offsets);
        let ids: Vec<String> = self.groups[rows.clone()].iter().map(|g| format!("prompt-{g}")).collect();
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from_iter_values(rows.clone().map(|j| j as i64))) as ArrayRef),
            ("loss_mask", mask),
            ("values", values),
            ("rewards", rewards),
            ("score", Arc::new(arrow::array::Float32Array::from(self.scores[rows.clone()].to_vec())) as ArrayRef),
            ("group_id", Arc::new(StringArray::from(ids)) as ArrayRef),
        ])
        .unwrap()
    }

    /// Writes rows `range` to `path`, `per_group` rows per row group.
    fn write(&self, path: &Path, range: std::ops::Range<usize>, per_group: usize, large: bool) {
        let schema = self.batch(0..0, large).schema();
        let props = WriterProperties::builder().set_compression(parquet::basic::Compression::SNAPPY).build();
        let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, Some(props)).unwrap();
        let mut j = range.start;
        while j < range.end {
            let k = (j + per_group).min(range.end);
            w.write(&self.batch(j..k, large)).unwrap();
            w.flush().unwrap();
            j = k;
        }
        w.close().unwrap();
    }
}

fn job(input: &Path, output: &Path, estimator: &str) -> Job {
    Job {
        input: input.into(),
        output: output.into(),
        estimator: Estimator::from_options(estimator, &[]).unwrap(),
        columns: ColumnSpec::default(),
        // Tiny batches, so row groups are read in several slices.
        tuning: Tuning { batch_bytes: 2000, ..Default::default() },
    }
}

fn read_all(path: &Path) -> Vec<RecordBatch> {
    let mut files = vec![];
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = fs::read_dir(path).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        files.extend(entries);
    } else {
        files.push(path.to_path_buf());
    }
    files
        .iter()
        .flat_map(|f| ParquetRecordBatchReaderBuilder::try_new(File::open(f).unwrap()).unwrap().build().unwrap())
        .map(|b| b.unwrap())
        .collect()
}

fn flat_f32(batches: &[RecordBatch], name: &str) -> Vec<f32> {
    let mut out = vec![];
    for b in batches {
        let c = b.column_by_name(name).unwrap();
        let (values, offsets): (_, Vec<i64>) = match c.as_list_opt::<i32>() {
            Some(l) => (l.values().clone(), l.value_offsets().iter().map(|&o| o as i64).collect()),
            None => {
                let l = c.as_list::<i64>();
                (l.values().clone(), l.value_offsets().to_vec())
            }
        };
        let v = values.as_primitive::<Float32Type>().values();
        out.extend_from_slice(&v[offsets[0] as usize..*offsets.last().unwrap() as usize]);
    }
    out
}

fn never_stop() -> impl FnMut(&mpo_logs::Progress) -> bool {
    |_| true
}

#[test]
fn mae_over_row_groups_and_batches_equals_the_core() {
    let d = scratch("mae");
    let log = Log::generate(300, 1);
    for large in [false, true] {
        let input = d.join(format!("in-{large}.parquet"));
        let output = d.join(format!("out-{large}.parquet"));
        log.write(&input, 0..log.rows(), 37, large);
        let summary = run(&job(&input, &output, "mae"), None, &mut never_stop()).unwrap();
        assert_eq!(summary.counts.rows, 300);
        assert_eq!(summary.counts.tokens, log.mask.len() as u64);

        let want = mpo_core::mae_advantages(
            &log.values,
            &log.mask,
            &log.offsets,
            Rewards::Token(&log.rewards),
            &MaeParams::default(),
        )
        .unwrap();
        let out = read_all(&output);
        assert_eq!(flat_f32(&out, "advantages"), want.advantages);
        assert_eq!(flat_f32(&out, "returns"), want.returns);
        assert_eq!(flat_f32(&out, "turn_advantages"), want.turn_advantages);
        // Inputs pass through unchanged and in order.
        let ids: Vec<i64> = out
            .iter()
            .flat_map(|b| {
                b.column_by_name("id").unwrap().as_primitive::<arrow::datatypes::Int64Type>().values().to_vec()
            })
            .collect();
        assert_eq!(ids, (0..300).collect::<Vec<i64>>());
        assert_eq!(flat_f32(&out, "values"), log.values);
        let ti = out[0].column_by_name("turn_index").unwrap();
        let first_row: Vec<i32> = if large {
            ti.as_list::<i64>().value(0).as_primitive::<Int32Type>().values().to_vec()
        } else {
            ti.as_list::<i32>().value(0).as_primitive::<Int32Type>().values().to_vec()
        };
        let first_mask = &log.mask[0..log.offsets[1] as usize];
        assert!(first_row.iter().zip(first_mask).all(|(&t, &m)| (t < 0) == (m == 0)));
        assert_eq!(first_row.iter().copied().filter(|&t| t >= 0).min(), Some(0));
    }
    fs::remove_dir_all(d).unwrap();
}

#[test]
fn grpo_groups_scattered_over_files_equal_the_core() {
    let d = scratch("grpo");
    let log = Log::generate(240, 2);
    let input = d.join("in");
    fs::create_dir_all(&input).unwrap();
    log.write(&input.join("a.parquet"), 0..100, 13, false);
    log.write(&input.join("b.parquet"), 100..240, 29, true);
    let output = d.join("out");
    for (name, params) in [
        ("grpo", GroupParams::default()),
        ("drgrpo", GroupParams { norm_std: false, ..Default::default() }),
        ("rloo", GroupParams { leave_one_out: true, ..Default::default() }),
    ] {
        run(&job(&input, &output, name), None, &mut never_stop()).unwrap();
        let per_row = mpo_core::group_advantages(&log.rewards_sum(), &log.groups, 7, &params).unwrap();
        let want = mpo_core::broadcast_to_tokens(&per_row, &log.mask, &log.offsets).unwrap();
        assert_eq!(flat_f32(&read_all(&output), "advantages"), want, "{name}");
    }
    fs::remove_dir_all(d).unwrap();
}

impl Log {
    /// Trajectory scores as the tool derives them from a rewards column.
    fn rewards_sum(&self) -> Vec<f32> {
        self.offsets
            .windows(2)
            .map(|w| self.rewards[w[0] as usize..w[1] as usize].iter().map(|&r| r as f64).sum::<f64>() as f32)
            .collect()
    }
}

#[test]
fn bad_data_names_file_row_group_row_and_column_and_leaves_old_output() {
    let d = scratch("bad");
    let mut log = Log::generate(50, 3);
    let input = d.join("in.parquet");
    let output = d.join("out.parquet");
    // An earlier output (only an output of the tool may be replaced).
    log.write(&input, 0..50, 10, false);
    run(&job(&input, &output, "mae"), None, &mut never_stop()).unwrap();
    let earlier = fs::read(&output).unwrap();
    // Row 27 gets a NaN value on a policy token.
    let q = (log.offsets[27]..log.offsets[28]).find(|&q| log.mask[q as usize] == 1).unwrap() as usize;
    log.values[q] = f32::NAN;
    log.write(&input, 0..50, 10, false);
    let e = run(&job(&input, &output, "mae"), None, &mut never_stop()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, LogError::Data { .. }), "{msg}");
    assert!(msg.contains("in.parquet: row group 2: row 27, column `values`: NaN is not finite"), "{msg}");
    assert_eq!(fs::read(&output).unwrap(), earlier);
    let leftovers: Vec<_> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    fs::remove_dir_all(d).unwrap();
}

#[test]
fn missing_columns_corrupt_files_and_same_paths_are_refused() {
    let d = scratch("refuse");
    let log = Log::generate(20, 4);
    let input = d.join("in.parquet");
    log.write(&input, 0..20, 10, false);

    let mut j = job(&input, &d.join("o.parquet"), "mae");
    j.columns.values = "critic".into();
    let msg = run(&j, None, &mut never_stop()).unwrap_err().to_string();
    assert!(msg.contains("in.parquet: missing column `critic`"), "{msg}");

    let e = run(&job(&input, &input, "mae"), None, &mut never_stop()).unwrap_err();
    assert!(e.is_usage(), "{e}");

    let bytes = fs::read(&input).unwrap();
    let cut = d.join("cut.parquet");
    fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = run(&job(&cut, &d.join("o.parquet"), "mae"), None, &mut never_stop()).unwrap_err();
    assert!(matches!(e, LogError::Corrupt { .. }) && e.to_string().contains("cut.parquet"), "{e}");
    assert!(!d.join("o.parquet").exists());
    fs::remove_dir_all(d).unwrap();
}

#[test]
fn stopping_from_progress_writes_nothing() {
    let d = scratch("stop");
    let log = Log::generate(100, 5);
    let input = d.join("in.parquet");
    log.write(&input, 0..100, 10, false);
    let output = d.join("out.parquet");
    let mut calls = 0;
    let e = run(&job(&input, &output, "mae"), None, &mut |_| {
        calls += 1;
        calls < 3
    })
    .unwrap_err();
    assert!(matches!(e, LogError::Interrupted));
    assert!(!output.exists());
    assert_eq!(fs::read_dir(&d).unwrap().count(), 1, "only the input is left");
    fs::remove_dir_all(d).unwrap();
}
