//! A hot malloc/free loop on the simulated device, for profilers (callgrind, perf).
use gpumem_nb::backend::sim::SimBackend;
use gpumem_nb::{AllocatorConfig, DeviceState, StreamId};

fn main() {
    let size: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(512);
    let n: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let mut state = DeviceState::new(0, AllocatorConfig::default());
    let mut dev = SimBackend::new(0, 80 << 30);
    for _ in 0..n {
        let a = state.malloc(&mut dev, std::hint::black_box(size), StreamId::DEFAULT).unwrap();
        state.free(&mut dev, a.block.unwrap()).unwrap();
    }
    println!("{}", state.stats().allocation[0].allocated);
}
