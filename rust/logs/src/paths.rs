//! INPUT and OUTPUT of a run: finding the Parquet files, and refusing combinations that
//! could modify or destroy an input or unrelated files.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::atomic::parent_of;
use crate::error::LogError;

/// The files of a run, each with the output path relative to OUTPUT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// One input file to one output file.
    File { input: PathBuf, output: PathBuf },
    /// A directory of Parquet files (searched recursively, in name order) to a directory
    /// with the same layout.
    Dir { input: PathBuf, output: PathBuf, files: Vec<PathBuf> },
}

impl Targets {
    /// Checks the paths and lists the inputs. Nothing is written.
    pub fn resolve(input: &Path, output: &Path) -> Result<Self, LogError> {
        let in_meta = fs::metadata(input).map_err(|e| LogError::io(input, "cannot open input", e))?;
        let in_canon = fs::canonicalize(input).map_err(|e| LogError::io(input, "cannot open input", e))?;
        let out_meta = fs::metadata(output).ok();
        let out_canon = match &out_meta {
            Some(_) => fs::canonicalize(output).map_err(|e| LogError::io(output, "cannot open output", e))?,
            None => {
                let parent = parent_of(output);
                let name = output.file_name().ok_or_else(|| {
                    LogError::Usage(format!("OUTPUT {} does not name a file or directory", output.display()))
                })?;
                fs::canonicalize(&parent)
                    .map_err(|e| LogError::io(&parent, "cannot use the output's directory", e))?
                    .join(name)
            }
        };
        if in_canon == out_canon || out_meta.as_ref().is_some_and(|m| same_file(&in_meta, m)) {
            return Err(LogError::Usage(format!(
                "OUTPUT {} is INPUT; write to a new path (inputs are never modified)",
                output.display()
            )));
        }
        if in_meta.is_dir() {
            if out_canon.starts_with(&in_canon) {
                return Err(LogError::Usage(format!(
                    "OUTPUT {} is inside the INPUT directory; choose a path outside it",
                    output.display()
                )));
            }
            if in_canon.starts_with(&out_canon) {
                return Err(LogError::Usage(format!(
                    "INPUT {} is inside OUTPUT; replacing OUTPUT would delete it",
                    input.display()
                )));
            }
            if let Some(m) = &out_meta {
                if !m.is_dir() {
                    return Err(LogError::Usage(format!(
                        "INPUT is a directory, so OUTPUT must be a directory, but {} is a file",
                        output.display()
                    )));
                }
                if let Some(stranger) = first_non_parquet(output)? {
                    return Err(LogError::Usage(format!(
                        "OUTPUT directory {} holds {}, which is not Parquet output; refusing to replace it",
                        output.display(),
                        stranger.display()
                    )));
                }
            }
            let files = dir_inputs(input)?;
            if out_meta.is_some() {
                refuse_inputs_inside_output(input, &files, output, &out_canon)?;
            }
            Ok(Targets::Dir { input: input.to_path_buf(), output: output.to_path_buf(), files })
        } else {
            if out_meta.as_ref().is_some_and(|m| m.is_dir()) {
                return Err(LogError::Usage(format!(
                    "INPUT is a file, so OUTPUT must be a file path, but {} is a directory",
                    output.display()
                )));
            }
            Ok(Targets::File { input: input.to_path_buf(), output: output.to_path_buf() })
        }
    }

    /// (input path, output path relative to OUTPUT) of every file, in processing order.
    pub fn inputs(&self) -> Vec<(PathBuf, PathBuf)> {
        match self {
            Targets::File { input, .. } => vec![(input.clone(), PathBuf::new())],
            Targets::Dir { input, files, .. } => files.iter().map(|f| (input.join(f), f.clone())).collect(),
        }
    }
}

/// The Parquet files a run reads from INPUT, in processing order: INPUT itself if it is
/// not a directory, else the files under it as [`Targets::resolve`] lists them. One
/// listing for every command that reads a log (`advantages`, `diagnose`); nothing is
/// written, and a directory without Parquet files is a usage error.
pub fn list_inputs(input: &Path) -> Result<Vec<PathBuf>, LogError> {
    let meta = fs::metadata(input).map_err(|e| LogError::io(input, "cannot open input", e))?;
    if !meta.is_dir() {
        return Ok(vec![input.to_path_buf()]);
    }
    Ok(dir_inputs(input)?.into_iter().map(|f| input.join(f)).collect())
}

/// The Parquet files under the directory `input`, relative to it; none is a usage error.
fn dir_inputs(input: &Path) -> Result<Vec<PathBuf>, LogError> {
    let mut files = Vec::new();
    list_parquet(input, Path::new(""), &mut files)?;
    if files.is_empty() {
        return Err(LogError::Usage(format!("INPUT directory {} holds no .parquet files", input.display())));
    }
    Ok(files)
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
    let mut in_output = HashSet::new();
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

/// (device, inode) of a file; `None` where the platform has no such identity.
#[cfg(unix)]
fn file_id(m: &fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_id(_: &fs::Metadata) -> Option<(u64, u64)> {
    None
}

/// The ids of the files a replacement of `dir` would delete: its tree, symlinks not
/// followed (deleting a symlink leaves its target alone).
fn file_ids_under(dir: &Path, ids: &mut HashSet<(u64, u64)>) -> Result<(), LogError> {
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

#[cfg(unix)]
fn same_file(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_file(_: &fs::Metadata, _: &fs::Metadata) -> bool {
    false
}

/// Hidden and underscore names (`.part.tmp`, `_SUCCESS`, `_metadata`) are not data, as in
/// Spark, pyarrow and polars.
fn is_hidden(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with('.') || name.starts_with('_')
}

fn is_parquet(name: &std::ffi::OsStr) -> bool {
    Path::new(name).extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

fn sorted_entries(dir: &Path) -> Result<Vec<fs::DirEntry>, LogError> {
    let mut entries = fs::read_dir(dir)
        .map_err(|e| LogError::io(dir, "cannot list directory", e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LogError::io(dir, "cannot list directory", e))?;
    entries.sort_by_key(|e| e.file_name());
    Ok(entries)
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

/// The first entry under `dir` that an earlier run of the tool would not have written.
fn first_non_parquet(dir: &Path) -> Result<Option<PathBuf>, LogError> {
    for entry in sorted_entries(dir)? {
        let path = entry.path();
        let ty = entry.file_type().map_err(|e| LogError::io(&path, "cannot read", e))?;
        if ty.is_dir() {
            if let Some(p) = first_non_parquet(&path)? {
                return Ok(Some(p));
            }
        } else if !(ty.is_file() && (is_parquet(&entry.file_name()) || is_hidden(&entry.file_name()))) {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::scratch;

    #[test]
    fn directories_are_listed_recursively_in_name_order() {
        let d = scratch("paths-list");
        let input = d.join("in");
        fs::create_dir_all(input.join("b=1")).unwrap();
        for f in ["z.parquet", "a.parquet", "b=1/c.parquet", "_SUCCESS", ".hidden.parquet", "notes.txt"] {
            fs::write(input.join(f), b"x").unwrap();
        }
        let t = Targets::resolve(&input, &d.join("out")).unwrap();
        let Targets::Dir { files, .. } = &t else { panic!("{t:?}") };
        let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        assert_eq!(names, ["a.parquet", "b=1/c.parquet", "z.parquet"]);
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn list_inputs_is_the_listing_of_a_run() {
        let d = scratch("paths-inputs");
        let input = d.join("in");
        fs::create_dir_all(input.join("part=1")).unwrap();
        for f in ["b.parquet", "part=1/a.parquet", "_SUCCESS", ".tmp.parquet"] {
            fs::write(input.join(f), b"x").unwrap();
        }
        let listed = list_inputs(&input).unwrap();
        let Targets::Dir { files, .. } = Targets::resolve(&input, &d.join("out")).unwrap() else { panic!() };
        assert_eq!(listed, files.iter().map(|f| input.join(f)).collect::<Vec<_>>());
        assert_eq!(list_inputs(&input.join("b.parquet")).unwrap(), [input.join("b.parquet")]);
        let empty = d.join("empty");
        fs::create_dir_all(&empty).unwrap();
        assert!(list_inputs(&empty).unwrap_err().is_usage());
        assert!(matches!(list_inputs(&d.join("nope")).unwrap_err(), LogError::Io { .. }));
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn dangerous_combinations_are_refused() {
        let d = scratch("paths-refuse");
        let input = d.join("in");
        fs::create_dir_all(&input).unwrap();
        fs::write(input.join("a.parquet"), b"x").unwrap();
        let usage = |i: &Path, o: &Path| Targets::resolve(i, o).unwrap_err().is_usage();
        assert!(usage(&input.join("a.parquet"), &input.join("a.parquet")));
        assert!(usage(&input.join("a.parquet"), &input.join(".").join("a.parquet")));
        assert!(usage(&input, &input.join("out")));
        assert!(usage(&input, &d));
        assert!(usage(&input.join("a.parquet"), &d));
        fs::write(d.join("file.parquet"), b"x").unwrap();
        assert!(usage(&input, &d.join("file.parquet")));
        let other = d.join("other");
        fs::create_dir_all(&other).unwrap();
        fs::write(other.join("thesis.tex"), b"x").unwrap();
        assert!(usage(&input, &other));
        // An input that is, through a link, a file inside OUTPUT: replacing OUTPUT
        // would delete it.
        let out = d.join("out");
        fs::create_dir_all(&out).unwrap();
        fs::write(out.join("real.parquet"), b"x").unwrap();
        let linked = d.join("linked");
        fs::create_dir_all(&linked).unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(out.join("real.parquet"), linked.join("sym.parquet")).unwrap();
            assert!(usage(&linked, &out), "a symlink into OUTPUT");
            fs::remove_file(linked.join("sym.parquet")).unwrap();
        }
        fs::hard_link(out.join("real.parquet"), linked.join("hard.parquet")).unwrap();
        assert!(usage(&linked, &out), "a hard link into OUTPUT");
        fs::remove_file(linked.join("hard.parquet")).unwrap();
        fs::write(linked.join("own.parquet"), b"x").unwrap();
        assert!(Targets::resolve(&linked, &out).is_ok(), "an unrelated input");
        // A missing input is an I/O error, not a usage error.
        let e = Targets::resolve(&d.join("nope.parquet"), &d.join("o.parquet")).unwrap_err();
        assert!(matches!(e, LogError::Io { .. }), "{e}");
        fs::remove_dir_all(d).unwrap();
    }
}
