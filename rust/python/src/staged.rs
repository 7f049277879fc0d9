//! A new file written whole or not at all by a Python writer (`RolloutLogWriter`'s Parquet
//! parts, written by pyarrow): `mpo_logs::atomic::StagedFile`, the rule of the command
//! line, with its no-replace commit for new files. Python writes through the descriptor
//! [`StagedFile::fileno`] gives; Rust owns it, syncs it and names the file.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use mpo_logs::atomic;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::log_error;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<StagedFile>()
}

/// A new file being written under a hidden temporary name beside `target`
/// (`.NAME.mpo-rs-PID-NANOS-N.tmp`, created exclusively; readers skip hidden names). Write
/// it through `fileno()`, then `commit_new` gives it its final name without ever replacing
/// a file; `discard` (or dropping it uncommitted) removes the temporary. Dropped in a
/// process forked from the one that created it, it leaves the temporary alone: it is the
/// parent's.
#[pyclass(module = "mpo_rs._native")]
#[derive(Debug)]
pub struct StagedFile {
    staged: Option<(atomic::StagedFile, File)>,
    owner: u32,
}

impl StagedFile {
    fn open(&self) -> PyResult<&(atomic::StagedFile, File)> {
        self.staged.as_ref().ok_or_else(|| PyValueError::new_err("the staged file is committed or discarded"))
    }
}

#[pymethods]
impl StagedFile {
    #[new]
    fn new(target: PathBuf) -> PyResult<Self> {
        let staged = atomic::StagedFile::create(&target).map_err(log_error)?;
        Ok(Self { staged: Some(staged), owner: std::process::id() })
    }

    /// The temporary's path.
    #[getter]
    fn temp_path(&self) -> PyResult<PathBuf> {
        Ok(self.open()?.0.temp_path().to_path_buf())
    }

    /// The temporary's file descriptor, open for writing; it stays owned by this object
    /// (open it in Python with `closefd=False`).
    fn fileno(&self) -> PyResult<i32> {
        Ok(self.open()?.1.as_raw_fd())
    }

    /// Makes the written file durable and gives it the name `target` only where no file
    /// has that name (a hard link, never a replacement), then removes the temporary and
    /// syncs the directory. Returns False, with nothing changed, where `target` is taken:
    /// call again with another name. Python must have flushed what it wrote.
    fn commit_new(&mut self, py: Python<'_>, target: PathBuf) -> PyResult<bool> {
        let Some((mut staged, file)) = self.staged.take() else {
            return Err(PyValueError::new_err("the staged file is committed or discarded"));
        };
        let done = py.detach(|| staged.commit_new(&file, Path::new(&target)));
        match done {
            Ok(false) => {
                self.staged = Some((staged, file));
                Ok(false)
            }
            Ok(true) => Ok(true),
            Err(e) => Err(log_error(e)), // the temporary is removed (dropped uncommitted)
        }
    }

    /// Removes the temporary (idempotent; nothing after a commit).
    fn discard(&mut self) {
        self.staged = None;
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        if std::process::id() != self.owner {
            // A forked child: the temporary (and its name) belong to the parent.
            if let Some((staged, _file)) = self.staged.take() {
                std::mem::forget(staged);
            }
        }
    }
}
