use super::*;
use crate::buffer::DeviceBuffer;
use crate::device::any::AnyBackend;
use crate::error::AllocError;
use crate::error::Error;
use cudarc::driver::DeviceSlice;
#[cfg(feature = "nvrtc")]
use cudarc::driver::PushKernelArg;

/// Runs everywhere: without a driver library the probe is an error value, not a panic.
#[test]
fn probe_without_driver_is_an_error_value() {
    let probed = probe();
    // On a GPU machine, `GPUMEM_NB_EXPECT_GPU=1` makes sure the probe finds the GPU.
    if std::env::var_os("GPUMEM_NB_EXPECT_GPU").is_some() {
        assert!(probed.is_ok(), "GPUMEM_NB_EXPECT_GPU is set, but: {probed:?}");
    }
    if !library_present() {
        let reason = probed.expect_err("no libcuda here, so the probe must fail");
        assert!(matches!(&reason, DeviceError::Unavailable(r) if r.contains("libcuda")), "{reason}");
        match CudaBackend::new(0) {
            Err(e) => assert_eq!(e, reason),
            Ok(_) => panic!("expected Unavailable, got a backend"),
        }
        // Cached: asking again gives the same answer and still does not panic.
        assert_eq!(probe(), Err(reason));
    } else {
        match probed {
            Ok(n) => {
                assert!(n >= 1);
                assert!(matches!(CudaBackend::new(n), Err(DeviceError::Unavailable(r)) if r.contains("requested")));
            }
            Err(reason) => {
                eprintln!("driver present, no usable device: {reason}");
                assert!(matches!(CudaBackend::new(0), Err(e) if e == reason))
            }
        }
    }
}

/// GPU tests run one at a time: some of them fill the device on purpose.
static GPU_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Device 0, holding the GPU lock while the test runs. The GPU tests below are ignored on a
/// host without one (`cargo test --lib -- --include-ignored` runs them); run there without a
/// usable GPU, they fail naming why.
fn gpu() -> (std::sync::MutexGuard<'static, ()>, CudaBackend) {
    if let Err(why) = probe() {
        panic!("this GPU test needs an NVIDIA GPU (CUDA device 0), and none is usable here: {why}");
    }
    let guard = crate::sync::lock(&GPU_LOCK);
    (guard, CudaBackend::new(0).expect("probe found a device, so it opens"))
}

fn gpu_allocator(conf: &str) -> (std::sync::MutexGuard<'static, ()>, Arc<crate::allocator::Allocator>) {
    let (guard, b) = gpu();
    let config = crate::policy::config::AllocatorConfig::parse(conf).unwrap();
    (guard, Arc::new(crate::allocator::CachingAllocator::new(AnyBackend::Cuda(b), config)))
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_reserve_release_and_oom() {
    let (_gpu, mut b) = gpu();
    let (free, total) = b.mem_get_info().unwrap();
    assert_eq!(total, b.total_memory());
    assert!(free <= total);
    let a = b.reserve(2 << 20, StreamId::DEFAULT).unwrap();
    assert_ne!(a, 0);
    assert!(b.release(a, 4 << 20).is_err(), "wrong size is refused");
    b.release(a, 2 << 20).unwrap();
    assert!(b.release(a, 2 << 20).is_err(), "double release is refused");
    // Far more than the card has: out-of-memory, as a value.
    assert_eq!(b.reserve(total * 4, StreamId::DEFAULT), Err(DeviceError::OutOfMemory));
    // And the device still works afterwards.
    let a = b.reserve(2 << 20, StreamId::DEFAULT).unwrap();
    b.release(a, 2 << 20).unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_vmm_map_unmap() {
    let (_gpu, mut b) = gpu();
    let page = 2u64 << 20;
    let va = b.reserve_address_range(64 * page).unwrap();
    b.map_pages(va, page, 3).unwrap();
    assert!(b.map_pages(va + page, page, 1).is_err(), "already mapped");
    assert!(b.map_pages(va + 63 * page, page, 2).is_err(), "outside the range");
    assert!(b.release_address_range(va, 64 * page).is_err(), "pages still mapped");
    // Mapping more than the device has fails all-or-nothing with OutOfMemory.
    let big = 64 * page;
    let huge = b.total_memory() / big + 2;
    let va2 = b.reserve_address_range(huge * big).unwrap();
    assert_eq!(b.map_pages(va2, big, huge), Err(DeviceError::OutOfMemory));
    assert_eq!(b.pages.len(), 3, "the failed call left nothing mapped");
    b.release_address_range(va2, huge * big).unwrap();
    b.unmap_pages(va, page, 3, StreamId::DEFAULT).unwrap();
    b.release_address_range(va, 64 * page).unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_streams_and_events() {
    let (_gpu, mut b) = gpu();
    let s = b.new_stream().unwrap();
    assert_ne!(s, StreamId::DEFAULT);
    assert!(b.stream(s).is_some());
    assert!(b.stream(StreamId(0xdead_0000)).is_none());
    assert!(b.record_event(StreamId(0xdead_0000)).is_err(), "unknown streams are refused");
    let e = b.record_event(s).unwrap();
    b.stream(s).unwrap().synchronize().unwrap();
    assert!(b.query_event(e).unwrap());
    assert!(b.query_event(e).is_err(), "a completed event is released");
    // The pooled event is reused.
    let e2 = b.record_event(StreamId::DEFAULT).unwrap();
    assert_eq!(e2, e);
    b.synchronize_event(e2).unwrap();
    let e3 = b.record_event(PER_THREAD_STREAM).unwrap();
    b.synchronize_event(e3).unwrap();
    // Adopting a stream from cudarc.
    let foreign = b.context().new_stream().unwrap();
    let id = b.adopt_stream(Arc::clone(&foreign)).unwrap();
    assert_eq!(id, stream_id(&foreign));
    let e4 = b.record_event(id).unwrap();
    b.synchronize_event(e4).unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_sleep_keeps_a_stream_busy() {
    let (_gpu, mut b) = gpu();
    let s = b.new_stream().unwrap();
    b.sleep_on_stream(s, std::time::Duration::from_millis(300)).unwrap();
    let e = b.record_event(s).unwrap();
    assert!(!b.query_event(e).unwrap(), "the event waits for the sleeping host function");
    b.synchronize_event(e).unwrap();
    assert!(b.sleep_on_stream(StreamId(0xdead_0000), std::time::Duration::from_millis(1)).is_err());
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_buffers_round_trip_zero_and_return_memory() {
    let (_gpu, a) = gpu_allocator("");
    let data: Vec<f32> = (0..100_000).map(|i| i as f32).collect();
    let b = DeviceBuffer::from_host(&a, &data, StreamId::DEFAULT).unwrap();
    assert_eq!(b.to_host().unwrap(), data);
    let addr = b.addr();
    drop(b);
    assert_eq!(a.memory_allocated(), 0);
    // The cached block comes back, and `zeros` really clears it.
    let z = DeviceBuffer::<f32>::zeros(&a, data.len(), StreamId::DEFAULT).unwrap();
    assert_eq!(z.addr(), addr);
    assert!(z.to_host().unwrap().iter().all(|&x| x == 0.0));
    drop(z);
    // A buffer on a stream of its own.
    let s = a.with_state(|_, b| Backend::new_stream(b)).unwrap();
    let mut u = DeviceBuffer::<u64>::alloc(&a, 4096, s).unwrap();
    let v: Vec<u64> = (0..4096u64).map(|i| i * 0x1_0000_0001).collect();
    u.copy_from_host(&v).unwrap();
    assert_eq!(u.to_host().unwrap(), v);
    assert_eq!(u.stream(), s);
    drop(u);
    let empty = DeviceBuffer::<u8>::from_host(&a, &[], StreamId::DEFAULT).unwrap();
    assert!(empty.to_host().unwrap().is_empty());
    drop(empty);
    a.check_invariants().unwrap();
    assert_eq!(a.memory_allocated(), 0);
    assert!(a.memory_reserved() > 0);
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_out_of_memory_is_a_value() {
    let (_gpu, a) = gpu_allocator("");
    let total = a.with_state(|_, b| b.total_memory()) as usize;
    let err = DeviceBuffer::<u8>::alloc(&a, total * 2, StreamId::DEFAULT).unwrap_err();
    assert!(matches!(err, Error::Alloc(AllocError::OutOfMemory(_))), "{err}");
    assert!(err.to_string().starts_with("CUDA out of memory. Tried to allocate"), "{err}");
    // The device still works afterwards.
    let b = DeviceBuffer::from_host(&a, &[1u32, 2, 3], StreamId::DEFAULT).unwrap();
    assert_eq!(b.to_host().unwrap(), vec![1, 2, 3]);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_expandable_segments() {
    let (_gpu, a) = gpu_allocator("expandable_segments:True");
    let mut bufs = Vec::new();
    for i in 0..20u32 {
        let n = ((i as usize % 5) + 1) * (3 << 20);
        let v: Vec<u32> = (0..n as u32).map(|x| x ^ i).collect();
        bufs.push((DeviceBuffer::from_host(&a, &v, StreamId::DEFAULT).unwrap(), v));
    }
    for (b, v) in &bufs {
        assert_eq!(&b.to_host().unwrap(), v);
    }
    assert!(a.segments().iter().any(|s| s.is_expandable));
    drop(bufs);
    a.check_invariants().unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
}

/// `compact:True` on a real device: pages mapped per 2 MiB, whole free pages unmapped and
/// mapped again where a request needs them (across streams too), data intact through every
/// move, a block pending on a busy stream left alone, the memory fraction and out-of-memory
/// as values, `empty_cache` back to zero.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_compact_policy() {
    let (_gpu, a) = gpu_allocator("compact:True");
    let sleep =
        |s| a.with_state(|_, b| b.as_cuda_mut().unwrap().sleep_on_stream(s, std::time::Duration::from_millis(300)));
    let sync = |s| a.with_state(|_, b| b.as_cuda().unwrap().stream(s).unwrap().synchronize());
    compact_scenario(&a, &|s| sleep(s).unwrap(), &|s| sync(s).unwrap());
}

/// The same scenario on the simulated device (so it is checked on every machine).
#[test]
fn compact_scenario_on_the_simulated_device() {
    let sim = AnyBackend::Sim(crate::device::sim::SimBackend::new(0, 80 << 30));
    let a = Arc::new(crate::allocator::CachingAllocator::new(
        sim,
        crate::policy::config::AllocatorConfig::parse("compact:True").unwrap(),
    ));
    let busy = |s, on| a.with_backend(|b| b.as_sim_mut().unwrap().set_stream_busy(s, on));
    compact_scenario(&a, &|s| busy(s, true), &|s| busy(s, false));
}

/// `hold(s)` keeps work pending on stream `s` for a while, `settle(s)` waits for it.
fn compact_scenario(a: &Arc<crate::allocator::Allocator>, hold: &dyn Fn(StreamId), settle: &dyn Fn(StreamId)) {
    const MIB: usize = 1 << 20;
    let words = |n: usize, seed: u32| -> Vec<u32> {
        (0..(n / 4) as u32).map(|x| x.wrapping_mul(2_654_435_761) ^ seed).collect()
    };
    // Small and large requests keep to pages of their own: a page for 512 B, two for 3 MiB.
    let small = DeviceBuffer::from_host(a, &words(512, 1), StreamId::DEFAULT).unwrap();
    let large = DeviceBuffer::from_host(a, &words(3 * MIB, 2), StreamId::DEFAULT).unwrap();
    assert_ne!(large.addr(), small.addr() + 512);
    assert_eq!(a.memory_reserved(), 6 << 20);
    // A new active peak takes x's free pages: unmapped there, mapped for z (x at 3 MiB in the
    // large arena, y after it: x's free block holds two whole pages).
    let x = DeviceBuffer::from_host(a, &words(6 * MIB, 3), StreamId::DEFAULT).unwrap();
    let y = DeviceBuffer::from_host(a, &words(6 * MIB, 4), StreamId::DEFAULT).unwrap();
    drop(x);
    let z = DeviceBuffer::from_host(a, &words(10 * MIB, 5), StreamId::DEFAULT).unwrap();
    assert_eq!(a.stats().num_device_free, 1, "x's two whole pages were moved");
    assert_eq!(a.memory_reserved(), 24 << 20);
    assert_eq!(a.max_memory_reserved(), 24 << 20, "never more than now");
    assert_eq!(z.to_host().unwrap(), words(10 * MIB, 5));
    assert_eq!(y.to_host().unwrap(), words(6 * MIB, 4));
    assert_eq!(large.to_host().unwrap(), words(3 * MIB, 2));
    // Free pages of the default stream back a side stream's buffer.
    let side = a.new_stream().unwrap();
    drop(z);
    let w = DeviceBuffer::from_host(a, &words(8 * MIB, 6), side).unwrap();
    assert_eq!(a.memory_reserved(), 24 << 20, "moved, not created");
    assert_eq!(w.to_host().unwrap(), words(8 * MIB, 6));
    a.check_invariants().unwrap();
    // A block freed while a busy stream still uses it is neither reused nor unmapped.
    let p = DeviceBuffer::from_host(a, &words(8 * MIB, 7), StreamId::DEFAULT).unwrap();
    let busy = a.new_stream().unwrap();
    hold(busy);
    p.record_stream(busy).unwrap();
    let p_addr = p.addr();
    drop(p);
    let q = DeviceBuffer::from_host(a, &words(8 * MIB, 8), StreamId::DEFAULT).unwrap();
    assert_ne!(q.addr(), p_addr);
    assert_eq!(q.to_host().unwrap(), words(8 * MIB, 8));
    settle(busy);
    a.check_invariants().unwrap();
    drop((small, large, y, w, q));
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    // Out of memory is a value, with PyTorch's message; the device works afterwards.
    let total = a.with_state(|_, b| b.total_memory()) as usize;
    let err = DeviceBuffer::<u8>::alloc(a, total * 2, StreamId::DEFAULT).unwrap_err();
    assert!(matches!(err, Error::Alloc(AllocError::OutOfMemory(_))), "{err}");
    assert!(err.to_string().starts_with("CUDA out of memory. Tried to allocate"), "{err}");
    // Under a memory fraction of 64 MiB: pages move to stay under it, then out of memory.
    a.set_per_process_memory_fraction((64 * MIB) as f64 / total as f64).unwrap();
    let f1 = DeviceBuffer::from_host(a, &words(40 * MIB, 9), StreamId::DEFAULT).unwrap();
    drop(f1);
    let f2 = DeviceBuffer::from_host(a, &words(60 * MIB, 10), StreamId::DEFAULT).unwrap();
    assert!(a.memory_reserved() <= (64 * MIB) as u64);
    let err = DeviceBuffer::<u8>::alloc(a, 8 * MIB, StreamId::DEFAULT).unwrap_err();
    assert!(matches!(err, Error::Alloc(AllocError::OutOfMemory(_))), "{err}");
    assert_eq!(f2.to_host().unwrap(), words(60 * MIB, 10));
    drop(f2);
    a.set_per_process_memory_fraction(1.0).unwrap();
    a.check_invariants().unwrap();
    a.empty_cache().unwrap();
    assert_eq!((a.memory_reserved(), a.memory_allocated()), (0, 0));
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_record_stream_defers_reuse() {
    let (_gpu, a) = gpu_allocator("");
    let side = a.with_state(|_, b| Backend::new_stream(b)).unwrap();
    let b = DeviceBuffer::<u8>::zeros(&a, 1 << 20, StreamId::DEFAULT).unwrap();
    b.record_stream(side).unwrap();
    drop(b);
    // The event recorded on `side` completes; later allocations process it.
    a.with_state(|_, be| be.as_cuda().unwrap().stream(side).unwrap().synchronize()).unwrap();
    let again = DeviceBuffer::<u8>::zeros(&a, 1 << 20, StreamId::DEFAULT).unwrap();
    drop(again);
    a.check_invariants().unwrap();
    assert_eq!(a.memory_allocated(), 0);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_cudarc_copies_through_views() {
    let (_gpu, a) = gpu_allocator("");
    let host: Vec<f64> = (0..5000).map(|i| i as f64 / 3.0).collect();
    let mut x = DeviceBuffer::<f64>::alloc(&a, host.len(), StreamId::DEFAULT).unwrap();
    let mut y = DeviceBuffer::<f64>::alloc(&a, host.len(), StreamId::DEFAULT).unwrap();
    {
        let mut v = x.cuda_mut().unwrap();
        let stream = Arc::clone(DeviceSlice::stream(&v));
        stream.memcpy_htod(&host, &mut v).unwrap();
        stream.memcpy_dtod(&x.cuda().unwrap(), &mut y.cuda_mut().unwrap()).unwrap();
        assert_eq!(stream.clone_dtoh(&y.cuda().unwrap()).unwrap(), host);
        stream.memset_zeros(&mut x.cuda_mut().unwrap()).unwrap();
        assert!(stream.clone_dtoh(&x.cuda().unwrap()).unwrap().iter().all(|&v| v == 0.0));
    }
    assert_eq!(y.to_host().unwrap(), host);
}

/// `out[i] = out[i] * 2 + v` for `i < n`, hand-written PTX (no NVRTC library needed).
#[cfg(feature = "nvrtc")]
const AXPB_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry axpb(
.param .u64 out,
.param .f32 v,
.param .u32 n
)
{
.reg .pred %p<2>;
.reg .b32 %r<6>;
.reg .f32 %f<4>;
.reg .b64 %rd<5>;

ld.param.u64 %rd1, [out];
ld.param.f32 %f1, [v];
ld.param.u32 %r2, [n];
mov.u32 %r3, %ctaid.x;
mov.u32 %r4, %ntid.x;
mov.u32 %r5, %tid.x;
mad.lo.s32 %r1, %r3, %r4, %r5;
setp.ge.u32 %p1, %r1, %r2;
@%p1 bra DONE;
cvta.to.global.u64 %rd2, %rd1;
mul.wide.u32 %rd3, %r1, 4;
add.s64 %rd4, %rd2, %rd3;
ld.global.f32 %f2, [%rd4];
fma.rn.f32 %f3, %f2, 0f40000000, %f1;
st.global.f32 [%rd4], %f3;
DONE:
ret;
}
"#;

#[cfg(feature = "nvrtc")]
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_kernel_launch_on_views() {
    use cudarc::driver::LaunchConfig;
    let (_gpu, a) = gpu_allocator("expandable_segments:True");
    let ctx = a.with_state(|_, b| Arc::clone(b.as_cuda().unwrap().context()));
    let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(AXPB_PTX)).unwrap();
    let f = module.load_function("axpb").unwrap();
    let n = 3_000_000u32; // 12 MB: more than one 2 MiB page of the expandable segment
    let host: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let mut buf = DeviceBuffer::from_host(&a, &host, StreamId::DEFAULT).unwrap();
    {
        let view = buf.cuda_mut().unwrap();
        let stream = Arc::clone(DeviceSlice::stream(&view));
        let mut launch = stream.launch_builder(&f);
        launch.arg(&view).arg(&0.5f32).arg(&n);
        // SAFETY: `axpb` takes (float*, float, unsigned) and touches out[0..n), which the
        // view covers (n f32 elements).
        unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.unwrap();
        stream.synchronize().unwrap();
    }
    let out = buf.to_host().unwrap();
    assert!(out.iter().zip(&host).all(|(&o, &h)| o == h * 2.0 + 0.5));
}

#[cfg(feature = "cublas")]
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --lib -- --include-ignored, on a GPU machine"]
fn gpu_cublas_gemm_on_views() {
    use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
    let (_gpu, a) = gpu_allocator("");
    // SAFETY: only tries to dlopen the cuBLAS library (no cudarc symbol is resolved).
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        eprintln!("skipped: no libcublas");
        return;
    }
    // Column-major 2×2: A = identity, B = [[1, 3], [2, 4]] (columns (1,2) and (3,4)).
    let ida = DeviceBuffer::from_host(&a, &[1.0f32, 0.0, 0.0, 1.0], StreamId::DEFAULT).unwrap();
    let bm = DeviceBuffer::from_host(&a, &[1.0f32, 2.0, 3.0, 4.0], StreamId::DEFAULT).unwrap();
    let mut c = DeviceBuffer::<f32>::zeros(&a, 4, StreamId::DEFAULT).unwrap();
    {
        let av = ida.cuda().unwrap();
        let bv = bm.cuda().unwrap();
        let mut cv = c.cuda_mut().unwrap();
        let blas = CudaBlas::new(Arc::clone(DeviceSlice::stream(&cv))).unwrap();
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: 2,
            n: 2,
            k: 2,
            alpha: 1.0f32,
            lda: 2,
            ldb: 2,
            beta: 0.0f32,
            ldc: 2,
        };
        // SAFETY: the three views hold 4 f32 each, as m = n = k = 2 with leading dimension 2
        // needs.
        unsafe { blas.gemm(cfg, &av, &bv, &mut cv) }.unwrap();
    }
    assert_eq!(c.to_host().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
}
