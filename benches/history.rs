//! History recording and snapshot benchmarks on the simulated device.
//!
//! - `pair/<mode>`: one malloc+free pair (3 events: alloc, free_requested, free_completed)
//!   with recording off, on without stacks, and on with stacks (`StackContext::All`: each
//!   operation walks its stack). Per-event overhead = (pair − pair_off) / 3.
//! - `snapshot_pickle/<n>`: take a snapshot of a ring of `n` events and write it as a pickle
//!   (no stacks), as `torch.cuda.memory._dump_snapshot` does.
//! - `line_map/<cells>`: map one generated `lib.rs` (a few items, the cell's statements, 150
//!   lines of runtime that match no cell) to the cells of a session `cells` long, kept in a
//!   `CellIndex` as gpumem-kernel's child keeps them: what naming a site in a new cell library
//!   costs the cell's report. It should not grow with the session.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::{AllocatorConfig, CachingAllocator, HistoryOptions, RecordMode, StackContext, StreamId};
use std::hint::black_box;

fn allocator() -> CachingAllocator<SimBackend> {
    CachingAllocator::new(SimBackend::new(0, 80 << 30), AllocatorConfig::default())
}

/// A few frames of "user code" above the allocation, like a real caller.
#[inline(never)]
fn user_layer_3(a: &CachingAllocator<SimBackend>) {
    let x = a.malloc(black_box(4096), StreamId::DEFAULT).unwrap();
    a.free(x.block.unwrap()).unwrap();
}
#[inline(never)]
fn user_layer_2(a: &CachingAllocator<SimBackend>) {
    user_layer_3(a);
    black_box(());
}
#[inline(never)]
fn user_layer_1(a: &CachingAllocator<SimBackend>) {
    user_layer_2(a);
    black_box(());
}

fn pair(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair");
    let modes = [
        ("off", HistoryOptions { enabled: RecordMode::Off, context: StackContext::None, max_entries: 0 }),
        ("events", HistoryOptions { enabled: RecordMode::All, context: StackContext::None, max_entries: 100_000 }),
        (
            "events_and_stacks",
            HistoryOptions { enabled: RecordMode::All, context: StackContext::All, max_entries: 100_000 },
        ),
    ];
    for (name, opts) in modes {
        let a = allocator();
        a.record_memory_history_with(opts);
        g.bench_function(name, |b| b.iter(|| user_layer_1(&a)));
    }
    g.finish();
}

fn snapshot_pickle(c: &mut Criterion) {
    let mut g = c.benchmark_group("snapshot_pickle");
    g.sample_size(10);
    for n in [100_000usize, 1_000_000] {
        let a = allocator();
        a.record_memory_history(RecordMode::All, n);
        // Live blocks spread over a few segments, and a full ring of events.
        let live: Vec<_> = (0..2000).map(|i| a.malloc(512 * (1 + i % 64), StreamId::DEFAULT).unwrap()).collect();
        // Each pair records 3 events (alloc, free_requested, free_completed).
        for _ in 0..n.div_ceil(3) {
            let x = a.malloc(4096, StreamId::DEFAULT).unwrap();
            a.free(x.block.unwrap()).unwrap();
        }
        assert_eq!(a.history().len(), n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                let snap = a.snapshot();
                black_box(gpumem_nb::snapshot::pickle::to_bytes(&snap).len())
            })
        });
        drop(live);
    }
    g.finish();
}

/// A cell of a long session: the soak's kinds of cell (`scripts/soak.py`), with a helper
/// function every 25 cells.
fn session_cell(i: u64) -> String {
    let m = 1 + (i * 7) % 13;
    match i % 10 {
        0 => format!(
            "let alloc = gpumem_nb::current()?;\nlet a = DeviceBuffer::<u8>::zeros(&alloc, {m} << 20, StreamId::DEFAULT)?;\na.num_bytes()"
        ),
        1 => format!(
            "{{ let t = DeviceBuffer::<u8>::zeros(&alloc, {} << 20, StreamId::DEFAULT)?; t.num_bytes() }}",
            2 * m
        ),
        4 => "drop(a);".into(),
        5 if i.is_multiple_of(25) => {
            format!("fn helper_{i}(n: usize) -> usize {{\n    let v = vec![0u8; n << 10];\n    v.len()\n}}")
        }
        8 => "let d = gpumem_nb::mem::driver_alloc_mib(2)?;\ndrop(d);".into(),
        _ => format!("{i}u64 * 2"),
    }
}

fn line_map(c: &mut Criterion) {
    use gpumem_nb::kernel::cells::{CellIndex, LineMap};
    let mut g = c.benchmark_group("line_map");
    for n in [250u64, 5_000] {
        let mut index = CellIndex::new();
        for i in 1..=n {
            index.insert(i, &session_cell(i));
        }
        let mut lib = String::from("#![allow(unused_imports)]\nuse gpumem_nb::{DeviceBuffer, StreamId};\n");
        lib += &session_cell(25 * (n / 25 - 1) + 5);
        lib += "\nmod runtime {\n";
        for k in 0..150 {
            lib += &format!("    pub fn runtime_{k}(store: &mut Store) -> Option<u32> {{ store.take({k}) }}\n");
        }
        lib += "}\npub extern \"C\" fn run_user_code_7(store: *mut u8) -> *mut u8 {\n";
        lib += &session_cell(n - 9);
        lib += "\nstore\n}\n";
        assert!(!LineMap::build_indexed(&lib, &index).runs.is_empty());
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| black_box(LineMap::build_indexed(black_box(&lib), &index).runs.len()))
        });
    }
    g.finish();
}

criterion_group!(benches, pair, snapshot_pickle, line_map);
criterion_main!(benches);
