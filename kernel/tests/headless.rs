//! `gpumem-kernel run` on small notebooks: real evcxr, the real gpumem-nb crate loaded with
//! `:dep`, the control channel, per-cell reports and magics.
//!
//! They run the kernel as a user does: no `EVCXR_TMPDIR`, so evcxr builds in the kernel's own
//! directory (`~/.cache/gpumem-kernel/evcxr`, outside any workspace); gpumem-nb compiles there
//! the first time (minutes) and later runs reuse it.

mod common;

use common::{
    CELL_MIME, errors, fresh_dir, notebook, notices, outputs, path_crate, records, repo_root, result_text, run,
};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

/// Every allocation of the notebook's process, whoever makes it, in each cell's record: on the
/// simulated device a driver allocation past the caching allocator (what candle or cuBLAS do on
/// a GPU) shows as `all_allocations` after − before, and a temporary one as the cell's peak.
#[test]
fn every_allocation_is_in_the_cell_record() {
    let nb = notebook(&[
        (":dep gpumem-nb", &[]),
        ("let d = gpumem_nb::mem::driver_alloc_mib(100)?;", &[]),
        ("let t = gpumem_nb::mem::driver_alloc_mib(300)?;\ndrop(t);", &[]),
        (
            "use gpumem_nb::{DeviceBuffer, StreamId};\nlet keep = DeviceBuffer::<u8>::zeros(&gpumem_nb::current()?, 64 << 20, StreamId::DEFAULT)?;",
            &[],
        ),
        ("%gpumem export all.csv", &[]),
    ]);
    let (code, out, stderr) = run("all", &nb, &[]);
    assert_eq!(code, 0, "{stderr}");
    let mib = 1u64 << 20;
    let all = |i: usize| records(&out, i)[0]["all_allocations"].clone();
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("not a byte count: {v}"));

    let a = all(1);
    assert_eq!(a["tracking"], "simulated", "{a}");
    assert_eq!(n(&a["after"]) - n(&a["before"]), 100 * mib, "{a}");
    assert!(n(&a["peak"]) >= 100 * mib);
    let driver = a["by_source"].as_array().unwrap().iter().find(|s| s["source"] == "driver").unwrap();
    assert_eq!(driver["delta"], 100 * mib);
    assert!(a["top"][0]["bytes"] == 100 * mib && a["top"][0]["owner"].as_str().is_some_and(|o| !o.is_empty()), "{a}");

    let b = all(2);
    assert_eq!(n(&b["after"]), n(&b["before"]), "made and dropped: no change\n{b}");
    assert_eq!(n(&b["peak"]) - n(&b["before"]), 300 * mib, "the peak is exactly the temporary\n{b}");

    let c = all(3);
    let r = &records(&out, 3)[0]["allocator"]["reserved"];
    assert_eq!(n(&c["after"]) - n(&c["before"]), n(&r["after"]) - n(&r["before"]), "allocator blocks count too\n{c}");
    // The report line leads with it.
    let line = outputs(&out, 1)
        .iter()
        .find_map(|o| o["data"]["text/plain"].as_str().filter(|t| t.starts_with("[")))
        .unwrap_or_default();
    assert!(line.contains(" · gpumem-nb 100 MiB (+100 MiB)"), "who holds it leads the line: {line}");
    assert!(!line.contains("allocated"), "no figures of an allocator the cell did not use: {line}");
    let owners = a["by_owner"].as_array().unwrap();
    assert_eq!(owners.len(), 1, "{a}");
    assert_eq!(
        (owners[0]["owner"].as_str(), n(&owners[0]["after"]) - n(&owners[0]["before"])),
        (Some("gpumem-nb"), 100 * mib)
    );
    // Tracked from the first cell, before the crate was ever used.
    assert_eq!(all(0)["tracking"], "simulated", "{}", all(0));
    // The export carries it.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nb-all");
    let csv = std::fs::read_to_string(dir.join("all.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = header.iter().position(|h| *h == "all_after").unwrap();
    let row2: Vec<&str> = csv.lines().nth(2).unwrap().split(',').collect();
    assert_eq!(row2[col].parse::<u64>().unwrap(), n(&a["after"]), "{csv}");
}

/// A notebook that never names gpumem-nb: every cell is tracked from the first (the kernel's own
/// copy of the crate watches the notebook's process from its start), and the line names no
/// allocator the notebook did not use.
#[test]
fn a_notebook_without_gpumem_nb_is_tracked_from_its_first_cell() {
    let nb = notebook(&[
        (
            "let v = vec![1u8; 1 << 20];
v.len()",
            &[],
        ),
        ("println!(\"{}\", v.len());", &[]),
    ]);
    let (code, out, stderr) = run("nodep", &nb, &[]);
    assert_eq!(code, 0, "{stderr}");
    for i in 0..2 {
        let rec = &records(&out, i)[0];
        assert_eq!(rec["all_allocations"]["tracking"], "simulated", "cell {i}: {rec}");
        assert_eq!(rec["crate_loaded"]["before"], true, "cell {i}: the kernel's copy served it before the cell");
        assert!(rec["allocator"].is_null(), "cell {i}: {rec}");
        let line = rec_line(&out, i);
        assert!(line.ends_with(" · no device memory"), "cell {i}: {line}");
        assert!(!line.contains("allocator") && !line.contains(":dep"), "cell {i}: {line}");
    }
}

/// The report line of the code cell at `i`.
fn rec_line(out: &Value, i: usize) -> String {
    outputs(out, i)
        .iter()
        .find_map(|o| o["data"]["text/plain"].as_str().filter(|t| t.starts_with('[')).map(str::to_string))
        .unwrap_or_default()
}

/// One allocator state across cells under real evcxr: each cell is its own shared object with
/// its own copy of the crate's statics, so this holds only through the crate's process-wide
/// anchor. Also: the crate's numbers reach the kernel's report over the control channel.
#[test]
fn one_allocator_state_across_cells_and_exact_reports() {
    let root = repo_root();
    let dep = format!(":dep gpumem-nb = {{ path = {:?} }}", root.to_str().unwrap());
    let nb = notebook(&[
        (&dep, &[]),
        (
            "use gpumem_nb::{DeviceBuffer, StreamId};\nlet keep = DeviceBuffer::<u8>::zeros(&gpumem_nb::current()?, 64 << 20, StreamId::DEFAULT)?;\ngpumem_nb::current()?.memory_allocated()",
            &[],
        ),
        ("let unrelated = 40 + 2;\nunrelated", &[]),
        ("gpumem_nb::current()?.memory_allocated()", &[]),
        ("drop(keep);\ngpumem_nb::current()?.memory_allocated()", &[]),
        ("%gpumem history\n%gpumem export history.csv", &[]),
        // Stack depths set in one cell hold in the next (each cell is its own library).
        ("gpumem_nb::current()?.set_stack_depth(5);\ngpumem_nb::tracking::set_stack_depth(7);", &[]),
        ("(gpumem_nb::current()?.stack_depth(), gpumem_nb::tracking::stack_depth())", &[]),
        // The freed 64 MiB are cached: a cell of the magic alone gives them back, and is measured.
        ("%gpumem trim", &[]),
    ]);
    let (code, out, stderr) = run("state", &nb, &[]);
    assert_eq!(result_text(&out, 7), "(5, 7)", "the depths one cell set are the next cell's (defaults: 12, 32)");
    assert_eq!(code, 0, "{stderr}");
    let mib64 = (64u64 << 20).to_string();
    assert_eq!(result_text(&out, 1), mib64, "cell 2 allocates");
    assert_eq!(result_text(&out, 2), "42");
    assert_eq!(result_text(&out, 3), mib64, "a later cell sees the same allocator (process-wide anchor)\n{stderr}");
    assert_eq!(result_text(&out, 4), "0", "dropping it brings the stats back down");

    // Reports: one per code cell that ran code, with the crate's exact numbers.
    for i in 0..5 {
        assert_eq!(records(&out, i).len(), 1, "cell {i}: one report\n{stderr}");
    }
    let r2 = records(&out, 1)[0];
    assert_eq!(r2["crate_loaded"]["after"], true, "the crate connected during cell 2: {r2}");
    assert_eq!(r2["allocator"]["allocated"]["after"], 64u64 << 20);
    assert_eq!(r2["allocator"]["backend"], "simulated");
    let r4 = records(&out, 3)[0];
    assert_eq!(r4["allocator"]["allocated"]["before"], 64u64 << 20);
    assert_eq!(r4["allocator"]["allocated"]["after"], 64u64 << 20);
    assert_eq!(r4["allocator"]["peak_is_cell"], true);
    let r5 = records(&out, 4)[0];
    assert_eq!(r5["allocator"]["allocated"]["after"], 0);
    assert!(
        outputs(&out, 4)
            .iter()
            .any(|o| o["data"]["text/plain"].as_str().is_some_and(|t| t.contains("allocated 0 B (-64.0 MiB)"))),
        "the report line says what the cell freed"
    );
    // History and export (magics-only cell: no report of its own).
    assert!(records(&out, 5).is_empty());
    let hist = outputs(&out, 5).iter().find_map(|o| o["data"]["text/html"].as_str()).unwrap();
    assert!(hist.contains("[2]") && hist.contains("+64.00\u{a0}MiB") && hist.contains("-64.00\u{a0}MiB"), "{hist}");
    let csv = std::fs::read_to_string(Path::new(env!("CARGO_TARGET_TMPDIR")).join("nb-state/history.csv")).unwrap();
    assert_eq!(csv.lines().count(), 6, "{csv}");

    // `%gpumem trim`: its figures are the allocator's own before and after, as the cell's
    // record reads them around it, and the record's line shows what was given back.
    let trim = records(&out, 8);
    assert_eq!(trim.len(), 1, "a trim cell is measured\n{stderr}");
    let figures = outputs(&out, 8)
        .iter()
        .find_map(|o| o["data"].get("application/vnd.gpumem.trim+json").cloned())
        .unwrap_or_else(|| panic!("the trim's figures: {:?}", outputs(&out, 8)));
    let rows = figures["trimmed"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "one allocator, no CUDA pool on the simulated device: {figures}");
    let (row, reserved) = (&rows[0], &trim[0]["allocator"]["reserved"]);
    assert_eq!((row["owner"].as_str(), row["device"].as_str()), (Some("gpumem-nb"), Some("simulated:0")));
    assert_eq!(row["reserved_before"], reserved["before"], "{figures}\n{}", trim[0]);
    assert_eq!(row["reserved_after"], reserved["after"], "{figures}\n{}", trim[0]);
    let given = reserved["before"].as_u64().unwrap() - reserved["after"].as_u64().unwrap();
    assert!(given >= 64 << 20, "the freed 64 MiB went back: {figures}");
    assert_eq!(row["in_use"], 0, "nothing was in use");
    let line = rec_line(&out, 8);
    assert!(line.contains("reserved") && line.contains("(-"), "the line shows the change: {line}");
}

/// Magics that talk to the crate: record, labels, snapshot, the cell magic's timeline, summary,
/// budget; bad magics; a panic; an abort followed by a working cell.
#[test]
fn magics_snapshots_and_restarts() {
    let nb = notebook(&[
        (":dep gpumem-nb = \"0.1\"", &[]),
        ("use gpumem_nb::{DeviceBuffer, StreamId};\nlet alloc = gpumem_nb::current()?;\nalloc.memory_allocated()", &[]),
        (
            "%gpumem record on --max-entries 1000\n%gpumem budget 16MiB\nlet a = DeviceBuffer::<u8>::zeros(&alloc, 32 << 20, StreamId::DEFAULT)?;",
            &[],
        ),
        ("%gpumem snapshot snap\nlet still_runs = 1;", &[]),
        (
            "%%gpumem --timeline --snapshot cellsnap\nfor i in 1..4 { let _t = DeviceBuffer::<u8>::zeros(&alloc, i << 20, StreamId::DEFAULT)?; }",
            &[],
        ),
        ("%gpumem summary", &[]),
        ("panic!(\"boom\")", &["raises-exception"]),
        ("std::process::abort()", &["raises-exception"]),
        ("gpumem_nb::current()?.memory_allocated()", &[]),
        ("%gpumem history\n%gpumem plot", &[]),
        ("%gpumem off\nlet quiet = 1;", &[]),
        ("%gpumem on", &[]),
        (":restart", &[]),
        ("gpumem_nb::current()?.memory_allocated()", &[]),
        ("%gpumem reset\n%gpumem history", &[]),
        ("%gpumem export /proc/no/such/dir/h.csv\n%gpumem snapshot /proc/no/such/dir", &[]),
        ("unsafe { std::ptr::null_mut::<u8>().write_volatile(1) };", &["raises-exception"]),
        ("gpumem_nb::current()?.memory_allocated()", &[]),
        ("%gpumem bogus\nlet never: u8 = \"compiled\";", &["raises-exception"]),
    ]);
    let (code, out, stderr) = run("magics", &nb, &[]);
    assert_eq!(code, 0, "{stderr}");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nb-magics");

    // Budget warning on the 32 MiB cell.
    let r3 = records(&out, 2)[0];
    assert!(r3["warnings"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().starts_with("over budget")), "{r3}");

    // Snapshot: files written, JSON re-read, allocations labelled with their cell.
    for f in ["snapshot.pickle", "snapshot.json", "trace_plot.html"] {
        assert!(dir.join("snap").join(f).is_file(), "{f}\n{stderr}");
    }
    let snap: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("snap/snapshot.json")).unwrap()).unwrap();
    let text = snap.to_string();
    assert!(text.contains("\"cell 3\""), "allocations of cell 3 carry its label");
    // A bad magic fails its cell before anything runs (its code would not even compile): one
    // error naming the line, with the usage.
    let errors: Vec<&Value> = outputs(&out, 18).iter().filter(|o| o["output_type"] == "error").collect();
    assert_eq!(errors.len(), 1, "{:?}", outputs(&out, 18));
    assert_eq!(errors[0]["ename"], "UsageError");
    assert!(errors[0]["evalue"].as_str().unwrap().contains("unknown verb `bogus` (line 1"), "{}", errors[0]);
    assert!(errors[0]["traceback"].to_string().contains("usage: %gpumem"), "{}", errors[0]);
    assert!(records(&out, 18).is_empty(), "nothing ran, nothing to report");

    // Cell magic: a timeline SVG and a snapshot of that cell.
    let svg = outputs(&out, 4).iter().find_map(|o| o["data"]["image/svg+xml"].as_str());
    assert!(svg.is_some_and(|s| s.contains("<svg")), "{:?}", outputs(&out, 4));
    assert!(dir.join("cellsnap/snapshot.pickle").is_file());
    // Summary.
    let summary = outputs(&out, 5).iter().find_map(|o| o["data"]["text/plain"].as_str()).unwrap();
    assert!(summary.contains("PyTorch CUDA memory summary"), "{summary}");
    // Panic: the kernel survives; abort: the child restarts, the next cell works, history kept.
    // A panic is the cell's error (what Jupyter gets too), its report still the last output.
    assert_eq!(records(&out, 6)[0]["status"], "panicked");
    let outs = outputs(&out, 6);
    let error = outs.iter().position(|o| o["output_type"] == "error").expect("the panic is an error");
    assert_eq!((outs[error]["ename"].as_str(), outs[error]["evalue"].as_str()), (Some("panic"), Some("boom")));
    assert!(outs.last().unwrap()["data"].get(CELL_MIME).is_some(), "the report comes last: {outs:?}");
    assert!(!outs.iter().any(|o| o["name"] == "stderr"), "the panic's text is in the error, not on stderr: {outs:?}");
    let r8 = records(&out, 7)[0];
    assert_eq!(r8["restarted"], true, "{r8}");
    assert!(outputs(&out, 7).iter().any(|o| o["output_type"] == "error"));
    assert_eq!(result_text(&out, 8), "0", "fresh child, fresh allocator");
    let r9 = records(&out, 8)[0];
    assert_eq!(r9["crate_loaded"]["after"], true, "the new child registered again: {r9}");
    let hist = outputs(&out, 9).iter().find_map(|o| o["data"]["text/plain"].as_str()).unwrap();
    assert!(hist.contains("8 cells") && hist.contains("child restarted"), "{hist}");
    assert!(outputs(&out, 9).iter().any(|o| o["data"]["image/svg+xml"].as_str().is_some_and(|s| s.contains("<svg"))));
    // off: measured but not shown; on again; :restart is a restart the report names.
    assert!(records(&out, 10).is_empty(), "{:?}", outputs(&out, 10));
    let r13 = records(&out, 12)[0];
    assert_eq!((r13["restarted"].as_bool(), r13["restart_reason"].as_str()), (Some(true), Some("restart requested")));
    assert_eq!(records(&out, 13)[0]["crate_loaded"]["after"], true, "registered again after :restart");
    let hist = outputs(&out, 14).iter().find_map(|o| o["data"]["text/plain"].as_str()).unwrap();
    assert!(hist.contains("0 cells this session"), "{hist}");
    // Unwritable paths: one line each (with the usage), the kernel carries on.
    let err: String =
        outputs(&out, 15).iter().filter(|o| o["name"] == "stderr").map(|o| o["text"].as_str().unwrap()).collect();
    assert!(err.contains("export: cannot write /proc/no/such/dir/h.csv"), "{err}");
    assert!(err.contains("snapshot to /proc/no/such/dir"), "{err}");
    // A segfault: the child restarts, the next cell works and registers again.
    let r = records(&out, 16)[0];
    assert_eq!(r["restarted"], true, "{r}");
    assert_eq!(result_text(&out, 17), "0");
    assert_eq!(records(&out, 17)[0]["crate_loaded"]["after"], true);
}

/// A failing cell that is not tagged `raises-exception` fails the run.
#[test]
fn unexpected_error_fails_the_run() {
    let nb = notebook(&[("let x: u32 = \"no\";", &[]), ("1 + 1", &[])]);
    let (code, out, stderr) = run("fail", &nb, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(outputs(&out, 0).iter().any(|o| o["output_type"] == "error" && o["ename"] == "CompilationError"));
    assert!(outputs(&out, 1).is_empty(), "stops at the first failure");
    assert!(stderr.contains("1 failed"), "{stderr}");
}

/// A cell whose code returns `Err` (through `?`, an out-of-memory error among them) or whose
/// value is an `Err` is an error: `ename`/`evalue` from the error, the record's status and the
/// history's notes say so, the report line flags the out-of-memory with its size (no
/// `--on-oom` asked), and an untagged one stops the run.
#[test]
fn errors_the_code_returns_fail_the_cell() {
    let nb = notebook(&[
        (":dep gpumem-nb", &[]),
        ("let alloc = gpumem_nb::current()?;", &[]),
        (
            "fn check(x: i32) -> Result<i32, String> { if x > 0 { Ok(x) } else { Err(\"my own error\".into()) } }\ncheck(-1)?;",
            &["raises-exception"],
        ),
        (
            "use gpumem_nb::{DeviceBuffer, StreamId};\nlet big = DeviceBuffer::<u8>::zeros(&alloc, 1 << 40, StreamId::DEFAULT)?;",
            &["raises-exception"],
        ),
        ("let r: Result<u32, String> = Err(\"bad input\".into());\nr", &["raises-exception"]),
        ("alloc.memory_allocated()", &[]),
        ("%gpumem history", &[]),
    ]);
    let (code, out, stderr) = run("errs", &nb, &[("GPUMEM_NB_DEVICE", "sim:8GiB")]);
    assert_eq!(code, 0, "{stderr}");
    let error = |i: usize| -> Value {
        outputs(&out, i)
            .iter()
            .find(|o| o["output_type"] == "error")
            .cloned()
            .unwrap_or_else(|| panic!("cell {i}: {:?}", outputs(&out, i)))
    };
    let e = error(2);
    assert_eq!((e["ename"].as_str(), e["evalue"].as_str()), (Some("Error"), Some("my own error")), "{e}");
    let e = error(3);
    assert_eq!(e["ename"], "OutOfMemoryError", "{e}");
    assert!(e["evalue"].as_str().unwrap().starts_with("CUDA out of memory. Tried to allocate 1024.00 GiB"), "{e}");
    let r = records(&out, 3)[0];
    assert_eq!(r["status"], "oom", "{r}");
    let line = outputs(&out, 3).iter().rev().find_map(|o| o["data"]["text/plain"].as_str()).unwrap();
    assert!(line.contains("✗ out of memory: asked for 1024.00 GiB"), "in the error's own unit: {line}");
    assert!(line.chars().count() <= 120, "{} characters: {line}", line.chars().count());
    assert_eq!(records(&out, 2)[0]["status"], "error");
    let e = error(4);
    assert_eq!((e["ename"].as_str(), e["evalue"].as_str()), (Some("Error"), Some("\"bad input\"")), "{e}");
    assert_eq!(result_text(&out, 5), "0", "the session goes on after the errors");
    let hist = outputs(&out, 6).iter().find_map(|o| o["data"]["text/html"].as_str()).unwrap();
    assert!(hist.contains(">OOM") && hist.contains(">error"), "{hist}");

    // Untagged, an `Err` stops the run there, as a panic does.
    let nb = notebook(&[("let r: Result<(), String> = Err(\"stop\".into());\nr?;", &[]), ("1 + 1", &[])]);
    let (code, out2, stderr) = run("errs-stop", &nb, &[]);
    assert_eq!(code, 1, "{stderr}");
    let e = outputs(&out2, 0).iter().find(|o| o["output_type"] == "error").cloned().unwrap();
    assert_eq!(e["evalue"], "stop", "{e}");
    assert!(outputs(&out2, 1).is_empty(), "stops at the first failure");
}

#[test]
fn subcommands_take_help() {
    for sub in ["install", "run"] {
        let o = Command::new(env!("CARGO_BIN_EXE_gpumem-kernel")).args([sub, "--help"]).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{sub} --help: {}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).contains("USAGE"), "{sub} --help");
    }
}

/// Without a Rust toolchain (no `cargo`/`rustc` on PATH or in `~/.cargo/bin`, as on a machine
/// where only the wheel was installed) the kernel says in one line what to install; with rustup's
/// directory missing from PATH only (a Jupyter started from a desktop), it finds it there.
#[test]
fn a_missing_toolchain_says_what_to_install() {
    let dir = fresh_dir("no-toolchain");
    let nb = dir.join("one.ipynb");
    std::fs::write(&nb, notebook(&[("1 + 1", &[])]).to_string()).unwrap();
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_gpumem-kernel"))
        .args(["run", nb.to_str().unwrap()])
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let line = err.lines().find(|l| l.contains("no Rust toolchain")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("https://sh.rustup.rs") && line.contains("--component rust-src"), "{line}");
    assert!(line.contains("then restart the kernel"), "{line}");
}

/// `:dep gpumem-nb` is the crate the kernel was built with: a version it does not satisfy is one
/// error line naming both (the cell fails, the kernel carries on), a bare one loads it.
#[test]
fn dep_gpumem_nb_is_the_kernels_own() {
    let nb = notebook(&[
        (":dep gpumem-nb = \"0.2\"", &["raises-exception"]),
        (":dep gpumem-nb", &[]),
        ("gpumem_nb::VERSION", &[]),
    ]);
    let (code, out, stderr) = run("dep", &nb, &[]);
    assert_eq!(code, 0, "{stderr}");
    let err = outputs(&out, 0).iter().find(|o| o["output_type"] == "error").expect("an error output");
    assert_eq!(err["ename"], "DependencyError");
    let evalue = err["evalue"].as_str().unwrap();
    let own = env!("CARGO_PKG_VERSION");
    assert!(
        evalue.contains("\"0.2\"") && evalue.contains(&format!("gpumem-nb {own}")) && !evalue.contains('\n'),
        "{evalue}"
    );
    assert_eq!(result_text(&out, 2), format!("\"{own}\""));
}

/// A cell that compiles dependencies says how far it has come on `run`'s console: here a fresh
/// build directory (outside any workspace) and a dependency of a few crates, built from scratch.
#[test]
fn compile_progress_on_the_console() {
    let fresh = tempfile::Builder::new().prefix("gpumem-kernel-test-progress-").tempdir().unwrap();
    let nb = notebook(&[(":dep serde_json = \"1\"\nserde_json::json!({\"a\": 1}).to_string()", &[])]);
    let (code, out, stderr) = run("progress", &nb, &[("EVCXR_TMPDIR", fresh.path().to_str().unwrap())]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(result_text(&out, 0), "\"{\\\"a\\\":1}\"");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("[1] compiling")).collect();
    assert!(!lines.is_empty(), "no progress line:\n{stderr}");
    let counts: Vec<(usize, usize)> = lines
        .iter()
        .filter_map(|l| {
            let rest = l.split("compiling dependencies: ").nth(1)?;
            let (built, rest) = rest.split_once(" of ")?;
            Some((built.parse().ok()?, rest.split(' ').next()?.parse().ok()?))
        })
        .collect();
    assert!(!counts.is_empty(), "{lines:?}");
    assert!(counts.iter().all(|&(b, t)| b < t && t >= 3 && t == counts[0].1), "{counts:?}");
    assert!(counts.windows(2).all(|w| w[0].0 <= w[1].0), "never backwards: {counts:?}");
}

/// `%gpumem diff` of two snapshot directories and of two cells' states (rebuilt from the
/// recorded history), a refused cell diff that history does not cover, and `%gpumem snapshot
/// --on-oom`: a cell running out of memory writes a snapshot then, and its report says why.
#[test]
fn diffs_and_out_of_memory_snapshots() {
    let nb = notebook(&[
        (":dep gpumem-nb", &[]),
        (
            "%gpumem record on --stacks\n%gpumem snapshot --on-oom oom\nuse gpumem_nb::{DeviceBuffer, StreamId};\nlet alloc = gpumem_nb::current()?;",
            &[],
        ),
        ("let a = DeviceBuffer::<u8>::zeros(&alloc, 8 << 20, StreamId::DEFAULT)?;", &[]),
        ("%gpumem snapshot snap-a", &[]),
        ("let b = DeviceBuffer::<u8>::zeros(&alloc, 16 << 20, StreamId::DEFAULT)?;\ndrop(a);", &[]),
        ("%gpumem snapshot snap-b\n%gpumem diff snap-a snap-b\n%gpumem diff 3 5\n%gpumem diff 1 now", &[]),
        ("let huge = DeviceBuffer::<u8>::zeros(&alloc, 9 << 30, StreamId::DEFAULT)?;", &["raises-exception"]),
        ("b.len()", &[]),
    ]);
    let (code, out, stderr) = run("diff", &nb, &[]);
    assert_eq!(code, 0, "{stderr}");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nb-diff");
    let texts: Vec<String> =
        outputs(&out, 5).iter().filter_map(|o| o["data"]["text/plain"].as_str().map(str::to_string)).collect();
    let files = texts.iter().find(|t| t.starts_with("memory diff /")).unwrap_or_else(|| panic!("{texts:?}"));
    let cells = texts.iter().find(|t| t.starts_with("memory diff after cell 3 → after cell 5")).expect("cells' diff");
    for d in [files, cells] {
        assert!(d.contains("appeared 1 (16.00 MiB)") && d.contains("disappeared 1 (8.00 MiB)"), "{d}");
        assert!(d.contains("cell 3") && d.contains("cell 5"), "labels from the history: {d}");
        assert!(d.contains("+8.00 MiB"), "{d}");
    }
    let html =
        outputs(&out, 5).iter().find_map(|o| o["data"]["text/html"].as_str().filter(|h| h.contains("memory diff")));
    assert!(html.is_some_and(|h| h.contains("<table")), "{html:?}");
    let err: String =
        outputs(&out, 5).iter().filter(|o| o["name"] == "stderr").map(|o| o["text"].as_str().unwrap()).collect();
    assert!(err.contains("diff: a cell's state is rebuilt from the recorded history"), "{err}");

    // Out of memory: the cell failed, its report says why and where the snapshot is.
    let r = records(&out, 6)[0];
    let oom = &r["oom"];
    assert_eq!(oom["requested"], 9u64 << 30, "{r}");
    assert!(oom["why"].as_str().unwrap().starts_with("out of memory on device 0: asked for 9.00 GiB"), "{oom}");
    assert!(oom["why"].as_str().unwrap().contains("fragmentation"), "{oom}");
    let page = oom["files"]["html"].as_str().unwrap();
    assert!(page.starts_with(dir.join("oom/cell-7").to_str().unwrap()) && Path::new(page).is_file(), "{oom}");
    let snap: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("oom/cell-7/snapshot.json")).unwrap()).unwrap();
    assert!(snap.to_string().contains("\"oom\""), "the failure is in the snapshot's history");
    let line = outputs(&out, 6).iter().find_map(|o| o["data"]["text/plain"].as_str().filter(|t| t.starts_with("[7]")));
    assert!(
        line.is_some_and(|l| l.contains("✗ out of memory: asked for 9.00 GiB") && l.contains("snapshot then:")),
        "{line:?}"
    );
    // kernel/README.md ("Out of memory") shows this line.
    eprintln!("out-of-memory line: {}", line.unwrap_or_default());
    let summary =
        outputs(&out, 6).iter().find_map(|o| o["data"]["text/html"].as_str().filter(|h| h.contains("gpumem-report")));
    assert!(summary.is_some_and(|h| h.contains("href=\"oom/cell-7/trace_plot.html\"")), "{summary:?}");
    assert_eq!(result_text(&out, 7), (16u64 << 20).to_string(), "the kernel carries on");
    assert!(records(&out, 7)[0].get("oom").is_none(), "a later cell has no failure of its own");
}

/// The tour itself (notebooks/tour.ipynb, as users run it) on the simulated device: its
/// `%gpumem explain` adds up to the allocator's reserved bytes and says what the next cell's
/// `empty_cache()` returns; its `%gpumem fit 1GiB` fits under every policy with the numbers
/// the session's allocations imply, and `gpumem_nb::plan::fit(512 MiB)` names the cell that fails.
#[test]
fn the_tour_explains_reserved_memory_and_plans_a_fit() {
    let root = repo_root();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nb-tour");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("tour.ipynb");
    let o = Command::new(env!("CARGO_BIN_EXE_gpumem-kernel"))
        .args(["run", root.join("notebooks/tour.ipynb").to_str().unwrap(), "--output", out.to_str().unwrap()])
        .env("GPUMEM_NB_DEVICE", "sim:8GiB")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let nb: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let cells = nb["cells"].as_array().unwrap();
    let find = |src: &str| cells.iter().position(|c| c["source"].as_str().is_some_and(|s| s.starts_with(src))).unwrap();
    let json_of = |i: usize| -> Value {
        outputs(&nb, i)
            .iter()
            .find_map(|o| {
                o["data"]
                    .get("application/vnd.gpumem.explain+json")
                    .or(o["data"].get("application/vnd.gpumem.fit+json"))
                    .cloned()
            })
            .unwrap_or_else(|| panic!("cell {i} shows no JSON: {:?}", outputs(&nb, i)))
    };
    let mib = 1u64 << 20;

    // %gpumem explain: the parts add up to the reserved bytes of the cell before's record.
    let e = find("%gpumem explain");
    let parts = &json_of(e)["parts"];
    let n = |k: &str| parts[k].as_u64().unwrap();
    let cached: u64 = parts["cached"].as_array().unwrap().iter().map(|c| c["bytes"].as_u64().unwrap()).sum();
    assert_eq!(n("requested") + n("rounding") + n("pending_free") + cached, n("reserved"), "{parts}");
    let temporary = records(&nb, find("// A temporary"))[0];
    assert_eq!(n("reserved"), temporary["allocator"]["reserved"]["after"].as_u64().unwrap());
    assert_eq!(n("requested") + n("rounding"), temporary["allocator"]["allocated"]["after"].as_u64().unwrap());
    assert_eq!(temporary["allocator"]["explain"], *parts, "the temporary cell's record has the same split");
    // x (256 MiB) and y (32 MiB) from sections 3 and 4, keep (1 + 2 + 3 + 4 MiB) from section 7.
    assert_eq!(n("requested"), (256 + 32 + 10) * mib);
    assert!(n("releasable") >= 256 * mib, "the temporary's segment is whole and free: {parts}");
    let text = outputs(&nb, e).iter().find_map(|o| o["data"]["text/plain"].as_str()).unwrap();
    assert!(text.contains("empty_cache() returns") && text.contains("= reserved"), "{text}");
    // The next cell's empty_cache() returns what explain said, and its record agrees.
    let ec = find("let before = alloc.memory_reserved();");
    assert_eq!(result_text(&nb, ec), n("releasable").to_string());
    let rec = records(&nb, ec)[0];
    let delta = rec["allocator"]["reserved"]["after"].as_i64().unwrap()
        - rec["allocator"]["reserved"]["before"].as_i64().unwrap();
    assert_eq!(-delta, n("releasable") as i64);
    // Every cell's record carries the split too.
    let ex = &rec["allocator"]["explain"];
    assert_eq!(ex["reserved"], rec["allocator"]["reserved"]["after"], "{ex}");
    assert_eq!(ex["releasable"], 0, "just emptied");

    // %gpumem fit 1GiB: fits under every policy; the live peak is what the session held at
    // once: x and y (made before recording: placed first), keep, and the 256 MiB temporary.
    let plan = json_of(find("%gpumem fit 1GiB"));
    assert_eq!(plan["device_bytes"], 1024 * mib);
    assert_eq!(plan["live_peak"], (256 + 32 + 10 + 256) * mib, "{plan}");
    assert_eq!(plan["before_recording"], serde_json::json!([2, (256 + 32) * mib]));
    let policies = plan["policies"].as_array().unwrap();
    let names: Vec<&str> = policies.iter().map(|p| p["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["default", "expandable", "compact"]);
    for p in policies {
        assert_eq!(p["fits"], true, "{p}");
        let min = p["min_device_bytes"].as_u64().unwrap();
        assert!(min >= (256 + 32 + 10 + 256) * mib && min <= 1024 * mib && min % (2 * mib) == 0, "{p}");
    }
    let label_of = |src: &str| format!("cell {}", cells[find(src)]["execution_count"]);
    let (timeline_label, temp_label) = (label_of("%%gpumem --timeline"), label_of("// A temporary"));
    let labels: Vec<&str> = plan["cells"].as_array().unwrap().iter().map(|c| c["label"].as_str().unwrap()).collect();
    for l in ["before recording", timeline_label.as_str(), temp_label.as_str()] {
        assert!(labels.contains(&l), "{l}: {labels:?}");
    }
    // gpumem_nb::plan::fit from code, on 512 MiB: the temporary's cell is where it fails.
    let lib = find("gpumem_nb::plan::fit(512 << 20)?");
    let text = outputs(&nb, lib)
        .iter()
        .find_map(|o| o["data"]["text/plain"].as_str())
        .unwrap_or_else(|| panic!("{:?}", outputs(&nb, lib)));
    assert!(text.contains(&format!("{temp_label}: ")) && text.contains("no ("), "{text}");
    assert!(!text.contains("yes"), "no policy fits 512 MiB: {text}");
    assert!(text.contains("Not modelled: the CUDA context"), "{text}");
}

/// README's "Reading the numbers" shows a cell's code and its line: the line is what that code's
/// cell shows (all but its wall time).
#[test]
fn the_readme_line_is_what_its_cell_shows() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let section = &readme[readme.find("## Reading the numbers").expect("the section")..];
    let block = |fence: &str| -> String {
        let start = section.find(fence).unwrap_or_else(|| panic!("no {fence} block")) + fence.len();
        section[start..][..section[start..].find("\n```").unwrap()].trim().to_string()
    };
    let (code, shown) = (block("```rust\n"), block("```text\n"));
    let nb = notebook(&[(":dep gpumem-nb", &[]), (&code, &[])]);
    let (status, out, stderr) = run("readme-line", &nb, &[]);
    assert_eq!(status, 0, "{stderr}");
    let line = outputs(&out, 1)
        .iter()
        .find_map(|o| o["data"]["text/plain"].as_str().filter(|t| t.starts_with("[2] ")))
        .unwrap_or_else(|| panic!("no line: {:?}", outputs(&out, 1)))
        .to_string();
    fn but_time(l: &str) -> Vec<&str> {
        l.split(" · ").enumerate().filter(|(i, _)| *i != 1).map(|(_, p)| p).collect()
    }
    assert_eq!(but_time(&shown), but_time(&line), "README shows:\n{shown}\nthe cell shows:\n{line}");
}

/// `%gpumem record on` in the cell whose code first uses the device (the crate connects in the
/// middle of that cell): that cell's allocations are recorded, and `fit` plans from them.
/// So is `--on-oom` there: its out of memory is caught.
#[test]
fn settings_of_the_first_cell_apply_to_its_own_code() {
    let nb = notebook(&[
        (":dep gpumem-nb", &[]),
        (
            "%gpumem record on\n%gpumem snapshot --on-oom oom\nlet alloc = gpumem_nb::current()?;\nlet k = gpumem_nb::DeviceBuffer::<u8>::zeros(&alloc, 32 << 20, gpumem_nb::StreamId::DEFAULT)?;\nlet big = gpumem_nb::DeviceBuffer::<u8>::zeros(&alloc, 1 << 40, gpumem_nb::StreamId::DEFAULT);\nbig.is_err()",
            &[],
        ),
        ("%gpumem fit 1GiB", &[]),
    ]);
    let (code, out, stderr) = run("first-cell-settings", &nb, &[]);
    assert_eq!(code, 0, "{stderr}");
    let rec = records(&out, 1)[0];
    assert!(rec["oom"]["requested"] == json!(1u64 << 40), "the OOM watch was armed: {rec}");
    let fit = outputs(&out, 2);
    assert!(
        fit.iter().any(|o| o["data"].get("application/vnd.gpumem.fit+json").is_some()),
        "fit planned from the first cell's recording: {fit:?}"
    );
}

/// `%gpumem fit` says what the peak is made of: each component live at the requested peak (a
/// stamped temporary that came and went counts there, not at the end), the allocator's rounding
/// and cache, the CUDA context, and the smallest card of the usual sizes.
#[test]
fn fit_shows_the_peak_by_component_and_the_smallest_card() {
    let nb = notebook(&[
        (":dep gpumem-nb", &[]),
        (
            "%gpumem record on\nuse gpumem_nb::{Component, DeviceBuffer, StreamId, components};\n\
             let w = gpumem_nb::component(Component::Parameter, || gpumem_nb::mem::driver_alloc_mib(48))?;",
            &[],
        ),
        (
            "let s = gpumem_nb::component(Component::OptimizerState, || DeviceBuffer::<u8>::zeros(&gpumem_nb::current()?, 96 << 20, StreamId::DEFAULT))?;",
            &[],
        ),
        (
            "{\n    let _t = components::enter(Component::Temp);\n    let t = gpumem_nb::mem::driver_alloc_mib(200)?;\n    drop(t);\n}",
            &[],
        ),
        ("%gpumem fit 20GiB", &[]),
        ("%gpumem history", &[]),
        ("%gpumem plot", &[]),
    ]);
    let (code, out, stderr) = run("fit-components", &nb, &[]);
    assert_eq!(code, 0, "{stderr}");
    let fit = outputs(&out, 4);
    let plan = fit
        .iter()
        .find_map(|o| o["data"].get("application/vnd.gpumem.fit+json"))
        .unwrap_or_else(|| panic!("no plan: {fit:?}\n{stderr}"));
    let mib = 1u64 << 20;
    let c = &plan["components"];
    assert_eq!(c["parameter"]["at_peak"], json!(48 * mib), "{c}");
    assert_eq!(c["optimizer_state"]["at_peak"], json!(96 * mib), "{c}");
    assert_eq!((c["temp"]["at_peak"].clone(), c["temp"]["end"].clone()), (json!(200 * mib), json!(0)), "{c}");
    let text = fit.iter().filter_map(|o| o["data"]["text/plain"].as_str()).collect::<String>();
    assert!(text.contains("what the peak is made of"), "{text}");
    let row = |name: &str| text.lines().find(|l| l.contains(name)).unwrap_or_else(|| panic!("no {name}: {text}"));
    assert!(row("optimizer_state").contains("96.00 MiB"), "{text}");
    // Driver allocations of whole 2 MiB and a block of the allocator's own size: no rounding.
    assert!(row("rounding and cache").contains(" 0 B "), "{text}");
    assert!(row("CUDA context and modules").contains("not measured") || row("CUDA context").contains("NVML"));
    assert!(row("smallest card").contains("16 GB (margin"), "{text}");
    // The history has one `what` column: each cell's largest components live after it; the plot
    // stacks them.
    let text = |i: usize| outputs(&out, i).iter().filter_map(|o| o["data"]["text/plain"].as_str()).collect::<String>();
    let history = text(5);
    let header =
        history.lines().find(|l| l.contains("cell") && l.contains("what")).unwrap_or_else(|| panic!("{history}"));
    assert!(!header.contains("optimizer_state") && !header.contains("parameter"), "one column: {header}");
    let third = history.lines().find(|l| l.contains("[3]")).unwrap_or_else(|| panic!("{history}"));
    assert!(third.contains("optimizer_state 96.00 MiB, parameter 48.00 MiB"), "largest first: {third}");
    let plot = text(6);
    assert!(plot.contains("optimizer_state (after) (stacked): "), "{plot}");
    assert!(plot.contains("stacked together: max"), "{plot}");
}

/// One copy of a `:dep` crate for the session: a `static` counter bumped from three cells reads
/// 1, 2, 3 (evcxr alone links a copy into each cell: 1, 1, 1), and the crate uses `libc` and
/// `cfg-if` (crates that use `core` directly, which evcxr's own dylib mode cannot build). A crate
/// that cannot be loaded that way (its library is named otherwise than its package) is said in
/// one line that names it, and its cells still run, linked per cell; `:allow_static_linking 1`
/// turns the mechanism off for later `:dep`s. A `:dep` whose features make cargo build a loaded
/// generation again restarts the process, said in one line (the alternative is a cell that
/// fails to load: `dlopen failed`).
/// A crate's counter in a static: one copy for the session counts on from cell to cell.
const BUMP: &str = "use std::sync::atomic::{AtomicUsize, Ordering};\n\
                    static COUNT: AtomicUsize = AtomicUsize::new(0);\n\
                    pub fn bump() -> usize { COUNT.fetch_add(1, Ordering::SeqCst) + 1 }\n";

#[test]
fn dependencies_are_loaded_once_for_the_session() {
    let dir = fresh_dir("session-deps");
    let counter = path_crate(
        &dir,
        "counter",
        "[dependencies]\nlibc = \"0.2\"\ncfg-if = \"1\"\n",
        &format!(
            "{BUMP}cfg_if::cfg_if! {{\n    if #[cfg(unix)] {{\n        pub fn pid() -> i32 {{ unsafe {{ libc::getpid() }} }}\n    \
             }} else {{\n        pub fn pid() -> i32 {{ 0 }}\n    }}\n}}\n"
        ),
    );
    let other = path_crate(&dir, "other-name", "[lib]\nname = \"othername\"\n", BUMP);
    let later = path_crate(&dir, "later", "", "pub fn answer() -> u32 { 42 }\n");
    // Asks `libc` for a feature the first generation built it without: cargo builds that
    // generation again, which the process already holds.
    let extra = path_crate(
        &dir,
        "extra",
        "[dependencies]\nlibc = { version = \"0.2\", features = [\"extra_traits\"] }\n",
        "pub fn one() -> u32 { 1 }\n",
    );
    let dep = |name: &str, p: &Path| format!(":dep {name} = {{ path = {:?} }}", p.display().to_string());
    let cells = [
        format!("{}\ncounter::bump()", dep("counter", &counter)),
        "counter::bump()".to_string(),
        "assert_eq!(counter::pid() as u32, std::process::id());\ncounter::bump()".to_string(),
        format!("{}\nextra::one()", dep("extra", &extra)),
        "counter::bump()".to_string(),
        format!("{}\nothername::bump()", dep("other-name", &other)),
        "othername::bump()".to_string(),
        format!(":allow_static_linking 1\n{}\nlater::answer()", dep("later", &later)),
        "counter::bump()".to_string(),
    ];
    let cells: Vec<(&str, &[&str])> = cells.iter().map(|c| (c.as_str(), &[][..])).collect();
    let (code, out, stderr) = run("session-deps", &notebook(&cells), &[]);
    assert_eq!(code, 0, "{stderr}");
    let results: Vec<String> = (0..cells.len()).map(|i| result_text(&out, i)).collect();
    assert_eq!(results, ["1", "2", "3", "1", "1", "1", "1", "42", "2"], "one counter for the session: {stderr}");
    let notices = |i: usize| -> String {
        outputs(&out, i)
            .iter()
            .filter(|o| o["output_type"] == "display_data" && o["data"].get(CELL_MIME).is_none())
            .filter_map(|o| o["data"]["text/plain"].as_str())
            .collect()
    };
    assert!(!notices(0).contains("cannot be loaded"), "{}", notices(0));
    // The rebuilt generation: said, the process restarted (the counter starts again), and the
    // cells after it load (no `dlopen failed`).
    let rebuilt = notices(3);
    assert!(rebuilt.starts_with("gpumem-kernel: adding extra built counter again"), "{rebuilt}");
    assert_eq!(records(&out, 3)[0]["restart_reason"], "session dependencies rebuilt");
    let fallback = notices(5);
    assert_eq!(fallback.lines().count(), 1, "{fallback}");
    assert!(
        fallback.starts_with("gpumem-kernel: other-name cannot be loaded once for the session (")
            && fallback.contains("statics are per cell"),
        "{fallback}"
    );
    assert!(notices(7).contains("linked into each cell"), "{}", notices(7));
    // The generation is a crate of its own, named by what it holds, in the shared directory.
    let src = outputs(&out, 0).iter().filter_map(|o| o["text"].as_str()).collect::<String>();
    assert!(!src.contains("gpumem_deps_"), "the loading cell is the kernel's, not shown: {src}");
}

/// The first generation links with the cell that declares it (one build). When that cell fails
/// to build for its own code, its `:dep` goes with it (as in evcxr) and the cell written again
/// loads it (the next cells share one counter); when the generation cannot be one library, the
/// cell runs without it, and says so.
#[test]
fn a_first_dependency_links_with_its_cell_whatever_the_cell_does() {
    let dir = fresh_dir("first-link");
    let counter = path_crate(&dir, "counter", "", BUMP);
    let other = path_crate(&dir, "other-name", "[lib]\nname = \"othername\"\n", "pub fn one() -> u32 { 1 }\n");
    let dep = |name: &str, p: &Path| format!(":dep {name} = {{ path = {:?} }}", p.display().to_string());
    let first = format!("{}\nlet wrong: u32 = \"text\";", dep("counter", &counter));
    let again = format!("{}\ncounter::bump()", dep("counter", &counter));
    let cells: Vec<(&str, &[&str])> =
        vec![(first.as_str(), &["raises-exception"][..]), (again.as_str(), &[]), ("counter::bump()", &[])];
    let (code, out, stderr) = run("first-link", &notebook(&cells), &[]);
    assert_eq!(code, 0, "{stderr}");
    let first_out = serde_json::to_string(outputs(&out, 0)).unwrap();
    assert!(!errors(&out, 0).is_empty() && first_out.contains("mismatched types"), "the cell's own error: {first_out}");
    assert_eq!([result_text(&out, 1), result_text(&out, 2)], ["1", "2"], "one counter for the session: {stderr}");

    let fallback = format!("{}\nothername::one()", dep("other-name", &other));
    let (code, out, stderr) = run("first-link-fallback", &notebook(&[(fallback.as_str(), &[])]), &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(result_text(&out, 0), "1", "the cell ran without the generation: {stderr}");
    let said = notices(&out, 0).join("\n");
    assert!(said.contains("other-name cannot be loaded once for the session"), "{said}");
}

/// A `tracing` subscriber set in one cell serves the next ones, as in a program: `tracing`
/// keeps its global dispatcher in a static, which evcxr alone copies into every cell (the
/// second cell's events went nowhere, evcxr#331). Two cells later a new `:dep` adds a
/// generation over the loaded one, and the subscriber still hears the cell after it.
#[test]
fn a_tracing_subscriber_set_in_one_cell_serves_the_next() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tracing-deps");
    let _ = std::fs::remove_dir_all(&dir);
    let later = path_crate(&dir, "later", "", "pub fn answer() -> u32 { 42 }\n");
    let later_cell = format!(
        ":dep later = {{ path = {:?} }}\ntracing::warn!(cell = 3, answer = later::answer(), \"after a new :dep\");",
        later.display().to_string()
    );
    let nb = notebook(&[
        (
            ":dep tracing = \"0.1\"\n:dep tracing-subscriber = \"0.3\"\n\
             tracing_subscriber::fmt().with_ansi(false).without_time().with_writer(std::io::stdout).init();\n\
             tracing::info!(cell = 1, \"subscriber set\");",
            &[],
        ),
        ("tracing::info!(cell = 2, \"heard in the next cell\");\ntracing::dispatcher::has_been_set()", &[]),
        (&later_cell, &[]),
    ]);
    let (code, out, stderr) = run("tracing-across-cells", &nb, &[]);
    assert_eq!(code, 0, "{stderr}");
    let stdout = |i: usize| -> String {
        outputs(&out, i).iter().filter(|o| o["name"] == "stdout").filter_map(|o| o["text"].as_str()).collect()
    };
    assert!(stdout(0).contains("INFO") && stdout(0).contains("subscriber set cell=1"), "{:?}", outputs(&out, 0));
    assert!(stdout(1).contains("heard in the next cell cell=2"), "the second cell's event: {:?}", outputs(&out, 1));
    assert_eq!(result_text(&out, 1), "true");
    assert!(
        stdout(2).contains("WARN") && stdout(2).contains("after a new :dep cell=3 answer=42"),
        "{:?}",
        outputs(&out, 2)
    );
}

/// What memory is, through the kernel's record: a rule of the notebook's own on a function it
/// defines (parameter), a stamp around a closure (optimizer_state, on the allocator's blocks), a
/// guard on a thread the cell starts (gradient), nothing (other), and the allocator's cached
/// free memory; per place, the components add up to every tracked byte, before and after each
/// cell. A stamp ends with the panic that unwinds it.
#[test]
fn every_tracked_byte_has_a_component() {
    let nb = notebook(&[
        (":dep gpumem-nb", &[]),
        (
            "use gpumem_nb::{Component, DeviceBuffer, StreamId, components};\n\
             components::add_rule(\"load_weights\", Component::Parameter)?;\n\
             fn load_weights(mib: u64) -> gpumem_nb::Result<gpumem_nb::mem::DriverBuffer> {\n    gpumem_nb::mem::driver_alloc_mib(mib)\n}",
            &[],
        ),
        ("let w = load_weights(48)?;", &[]),
        (
            "let state = gpumem_nb::component(Component::OptimizerState, || {\n    DeviceBuffer::<u8>::zeros(&gpumem_nb::current()?, 96 << 20, StreamId::DEFAULT)\n})?;",
            &[],
        ),
        (
            "let g = std::thread::spawn(|| {\n    let _g = components::enter(Component::Gradient);\n    gpumem_nb::mem::driver_alloc_mib(16)\n}).join().unwrap()?;",
            &[],
        ),
        ("let misc = gpumem_nb::mem::driver_alloc_mib(8)?;", &[]),
        ("drop(state);", &[]),
        ("let _t = components::enter(Component::Temp);\npanic!(\"inside a stamp\");", &["raises-exception"]),
        ("let later = gpumem_nb::mem::driver_alloc_mib(4)?;\ncomponents::current()", &[]),
        ("gpumem_nb::tracking::top(5)", &[]),
        ("%gpumem snapshot snaps", &[]),
        (
            "let huge = DeviceBuffer::<u8>::zeros(&gpumem_nb::current()?, 1 << 40, StreamId::DEFAULT)?;",
            &["raises-exception"],
        ),
        (
            "{
    let _t = components::enter(Component::Temp);
    let a = gpumem_nb::mem::driver_alloc_mib(32)?;
    drop(a);
                 let b = DeviceBuffer::<u8>::zeros(&gpumem_nb::current()?, 24 << 20, StreamId::DEFAULT)?;
    drop(b);
}
             let kept = gpumem_nb::component(Component::Activation, || gpumem_nb::mem::driver_alloc_mib(2))?;",
            &[],
        ),
    ]);
    let (_, out, stderr) = run("components", &nb, &[]);
    let mib = 1u64 << 20;
    let parts = |i: usize| -> (Value, std::collections::BTreeMap<String, (Option<u64>, u64)>) {
        let all =
            records(&out, i).first().unwrap_or_else(|| panic!("cell {i}: no record\n{stderr}"))["all_allocations"]
                .clone();
        let m = all["by_component"]
            .as_array()
            .unwrap_or_else(|| panic!("cell {i}: no by_component: {all}"))
            .iter()
            .map(|c| {
                (c["component"].as_str().unwrap().to_string(), (c["before"].as_u64(), c["after"].as_u64().unwrap()))
            })
            .collect();
        (all, m)
    };
    for i in 2..=8 {
        let (all, m) = parts(i);
        let after: u64 = m.values().map(|v| v.1).sum();
        assert_eq!(Some(after), all["after"].as_u64(), "cell {i}: the components add up to every byte: {all}");
        if i > 2 {
            let before: u64 = m.values().map(|v| v.0.unwrap()).sum();
            assert_eq!(Some(before), all["before"].as_u64(), "cell {i}: and before the cell: {all}");
        }
    }
    let delta = |i: usize, c: &str| parts(i).1.get(c).map_or(0, |v| v.1 as i64 - v.0.unwrap_or(0) as i64);
    let live = |i: usize, c: &str| parts(i).1.get(c).map_or(0, |v| v.1);
    assert_eq!(delta(2, "parameter"), 48 * mib as i64, "the notebook's own rule: {:?}", parts(2).1);
    assert_eq!(delta(3, "optimizer_state"), 96 * mib as i64, "the stamp on the allocator's block: {:?}", parts(3).1);
    assert_eq!(delta(4, "gradient"), 16 * mib as i64, "a guard on the cell's own thread: {:?}", parts(4).1);
    assert_eq!(delta(5, "other"), 8 * mib as i64, "no stamp, no rule: {:?}", parts(5).1);
    assert_eq!((live(5, "parameter"), live(5, "gradient")), (48 * mib, 16 * mib), "kept: {:?}", parts(5).1);
    assert_eq!(delta(6, "optimizer_state"), -96 * (mib as i64), "{:?}", parts(6).1);
    assert_eq!(delta(6, "cached"), 96 * mib as i64, "the freed block stays cached: {:?}", parts(6).1);
    assert_eq!(delta(8, "other"), 4 * mib as i64, "the panic ended the stamp: {:?}", parts(8).1);
    assert_eq!(result_text(&out, 8), "None");
    // `top` says what each site's memory is.
    let top = result_text(&out, 9);
    let row = top.lines().find(|l| l.contains("load_weights")).unwrap_or_else(|| panic!("{top}"));
    assert!(top.contains("what") && row.contains("parameter") && top.contains("gradient"), "{top}");
    // A snapshot says it with each stack, as a frame of its own (what PyTorch's viewer lists).
    let snap =
        std::fs::read_to_string(Path::new(env!("CARGO_TARGET_TMPDIR")).join("nb-components/snaps/snapshot.json"))
            .unwrap_or_else(|e| panic!("{e}\n{stderr}"));
    for c in ["parameter", "gradient"] {
        assert!(snap.contains(&format!("component {c}")), "{c} not in the snapshot's frames");
    }
    // An out-of-memory failure says what the memory in use was.
    let why = records(&out, 11)[0]["oom"]["why"].as_str().unwrap_or_default().to_string();
    assert!(why.contains("in use: parameter 48.00 MiB, gradient 16.00 MiB, other"), "{why}");
    // Each component's highest point in the cell, from the order of its changes: a temporary
    // driver allocation and then a block of the allocator, both freed before the cell ended.
    let peak = |i: usize, c: &str| {
        let all = &records(&out, i)[0]["all_allocations"];
        all["by_component"].as_array().and_then(|v| v.iter().find(|x| x["component"] == c)).map(|x| x["peak"].clone())
    };
    assert_eq!(peak(12, "temp"), Some(Value::from(32 * mib)), "{}", records(&out, 12)[0]["all_allocations"]);
    assert_eq!(peak(12, "activation"), Some(Value::from(2 * mib)));
    assert_eq!(peak(12, "gradient"), Some(Value::from(16 * mib)), "untouched: its bytes");
    assert_eq!(peak(3, "optimizer_state"), Some(Value::from(96 * mib)), "a block of the allocator");
    assert_eq!(peak(12, "cached"), Some(Value::Null), "the cache has no peak of its own");
    // What outlived the code that made it: the activation kept by cell 12, with its site.
    let kept = records(&out, 12)[0]["all_allocations"]["kept"].clone();
    let row = kept.as_array().and_then(|v| v.iter().find(|k| k["component"] == "activation")).cloned();
    let row = row.unwrap_or_else(|| panic!("no kept activation: {kept}"));
    let this = records(&out, 12)[0]["cell"].as_u64();
    assert_eq!((row["bytes"].as_u64(), row["cell"].as_u64()), (Some(2 * mib), this), "made by that cell: {row}");
    assert!(
        !kept.as_array().unwrap().iter().any(|k| k["component"] == "parameter"),
        "only activations and temps: {kept}"
    );
    // The line says what the memory is, largest first.
    let line = outputs(&out, 5)
        .iter()
        .find_map(|o| o["data"]["text/plain"].as_str().filter(|t| t.starts_with("[")))
        .unwrap_or_default()
        .to_string();
    assert!(line.contains(" · what: optimizer_state 96.0 MiB, …") && line.chars().count() <= 120, "{line}");
}

/// Many ranks, one view: a cell starts two worker processes with `std::process::Command`, one per
/// rank (`RANK=0` / `RANK=1`, as candle's multi-process examples start one per GPU), each holding
/// memory on the simulated device (`gpumem-demo hold`). The cell's record lists each with its
/// rank, its device and its bytes (what the simulated process table holds for its pid), and
/// `%gpumem ranks` shows both ranks, their min / max / mean / sum and the rank holding the most;
/// `%gpumem ranks 1` that cell's processes one by one; a cell not in the history is one line.
#[test]
fn ranks_a_cell_starts_are_one_view() {
    let demo = common::demo_binary();
    let table = fresh_dir("ranks-sim-procs");
    let nb = notebook(&[
        (
            "use std::io::BufRead;\n\
             let mut ranks = Vec::new();\n\
             for (rank, size) in [(0, \"48MiB\"), (1, \"80MiB\")] {\n\
             \x20   let mut w = std::process::Command::new(std::env::var(\"GPUMEM_DEMO\")?)\n\
             \x20       .args([\"hold\", size, \"120\"])\n\
             \x20       .env(\"RANK\", rank.to_string())\n\
             \x20       .env(\"LOCAL_RANK\", rank.to_string())\n\
             \x20       .stdout(std::process::Stdio::piped())\n\
             \x20       .spawn()?;\n\
             \x20   let mut first = String::new();\n\
             \x20   std::io::BufReader::new(w.stdout.take().unwrap()).read_line(&mut first)?;\n\
             \x20   println!(\"rank {rank} pid {} {}\", w.id(), first.trim());\n\
             \x20   ranks.push(w);\n\
             }",
            &[],
        ),
        ("%gpumem ranks\n%gpumem ranks 1\n%gpumem ranks 9", &[]),
    ]);
    let (code, out, stderr) =
        run("ranks", &nb, &[("GPUMEM_DEMO", demo.to_str().unwrap()), ("GPUMEM_NB_SIM_PROCS", table.to_str().unwrap())]);
    // The workers outlive the notebook (they hold for 120 s): read their rows, then end them.
    let printed: String = outputs(&out, 0).iter().filter_map(|o| o["text"].as_str()).collect();
    let pids: Vec<u32> =
        printed.lines().filter_map(|l| l.strip_prefix("rank ")?.split_whitespace().nth(2)?.parse().ok()).collect();
    let held: Vec<u64> = pids
        .iter()
        .map(|p| std::fs::read_to_string(table.join(format!("{p}-0"))).map_or(0, |s| s.trim().parse().unwrap_or(0)))
        .collect();
    for p in &pids {
        let _ = Command::new("kill").arg(p.to_string()).status();
    }
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(pids.len(), 2, "each worker's first line: {printed:?}\n{stderr}");
    let mib = 1u64 << 20;
    assert_eq!(held, [48 * mib, 80 * mib], "the simulated process table holds each worker's buffer");

    // The record: both workers, each with its rank, device and the table's bytes.
    let rec = records(&out, 0);
    let rows = rec[0]["children"].as_array().unwrap_or_else(|| panic!("no children: {}", rec[0]));
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (rank, (pid, bytes)) in pids.iter().zip(&held).enumerate() {
        let row = rows.iter().find(|r| r["pid"] == *pid).unwrap_or_else(|| panic!("pid {pid}: {rows:?}"));
        assert_eq!(row["rank"], rank as u64, "{row}");
        assert_eq!(row["local_rank"], rank as u64, "{row}");
        assert_eq!(row["rank_from"], "RANK", "{row}");
        assert_eq!(row["device"], "sim-0");
        assert_eq!(row["source"], "simulated");
        assert_eq!(row["used"], *bytes, "{row}");
        assert_eq!(row["name"], "gpumem-demo");
    }

    // `%gpumem ranks`: one row for the cell, its figures for programs beside the table.
    let shown: Vec<&Value> = outputs(&out, 1).iter().filter(|o| o["output_type"] == "display_data").collect();
    assert_eq!(shown.len(), 2, "the session's table and cell 1's: {shown:?}");
    let fig = &shown[0]["data"]["application/vnd.gpumem.ranks+json"];
    let cell = &fig["cells"].as_array().unwrap_or_else(|| panic!("{fig}"))[0];
    assert_eq!(cell["cell"], 1);
    assert_eq!(cell["figure"], "at the end of the cell", "headless: no live line, no readings during the cell");
    let ranks: Vec<(u64, u64, u64)> = cell["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["rank"].as_u64().unwrap(), p["pid"].as_u64().unwrap(), p["used"].as_u64().unwrap()))
        .collect();
    assert_eq!(ranks, [(0, pids[0] as u64, held[0]), (1, pids[1] as u64, held[1])], "{cell}");
    let s = &cell["summary"];
    assert_eq!((s["count"].as_u64(), s["min"].as_u64(), s["max"].as_u64()), (Some(2), Some(held[0]), Some(held[1])));
    assert_eq!(s["sum"].as_u64(), Some(held[0] + held[1]));
    assert_eq!(s["mean"].as_f64(), Some((held[0] + held[1]) as f64 / 2.0));
    assert_eq!(s["highest"], json!({"rank": 1, "pid": pids[1], "devices": ["sim-0"]}), "rank 1 holds the most");
    let text = shown[0]["data"]["text/plain"].as_str().unwrap();
    let iec = gpumem_nb::units::iec;
    let who = format!("rank 1 · pid {} · sim-0", pids[1]);
    for want in [iec(held[0]), iec(held[1]), iec(held[0] + held[1]), "0, 1".to_string(), who.clone()] {
        assert!(text.contains(&want), "{want}:\n{text}");
    }
    assert!(shown[0]["data"]["text/html"].as_str().is_some_and(|h| h.contains("<table")));
    // `%gpumem ranks 1`: the cell's processes one by one.
    let one = shown[1]["data"]["text/plain"].as_str().unwrap();
    assert!(
        one.starts_with(&format!("cell [1]: 2 processes · at the end of the cell · min {}", iec(held[0]))),
        "{one}"
    );
    assert!(one.contains(&who) && one.contains(&pids[0].to_string()), "{one}");
    // A cell the history does not have: one line.
    let err: String =
        outputs(&out, 1).iter().filter(|o| o["name"] == "stderr").filter_map(|o| o["text"].as_str()).collect();
    assert!(err.lines().any(|l| l == "%gpumem: ranks: no cell [9] in this session's history"), "{err}");
}

/// An error a framework returns is shown whole, and a panic on another thread while a cell runs
/// makes the cell an error (issue: a candle error's backtrace frame was the error's value, a
/// burn device thread's panic let the cell answer `0.0`). anyhow's chain: gpumem-kernel has
/// evcxr write a `?` error with `{:#}` (anyhow's chain on one line), with `Debug` after `:efmt
/// {:?}` (the chain and its backtrace, folded). A thread's panic while the cell waits for it (`join`
/// returns `Err`, the cell goes on) or sleeps: the error names the thread; the value is not the
/// cell's result. The next cell is clean.
#[test]
fn framework_errors_whole_and_panics_on_other_threads() {
    let load = "use anyhow::Context;\n\
                fn load() -> anyhow::Result<Vec<u8>> {\n    \
                    std::fs::read(\"/nonexistent/weights.safetensors\").context(\"reading the weights\")\n\
                }\n\
                load().context(\"loading the model\")?;";
    let join = "let worker = std::thread::Builder::new().name(\"worker-1\".into());\n\
                worker.spawn(|| panic!(\"boom on worker\")).unwrap().join().is_err()";
    let sleep = "std::thread::Builder::new().name(\"worker-2\".into()).spawn(|| {\n    \
                     std::thread::sleep(std::time::Duration::from_millis(100));\n    \
                     panic!(\"late on worker\")\n\
                 }).unwrap();\n\
                 std::thread::sleep(std::time::Duration::from_millis(1000));\n\
                 0.0";
    let nb = notebook(&[
        (":dep anyhow = \"1\"", &[]),
        (load, &["raises-exception"]),
        (":efmt {:?}", &[]),
        (load, &["raises-exception"]),
        (join, &["raises-exception"]),
        (sleep, &["raises-exception"]),
        ("1 + 1", &[]),
    ]);
    let (code, out, stderr) = run("framework-errors", &nb, &[]);
    assert_eq!(code, 0, "{stderr}");
    let error = |i: usize| -> Value {
        outputs(&out, i)
            .iter()
            .find(|o| o["output_type"] == "error")
            .cloned()
            .unwrap_or_else(|| panic!("cell {i}: {:?}", outputs(&out, i)))
    };
    let traceback = |e: &Value| -> String {
        e["traceback"].as_array().unwrap().iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n")
    };
    // The default, `{:#}`: the whole chain, outermost first.
    assert_eq!(
        errors(&out, 1),
        ["Error: loading the model: reading the weights: No such file or directory (os error 2)"]
    );
    // `Debug`: the chain, then the backtrace folded to the cell's own frames.
    let e = error(3);
    assert_eq!((e["ename"].as_str(), e["evalue"].as_str()), (Some("Error"), Some("loading the model")), "{e}");
    let tb = traceback(&e);
    assert!(
        tb.contains("Caused by:\n    0: reading the weights\n    1: No such file or directory (os error 2)"),
        "{tb}"
    );
    assert!(tb.contains("stack backtrace (innermost first;") && tb.contains("at cell [4] line 3"), "{tb}");
    for hidden in ["_start", "anyhow::", "load_and_run", "Stack backtrace:"] {
        assert!(!tb.contains(hidden), "{hidden}: {tb}");
    }
    // A thread's panic the cell waited for, and one while it slept: errors naming the thread;
    // the value is in a note, not the result.
    for (i, thread, message, value) in
        [(4, "worker-1", "boom on worker", "true"), (5, "worker-2", "late on worker", "0.0")]
    {
        let e = error(i);
        assert_eq!(e["ename"], "panic", "{e}");
        assert_eq!(e["evalue"], format!("thread '{thread}' panicked: {message}"), "{e}");
        let tb = traceback(&e);
        assert!(tb.contains(&format!("on thread '{thread}'")) && tb.contains("stack backtrace ("), "{tb}");
        assert!(!tb.contains("rust_begin_unwind"), "{tb}");
        assert_eq!(result_text(&out, i), "", "cell {i}: {:?}", outputs(&out, i));
        assert!(notices(&out, i).iter().any(|n| n.ends_with(&format!("It was: {value}"))), "{:?}", notices(&out, i));
        assert_eq!(records(&out, i)[0]["status"], "panicked");
    }
    assert_eq!(result_text(&out, 6), "2");
    assert!(errors(&out, 6).is_empty(), "{:?}", outputs(&out, 6));
}

/// `%%gpumem sweep` on gpumem-nb's own allocator (the simulated device of 8 GiB): each run's
/// peak fitted (100 MiB kept, 32 MiB at every value, 64 MiB per unit), the largest value it
/// predicts for this device then run and fitting, 5 % more running out of memory by name; and the
/// contract's bad cells each a one-line `UsageError` that runs nothing and loses nothing.
#[test]
fn a_sweep_predicts_the_largest_batch_and_the_prediction_holds() {
    let zeros = "DeviceBuffer::<u8>::zeros(&gpumem_nb::current()?";
    let step = |b: &str| {
        format!(
            "let act = {zeros}, {b} * (64 << 20), StreamId::DEFAULT)?;\nlet tmp = {zeros}, 32 << 20, StreamId::DEFAULT)?;\nlet _ = (&keep, &act, &tmp);"
        )
    };
    let sweep = format!("%%gpumem sweep batch=4,1,2\n{}", step("batch"));
    // 1 % of 8 GiB kept free: (8110.08 − 100 − 32) / 64 = 124.7: 124 fits, 131 (5 % more,
    // rounded up) does not.
    let fits = step("124");
    let over = step("131");
    const RAISES: &[&str] = &["raises-exception"];
    let nb = notebook(&[
        (":dep gpumem-nb", &[]),
        (
            &format!("use gpumem_nb::{{DeviceBuffer, StreamId}};\nlet keep = {zeros}, 100 << 20, StreamId::DEFAULT)?;"),
            &[],
        ),
        (&sweep, &[]),
        (&format!("{{\n{fits}\n}}"), &[]),
        (&format!("{{\n{over}\n}}"), RAISES),
        ("%%gpumem sweep n=1,2,3\nlet z = 1;", RAISES),
        ("%%gpumem sweep batch=1,2,3\nlet gone = keep;\nlet _ = batch;", RAISES),
        ("let mut step = 0;", &[]),
        ("%%gpumem sweep batch=1,2,3\nstep += batch;", RAISES),
        ("keep.len()", &[]),
    ]);
    let (_, out, stderr) = run("sweep", &nb, &[]);
    let mib = (1u64 << 20) as f64;
    let figures = outputs(&out, 2)
        .iter()
        .find_map(|o| o["data"].get("application/vnd.gpumem.sweep+json"))
        .unwrap_or_else(|| panic!("no sweep figures: {:?}\n{:?}\n{stderr}", notices(&out, 2), errors(&out, 2)))
        .clone();
    assert!(errors(&out, 2).is_empty(), "{:?}", errors(&out, 2));
    let runs = figures["sweep"]["runs"].as_array().unwrap();
    let values: Vec<f64> = runs.iter().map(|r| r["value"].as_f64().unwrap()).collect();
    assert_eq!(values, [1.0, 2.0, 4.0], "ascending, the warm-up not counted");
    for r in runs {
        let b = r["value"].as_f64().unwrap();
        assert_eq!(r["peak"].as_f64().unwrap(), (100.0 + 32.0 + 64.0 * b) * mib, "each run's device peak: {r}");
    }
    let total = &figures["sweep"]["total"];
    assert_eq!(total["shape"], "linear", "{total}");
    assert!((total["slope"].as_f64().unwrap() - 64.0 * mib).abs() < 1.0, "{total}");
    assert!((total["intercept"].as_f64().unwrap() - 132.0 * mib).abs() < 1.0, "{total}");
    let this = &figures["answers"][0];
    assert_eq!(this["capacity"], 8u64 << 30, "{this}");
    assert_eq!(this["largest"]["value"], 124.0, "{this}");
    assert_eq!(figures["limiting"]["component"], "other", "the allocator's blocks, untagged: {figures}");
    assert!(figures["sweep"]["components"].get("cached").is_none(), "a cache is no component: {figures}");
    // Each run is a cell of the history with its own report; the tables say the answer.
    assert!(records(&out, 2).len() >= 4, "the warm-up and three runs each reported");
    let tables = notices(&out, 2).join("\n");
    assert!(tables.contains("the largest batch that fits") && tables.contains("124"), "{tables}");
    // The prediction holds: 124 runs, 131 runs out of memory by name.
    assert!(errors(&out, 3).is_empty(), "b* fits: {:?}", errors(&out, 3));
    let oom = errors(&out, 4);
    assert!(oom.iter().any(|e| e.contains("out of memory")), "5 % more fails by name: {oom:?}");
    // Bad cells: one line each, nothing of them ran, the session intact.
    for (cell, want) in [(5, "does not use `n`"), (6, "moves `keep`"), (8, "assigns `step`")] {
        let e = errors(&out, cell);
        assert!(
            e.len() == 1 && e[0].starts_with("UsageError: %%gpumem sweep: ") && e[0].contains(want),
            "{cell}: {e:?}"
        );
        assert!(records(&out, cell).is_empty(), "nothing ran: {cell}");
    }
    assert_eq!(result_text(&out, 9), "104857600", "`keep` is still the session's");
}
