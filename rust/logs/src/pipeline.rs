//! The streaming Parquet → Parquet run behind `mpo-rs advantages`.
//!
//! Three stages handing batches over through rendezvous channels, so each stage holds
//! one batch and memory does not depend on the input size:
//!
//! ```text
//!   decode thread (rayon) ──▶ compute (calling thread, rayon) ──▶ encode thread (rayon)
//!   columns in parallel        mpo-core over the batch's rows      columns in parallel
//! ```
//!
//! Row groups are decoded in slices of about `Tuning::batch_bytes` (a huge row group does
//! not have to fit in memory), and the encoder cuts an output row group at every input
//! row-group boundary and whenever `Tuning::max_row_group_bytes` of encoded data is
//! buffered. Decoding, computing and encoding of consecutive batches overlap.
//!
//! Group baselines need statistics over the whole input first; a first pass reads only
//! the score (or rewards) and group columns — one scan for sums, one more for GRPO's std —
//! and keeps one entry per group.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;

use crate::annotate::{annotate, append, BatchCounts};
use crate::atomic::{StagedDir, StagedFile};
use crate::encode::ParallelWriter;
use crate::error::LogError;
use crate::estimator::Estimator;
use crate::groups::GroupStats;
use crate::paths::Targets;
use crate::row_group::{contain, DecodeError, RowGroupReader};
use crate::schema::{ColumnSpec, Columns};
pub use crate::sources::check_group_column;
use crate::sources::{open_sources, Source};

/// One run of the tool.
#[derive(Debug, Clone)]
pub struct Job {
    pub input: PathBuf,
    pub output: PathBuf,
    pub estimator: Estimator,
    pub columns: ColumnSpec,
    pub tuning: Tuning,
}

/// Memory/throughput knobs; the defaults keep a run within a few hundred MB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Decoded bytes per batch (a row group is read in slices of about this size).
    pub batch_bytes: usize,
    /// An output row group is cut once this many encoded bytes are buffered.
    pub max_row_group_bytes: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        // Measured on 2 cores (rust/logs/examples/advantages.rs, system allocator): 1-16 MiB
        // batches run at the same speed, and the resident set grows with the batch
        // (2 MiB: ~170 MB, 16 MiB: ~350 MB); 64 MiB row groups are what Parquet readers
        // like and cost at most that much buffered output.
        Self { batch_bytes: 2 << 20, max_row_group_bytes: 64 << 20 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Scanning scores and group ids (group estimators only).
    GroupStatistics,
    /// Computing and writing the output.
    Write,
}

/// Reported after every batch.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub phase: Phase,
    /// Rows and tokens done in this phase (tokens are counted in the write phase only).
    pub rows: u64,
    pub tokens: u64,
    pub total_rows: u64,
    pub elapsed: Duration,
}

/// What a finished run did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub files: usize,
    pub row_groups: usize,
    pub counts: BatchCounts,
    pub input_bytes: u64,
    pub output_bytes: u64,
    pub seconds: f64,
}

/// Runs `job`. The estimators run on `pool` (else on rayon's global pool); `progress` is
/// called on the calling thread after every batch, and returning false stops the run
/// (nothing is written). On any error the previous OUTPUT is left as it was.
pub fn run(
    job: &Job,
    pool: Option<&rayon::ThreadPool>,
    progress: &mut dyn FnMut(&Progress) -> bool,
) -> Result<Summary, LogError> {
    let start = Instant::now();
    job.estimator.validate()?;
    let targets = Targets::resolve(&job.input, &job.output)?;
    let (columns, sources) = open_sources(&targets, &job.columns, &job.estimator, job.tuning.max_row_group_bytes)?;
    let total_rows = sources.iter().map(|s| s.meta.metadata().file_metadata().num_rows() as u64).sum();
    let mut clock = Clock { start, total_rows, progress };

    let groups = match job.estimator {
        Estimator::Group(params) => {
            Some(group_statistics(&sources, &columns, GroupStats::new(params), &job.tuning, &mut clock)?)
        }
        Estimator::Gigpo(params) => {
            Some(group_statistics(&sources, &columns, GroupStats::gigpo(&params), &job.tuning, &mut clock)?)
        }
        _ => None,
    };
    let work = Work {
        sources: &sources,
        columns: &columns,
        estimator: &job.estimator,
        groups: groups.as_ref(),
        tuning: &job.tuning,
        pool,
    };
    let (counts, output_bytes) = match &targets {
        Targets::File { output, .. } => stream(&work, Sink::File(output), &mut clock)?,
        Targets::Dir { output, .. } => {
            let staged = StagedDir::create(output)?;
            let done = stream(&work, Sink::Dir { staged: &staged, shown: output }, &mut clock)?;
            staged.commit()?;
            done
        }
    };
    Ok(Summary {
        files: sources.len(),
        row_groups: sources.iter().map(|s| s.meta.metadata().num_row_groups()).sum(),
        counts,
        input_bytes: sources.iter().map(|s| s.bytes).sum(),
        output_bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

struct Clock<'a> {
    start: Instant,
    total_rows: u64,
    progress: &'a mut dyn FnMut(&Progress) -> bool,
}

impl Clock<'_> {
    fn report(&mut self, phase: Phase, rows: u64, tokens: u64) -> Result<(), LogError> {
        let p = Progress { phase, rows, tokens, total_rows: self.total_rows, elapsed: self.start.elapsed() };
        if (self.progress)(&p) {
            Ok(())
        } else {
            Err(LogError::Interrupted)
        }
    }
}

/// The statistics pass: only the score/rewards and group columns are decoded (and the mask
/// where observation rewards are moved).
fn group_statistics(
    sources: &[Source],
    columns: &Columns,
    mut stats: GroupStats,
    tuning: &Tuning,
    clock: &mut Clock<'_>,
) -> Result<GroupStats, LogError> {
    let group_col = columns.group.as_deref().unwrap_or_default();
    // The group-id rule across files, on their schemas first: a log mixing string and
    // number ids is refused before any row is read.
    for s in sources {
        if let Ok(field) = s.meta.schema().field_with_name(group_col) {
            let name = s.path.display().to_string();
            stats
                .note_column(group_col, field.data_type(), &name)
                .map_err(|e| LogError::Data { at: s.at(None), error: e })?;
        }
    }
    while stats.wants_scan() {
        let mut rows = 0u64;
        for s in sources {
            stats.set_source(s.path.display().to_string());
            let descr = s.meta.parquet_schema();
            let wanted = columns.score_pass_columns();
            let roots: Vec<usize> = descr
                .root_schema()
                .get_fields()
                .iter()
                .enumerate()
                .filter(|(_, f)| wanted.contains(&f.name()))
                .map(|(i, _)| i)
                .collect();
            let leaves: Vec<usize> =
                (0..descr.num_columns()).filter(|&l| roots.contains(&descr.get_column_root_idx(l))).collect();
            let projection = ProjectionMask::roots(descr, roots.iter().copied());
            for (g, base) in s.row_group_starts().into_iter().enumerate() {
                let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(s.open()?, s.meta.clone())
                    .with_projection(projection.clone())
                    .with_row_groups(vec![g])
                    .with_batch_size(s.batch_rows(g, Some(&leaves), tuning.batch_bytes))
                    .build()
                    .map_err(|e| s.corrupt_column(g, e))?;
                let mut row_base = base;
                // As in the write pass, a reader that panics on a malformed page is this
                // row group's error.
                while let Some(batch) = contain(|| reader.next()).map_err(|m| s.corrupt(Some(g), m))? {
                    let batch = batch.map_err(|e| s.corrupt_column(g, e))?;
                    stats.scan_batch(&batch, columns).map_err(|e| s.data(g, row_base, e))?;
                    row_base += batch.num_rows() as u64;
                    rows += batch.num_rows() as u64;
                    clock.report(Phase::GroupStatistics, rows, 0)?;
                }
            }
        }
        stats.finish_scan().map_err(LogError::Batch)?;
    }
    Ok(stats)
}

/// What the compute stage needs.
struct Work<'a> {
    sources: &'a [Source],
    columns: &'a Columns,
    estimator: &'a Estimator,
    groups: Option<&'a GroupStats>,
    tuning: &'a Tuning,
    pool: Option<&'a rayon::ThreadPool>,
}

/// Where encoded files go.
#[derive(Clone, Copy)]
enum Sink<'a> {
    /// One file, staged beside this target and renamed over it when complete.
    File(&'a Path),
    /// Files inside a staged directory that replaces `shown` as a whole.
    Dir { staged: &'a StagedDir, shown: &'a Path },
}

enum Decoded {
    FileStart(usize),
    Batch { file: usize, row_group: usize, row_base: u64, batch: RecordBatch },
    RowGroupEnd,
    FileEnd,
}

enum ToWrite {
    FileStart(usize),
    Batch(RecordBatch),
    RowGroupEnd,
    FileEnd,
}

/// The write pass: decode ▶ compute ▶ encode, overlapped. Returns the counts and the
/// bytes written.
fn stream(work: &Work<'_>, sink: Sink<'_>, clock: &mut Clock<'_>) -> Result<(BatchCounts, u64), LogError> {
    std::thread::scope(|scope| {
        // Rendezvous channels: a stage waits until the next one takes its batch, so no
        // batch sits in a queue.
        let (decoded_tx, decoded_rx) = sync_channel::<Result<Decoded, LogError>>(0);
        let (write_tx, write_rx) = sync_channel::<ToWrite>(0);
        let sources = work.sources;
        let batch_bytes = work.tuning.batch_bytes;
        let pool = work.pool;
        let max_row_group_bytes = work.tuning.max_row_group_bytes;
        let decoder = std::thread::Builder::new()
            .name("mpo-rs-decode".into())
            .spawn_scoped(scope, move || decode_all(sources, batch_bytes, pool, decoded_tx))
            .map_err(|e| LogError::io("<thread>", "cannot start the decoder thread", e))?;
        let encoder = std::thread::Builder::new()
            .name("mpo-rs-encode".into())
            .spawn_scoped(scope, move || encode_all(sources, sink, write_rx, pool, max_row_group_bytes))
            .map_err(|e| LogError::io("<thread>", "cannot start the encoder thread", e))?;
        let computed = compute_all(work, decoded_rx, write_tx, clock);
        let written = encoder.join().unwrap_or_else(|_| Err(internal("the encoder thread panicked")));
        let decoded = decoder.join();
        // A compute or decode failure is the cause; the encoder then only saw the channel
        // close. An encoder failure makes the compute stage stop early without an error.
        let (counts, files_done) = computed?;
        let bytes = written?;
        if decoded.is_err() || files_done != work.sources.len() {
            // Never report success for a run that did not see every file to its end.
            return Err(internal("the run ended before all input was written"));
        }
        Ok((counts, bytes))
    })
}

fn internal(message: &str) -> LogError {
    LogError::Write { path: PathBuf::from("<output>"), message: message.into() }
}

fn compute_all(
    work: &Work<'_>,
    decoded: Receiver<Result<Decoded, LogError>>,
    to_write: SyncSender<ToWrite>,
    clock: &mut Clock<'_>,
) -> Result<(BatchCounts, usize), LogError> {
    let mut counts = BatchCounts::default();
    let mut files_done = 0;
    for item in decoded {
        let out = match item? {
            Decoded::FileStart(i) => ToWrite::FileStart(i),
            Decoded::RowGroupEnd => ToWrite::RowGroupEnd,
            Decoded::FileEnd => {
                files_done += 1;
                ToWrite::FileEnd
            }
            Decoded::Batch { file, row_group, row_base, batch } => {
                let s = &work.sources[file];
                let compute = || annotate(&batch, work.columns, work.estimator, work.groups);
                let annotation = match work.pool {
                    Some(pool) => pool.install(compute),
                    None => compute(),
                }
                .map_err(|e| s.data(row_group, row_base, e))?;
                counts += annotation.counts;
                let out =
                    append(&batch, annotation, s.out_schema.clone()).map_err(|e| s.data(row_group, row_base, e))?;
                clock.report(Phase::Write, counts.rows, counts.tokens)?;
                ToWrite::Batch(out)
            }
        };
        if to_write.send(out).is_err() {
            break; // the encoder failed; its error is reported
        }
    }
    Ok((counts, files_done))
}

/// Why a stage stopped early.
enum Stop {
    /// The next stage is gone (it failed or the run was stopped).
    Hangup,
    Failed(LogError),
}

fn decode_all(
    sources: &[Source],
    batch_bytes: usize,
    pool: Option<&rayon::ThreadPool>,
    tx: SyncSender<Result<Decoded, LogError>>,
) {
    let send = |d: Decoded| tx.send(Ok(d)).map_err(|_| Stop::Hangup);
    let result = sources.iter().enumerate().try_for_each(|(i, s)| {
        send(Decoded::FileStart(i))?;
        for (g, base) in s.row_group_starts().into_iter().enumerate() {
            // A reader that panics on a malformed page must not take the run down
            // unexplained: it becomes this row group's error.
            let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                decode_row_group(i, s, g, base, batch_bytes, pool, &send)
            }));
            match decoded {
                Ok(done) => done?,
                Err(panic) => {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|m| m.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    return Err(Stop::Failed(s.corrupt(Some(g), format!("the reader failed: {why}"))));
                }
            }
            send(Decoded::RowGroupEnd)?;
        }
        send(Decoded::FileEnd)
    });
    if let Err(Stop::Failed(e)) = result {
        let _ = tx.send(Err(e));
    }
}

/// Sends the batches of row group `g` of file `i` (whose first row is file row `base`).
fn decode_row_group(
    i: usize,
    s: &Source,
    g: usize,
    base: u64,
    batch_bytes: usize,
    pool: Option<&rayon::ThreadPool>,
    send: &dyn Fn(Decoded) -> Result<(), Stop>,
) -> Result<(), Stop> {
    let failed =
        |e: DecodeError| Stop::Failed(LogError::Corrupt { at: s.at(Some(g)), column: e.column, message: e.message });
    let mut reader =
        RowGroupReader::new(|| File::open(&s.path), &s.meta, g, s.batch_rows(g, None, batch_bytes)).map_err(failed)?;
    let mut row_base = base;
    while let Some(batch) = reader.next_batch(pool) {
        let batch = batch.map_err(failed)?;
        let n = batch.num_rows() as u64;
        send(Decoded::Batch { file: i, row_group: g, row_base, batch })?;
        row_base += n;
    }
    let expected = s.meta.metadata().row_group(g).num_rows().max(0) as u64;
    if row_base - base != expected {
        let message = format!("decoded {} rows, the footer says {expected}", row_base - base);
        return Err(Stop::Failed(s.corrupt(Some(g), message)));
    }
    Ok(())
}

/// An output file being encoded.
struct Encoding<'p> {
    writer: ParallelWriter<BufWriter<File>>,
    pool: Option<&'p rayon::ThreadPool>,
    /// Set for a single-file output (renamed into place at the end); a file inside a
    /// staged directory needs only a sync.
    staged: Option<StagedFile>,
    shown: PathBuf,
}

impl<'p> Encoding<'p> {
    fn open(
        s: &Source,
        sink: Sink<'_>,
        pool: Option<&'p rayon::ThreadPool>,
        max_row_group_bytes: usize,
    ) -> Result<Self, LogError> {
        let (staged, file, shown) = match sink {
            Sink::File(target) => {
                let (staged, file) = StagedFile::create(target)?;
                (Some(staged), file, target.to_path_buf())
            }
            Sink::Dir { staged, shown } => {
                let (_, file) = staged.create_file(&s.relative)?;
                (None, file, shown.join(&s.relative))
            }
        };
        let out = BufWriter::with_capacity(4 << 20, file);
        let writer = ParallelWriter::try_new(out, s.out_schema.clone(), s.props.clone(), max_row_group_bytes)
            .map_err(|e| LogError::Write { path: shown.clone(), message: e.to_string() })?;
        Ok(Self { writer, pool, staged, shown })
    }

    fn failed(&self, e: impl std::fmt::Display) -> LogError {
        LogError::Write { path: self.shown.clone(), message: e.to_string() }
    }

    /// Writes the footer, syncs, and (single file) renames into place. Returns the size.
    fn finish(self) -> Result<u64, LogError> {
        let Encoding { writer, pool, staged, shown } = self;
        let buffered =
            writer.into_inner(pool).map_err(|e| LogError::Write { path: shown.clone(), message: e.to_string() })?;
        let file = buffered.into_inner().map_err(|e| LogError::io(&shown, "cannot write output", e.into_error()))?;
        let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        match staged {
            Some(staged) => staged.commit(file)?,
            None => file.sync_all().map_err(|e| LogError::io(&shown, "cannot sync output", e))?,
        }
        Ok(bytes)
    }
}

fn encode_all(
    sources: &[Source],
    sink: Sink<'_>,
    rx: Receiver<ToWrite>,
    pool: Option<&rayon::ThreadPool>,
    max_row_group_bytes: usize,
) -> Result<u64, LogError> {
    let mut open: Option<Encoding<'_>> = None;
    let mut bytes = 0u64;
    let not_open = || internal("a batch arrived before its file was opened");
    // Leaving early drops `open`, which deletes its temporary file.
    for msg in rx {
        match msg {
            ToWrite::FileStart(i) => open = Some(Encoding::open(&sources[i], sink, pool, max_row_group_bytes)?),
            ToWrite::Batch(batch) => {
                let enc = open.as_mut().ok_or_else(not_open)?;
                enc.writer.write(&batch, enc.pool).map_err(|e| enc.failed(e))?;
            }
            ToWrite::RowGroupEnd => {
                let enc = open.as_mut().ok_or_else(not_open)?;
                enc.writer.flush(enc.pool).map_err(|e| enc.failed(e))?;
            }
            ToWrite::FileEnd => bytes += open.take().ok_or_else(not_open)?.finish()?,
        }
    }
    Ok(bytes)
}
