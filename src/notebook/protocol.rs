//! The control channel's messages, as types: what gpumem-kernel asks the crate in the notebook
//! child and what it answers. Both ends use these types, so a field cannot drift apart.
//!
//! The wire is one JSON object per line each way. On connecting, the child sends a [`Hello`];
//! then every [`Request`] (`{"id": n, "op": "…", …}`) gets one [`Reply`] with the same id
//! (`{"id": n, "ok": true, …}` or `{"id": n, "ok": false, "error": "…"}`).
//!
//! Version skew (a kernel built from one release talking to a notebook that loaded another) is
//! tolerated both ways: unknown fields are ignored, missing optional fields take their
//! defaults, and an unknown `op` is answered with an error naming it. A line that is not a
//! request at all gets an error reply and changes nothing.
#![forbid(unsafe_code)]

use crate::device::BackendKind;
use crate::record::component::Component;
use crate::record::history::RecordMode;
use serde::{Deserialize, Serialize};

/// The environment variable naming the kernel's control socket.
pub const CONTROL_VAR: &str = "GPUMEM_NB_CONTROL";

/// The file beside the control socket where the kernel keeps the requests a child applies as
/// it connects (`record`, `on_oom`: one [`Op`] per line, JSON), read by the crate before its
/// first device is used: `%gpumem record on` in the cell of the first use records that use.
pub fn on_connect_path(socket: &std::path::Path) -> std::path::PathBuf {
    let mut name = socket.file_name().unwrap_or_default().to_os_string();
    name.push(".on-connect");
    socket.with_file_name(name)
}

/// The longest line either end accepts (a hostile or broken peer cannot make the other end
/// buffer without bound). Replies with an SVG chart stay far below it.
pub const MAX_LINE: usize = 16 << 20;

/// The child's first line: who it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always 1 (the protocol's version).
    pub hello: u32,
    /// The child's process id (the kernel checks it against the socket's peer credentials).
    pub pid: u32,
    /// The crate's version (`CARGO_PKG_VERSION`).
    #[serde(default)]
    pub version: String,
}

impl Hello {
    /// This process's hello.
    pub fn new() -> Self {
        Hello { hello: 1, pid: std::process::id(), version: env!("CARGO_PKG_VERSION").to_string() }
    }
}

impl Default for Hello {
    fn default() -> Self {
        Self::new()
    }
}

/// A request: its id and what is asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Echoed in the reply.
    pub id: u64,
    /// The operation.
    #[serde(flatten)]
    pub op: Op,
}

/// What the kernel asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Before a cell: label allocations "cell N", open a fresh peak slot per device, restart
    /// the CUDA pool's high-water marks; answered with the readings.
    Pre {
        /// The cell's execution count.
        cell: u64,
    },
    /// After a cell: the readings with the peaks since `pre`; closes the slots, clears the
    /// label.
    Post {
        /// The cell's execution count.
        cell: u64,
    },
    /// The readings now.
    Read,
    /// The readings now with the peaks since `pre`, leaving the cell's slots open, and without
    /// the top owners (no stack is symbolised): what gpumem-kernel's live line asks a few
    /// times a second while a cell runs.
    Live,
    /// Sets history recording on every open device.
    Record(RecordRequest),
    /// Writes snapshot.pickle/.json/trace_plot.html of device 0 into `dir`.
    Snapshot {
        /// Directory (created if missing).
        dir: String,
    },
    /// Watches every open device for out-of-memory: the first failure of a cell writes a
    /// snapshot into `dir/cell-N` at that moment, and the cell's `post` answers `oom`.
    OnOom {
        /// Directory (created when needed); `None` stops watching.
        #[serde(default)]
        dir: Option<String>,
    },
    /// The memory-over-time chart of device 0's recorded history.
    HistorySvg,
    /// Device 0's `memory_summary()`.
    Summary,
    /// The code of a cell as its user sees it (sent before the cell runs), so that sites in it
    /// get their lines.
    CellCode {
        /// The cell's execution count.
        cell: u64,
        /// Its code (magic lines replaced by comments, so lines keep their numbers).
        code: String,
    },
    /// The code of several cells at once (what a child is sent as it connects): as many
    /// [`Op::CellCode`]s in one round trip.
    CellCodes {
        /// (execution count, code) of each cell.
        codes: Vec<(u64, String)>,
    },
    /// The `n` sites holding the most memory now and at the session's peak.
    Top {
        /// How many per place.
        #[serde(default = "five")]
        n: usize,
    },
    /// Gives back what the process holds cached and unused (`%gpumem trim`): gpumem-nb's
    /// allocator's cache on each open device, each CUDA device's stream-ordered pool; answered
    /// with what each held before and after ([`Trimmed`]).
    Trim,
}

fn five() -> usize {
    5
}

impl Op {
    /// The operation's name on the wire (`"pre"`, `"history_svg"`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Pre { .. } => "pre",
            Op::Post { .. } => "post",
            Op::Read => "read",
            Op::Live => "live",
            Op::Record(_) => "record",
            Op::Snapshot { .. } => "snapshot",
            Op::OnOom { .. } => "on_oom",
            Op::HistorySvg => "history_svg",
            Op::Summary => "summary",
            Op::CellCode { .. } => "cell_code",
            Op::CellCodes { .. } => "cell_codes",
            Op::Top { .. } => "top",
            Op::Trim => "trim",
        }
    }
}

/// What `record` sets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordRequest {
    /// `all`, `state` or `off`.
    #[serde(default = "record_all", with = "record_mode")]
    pub enabled: RecordMode,
    /// Ring size (`None`: unbounded).
    #[serde(default)]
    pub max_entries: Option<u64>,
    /// Whether to capture stacks.
    #[serde(default)]
    pub stacks: bool,
}

fn record_all() -> RecordMode {
    RecordMode::All
}

/// `RecordMode` as PyTorch's strings (`"all"`, `"state"`, `"off"`).
mod record_mode {
    use crate::record::history::RecordMode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(m: &RecordMode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match m {
            RecordMode::All => "all",
            RecordMode::State => "state",
            RecordMode::Off => "off",
        })
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RecordMode, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "all" => Ok(RecordMode::All),
            "state" => Ok(RecordMode::State),
            "off" => Ok(RecordMode::Off),
            other => Err(serde::de::Error::custom(format!("unknown record mode {other:?} (all, state or off)"))),
        }
    }
}

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

/// A reply. Which fields are set depends on the request: `devices` for `pre`/`post`/`read`/`live`
/// (and `oom` for `post`, `frameworks` for `pre`/`post`/`read` when one is watched), `files` for
/// `snapshot`, `svg` and `text` for `history_svg`, `text` for `summary`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// The request's id (`None` when the request could not be read at all).
    pub id: Option<u64>,
    /// Whether the request succeeded.
    pub ok: bool,
    /// Why it failed, in one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every open device's numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<DeviceReading>>,
    /// The files a snapshot wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<SnapshotPaths>,
    /// A chart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    /// A text (a chart's text form, the memory summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Whether every allocation of the process is tracked: `cupti`, `simulated`,
    /// `unavailable: <why>`, `off (…)`, `not started`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<String>,
    /// Every allocation of the process, per device touched (and the host's pinned memory), with
    /// peaks since `pre` (or since tracking began): what `pre`, `post` and `read` answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracked: Option<Vec<PlaceReading>>,
    /// Every CUDA device the process sees, by ordinal, with its UUID, when CUPTI tracks (`pre`,
    /// `post`, `read`): how the kernel gives NVML's devices their ordinals, also one where the
    /// cell made only a context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_devices: Option<Vec<CudaDevice>>,
    /// The cell's first out-of-memory failure, when `on_oom` watches (`post`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomEvent>,
    /// The top sites (`top`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top: Option<TopReport>,
    /// What `trim` gave back, per owner and device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trim: Option<Vec<Trimmed>>,
    /// The frameworks a notebook watches (`gpumem_nb::frameworks`), their own numbers: what
    /// `pre`, `post` and `read` answer (not `live`, which must not wait on a framework's
    /// queue), absent when none is watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frameworks: Option<Vec<FrameworkReading>>,
    /// What did not settle before the reading (`pre`, `post`, `read`, `top`, `snapshot`): a
    /// device or framework still busy after the settle time, read as it was. Absent when all
    /// settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsettled: Option<Vec<Settled>>,
}

impl Reply {
    /// A success for request `id`, with nothing in it yet.
    pub fn ok(id: u64) -> Self {
        Reply { id: Some(id), ok: true, ..Default::default() }
    }

    /// A failure for request `id` (or an unreadable one), with its reason.
    pub fn error(id: Option<u64>, why: impl Into<String>) -> Self {
        Reply { id, ok: false, error: Some(why.into()), ..Default::default() }
    }
}

/// Reads a request line. A line that is not a request is an error naming what was wrong, with
/// the id when one could still be read from it (so the sender can match the failure).
pub fn parse_request(line: &str) -> Result<Request, (Option<u64>, String)> {
    serde_json::from_str::<Request>(line).map_err(|e| {
        let id = serde_json::from_str::<serde_json::Value>(line).ok().and_then(|v| v.get("id")?.as_u64());
        (id, format!("malformed request: {e}"))
    })
}

/// One line of JSON (without the newline) for a message.
pub fn to_line<T: Serialize>(msg: &T) -> String {
    // Serialising these types cannot fail: no maps with non-string keys, no custom errors.
    serde_json::to_string(msg).unwrap_or_else(|e| format!("{{\"ok\":false,\"error\":\"unserialisable: {e}\"}}"))
}

#[cfg(test)]
mod tests {
    /// A site in words: the function and the cell line that led there; memory a framework's own
    /// thread made, by the framework and the cell that queued it.
    #[test]
    fn sites_in_words() {
        let b = |owner: &str, function: Option<&str>, cell: Option<u64>, line: Option<u32>, queued: bool| OwnerBytes {
            owner: owner.into(),
            function: function.map(str::to_string),
            cell,
            line,
            queued,
            ..Default::default()
        };
        assert_eq!(b("notebook cell", None, Some(4), Some(1), false).site(), "cell 4:1");
        assert_eq!(
            b("candle_core::…", Some("candle_core::Tensor::zeros"), Some(3), Some(2), false).site(),
            "candle_core::Tensor::zeros ← cell 3:2"
        );
        let cubecl =
            b("cubecl_cuda::…", Some("<cubecl_cuda::GpuStorage as ComputeStorage>::alloc"), Some(4), None, true);
        assert_eq!(cubecl.site(), "cubecl ← cell 4");
        assert_eq!(b("libstd-d1237ef7159db0a2.so", None, Some(17), None, true).site(), "a thread ← cell 17");
        // NCCL's proxy thread at the first collective, and its communicator made by the cell.
        assert_eq!(b("libnccl.so.2", Some("libnccl.so.2"), Some(3), None, true).site(), "NCCL ← cell 3");
        assert_eq!(b("libnccl.so.2", Some("libnccl.so.2"), Some(3), Some(4), false).site(), "NCCL ← cell 3:4");
        assert_eq!(b("libcublasLt.so.13", Some("libcublasLt.so.13"), None, None, false).site(), "cuBLASLt");
        // A library we do not know keeps its file name.
        assert_eq!(b("libfoo.so.1", Some("libfoo.so.1"), Some(2), Some(1), false).site(), "libfoo.so.1 ← cell 2:1");
    }

    use super::*;

    #[test]
    fn requests_have_the_documented_wire_form() {
        let r = Request { id: 7, op: Op::Pre { cell: 3 } };
        assert_eq!(to_line(&r), r#"{"id":7,"op":"pre","cell":3}"#);
        let r = Request {
            id: 8,
            op: Op::Record(RecordRequest { enabled: RecordMode::State, max_entries: Some(10), stacks: true }),
        };
        assert_eq!(to_line(&r), r#"{"id":8,"op":"record","enabled":"state","max_entries":10,"stacks":true}"#);
        assert_eq!(to_line(&Request { id: 9, op: Op::HistorySvg }), r#"{"id":9,"op":"history_svg"}"#);
        for op in [
            Op::Pre { cell: 1 },
            Op::Post { cell: 1 },
            Op::Read,
            Op::Live,
            Op::Summary,
            Op::Snapshot { dir: "d".into() },
        ] {
            assert!(to_line(&Request { id: 1, op: op.clone() }).contains(&format!("\"op\":\"{}\"", op.name())));
        }
        for line in [
            r#"{"id":7,"op":"pre","cell":3}"#,
            r#"{"id":8,"op":"record","enabled":"state","max_entries":10,"stacks":true}"#,
            r#"{"id":9,"op":"history_svg"}"#,
            r#"{"id":10,"op":"snapshot","dir":"/tmp/x"}"#,
            r#"{"id":11,"op":"on_oom","dir":"/tmp/oom"}"#,
            r#"{"id":12,"op":"on_oom","dir":null}"#,
        ] {
            assert_eq!(to_line(&parse_request(line).unwrap()), line);
        }
    }

    #[test]
    fn skew_is_tolerated_and_garbage_is_named() {
        // An older kernel's `record` without fields: the defaults.
        let r = parse_request(r#"{"id":1,"op":"record","future_field":true}"#).unwrap();
        assert_eq!(r.op, Op::Record(RecordRequest { enabled: RecordMode::All, max_entries: None, stacks: false }));
        let (id, why) = parse_request(r#"{"id":4,"op":"frobnicate"}"#).unwrap_err();
        assert_eq!(id, Some(4));
        assert!(why.starts_with("malformed request") && why.contains("frobnicate"), "{why}");
        let (id, why) = parse_request("not json").unwrap_err();
        assert_eq!(id, None);
        assert!(!why.contains('\n'), "{why}");
        assert!(parse_request(r#"{"id":1,"op":"record","enabled":"sometimes"}"#).unwrap_err().1.contains("sometimes"));
        assert!(parse_request(r#"{"id":1,"op":"pre"}"#).unwrap_err().1.contains("cell"));
        // A reply with fields from a newer crate still reads.
        let reply: Reply = serde_json::from_str(
            r#"{"id":2,"ok":true,"devices":[{"device":0,"backend":"simulated","allocated":1,"reserved":2,
                "peak_allocated":1,"peak_reserved":2,"from_the_future":[1,2]}],"extra":{}}"#,
        )
        .unwrap();
        let d = &reply.devices.unwrap()[0];
        assert_eq!((d.allocated, d.reserved, d.device_free, d.backend), (1, 2, None, BackendKind::Simulated));
        assert_eq!(reply.frameworks, None, "no framework watched: no field");
        // A framework's pool from an older or newer crate: missing counts are 0, unknown
        // fields are ignored; the field is left out when nothing is watched.
        let reply: Reply = serde_json::from_str(
            r#"{"id":3,"ok":true,"frameworks":[{"framework":"cubecl","device":"cuda:0",
                "pools":[{"kind":"sliced","in_use":5,"reserved":8,"future":1}]}]}"#,
        )
        .unwrap();
        let f = &reply.frameworks.as_ref().unwrap()[0];
        assert_eq!((f.framework.as_str(), f.error.as_ref(), f.pools[0].pages), ("cubecl", None, 0));
        assert_eq!(f.pools[0].cached(), 3);
        assert!(!to_line(&Reply::ok(1)).contains("frameworks"));
    }
}
