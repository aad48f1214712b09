//! Will it fit (`gpumem_nb::replay::fit`, `gpumem-replay --fit`), on the real PyTorch traces:
//! an unconstrained run makes the recorded decisions; at PyTorch's reserved peak the program
//! fits and 256 MiB under its allocated peak it does not, under PyTorch's policy and compact;
//! compact's smallest device is within 5 % of the allocated peak; the search's answer is
//! measured on both sides. And on made-up programs: failures are skipped and named per label,
//! other sources' allocations take the device's memory at 2 MiB granularity.

use gpumem_nb::device::sim::GRANULARITY;
use gpumem_nb::replay::fit::{self, Program};
use gpumem_nb::replay::{DeviceTrace, EventInfo, Foreign, ReplayOptions, TraceLine, read_recording, replay};
use gpumem_nb::{AllocatorConfig, StreamId, TraceAction};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The shipped traces and the H100 ones written the usual way (`h100_natural`), with their
/// sidecars' `stats` (PyTorch's own `memory_stats()`).
fn traces() -> Vec<(PathBuf, Value)> {
    let mut out = Vec::new();
    for dir in ["tests/fixtures/traces", "tests/fixtures/traces/recorded/h100_natural"] {
        let mut v: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(".trace.tsv.gz"))
            .collect();
        v.sort();
        for t in v {
            let side = t.to_string_lossy().replace(".trace.tsv.gz", ".json");
            let side: Value = serde_json::from_str(&std::fs::read_to_string(side).unwrap()).unwrap();
            out.push((t, side["stats"].clone()));
        }
    }
    assert_eq!(out.len(), 8);
    out
}

/// 256 MiB under the allocated peak (half of it, for the small two-stream trace).
fn under(allocated: u64) -> u64 {
    allocated.saturating_sub(256 * MIB).max(allocated / 2)
}

fn conf(s: &str) -> AllocatorConfig {
    AllocatorConfig::parse(s).unwrap()
}

#[test]
fn pytorchs_peaks_bound_the_fit_under_default_and_compact() {
    for (path, stats) in traces() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("infer_varlen") || name.starts_with("batch_sweep") {
            continue; // the largest two: below, in the binary test (release-speed there too)
        }
        let rec = read_recording(&path).unwrap();
        let t = &rec.devices[0];
        let exact = replay(&t.events, &ReplayOptions::default(), "t").unwrap();
        let program = Program::new(t, exact.empty_cache_before.clone(), 80 << 30);
        let reserved = stats["reserved_bytes.all.peak"].as_u64().unwrap();
        let allocated = stats["allocated_bytes.all.peak"].as_u64().unwrap();
        // Unconstrained, PyTorch's policy makes PyTorch's decisions: its peaks exactly.
        let un = fit::run(&program, &conf(""), None).unwrap();
        assert_eq!((un.reserved_peak, un.allocated_peak), (reserved, allocated), "{name}");
        for policy in ["", "compact:True"] {
            let c = conf(policy);
            let at_peak = fit::run(&program, &c, Some(reserved)).unwrap();
            assert!(at_peak.fits, "{name} {policy:?}: fits at PyTorch's reserved peak");
            assert!(at_peak.first_failure.is_none());
            let short = fit::run(&program, &c, Some(under(allocated))).unwrap();
            assert!(!short.fits, "{name} {policy:?}: 256 MiB under the allocated peak");
            let f = short.first_failure.as_ref().unwrap();
            assert!(f.size > 0 && t.events[f.index].action == TraceAction::Alloc, "{name}: {f:?}");
            assert_eq!(t.events[f.index].size, f.size);
            let parts = f.parts.as_ref().expect("the first failure explains the reserved bytes");
            parts.check().unwrap();
            assert_eq!(parts.reserved, f.reserved);
        }
        let compact = fit::min_device(&program, &conf("compact:True")).unwrap();
        assert!(
            compact.min_device_bytes as f64 <= 1.05 * allocated as f64,
            "{name}: compact needs {} for an allocated peak of {allocated}",
            compact.min_device_bytes
        );
        for s in [&compact, &fit::min_device(&program, &conf("")).unwrap()] {
            let min = s.min_device_bytes;
            assert_eq!(min % GRANULARITY, 0);
            assert!(s.probes.contains(&(min, true)), "{name}: the answer was run, and fit");
            let below = min - GRANULARITY;
            assert!(
                s.probes.contains(&(below, false)) || below < s.live_peak,
                "{name}: 2 MiB less was run and failed, or is below the program's live peak"
            );
            assert!(s.live_peak <= min && min <= s.unconstrained.device_peak.div_ceil(GRANULARITY) * GRANULARITY * 2);
        }
    }
}

/// The fixed interface: `--fit SIZE --json` has `fits`, `first_failure` (with `index` and
/// `size`), `min_device_bytes`, `reserved_peak`, on the largest traces too.
#[test]
fn the_fit_fields_of_gpumem_replay() {
    let run = |path: &Path, args: &[&str]| -> Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumem-replay"))
            .arg(path)
            .arg("--json")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    for (path, stats) in traces() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !(name.starts_with("batch_sweep") || name.starts_with("two_streams")) {
            continue;
        }
        let reserved = stats["reserved_bytes.all.peak"].as_u64().unwrap();
        let allocated = stats["allocated_bytes.all.peak"].as_u64().unwrap();
        for policy in ["", "compact:True"] {
            let yes = run(&path, &["--fit", &reserved.to_string(), "--alloc-conf", policy]);
            assert_eq!(yes["fits"], true, "{name} {policy:?}");
            assert!(yes["first_failure"].is_null());
            let no = run(&path, &["--fit", &under(allocated).to_string(), "--alloc-conf", policy]);
            assert_eq!(no["fits"], false, "{name} {policy:?}");
            assert!(no["first_failure"]["index"].is_u64() && no["first_failure"]["size"].as_u64() > Some(0));
            let min = no["min_device_bytes"].as_u64().unwrap();
            assert!(no["reserved_peak"].as_u64().unwrap() <= allocated, "{name}: it failed before its peak");
            assert_eq!(yes["min_device_bytes"], min, "the search does not depend on SIZE");
            assert_eq!(no["fit"]["min_device_by_policy"]["compact"]["alloc_conf"], "compact:True");
            if policy == "compact:True" {
                assert!(min as f64 <= 1.05 * allocated as f64, "{name}: {min} for {allocated}");
            }
        }
    }
    // A size in units, and a bad one.
    let path = root().join("tests/fixtures/traces/two_streams.trace.tsv.gz");
    assert_eq!(run(&path, &["--fit", "24GiB"])["fit"]["device_bytes"], 24u64 << 30);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumem-replay"))
        .arg(&path)
        .args(["--fit", "lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--fit: bad size 'lots'"));
}

fn line(n: usize, action: TraceAction, addr: u64, size: u64) -> TraceLine {
    TraceLine { line: n, action, addr, size, stream: StreamId::DEFAULT, time_us: n as i64 }
}

fn info(label: &str, function: &str) -> Option<Arc<EventInfo>> {
    let frames = vec![gpumem_nb::snapshot::Frame { name: function.into(), filename: label.into(), line: 4 }];
    Some(Arc::new(EventInfo { label: label.into(), frames }))
}

/// Two cells: the first holds 60 MiB, the second asks for 30 MiB and 1 GiB. On 100 MiB the
/// 1 GiB request fails (cell 2's first failure, with its site) and is skipped with its free;
/// a driver allocation of 1 MiB in cell 1 takes 2 MiB of the device.
#[test]
fn failures_are_skipped_and_named_by_cell() {
    let a = 0x7f00_0000_0000u64;
    let events = vec![
        line(1, TraceAction::Alloc, a, 60 * MIB),
        line(2, TraceAction::Alloc, a + (64 << 20), 30 * MIB),
        line(3, TraceAction::Alloc, a + (128 << 20), 1 << 30),
        line(4, TraceAction::FreeRequested, a + (128 << 20), 1 << 30),
        line(5, TraceAction::FreeCompleted, a + (128 << 20), 1 << 30),
        line(6, TraceAction::FreeRequested, a, 60 * MIB),
        line(7, TraceAction::FreeCompleted, a, 60 * MIB),
    ];
    let infos = vec![info("cell 1", "load"), info("cell 2", "small"), info("cell 2", "huge"), None, None, None, None];
    let foreign = vec![Foreign {
        before: 1,
        alloc: true,
        addr: 1 << 50,
        size: MIB,
        source: "driver",
        info: info("cell 1", "cublas"),
        event: 2,
    }];
    let trace = DeviceTrace { device: 0, events, info: infos, foreign, skipped: 0, prologue: Vec::new() };
    let program = Program::new(&trace, Vec::new(), 1 << 30);
    assert_eq!(program.live_peak(), 60 * MIB + 2 * MIB + 30 * MIB + (1 << 30));
    let r = fit::run(&program, &conf(""), Some(100 * MIB)).unwrap();
    assert!(!r.fits);
    assert_eq!(r.failures, 1, "the free of the failed request is skipped, not an error");
    let f = r.first_failure.as_ref().unwrap();
    assert_eq!((f.index, f.event, f.size, f.source.as_str()), (2, 3, 1 << 30, "allocator"));
    assert_eq!(f.label.as_deref(), Some("cell 2"));
    assert_eq!(f.site.as_deref(), Some("huge (cell 2:4)"));
    assert_eq!(r.first_failure_by_label.keys().collect::<Vec<_>>(), ["cell 2"]);
    // 60 MiB + 30 MiB segments (rounded to 2 MiB) and the driver's 2 MiB.
    assert_eq!(r.device_peak, 60 * MIB + 30 * MIB + 2 * MIB);
    assert_eq!(r.device_peak_by_label["cell 1"], 62 * MIB);
    // The driver allocation itself fails on a device too small for it after cell 1's 60 MiB.
    let r = fit::run(&program, &conf(""), Some(61 * MIB)).unwrap();
    let f = r.first_failure.as_ref().unwrap();
    assert_eq!((f.source.as_str(), f.label.as_deref(), f.size), ("driver", Some("cell 1"), MIB));
    // The smallest device runs all of it.
    let s = fit::min_device(&program, &conf("")).unwrap();
    assert_eq!(s.min_device_bytes, 60 * MIB + 2 * MIB + 30 * MIB + (1 << 30));
}
