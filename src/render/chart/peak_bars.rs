//! Peak bars: grouped bars (and lines) per label with an optional budget line, made for "peak
//! per notebook cell".

use super::*;
use crate::units::iec;

/// How a [`Series`] is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeriesKind {
    /// Bars, grouped side by side with the other bar series.
    Bar,
    /// A line with a dot per value, over the bars.
    Line,
    /// Bars stacked on the other stacked series, in their order, in one slot beside the grouped
    /// bars (parts of one whole: what is live by component).
    Stacked,
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

    /// A stacked series: its bars sit on the stacked series before it.
    pub fn stacked<V: Into<Option<u64>>>(name: impl Into<String>, values: impl IntoIterator<Item = V>) -> Self {
        Series { name: name.into(), values: values.into_iter().map(Into::into).collect(), kind: SeriesKind::Stacked }
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
    let vmax = (0..n).map(|i| stacked_total(series, i)).max().unwrap_or(0).max(vmax);
    let top = vmax.max(budget.unwrap_or(0)).max(1);
    let (unit, div) = axis_unit(top);
    let y_top = top as f64 / div * 1.12;
    let x_desc = opts.x_desc.clone().unwrap_or_else(|| "cell".to_string());
    let mut legend: Vec<(String, Swatch)> = series
        .iter()
        .enumerate()
        .map(|(ci, s)| {
            let c = PALETTE[ci % PALETTE.len()];
            (s.name.clone(), if s.kind == SeriesKind::Line { Swatch::Dotted(c) } else { Swatch::Square(c) })
        })
        .collect();
    if let Some(b) = budget {
        legend.push((format!("budget {}", iec(b)), Swatch::Dashed(BUDGET_COLOR)));
    }
    draw_header(&root, w, title, &legend)?;
    let header = header_height(w, &legend);
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .margin_top(header)
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
    let stacked = series.iter().any(|s| s.kind == SeriesKind::Stacked);
    let nb = (bar_series.len() + usize::from(stacked)).max(1) as f64;
    let group = 0.8;
    let bar = |slot: usize, i: usize, from: u64, to: u64, color: RGBColor| -> DrawResult {
        let left = i as f64 - group / 2.0 + group * slot as f64 / nb;
        let right = left + group / nb;
        let (a, b) = (chart.backend_coord(&(left, to as f64 / div)), chart.backend_coord(&(right, from as f64 / div)));
        let (ax, bx) = (a.0, b.0.max(a.0 + 1));
        let ay = a.1.min(b.1 - 1);
        root.draw(&Rectangle::new([(ax, ay), (bx, b.1)], color.filled())).map_err(err)
    };
    for (slot, (ci, s)) in bar_series.iter().enumerate() {
        for (i, v) in s.values.iter().enumerate() {
            if let Some(v) = v {
                bar(slot, i, 0, *v, PALETTE[ci % PALETTE.len()])?;
            }
        }
    }
    let mut base = vec![0u64; n];
    for (ci, s) in series.iter().enumerate().filter(|(_, s)| s.kind == SeriesKind::Stacked) {
        for (i, v) in s.values.iter().enumerate().filter(|(i, _)| *i < n) {
            if let Some(v) = v.filter(|v| *v > 0) {
                bar(bar_series.len(), i, base[i], base[i] + v, PALETTE[ci % PALETTE.len()])?;
                base[i] += v;
            }
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

/// The stacked series' sum at label `i`.
fn stacked_total(series: &[Series], i: usize) -> u64 {
    series.iter().filter(|s| s.kind == SeriesKind::Stacked).filter_map(|s| s.values.get(i).copied().flatten()).sum()
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
            SeriesKind::Stacked => "stacked",
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
    if series.iter().any(|sr| sr.kind == SeriesKind::Stacked) {
        let totals: Vec<u64> = (0..n).map(|i| stacked_total(series, i)).collect();
        if let Some((imax, max)) = totals.iter().enumerate().max_by_key(|x| (*x.1, std::cmp::Reverse(x.0))) {
            s.push_str(&format!("stacked together: max {} at {}\n", iec(*max), name(imax)));
        }
    }
    if let Some(b) = budget {
        let over: Vec<String> = (0..n)
            .filter(|&i| {
                stacked_total(series, i) > b
                    || series.iter().any(|sr| sr.values.get(i).copied().flatten().is_some_and(|v| v > b))
            })
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
    use crate::units::MIB;

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

    /// Stacked series add up per label: their sum is what breaches a budget and sets the scale.
    #[test]
    fn stacked_parts_add_up() {
        let c = peak_bars(
            &["[1]", "[2]"],
            &[
                Series::bars("all allocations peak", [3 * MIB, 3 * MIB]),
                Series::stacked("parameter", [2 * MIB, 2 * MIB]),
                Series::stacked("gradient", [0, 3 * MIB]),
            ],
            Some(4 * MIB),
        );
        assert!(c.text.contains("gradient (stacked): 2 values, min 0 B at [1], max 3.00 MiB at [2]"), "{}", c.text);
        assert!(c.text.contains("stacked together: max 5.00 MiB at [2]"), "{}", c.text);
        assert!(c.text.ends_with("budget 4.00 MiB: above it at [2]"), "{}", c.text);
        assert!(c.svg.contains("gradient") && c.svg.contains("parameter"), "the legend names the parts");
    }
}
