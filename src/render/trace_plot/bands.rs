//! The active-memory timeline of the page: allocations paired from the device trace (MemoryViz's
//! way), stacked as bands over the event index, the largest drawn on their own and the rest
//! summed, within a point budget.

use super::*;

/// Where an allocation's label and stack come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// A trace entry (the alloc, or the free of an allocation made before the trace).
    Event(usize),
    /// A block of `segments` (index into the device's segments, then into its blocks).
    Block(usize, usize),
}

/// One allocation of the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Alloc {
    pub(super) size: u64,
    pub(super) addr: u64,
    pub(super) stream: u64,
    /// Event index of the alloc; `None`: before the trace.
    pub(super) start: Option<usize>,
    /// Event index of the free_completed; `None`: still allocated at the end.
    pub(super) end: Option<usize>,
    pub(super) origin: Origin,
}

/// Allocations paired from a device trace, MemoryViz's way.
#[derive(Clone, Debug, Default)]
pub(super) struct Timeline {
    /// Length of the x axis: the number of events (at least 1).
    pub(super) n: usize,
    pub(super) allocs: Vec<Alloc>,
    /// Allocation ids in stacking order, bottom first (the ones from before the trace first).
    pub(super) order: Vec<usize>,
    /// Inserts (true) and removals in event order: (event index, allocation id, insert).
    pub(super) acts: Vec<(usize, usize, bool)>,
    /// Out-of-memory events (indices).
    pub(super) ooms: Vec<usize>,
}

impl Timeline {
    pub(super) fn build(trace: &[TraceSnap], segs: &[&Segment]) -> Self {
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
pub(super) struct Map {
    pub(super) x0: f64,
    pub(super) x1: f64,
    pub(super) ybot: f64,
    pub(super) ytop: f64,
    pub(super) n: f64,
    pub(super) ymax: f64,
}

impl Map {
    pub(super) fn x(&self, event: f64) -> f64 {
        self.x0 + (self.x1 - self.x0) * (event / self.n)
    }
    pub(super) fn y(&self, bytes: f64) -> f64 {
        self.ybot - (self.ybot - self.ytop) * (bytes / self.ymax)
    }
    pub(super) fn columns(&self) -> usize {
        ((self.x1 - self.x0).round() as usize).max(1)
    }
    pub(super) fn col(&self, event: usize) -> usize {
        let c = (event as f64 / self.n * self.columns() as f64) as usize;
        c.min(self.columns() - 1)
    }
}

/// The chart frame (background, grid, axes, tick labels) from plotters, and its pixel mapping.
pub(super) fn frame_svg(
    w: u32,
    h: u32,
    n: usize,
    ymax: u64,
    unit: (&'static str, f64),
) -> Result<(String, Map), String> {
    use plotters::prelude::*;
    let mut svg = String::new();
    let ymax_units = ymax as f64 / unit.1;
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
        let yfmt = |v: &f64| axis_label(*v, unit.0);
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
            ymax: unit.1 * ymax_units,
        };
        // Our mapping is plotters' own (to the pixel it rounds to).
        for (xv, yv) in [(0u64, 0f64), (n as u64, ymax_units), (n as u64 / 3, ymax_units / 7.0)] {
            let (px, py) = chart.backend_coord(&(xv, yv));
            debug_assert!(
                (map.x(xv as f64) - px as f64).abs() <= 1.0 && (map.y(yv * unit.1) - py as f64).abs() <= 1.0,
                "pixel mapping differs from plotters' at ({xv}, {yv}): ({px}, {py})"
            );
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok((svg, map))
}

/// A band's lower edge: (x in pixels, offset in bytes) points, simplified to the pixel grid.
pub(super) type Edge = Vec<(f64, u64)>;

/// The stack of drawn bands while sweeping the trace.
pub(super) struct Stack {
    /// Live drawn allocations, bottom first.
    pub(super) current: Vec<usize>,
    /// Each allocation's current offset (bytes below it).
    pub(super) off: Vec<u64>,
    /// Lower edges so far.
    pub(super) edges: Vec<Option<Edge>>,
    pub(super) total: u64,
}

impl Stack {
    pub(super) fn insert(&mut self, id: usize, size: u64, x: f64) {
        self.off[id] = self.total;
        self.edges[id] = Some(vec![(x, self.total)]);
        self.current.push(id);
        self.total += size;
    }
}

/// Lays out the drawn bands: their lower edges over time, and the number of polygon points.
pub(super) fn layout_bands(tl: &Timeline, drawn: &[bool], map: &Map) -> (Vec<Option<Edge>>, usize) {
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
pub(super) fn columns(tl: &Timeline, drawn: &[bool], map: &Map) -> (Vec<u64>, Vec<u64>) {
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
pub(super) fn peak(tl: &Timeline) -> u64 {
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
pub(super) fn choose(tl: &Timeline, k: usize, min_span: usize) -> Vec<bool> {
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
pub(super) fn push_point(out: &mut String, last: &mut Option<(i64, i64)>, x: f64, y: f64) {
    let q = ((x * 10.0).round() as i64, (y * 10.0).round() as i64);
    if *last == Some(q) {
        return;
    }
    *last = Some(q);
    let _ = write!(out, "{:.1},{:.1} ", q.0 as f64 / 10.0, q.1 as f64 / 10.0);
}

pub(super) fn band_title(tl: &Timeline, id: usize, trace: &[TraceSnap], segs: &[&Segment]) -> String {
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

pub(super) fn timeline_html(h: &mut String, tl: &Timeline, trace: &[TraceSnap], segs: &[&Segment], opts: &HtmlOptions) {
    let total_allocs = tl.allocs.len();
    if total_allocs == 0 {
        h.push_str(
            "<p class=\"note\">No allocations: the device trace holds no alloc or free events and no block is live. \
             Record history (<code>record_memory_history</code>) before the work to see a timeline.</p>\n",
        );
    }
    let pk = peak(tl);
    let unit = axis_unit(pk.max(1));
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
