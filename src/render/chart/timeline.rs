//! "Memory over time": a [`MemoryTimeline`] drawn as allocated and reserved areas over the
//! event sequence, OOMs marked.

use super::*;
use crate::allocator::CachingAllocator;
use crate::device::Backend;
use crate::snapshot::{MemoryTimeline, TimelineSource};
use crate::units::{group_digits, iec};

impl MemoryTimeline {
    /// The timeline of an allocator's recorded history, under its own configuration. Only
    /// copies data out of the allocator; nothing is computed under its lock.
    pub fn of<B: Backend>(alloc: &CachingAllocator<B>) -> Self {
        let (history, config) =
            alloc.with_state(|s, _| (s.history.entries().iter().cloned().collect::<Vec<_>>(), s.config().clone()));
        let mut tl = Self::from_trace(&history, &config);
        tl.source = format!("allocator history, device {}, {}", alloc.device(), alloc.backend_kind().name());
        tl
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
            s.push_str(&format!(", over {}", crate::units::format_duration_us(last_t - t0)));
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
    let header = header_height(w, &legend);
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .margin_top(header)
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

/// Allocated and reserved bytes over the events of a trace ([`TraceEntry`](crate::TraceEntry) list, e.g.
/// `alloc.history()`, or a [`Snapshot`](crate::snapshot::Snapshot)), OOMs marked, y axis in IEC units.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixel_path_keeps_extremes() {
        let mut p = PixelPath::default();
        for (x, y) in [(0, 5), (0, 9), (0, 1), (0, 4), (1, 4), (1, 4)] {
            p.push((x, y));
        }
        assert_eq!(p.finish(), vec![(0, 5), (0, 9), (0, 1), (0, 4), (1, 4)]);
    }
}
