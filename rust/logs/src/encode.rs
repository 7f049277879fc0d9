//! A Parquet writer that encodes the columns of each batch in parallel.
//!
//! Encoding is the most expensive stage of the pipeline (page building, dictionaries,
//! compression), and `ArrowWriter` does it one column after another. Here each top-level
//! column's leaves go to their own `ArrowColumnWriter` on the rayon pool; a row group is
//! closed (its column chunks spliced into the file in schema order) when asked, or once
//! `max_row_group_bytes` of encoded data is buffered. The file layout, schema metadata and
//! properties are exactly `ArrowWriter`'s: it is built by one and taken apart.

use std::io::Write;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory};
use parquet::arrow::ArrowWriter;
use parquet::errors::Result;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use rayon::prelude::*;

pub struct ParallelWriter<W: Write + Send> {
    file: SerializedFileWriter<W>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    /// Parquet leaves under each top-level field (1 for lists of primitives).
    leaves_per_field: Vec<usize>,
    max_row_group_bytes: usize,
    /// The row group being encoded: each field's leaf writers.
    in_progress: Option<Vec<Vec<ArrowColumnWriter>>>,
    row_groups: usize,
}

impl<W: Write + Send> ParallelWriter<W> {
    pub fn try_new(out: W, schema: SchemaRef, props: WriterProperties, max_row_group_bytes: usize) -> Result<Self> {
        let (file, factory) = ArrowWriter::try_new(out, schema.clone(), Some(props))?.into_serialized_writer()?;
        let descr = file.schema_descr();
        let mut leaves_per_field = vec![0usize; schema.fields().len()];
        for leaf in 0..descr.num_columns() {
            if let Some(n) = leaves_per_field.get_mut(descr.get_column_root_idx(leaf)) {
                *n += 1;
            }
        }
        Ok(Self { file, factory, schema, leaves_per_field, max_row_group_bytes, in_progress: None, row_groups: 0 })
    }

    /// Encodes `batch` into the current row group, closing it if it has grown past the
    /// size limit. Runs on `pool` (else rayon's global pool).
    pub fn write(&mut self, batch: &RecordBatch, pool: Option<&rayon::ThreadPool>) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.in_progress.is_none() {
            let mut writers = self.factory.create_column_writers(self.row_groups)?.into_iter();
            let grouped = self.leaves_per_field.iter().map(|&n| writers.by_ref().take(n).collect()).collect();
            self.in_progress = Some(grouped);
        }
        let Some(groups) = self.in_progress.as_mut() else { unreachable!("created above") };
        let fields = self.schema.fields();
        let encode = || {
            groups.par_iter_mut().zip(batch.columns().par_iter()).zip(fields.par_iter()).try_for_each(
                |((writers, array), field)| {
                    for (writer, leaf) in writers.iter_mut().zip(compute_leaves(field, array)?) {
                        writer.write(&leaf)?;
                    }
                    Ok::<(), parquet::errors::ParquetError>(())
                },
            )
        };
        in_pool(pool, encode)?;
        let buffered: usize = groups.iter().flatten().map(|w| w.get_estimated_total_bytes()).sum();
        if buffered >= self.max_row_group_bytes {
            self.flush(pool)?;
        }
        Ok(())
    }

    /// Closes the current row group, if it holds any rows.
    pub fn flush(&mut self, pool: Option<&rayon::ThreadPool>) -> Result<()> {
        let Some(groups) = self.in_progress.take() else { return Ok(()) };
        let close = || groups.into_par_iter().flatten().map(|w| w.close()).collect::<Result<Vec<ArrowColumnChunk>>>();
        let chunks = in_pool(pool, close)?;
        let mut row_group = self.file.next_row_group()?;
        for chunk in chunks {
            chunk.append_to_row_group(&mut row_group)?;
        }
        row_group.close()?;
        self.row_groups += 1;
        Ok(())
    }

    /// Closes the last row group, writes the footer and returns the output.
    pub fn into_inner(mut self, pool: Option<&rayon::ThreadPool>) -> Result<W> {
        self.flush(pool)?;
        self.file.into_inner()
    }
}

fn in_pool<T: Send>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> T + Send) -> T {
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Float32Array, Int64Array, ListArray};
    use arrow::datatypes::Float32Type;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use std::sync::Arc;

    #[test]
    fn reads_back_like_arrow_writer_output_with_the_same_row_groups() {
        let lists: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(
            (0..50).map(|i| Some((0..i % 7).map(|k| Some(k as f32)).collect::<Vec<_>>())),
        ));
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..50));
        let scores: ArrayRef = Arc::new(Float32Array::from_iter_values((0..50).map(|i| i as f32)));
        let batch = RecordBatch::try_from_iter([("id", ids), ("tokens", lists), ("score", scores)]).unwrap();
        let path = crate::test_util::scratch("encode").join("t.parquet");
        let file = std::fs::File::create(&path).unwrap();
        let mut w = ParallelWriter::try_new(file, batch.schema(), WriterProperties::default(), usize::MAX).unwrap();
        w.write(&batch.slice(0, 20), None).unwrap();
        w.write(&batch.slice(20, 10), None).unwrap();
        w.flush(None).unwrap();
        w.write(&batch.slice(30, 0), None).unwrap();
        w.write(&batch.slice(30, 20), None).unwrap();
        w.into_inner(None).unwrap().sync_all().unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap()).unwrap();
        let groups: Vec<i64> = reader.metadata().row_groups().iter().map(|g| g.num_rows()).collect();
        assert_eq!(groups, vec![30, 20]);
        assert_eq!(reader.schema(), &batch.schema());
        let back: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
        let back = arrow::compute::concat_batches(&batch.schema(), &back).unwrap();
        assert_eq!(back, batch);
    }
}
