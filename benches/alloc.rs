//! Allocation benchmarks on the simulated device, through the thread-safe front (the policy
//! under its mutex: what every caller pays).
//!
//! - `hot/<size>`: one malloc+free pair of the same size, again and again (the cache is warm:
//!   after the first pair no device call happens).
//! - `mixed_1000_live`: 1000 live blocks of log-uniform sizes 512 B – 8 MiB; each iteration
//!   frees a random live block and allocates a new random size (one pair).
//!
//! Each runs under PyTorch's default policy (`allocator`) and under our `compact:True`
//! (`compact`), whose per-pair cost must stay within 1.5× of the default's.
//!
//! The same workloads run against PyTorch's C++ allocator and the CUDA driver on the GPU
//! machine (scripts/gpu-check.sh); BENCHMARKS.md has the figures.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::{AllocatorConfig, CachingAllocator, StreamId};
use std::hint::black_box;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Log-uniform in [512, 8 MiB].
    fn size(&mut self) -> u64 {
        let lo = 9.0f64; // log2(512)
        let hi = 23.0f64; // log2(8 MiB)
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        2f64.powf(lo + u * (hi - lo)) as u64
    }
}

/// The two policies benchmarked: (name, `GPUMEM_NB_ALLOC_CONF`).
const POLICIES: [(&str, &str); 2] = [("allocator", ""), ("compact", "compact:True")];

fn allocator(conf: &str) -> CachingAllocator<SimBackend> {
    CachingAllocator::new(SimBackend::new(0, 80 << 30), AllocatorConfig::parse(conf).unwrap())
}

fn hot(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot");
    g.throughput(Throughput::Elements(1));
    for (name, conf) in POLICIES {
        for size in [512u64, 1 << 20, 64 << 20] {
            let alloc = allocator(conf);
            g.bench_with_input(BenchmarkId::new(name, size), &size, |b, &size| {
                b.iter(|| {
                    let a = alloc.malloc(black_box(size), StreamId::DEFAULT).unwrap();
                    alloc.free(a.block.unwrap()).unwrap();
                })
            });
        }
    }
    g.finish();
}

fn mixed(c: &mut Criterion) {
    let mut g = c.benchmark_group("mixed_1000_live");
    g.throughput(Throughput::Elements(1));
    for (name, conf) in POLICIES {
        let alloc = allocator(conf);
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let mut live: Vec<_> =
            (0..1000).map(|_| alloc.malloc(rng.size(), StreamId::DEFAULT).unwrap().block.unwrap()).collect();
        g.bench_function(name, |b| {
            b.iter(|| {
                let i = (rng.next() % live.len() as u64) as usize;
                alloc.free(live[i]).unwrap();
                live[i] = alloc.malloc(rng.size(), StreamId::DEFAULT).unwrap().block.unwrap();
            })
        });
    }
    g.finish();
}

/// 8 threads, each on its own stream, doing hot 512 B pairs on one shared allocator: the time
/// per pair as each thread sees it (wall time ÷ pairs per thread), lock contention included.
fn threads8(c: &mut Criterion) {
    let mut g = c.benchmark_group("threads8");
    g.throughput(Throughput::Elements(1));
    let alloc = std::sync::Arc::new(allocator(""));
    let streams: Vec<StreamId> = (0..8).map(|_| alloc.new_stream().unwrap()).collect();
    g.bench_function("hot_512_per_stream", |b| {
        b.iter_custom(|iters| {
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
            let handles: Vec<_> = streams
                .iter()
                .map(|&s| {
                    let (a, barrier) = (std::sync::Arc::clone(&alloc), std::sync::Arc::clone(&barrier));
                    std::thread::spawn(move || {
                        barrier.wait();
                        let t0 = std::time::Instant::now();
                        for _ in 0..iters {
                            let x = a.malloc(black_box(512), s).unwrap();
                            a.free(x.block.unwrap()).unwrap();
                        }
                        t0.elapsed()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).max().unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, hot, mixed, threads8);
criterion_main!(benches);
