//! The segment map: a bar per segment, blocks coloured by state.

use super::*;
use crate::snapshot::Snapshot;
use crate::units::iec;
use std::collections::{BTreeMap, HashSet};

/// A bar per segment (address order), blocks coloured by state: allocated, pending free
/// (awaiting stream events), inactive (cached free space). Bars are scaled to their own
/// segment, so fragmentation is visible in every segment whatever its size; sizes are written
/// beside them.
pub fn segment_map(snapshot: &Snapshot) -> Chart {
    segment_map_with(snapshot, &ChartOptions::default())
}

/// The SVG of [`segment_map`] alone.
pub fn segment_map_svg(snapshot: &Snapshot) -> String {
    segment_map(snapshot).svg
}

/// [`segment_map`] with options (`width`, `title`, `max_rows`).
pub fn segment_map_with(snapshot: &Snapshot, opts: &ChartOptions) -> Chart {
    let devices: HashSet<i32> = snapshot.segments.iter().map(|s| s.device).collect();
    let title = opts.title.clone().unwrap_or_else(|| {
        let mut d: Vec<i32> = devices.iter().copied().collect();
        d.sort_unstable();
        let dev = match d.as_slice() {
            [] => "snapshot".to_string(),
            [one] => format!("snapshot, device {one}"),
            many => format!("snapshot, devices {}", many.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")),
        };
        format!("Segments — {dev}")
    });
    let mut buf = String::new();
    let height = segment_map_height(snapshot, opts);
    let svg = match draw_segment_map(&mut buf, snapshot, &title, opts, height) {
        Ok(()) => buf,
        Err(e) => error_svg(opts.width, height, &title, &e),
    };
    Chart { text: describe_segments(snapshot, &title), title, svg }
}

const ROW_H: u32 = 18;
const ROW_GAP: u32 = 5;

fn segment_map_height(snapshot: &Snapshot, opts: &ChartOptions) -> u32 {
    let rows = snapshot.segments.len().min(opts.max_rows.max(1)) as u32;
    let more = u32::from(snapshot.segments.len() > opts.max_rows.max(1));
    48 + rows.max(1) * (ROW_H + ROW_GAP) + more * 20 + 40
}

fn draw_segment_map(buf: &mut String, snap: &Snapshot, title: &str, opts: &ChartOptions, h: u32) -> DrawResult {
    let w = opts.width.max(400);
    let root = SVGBackend::with_string(buf, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    root.draw(&Text::new(title.to_string(), (12, 10), font(TITLE_SIZE))).map_err(err)?;
    let label_w: i32 = 250;
    let right_w: i32 = 150;
    let x0 = 12 + label_w;
    let bar_w = (w as i32 - x0 - right_w - 12).max(50);
    let mut y = 44i32;
    let rows = opts.max_rows.max(1);
    if snap.segments.is_empty() {
        root.draw(&Text::new("no segments", (12, y), font(LABEL_SIZE))).map_err(err)?;
    }
    for s in snap.segments.iter().take(rows) {
        let pool = if s.is_expandable { format!("{} exp.", s.segment_type) } else { s.segment_type.to_string() };
        let label = format!("{:#x}  {}  {}", s.address, iec(s.total_size), pool);
        root.draw(&Text::new(label, (12, y + 1), font(SMALL_SIZE_FONT))).map_err(err)?;
        // Runs of blocks with the same state, in pixels.
        let total = s.total_size.max(1) as f64;
        let mut off = 0u64;
        let mut runs: Vec<(i32, i32, &str, usize)> = Vec::new();
        for b in &s.blocks {
            let a = x0 + (off as f64 / total * bar_w as f64).round() as i32;
            off += b.size;
            let e = x0 + (off as f64 / total * bar_w as f64).round() as i32;
            match runs.last_mut() {
                Some(r) if r.2 == b.state => {
                    r.1 = e;
                    r.3 += 1;
                }
                _ => runs.push((a, e, b.state, 1)),
            }
        }
        for (a, e, state, _) in &runs {
            let color = match *state {
                "active_allocated" => STATE_ALLOCATED,
                "active_pending_free" => STATE_PENDING,
                _ => STATE_INACTIVE,
            };
            let e = (*e).max(a + 1);
            root.draw(&Rectangle::new([(*a, y), (e, y + ROW_H as i32)], color.filled())).map_err(err)?;
        }
        // Boundaries between allocated blocks, where there is room to see them.
        let mut off = 0u64;
        for b in &s.blocks {
            if off > 0 && b.state != "inactive" {
                let x = x0 + (off as f64 / total * bar_w as f64).round() as i32;
                let bw = (b.size as f64 / total * bar_w as f64) as i32;
                if bw >= 4 {
                    root.draw(&PathElement::new(vec![(x, y), (x, y + ROW_H as i32)], WHITE.stroke_width(1)))
                        .map_err(err)?;
                }
            }
            off += b.size;
        }
        root.draw(&Rectangle::new([(x0, y), (x0 + bar_w, y + ROW_H as i32)], AXIS_GRAY.stroke_width(1)))
            .map_err(err)?;
        let pct = if s.total_size > 0 { s.allocated_size as f64 * 100.0 / s.total_size as f64 } else { 0.0 };
        root.draw(&Text::new(
            format!("{} used ({pct:.0}%)", iec(s.allocated_size)),
            (x0 + bar_w + 8, y + 1),
            font(SMALL_SIZE_FONT),
        ))
        .map_err(err)?;
        y += (ROW_H + ROW_GAP) as i32;
    }
    if snap.segments.len() > rows {
        let rest = &snap.segments[rows..];
        let bytes: u64 = rest.iter().map(|s| s.total_size).sum();
        root.draw(&Text::new(
            format!("… {} more segments ({}) not drawn", rest.len(), iec(bytes)),
            (12, y),
            font(SMALL_SIZE_FONT),
        ))
        .map_err(err)?;
        y += 20;
    }
    // Legend.
    y += 8;
    let mut lx = 12;
    for (label, color) in [
        ("allocated", STATE_ALLOCATED),
        ("pending free (stream events)", STATE_PENDING),
        ("inactive (cached, free)", STATE_INACTIVE),
    ] {
        root.draw(&Rectangle::new([(lx, y + 1), (lx + 12, y + 13)], color.filled())).map_err(err)?;
        root.draw(&Rectangle::new([(lx, y + 1), (lx + 12, y + 13)], AXIS_GRAY.stroke_width(1))).map_err(err)?;
        root.draw(&Text::new(label, (lx + 17, y), font(SMALL_SIZE_FONT))).map_err(err)?;
        lx += 17 + (label.len() as i32) * 7 + 22;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn describe_segments(snap: &Snapshot, title: &str) -> String {
    let mut by_state: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    let mut largest_free = 0u64;
    for s in &snap.segments {
        for b in &s.blocks {
            let e = by_state.entry(b.state).or_default();
            e.0 += 1;
            e.1 += b.size;
            if b.state == "inactive" {
                largest_free = largest_free.max(b.size);
            }
        }
    }
    let reserved: u64 = snap.segments.iter().map(|s| s.total_size).sum();
    let get = |k: &str| by_state.get(k).copied().unwrap_or_default();
    let (na, ba) = get("active_allocated");
    let (np, bp) = get("active_pending_free");
    let (ni, bi) = get("inactive");
    format!(
        "{title}\n{} segments, {} reserved\nblocks: {na} allocated ({}), {np} pending free ({}), {ni} inactive ({})\nlargest inactive block: {}",
        snap.segments.len(),
        iec(reserved),
        iec(ba),
        iec(bp),
        iec(bi),
        iec(largest_free)
    )
}
