//! Finding the Parquet files of an INPUT: one listing for every command that reads a log,
//! and the name rules it shares with the output-safety rule ([`crate::safety`]).

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use crate::aliasing::refuse_duplicate_inputs;
use crate::error::LogError;

/// Hidden and underscore names (`.part.tmp`, `_SUCCESS`, `_metadata`) are not data, as in
/// Spark, pyarrow and polars: the input listing skips them, and so does rule 1.
pub(crate) fn is_hidden(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with('.') || name.starts_with('_')
}

pub(crate) fn is_parquet(name: &OsStr) -> bool {
    Path::new(name).extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// The entries of `dir` in name order.
pub(crate) fn sorted_entries(dir: &Path) -> Result<Vec<fs::DirEntry>, LogError> {
    let mut entries = fs::read_dir(dir)
        .map_err(|e| LogError::io(dir, "cannot list directory", e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LogError::io(dir, "cannot list directory", e))?;
    entries.sort_by_key(|e| e.file_name());
    Ok(entries)
}

/// The Parquet files a run reads from INPUT, in processing order: INPUT itself if it is
/// not a directory, else the files under it as [`Targets::resolve`] lists them. One
/// listing for every command that reads a log (`advantages`, `diagnose`); nothing is
/// written. A directory without Parquet files, or with two names of one file (a symlink
/// or a hard link beside its target), is a usage error.
pub fn list_inputs(input: &Path) -> Result<Vec<PathBuf>, LogError> {
    let meta = fs::metadata(input).map_err(|e| LogError::io(input, "cannot open input", e))?;
    if !meta.is_dir() {
        return Ok(vec![input.to_path_buf()]);
    }
    Ok(dir_inputs(input)?.into_iter().map(|f| input.join(f)).collect())
}

/// The Parquet files under the directory `input`, relative to it; none, or two names of
/// one file, is a usage error.
pub(crate) fn dir_inputs(input: &Path) -> Result<Vec<PathBuf>, LogError> {
    let mut files = Vec::new();
    list_parquet(input, Path::new(""), &mut files)?;
    if files.is_empty() {
        return Err(LogError::Usage(format!("INPUT directory {} holds no .parquet files", input.display())));
    }
    let paths: Vec<PathBuf> = files.iter().map(|f| input.join(f)).collect();
    refuse_duplicate_inputs(&paths)?;
    Ok(files)
}

/// Appends the Parquet files under `root/relative` to `out` in name order. Directory
/// symlinks are not followed (no cycles); file symlinks are.
fn list_parquet(root: &Path, relative: &Path, out: &mut Vec<PathBuf>) -> Result<(), LogError> {
    for entry in sorted_entries(&root.join(relative))? {
        let name = entry.file_name();
        if is_hidden(&name) {
            continue;
        }
        let rel = relative.join(&name);
        let ty = entry.file_type().map_err(|e| LogError::io(entry.path(), "cannot read", e))?;
        if ty.is_dir() {
            list_parquet(root, &rel, out)?;
        } else if is_parquet(&name) && fs::metadata(entry.path()).is_ok_and(|m| m.is_file()) {
            out.push(rel);
        }
    }
    Ok(())
}
