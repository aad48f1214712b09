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
        // The cells run on the thread that first opens a device: stacks walked elsewhere are
        // a framework's or a worker's, made for the cell that was running.
        crate::record::frames::set_home_thread();
        let blocks = tracking::block_stacks();
        if blocks.is_some() {
            alloc.set_stack_depth(tracking::BLOCK_STACK_DEPTH);
            // Its blocks' changes, for components' peaks within a cell.
            alloc.set_block_observer(Some(tracking::block_observer()));
        }
        if let Some(options) = blocks {
            alloc.record_memory_history_with(options);
        }
        // `%gpumem record on` and `--on-oom` asked before the first use: the new allocator records
        // and is watched from its start.
        control::opened(&alloc);
        control::start_if_requested();
        stock::start_if_evcxr();
    }
    Ok(alloc)
}

/// The allocator of device 0 (the notebook's device).
pub fn current() -> Result<Arc<Allocator>> {
    device(0)
}

/// In gpumem-kernel's notebook process (the kernel's own binary, playing evcxr's child: the
/// control channel's `GPUMEM_NB_CONTROL` is set), before its first cell: every device
/// allocation of the process is tracked from now on and the kernel's per-cell readings are
/// served, whatever framework the notebook uses and whether or not it ever names gpumem-nb. No
/// device is opened and no CUDA context is made: CUPTI subscribes to the driver's calls (a
/// notebook that never touches the GPU holds nothing there), the simulated driver where there
/// is no GPU. The thread that calls this is the one that runs the cells. A later `:dep
/// gpumem-nb` built by the same compiler joins this state ([`super::anchor`]); one built by
/// another stays beside it and never subscribes a second time ([`tracking::TRACKER_VAR`]).
/// Returns at once in any other process.
pub fn watch_from_start() {
    if std::env::var_os(super::protocol::CONTROL_VAR).is_none() || std::env::var_os(stock::RUNTIME_VAR).is_none() {
        return;
    }
    publish_tracker();
    crate::record::frames::set_home_thread();
    tracking::start(simulated_without_probe());
    tracking::keep_by_default();
    control::start_if_requested();
}

/// Watches this process from now on, without opening a device (no CUDA context is made): every
/// device allocation of the process is tracked, whoever makes it (candle, burn, cudarc, …), and
/// in the stock evcxr kernel every later cell gets its report. What a notebook in the stock
/// kernel calls once, in its first cell after `:dep gpumem-nb`; in gpumem-kernel every notebook
/// is watched before its first cell and this changes nothing. Call it on the thread that runs
/// the notebook's cells. Returns how the process is tracked.
pub fn watch() -> tracking::TrackingStatus {
    crate::record::frames::set_home_thread();
    start_or_join(simulated_without_probe());
    tracking::keep_by_default();
    control::start_if_requested();
    stock::start_if_evcxr();
    tracking::status()
}

/// Says in the environment that this copy tracks the process ([`tracking::TRACKER_VAR`]). Called before
/// any thread of the process is started (`set_var`'s rule, which the crate keeps by taking no
/// `unsafe` outside its three places: the anchor publishes it).
fn publish_tracker() {
    super::anchor::publish_var(
        tracking::TRACKER_VAR,
        &format!("{}@{}", std::process::id(), super::anchor::build_fingerprint()),
    );
}

/// The tracker another copy of the crate runs in this process, when one said so
/// ([`tracking::TRACKER_VAR`]) and it is not this copy's state: its build fingerprint.
fn tracker_elsewhere() -> Option<String> {
    tracker_of(&std::env::var(tracking::TRACKER_VAR).ok()?, std::process::id())
}

/// The build fingerprint in a [`tracking::TRACKER_VAR`] value, when it names process `pid` (a
/// child inherits the variable, never the tracker).
fn tracker_of(value: &str, pid: u32) -> Option<String> {
    let (p, fingerprint) = value.split_once('@')?;
    (p.parse::<u32>().ok()? == pid && !fingerprint.is_empty()).then(|| fingerprint.to_string())
}

/// Starts tracking as a copy of the crate opens its first device: where gpumem-kernel's own copy
/// already tracks this process with state this copy cannot share, only says so
/// ([`tracking::TrackingStatus::Elsewhere`]); otherwise `tracking::start`.
fn start_or_join(simulated: bool) {
    if let Some(theirs) = tracker_elsewhere() {
        let why = format!(
            "gpumem-kernel tracks this process (its gpumem-nb was built as {theirs}; this one as {})",
            super::anchor::build_fingerprint()
        );
        if tracking::set_elsewhere(why) {
            return;
        }
    }
    tracking::start(simulated);
}

/// Whether the notebook's devices will be simulated, told without starting CUDA: asked for
/// (`GPUMEM_NB_DEVICE=sim…`), or `auto` on a machine with no CUDA driver. A malformed setting
/// is the GPU's case (CUPTI sees what the code does; the setting's error comes with the first
/// device gpumem-nb opens).
fn simulated_without_probe() -> bool {
    use super::registry::{DeviceSelection, selection};
    match selection() {
        Ok(DeviceSelection::Sim(..)) => true,
        Ok(DeviceSelection::Auto) => !cuda_driver_present(),
        _ => false,
    }
}

#[cfg(feature = "cuda")]
fn cuda_driver_present() -> bool {
    crate::device::cuda::library_present()
}

#[cfg(not(feature = "cuda"))]
fn cuda_driver_present() -> bool {
    false
}

/// Every allocation of the process is tracked from the first device on: the simulated device
/// reports through its own driver, a GPU through CUPTI. Tracking off (`GPUMEM_NB_TRACK=off`) or
/// unavailable: the backend reports to nobody, so an untracked allocation costs what it costs
/// without gpumem-nb's books.
fn start_tracking(resolved: &Resolved) -> Option<DriverSink> {
    start_or_join(matches!(resolved, Resolved::Simulated { .. }));
    tracking::status().is_on().then_some(tracking::sink as DriverSink)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::notebook::registry::resolved;

    #[test]
    fn a_tracker_is_another_copy_s_only_in_its_own_process() {
        let fp = crate::notebook::anchor::build_fingerprint();
        assert_eq!(tracker_of(&format!("41@{fp}"), 41), Some(fp.clone()));
        assert_eq!(tracker_of(&format!("41@{fp}"), 42), None, "a child inherits the variable, not the tracker");
        for bad in ["", "41", "41@", "x@y", "@fp"] {
            assert_eq!(tracker_of(bad, 41), None, "{bad:?}");
        }
    }

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
