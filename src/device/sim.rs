//! The simulated device: a capacity-limited address space with deterministic addresses.
//!
//! Plan memory for an 80 GiB card on a laptop, test every layer without a GPU. Addresses are
//! handed out first-fit from a fixed base, aligned to 2 MiB (the driver's granularity), so the
//! same sequence of calls always gives the same addresses. Address-range reservations
//! (expandable segments) take address space but no capacity; segments and mapped pages take
//! capacity. Streams can be marked busy: events recorded on a busy stream stay incomplete until
//! the stream is synchronised, which is how tests hold a cross-stream free pending.
//!
//! It is also a simulated driver: other code can allocate straight from it
//! (`SimBackend::driver_alloc`, what `cuMemAlloc` is on a GPU), taking capacity the caching
//! allocator then does not have, and once given a sink ([`Backend::set_driver_sink`]) it reports
//! every allocation and release to it, its own segments and pages marked as the allocator's,
//! as CUPTI reports a GPU's.
#![forbid(unsafe_code)]

use super::{Backend, BackendKind, DeviceError, DriverCall, DriverEvent, DriverKind, DriverSink, EventId, StreamId};
use crate::units::{GIB, MIB};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Allocation granularity of the simulated driver.
pub const GRANULARITY: u64 = 2 * MIB;
/// First address handed out (looks like a CUDA device address).
pub(crate) const BASE_ADDRESS: u64 = 0x7f00_0000_0000;

/// The addresses of simulated device N (N ≥ 1) start N windows above the base: 16 TiB each, so
/// that no two devices hand out the same address.
const DEVICE_WINDOW: u64 = 1 << 44;
/// Default capacity of the simulated device: 80 GiB.
pub(crate) const DEFAULT_CAPACITY: u64 = 80 * GIB;

/// A simulated GPU.
#[derive(Clone, Debug)]
pub struct SimBackend {
    device: i32,
    capacity: u64,
    used: u64,
    /// Free address ranges: start → length.
    free_ranges: BTreeMap<u64, u64>,
    /// Live reservations (segments and address ranges): start → length.
    live: HashMap<u64, u64>,
    /// Mapped pages: page address → page size.
    mapped: HashMap<u64, u64>,
    busy: HashSet<StreamId>,
    events: HashMap<u64, (StreamId, bool)>,
    next_event: u64,
    fail_reserves: u32,
    next_stream: u64,
    /// Allocations made through the simulated driver: address → requested bytes.
    driver_allocs: HashMap<u64, u64>,
    sink: Option<DriverSink>,
    /// Its row in the simulated process table (`sim_procs`), once its use is published: the
    /// notebook's device, not the many a plan or a test makes.
    published: Option<super::sim_procs::Row>,
    /// A fault injected for the next launch or copy ([`SimBackend::inject_fault`]).
    pending_fault: Option<super::Fault>,
    /// The lost context, once a fault fired: every later call fails with it, as on a GPU.
    lost: Option<super::LostContext>,
}

impl SimBackend {
    /// Makes the next launch or copy of this device fault with `fault`, as a kernel writing
    /// out of bounds does on a GPU: that call, and every later one, fails with
    /// [`DeviceError::ContextLost`] (the test path of a lost context, without a GPU).
    pub fn inject_fault(&mut self, fault: super::Fault) {
        self.pending_fault = Some(fault);
    }

    /// The lost context, once an injected fault fired.
    pub fn lost(&self) -> Option<&super::LostContext> {
        self.lost.as_ref()
    }

    /// `Err` once the context is lost (every call of a lost context fails).
    fn alive(&self) -> Result<(), DeviceError> {
        match &self.lost {
            Some(l) => Err(DeviceError::ContextLost(l.clone())),
            None => Ok(()),
        }
    }

    /// A simulated device of `capacity` bytes.
    pub fn new(device: i32, capacity: u64) -> Self {
        // Device 0 from the base up; each other device in its own window of the one address
        // space, as CUDA's unified addressing keeps devices apart (an address names one device).
        let mut free_ranges = BTreeMap::new();
        match u64::try_from(device).unwrap_or(0) {
            0 => free_ranges.insert(BASE_ADDRESS, u64::MAX - BASE_ADDRESS - GRANULARITY),
            d => free_ranges.insert(BASE_ADDRESS + d * DEVICE_WINDOW, DEVICE_WINDOW),
        };
        SimBackend {
            device,
            capacity,
            used: 0,
            free_ranges,
            live: HashMap::new(),
            mapped: HashMap::new(),
            busy: HashSet::new(),
            events: HashMap::new(),
            next_event: 1,
            fail_reserves: 0,
            next_stream: 0x5000,
            driver_allocs: HashMap::new(),
            sink: None,
            published: None,
            pending_fault: None,
            lost: None,
        }
    }

    /// Lists this process, with the bytes it holds here, in the simulated process table (what
    /// NVML's process list is on a GPU: `device::sim_procs`), from now on.
    pub(crate) fn publish_usage(&mut self) {
        if self.published.is_none() {
            self.published = super::sim_procs::Row::open(self.device);
        }
        self.publish();
    }

    fn publish(&self) {
        if let Some(row) = &self.published {
            row.publish(self.used);
        }
    }

    /// Bytes of capacity in use (segments plus mapped pages).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// A new stream handle, distinct from the default stream and from earlier ones.
    pub fn new_stream(&mut self) -> StreamId {
        self.next_stream += 0x100;
        StreamId(self.next_stream)
    }

    /// Marks a stream busy (events recorded on it stay pending) or idle (they complete).
    pub fn set_stream_busy(&mut self, stream: StreamId, busy: bool) {
        if busy {
            self.busy.insert(stream);
        } else {
            self.busy.remove(&stream);
            for (s, done) in self.events.values_mut() {
                if *s == stream {
                    *done = true;
                }
            }
        }
    }

    /// Completes all work on every stream.
    pub fn synchronize(&mut self) {
        let streams: Vec<StreamId> = self.busy.drain().collect();
        for s in streams {
            self.set_stream_busy(s, false);
        }
    }

    /// Makes the next `n` segment reservations or page maps fail with out-of-memory.
    pub fn fail_next_reserves(&mut self, n: u32) {
        self.fail_reserves = n;
    }

    /// Allocates `size` bytes straight from the simulated driver (what `cuMemAlloc` is on a
    /// GPU): capacity rounded up to the 2 MiB granularity, reported to the sink as another
    /// library's allocation. `Err(OutOfMemory)` when the device is full.
    pub(crate) fn driver_alloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.alive()?;
        if size == 0 {
            return Err(DeviceError::Driver("CUDA_ERROR_INVALID_VALUE (simulated): 0 bytes".into()));
        }
        let rounded = size.div_ceil(GRANULARITY) * GRANULARITY;
        if let Err(e) = self.consume(rounded) {
            // As CUPTI sees a refused `cuMemAlloc` on a GPU: the out-of-memory, where it happens.
            if e == DeviceError::OutOfMemory {
                self.report(DriverCall::Failed { kind: DriverKind::Alloc, size }, "cuMemAlloc (simulated)", false);
            }
            return Err(e);
        }
        let addr = self.take_range(rounded).inspect_err(|_| self.used -= rounded)?;
        self.driver_allocs.insert(addr, size);
        let call = DriverCall::Alloc { kind: DriverKind::Alloc, addr, size, stream: 0 };
        self.report(call, "cuMemAlloc (simulated)", false);
        Ok(addr)
    }

    /// Frees an allocation of [`SimBackend::driver_alloc`].
    pub(crate) fn driver_free(&mut self, addr: u64) -> Result<(), DeviceError> {
        let Some(size) = self.driver_allocs.remove(&addr) else {
            return Err(DeviceError::Driver(format!(
                "CUDA_ERROR_INVALID_VALUE (simulated): {addr:#x} is not a driver allocation"
            )));
        };
        let rounded = size.div_ceil(GRANULARITY) * GRANULARITY;
        self.return_range(addr, rounded)?;
        self.used -= rounded;
        self.publish();
        self.report(DriverCall::Free { addr }, "cuMemFree (simulated)", false);
        Ok(())
    }

    fn report(&self, call: DriverCall, api: &'static str, ours: bool) {
        if let Some(sink) = self.sink {
            sink(&DriverEvent { call, device: Some(self.device), api, ours });
        }
    }

    fn take_range(&mut self, size: u64) -> Result<u64, DeviceError> {
        let size = size.div_ceil(GRANULARITY) * GRANULARITY;
        let (&start, &len) = self.free_ranges.iter().find(|&(_, &len)| len >= size).ok_or(DeviceError::OutOfMemory)?;
        self.free_ranges.remove(&start);
        if len > size {
            self.free_ranges.insert(start + size, len - size);
        }
        self.live.insert(start, size);
        Ok(start)
    }

    fn return_range(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let size = size.div_ceil(GRANULARITY) * GRANULARITY;
        match self.live.remove(&addr) {
            Some(s) if s == size => {}
            Some(s) => {
                self.live.insert(addr, s);
                return Err(DeviceError::Driver(format!(
                    "CUDA_ERROR_INVALID_VALUE (simulated): release of {size} bytes at {addr:#x}, reserved {s}"
                )));
            }
            None => {
                return Err(DeviceError::Driver(format!(
                    "CUDA_ERROR_INVALID_VALUE (simulated): {addr:#x} is not a reservation"
                )));
            }
        }
        let mut start = addr;
        let mut len = size;
        if let Some((&ps, &pl)) = self.free_ranges.range(..addr).next_back().filter(|(ps, pl)| **ps + **pl == addr) {
            self.free_ranges.remove(&ps);
            start = ps;
            len += pl;
        }
        if let Some(&nl) = self.free_ranges.get(&(addr + size)) {
            self.free_ranges.remove(&(addr + size));
            len += nl;
        }
        self.free_ranges.insert(start, len);
        Ok(())
    }

    fn consume(&mut self, bytes: u64) -> Result<(), DeviceError> {
        if self.fail_reserves > 0 {
            self.fail_reserves -= 1;
            return Err(DeviceError::OutOfMemory);
        }
        if self.used + bytes > self.capacity {
            return Err(DeviceError::OutOfMemory);
        }
        self.used += bytes;
        self.publish();
        Ok(())
    }
}

impl Backend for SimBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Simulated
    }
    fn new_stream(&mut self) -> Result<StreamId, DeviceError> {
        Ok(SimBackend::new_stream(self))
    }
    fn device_index(&self) -> i32 {
        self.device
    }
    fn total_memory(&self) -> u64 {
        self.capacity
    }
    /// Where an injected fault fires (the streams' simulated work is [`SimBackend::synchronize`]'s,
    /// which tests drive on their own).
    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.fault_point("cuCtxSynchronize")
    }
    fn fault_point(&mut self, call: &'static str) -> Result<(), DeviceError> {
        if let Some(fault) = self.pending_fault.take() {
            self.lost = Some(super::LostContext { fault, call: call.to_string() });
        }
        self.alive()
    }
    fn mem_get_info(&mut self) -> Result<(u64, u64), DeviceError> {
        self.alive()?;
        Ok((self.capacity - self.used, self.capacity))
    }
    fn set_driver_sink(&mut self, sink: DriverSink) {
        self.sink = Some(sink);
    }
    fn reserve(&mut self, size: u64, _stream: StreamId) -> Result<u64, DeviceError> {
        self.alive()?;
        self.consume(size)?;
        let addr = self.take_range(size).inspect_err(|_| self.used -= size)?;
        self.report(
            DriverCall::Alloc { kind: DriverKind::Alloc, addr, size, stream: 0 },
            "cuMemAlloc (simulated)",
            true,
        );
        Ok(addr)
    }
    fn release(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        if self.driver_allocs.contains_key(&addr) {
            return Err(DeviceError::Driver(format!(
                "CUDA_ERROR_INVALID_VALUE (simulated): {addr:#x} is a driver allocation, not a segment"
            )));
        }
        self.return_range(addr, size)?;
        self.used -= size;
        self.publish();
        self.report(DriverCall::Free { addr }, "cuMemFree (simulated)", true);
        Ok(())
    }
    fn reserve_address_range(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.take_range(size)
    }
    fn release_address_range(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        if self.mapped.keys().any(|&p| p >= addr && p < addr + size) {
            return Err(DeviceError::Driver(format!(
                "CUDA_ERROR_INVALID_VALUE (simulated): range {addr:#x} still has mapped pages"
            )));
        }
        self.return_range(addr, size)
    }
    fn map_pages(&mut self, addr: u64, page_size: u64, pages: u64) -> Result<(), DeviceError> {
        for i in 0..pages {
            if self.mapped.contains_key(&(addr + i * page_size)) {
                return Err(DeviceError::Driver(format!(
                    "CUDA_ERROR_INVALID_VALUE (simulated): page {:#x} already mapped",
                    addr + i * page_size
                )));
            }
        }
        self.consume(page_size * pages)?;
        for i in 0..pages {
            let page = addr + i * page_size;
            self.mapped.insert(page, page_size);
            let call = DriverCall::Alloc { kind: DriverKind::Vmm, addr: page, size: page_size, stream: 0 };
            self.report(call, "cuMemCreate+cuMemMap (simulated)", true);
        }
        Ok(())
    }
    fn unmap_pages(&mut self, addr: u64, page_size: u64, pages: u64, _stream: StreamId) -> Result<(), DeviceError> {
        for i in 0..pages {
            if self.mapped.remove(&(addr + i * page_size)).is_none() {
                return Err(DeviceError::Driver(format!(
                    "CUDA_ERROR_INVALID_VALUE (simulated): page {:#x} not mapped",
                    addr + i * page_size
                )));
            }
            self.used -= page_size;
            self.publish();
            self.report(DriverCall::Free { addr: addr + i * page_size }, "cuMemUnmap+cuMemRelease (simulated)", true);
        }
        Ok(())
    }
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        let id = self.next_event;
        self.next_event += 1;
        self.events.insert(id, (stream, !self.busy.contains(&stream)));
        Ok(EventId(id))
    }
    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        match self.events.get(&event.0) {
            Some(&(_, true)) => {
                self.events.remove(&event.0);
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Err(DeviceError::Driver("CUDA_ERROR_INVALID_HANDLE (simulated event)".into())),
        }
    }
    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        self.events
            .remove(&event.0)
            .map(|_| ())
            .ok_or_else(|| DeviceError::Driver("CUDA_ERROR_INVALID_HANDLE (simulated event)".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_first_fit_addresses_and_capacity() {
        let mut s = SimBackend::new(0, 10 * MIB);
        let a = s.reserve(2 * MIB, StreamId::DEFAULT).unwrap();
        let b = s.reserve(4 * MIB, StreamId::DEFAULT).unwrap();
        assert_eq!(a, BASE_ADDRESS);
        assert_eq!(b, BASE_ADDRESS + 2 * MIB);
        assert_eq!(s.reserve(6 * MIB, StreamId::DEFAULT), Err(DeviceError::OutOfMemory));
        assert_eq!(s.mem_get_info().unwrap(), (4 * MIB, 10 * MIB));
        s.release(a, 2 * MIB).unwrap();
        assert_eq!(s.reserve(2 * MIB, StreamId::DEFAULT).unwrap(), a);
        assert!(s.release(a + 1, 2 * MIB).is_err());
        // A second simulated device hands out addresses of its own.
        let mut one = SimBackend::new(1, 10 * MIB);
        assert_eq!(one.reserve(2 * MIB, StreamId::DEFAULT).unwrap(), BASE_ADDRESS + DEVICE_WINDOW);
    }

    #[test]
    fn busy_stream_holds_events() {
        let mut s = SimBackend::new(0, GIB);
        let st = s.new_stream();
        s.set_stream_busy(st, true);
        let e = s.record_event(st).unwrap();
        assert!(!s.query_event(e).unwrap());
        s.synchronize();
        assert!(s.query_event(e).unwrap());
    }

    #[test]
    fn the_simulated_driver_takes_capacity_and_reports_every_call() {
        use std::sync::Mutex;
        static SEEN: Mutex<Vec<(DriverCall, bool)>> = Mutex::new(Vec::new());
        fn sink(e: &DriverEvent) {
            SEEN.lock().unwrap().push((e.call, e.ours));
        }
        let mut s = SimBackend::new(0, 64 * MIB);
        s.set_driver_sink(sink);
        let d = s.driver_alloc(3 * MIB).unwrap();
        assert_eq!(s.mem_get_info().unwrap().0, 60 * MIB, "4 MiB of capacity: the granularity");
        let seg = s.reserve(20 * MIB, StreamId::DEFAULT).unwrap();
        assert!(s.release(d, 3 * MIB).is_err(), "a driver allocation is no segment");
        assert_eq!(s.driver_alloc(100 * MIB), Err(DeviceError::OutOfMemory));
        s.driver_free(d).unwrap();
        assert!(s.driver_free(d).is_err(), "freed once");
        s.release(seg, 20 * MIB).unwrap();
        assert_eq!(s.used(), 0);
        let seen = SEEN.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                (DriverCall::Alloc { kind: DriverKind::Alloc, addr: d, size: 3 * MIB, stream: 0 }, false),
                (DriverCall::Alloc { kind: DriverKind::Alloc, addr: seg, size: 20 * MIB, stream: 0 }, true),
                (DriverCall::Failed { kind: DriverKind::Alloc, size: 100 * MIB }, false),
                (DriverCall::Free { addr: d }, false),
                (DriverCall::Free { addr: seg }, true),
            ]
        );
    }

    #[test]
    fn pages_take_capacity_ranges_do_not() {
        let mut s = SimBackend::new(0, 4 * MIB);
        let va = s.reserve_address_range(100 * GIB).unwrap();
        s.map_pages(va, 2 * MIB, 2).unwrap();
        assert_eq!(s.map_pages(va + 4 * MIB, 2 * MIB, 1), Err(DeviceError::OutOfMemory));
        assert!(s.release_address_range(va, 100 * GIB).is_err());
        s.unmap_pages(va, 2 * MIB, 2, StreamId::DEFAULT).unwrap();
        s.release_address_range(va, 100 * GIB).unwrap();
        assert_eq!(s.used(), 0);
    }
}
