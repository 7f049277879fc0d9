//! The advantage columns of a table already in memory (the Arrow entry point of the
//! binding): group statistics over all its batches, then each batch annotated, with
//! errors naming the row in the whole table.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;

use crate::annotate::{annotate, output_fields};
use crate::decode::read_row_scores;
use crate::error::{DataError, LogError};
use crate::estimator::Estimator;
use crate::groups::GroupStats;
use crate::schema::Columns;

/// The output columns (advantages, returns, turn_index, turn_advantages) of every batch,
/// one output batch per input batch. `columns` are resolved against `schema`, the schema
/// of every batch. Runs on the current rayon pool.
pub fn annotate_table(
    batches: &[RecordBatch],
    schema: &Schema,
    columns: &Columns,
    estimator: &Estimator,
) -> Result<(Vec<RecordBatch>, Arc<Schema>), LogError> {
    let out_schema = Arc::new(Schema::new(output_fields(columns.list_kind(schema)).to_vec()));
    let groups = match estimator {
        Estimator::Group(params) => Some(group_statistics(batches, columns, GroupStats::new(*params))?),
        _ => None,
    };
    let mut out = Vec::with_capacity(batches.len());
    let mut base = 0u64;
    for batch in batches {
        let a =
            annotate(batch, columns, estimator, groups.as_ref()).map_err(|e| LogError::Batch(e.shift_rows(base)))?;
        out.push(
            RecordBatch::try_new(out_schema.clone(), a.columns.to_vec())
                .map_err(|e| LogError::Batch(DataError::Capacity(format!("cannot assemble the output: {e}"))))?,
        );
        base += batch.num_rows() as u64;
    }
    Ok((out, out_schema))
}

/// Group statistics over all batches of the table (the same scans as the Parquet tool).
fn group_statistics(batches: &[RecordBatch], columns: &Columns, mut stats: GroupStats) -> Result<GroupStats, LogError> {
    let group_col = columns.group.as_deref().unwrap_or_default();
    while stats.wants_scan() {
        let mut base = 0u64;
        for batch in batches {
            let shifted = |e: DataError| LogError::Batch(e.shift_rows(base));
            let scores = read_row_scores(batch, &columns.reward).map_err(shifted)?;
            stats.scan(group_col, batch, &scores).map_err(shifted)?;
            base += batch.num_rows() as u64;
        }
        stats.finish_scan();
    }
    Ok(stats)
}
