//! cubecl 0.10's own books, for burn 0.21 notebooks (feature `cubecl010`).
//!
//! The same job as [`super::cubecl`] for the release before it. burn 0.22's CUDA runtime
//! (cubecl 0.11) builds LLVM's NVPTX backend into itself and downloads a prebuilt LLVM while it
//! compiles, which a machine that reaches only package registries cannot do; burn 0.21 (cubecl
//! 0.10) compiles its kernels with NVRTC and builds offline. cubecl 0.10 reports less:
//! `ComputeClient::memory_usage()`, the totals of one stream's pools (bytes live allocations
//! use, their padding, bytes reserved, live allocations), no pages, kinds or high-water marks.
//! A reading is therefore one entry of kind `all pools`. cubecl 0.10's CUDA runtime takes its
//! pages with `cuMemAllocAsync` on its stream (`cuMemAlloc` when that fails): tracking counts
//! them under the CUDA pool, and the record's CUDA pool numbers include them.
//!
//! ```ignore
//! use burn::cubecl::{Runtime, cuda::{CudaDevice, CudaRuntime}};
//! let client = CudaRuntime::client(&CudaDevice::new(0));
//! gpumem_nb::frameworks::cubecl010::watch(&client)?;
//! ```
//!
//! cubecl 0.10 gives every thread a stream of its own (a thread-local id), and
//! `memory_usage()` reads the caller's. [`watch`] notes the stream of the thread that calls it
//! (the notebook's: evcxr runs every cell on the child's main thread) and reads that stream's
//! pools from the control channel's thread. Under evcxr each cell also has its own copy of
//! cubecl's statics, its device servers among them: call `watch` in the cell that made the
//! server the model's tensors live in.
#![forbid(unsafe_code)]

use crate::notebook::protocol::{FrameworkPool, FrameworkReading};
use crate::notebook::watched;
use cubecl_common_010::stream_id::StreamId;
use cubecl_runtime_010::client::ComputeClient;
use cubecl_runtime_010::memory_management::MemoryUsage;
use cubecl_runtime_010::runtime::Runtime;
use std::sync::Arc;

/// Where every reading's numbers come from.
pub const SOURCE: &str =
    "cubecl 0.10's own books: ComputeClient::memory_usage, the notebook thread's stream (totals of its pools)";

/// The kind of the one pool entry a reading has: cubecl 0.10 reports totals only.
pub const KIND: &str = watched::TOTALS;

/// Watches `client`'s pools for the calling thread's stream from now on: every cell's record
/// and line carry them. Also opens gpumem-nb's device 0, which starts the per-cell readings and
/// tracking, if no cell did yet. Watching the same runtime and stream again replaces the earlier
/// watch. Returns what is watched (`cuda stream 0`).
pub fn watch<R: Runtime>(client: &ComputeClient<R>) -> crate::error::Result<String> {
    let stream = StreamId::current();
    let device = format!("{} stream {}", R::name(client), stream.value);
    let (c, flusher, cleaner) = (client.clone(), client.clone(), client.clone());
    // Before every reading: what the notebook queued runs first. cubecl keeps up to 32 tasks
    // (a model's creation, its first launches) in its device queue until something blocks; a
    // flush runs them all (every stream's: one queue per device), on the notebook's stream id.
    let settle = move || stream.executes(|| flusher.flush()).map_err(|e| format!("{e:?}"));
    watch_usage_settled(
        &device,
        move || stream.executes(|| c.memory_usage()).map_err(|e| format!("{e:?}")),
        Some(Arc::new(settle)),
    )?;
    // `%gpumem trim`: cubecl's own cleanup, on the notebook's stream.
    trim_with(&device, move || {
        stream.executes(|| cleaner.memory_cleanup());
        Ok(())
    });
    Ok(device)
}

/// Gives the watch of `device` (see [`watch_usage`]) a cleanup that `%gpumem trim` calls to give
/// back what the pools keep cached (cubecl: `memory_cleanup`); false when `device` is not
/// watched.
pub fn trim_with(device: &str, cleanup: impl Fn() -> Result<(), String> + Send + Sync + 'static) -> bool {
    watched::set_trim(&key(device), Arc::new(cleanup))
}

/// Watches cubecl 0.10 memory usage from any source (another client, a memory manager of one's
/// own): `usage` is asked at every cell's reading; an error is that reading's error.
pub fn watch_usage(
    device: &str,
    usage: impl Fn() -> Result<MemoryUsage, String> + Send + Sync + 'static,
) -> crate::error::Result<()> {
    watch_usage_settled(device, usage, None)
}

fn watch_usage_settled(
    device: &str,
    usage: impl Fn() -> Result<MemoryUsage, String> + Send + Sync + 'static,
    settle: Option<watched::Settler>,
) -> crate::error::Result<()> {
    crate::notebook::session::current()?;
    let label = device.to_string();
    watched::watch(
        &key(device),
        Arc::new(move || watched::totals("cubecl", &label, SOURCE, usage().map(|u| pool(&u)))),
        settle,
    );
    Ok(())
}

/// Stops watching `device` (`cuda stream 0`); false when it was not watched.
pub fn unwatch(device: &str) -> bool {
    watched::unwatch(&key(device))
}

fn key(device: &str) -> String {
    format!("cubecl {device}")
}

/// cubecl 0.10's memory usage as gpumem-nb's reading: one entry, kind [`KIND`].
pub fn reading(device: &str, u: &MemoryUsage) -> FrameworkReading {
    watched::totals("cubecl", device, SOURCE, Ok(pool(u)))
}

/// cubecl 0.10's totals as one pool entry.
fn pool(u: &MemoryUsage) -> FrameworkPool {
    FrameworkPool {
        allocations: u.number_allocs,
        in_use: u.bytes_in_use,
        padding: u.bytes_padding,
        reserved: u.bytes_reserved,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_maps_to_one_entry_with_cubecls_numbers() {
        let u = MemoryUsage { number_allocs: 3, bytes_in_use: 1000, bytes_padding: 24, bytes_reserved: 2 << 20 };
        let r = reading("cuda stream 0", &u);
        assert_eq!((r.framework.as_str(), r.device.as_str(), r.error.as_ref()), ("cubecl", "cuda stream 0", None));
        let p = &r.pools[0];
        assert_eq!((p.kind.as_str(), p.allocations, p.in_use, p.padding, p.reserved), (KIND, 3, 1000, 24, 2 << 20));
        assert_eq!(p.cached(), (2 << 20) - 1024);
        assert_eq!((p.pages, p.pages_peak, p.page_size), (0, 0, None), "cubecl 0.10 counts no pages");
    }
}
