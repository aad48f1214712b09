//! Every reserved byte explained, as a table: an allocator's [`ReservedParts`] with the CUDA
//! stream-ordered pool beside it (what `%gpumem explain` and `gpumem_nb::plan::explain` show).

use super::{MimeBundle, Table};
use crate::device::{BackendKind, PoolUsage};
use crate::policy::ReservedParts;
use crate::units::iec;
use std::fmt;

/// The reserved bytes of one device, explained (plain data; see [`ReservedParts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservedView {
    /// Device index.
    pub device: i32,
    /// What the numbers come from.
    pub backend: BackendKind,
    /// When, for the caption (`after cell 5`, `now`).
    pub when: String,
    /// The allocator's parts.
    pub parts: ReservedParts,
    /// The CUDA stream-ordered pool (`cuMemAllocAsync`: cudarc's `CudaSlice`, candle), when the
    /// device has one.
    pub pool: Option<PoolUsage>,
}

impl ReservedView {
    /// The CUDA pool's bytes held beyond its live ones (`reserved − used`), when there is one.
    pub fn pool_held(&self) -> Option<u64> {
        self.pool.map(|p| p.reserved.saturating_sub(p.used))
    }

    /// The table: each part, its bytes, what it is.
    pub fn table(&self) -> Table {
        let p = &self.parts;
        let mut t = Table::new(["part", "bytes", "what it is"]).right_align([1]);
        t.row(["requested", &iec(p.requested), "what the program asked for, in blocks it holds"]);
        t.row([
            "+ rounding",
            &iec(p.rounding),
            "those blocks beyond the requests (512 B steps, remainders too small to split off)",
        ]);
        t.row(["+ pending frees", &iec(p.pending_free), "freed, waiting for another stream's work (record_stream)"]);
        for c in &p.cached {
            let what = format!("free, cached for reuse: {} block{}", c.blocks, if c.blocks == 1 { "" } else { "s" });
            t.row([format!("+ cached, {} pool, {}", c.pool, c.label()), iec(c.bytes), what]);
        }
        if p.cached.is_empty() {
            t.row(["+ cached", &iec(0), "no free blocks"]);
        }
        t.row(["= reserved", &iec(p.reserved), "obtained from the device (segments, mapped pages)"]);
        t.row([
            "empty_cache() returns",
            &iec(p.releasable),
            "whole free segments or pages, after waiting for pending frees",
        ]);
        t.row(["empty_cache() keeps", &iec(p.kept()), "free space in segments that hold live blocks (fragmentation)"]);
        t.row([
            "largest free block".to_string(),
            format!("{} / {}", iec(p.largest_free_small), iec(p.largest_free_large)),
            "small / large pool: a larger request needs new memory from the device".to_string(),
        ]);
        match (self.pool, self.pool_held()) {
            (Some(pool), Some(held)) => t.row([
                "CUDA pool beyond live".to_string(),
                iec(held),
                format!(
                    "cuMemAllocAsync pool (cudarc, candle): {} reserved, {} in use; not part of the allocator's reserved",
                    iec(pool.reserved),
                    iec(pool.used)
                ),
            ]),
            _ => t.row(["CUDA pool beyond live", "n/a", "no stream-ordered pool on this device"]),
        }
        let sim = if self.backend == BackendKind::Cuda { "" } else { ", simulated" };
        t.caption(format!(
            "device {}{sim} · gpumem-nb allocator, {} · exact: the parts above the line add up to reserved",
            self.device, self.when
        ))
    }

    /// Text and HTML.
    pub fn bundle(&self) -> MimeBundle {
        self.table().bundle()
    }
}

impl fmt::Display for ReservedView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.table().to_text())
    }
}

super::evcxr_display!(ReservedView);
