//! Files found by the fuzzer (rust/fuzz): a damaged footer whose embedded Arrow schema
//! makes the Arrow reader panic. The run must fail with a one-line "cannot read Parquet"
//! error naming the file (exit code 1), never a panic across the boundary.

use std::path::{Path, PathBuf};

use mpo_logs::{run, ColumnSpec, Estimator, EstimatorOptions, Job, LogError, Tuning};

fn finding(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/findings").join(name)
}

fn advantages(input: &Path, estimator: &str) -> Result<mpo_logs::Summary, LogError> {
    let out = std::env::temp_dir().join(format!("mpo-logs-corrupt-footer-{}-{estimator}.parquet", std::process::id()));
    let job = Job {
        input: input.to_path_buf(),
        output: out.clone(),
        estimator: Estimator::from_options(estimator, &EstimatorOptions::default()).unwrap(),
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
