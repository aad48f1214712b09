//! What a notebook process starts with its first device: [`device`] and [`current`] open a
//! device through the [registry](super::registry) and, the first time, start what watches the
//! process from then on:
//!
//! 1. tracking of every device allocation (CUPTI on a GPU, the simulated driver otherwise),
//!    subscribed before the device is opened so that the backend's sink reports to it; and, with
//!    its stacks, the stack of every live block of the allocator (so that sites name the code
//!    holding memory);
//! 2. the control channel to gpumem-kernel, when the kernel asked for it (`GPUMEM_NB_CONTROL`);
//! 3. the stock evcxr kernel's per-cell hooks, when the process is an evcxr child without
//!    gpumem-kernel.
//!
//! Each of these keeps its own state in its own module; this one only orders them.
#![forbid(unsafe_code)]

use super::registry::{self, Resolved};
use super::{control, stock, tracking};
use crate::allocator::Allocator;
use crate::device::DriverSink;
use crate::error::Result;
use std::sync::Arc;

/// The allocator of device `index` in this process: created on first use, then the same `Arc`
/// (one per device per process, whichever notebook cell asks). Thread-safe; errors (a malformed
/// `GPUMEM_NB_DEVICE` or `GPUMEM_NB_ALLOC_CONF`, no GPU for `cuda`, an index out of range) are
/// values and leave nothing cached.
pub fn device(index: usize) -> Result<Arc<Allocator>> {
    let (alloc, opened) = registry::open(index, start_tracking)?;
    if opened {
        use crate::record::history::{HistoryOptions, RecordMode, StackContext};
        // The cells run on the thread that first opens a device: stacks walked elsewhere are
        // a framework's or a worker's, made for the cell that was running.
        crate::record::frames::set_home_thread();
        let blocks = tracking::block_stacks();
        if blocks.is_some() {
            alloc.set_stack_depth(tracking::BLOCK_STACK_DEPTH);
            // Its blocks' changes, for components' peaks within a cell.
            alloc.set_block_observer(Some(tracking::block_observer()));
        }
        // `%gpumem record on` before the first use: the new allocator records from its start.
        let options = match tracking::recording() {
            Some(max_entries) => Some(HistoryOptions {
                enabled: RecordMode::All,
                context: blocks.map_or(StackContext::None, |b| b.context),
                max_entries,
            }),
            None => blocks,
        };
        if let Some(options) = options {
            alloc.record_memory_history_with(options);
        }
        control::start_if_requested();
        stock::start_if_evcxr();
    }
    Ok(alloc)
}

/// The allocator of device 0 (the notebook's device).
pub fn current() -> Result<Arc<Allocator>> {
    device(0)
}

/// Every allocation of the process is tracked from the first device on: the simulated device
/// reports through its own driver, a GPU through CUPTI. Tracking off (`GPUMEM_NB_TRACK=off`) or
/// unavailable: the backend reports to nobody, so an untracked allocation costs what it costs
/// without gpumem-nb's books.
fn start_tracking(resolved: &Resolved) -> Option<DriverSink> {
    tracking::start(matches!(resolved, Resolved::Simulated { .. }));
    tracking::status().is_on().then_some(tracking::sink as DriverSink)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::notebook::registry::resolved;

    #[test]
    fn device_returns_one_allocator_per_process() {
        // Reads the environment as the test runner left it (no mutation here).
        let (a, b) = match (current(), device(0)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                // Only a malformed environment can make this fail.
                assert!(matches!(e, Error::Setting(_) | Error::Config(_) | Error::NoCuda(_)), "{e}");
                return;
            }
        };
        assert!(Arc::ptr_eq(&a, &b));
        let r = resolved().unwrap();
        let n = r.device_count();
        assert!(device(n).is_err());
        let threads: Vec<_> = (0..4).map(|_| std::thread::spawn(|| device(0).unwrap())).collect();
        for t in threads {
            assert!(Arc::ptr_eq(&t.join().unwrap(), &a));
        }
        assert!(tracking::status() != tracking::TrackingStatus::NotStarted, "opening a device started tracking");
    }
}
