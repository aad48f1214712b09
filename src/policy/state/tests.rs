//! Policy behaviour on the simulated device, one behaviour per test, invariants recounted
//! after every step. These also run under Miri (see README, "Testing").
use super::*;
use crate::device::sim::SimBackend;
use crate::policy::oom::AllocError;
use crate::units::{GIB, MIB};

fn setup(conf: &str) -> (DeviceState, SimBackend) {
    (DeviceState::new(0, AllocatorConfig::parse(conf).unwrap()), SimBackend::new(0, 8 * GIB))
}

fn alloc(s: &mut DeviceState, d: &mut SimBackend, n: u64) -> BlockId {
    let a = s.malloc(d, n, StreamId::DEFAULT).unwrap();
    s.check_invariants().unwrap();
    a.block.unwrap()
}

fn free(s: &mut DeviceState, d: &mut SimBackend, b: BlockId) {
    s.free(d, b).unwrap();
    s.check_invariants().unwrap();
}

#[test]
fn small_requests_share_a_2mib_segment_and_merge_back() {
    let (mut s, mut d) = setup("");
    let a = alloc(&mut s, &mut d, 1);
    let b = alloc(&mut s, &mut d, 1000);
    assert_eq!(s.segments().len(), 1);
    assert_eq!(s.block(b).unwrap().addr - s.block(a).unwrap().addr, 512);
    free(&mut s, &mut d, a);
    free(&mut s, &mut d, b);
    let segs = s.segments();
    assert_eq!(segs[0].blocks.len(), 1, "all blocks merged back into one");
    assert_eq!(s.stats().inactive_split[0].current, 0);
}

#[test]
fn best_fit_takes_smallest_then_lowest_address() {
    let (mut s, mut d) = setup("");
    // Three 2 MiB-ish large holes of different sizes inside one 20 MiB segment.
    let x: Vec<BlockId> =
        [3 * MIB, 2 * MIB, 4 * MIB, 2 * MIB, 2 * MIB].iter().map(|&n| alloc(&mut s, &mut d, n)).collect();
    let addr = |s: &DeviceState, b| s.block(b).unwrap().addr;
    let (a0, a2) = (addr(&s, x[0]), addr(&s, x[2]));
    free(&mut s, &mut d, x[0]);
    free(&mut s, &mut d, x[2]);
    let y = alloc(&mut s, &mut d, 3 * MIB);
    assert_eq!(addr(&s, y), a0, "3 MiB hole fits exactly and is smaller than the 4 MiB one");
    let z = alloc(&mut s, &mut d, 2 * MIB);
    assert_eq!(addr(&s, z), a2, "the 4 MiB hole is the smallest left");
}

#[test]
fn large_remainder_of_one_mib_or_less_is_not_split() {
    let (mut s, mut d) = setup("");
    let a = alloc(&mut s, &mut d, 21 * MIB);
    assert_eq!(s.block(a).unwrap().size, 22 * MIB);
    assert_eq!(s.stats().inactive_split_bytes[0].current, 0);
}

#[test]
fn streams_never_share_free_blocks() {
    let (mut s, mut d) = setup("");
    let a = alloc(&mut s, &mut d, 4 * MIB);
    free(&mut s, &mut d, a);
    let side = d.new_stream();
    s.malloc(&mut d, 4 * MIB, side).unwrap();
    assert_eq!(s.stats().reserved_bytes[0].current as u64, 40 * MIB);
}

#[test]
fn cross_stream_free_waits_for_the_event() {
    let (mut s, mut d) = setup("");
    let side = d.new_stream();
    let a = alloc(&mut s, &mut d, 4 * MIB);
    d.set_stream_busy(side, true);
    s.record_stream(a, side).unwrap();
    free(&mut s, &mut d, a);
    assert_eq!(s.pending_frees(), 1);
    assert_eq!(s.stats().active_bytes[0].current as u64, 4 * MIB);
    // Not complete yet: a new request cannot reuse it.
    let b = alloc(&mut s, &mut d, 4 * MIB);
    assert_ne!(s.block(b).unwrap().addr, s.block(a).map_or(0, |v| v.addr));
    assert_eq!(s.stats().reserved_bytes[0].current as u64, 20 * MIB, "the pending block's segment still has room");
    assert_eq!(s.pending_frees(), 1);
    d.synchronize();
    s.process_events(&mut d).unwrap();
    s.check_invariants().unwrap();
    assert_eq!(s.pending_frees(), 0);
    assert_eq!(s.stats().active_bytes[0].current as u64, 4 * MIB);
}

#[test]
fn oom_injection_releases_cache_and_retries() {
    let (mut s, mut d) = setup("");
    let a = alloc(&mut s, &mut d, 50 * MIB);
    free(&mut s, &mut d, a);
    d.fail_next_reserves(1);
    // 60 MiB does not fit the cached 50 MiB block: the device refuses once, the cache is
    // released, the retry succeeds.
    let b = alloc(&mut s, &mut d, 60 * MIB);
    assert_eq!(s.stats().num_alloc_retries, 1);
    assert_eq!(s.stats().num_device_free, 1, "the cached 50 MiB segment was released");
    assert!(s.block(b).is_some());
}

#[test]
fn slots_see_peaks_inside_their_own_window() {
    let (mut s, mut d) = setup("");
    let outer = s.open_slot();
    let a = alloc(&mut s, &mut d, 8 * MIB);
    free(&mut s, &mut d, a);
    let inner = s.open_slot();
    let b = alloc(&mut s, &mut d, 2 * MIB);
    assert_eq!(s.slot_peaks(inner).unwrap().allocated as u64, 2 * MIB);
    assert_eq!(s.slot_peaks(outer).unwrap().allocated as u64, 8 * MIB);
    s.reset_slot(inner);
    assert_eq!(s.slot_peaks(outer).unwrap().allocated as u64, 8 * MIB);
    s.reset_peak_stats();
    assert_eq!(s.slot_peaks(outer).unwrap().allocated as u64, 8 * MIB, "global reset leaves slots alone");
    free(&mut s, &mut d, b);
    s.close_slot(inner);
    assert!(s.slot_peaks(inner).is_none());
}

/// A deterministic pseudo-random walk (small enough for Miri) over every operation.
#[test]
fn random_walk_keeps_invariants() {
    for conf in
        ["", "max_split_size_mb:20", "expandable_segments:True", "compact:True", "compact:True,compact_slack_bp:0"]
    {
        let mut s = DeviceState::new(0, AllocatorConfig::parse(conf).unwrap());
        let mut d = SimBackend::new(0, 256 * MIB);
        let side = d.new_stream();
        let mut live: Vec<BlockId> = Vec::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let steps = if cfg!(miri) { 120 } else { 2000 };
        for _ in 0..steps {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 10 {
                0..=4 => {
                    let size = 1 + (x >> 8) % [4096, 2 * MIB, 40 * MIB][(x >> 4) as usize % 3];
                    let stream = if x & 0x100 == 0 { StreamId::DEFAULT } else { side };
                    if let Ok(a) = s.malloc(&mut d, size, stream) {
                        live.push(a.block.unwrap());
                    }
                }
                5..=7 if !live.is_empty() => {
                    let b = live.swap_remove((x >> 16) as usize % live.len());
                    if x & 0x200 != 0 {
                        d.set_stream_busy(StreamId(7), true);
                        s.record_stream(b, StreamId(7)).unwrap();
                    }
                    s.free(&mut d, b).unwrap();
                }
                8 => d.set_stream_busy(StreamId(7), false),
                9 => s.empty_cache(&mut d).unwrap(),
                _ => {}
            }
            s.check_invariants().unwrap_or_else(|e| panic!("{conf}: {e}"));
        }
        for b in live {
            s.free(&mut d, b).unwrap();
        }
        d.synchronize();
        s.empty_cache(&mut d).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.stats().reserved_bytes[0].current, 0, "{conf}");
        assert_eq!(d.used(), 0, "{conf}: every byte returned to the device");
    }
}

// ---------------------------------------------------------------------------------------------
// compact:True (our policy, `compact.rs`)

fn reserved(s: &DeviceState) -> u64 {
    s.stats().reserved_bytes[0].current as u64
}

#[test]
fn compact_keeps_small_and_large_requests_in_their_own_pages() {
    let (mut s, mut d) = setup("compact:True");
    let a = alloc(&mut s, &mut d, 500);
    let b = alloc(&mut s, &mut d, 3 * MIB);
    let c = alloc(&mut s, &mut d, 700 << 10);
    let (va, vb, vc) = (s.block(a).unwrap(), s.block(b).unwrap(), s.block(c).unwrap());
    assert_eq!(vc.addr, va.addr + 512, "small requests share the small arena's page");
    assert_eq!(reserved(&s), 6 * MIB, "a page for the small requests, two for 3 MiB");
    let st = s.stats();
    assert_eq!(st.segment[0].current, 0, "no segments, as with expandable segments");
    assert_eq!((st.allocated_bytes[1].current, st.allocated_bytes[2].current), (512 + (700 << 10), 3 << 20));
    assert_eq!((st.reserved_bytes[1].current, st.reserved_bytes[2].current), (2 << 20, 4 << 20));
    assert_eq!(st.num_device_alloc, 2);
    let segs = s.segments();
    let pools: Vec<(PoolKind, u64)> = segs.iter().map(|g| (g.pool, g.total_size)).collect();
    assert!(segs.iter().all(|g| g.is_expandable), "{pools:?}");
    assert!(pools.contains(&(PoolKind::Small, 2 * MIB)) && pools.contains(&(PoolKind::Large, 4 * MIB)), "{pools:?}");
    assert!(segs.iter().any(|g| g.blocks.iter().any(|k| k.addr == vb.addr)));
    // The large block's pages hold nothing small: once it is free they go back whole, while
    // the small blocks still live.
    free(&mut s, &mut d, b);
    assert_eq!(reserved(&s), 6 * MIB, "free never unmaps");
    s.empty_cache(&mut d).unwrap();
    s.check_invariants().unwrap();
    assert_eq!((reserved(&s), d.used()), (2 * MIB, 2 * MIB));
    free(&mut s, &mut d, a);
    free(&mut s, &mut d, c);
    assert_eq!(s.segments()[0].blocks.len(), 1, "merged back into one free block");
    s.empty_cache(&mut d).unwrap();
    s.check_invariants().unwrap();
    assert_eq!((reserved(&s), d.used()), (0, 0));
}

#[test]
fn compact_new_peak_takes_free_pages_instead_of_growing() {
    let (mut s, mut d) = setup("compact:True");
    let x = alloc(&mut s, &mut d, 6 * MIB);
    let _y = alloc(&mut s, &mut d, 6 * MIB);
    free(&mut s, &mut d, x);
    // 8 MiB fits no free block; it sets a new active peak, so x's three pages move.
    let z = alloc(&mut s, &mut d, 8 * MIB);
    assert_eq!(reserved(&s), 14 * MIB);
    assert_eq!(s.stats().reserved_bytes[0].peak as u64, 14 * MIB, "never more than the live bytes");
    assert_eq!(s.stats().num_device_free, 1, "one unmapped range");
    assert_eq!(s.block(z).unwrap().size, 8 * MIB);
    assert_eq!(d.used(), 14 * MIB);
}

/// Below its active peak, a request grows within the slack (pages created), or with no slack
/// takes free pages from elsewhere: reserved stays at the peak.
#[test]
fn compact_grows_within_the_slack_else_moves_pages() {
    for (conf, want_reserved, want_unmaps) in
        [("compact:True,compact_slack_bp:10000", 12 * MIB, 0), ("compact:True,compact_slack_bp:0", 10 * MIB, 1)]
    {
        let (mut s, mut d) = setup(conf);
        let x = alloc(&mut s, &mut d, 4 * MIB);
        let _y = alloc(&mut s, &mut d, 2 * MIB);
        let w = alloc(&mut s, &mut d, 4 * MIB);
        free(&mut s, &mut d, x);
        free(&mut s, &mut d, w);
        // Two 4 MiB holes; 6 MiB goes after y, over w's free pages, and needs one page more.
        let z = alloc(&mut s, &mut d, 6 * MIB);
        assert_eq!(reserved(&s), want_reserved, "{conf}");
        assert_eq!(s.stats().num_device_free, want_unmaps, "{conf}");
        assert_eq!(s.block(z).unwrap().addr, s.segments()[0].address + 6 * MIB, "{conf}");
    }
}

#[test]
fn compact_free_pages_move_between_streams() {
    let (mut s, mut d) = setup("compact:True");
    let x = alloc(&mut s, &mut d, 6 * MIB);
    free(&mut s, &mut d, x);
    let side = d.new_stream();
    let y = s.malloc(&mut d, 6 * MIB, side).unwrap();
    s.check_invariants().unwrap();
    assert_eq!(reserved(&s), 6 * MIB, "the default stream's free pages now back the side stream's block");
    let segs = s.segments();
    assert_eq!((segs.len(), segs[0].stream, segs[0].address), (1, side, y.addr));
}

#[test]
fn compact_pending_block_is_neither_reused_nor_moved_until_its_event() {
    let (mut s, mut d) = setup("compact:True");
    let side = d.new_stream();
    d.set_stream_busy(side, true);
    let x = alloc(&mut s, &mut d, 6 * MIB);
    let xa = s.block(x).unwrap().addr;
    s.record_stream(x, side).unwrap();
    free(&mut s, &mut d, x);
    let y = alloc(&mut s, &mut d, 6 * MIB);
    assert_ne!(s.block(y).unwrap().addr, xa);
    assert_eq!((reserved(&s), s.stats().num_device_free), (12 * MIB, 0));
    d.synchronize();
    s.process_events(&mut d).unwrap();
    s.check_invariants().unwrap();
    assert_eq!(s.pending_frees(), 0);
    let z = alloc(&mut s, &mut d, 6 * MIB);
    assert_eq!(s.block(z).unwrap().addr, xa, "reused once the event completed");
}

#[test]
fn compact_failed_growth_falls_back_to_moving_pages() {
    let (mut s, mut d) = setup("compact:True,compact_slack_bp:10000");
    let x = alloc(&mut s, &mut d, 4 * MIB);
    let _y = alloc(&mut s, &mut d, 2 * MIB);
    let w = alloc(&mut s, &mut d, 4 * MIB);
    free(&mut s, &mut d, x);
    free(&mut s, &mut d, w);
    d.fail_next_reserves(1);
    alloc(&mut s, &mut d, 6 * MIB);
    assert_eq!(reserved(&s), 10 * MIB);
    assert_eq!((s.stats().num_device_free, s.stats().num_alloc_retries), (1, 0));
}

#[test]
fn compact_out_of_memory_waits_for_events_then_reports() {
    let mut s = DeviceState::new(0, AllocatorConfig::parse("compact:True").unwrap());
    let mut d = SimBackend::new(0, 16 * MIB);
    let side = d.new_stream();
    d.set_stream_busy(side, true);
    let a = alloc(&mut s, &mut d, 12 * MIB);
    s.record_stream(a, side).unwrap();
    free(&mut s, &mut d, a);
    // The pending block holds the device: the retry after waiting for events reuses it.
    let b = alloc(&mut s, &mut d, 8 * MIB);
    assert_eq!((s.stats().num_alloc_retries, s.stats().num_sync_all_streams), (1, 1));
    assert_eq!(s.stats().num_ooms, 0);
    match s.malloc(&mut d, 10 * MIB, StreamId::DEFAULT) {
        Err(AllocError::OutOfMemory(r)) => {
            assert_eq!((r.alloc_size, r.reserved), (10 * MIB, 12 * MIB));
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    s.check_invariants().unwrap();
    assert_eq!((s.stats().num_ooms, s.stats().num_alloc_retries), (1, 2));
    free(&mut s, &mut d, b);
    alloc(&mut s, &mut d, 10 * MIB);
}

#[test]
fn compact_memory_fraction_caps_mapped_pages() {
    let (mut s, mut d) = setup("compact:True");
    s.set_memory_fraction((10 * MIB) as f64 / (8 * GIB) as f64, 8 * GIB).unwrap();
    let x = alloc(&mut s, &mut d, 8 * MIB);
    free(&mut s, &mut d, x);
    let _y = alloc(&mut s, &mut d, 10 * MIB);
    assert_eq!(reserved(&s), 10 * MIB, "x's pages moved, one created: at the limit");
    match s.malloc(&mut d, 1, StreamId::DEFAULT) {
        Err(AllocError::OutOfMemory(r)) => assert_eq!(r.allowed, Some(10 * MIB)),
        other => panic!("expected out of memory, got {other:?}"),
    }
    s.check_invariants().unwrap();
}

#[test]
fn compact_empty_cache_unmaps_whole_free_pages_only() {
    let (mut s, mut d) = setup("compact:True");
    let a = alloc(&mut s, &mut d, 1000);
    let b = alloc(&mut s, &mut d, 3 * MIB);
    free(&mut s, &mut d, b);
    s.empty_cache(&mut d).unwrap();
    s.check_invariants().unwrap();
    assert_eq!(reserved(&s), 2 * MIB, "the page holding the small block stays");
    free(&mut s, &mut d, a);
    s.empty_cache(&mut d).unwrap();
    s.check_invariants().unwrap();
    assert_eq!((reserved(&s), d.used()), (0, 0));
    assert!(s.segments().is_empty());
}
