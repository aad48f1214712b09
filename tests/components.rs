//! What memory is, in the allocator's own statistics: `memory_stats()` keeps PyTorch 2.11's 122
//! keys until a block is allocated under a component stamp, then adds
//! `component_bytes.{component}.{allocated,current,freed,peak}` for every component (pytorch/pytorch
//! #182387's keys), unstamped blocks under `other`; the books agree with the blocks after every
//! operation, and the resets reset them as PyTorch's resets do.

use gpumem_nb::device::any::AnyBackend;
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::{AllocatorConfig, CachingAllocator, Component, DeviceBuffer, StreamId, components};
use std::sync::Arc;

const MIB: i64 = 1 << 20;

#[test]
fn component_bytes_follow_the_stamps() {
    let alloc =
        Arc::new(CachingAllocator::new(AnyBackend::Sim(SimBackend::new(0, 8 << 30)), AllocatorConfig::default()));
    let zeros = |mib: u64| DeviceBuffer::<u8>::zeros(&alloc, (mib as usize) << 20, StreamId::DEFAULT).unwrap();
    let stat = |c: &str, k: &str| alloc.memory_stats().get(&format!("component_bytes.{c}.{k}")).copied();
    let plain = zeros(1);
    assert_eq!(alloc.memory_stats().len(), 122, "no stamp yet: PyTorch 2.11's keys alone");
    let weights = gpumem_nb::component(Component::Parameter, || zeros(4));
    alloc.check_invariants().unwrap();
    let m = alloc.memory_stats();
    assert_eq!(m.len(), 122 + 8 * 4, "every component's four keys");
    assert_eq!(stat("parameter", "current"), Some(4 * MIB));
    assert_eq!(stat("other", "current"), Some(MIB), "the unstamped block");
    let moments = {
        let _g = components::enter(Component::OptimizerState);
        // Nested: the innermost stamp wins, and ends with its guard.
        let scratch = gpumem_nb::component(Component::Temp, || zeros(2));
        assert_eq!(stat("temp", "current"), Some(2 * MIB));
        drop(scratch);
        zeros(8)
    };
    alloc.check_invariants().unwrap();
    assert_eq!(stat("optimizer_state", "current"), Some(8 * MIB));
    assert_eq!(
        (stat("temp", "current"), stat("temp", "peak"), stat("temp", "freed")),
        (Some(0), Some(2 * MIB), Some(2 * MIB))
    );
    drop(weights);
    alloc.check_invariants().unwrap();
    assert_eq!(
        (
            stat("parameter", "allocated"),
            stat("parameter", "current"),
            stat("parameter", "freed"),
            stat("parameter", "peak")
        ),
        (Some(4 * MIB), Some(0), Some(4 * MIB), Some(4 * MIB))
    );
    let m = alloc.memory_stats();
    let sum: i64 = Component::ALL.iter().map(|c| m[&format!("component_bytes.{}.current", c.key())]).sum();
    assert_eq!(sum, m["allocated_bytes.all.current"], "the components add up to the allocated bytes");
    alloc.reset_peak_memory_stats();
    assert_eq!(stat("parameter", "peak"), Some(0));
    alloc.reset_accumulated_memory_stats();
    assert_eq!((stat("temp", "allocated"), stat("temp", "freed")), (Some(0), Some(0)));
    assert_eq!(stat("optimizer_state", "current"), Some(8 * MIB));
    drop((plain, moments));
    alloc.check_invariants().unwrap();
}
