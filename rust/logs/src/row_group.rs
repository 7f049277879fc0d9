//! Reading a Parquet row group into `RecordBatch`es, its columns decoded in parallel, and
//! a panicking reader contained as an error ([`contain`]).
//!
//! A row group is decoded with its columns in parallel: `ParquetRecordBatchReader` decodes
//! the columns of a batch one after another, but a rollout log's cost sits in a handful of
//! long list columns, so one reader per top-level column, advanced together on the rayon
//! pool, decodes a batch in about the time of its largest column. The readers share the
//! footer and read their own column chunks.

use std::fs::File;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use rayon::prelude::*;

/// The batches of one row group, `batch_rows` rows at a time.
pub(crate) struct RowGroupReader {
    /// One reader per top-level column, with the column's name.
    readers: Vec<(String, ParquetRecordBatchReader)>,
    schema: SchemaRef,
}

/// A column that failed to decode (None: the row group as a whole).
#[derive(Debug)]
pub(crate) struct DecodeError {
    pub(crate) column: Option<String>,
    pub(crate) message: String,
}

impl DecodeError {
    fn of(column: Option<&str>, e: impl std::fmt::Display) -> Self {
        Self { column: column.map(str::to_string), message: e.to_string() }
    }
}

/// Runs `f`, turning a panic of the Parquet or Arrow readers into its message: a
/// malformed file (e.g. a footer whose embedded Arrow schema the IPC decoder refuses by
/// panicking) must become that file's error, not take the run down.
pub(crate) fn contain<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|m| m.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        format!("the reader failed: {why}")
    })
}

impl RowGroupReader {
    /// `open` gives a fresh handle on the file for each column's reader.
    pub(crate) fn new(
        open: impl Fn() -> std::io::Result<File>,
        meta: &ArrowReaderMetadata,
        row_group: usize,
        batch_rows: usize,
    ) -> Result<Self, DecodeError> {
        let descr = meta.parquet_schema();
        let readers = descr
            .root_schema()
            .get_fields()
            .iter()
            .enumerate()
            .map(|(root, field)| {
                let name = field.name();
                let file = open().map_err(|e| DecodeError::of(None, e))?;
                let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
                    .with_projection(ProjectionMask::roots(descr, [root]))
                    .with_row_groups(vec![row_group])
                    .with_batch_size(batch_rows)
                    .build()
                    .map_err(|e| DecodeError::of(Some(name), e))?;
                Ok((name.to_string(), reader))
            })
            .collect::<Result<Vec<_>, DecodeError>>()?;
        Ok(Self { readers, schema: meta.schema().clone() })
    }

    /// The next batch, decoded on `pool` (else rayon's global pool); None at the end.
    pub(crate) fn next_batch(&mut self, pool: Option<&rayon::ThreadPool>) -> Option<Result<RecordBatch, DecodeError>> {
        let readers = &mut self.readers;
        let mut decode = move || {
            readers
                .par_iter_mut()
                .map(|(name, reader)| {
                    let next = reader.next()?.map(|b| b.column(0).clone());
                    Some(next.map_err(|e| DecodeError::of(Some(name), e)))
                })
                .collect::<Vec<Option<Result<ArrayRef, DecodeError>>>>()
        };
        let columns = match pool {
            Some(pool) => pool.install(decode),
            None => decode(),
        };
        if columns.iter().all(Option::is_none) {
            return None;
        }
        let mut arrays = Vec::with_capacity(columns.len());
        for (column, (name, _)) in columns.into_iter().zip(&self.readers) {
            match column {
                Some(Ok(array)) => arrays.push(array),
                Some(Err(e)) => return Some(Err(e)),
                None => return Some(Err(DecodeError::of(Some(name), "the column has fewer rows than the others"))),
            }
        }
        Some(RecordBatch::try_new(self.schema.clone(), arrays).map_err(|e| DecodeError::of(None, e)))
    }
}
