use super::*;
use crate::test_util::{our_output, parquet_with, raw_log, scratch};

fn usage(e: LogError) -> String {
    assert!(e.is_usage(), "{e}");
    e.to_string()
}

#[test]
fn a_dataset_output_must_be_new_or_empty_and_alias_no_input() {
    let d = scratch("safety-dataset");
    let logs = d.join("logs");
    fs::create_dir_all(&logs).unwrap();
    raw_log(&logs.join("a.parquet"));
    let inputs = vec![logs.clone()];
    assert!(check_dataset_output(&inputs, Some(&d.join("new"))).is_ok());
    assert!(check_dataset_output(&inputs, Some(&d.join("missing/parent/new"))).is_ok());
    fs::create_dir_all(d.join("empty")).unwrap();
    fs::write(d.join("empty/.hidden"), b"x").unwrap();
    assert!(check_dataset_output(&inputs, Some(&d.join("empty"))).is_ok());
    // Earlier outputs too: the new files would be read beside them.
    fs::create_dir_all(d.join("earlier")).unwrap();
    our_output(&d.join("earlier/part.parquet"));
    assert!(usage(check_dataset_output(&inputs, Some(&d.join("earlier"))).unwrap_err()).contains("not empty"));
    raw_log(&d.join("file.parquet"));
    assert!(usage(check_dataset_output(&inputs, Some(&d.join("file.parquet"))).unwrap_err()).contains("is a file"));
    assert!(usage(check_dataset_output(&inputs, Some(&logs)).unwrap_err()).contains("is INPUT"));
    assert!(usage(check_dataset_output(&inputs, Some(&logs.join("out"))).unwrap_err()).contains("inside the INPUT"));
    let inner = vec![logs.join("a.parquet")];
    assert!(usage(check_dataset_output(&inner, Some(&logs)).unwrap_err()).contains("is inside OUTPUT"));
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(logs.join("a.parquet"), d.join("link.parquet")).unwrap();
        let twice = vec![logs.clone(), d.join("link.parquet")];
        assert!(usage(check_dataset_output(&twice, Some(&d.join("new"))).unwrap_err()).contains("same file"));
    }
    fs::remove_dir_all(d).unwrap();
}

#[test]
fn outputs_are_recognised_by_their_appended_columns() {
    let d = scratch("safety-owner");
    our_output(&d.join("ours.parquet"));
    raw_log(&d.join("raw.parquet"));
    parquet_with(&d.join("reordered.parquet"), &["advantages", "returns", "turn_advantages", "turn_index"]);
    fs::write(d.join("junk.parquet"), b"PAR1 not parquet").unwrap();
    assert!(is_tool_output(&d.join("ours.parquet")).unwrap());
    assert!(!is_tool_output(&d.join("raw.parquet")).unwrap());
    assert!(!is_tool_output(&d.join("reordered.parquet")).unwrap());
    assert!(!is_tool_output(&d.join("junk.parquet")).unwrap());
    fs::remove_dir_all(d).unwrap();
}

#[test]
fn an_existing_output_file_is_replaced_only_if_it_is_ours() {
    let d = scratch("safety-file");
    let input = d.join("in.parquet");
    raw_log(&input);
    let out = d.join("out.parquet");
    our_output(&out);
    assert!(check_run(&input, &out).is_ok());
    raw_log(&out);
    let m = usage(check_run(&input, &out).unwrap_err());
    assert!(m.contains("out.parquet is not an output of mpo-rs advantages") && m.contains("remove it"), "{m}");
    fs::write(&out, b"precious").unwrap();
    usage(check_run(&input, &out).unwrap_err());
    #[cfg(unix)]
    {
        // A symlink to nothing is not a path to write through.
        let dangling = d.join("dangling.parquet");
        std::os::unix::fs::symlink(d.join("nowhere"), &dangling).unwrap();
        assert!(usage(check_run(&input, &dangling).unwrap_err()).contains("symlink to nothing"));
    }
    fs::remove_dir_all(d).unwrap();
}

#[cfg(target_os = "linux")] // (libc is a dependency on Linux only)
#[test]
fn a_fifo_or_a_device_output_is_refused_without_being_opened() {
    let d = scratch("safety-special");
    let input = d.join("in.parquet");
    raw_log(&input);
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(fifo.as_os_str())).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // (Opening the FIFO for reading would block: the test returning shows it was not.)
    let m = usage(check_run(&input, &fifo).unwrap_err());
    assert!(m.contains("is a FIFO, not a regular file or a directory"), "{m}");
    let link = d.join("link-to-fifo.parquet");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    assert!(usage(check_run(&input, &link).unwrap_err()).contains("a FIFO"));
    let dev_null = Path::new("/dev/null");
    if fs::metadata(dev_null).is_ok() {
        let m = usage(check_run(&input, dev_null).unwrap_err());
        assert!(m.contains("is a character device"), "{m}");
        use std::os::unix::fs::FileTypeExt;
        assert!(fs::metadata(dev_null).unwrap().file_type().is_char_device());
    }
    // Report directories follow the same rule.
    assert!(
        usage(check_report_dir(&fifo, ReportTool::Diagnose, true, "REPORT_DIR", &[]).unwrap_err()).contains("a FIFO")
    );
    fs::remove_dir_all(d).unwrap();
}

#[test]
fn an_output_directory_is_replaced_only_if_it_holds_only_our_outputs() {
    let d = scratch("safety-dir");
    let input = d.join("in");
    fs::create_dir_all(&input).unwrap();
    raw_log(&input.join("a.parquet"));
    let out = d.join("out");
    fs::create_dir_all(out.join("part=1")).unwrap();
    assert!(check_run(&input, &out).is_ok(), "an empty directory");
    our_output(&out.join("a.parquet"));
    our_output(&out.join("part=1/b.parquet"));
    fs::write(out.join("_SUCCESS"), b"").unwrap();
    fs::write(out.join(".a.parquet.mpo-rs-1-2-3.tmp"), b"partial").unwrap();
    assert!(check_run(&input, &out).is_ok(), "earlier outputs");
    raw_log(&out.join("part=1/precious_raw.parquet"));
    let m = usage(check_run(&input, &out).unwrap_err());
    assert!(m.contains("precious_raw.parquet, which is not an output of mpo-rs advantages"), "{m}");
    assert!(m.contains("refusing to replace it"), "{m}");
    fs::remove_file(out.join("part=1/precious_raw.parquet")).unwrap();
    fs::write(out.join("notes.txt"), b"mine").unwrap();
    assert!(usage(check_run(&input, &out).unwrap_err()).contains("notes.txt, which is not Parquet output"));
    fs::remove_dir_all(d).unwrap();
}

#[test]
fn two_names_of_one_input_file_are_refused() {
    let d = scratch("safety-dup");
    let input = d.join("in");
    fs::create_dir_all(&input).unwrap();
    raw_log(&input.join("a.parquet"));
    fs::hard_link(input.join("a.parquet"), input.join("b.parquet")).unwrap();
    let m = usage(list_inputs(&input).unwrap_err());
    assert!(m.contains("a.parquet and ") && m.contains("b.parquet are the same file"), "{m}");
    assert!(check_run(&input, &d.join("out")).unwrap_err().is_usage(), "a hard link");
    fs::remove_file(input.join("b.parquet")).unwrap();
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(input.join("a.parquet"), input.join("b.parquet")).unwrap();
        assert!(usage(list_inputs(&input).unwrap_err()).contains("are the same file"), "a symlink");
        assert!(check_run(&input, &d.join("out")).unwrap_err().is_usage());
        fs::remove_file(input.join("b.parquet")).unwrap();
    }
    raw_log(&input.join("b.parquet"));
    assert_eq!(list_inputs(&input).unwrap().len(), 2, "two files with equal contents are two inputs");
    fs::remove_dir_all(d).unwrap();
}

#[test]
fn report_directories_are_claimed_through_their_marker() {
    let d = scratch("safety-report");
    let dir = d.join("report");
    let claim = |tool, config, overwrite| claim_report_dir(&dir, tool, config, overwrite, "REPORT_DIR", &[]);
    // A new directory (parents created), then again by the same tool.
    assert_eq!(claim_report_dir(&dir.join("sub"), ReportTool::Diagnose, None, false, "REPORT_DIR", &[]).unwrap(), None);
    fs::remove_dir_all(dir.join("sub")).unwrap();
    assert_eq!(claim(ReportTool::Reproduce, Some("abc123"), false).unwrap(), None, "an empty directory");
    fs::write(dir.join("results.json"), b"{}").unwrap();
    assert_eq!(read_marker(&dir).unwrap(), Some(Marker { tool: "reproduce".into(), config: Some("abc123".into()) }));
    assert_eq!(claim(ReportTool::Reproduce, Some("def456"), false).unwrap().as_deref(), Some("abc123"));
    assert_eq!(check_report_dir(&dir, ReportTool::Reproduce, false, "--out", &[]).unwrap().as_deref(), Some("def456"));
    // Another tool's directory, or one without a marker, is refused unless asked for.
    let m = usage(claim(ReportTool::Diagnose, None, false).unwrap_err());
    assert!(m.contains("is the output of mpo-rs reproduce, not of mpo-rs diagnose"), "{m}");
    fs::remove_file(dir.join(MARKER)).unwrap();
    let m = usage(check_report_dir(&dir, ReportTool::Reproduce, false, "--out", &[]).unwrap_err());
    assert!(m.starts_with("--out ") && m.contains("results.json") && m.contains("not written by"), "{m}");
    fs::write(dir.join(MARKER), b"tool: reproduce\n").unwrap();
    usage(check_report_dir(&dir, ReportTool::Reproduce, false, "--out", &[]).unwrap_err());
    assert_eq!(claim(ReportTool::Diagnose, None, true).unwrap(), None, "overwrite");
    assert_eq!(read_marker(&dir).unwrap().unwrap().tool, "diagnose");
    assert_eq!(fs::read(dir.join("results.json")).unwrap(), b"{}", "claiming deletes nothing");
    // A file is not a directory; a bad configuration id is refused before anything.
    fs::write(d.join("file"), b"keep").unwrap();
    let m = usage(check_report_dir(&d.join("file"), ReportTool::Diagnose, true, "REPORT_DIR", &[]).unwrap_err());
    assert!(m.contains("is a file, and a report is a directory"), "{m}");
    let fresh = d.join("fresh");
    for bad in ["", "two words", "line\nbreak"] {
        usage(claim_report_dir(&fresh, ReportTool::Reproduce, Some(bad), false, "--out", &[]).unwrap_err());
    }
    assert!(!fresh.exists());
    usage(ReportTool::from_name("advantages").unwrap_err());
    assert_eq!(read_marker(&d.join("file")).unwrap(), None);
    fs::remove_dir_all(d).unwrap();
}
