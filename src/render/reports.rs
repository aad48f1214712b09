//! Displayable reports: the allocator's summary, its headline statistics, its segments, and a
//! snapshot at a glance. Each one is plain data taken from the allocator once (by its `of`
//! constructor) or given by the caller (stats map, [`Snapshot`], segment list), rendered as
//! text and HTML without touching the allocator again.
//!
//! Every report has `bundle()` (a [`MimeBundle`]), `evcxr_display()` (shows it in an evcxr
//! cell) and `Display` (its text form).

use super::{MimeBundle, Table, escape};
use crate::allocator::CachingAllocator;
use crate::device::{Backend, BackendKind};
use crate::policy::SegmentView;
use crate::record::history::TraceAction;
use crate::snapshot::Snapshot;
use crate::units::iec;
use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};

use crate::units::{format_duration_us, format_utc, group_digits};

/// "allocator, device 0, simulated": what the numbers of a report cover.
fn allocator_source(device: i32, backend: BackendKind) -> String {
    format!("allocator, device {device}, {}", backend.name())
}

/// A small heading line for HTML reports.
fn html_heading(text: &str) -> String {
    format!(
        "<div style=\"font-family:sans-serif;font-size:13px;font-weight:600;margin:8px 0 4px 0\">{}</div>",
        escape(text)
    )
}

// ---------------------------------------------------------------------------------------------
// MemorySummary

/// PyTorch's `memory_summary()` table with where it comes from. The text form is PyTorch's
/// table exactly; the HTML form shows it in a `<pre>` under a line naming the device and the
/// backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemorySummary {
    /// The summary text, byte for byte PyTorch's.
    pub text: String,
    /// Device index.
    pub device: i32,
    /// What backs the allocator.
    pub backend: BackendKind,
    /// Whether the per-pool rows were left out.
    pub abbreviated: bool,
}

impl MemorySummary {
    /// The summary of `alloc` now (`alloc.memory_summary(abbreviated)`).
    pub fn of<B: Backend>(alloc: &CachingAllocator<B>, abbreviated: bool) -> Self {
        MemorySummary {
            text: alloc.memory_summary(abbreviated),
            device: alloc.device(),
            backend: alloc.backend_kind(),
            abbreviated,
        }
    }

    /// The summary of a `memory_stats()` map.
    pub fn from_stats(stats: &BTreeMap<String, i64>, device: i32, backend: BackendKind, abbreviated: bool) -> Self {
        MemorySummary {
            text: crate::stats::summary::memory_summary(stats, device, abbreviated),
            device,
            backend,
            abbreviated,
        }
    }

    /// "allocator, device 0, simulated".
    pub fn source(&self) -> String {
        allocator_source(self.device, self.backend)
    }

    /// The HTML form.
    pub fn to_html(&self) -> String {
        format!(
            "<div class=\"gpumem-summary\"><div style=\"font-family:sans-serif;font-size:12px;color:#555;margin-bottom:4px\">\
             memory_summary() — {}</div><pre style=\"font-family:monospace;font-size:12px;line-height:1.25;margin:0\">{}</pre></div>",
            escape(&self.source()),
            escape(&self.text)
        )
    }

    /// Text and HTML.
    pub fn bundle(&self) -> MimeBundle {
        MimeBundle::text(self.text.clone()).with_html(self.to_html())
    }
}

impl fmt::Display for MemorySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

// ---------------------------------------------------------------------------------------------
// MemoryStatsTable

/// Whether a row holds bytes or a count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatUnit {
    /// Bytes (shown in IEC units).
    Bytes,
    /// A count.
    Count,
}

/// One row of a [`MemoryStatsTable`], with the raw numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatRow {
    /// What the row shows.
    pub label: &'static str,
    /// The `memory_stats()` key (without `.current` / `.peak` for current/peak rows).
    pub key: &'static str,
    /// Current value (for event counters: the count since the last reset).
    pub current: i64,
    /// Peak value, for current/peak statistics.
    pub peak: Option<i64>,
    /// Bytes or count.
    pub unit: StatUnit,
}

impl StatRow {
    fn cell(&self, v: i64) -> String {
        match self.unit {
            StatUnit::Bytes => iec(v.max(0) as u64),
            StatUnit::Count => group_digits(v.max(0) as u64),
        }
    }
}

/// The headline numbers of `memory_stats()`: allocated, reserved, active, requested and
/// non-releasable (inactive split) bytes, current and peak, in IEC units; segment and
/// allocation counts; OOMs, allocation retries, device allocations and frees. The full map
/// (PyTorch's 122 keys) stays available through [`MemoryStatsTable::stats`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryStatsTable {
    /// The `memory_stats()` map.
    pub stats: BTreeMap<String, i64>,
    /// Device index.
    pub device: i32,
    /// What backs the allocator.
    pub backend: BackendKind,
}

const CURRENT_PEAK_ROWS: [(&str, &str, StatUnit); 7] = [
    ("allocated", "allocated_bytes.all", StatUnit::Bytes),
    ("reserved", "reserved_bytes.all", StatUnit::Bytes),
    ("active", "active_bytes.all", StatUnit::Bytes),
    ("requested", "requested_bytes.all", StatUnit::Bytes),
    ("inactive split (non-releasable)", "inactive_split_bytes.all", StatUnit::Bytes),
    ("segments", "segment.all", StatUnit::Count),
    ("allocations", "allocation.all", StatUnit::Count),
];

const COUNTER_ROWS: [(&str, &str); 4] = [
    ("OOMs", "num_ooms"),
    ("allocation retries", "num_alloc_retries"),
    ("device allocations", "num_device_alloc"),
    ("device frees", "num_device_free"),
];

impl MemoryStatsTable {
    /// The statistics of `alloc` now (one `memory_stats()` call).
    pub fn of<B: Backend>(alloc: &CachingAllocator<B>) -> Self {
        MemoryStatsTable { stats: alloc.memory_stats(), device: alloc.device(), backend: alloc.backend_kind() }
    }

    /// The table of a `memory_stats()` map.
    pub fn from_stats(stats: BTreeMap<String, i64>, device: i32, backend: BackendKind) -> Self {
        MemoryStatsTable { stats, device, backend }
    }

    /// The full `memory_stats()` map.
    pub fn stats(&self) -> &BTreeMap<String, i64> {
        &self.stats
    }

    /// One key of the map (0 when missing is *not* assumed: `None`).
    pub fn get(&self, key: &str) -> Option<i64> {
        self.stats.get(key).copied()
    }

    /// The rows shown, with raw values.
    pub fn rows(&self) -> Vec<StatRow> {
        let get = |k: String| self.stats.get(&k).copied().unwrap_or(0);
        let mut rows: Vec<StatRow> = CURRENT_PEAK_ROWS
            .iter()
            .map(|&(label, key, unit)| StatRow {
                label,
                key,
                current: get(format!("{key}.current")),
                peak: Some(get(format!("{key}.peak"))),
                unit,
            })
            .collect();
        rows.extend(COUNTER_ROWS.iter().map(|&(label, key)| StatRow {
            label,
            key,
            current: get(key.to_string()),
            peak: None,
            unit: StatUnit::Count,
        }));
        rows
    }

    /// "memory_stats() — allocator, device 0, simulated; …".
    pub fn caption(&self) -> String {
        format!(
            "memory_stats() — {}; peaks since the last peak reset, counters since the last accumulated reset; \
             1 MiB = 1,048,576 bytes",
            allocator_source(self.device, self.backend)
        )
    }

    /// The table (text and HTML come from it).
    pub fn table(&self) -> Table {
        let mut t = Table::new(["metric", "current", "peak"]).right_align([1, 2]).caption(self.caption());
        for r in self.rows() {
            let peak = r.peak.map_or_else(String::new, |p| r.cell(p));
            t.row([r.label.to_string(), r.cell(r.current), peak]);
        }
        t
    }

    /// Text and HTML.
    pub fn bundle(&self) -> MimeBundle {
        self.table().bundle()
    }
}

impl fmt::Display for MemoryStatsTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.table().to_text())
    }
}

// ---------------------------------------------------------------------------------------------
// SegmentTable

/// One segment's numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentRow {
    /// Device index.
    pub device: i32,
    /// First byte.
    pub address: u64,
    /// "small" or "large".
    pub pool: &'static str,
    /// Part of an expandable segment.
    pub expandable: bool,
    /// Raw stream handle (0: the default stream).
    pub stream: u64,
    /// Segment size.
    pub total: u64,
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// Bytes in active blocks (allocated or awaiting stream events).
    pub active: u64,
    /// Bytes in inactive (cached, free) blocks.
    pub free: u64,
    /// Number of blocks.
    pub blocks: usize,
    /// The largest inactive block: what the segment can still hand out in one piece.
    pub largest_free: u64,
}

/// One row per segment: address, pool, stream, total / allocated / active / free bytes,
/// blocks, and the largest free block (fragmentation at a glance), with a totals row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentTable {
    /// Segments in address order.
    pub rows: Vec<SegmentRow>,
    /// Where the segments come from ("allocator, device 0, simulated", "snapshot").
    pub source: String,
}

impl SegmentTable {
    /// The segments of `alloc` now (one `segments()` call).
    pub fn of<B: Backend>(alloc: &CachingAllocator<B>) -> Self {
        Self::from_segments(&alloc.segments(), alloc.device(), alloc.backend_kind())
    }

    /// The segments as [`CachingAllocator::segments`] returns them.
    pub fn from_segments(segments: &[SegmentView], device: i32, backend: BackendKind) -> Self {
        let rows = segments
            .iter()
            .map(|s| {
                let free: u64 = s.blocks.iter().filter(|b| !b.active).map(|b| b.size).sum();
                SegmentRow {
                    device,
                    address: s.address,
                    pool: s.pool.name(),
                    expandable: s.is_expandable,
                    stream: s.stream.0,
                    total: s.total_size,
                    allocated: s.allocated_size(),
                    active: s.active_size(),
                    free,
                    blocks: s.blocks.len(),
                    largest_free: s.blocks.iter().filter(|b| !b.active).map(|b| b.size).max().unwrap_or(0),
                }
            })
            .collect();
        SegmentTable { rows, source: allocator_source(device, backend) }
    }

    /// The segments of a snapshot (all devices).
    pub fn from_snapshot(snapshot: &Snapshot) -> Self {
        let rows = snapshot
            .segments
            .iter()
            .map(|s| {
                let inactive = || s.blocks.iter().filter(|b| b.state == "inactive").map(|b| b.size);
                SegmentRow {
                    device: s.device,
                    address: s.address,
                    pool: s.segment_type,
                    expandable: s.is_expandable,
                    stream: s.stream,
                    total: s.total_size,
                    allocated: s.allocated_size,
                    active: s.active_size,
                    free: inactive().sum(),
                    blocks: s.blocks.len(),
                    largest_free: inactive().max().unwrap_or(0),
                }
            })
            .collect::<Vec<_>>();
        let mut devices: Vec<i32> = rows.iter().map(|r: &SegmentRow| r.device).collect();
        devices.sort_unstable();
        devices.dedup();
        let source = match devices.as_slice() {
            [d] => format!("snapshot, device {d}"),
            _ => "snapshot".to_string(),
        };
        SegmentTable { rows, source }
    }

    /// Sums over all rows (`largest_free`: the largest of all; `address`: 0).
    pub fn totals(&self) -> SegmentRow {
        let mut t = SegmentRow { pool: "", ..Default::default() };
        for r in &self.rows {
            t.total += r.total;
            t.allocated += r.allocated;
            t.active += r.active;
            t.free += r.free;
            t.blocks += r.blocks;
            t.largest_free = t.largest_free.max(r.largest_free);
        }
        t
    }

    fn multi_device(&self) -> bool {
        self.rows.windows(2).any(|w| w[0].device != w[1].device)
    }

    /// "3 segments — allocator, device 0, simulated; …".
    pub fn caption(&self) -> String {
        format!(
            "{} segment{} — {}; free = inactive (cached) blocks; largest free = the biggest piece a segment can still hand out",
            self.rows.len(),
            if self.rows.len() == 1 { "" } else { "s" },
            self.source
        )
    }

    /// The table (text and HTML come from it).
    pub fn table(&self) -> Table {
        let multi = self.multi_device();
        let mut header: Vec<&str> = Vec::new();
        if multi {
            header.push("device");
        }
        header.extend(["address", "pool", "stream", "total", "allocated", "active", "free", "blocks", "largest free"]);
        let off = usize::from(multi);
        let mut t = Table::new(header).right_align((3..9).map(|c| c + off)).caption(self.caption());
        let stream = |s: u64| if s == 0 { "default".to_string() } else { format!("{s:#x}") };
        for r in &self.rows {
            let mut cells = Vec::new();
            if multi {
                cells.push(r.device.to_string());
            }
            let pool = if r.expandable { format!("{} (exp.)", r.pool) } else { r.pool.to_string() };
            cells.extend([
                format!("{:#x}", r.address),
                pool,
                stream(r.stream),
                iec(r.total),
                iec(r.allocated),
                iec(r.active),
                iec(r.free),
                group_digits(r.blocks as u64),
                iec(r.largest_free),
            ]);
            t.row(cells);
        }
        let s = self.totals();
        let mut cells = Vec::new();
        if multi {
            cells.push(String::new());
        }
        cells.extend([
            "total".to_string(),
            String::new(),
            String::new(),
            iec(s.total),
            iec(s.allocated),
            iec(s.active),
            iec(s.free),
            group_digits(s.blocks as u64),
            iec(s.largest_free),
        ]);
        t.row(cells);
        t
    }

    /// Text and HTML.
    pub fn bundle(&self) -> MimeBundle {
        self.table().bundle()
    }
}

impl fmt::Display for SegmentTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.table().to_text())
    }
}

// ---------------------------------------------------------------------------------------------
// SnapshotSummary

/// Blocks in one state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateCount {
    /// PyTorch's state string.
    pub state: &'static str,
    /// Number of blocks.
    pub blocks: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// A live (active) block of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Device index.
    pub device: i32,
    /// Address.
    pub address: u64,
    /// Block size.
    pub size: u64,
    /// Requested (unrounded) size.
    pub requested: u64,
    /// "active_allocated" or "active_pending_free".
    pub state: &'static str,
    /// The label it was allocated under (`user_metadata` of its last `alloc` event), or "".
    pub label: String,
    /// The innermost user frame of its allocation ("name (file:line)"), when stacks were kept.
    pub top_frame: Option<String>,
}

/// A snapshot at a glance: segments, blocks by state, events by action, the time span of the
/// trace, and the largest live blocks with their label and allocating frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSummary {
    /// Devices with segments or events.
    pub devices: Vec<i32>,
    /// Number of segments.
    pub segments: usize,
    /// Segments of the small pool.
    pub small_segments: usize,
    /// Segments of the large pool.
    pub large_segments: usize,
    /// Bytes of all segments.
    pub reserved: u64,
    /// Blocks by state: allocated, pending free, inactive (always these three, in this order).
    pub states: Vec<StateCount>,
    /// Events by action, PyTorch's vocabulary order (only actions that occur).
    pub events: Vec<(String, usize)>,
    /// Time of the first and the last event (µs since the Unix epoch).
    pub span_us: Option<(i64, i64)>,
    /// The largest live blocks, biggest first.
    pub largest: Vec<LiveBlock>,
    /// Number of live blocks in all.
    pub live_blocks: usize,
    /// The allocator configuration string the snapshot was taken under.
    pub conf: String,
}

const STATES: [&str; 3] = ["active_allocated", "active_pending_free", "inactive"];
const ACTIONS: [TraceAction; 9] = [
    TraceAction::Alloc,
    TraceAction::FreeRequested,
    TraceAction::FreeCompleted,
    TraceAction::SegmentAlloc,
    TraceAction::SegmentFree,
    TraceAction::SegmentMap,
    TraceAction::SegmentUnmap,
    TraceAction::Snapshot,
    TraceAction::Oom,
];

fn short_frame(f: &crate::record::frames::Frame) -> String {
    let mut name = f.name.clone();
    if name.chars().count() > 64 {
        name = format!("…{}", name.chars().rev().take(63).collect::<Vec<_>>().into_iter().rev().collect::<String>());
    }
    let file = std::path::Path::new(&f.filename).file_name().and_then(|s| s.to_str()).unwrap_or(&f.filename);
    if f.line > 0 { format!("{name} ({file}:{})", f.line) } else { format!("{name} ({file})") }
}

impl SnapshotSummary {
    /// The summary with the 10 largest live blocks.
    pub fn of(snapshot: &Snapshot) -> Self {
        Self::with_top(snapshot, 10)
    }

    /// The summary with the `top` largest live blocks.
    pub fn with_top(snapshot: &Snapshot, top: usize) -> Self {
        let mut devices: Vec<i32> = snapshot.segments.iter().map(|s| s.device).collect();
        devices.extend(snapshot.device_traces.iter().enumerate().filter(|(_, t)| !t.is_empty()).map(|(d, _)| d as i32));
        devices.sort_unstable();
        devices.dedup();

        let mut states: Vec<StateCount> =
            STATES.iter().map(|&state| StateCount { state, blocks: 0, bytes: 0 }).collect();
        for b in snapshot.segments.iter().flat_map(|s| &s.blocks) {
            if let Some(sc) = states.iter_mut().find(|sc| sc.state == b.state) {
                sc.blocks += 1;
                sc.bytes += b.size;
            }
        }

        let mut counts: HashMap<&str, usize> = HashMap::new();
        let mut span: Option<(i64, i64)> = None;
        // Label and frames of the last alloc at each (device, address).
        let mut last_alloc: HashMap<(i32, u64), &crate::snapshot::TraceSnap> = HashMap::new();
        for (d, trace) in snapshot.device_traces.iter().enumerate() {
            for e in trace {
                *counts.entry(e.action).or_default() += 1;
                if e.time_us > 0 {
                    span = Some(span.map_or((e.time_us, e.time_us), |(a, b)| (a.min(e.time_us), b.max(e.time_us))));
                }
                if e.action == "alloc"
                    && let Some(a) = e.addr
                {
                    last_alloc.insert((d as i32, a), e);
                }
            }
        }
        let mut events: Vec<(String, usize)> =
            ACTIONS.iter().filter_map(|a| counts.get(a.name()).map(|&n| (a.name().to_string(), n))).collect();
        let mut other: Vec<(String, usize)> = counts
            .iter()
            .filter(|(k, _)| TraceAction::from_name(k).is_none())
            .map(|(k, &n)| (k.to_string(), n))
            .collect();
        other.sort();
        events.extend(other);

        let mut live: Vec<LiveBlock> = snapshot
            .segments
            .iter()
            .flat_map(|s| s.blocks.iter().map(move |b| (s.device, b)))
            .filter(|(_, b)| b.state != "inactive")
            .map(|(device, b)| {
                let ev = last_alloc.get(&(device, b.address));
                let frame = b
                    .frames
                    .first()
                    .or_else(|| ev.and_then(|e| e.frames.as_ref()).and_then(|f| f.first()))
                    .map(short_frame);
                LiveBlock {
                    device,
                    address: b.address,
                    size: b.size,
                    requested: b.requested_size,
                    state: b.state,
                    label: ev.map(|e| e.user_metadata.clone()).unwrap_or_default(),
                    top_frame: frame,
                }
            })
            .collect();
        let live_blocks = live.len();
        live.sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
        live.truncate(top);

        SnapshotSummary {
            devices,
            segments: snapshot.segments.len(),
            small_segments: snapshot.segments.iter().filter(|s| s.segment_type == "small").count(),
            large_segments: snapshot.segments.iter().filter(|s| s.segment_type == "large").count(),
            reserved: snapshot.segments.iter().map(|s| s.total_size).sum(),
            states,
            events,
            span_us: span,
            largest: live,
            live_blocks,
            conf: snapshot.allocator_settings.conf.clone(),
        }
    }

    /// Total number of events.
    pub fn num_events(&self) -> usize {
        self.events.iter().map(|(_, n)| n).sum()
    }

    /// The first line: devices, segments, reserved bytes.
    pub fn headline(&self) -> String {
        let dev = match self.devices.as_slice() {
            [] => String::new(),
            [d] => format!(", device {d}"),
            many => format!(", devices {}", many.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")),
        };
        format!(
            "Snapshot{dev}: {} segments ({} small, {} large), {} reserved, {} live blocks, {} events",
            self.segments,
            self.small_segments,
            self.large_segments,
            iec(self.reserved),
            group_digits(self.live_blocks as u64),
            group_digits(self.num_events() as u64)
        )
    }

    /// The time span line.
    fn span_line(&self) -> String {
        match self.span_us {
            Some((a, b)) => format!("events from {} over {}", format_utc(a), format_duration_us(b - a)),
            None => "no timed events".to_string(),
        }
    }

    /// The tables: blocks by state, events by action, largest live blocks.
    pub fn tables(&self) -> [Table; 3] {
        let mut blocks = Table::new(["block state", "blocks", "bytes"]).right_align([1, 2]);
        for s in &self.states {
            blocks.row([s.state.to_string(), group_digits(s.blocks as u64), iec(s.bytes)]);
        }
        let mut events = Table::new(["event", "count"]).right_align([1]);
        for (a, n) in &self.events {
            events.row([a.clone(), group_digits(*n as u64)]);
        }
        // Label and frame columns only when some block has one.
        let labels = self.largest.iter().any(|b| !b.label.is_empty());
        let frames = self.largest.iter().any(|b| b.top_frame.is_some());
        let mut header = vec!["#", "size", "requested", "address", "state"];
        if labels {
            header.push("label");
        }
        if frames {
            header.push("allocated at");
        }
        let mut caption = format!("largest {} of {} live blocks", self.largest.len(), self.live_blocks);
        if labels {
            caption.push_str("; label = user_metadata of the block's alloc event");
        }
        let mut top = Table::new(header).right_align([0, 1, 2]).caption(caption);
        for (i, b) in self.largest.iter().enumerate() {
            let mut row = vec![
                (i + 1).to_string(),
                iec(b.size),
                iec(b.requested),
                format!("{:#x}", b.address),
                b.state.to_string(),
            ];
            if labels {
                row.push(b.label.clone());
            }
            if frames {
                row.push(b.top_frame.clone().unwrap_or_else(|| "—".to_string()));
            }
            top.row(row);
        }
        [blocks, events, top]
    }

    /// The text form.
    pub fn to_text(&self) -> String {
        let [blocks, events, top] = self.tables();
        let mut s = format!("{}\n{}\n", self.headline(), self.span_line());
        if !self.conf.is_empty() {
            let _ = writeln!(s, "allocator configuration: {}", self.conf);
        }
        let _ = write!(
            s,
            "\nBlocks\n{}\n\nEvents\n{}\n\nLargest live blocks\n{}",
            blocks.to_text(),
            events.to_text(),
            top.to_text()
        );
        s
    }

    /// The HTML form.
    pub fn to_html(&self) -> String {
        let [blocks, events, top] = self.tables();
        let mut h = String::from("<div class=\"gpumem-snapshot\">");
        let _ = write!(
            h,
            "<div style=\"font-family:sans-serif;font-size:13px\"><b>{}</b><br><span style=\"color:#555\">{}{}</span></div>",
            escape(&self.headline()),
            escape(&self.span_line()),
            if self.conf.is_empty() { String::new() } else { format!("; configuration {}", escape(&self.conf)) }
        );
        h.push_str("<div style=\"display:flex;gap:32px;flex-wrap:wrap;align-items:flex-start\"><div>");
        h.push_str(&html_heading("Blocks"));
        h.push_str(&blocks.to_html());
        h.push_str("</div><div>");
        h.push_str(&html_heading("Events"));
        h.push_str(&events.to_html());
        h.push_str("</div></div>");
        h.push_str(&html_heading("Largest live blocks"));
        h.push_str(&top.to_html());
        h.push_str("</div>");
        h
    }

    /// Text and HTML.
    pub fn bundle(&self) -> MimeBundle {
        MimeBundle::text(self.to_text()).with_html(self.to_html())
    }
}

impl fmt::Display for SnapshotSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

crate::render::evcxr_display!(MemorySummary, MemoryStatsTable, SegmentTable, SnapshotSummary);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_table_from_map() {
        let mut m = BTreeMap::new();
        m.insert("allocated_bytes.all.current".to_string(), 3 << 20);
        m.insert("allocated_bytes.all.peak".to_string(), 5 << 19);
        m.insert("num_device_alloc".to_string(), 1234);
        let t = MemoryStatsTable::from_stats(m, 1, BackendKind::Cuda);
        let text = t.to_string();
        assert!(text.contains("3.00 MiB") && text.contains("2.50 MiB") && text.contains("1,234"), "{text}");
        assert!(t.caption().contains("allocator, device 1, cuda"));
        assert_eq!(t.rows()[0].current, 3 << 20);
    }
}
