//! INPUT and OUTPUT of a run: its Parquet files (found by [`crate::listing`]), each with
//! its output path. What may be written where, and which inputs alias each other or
//! OUTPUT, is decided by [`crate::safety`].

use std::path::{Path, PathBuf};

use crate::error::LogError;
use crate::safety;

// Re-exported where the crate has always named it.
pub use crate::listing::list_inputs;

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
    /// Checks the paths by the output-safety rule ([`crate::safety`]) and lists the
    /// inputs. Nothing is written.
    pub fn resolve(input: &Path, output: &Path) -> Result<Self, LogError> {
        Ok(match safety::check_run(input, output)? {
            None => Targets::File { input: input.to_path_buf(), output: output.to_path_buf() },
            Some(files) => Targets::Dir { input: input.to_path_buf(), output: output.to_path_buf(), files },
        })
    }

    /// (input path, output path relative to OUTPUT) of every file, in processing order.
    pub fn inputs(&self) -> Vec<(PathBuf, PathBuf)> {
        match self {
            Targets::File { input, .. } => vec![(input.clone(), PathBuf::new())],
            Targets::Dir { input, files, .. } => files.iter().map(|f| (input.join(f), f.clone())).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::test_util::{our_output, scratch};

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
        our_output(&out.join("real.parquet"));
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
