//! The per-cell record (the `application/vnd.gpumem.cell+json` object) and its parts, and
//! [`build_record`], which assembles one from the hooks' [`Readings`].

use super::deltas::{ComponentDelta, OwnerDelta, component_deltas, owner_deltas};
use crate::device::BackendKind;
use crate::device::nvml::{NvmlDevice, NvmlSnapshot};
use serde::{Deserialize, Serialize};

/// The MIME type of the machine-readable per-cell record.
pub const CELL_MIME: &str = "application/vnd.gpumem.cell+json";

/// One device's numbers from the crate: the control protocol's reading, shared with the
/// library so the two ends cannot drift apart.
pub use crate::notebook::protocol::DeviceReading as CrateReading;

/// Before and after of one quantity: bytes (`Span`, i.e. `Span<Option<u64>>`, `None` where
/// unknown) or a flag (`Span<bool>`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span<T = Option<u64>> {
    /// At the start of the cell.
    pub before: T,
    /// At the end.
    pub after: T,
}

impl Span {
    /// after − before, when both are known.
    pub fn delta(&self) -> Option<i64> {
        Some(self.after? as i64 - self.before? as i64)
    }
}

/// The allocator's numbers for one cell on one device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorPart {
    /// CUDA index in the child.
    pub device: i32,
    /// What backs the allocator.
    pub backend: BackendKind,
    /// Allocated bytes.
    pub allocated: Span,
    /// Reserved bytes.
    pub reserved: Span,
    /// Peak allocated during the cell.
    pub peak_allocated: u64,
    /// Peak reserved during the cell.
    pub peak_reserved: u64,
    /// Whether the peaks cover exactly this cell: a slot opened by `pre`, or the crate loaded
    /// during the cell (nothing was there before). False only where a crate loaded earlier
    /// opened no slot for the cell: then they cover everything since it loaded.
    pub peak_is_cell: bool,
    /// Allocation failures during the cell.
    pub ooms: u64,
    /// Where the reserved bytes are after the cell: requested, rounding, pending frees, cached
    /// free blocks by pool and size class, what `empty_cache()` would return (they add up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<crate::policy::ReservedParts>,
}

/// The CUDA stream-ordered pool (cudarc's `CudaSlice` allocations).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolPart {
    /// Bytes in use.
    pub used: Span,
    /// Bytes reserved.
    pub reserved: Span,
    /// High-water mark of use during the cell.
    pub used_high: Option<u64>,
    /// High-water mark of reservation during the cell.
    pub reserved_high: Option<u64>,
}

/// Every device allocation of the process during the cell, whoever made it (gpumem-nb's
/// tracking: CUPTI on a GPU, the simulated driver otherwise): the `all_allocations` object.
/// The top-level numbers (`place`, its fields inline in the JSON) are the notebook's device
/// (device 0, or the first one touched); `devices` has every device touched, and the host's
/// pinned memory (`device: null`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllAllocations {
    /// `cupti`, `simulated`, or `unavailable: <why>` (then there are no numbers).
    pub tracking: String,
    /// The notebook's device: its numbers, `after` and `peak` `None` when tracking is off.
    #[serde(flatten)]
    pub place: PlaceAll<Option<u64>>,
    /// Every place touched, the same numbers.
    pub devices: Vec<PlaceAll>,
}

/// One source's change over a cell.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceDelta {
    /// `allocator`, `pool`, `driver`, `vmm`, `managed`, `host_pinned`.
    pub source: String,
    /// after − before, bytes.
    pub delta: i64,
    /// The highest during the cell.
    pub peak: u64,
}

/// One place's numbers (a device, or the host for pinned memory). `N` is how its `after` and
/// `peak` are held: bytes (`u64`) for a place that was read, `Option<u64>` for
/// [`AllAllocations::place`], which has none when tracking is off.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaceAll<N = u64> {
    /// CUDA device, `None` for the host.
    pub device: Option<i32>,
    /// At the start of the cell.
    pub before: Option<u64>,
    /// At the end.
    pub after: N,
    /// The highest during the cell.
    pub peak: N,
    /// Per source: change over the cell and peak during it.
    pub by_source: Vec<SourceDelta>,
    /// What the live bytes are ([`crate::components`]): each component's bytes before and
    /// after the cell, and the allocator's cached free memory (`cached`); the `after`s add up
    /// to `after`.
    #[serde(default)]
    pub by_component: Vec<ComponentDelta>,
    /// Who holds the live bytes, by the framework or library that made them (`candle`,
    /// `burn/cubecl`, `cudarc`, `cuBLAS`, `NCCL`, `gpumem-nb`, …), each before and after the cell
    /// and at its highest in it; largest first after the cell; the `after`s add up to `after`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_owner: Vec<OwnerDelta>,
    /// Who holds the most of what is live after the cell.
    pub top: Vec<crate::notebook::protocol::OwnerBytes>,
    /// Activations and temporaries live after the cell, by site and the cell that made them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<crate::notebook::protocol::OwnerBytes>,
}

impl AllAllocations {
    /// after − before of the top-level device, when both are known.
    pub fn delta(&self) -> Option<i64> {
        Some(self.place.after? as i64 - self.place.before? as i64)
    }

    /// Whether there are numbers (tracking is on).
    pub fn is_tracked(&self) -> bool {
        self.place.after.is_some()
    }
}

/// What the crate said about tracking in one reply: its status and every place's reading.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrackedReadings {
    /// `cupti`, `simulated`, `unavailable: …`.
    pub status: String,
    /// Every place (empty when tracking is off).
    pub places: Vec<crate::notebook::protocol::PlaceReading>,
    /// Every CUDA device the process sees, ordinal and UUID (empty on the simulated device).
    pub cuda_devices: Vec<crate::notebook::protocol::CudaDevice>,
}

impl TrackedReadings {
    /// The devices' readings and the tracked ones in a `pre`, `post` or `read` reply.
    pub fn of_reply(mut reply: crate::notebook::protocol::Reply) -> (Vec<CrateReading>, Option<TrackedReadings>) {
        let tracked = Self::take(&mut reply);
        (reply.devices.unwrap_or_default(), tracked)
    }

    /// The tracked readings a reply carries, taken out of it (`None` when it says nothing of
    /// tracking).
    pub fn take(reply: &mut crate::notebook::protocol::Reply) -> Option<TrackedReadings> {
        let status = reply.tracking.take()?;
        Some(TrackedReadings {
            status,
            places: reply.tracked.take().unwrap_or_default(),
            cuda_devices: reply.cuda_devices.take().unwrap_or_default(),
        })
    }
}

/// The `all_allocations` part from the tracked readings before and after a cell (`before` is
/// `None` when the crate was not connected before it; `loaded_during` when it loaded in it).
pub fn all_allocations(
    before: Option<&TrackedReadings>,
    after: &TrackedReadings,
    loaded_during: bool,
) -> AllAllocations {
    use crate::notebook::protocol::PlaceReading;
    let mut out = AllAllocations { tracking: after.status.clone(), ..Default::default() };
    if after.places.is_empty() && !(after.status == "cupti" || after.status == "simulated") {
        return out;
    }
    let find = |r: Option<&TrackedReadings>, d: Option<i32>| -> Option<PlaceReading> {
        r.and_then(|r| r.places.iter().find(|p| p.device == d).cloned())
    };
    let source_deltas = |b: Option<&PlaceReading>, a: &PlaceReading| -> Vec<SourceDelta> {
        a.by_source
            .iter()
            .map(|s| {
                let before = b.and_then(|b| b.by_source.iter().find(|x| x.source == s.source)).map_or(0, |x| x.live);
                SourceDelta { source: s.source.clone(), delta: s.live as i64 - before as i64, peak: s.peak }
            })
            .collect()
    };
    for a in &after.places {
        let b = find(before, a.device);
        let start = match (&b, loaded_during) {
            (Some(b), _) => Some(b.live),
            // Tracking began during the cell: it started from nothing it could see.
            (None, true) => Some(0),
            // A place first touched during the cell held nothing before it.
            (None, false) if before.is_some() => Some(0),
            (None, false) => None,
        };
        out.devices.push(PlaceAll {
            device: a.device,
            before: start,
            after: a.live,
            peak: a.peak,
            by_source: source_deltas(b.as_ref(), a),
            by_component: component_deltas(b.as_ref(), a, start.is_some()),
            by_owner: owner_deltas(b.as_ref(), a, start.is_some()),
            top: a.top.clone(),
            kept: a.kept.clone(),
        });
    }
    let main = out
        .devices
        .iter()
        .find(|p| p.device == Some(0))
        .or_else(|| out.devices.iter().find(|p| p.device.is_some()))
        .cloned();
    out.place = match main {
        Some(m) => PlaceAll {
            device: m.device,
            before: m.before,
            after: Some(m.after),
            peak: Some(m.peak),
            by_source: m.by_source,
            by_component: m.by_component,
            by_owner: m.by_owner,
            top: m.top,
            kept: m.kept,
        },
        // Tracked, but no device memory anywhere: zero on device 0.
        None => PlaceAll { device: Some(0), before: Some(0), after: Some(0), peak: Some(0), ..Default::default() },
    };
    out
}

/// NVML's view of the child process and its device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlPart {
    /// The CUDA device it is in the notebook's process (matched by UUID with the crate's and the
    /// tracker's readings), in [`CellRecord::nvml_devices`]; `None` where no reading names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<i32>,
    /// The NVML device (`GPU-…`), if known.
    pub uuid: Option<String>,
    /// Its name.
    pub name: Option<String>,
    /// This process's memory on the device.
    pub process: Span,
    /// Other processes on the device, after the cell.
    pub others_after: Option<u64>,
    /// Device free memory after the cell.
    pub device_free: Option<u64>,
    /// Device size.
    pub device_total: Option<u64>,
    /// Why NVML said nothing, when it did not.
    pub unavailable: Option<String>,
}

/// The local memory the driver holds for kernels' stacks on one CUDA device (its primary
/// context): each thread's stack (`CU_LIMIT_STACK_SIZE`, raised by the driver for a kernel with
/// a larger frame, and kept) times the threads the device holds at once. No allocation tracker
/// sees it; NVML counts it. Read by the crate before and after the cell.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalMemoryPart {
    /// The CUDA device (ordinal in the notebook's process).
    pub device: i32,
    /// Its UUID (`GPU-…`), how NVML's figures are matched.
    pub uuid: String,
    /// Each thread's stack, bytes, before and after the cell (`None` before: the context was
    /// not active then, or the process restarted).
    pub stack_bytes: Span,
    /// Threads the device holds at once (SMs × threads per SM).
    pub resident_threads: u64,
}

impl LocalMemoryPart {
    /// The bytes held at one end of the cell.
    pub fn bytes(&self, at: fn(&Span) -> Option<u64>) -> Option<u64> {
        Some(at(&self.stack_bytes)? * self.resident_threads)
    }

    /// Its change over the cell, bytes; `None` where either end was not read.
    pub fn delta(&self) -> Option<i64> {
        Some(self.bytes(|s| s.after)? as i64 - self.bytes(|s| s.before)? as i64)
    }
}

/// Everything measured about one cell: the `application/vnd.gpumem.cell+json` object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    /// Execution count.
    pub cell: u64,
    /// The label the allocations of the cell carry in snapshots ("cell N").
    pub label: String,
    /// First code line (for the history table).
    pub first_line: String,
    /// How the cell ended.
    pub status: CellStatus,
    /// The device the line describes, e.g. `cuda:0 NVIDIA H100 80GB HBM3` or `sim:0 (simulated)`.
    pub device: String,
    /// Where each number comes from.
    pub sources: Sources,
    /// The allocator (device 0 or the first device the crate reported), when the crate is loaded.
    pub allocator: Option<AllocatorPart>,
    /// Every device allocation of the process (tracking), when the crate is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_allocations: Option<AllAllocations>,
    /// Every device the crate reported (multi-GPU), after the cell.
    pub devices_after: Vec<CrateReading>,
    /// The CUDA pool, when the backend is CUDA.
    pub pool: Option<PoolPart>,
    /// The frameworks the notebook watches (`gpumem_nb::frameworks`: cubecl's pools), in their
    /// own numbers: in use, cached, reserved, per pool kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frameworks: Vec<super::FrameworkPart>,
    /// What the notebook's variables hold by a framework's own types at the cell's end (the
    /// session library's probe: burn's parameters, optimizer state, tensors), when it saw the
    /// cell's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variables: Option<super::VariablesPart>,
    /// NVML: the notebook's device (the one the line describes).
    pub nvml: NvmlPart,
    /// NVML, every device the notebook's process is on, when it is on more than one (each with
    /// its CUDA device); empty otherwise (`nvml` says it all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvml_devices: Vec<NvmlPart>,
    /// The driver's local memory for kernels' stacks, per CUDA device with an active context
    /// after the cell (CUPTI tracking on a GPU); part of what NVML counts and no tracker sees.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_memory: Vec<LocalMemoryPart>,
    /// Free/total from the crate (cuMemGetInfo or the simulated device), after the cell.
    pub crate_device_free: Option<u64>,
    /// Device size from the crate.
    pub crate_device_total: Option<u64>,
    /// The notebook's device's size as CUDA counts it (`cuMemGetInfo`'s total: gpumem-nb's
    /// allocator's reading, else the driver's in the device's primary context), below NVML's
    /// total by what the driver keeps for itself; `None` on the simulated device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_total: Option<u64>,
    /// Wall time of the cell (compile + run), milliseconds.
    pub wall_ms: f64,
    /// Time the kernel spent in its hooks (pre + post), microseconds.
    pub hook_us: u64,
    /// The live line, when the cell ran long enough to show one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveCost>,
    /// The cell's first out-of-memory failure, when `%gpumem snapshot --on-oom` watched: why,
    /// and the snapshot written then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<crate::notebook::protocol::OomEvent>,
    /// The child's pid after the cell.
    pub child_pid: Option<u32>,
    /// The child's pid before the cell.
    pub child_pid_before: Option<u32>,
    /// Whether the child was replaced during the cell (crash, interrupt, `:restart`, `:clear`).
    pub restarted: bool,
    /// Why, when known.
    pub restart_reason: Option<String>,
    /// Whether gpumem-nb was loaded (connected) before the cell, after it.
    pub crate_loaded: Span<bool>,
    /// Warnings shown in the line.
    pub warnings: Vec<String>,
    /// Hash of the cell's code (re-run detection).
    pub source_hash: String,
    /// Whether the notebook declared `:dep gpumem-nb` by the end of the cell: without the crate
    /// loaded, the line then says it loads at its first use rather than that it is missing.
    #[serde(default)]
    pub crate_declared: bool,
    /// The notebook process's own worker processes holding device memory after the cell (by
    /// pid, with names; NVML, or the simulated process table): not in its own numbers above.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<crate::notebook::children::ChildProcess>,
    /// The device's CUDA context, lost by the end of the cell (a kernel faulted): the device
    /// can no longer be read, and every later call on it fails until the process restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<crate::device::LostContext>,
    /// A device or watched framework that did not run what the cell queued within the settle
    /// time: the numbers after the cell are as they stood, without that work.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsettled: Vec<crate::notebook::protocol::Settled>,
    /// The session's budget (`%gpumem budget`) when the cell ran, bytes: what its warnings
    /// compared with, for a frontend that draws the line (the JupyterLab panel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u64>,
}

/// How a cell ended: the record's `status`, the worst of what happened (lower case in JSON).
/// Ordered by name, as maps keyed by it list them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CellStatus {
    /// It ran to its end.
    #[default]
    Ok,
    /// It failed otherwise: an `Err` it returned, code that did not compile, an interrupt, a
    /// notebook process that ended.
    Error,
    /// It panicked.
    Panicked,
    /// An allocation failed for want of device memory.
    Oom,
    /// The device's CUDA context was lost (a kernel faulted).
    Lost,
    /// It did not run: the context was lost in an earlier cell. Only records of gpumem-kernel
    /// before 2026-11-28 say so: cells after a loss now run (host code works, device calls fail).
    Refused,
}

impl CellStatus {
    /// The name in data and on screen (`ok`, `panicked`, …).
    pub fn name(self) -> &'static str {
        match self {
            CellStatus::Ok => "ok",
            CellStatus::Error => "error",
            CellStatus::Panicked => "panicked",
            CellStatus::Oom => "oom",
            CellStatus::Lost => "lost",
            CellStatus::Refused => "refused",
        }
    }
}

impl std::fmt::Display for CellStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Ord for CellStatus {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.name().cmp(other.name())
    }
}

impl PartialOrd for CellStatus {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// What a cell's live line cost the kernel (see `crate::live`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveCost {
    /// Lines shown: the first one and its in-place updates.
    pub updates: u32,
    /// CPU time of the kernel's sampler thread, microseconds.
    pub cpu_us: u64,
    /// How long the sampler ran, milliseconds.
    pub wall_ms: f64,
}

/// Where the numbers of a record come from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sources {
    /// The allocator numbers.
    pub allocator: String,
    /// The CUDA pool numbers.
    pub pool: String,
    /// This process / other processes.
    pub process: String,
    /// Device free/total.
    pub device: String,
}

/// NVML's change of this process's memory over a cell, split into what explains it: every
/// tracked allocation, the CUDA pool's cache (reserved − used: memory the stream-ordered pool
/// keeps after frees, or reuses before asking for more), and the rest, which no tracker sees
/// (the CUDA context, the code of the kernels loaded, a kernel's local memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NvmlGap {
    /// NVML's change, bytes.
    pub nvml: i64,
    /// Every tracked allocation's change on that device.
    pub tracked: i64,
    /// The CUDA pool's cache's change.
    pub pool_cache: i64,
    /// The driver's local memory for kernels' stacks: its change (0 where not read at both ends).
    pub local_memory: i64,
    /// What is left: `nvml − tracked − pool_cache − local_memory`.
    pub rest: i64,
}

impl NvmlGap {
    fn new(nvml: i64, tracked: i64, pool_cache: i64, local_memory: i64) -> Self {
        NvmlGap { nvml, tracked, pool_cache, local_memory, rest: nvml - tracked - pool_cache - local_memory }
    }
}

impl CellRecord {
    /// NVML's change over the cell, explained (see [`NvmlGap`]); `None` where NVML or tracking
    /// has no number for both ends (a restart, no GPU).
    pub(crate) fn nvml_gap(&self) -> Option<NvmlGap> {
        let nvml = self.nvml.process.delta()?;
        let tracked = self.all_allocations.as_ref()?.delta()?;
        // Before the process's first CUDA call (NVML had nothing of it) no pool held anything,
        // though the crate, not loaded yet, could not say so.
        let fresh = self.nvml.process.before == Some(0);
        let pool_cache = self.pool_cache(|s| s.after)? - self.pool_cache(|s| s.before).or(fresh.then_some(0))?;
        Some(NvmlGap::new(nvml, tracked, pool_cache, self.local_memory_on(self.nvml.uuid.as_deref())))
    }

    /// The change of the driver's local memory on the device NVML names by `uuid`; 0 where it
    /// was not read at both ends.
    pub(crate) fn local_memory_on(&self, uuid: Option<&str>) -> i64 {
        self.local_memory_part(uuid).and_then(LocalMemoryPart::delta).unwrap_or(0)
    }

    /// The driver's kernel stacks on the device NVML names by `uuid`.
    pub(crate) fn local_memory_part(&self, uuid: Option<&str>) -> Option<&LocalMemoryPart> {
        uuid.and_then(|u| self.local_memory.iter().find(|l| l.uuid.eq_ignore_ascii_case(u)))
    }

    /// NVML's change over the cell on one of several devices ([`CellRecord::nvml_devices`]),
    /// explained by the tracked allocations on that device and, where the crate reads it, its
    /// CUDA pool's cache; `None` where a number is missing (no tracked place for the device, a
    /// pool read after the cell only).
    pub(crate) fn nvml_gap_on(&self, part: &NvmlPart) -> Option<NvmlGap> {
        let nvml = part.process.delta()?;
        let device = part.device?;
        let all = self.all_allocations.as_ref().filter(|a| a.is_tracked())?;
        let place = all.devices.iter().find(|p| p.device == Some(device));
        // A device with no tracked place held nothing tracked at either end.
        let tracked = match place {
            Some(p) => p.after as i64 - p.before.or((part.process.before == Some(0)).then_some(0))? as i64,
            None => 0,
        };
        let pool_cache = match self.devices_after.iter().find(|d| d.device == device) {
            // The notebook's device: its pool read at both ends.
            _ if part.uuid == self.nvml.uuid && self.nvml.uuid.is_some() => self.nvml_gap()?.pool_cache,
            Some(d) if d.pool_reserved.unwrap_or(0) > d.pool_used.unwrap_or(0) => return None,
            _ => 0,
        };
        Some(NvmlGap::new(nvml, tracked, pool_cache, self.local_memory_on(part.uuid.as_deref())))
    }

    /// The CUDA context and modules after the cell: NVML's bytes of the process beyond every
    /// tracked allocation and the CUDA pool's cache; `None` where one of them has no number.
    pub fn context_after(&self) -> Option<u64> {
        let nvml = self.nvml.process.after.filter(|b| *b > 0)?;
        let tracked = self.all_allocations.as_ref()?.place.after?;
        let cache = self.pool_cache(|s| s.after)?.max(0) as u64;
        Some(nvml.saturating_sub(tracked + cache))
    }

    /// The CUDA pool's cached free bytes (reserved − used) at one end of the cell (`at`: `before`
    /// or `after`); 0 without a pool, `None` where it was not read.
    fn pool_cache(&self, at: fn(&Span) -> Option<u64>) -> Option<i64> {
        self.pool.as_ref().map_or(Some(0), |p| Some(at(&p.reserved)? as i64 - at(&p.used)? as i64))
    }

    /// What the budget is compared with: the cell's peak of live memory, the allocator's
    /// allocated peak plus the CUDA pool's used high-water mark (cached but free memory does
    /// not count: it is reusable).
    pub fn peak_total(&self) -> Option<u64> {
        let a = self.allocator.as_ref()?;
        let pool = self.pool.as_ref().and_then(|p| p.used_high.or(p.used.after)).unwrap_or(0);
        Some(a.peak_allocated + pool)
    }

    /// Device free after the cell, and total: NVML first, else the crate.
    pub fn device_free_total(&self) -> Option<(u64, u64)> {
        match (self.nvml.device_free, self.nvml.device_total) {
            (Some(f), Some(t)) => Some((f, t)),
            _ => Some((self.crate_device_free?, self.crate_device_total?)),
        }
    }
}

/// Inputs to [`build_record`]: what the hooks read.
pub struct Readings<'a> {
    /// Crate readings before (from `pre`), if the crate was connected.
    pub crate_before: Option<&'a [CrateReading]>,
    /// Crate readings after (from `post`, or `read` when the crate connected during the cell).
    pub crate_after: Option<&'a [CrateReading]>,
    /// Tracked readings before (from `pre`).
    pub tracked_before: Option<&'a TrackedReadings>,
    /// Tracked readings after.
    pub tracked_after: Option<&'a TrackedReadings>,
    /// Whether `pre` opened a cell slot (peaks cover exactly the cell).
    pub slot_opened: bool,
    /// NVML before.
    pub nvml_before: &'a NvmlSnapshot,
    /// NVML after.
    pub nvml_after: &'a NvmlSnapshot,
    /// Child pids.
    pub pid_before: Option<u32>,
    /// Child pid after.
    pub pid_after: Option<u32>,
}

/// Assembles a record (without warnings, which need the session).
pub fn build_record(cell: u64, r: &Readings<'_>) -> CellRecord {
    let mut rec = CellRecord {
        cell,
        label: format!("cell {cell}"),
        status: CellStatus::Ok,
        child_pid: r.pid_after,
        child_pid_before: r.pid_before,
        restarted: r.pid_before.is_some() && r.pid_before != r.pid_after,
        crate_loaded: Span { before: r.crate_before.is_some(), after: r.crate_after.is_some() },
        ..Default::default()
    };
    let after0 = r.crate_after.and_then(|v| v.iter().find(|d| d.device == 0).or(v.first()));
    // Readings from the old child are not comparable after a restart.
    let before0 = if rec.restarted {
        None
    } else {
        r.crate_before.and_then(|v| v.iter().find(|d| Some(d.device) == after0.map(|a| a.device)))
    };
    if let Some(a) = after0 {
        // Opened during this cell (the crate loaded in it, or, loaded before, it opened the device
        // in it): it started from nothing.
        let start = |f: fn(&CrateReading) -> u64| match before0 {
            Some(b) => Some(f(b)),
            None if !rec.restarted => Some(0),
            None => None,
        };
        rec.allocator = Some(AllocatorPart {
            device: a.device,
            backend: a.backend,
            allocated: Span { before: start(|x| x.allocated), after: Some(a.allocated) },
            reserved: Span { before: start(|x| x.reserved), after: Some(a.reserved) },
            peak_allocated: a.peak_allocated,
            peak_reserved: a.peak_reserved,
            // Opened during this cell (a new child's included): nothing was there before, so the
            // peaks since it opened are the cell's.
            peak_is_cell: r.slot_opened || before0.is_none() || rec.restarted,
            ooms: a.num_ooms.saturating_sub(before0.map_or(0, |b| b.num_ooms)),
            explain: a.explain.clone(),
        });
        if !a.is_simulated() || a.pool_used.is_some() {
            rec.pool = Some(PoolPart {
                used: Span { before: before0.and_then(|b| b.pool_used), after: a.pool_used },
                reserved: Span { before: before0.and_then(|b| b.pool_reserved), after: a.pool_reserved },
                used_high: a.pool_used_high,
                reserved_high: a.pool_reserved_high,
            });
        }
        rec.crate_device_free = a.device_free;
        rec.crate_device_total = a.device_total;
        rec.devices_after = r.crate_after.map(<[_]>::to_vec).unwrap_or_default();
        rec.sources.allocator = if a.is_simulated() {
            "gpumem-nb allocator on the simulated device (exact)".into()
        } else {
            "gpumem-nb allocator (exact)".into()
        };
        rec.sources.pool = "CUDA stream-ordered pool, driver high-water marks (exact)".into();
    } else {
        rec.sources.allocator = "gpumem-nb not loaded".into();
    }
    if let Some(after) = r.tracked_after {
        let before = if rec.restarted { None } else { r.tracked_before };
        let loaded_during = !rec.crate_loaded.before && !rec.restarted;
        rec.all_allocations = Some(all_allocations(before, after, loaded_during));
    }
    // NVML.
    // The notebook's device: the allocator's, else the tracked one the record leads with (NVML
    // lists a process's GPUs in its own order).
    let ordinals = device_ordinals(r, true);
    let tracked_place = rec.all_allocations.as_ref().and_then(|a| a.place.device);
    let uuid_hint = after0
        .and_then(|a| a.uuid.as_deref())
        .or_else(|| ordinals.iter().find(|(_, o)| Some(*o) == tracked_place).map(|(u, _)| u.as_str()));
    let dev_after: Option<&NvmlDevice> = r.nvml_after.device_of(r.pid_after, uuid_hint);
    if let Some(d) = dev_after {
        // The notebook's device: its ordinal is the allocator's (the JSON as before).
        rec.nvml = NvmlPart { device: None, ..nvml_part(d, r, rec.restarted, &ordinals) };
        rec.sources.process =
            format!("NVML per-process (pid {}, {})", r.pid_after.map_or("?".into(), |p| p.to_string()), d.uuid);
        rec.sources.device = format!("NVML device memory ({})", d.uuid);
    } else {
        rec.nvml.unavailable = Some(match &r.nvml_after.error {
            Some(e) => e.clone(),
            None if r.nvml_after.devices.is_empty() => "NVML lists no GPU".into(),
            None => "the child is on no GPU NVML lists".into(),
        });
        rec.sources.process = rec.nvml.unavailable.clone().unwrap_or_default();
        rec.sources.device = match after0 {
            Some(a) if a.is_simulated() => "simulated device capacity (gpumem-nb)".into(),
            Some(_) => "cuMemGetInfo (gpumem-nb)".into(),
            None => "unknown".into(),
        };
    }
    rec.nvml_devices = nvml_devices(r, rec.restarted, &ordinals, &device_ordinals(r, false));
    rec.local_memory = local_memory(r, rec.restarted);
    if rec.pool.is_none() {
        rec.pool = tracked_pool(r, tracked_place, rec.restarted);
        if rec.pool.is_some() {
            rec.sources.pool = "CUDA stream-ordered pool, the driver's counters in the primary context (exact)".into();
        }
    }
    // A cell that ended without the crate's reading (a new process after an interrupt): the
    // device it had (gpumem-kernel names the one a notebook will use before the crate loads:
    // `registry::device_before_use`).
    let reading = after0.or_else(|| r.crate_before.and_then(|v| v.first()));
    let cupti = r.tracked_after.is_some_and(|t| t.status == "cupti");
    rec.device = match (reading, dev_after, tracked_place) {
        // No allocator of ours on a GPU (the notebook's code uses cudarc or candle alone): the
        // CUDA device the tracker saw.
        (None, Some(d), Some(o)) if cupti => format!("cuda:{o} {}", d.name),
        (reading, d, _) => device_name(reading, d),
    };
    rec.lost = r.crate_after.and_then(|v| v.iter().find_map(|d| d.lost.clone()));
    let seen = r.tracked_after.into_iter().flat_map(|t| &t.cuda_devices);
    rec.cuda_total = after0.filter(|a| !a.is_simulated()).and_then(|a| a.device_total).or_else(|| {
        let uuid = rec.nvml.uuid.as_deref()?;
        seen.clone().find(|d| d.uuid.eq_ignore_ascii_case(uuid))?.mem_total
    });
    rec
}

/// Each CUDA device's UUID (`GPU-…`) as the crate's and the tracker's readings after the cell
/// name it, with its ordinal in the notebook's process: the devices the crate opened, those
/// the tracker saw bytes on, and every device the process sees (a device with only a context
/// on it, NVML's bytes and none tracked, still gets its ordinal).
/// With `visible` false, only the devices in use: opened by the crate, with tracked bytes, or
/// with an active context (its kernel stacks read).
/// The notebook's device's CUDA pool as the tracker read it in the device's primary context,
/// where no allocator of gpumem-nb's read it (a notebook of candle or cudarc alone): what the
/// pool keeps cached, which NVML counts and no allocation does.
fn tracked_pool(r: &Readings<'_>, place: Option<i32>, restarted: bool) -> Option<PoolPart> {
    let ordinal = place?;
    let of = |t: Option<&TrackedReadings>| t?.cuda_devices.iter().find(|d| d.ordinal == ordinal).cloned();
    let after = of(r.tracked_after)?;
    after.pool_reserved?;
    // Before the cell: the reading then, or an empty pool where NVML had nothing of the process
    // (no context: no pool held anything).
    let before = if restarted { None } else { of(r.tracked_before) };
    let fresh = r.tracked_before.is_some() && before.is_none();
    let at = |d: &Option<crate::notebook::protocol::CudaDevice>,
              f: fn(&crate::notebook::protocol::CudaDevice) -> Option<u64>| {
        match d {
            // A context not active then (no stack read) had no pool in use.
            Some(d) => f(d).or(d.stack_bytes.is_none().then_some(0)),
            None if fresh => Some(0),
            None => None,
        }
    };
    Some(PoolPart {
        used: Span { before: at(&before, |d| d.pool_used), after: after.pool_used },
        reserved: Span { before: at(&before, |d| d.pool_reserved), after: after.pool_reserved },
        used_high: None,
        reserved_high: after.pool_reserved_high,
    })
}

fn device_ordinals(r: &Readings<'_>, visible: bool) -> Vec<(String, i32)> {
    let crate_ = r.crate_after.into_iter().flatten().filter_map(|d| Some((d.uuid.clone()?, d.device)));
    let tracked =
        r.tracked_after.into_iter().flat_map(|t| &t.places).filter_map(|p| Some((p.uuid.clone()?, p.device?)));
    let seen = r.tracked_after.into_iter().flat_map(|t| &t.cuda_devices);
    let seen = seen.filter(|d| visible || d.stack_bytes.is_some()).map(|d| (d.uuid.clone(), d.ordinal));
    let mut out: Vec<(String, i32)> = crate_.chain(tracked).chain(seen).collect();
    out.sort();
    out.dedup();
    out
}

/// The driver's local memory on every device whose primary context is active after the cell.
fn local_memory(r: &Readings<'_>, restarted: bool) -> Vec<LocalMemoryPart> {
    let before = |ordinal: i32| {
        let b = r.tracked_before.filter(|_| !restarted)?;
        b.cuda_devices.iter().find(|d| d.ordinal == ordinal)?.stack_bytes
    };
    r.tracked_after
        .into_iter()
        .flat_map(|t| &t.cuda_devices)
        .filter_map(|d| {
            Some(LocalMemoryPart {
                device: d.ordinal,
                uuid: d.uuid.clone(),
                stack_bytes: Span { before: before(d.ordinal), after: Some(d.stack_bytes?) },
                resident_threads: d.resident_threads?,
            })
        })
        .collect()
}

/// NVML's figures for one device: the process's bytes before and after the cell (0 where NVML
/// does not list it), the other processes', the device's free and total memory.
fn nvml_part(d: &NvmlDevice, r: &Readings<'_>, restarted: bool, ordinals: &[(String, i32)]) -> NvmlPart {
    let listed_after = r.pid_after.is_some_and(|p| d.lists(p));
    let before = if restarted {
        None
    } else {
        let before = r.nvml_before.devices.iter().find(|x| x.uuid == d.uuid);
        match (before, r.pid_before) {
            (Some(b), Some(p)) => b.process_used(p).or((!b.lists(p)).then_some(0)),
            _ => None,
        }
    };
    NvmlPart {
        device: ordinals.iter().find(|(u, _)| u.eq_ignore_ascii_case(&d.uuid)).map(|(_, o)| *o),
        uuid: Some(d.uuid.clone()),
        name: Some(d.name.clone()),
        process: Span { before, after: r.pid_after.and_then(|p| d.process_used(p)).or((!listed_after).then_some(0)) },
        others_after: Some(r.pid_after.map_or(d.used, |p| d.others_used(p))),
        device_free: Some(d.free),
        device_total: Some(d.total),
        unavailable: None,
    }
}

/// NVML's figures for every device the notebook's process is on (listed by NVML before or after
/// the cell, or named by a reading), when that is more than one device.
/// `ordinals` numbers the devices (every one the process sees); `in_use` says which it is on
/// beside NVML's lists.
fn nvml_devices(
    r: &Readings<'_>,
    restarted: bool,
    ordinals: &[(String, i32)],
    in_use: &[(String, i32)],
) -> Vec<NvmlPart> {
    let on = |d: &NvmlDevice| {
        let listed_before = !restarted
            && r.pid_before.is_some_and(|p| r.nvml_before.devices.iter().any(|b| b.uuid == d.uuid && b.lists(p)));
        r.pid_after.is_some_and(|p| d.lists(p))
            || listed_before
            || in_use.iter().any(|(u, _)| u.eq_ignore_ascii_case(&d.uuid))
    };
    let parts: Vec<NvmlPart> =
        r.nvml_after.devices.iter().filter(|d| on(d)).map(|d| nvml_part(d, r, restarted, ordinals)).collect();
    if parts.len() > 1 { parts } else { Vec::new() }
}

/// How a line names its device: `cuda:0 NVIDIA H100 80GB HBM3`, `sim:0 (simulated)`, an NVML
/// device when the crate is not loaded, or `device n/a`.
pub fn device_name(reading: Option<&CrateReading>, nvml: Option<&NvmlDevice>) -> String {
    match (reading, nvml) {
        (Some(a), Some(d)) if !a.is_simulated() => format!("cuda:{} {}", a.device, d.name),
        (Some(a), _) if !a.is_simulated() => format!("cuda:{}", a.device),
        (Some(a), _) => format!("sim:{} (simulated)", a.device),
        (None, Some(d)) => format!("{} (NVML {})", d.name, d.index),
        (None, None) => "device n/a".into(),
    }
}
