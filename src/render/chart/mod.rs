//! Charts as self-contained SVG (plotters' SVG backend; text stays SVG `<text>`, so no fonts
//! are embedded or fetched), each wrapped in a [`Chart`] that carries a `text/plain` summary of
//! the data next to the `image/svg+xml`.
//!
//! - [`memory_over_time`]: allocated and reserved bytes stepping over the event sequence of a
//!   trace ([`TraceEntry`](crate::TraceEntry) list or [`Snapshot`](crate::snapshot::Snapshot)), OOMs marked. The running totals come from
//!   [`crate::snapshot::MemoryTimeline`], which replays the trace's geometry (see there for what is exact).
//! - [`segment_map`]: one bar per segment, blocks coloured by state.
//! - [`peak_bars`]: grouped bars (and optional lines) per label with an optional budget line;
//!   made for "peak per notebook cell" (x = cells; allocated peak, reserved peak, process total).
//!
//! Each `*_svg` function returns the SVG string alone. Long traces are downsampled to the plot
//! width (per pixel column: first, lowest, highest and last value, so no peak is lost), which
//! keeps a chart of 100k events well under 100 KiB.

mod peak_bars;
mod segment_map;
mod timeline;

pub use peak_bars::{Series, SeriesKind, peak_bars, peak_bars_svg, peak_bars_with};
pub use segment_map::{segment_map, segment_map_svg, segment_map_with};
pub use timeline::{memory_over_time, memory_over_time_svg, memory_over_time_with};

use super::{MimeBundle, axis_label, axis_unit};
use crate::snapshot::TimelinePoint;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
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

    /// Text, the chart as HTML (the SVG inline, in the theme's colours, scaled to the output
    /// area: [`svg_html`]) and the SVG itself (for viewers that show images only).
    pub fn bundle(&self) -> MimeBundle {
        MimeBundle::text(self.text.clone()).with_html(svg_html(&self.svg)).with_svg(self.svg.clone())
    }

    /// Writes the SVG to `path`.
    pub fn save_svg(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        std::fs::write(path, &self.svg)
    }
}

/// The colours plotters writes for the parts of a chart that are not data, and the JupyterLab
/// theme variable each becomes inline (the same colour as the fallback).
const THEMED: [(&str, &str, &str); 8] = [
    ("fill", "#FFFFFF", "var(--jp-layout-color0,#fff)"),
    ("stroke", "#FFFFFF", "var(--jp-layout-color0,#fff)"),
    ("fill", "#000000", "var(--jp-ui-font-color1,#000)"),
    ("stroke", "#000000", "var(--jp-ui-font-color1,#000)"),
    ("fill", "#5A5A5A", "var(--jp-ui-font-color2,#5a5a5a)"),
    ("stroke", "#5A5A5A", "var(--jp-ui-font-color2,#5a5a5a)"),
    ("stroke", "#E8E8E8", "var(--jp-border-color2,#e8e8e8)"),
    ("fill", "#E2E2E2", "var(--jp-border-color2,#e2e2e2)"),
];

/// A chart's SVG to put inline in HTML: it scales to the width of what holds it (its `viewBox`,
/// `width="100%"`, never wider than drawn) and takes JupyterLab's theme colours for background,
/// text, axes and grid (a `<style>` scoped to the chart, with the drawn colours as fallbacks), so
/// light, dark and high-contrast themes read. The data colours stay. Shown as an image
/// (`image/svg+xml`), the same SVG keeps its drawn colours: JupyterLab draws SVG images in an
/// `<img>`, which page styles do not reach.
pub fn svg_html(svg: &str) -> String {
    let Some(end) = svg.find('>') else { return String::new() };
    let head = &svg[..end];
    let attr = |name: &str| -> Option<&str> {
        let at = head.find(&format!(" {name}=\""))? + name.len() + 3;
        head[at..].split('"').next()
    };
    let width = attr("width").unwrap_or("900").to_string();
    let mut open = head.to_string();
    for name in ["width", "height"] {
        if let Some(v) = attr(name) {
            open = open.replacen(&format!(" {name}=\"{v}\""), "", 1);
        }
    }
    let style: String = THEMED.iter().map(|(a, c, v)| format!("svg.gpumem-chart [{a}=\"{c}\"]{{{a}:{v}}}")).collect();
    format!(
        "<div class=\"gpumem-chart-box\" style=\"max-width:{width}px\">{open} class=\"gpumem-chart\" width=\"100%\" \
         style=\"display:block;height:auto\" role=\"img\"><style>{style}</style>{}</div>",
        &svg[end + 1..]
    )
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
        ChartOptions { width: 640, height: 400, title: None, x_desc: None, max_rows: 48 }
    }
}

// Fonts: plotters writes `font-size = size / 1.24` into the SVG, so 19 gives ~15.3 px: drawn
// 640 wide and scaled to a narrow notebook's output area (about 430 px in a 900 px window with
// the file browser open), text stays above 10 px.
pub(super) const FONT: &str = "sans-serif";
pub(super) const TITLE_SIZE: f64 = 22.0;
pub(super) const LABEL_SIZE: f64 = 19.0;
pub(super) const DESC_SIZE: f64 = 19.0;
pub(super) const SMALL_SIZE_FONT: f64 = 19.0;

pub(super) const ALLOCATED_COLOR: RGBColor = RGBColor(31, 119, 180);
pub(super) const RESERVED_COLOR: RGBColor = RGBColor(255, 127, 14);
pub(super) const OOM_COLOR: RGBColor = RGBColor(214, 39, 40);
/// Used for the budget line only, so the line can be found and dashed in the SVG text.
pub(super) const BUDGET_COLOR: RGBColor = RGBColor(214, 39, 41);
pub(super) const BUDGET_STROKE: &str = "stroke=\"#D62729\"";
pub(super) const GRID_COLOR: RGBColor = RGBColor(232, 232, 232);
pub(super) const AXIS_GRAY: RGBColor = RGBColor(90, 90, 90);
/// Series colours for [`peak_bars`], in order: each series its own (Tableau's 10 and four more,
/// none the budget's red).
pub(super) const PALETTE: [RGBColor; 14] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(127, 127, 127),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(197, 176, 213),
    RGBColor(196, 156, 148),
];
pub(super) const STATE_ALLOCATED: RGBColor = RGBColor(78, 121, 167);
pub(super) const STATE_PENDING: RGBColor = RGBColor(242, 142, 43);
pub(super) const STATE_INACTIVE: RGBColor = RGBColor(226, 226, 226);

pub(super) fn font(size: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).color(&BLACK)
}

/// A chart that could not be drawn: an SVG saying so.
pub(super) fn error_svg(width: u32, height: u32, what: &str, err: &dyn fmt::Display) -> String {
    format!(
        "<svg width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" xmlns=\"http://www.w3.org/2000/svg\">\
         <text x=\"10\" y=\"20\" font-family=\"sans-serif\" font-size=\"13\">{}</text></svg>",
        super::escape(&format!("{what}: cannot draw the chart ({err})"))
    )
}

pub(super) type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Reads one total out of a point.
pub(super) type Getter = fn(&TimelinePoint) -> u64;

pub(super) fn err<E: std::error::Error + Send + Sync + 'static>(e: E) -> Box<dyn std::error::Error> {
    Box::new(e)
}

/// A legend swatch.
#[derive(Clone, Copy)]
pub(super) enum Swatch {
    Square(RGBColor),
    Line(RGBColor),
    /// A line with a dot (line series).
    Dotted(RGBColor),
    /// A dashed line (the budget).
    Dashed(RGBColor),
}

/// Space above the plot for the title and a legend of one row; each more row takes
/// [`LEGEND_ROW_H`] ([`header_height`]).
pub(super) const HEADER_H: i32 = 64;
pub(super) const LEGEND_ROW_H: i32 = 22;

/// The legend's rows: items laid out left to right, a new row where the next would pass the
/// chart's right edge (no item is ever cut off); each row is centred.
fn legend_rows(width: u32, legend: &[(String, Swatch)]) -> Vec<(i32, Vec<usize>)> {
    // plotters cannot measure SVG text: estimate ~0.6 em per character (sans-serif digits and
    // lower case are narrower; capitals and `_` about that).
    let char_w = SMALL_SIZE_FONT / 1.24 * 0.6;
    let item_w = |l: &str| 20 + (char_w * l.chars().count() as f64).ceil() as i32 + 18;
    let room = width as i32 - 16;
    let mut rows: Vec<(i32, Vec<usize>)> = Vec::new();
    for (i, (label, _)) in legend.iter().enumerate() {
        let w = item_w(label);
        match rows.last_mut() {
            Some((used, items)) if *used + w - 18 <= room => {
                *used += w;
                items.push(i);
            }
            _ => rows.push((w, vec![i])),
        }
    }
    rows.into_iter().map(|(used, items)| (((width as i32 - (used - 18)) / 2).max(8), items)).collect()
}

/// The height above the plot that [`draw_header`] takes for this legend at this width.
pub(super) fn header_height(width: u32, legend: &[(String, Swatch)]) -> i32 {
    HEADER_H + LEGEND_ROW_H * (legend_rows(width, legend).len() as i32 - 1).max(0)
}

/// Draws the title and, under it, the legend (both centred, the legend in as many rows as it
/// needs), above the plot.
pub(super) fn draw_header<DB: DrawingBackend>(
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
    let char_w = SMALL_SIZE_FONT / 1.24 * 0.6;
    for (row, (start, items)) in legend_rows(width, legend).into_iter().enumerate() {
        let y = 38 + LEGEND_ROW_H * row as i32;
        let mut x = start;
        for i in items {
            let (label, swatch) = &legend[i];
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
            root.draw(&Text::new(label.clone(), (x + 20, y - 2), font(SMALL_SIZE_FONT))).map_err(err)?;
            x += 20 + (char_w * label.chars().count() as f64).ceil() as i32 + 18;
        }
    }
    Ok(())
}

crate::render::evcxr_display!(Chart);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_svg_scales_and_takes_the_theme() {
        let svg = "<svg width=\"900\" height=\"360\" viewBox=\"0 0 900 360\" xmlns=\"http://www.w3.org/2000/svg\">\
                   <rect fill=\"#FFFFFF\"/><text fill=\"#000000\">a</text></svg>";
        let h = svg_html(svg);
        assert!(
            h.starts_with("<div class=\"gpumem-chart-box\" style=\"max-width:900px\"><svg viewBox=\"0 0 900 360\""),
            "{h}"
        );
        assert!(h.contains(" class=\"gpumem-chart\" width=\"100%\""), "{h}");
        assert!(!h.contains("height=\"360\""), "{h}");
        assert!(h.contains("svg.gpumem-chart [fill=\"#FFFFFF\"]{fill:var(--jp-layout-color0,#fff)}"), "{h}");
        assert!(h.ends_with("<rect fill=\"#FFFFFF\"/><text fill=\"#000000\">a</text></svg></div>"), "{h}");
    }

    #[test]
    fn axis_labels() {
        use crate::units::GIB;
        assert_eq!(axis_unit(3 * GIB / 2), ("GiB", GIB as f64));
        assert_eq!(axis_label(0.0, "MiB"), "0");
        assert_eq!(axis_label(1.5, "GiB"), "1.5 GiB");
        assert_eq!(axis_label(200.0, "MiB"), "200 MiB");
    }
}
