//! The allocation workloads of `scripts/gpu/alloc_bench.cpp`, timed the way it times PyTorch's
//! C++ allocator: the same random sizes (xorshift, log-uniform 512 B – 8 MiB, same seed), the
//! same number of pairs per repeat and repeats, the median of the repeats, on gpumem-nb's
//! thread-safe front over the simulated device (in steady state no workload calls a device, so
//! this is the allocator's own cost on any backend). Prints one JSON line per workload with
//! `impl` "gpumem_nb" (and "gpumem_nb_compact" under `compact:True`), the format of
//! alloc_bench.cpp, so the GPU bundle lines them up in one run. One workload is gpumem-nb's
//! own: "hot/512+component", the hot 512 B pair run inside a component stamp
//! (`gpumem_nb::component`), beside "hot/512" what the component bookkeeping costs a pair
//! (default policy; `bench_median.py` lists only the workloads PyTorch has):
//!
//!     alloc_pairs [PAIRS [REPEATS]]        (default 200000 7, alloc_bench.cpp's)
//!     alloc_pairs PAIRS REPEATS mixed      (the mixed workload alone, default policy)
//!
//! criterion (`benches/alloc.rs`) measures the same workloads its own way (its warm-up and
//! sampling run many more pairs, so the mixed state has churned longer); this is the
//! like-for-like row.
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::{AllocatorConfig, CachingAllocator, Component, StreamId};
use std::hint::black_box;
use std::time::Instant;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn size(&mut self) -> u64 {
        let u = (self.next() >> 11) as f64 / 9007199254740992.0;
        2f64.powf(9.0 + u * 14.0) as u64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn hot(alloc: &CachingAllocator<SimBackend>, size: u64, iters: u64, repeats: usize) -> f64 {
    // One pair first, as alloc_bench.cpp's warm-up: the segment is cached from then on.
    let a = alloc.malloc(size, StreamId::DEFAULT).unwrap();
    alloc.free(a.block.unwrap()).unwrap();
    let r = (0..repeats)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..iters {
                let a = alloc.malloc(black_box(size), StreamId::DEFAULT).unwrap();
                alloc.free(a.block.unwrap()).unwrap();
            }
            t0.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    median(r)
}

fn mixed(alloc: &CachingAllocator<SimBackend>, iters: u64, repeats: usize) -> f64 {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut live: Vec<_> =
        (0..1000).map(|_| alloc.malloc(rng.size(), StreamId::DEFAULT).unwrap().block.unwrap()).collect();
    let r = (0..repeats)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..iters {
                let j = (rng.next() % live.len() as u64) as usize;
                alloc.free(live[j]).unwrap();
                live[j] = alloc.malloc(rng.size(), StreamId::DEFAULT).unwrap().block.unwrap();
            }
            t0.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    for b in live {
        alloc.free(b).unwrap();
    }
    median(r)
}

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    // `mixed`: the default policy's mixed workload alone (the interleaved protocol of
    // scripts/gpu/run.sh alternates it with PyTorch's, process by process).
    if std::env::args().any(|a| a == "mixed") {
        let iters = args.first().copied().unwrap_or(200_000).max(1);
        let repeats = args.get(1).copied().unwrap_or(7).max(1) as usize;
        let alloc = CachingAllocator::new(SimBackend::new(0, 80 << 30), AllocatorConfig::parse("").unwrap());
        let ns = mixed(&alloc, iters, repeats);
        println!("{{\"impl\": \"gpumem_nb\", \"workload\": \"mixed_1000_live\", \"ns_per_pair\": {ns:.1}}}");
        return;
    }
    let iters = args.first().copied().unwrap_or(200_000).max(1);
    let repeats = args.get(1).copied().unwrap_or(7).max(1) as usize;
    for (name, conf) in [("gpumem_nb", ""), ("gpumem_nb_compact", "compact:True")] {
        let report = |workload: &str, ns: f64| {
            println!("{{\"impl\": \"{name}\", \"workload\": \"{workload}\", \"ns_per_pair\": {ns:.1}}}");
        };
        let fresh = || CachingAllocator::new(SimBackend::new(0, 80 << 30), AllocatorConfig::parse(conf).unwrap());
        for (workload, size) in [("hot/512", 512u64), ("hot/1048576", 1 << 20), ("hot/67108864", 64 << 20)] {
            report(workload, hot(&fresh(), size, iters, repeats));
        }
        report("mixed_1000_live", mixed(&fresh(), iters, repeats));
        if conf.is_empty() {
            // The stamp is set once around the workload, as a notebook stamps a step: every pair
            // is counted as an activation.
            let ns = gpumem_nb::component(Component::Activation, || hot(&fresh(), 512, iters, repeats));
            report("hot/512+component", ns);
        }
    }
}
