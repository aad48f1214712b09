//! What the child reads and answers with over the control channel: each device's numbers,
//! every allocation tracked per place and owner, the watched frameworks' own books, what a trim
//! gave back, an out-of-memory event. Plain data, serialised as the wire's JSON.
#![forbid(unsafe_code)]

use crate::device::BackendKind;
use crate::record::component::Component;
use serde::{Deserialize, Serialize};

/// One device's numbers, bytes. `pool_*` (the CUDA stream-ordered pool that cudarc's own
/// `CudaSlice` and candle use) are `None` on the simulated device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReading {
    /// CUDA device index (as the child numbers it).
    pub device: i32,
    /// What backs the allocator.
    pub backend: BackendKind,
    /// Bytes in live allocations.
    pub allocated: u64,
    /// Bytes in segments the allocator holds.
    pub reserved: u64,
    /// Bytes in active blocks.
    #[serde(default)]
    pub active: u64,
    /// Bytes requested by callers (before rounding).
    #[serde(default)]
    pub requested: u64,
    /// Peak allocated since `pre` (or overall, when no cell slot was open).
    pub peak_allocated: u64,
    /// Peak reserved since `pre`.
    pub peak_reserved: u64,
    /// Free device memory (`cuMemGetInfo`, or the simulated capacity left).
    #[serde(default)]
    pub device_free: Option<u64>,
    /// Device size.
    #[serde(default)]
    pub device_total: Option<u64>,
    /// CUDA pool: bytes in use.
    #[serde(default)]
    pub pool_used: Option<u64>,
    /// CUDA pool: bytes reserved.
    #[serde(default)]
    pub pool_reserved: Option<u64>,
    /// CUDA pool: high-water mark of use since `pre`.
    #[serde(default)]
    pub pool_used_high: Option<u64>,
    /// CUDA pool: high-water mark of reservation since `pre`.
    #[serde(default)]
    pub pool_reserved_high: Option<u64>,
    /// Allocation failures so far.
    #[serde(default)]
    pub num_ooms: u64,
    /// The device's UUID in NVML's form (`GPU-…`), to find the NVML device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Where the reserved bytes are (`post` and `read` only: not the live line's readings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<crate::policy::ReservedParts>,
    /// The device's CUDA context, lost (a kernel faulted): the numbers are the allocator's as
    /// they stood, the device is no longer read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<crate::device::LostContext>,
}

impl DeviceReading {
    /// Whether the numbers come from the simulated device.
    pub fn is_simulated(&self) -> bool {
        self.backend != BackendKind::Cuda
    }
}

/// What `trim` gave back of one owner's cache on one device, by the owner's own counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Trimmed {
    /// Whose cache: `gpumem-nb` (its caching allocator) or `CUDA pool` (the device's
    /// stream-ordered pool, where candle and cudarc allocate).
    pub owner: String,
    /// The device (`cuda:0`, `simulated:0`).
    pub device: String,
    /// Where the figures come from, in words.
    pub source: String,
    /// Bytes reserved (in use and cached) before the trim.
    pub reserved_before: u64,
    /// Bytes reserved after it.
    pub reserved_after: u64,
    /// Bytes in use after it (the trim never touches them).
    pub in_use: u64,
    /// Why this owner's cache was not trimmed (the figures are then its own, untouched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Trimmed {
    /// What the trim gave back (0 where it failed or reserved grew meanwhile).
    pub fn given_back(&self) -> u64 {
        self.reserved_before.saturating_sub(self.reserved_after)
    }
}

/// A CUDA device as the process numbers it, and as NVML names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CudaDevice {
    /// The process's ordinal (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: i32,
    /// The UUID in NVML's form, `GPU-…`.
    pub uuid: String,
    /// Each thread's stack in the device's primary context, bytes (`CU_LIMIT_STACK_SIZE`, which
    /// the driver raises for a kernel with a larger frame); absent where that context is not
    /// active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_bytes: Option<u64>,
    /// Threads the device holds at once (SMs × threads per SM): the driver reserves
    /// `stack_bytes` for each, its local memory for kernels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_threads: Option<u64>,
    /// The device's CUDA stream-ordered pool (where cudarc's `CudaSlice` and candle allocate),
    /// bytes in use and reserved, read from its primary context where that is active (the
    /// driver's own counters, exact): what the pool keeps cached is counted by NVML, never by
    /// a tracked allocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_used: Option<u64>,
    /// The same pool's reserved bytes (in use and cached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_reserved: Option<u64>,
    /// The most the same pool reserved since the cell began (its high-water mark, reset before
    /// each cell): what it held even where a synchronize gave memory back before the reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_reserved_high: Option<u64>,
    /// The device's size as CUDA counts it (`cuMemGetInfo`'s total in its primary context, where
    /// that is active): NVML's total less what the driver keeps for itself, the most a process
    /// can be given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_total: Option<u64>,
}

/// One place's tracked bytes, as reports show them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlaceReading {
    /// CUDA device, or `None` for pinned host memory.
    pub device: Option<i32>,
    /// The device's UUID in NVML's form (`GPU-…`) on a real GPU, which the kernel matches with
    /// NVML's per-device figures; `None` on the simulated device and for the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Bytes now, every source.
    pub live: u64,
    /// Highest `live` in the window (since the slot opened, or since tracking began).
    pub peak: u64,
    /// Per source with any bytes in the window.
    pub by_source: Vec<SourceReading>,
    /// Who holds the most of `live`, largest first (at most five).
    pub top: Vec<OwnerBytes>,
    /// Activations and temporaries still live, by site, cell and component, largest first (at
    /// most five): memory that outlived the code that made it (a kept graph, a forgotten
    /// intermediate). Empty when not asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<OwnerBytes>,
    /// What `live` is, by component ([`crate::components`]), with the allocator's cached free
    /// memory as `cached`: they add up to `live`. Empty when not asked for.
    #[serde(default)]
    pub by_component: Vec<ComponentReading>,
    /// Who holds `live`, by the framework or library that made each allocation
    /// ([`OwnerReading::owner`]): they add up to `live`. Empty when not asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_owner: Vec<OwnerReading>,
}

/// The owner word of gpumem-nb's own allocator (its blocks and its cache) in `by_owner`.
pub const GPUMEM_NB: &str = "gpumem-nb";

/// One owner's live bytes at a place: the framework or library that holds them, in its own
/// word (`candle`, `burn/cubecl`, `cudarc`, `cuBLAS`, `NCCL`, `gpumem-nb`, …: `track::owner`'s
/// rule), and how far they rose above their start while the slot was open.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerReading {
    /// The owner.
    pub owner: String,
    /// Its bytes now.
    pub live: u64,
    /// Its rise above its start during the slot, when the slot's changes are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rise: Option<u64>,
}

/// What a component reading's bytes are: one component's memory, or the allocator's cached free
/// memory (reserved by gpumem-nb's allocator, allocated to no one). On the wire, the
/// component's key (`parameter`, …, `other`: [`Component::key`]) or `cached`; any other name is
/// an error naming the ones known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Held {
    /// Memory of one component.
    Component(Component),
    /// The allocator's cached free memory.
    Cached,
}

impl Held {
    /// The name in data and on screen: the component's key, or `cached`.
    pub fn key(self) -> &'static str {
        match self {
            Held::Component(c) => c.key(),
            Held::Cached => "cached",
        }
    }

    /// Its name where a person reads it (the line, the history, the chart): `untagged` for
    /// `other` (bytes no stamp or rule named: the user's own buffers, mostly), the key otherwise.
    pub fn label(self) -> &'static str {
        match self {
            Held::Component(Component::Other) => "untagged",
            other => other.key(),
        }
    }

    /// Whether it says more than nothing: neither `other` nor `cached`. The line, the
    /// out-of-memory message and `top` say what memory is only once something is.
    pub fn is_classified(self) -> bool {
        !matches!(self, Held::Component(Component::Other) | Held::Cached)
    }
}

impl From<Component> for Held {
    fn from(c: Component) -> Self {
        Held::Component(c)
    }
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

impl Serialize for Held {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.key())
    }
}

impl<'de> Deserialize<'de> for Held {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Held, D::Error> {
        let name = String::deserialize(d)?;
        let held = Component::ALL.into_iter().map(Held::Component).chain([Held::Cached]);
        held.clone().find(|h| h.key() == name).ok_or_else(|| {
            let known: Vec<&str> = held.map(Held::key).collect();
            serde::de::Error::custom(format!("unknown component {name:?} (one of {})", known.join(", ")))
        })
    }
}

/// One component's live bytes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ComponentReading {
    /// What the bytes are.
    pub component: Held,
    /// Bytes now.
    pub live: u64,
    /// How far it rose above its bytes at the reading before (the cell's start) at its highest,
    /// when the changes in between are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rise: Option<u64>,
}

/// One source's bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceReading {
    /// `allocator`, `pool`, `driver`, `vmm`, `managed`, `host_pinned`.
    pub source: String,
    /// Bytes now.
    pub live: u64,
    /// Highest in the window.
    pub peak: u64,
}

/// One watched framework's settle step before a reading (its queued work run first).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settled {
    /// What was settled (`cubecl cuda stream 0`, `device 0`).
    pub key: String,
    /// How long it took, microseconds.
    pub waited_us: u64,
    /// Why it did not settle (no answer in time: read as it is; its error); `None`: settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How the allocator's cached free memory is named among the sites (its `function`): memory no
/// code holds, kept for reuse.
pub const CACHED_FREE: &str = "cached by the allocator, free";

/// Live bytes of one site: the allocations made at one place.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OwnerBytes {
    /// The library or code that made the allocations (`libcublasLt.so.13`, `candle_core::…`,
    /// `notebook cell`).
    pub owner: String,
    /// Their live bytes.
    pub bytes: u64,
    /// Full path of the innermost function outside CUDA, cudarc, gpumem-nb and std
    /// (`candle_core::tensor::Tensor::zeros`, `libcublasLt.so.13`, a function the notebook
    /// defined); `null` for the cell's own code or when unknown.
    #[serde(default)]
    pub function: Option<String>,
    /// The cell of the innermost notebook frame (its execution count); `null` when unknown.
    #[serde(default)]
    pub cell: Option<u64>,
    /// Its line, 1 = the cell's first line; `null` when unknown.
    #[serde(default)]
    pub line: Option<u32>,
    /// The running cell's line that called into a function an earlier cell defined (where
    /// `cell`/`line` point), as `[cell, line]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub called_from: Option<(u64, u32)>,
    /// For blocks of gpumem-nb's allocator: the site that made the segment they are in, where
    /// it is another (a later buffer reusing a cached segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
    /// Made on another thread than the cell's (a framework's device thread, a worker) while
    /// `cell` ran: work the cell queued.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
    /// What the memory is (`parameter`, `optimizer_state`, …: [`crate::components`]); `null`
    /// for the allocator's cached free memory and from an older crate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<Component>,
}

impl OwnerBytes {
    /// The site in words: `candle_core::tensor::Tensor::zeros ← cell 5:3`, `cell 5:3`,
    /// `alloc48 (cell 4:2) ← cell 5:2`, or the owner when nothing more is known.
    pub fn site(&self) -> String {
        if self.queued
            && let Some(c) = self.cell
        {
            // `cubecl ← cell 3`: the framework (its crate's first word), and the cell that
            // queued the work; `NCCL ← cell 3` for a CUDA library's own thread (NCCL's proxy).
            let who = self.owner.split("::").next().unwrap_or(&self.owner);
            let who = who.split('_').next().unwrap_or(who);
            // A thread whose only named frames are the runtime's (`libstd-….so`): no one to name.
            let who = match crate::record::frames::cuda_library(&self.owner) {
                Some(library) => library,
                None if who.contains(".so") => "a thread",
                None => who,
            };
            return format!("{who} ← cell {c}");
        }
        let at = match (self.cell, self.line) {
            (Some(c), Some(l)) => Some(format!("cell {c}:{l}")),
            (Some(c), None) => Some(format!("cell {c}")),
            _ => None,
        };
        let from = self.called_from.map(|(c, l)| format!("cell {c}:{l}"));
        // A CUDA library without symbols is its name (`NCCL ← cell 3:4`), not its file.
        let function = self.function.as_deref().map(|f| crate::record::frames::cuda_library(f).unwrap_or(f));
        match (function, at, from) {
            (Some(f), Some(at), Some(from)) => format!("{f} ({at}) ← {from}"),
            (Some(f), Some(at), None) => format!("{f} ← {at}"),
            (Some(f), None, _) => f.to_string(),
            (None, Some(at), _) => at,
            (None, None, _) => self.owner.clone(),
        }
    }
}

/// The sites holding the most memory now and at the session's peak (`%gpumem top`,
/// `gpumem_nb::tracking::top`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopReport {
    /// `cupti`, `simulated`, `unavailable: …`.
    pub tracking: String,
    /// Every place that held memory.
    pub places: Vec<PlaceTop>,
}

/// One place's top sites.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlaceTop {
    /// CUDA device, or `None` for pinned host memory.
    pub device: Option<i32>,
    /// Bytes live now, every source.
    pub live: u64,
    /// The highest since tracking began (the session's peak).
    pub peak: u64,
    /// The sites holding the most of `live`, largest first.
    pub now: Vec<OwnerBytes>,
    /// The sites that held the most at the peak, largest first.
    pub at_peak: Vec<OwnerBytes>,
}

/// A framework's own account of the device memory it holds, read at the same moment as the
/// other numbers (`gpumem_nb::frameworks`: cubecl's pools, which burn allocates from). What is
/// in use and what the framework keeps cached are its numbers, not gpumem-nb's: the driver only
/// sees its pages.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameworkReading {
    /// The framework (`cubecl`).
    pub framework: String,
    /// What it was asked about, in its words (`cuda:0`).
    pub device: String,
    /// Where the numbers come from (`ComputeClient::memory_report`, device scope).
    #[serde(default)]
    pub source: String,
    /// Why there are no numbers this time (the framework's reader failed or panicked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every pool of every stream, in the framework's order.
    #[serde(default)]
    pub pools: Vec<FrameworkPool>,
    /// What the component stamps that ended since the previous reading changed in its books
    /// (`gpumem_nb::component`), per component in the order first seen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<FrameworkPhase>,
    /// The watch began with this reading, and at the reading before it the framework held no
    /// device memory (tracking saw none of its allocations live): a cell's change counts from 0.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_empty: bool,
}

/// What the notebook's variables held at the end of a cell, by a framework's own types: the
/// probe gpumem-kernel compiles into the session library for burn 0.21, which evcxr shows each
/// variable before storing it (`notebook::probe`). Sizes are logical (elements × the dtype's
/// size, as burn's `num_params` counts); a buffer two variables share counts for each.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariablesReading {
    /// The framework whose types were read (`burn`).
    pub framework: String,
    /// Which cell end of the session this is (1 for the first probed; a cell that stored no
    /// variable, or returned early, leaves it as it was).
    pub probe: u64,
    /// Where the numbers come from.
    pub source: String,
    /// Each variable holding tensors, in the order the probe saw them.
    pub variables: Vec<VariableHeld>,
}

/// One variable's tensors, as the probe counted them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariableHeld {
    /// The variable's name.
    pub name: String,
    /// What its tensors are: `parameter` (a module's), `optimizer_state` (an optimizer's
    /// moments) or `tensor` (a tensor of its own).
    pub component: String,
    /// Their logical bytes.
    pub bytes: u64,
    /// How many tensors.
    pub tensors: u64,
    /// Parameters not initialised yet (burn's lazy `Param`): no memory until first used.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lazy: u64,
    /// Its type, as Rust names it.
    #[serde(default)]
    pub type_name: String,
}

/// The stamped phases of one component, on one watched framework: how its in-use bytes changed
/// from when each stamp began to when it ended, less what stamps nested in it changed (those
/// count for their own component). A framework that keeps tensors in pools of its own (cubecl)
/// hides each allocation from tracking; its books, read at the stamp's two ends, are what is
/// known: the net change, not a peak, and memory made and freed inside the phase is not in it.
/// The books are the process's: what another thread changes while a stamp is open (another
/// stamp, or unstamped work) is in that stamp's change too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameworkPhase {
    /// The component stamped (`parameter`).
    pub component: Component,
    /// How many stamps of it ended.
    pub phases: u64,
    /// Bytes in use at their ends − at their beginnings, summed, nested stamps' changes excepted.
    pub change: i64,
    /// Stamps whose framework did not answer at one end (busy, too slow, or failed): not in
    /// `phases` nor `change`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unread: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One pool of a framework, named and counted as the framework counts it (bytes, pages).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameworkPool {
    /// The pool's kind (cubecl: `sliced`, `adaptive`, `exclusive`, `direct`, `persistent`, and
    /// `dedicated` for the allocations that are each their own device allocation).
    pub kind: String,
    /// The stream whose memory it is.
    #[serde(default)]
    pub stream: u64,
    /// The size of its pages, when all its new pages have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u64>,
    /// Live allocations in it (not pages).
    #[serde(default)]
    pub allocations: u64,
    /// Bytes those allocations asked for.
    pub in_use: u64,
    /// Padding inside them (alignment).
    #[serde(default)]
    pub padding: u64,
    /// Bytes the pool holds from the device (its pages): at least `in_use + padding`; the rest
    /// is kept cached for reuse.
    pub reserved: u64,
    /// Pages (device allocations) held now.
    #[serde(default)]
    pub pages: u64,
    /// The most pages it ever held at once (the framework's high-water mark, since the pool was
    /// made, not since a cell began).
    #[serde(default)]
    pub pages_peak: u64,
    /// Pages planned by a dry run and never backed by device memory (counted in `pages`).
    #[serde(default)]
    pub pages_unmapped: u64,
    /// The largest allocation the pool ever served, bytes asked for.
    #[serde(default)]
    pub largest_alloc: u64,
}

impl FrameworkPool {
    /// Bytes the pool holds that no live allocation uses: what the framework keeps cached.
    pub fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.in_use + self.padding)
    }
}

/// Paths of a written snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotPaths {
    /// `snapshot.pickle`.
    pub pickle: String,
    /// `snapshot.json`.
    pub json: String,
    /// `trace_plot.html`.
    pub html: String,
}

impl From<&crate::render::SnapshotFiles> for SnapshotPaths {
    fn from(f: &crate::render::SnapshotFiles) -> Self {
        let path = |p: &std::path::Path| p.display().to_string();
        SnapshotPaths { pickle: path(&f.pickle), json: path(&f.json), html: path(&f.html) }
    }
}

/// An out-of-memory failure during a cell, as `post` reports it: why, in numbers and in one
/// line, and the snapshot written at that moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomEvent {
    /// The device that ran out.
    pub device: i32,
    /// Failures during the cell (the first one is described).
    pub count: u64,
    /// Bytes the failing allocation asked the device for.
    pub requested: u64,
    /// Free device memory then (`cuMemGetInfo`, or the simulated capacity left).
    pub device_free: u64,
    /// Device size.
    pub device_total: u64,
    /// The allocator's cached, unallocated bytes then.
    pub cached_free: u64,
    /// The largest of them in one block.
    pub largest_free_block: u64,
    /// Why it failed, in one line.
    pub why: String,
    /// The snapshot written then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<SnapshotPaths>,
    /// Why no snapshot could be written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_error: Option<String>,
    /// The sites holding the most of the device's memory when the allocation failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<OwnerBytes>,
    /// What the tracked memory was then, by component (with the allocator's cache as
    /// `cached`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_component: Vec<ComponentReading>,
    /// The driver entry point that refused the allocation (`cuMemAllocAsync`), for a
    /// framework's out-of-memory seen through the driver; `None` for gpumem-nb's allocator's
    /// own (its numbers above are the allocator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    /// Who asked, in the framework's word (`candle`, `burn/cubecl`, `cudarc`, `gpumem-nb`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Where it was asked for: the function, and the cell and line of the notebook's code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<OwnerBytes>,
    /// What held the device then, by owner (largest first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_owner: Vec<OwnerReading>,
}

impl OomEvent {
    /// How split the cached free memory was: 1 − largest free block ÷ cached free bytes (0 when
    /// nothing is cached).
    pub fn fragmentation(&self) -> f64 {
        if self.cached_free == 0 { 0.0 } else { 1.0 - self.largest_free_block as f64 / self.cached_free as f64 }
    }
}
