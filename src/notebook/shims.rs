//! Frameworks' own books with no call of the notebook's: cubecl's (burn's GPU backends), through
//! the reader gpumem-kernel compiles into the notebook's session library
//! (`kernel/src/build/books_shim.rs`, found by `device::cuda::books`).
//!
//! Once tracking has seen cubecl (the owner `burn/cubecl`) hold memory on a CUDA device, that
//! device's books are watched as `frameworks::cubecl010::watch` would watch them: every later
//! reading carries them (settled first), and `%gpumem trim` gives back what cubecl keeps cached.
//! Not before: a notebook that never touches the GPU makes no CUDA context through this. A
//! notebook that watches cubecl itself keeps its own watch. Without the reader (the stock kernel,
//! a burn the kernel has no reader for, a notebook that links its crates per cell) nothing is
//! watched, and cubecl's pages are tracked as before, without cubecl's own figures.
#![forbid(unsafe_code)]

use super::protocol::PlaceReading;

/// Where the numbers come from.
#[cfg(feature = "cuda")]
const SOURCE: &str = "cubecl 0.10's own books, read by gpumem-kernel's session library: \
     ComputeClient::memory_usage, the notebook thread's stream (totals of its pools)";

/// The owner word of cubecl's pages in tracking (`track::owner`).
const CUBECL: &str = "burn/cubecl";

/// The CUDA devices on which `places` show cubecl holding memory.
fn cubecl_devices(places: &[PlaceReading]) -> Vec<u32> {
    let mut out: Vec<u32> = places
        .iter()
        .filter(|p| p.by_owner.iter().any(|o| o.owner == CUBECL && o.live > 0))
        .filter_map(|p| u32::try_from(p.device?).ok())
        .collect();
    out.dedup();
    out
}

/// Watches cubecl's books on each device where `places` (a reading's tracked places, with their
/// owners) show cubecl holding memory and no watch of cubecl's is there yet, when the session
/// library has a reader. True when a watch was added (the caller settles it before reading).
pub(crate) fn attach(places: &[PlaceReading]) -> bool {
    let devices = cubecl_devices(places);
    if devices.is_empty() || super::watched::watching("cubecl ") {
        return false;
    }
    attach_on(&devices)
}

#[cfg(feature = "cuda")]
fn attach_on(devices: &[u32]) -> bool {
    use super::protocol::{FrameworkPool, FrameworkReading};
    use super::watched;
    use crate::device::cuda::books;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(reader) = books::find(crate::record::cells::SESSION_DEPS_PREFIX).map(Arc::new) else { return false };
    let stream = reader.stream();
    for &d in devices {
        let label = format!("cuda:{d} stream {stream}");
        let key = format!("cubecl {label}");
        let (r, s, t) = (Arc::clone(&reader), Arc::clone(&reader), Arc::clone(&reader));
        // The first reading is the one right after this: the reading before it (the previous
        // cell's) saw no cubecl memory live on this device, or the watch would have begun then.
        let first = AtomicBool::new(true);
        watched::watch(
            &key,
            Arc::new(move || {
                let read = r.usage(d).map(|u| FrameworkPool {
                    allocations: u.allocations,
                    in_use: u.in_use,
                    padding: u.padding,
                    reserved: u.reserved,
                    ..Default::default()
                });
                let from_empty = read.is_ok() && first.swap(false, Ordering::SeqCst);
                FrameworkReading { from_empty, ..watched::totals("cubecl", &label, SOURCE, read) }
            }),
            Some(Arc::new(move || s.flush(d))),
        );
        watched::set_trim(&key, Arc::new(move || t.cleanup(d)));
    }
    true
}

#[cfg(not(feature = "cuda"))]
fn attach_on(_devices: &[u32]) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notebook::protocol::OwnerReading;

    fn place(device: Option<i32>, owners: &[(&str, u64)]) -> PlaceReading {
        PlaceReading {
            device,
            by_owner: owners.iter().map(|(o, b)| OwnerReading { owner: o.to_string(), live: *b, rise: None }).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn cubecl_s_books_are_wanted_only_where_cubecl_holds_device_memory() {
        let places = [
            place(Some(0), &[("candle", 1 << 30)]),
            place(Some(1), &[("burn/cubecl", 2 << 20), ("cuBLAS", 1)]),
            place(Some(2), &[("burn/cubecl", 0)]),
            place(None, &[("burn/cubecl", 4096)]),
        ];
        assert_eq!(cubecl_devices(&places), [1]);
        assert!(cubecl_devices(&places[..1]).is_empty());
        // No session library in this process: nothing is watched, and nothing fails.
        assert!(!attach(&places));
        assert!(!super::super::watched::watching("cubecl "));
    }
}
