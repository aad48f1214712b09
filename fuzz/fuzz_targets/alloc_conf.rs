//! `GPUMEM_NB_ALLOC_CONF` / `PYTORCH_CUDA_ALLOC_CONF` strings: a malformed one is a one-line
//! error naming what was wrong; an accepted one gives an allocator that works.
#![no_main]

use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::{AllocatorConfig, CachingAllocator, StreamId};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match AllocatorConfig::parse(text) {
        Ok(config) => {
            let alloc = CachingAllocator::new(SimBackend::new(0, 1 << 30), config);
            for size in [1, 512, 1 << 20, (1 << 20) + 1, 3 << 20, 12 << 20, 50 << 20] {
                if let Ok(a) = alloc.malloc(size, StreamId::DEFAULT) {
                    alloc.free(a.block.expect("a block for a non-empty request")).expect("free");
                }
                alloc.check_invariants().expect("invariants");
            }
            alloc.empty_cache().expect("empty_cache");
            assert_eq!(alloc.memory_reserved(), 0);
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty() && !msg.contains('\n'), "{msg:?}");
        }
    }
});
