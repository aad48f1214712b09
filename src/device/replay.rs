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
        let end = a.saturating_add(size);
        self.live.range(..end).next_back().is_some_and(|(&b, &s)| b.saturating_add(s) > a)
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
    fn next_address(&mut self, queue_is_ranges: bool, size: u64) -> u64 {
        let q = if queue_is_ranges { &mut self.range_bases } else { &mut self.addresses };
        if let Some(a) = q.pop_front() {
            return a;
        }
        if !queue_is_ranges {
            while let Some(a) = self.by_size.get_mut(&size).and_then(VecDeque::pop_front) {
                if !self.overlaps_live(a, size) {
                    return a;
                }
            }
        }
        loop {
            let a = self.fallback_next;
            self.fallback_next += size.div_ceil(1 << 21) * (1 << 21) + (1 << 21);
            if queue_is_ranges || !self.overlaps_live(a, size) {
                return a;
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
        let a = self.next_address(false, size);
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
