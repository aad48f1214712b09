//! History recording and snapshot benchmarks on the simulated device.
//!
//! - `pair/<mode>`: one malloc+free pair (3 events: alloc, free_requested, free_completed)
//!   with recording off, on without stacks, and on with stacks (`StackContext::All`: each
//!   operation walks its stack). Per-event overhead = (pair − pair_off) / 3.
//! - `snapshot_pickle/<n>`: take a snapshot of a ring of `n` events and write it as a pickle
//!   (no stacks), as `torch.cuda.memory._dump_snapshot` does.

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

criterion_group!(benches, pair, snapshot_pickle);
criterion_main!(benches);
