//! The input files of a run: each opened, its footer read and its columns checked before
//! anything is computed ([`open_sources`]), with what its output needs; and the group-id
//! rule over the files' schemas alone ([`check_group_column`]).

use std::fs::File;
use std::path::PathBuf;

use arrow::datatypes::SchemaRef;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use parquet::file::properties::WriterProperties;

use crate::annotate::output_schema;
use crate::error::{DataError, FileAt, LogError};
use crate::estimator::{Estimator, EstimatorColumns};
use crate::groups::GroupStats;
use crate::output::writer_properties;
use crate::paths::Targets;
use crate::row_group::contain;
use crate::schema::{AnchorColumn, ColumnSpec, Columns};

/// An input file, opened and checked, with what its output needs.
pub(crate) struct Source {
    pub(crate) path: PathBuf,
    /// The path below INPUT, which the output keeps below OUTPUT.
    pub(crate) relative: PathBuf,
    pub(crate) bytes: u64,
    pub(crate) meta: ArrowReaderMetadata,
    pub(crate) out_schema: SchemaRef,
    pub(crate) props: WriterProperties,
}

impl Source {
    pub(crate) fn at(&self, row_group: Option<usize>) -> FileAt {
        FileAt { path: self.path.clone(), row_group }
    }

    pub(crate) fn open(&self) -> Result<File, LogError> {
        File::open(&self.path).map_err(|e| LogError::io(&self.path, "cannot open input", e))
    }

    pub(crate) fn corrupt(&self, row_group: Option<usize>, e: impl std::fmt::Display) -> LogError {
        LogError::Corrupt { at: self.at(row_group), column: None, message: e.to_string() }
    }

    /// A decode failure in row group `g`, naming the first column that fails on its own
    /// (decoding columns one by one costs nothing until something is already wrong).
    pub(crate) fn corrupt_column(&self, g: usize, e: impl std::fmt::Display) -> LogError {
        let descr = self.meta.parquet_schema();
        let column = (0..descr.root_schema().get_fields().len()).find_map(|root| {
            let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(self.open().ok()?, self.meta.clone())
                .with_projection(ProjectionMask::roots(descr, [root]))
                .with_row_groups(vec![g])
                .build()
                .ok()?;
            let fails = contain(|| reader.any(|b| b.is_err())).unwrap_or(true);
            fails.then(|| descr.root_schema().get_fields()[root].name().to_string())
        });
        LogError::Corrupt { at: self.at(Some(g)), column, message: e.to_string() }
    }

    pub(crate) fn data(&self, row_group: usize, row_base: u64, e: DataError) -> LogError {
        LogError::Data { at: self.at(Some(row_group)), error: e.shift_rows(row_base) }
    }

    /// Rows per batch for row group `g` so a decoded batch of the `leaves` is about
    /// `target` bytes.
    pub(crate) fn batch_rows(&self, g: usize, leaves: Option<&[usize]>, target: usize) -> usize {
        let group = self.meta.metadata().row_group(g);
        let rows = group.num_rows().max(1) as u64;
        let bytes: u64 = match leaves {
            None => group.total_byte_size().max(0) as u64,
            Some(leaves) => leaves.iter().map(|&l| group.column(l).uncompressed_size().max(0) as u64).sum(),
        };
        (target as u64 * rows / bytes.max(1)).clamp(1, rows) as usize
    }

    /// Row offset of each row group's first row in the file.
    pub(crate) fn row_group_starts(&self) -> Vec<u64> {
        let mut start = 0u64;
        self.meta
            .metadata()
            .row_groups()
            .iter()
            .map(|g| {
                let s = start;
                start += g.num_rows().max(0) as u64;
                s
            })
            .collect()
    }
}

/// Opens every input (footer and schema) before anything is computed, so a bad file
/// anywhere fails the run at once.
pub(crate) fn open_sources(
    targets: &Targets,
    spec: &ColumnSpec,
    estimator: &Estimator,
    max_row_group_bytes: usize,
) -> Result<(Columns, Vec<Source>), LogError> {
    let mut columns: Option<Columns> = None;
    let mut sources = Vec::new();
    for (path, relative) in targets.inputs() {
        let file = File::open(&path).map_err(|e| LogError::io(&path, "cannot open input", e))?;
        let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        let at = FileAt { path: path.clone(), row_group: None };
        let meta = contain(|| ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()))
            .and_then(|loaded| loaded.map_err(|e| e.to_string()))
            .map_err(|message| LogError::Corrupt { at: at.clone(), column: None, message })?;
        let schema = meta.schema();
        // Each file's columns are chosen alike (names given, else the defaults present);
        // files that choose differently are refused whatever their order, rather than
        // read by the first file's choice (docs/reliability.md, "One input rule").
        let resolved = spec
            .resolve(schema, estimator.needs())
            .and_then(|r| match &columns {
                Some(c) if *c != r => Err(LogError::Batch(DataError::ColumnsDiffer(differ(c, &r, &sources[0])))),
                Some(c) => c.check_schema(schema).map(|_| r).map_err(LogError::Batch),
                None => Ok(r),
            })
            .map_err(|e| match e {
                LogError::Batch(error) => LogError::Data { at: at.clone(), error },
                other => other,
            })?;
        let out_schema = output_schema(schema, &resolved);
        let props = writer_properties(meta.metadata(), &resolved.mask, &out_schema, max_row_group_bytes)
            .map_err(|e| LogError::Write { path: path.clone(), message: e.to_string() })?;
        sources.push(Source { path, relative, bytes, meta, out_schema, props });
        columns.get_or_insert(resolved);
    }
    let columns = columns.ok_or_else(|| LogError::Usage("no input files".into()))?;
    Ok((columns, sources))
}

/// Why a file's columns (`other`) are not those of the first file (`first`, read as
/// `columns`).
fn differ(columns: &Columns, other: &Columns, first: &Source) -> String {
    let first = first.path.display();
    let anchors = |c: &Columns| match &c.anchors {
        Some(AnchorColumn::TurnStates(n)) => format!("from `{n}` (one id per turn)"),
        Some(AnchorColumn::Tokens(n)) => format!("from `{n}` (token ids, hashed)"),
        None => "from no column".into(),
    };
    let detail = if columns.anchors != other.anchors {
        format!("this file's anchor states come {}, {first}'s {}", anchors(other), anchors(columns))
    } else {
        format!("this file's columns are {other:?}, {first}'s {columns:?}")
    };
    format!(
        "{detail}: the files of one log must read the same columns; name them (--turn-state-ids-col, \
         --token-ids-col, --rewards-col, ...) or make the files agree"
    )
}

/// The group-id rule across the Parquet files of `inputs` (each listed as [`crate::pipeline::run`] lists it),
/// on their schemas only: a log whose files hold string ids beside number ids is refused,
/// naming both files, as `run` refuses it before reading a row. For adapters that read
/// the files another way (the Ray adapter, whose reader would fail on such a log with
/// Arrow's schema-merge error). Files without the column are left to the column checks.
pub fn check_group_column(inputs: &[PathBuf], group_col: &str) -> Result<(), LogError> {
    let mut stats = GroupStats::new(mpo_core::GroupParams::default());
    let mut files = Vec::new();
    for input in inputs {
        files.extend(crate::paths::list_inputs(input)?);
    }
    for path in files {
        let file = File::open(&path).map_err(|e| LogError::io(&path, "cannot open input", e))?;
        let at = FileAt { path: path.clone(), row_group: None };
        let meta = contain(|| ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()))
            .and_then(|loaded| loaded.map_err(|e| e.to_string()))
            .map_err(|message| LogError::Corrupt { at: at.clone(), column: None, message })?;
        if let Ok(field) = meta.schema().field_with_name(group_col) {
            let name = path.display().to_string();
            stats.note_column(group_col, field.data_type(), &name).map_err(|error| LogError::Data { at, error })?;
        }
    }
    Ok(())
}
