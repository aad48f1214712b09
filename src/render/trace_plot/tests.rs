use super::bands::*;
use super::*;
use crate::snapshot::AllocatorSettings;
use crate::units::GIB;

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
    let spans: Vec<(u64, Option<usize>, Option<usize>)> = tl.allocs.iter().map(|a| (a.size, a.start, a.end)).collect();
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
    let trace =
        vec![ev("alloc", A, 100), ev("alloc", A + 512, 50), ev("free_completed", A, 100), ev("alloc", A + 1024, 10)];
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
    let html = render_with(&snap(Vec::new(), trace.clone()), &HtmlOptions { max_bands: 5, ..HtmlOptions::default() });
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
    let blocks: Vec<BlockSnap> =
        (0..4096).map(|i| block(A + i * 512, 512, if i % 3 == 0 { "active_allocated" } else { "inactive" })).collect();
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
    assert_eq!(axis_unit(3 * GIB), ("GiB", GIB as f64));
    assert_eq!(axis_unit(100), ("B", 1.0));
}
