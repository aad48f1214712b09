//! `check_invariants`: the block graph, the pools and the statistics recounted from scratch.
//!
//! Checked: blocks of a segment are linked both ways, contiguous and on one stream; free
//! mapped blocks are exactly the pool entries, under their (stream, size, address) key; no two
//! mergeable free neighbours are left unmerged; segments never overlap; pages of expandable
//! segments and compact arenas agree with the blocks on them; and every current statistic (allocation, allocated/active/requested/reserved bytes, segments, inactive
//! split blocks and bytes, oversize counters) equals a recount from the graph.
#![forbid(unsafe_code)]

use super::block::{Block, ExpandableSegment, NIL};
use super::rounding::PoolKind;
use super::state::{DeviceState, PAGE};

fn idx(p: PoolKind) -> usize {
    match p {
        PoolKind::Small => 1,
        PoolKind::Large => 2,
    }
}

/// A broken invariant of an allocator's state: the first violation found, in one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvariantViolation(pub String);

impl std::fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "allocator invariant violated: {}", self.0)
    }
}

impl std::error::Error for InvariantViolation {}

impl DeviceState {
    /// Checks every structural and statistical invariant; `Err` names the first violation.
    pub(crate) fn check_invariants(&self) -> Result<(), InvariantViolation> {
        check(self).map_err(InvariantViolation)
    }
}

fn check(state: &DeviceState) -> Result<(), String> {
    let (arena, small, large, expandable, stats, total_reserved) = state.parts();
    let max_split = state.config().max_split_size;
    let compact = state.config().compact;
    // Under compact: active bytes per (stream, pool), an arena's (for the granule's lower bound
    // on reserved).
    let mut live_by_arena: std::collections::BTreeMap<(u64, usize), u64> = Default::default();
    let mergeable = |b: &Block| !b.allocated && b.event_count == 0 && !b.has_uses;

    // [all, small, large] recounts
    let mut allocation = [0i64; 3];
    let mut allocated = [0i64; 3];
    let mut active = [0i64; 3];
    let mut active_bytes = [0i64; 3];
    let mut requested = [0i64; 3];
    let mut segment = [0i64; 3];
    let mut reserved = [0i64; 3];
    let mut inactive_split = [0i64; 3];
    let mut inactive_split_bytes = [0i64; 3];
    let mut oversize_alloc = 0i64;
    let mut oversize_seg = 0i64;
    let mut free_mapped = 0usize;
    let mut unmapped = 0usize;
    let mut spans: Vec<(u64, u64)> = Vec::new();
    let mut by_component = [0i64; 8];

    for (i, b) in arena.live() {
        let p = idx(b.pool);
        let add = |arr: &mut [i64; 3], n: i64| {
            arr[0] += n;
            arr[p] += n;
        };
        if b.size == 0 {
            return Err(format!("block {i} at {:#x} has size 0", b.addr));
        }
        if b.next != NIL {
            let n = arena.get(b.next);
            if !n.live || n.prev != i || n.addr != b.addr + b.size || n.stream != b.stream || n.pool != b.pool {
                return Err(format!("block {i} at {:#x}: broken link to next block {}", b.addr, b.next));
            }
            if b.mapped == n.mapped && mergeable(b) && mergeable(n) {
                return Err(format!("free neighbours at {:#x} and {:#x} were not merged", b.addr, n.addr));
            }
        }
        if b.prev != NIL && arena.get(b.prev).next != i {
            return Err(format!("block {i} at {:#x}: broken link to previous block", b.addr));
        }
        if b.allocated {
            add(&mut allocation, 1);
            add(&mut allocated, b.size as i64);
            by_component[usize::from(b.component).min(by_component.len() - 1)] += b.size as i64;
            if b.size >= max_split {
                oversize_alloc += 1;
            }
        }
        if b.is_active() {
            if b.requested_size > b.size {
                return Err(format!("block at {:#x}: requested {} > size {}", b.addr, b.requested_size, b.size));
            }
            add(&mut active, 1);
            add(&mut active_bytes, b.size as i64);
            add(&mut requested, b.requested_size as i64);
            *live_by_arena.entry((b.stream.0, p)).or_default() += b.size;
        }
        if b.is_expandable() {
            check_pages(&expandable[b.expandable as usize], b)?;
        }
        let pool = if b.pool == PoolKind::Small { small } else { large };
        if b.mapped {
            let in_pool = pool.blocks.get(&b.free_key()) == Some(&i);
            if mergeable(b) != in_pool {
                return Err(format!(
                    "block at {:#x} (allocated {}, events {}) pool membership {in_pool} is wrong",
                    b.addr, b.allocated, b.event_count
                ));
            }
            if in_pool {
                free_mapped += 1;
            }
            if b.is_expandable() && compact {
                // Per pool from the pages' owners, below.
                reserved[0] += b.size as i64;
            } else if b.is_expandable() {
                add(&mut reserved, b.size as i64);
            } else if mergeable(b) && b.is_split() {
                add(&mut inactive_split, 1);
                add(&mut inactive_split_bytes, b.size as i64);
            }
        } else {
            if pool.unmapped.get(&(b.stream.0, b.addr)) != Some(&i) {
                return Err(format!("unmapped block at {:#x} missing from the unmapped set", b.addr));
            }
            unmapped += 1;
        }
        if b.prev == NIL && !b.is_expandable() {
            let mut total = 0;
            let mut c = i;
            while c != NIL {
                total += arena.get(c).size;
                c = arena.get(c).next;
            }
            add(&mut segment, 1);
            add(&mut reserved, total as i64);
            if total >= max_split {
                oversize_seg += 1;
            }
            spans.push((b.addr, total));
        }
    }
    for es in expandable.iter().filter(|e| e.live) {
        spans.push((es.base, es.size));
        if compact {
            for owner in es.pages.iter().flatten() {
                reserved[idx(*owner)] += es.page as i64;
            }
        }
    }
    if compact {
        // The 2 MiB granule: an arena's live bytes need at least that many whole pages.
        let floor: u64 = live_by_arena.values().map(|v| v.div_ceil(PAGE) * PAGE).sum();
        if total_reserved < floor {
            return Err(format!("reserved {total_reserved} is below the granule's floor {floor}"));
        }
    }
    small.blocks.check()?;
    large.blocks.check()?;
    let pool_entries = small.blocks.len() + large.blocks.len();
    if pool_entries != free_mapped {
        return Err(format!("pools hold {pool_entries} entries but {free_mapped} free blocks exist"));
    }
    if small.unmapped.len() + large.unmapped.len() != unmapped {
        return Err("unmapped set holds stale entries".into());
    }
    spans.sort();
    for w in spans.windows(2) {
        if w[0].0 + w[0].1 > w[1].0 {
            return Err(format!("segments at {:#x} and {:#x} overlap", w[0].0, w[1].0));
        }
    }
    let checks: [(&str, &crate::stats::StatArray, [i64; 3]); 9] = [
        ("allocation", &stats.allocation, allocation),
        ("allocated_bytes", &stats.allocated_bytes, allocated),
        ("active", &stats.active, active),
        ("active_bytes", &stats.active_bytes, active_bytes),
        ("requested_bytes", &stats.requested_bytes, requested),
        ("segment", &stats.segment, segment),
        ("reserved_bytes", &stats.reserved_bytes, reserved),
        ("inactive_split", &stats.inactive_split, inactive_split),
        ("inactive_split_bytes", &stats.inactive_split_bytes, inactive_split_bytes),
    ];
    for (name, arr, want) in checks {
        for (t, key) in ["all", "small_pool", "large_pool"].iter().enumerate() {
            if arr[t].current != want[t] {
                return Err(format!("{name}.{key}.current is {} but the blocks add up to {}", arr[t].current, want[t]));
            }
            if arr[t].current > arr[t].peak {
                return Err(format!("{name}.{key}: current above peak"));
            }
        }
    }
    for (c, (stat, want)) in state.component_stats().iter().zip(by_component).enumerate() {
        if stat.current != want || stat.current > stat.peak {
            return Err(format!(
                "component_bytes.{}.current is {} (peak {}) but its blocks add up to {want}",
                crate::record::component::Component::ALL[c].key(),
                stat.current,
                stat.peak
            ));
        }
    }
    if stats.oversize_allocations.current != oversize_alloc {
        return Err(format!("oversize_allocations.current {} != {oversize_alloc}", stats.oversize_allocations.current));
    }
    if stats.oversize_segments.current != oversize_seg {
        return Err(format!("oversize_segments.current {} != {oversize_seg}", stats.oversize_segments.current));
    }
    if total_reserved as i64 != stats.reserved_bytes[0].current {
        return Err(format!(
            "total reserved {total_reserved} != reserved_bytes.all.current {}",
            stats.reserved_bytes[0].current
        ));
    }
    Ok(())
}

/// A block of an expandable segment or compact arena agrees with the pages under it: an
/// unmapped block is whole pages, all unmapped; every page a mapped block touches is mapped and
/// counted for the block's pool (an arena's blocks and pages all have its pool).
fn check_pages(es: &ExpandableSegment, b: &Block) -> Result<(), String> {
    let (first, last) = (es.page_of(b.addr), es.page_of(b.addr + b.size - 1));
    let pages = &es.pages[first..=last];
    if b.mapped {
        if pages.iter().any(Option::is_none) {
            return Err(format!("mapped block at {:#x} lies on an unmapped page", b.addr));
        }
        if pages.iter().any(|p| *p != Some(b.pool)) {
            return Err(format!("mapped block at {:#x} lies on a page counted for another pool", b.addr));
        }
    } else if !(b.addr - es.base).is_multiple_of(es.page) || !b.size.is_multiple_of(es.page) {
        return Err(format!("unmapped block at {:#x} (+{}) is not whole pages", b.addr, b.size));
    } else if pages.iter().any(Option::is_some) {
        return Err(format!("unmapped block at {:#x} holds a mapped page", b.addr));
    }
    Ok(())
}
