//! Property tests: random sequences of every allocator operation on the simulated device, with
//! `check_invariants()` after every step — blocks tile each segment exactly and in order, free
//! blocks are exactly the pool entries, no two mergeable neighbours are left apart, segments
//! never overlap, and every current statistic equals a recount from the blocks. The same
//! sequences run under PyTorch's policies and under our `compact` one. After every step the
//! reserved bytes' explanation adds up, and what it says `empty_cache` returns is what it does.

use gpumem_nb::blocks::BlockId;
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::{AllocError, AllocatorConfig, CachingAllocator, StreamId};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, stream: u8 },
    Free { pick: usize },
    RecordStream { pick: usize, stream: u8 },
    SetBusy { stream: u8, busy: bool },
    EmptyCache,
    DeviceRefuses { n: u8 },
    Fraction { percent: u8 },
    ResetPeaks,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![1u64..2048, 2048u64..(1 << 20), (1u64 << 20)..(12 << 20), (12u64 << 20)..(96 << 20)];
    prop_oneof![
        8 => (size, 0u8..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        6 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0u8..3).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        2 => (0u8..3, any::<bool>()).prop_map(|(stream, busy)| Op::SetBusy { stream, busy }),
        1 => Just(Op::EmptyCache),
        1 => (1u8..3).prop_map(|n| Op::DeviceRefuses { n }),
        1 => (0u8..=100).prop_map(|percent| Op::Fraction { percent }),
        1 => Just(Op::ResetPeaks),
    ]
}

fn run(conf: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let alloc = CachingAllocator::new(SimBackend::new(0, 512 << 20), AllocatorConfig::parse(conf).unwrap());
    let streams: Vec<StreamId> =
        (0..3).map(|i| if i == 0 { StreamId::DEFAULT } else { alloc.with_backend(|b| b.new_stream()) }).collect();
    let mut live: Vec<(BlockId, u64)> = Vec::new();
    for op in ops {
        match *op {
            Op::Alloc { size, stream } => match alloc.malloc(size, streams[stream as usize]) {
                Ok(a) => {
                    let b = a.block.unwrap();
                    prop_assert!(a.size >= size && a.size % 512 == 0);
                    live.push((b, a.addr));
                }
                Err(AllocError::OutOfMemory(r)) => prop_assert!(r.alloc_size >= size),
                Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e}"))),
            },
            Op::Free { pick } if !live.is_empty() => {
                let (b, _) = live.swap_remove(pick % live.len());
                alloc.free(b).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(alloc.free(b).is_err(), "a second free of the same block is refused");
            }
            Op::RecordStream { pick, stream } if !live.is_empty() => {
                let (b, _) = live[pick % live.len()];
                alloc.record_stream(b, streams[stream as usize]).unwrap();
            }
            Op::SetBusy { stream, busy } => alloc.with_backend(|d| d.set_stream_busy(streams[stream as usize], busy)),
            Op::EmptyCache => {
                // What the explanation said empty_cache would return is what it returns.
                let (parts, before) = (alloc.reserved_parts(), alloc.memory_reserved());
                alloc.empty_cache().unwrap();
                prop_assert_eq!(before - alloc.memory_reserved(), parts.releasable, "{:?}", parts);
            }
            Op::DeviceRefuses { n } => alloc.with_backend(|d| d.fail_next_reserves(n as u32)),
            Op::Fraction { percent } => alloc.set_per_process_memory_fraction(percent as f64 / 100.0).unwrap(),
            Op::ResetPeaks => alloc.reset_peak_memory_stats(),
            _ => {}
        }
        alloc.check_invariants().map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
        // Every reserved byte is in exactly one part of the explanation.
        let parts = alloc.reserved_parts();
        parts.check().map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
        prop_assert_eq!(parts.reserved, alloc.memory_reserved());
        prop_assert_eq!(parts.allocated(), alloc.memory_allocated());
        // Live blocks never overlap one another.
        let mut spans: Vec<(u64, u64)> =
            live.iter().map(|(b, a)| (*a, alloc.block(*b).map(|v| v.size).unwrap_or(0))).collect();
        spans.sort();
        prop_assert!(spans.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "live blocks overlap");
        // The device's accounting agrees with the allocator's.
        let (reserved, used) = (alloc.memory_reserved(), alloc.with_backend(|d| d.used()));
        prop_assert_eq!(reserved, used, "reserved bytes equal the simulated device's used bytes");
    }
    // Everything returns: free all, complete every stream, release the cache.
    for (b, _) in live {
        alloc.free(b).unwrap();
    }
    alloc.with_backend(|d| d.synchronize());
    alloc.set_per_process_memory_fraction(1.0).unwrap();
    alloc.empty_cache().unwrap();
    alloc.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(alloc.memory_reserved(), 0);
    prop_assert_eq!(alloc.memory_allocated(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn default_policy(ops in prop::collection::vec(op(), 1..200)) {
        run("", &ops)?;
    }

    #[test]
    fn oversize_blocks_and_power2_rounding(ops in prop::collection::vec(op(), 1..200)) {
        run("max_split_size_mb:24,roundup_power2_divisions:[1:4,64:2,>:1]", &ops)?;
    }

    #[test]
    fn garbage_collection(ops in prop::collection::vec(op(), 1..200)) {
        run("garbage_collection_threshold:0.6", &ops)?;
    }

    #[test]
    fn expandable_segments(ops in prop::collection::vec(op(), 1..200)) {
        run("expandable_segments:True", &ops)?;
    }

    #[test]
    fn compact(ops in prop::collection::vec(op(), 1..200)) {
        run("compact:True", &ops)?;
    }

    /// No slack: every page needed beyond the active peak is taken from elsewhere.
    #[test]
    fn compact_without_slack(ops in prop::collection::vec(op(), 1..200)) {
        run("compact:True,compact_slack_bp:0,roundup_power2_divisions:[1:4,64:2,>:1]", &ops)?;
    }

    /// A generous slack: pages mostly created, rarely moved.
    #[test]
    fn compact_with_slack(ops in prop::collection::vec(op(), 1..200)) {
        run("compact:True,compact_slack_bp:5000", &ops)?;
    }
}
