//! mpo-logs: rollout logs in Arrow and Parquet.
//!
//! A rollout log has one row per trajectory and one list per token column (mask, values,
//! rewards, ...). This crate reads those columns out of Arrow `RecordBatch`es without
//! copying where the types allow ([`schema`] finds and checks them, [`decode`] reads
//! them), computes the advantage columns with mpo-core ([`annotate`]), gathers
//! group-baseline statistics over any number of batches ([`groups`]; GiGPO's step groups
//! in [`gigpo`]), and streams Parquet
//! files through all of it with bounded memory and atomic output ([`pipeline`]), replacing
//! nothing that is not its own output ([`safety`], the one output-safety rule). No Python
//! here: the `mpo_rs._native` binding and the `mpo-rs` command line are thin layers over
//! [`pipeline::run`] and [`annotate::annotate`].

pub mod aliasing;
pub mod annotate;
pub mod atomic;
mod bridge;
pub mod decode;
mod encode;
pub mod error;
pub mod estimator;
pub mod gigpo;
mod group_ids;
pub mod groups;
mod listing;
pub mod observation;
mod output;
pub mod paths;
mod phase;
pub mod pipeline;
pub mod relocate;
mod row_group;
pub mod safety;
pub mod schema;
mod sources;
mod steps;
pub mod table;

pub use annotate::{annotate, append, output_fields, output_schema, partial_group_statistics, Annotation, BatchCounts};
pub use decode::AnchorData;
pub use decode::{read_numbers, read_row_scores, ListOffsets, RewardData, Rollouts};
pub use error::{DataError, FileAt, LogError};
pub use estimator::{Estimator, EstimatorColumns, OptionKind, OptionSpec, OptionValue, ESTIMATORS, OPTIONS};
pub use groups::{GroupStats, IdKind, IdKinds, STATISTICS_COLUMNS};
pub use observation::{check_observation_rewards, ObservationRewards, OBSERVATION_REWARDS};
pub use pipeline::{check_group_column, run, Job, Phase, Progress, Summary, Tuning};
pub use schema::{
    AnchorColumn, ColumnRow, ColumnSpec, Columns, ListKind, Needs, RewardColumn, COLUMNS, OUTPUT_COLUMNS,
};
pub use table::{annotate_batches, annotate_table};

#[cfg(test)]
pub(crate) mod test_util {
    use std::fs;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Float32Array, ListArray, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};

    /// A fresh scratch directory for one test (std only; no tempfile crate).
    pub(crate) fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mpo-logs-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// A Parquet file with `columns` (one list<float32> row each).
    pub(crate) fn parquet_with(path: &Path, columns: &[&str]) {
        let item = Arc::new(Field::new_list_field(DataType::Float32, true));
        let fields: Vec<Field> = columns.iter().map(|c| Field::new(*c, DataType::List(item.clone()), true)).collect();
        let schema = Arc::new(Schema::new(fields));
        let arrays: Vec<ArrayRef> = columns
            .iter()
            .map(|_| {
                Arc::new(ListArray::new(
                    item.clone(),
                    arrow::buffer::OffsetBuffer::from_lengths([1]),
                    Arc::new(Float32Array::from(vec![1.0])),
                    None,
                )) as ArrayRef
            })
            .collect();
        let batch = RecordBatch::try_new(schema.clone(), arrays).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(fs::File::create(path).unwrap(), schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    pub(crate) fn raw_log(path: &Path) {
        parquet_with(path, &["loss_mask", "values", "rewards"]);
    }

    pub(crate) fn our_output(path: &Path) {
        let mut columns = vec!["loss_mask", "values", "rewards"];
        columns.extend(crate::OUTPUT_COLUMNS);
        parquet_with(path, &columns);
    }
}
