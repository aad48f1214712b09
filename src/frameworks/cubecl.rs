//! cubecl's own books, for burn notebooks (feature `cubecl`).
//!
//! burn's GPU backends allocate through cubecl, which keeps its device memory in pools of pages
//! and never goes through gpumem-nb's allocator. Tracking sees each page as cubecl takes it from
//! the driver (`cuMemAlloc` with cubecl's default allocator) and gives it back, but not what
//! inside a page is in use: a pool that grew and a leak look the same there. cubecl's memory
//! report says it: per stream and pool, the bytes live allocations use, their padding, the bytes
//! reserved, the pages held and their high-water mark. [`watch`] puts that report into every
//! cell's reading, so the record and line show what is live and what cubecl keeps cached:
//!
//! ```ignore
//! let client = burn::cubecl::Device::cuda(0)?.client();   // cubecl 0.11's `Client`
//! gpumem_nb::frameworks::cubecl::watch(&client)?;
//! ```
//!
//! Written against cubecl 0.11 (burn 0.22): `Client::memory_report(MemoryScope::Device)`,
//! which returns a `MemoryPoolReport` per pool (cubecl PR #1494). Pool kinds keep cubecl's
//! names; the dedicated allocations (each its own device allocation) are the kind `dedicated`.
//!
//! Under evcxr each cell has its own copy of cubecl's statics, its device servers among them:
//! call `watch` in the cell that made the device's server (the one that runs the model), so
//! the client read is the server the model's tensors live in.
#![forbid(unsafe_code)]

use crate::notebook::protocol::{FrameworkPool, FrameworkReading};
use crate::notebook::watched;
use cubecl_runtime::client::Client;
use cubecl_runtime::memory_management::{MemoryPoolKind, MemoryPoolReport, MemoryReport, MemoryScope};
use std::sync::Arc;

/// Where every reading's numbers come from.
pub const SOURCE: &str = "cubecl's own books: Client::memory_report, every stream of the device";

/// What cubecl calls the device `client` runs on: `cuda:0`.
pub fn device_label(client: &Client) -> String {
    format!("{}:{}", client.name(), client.service_id().device.index_id)
}

/// Watches `client`'s device from now on: every cell's record and line carry its pools. Also
/// opens gpumem-nb's device 0, which starts the per-cell readings and tracking, if no cell did
/// yet. Watching the same device again replaces the earlier watch. Returns what is watched
/// (`cuda:0`).
pub fn watch(client: &Client) -> crate::error::Result<String> {
    let device = device_label(client);
    let (c, cleaner) = (client.clone(), client.clone());
    watch_report(&device, move || c.memory_report(MemoryScope::Device))?;
    // `%gpumem trim`: cubecl's own cleanup, every stream of the device.
    watched::set_trim(&key(&device), Arc::new(move || cleaner.memory_cleanup().map_err(|e| format!("{e:?}"))));
    Ok(device)
}

/// Watches a cubecl memory report from any source (another runtime's client, a memory manager
/// of one's own): `report` is asked at every cell's reading.
pub fn watch_report(
    device: &str,
    report: impl Fn() -> MemoryReport + Send + Sync + 'static,
) -> crate::error::Result<()> {
    crate::notebook::session::current()?;
    let label = device.to_string();
    // cubecl 0.11's report is a blocking call on the device's queue: what was queued before it
    // runs first (no separate settle step, which would need the notebook's stream id).
    watched::watch(&key(device), Arc::new(move || reading(&label, &report())), None);
    Ok(())
}

/// Stops watching `device` (`cuda:0`); false when it was not watched.
pub fn unwatch(device: &str) -> bool {
    watched::unwatch(&key(device))
}

fn key(device: &str) -> String {
    format!("cubecl {device}")
}

/// A cubecl memory report as gpumem-nb's reading: every pool of every stream, dynamic pools
/// first (cubecl's routing order), then the persistent pool, the dedicated allocations and the
/// runtime's auxiliary memories (named `auxiliary: NAME`).
pub fn reading(device: &str, report: &MemoryReport) -> FrameworkReading {
    let mut pools = Vec::new();
    for s in &report.streams {
        let stream = s.stream.value;
        let p = &s.pools;
        pools.extend(p.dynamic.iter().map(|r| pool(kind_name(&r.kind), stream, r)));
        pools.push(pool("persistent".into(), stream, &p.persistent));
        pools.push(pool("dedicated".into(), stream, &p.dedicated));
        for aux in &s.auxiliary {
            let a = &aux.pools;
            let pools_of = a.dynamic.iter().chain([&a.persistent, &a.dedicated]);
            pools.extend(pools_of.map(|r| pool(format!("auxiliary: {}", aux.name), stream, r)));
        }
    }
    FrameworkReading {
        framework: "cubecl".into(),
        device: device.to_string(),
        source: SOURCE.into(),
        pools,
        ..Default::default()
    }
}

/// cubecl's name of a pool kind.
fn kind_name(kind: &MemoryPoolKind) -> String {
    match kind {
        MemoryPoolKind::Sliced { .. } => "sliced",
        MemoryPoolKind::Adaptive { .. } => "adaptive",
        MemoryPoolKind::Exclusive { .. } => "exclusive",
        MemoryPoolKind::Direct => "direct",
        MemoryPoolKind::Persistent => "persistent",
    }
    .into()
}

fn pool(kind: String, stream: u64, r: &MemoryPoolReport) -> FrameworkPool {
    let page_size = match r.kind {
        MemoryPoolKind::Sliced { page_size, .. } | MemoryPoolKind::Adaptive { page_size, .. } => Some(page_size),
        _ => None,
    };
    FrameworkPool {
        kind,
        stream,
        page_size,
        allocations: r.usage.number_allocs,
        in_use: r.usage.bytes_in_use,
        padding: r.usage.bytes_padding,
        reserved: r.usage.bytes_reserved,
        pages: r.pages,
        pages_peak: r.pages_peak,
        pages_unmapped: r.pages_unmapped,
        largest_alloc: r.largest_alloc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cubecl_runtime::memory_management::{
        AuxiliaryMemoryReport, MemoryPoolsReport, MemoryUsage, StreamMemoryReport,
    };

    fn report(kind: MemoryPoolKind, in_use: u64, padding: u64, reserved: u64, pages: u64) -> MemoryPoolReport {
        MemoryPoolReport {
            kind,
            usage: MemoryUsage {
                number_allocs: in_use.min(3),
                bytes_in_use: in_use,
                bytes_padding: padding,
                bytes_reserved: reserved,
            },
            pages,
            pages_peak: pages + 1,
            pages_unmapped: 0,
            largest_alloc: in_use,
        }
    }

    /// Every pool of every stream is one entry, with cubecl's numbers unchanged and its kind's
    /// name; the sums are cubecl's own `usage()`.
    #[test]
    fn a_report_maps_pool_by_pool_and_sums_as_cubecl_sums() {
        let stream = |value: u64, scale: u64| StreamMemoryReport {
            // cubecl's `StreamId` is `{ value }`, from a crate this one does not name.
            stream: serde_json::from_value(serde_json::json!({ "value": value })).unwrap(),
            pools: MemoryPoolsReport {
                dynamic: vec![
                    report(
                        MemoryPoolKind::Sliced { page_size: 8 << 20, max_slice_size: 1 << 20 },
                        100 * scale,
                        28,
                        8 << 20,
                        1,
                    ),
                    report(
                        MemoryPoolKind::Adaptive { page_size: 64 << 20, outdated_pages: 0 },
                        40 << 20,
                        0,
                        128 << 20,
                        2,
                    ),
                ],
                persistent: report(MemoryPoolKind::Persistent, 16 << 20, 0, 16 << 20, 1),
                dedicated: report(MemoryPoolKind::Direct, 0, 0, 0, 0),
            },
            auxiliary: vec![AuxiliaryMemoryReport {
                name: "staging".into(),
                pools: MemoryPoolsReport {
                    dynamic: vec![],
                    persistent: report(MemoryPoolKind::Persistent, 0, 0, 0, 0),
                    dedicated: report(MemoryPoolKind::Direct, 1 << 20, 0, 1 << 20, 1),
                },
            }],
        };
        let r = MemoryReport { streams: vec![stream(0, 1), stream(7, 2)] };
        let got = reading("cuda:0", &r);
        assert_eq!((got.framework.as_str(), got.device.as_str(), got.error.as_ref()), ("cubecl", "cuda:0", None));
        let kinds: Vec<&str> = got.pools.iter().map(|p| p.kind.as_str()).collect();
        let one = ["sliced", "adaptive", "persistent", "dedicated", "auxiliary: staging", "auxiliary: staging"];
        assert_eq!(kinds, [one, one].concat());
        assert_eq!(got.pools[6].stream, 7);
        let sliced = &got.pools[6];
        assert_eq!(
            (sliced.in_use, sliced.padding, sliced.reserved, sliced.page_size),
            (200, 28, 8 << 20, Some(8 << 20))
        );
        assert_eq!((sliced.pages, sliced.pages_peak, sliced.largest_alloc), (1, 2, 200));
        assert_eq!(got.pools[1].page_size, Some(64 << 20));
        assert_eq!(got.pools[2].page_size, None);
        let usage = r.usage();
        let sum = |f: fn(&FrameworkPool) -> u64| got.pools.iter().map(f).sum::<u64>();
        assert_eq!(sum(|p| p.in_use), usage.bytes_in_use);
        assert_eq!(sum(|p| p.padding), usage.bytes_padding);
        assert_eq!(sum(|p| p.reserved), usage.bytes_reserved);
        assert_eq!(sum(|p| p.allocations), usage.number_allocs);
        assert_eq!(sum(|p| p.cached()), usage.bytes_reserved - usage.bytes_in_use - usage.bytes_padding);
    }
}
