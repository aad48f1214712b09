//! The segment map of the page: a row per segment, blocks coloured by state.

use super::*;

/// One rectangle of the segment map (a block, or a run of merged thin blocks).
pub(super) fn block_title(b: &BlockSnap) -> String {
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

pub(super) fn segment_map_html(h: &mut String, segs: &[&Segment], total_blocks: usize, opts: &HtmlOptions) {
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
