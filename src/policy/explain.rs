//! Every reserved byte explained: where the bytes an allocator holds from the device are, in
//! parts that add up to the reserved total.
//!
//! PyTorch's answer to "why is memory reserved but not allocated" is one number in its
//! out-of-memory message. [`ReservedParts`] splits `reserved` exactly, block by block:
//!
//! - `requested`: what the program asked for, in blocks it still holds;
//! - `rounding`: what those blocks hold beyond the request (512-byte rounding, power-of-two
//!   divisions, a remainder too small to split off, a whole oversize block);
//! - `pending_free`: blocks the program freed that wait for another stream's work
//!   (`record_stream`) before they can be reused;
//! - `cached`: free blocks kept for reuse, by pool and size class.
//!
//! `requested + rounding + pending_free + Σ cached = reserved`, and `reserved − allocated =
//! pending_free + Σ cached`. Of the free and pending bytes, `releasable` is what `empty_cache()`
//! would return now (found by running it on a copy of the state: the same code, so the same
//! answer, for every policy), the rest sits in segments that still hold live blocks
//! (fragmentation). The largest free block of each pool says whether a request of a given size
//! can be served from the cache at all ([`ReservedParts::serves`]).
#![forbid(unsafe_code)]

use super::rounding::{PoolKind, round_size};
use super::state::DeviceState;
use crate::device::{Backend, BackendKind, DeviceError, EventId, StreamId};
use crate::units::{GIB, KIB, MIB};
use serde::{Deserialize, Serialize};

/// Upper bounds (exclusive) of the size classes free blocks are counted in; the last class is
/// everything from 1 GiB up.
const CLASS_BOUNDS: [u64; 7] = [64 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, GIB];

/// Free cached blocks of one pool and size class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedClass {
    /// `small` or `large`.
    pub pool: String,
    /// Smallest block size in the class (bytes).
    pub min: u64,
    /// First size above the class (bytes); `None` for the last class.
    pub max: Option<u64>,
    /// Free blocks.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl CachedClass {
    /// `64.00 KiB – 1.00 MiB`, `≥ 1.00 GiB`.
    pub fn label(&self) -> String {
        use crate::units::iec;
        match self.max {
            Some(m) if self.min == 0 => format!("< {}", iec(m)),
            Some(m) => format!("{} – {}", iec(self.min), iec(m)),
            None => format!("≥ {}", iec(self.min)),
        }
    }
}

/// Where an allocator's reserved bytes are (see the module docs). Bytes throughout.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservedParts {
    /// Bytes obtained from the device (`reserved_bytes.all.current`).
    pub reserved: u64,
    /// Sum of the requests of the blocks the program holds.
    pub requested: u64,
    /// What those blocks hold beyond their requests.
    pub rounding: u64,
    /// Freed blocks waiting for other streams' work before reuse.
    pub pending_free: u64,
    /// Free cached blocks by pool and size class (only non-empty classes, small pool first).
    pub cached: Vec<CachedClass>,
    /// What `empty_cache()` would return now.
    pub releasable: u64,
    /// The largest free block of the small pool (0: none).
    pub largest_free_small: u64,
    /// The largest free block of the large pool (0: none).
    pub largest_free_large: u64,
}

impl ReservedParts {
    /// Bytes of allocated blocks: `requested + rounding`.
    pub fn allocated(&self) -> u64 {
        self.requested + self.rounding
    }

    /// Bytes of free cached blocks.
    pub fn cached_bytes(&self) -> u64 {
        self.cached.iter().map(|c| c.bytes).sum()
    }

    /// Free cached bytes of one pool.
    pub fn cached_in(&self, pool: &str) -> u64 {
        self.cached.iter().filter(|c| c.pool == pool).map(|c| c.bytes).sum()
    }

    /// Free and pending bytes `empty_cache()` would keep: they share segments with live blocks.
    pub fn kept(&self) -> u64 {
        (self.pending_free + self.cached_bytes()).saturating_sub(self.releasable)
    }

    /// Whether the parts add up: `requested + rounding + pending_free + Σ cached = reserved`,
    /// and no more can be released than is free or pending.
    pub fn check(&self) -> Result<(), super::InvariantViolation> {
        let sum = self.requested + self.rounding + self.pending_free + self.cached_bytes();
        if sum != self.reserved {
            return Err(super::InvariantViolation(format!(
                "the parts add up to {sum} bytes, reserved is {}",
                self.reserved
            )));
        }
        if self.releasable > self.pending_free + self.cached_bytes() {
            return Err(super::InvariantViolation(format!(
                "releasable {} exceeds the free and pending bytes {}",
                self.releasable,
                self.pending_free + self.cached_bytes()
            )));
        }
        Ok(())
    }

    /// Whether the cache could serve a request of `size` bytes without new memory from the
    /// device: its rounded size fits in the largest free block of its pool. (PyTorch's best fit
    /// also needs the block on the request's stream; this looks at every stream.)
    pub fn serves(&self, size: u64) -> bool {
        let rounded = round_size(size, &Default::default());
        let largest = match PoolKind::for_size(rounded) {
            PoolKind::Small => self.largest_free_small,
            PoolKind::Large => self.largest_free_large,
        };
        rounded <= largest
    }
}

/// Size class index of a free block.
fn class_of(size: u64) -> usize {
    CLASS_BOUNDS.iter().position(|&b| size < b).unwrap_or(CLASS_BOUNDS.len())
}

/// A device that accepts whatever `empty_cache` gives back: running it on a copy of the state
/// tells what it would release.
struct Discard;

impl Backend for Discard {
    fn kind(&self) -> BackendKind {
        BackendKind::Simulated
    }
    fn device_index(&self) -> i32 {
        0
    }
    fn total_memory(&self) -> u64 {
        u64::MAX
    }
    fn mem_get_info(&mut self) -> Result<(u64, u64), DeviceError> {
        Ok((u64::MAX, u64::MAX))
    }
    fn reserve(&mut self, _size: u64, _stream: StreamId) -> Result<u64, DeviceError> {
        Err(DeviceError::OutOfMemory)
    }
    fn release(&mut self, _addr: u64, _size: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn reserve_address_range(&mut self, _size: u64) -> Result<u64, DeviceError> {
        Err(DeviceError::OutOfMemory)
    }
    fn release_address_range(&mut self, _addr: u64, _size: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn map_pages(&mut self, _addr: u64, _page_size: u64, _pages: u64) -> Result<(), DeviceError> {
        Err(DeviceError::OutOfMemory)
    }
    fn unmap_pages(&mut self, _addr: u64, _page_size: u64, _pages: u64, _stream: StreamId) -> Result<(), DeviceError> {
        Ok(())
    }
    fn record_event(&mut self, _stream: StreamId) -> Result<EventId, DeviceError> {
        Ok(EventId(0))
    }
    fn query_event(&mut self, _event: EventId) -> Result<bool, DeviceError> {
        Ok(true)
    }
    fn synchronize_event(&mut self, _event: EventId) -> Result<(), DeviceError> {
        Ok(())
    }
}

impl DeviceState {
    /// Where the reserved bytes are now (see [`ReservedParts`]). `&mut` only to set the
    /// recorded history aside while the state is copied; nothing observable changes.
    pub(crate) fn reserved_parts(&mut self) -> ReservedParts {
        let mut parts = self.reserved_parts_kept();
        parts.releasable = self.releasable_bytes();
        parts
    }

    /// The parts without `releasable` (left 0): one walk over the blocks, no copy.
    pub(crate) fn reserved_parts_kept(&self) -> ReservedParts {
        let mut parts = ReservedParts::default();
        let mut classes = [[(0u64, 0u64); CLASS_BOUNDS.len() + 1]; 2];
        for seg in self.segments() {
            parts.reserved += seg.total_size;
            for b in &seg.blocks {
                if b.allocated {
                    parts.requested += b.requested_size;
                    parts.rounding += b.size - b.requested_size.min(b.size);
                } else if b.active {
                    parts.pending_free += b.size;
                } else {
                    let (p, largest) = match seg.pool {
                        PoolKind::Small => (0, &mut parts.largest_free_small),
                        PoolKind::Large => (1, &mut parts.largest_free_large),
                    };
                    *largest = (*largest).max(b.size);
                    let c = &mut classes[p][class_of(b.size)];
                    c.0 += 1;
                    c.1 += b.size;
                }
            }
        }
        for (p, pool) in [(0, PoolKind::Small), (1, PoolKind::Large)] {
            for (i, &(blocks, bytes)) in classes[p].iter().enumerate() {
                if blocks > 0 {
                    parts.cached.push(CachedClass {
                        pool: pool.name().into(),
                        min: if i == 0 { 0 } else { CLASS_BOUNDS[i - 1] },
                        max: CLASS_BOUNDS.get(i).copied(),
                        blocks,
                        bytes,
                    });
                }
            }
        }
        parts
    }

    /// What `empty_cache()` would return now: it runs on a copy of the state (without the
    /// recorded history and stacks, which it does not need).
    fn releasable_bytes(&mut self) -> u64 {
        let history = std::mem::take(&mut self.history);
        let ctx = self.take_contexts();
        let mut copy = self.clone();
        self.history = history;
        self.restore_contexts(ctx);
        let before = copy.total_reserved();
        match copy.empty_cache(&mut Discard) {
            Ok(()) => before - copy.total_reserved(),
            Err(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::SimBackend;
    use crate::policy::config::AllocatorConfig;

    fn state(conf: &str) -> (DeviceState, SimBackend) {
        (DeviceState::new(0, AllocatorConfig::parse(conf).unwrap()), SimBackend::new(0, 8 * GIB))
    }

    #[test]
    fn parts_of_a_known_state() {
        let (mut s, mut d) = state("");
        let a = s.malloc(&mut d, 1000, StreamId::DEFAULT).unwrap(); // 1024 in a 2 MiB small segment
        let b = s.malloc(&mut d, 3 * MIB, StreamId::DEFAULT).unwrap(); // 3 MiB in a 20 MiB segment
        let c = s.malloc(&mut d, 30 * MIB, StreamId::DEFAULT).unwrap(); // its own 30 MiB segment
        s.free(&mut d, c.block.unwrap()).unwrap();
        let p = s.reserved_parts();
        p.check().unwrap();
        assert_eq!(p.reserved, 2 * MIB + 20 * MIB + 30 * MIB);
        assert_eq!(p.requested, 1000 + 3 * MIB);
        assert_eq!(p.rounding, 24);
        assert_eq!(p.pending_free, 0);
        assert_eq!(p.cached_in("small"), 2 * MIB - 1024);
        assert_eq!(p.cached_in("large"), 17 * MIB + 30 * MIB);
        // Only the whole free 30 MiB segment goes back; the rest shares segments with live blocks.
        assert_eq!(p.releasable, 30 * MIB);
        assert_eq!(p.kept(), 2 * MIB - 1024 + 17 * MIB);
        assert_eq!((p.largest_free_small, p.largest_free_large), (2 * MIB - 1024, 30 * MIB));
        assert!(p.serves(30 * MIB) && !p.serves(31 * MIB));
        let labels: Vec<String> = p.cached.iter().map(|c| format!("{} {}", c.pool, c.label())).collect();
        assert_eq!(labels, ["small 1.00 MiB – 4.00 MiB", "large 16.00 MiB – 64.00 MiB"]);
        // Nothing observable changed: empty_cache really returns what was said.
        let before = s.total_reserved();
        s.empty_cache(&mut d).unwrap();
        assert_eq!(before - s.total_reserved(), p.releasable);
        let _ = (a, b);
    }

    #[test]
    fn pending_frees_are_their_own_part_and_empty_cache_waits_for_them() {
        let (mut s, mut d) = state("");
        let side = d.new_stream();
        let a = s.malloc(&mut d, 40 * MIB, StreamId::DEFAULT).unwrap();
        s.record_stream(a.block.unwrap(), side).unwrap();
        d.set_stream_busy(side, true);
        s.free(&mut d, a.block.unwrap()).unwrap();
        let p = s.reserved_parts();
        p.check().unwrap();
        assert_eq!(p.pending_free, 40 * MIB);
        assert_eq!(p.allocated(), 0);
        assert_eq!(p.releasable, 40 * MIB, "empty_cache synchronises the stream first");
        assert_eq!(s.pending_frees(), 1, "the copy waited, not the state");
    }

    #[test]
    fn an_out_of_memory_report_carries_the_split() {
        let mut s = DeviceState::new(0, AllocatorConfig::default());
        let mut d = SimBackend::new(0, 64 * MIB);
        let blocks: Vec<_> = (0..6).map(|_| s.malloc(&mut d, 8 * MIB, StreamId::DEFAULT).unwrap()).collect();
        for b in blocks.iter().step_by(2) {
            s.free(&mut d, b.block.unwrap()).unwrap();
        }
        let Err(crate::policy::AllocError::OutOfMemory(r)) = s.malloc(&mut d, 40 * MIB, StreamId::DEFAULT) else {
            panic!("40 MiB cannot fit")
        };
        let p = r.parts.clone().unwrap();
        p.check().unwrap();
        assert_eq!((p.reserved, p.requested, p.cached_bytes()), (60 * MIB, 24 * MIB, 36 * MIB));
        assert_eq!(p.releasable, 0, "the out-of-memory path already released what it could");
        let line = r.explain().unwrap();
        assert!(line.starts_with("reserved 60.00 MiB = requested 24.00 MiB + rounding 0 bytes"), "{line}");
        assert!(line.ends_with("a 40.00 MiB request cannot be served from the cache"), "{line}");
        s.set_explain_ooms(false);
        let Err(crate::policy::AllocError::OutOfMemory(r)) = s.malloc(&mut d, 40 * MIB, StreamId::DEFAULT) else {
            panic!()
        };
        assert!(r.parts.is_none() && r.explain().is_none());
    }

    #[test]
    fn expandable_and_compact_parts_add_up() {
        for conf in ["expandable_segments:True", "compact:True"] {
            let (mut s, mut d) = state(conf);
            let blocks: Vec<_> =
                (1..12).map(|i| s.malloc(&mut d, i * 3 * MIB + 100, StreamId::DEFAULT).unwrap()).collect();
            for b in blocks.iter().step_by(3) {
                s.free(&mut d, b.block.unwrap()).unwrap();
            }
            let p = s.reserved_parts();
            p.check().unwrap_or_else(|e| panic!("{conf}: {e}"));
            let before = s.total_reserved();
            s.empty_cache(&mut d).unwrap();
            assert_eq!(before - s.total_reserved(), p.releasable, "{conf}");
        }
    }
}
