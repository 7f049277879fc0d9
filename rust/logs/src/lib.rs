//! mpo-logs: rollout logs in Arrow and Parquet.
//!
//! A rollout log has one row per trajectory and one list per token column (mask, values,
//! rewards, ...). This crate reads those columns out of Arrow `RecordBatch`es without
//! copying where the types allow ([`schema`] finds and checks them, [`decode`] reads
//! them), computes the advantage columns with mpo-core ([`annotate`]), gathers
//! group-baseline statistics over any number of batches ([`groups`]), and streams Parquet
//! files through all of it with bounded memory and atomic output ([`pipeline`]). No Python
//! here: the `mpo_rs._native` binding and the `mpo-rs` command line are thin layers over
//! [`pipeline::run`] and [`annotate::annotate`].

pub mod annotate;
pub mod atomic;
pub mod decode;
mod encode;
pub mod error;
pub mod estimator;
pub mod groups;
mod output;
pub mod paths;
pub mod pipeline;
pub mod schema;
pub mod table;

pub use annotate::{annotate, append, output_fields, output_schema, partial_group_statistics, Annotation, BatchCounts};
pub use decode::{read_numbers, read_row_scores, ListOffsets, RewardData, Rollouts};
pub use error::{DataError, FileAt, LogError};
pub use estimator::{Estimator, EstimatorColumns, OptionKind, OptionSpec, OptionValue, ESTIMATORS, OPTIONS};
pub use groups::{GroupStats, IdKind, IdKinds, STATISTICS_COLUMNS};
pub use pipeline::{check_group_column, run, Job, Phase, Progress, Summary, Tuning};
pub use schema::{ColumnRow, ColumnSpec, Columns, ListKind, Needs, RewardColumn, COLUMNS, OUTPUT_COLUMNS};
pub use table::{annotate_batches, annotate_table};

#[cfg(test)]
pub(crate) mod test_util {
    use std::path::PathBuf;

    /// A fresh scratch directory for one test (std only; no tempfile crate).
    pub(crate) fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mpo-logs-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
