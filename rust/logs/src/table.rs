//! The advantage columns of a table already in memory (the Arrow entry point of the
//! binding): group statistics over all its batches, then each batch annotated, with
//! errors naming the row in the whole table.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;

use crate::annotate::{annotate, output_fields, output_schema};
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
    let groups = match estimator {
        Estimator::Group(params) => Some(group_statistics(batches, columns, GroupStats::new(*params))?),
        Estimator::Gigpo(params) => Some(group_statistics(batches, columns, GroupStats::gigpo(params))?),
        _ => None,
    };
    annotate_batches(batches, schema, columns, estimator, groups.as_ref(), false).map_err(LogError::Batch)
}

/// The output columns of every batch with statistics gathered elsewhere (`groups`, needed
/// by the group estimators: see [`GroupStats::merge`]), one output batch per input batch;
/// with `keep_input`, each output batch is its input batch with the columns appended.
/// Errors name the row in the whole of `batches`.
pub fn annotate_batches(
    batches: &[RecordBatch],
    schema: &Schema,
    columns: &Columns,
    estimator: &Estimator,
    groups: Option<&GroupStats>,
    keep_input: bool,
) -> Result<(Vec<RecordBatch>, Arc<Schema>), DataError> {
    let out_schema = if keep_input {
        output_schema(schema, columns)
    } else {
        Arc::new(Schema::new(output_fields(columns.list_kind(schema)).to_vec()))
    };
    let mut out = Vec::with_capacity(batches.len());
    let mut base = 0u64;
    for batch in batches {
        let a = annotate(batch, columns, estimator, groups).map_err(|e| e.shift_rows(base))?;
        let mut arrays = if keep_input { batch.columns().to_vec() } else { Vec::new() };
        arrays.extend(a.columns);
        out.push(
            RecordBatch::try_new(out_schema.clone(), arrays)
                .map_err(|e| DataError::Capacity(format!("cannot assemble the output: {e}")))?,
        );
        base += batch.num_rows() as u64;
    }
    Ok((out, out_schema))
}

/// Group (and GiGPO's step-group) statistics over all batches of the table (the same
/// scans as the Parquet tool).
fn group_statistics(batches: &[RecordBatch], columns: &Columns, mut stats: GroupStats) -> Result<GroupStats, LogError> {
    while stats.wants_scan() {
        let mut base = 0u64;
        for batch in batches {
            let shifted = |e: DataError| LogError::Batch(e.shift_rows(base));
            stats.scan_batch(batch, columns).map_err(shifted)?;
            base += batch.num_rows() as u64;
        }
        stats.finish_scan().map_err(LogError::Batch)?;
    }
    Ok(stats)
}
