//! Rule 2 of the output-safety rule ([`crate::safety`]): an output never is, contains or
//! lies inside an input, whether or not it exists yet, and no two inputs are one file.
//! Every writer calls [`refuse_aliasing`] before anything is written: `mpo-rs advantages`,
//! Ray's `advantages_parquet`, `mpo-rs diagnose -o` and `mpo-rs reproduce --out`; every
//! listing of inputs is checked by [`refuse_duplicate_inputs`].

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::error::LogError;

/// The canonical path `path` names, whether or not it exists yet: its longest existing
/// prefix with symlinks resolved, then the missing rest appended (`.` dropped, `..` taken
/// lexically: a component that does not exist yet is no link, and creating the parents
/// makes it a plain directory). A path whose parents do not exist yet is compared as the
/// path it will be once they are created.
pub fn canonical_target(path: &Path) -> Result<PathBuf, LogError> {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map_err(|e| LogError::io(path, "cannot resolve the output path", e))?.join(path)
    };
    let parts: Vec<Component<'_>> = absolute.components().collect();
    for existing in (1..=parts.len()).rev() {
        let prefix: PathBuf = parts[..existing].iter().collect();
        let base = match fs::canonicalize(&prefix) {
            Ok(base) => base,
            Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => continue,
            Err(e) => return Err(LogError::io(&prefix, "cannot resolve the output path", e)),
        };
        let mut target = base;
        for part in &parts[existing..] {
            match part {
                Component::ParentDir => {
                    target.pop();
                }
                Component::Normal(name) => target.push(name),
                _ => {}
            }
        }
        return Ok(target);
    }
    // Not even the root exists (cannot happen on a working system): compare lexically.
    Ok(absolute)
}

/// Refuses an `output` (named `label` in messages: "OUTPUT", "REPORT_DIR", "--out") that
/// is one of `inputs`, lies inside an input directory, or contains an input — compared
/// canonically ([`canonical_target`], so also before `output` or its parents exist) and,
/// where `output` exists, by (device, inode), which every name of a file or directory
/// shares (hard links, bind mounts). A missing input aliases nothing and is skipped (its
/// reader reports it).
pub fn refuse_aliasing(inputs: &[PathBuf], output: &Path, label: &str) -> Result<(), LogError> {
    let out_canon = canonical_target(output)?;
    let out_id = fs::metadata(output).ok().as_ref().and_then(file_id);
    let shown = output.display();
    for input in inputs {
        let meta = match fs::metadata(input) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(LogError::io(input, "cannot open input", e)),
        };
        let in_canon = fs::canonicalize(input).map_err(|e| LogError::io(input, "cannot open input", e))?;
        if in_canon == out_canon || out_id.is_some_and(|id| file_id(&meta) == Some(id)) {
            return Err(LogError::Usage(format!(
                "{label} {shown} is INPUT {}; write to a new path (inputs are never modified)",
                input.display()
            )));
        }
        if out_canon.starts_with(&in_canon) {
            return Err(LogError::Usage(format!(
                "{label} {shown} is inside the INPUT directory {}; choose a path outside it (inputs are never modified)",
                input.display()
            )));
        }
        if in_canon.starts_with(&out_canon) {
            return Err(LogError::Usage(format!(
                "INPUT {} is inside {label} {shown}; writing {label} could replace or delete it: \
                 choose a path that does not contain INPUT",
                input.display()
            )));
        }
    }
    Ok(())
}

/// (device, inode) of a file; `None` where the platform has no such identity.
#[cfg(unix)]
pub(crate) fn file_id(m: &fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((m.dev(), m.ino()))
}

#[cfg(not(unix))]
pub(crate) fn file_id(_: &fs::Metadata) -> Option<(u64, u64)> {
    None
}

/// Refuses a listing in which two entries are one file (a symlink or a hard link beside
/// its target, or two links to one file): it would be read twice. Compared by (device,
/// inode) where the platform has it, else by canonical path.
pub fn refuse_duplicate_inputs(files: &[PathBuf]) -> Result<(), LogError> {
    #[derive(PartialEq, Eq, Hash)]
    enum Identity {
        Inode(u64, u64),
        Path(PathBuf),
    }
    let mut seen: HashMap<Identity, &Path> = HashMap::with_capacity(files.len());
    for path in files {
        let meta = fs::metadata(path).map_err(|e| LogError::io(path, "cannot open input", e))?;
        let id = match file_id(&meta) {
            Some((dev, ino)) => Identity::Inode(dev, ino),
            None => Identity::Path(fs::canonicalize(path).map_err(|e| LogError::io(path, "cannot open input", e))?),
        };
        if let Some(first) = seen.insert(id, path) {
            return Err(LogError::Usage(format!(
                "INPUT files {} and {} are the same file (a symlink or a hard link); it would be read twice: \
                 remove one of them from INPUT",
                first.display(),
                path.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::scratch;

    fn refused(inputs: &[PathBuf], output: &Path) -> String {
        let e = refuse_aliasing(inputs, output, "OUTPUT").unwrap_err();
        assert!(e.is_usage(), "{e}");
        e.to_string()
    }

    #[test]
    fn an_output_that_does_not_exist_yet_is_compared_as_it_will_be() {
        let d = scratch("aliasing-missing");
        let input = d.join("in");
        fs::create_dir_all(&input).unwrap();
        let inputs = vec![input.clone()];
        assert!(refused(&inputs, &input.join("missing/new")).contains("inside the INPUT directory"));
        assert!(refused(&inputs, &d.join("x/../in/a/b")).contains("inside the INPUT directory"));
        assert!(refused(&inputs, &d.join("in/missing/..")).contains("is INPUT"));
        assert!(refused(&inputs, &d).contains("is inside OUTPUT"));
        assert!(refuse_aliasing(&inputs, &d.join("missing/new"), "OUTPUT").is_ok());
        assert!(refuse_aliasing(&inputs, &d.join("in2"), "OUTPUT").is_ok(), "a sibling sharing a prefix");
        #[cfg(unix)]
        {
            let link = d.join("link");
            std::os::unix::fs::symlink(&input, &link).unwrap();
            assert!(refused(&inputs, &link.join("missing/new")).contains("inside the INPUT directory"));
            assert!(refused(std::slice::from_ref(&link), &input).contains("is INPUT"));
        }
        assert!(refuse_aliasing(&[d.join("nope")], &d.join("nope/out"), "OUTPUT").is_ok(), "nothing to alias");
        fs::remove_dir_all(d).unwrap();
    }
}
