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

use crate::record::frames::Frame;
use crate::render::{axis_label, axis_unit, escape};
use crate::snapshot::{BlockSnap, Segment, Snapshot, TraceSnap};
use crate::units::iec;
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

mod bands;
mod segments;

use bands::{Timeline, timeline_html};
use segments::segment_map_html;

#[cfg(test)]
mod tests;
