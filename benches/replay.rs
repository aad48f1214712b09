//! Replay speed: events per second through `gpumem-replay`'s paths, on the real traces shipped in
//! `tests/fixtures/traces/` (read and parsed once, outside the timing).
//!
//! - `exact/<trace>`: the address-faithful replay under PyTorch's policy (every device event
//!   checked against the trace's);
//! - `fit/<trace>`: one run of the recorded program on a device of the trace's reserved peak
//!   (`replay::fit::run`, what `--fit` repeats for each size it tries);
//! - `read/<trace>`: reading a snapshot pickle of PyTorch's structure (built from the trace by
//!   tests/fixtures/snapshots/build_snapshot.py when python3 is there) into a recording.
//!
//! Throughput is in trace events (criterion's "elem/s").

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use gpumem_nb::AllocatorConfig;
use gpumem_nb::replay::fit::{self, Program};
use gpumem_nb::replay::{ReplayOptions, read_recording, replay};
use std::path::Path;

const TRACES: [&str; 3] = ["gpt2_train", "resnet50_train", "two_streams"];

fn trace_path(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/traces/{name}.trace.tsv.gz"))
}

fn exact(c: &mut Criterion) {
    let mut g = c.benchmark_group("exact");
    for name in TRACES {
        let rec = read_recording(&trace_path(name)).unwrap();
        let events = &rec.devices[0].events;
        g.throughput(Throughput::Elements(events.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), events, |b, events| {
            b.iter(|| replay(events, &ReplayOptions::default(), name).unwrap())
        });
    }
    g.finish();
}

fn fit_run(c: &mut Criterion) {
    let mut g = c.benchmark_group("fit");
    for name in TRACES {
        let rec = read_recording(&trace_path(name)).unwrap();
        let t = &rec.devices[0];
        let exact = replay(&t.events, &ReplayOptions::default(), name).unwrap();
        let program = Program::new(t, exact.empty_cache_before.clone(), 80 << 30);
        let config = AllocatorConfig::default();
        let size = exact.reserved_peak as u64;
        g.throughput(Throughput::Elements(t.events.len() as u64));
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| fit::run(&program, &config, Some(size)).unwrap())
        });
    }
    g.finish();
}

fn read(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("gpumem-bench-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let builder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots/build_snapshot.py");
    let mut g = c.benchmark_group("read");
    for name in TRACES {
        let out = dir.join(format!("{name}.pickle"));
        let built = std::process::Command::new("python3")
            .arg(&builder)
            .arg(trace_path(name))
            .arg(&out)
            .status()
            .is_ok_and(|s| s.success());
        if !built {
            eprintln!("read/{name}: skipped (python3 could not build the snapshot)");
            continue;
        }
        let events = read_recording(&out).unwrap().devices[0].events.len();
        g.throughput(Throughput::Elements(events as u64));
        g.bench_function(BenchmarkId::from_parameter(name), |b| b.iter(|| read_recording(&out).unwrap()));
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, exact, fit_run, read);
criterion_main!(benches);
