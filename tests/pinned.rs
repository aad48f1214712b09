//! The caching host allocator (`gpumem_nb::pinned::HostAllocator`) on the simulated device: power-of-two
//! classes, reuse only after stream work completes, PyTorch's host stats, and round trips
//! through a `DeviceBuffer`.

use gpumem_nb::device::any::AnyBackend;
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::pinned::{HostAllocator, HostCacheState, HostMemoryKind, PinnedBuffer};
use gpumem_nb::units::GIB;
use gpumem_nb::{Allocator, AllocatorConfig, CachingAllocator, DeviceBuffer, Error, StreamId};
use std::sync::Arc;

fn sim(cap: u64) -> Arc<Allocator> {
    Arc::new(CachingAllocator::new(AnyBackend::Sim(SimBackend::new(0, cap)), AllocatorConfig::default()))
}

fn busy(a: &Arc<Allocator>, stream: StreamId, busy: bool) {
    a.with_backend(|b| b.as_sim_mut().unwrap().set_stream_busy(stream, busy));
}

#[test]
fn a_freed_block_is_reused_for_the_same_size_class() {
    let host = HostAllocator::simulated();
    assert_eq!(host.memory_kind(), HostMemoryKind::Heap);
    let b1 = PinnedBuffer::<f32>::alloc(&host, 1000).unwrap(); // 4000 B -> 4096 B block
    assert_eq!((b1.len(), b1.num_bytes(), b1.block_size()), (1000, 4000, 4096));
    let p1 = b1.as_ptr();
    drop(b1);
    let b2 = PinnedBuffer::<f32>::alloc(&host, 700).unwrap(); // 2800 B: same class
    assert_eq!(b2.as_ptr(), p1, "the cached block comes back");
    assert_eq!(b2.block_size(), 4096);
    let b3 = PinnedBuffer::<f32>::alloc(&host, 1500).unwrap(); // 6000 B -> 8192 B: a new block
    assert_ne!(b3.as_ptr(), p1);
    let s = host.stats();
    assert_eq!((s.num_host_alloc, s.num_host_free), (2, 0));
    assert_eq!((s.allocation.current, s.allocation.allocated, s.allocation.freed), (2, 3, 1));
    assert_eq!((s.reserved_bytes.current, s.allocated_bytes.current), (4096 + 8192, 4096 + 8192));
    // A block of another element type of the same class is reused too (fresh heap memory).
    drop(b2);
    let b4 = PinnedBuffer::<u8>::alloc(&host, 4096).unwrap();
    assert_eq!(b4.as_slice().unwrap().len(), 4096);
    assert_eq!(host.stats().num_host_alloc, 2);
    drop((b3, b4));
}

#[test]
fn stats_after_alloc_free_and_empty_cache() {
    let host = HostAllocator::simulated();
    let a = PinnedBuffer::<u64>::alloc(&host, 100).unwrap(); // 800 B -> 1024
    let b = PinnedBuffer::<u8>::alloc(&host, 3000).unwrap(); // -> 4096
    let m = host.host_memory_stats();
    assert_eq!(m.len(), 28);
    let expect = |m: &std::collections::BTreeMap<String, i64>, k: &str, v: i64| assert_eq!(m[k], v, "{k}");
    expect(&m, "allocation.current", 2);
    expect(&m, "allocation.peak", 2);
    expect(&m, "segment.current", 2);
    expect(&m, "allocated_bytes.current", 5120);
    expect(&m, "reserved_bytes.current", 5120);
    expect(&m, "num_host_alloc", 2);
    expect(&m, "num_host_free", 0);
    expect(&m, "host_alloc_time.count", 2);

    drop(a);
    let m = host.host_memory_stats();
    expect(&m, "allocation.current", 1);
    expect(&m, "allocation.freed", 1);
    expect(&m, "allocated_bytes.current", 4096);
    expect(&m, "allocated_bytes.peak", 5120);
    expect(&m, "segment.current", 2);
    expect(&m, "reserved_bytes.current", 5120);
    assert_eq!(host.cache_state(), HostCacheState { cached_blocks: 1, cached_bytes: 1024, ..Default::default() });

    // empty_cache returns the free block only; the one in use stays.
    host.empty_cache().unwrap();
    let m = host.host_memory_stats();
    expect(&m, "segment.current", 1);
    expect(&m, "segment.freed", 1);
    expect(&m, "reserved_bytes.current", 4096);
    expect(&m, "reserved_bytes.peak", 5120);
    expect(&m, "num_host_free", 1);
    expect(&m, "host_free_time.count", 1);
    expect(&m, "allocation.current", 1);

    drop(b);
    host.empty_cache().unwrap();
    let s = host.stats();
    assert_eq!((s.segment.current, s.reserved_bytes.current, s.allocation.current), (0, 0, 0));
    assert_eq!((s.num_host_alloc, s.num_host_free), (2, 2));
    assert_eq!(host.cache_state(), HostCacheState::default());

    host.reset_peak_host_memory_stats();
    host.reset_accumulated_host_memory_stats();
    let m = host.host_memory_stats();
    expect(&m, "reserved_bytes.peak", 0);
    expect(&m, "allocation.allocated", 0);
    expect(&m, "num_host_alloc", 0);
    expect(&m, "host_alloc_time.count", 0);
    expect(&m, "host_alloc_time.max", 0);

    let text = host.stats().to_string();
    assert!(text.contains("allocated_bytes") && text.contains("heap (simulated)"), "{text}");
    assert!(host.stats().bundle().html.unwrap().starts_with("<div class=\"gpumem-table\""));
}

#[test]
fn round_trip_host_device_host() {
    let a = sim(GIB);
    let host = HostAllocator::for_device(&a);
    assert_eq!(host.memory_kind(), HostMemoryKind::Heap, "simulated device: heap memory");
    let data: Vec<f64> = (0..5000).map(|i| i as f64 * 0.25).collect();
    let src = PinnedBuffer::from_slice(&host, &data).unwrap();
    let dev = src.to_device(&a, StreamId::DEFAULT).unwrap();
    assert_eq!(dev.to_host().unwrap(), data);
    let mut back = PinnedBuffer::<f64>::alloc(&host, data.len()).unwrap();
    back.copy_from_device_async(&dev, StreamId::DEFAULT).unwrap();
    assert_eq!(back.to_vec().unwrap(), data);

    // Overwrite on the device side, copy back into the same pinned buffer.
    let mut dev2 = DeviceBuffer::<f64>::zeros(&a, data.len(), StreamId::DEFAULT).unwrap();
    back.as_mut_slice().unwrap()[0] = -1.0;
    back.copy_to_device_async(&mut dev2, StreamId::DEFAULT).unwrap();
    assert_eq!(dev2.to_host().unwrap()[0], -1.0);
    assert_eq!(dev2.to_host().unwrap()[1..], data[1..]);

    // Lengths must match.
    let short = PinnedBuffer::<f64>::alloc(&host, 10).unwrap();
    assert!(matches!(short.copy_to_device_async(&mut dev2, StreamId::DEFAULT), Err(Error::InvalidArgument(_))));
    drop((src, back, short, dev, dev2));
    a.check_invariants().unwrap();
}

#[test]
fn a_block_is_reused_only_after_the_stream_work_completes() {
    let a = sim(GIB);
    let host = HostAllocator::for_device(&a);
    let side = a.new_stream().unwrap();
    let mut dev = DeviceBuffer::<u32>::zeros(&a, 1024, StreamId::DEFAULT).unwrap();

    busy(&a, side, true);
    let b1 = PinnedBuffer::from_slice(&host, &[7u32; 1024]).unwrap();
    let p1 = b1.as_ptr();
    b1.copy_to_device_async(&mut dev, side).unwrap(); // used on the busy stream
    drop(b1);
    assert_eq!(host.cache_state().pending_blocks, 1);
    let s = host.stats();
    assert_eq!(s.allocation.current, 1, "a pending block still counts as allocated");

    // Same class while the stream is busy: a new block.
    let b2 = PinnedBuffer::<u32>::alloc(&host, 1024).unwrap();
    assert_ne!(b2.as_ptr(), p1);
    assert_eq!(host.stats().num_host_alloc, 2);
    // empty_cache does not touch a pending block.
    host.empty_cache().unwrap();
    assert_eq!(host.stats().segment.current, 2);

    busy(&a, side, false);
    let b3 = PinnedBuffer::<u32>::alloc(&host, 1000).unwrap();
    assert_eq!(b3.as_ptr(), p1, "reused once the event completed");
    assert_eq!(b3.as_slice().unwrap()[0], 7, "contents are whatever the block held");
    let s = host.stats();
    assert_eq!((s.num_host_alloc, s.allocation.current, s.allocation.freed), (2, 2, 1));
    assert_eq!(dev.to_host().unwrap(), vec![7u32; 1024]);
    drop((b2, b3));
    drop(dev);
    a.check_invariants().unwrap();
}

#[test]
fn record_stream_defers_reuse_and_downloads_count_as_uses() {
    let a = sim(GIB);
    let host = HostAllocator::for_device(&a);
    let side = a.new_stream().unwrap();
    busy(&a, side, true);
    let b = PinnedBuffer::<u8>::alloc(&host, 512).unwrap();
    let p = b.as_ptr();
    b.record_stream(&a, side);
    b.record_stream(&a, side); // named once
    drop(b);
    assert_eq!(host.cache_state().pending_blocks, 1);
    let other = PinnedBuffer::<u8>::alloc(&host, 512).unwrap();
    assert_ne!(other.as_ptr(), p);
    drop(other);

    // A download on the busy stream keeps its block too.
    let src = DeviceBuffer::from_host(&a, &[3u8; 256], StreamId::DEFAULT).unwrap();
    let mut d = PinnedBuffer::<u8>::alloc(&host, 256).unwrap();
    d.copy_from_device_async(&src, side).unwrap();
    assert_eq!(d.to_vec().unwrap(), vec![3u8; 256]);
    drop(d);
    assert_eq!(host.cache_state().pending_blocks, 2);

    busy(&a, side, false);
    host.empty_cache().unwrap();
    let st = host.cache_state();
    assert_eq!((st.pending_blocks, st.cached_blocks), (0, 0));
    assert_eq!(host.stats().segment.current, 0);
    drop(src);
    a.check_invariants().unwrap();
}

#[test]
fn empty_buffers_take_no_block() {
    let host = HostAllocator::simulated();
    let e = PinnedBuffer::<f32>::alloc(&host, 0).unwrap();
    let z = PinnedBuffer::<[u8; 0]>::alloc(&host, 5).unwrap();
    assert!(e.is_empty() && e.block_size() == 0);
    assert_eq!(z.len(), 5);
    assert_eq!(z.as_slice().unwrap().len(), 5);
    assert_eq!(host.stats().segment.allocated, 0);
    let a = sim(GIB);
    let d = e.to_device(&a, StreamId::DEFAULT).unwrap();
    assert!(d.is_empty());
    drop((e, z, d));
    assert_eq!(host.stats().allocation.allocated, 0);
}

/// An allocator on CUDA device 0, for the GPU tests: they are `#[ignore]`d, so a plain `cargo
/// test` reports them ignored, and a GPU machine runs them with `--include-ignored`
/// (`scripts/gpu/run.sh`). Without a usable GPU this fails, saying why: a GPU test that ran
/// nothing must not count as passed.
#[cfg(feature = "cuda")]
fn gpu() -> Arc<Allocator> {
    use gpumem_nb::device::cuda::{CudaBackend, probe};
    if let Err(why) = probe() {
        panic!("this GPU test needs an NVIDIA GPU (CUDA device 0), and none is usable here: {why}");
    }
    let b = CudaBackend::new(0).expect("the CUDA probe found a device, so device 0 opens");
    Arc::new(CachingAllocator::new(AnyBackend::Cuda(b), AllocatorConfig::default()))
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --test pinned -- --include-ignored, on a GPU machine"]
fn gpu_pinned_round_trip_on_a_stream_and_reuse() {
    let a = gpu();
    let host = HostAllocator::for_device(&a);
    assert_eq!(host.memory_kind(), HostMemoryKind::Pinned);
    let s = a.new_stream().unwrap();
    let data: Vec<f32> = (0..(1u32 << 22)).map(|i| i as f32 * 0.5).collect(); // 16 MiB
    let src = PinnedBuffer::from_slice(&host, &data).unwrap();
    assert_eq!((src.memory_kind(), src.block_size()), (HostMemoryKind::Pinned, 16 << 20));
    let mut dev = DeviceBuffer::<f32>::alloc(&a, data.len(), s).unwrap();
    src.copy_to_device_async(&mut dev, s).unwrap();
    let mut back = PinnedBuffer::<f32>::alloc(&host, data.len()).unwrap();
    back.copy_from_device_async(&dev, s).unwrap();
    assert!(back.as_slice().unwrap() == &data[..], "the slice waits for the download");
    // Upload through the default stream into a buffer of another stream, and read it back.
    let mut dev2 = DeviceBuffer::<f32>::alloc(&a, data.len(), StreamId::DEFAULT).unwrap();
    back.as_mut_slice().unwrap()[0] = -3.0;
    back.copy_to_device_async(&mut dev2, s).unwrap(); // dev2 is marked used on `s`
    a.with_backend(|b| b.as_cuda().unwrap().stream(s).unwrap().synchronize()).unwrap();
    let got = dev2.to_host().unwrap();
    assert_eq!(got[0], -3.0);
    assert!(got[1..] == data[1..]);
    let p = src.as_ptr();
    drop(src);
    // Its copy completed long ago: the block comes back for the same class.
    let again = PinnedBuffer::<f32>::alloc(&host, data.len() - 5).unwrap();
    assert_eq!(again.as_ptr(), p);
    let st = host.stats();
    assert_eq!((st.num_host_alloc, st.segment.current, st.reserved_bytes.current), (2, 2, 32 << 20));
    drop((again, back));
    host.empty_cache().unwrap();
    let st = host.stats();
    assert_eq!((st.segment.current, st.num_host_free), (0, 2));
    eprintln!("{st}");
    drop((dev, dev2));
    a.check_invariants().unwrap();
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --test pinned -- --include-ignored, on a GPU machine"]
fn gpu_dropping_right_after_a_queued_copy_is_safe() {
    let a = gpu();
    let host = HostAllocator::for_device(&a);
    let s = a.new_stream().unwrap();
    let n = 64usize << 20; // 256 MiB of f32: the copies take a while
    let dev = DeviceBuffer::<f32>::zeros(&a, n, s).unwrap();
    for _ in 0..3 {
        let mut b = PinnedBuffer::<f32>::alloc(&host, n).unwrap();
        b.copy_from_device_async(&dev, s).unwrap();
        drop(b); // pending until the copy completes; the memory waits for it before any reuse
    }
    host.empty_cache().unwrap();
    let mut b = PinnedBuffer::<f32>::alloc(&host, n).unwrap();
    b.copy_from_device_async(&dev, s).unwrap();
    assert!(b.as_slice().unwrap().iter().all(|&x| x == 0.0));
    drop(b);
    drop(host); // waits for pending work, frees every block
    drop(dev);
    a.check_invariants().unwrap();
}

#[test]
fn buffers_and_caches_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<PinnedBuffer<f32>>();
    send_sync::<HostAllocator>();
    send_sync::<gpumem_nb::pinned::HostStats>();
    let host = HostAllocator::simulated();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let host = Arc::clone(&host);
            std::thread::spawn(move || {
                for i in 0..50usize {
                    let b = PinnedBuffer::from_slice(&host, &vec![t as u16; 1 + (i * 37) % 3000]).unwrap();
                    assert!(b.as_slice().unwrap().iter().all(|&x| x == t as u16));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = host.stats();
    assert_eq!((s.allocation.current, s.allocation.allocated, s.allocation.freed), (0, 200, 200));
    assert!(s.segment.current <= 4 * 13, "at most one block per thread and class: {}", s.segment.current);
    host.empty_cache().unwrap();
    assert_eq!(host.stats().reserved_bytes.current, 0);
}
