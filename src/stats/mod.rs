//! Allocator statistics with PyTorch's names and meaning (`memory_stats()`), plus peak slots.
//!
//! A [`Stat`] is four counters: `current`, `peak`, `allocated` (sum of increases) and `freed`
//! (sum of decreases). A `StatArray` holds one per `StatType`: "all", "small_pool",
//! "large_pool"; every update touches "all" and the block's own pool.
//!
//! Peak slots (`PeakSlots`) are what PyTorch lacks (issue 16266): independent peak trackers
//! that several scopes hold at once. Each slot remembers the highest allocated / reserved /
//! active / requested bytes since it was opened or last reset, so resetting one slot (a notebook
//! cell's) never disturbs another (an inner scope's) nor the global `peak`.
//!
//! Beside them, [`spread`]: one figure across several ranks (min, max, mean, sum, which one is
//! highest).
#![forbid(unsafe_code)]

pub mod spread;
pub(crate) mod summary;

use std::collections::BTreeMap;

/// One statistic: COUNT or SUM, with its lifetime totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// Current value.
    pub current: i64,
    /// Highest `current` since the last peak reset.
    pub peak: i64,
    /// Sum of all increases since the last accumulated reset.
    pub allocated: i64,
    /// Sum of all decreases since the last accumulated reset.
    pub freed: i64,
}

impl Stat {
    /// `current += n`, raising `peak`, adding to `allocated`.
    #[inline]
    pub(crate) fn increase(&mut self, n: i64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
        self.allocated += n;
    }
    /// `current -= n`, adding to `freed`.
    #[inline]
    pub(crate) fn decrease(&mut self, n: i64) {
        self.current -= n;
        self.freed += n;
    }
    /// `peak = current` (`reset_peak_memory_stats`).
    pub(crate) fn reset_peak(&mut self) {
        self.peak = self.current;
    }
    /// Zero `allocated` and `freed` (`reset_accumulated_memory_stats`).
    pub(crate) fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Index into a [`StatArray`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatType {
    /// "all": every pool.
    Aggregate = 0,
    /// "small_pool".
    SmallPool = 1,
    /// "large_pool".
    LargePool = 2,
}

impl StatType {
    /// The three types in `memory_stats()` key order of PyTorch's C++ (all, small, large).
    pub(crate) const ALL: [StatType; 3] = [StatType::Aggregate, StatType::SmallPool, StatType::LargePool];
    /// The key fragment: "all", "small_pool", "large_pool".
    pub(crate) fn key(self) -> &'static str {
        match self {
            StatType::Aggregate => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }
}

/// One [`Stat`] per [`StatType`].
pub(crate) type StatArray = [Stat; 3];

/// Every statistic of one device's caching allocator (PyTorch's `DeviceStats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// COUNT: allocations handed out and not yet freed by the user.
    pub allocation: StatArray,
    /// COUNT: segments obtained from the device (cudaMalloc), never expandable maps.
    pub segment: StatArray,
    /// COUNT: active blocks (allocated, or freed but awaiting stream events).
    pub active: StatArray,
    /// COUNT: free blocks inside split segments (cached but not releasable).
    pub inactive_split: StatArray,
    /// SUM: bytes of allocated blocks (rounded sizes).
    pub allocated_bytes: StatArray,
    /// SUM: bytes reserved from the device (segments, or mapped pages).
    pub reserved_bytes: StatArray,
    /// SUM: bytes of active blocks.
    pub active_bytes: StatArray,
    /// SUM: bytes of free blocks inside split segments.
    pub inactive_split_bytes: StatArray,
    /// SUM: bytes requested by callers (unrounded) for active blocks.
    pub requested_bytes: StatArray,
    /// COUNT: allocations of blocks ≥ max_split_size.
    pub oversize_allocations: Stat,
    /// COUNT: segments ≥ max_split_size.
    pub oversize_segments: Stat,
    /// COUNT: allocation attempts after releasing every cached block.
    pub num_alloc_retries: i64,
    /// COUNT: out-of-memory errors raised.
    pub num_ooms: i64,
    /// COUNT: synchronisations of every pending stream event (empty_cache, OOM path).
    pub num_sync_all_streams: i64,
    /// COUNT: device allocations (cudaMalloc calls, or page-map calls).
    pub num_device_alloc: i64,
    /// COUNT: device frees (cudaFree calls, or page-unmap calls).
    pub num_device_free: i64,
    /// The configured max_split_size, −1 when unlimited.
    pub max_split_size: i64,
}

impl DeviceStats {
    /// A zeroed set with the given `max_split_size` report value.
    pub(crate) fn new(max_split_size: i64) -> Self {
        DeviceStats { max_split_size, ..Default::default() }
    }

    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("active", &self.active),
            ("active_bytes", &self.active_bytes),
            ("allocated_bytes", &self.allocated_bytes),
            ("allocation", &self.allocation),
            ("inactive_split", &self.inactive_split),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("segment", &self.segment),
        ]
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.active,
            &mut self.active_bytes,
            &mut self.allocated_bytes,
            &mut self.allocation,
            &mut self.inactive_split,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
            &mut self.reserved_bytes,
            &mut self.segment,
        ]
    }

    /// The flat, sorted `memory_stats()` map: 122 keys, PyTorch 2.11's names.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for (name, arr) in self.arrays() {
            for t in StatType::ALL {
                put_stat(&mut m, &format!("{name}.{}", t.key()), &arr[t as usize]);
            }
        }
        put_stat(&mut m, "oversize_allocations", &self.oversize_allocations);
        put_stat(&mut m, "oversize_segments", &self.oversize_segments);
        m.insert("max_split_size".into(), self.max_split_size);
        m.insert("num_alloc_retries".into(), self.num_alloc_retries);
        m.insert("num_device_alloc".into(), self.num_device_alloc);
        m.insert("num_device_free".into(), self.num_device_free);
        m.insert("num_ooms".into(), self.num_ooms);
        m.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        m
    }

    /// `reset_peak_memory_stats`: `peak = current` for every stat.
    pub(crate) fn reset_peak(&mut self) {
        for arr in self.arrays_mut() {
            arr.iter_mut().for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `reset_accumulated_memory_stats`: zero `allocated`/`freed` and the event counters.
    pub(crate) fn reset_accumulated(&mut self) {
        for arr in self.arrays_mut() {
            arr.iter_mut().for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }
}

fn put_stat(m: &mut BTreeMap<String, i64>, prefix: &str, s: &Stat) {
    m.insert(format!("{prefix}.allocated"), s.allocated);
    m.insert(format!("{prefix}.current"), s.current);
    m.insert(format!("{prefix}.freed"), s.freed);
    m.insert(format!("{prefix}.peak"), s.peak);
}

/// Peaks seen by one slot since it was opened or last reset (bytes, "all" pools).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotPeaks {
    /// Highest `allocated_bytes.all.current`.
    pub allocated: i64,
    /// Highest `reserved_bytes.all.current`.
    pub reserved: i64,
    /// Highest `active_bytes.all.current`.
    pub active: i64,
    /// Highest `requested_bytes.all.current`.
    pub requested: i64,
}

/// Identifies an open peak slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotId(pub(crate) u32);

/// Independent peak trackers. Opening a slot starts it at the current values; every increase
/// raises every open slot; resetting or closing one slot touches nothing else.
#[derive(Clone, Debug, Default)]
pub(crate) struct PeakSlots {
    slots: Vec<Option<SlotPeaks>>,
    open: usize,
}

impl PeakSlots {
    /// Opens a slot starting at `now`.
    pub(crate) fn open(&mut self, now: SlotPeaks) -> SlotId {
        self.open += 1;
        if let Some(i) = self.slots.iter().position(Option::is_none) {
            self.slots[i] = Some(now);
            SlotId(i as u32)
        } else {
            self.slots.push(Some(now));
            SlotId(self.slots.len() as u32 - 1)
        }
    }
    /// Closes a slot, returning its peaks (None if it was not open).
    pub(crate) fn close(&mut self, id: SlotId) -> Option<SlotPeaks> {
        let p = self.slots.get_mut(id.0 as usize)?.take();
        if p.is_some() {
            self.open -= 1;
        }
        p
    }
    /// The peaks of an open slot.
    pub(crate) fn get(&self, id: SlotId) -> Option<SlotPeaks> {
        self.slots.get(id.0 as usize).copied().flatten()
    }
    /// Restarts one slot at `now`.
    pub(crate) fn reset(&mut self, id: SlotId, now: SlotPeaks) -> bool {
        match self.slots.get_mut(id.0 as usize) {
            Some(Some(p)) => {
                *p = now;
                true
            }
            _ => false,
        }
    }
    /// Number of open slots.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.open
    }
    /// Raises every open slot to at least `now`.
    #[inline]
    pub(crate) fn observe(&mut self, now: SlotPeaks) {
        if self.open == 0 {
            return;
        }
        for p in self.slots.iter_mut().flatten() {
            p.allocated = p.allocated.max(now.allocated);
            p.reserved = p.reserved.max(now.reserved);
            p.active = p.active.max(now.active);
            p.requested = p.requested.max(now.requested);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_set_is_pytorch_2_11() {
        let m = DeviceStats::new(-1).memory_stats();
        assert_eq!(m.len(), 122);
        assert_eq!(m["max_split_size"], -1);
        assert!(m.contains_key("allocation.all.current"));
        assert!(m.contains_key("oversize_segments.peak"));
        assert!(m.keys().zip(m.keys().skip(1)).all(|(a, b)| a < b));
    }

    #[test]
    fn stat_arithmetic_and_resets() {
        let mut s = DeviceStats::new(-1);
        s.allocated_bytes[0].increase(10);
        s.allocated_bytes[0].decrease(4);
        s.num_ooms = 2;
        assert_eq!(s.allocated_bytes[0], Stat { current: 6, peak: 10, allocated: 10, freed: 4 });
        s.reset_peak();
        assert_eq!(s.allocated_bytes[0].peak, 6);
        s.reset_accumulated();
        assert_eq!(s.allocated_bytes[0], Stat { current: 6, peak: 6, allocated: 0, freed: 0 });
        assert_eq!(s.num_ooms, 0);
    }

    #[test]
    fn slots_are_independent() {
        let at = |a| SlotPeaks { allocated: a, ..Default::default() };
        let mut slots = PeakSlots::default();
        let outer = slots.open(at(0));
        slots.observe(at(100));
        let inner = slots.open(at(50));
        slots.observe(at(70));
        assert_eq!(slots.get(inner).unwrap().allocated, 70);
        slots.reset(inner, at(10));
        assert_eq!(slots.get(outer).unwrap().allocated, 100);
        assert_eq!(slots.close(inner).unwrap().allocated, 10);
        assert_eq!(slots.len(), 1);
        assert!(slots.get(inner).is_none());
    }
}
