//! Out of memory, caught as it happens.
//!
//! From a cell's `pre` on, every open device is watched: each allocator gets an out-of-memory
//! observer (data of the allocator, which every copy of the crate in the evcxr process shares).
//! The cell's `post` reply says why its first failure happened, in one line: what was asked
//! for, what the device had free, and how the allocator's cached free memory was split (its
//! largest block, fragmentation); later failures of the same cell are counted. When the kernel
//! asked for snapshots (control op `on_oom`, `%gpumem snapshot --on-oom DIR` in gpumem-kernel),
//! the first failure also writes one into `DIR/cell-N` at that moment, while the state still
//! holds what the failing code held.
#![forbid(unsafe_code)]

use super::protocol::{ComponentReading, Held, OomEvent, SnapshotPaths};
use crate::allocator::Allocator;
use crate::error::OomReport;
use crate::policy::SegmentView;
use crate::units::iec;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

/// The process's one watch (every copy of the crate, the control channel's session and the
/// stock kernel's hooks alike).
pub(crate) fn process_watch() -> Arc<OomWatch> {
    super::anchor::per_process!("oom-watch", Arc<OomWatch>, || Arc::new(OomWatch::default())).clone()
}

/// The control session's watch: where snapshots go, the cell running, its first failure.
#[derive(Default)]
pub(crate) struct OomWatch {
    state: Mutex<WatchState>,
}

#[derive(Default)]
struct WatchState {
    dir: Option<PathBuf>,
    cell: Option<u64>,
    event: Option<OomEvent>,
}

impl OomWatch {
    fn lock(&self) -> MutexGuard<'_, WatchState> {
        crate::sync::lock(&self.state)
    }

    /// Where the first failure of a cell writes its snapshot (`None`: no snapshots).
    pub(crate) fn set_dir(self: &Arc<Self>, dir: Option<PathBuf>) {
        self.lock().dir = dir;
        for a in super::registry::opened() {
            self.watch(&a);
        }
    }

    /// Cell `cell` begins: failures from now on are its own (devices opened since the last
    /// cell are watched from now on too).
    pub(crate) fn begin(self: &Arc<Self>, cell: u64) {
        let mut st = self.lock();
        (st.cell, st.event) = (Some(cell), None);
        drop(st);
        for a in super::registry::opened() {
            self.watch(&a);
        }
    }

    /// The cell ended: its first failure, if it had one.
    pub(crate) fn end(&self) -> Option<OomEvent> {
        let mut st = self.lock();
        st.cell = None;
        st.event.take()
    }

    /// Watches a device opened after the watch began (in the middle of a cell, say): its
    /// failures are the running cell's, and write their snapshot where asked.
    pub(crate) fn watch_device(self: &Arc<Self>, alloc: &Arc<Allocator>) {
        self.watch(alloc);
    }

    fn watch(self: &Arc<Self>, alloc: &Arc<Allocator>) {
        let (watch, device) = (Arc::downgrade(self), Arc::downgrade(alloc));
        alloc.set_oom_observer(Some(Arc::new(move |report: &OomReport| {
            if let (Some(w), Some(a)) = (watch.upgrade(), device.upgrade()) {
                w.on_oom(&a, report);
            }
        })));
    }

    fn on_oom(&self, alloc: &Allocator, report: &OomReport) {
        let mut st = self.lock();
        if let Some(e) = &mut st.event {
            e.count += 1;
            return;
        }
        let dir = st.dir.clone().map(|d| d.join(st.cell.map_or_else(|| "oom".to_string(), |c| format!("cell-{c}"))));
        st.event = Some(describe(report, &alloc.segments()));
        drop(st);
        // The sites holding the device's memory as it failed (named outside the watch's lock).
        if super::tracking::status().is_on() {
            let top = super::tracking::top(3).places.into_iter().find(|p| p.device == Some(report.device));
            if let (Some(p), Some(e)) = (top, &mut self.lock().event) {
                if !p.now.is_empty() {
                    let held: Vec<String> = p.now.iter().map(|s| format!("{} {}", s.site(), iec(s.bytes))).collect();
                    e.why = format!("{}; held by {}", e.why, held.join(", "));
                }
                e.top = p.now;
            }
            // What the memory in use was, where anything is more than `other`.
            let parts = super::tracking::readings(None, false, true)
                .into_iter()
                .find(|p| p.device == Some(report.device))
                .map(|p| p.by_component)
                .unwrap_or_default();
            if let Some(e) = &mut self.lock().event {
                if let Some(what) = in_use_by_component(&parts) {
                    e.why = format!("{}; {what}", e.why);
                }
                e.by_component = parts;
            }
        }
        // Written outside the watch's lock: another thread's failure meanwhile is counted.
        let Some(dir) = dir else { return };
        let written = super::tracking::snapshot(alloc).save(&dir);
        if let Some(e) = &mut self.lock().event {
            match written {
                Ok(files) => e.files = Some(SnapshotPaths::from(&files)),
                Err(why) => e.snapshot_error = Some(why.to_string()),
            }
        }
    }
}

/// The allocation the driver refused since the last call (`None`: none), as an out-of-memory
/// event: what was asked, by which call, by whom and where (the site's cell and line), the
/// device's free and total memory now (gpumem-nb's allocator's reading of it where one is open,
/// else `cuMemGetInfo` in the device's primary context), and what holds the device now, by
/// owner, component and site. A framework's out-of-memory seen as it happens, which the
/// framework's own error may describe less (candle: `DriverError(CUDA_ERROR_OUT_OF_MEMORY, …)`;
/// cubecl: a panic on its device thread).
pub(crate) fn refused() -> Option<OomEvent> {
    let (f, count, who) = super::tracking::take_failure()?;
    let (site, owner) = match who {
        Some((site, owner)) => (Some(site), Some(owner)),
        None => (None, None),
    };
    let place =
        super::tracking::readings(None, true, true).into_iter().find(|p| p.device == f.device).unwrap_or_default();
    let (free, total) = super::gpus::device_memory(f.device).unwrap_or((0, 0));
    let who = owner.as_deref().unwrap_or("unknown");
    let at = site.as_ref().map(|s| s.site()).unwrap_or_else(|| "no stack".into());
    let device = f.device.map_or("host (pinned)".to_string(), |d| format!("device {d}"));
    let why = format!(
        "{} refused {} on {device} ({who}, {at}): out of memory; {} free of {}",
        f.api,
        crate::units::iec(f.size),
        crate::units::iec(free),
        crate::units::iec(total)
    );
    Some(OomEvent {
        device: f.device.unwrap_or(-1),
        count,
        requested: f.size,
        device_free: free,
        device_total: total,
        why,
        top: place.top,
        by_component: place.by_component,
        api: Some(f.api.to_string()),
        owner,
        site,
        by_owner: place.by_owner,
        ..Default::default()
    })
}

/// `of the 1.50 GiB in use: optimizer_state 1.00 GiB, parameter 512.00 MiB` (largest first,
/// the allocator's cached free memory left out), where anything is more than `other`.
fn in_use_by_component(parts: &[ComponentReading]) -> Option<String> {
    if !parts.iter().any(|c| c.component.is_classified() && c.live > 0) {
        return None;
    }
    let mut held: Vec<&ComponentReading> = parts.iter().filter(|c| c.component != Held::Cached && c.live > 0).collect();
    held.sort_by(|a, b| b.live.cmp(&a.live).then(a.component.key().cmp(b.component.key())));
    let total: u64 = held.iter().map(|c| c.live).sum();
    let words: Vec<String> = held.iter().map(|c| format!("{} {}", c.component, iec(c.live))).collect();
    Some(format!("of the {} in use: {}", iec(total), words.join(", ")))
}

/// An out-of-memory failure in numbers and in one line, from its report and the allocator's
/// segments then.
pub fn describe(report: &OomReport, segments: &[SegmentView]) -> OomEvent {
    let free = segments.iter().flat_map(|s| &s.blocks).filter(|b| !b.active).map(|b| b.size);
    let (cached_free, largest_free_block) = free.fold((0, 0), |(sum, max), b| (sum + b, max.max(b)));
    let mut e = OomEvent {
        device: report.device,
        count: 1,
        requested: report.requested,
        device_free: report.free,
        device_total: report.total,
        cached_free,
        largest_free_block,
        ..Default::default()
    };
    let segment = if report.alloc_size > report.requested {
        format!(" (a {} segment)", iec(report.alloc_size))
    } else {
        String::new()
    };
    let allowed = report.allowed.map_or(String::new(), |a| format!(", {} allowed to this process", iec(a)));
    e.why = format!(
        "out of memory on device {}: asked for {}{segment} with {} free of {}{allowed}; the cache held {} free, largest \
         block {} (fragmentation {:.0}%)",
        report.device,
        iec(report.requested),
        iec(report.free),
        iec(report.total),
        iec(cached_free),
        iec(largest_free_block),
        e.fragmentation() * 100.0
    );
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::CachingAllocator;
    use crate::device::StreamId;
    use crate::device::sim::SimBackend;
    use crate::error::AllocError;
    use crate::policy::config::AllocatorConfig;

    /// The observer sees the failure while the blocks are still held; the description counts
    /// the cache's free blocks.
    #[test]
    fn a_failure_is_described_with_the_cache_split() {
        let mib = 1u64 << 20;
        let alloc = Arc::new(CachingAllocator::new(SimBackend::new(0, 64 * mib), AllocatorConfig::default()));
        let blocks: Vec<_> = (0..6).map(|_| alloc.malloc(8 * mib, StreamId::DEFAULT).unwrap()).collect();
        // Free every other block: 24 MiB cached in three 8 MiB pieces, none adjacent.
        for b in blocks.iter().step_by(2) {
            alloc.free(b.block.unwrap()).unwrap();
        }
        let seen: Arc<Mutex<Vec<OomEvent>>> = Arc::default();
        let (sink, a) = (seen.clone(), alloc.clone());
        alloc.set_oom_observer(Some(Arc::new(move |r: &OomReport| {
            sink.lock().unwrap().push(describe(r, &a.segments()));
        })));
        let err = alloc.malloc(40 * mib, StreamId::DEFAULT).unwrap_err();
        assert!(matches!(err, AllocError::OutOfMemory(_)));
        let seen = seen.lock().unwrap();
        let e = &seen[0];
        assert_eq!(e.requested, 40 * mib);
        assert!(e.cached_free >= e.largest_free_block && e.largest_free_block > 0, "{e:?}");
        assert!(e.why.starts_with("out of memory on device 0: asked for 40.00 MiB"), "{}", e.why);
        assert!(e.why.contains("fragmentation"), "{}", e.why);
        alloc.set_oom_observer(None);
        assert!(alloc.malloc(40 * mib, StreamId::DEFAULT).is_err());
        assert_eq!(seen.len(), 1, "no observer, nothing told");
    }

    /// Without a snapshot directory a cell's failure is still described (the report line flags
    /// it), and nothing is written.
    #[test]
    fn a_cell_is_watched_without_a_snapshot_directory() {
        let mib = 1u64 << 20;
        let backend = crate::device::any::AnyBackend::Sim(SimBackend::new(0, 64 * mib));
        let alloc = Arc::new(CachingAllocator::new(backend, AllocatorConfig::default()));
        let watch = Arc::new(OomWatch::default());
        watch.lock().cell = Some(7);
        watch.watch(&alloc);
        assert!(alloc.malloc(100 * mib, StreamId::DEFAULT).is_err());
        assert!(alloc.malloc(100 * mib, StreamId::DEFAULT).is_err());
        let e = watch.end().expect("the failure");
        assert_eq!((e.requested, e.count), (100 * mib, 2));
        assert!(e.files.is_none() && e.snapshot_error.is_none(), "{e:?}");
        assert!(watch.end().is_none(), "taken");
    }
}
