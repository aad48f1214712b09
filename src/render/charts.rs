//! Charts as self-contained SVG (plotters' SVG backend; text stays SVG `<text>`, so no fonts
//! are embedded or fetched), each wrapped in a [`Chart`] that carries a `text/plain` summary of
//! the data next to the `image/svg+xml`.
//!
//! - [`memory_over_time`]: allocated and reserved bytes stepping over the event sequence of a
//!   trace ([`TraceEntry`] list or [`Snapshot`]), OOMs marked. The running totals come from
//!   [`MemoryTimeline`], which replays the trace's geometry (see there for what is exact).
//! - [`segment_map`]: one bar per segment, blocks coloured by state.
//! - [`peak_bars`]: grouped bars (and optional lines) per label with an optional budget line;
//!   made for "peak per notebook cell" (x = cells; allocated peak, reserved peak, process total).
//!
//! Each `*_svg` function returns the SVG string alone. Long traces are downsampled to the plot
//! width (per pixel column: first, lowest, highest and last value, so no peak is lost), which
//! keeps a chart of 100k events well under 100 KiB.

use super::MimeBundle;
use crate::backend::Backend;
use crate::config::AllocatorConfig;
use crate::history::{TraceAction, TraceEntry};
use crate::policy::constants::{MIN_BLOCK_SIZE, SMALL_SIZE};
use crate::policy::rounding::{PoolKind, round_size};
use crate::snapshot::Snapshot;
use crate::units::{GIB, KIB, MIB, TIB, iec};
use crate::{CachingAllocator, render::reports::group_digits};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::{BTreeMap, HashSet};
use std::fmt;

// ---------------------------------------------------------------------------------------------
// Chart

/// A rendered chart: SVG plus a plain-text description of the data it shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chart {
    /// The chart's title (also drawn in the SVG).
    pub title: String,
    /// The SVG document.
    pub svg: String,
    /// What the chart shows, as text (the `text/plain` fallback).
    pub text: String,
}

impl Chart {
    /// The SVG document.
    pub fn svg(&self) -> &str {
        &self.svg
    }

    /// Text and SVG.
    pub fn bundle(&self) -> MimeBundle {
        MimeBundle::text(self.text.clone()).with_svg(self.svg.clone())
    }

    /// Shows the chart in an evcxr notebook cell.
    pub fn evcxr_display(&self) {
        self.bundle().evcxr_display();
    }

    /// Writes the SVG to `path`.
    pub fn save_svg(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        std::fs::write(path, &self.svg)
    }
}

impl fmt::Display for Chart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Size and labels of a chart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChartOptions {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels (for the segment map: the height grows with the rows instead).
    pub height: u32,
    /// Replaces the default title.
    pub title: Option<String>,
    /// Replaces the default x-axis description.
    pub x_desc: Option<String>,
    /// Segment map: at most this many segment rows (the rest are summed up in a note).
    pub max_rows: usize,
}

impl Default for ChartOptions {
    fn default() -> Self {
        ChartOptions { width: 900, height: 360, title: None, x_desc: None, max_rows: 48 }
    }
}

// Fonts: plotters writes `font-size = size / 1.24` into the SVG, so 15 gives ~12 px.
const FONT: &str = "sans-serif";
const TITLE_SIZE: f64 = 20.0;
const LABEL_SIZE: f64 = 15.5;
const DESC_SIZE: f64 = 16.0;
const SMALL_SIZE_FONT: f64 = 14.5;

const ALLOCATED_COLOR: RGBColor = RGBColor(31, 119, 180);
const RESERVED_COLOR: RGBColor = RGBColor(255, 127, 14);
const OOM_COLOR: RGBColor = RGBColor(214, 39, 40);
/// Used for the budget line only, so the line can be found and dashed in the SVG text.
const BUDGET_COLOR: RGBColor = RGBColor(214, 39, 41);
const BUDGET_STROKE: &str = "stroke=\"#D62729\"";
const GRID_COLOR: RGBColor = RGBColor(232, 232, 232);
const AXIS_GRAY: RGBColor = RGBColor(90, 90, 90);
/// Series colours for [`peak_bars`], in order.
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
];
const STATE_ALLOCATED: RGBColor = RGBColor(78, 121, 167);
const STATE_PENDING: RGBColor = RGBColor(242, 142, 43);
const STATE_INACTIVE: RGBColor = RGBColor(226, 226, 226);

fn font(size: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).color(&BLACK)
}

/// The unit an axis of byte values is labelled in: the largest IEC unit not above `max`.
fn axis_unit(max: u64) -> (&'static str, f64) {
    if max >= TIB {
        ("TiB", TIB as f64)
    } else if max >= GIB {
        ("GiB", GIB as f64)
    } else if max >= MIB {
        ("MiB", MIB as f64)
    } else if max >= KIB {
        ("KiB", KIB as f64)
    } else {
        ("B", 1.0)
    }
}

/// An axis tick value in `unit`: "0", "512 MiB", "1.5 GiB".
fn axis_label(v: f64, unit: &str) -> String {
    if v.abs() < 1e-9 {
        return "0".to_string();
    }
    if unit == "B" && (v - v.round()).abs() > 1e-9 {
        return String::new();
    }
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} {unit}")
}

/// A chart that could not be drawn: an SVG saying so.
fn error_svg(width: u32, height: u32, what: &str, err: &dyn fmt::Display) -> String {
    format!(
        "<svg width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" xmlns=\"http://www.w3.org/2000/svg\">\
         <text x=\"10\" y=\"20\" font-family=\"sans-serif\" font-size=\"13\">{}</text></svg>",
        super::escape(&format!("{what}: cannot draw the chart ({err})"))
    )
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Reads one total out of a point.
type Getter = fn(&TimelinePoint) -> u64;

fn err<E: std::error::Error + Send + Sync + 'static>(e: E) -> Box<dyn std::error::Error> {
    Box::new(e)
}

/// A legend swatch.
#[derive(Clone, Copy)]
enum Swatch {
    Square(RGBColor),
    Line(RGBColor),
    /// A line with a dot (line series).
    Dotted(RGBColor),
    /// A dashed line (the budget).
    Dashed(RGBColor),
}

/// Space above the plot for the title and the legend.
const HEADER_H: i32 = 58;

/// Draws the title and, under it, the legend (both centred), above the plot.
fn draw_header<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    width: u32,
    title: &str,
    legend: &[(String, Swatch)],
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let center = Pos::new(HPos::Center, VPos::Top);
    root.draw(&Text::new(title.to_string(), (width as i32 / 2, 8), font(TITLE_SIZE).pos(center))).map_err(err)?;
    // plotters cannot measure SVG text: estimate ~0.56 em per character.
    let char_w = SMALL_SIZE_FONT / 1.24 * 0.56;
    let item_w = |l: &str| 20 + (char_w * l.chars().count() as f64).round() as i32 + 18;
    let total: i32 = legend.iter().map(|(l, _)| item_w(l)).sum::<i32>() - 18;
    let mut x = ((width as i32 - total) / 2).max(8);
    let y = 36;
    for (label, swatch) in legend {
        match *swatch {
            Swatch::Square(c) => root.draw(&Rectangle::new([(x, y), (x + 12, y + 12)], c.filled())).map_err(err)?,
            Swatch::Line(c) => {
                root.draw(&Rectangle::new([(x, y + 5), (x + 14, y + 7)], c.filled())).map_err(err)?;
            }
            Swatch::Dotted(c) => {
                root.draw(&Rectangle::new([(x, y + 5), (x + 14, y + 7)], c.filled())).map_err(err)?;
                root.draw(&Circle::new((x + 7, y + 6), 3, c.filled())).map_err(err)?;
            }
            Swatch::Dashed(c) => {
                root.draw(&Rectangle::new([(x, y + 5), (x + 5, y + 7)], c.filled())).map_err(err)?;
                root.draw(&Rectangle::new([(x + 9, y + 5), (x + 14, y + 7)], c.filled())).map_err(err)?;
            }
        }
        root.draw(&Text::new(label.clone(), (x + 20, y - 1), font(SMALL_SIZE_FONT))).map_err(err)?;
        x += item_w(label);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Memory timeline: running totals reconstructed from a trace

/// Totals after a number of events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelinePoint {
    /// Events applied so far (0 = before the first event).
    pub event: usize,
    /// Time of the last applied event (µs since the Unix epoch; 0 before the first).
    pub time_us: i64,
    /// Bytes in allocated blocks (`memory_allocated()`; rounded block sizes).
    pub allocated: u64,
    /// Bytes reserved from the device (`memory_reserved()`).
    pub reserved: u64,
    /// Bytes in active blocks (allocated or awaiting stream events).
    pub active: u64,
    /// Requested (unrounded) bytes of active blocks.
    pub requested: u64,
}

/// Allocated / reserved / active / requested bytes after every event of a trace.
///
/// A trace records the *requested* size of each allocation, not the block it got, so the
/// block size is recovered from the trace's own geometry: segments come from
/// `segment_alloc` / `segment_map`, live blocks from `alloc` … `free_completed`, and a new
/// block takes the front of the free gap at its address, rounded with PyTorch's `round_size`
/// and split (or not) with PyTorch's rule. For a trace recorded from the allocator's start
/// with the allocator's configuration this is exact: the last point equals
/// `memory_allocated()` / `memory_reserved()` and the maxima equal the peaks.
///
/// A trace that starts late (ring buffer full, recording switched on mid-way) still works:
/// segments and blocks freed before they were seen are taken as present from the start, and
/// a [`Snapshot`]'s end state supplies the rest; sizes that had to be guessed are counted in
/// [`MemoryTimeline::estimated`] and clear [`MemoryTimeline::exact`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryTimeline {
    /// What the events come from ("allocator history", "snapshot, device 0").
    pub source: String,
    /// `points[k]`: totals after `k` events; `points[0]` is the state before the first.
    pub points: Vec<TimelinePoint>,
    /// Event numbers (1-based, as in `points`) of out-of-memory events.
    pub ooms: Vec<usize>,
    /// Block sizes that could not be derived from the trace and were estimated.
    pub estimated: usize,
    /// Whether every total is exact (no estimates, consistent with any end state given).
    pub exact: bool,
    /// Why the totals are not exact, when they are not.
    pub note: Option<String>,
}

/// Something a [`MemoryTimeline`] can be built from.
pub trait TimelineSource {
    /// The timeline of this source.
    fn timeline(&self) -> MemoryTimeline;
}

impl TimelineSource for [TraceEntry] {
    fn timeline(&self) -> MemoryTimeline {
        MemoryTimeline::from_trace(self, &AllocatorConfig::default())
    }
}

impl TimelineSource for Vec<TraceEntry> {
    fn timeline(&self) -> MemoryTimeline {
        self.as_slice().timeline()
    }
}

impl TimelineSource for Snapshot {
    fn timeline(&self) -> MemoryTimeline {
        MemoryTimeline::from_snapshot(self)
    }
}

impl TimelineSource for MemoryTimeline {
    fn timeline(&self) -> MemoryTimeline {
        self.clone()
    }
}

/// One event, whatever it was read from.
#[derive(Clone, Copy, Debug)]
struct Ev {
    action: Option<TraceAction>,
    addr: u64,
    size: u64,
    time_us: i64,
}

impl From<&TraceEntry> for Ev {
    fn from(e: &TraceEntry) -> Self {
        Ev { action: Some(e.action), addr: e.addr, size: e.size, time_us: e.time_us }
    }
}

#[derive(Clone, Copy, Debug)]
struct Blk {
    size: u64,
    requested: u64,
    allocated: bool,
}

/// What is known of the state before the first event.
#[derive(Default)]
struct Initial {
    segments: Vec<(u64, u64)>,
    mapped: Vec<(u64, u64)>,
    /// (address, requested, allocated, exact size if known)
    blocks: Vec<(u64, u64, bool, Option<u64>)>,
}

struct Rebuild<'c> {
    cfg: &'c AllocatorConfig,
    segments: BTreeMap<u64, u64>,
    /// Mapped ranges of expandable segments, merged: start → end.
    mapped: BTreeMap<u64, u64>,
    blocks: BTreeMap<u64, Blk>,
    allocated: i64,
    reserved: i64,
    active: i64,
    requested: i64,
    estimated: usize,
    negative: bool,
}

impl<'c> Rebuild<'c> {
    fn new(cfg: &'c AllocatorConfig) -> Self {
        Rebuild {
            cfg,
            segments: BTreeMap::new(),
            mapped: BTreeMap::new(),
            blocks: BTreeMap::new(),
            allocated: 0,
            reserved: 0,
            active: 0,
            requested: 0,
            estimated: 0,
            negative: false,
        }
    }

    /// End of the segment or mapped range holding `addr`.
    fn region_end(&self, addr: u64) -> Option<u64> {
        if let Some((&s, &size)) = self.segments.range(..=addr).next_back()
            && addr < s.saturating_add(size)
        {
            return Some(s.saturating_add(size));
        }
        if let Some((_, &end)) = self.mapped.range(..=addr).next_back()
            && addr < end
        {
            return Some(end);
        }
        None
    }

    /// The size of the block an allocation of `req` bytes got at `addr`: the front of the free
    /// gap there, split off when PyTorch's `should_split` says so.
    fn block_size(&mut self, addr: u64, req: u64) -> u64 {
        let rounded = round_size(req, self.cfg);
        let Some(end) = self.region_end(addr) else {
            self.estimated += 1;
            return rounded;
        };
        let next = self.blocks.range(addr.saturating_add(1)..).next().map_or(u64::MAX, |(&a, _)| a).min(end);
        let avail = next.saturating_sub(addr);
        if avail < rounded {
            self.estimated += 1;
            return rounded;
        }
        let remaining = avail - rounded;
        let split = if PoolKind::for_size(rounded) == PoolKind::Small || self.cfg.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            rounded < self.cfg.max_split_size && remaining > SMALL_SIZE
        };
        if split { rounded } else { avail }
    }

    fn map(&mut self, addr: u64, size: u64) {
        let (mut start, mut end) = (addr, addr.saturating_add(size));
        if let Some((&s, &e)) = self.mapped.range(..=start).next_back()
            && e >= start
        {
            start = s;
            end = end.max(e);
            self.mapped.remove(&s);
        }
        while let Some((&s, &e)) = self.mapped.range(start..=end).next() {
            end = end.max(e);
            self.mapped.remove(&s);
        }
        self.mapped.insert(start, end);
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(size);
        let hit: Vec<(u64, u64)> =
            self.mapped.range(..end).filter(|&(_, &e)| e > addr).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in hit {
            self.mapped.remove(&s);
            if s < addr {
                self.mapped.insert(s, addr);
            }
            if e > end {
                self.mapped.insert(end, e);
            }
        }
    }

    fn seed(&mut self, init: &Initial) {
        for &(a, s) in &init.segments {
            self.segments.insert(a, s);
            self.reserved += s as i64;
        }
        for &(a, s) in &init.mapped {
            self.map(a, s);
            self.reserved += s as i64;
        }
        for &(a, req, allocated, size) in &init.blocks {
            let size = size.unwrap_or_else(|| {
                self.estimated += 1;
                round_size(req, self.cfg)
            });
            self.blocks.insert(a, Blk { size, requested: req, allocated });
            self.active += size as i64;
            self.requested += req as i64;
            if allocated {
                self.allocated += size as i64;
            }
        }
    }

    fn apply(&mut self, e: &Ev) {
        let Some(action) = e.action else { return };
        match action {
            TraceAction::SegmentAlloc => {
                self.segments.insert(e.addr, e.size);
                self.reserved += e.size as i64;
            }
            TraceAction::SegmentFree => {
                self.segments.remove(&e.addr);
                self.reserved -= e.size as i64;
            }
            TraceAction::SegmentMap => {
                self.map(e.addr, e.size);
                self.reserved += e.size as i64;
            }
            TraceAction::SegmentUnmap => {
                self.unmap(e.addr, e.size);
                self.reserved -= e.size as i64;
            }
            TraceAction::Alloc => {
                let size = self.block_size(e.addr, e.size);
                if let Some(old) = self.blocks.insert(e.addr, Blk { size, requested: e.size, allocated: true }) {
                    // A block we never saw freed: drop its contribution.
                    self.estimated += 1;
                    self.active -= old.size as i64;
                    self.requested -= old.requested as i64;
                    if old.allocated {
                        self.allocated -= old.size as i64;
                    }
                }
                self.allocated += size as i64;
                self.active += size as i64;
                self.requested += e.size as i64;
            }
            TraceAction::FreeRequested => match self.blocks.get_mut(&e.addr) {
                Some(b) if b.allocated => {
                    b.allocated = false;
                    self.allocated -= b.size as i64;
                }
                _ => self.estimated += 1,
            },
            TraceAction::FreeCompleted => match self.blocks.remove(&e.addr) {
                Some(b) => {
                    if b.allocated {
                        self.allocated -= b.size as i64;
                    }
                    self.active -= b.size as i64;
                    self.requested -= b.requested as i64;
                }
                None => self.estimated += 1,
            },
            TraceAction::Oom | TraceAction::Snapshot => {}
        }
    }

    fn point(&mut self, event: usize, time_us: i64) -> TimelinePoint {
        let mut clamp = |v: i64| {
            if v < 0 {
                self.negative = true;
            }
            v.max(0) as u64
        };
        TimelinePoint {
            event,
            time_us,
            allocated: clamp(self.allocated),
            reserved: clamp(self.reserved),
            active: clamp(self.active),
            requested: clamp(self.requested),
        }
    }
}

/// What the trace itself says existed before its first event: segments and blocks that are
/// freed (or unmapped) before they were ever allocated (or mapped) in it.
fn initial_from_trace(events: &[Ev]) -> Initial {
    let mut init = Initial::default();
    let mut seen_seg = HashSet::new();
    let mut seen_blk = HashSet::new();
    let mut mapped_seen: Vec<(u64, u64)> = Vec::new();
    for e in events {
        let Some(action) = e.action else { continue };
        // Whether this is the first event at its address (segment or block).
        let first_seg =
            matches!(action, TraceAction::SegmentAlloc | TraceAction::SegmentFree) && seen_seg.insert(e.addr);
        let first_blk = matches!(action, TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::FreeCompleted)
            && seen_blk.insert(e.addr);
        match action {
            TraceAction::SegmentFree if first_seg => init.segments.push((e.addr, e.size)),
            TraceAction::SegmentMap => mapped_seen.push((e.addr, e.addr.saturating_add(e.size))),
            TraceAction::SegmentUnmap => {
                let end = e.addr.saturating_add(e.size);
                if !mapped_seen.iter().any(|&(s, x)| s < end && x > e.addr) {
                    init.mapped.push((e.addr, e.size));
                }
                mapped_seen.push((e.addr, end));
            }
            TraceAction::FreeRequested if first_blk => init.blocks.push((e.addr, e.size, true, None)),
            TraceAction::FreeCompleted if first_blk => init.blocks.push((e.addr, e.size, false, None)),
            _ => {}
        }
    }
    init
}

/// The allocator configuration a snapshot was taken under (what matters for block sizes).
fn config_of(snapshot: &Snapshot) -> AllocatorConfig {
    let s = &snapshot.allocator_settings;
    let mut cfg = AllocatorConfig {
        max_split_size: if s.max_split_size < 0 { u64::MAX } else { s.max_split_size as u64 },
        expandable_segments: s.expandable_segments,
        ..AllocatorConfig::default()
    };
    for (i, (_, d)) in s.roundup_power2_divisions.iter().enumerate() {
        if let Some(slot) = cfg.roundup_power2_divisions.get_mut(i) {
            *slot = *d;
        }
    }
    cfg
}

impl MemoryTimeline {
    /// The timeline of recorded events (oldest first), for an allocator with `config`.
    pub fn from_trace(entries: &[TraceEntry], config: &AllocatorConfig) -> Self {
        let events: Vec<Ev> = entries.iter().map(Ev::from).collect();
        let init = initial_from_trace(&events);
        let mut tl = Self::build(&events, &init, config, None);
        tl.source = "allocator history".to_string();
        tl
    }

    /// The timeline of an allocator's recorded history, under its own configuration. Only
    /// copies data out of the allocator; nothing is computed under its lock.
    pub fn of<B: Backend>(alloc: &CachingAllocator<B>) -> Self {
        let (history, config) =
            alloc.with_state(|s, _| (s.history.entries().iter().cloned().collect::<Vec<_>>(), s.config().clone()));
        let mut tl = Self::from_trace(&history, &config);
        tl.source = format!("allocator history, device {}, {}", alloc.device(), alloc.backend_kind().name());
        tl
    }

    /// The timeline of a snapshot's trace (the device with data; the highest index if several),
    /// checked against, and completed by, the snapshot's end state.
    pub fn from_snapshot(snapshot: &Snapshot) -> Self {
        let device = snapshot_device(snapshot);
        Self::from_snapshot_device(snapshot, device)
    }

    /// The timeline of one device of a snapshot.
    pub fn from_snapshot_device(snapshot: &Snapshot, device: i32) -> Self {
        let cfg = config_of(snapshot);
        let trace = usize::try_from(device).ok().and_then(|d| snapshot.device_traces.get(d));
        let events: Vec<Ev> = trace
            .map(|t| {
                t.iter()
                    .map(|e| Ev {
                        action: TraceAction::from_name(e.action),
                        addr: e.addr.or(e.device_free).unwrap_or(0),
                        size: e.size,
                        time_us: e.time_us,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut init = initial_from_trace(&events);
        // The end state fills in what the trace never touched.
        let seg_addrs: HashSet<u64> = events
            .iter()
            .filter(|e| matches!(e.action, Some(TraceAction::SegmentAlloc | TraceAction::SegmentFree)))
            .map(|e| e.addr)
            .collect();
        let blk_addrs: HashSet<u64> = events
            .iter()
            .filter(|e| {
                matches!(e.action, Some(TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::FreeCompleted))
            })
            .map(|e| e.addr)
            .collect();
        let maps: Vec<(u64, u64)> = events
            .iter()
            .filter(|e| matches!(e.action, Some(TraceAction::SegmentMap | TraceAction::SegmentUnmap)))
            .map(|e| (e.addr, e.addr.saturating_add(e.size)))
            .collect();
        let segs = snapshot.segments.iter().filter(|s| s.device == device);
        let (mut final_allocated, mut final_reserved) = (0u64, 0u64);
        for s in segs {
            final_allocated += s.allocated_size;
            final_reserved += s.total_size;
            if s.is_expandable {
                let end = s.address.saturating_add(s.total_size);
                // Mapped in part during the trace: the starting extent is not known exactly, and
                // the end-state check below tells whether it mattered.
                if !maps.iter().any(|&(a, e)| a < end && e > s.address) {
                    init.mapped.push((s.address, s.total_size));
                }
            } else if !seg_addrs.contains(&s.address) {
                init.segments.push((s.address, s.total_size));
            }
            for b in &s.blocks {
                if b.state != "inactive" && !blk_addrs.contains(&b.address) {
                    init.blocks.push((b.address, b.requested_size, b.state == "active_allocated", Some(b.size)));
                }
            }
        }
        let mut tl = Self::build(&events, &init, &cfg, Some((final_allocated, final_reserved)));
        tl.source = format!("snapshot, device {device}");
        tl
    }

    fn build(events: &[Ev], init: &Initial, cfg: &AllocatorConfig, end: Option<(u64, u64)>) -> Self {
        let mut r = Rebuild::new(cfg);
        r.seed(init);
        let mut points = Vec::with_capacity(events.len() + 1);
        let mut ooms = Vec::new();
        points.push(r.point(0, 0));
        for (i, e) in events.iter().enumerate() {
            r.apply(e);
            if e.action == Some(TraceAction::Oom) {
                ooms.push(i + 1);
            }
            points.push(r.point(i + 1, e.time_us));
        }
        let mut notes = Vec::new();
        if r.estimated > 0 {
            notes.push(format!("{} block sizes estimated (the trace does not cover them)", r.estimated));
        }
        if r.negative {
            notes.push("memory freed that the trace never allocated".to_string());
        }
        if let (Some((fa, fr)), Some(last)) = (end, points.last())
            && (last.allocated != fa || last.reserved != fr)
        {
            notes.push(format!(
                "end state differs from the snapshot's (allocated {} vs {}, reserved {} vs {})",
                iec(last.allocated),
                iec(fa),
                iec(last.reserved),
                iec(fr)
            ));
        }
        MemoryTimeline {
            source: String::new(),
            points,
            ooms,
            estimated: r.estimated,
            exact: notes.is_empty(),
            note: (!notes.is_empty()).then(|| notes.join("; ")),
        }
    }

    /// Number of events.
    pub fn events(&self) -> usize {
        self.points.len().saturating_sub(1)
    }

    /// The totals after the last event.
    pub fn last(&self) -> TimelinePoint {
        self.points.last().copied().unwrap_or_default()
    }

    /// The highest allocated bytes and the point it was reached.
    pub fn peak_allocated(&self) -> TimelinePoint {
        self.points.iter().copied().max_by_key(|p| (p.allocated, std::cmp::Reverse(p.event))).unwrap_or_default()
    }

    /// The highest reserved bytes and the point it was reached.
    pub fn peak_reserved(&self) -> TimelinePoint {
        self.points.iter().copied().max_by_key(|p| (p.reserved, std::cmp::Reverse(p.event))).unwrap_or_default()
    }

    /// The chart of this timeline.
    pub fn chart(&self, opts: &ChartOptions) -> Chart {
        let title = opts.title.clone().unwrap_or_else(|| format!("Memory over time — {}", self.source));
        let svg = timeline_svg(self, &title, opts);
        Chart { text: self.describe(&title), title, svg }
    }

    /// The text form of the chart: what it shows, its extremes and its OOMs.
    pub fn describe(&self, title: &str) -> String {
        let mut s = String::new();
        let n = self.events();
        let first_t = self.points.iter().skip(1).map(|p| p.time_us).find(|&t| t > 0);
        let last_t = self.last().time_us;
        s.push_str(&format!(
            "{title}\n{} events, {} points",
            group_digits(n as u64),
            group_digits(self.points.len() as u64)
        ));
        if let Some(t0) = first_t
            && last_t >= t0
        {
            s.push_str(&format!(", over {}", crate::render::reports::duration(last_t - t0)));
        }
        s.push('\n');
        let series: [(&str, Getter); 2] = [("allocated", |p| p.allocated), ("reserved", |p| p.reserved)];
        for (name, get) in series {
            let (min, max) = self.points.iter().map(get).fold((u64::MAX, 0), |(a, b), v| (a.min(v), b.max(v)));
            let min = if self.points.is_empty() { 0 } else { min };
            let at = self.points.iter().find(|p| get(p) == max).map_or(0, |p| p.event);
            s.push_str(&format!(
                "{name:<9}: start {}, end {}, min {}, max {} (after event {})\n",
                iec(self.points.first().map(get).unwrap_or(0)),
                iec(get(&self.last())),
                iec(min),
                iec(max),
                group_digits(at as u64)
            ));
        }
        if self.ooms.is_empty() {
            s.push_str("OOMs: none");
        } else {
            let list: Vec<String> = self.ooms.iter().take(10).map(|&k| group_digits(k as u64)).collect();
            let more = if self.ooms.len() > 10 { ", …" } else { "" };
            s.push_str(&format!("OOMs: {} (at events {}{more})", self.ooms.len(), list.join(", ")));
        }
        match &self.note {
            Some(note) => s.push_str(&format!("\napproximate: {note}")),
            None => s.push_str("\nexact: block sizes follow the trace's geometry and PyTorch's rounding"),
        }
        s
    }
}

fn snapshot_device(snapshot: &Snapshot) -> i32 {
    let from_traces = snapshot.device_traces.iter().rposition(|t| !t.is_empty()).map(|d| d as i32);
    let from_segments = snapshot.segments.iter().map(|s| s.device).max();
    from_traces.max(from_segments).unwrap_or(0)
}

/// A polyline in pixels built from a step function, keeping per pixel column only the first,
/// lowest, highest and last value (in the order they occur).
#[derive(Default)]
struct PixelPath {
    out: Vec<(i32, i32)>,
    col_x: Option<i32>,
    col: Vec<i32>,
}

impl PixelPath {
    fn push(&mut self, (x, y): (i32, i32)) {
        if self.col_x != Some(x) {
            self.flush();
            self.col_x = Some(x);
        }
        self.col.push(y);
    }

    fn flush(&mut self) {
        let Some(x) = self.col_x else { return };
        if self.col.is_empty() {
            return;
        }
        let first = self.col[0];
        let last = self.col[self.col.len() - 1];
        let (mut imin, mut imax) = (0, 0);
        for (i, &y) in self.col.iter().enumerate() {
            if y < self.col[imin] {
                imin = i;
            }
            if y > self.col[imax] {
                imax = i;
            }
        }
        let (a, b) = if imin <= imax { (imin, imax) } else { (imax, imin) };
        for y in [first, self.col[a], self.col[b], last] {
            if self.out.last() != Some(&(x, y)) {
                self.out.push((x, y));
            }
        }
        self.col.clear();
    }

    fn finish(mut self) -> Vec<(i32, i32)> {
        self.flush();
        self.out
    }
}

/// The SVG of [`memory_over_time`].
fn timeline_svg(tl: &MemoryTimeline, title: &str, opts: &ChartOptions) -> String {
    let mut buf = String::new();
    let r = draw_timeline(&mut buf, tl, title, opts);
    match r {
        Ok(()) => buf,
        Err(e) => error_svg(opts.width, opts.height, title, &e),
    }
}

fn draw_timeline(buf: &mut String, tl: &MemoryTimeline, title: &str, opts: &ChartOptions) -> DrawResult {
    let (w, h) = (opts.width.max(200), opts.height.max(150));
    let root = SVGBackend::with_string(buf, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let n = tl.events();
    let max = tl.points.iter().map(|p| p.allocated.max(p.reserved)).max().unwrap_or(0);
    let (unit, div) = axis_unit(max.max(1));
    let y_top = (max as f64 / div * 1.08).max(1.0);
    let x_max = n.max(1) as f64;
    let mut legend = vec![
        (format!("reserved (max {})", iec(tl.peak_reserved().reserved)), Swatch::Square(RESERVED_COLOR)),
        (format!("allocated (max {})", iec(tl.peak_allocated().allocated)), Swatch::Square(ALLOCATED_COLOR)),
    ];
    if !tl.ooms.is_empty() {
        legend.push((format!("OOM ×{}", tl.ooms.len()), Swatch::Line(OOM_COLOR)));
    }
    draw_header(&root, w, title, &legend)?;
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .margin_top(HEADER_H)
        .margin_right(24)
        .x_label_area_size(46)
        .y_label_area_size(92)
        .build_cartesian_2d(0f64..x_max, 0f64..y_top)
        .map_err(err)?;
    let y_fmt = |v: &f64| axis_label(*v, unit);
    let x_fmt = |v: &f64| {
        if (v - v.round()).abs() > 1e-6 { String::new() } else { group_digits(v.round().max(0.0) as u64) }
    };
    let x_desc = opts.x_desc.clone().unwrap_or_else(|| "event".to_string());
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .bold_line_style(GRID_COLOR)
        .axis_style(AXIS_GRAY)
        .x_labels(n.clamp(2, 10))
        .y_labels(6)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .x_desc(x_desc)
        .y_desc("bytes")
        .label_style(font(LABEL_SIZE))
        .axis_desc_style(font(DESC_SIZE))
        .draw()
        .map_err(err)?;

    let (_, y_px) = chart.plotting_area().get_pixel_range();
    let base_y = y_px.end - 1;
    let path = |get: Getter| {
        let mut p = PixelPath::default();
        let mut prev: Option<f64> = None;
        for pt in &tl.points {
            let v = get(pt) as f64 / div;
            let x = pt.event as f64;
            if let Some(pv) = prev {
                p.push(chart.backend_coord(&(x, pv)));
            }
            p.push(chart.backend_coord(&(x, v)));
            prev = Some(v);
        }
        // Extend the last value to the right edge.
        if let Some(pv) = prev {
            p.push(chart.backend_coord(&(x_max, pv)));
        }
        p.finish()
    };
    let series: [(&str, RGBColor, Getter, f64); 2] =
        [("reserved", RESERVED_COLOR, |p| p.reserved, 0.12), ("allocated", ALLOCATED_COLOR, |p| p.allocated, 0.22)];
    for (_, color, get, alpha) in series {
        let pts = path(get);
        if pts.is_empty() {
            continue;
        }
        let mut poly = pts.clone();
        poly.push((pts[pts.len() - 1].0, base_y));
        poly.push((pts[0].0, base_y));
        root.draw(&Polygon::new(poly, color.mix(alpha).filled())).map_err(err)?;
        root.draw(&PathElement::new(pts, color.stroke_width(2))).map_err(err)?;
    }

    // OOM markers: one vertical line per pixel column, labelled once.
    let mut oom_cols: Vec<i32> = tl.ooms.iter().map(|&k| chart.backend_coord(&(k as f64, 0.0)).0).collect();
    oom_cols.dedup();
    for (i, &x) in oom_cols.iter().enumerate() {
        root.draw(&PathElement::new(vec![(x, y_px.start), (x, base_y)], OOM_COLOR.stroke_width(1))).map_err(err)?;
        if i < 8 {
            root.draw(&Text::new("OOM", (x + 3, y_px.start + 2), font(SMALL_SIZE_FONT).color(&OOM_COLOR)))
                .map_err(err)?;
        }
    }

    root.present().map_err(err)?;
    Ok(())
}

/// Allocated and reserved bytes over the events of a trace ([`TraceEntry`] list, e.g.
/// `alloc.history()`, or a [`Snapshot`]), OOMs marked, y axis in IEC units.
pub fn memory_over_time<S: TimelineSource + ?Sized>(source: &S) -> Chart {
    memory_over_time_with(source, &ChartOptions::default())
}

/// [`memory_over_time`] with options.
pub fn memory_over_time_with<S: TimelineSource + ?Sized>(source: &S, opts: &ChartOptions) -> Chart {
    source.timeline().chart(opts)
}

/// The SVG of [`memory_over_time`] alone.
pub fn memory_over_time_svg<S: TimelineSource + ?Sized>(source: &S) -> String {
    memory_over_time(source).svg
}

// ---------------------------------------------------------------------------------------------
// Segment map

/// A bar per segment (address order), blocks coloured by state: allocated, pending free
/// (awaiting stream events), inactive (cached free space). Bars are scaled to their own
/// segment, so fragmentation is visible in every segment whatever its size; sizes are written
/// beside them.
pub fn segment_map(snapshot: &Snapshot) -> Chart {
    segment_map_with(snapshot, &ChartOptions::default())
}

/// The SVG of [`segment_map`] alone.
pub fn segment_map_svg(snapshot: &Snapshot) -> String {
    segment_map(snapshot).svg
}

/// [`segment_map`] with options (`width`, `title`, `max_rows`).
pub fn segment_map_with(snapshot: &Snapshot, opts: &ChartOptions) -> Chart {
    let devices: HashSet<i32> = snapshot.segments.iter().map(|s| s.device).collect();
    let title = opts.title.clone().unwrap_or_else(|| {
        let mut d: Vec<i32> = devices.iter().copied().collect();
        d.sort_unstable();
        let dev = match d.as_slice() {
            [] => "snapshot".to_string(),
            [one] => format!("snapshot, device {one}"),
            many => format!("snapshot, devices {}", many.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")),
        };
        format!("Segments — {dev}")
    });
    let mut buf = String::new();
    let height = segment_map_height(snapshot, opts);
    let svg = match draw_segment_map(&mut buf, snapshot, &title, opts, height) {
        Ok(()) => buf,
        Err(e) => error_svg(opts.width, height, &title, &e),
    };
    Chart { text: describe_segments(snapshot, &title), title, svg }
}

const ROW_H: u32 = 18;
const ROW_GAP: u32 = 5;

fn segment_map_height(snapshot: &Snapshot, opts: &ChartOptions) -> u32 {
    let rows = snapshot.segments.len().min(opts.max_rows.max(1)) as u32;
    let more = u32::from(snapshot.segments.len() > opts.max_rows.max(1));
    48 + rows.max(1) * (ROW_H + ROW_GAP) + more * 20 + 40
}

fn draw_segment_map(buf: &mut String, snap: &Snapshot, title: &str, opts: &ChartOptions, h: u32) -> DrawResult {
    let w = opts.width.max(400);
    let root = SVGBackend::with_string(buf, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    root.draw(&Text::new(title.to_string(), (12, 10), font(TITLE_SIZE))).map_err(err)?;
    let label_w: i32 = 250;
    let right_w: i32 = 150;
    let x0 = 12 + label_w;
    let bar_w = (w as i32 - x0 - right_w - 12).max(50);
    let mut y = 44i32;
    let rows = opts.max_rows.max(1);
    if snap.segments.is_empty() {
        root.draw(&Text::new("no segments", (12, y), font(LABEL_SIZE))).map_err(err)?;
    }
    for s in snap.segments.iter().take(rows) {
        let pool = if s.is_expandable { format!("{} exp.", s.segment_type) } else { s.segment_type.to_string() };
        let label = format!("{:#x}  {}  {}", s.address, iec(s.total_size), pool);
        root.draw(&Text::new(label, (12, y + 1), font(SMALL_SIZE_FONT))).map_err(err)?;
        // Runs of blocks with the same state, in pixels.
        let total = s.total_size.max(1) as f64;
        let mut off = 0u64;
        let mut runs: Vec<(i32, i32, &str, usize)> = Vec::new();
        for b in &s.blocks {
            let a = x0 + (off as f64 / total * bar_w as f64).round() as i32;
            off += b.size;
            let e = x0 + (off as f64 / total * bar_w as f64).round() as i32;
            match runs.last_mut() {
                Some(r) if r.2 == b.state => {
                    r.1 = e;
                    r.3 += 1;
                }
                _ => runs.push((a, e, b.state, 1)),
            }
        }
        for (a, e, state, _) in &runs {
            let color = match *state {
                "active_allocated" => STATE_ALLOCATED,
                "active_pending_free" => STATE_PENDING,
                _ => STATE_INACTIVE,
            };
            let e = (*e).max(a + 1);
            root.draw(&Rectangle::new([(*a, y), (e, y + ROW_H as i32)], color.filled())).map_err(err)?;
        }
        // Boundaries between allocated blocks, where there is room to see them.
        let mut off = 0u64;
        for b in &s.blocks {
            if off > 0 && b.state != "inactive" {
                let x = x0 + (off as f64 / total * bar_w as f64).round() as i32;
                let bw = (b.size as f64 / total * bar_w as f64) as i32;
                if bw >= 4 {
                    root.draw(&PathElement::new(vec![(x, y), (x, y + ROW_H as i32)], WHITE.stroke_width(1)))
                        .map_err(err)?;
                }
            }
            off += b.size;
        }
        root.draw(&Rectangle::new([(x0, y), (x0 + bar_w, y + ROW_H as i32)], AXIS_GRAY.stroke_width(1)))
            .map_err(err)?;
        let pct = if s.total_size > 0 { s.allocated_size as f64 * 100.0 / s.total_size as f64 } else { 0.0 };
        root.draw(&Text::new(
            format!("{} used ({pct:.0}%)", iec(s.allocated_size)),
            (x0 + bar_w + 8, y + 1),
            font(SMALL_SIZE_FONT),
        ))
        .map_err(err)?;
        y += (ROW_H + ROW_GAP) as i32;
    }
    if snap.segments.len() > rows {
        let rest = &snap.segments[rows..];
        let bytes: u64 = rest.iter().map(|s| s.total_size).sum();
        root.draw(&Text::new(
            format!("… {} more segments ({}) not drawn", rest.len(), iec(bytes)),
            (12, y),
            font(SMALL_SIZE_FONT),
        ))
        .map_err(err)?;
        y += 20;
    }
    // Legend.
    y += 8;
    let mut lx = 12;
    for (label, color) in [
        ("allocated", STATE_ALLOCATED),
        ("pending free (stream events)", STATE_PENDING),
        ("inactive (cached, free)", STATE_INACTIVE),
    ] {
        root.draw(&Rectangle::new([(lx, y + 1), (lx + 12, y + 13)], color.filled())).map_err(err)?;
        root.draw(&Rectangle::new([(lx, y + 1), (lx + 12, y + 13)], AXIS_GRAY.stroke_width(1))).map_err(err)?;
        root.draw(&Text::new(label, (lx + 17, y), font(SMALL_SIZE_FONT))).map_err(err)?;
        lx += 17 + (label.len() as i32) * 7 + 22;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn describe_segments(snap: &Snapshot, title: &str) -> String {
    let mut by_state: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    let mut largest_free = 0u64;
    for s in &snap.segments {
        for b in &s.blocks {
            let e = by_state.entry(b.state).or_default();
            e.0 += 1;
            e.1 += b.size;
            if b.state == "inactive" {
                largest_free = largest_free.max(b.size);
            }
        }
    }
    let reserved: u64 = snap.segments.iter().map(|s| s.total_size).sum();
    let get = |k: &str| by_state.get(k).copied().unwrap_or_default();
    let (na, ba) = get("active_allocated");
    let (np, bp) = get("active_pending_free");
    let (ni, bi) = get("inactive");
    format!(
        "{title}\n{} segments, {} reserved\nblocks: {na} allocated ({}), {np} pending free ({}), {ni} inactive ({})\nlargest inactive block: {}",
        snap.segments.len(),
        iec(reserved),
        iec(ba),
        iec(bp),
        iec(bi),
        iec(largest_free)
    )
}

// ---------------------------------------------------------------------------------------------
// Peak bars

/// How a [`Series`] is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeriesKind {
    /// Bars, grouped side by side with the other bar series.
    Bar,
    /// A line with a dot per value, over the bars.
    Line,
}

/// One named series of byte values, one value per label (`None`: no value there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Series {
    /// Legend name, e.g. "allocated peak".
    pub name: String,
    /// Bytes per label.
    pub values: Vec<Option<u64>>,
    /// Bars or a line.
    pub kind: SeriesKind,
}

impl Series {
    /// A bar series: `Series::bars("allocated peak", [1 << 30, 2 << 30])`.
    pub fn bars<V: Into<Option<u64>>>(name: impl Into<String>, values: impl IntoIterator<Item = V>) -> Self {
        Series { name: name.into(), values: values.into_iter().map(Into::into).collect(), kind: SeriesKind::Bar }
    }

    /// A line series (e.g. the whole process as NVML sees it, with `None` where unknown).
    pub fn line<V: Into<Option<u64>>>(name: impl Into<String>, values: impl IntoIterator<Item = V>) -> Self {
        Series { name: name.into(), values: values.into_iter().map(Into::into).collect(), kind: SeriesKind::Line }
    }
}

/// Grouped bars (and lines) of byte values per label, with an optional horizontal budget
/// line: made for peaks per notebook cell (labels `[1]`, `[2]`, …; series "allocated peak",
/// "reserved peak" as bars, "process (NVML)" as a line). Values above the budget are named in
/// the text form.
pub fn peak_bars<L: AsRef<str>>(labels: &[L], series: &[Series], budget: Option<u64>) -> Chart {
    peak_bars_with(labels, series, budget, &ChartOptions::default())
}

/// The SVG of [`peak_bars`] alone.
pub fn peak_bars_svg<L: AsRef<str>>(labels: &[L], series: &[Series], budget: Option<u64>) -> String {
    peak_bars(labels, series, budget).svg
}

/// [`peak_bars`] with options (`title` defaults to "Peak memory per cell", `x_desc` to "cell").
pub fn peak_bars_with<L: AsRef<str>>(
    labels: &[L],
    series: &[Series],
    budget: Option<u64>,
    opts: &ChartOptions,
) -> Chart {
    let labels: Vec<&str> = labels.iter().map(AsRef::as_ref).collect();
    let title = opts.title.clone().unwrap_or_else(|| "Peak memory per cell".to_string());
    let mut buf = String::new();
    let svg = match draw_peak_bars(&mut buf, &labels, series, budget, &title, opts) {
        Ok(()) => buf.replace(BUDGET_STROKE, &format!("{BUDGET_STROKE} stroke-dasharray=\"9 6\"")),
        Err(e) => error_svg(opts.width, opts.height, &title, &e),
    };
    Chart { text: describe_peaks(&labels, series, budget, &title), title, svg }
}

fn draw_peak_bars(
    buf: &mut String,
    labels: &[&str],
    series: &[Series],
    budget: Option<u64>,
    title: &str,
    opts: &ChartOptions,
) -> DrawResult {
    let (w, h) = (opts.width.max(200), opts.height.max(150));
    let root = SVGBackend::with_string(buf, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let n = labels.len().max(series.iter().map(|s| s.values.len()).max().unwrap_or(0));
    let vmax = series.iter().flat_map(|s| s.values.iter().flatten().copied()).max().unwrap_or(0);
    let top = vmax.max(budget.unwrap_or(0)).max(1);
    let (unit, div) = axis_unit(top);
    let y_top = top as f64 / div * 1.12;
    let x_desc = opts.x_desc.clone().unwrap_or_else(|| "cell".to_string());
    let mut legend: Vec<(String, Swatch)> = series
        .iter()
        .enumerate()
        .map(|(ci, s)| {
            let c = PALETTE[ci % PALETTE.len()];
            (s.name.clone(), if s.kind == SeriesKind::Bar { Swatch::Square(c) } else { Swatch::Dotted(c) })
        })
        .collect();
    if let Some(b) = budget {
        legend.push((format!("budget {}", iec(b)), Swatch::Dashed(BUDGET_COLOR)));
    }
    draw_header(&root, w, title, &legend)?;
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .margin_top(HEADER_H)
        .margin_right(24)
        .x_label_area_size(46)
        .y_label_area_size(92)
        .build_cartesian_2d(-0.5f64..(n.max(1) as f64 - 0.5), 0f64..y_top)
        .map_err(err)?;
    let y_fmt = |v: &f64| axis_label(*v, unit);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .bold_line_style(GRID_COLOR)
        .axis_style(AXIS_GRAY)
        .x_labels(0)
        .y_labels(6)
        .y_label_formatter(&y_fmt)
        .x_desc(x_desc)
        .y_desc("bytes")
        .label_style(font(LABEL_SIZE))
        .axis_desc_style(font(DESC_SIZE))
        .draw()
        .map_err(err)?;

    let (x_px, y_px) = chart.plotting_area().get_pixel_range();
    let bar_series: Vec<(usize, &Series)> =
        series.iter().enumerate().filter(|(_, s)| s.kind == SeriesKind::Bar).collect();
    let nb = bar_series.len().max(1) as f64;
    let group = 0.8;
    for (slot, (ci, s)) in bar_series.iter().enumerate() {
        let color = PALETTE[ci % PALETTE.len()];
        for (i, v) in s.values.iter().enumerate() {
            let Some(v) = v else { continue };
            let left = i as f64 - group / 2.0 + group * slot as f64 / nb;
            let right = left + group / nb;
            let (a, b) = (chart.backend_coord(&(left, *v as f64 / div)), chart.backend_coord(&(right, 0.0)));
            let (ax, bx) = (a.0, b.0.max(a.0 + 1));
            let ay = a.1.min(b.1 - 1);
            root.draw(&Rectangle::new([(ax, ay), (bx, b.1)], color.filled())).map_err(err)?;
        }
    }
    for (ci, s) in series.iter().enumerate().filter(|(_, s)| s.kind == SeriesKind::Line) {
        let color = PALETTE[ci % PALETTE.len()];
        // A line through consecutive known values; a gap (None) breaks it.
        let mut run: Vec<(i32, i32)> = Vec::new();
        let mut runs = Vec::new();
        for (i, v) in s.values.iter().enumerate() {
            match v {
                Some(v) => run.push(chart.backend_coord(&(i as f64, *v as f64 / div))),
                None => runs.push(std::mem::take(&mut run)),
            }
        }
        runs.push(run);
        for r in runs.into_iter().filter(|r| !r.is_empty()) {
            if r.len() > 1 {
                root.draw(&PathElement::new(r.clone(), color.stroke_width(2))).map_err(err)?;
            }
            if n <= 200 {
                for p in r {
                    root.draw(&Circle::new(p, 3, color.filled())).map_err(err)?;
                }
            }
        }
    }
    if let Some(b) = budget {
        let y = chart.backend_coord(&(0.0, b as f64 / div)).1;
        // One polyline, dashed afterwards (in `peak_bars_with`).
        root.draw(&PathElement::new(vec![(x_px.start, y), (x_px.end, y)], BUDGET_COLOR.stroke_width(2)))
            .map_err(err)?;
    }
    // X labels: every k-th, so they never overlap.
    let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(1).max(1) as i32;
    let slot_px = (x_px.end - x_px.start) as f64 / n.max(1) as f64;
    let need = (longest * 8 + 10) as f64;
    let every = (need / slot_px).ceil().max(1.0) as usize;
    for (i, l) in labels.iter().enumerate() {
        if i % every != 0 && i + 1 != labels.len() {
            continue;
        }
        if i + 1 == labels.len() && i % every != 0 && (i % every) * 2 < every {
            continue;
        }
        let (x, _) = chart.backend_coord(&(i as f64, 0.0));
        root.draw(&Text::new(
            l.to_string(),
            (x, y_px.end + 6),
            font(LABEL_SIZE).pos(Pos::new(HPos::Center, VPos::Top)),
        ))
        .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn describe_peaks(labels: &[&str], series: &[Series], budget: Option<u64>, title: &str) -> String {
    let name = |i: usize| labels.get(i).map_or_else(|| format!("#{i}"), |l| l.to_string());
    let mut s = format!("{title}\n");
    let n = labels.len().max(series.iter().map(|s| s.values.len()).max().unwrap_or(0));
    match n {
        0 => s.push_str("no values\n"),
        1 => s.push_str(&format!("1 label ({})\n", name(0))),
        _ => s.push_str(&format!("{n} labels ({} … {})\n", name(0), name(n - 1))),
    }
    for sr in series {
        let known: Vec<(usize, u64)> = sr.values.iter().enumerate().filter_map(|(i, v)| v.map(|v| (i, v))).collect();
        let kind = match sr.kind {
            SeriesKind::Bar => "bars",
            SeriesKind::Line => "line",
        };
        match (known.iter().min_by_key(|x| x.1), known.iter().max_by_key(|x| (x.1, std::cmp::Reverse(x.0)))) {
            (Some(&(imin, min)), Some(&(imax, max))) => s.push_str(&format!(
                "{} ({kind}): {} values, min {} at {}, max {} at {}, last {}\n",
                sr.name,
                known.len(),
                iec(min),
                name(imin),
                iec(max),
                name(imax),
                iec(known[known.len() - 1].1)
            )),
            _ => s.push_str(&format!("{} ({kind}): no values\n", sr.name)),
        }
    }
    if let Some(b) = budget {
        let over: Vec<String> = (0..n)
            .filter(|&i| series.iter().any(|sr| sr.values.get(i).copied().flatten().is_some_and(|v| v > b)))
            .map(name)
            .collect();
        if over.is_empty() {
            s.push_str(&format!("budget {}: nothing above it", iec(b)));
        } else {
            s.push_str(&format!("budget {}: above it at {}", iec(b), over.join(", ")));
        }
    } else {
        s.pop();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
        TraceEntry { action, addr, size, stream: StreamId::DEFAULT, time_us: 1, frames: None, label: 0 }
    }

    use crate::backend::StreamId;

    #[test]
    fn block_size_follows_split_rule() {
        use TraceAction::*;
        let a = 0x1000_0000;
        // 19.5 MiB in a 20 MiB segment: the 0.5 MiB rest is not split off (≤ 1 MiB).
        let t = vec![
            ev(SegmentAlloc, a, 20 * MIB),
            ev(Alloc, a, 19 * MIB + MIB / 2),
            ev(FreeRequested, a, 19 * MIB + MIB / 2),
            ev(FreeCompleted, a, 19 * MIB + MIB / 2),
            ev(Alloc, a, 3 * MIB),
            ev(Alloc, a + 3 * MIB, 1000),
        ];
        let tl = MemoryTimeline::from_trace(&t, &AllocatorConfig::default());
        assert_eq!(tl.points[2].allocated, 20 * MIB);
        assert_eq!(tl.points[3].allocated, 0);
        assert_eq!(tl.points[4].active, 0);
        assert_eq!(tl.points[5].allocated, 3 * MIB);
        // 1000 B rounds to 1024; the block is carved from the large segment's free rest, which
        // (17 MiB − 1024 B remaining) is split.
        assert_eq!(tl.points[6].allocated, 3 * MIB + 1024);
        assert_eq!(tl.last().reserved, 20 * MIB);
        assert!(tl.exact, "{:?}", tl.note);
    }

    #[test]
    fn late_trace_takes_unseen_segments_as_present() {
        use TraceAction::*;
        let t = vec![ev(FreeRequested, 0x2000, 512), ev(FreeCompleted, 0x2000, 512), ev(SegmentFree, 0x2000, 2 * MIB)];
        let tl = MemoryTimeline::from_trace(&t, &AllocatorConfig::default());
        assert_eq!(tl.points[0].reserved, 2 * MIB);
        assert_eq!(tl.points[0].allocated, 512);
        assert_eq!(tl.last().reserved, 0);
        assert_eq!(tl.estimated, 1);
        assert!(!tl.exact);
    }

    #[test]
    fn pixel_path_keeps_extremes() {
        let mut p = PixelPath::default();
        for (x, y) in [(0, 5), (0, 9), (0, 1), (0, 4), (1, 4), (1, 4)] {
            p.push((x, y));
        }
        assert_eq!(p.finish(), vec![(0, 5), (0, 9), (0, 1), (0, 4), (1, 4)]);
    }

    #[test]
    fn axis_labels() {
        assert_eq!(axis_unit(3 * GIB / 2), ("GiB", GIB as f64));
        assert_eq!(axis_label(0.0, "MiB"), "0");
        assert_eq!(axis_label(1.5, "GiB"), "1.5 GiB");
        assert_eq!(axis_label(200.0, "MiB"), "200 MiB");
    }

    #[test]
    fn peaks_text_names_budget_breaches() {
        let c = peak_bars(
            &["[1]", "[2]", "[3]"],
            &[
                Series::bars("allocated peak", [MIB, 3 * MIB, 2 * MIB]),
                Series::line("process", [None, Some(5 * MIB), None]),
            ],
            Some(4 * MIB),
        );
        assert!(
            c.text.contains("allocated peak (bars): 3 values, min 1.00 MiB at [1], max 3.00 MiB at [2]"),
            "{}",
            c.text
        );
        assert!(c.text.ends_with("budget 4.00 MiB: above it at [2]"), "{}", c.text);
        assert!(c.svg.starts_with("<svg") && c.svg.contains("budget 4.00 MiB"));
    }
}
