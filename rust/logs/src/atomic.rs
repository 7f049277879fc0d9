//! Output that appears whole or not at all.
//!
//! Everything is written under a hidden temporary name beside the target (same directory,
//! so the final rename stays on one filesystem), fsynced, and renamed over the target only
//! once complete; the parent directory is fsynced after the rename. A crash or `kill -9`
//! at any moment therefore leaves the earlier target as it was and never a partial file
//! under the target's name — at worst a hidden `.NAME.mpo-rs-*.tmp` left beside it. An
//! error or an early return removes the temporary (on drop).
//!
//! A *new* file — one no earlier output may stand in for, such as the next part of a
//! rollout log — is committed without replacing anything ([`StagedFile::commit_new`]): it
//! gets its name by a hard link, which fails where the name is taken, so a file the user
//! owns is never replaced, whoever made it meanwhile.
//!
//! A directory target is replaced by exchanging it atomically with the staged directory
//! (Linux `renameat2(RENAME_EXCHANGE)`), then deleting the old contents; where the
//! filesystem cannot exchange, the old directory is first moved aside.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::LogError;

/// Marker in every temporary name, so leftovers of a killed run are recognisable.
pub const TEMP_MARKER: &str = ".mpo-rs-";

/// A hidden sibling of `target` no other run uses.
fn temp_sibling(target: &Path, what: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "output".into());
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    parent_of(target).join(format!(".{name}{TEMP_MARKER}{}-{nanos}-{n}.{what}", std::process::id()))
}

/// The directory holding `path` (`.` for a bare name).
pub fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| LogError::io(dir, "cannot sync directory", e))
}

/// One output file being written under a temporary name.
#[derive(Debug)]
pub struct StagedFile {
    temp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl StagedFile {
    /// Creates the temporary file beside `target`.
    pub fn create(target: &Path) -> Result<(Self, File), LogError> {
        let temp = temp_sibling(target, "tmp");
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| LogError::io(target, "cannot create output", e))?;
        Ok((Self { temp, target: target.to_path_buf(), committed: false }, file))
    }

    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// Makes `file` (the one [`create`](Self::create) returned, fully written) durable
    /// and moves it over the target.
    pub fn commit(mut self, file: File) -> Result<(), LogError> {
        file.sync_all().map_err(|e| LogError::io(&self.target, "cannot sync output", e))?;
        drop(file);
        fs::rename(&self.temp, &self.target)
            .map_err(|e| LogError::io(&self.target, "cannot move output into place", e))?;
        self.committed = true;
        sync_dir(&parent_of(&self.target))
    }
}

impl StagedFile {
    /// Makes `file` (the one [`create`](Self::create) returned, fully written) durable and
    /// gives it the name `target` only where no file (nor link) has that name: a hard link,
    /// then the temporary removed and the directory fsynced. Returns false where `target`
    /// is taken, with nothing changed, so the caller may choose another name and call
    /// again. A kill before the link leaves the hidden temporary alone; after it, the
    /// whole file under `target` (and perhaps the temporary as a second, hidden name).
    pub fn commit_new(&mut self, file: &File, target: &Path) -> Result<bool, LogError> {
        if self.committed {
            return Err(LogError::Usage(format!("{} is already committed", self.target.display())));
        }
        file.sync_all().map_err(|e| LogError::io(target, "cannot sync output", e))?;
        match fs::hard_link(&self.temp, target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(LogError::io(target, "cannot move output into place", e)),
        }
        self.committed = true;
        self.target = target.to_path_buf();
        fs::remove_file(&self.temp).map_err(|e| LogError::io(&self.temp, "cannot remove temporary", e))?;
        sync_dir(&parent_of(target))?;
        Ok(true)
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// An output directory being filled under a temporary name. Files inside it need no
/// renames of their own: the whole directory appears at once.
#[derive(Debug)]
pub struct StagedDir {
    temp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl StagedDir {
    pub fn create(target: &Path) -> Result<Self, LogError> {
        let temp = temp_sibling(target, "tmpdir");
        fs::create_dir(&temp).map_err(|e| LogError::io(target, "cannot create output directory", e))?;
        Ok(Self { temp, target: target.to_path_buf(), committed: false })
    }

    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// Creates the file that will end up at `target/relative`.
    pub fn create_file(&self, relative: &Path) -> Result<(PathBuf, File), LogError> {
        let path = self.temp.join(relative);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| LogError::io(dir, "cannot create output directory", e))?;
        }
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| LogError::io(self.target.join(relative), "cannot create output", e))?;
        Ok((path, file))
    }

    /// Syncs the staged tree and puts it in place of the target. Each file must have been
    /// synced by its writer.
    pub fn commit(mut self) -> Result<(), LogError> {
        sync_tree(&self.temp)?;
        if fs::symlink_metadata(&self.target).is_ok() {
            replace_dir(&self.temp, &self.target)?;
            // `temp` now holds the previous output.
            let _ = fs::remove_dir_all(&self.temp);
        } else {
            fs::rename(&self.temp, &self.target)
                .map_err(|e| LogError::io(&self.target, "cannot move output into place", e))?;
        }
        self.committed = true;
        sync_dir(&parent_of(&self.target))
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.temp);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Report files: never written through a link.

/// The directory `dir/relative` (`relative`: plain names only), created as needed, where
/// no component below `dir` is a link: a symlink there (to a directory or to anything)
/// is replaced by a new, empty directory, never followed, so nothing outside the report
/// is written. `dir` itself is the caller's path and is created if missing.
pub fn output_subdir(dir: &Path, relative: &Path) -> Result<PathBuf, LogError> {
    fs::create_dir_all(dir).map_err(|e| LogError::io(dir, "cannot create output directory", e))?;
    let mut path = dir.to_path_buf();
    for part in relative.components() {
        let std::path::Component::Normal(name) = part else {
            return Err(LogError::Usage(format!(
                "output path {} must be relative to its directory, without `..` or `.`",
                relative.display()
            )));
        };
        path.push(name);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => continue,
            Ok(m) if m.file_type().is_symlink() => {
                fs::remove_file(&path).map_err(|e| LogError::io(&path, "cannot replace a link in the output", e))?
            }
            Ok(_) => {
                return Err(LogError::Usage(format!(
                    "{} is in the way of a directory of the output and is not one; remove it",
                    path.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io(&path, "cannot inspect output", e)),
        }
        match fs::create_dir(&path) {
            Ok(()) => {}
            // Another writer made it meanwhile; its kind is checked again below.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(LogError::io(&path, "cannot create output directory", e)),
        }
        if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            return Err(LogError::Usage(format!("{} changed while the output was written", path.display())));
        }
    }
    Ok(path)
}

/// Writes `data` to `dir/relative` whole or not at all and never through a link: its
/// directories are made by [`output_subdir`], the bytes go to a new temporary beside the
/// target (created exclusively: `O_CREAT | O_EXCL`, which never follows a link), and the
/// temporary is renamed over the target, which replaces a symlink there rather than
/// writing into what it points to. Returns the target's path.
pub fn write_output_file(dir: &Path, relative: &Path, data: &[u8]) -> Result<PathBuf, LogError> {
    let (Some(name), parent) = (relative.file_name(), relative.parent().unwrap_or(Path::new(""))) else {
        return Err(LogError::Usage(format!("output path {} does not name a file", relative.display())));
    };
    let target = output_subdir(dir, parent)?.join(name);
    if fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
        return Err(LogError::Usage(format!("{} is a directory, where the output writes a file", target.display())));
    }
    let (staged, mut file) = StagedFile::create(&target)?;
    io::Write::write_all(&mut file, data).map_err(|e| LogError::io(&target, "cannot write output", e))?;
    staged.commit(file)?;
    Ok(target)
}

fn sync_tree(dir: &Path) -> Result<(), LogError> {
    for entry in fs::read_dir(dir).map_err(|e| LogError::io(dir, "cannot list directory", e))? {
        let entry = entry.map_err(|e| LogError::io(dir, "cannot list directory", e))?;
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            sync_tree(&entry.path())?;
        }
    }
    sync_dir(dir)
}

/// Leaves `staged` at `target` and the previous `target` at `staged`.
fn replace_dir(staged: &Path, target: &Path) -> Result<(), LogError> {
    match exchange(staged, target) {
        Ok(()) => Ok(()),
        Err(_) => {
            // No atomic exchange here: move the old output aside first. A crash between
            // the two renames leaves the old output under the aside name, not lost.
            let aside = temp_sibling(target, "old");
            fs::rename(target, &aside).map_err(|e| LogError::io(target, "cannot move the previous output aside", e))?;
            fs::rename(staged, target).map_err(|e| LogError::io(target, "cannot move output into place", e))?;
            fs::rename(&aside, staged).map_err(|e| LogError::io(&aside, "cannot clear the previous output", e))
        }
    }
}

#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: both paths are valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::scratch;
    use std::io::Write;

    fn hidden_leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(TEMP_MARKER))
            .collect()
    }

    #[test]
    fn a_file_appears_only_on_commit_and_an_abandoned_one_leaves_nothing() {
        let d = scratch("file");
        let target = d.join("out.parquet");
        fs::write(&target, b"old").unwrap();
        let (staged, mut f) = StagedFile::create(&target).unwrap();
        f.write_all(b"new").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"old");
        staged.commit(f).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");

        let (staged, mut f) = StagedFile::create(&target).unwrap();
        f.write_all(b"partial").unwrap();
        drop((staged, f));
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert!(hidden_leftovers(&d).is_empty());
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_new_file_never_replaces_a_taken_name() {
        let d = scratch("new-file");
        let (taken, free) = (d.join("part-0.parquet"), d.join("part-1.parquet"));
        fs::write(&taken, b"theirs").unwrap();
        let (mut staged, mut f) = StagedFile::create(&taken).unwrap();
        f.write_all(b"ours").unwrap();
        assert!(!staged.commit_new(&f, &taken).unwrap());
        assert_eq!(fs::read(&taken).unwrap(), b"theirs");
        assert_eq!(hidden_leftovers(&d).len(), 1, "the temporary waits for another name");
        assert!(staged.commit_new(&f, &free).unwrap());
        assert_eq!(fs::read(&free).unwrap(), b"ours");
        assert!(staged.commit_new(&f, &d.join("part-2.parquet")).unwrap_err().is_usage());
        drop((staged, f));
        assert_eq!(fs::read(&free).unwrap(), b"ours", "a committed file stays on drop");
        assert!(hidden_leftovers(&d).is_empty());
        // A dangling symlink is a taken name too, and nothing is written through it.
        #[cfg(unix)]
        {
            let link = d.join("part-3.parquet");
            std::os::unix::fs::symlink(d.join("nowhere"), &link).unwrap();
            let (mut staged, f) = StagedFile::create(&link).unwrap();
            assert!(!staged.commit_new(&f, &link).unwrap());
            assert!(!d.join("nowhere").exists());
        }
        fs::remove_dir_all(d).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_report_file_replaces_a_link_and_never_writes_through_it() {
        let d = scratch("report-links");
        let (report, outside) = (d.join("report"), d.join("outside"));
        fs::create_dir_all(&report).unwrap();
        fs::write(&outside, b"precious").unwrap();
        std::os::unix::fs::symlink(&outside, report.join("share.png")).unwrap();
        write_output_file(&report, Path::new("share.png"), b"png").unwrap();
        assert_eq!(fs::read(&outside).unwrap(), b"precious");
        assert_eq!(fs::read(report.join("share.png")).unwrap(), b"png");
        assert!(!fs::symlink_metadata(report.join("share.png")).unwrap().file_type().is_symlink());
        // A directory link below the report is replaced by a directory, not followed.
        let elsewhere = d.join("elsewhere");
        fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, report.join("img")).unwrap();
        write_output_file(&report, Path::new("img/a.png"), b"a").unwrap();
        assert!(fs::read_dir(&elsewhere).unwrap().next().is_none());
        assert_eq!(fs::read(report.join("img/a.png")).unwrap(), b"a");
        // A dangling link is replaced too; `..` is refused.
        std::os::unix::fs::symlink(d.join("nowhere"), report.join("b.json")).unwrap();
        write_output_file(&report, Path::new("b.json"), b"{}").unwrap();
        assert!(!d.join("nowhere").exists());
        assert!(write_output_file(&report, Path::new("../x"), b"x").unwrap_err().is_usage());
        assert!(hidden_leftovers(&report).is_empty());
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_directory_replaces_the_previous_one_whole() {
        let d = scratch("dir");
        let target = d.join("out");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("stale.parquet"), b"old").unwrap();
        let staged = StagedDir::create(&target).unwrap();
        let (_, mut f) = staged.create_file(Path::new("sub/a.parquet")).unwrap();
        f.write_all(b"a").unwrap();
        f.sync_all().unwrap();
        assert!(target.join("stale.parquet").exists());
        staged.commit().unwrap();
        assert_eq!(fs::read(target.join("sub/a.parquet")).unwrap(), b"a");
        assert!(!target.join("stale.parquet").exists());
        assert!(hidden_leftovers(&d).is_empty());

        let staged = StagedDir::create(&d.join("never")).unwrap();
        drop(staged);
        assert!(!d.join("never").exists());
        assert!(hidden_leftovers(&d).is_empty());
        fs::remove_dir_all(d).unwrap();
    }
}
