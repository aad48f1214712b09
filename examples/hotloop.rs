//! Allocation loops on the simulated device through the allocator's public front (what every
//! caller pays: the policy under its mutex), for profilers (callgrind, perf):
//! `hotloop hot SIZE N` (one malloc/free pair of SIZE, N times) or
//! `hotloop mixed N` (1000 live log-uniform blocks of 512 B–8 MiB, N random free+malloc pairs).
//! The policy is `GPUMEM_NB_ALLOC_CONF`'s (e.g. `compact:True`), PyTorch's default if unset.
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::{AllocatorConfig, CachingAllocator, StreamId};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: u64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let config = AllocatorConfig::from_env().expect("GPUMEM_NB_ALLOC_CONF");
    let alloc = CachingAllocator::new(SimBackend::new(0, 80 << 30), config);
    if args.get(1).map(String::as_str) == Some("mixed") {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut size = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (2f64.powf(9.0 + (x >> 11) as f64 / (1u64 << 53) as f64 * 14.0) as u64, x)
        };
        let mut live: Vec<_> =
            (0..1000).map(|_| alloc.malloc(size().0, StreamId::DEFAULT).unwrap().block.unwrap()).collect();
        for _ in 0..arg(2, 100_000) {
            let (s, r) = size();
            let i = (r % 1000) as usize;
            alloc.free(live[i]).unwrap();
            live[i] = alloc.malloc(s, StreamId::DEFAULT).unwrap().block.unwrap();
        }
    } else {
        let size = arg(2, 512);
        for _ in 0..arg(3, 200_000) {
            let a = alloc.malloc(std::hint::black_box(size), StreamId::DEFAULT).unwrap();
            alloc.free(a.block.unwrap()).unwrap();
        }
    }
    let s = alloc.stats();
    println!(
        "allocations {} segments {} free blocks cached {} reserved {} maps {} unmaps {}",
        s.allocation[0].allocated,
        s.segment[0].current,
        s.inactive_split[0].current,
        s.reserved_bytes[0].current,
        s.num_device_alloc,
        s.num_device_free
    );
}
