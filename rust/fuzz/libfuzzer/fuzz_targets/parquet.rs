#![no_main]
//! Any bytes as a Parquet file → `mpo_logs::run`, checked (see mpo_fuzz::parquet). The
//! estimator and batch size come from the length, so the corpus files stay plain Parquet.
//! libFuzzer's -timeout and -rss_limit_mb catch hangs and runaway memory.

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use mpo_fuzz::parquet::{check, Expect, BATCH_BYTES, ESTIMATORS};

fuzz_target!(|data: &[u8]| {
    let dir: PathBuf = std::env::temp_dir().join(format!("mpo-fuzz-libfuzzer-{}", std::process::id()));
    let estimator = ESTIMATORS[data.len() % ESTIMATORS.len()];
    let batch = BATCH_BYTES[data.len() / ESTIMATORS.len() % BATCH_BYTES.len()];
    if let Err(f) = check(data, Expect::Either, estimator, batch, &dir) {
        panic!("{f}");
    }
});
