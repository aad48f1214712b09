//! Reports and charts on the simulated device: exact content of the text and HTML forms, SVG
//! structure, and the chart's reconstructed totals against the allocator's own statistics
//! (also on the real PyTorch traces replayed through the allocator).

use gpumem_nb::blocks::BlockId;
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::render::chart::{self, ChartOptions, Series, memory_over_time, peak_bars, segment_map};
use gpumem_nb::render::reports::{MemoryStatsTable, MemorySummary, SegmentTable, SnapshotSummary, StatUnit};
use gpumem_nb::replay::{ReplayOptions, read_trace, replay};
use gpumem_nb::snapshot::{MemoryTimeline, TimelineSource};
use gpumem_nb::units::{GIB, KIB, MIB};
use gpumem_nb::{
    AllocatorConfig, CachingAllocator, HistoryOptions, RecordMode, StackContext, StreamId, TraceAction, TraceEntry,
};
use std::path::PathBuf;

type Sim = CachingAllocator<SimBackend>;

fn sim(capacity: u64) -> Sim {
    let a = CachingAllocator::new(SimBackend::new(0, capacity), AllocatorConfig::default());
    a.record_memory_history(RecordMode::All, usize::MAX);
    a
}

fn malloc(a: &Sim, size: u64) -> BlockId {
    a.malloc(size, StreamId::DEFAULT).expect("malloc").block.expect("block")
}

/// Where tests leave files to look at: `$CARGO_TARGET_TMPDIR/render`.
fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("render");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A small well-formedness check: every tag closes in order, attributes are quoted, text has
/// no raw `<` or `&` outside entities.
fn assert_xml_ish(svg: &str) {
    assert!(svg.starts_with("<svg "), "{}", &svg[..svg.len().min(80)]);
    assert!(svg.trim_end().ends_with("</svg>"));
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find('<') {
        let text = &rest[..i];
        for (j, _) in text.match_indices('&') {
            let ent = &text[j..];
            assert!(
                ["&lt;", "&gt;", "&amp;", "&quot;", "&apos;", "&#"].iter().any(|e| ent.starts_with(e)),
                "raw & in text: {}",
                &ent[..ent.len().min(20)]
            );
        }
        rest = &rest[i..];
        let end = rest.find('>').expect("unclosed tag");
        let tag = &rest[1..end];
        assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes in <{tag}>");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name.trim()), "mismatched </{name}>");
        } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
            stack.push(tag.split_whitespace().next().unwrap().to_string());
        }
        rest = &rest[end + 1..];
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
}

fn count(h: &str, needle: &str) -> usize {
    h.matches(needle).count()
}

/// Whether the SVG has a `<text>` element whose content is exactly `s` (plotters puts the
/// content on its own line).
fn smallest_font(svg: &str) -> f64 {
    let sizes: Vec<f64> = svg
        .split("font-size=\"")
        .skip(1)
        .map(|t| t.split('"').next().unwrap().parse::<f64>().expect("font-size is a number"))
        .collect();
    assert!(!sizes.is_empty(), "the chart has text");
    sizes.into_iter().fold(f64::INFINITY, f64::min)
}

fn has_text(svg: &str, s: &str) -> bool {
    svg.contains(&format!(">\n{}\n</text>", s))
}

/// Texts ending in `suffix`.
fn texts_ending(svg: &str, suffix: &str) -> usize {
    svg.split("</text>").filter(|t| t.trim_end().ends_with(suffix)).count()
}

/// Polylines stroked in `colour` ("#RRGGBB").
fn polylines(svg: &str, colour: &str) -> usize {
    svg.split("<polyline")
        .skip(1)
        .filter(|p| p.split('>').next().unwrap().contains(&format!("stroke=\"{colour}\"")))
        .count()
}

/// A workload touching every kind of block: small and large pools, a 19.5 MiB request that
/// takes a whole 20 MiB segment (rest ≤ 1 MiB is not split), a freed block in the middle of a
/// segment, a block awaiting another stream's events, and an `empty_cache`.
fn workload(a: &Sim) -> (Vec<BlockId>, StreamId) {
    let s2 = a.new_stream().unwrap();
    let x = malloc(a, 5 * MIB); // large segment #1, 20 MiB
    let y = malloc(a, 3 * MIB); // same segment
    let s = malloc(a, 512 * KIB); // small segment, 2 MiB
    let w = malloc(a, 19 * MIB + MIB / 2); // segment #2, taken whole
    a.free(x).unwrap(); // a 5 MiB hole in front of y
    let t = malloc(a, 1000); // 1024 B in the small segment
    a.free(w).unwrap();
    a.empty_cache().unwrap(); // segment #2 goes back
    let z = malloc(a, 40 * MIB); // segment #3, 40 MiB
    let p = malloc(a, 700 * KIB); // small
    a.record_stream(p, s2).unwrap();
    a.with_backend(|b| b.set_stream_busy(s2, true));
    a.free(p).unwrap(); // pending: its stream is busy
    (vec![y, s, t, z], s2)
}

#[test]
fn memory_summary_is_pytorch_text_and_names_source_in_html() {
    let a = sim(8 << 30);
    workload(&a);
    for abbreviated in [false, true] {
        let s = MemorySummary::of(&a, abbreviated);
        assert_eq!(s.to_string(), a.memory_summary(abbreviated));
        assert_eq!(s.text, a.memory_summary(abbreviated));
        let b = s.bundle();
        assert_eq!(b.text, a.memory_summary(abbreviated));
        let html = b.html.as_deref().unwrap();
        assert!(html.contains("allocator, device 0, simulated"), "{html}");
        assert!(html.contains("<pre"));
        assert!(html.contains("PyTorch CUDA memory summary, device ID 0"));
        let evcxr = b.to_evcxr();
        assert!(evcxr.starts_with(&format!("EVCXR_BEGIN_CONTENT text/plain\n{}\nEVCXR_END_CONTENT\n", s.text)));
        assert!(evcxr.contains("EVCXR_BEGIN_CONTENT text/html\n<div class=\"gpumem-summary\">"));
    }
    let from_map = MemorySummary::from_stats(&a.memory_stats(), 0, a.backend_kind(), false);
    assert_eq!(from_map.text, a.memory_summary(false));
    std::fs::write(out_dir().join("summary.html"), MemorySummary::of(&a, false).to_html()).unwrap();
}

#[test]
fn stats_table_shows_exact_iec_numbers() {
    let a = sim(8 << 30);
    let x = malloc(&a, 5 * MIB);
    let _y = malloc(&a, 512 * KIB);
    a.free(x).unwrap();
    let t = MemoryStatsTable::of(&a);
    assert_eq!(t.stats().len(), 122);
    assert_eq!(t.get("allocated_bytes.all.peak"), Some((5 * MIB + 512 * KIB) as i64));
    let rows = t.table().rows;
    let row = |label: &str| rows.iter().find(|r| r[0] == label).unwrap_or_else(|| panic!("{label}: {rows:?}")).clone();
    assert_eq!(row("allocated"), ["allocated", "512.00 KiB", "5.50 MiB"]);
    assert_eq!(row("reserved"), ["reserved", "22.00 MiB", "22.00 MiB"]);
    assert_eq!(row("active"), ["active", "512.00 KiB", "5.50 MiB"]);
    assert_eq!(row("requested"), ["requested", "512.00 KiB", "5.50 MiB"]);
    assert_eq!(row("inactive split (non-releasable)"), ["inactive split (non-releasable)", "1.50 MiB", "16.50 MiB"]);
    assert_eq!(row("segments"), ["segments", "2", "2"]);
    assert_eq!(row("allocations"), ["allocations", "1", "2"]);
    assert_eq!(row("OOMs"), ["OOMs", "0", ""]);
    assert_eq!(row("allocation retries"), ["allocation retries", "0", ""]);
    assert_eq!(row("device allocations"), ["device allocations", "2", ""]);
    assert_eq!(row("device frees"), ["device frees", "0", ""]);
    // Raw bytes in the data.
    let r = &t.rows()[0];
    assert_eq!((r.current, r.peak, r.unit), ((512 * KIB) as i64, Some((5 * MIB + 512 * KIB) as i64), StatUnit::Bytes));

    let text = t.to_string();
    assert!(text.ends_with(&t.caption()), "{text}");
    assert!(t.caption().contains("allocator, device 0, simulated"));
    let b = t.bundle();
    let html = b.html.as_deref().unwrap();
    assert!(html.contains("text-align:right;padding:2px 8px;vertical-align:top\">5.50\u{a0}MiB</td>"), "{html}");
    let evcxr = b.to_evcxr();
    assert!(evcxr.contains("EVCXR_BEGIN_CONTENT text/plain\n") && evcxr.contains("EVCXR_BEGIN_CONTENT text/html\n"));
}

#[test]
fn segment_table_rows_and_totals() {
    let a = sim(8 << 30);
    let (_, s2) = workload(&a);
    let views = a.segments();
    let t = SegmentTable::of(&a);
    assert_eq!(t.rows.len(), views.len());
    assert_eq!(t.rows.len(), 3);
    let tot = t.totals();
    assert_eq!(tot.total, a.memory_reserved());
    assert_eq!(tot.allocated, a.memory_allocated());
    assert_eq!(tot.active as i64, a.memory_stats()["active_bytes.all.current"]);
    assert_eq!(tot.free, tot.total - tot.active);
    // Segment #1: 5 MiB hole, y (3 MiB), 12 MiB tail.
    let seg1 = &t.rows[0];
    assert_eq!((seg1.pool, seg1.total, seg1.allocated, seg1.blocks), ("large", 20 * MIB, 3 * MIB, 3));
    assert_eq!((seg1.free, seg1.largest_free), (17 * MIB, 12 * MIB));
    // The small segment: 512 KiB and 1024 B allocated, 700 KiB pending on the busy stream.
    let small = t.rows.iter().find(|r| r.pool == "small").unwrap();
    assert_eq!(small.allocated, 512 * KIB + 1024);
    assert_eq!(small.active, 512 * KIB + 1024 + 700 * KIB);
    assert_eq!(small.stream, 0);

    let table = t.table();
    assert_eq!(table.rows.len(), 4, "3 segments + totals");
    assert_eq!(table.rows[0][0], format!("{:#x}", views[0].address));
    assert_eq!(
        &table.rows[0][1..],
        ["large", "default", "20.00 MiB", "3.00 MiB", "3.00 MiB", "17.00 MiB", "3", "12.00 MiB"]
    );
    let last = table.rows.last().unwrap();
    assert_eq!(last[0], "total");
    assert_eq!(last[3], gpumem_nb::units::iec(a.memory_reserved()));
    let text = t.to_string();
    assert!(text.contains("3 segments — allocator, device 0, simulated"), "{text}");
    assert_eq!(count(&t.bundle().html.unwrap(), "<tr"), 5);

    // The same numbers from a snapshot.
    let snap = a.snapshot();
    let from_snap = SegmentTable::from_snapshot(&snap);
    assert_eq!(from_snap.rows, t.rows);
    assert!(from_snap.caption().contains("snapshot, device 0"));
    let _ = s2;
    std::fs::write(out_dir().join("segments.html"), t.bundle().html.unwrap()).unwrap();
}

#[test]
fn timeline_totals_match_the_allocator() {
    let a = sim(8 << 30);
    let (live, s2) = workload(&a);
    let check = |a: &Sim| {
        let tl = MemoryTimeline::of(a);
        assert!(tl.exact, "{:?}", tl.note);
        assert_eq!(tl.last().allocated, a.memory_allocated());
        assert_eq!(tl.last().reserved, a.memory_reserved());
        assert_eq!(tl.last().active as i64, a.memory_stats()["active_bytes.all.current"]);
        assert_eq!(tl.last().requested as i64, a.memory_stats()["requested_bytes.all.current"]);
        assert_eq!(tl.peak_allocated().allocated, a.max_memory_allocated());
        assert_eq!(tl.peak_reserved().reserved, a.max_memory_reserved());
        // The same from the plain history and from a snapshot.
        let from_history = TimelineSource::timeline(&a.history());
        assert_eq!(from_history.points, tl.points);
        let snap = MemoryTimeline::from_snapshot(&a.snapshot());
        assert!(snap.exact, "{:?}", snap.note);
        assert_eq!(snap.last().allocated, a.memory_allocated());
    };
    check(&a);
    // The pending block completes; everything is freed and the cache emptied.
    a.with_backend(|b| b.set_stream_busy(s2, false));
    for b in live {
        a.free(b).unwrap();
    }
    check(&a);
    a.empty_cache().unwrap();
    check(&a);
    assert_eq!(a.memory_reserved(), 0);
}

#[test]
fn timeline_survives_a_late_start_with_a_snapshot() {
    let a = sim(8 << 30);
    a.record_memory_history(RecordMode::Off, 0);
    let before = malloc(&a, 7 * MIB);
    let _kept = malloc(&a, 100 * KIB);
    a.record_memory_history(RecordMode::All, usize::MAX);
    let x = malloc(&a, 2 * MIB);
    a.free(before).unwrap();
    a.free(x).unwrap();
    let _y = malloc(&a, 30 * MIB);
    let tl = MemoryTimeline::from_snapshot(&a.snapshot());
    assert_eq!(tl.last().allocated, a.memory_allocated());
    assert_eq!(tl.last().reserved, a.memory_reserved());
    // The 7 MiB block was alive before recording: its size is estimated from its request.
    assert_eq!(tl.points[0].allocated, 7 * MIB + 100 * KIB);
    assert_eq!(tl.points[0].reserved, 22 * MIB);
}

#[test]
fn real_traces_replayed_give_the_same_totals_and_peaks() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/traces");
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".trace.tsv.gz"))
        .collect();
    names.sort();
    assert!(names.len() >= 3);
    for path in names {
        let events = read_trace(&path).unwrap();
        let opts = ReplayOptions { keep_history: true, ..ReplayOptions::default() };
        let rep = replay(&events, &opts, &path.to_string_lossy()).unwrap();
        let tl = MemoryTimeline::from_trace(&rep.history, &opts.config);
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        assert!(tl.exact, "{name}: {:?}", tl.note);
        assert_eq!(tl.events(), rep.history.len());
        assert_eq!(tl.last().allocated as i64, rep.stats["allocated_bytes.all.current"], "{name}");
        assert_eq!(tl.last().reserved as i64, rep.stats["reserved_bytes.all.current"], "{name}");
        assert_eq!(tl.peak_allocated().allocated as i64, rep.allocated_peak, "{name}");
        assert_eq!(tl.peak_reserved().reserved as i64, rep.reserved_peak, "{name}");
        let snap = rep.snapshot();
        let c = memory_over_time(&snap);
        assert_xml_ish(&c.svg);
        assert!(c.svg.len() < 160 * 1024, "{name}: {} bytes", c.svg.len());
        if name.starts_with("gpt2") {
            c.save_svg(out_dir().join("timeline_gpt2.svg")).unwrap();
            segment_map(&snap).save_svg(out_dir().join("segments_gpt2.svg")).unwrap();
            std::fs::write(out_dir().join("snapshot_gpt2.txt"), SnapshotSummary::of(&snap).to_string()).unwrap();
        }
    }
}

#[test]
fn memory_chart_svg_structure_and_oom_marks() {
    let a = sim(64 * MIB);
    let x = malloc(&a, 12 * MIB);
    let y = malloc(&a, 30 * MIB);
    assert!(a.malloc(40 * MIB, StreamId::DEFAULT).is_err());
    a.free(x).unwrap();
    let _z = malloc(&a, MIB / 2);
    a.free(y).unwrap();
    let hist = a.history();
    let ooms = hist.iter().filter(|e| e.action == TraceAction::Oom).count();
    assert_eq!(ooms, 1);
    let c = memory_over_time(&hist);
    c.save_svg(out_dir().join("timeline_oom.svg")).unwrap();
    assert_xml_ish(&c.svg);
    // Two series (reserved, allocated): a filled polygon and a line each; one OOM line.
    assert_eq!(count(&c.svg, "<polygon"), 2);
    assert_eq!(polylines(&c.svg, "#FF7F0E"), 1);
    assert_eq!(polylines(&c.svg, "#1F77B4"), 1);
    assert_eq!(polylines(&c.svg, "#D62728"), 1);
    assert!(has_text(&c.svg, "OOM"), "OOM label");
    // y axis ticks in IEC units, axis descriptions, legend with exact maxima.
    assert!(texts_ending(&c.svg, " MiB") >= 3);
    assert!(has_text(&c.svg, "bytes") && has_text(&c.svg, "event"));
    let max_alloc = gpumem_nb::units::iec(a.max_memory_allocated());
    assert!(has_text(&c.svg, &format!("allocated (max {max_alloc})")), "{max_alloc}");
    // The chart is drawn 640 wide so that it reads at a notebook's width: its smallest text is at
    // least 15 units, 10.4 px when JupyterLab scales it into a 900 px window (the browser test
    // measures that).
    let smallest = smallest_font(&c.svg);
    assert!(smallest >= 15.0, "readable label size: smallest text {smallest}");
    // The text form.
    assert!(c.text.starts_with("Memory over time — allocator history\n"), "{}", c.text);
    assert!(c.text.contains(&format!("{} events, {} points", hist.len(), hist.len() + 1)));
    assert!(c.text.contains(&format!("max {max_alloc}")));
    assert!(c.text.contains("OOMs: 1 (at events "));
    assert!(c.text.contains("exact"));
    let b = c.bundle();
    // The HTML form is the same chart inline, scaled to its box and in the theme's colours.
    let html = b.html.as_deref().unwrap();
    assert!(html.contains("<svg viewBox=") && html.contains("class=\"gpumem-chart\" width=\"100%\""), "{html:.300}");
    assert!(html.contains("var(--jp-layout-color0,#fff)"), "{html:.300}");
    let ev = b.to_evcxr();
    assert!(ev.contains("EVCXR_BEGIN_CONTENT text/plain\nMemory over time"));
    assert!(ev.contains("EVCXR_BEGIN_CONTENT image/svg+xml\n<svg "));
    assert_eq!(c.to_string(), c.text);
    c.save_svg(out_dir().join("timeline_oom.svg")).unwrap();
}

#[test]
fn hundred_thousand_events_stay_small() {
    // A synthetic trace: a sawtooth of allocations in one big segment.
    let base = 0x7f00_0000_0000u64;
    let mut t = vec![TraceEntry {
        action: TraceAction::SegmentAlloc,
        addr: base,
        size: GIB,
        stream: StreamId::DEFAULT,
        time_us: 1_000_000,
        frames: None,
        label: 0,
    }];
    let mut live = Vec::new();
    let mut off = 0u64;
    for i in 0..70_000u64 {
        let e = |action, addr, size| TraceEntry {
            action,
            addr,
            size,
            stream: StreamId::DEFAULT,
            time_us: 1_000_000 + i as i64,
            frames: None,
            label: 0,
        };
        if i % 200 < 150 && off + 2 * MIB < GIB {
            t.push(e(TraceAction::Alloc, base + off, 2 * MIB));
            live.push(base + off);
            off += 2 * MIB;
        } else if let Some(addr) = live.pop() {
            t.push(e(TraceAction::FreeRequested, addr, 2 * MIB));
            t.push(e(TraceAction::FreeCompleted, addr, 2 * MIB));
            off = addr - base;
        }
    }
    assert!(t.len() >= 90_000);
    let tl = MemoryTimeline::from_trace(&t, &AllocatorConfig::default());
    assert!(tl.exact, "{:?}", tl.note);
    assert_eq!(tl.last().allocated, live.len() as u64 * 2 * MIB);
    let c = memory_over_time(&tl);
    assert_xml_ish(&c.svg);
    assert!(c.svg.len() < 120 * 1024, "{} bytes", c.svg.len());
    // Downsampled: a polyline has at most ~4 points per pixel column.
    let line = c.svg.split("<polyline").nth(1).unwrap();
    let pts = line.split("points=\"").nth(1).unwrap().split('"').next().unwrap().split_whitespace().count();
    assert!(pts <= 4 * 900, "{pts} points");
    c.save_svg(out_dir().join("timeline_100k.svg")).unwrap();
}

#[test]
fn segment_map_colours_blocks_by_state() {
    let a = sim(8 << 30);
    workload(&a);
    let snap = a.snapshot();
    let c = segment_map(&snap);
    assert_xml_ish(&c.svg);
    assert!(c.title.starts_with("Segments — snapshot, device 0"));
    for s in &snap.segments {
        assert!(c.svg.contains(&format!("{:#x}", s.address)));
    }
    // allocated (blue), pending free (orange), inactive (grey) all present.
    for colour in ["#4E79A7", "#F28E2B", "#E2E2E2"] {
        assert!(c.svg.contains(colour), "{colour}");
    }
    assert!(c.text.contains("3 segments, 62.00 MiB reserved"), "{}", c.text);
    assert!(c.text.contains("pending free (700.00 KiB)"), "{}", c.text);
    assert!(c.text.contains("largest inactive block: 12.00 MiB"), "{}", c.text);
    // Many segments: capped rows with a note.
    let many = chart::segment_map_with(&snap, &ChartOptions { max_rows: 2, ..Default::default() });
    assert!(many.svg.contains("1 more segments"));
    c.save_svg(out_dir().join("segments.svg")).unwrap();
}

#[test]
fn peak_bars_for_cells_with_budget() {
    let labels: Vec<String> = (1..=12).map(|i| format!("[{i}]")).collect();
    let alloc: Vec<u64> = (1..=12u64).map(|i| i * 512 * MIB).collect();
    let reserved: Vec<u64> = alloc.iter().map(|v| v + 256 * MIB).collect();
    let process: Vec<Option<u64>> =
        reserved.iter().enumerate().map(|(i, v)| (i != 4).then_some(v + 600 * MIB)).collect();
    let series = [
        Series::bars("allocated peak", alloc.clone()),
        Series::bars("reserved peak", reserved),
        Series::line("process (NVML)", process),
    ];
    let c = peak_bars(&labels, &series, Some(5 * GIB));
    c.save_svg(out_dir().join("peaks.svg")).unwrap();
    assert_xml_ish(&c.svg);
    assert!(has_text(&c.svg, "[1]") && has_text(&c.svg, "[12]"));
    assert!(has_text(&c.svg, "budget 5.00 GiB") && c.svg.contains("stroke-dasharray"));
    assert!(texts_ending(&c.svg, " GiB") >= 3);
    // Two line pieces around the gap at [5], and the budget line.
    assert_eq!(polylines(&c.svg, "#2CA02C"), 2);
    assert_eq!(polylines(&c.svg, "#D62729"), 1);
    // 24 bars + 2 legend squares + 1 line legend in the series colours.
    assert_eq!(count(&c.svg, "fill=\"#1F77B4\""), 13);
    assert_eq!(count(&c.svg, "fill=\"#FF7F0E\""), 13);
    assert!(c.text.contains("12 labels ([1] … [12])"), "{}", c.text);
    assert!(
        c.text.contains("allocated peak (bars): 12 values, min 512.00 MiB at [1], max 6.00 GiB at [12]"),
        "{}",
        c.text
    );
    assert!(c.text.contains("process (NVML) (line): 11 values"), "{}", c.text);
    assert!(c.text.contains("budget 5.00 GiB: above it at [9], [10], [11], [12]"), "{}", c.text);
    let ev = c.bundle().to_evcxr();
    assert!(ev.contains("EVCXR_BEGIN_CONTENT text/plain\n") && ev.contains("EVCXR_BEGIN_CONTENT image/svg+xml\n"));
    c.save_svg(out_dir().join("peaks.svg")).unwrap();

    // Many cells: labels thinned out, no budget.
    let labels: Vec<String> = (1..=150).map(|i| format!("[{i}]")).collect();
    let vals: Vec<u64> = (0..150u64).map(|i| (i % 17) * 100 * MIB).collect();
    let c = peak_bars(&labels, &[Series::bars("allocated peak", vals)], None);
    assert_xml_ish(&c.svg);
    assert!(count(&c.svg, ">\n[") < 60);
    assert!(!c.text.contains("budget"));
    c.save_svg(out_dir().join("peaks_150.svg")).unwrap();
}

#[test]
fn snapshot_summary_counts_and_largest_blocks() {
    let a = sim(8 << 30);
    a.record_memory_history_with(HistoryOptions {
        enabled: RecordMode::All,
        context: StackContext::All,
        max_entries: usize::MAX,
    });
    a.set_label(Some("cell 3"));
    let big = malloc(&a, 64 * MIB);
    a.set_label(Some("cell 4"));
    let mid = malloc(&a, 3 * MIB);
    let small = malloc(&a, 4000);
    a.set_label(None);
    a.free(mid).unwrap();
    let snap = a.snapshot();
    let s = SnapshotSummary::of(&snap);
    assert_eq!(s.devices, [0]);
    assert_eq!((s.segments, s.small_segments, s.large_segments), (3, 1, 2));
    assert_eq!(s.reserved, a.memory_reserved());
    assert_eq!(s.states[0].state, "active_allocated");
    assert_eq!((s.states[0].blocks, s.states[0].bytes), (2, 64 * MIB + 4096));
    assert_eq!(s.states[1].blocks, 0);
    let ev = |name: &str| s.events.iter().find(|(a, _)| a == name).map(|(_, n)| *n);
    assert_eq!(ev("alloc"), Some(3));
    assert_eq!(ev("free_requested"), Some(1));
    assert_eq!(ev("free_completed"), Some(1));
    assert_eq!(ev("segment_alloc"), Some(3));
    assert_eq!(ev("snapshot"), snap.device_traces[0].iter().any(|e| e.action == "snapshot").then_some(1));
    assert_eq!(ev("oom"), None);
    assert_eq!(s.num_events(), snap.num_events());
    assert_eq!(s.live_blocks, 2);
    assert_eq!(s.largest[0].size, 64 * MIB);
    assert_eq!(s.largest[0].label, "cell 3");
    assert_eq!(s.largest[1].label, "cell 4");
    assert_eq!(s.largest[1].requested, 4000);
    let frame = s.largest[0].top_frame.clone().expect("frames were recorded");
    assert!(!frame.starts_with("gpumem_nb::"), "{frame}");
    let text = s.to_string();
    assert!(
        text.starts_with("Snapshot, device 0: 3 segments (1 small, 2 large), 86.00 MiB reserved, 2 live blocks"),
        "{text}"
    );
    assert!(text.contains("64.00 MiB") && text.contains("cell 3") && text.contains("events from "), "{text}");
    let html = s.bundle().html.unwrap();
    assert!(html.contains("text-align:left;padding:2px 8px;vertical-align:top\">cell 3</td>"), "{html}");
    let _ = (big, small);
    std::fs::write(out_dir().join("snapshot_summary.html"), html).unwrap();
    std::fs::write(out_dir().join("snapshot_summary.txt"), text).unwrap();
}

#[test]
fn empty_inputs_still_render() {
    let a = sim(8 << 30);
    let c = memory_over_time(&a.history());
    assert_xml_ish(&c.svg);
    assert!(c.text.contains("0 events, 1 points"), "{}", c.text);
    let snap = a.snapshot();
    let m = segment_map(&snap);
    assert_xml_ish(&m.svg);
    assert!(has_text(&m.svg, "no segments"));
    assert!(SegmentTable::from_snapshot(&snap).to_string().contains("0 segments"));
    let s = SnapshotSummary::of(&snap);
    assert_eq!((s.segments, s.live_blocks), (0, 0));
    assert!(s.to_string().starts_with("Snapshot: 0 segments"), "{s}");
    let p = peak_bars::<&str>(&[], &[], None);
    assert_xml_ish(&p.svg);
    assert!(p.text.contains("no values"));
    for svg in [&c.svg, &m.svg, &p.svg] {
        assert!(!svg.contains("cannot draw"), "{svg}");
    }
}

#[test]
fn every_report_speaks_evcxr() {
    let a = sim(8 << 30);
    workload(&a);
    let snap = a.snapshot();
    let bundles = [
        ("text/html", MemorySummary::of(&a, true).bundle()),
        ("text/html", MemoryStatsTable::of(&a).bundle()),
        ("text/html", SegmentTable::of(&a).bundle()),
        ("text/html", SnapshotSummary::of(&snap).bundle()),
        ("image/svg+xml", memory_over_time(&snap).bundle()),
        ("image/svg+xml", segment_map(&snap).bundle()),
        ("image/svg+xml", peak_bars(&["[1]"], &[Series::bars("allocated peak", [MIB])], None).bundle()),
    ];
    for (rich, b) in bundles {
        let out = b.to_evcxr();
        assert!(out.starts_with("EVCXR_BEGIN_CONTENT text/plain\n"), "{out}");
        assert!(!b.text.is_empty());
        assert!(out.contains(&format!("EVCXR_END_CONTENT\nEVCXR_BEGIN_CONTENT {rich}\n")), "{rich}");
        assert_eq!(out.matches("EVCXR_BEGIN_CONTENT").count(), out.matches("EVCXR_END_CONTENT").count());
    }
}
