//! The offline HTML page: PyTorch memory_viz's "Active Memory Timeline" and a segment map, in
//! one self-contained file (inline SVG and CSS, a few optional lines of script; nothing fetched).
//!
//! # The timeline
//! It follows `MemoryViz.js` (`process_alloc_data`): an `alloc` is paired with the next
//! `free_completed` at the same address; an alloc without a free stays to the end; a
//! `free_completed` without an alloc, and an `active_allocated` block of `segments` with no
//! alloc left in the trace ("ghost" blocks), existed before the trace started. Each allocation
//! is a band of its requested size, stacked on the allocations made before it; when one under it
//! is freed, it drops by that size. x is the event index in the device trace, y bytes.
//!
//! # Large traces
//! The [`HtmlOptions::max_bands`] allocations that cover the most of the chart (size × lifetime,
//! a lifetime counting as at least one pixel column) get their own band (MemoryViz keeps its
//! `max_entries` largest by size alone, which hides long-lived weights behind short spikes); the
//! rest become one "other allocations" area on top of them, as in MemoryViz, whose
//! outline is computed per pixel column (the top of a column is its peak). Band outlines are
//! simplified to the pixel grid, so the drawing cost depends on the chart's size and the band
//! limit, not on the trace length; the page says what was merged. The segment map merges blocks
//! narrower than a pixel once the snapshot holds more than [`HtmlOptions::max_blocks`] blocks.
//!
//! The chart frame (axes, grid, tick labels) is drawn by plotters; the bands, blocks and their
//! `<title>` hover texts are written into the same `<svg>` with the same pixel mapping.

use super::{BlockSnap, Segment, Snapshot, TraceSnap};
use crate::frames::Frame;
use crate::render::escape;
use crate::units::{GIB, KIB, MIB, TIB, iec};
use std::collections::HashMap;
use std::fmt::Write as _;

/// Default number of allocations drawn as their own band.
pub const DEFAULT_MAX_BANDS: usize = 3000;
/// Default number of blocks drawn as their own rectangle in the segment map.
pub const DEFAULT_MAX_BLOCKS: usize = 20_000;
/// At most this many polygon points for all bands together; above it, fewer bands are kept.
const MAX_BAND_POINTS: usize = 600_000;
/// At most this many out-of-memory markers.
const MAX_OOM_MARKS: usize = 200;

/// Limits and labels of the page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HtmlOptions {
    /// Allocations drawn as their own band (those covering the most area: size × lifetime);
    /// the others are merged into one "other allocations" area.
    pub max_bands: usize,
    /// Above this many blocks in the snapshot, blocks narrower than a pixel are merged in the
    /// segment map.
    pub max_blocks: usize,
    /// Width of the charts in CSS pixels.
    pub width: u32,
    /// Height of the timeline in CSS pixels.
    pub height: u32,
    /// What the numbers come from, shown in the header after "allocator snapshot, device N"
    /// (for example "simulated device"); `None` for nothing more.
    pub source: Option<String>,
}

impl Default for HtmlOptions {
    fn default() -> Self {
        HtmlOptions {
            max_bands: DEFAULT_MAX_BANDS,
            max_blocks: DEFAULT_MAX_BLOCKS,
            width: 1200,
            height: 520,
            source: None,
        }
    }
}

/// A self-contained page for the snapshot, with the default options.
pub fn render(snapshot: &Snapshot) -> String {
    render_with(snapshot, &HtmlOptions::default())
}

/// A self-contained page for the snapshot.
pub fn render_with(snapshot: &Snapshot, opts: &HtmlOptions) -> String {
    let mut h = String::with_capacity(1 << 16);
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    h.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">");
    h.push_str("<title>gpumem-nb memory snapshot</title>\n<style>");
    h.push_str(CSS);
    h.push_str("</style></head>\n<body>\n<h1>gpumem-nb memory snapshot</h1>\n");
    settings_html(&mut h, snapshot);
    for device in devices(snapshot) {
        device_html(&mut h, snapshot, device, opts);
    }
    h.push_str("<script>");
    h.push_str(SCRIPT);
    h.push_str("</script>\n</body></html>\n");
    h
}

const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:16px 20px;color:#222;\
background:#fff}h1{font-size:20px;margin:0 0 6px}h2{font-size:17px;margin:18px 0 4px}h3{font-size:15px;margin:14px 0 4px}\
.source{color:#555;font-size:13px;margin:2px 0 8px}.stats{display:flex;flex-wrap:wrap;gap:6px 22px;font-size:14px;\
margin:4px 0}.stats b{font-variant-numeric:tabular-nums}.settings{font-family:ui-monospace,Menlo,Consolas,monospace;\
font-size:12px;color:#444;margin:4px 0 8px;line-height:1.5}.note{font-size:13px;color:#444;margin:4px 0;max-width:1200px}\
.warn{color:#8a4b00}svg{display:block}svg text{user-select:none}.band:hover,.block:hover,.blocks:hover,.agg:hover\
{stroke:#000;stroke-width:1}.segment:hover .segbg{stroke:#888}.info{font-size:12px;background:#f6f6f6;border:1px solid #ddd;\
padding:6px 8px;min-height:3.2em;max-width:1180px;white-space:pre-wrap;margin:6px 0}.legend span{display:inline-block;\
width:12px;height:12px;vertical-align:-2px;margin:0 4px 0 12px;border:1px solid #bbb}";

const SCRIPT: &str = "document.addEventListener('mouseover',function(e){var t=e.target;\
if(!t||!t.classList||!t.closest)return;var c=t.classList;\
if(!(c.contains('band')||c.contains('agg')||c.contains('block')||c.contains('blocks')||c.contains('oom')))return;\
var s=t.closest('section'),info=s&&s.querySelector('.info'),ti=t.querySelector('title');\
if(info&&ti)info.textContent=ti.textContent;});";

/// Colors of the bands (d3's Tableau10, as MemoryViz uses).
const PALETTE: [&str; 10] =
    ["#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f", "#edc949", "#af7aa1", "#ff9da7", "#9c755f", "#bab0ab"];
const OTHER_COLOR: &str = "#c8c8c8";
const STATE_COLORS: [(&str, &str); 3] =
    [("active_allocated", "#4e79a7"), ("active_pending_free", "#f28e2c"), ("inactive", "#e4e4e4")];

fn state_color(state: &str) -> &'static str {
    STATE_COLORS.iter().find(|(s, _)| *s == state).map_or("#bbbbbb", |(_, c)| c)
}

/// Device indices with segments or trace entries, in order (device 0 when there is nothing).
fn devices(s: &Snapshot) -> Vec<i32> {
    let mut d: Vec<i32> = s.segments.iter().map(|g| g.device).collect();
    d.extend(s.device_traces.iter().enumerate().filter(|(_, t)| !t.is_empty()).map(|(i, _)| i as i32));
    d.sort_unstable();
    d.dedup();
    if d.is_empty() {
        d.push(0);
    }
    d
}

use crate::units::group_digits as group;

fn top_frame(frames: &[Frame]) -> Option<String> {
    frames.first().map(|f| format!("{} ({}:{})", f.name, f.filename, f.line))
}

fn settings_html(h: &mut String, s: &Snapshot) {
    let a = &s.allocator_settings;
    let conf = if a.conf.is_empty() { "(unset)".to_string() } else { a.conf.clone() };
    let divisions: Vec<String> = a.roundup_power2_divisions.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    let max_split = if a.max_split_size < 0 { "unlimited".to_string() } else { iec(a.max_split_size as u64) };
    let text = format!(
        "allocator settings: GPUMEM_NB_ALLOC_CONF (PYTORCH_CUDA_ALLOC_CONF) = {conf}; max_split_size = {max_split}; \
         garbage_collection_threshold = {}; expandable_segments = {}; roundup_power2_divisions = {{{}}}; \
         pinned_num_register_threads = {}; release_lock_on_cudamalloc = {}; pinned_use_cuda_host_register = {}; \
         graph_capture_record_stream_reuse = {}",
        a.garbage_collection_threshold,
        a.expandable_segments,
        divisions.join(", "),
        a.pinned_num_register_threads,
        a.release_lock_on_cudamalloc,
        a.pinned_use_cuda_host_register,
        a.graph_capture_record_stream_reuse,
    );
    let _ = writeln!(h, "<div class=\"settings\">{}</div>", escape(&text));
}

fn device_html(h: &mut String, s: &Snapshot, device: i32, opts: &HtmlOptions) {
    let segs: Vec<&Segment> = s.segments.iter().filter(|g| g.device == device).collect();
    let trace: &[TraceSnap] =
        usize::try_from(device).ok().and_then(|d| s.device_traces.get(d)).map_or(&[], Vec::as_slice);
    let reserved: u64 = segs.iter().map(|g| g.total_size).sum();
    let allocated: u64 = segs.iter().map(|g| g.allocated_size).sum();
    let active: u64 = segs.iter().map(|g| g.active_size).sum();
    let requested: u64 = segs.iter().map(|g| g.requested_size).sum();
    let blocks: usize = segs.iter().map(|g| g.blocks.len()).sum();
    let _ = writeln!(h, "<section class=\"device\" data-device=\"{device}\"><h2>Device {device}</h2>");
    let mut source = format!("Source: allocator snapshot, device {device}");
    if let Some(extra) = &opts.source {
        let _ = write!(source, " ({extra})");
    }
    source.push_str(
        ": the caching allocator's own accounting (segments reserved from the device, blocks handed out). \
         nvidia-smi also counts the CUDA context and memory outside this allocator.",
    );
    let _ = writeln!(h, "<div class=\"source\">{}</div>", escape(&source));
    let stat = |h: &mut String, k: &str, v: String| {
        let _ = write!(h, "<span>{k}: <b>{}</b></span>", escape(&v));
    };
    h.push_str("<div class=\"stats\">");
    stat(h, "segments", group(segs.len() as u64));
    stat(h, "blocks", group(blocks as u64));
    stat(h, "events", group(trace.len() as u64));
    stat(h, "reserved", iec(reserved));
    stat(h, "allocated", iec(allocated));
    stat(h, "active", iec(active));
    stat(h, "requested", iec(requested));
    if let (Some(first), Some(last)) = (trace.first(), trace.last()) {
        let span = (last.time_us - first.time_us).max(0) as f64 / 1e6;
        stat(h, "trace span", format!("{span:.3} s"));
    }
    h.push_str("</div>\n");

    h.push_str("<h3>Active memory timeline</h3>\n");
    let tl = Timeline::build(trace, &segs);
    timeline_html(h, &tl, trace, &segs, opts);
    h.push_str(
        "<pre class=\"info\">Hover a band or a block for its details (size, address, events, label, stack).</pre>\n",
    );

    h.push_str("<h3>Segment map</h3>\n");
    segment_map_html(h, &segs, blocks, opts);
    h.push_str("</section>\n");
}

/// Where an allocation's label and stack come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// A trace entry (the alloc, or the free of an allocation made before the trace).
    Event(usize),
    /// A block of `segments` (index into the device's segments, then into its blocks).
    Block(usize, usize),
}

/// One allocation of the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Alloc {
    size: u64,
    addr: u64,
    stream: u64,
    /// Event index of the alloc; `None`: before the trace.
    start: Option<usize>,
    /// Event index of the free_completed; `None`: still allocated at the end.
    end: Option<usize>,
    origin: Origin,
}

/// Allocations paired from a device trace, MemoryViz's way.
#[derive(Clone, Debug, Default)]
struct Timeline {
    /// Length of the x axis: the number of events (at least 1).
    n: usize,
    allocs: Vec<Alloc>,
    /// Allocation ids in stacking order, bottom first (the ones from before the trace first).
    order: Vec<usize>,
    /// Inserts (true) and removals in event order: (event index, allocation id, insert).
    acts: Vec<(usize, usize, bool)>,
    /// Out-of-memory events (indices).
    ooms: Vec<usize>,
}

impl Timeline {
    fn build(trace: &[TraceSnap], segs: &[&Segment]) -> Self {
        let mut allocs: Vec<Alloc> = Vec::new();
        let mut live: HashMap<u64, usize> = HashMap::new();
        let mut acts = Vec::new();
        let mut from_frees = Vec::new();
        let mut in_trace = Vec::new();
        let mut ooms = Vec::new();
        for (i, e) in trace.iter().enumerate() {
            match (e.action, e.addr) {
                ("alloc", Some(addr)) => {
                    let id = allocs.len();
                    allocs.push(Alloc {
                        size: e.size,
                        addr,
                        stream: e.stream,
                        start: Some(i),
                        end: None,
                        origin: Origin::Event(i),
                    });
                    // An address allocated twice without a free in between: the first stays
                    // to the end, as in MemoryViz.
                    live.insert(addr, id);
                    in_trace.push(id);
                    acts.push((i, id, true));
                }
                ("free_completed", Some(addr)) => {
                    let id = match live.remove(&addr) {
                        Some(id) => {
                            allocs[id].end = Some(i);
                            id
                        }
                        None => {
                            allocs.push(Alloc {
                                size: e.size,
                                addr,
                                stream: e.stream,
                                start: None,
                                end: Some(i),
                                origin: Origin::Event(i),
                            });
                            from_frees.push(allocs.len() - 1);
                            allocs.len() - 1
                        }
                    };
                    acts.push((i, id, false));
                }
                ("oom", _) => ooms.push(i),
                _ => {}
            }
        }
        let mut ghosts = Vec::new();
        for (si, g) in segs.iter().enumerate() {
            for (bi, b) in g.blocks.iter().enumerate() {
                if b.state == "active_allocated" && !live.contains_key(&b.address) {
                    ghosts.push(allocs.len());
                    allocs.push(Alloc {
                        size: b.requested_size,
                        addr: b.address,
                        stream: g.stream,
                        start: None,
                        end: None,
                        origin: Origin::Block(si, bi),
                    });
                }
            }
        }
        // MemoryViz reverses its "initially allocated" list (frees without alloc, then ghosts):
        // the ghosts lie at the bottom, and the allocation freed first lies highest.
        let mut order: Vec<usize> = ghosts.iter().rev().chain(from_frees.iter().rev()).copied().collect();
        order.extend(in_trace);
        Timeline { n: trace.len().max(1), allocs, order, acts, ooms }
    }
}

/// Pixel mapping of the plotting area (the same as plotters' for its Cartesian coordinates).
#[derive(Clone, Copy, Debug)]
struct Map {
    x0: f64,
    x1: f64,
    ybot: f64,
    ytop: f64,
    n: f64,
    ymax: f64,
}

impl Map {
    fn x(&self, event: f64) -> f64 {
        self.x0 + (self.x1 - self.x0) * (event / self.n)
    }
    fn y(&self, bytes: f64) -> f64 {
        self.ybot - (self.ybot - self.ytop) * (bytes / self.ymax)
    }
    fn columns(&self) -> usize {
        ((self.x1 - self.x0).round() as usize).max(1)
    }
    fn col(&self, event: usize) -> usize {
        let c = (event as f64 / self.n * self.columns() as f64) as usize;
        c.min(self.columns() - 1)
    }
}

/// The chosen unit for the y axis.
fn unit_for(bytes: u64) -> (u64, &'static str) {
    match bytes {
        b if b >= TIB => (TIB, "TiB"),
        b if b >= GIB => (GIB, "GiB"),
        b if b >= MIB => (MIB, "MiB"),
        b if b >= KIB => (KIB, "KiB"),
        _ => (1, "B"),
    }
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".to_string() } else { s.to_string() }
}

/// The chart frame (background, grid, axes, tick labels) from plotters, and its pixel mapping.
fn frame_svg(w: u32, h: u32, n: usize, ymax: u64, unit: (u64, &'static str)) -> Result<(String, Map), String> {
    use plotters::prelude::*;
    let mut svg = String::new();
    let ymax_units = ymax as f64 / unit.0 as f64;
    let map;
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_right(24)
            .x_label_area_size(46)
            .y_label_area_size(90)
            .build_cartesian_2d(0u64..n as u64, 0f64..ymax_units)
            .map_err(|e| e.to_string())?;
        let xfmt = |v: &u64| group(*v);
        let yfmt = |v: &f64| format!("{} {}", trim_float(*v), unit.1);
        chart
            .configure_mesh()
            .x_desc("event index in the device trace")
            .y_desc("active memory (requested bytes)")
            .x_labels(10)
            .y_labels(10)
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .bold_line_style(RGBColor(222, 222, 222))
            .light_line_style(RGBColor(243, 243, 243))
            .axis_desc_style(("sans-serif", 15))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(|e| e.to_string())?;
        let (xr, yr) = chart.plotting_area().get_pixel_range();
        map = Map {
            x0: xr.start as f64,
            x1: (xr.end - 1) as f64,
            ybot: (yr.end - 1) as f64,
            ytop: yr.start as f64,
            n: n as f64,
            ymax: unit.0 as f64 * ymax_units,
        };
        // Our mapping is plotters' own (to the pixel it rounds to).
        for (xv, yv) in [(0u64, 0f64), (n as u64, ymax_units), (n as u64 / 3, ymax_units / 7.0)] {
            let (px, py) = chart.backend_coord(&(xv, yv));
            debug_assert!(
                (map.x(xv as f64) - px as f64).abs() <= 1.0 && (map.y(yv * unit.0 as f64) - py as f64).abs() <= 1.0,
                "pixel mapping differs from plotters' at ({xv}, {yv}): ({px}, {py})"
            );
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok((svg, map))
}

/// A band's lower edge: (x in pixels, offset in bytes) points, simplified to the pixel grid.
type Edge = Vec<(f64, u64)>;

/// The stack of drawn bands while sweeping the trace.
struct Stack {
    /// Live drawn allocations, bottom first.
    current: Vec<usize>,
    /// Each allocation's current offset (bytes below it).
    off: Vec<u64>,
    /// Lower edges so far.
    edges: Vec<Option<Edge>>,
    total: u64,
}

impl Stack {
    fn insert(&mut self, id: usize, size: u64, x: f64) {
        self.off[id] = self.total;
        self.edges[id] = Some(vec![(x, self.total)]);
        self.current.push(id);
        self.total += size;
    }
}

/// Lays out the drawn bands: their lower edges over time, and the number of polygon points.
fn layout_bands(tl: &Timeline, drawn: &[bool], map: &Map) -> (Vec<Option<Edge>>, usize) {
    let n = tl.allocs.len();
    let mut st = Stack { current: Vec::new(), off: vec![0; n], edges: vec![None; n], total: 0 };
    let x0 = map.x(0.0);
    for &id in &tl.order {
        if drawn[id] && tl.allocs[id].start.is_none() {
            st.insert(id, tl.allocs[id].size, x0);
        }
    }
    let mut points = 0usize;
    for &(i, id, ins) in &tl.acts {
        if !drawn[id] {
            continue;
        }
        let x = map.x(i as f64);
        let size = tl.allocs[id].size;
        if ins {
            st.insert(id, size, x);
            continue;
        }
        let Some(pos) = st.current.iter().rposition(|&c| c == id) else { continue };
        st.current.remove(pos);
        if let Some(e) = st.edges[id].as_mut() {
            e.push((x, st.off[id]));
            points += e.len();
        }
        for &above in &st.current[pos..] {
            let old = st.off[above];
            let new = old - size;
            st.off[above] = new;
            if let Some(e) = st.edges[above].as_mut() {
                match e.last_mut() {
                    // Several drops within half a pixel: keep the last offset only.
                    Some(last) if x - last.0 < 0.5 => last.1 = new,
                    _ => {
                        e.push((x, old));
                        e.push((x, new));
                    }
                }
            }
        }
        st.total -= size;
    }
    let xend = map.x(tl.n as f64);
    for &id in &st.current {
        if let Some(e) = st.edges[id].as_mut() {
            e.push((xend, st.off[id]));
            points += e.len();
        }
    }
    (st.edges, points * 2)
}

/// Per pixel column: the lowest drawn total and the highest total (drawn + other).
fn columns(tl: &Timeline, drawn: &[bool], map: &Map) -> (Vec<u64>, Vec<u64>) {
    let w = map.columns();
    let mut low = vec![u64::MAX; w];
    let mut high = vec![0u64; w];
    let (mut d, mut o) = (0u64, 0u64);
    for a in tl.allocs.iter().enumerate().filter(|(_, a)| a.start.is_none()).map(|(i, a)| (i, a.size)) {
        if drawn[a.0] { d += a.1 } else { o += a.1 }
    }
    let mut paint = |from: usize, to: usize, d: u64, o: u64| {
        for c in map.col(from)..=map.col(to) {
            low[c] = low[c].min(d);
            high[c] = high[c].max(d + o);
        }
    };
    let mut prev = 0usize;
    for &(i, id, ins) in &tl.acts {
        paint(prev, i, d, o);
        prev = i;
        let s = tl.allocs[id].size;
        let v = if drawn[id] { &mut d } else { &mut o };
        *v = if ins { *v + s } else { v.saturating_sub(s) };
    }
    paint(prev, tl.n, d, o);
    for l in &mut low {
        if *l == u64::MAX {
            *l = 0;
        }
    }
    (low, high)
}

/// Highest total active bytes over the trace.
fn peak(tl: &Timeline) -> u64 {
    let mut t: u64 = tl.allocs.iter().filter(|a| a.start.is_none()).map(|a| a.size).sum();
    let mut p = t;
    for &(_, id, ins) in &tl.acts {
        let s = tl.allocs[id].size;
        t = if ins { t + s } else { t.saturating_sub(s) };
        p = p.max(t);
    }
    p
}

/// Which allocations get their own band: all, or the `k` that cover the most area on the chart
/// (size × lifetime, a lifetime counting as at least `min_span` events, one pixel column), so
/// long-lived memory (weights) stays visible next to the largest short-lived spikes.
fn choose(tl: &Timeline, k: usize, min_span: usize) -> Vec<bool> {
    let n = tl.allocs.len();
    if n <= k {
        return vec![true; n];
    }
    let area = |a: &Alloc| {
        let span = a.end.unwrap_or(tl.n).saturating_sub(a.start.unwrap_or(0)).max(min_span).max(1);
        u128::from(a.size) * span as u128
    };
    let mut ids: Vec<usize> = (0..n).collect();
    let key = |&i: &usize| (std::cmp::Reverse(area(&tl.allocs[i])), std::cmp::Reverse(tl.allocs[i].size), i);
    if k > 0 {
        ids.select_nth_unstable_by_key(k - 1, key);
    }
    let mut drawn = vec![false; n];
    for &i in &ids[..k] {
        drawn[i] = true;
    }
    drawn
}

/// Appends `x,y ` to a points attribute unless it repeats the previous point (at 0.1 px).
fn push_point(out: &mut String, last: &mut Option<(i64, i64)>, x: f64, y: f64) {
    let q = ((x * 10.0).round() as i64, (y * 10.0).round() as i64);
    if *last == Some(q) {
        return;
    }
    *last = Some(q);
    let _ = write!(out, "{:.1},{:.1} ", q.0 as f64 / 10.0, q.1 as f64 / 10.0);
}

fn band_title(tl: &Timeline, id: usize, trace: &[TraceSnap], segs: &[&Segment]) -> String {
    let a = &tl.allocs[id];
    let mut t =
        format!("{} ({} bytes) requested\naddress 0x{:x}, stream {}\n", iec(a.size), group(a.size), a.addr, a.stream);
    match (a.start, a.end, a.origin) {
        (Some(s), Some(e), _) => {
            let _ = write!(t, "allocated at event {s}, freed at event {e}");
        }
        (Some(s), None, _) => {
            let _ = write!(t, "allocated at event {s}, still allocated at the end");
        }
        (None, Some(e), _) => {
            let _ = write!(t, "allocated before the trace started, freed at event {e}");
        }
        (None, None, _) => {
            t.push_str("allocated before the trace started, still allocated (a live block of the snapshot)")
        }
    }
    let (label, frames): (&str, &[Frame]) = match a.origin {
        Origin::Event(i) => {
            let e = &trace[i];
            (e.user_metadata.as_str(), e.frames.as_deref().unwrap_or(&[]))
        }
        Origin::Block(s, b) => ("", segs[s].blocks[b].frames.as_slice()),
    };
    if !label.is_empty() {
        let _ = write!(t, "\nlabel: {label}");
    }
    if let Some(f) = top_frame(frames) {
        let _ = write!(t, "\nat {f}");
    }
    t
}

fn timeline_html(h: &mut String, tl: &Timeline, trace: &[TraceSnap], segs: &[&Segment], opts: &HtmlOptions) {
    let total_allocs = tl.allocs.len();
    if total_allocs == 0 {
        h.push_str(
            "<p class=\"note\">No allocations: the device trace holds no alloc or free events and no block is live. \
             Record history (<code>record_memory_history</code>) before the work to see a timeline.</p>\n",
        );
    }
    let pk = peak(tl);
    let unit = unit_for(pk.max(1));
    let ymax = ((pk.max(1) as f64) * 1.06).ceil() as u64;
    let (frame, map) = match frame_svg(opts.width, opts.height, tl.n, ymax, unit) {
        Ok(v) => v,
        Err(e) => {
            let _ = writeln!(h, "<p class=\"warn\">The chart could not be drawn: {}</p>", escape(&e));
            return;
        }
    };
    let mut k = opts.max_bands.min(total_allocs);
    let (mut drawn, mut edges);
    loop {
        drawn = choose(tl, k, tl.n / map.columns());
        let (e, points) = layout_bands(tl, &drawn, &map);
        edges = e;
        if points <= MAX_BAND_POINTS || k <= 1 {
            break;
        }
        // Too many outlines to stay light: keep fewer bands, proportionally.
        k = (k as f64 * MAX_BAND_POINTS as f64 / points as f64 * 0.9) as usize;
        k = k.max(1);
    }
    let merged = total_allocs - k;

    let mut g = String::with_capacity(1 << 16);
    g.push_str("<g class=\"bands\">");
    if merged > 0 {
        let (low, high) = columns(tl, &drawn, &map);
        let largest_other = tl.allocs.iter().zip(&drawn).filter(|(_, d)| !**d).map(|(a, _)| a.size).max().unwrap_or(0);
        let peak_other = high.iter().zip(&low).map(|(h, l)| h - l.min(h)).max().unwrap_or(0);
        let title = format!(
            "other allocations ({} blocks): {} allocations covering less of the chart than those drawn (each at most \
             {}), merged per pixel column; the top of each column is its highest total; up to {} at once",
            group(merged as u64),
            group(merged as u64),
            iec(largest_other),
            iec(peak_other)
        );
        let _ = write!(g, "<polygon class=\"agg\" fill=\"{OTHER_COLOR}\" points=\"");
        let mut last = None;
        let cw = (map.x1 - map.x0) / map.columns() as f64;
        for (c, &v) in high.iter().enumerate() {
            let x = map.x0 + c as f64 * cw;
            push_point(&mut g, &mut last, x, map.y(v as f64));
            push_point(&mut g, &mut last, x + cw, map.y(v as f64));
        }
        for (c, &v) in low.iter().enumerate().rev() {
            let x = map.x0 + c as f64 * cw;
            push_point(&mut g, &mut last, x + cw, map.y(v as f64));
            push_point(&mut g, &mut last, x, map.y(v as f64));
        }
        let _ = write!(g, "\"><title>{}</title></polygon>", escape(&title));
    }
    for (rank, &id) in tl.order.iter().enumerate() {
        let Some(edge) = &edges[id] else { continue };
        let size = tl.allocs[id].size as f64;
        let _ = write!(g, "<polygon class=\"band\" fill=\"{}\" points=\"", PALETTE[rank % PALETTE.len()]);
        let mut last = None;
        for &(x, o) in edge {
            push_point(&mut g, &mut last, x, map.y(o as f64));
        }
        for &(x, o) in edge.iter().rev() {
            push_point(&mut g, &mut last, x, map.y(o as f64 + size));
        }
        let _ = write!(g, "\"><title>{}</title></polygon>", escape(&band_title(tl, id, trace, segs)));
    }
    g.push_str("</g>");
    if !tl.ooms.is_empty() {
        g.push_str("<g class=\"ooms\">");
        for &i in tl.ooms.iter().take(MAX_OOM_MARKS) {
            let e = &trace[i];
            let x = map.x(i as f64);
            let title = format!(
                "out of memory at event {i}: requested {} ({} bytes), device free {}",
                iec(e.size),
                group(e.size),
                e.device_free.map_or("unknown".to_string(), iec)
            );
            let _ = write!(
                g,
                "<line class=\"oom\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#d00\" \
                 stroke-width=\"2\" stroke-dasharray=\"4 3\"><title>{}</title></line>",
                map.ytop,
                map.ybot,
                escape(&title)
            );
        }
        g.push_str("</g>");
    }

    // The bands go into plotters' <svg>, after the grid (so they cover it) and before its end.
    let mut svg = frame.replacen("<svg ", "<svg class=\"timeline\" ", 1);
    match svg.rfind("</svg>") {
        Some(p) => svg.insert_str(p, &g),
        None => svg.push_str(&g),
    }
    let drawn_count = k;
    let mut note = format!(
        "{} allocations: each band is one allocation (its height is the requested size), stacked on the allocations \
         made before it; when an allocation below is freed, the bands above drop. Allocations from before the trace \
         (frees without an alloc, live blocks of the snapshot) start at the left edge.",
        group(total_allocs as u64)
    );
    if !tl.ooms.is_empty() {
        let _ = write!(note, " Dashed red lines: {} out-of-memory events.", group(tl.ooms.len() as u64));
    }
    let _ = writeln!(h, "<p class=\"note\">{}</p>", escape(&note));
    if merged > 0 {
        let text = format!(
            "Downsampled: the {} allocations covering the most of the chart (size × lifetime) are drawn as their own \
             band; the other {} allocations are merged \
             into the gray \"other allocations\" area on top (outline per pixel column, {} columns, showing each \
             column's highest total). Band outlines are simplified to the pixel grid.",
            group(drawn_count as u64),
            group(merged as u64),
            map.columns()
        );
        let _ = writeln!(h, "<p class=\"note warn downsampled\">{}</p>", escape(&text));
    }
    h.push_str(&svg);
    h.push('\n');
}

/// One rectangle of the segment map (a block, or a run of merged thin blocks).
fn block_title(b: &BlockSnap) -> String {
    let mut t = format!(
        "block {} ({} bytes) at 0x{:x}\nstate: {}\nrequested: {} ({} bytes)",
        iec(b.size),
        group(b.size),
        b.address,
        b.state,
        iec(b.requested_size),
        group(b.requested_size)
    );
    if let Some(f) = top_frame(&b.frames) {
        let _ = write!(t, "\nat {f}");
    }
    t
}

fn segment_map_html(h: &mut String, segs: &[&Segment], total_blocks: usize, opts: &HtmlOptions) {
    if segs.is_empty() {
        h.push_str("<p class=\"note\">No segments: nothing is reserved on this device.</p>\n");
        return;
    }
    let merge = total_blocks > opts.max_blocks;
    let w = opts.width as f64;
    let (label_w, bar_x) = (300.0, 306.0);
    let bar_w = (w - bar_x - 8.0).max(50.0);
    let (row_h, gap) = (16.0, 5.0);
    let height = segs.len() as f64 * (row_h + gap) + gap;
    h.push_str("<div class=\"note legend\">One row per segment (address order), blocks left to right in proportion to their size:");
    for (s, c) in STATE_COLORS {
        let _ = write!(h, "<span style=\"background:{c}\"></span>{s}");
    }
    h.push_str("</div>\n");
    let mut merged_blocks = 0usize;
    let mut body = String::new();
    for (i, g) in segs.iter().enumerate() {
        let y = gap + i as f64 * (row_h + gap);
        let seg_title = format!(
            "segment 0x{:x}: {} ({} bytes), {} pool, stream {}{}\nallocated {}, active {}, requested {}, {} blocks",
            g.address,
            iec(g.total_size),
            group(g.total_size),
            g.segment_type,
            g.stream,
            if g.is_expandable { ", expandable" } else { "" },
            iec(g.allocated_size),
            iec(g.active_size),
            iec(g.requested_size),
            group(g.blocks.len() as u64)
        );
        let label = format!("0x{:x}  {}  {}  s{}", g.address, iec(g.total_size), g.segment_type, g.stream);
        let _ = write!(
            body,
            "<g class=\"segment\" transform=\"translate(0,{y:.1})\"><title>{}</title>\
             <text x=\"{label_w}\" y=\"{:.1}\" text-anchor=\"end\" font-family=\"ui-monospace,Menlo,Consolas,monospace\" \
             font-size=\"12\" fill=\"#333\">{}</text>\
             <rect class=\"segbg\" x=\"{bar_x}\" y=\"0\" width=\"{bar_w:.1}\" height=\"{row_h}\" fill=\"#f4f4f4\" stroke=\"#ccc\" \
             stroke-width=\"0.5\"/>",
            escape(&seg_title),
            row_h - 4.0,
            escape(&label)
        );
        let scale = if g.total_size > 0 { bar_w / g.total_size as f64 } else { 0.0 };
        let mut cum = 0u64;
        // A pending run of thin blocks (merge mode): start offset, count, bytes, allocated bytes.
        let mut run: Option<(u64, usize, u64, u64)> = None;
        let flush = |body: &mut String, run: &mut Option<(u64, usize, u64, u64)>, merged: &mut usize| {
            if let Some((start, n, bytes, active)) = run.take() {
                let x = bar_x + start as f64 * scale;
                let color = if active * 2 >= bytes { state_color("active_allocated") } else { state_color("inactive") };
                let title = format!(
                    "{} blocks merged (each narrower than a pixel): {} ({} bytes), {} of it active",
                    group(n as u64),
                    iec(bytes),
                    group(bytes),
                    iec(active)
                );
                let _ = write!(
                    body,
                    "<rect class=\"blocks\" x=\"{x:.1}\" y=\"0\" width=\"{:.1}\" height=\"{row_h}\" fill=\"{color}\">\
                     <title>{}</title></rect>",
                    (bytes as f64 * scale).max(0.5),
                    escape(&title)
                );
                *merged += n;
            }
        };
        for b in &g.blocks {
            let bw = b.size as f64 * scale;
            if merge && bw < 1.0 {
                let active = if b.state == "inactive" { 0 } else { b.size };
                let r = run.get_or_insert((cum, 0, 0, 0));
                r.1 += 1;
                r.2 += b.size;
                r.3 += active;
                if r.2 as f64 * scale >= 1.0 {
                    flush(&mut body, &mut run, &mut merged_blocks);
                }
            } else {
                flush(&mut body, &mut run, &mut merged_blocks);
                let x = bar_x + cum as f64 * scale;
                let min_w = if b.state == "inactive" { 0.0 } else { 1.0 };
                let _ = write!(
                    body,
                    "<rect class=\"block\" x=\"{x:.2}\" y=\"0\" width=\"{:.2}\" height=\"{row_h}\" fill=\"{}\" \
                     stroke=\"#fff\" stroke-width=\"0.5\"><title>{}</title></rect>",
                    bw.max(min_w),
                    state_color(b.state),
                    escape(&block_title(b))
                );
            }
            cum += b.size;
        }
        flush(&mut body, &mut run, &mut merged_blocks);
        body.push_str("</g>");
    }
    if merged_blocks > 0 {
        let text = format!(
            "Downsampled: {} blocks narrower than a pixel are merged into runs (gray or blue by what most of the run is); \
             the snapshot has {} blocks, above the limit of {} drawn one by one.",
            group(merged_blocks as u64),
            group(total_blocks as u64),
            group(opts.max_blocks as u64)
        );
        let _ = writeln!(h, "<p class=\"note warn downsampled\">{}</p>", escape(&text));
    }
    let _ = writeln!(
        h,
        "<svg class=\"segments\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {} {height:.0}\">{body}</svg>",
        opts.width, opts.width
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::AllocatorSettings;

    fn settings() -> AllocatorSettings {
        AllocatorSettings {
            conf: String::new(),
            max_split_size: -1,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            pinned_num_register_threads: 1,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            graph_capture_record_stream_reuse: false,
            roundup_power2_divisions: (0..16).map(|i| ((1u64 << i).to_string(), 0)).collect(),
        }
    }

    fn ev(action: &'static str, addr: u64, size: u64) -> TraceSnap {
        let oom = action == "oom";
        TraceSnap {
            action,
            addr: (!oom).then_some(addr),
            device_free: oom.then_some(addr),
            size,
            stream: 0,
            time_us: 1_700_000_000_000_000,
            compile_context: "N/A",
            user_metadata: String::new(),
            frames: None,
        }
    }

    fn block(address: u64, size: u64, state: &'static str) -> BlockSnap {
        BlockSnap { address, size, requested_size: size, state, frames: Vec::new() }
    }

    fn segment(address: u64, blocks: Vec<BlockSnap>) -> Segment {
        let total: u64 = blocks.iter().map(|b| b.size).sum();
        let active: u64 = blocks.iter().filter(|b| b.state != "inactive").map(|b| b.size).sum();
        Segment {
            device: 0,
            address,
            total_size: total,
            allocated_size: active,
            active_size: active,
            requested_size: active,
            stream: 0,
            segment_type: "large",
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: Vec::new(),
            blocks,
        }
    }

    fn snap(segments: Vec<Segment>, trace: Vec<TraceSnap>) -> Snapshot {
        Snapshot {
            segments,
            device_traces: vec![trace],
            allocator_settings: settings(),
            external_annotations: Vec::new(),
            backend: None,
        }
    }

    fn bands(html: &str) -> usize {
        html.matches("class=\"band\"").count()
    }

    const A: u64 = 0x7f00_0000_0000;
    const MB: u64 = 1 << 20;

    #[test]
    fn one_band_per_allocation() {
        let trace = vec![
            ev("segment_alloc", A, 20 * MB),
            ev("alloc", A, 2 * MB),
            ev("alloc", A + 2 * MB, 3 * MB),
            ev("free_requested", A, 2 * MB),
            ev("free_completed", A, 2 * MB),
            ev("alloc", A + 5 * MB, MB),
            ev("snapshot", 0, 4 * MB),
        ];
        let s = snap(
            vec![segment(
                A,
                vec![
                    block(A, 2 * MB, "inactive"),
                    block(A + 2 * MB, 3 * MB, "active_allocated"),
                    block(A + 5 * MB, MB, "active_allocated"),
                    block(A + 6 * MB, 14 * MB, "inactive"),
                ],
            )],
            trace,
        );
        let html = render(&s);
        assert_eq!(bands(&html), 3);
        assert!(!html.contains("class=\"agg\"") && !html.contains("Downsampled"));
        assert_eq!(html.matches("class=\"segment\"").count(), 1);
        assert_eq!(html.matches("class=\"block\"").count(), 4);
        assert!(html.contains("<svg class=\"timeline\""));
        assert!(html.contains("2.00 MiB (2,097,152 bytes) requested"));
        assert!(html.contains("allocated at event 1, freed at event 4"));
        assert!(html.contains("allocated at event 2, still allocated at the end"));
        assert!(html.contains("address 0x7f0000200000"));
        assert!(html.contains("reserved: <b>20.00 MiB</b>") && html.contains("allocated: <b>4.00 MiB</b>"));
        assert!(html.contains("allocator snapshot, device 0"));
        assert!(html.contains("roundup_power2_divisions"));
        // Self-contained: no fetches.
        assert!(!html.contains("https://") && !html.contains("<link") && !html.contains(" src="));
    }

    #[test]
    fn pairs_by_address_across_reuse() {
        let trace = vec![
            ev("alloc", A, 100),
            ev("free_requested", A, 100),
            ev("free_completed", A, 100),
            ev("alloc", A, 200),
            ev("alloc", A + 512, 50),
            ev("free_completed", A, 200),
            ev("alloc", A, 300),
        ];
        let tl = Timeline::build(&trace, &[]);
        let spans: Vec<(u64, Option<usize>, Option<usize>)> =
            tl.allocs.iter().map(|a| (a.size, a.start, a.end)).collect();
        assert_eq!(
            spans,
            vec![(100, Some(0), Some(2)), (200, Some(3), Some(5)), (50, Some(4), None), (300, Some(6), None)]
        );
        assert_eq!(tl.order, vec![0, 1, 2, 3]);
        let html = render(&snap(Vec::new(), trace));
        assert_eq!(bands(&html), 4);
        assert!(html.contains("allocated at event 3, freed at event 5"));
        assert!(html.contains("allocated at event 6, still allocated at the end"));
    }

    #[test]
    fn bands_drop_when_an_allocation_below_is_freed() {
        let trace = vec![
            ev("alloc", A, 100),
            ev("alloc", A + 512, 50),
            ev("free_completed", A, 100),
            ev("alloc", A + 1024, 10),
        ];
        let tl = Timeline::build(&trace, &[]);
        let map = Map { x0: 0.0, x1: 400.0, ybot: 100.0, ytop: 0.0, n: 4.0, ymax: 200.0 };
        let (edges, _) = layout_bands(&tl, &[true; 3], &map);
        assert_eq!(edges[0].as_ref().unwrap(), &vec![(0.0, 0), (200.0, 0)]);
        // B sat on A (offset 100) and drops to 0 at event 2.
        assert_eq!(edges[1].as_ref().unwrap(), &vec![(100.0, 100), (200.0, 100), (200.0, 0), (400.0, 0)]);
        // C sits on B alone.
        assert_eq!(edges[2].as_ref().unwrap(), &vec![(300.0, 50), (400.0, 50)]);
        assert_eq!(peak(&tl), 150);
    }

    #[test]
    fn ghost_blocks_and_frees_without_alloc_start_at_the_left() {
        // The trace starts mid-way (a ring buffer): a free of an older block, then new work.
        let mut old_free = ev("free_completed", A + 8 * MB, 4 * MB);
        old_free.user_metadata = "older cell".into();
        let trace = vec![ev("alloc", A, MB), old_free, ev("free_completed", A, MB), ev("alloc", A + MB, 2 * MB)];
        let mut ghost = block(A + 16 * MB, 6 * MB, "active_allocated");
        ghost.requested_size = 5 * MB;
        ghost.frames = vec![Frame { name: "model::load".into(), filename: "src/model.rs".into(), line: 42 }];
        let segs = vec![segment(
            A,
            vec![
                block(A, MB, "inactive"),
                block(A + MB, 2 * MB, "active_allocated"),
                block(A + 3 * MB, 13 * MB, "inactive"),
                ghost,
                block(A + 22 * MB, 2 * MB, "active_pending_free"),
            ],
        )];
        let refs: Vec<&Segment> = segs.iter().collect();
        let tl = Timeline::build(&trace, &refs);
        // alloc A, the older free, alloc A+1MB, then the ghost (A+1MB is live in the trace: no ghost;
        // the pending-free block is not drawn, as in MemoryViz).
        assert_eq!(tl.allocs.len(), 4);
        let ghost = &tl.allocs[3];
        assert_eq!((ghost.size, ghost.start, ghost.end, ghost.origin), (5 * MB, None, None, Origin::Block(0, 3)));
        let older = &tl.allocs[1];
        assert_eq!((older.size, older.start, older.end), (4 * MB, None, Some(1)));
        // Ghosts at the bottom, then the frees without alloc, then the trace's allocations.
        assert_eq!(tl.order, vec![3, 1, 0, 2]);
        let html = render(&snap(segs, trace));
        assert_eq!(bands(&html), 4);
        assert!(html.contains("allocated before the trace started, still allocated (a live block of the snapshot)"));
        assert!(html.contains("at model::load (src/model.rs:42)"));
        assert!(html.contains("allocated before the trace started, freed at event 1\nlabel: older cell"));
        // Peak: ghost 5 + older 4 + A 1 = 10 MiB at event 0.
        assert_eq!(peak(&tl), 10 * MB);
    }

    #[test]
    fn oom_snapshot_and_segment_events_are_not_bands() {
        let trace = vec![
            ev("segment_alloc", A, 20 * MB),
            ev("segment_map", A, 2 * MB),
            ev("oom", 1 << 30, 80 << 30),
            ev("free_requested", A, MB),
            ev("snapshot", 0, 0),
            ev("segment_unmap", A, 2 * MB),
            ev("segment_free", A, 20 * MB),
        ];
        let html = render(&snap(Vec::new(), trace));
        assert_eq!(bands(&html), 0);
        assert!(html.contains("No allocations"));
        assert_eq!(html.matches("class=\"oom\"").count(), 1);
        assert!(html.contains("out of memory at event 2: requested 80.00 GiB"));
        assert!(html.contains("No segments"));
    }

    #[test]
    fn hostile_labels_and_frames_are_escaped() {
        let evil = "<script>alert('x')</script>&\"";
        let mut a = ev("alloc", A, 1000);
        a.user_metadata = evil.into();
        a.frames = Some(vec![Frame { name: evil.into(), filename: "<b>.rs".into(), line: 1 }]);
        let mut b = block(A, 1024, "active_allocated");
        b.frames = vec![Frame { name: "</title><script>x</script>".into(), filename: "f".into(), line: 2 }];
        let mut s = snap(vec![segment(A, vec![b, block(A + 1024, 2 * MB - 1024, "inactive")])], vec![a]);
        s.allocator_settings.conf = "<img onerror=x>".into();
        let html = render_with(&s, &HtmlOptions { source: Some("<i>sim</i>".into()), ..HtmlOptions::default() });
        // The only script is ours; nothing from the data opens a tag.
        assert_eq!(html.matches("<script>").count(), 1);
        assert!(!html.contains("<img") && !html.contains("<i>sim") && !html.contains("<b>.rs"));
        assert!(html.contains("label: &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"));
        assert!(html.contains("&lt;/title&gt;&lt;script&gt;x&lt;/script&gt; (f:2)"));
        assert!(html.contains("(&lt;b&gt;.rs:1)"));
        assert_eq!(bands(&html), 1);
    }

    fn many(n: u64) -> Vec<TraceSnap> {
        // n allocations of distinct sizes (1000 + i bytes), each freed right away.
        let mut t = Vec::new();
        for i in 0..n {
            t.push(ev("alloc", A + i * 4096, 1000 + i));
            t.push(ev("free_completed", A + i * 4096, 1000 + i));
        }
        t
    }

    #[test]
    fn downsampling_keeps_the_largest_and_reports_the_rest() {
        let trace = many(20);
        let html =
            render_with(&snap(Vec::new(), trace.clone()), &HtmlOptions { max_bands: 5, ..HtmlOptions::default() });
        assert_eq!(bands(&html), 5);
        assert_eq!(html.matches("class=\"agg\"").count(), 1);
        assert!(html.contains("the 5 allocations covering the most of the chart (size × lifetime) are drawn"));
        assert!(html.contains("the other 15 allocations are merged"));
        assert!(html.contains("other allocations (15 blocks)"));
        // Same lifetimes: the largest are kept, the last five (sizes 1015..1019).
        for size in 1015..1020 {
            assert!(html.contains(&format!("({} bytes) requested", group(size))), "{size}");
        }
        assert!(!html.contains("(1,014 bytes) requested"));
        // Under the limit nothing is merged.
        let html = render_with(&snap(Vec::new(), trace), &HtmlOptions { max_bands: 20, ..HtmlOptions::default() });
        assert_eq!((bands(&html), html.contains("class=\"agg\"")), (20, false));
    }

    #[test]
    fn long_lived_allocations_win_over_short_spikes() {
        // A 600-byte allocation that lives throughout, and 20 short ones of about 1000 bytes.
        let mut trace = vec![ev("alloc", A - 4096, 600)];
        trace.extend(many(20));
        let html = render_with(&snap(Vec::new(), trace), &HtmlOptions { max_bands: 5, ..HtmlOptions::default() });
        assert_eq!(bands(&html), 5);
        assert!(html.contains("600 B (600 bytes) requested"));
    }

    #[test]
    fn outlines_stay_within_the_point_budget() {
        // 1500 allocations, then 1500 long-lived ones on top, then the first 1500 freed one by
        // one across the whole chart: every free makes all long-lived bands step down.
        let mut t = Vec::new();
        for i in 0..1500u64 {
            t.push(ev("alloc", A + i * 4096, MB + i));
        }
        for i in 0..1500u64 {
            t.push(ev("alloc", A + (1 << 30) + i * 4096, 2 * MB + i));
        }
        for i in 0..1500u64 {
            t.push(ev("free_completed", A + i * 4096, MB + i));
            t.extend((0..20).map(|_| ev("snapshot", 0, 0)));
        }
        let html = render(&snap(Vec::new(), t));
        let drawn = bands(&html);
        assert!(drawn < 3000 && drawn > 50, "{drawn}");
        let points =
            html.split("points=\"").skip(1).map(|p| p.split('"').next().unwrap().split(' ').count()).sum::<usize>();
        assert!(points <= MAX_BAND_POINTS + 20_000, "{points}");
        assert!(html.contains(&format!("the other {} allocations are merged", group(3000 - drawn as u64))));
    }

    #[test]
    fn default_limit_applies_to_large_traces() {
        let n = DEFAULT_MAX_BANDS as u64 + 500;
        let html = render(&snap(Vec::new(), many(n)));
        assert_eq!(bands(&html), DEFAULT_MAX_BANDS);
        assert!(html.contains("the other 500 allocations are merged"));
    }

    #[test]
    fn aggregate_columns_show_the_peak_of_merged_allocations() {
        let trace = many(100);
        let tl = Timeline::build(&trace, &[]);
        let drawn = choose(&tl, 10, 1);
        assert_eq!(drawn.iter().filter(|d| **d).count(), 10);
        // One column per event: event 0 allocates 1000 B, event 1 frees it, event 2 allocates 1001 B.
        let map = Map { x0: 0.0, x1: tl.n as f64, ybot: 100.0, ytop: 0.0, n: tl.n as f64, ymax: 4000.0 };
        let (low, high) = columns(&tl, &drawn, &map);
        assert_eq!(low.len(), tl.n);
        assert_eq!(&high[..4], &[1000, 1000, 1001, 1001]);
        // The ten largest (the last ten) are drawn: nothing of them at the start.
        assert_eq!(low[0], 0);
        // Ten columns over the same trace: each column's top is its peak.
        let map = Map { x1: 10.0, ..map };
        let (_, high) = columns(&tl, &drawn, &map);
        assert_eq!(high.len(), 10);
        assert_eq!(high[0], 1009);
        assert!(high.iter().zip(&low).all(|(h, l)| h >= l));
    }

    #[test]
    fn segment_map_merges_thin_blocks_above_the_limit() {
        let blocks: Vec<BlockSnap> = (0..4096)
            .map(|i| block(A + i * 512, 512, if i % 3 == 0 { "active_allocated" } else { "inactive" }))
            .collect();
        let s = snap(vec![segment(A, blocks)], Vec::new());
        let html = render_with(&s, &HtmlOptions { max_blocks: 1000, ..HtmlOptions::default() });
        assert_eq!(html.matches("class=\"block\"").count(), 0);
        let runs = html.matches("class=\"blocks\"").count();
        assert!(runs > 100 && runs < 1000, "{runs}");
        assert!(html.contains("Downsampled: 4,096 blocks narrower than a pixel"));
        let html = render(&s);
        assert_eq!(html.matches("class=\"block\"").count(), 4096);
    }

    #[test]
    fn empty_snapshot_still_renders() {
        let s = Snapshot {
            segments: Vec::new(),
            device_traces: Vec::new(),
            allocator_settings: settings(),
            external_annotations: Vec::new(),
            backend: None,
        };
        let html = render(&s);
        assert!(html.contains("Device 0") && html.contains("No allocations") && html.contains("No segments"));
        assert!(html.ends_with("</html>\n"));
    }

    #[test]
    fn group_and_units() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(unit_for(3 * GIB), (GIB, "GiB"));
        assert_eq!(unit_for(100), (1, "B"));
        assert_eq!(trim_float(1.50), "1.5");
        assert_eq!(trim_float(2.0), "2");
    }
}
