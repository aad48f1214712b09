//! The replay device: segments get the addresses a recorded trace got.
//!
//! PyTorch's best fit breaks ties by address, so a replay is decision-for-decision faithful
//! only when every segment lands where it landed in the recording. The replay driver
//! ([`crate::replay`]) queues the trace's segment addresses here; the backend hands them out in
//! order, fails a reservation when told to (the trace shows the device was full), and completes
//! stream events when the trace says the block came back (`free_completed`).
//!
//! For fit planning (`crate::replay::fit`) it is also a device of a given capacity: a
//! reservation or page map that would take the memory in use past it fails with out-of-memory,
//! segments land at the trace's address for their size when that address is free (so an
//! unconstrained run makes the trace's decisions), and other libraries' allocations take their
//! share of the capacity ([`ReplayBackend::take_external`]).
#![forbid(unsafe_code)]

use super::{Backend, BackendKind, DeviceError, EventId, StreamId};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// A device that replays a trace's segment addresses.
#[derive(Clone, Debug)]
pub(crate) struct ReplayBackend {
    total: u64,
    used: u64,
    addresses: VecDeque<u64>,
    range_bases: VecDeque<u64>,
    fallback_next: u64,
    lookahead_range_bases: Vec<u64>,
    ranges: Vec<(u64, u64)>,
    fail: u32,
    events: HashMap<u64, bool>,
    next_event: u64,
    recorded: Vec<EventId>,
    /// Live segments: address → size.
    live: BTreeMap<u64, u64>,
    /// Memory the device has; reservations and maps past it fail with out-of-memory.
    capacity: u64,
    /// Addresses to give a segment of a size when none is queued: the trace's, in order.
    by_size: HashMap<u64, VecDeque<u64>>,
}

impl ReplayBackend {
    /// A replay device reporting `total` bytes of memory.
    pub(crate) fn new(total: u64) -> Self {
        ReplayBackend {
            total,
            used: 0,
            addresses: VecDeque::new(),
            range_bases: VecDeque::new(),
            fallback_next: 1 << 44,
            lookahead_range_bases: Vec::new(),
            ranges: Vec::new(),
            fail: 0,
            events: HashMap::new(),
            next_event: 1,
            recorded: Vec::new(),
            live: BTreeMap::new(),
            capacity: u64::MAX,
            by_size: HashMap::new(),
        }
    }
    /// A device that reports `total` bytes and holds at most `capacity` (reservations, mapped
    /// pages and [`ReplayBackend::take_external`] together).
    pub(crate) fn with_capacity(total: u64, capacity: u64) -> Self {
        ReplayBackend { capacity, ..ReplayBackend::new(total) }
    }
    /// Bytes in use: segments, mapped pages and external allocations.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }
    /// Gives each new segment of a size, when no address is queued, the next of `addrs` of
    /// that size (the trace's `segment_alloc`s, in order) that does not overlap a live one.
    pub(crate) fn set_addresses_by_size(&mut self, addrs: impl IntoIterator<Item = (u64, u64)>) {
        self.by_size.clear();
        for (size, addr) in addrs {
            self.by_size.entry(size).or_default().push_back(addr);
        }
    }
    /// Takes `bytes` of capacity for another library's allocation (a driver, pool or VMM
    /// allocation of a recorded session). `Err(OutOfMemory)` when they do not fit.
    pub(crate) fn take_external(&mut self, bytes: u64) -> Result<(), DeviceError> {
        if self.used.saturating_add(bytes) > self.capacity {
            return Err(DeviceError::OutOfMemory);
        }
        self.used += bytes;
        Ok(())
    }
    /// Returns capacity taken by [`ReplayBackend::take_external`].
    pub(crate) fn release_external(&mut self, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
    }
    fn overlaps_live(&self, a: u64, size: u64) -> bool {
        self.live_end_over(a, size).is_some()
    }
    /// The end of the live segment `[a, a + size)` overlaps, if any.
    fn live_end_over(&self, a: u64, size: u64) -> Option<u64> {
        let end = a.saturating_add(size);
        self.live.range(..end).next_back().map(|(&b, &s)| b.saturating_add(s)).filter(|&e| e > a)
    }
    fn has_room(&self, bytes: u64) -> Result<(), DeviceError> {
        if self.used.saturating_add(bytes) > self.capacity { Err(DeviceError::OutOfMemory) } else { Ok(()) }
    }
    /// Queues the address the next segment reservation returns.
    pub(crate) fn push_segment_address(&mut self, addr: u64) {
        self.addresses.push_back(addr);
    }
    /// Queues the base the next address-range reservation returns (expandable segments).
    pub(crate) fn push_range_base(&mut self, addr: u64) {
        self.range_bases.push_back(addr);
    }
    /// Candidate bases for a range reservation when none is queued, in trace order: a
    /// reservation whose first map failed (out of memory) leaves no trace of its address until
    /// a later map reveals it. The first candidate outside every live range is used.
    pub(crate) fn set_lookahead_range_bases(&mut self, addrs: Vec<u64>) {
        self.lookahead_range_bases = addrs;
    }
    /// Drops queued addresses that were not used.
    pub(crate) fn clear_queued(&mut self) {
        self.addresses.clear();
        self.range_bases.clear();
    }
    /// Makes the next `n` reservations or page maps fail with out-of-memory.
    pub(crate) fn fail_next(&mut self, n: u32) {
        self.fail = n;
    }
    /// Events recorded since the last call.
    pub(crate) fn take_recorded_events(&mut self) -> Vec<EventId> {
        std::mem::take(&mut self.recorded)
    }
    /// Marks an event complete.
    pub(crate) fn complete_event(&mut self, e: EventId) {
        if let Some(done) = self.events.get_mut(&e.0) {
            *done = true;
        }
    }
    /// The address the next reservation of `size` bytes returns: the trace's, else the next
    /// free one in the fallback region; `None` when the address space is spent (a garbled
    /// trace's sizes can be near 2^64).
    fn next_address(&mut self, queue_is_ranges: bool, size: u64) -> Option<u64> {
        const GRAIN: u64 = 1 << 21;
        let q = if queue_is_ranges { &mut self.range_bases } else { &mut self.addresses };
        if let Some(a) = q.pop_front() {
            return Some(a);
        }
        if !queue_is_ranges {
            while let Some(a) = self.by_size.get_mut(&size).and_then(VecDeque::pop_front) {
                if !self.overlaps_live(a, size) {
                    return Some(a);
                }
            }
        }
        loop {
            let a = self.fallback_next;
            let over = if queue_is_ranges { None } else { self.live_end_over(a, size) };
            self.fallback_next = match over {
                // Past the live segment in one step, however large it is: every pass leaves
                // one behind, so the search ends.
                Some(end) => end.checked_next_multiple_of(GRAIN)?,
                None => a.checked_add(size.checked_next_multiple_of(GRAIN)?.checked_add(GRAIN)?)?,
            };
            if over.is_none() {
                return Some(a);
            }
        }
    }
    fn check_fail(&mut self) -> Result<(), DeviceError> {
        if self.fail > 0 {
            self.fail -= 1;
            return Err(DeviceError::OutOfMemory);
        }
        Ok(())
    }
}

impl Backend for ReplayBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Replay
    }
    fn device_index(&self) -> i32 {
        0
    }
    fn total_memory(&self) -> u64 {
        self.total
    }
    fn mem_get_info(&mut self) -> Result<(u64, u64), DeviceError> {
        Ok((self.total.saturating_sub(self.used), self.total))
    }
    fn reserve(&mut self, size: u64, _stream: StreamId) -> Result<u64, DeviceError> {
        self.check_fail()?;
        self.has_room(size)?;
        let a = self
            .next_address(false, size)
            .ok_or_else(|| DeviceError::Driver(format!("replay: no address is left for a segment of {size} bytes")))?;
        // A garbled trace can name an address inside a live segment: refuse it rather than
        // let two segments overlap.
        let end = a.saturating_add(size);
        if let Some((&b, &s)) = self.live.range(..end).next_back()
            && b.saturating_add(s) > a
        {
            return Err(DeviceError::Driver(format!(
                "replay: the trace's segment at {a:#x} ({size} bytes) overlaps the live segment at {b:#x} ({s} bytes)"
            )));
        }
        self.used += size;
        self.live.insert(a, size);
        Ok(a)
    }
    fn release(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        match self.live.remove(&addr) {
            Some(s) if s == size => {
                self.used -= size;
                Ok(())
            }
            _ => Err(DeviceError::Driver(format!("replay: {addr:#x} ({size} bytes) is not a live segment"))),
        }
    }
    fn reserve_address_range(&mut self, size: u64) -> Result<u64, DeviceError> {
        // A queued or looked-ahead base inside a live range is a map into that range, not a
        // new reservation.
        let live = &self.ranges;
        let free = |a: &u64| !live.iter().any(|&(b, s)| *a >= b && *a < b + s);
        let base = if let Some(i) = self.range_bases.iter().position(free) {
            self.range_bases.remove(i).unwrap_or_default()
        } else if let Some(i) = self.lookahead_range_bases.iter().position(free) {
            self.lookahead_range_bases.remove(i)
        } else {
            self.next_address(true, size)
                .ok_or_else(|| DeviceError::Driver(format!("replay: no address is left for a range of {size} bytes")))?
        };
        self.ranges.push((base, size));
        Ok(base)
    }
    fn release_address_range(&mut self, addr: u64, _size: u64) -> Result<(), DeviceError> {
        self.ranges.retain(|&(b, _)| b != addr);
        Ok(())
    }
    fn map_pages(&mut self, _addr: u64, page_size: u64, pages: u64) -> Result<(), DeviceError> {
        self.check_fail()?;
        self.has_room(page_size * pages)?;
        self.used += page_size * pages;
        Ok(())
    }
    fn unmap_pages(&mut self, _addr: u64, page_size: u64, pages: u64, _stream: StreamId) -> Result<(), DeviceError> {
        self.used -= page_size * pages;
        Ok(())
    }
    fn record_event(&mut self, _stream: StreamId) -> Result<EventId, DeviceError> {
        let e = EventId(self.next_event);
        self.next_event += 1;
        self.events.insert(e.0, false);
        self.recorded.push(e);
        Ok(e)
    }
    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        match self.events.get(&event.0) {
            Some(true) => {
                self.events.remove(&event.0);
                Ok(true)
            }
            Some(false) => Ok(false),
            None => Err(DeviceError::Driver("replay: unknown event".into())),
        }
    }
    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        self.events.remove(&event.0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A garbled trace's segment can cover nearly all of the address space: the next segment's
    /// address is found past it in one step, or refused when none is left, never searched for
    /// 2 MiB at a time (the trace fuzz target hung there for minutes).
    #[test]
    fn a_huge_live_segment_is_stepped_over_at_once_and_the_end_of_the_space_refused() {
        let mut d = ReplayBackend::new(u64::MAX);
        d.push_segment_address(1 << 44);
        let huge = 1_795_238_599_375_623u64;
        assert_eq!(d.reserve(huge, StreamId(0)), Ok(1 << 44));
        let next = d.reserve(155_189_248, StreamId(0)).unwrap();
        assert!(next >= (1 << 44) + huge && next.is_multiple_of(1 << 21), "{next:#x}");
        // A segment that reaches the end of the address space leaves nothing after it.
        d.push_segment_address(next + (1 << 30));
        assert!(d.reserve(u64::MAX - next - (1 << 30), StreamId(0)).is_ok());
        assert!(d.reserve(1 << 21, StreamId(0)).is_ok(), "the gap before it is still used");
        let refused = d.reserve(1 << 30, StreamId(0)).unwrap_err();
        assert!(refused.to_string().contains("no address is left"), "{refused}");
        assert!(d.reserve_address_range(u64::MAX).is_err(), "a range past the end is refused too");
    }
}
