//! The stock evcxr kernel's in-child hooks through real file descriptors: this test binary runs
//! itself as the child, with a loop that speaks evcxr 0.22's runtime protocol (`LOAD_AND_RUN`
//! lines in, output and `EVCXR_EXECUTION_COMPLETE` out, panics caught and announced), and
//! plays evcxr's parent over pipes. The crate installs its hooks in the first run that opens a
//! device; every later run is reported. `scripts/test.sh` runs the same through the real
//! `evcxr_jupyter` and Jupyter (`kernel/tests/stock_nbclient.py`).

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Duration;

const CHILD_VAR: &str = "GPUMEM_NB_STOCK_TEST_CHILD";
const MIB: usize = 1 << 20;

/// Kept across runs, as evcxr keeps a cell's variables.
static KEEP: Mutex<Vec<gpumem_nb::DeviceBuffer<u8>>> = Mutex::new(Vec::new());

/// What run `n` of the child does.
fn cell(n: u64) {
    let dev = || gpumem_nb::current().unwrap();
    match n {
        1 => drop(dev()),
        2 => KEEP
            .lock()
            .unwrap()
            .push(gpumem_nb::DeviceBuffer::alloc(&dev(), 64 * MIB, gpumem_nb::StreamId::DEFAULT).unwrap()),
        3 => {
            drop(gpumem_nb::DeviceBuffer::<u8>::alloc(&dev(), 32 * MIB, gpumem_nb::StreamId::DEFAULT).unwrap());
            println!("EVCXR_BEGIN_CONTENT text/plain\n42\nEVCXR_END_CONTENT");
            print!("\rstep 3/3");
            std::io::stdout().flush().unwrap();
        }
        4 => panic!("a cell panics"),
        5 => gpumem_nb::kernel::set_reports(false),
        7 => gpumem_nb::kernel::set_reports(true),
        _ => {}
    }
}

/// The child: evcxr's runtime loop (one lock on stdin for the whole process, as evcxr's).
#[test]
#[ignore = "the child of `reports_in_the_child`, run by it"]
fn child_runtime() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return;
    }
    std::panic::set_hook(Box::new(|info| eprintln!("{info}")));
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let n = line.rsplit_once("run_user_code_").unwrap().1.parse().unwrap();
        if std::panic::catch_unwind(|| cell(n)).is_err() {
            println!("EVCXR_PANIC_NOTIFICATION");
        }
        println!("EVCXR_EXECUTION_COMPLETE");
    }
    std::process::exit(0);
}

#[test]
fn reports_in_the_child() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_runtime", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, "1")
        .env("EVCXR_IS_RUNTIME", "1")
        .env("GPUMEM_NB_DEVICE", "sim:8GiB")
        .env_remove("GPUMEM_NB_CONTROL")
        .env_remove("GPUMEM_NB_REPORTS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut to_child = child.stdin.take().unwrap();
    let (tx, lines) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let _ = tx.send(l.unwrap());
        }
    });
    // One run as evcxr does it: the command, then every line up to the COMPLETE.
    let mut run = |n: u64| -> Vec<String> {
        writeln!(to_child, "LOAD_AND_RUN /tmp/libcode_{n}.so run_user_code_{n}").unwrap();
        let mut got = Vec::new();
        loop {
            let l = lines.recv_timeout(Duration::from_secs(60)).expect("the run never completed");
            // The test harness's own `test child_runtime ... ` is glued to the first COMPLETE.
            if l.ends_with("EVCXR_EXECUTION_COMPLETE") {
                return got;
            }
            got.push(l);
        }
    };
    let report = |lines: &[String]| lines.iter().find(|l| l.starts_with('[') && l.contains("] sim · ")).cloned();

    let r1 = run(1);
    assert_eq!(report(&r1), None, "the run that installs the hooks had no pre-hook: {r1:?}");

    let r2 = run(2);
    let line = report(&r2).unwrap_or_else(|| panic!("{r1:?} {r2:?}"));
    assert!(line.starts_with("[2] sim · "), "{line}");
    // Every allocation is the allocator's: the driver's view is the same, so not on the line.
    assert!(
        line.contains(" · allocated 64.0 MiB (+64.0 MiB) · reserved 64.0 MiB (+64.0 MiB) · top stock::cell · free "),
        "{line}"
    );
    assert_eq!(r2.last(), Some(&line), "the report is the run's last line");

    // A temporary and a value: the cell's own block and its flushed partial line stay as they
    // were; the record goes in a block of its own.
    let r3 = run(3);
    let own = ["EVCXR_BEGIN_CONTENT text/plain", "42", "EVCXR_END_CONTENT", "\rstep 3/3"];
    let at = r3.iter().position(|l| l == own[0]).unwrap();
    assert_eq!(r3[at..at + 4], own, "{r3:?}");
    let line = &r3[at + 4];
    // The allocator keeps the freed 32 MiB cached: reserved, so allocated by the driver.
    let expect = " · allocated 64.0 MiB (peak 96.0 MiB) · reserved 96.0 MiB (+32.0 MiB) · top stock::cell · ";
    assert!(line.starts_with("[3] sim · ") && line.contains(expect), "{line}");
    assert_eq!(r3[at + 5], "EVCXR_BEGIN_CONTENT application/vnd.gpumem.cell+json");
    assert_eq!(r3[at + 7], "EVCXR_END_CONTENT");
    let rec: Value = serde_json::from_str(&r3[at + 6]).unwrap();
    assert_eq!((rec["cell"].as_u64(), rec["status"].as_str()), (Some(3), Some("ok")));
    assert_eq!(rec["allocator"]["peak_allocated"], 96 * MIB);
    assert_eq!(rec["all_allocations"]["peak"], 96 * MIB);

    let r4 = run(4);
    assert_eq!(r4[r4.len() - 2], "EVCXR_PANIC_NOTIFICATION", "{r4:?}");
    assert!(report(&r4).unwrap().starts_with("[4] "), "the hooks outlive a panic: {r4:?}");

    // Off from run 5 (whose pre-hook had run) until run 7 turns them on; run 8 reports.
    for n in [5, 6, 7] {
        let r = run(n);
        assert_eq!(report(&r), None, "run {n}: {r:?}");
    }
    let line = report(&run(8)).unwrap();
    assert!(line.starts_with("[8] sim · "), "{line}");
    assert!(line.contains(" · allocated 64.0 MiB (±0 B) · reserved 96.0 MiB (±0 B) · top stock::cell · "), "{line}");

    // evcxr closes stdin to stop the child: it exits.
    drop(to_child);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}
