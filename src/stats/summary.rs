//! `memory_summary()`: PyTorch's text table, byte for byte (`torch/cuda/memory.py`).
#![forbid(unsafe_code)]

use crate::units::{summary_count, summary_size};
use std::collections::BTreeMap;

/// The summary for a `memory_stats()` map. `abbreviated` drops the per-pool rows.
///
/// The map must hold the 122 keys of [`crate::stats::DeviceStats::memory_stats`].
pub(crate) fn memory_summary(stats: &BTreeMap<String, i64>, device: i32, abbreviated: bool) -> String {
    let get = |k: &str| stats.get(k).copied().unwrap_or(0);
    let mut lines: Vec<String> = Vec::new();
    lines.push("=".repeat(75));
    lines.push(format!(" {:16} PyTorch CUDA memory summary, device ID {:<17} ", "", device));
    lines.push("-".repeat(75));
    lines.push(format!(
        "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
        "",
        get("num_ooms"),
        "",
        get("num_alloc_retries")
    ));
    lines.push("=".repeat(75));
    lines.push("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string());

    type Fmt = fn(i64, i64) -> String;
    let metrics: [(&str, &str, Fmt); 9] = [
        ("allocated_bytes", "Allocated memory", summary_size),
        ("active_bytes", "Active memory", summary_size),
        ("requested_bytes", "Requested memory", summary_size),
        ("reserved_bytes", "GPU reserved memory", summary_size),
        ("inactive_split_bytes", "Non-releasable memory", summary_size),
        ("allocation", "Allocations", summary_count),
        ("active", "Active allocs", summary_count),
        ("segment", "GPU reserved segments", summary_count),
        ("inactive_split", "Non-releasable allocs", summary_count),
    ];
    for (key, title, fmt) in metrics {
        lines.push("-".repeat(75));
        let mut sub = vec![("all", title)];
        if !abbreviated {
            sub.push(("large_pool", "      from large pool"));
            sub.push(("small_pool", "      from small pool"));
        }
        let pref = |field: &str| get(&format!("{key}.all.{field}"));
        let (pc, pp, pa, pf) = (pref("current"), pref("peak"), pref("allocated"), pref("freed"));
        for (sk, name) in sub {
            let v = |field: &str| get(&format!("{key}.{sk}.{field}"));
            lines.push(format!(
                " {:<21} | {} | {} | {} | {} ",
                name,
                fmt(v("current"), pc),
                fmt(v("peak"), pp),
                fmt(v("allocated"), pa),
                fmt(v("freed"), pf)
            ));
        }
    }
    for (key, title) in
        [("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize GPU segments")]
    {
        lines.push("-".repeat(75));
        let v = |field: &str| get(&format!("{key}.{field}"));
        let (c, p, a, f) = (v("current"), v("peak"), v("allocated"), v("freed"));
        lines.push(format!(
            " {:<21} | {} | {} | {} | {} ",
            title,
            summary_count(c, c),
            summary_count(p, p),
            summary_count(a, a),
            summary_count(f, f)
        ));
    }
    lines.push("=".repeat(75));
    format!("|{}|\n", lines.join("|\n|"))
}
