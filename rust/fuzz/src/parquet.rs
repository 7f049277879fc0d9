//! The Parquet fuzz target: a file's bytes → `mpo_logs::run` (the pipeline behind
//! `mpo-rs advantages`) → the outcome checked.
//!
//! - Every run: no panic escapes, the input file is unchanged, an error is one line that
//!   names the input file and is not a usage error (exit code 1, not 2), and a failed run
//!   leaves nothing behind in the output's directory.
//! - [`Expect::Error`] (truncated files, damaged footers, wrong column types, bad data):
//!   the run must fail.
//! - [`Expect::RoundTrip`] (an untouched good file): the run must succeed.
//! - Whenever a run succeeds: the output reads back with the plain Parquet reader, has the
//!   input's rows and columns unchanged plus the four output columns, and the advantages
//!   match the slow reference ([`crate::reference`]) computed from the columns as read
//!   back, or for the group estimators are one value per row on its policy tokens.
//!
//! Hangs and aborts (out of memory) are caught by the driver, which runs this target in a
//! child process with a time limit and an address-space limit.

use std::fs::{self, File};
use std::path::Path;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, RecordBatchReader};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::{DataType, Float32Type, Float64Type, SchemaRef};
use mpo_logs::{run, ColumnSpec, Estimator, Job, LogError, Tuning, OUTPUT_COLUMNS};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::{reference, take_panic, Failure};

/// What a run on a given file must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    RoundTrip,
    Error,
    Either,
}

impl Expect {
    pub fn name(self) -> &'static str {
        match self {
            Expect::RoundTrip => "roundtrip",
            Expect::Error => "error",
            Expect::Either => "either",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Expect::RoundTrip, Expect::Error, Expect::Either].into_iter().find(|e| e.name() == s)
    }
}

/// The estimators a run may use (the CLI's names).
pub const ESTIMATORS: [&str; 5] = ["mae", "gae", "grpo", "rloo", "bilevel"];

/// Decoded bytes per batch: tiny batches exercise row-group slicing.
pub const BATCH_BYTES: [usize; 3] = [64, 4096, 2 << 20];

/// Runs the pipeline on `data` (written to `dir`/input.parquet; `dir` is emptied first)
/// and checks the outcome. Returns the outcome's class.
pub fn check(data: &[u8], expect: Expect, estimator: &str, batch_bytes: usize, dir: &Path) -> Result<String, Failure> {
    let io = |what: &str, e: std::io::Error| Failure::new(format!("fuzz harness: {what}: {e}"));
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).map_err(|e| io("cannot create the work dir", e))?;
    let input = dir.join("input.parquet");
    let output = dir.join("output.parquet");
    fs::write(&input, data).map_err(|e| io("cannot write the input", e))?;
    let estimator = Estimator::from_options(estimator, &[]).map_err(|e| Failure::new(format!("fuzz harness: {e}")))?;
    let job = Job {
        input: input.clone(),
        output: output.clone(),
        estimator,
        columns: ColumnSpec::default(),
        tuning: Tuning { batch_bytes, max_row_group_bytes: 1 << 16 },
    };
    take_panic();
    let result = run(&job, None, &mut |_| true);
    let contained_panic = take_panic();

    if fs::read(&input).map_err(|e| io("cannot read the input back", e))? != data {
        return Err(Failure::new("the input file was modified".into()));
    }
    match result {
        Err(e) => {
            let msg = e.to_string();
            if msg.is_empty() || msg.contains('\n') {
                return Err(Failure::new(format!("error message is not one line: {msg:?}")));
            }
            if e.is_usage() {
                return Err(Failure::new(format!("a bad file is reported as a usage error (exit 2): {msg}")));
            }
            if !msg.contains("input.parquet") {
                return Err(Failure::new(format!("the error does not name the input file: {msg}")));
            }
            let left: Vec<String> = fs::read_dir(dir)
                .map_err(|e| io("cannot list the work dir", e))?
                .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .filter(|n| n != "input.parquet")
                .collect();
            if !left.is_empty() {
                return Err(Failure::new(format!("a failed run left {left:?} beside the output ({msg})")));
            }
            if expect == Expect::RoundTrip {
                return Err(Failure::new(format!("a good file was refused: {msg}")));
            }
            Ok(match (&e, contained_panic) {
                (_, Some(_)) => "error-reader-panic-contained".into(),
                (LogError::Corrupt { .. }, None) => "error-corrupt".into(),
                (LogError::Data { .. }, None) => "error-data".into(),
                _ => "error-other".into(),
            })
        }
        Ok(summary) => {
            if expect == Expect::Error {
                return Err(Failure::new("a corrupt or invalid file was accepted".into()));
            }
            verify_output(&input, &output, &estimator, summary.counts.rows)?;
            Ok("ok".into())
        }
    }
}

fn read_all(path: &Path) -> Result<(SchemaRef, RecordBatch), String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| e.to_string())?
        .build()
        .map_err(|e| e.to_string())?;
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    let all = concat_batches(&schema, &batches).map_err(|e| e.to_string())?;
    Ok((schema, all))
}

/// A list column as (row offsets from 0, values cast to f64).
fn flat_list(col: &ArrayRef) -> Option<(Vec<usize>, Vec<f64>)> {
    let (offsets, values): (Vec<usize>, ArrayRef) = match col.data_type() {
        DataType::List(_) => {
            let l = col.as_list::<i32>();
            (l.value_offsets().iter().map(|&o| o as usize).collect(), l.values().clone())
        }
        DataType::LargeList(_) => {
            let l = col.as_list::<i64>();
            (l.value_offsets().iter().map(|&o| o as usize).collect(), l.values().clone())
        }
        _ => return None,
    };
    let lo = *offsets.first()?;
    let hi = *offsets.last()?;
    let sliced = values.slice(lo, hi - lo);
    // Booleans and integers go through f64 exactly; floats are rounded to f32 first, as
    // the pipeline reads them.
    let numbers = if sliced.data_type().is_floating() {
        cast(&cast(&sliced, &DataType::Float32).ok()?, &DataType::Float64).ok()?
    } else {
        cast(&sliced, &DataType::Float64).ok()?
    };
    let numbers = numbers.as_primitive::<Float64Type>().values().to_vec();
    Some((offsets.iter().map(|&o| o - lo).collect(), numbers))
}

fn fail(what: String) -> Failure {
    Failure::new(format!("accepted file: {what}"))
}

fn verify_output(input: &Path, output: &Path, estimator: &Estimator, rows: u64) -> Result<(), Failure> {
    let (in_schema, inp) = read_all(input).map_err(|e| fail(format!("the plain reader refuses the input: {e}")))?;
    let (out_schema, out) = read_all(output).map_err(|e| fail(format!("the output does not read back: {e}")))?;
    if inp.num_rows() as u64 != rows || out.num_rows() != inp.num_rows() {
        return Err(fail(format!("rows: input {}, output {}, summary {rows}", inp.num_rows(), out.num_rows())));
    }
    let n_in = in_schema.fields().len();
    let names: Vec<&str> = out_schema.fields().iter().map(|f| f.name().as_str()).collect();
    let expected: Vec<&str> = in_schema.fields().iter().map(|f| f.name().as_str()).chain(OUTPUT_COLUMNS).collect();
    if names != expected {
        return Err(fail(format!("output columns {names:?}, expected {expected:?}")));
    }
    for k in 0..n_in {
        if out.column(k).as_ref() != inp.column(k).as_ref() {
            return Err(fail(format!("input column `{}` changed", names[k])));
        }
    }
    let col = |name: &str| inp.column_by_name(name);
    let Some((offsets, mask)) = col("loss_mask").and_then(flat_list) else {
        return Err(fail("no readable loss_mask".into()));
    };
    let mask: Vec<u8> = mask.iter().map(|&m| m as u8).collect();
    let offsets: Vec<i64> = offsets.iter().map(|&o| o as i64).collect();
    let out_list =
        |k: usize| flat_list(out.column(n_in + k)).map(|(o, v)| (o.iter().map(|&x| x as i64).collect::<Vec<_>>(), v));
    let (Some((adv_off, adv)), Some((_, ret)), Some((_, turn_index))) = (out_list(0), out_list(1), out_list(2)) else {
        return Err(fail("output columns are not lists".into()));
    };
    if adv_off != offsets || adv.len() != mask.len() || ret.len() != mask.len() || turn_index.len() != mask.len() {
        return Err(fail("output lists do not have the mask's lengths".into()));
    }
    // turn_index: the turn within the row, −1 off-policy.
    let turns = reference::segment(&mask, &offsets);
    for j in 0..offsets.len() - 1 {
        for q in offsets[j] as usize..offsets[j + 1] as usize {
            let t = turns.token_turn[q];
            let want = if t < 0 { -1 } else { t as i64 - turns.traj_offsets[j] };
            if turn_index[q] as i64 != want {
                return Err(fail(format!(
                    "turn_index of row {j} token {} is {}, expected {want}",
                    q - offsets[j] as usize,
                    turn_index[q]
                )));
            }
        }
    }
    let finite = adv.iter().chain(&ret).all(|x| x.is_finite());
    if !finite && !crate::estimators::ALLOW_NONFINITE_OUTPUT {
        return Err(fail("non-finite advantages or returns written".into()));
    }

    let token_rewards = col("rewards").and_then(flat_list);
    let scores: Option<Vec<f32>> = col("score").and_then(|s| {
        let f = cast(s, &DataType::Float32).ok()?;
        Some(f.as_primitive::<Float32Type>().values().to_vec())
    });
    let r: Vec<f64> = match (&token_rewards, &scores) {
        (Some((_, r)), _) => r.clone(),
        (None, Some(s)) => reference::token_rewards(&mask, &offsets, None, Some(s)),
        (None, None) => return Err(fail("neither rewards nor score read back".into())),
    };
    let clean = |xs: &[f64]| xs.iter().all(|x| x.is_finite() && x.abs() <= 1e4);
    match estimator {
        Estimator::Mae(_) | Estimator::Gae(_) | Estimator::BiLevel(_) if !clean(&r) => {}
        Estimator::Mae(p) => {
            let Some((_, values)) = col("values").and_then(flat_list) else {
                return Err(fail("no readable values".into()));
            };
            if clean(&values) {
                let v32: Vec<f32> = values.iter().map(|&x| x as f32).collect();
                let want = reference::mae_truncated(
                    &v32,
                    &mask,
                    &offsets,
                    &r,
                    &[],
                    p.lam,
                    p.lam_intra,
                    p.beta,
                    p.gamma,
                    p.lam_critic,
                );
                compare("advantages", &adv, &want.advantages)?;
                compare("returns", &ret, &want.returns)?;
            }
        }
        Estimator::Gae(p) => {
            let Some((_, values)) = col("values").and_then(flat_list) else {
                return Err(fail("no readable values".into()));
            };
            if clean(&values) {
                let v32: Vec<f32> = values.iter().map(|&x| x as f32).collect();
                let (a, g) = reference::gae_truncated(
                    &v32,
                    &mask,
                    &offsets,
                    &r,
                    &[],
                    p.gamma,
                    p.lam,
                    p.lam_critic,
                    p.length_adaptive_alpha,
                );
                compare("advantages", &adv, &a)?;
                compare("returns", &ret, &g)?;
            }
        }
        Estimator::BiLevel(p) => {
            let Some((_, values)) = col("values").and_then(flat_list) else {
                return Err(fail("no readable values".into()));
            };
            if clean(&values) {
                let v32: Vec<f32> = values.iter().map(|&x| x as f32).collect();
                let want = reference::bilevel(&v32, &mask, &offsets, &r, p.lam, p.gamma, p.high_level_gamma);
                compare("advantages", &adv, &want.advantages)?;
                compare("returns", &ret, &want.returns)?;
            }
        }
        Estimator::Group(_) => {
            // One value per row on its policy tokens, 0 elsewhere; returns = advantages.
            for j in 0..offsets.len() - 1 {
                let range = offsets[j] as usize..offsets[j + 1] as usize;
                let first = range.clone().find(|&q| mask[q] != 0).map(|q| adv[q]);
                for q in range {
                    let want = if mask[q] != 0 { first.unwrap_or(0.0) } else { 0.0 };
                    if adv[q].to_bits() != want.to_bits() || ret[q].to_bits() != adv[q].to_bits() {
                        return Err(fail(format!("row {j}: group advantages are not one value on its policy tokens")));
                    }
                }
            }
        }
        // Not among this fuzzer's ESTIMATORS (its logs carry no anchor states).
        Estimator::Gigpo(_) => return Err(fail("the Parquet fuzzer has no gigpo check".into())),
    }
    Ok(())
}

fn compare(name: &str, got: &[f64], want: &[f64]) -> Result<(), Failure> {
    match got.iter().zip(want).position(|(&g, &w)| (g - w).abs() > 1e-5 * (1.0 + w.abs())) {
        None => Ok(()),
        Some(k) => Err(fail(format!("`{name}` token {k} is {} but the reference gives {}", got[k], want[k]))),
    }
}
