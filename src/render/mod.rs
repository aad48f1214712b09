//! Inline rendering for Jupyter (through evcxr or the gpumem kernel) and for terminals.
//!
//! Every displayable value produces a [`MimeBundle`]: always `text/plain`, plus `text/html`
//! and/or `image/svg+xml`. Everything renders offline (no scripts from a CDN, no fonts to
//! fetch) and survives nbconvert. Sizes are bytes in data and IEC units (KiB, MiB, GiB) on
//! screen. Renderers read plain data only (stats maps, snapshots, reports), never the
//! allocator itself.
//!
//! evcxr shows a value whose type has an `evcxr_display(&self)` method; ours print the bundle
//! in evcxr's content protocol (`EVCXR_BEGIN_CONTENT <mime>` … `EVCXR_END_CONTENT`).

pub mod chart;
mod diff;
pub mod explain;
mod files;
pub mod reports;
pub mod trace_plot;

pub use files::SnapshotFiles;

use crate::units::{GIB, KIB, MIB, TIB};

use std::fmt::Write as _;

/// A value's representations, by MIME type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MimeBundle {
    /// `text/plain`: always present.
    pub text: String,
    /// `text/html`, when there is one.
    pub html: Option<String>,
    /// `image/svg+xml`, when there is one.
    pub svg: Option<String>,
}

impl MimeBundle {
    /// A text-only bundle.
    pub fn text(text: impl Into<String>) -> Self {
        MimeBundle { text: text.into(), html: None, svg: None }
    }

    /// Adds an HTML representation.
    pub fn with_html(mut self, html: impl Into<String>) -> Self {
        self.html = Some(html.into());
        self
    }

    /// Adds an SVG representation.
    pub fn with_svg(mut self, svg: impl Into<String>) -> Self {
        self.svg = Some(svg.into());
        self
    }

    /// The bundle in evcxr's content protocol.
    pub fn to_evcxr(&self) -> String {
        let mut out = String::new();
        let mut block = |mime: &str, data: &str| {
            let _ = write!(out, "EVCXR_BEGIN_CONTENT {mime}\n{data}\nEVCXR_END_CONTENT\n");
        };
        block("text/plain", &self.text);
        if let Some(h) = &self.html {
            block("text/html", h);
        }
        if let Some(s) = &self.svg {
            block("image/svg+xml", s);
        }
        out
    }

    /// Shows the bundle in an evcxr notebook cell (prints it in evcxr's content protocol).
    pub fn evcxr_display(&self) {
        print!("{}", self.to_evcxr());
    }
}

/// Secondary text (captions, the report line): JupyterLab's secondary content colour, with a
/// fallback that reads on white (contrast 6.2:1).
pub const TEXT2: &str = "var(--jp-content-font-color2,#616161)";

/// The units a number can carry on screen: sizes, durations, percentages.
const UNITS: [&str; 11] = ["B", "KiB", "MiB", "GiB", "TiB", "µs", "ms", "s", "min", "h", "%"];

/// Escaped HTML text with a non-breaking space wherever a line break would split a quantity: between
/// a number and its unit (`64.00 MiB`), and after `Δ`. So `+64.00 MiB` never wraps.
pub(crate) fn nowrap_units(escaped: &str) -> String {
    let chars: Vec<char> = escaped.chars().collect();
    let mut out = String::with_capacity(escaped.len() + 16);
    for (i, &c) in chars.iter().enumerate() {
        if c == ' ' && i > 0 {
            let prev = chars[i - 1];
            let rest: String =
                chars[i + 1..].iter().take_while(|c| c.is_alphanumeric() || **c == '%' || **c == 'µ').collect();
            let unit_follows = prev.is_ascii_digit() && UNITS.contains(&rest.as_str());
            if unit_follows || prev == 'Δ' {
                out.push('\u{a0}');
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A table rendered as text (comfy-table) and as an HTML table, with a caption saying what
/// the numbers cover.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// Column titles.
    pub header: Vec<String>,
    /// Rows of cells (already formatted).
    pub rows: Vec<Vec<String>>,
    /// Columns to right-align (numbers).
    pub right: Vec<usize>,
    /// One line under the table: the source of the numbers.
    pub caption: String,
    /// One line above the table: the question it answers (none by default).
    pub title: String,
    /// Columns whose cells the HTML form cuts to a number of characters, the whole text on
    /// hover (code, say, so that the numbers stay in view in a narrow notebook).
    pub cut: Vec<(usize, usize)>,
}

impl Table {
    /// A table with these column titles.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Table { header: header.into_iter().map(Into::into).collect(), ..Default::default() }
    }

    /// Right-aligns these columns.
    pub fn right_align(mut self, cols: impl IntoIterator<Item = usize>) -> Self {
        self.right = cols.into_iter().collect();
        self
    }

    /// Cuts column `col`'s cells to `chars` characters in the HTML form ("…" where cut, the
    /// whole text in the cell's title); the text form keeps them whole.
    pub fn cut_column(mut self, col: usize, chars: usize) -> Self {
        self.cut.push((col, chars));
        self
    }

    /// Sets the caption.
    pub fn caption(mut self, caption: impl Into<String>) -> Self {
        self.caption = caption.into();
        self
    }

    /// Sets the title: a line above the table (bold in HTML).
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = title.into();
        self
    }

    /// Appends a row.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// The text form.
    pub fn to_text(&self) -> String {
        use comfy_table::{CellAlignment, ContentArrangement, presets::UTF8_FULL_CONDENSED};
        let mut t = comfy_table::Table::new();
        t.load_preset(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Disabled);
        t.set_header(self.header.clone());
        for r in &self.rows {
            t.add_row(r.clone());
        }
        for &c in &self.right {
            if let Some(col) = t.column_mut(c) {
                col.set_cell_alignment(CellAlignment::Right);
            }
        }
        let mut s = if self.title.is_empty() { String::new() } else { format!("{}\n", self.title) };
        s.push_str(&t.to_string());
        if !self.caption.is_empty() {
            s.push('\n');
            s.push_str(&self.caption);
        }
        s
    }

    /// The HTML form (inline styles only, so it renders the same everywhere). Colours are
    /// JupyterLab's theme variables with light fallbacks (so light, dark and high-contrast themes
    /// read, and a page without them looks as before). Numbers never wrap (a non-breaking space
    /// before their unit, `white-space:nowrap` in number columns); a table wider than the output
    /// area scrolls inside its own box, its first column staying in view.
    pub fn to_html(&self) -> String {
        let mut h = String::new();
        if !self.title.is_empty() {
            let _ = write!(
                h,
                "<div class=\"gpumem-table-title\" style=\"font-family:var(--jp-code-font-family,monospace);\
                 font-size:var(--jp-code-font-size,12px);font-weight:bold;\
                 color:var(--jp-content-font-color1,#212121);padding:2px 0\">{}</div>",
                nowrap_units(&escape(&self.title))
            );
        }
        h.push_str(
            "<div class=\"gpumem-table\" style=\"overflow-x:auto;max-width:100%\">\
             <table class=\"gpumem\" style=\"border-collapse:collapse;margin:0;font-family:var(--jp-code-font-family,monospace);\
             font-size:var(--jp-code-font-size,12px);color:var(--jp-content-font-color1,#212121)\">",
        );
        if !self.caption.is_empty() {
            let _ = write!(
                h,
                "<caption style=\"caption-side:bottom;text-align:left;color:{TEXT2};padding-top:2px\">{}</caption>",
                nowrap_units(&escape(&self.caption))
            );
        }
        // The first column stays put while the rest scrolls: it needs the row's background.
        let sticky = |i: usize| if i == 0 { "position:sticky;left:0;background:inherit;" } else { "" };
        h.push_str("<thead><tr style=\"background:var(--jp-layout-color0,#fff)\">");
        for (i, c) in self.header.iter().enumerate() {
            let align = if self.right.contains(&i) { "right" } else { "left" };
            let _ = write!(
                h,
                "<th style=\"{}text-align:{align};padding:2px 8px;vertical-align:bottom;\
                 border-bottom:1px solid var(--jp-border-color1,#999)\">{}</th>",
                sticky(i),
                nowrap_units(&escape(c))
            );
        }
        h.push_str("</tr></thead><tbody>");
        // A words column is kept from a sliver (18 characters at least), but never wider than its
        // longest text: an empty notes column takes only its title's width.
        let longest = |i: usize| {
            let cells = self.rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count());
            let cut = self.cut.iter().find(|(col, _)| *col == i).map_or(usize::MAX, |(_, n)| *n);
            cells.chain(self.header.get(i).map(|h| h.chars().count())).max().unwrap_or(0).min(cut)
        };
        let min_ch: Vec<usize> = (0..self.header.len()).map(|i| longest(i).min(18)).collect();
        for (n, r) in self.rows.iter().enumerate() {
            let bg = if n % 2 == 0 {
                "var(--jp-layout-color0,#fff)"
            } else {
                "var(--jp-rendermime-table-row-background,#f5f5f5)"
            };
            let _ = write!(h, "<tr style=\"background:{bg}\">");
            for (i, c) in r.iter().enumerate() {
                // Numbers never wrap; words wrap, but not into a sliver of a column.
                let (align, wrap) = if self.right.contains(&i) {
                    ("right", "white-space:nowrap;")
                } else if i == 0 {
                    ("left", "min-width:8ch;")
                } else {
                    ("left", "")
                };
                let wrap = if wrap.is_empty() {
                    format!("min-width:{}ch;", min_ch.get(i).copied().unwrap_or(18))
                } else {
                    wrap.to_string()
                };
                let text = match self.cut.iter().find(|(col, _)| *col == i) {
                    Some(&(_, n)) if c.chars().count() > n => format!(
                        "<span title=\"{}\">{}…</span>",
                        escape(c),
                        escape(&c.chars().take(n.saturating_sub(1)).collect::<String>())
                    ),
                    _ => nowrap_units(&escape(c)),
                };
                let _ = write!(
                    h,
                    "<td style=\"{}{wrap}text-align:{align};padding:2px 8px;vertical-align:top\">{text}</td>",
                    sticky(i),
                );
            }
            h.push_str("</tr>");
        }
        h.push_str("</tbody></table></div>");
        h
    }

    /// Text and HTML together.
    pub fn bundle(&self) -> MimeBundle {
        MimeBundle::text(self.to_text()).with_html(self.to_html())
    }
}

/// The unit an axis of byte values up to `max` is labelled in: the largest IEC unit not above
/// `max`, as (name, bytes per unit). Charts and the snapshot page share it.
pub(crate) fn axis_unit(max: u64) -> (&'static str, f64) {
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
pub(crate) fn axis_label(v: f64, unit: &str) -> String {
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

/// Gives each type, which has `fn bundle(&self) -> MimeBundle`, its `evcxr_display`: evcxr
/// shows a cell's value through an inherent method of that name (a trait method is not found).
macro_rules! evcxr_display {
    ($($t:ty),+ $(,)?) => {$(
        impl $t {
            /// Shows the value in an evcxr notebook cell: text, and HTML or SVG.
            pub fn evcxr_display(&self) {
                self.bundle().evcxr_display();
            }
        }
    )+};
}
pub(crate) use evcxr_display;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evcxr_protocol_carries_text_and_html() {
        let b = MimeBundle::text("1 B").with_html("<b>1 B</b>");
        assert_eq!(
            b.to_evcxr(),
            "EVCXR_BEGIN_CONTENT text/plain\n1 B\nEVCXR_END_CONTENT\nEVCXR_BEGIN_CONTENT text/html\n<b>1 B</b>\nEVCXR_END_CONTENT\n"
        );
    }

    #[test]
    fn table_text_and_html() {
        let mut t = Table::new(["what", "bytes"]).right_align([1]).caption("source: allocator");
        t.row(["allocated", "1.00 MiB"]);
        t.row(["<script>", "0 B"]);
        let text = t.to_text();
        assert!(
            text.contains("allocated") && text.contains("1.00 MiB") && text.ends_with("source: allocator"),
            "{text}"
        );
        let html = t.to_html();
        assert!(html.contains("&lt;script&gt;") && !html.contains("<script>"));
        assert!(html.contains("text-align:right"));
        assert!(html.contains(">1.00\u{a0}MiB</td>"), "a number and its unit do not part: {html}");
        assert!(html.contains("white-space:nowrap"), "{html}");
        assert!(
            html.starts_with("<div class=\"gpumem-table\" style=\"overflow-x:auto"),
            "scrolls in its own box: {html}"
        );
        assert!(html.contains("position:sticky;left:0"), "the first column stays in view: {html}");
        assert!(html.contains("var(--jp-layout-color0,#fff)"), "theme colours with fallbacks: {html}");
    }

    #[test]
    fn a_cut_column_keeps_the_whole_text_on_hover() {
        let mut t = Table::new(["n", "code"]).cut_column(1, 8);
        t.row(["1", "let a = \"<long>\";"]);
        t.row(["2", "short"]);
        let html = t.to_html();
        assert!(html.contains("<span title=\"let a = &quot;&lt;long&gt;&quot;;\">let a =…</span>"), "{html}");
        assert!(html.contains(">short</td>"), "{html}");
        assert!(t.to_text().contains("let a = \"<long>\";"), "the text form keeps it whole");
    }

    #[test]
    fn numbers_and_units_stay_together() {
        assert_eq!(nowrap_units("Δ +64.00 MiB, peak 1.5 GiB"), "Δ\u{a0}+64.00\u{a0}MiB, peak 1.5\u{a0}GiB");
        assert_eq!(nowrap_units("3 cells · wall 5.60 s"), "3 cells · wall 5.60\u{a0}s");
        assert_eq!(nowrap_units("512 B Bytes 2 Sims"), "512\u{a0}B Bytes 2 Sims");
        assert_eq!(nowrap_units("850 µs"), "850\u{a0}µs");
    }
}
