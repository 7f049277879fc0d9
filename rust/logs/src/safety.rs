//! Output safety: the one rule for what a run may replace, and how aliasing among its
//! inputs and outputs is detected. Every command that writes goes through it before
//! anything is written — `mpo-rs advantages` ([`check_run`], for `paths::Targets`), and
//! `mpo-rs diagnose -o` and `mpo-rs reproduce --out` (report directories: the binding's
//! `check_output_dir` / `claim_output_dir`, over [`check_report_dir`] and
//! [`claim_report_dir`]). A refusal is [`LogError::Usage`] (exit code 2), one line naming
//! the path at fault and how to proceed; an error of the operating system is
//! [`LogError::Io`].
//!
//! **1. Nothing that exists and is not this tool's output is replaced.**
//! - An OUTPUT that exists and is not a regular file or a directory — a device such as
//!   `/dev/null`, a FIFO, a socket, a symlink to nothing (symlinks are resolved) — is
//!   never replaced, and never opened.
//! - A *Parquet log* is the tool's output when its Arrow schema, read from the footer
//!   alone, ends with the four columns `advantages` appends ([`OUTPUT_COLUMNS`], in order).
//!   Nothing is added to the files to recognise them. An existing file OUTPUT of
//!   `advantages` must be one.
//! - An existing directory OUTPUT of `advantages` must hold nothing but such logs (regular
//!   files named `*.parquet`), directories of them, and hidden or `_` names (`_SUCCESS`,
//!   a killed run's temporaries; skipped as the input listing skips them). An empty
//!   directory qualifies.
//! - A *report directory* (`diagnose`, `reproduce`) is the tool's output when it holds the
//!   marker file [`MARKER`] naming that tool (and, optionally, the configuration the
//!   output was made with); the tool writes the marker when it claims the directory.
//!   A missing or empty directory qualifies; any other directory is taken only when the
//!   caller asks for it explicitly (`overwrite`).
//!
//! **2. Inputs and outputs do not alias.** Paths are compared canonically (symlinks
//! resolved) and files also by (device, inode), which every name of a file shares (hard
//! links, bind mounts).
//! - OUTPUT is not INPUT, does not lie inside an INPUT directory, and does not contain
//!   INPUT, whether or not OUTPUT or its parents exist yet: one check for every writer,
//!   [`crate::aliasing::refuse_aliasing`].
//! - No input is one of the files a replacement of OUTPUT deletes (its tree, symlinks not
//!   followed).
//! - No two inputs are one file: a symlink or a hard link beside its target would be read
//!   twice (and counted twice by the group statistics).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};

use crate::aliasing::{canonical_target, file_id, refuse_aliasing};
use crate::atomic::{parent_of, StagedFile};
use crate::error::LogError;
use crate::listing::{dir_inputs, is_hidden, is_parquet, list_inputs, sorted_entries};
use crate::row_group::contain;
use crate::schema::OUTPUT_COLUMNS;

// Re-exported where the crate has always named it.
pub use crate::aliasing::refuse_duplicate_inputs;

/// The file that marks a report directory as the output of one tool.
pub const MARKER: &str = ".mpo-rs-output";

/// First line of every marker file.
const MARKER_HEADER: &str = "written by mpo-rs: this directory is the output of the tool below";

/// Longest configuration id a marker records.
const MAX_CONFIG_LEN: usize = 128;

// ---------------------------------------------------------------------------------------
// What exists at a path.

/// What exists at an OUTPUT path, symlinks resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Existing {
    Absent,
    File,
    Dir,
}

/// What is at `path`; anything but nothing, a regular file or a directory is refused
/// (`label` names the path in the message: "OUTPUT", "REPORT_DIR", ...).
pub(crate) fn existing(path: &Path, label: &str) -> Result<Existing, LogError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Existing::Absent),
        Err(e) => return Err(LogError::io(path, "cannot inspect output", e)),
        Ok(_) => {}
    }
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LogError::Usage(format!(
                "{label} {} is a symlink to nothing; remove it or choose a new path",
                path.display()
            )))
        }
        Err(e) => return Err(LogError::io(path, "cannot inspect output", e)),
    };
    if meta.is_dir() {
        Ok(Existing::Dir)
    } else if meta.is_file() {
        Ok(Existing::File)
    } else {
        Err(LogError::Usage(format!(
            "{label} {} is {}, not a regular file or a directory; it is never replaced: choose a new path",
            path.display(),
            special_kind(&meta.file_type())
        )))
    }
}

#[cfg(unix)]
fn special_kind(t: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: &fs::FileType) -> &'static str {
    "a special file"
}

// ---------------------------------------------------------------------------------------
// Rule 1 for `advantages`: Parquet logs.

/// Whether the regular file `path` is an output of `advantages`: a Parquet file whose
/// Arrow schema (the footer alone is read) ends with [`OUTPUT_COLUMNS`]. A file that is
/// not Parquet at all is not.
pub fn is_tool_output(path: &Path) -> Result<bool, LogError> {
    let file = fs::File::open(path).map_err(|e| LogError::io(path, "cannot open output", e))?;
    let loaded = contain(|| ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()));
    let Ok(Ok(meta)) = loaded else { return Ok(false) };
    let names: Vec<&str> = meta.schema().fields().iter().map(|f| f.name().as_str()).collect();
    Ok(names.ends_with(&OUTPUT_COLUMNS))
}

/// Why a file is not ours, to follow its name.
fn not_ours() -> String {
    format!("is not an output of mpo-rs advantages (its columns do not end with {})", OUTPUT_COLUMNS.join(", "))
}

/// An existing file OUTPUT of `advantages` must be an earlier output of it.
fn refuse_foreign_file(output: &Path) -> Result<(), LogError> {
    if is_tool_output(output)? {
        return Ok(());
    }
    Err(LogError::Usage(format!(
        "OUTPUT {} {}; refusing to replace it: remove it or choose a new path",
        output.display(),
        not_ours()
    )))
}

/// An existing directory OUTPUT of `advantages` must hold only earlier outputs of it
/// (and hidden names).
fn refuse_foreign_dir(output: &Path) -> Result<(), LogError> {
    let Some((stranger, why)) = first_foreign(output)? else { return Ok(()) };
    Err(LogError::Usage(format!(
        "OUTPUT directory {} holds {}, which {why}; refusing to replace it: remove it or choose a new directory",
        output.display(),
        stranger.display()
    )))
}

/// The first entry under `dir` that an earlier run of `advantages` would not have written,
/// with why.
fn first_foreign(dir: &Path) -> Result<Option<(PathBuf, String)>, LogError> {
    for entry in sorted_entries(dir)? {
        let path = entry.path();
        let name = entry.file_name();
        // Not followed: deleting a symlink leaves its target alone, but a symlink is not
        // something the tool writes.
        let ty = entry.file_type().map_err(|e| LogError::io(&path, "cannot read", e))?;
        if ty.is_dir() {
            if let Some(found) = first_foreign(&path)? {
                return Ok(Some(found));
            }
        } else if ty.is_file() && is_hidden(&name) {
            continue;
        } else if !(ty.is_file() && is_parquet(&name)) {
            return Ok(Some((path, "is not Parquet output".into())));
        } else if !is_tool_output(&path)? {
            return Ok(Some((path, not_ours())));
        }
    }
    Ok(None)
}

// ---------------------------------------------------------------------------------------
// Rule 2: aliasing.

/// Checks INPUT and OUTPUT of an `advantages` run by the whole rule and lists INPUT (as
/// [`crate::listing`] lists it): None for a file INPUT, else its Parquet files relative to
/// it. Nothing is written.
pub(crate) fn check_run(input: &Path, output: &Path) -> Result<Option<Vec<PathBuf>>, LogError> {
    let checked = check_unlisted(input, output)?;
    if !checked.input_is_dir {
        return Ok(None);
    }
    let files = dir_inputs(input)?;
    checked.check_listing(input, &files, output)?;
    Ok(Some(files))
}

/// The checked paths of an `advantages` run, before INPUT is listed.
#[derive(Debug)]
struct RunPaths {
    input_is_dir: bool,
    output_exists: bool,
    out_canon: PathBuf,
}

/// Checks INPUT and OUTPUT of an `advantages` run as far as that needs no listing of
/// INPUT: OUTPUT's kind (rule 1), OUTPUT against INPUT (rule 2), a file OUTPUT's owner
/// (rule 1). With a directory INPUT, [`RunPaths::check_listing`] does the rest.
fn check_unlisted(input: &Path, output: &Path) -> Result<RunPaths, LogError> {
    let in_meta = fs::metadata(input).map_err(|e| LogError::io(input, "cannot open input", e))?;
    let out_kind = existing(output, "OUTPUT")?;
    if out_kind == Existing::Absent && output.file_name().is_none() {
        return Err(LogError::Usage(format!("OUTPUT {} does not name a file or directory", output.display())));
    }
    refuse_aliasing(&[input.to_path_buf()], output, "OUTPUT")?;
    if out_kind == Existing::Absent {
        let parent = parent_of(output);
        fs::metadata(&parent).map_err(|e| LogError::io(&parent, "cannot use the output's directory", e))?;
    }
    let out_canon = canonical_target(output)?;
    let input_is_dir = in_meta.is_dir();
    if input_is_dir {
        if out_kind == Existing::File {
            return Err(LogError::Usage(format!(
                "INPUT is a directory, so OUTPUT must be a directory, but {} is a file",
                output.display()
            )));
        }
    } else {
        if out_kind == Existing::Dir {
            return Err(LogError::Usage(format!(
                "INPUT is a file, so OUTPUT must be a file path, but {} is a directory",
                output.display()
            )));
        }
        if out_kind == Existing::File {
            refuse_foreign_file(output)?;
        }
    }
    Ok(RunPaths { input_is_dir, output_exists: out_kind != Existing::Absent, out_canon })
}

impl RunPaths {
    /// The rest of the checks of a directory INPUT, given its listing (`files`, relative to
    /// `input`): no input is a file a replacement of OUTPUT deletes (rule 2), and an
    /// existing OUTPUT directory holds only earlier outputs (rule 1). The listing itself
    /// was checked by [`refuse_duplicate_inputs`].
    fn check_listing(&self, input: &Path, files: &[PathBuf], output: &Path) -> Result<(), LogError> {
        if !self.output_exists {
            return Ok(());
        }
        refuse_inputs_inside_output(input, files, output, &self.out_canon)?;
        refuse_foreign_dir(output)
    }
}

/// Replacing OUTPUT deletes every file in its tree, so no input may be one of them: not
/// through a symlink (its resolved path), a hard link or a bind mount (its device and
/// inode, which every name of a file shares).
fn refuse_inputs_inside_output(
    input: &Path,
    files: &[PathBuf],
    output: &Path,
    out_canon: &Path,
) -> Result<(), LogError> {
    let mut in_output = Vec::new();
    file_ids_under(output, &mut in_output)?;
    for file in files {
        let path = input.join(file);
        let canon = fs::canonicalize(&path).map_err(|e| LogError::io(&path, "cannot open input", e))?;
        let meta = fs::metadata(&path).map_err(|e| LogError::io(&path, "cannot open input", e))?;
        if canon.starts_with(out_canon) || file_id(&meta).is_some_and(|id| in_output.contains(&id)) {
            return Err(LogError::Usage(format!(
                "INPUT file {} is a file inside OUTPUT {} (through a link or a mount); replacing OUTPUT would delete it",
                path.display(),
                output.display()
            )));
        }
    }
    Ok(())
}

/// The ids of the files a replacement of `dir` would delete: its tree, symlinks not
/// followed (deleting a symlink leaves its target alone).
fn file_ids_under(dir: &Path, ids: &mut Vec<(u64, u64)>) -> Result<(), LogError> {
    for entry in sorted_entries(dir)? {
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).map_err(|e| LogError::io(&path, "cannot read", e))?;
        if meta.is_dir() {
            file_ids_under(&path, ids)?;
        } else if meta.is_file() {
            ids.extend(file_id(&meta));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Writers that add files to a directory (Ray Data's `write_parquet`).

/// Checks the local `inputs` and the directory `output` of a writer that adds its own
/// files to `output` and never replaces it (Ray Data's `Dataset.write_parquet`). Rule 1:
/// `output` must not exist or be a directory with no visible entries — beside earlier
/// files, even earlier outputs, the new ones would be read together with them. Rule 2:
/// `output` is no input, does not lie inside an input directory and does not contain an
/// input, and no two inputs are one file. With no `output` (one the caller cannot check,
/// such as a URI), only the last. Nothing is written.
pub fn check_dataset_output(inputs: &[PathBuf], output: Option<&Path>) -> Result<(), LogError> {
    let Some(output) = output else { return refuse_duplicate_listing(inputs) };
    let shown = output.display();
    let kind = existing(output, "OUTPUT")?;
    if kind == Existing::File {
        return Err(LogError::Usage(format!(
            "OUTPUT {shown} is a file; the dataset is written as a directory of Parquet files: choose a new directory"
        )));
    }
    if kind == Existing::Absent && output.file_name().is_none() {
        return Err(LogError::Usage(format!("OUTPUT {shown} does not name a directory")));
    }
    refuse_aliasing(inputs, output, "OUTPUT")?;
    if kind == Existing::Dir {
        if let Some(entry) = sorted_entries(output)?.into_iter().find(|e| !is_hidden(&e.file_name())) {
            return Err(LogError::Usage(format!(
                "OUTPUT directory {shown} is not empty (it holds {}); the dataset's files would be added beside \
                 what is there and read with it later: remove its contents or choose a new directory",
                entry.path().display()
            )));
        }
    }
    refuse_duplicate_listing(inputs)
}

/// Every file of every input, listed as the commands list them; no file twice.
fn refuse_duplicate_listing(inputs: &[PathBuf]) -> Result<(), LogError> {
    let mut files = Vec::new();
    for input in inputs {
        files.extend(list_inputs(input)?);
    }
    refuse_duplicate_inputs(&files)
}

// ---------------------------------------------------------------------------------------
// Rule 1 for report directories: the marker.

/// The tools that write report directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportTool {
    Diagnose,
    Reproduce,
}

impl ReportTool {
    pub const ALL: [ReportTool; 2] = [ReportTool::Diagnose, ReportTool::Reproduce];

    pub fn name(self) -> &'static str {
        match self {
            ReportTool::Diagnose => "diagnose",
            ReportTool::Reproduce => "reproduce",
        }
    }

    pub fn from_name(name: &str) -> Result<Self, LogError> {
        Self::ALL.into_iter().find(|t| t.name() == name).ok_or_else(|| {
            let known: Vec<&str> = Self::ALL.iter().map(|t| t.name()).collect();
            LogError::Usage(format!("unknown report tool `{name}`; choose one of {}", known.join(", ")))
        })
    }
}

/// What a marker file records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The tool's name, as [`ReportTool::name`] writes it (a marker of another version may
    /// name a tool this one does not know).
    pub tool: String,
    /// The configuration id the output was made with, if the tool gave one.
    pub config: Option<String>,
}

impl Marker {
    fn render(&self) -> String {
        let mut text = format!("{MARKER_HEADER}\ntool: {}\n", self.tool);
        if let Some(c) = &self.config {
            text.push_str(&format!("config: {c}\n"));
        }
        text
    }

    /// `None` for text that is not a marker.
    fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        if lines.next()? != MARKER_HEADER {
            return None;
        }
        let (mut tool, mut config) = (None, None);
        for line in lines {
            if let Some(t) = line.strip_prefix("tool: ") {
                tool = Some(t.to_string());
            } else if let Some(c) = line.strip_prefix("config: ") {
                config = Some(c.to_string());
            }
        }
        Some(Marker { tool: tool?, config })
    }
}

/// The marker of the directory `dir`; `None` if it has none (or `dir` is not a directory),
/// or the file is not a marker.
pub fn read_marker(dir: &Path) -> Result<Option<Marker>, LogError> {
    let path = dir.join(MARKER);
    match fs::symlink_metadata(&path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Ok(None),
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => return Ok(None),
        Err(e) => return Err(LogError::io(&path, "cannot read the output marker", e)),
    }
    let bytes = fs::read(&path).map_err(|e| LogError::io(&path, "cannot read the output marker", e))?;
    Ok(std::str::from_utf8(&bytes).ok().and_then(Marker::parse))
}

/// Checks that `dir` may receive the output of `tool` (rule 1): it does not exist, or is
/// an empty directory, or holds `tool`'s marker; with `overwrite`, any directory. It is
/// not, does not contain and does not lie inside any of `inputs` (rule 2, with or without
/// `overwrite`). `label` names the path in messages ("REPORT_DIR", "--out"). Returns the
/// configuration id the marker records when it is `tool`'s. Nothing is written.
pub fn check_report_dir(
    dir: &Path,
    tool: ReportTool,
    overwrite: bool,
    label: &str,
    inputs: &[PathBuf],
) -> Result<Option<String>, LogError> {
    let shown = dir.display();
    let kind = existing(dir, label)?;
    if kind == Existing::File {
        return Err(LogError::Usage(format!(
            "{label} {shown} is a file, and a report is a directory: give the path of a new or empty directory"
        )));
    }
    refuse_aliasing(inputs, dir, label)?;
    if kind == Existing::Absent {
        return Ok(None);
    }
    let marker = read_marker(dir)?;
    match marker {
        Some(m) if m.tool == tool.name() => return Ok(m.config),
        _ if overwrite => return Ok(None),
        Some(m) => {
            return Err(LogError::Usage(format!(
                "{label} {shown} is the output of mpo-rs {}, not of mpo-rs {}; remove it or choose a new directory",
                m.tool,
                tool.name()
            )))
        }
        None => {}
    }
    let first = sorted_entries(dir)?.into_iter().next();
    match first {
        None => Ok(None),
        Some(entry) => Err(LogError::Usage(format!(
            "{label} {shown} is not empty and was not written by mpo-rs {} (it holds {} and no {MARKER} marker); \
             refusing to write into it: remove its contents or choose a new directory",
            tool.name(),
            entry.path().display()
        ))),
    }
}

/// [`check_report_dir`], then creates `dir` (and its parents) if needed and writes
/// `tool`'s marker into it, with `config` (one line of printable ASCII, no spaces, at
/// most 128 characters) when given. Returns the configuration id the previous marker
/// recorded when it was `tool`'s (to resume a run with the same configuration).
pub fn claim_report_dir(
    dir: &Path,
    tool: ReportTool,
    config: Option<&str>,
    overwrite: bool,
    label: &str,
    inputs: &[PathBuf],
) -> Result<Option<String>, LogError> {
    if let Some(c) = config {
        if c.is_empty() || c.len() > MAX_CONFIG_LEN || !c.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(LogError::Usage(format!(
                "configuration id {c:?} must be 1 to {MAX_CONFIG_LEN} printable ASCII characters without spaces"
            )));
        }
    }
    let previous = check_report_dir(dir, tool, overwrite, label, inputs)?;
    fs::create_dir_all(dir).map_err(|e| LogError::io(dir, "cannot create output directory", e))?;
    let marker = Marker { tool: tool.name().to_string(), config: config.map(str::to_string) };
    let target = dir.join(MARKER);
    let (staged, mut file) = StagedFile::create(&target)?;
    file.write_all(marker.render().as_bytes()).map_err(|e| LogError::io(&target, "cannot write output marker", e))?;
    staged.commit(file)?;
    Ok(previous)
}

#[cfg(test)]
mod tests;
