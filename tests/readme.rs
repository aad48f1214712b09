//! The README's examples, run: the numbers and the message it shows are the ones the code
//! produces (on the simulated device, as on a machine without a GPU).

use gpumem_nb::backend::sim::SimBackend;
use gpumem_nb::{AllocatorConfig, AnyBackend, CachingAllocator, DeviceBuffer, StreamId};
use std::sync::Arc;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

fn sim(capacity: u64) -> Arc<gpumem_nb::Allocator> {
    Arc::new(CachingAllocator::new(AnyBackend::Sim(SimBackend::new(0, capacity)), AllocatorConfig::default()))
}

#[test]
fn tour_numbers_are_what_the_allocator_reports() {
    let alloc = sim(80 << 30);
    let x = DeviceBuffer::<f32>::zeros(&alloc, 1 << 20, StreamId::DEFAULT).unwrap();
    let y = DeviceBuffer::from_host(&alloc, &[1.0f32, 2.0, 3.0], StreamId::DEFAULT).unwrap();
    assert_eq!(y.to_host().unwrap(), vec![1.0, 2.0, 3.0]);
    let text = readme();
    assert_eq!(alloc.memory_allocated(), 4_194_816);
    assert!(text.contains("alloc.memory_allocated();    // 4,194,816 bytes"));
    assert_eq!(alloc.memory_reserved(), 23_068_672);
    assert!(text.contains("alloc.memory_reserved();     // 23,068,672 bytes"));
    drop(x);
    assert_eq!(alloc.memory_reserved(), 23_068_672);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.memory_reserved(), 2 << 20, "y's small segment stays");
    let slot = alloc.peak_slot();
    drop(DeviceBuffer::<u8>::zeros(&alloc, 64 << 20, StreamId::DEFAULT).unwrap());
    assert_eq!(slot.peaks().allocated, (64 << 20) + 512);
}

#[test]
fn oom_message_in_readme_is_the_real_one() {
    // The conformance case D on a simulated card of the H200's size.
    let alloc = sim(150_109_880_320);
    let _keep = alloc.malloc(3 << 20, StreamId::DEFAULT).unwrap();
    let tmp = alloc.malloc(50 << 20, StreamId::DEFAULT).unwrap();
    alloc.free(tmp.block.unwrap()).unwrap();
    let msg = alloc.malloc(1 << 40, StreamId::DEFAULT).unwrap_err().to_string();
    let shown: String = readme()
        .split("CUDA out of memory. Tried to allocate 1024.00 GiB")
        .nth(1)
        .and_then(|rest| rest.split('…').next())
        .map(|s| format!("CUDA out of memory. Tried to allocate 1024.00 GiB{}", s.replace('\n', " ")))
        .expect("README shows the message");
    assert!(msg.starts_with(shown.trim_end()), "README:\n{shown}\nreal:\n{msg}");
}
