//! Files found by the fuzzer (rust/fuzz) on which a Parquet or Arrow reader panics. The
//! run must fail with a one-line "cannot read Parquet" error naming the file (exit code
//! 1), never a panic across the boundary, whatever the estimator.

// Helpers outside #[test] functions may unwrap too: a failed set-up fails the test.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use mpo_logs::{run, ColumnSpec, Estimator, Job, LogError, Tuning};

fn finding(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/findings").join(name)
}

fn advantages(input: &Path, estimator: &str) -> Result<mpo_logs::Summary, LogError> {
    let out = std::env::temp_dir().join(format!("mpo-logs-fuzz-finding-{}-{estimator}.parquet", std::process::id()));
    let job = Job {
        input: input.to_path_buf(),
        output: out.clone(),
        estimator: Estimator::from_options(estimator, &[]).unwrap(),
        columns: ColumnSpec::default(),
        tuning: Tuning::default(),
    };
    let result = run(&job, None, &mut |_| true);
    assert!(!out.exists(), "a failed run wrote {}", out.display());
    result
}

#[test]
fn a_footer_whose_arrow_schema_panics_the_reader_is_a_corrupt_file() {
    for name in ["corrupt-arrow-schema-int-width-0.parquet", "corrupt-arrow-schema-float-precision.parquet"] {
        let input = finding(name);
        for estimator in ["mae", "grpo"] {
            let caught = std::panic::catch_unwind(|| advantages(&input, estimator));
            let result = caught.unwrap_or_else(|_| panic!("{name} ({estimator}): the run panicked"));
            let e = result.expect_err(name);
            let msg = e.to_string();
            assert!(matches!(e, LogError::Corrupt { .. }), "{name}: {msg}");
            assert!(msg.contains(name) && msg.contains("cannot read Parquet") && !msg.contains('\n'), "{msg}");
        }
    }
}

#[test]
fn a_data_page_that_panics_the_reader_is_a_corrupt_row_group_in_both_passes() {
    // The group estimators read the score and group columns in a statistics pass first;
    // its reader panicked ("Decoder for dict should have been set") outside the write
    // pass's guard.
    let name = "corrupt-data-page-dictionary-decoder.parquet";
    let input = finding(name);
    for estimator in ["mae", "gae", "grpo", "rloo"] {
        let caught = std::panic::catch_unwind(|| advantages(&input, estimator));
        let result = caught.unwrap_or_else(|_| panic!("{name} ({estimator}): the run panicked"));
        let e = result.expect_err(name);
        let msg = e.to_string();
        assert!(matches!(e, LogError::Corrupt { .. }), "{estimator}: {msg}");
        assert!(msg.contains(name) && msg.contains("row group") && !msg.contains('\n'), "{estimator}: {msg}");
    }
}
