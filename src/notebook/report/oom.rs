//! An out-of-memory as the cell's error says it: PyTorch's words (`CUDA out of memory. Tried to
//! allocate 96.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 46.59 GiB is free.`),
//! then what PyTorch cannot say for another framework: who asked and where (the framework, the
//! driver call, the cell and line), what the process holds by owner and component (the tracker)
//! and by NVML's count, other processes' share, and the site holding the most.

use crate::device::nvml::NvmlDevice;
use crate::notebook::protocol::{CACHED_FREE, Held, OomEvent};
use crate::units::format_size;

/// The error's lines: the first is its value (`evalue`), the rest its explanation. `nvml`: the
/// device as NVML saw it after the cell, and the notebook process's pid, for what the process
/// and the others hold (`None` where NVML says nothing: the simulated device).
pub fn oom_message(e: &OomEvent, nvml: Option<(&NvmlDevice, u32)>, simulated: bool) -> Vec<String> {
    let gpu = match (e.device >= 0, simulated) {
        (true, false) => format!("GPU {}", e.device),
        (true, true) => format!("GPU {} (simulated)", e.device),
        (false, _) => "the host (pinned memory)".into(),
    };
    // The device's size and free memory: the reading taken for the event (the allocator's, or
    // the driver's in the device's context), else NVML's after the cell.
    let (free, total) = match (e.device_total, nvml) {
        (0, Some((d, _))) => (d.free, d.total),
        _ => (e.device_free, e.device_total),
    };
    let mut first = format!("CUDA out of memory. Tried to allocate {}.", format_size(e.requested));
    if total > 0 {
        first.push_str(&format!(
            " {gpu} has a total capacity of {} of which {} is free.",
            format_size(total),
            format_size(free)
        ));
    }
    let mut lines = vec![first];
    // Who asked, and where.
    let who = e.owner.as_deref().unwrap_or("gpumem-nb");
    let call = e.api.as_deref().map_or_else(|| "its caching allocator".to_string(), |a| format!("`{a}`"));
    let at = e.site.as_ref().map_or_else(String::new, |s| format!(" at {}", s.site()));
    let more = if e.count > 1 { format!(" ({} refusals in the cell)", e.count) } else { String::new() };
    lines.push(format!("Asked by {who} through {call}{at}{more}."));
    // What the process holds: NVML's count, then by owner and component (tracked).
    let held: Vec<String> =
        e.by_owner.iter().filter(|o| o.live > 0).map(|o| format!("{} {}", o.owner, format_size(o.live))).collect();
    let parts: Vec<String> = e
        .by_component
        .iter()
        .filter(|c| c.live > 0 && c.component != Held::Cached)
        .map(|c| format!("{} {}", c.component, format_size(c.live)))
        .collect();
    let tracked: u64 = e.by_owner.iter().map(|o| o.live).sum();
    let mut holds = match nvml.and_then(|(d, pid)| d.process_used(pid)) {
        Some(p) => format!("This process has {} in use on {gpu} (NVML)", format_size(p)),
        None => format!("This process holds {} on {gpu} (tracked)", format_size(tracked)),
    };
    if !held.is_empty() {
        holds.push_str(&format!("; its allocations: {}", held.join(", ")));
        if parts.iter().any(|p| !p.starts_with("other ")) {
            holds.push_str(&format!(" ({})", parts.join(", ")));
        }
    }
    if let Some((d, pid)) = nvml {
        holds.push_str(&format!("; other processes {}", format_size(d.others_used(pid))));
    }
    lines.push(format!("{holds}."));
    if let Some(top) = e.top.iter().find(|t| t.function.as_deref() != Some(CACHED_FREE)) {
        lines.push(format!("Holding the most: {} ({}).", top.site(), format_size(top.bytes)));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::nvml::NvmlProcess;
    use crate::notebook::protocol::{ComponentReading, OwnerBytes, OwnerReading};
    use crate::record::component::Component;

    #[test]
    fn a_framework_s_out_of_memory_is_said_as_pytorch_says_it_and_more() {
        let gib = 1u64 << 30;
        let e = OomEvent {
            device: 0,
            count: 1,
            requested: 96 * gib,
            device_free: 47 * gib,
            device_total: 80 * gib,
            api: Some("cuMemAllocAsync".into()),
            owner: Some("candle".into()),
            site: Some(OwnerBytes {
                owner: "candle_core::…".into(),
                function: Some("candle_core::tensor::Tensor::ones".into()),
                cell: Some(3),
                line: Some(2),
                ..Default::default()
            }),
            by_owner: vec![OwnerReading { owner: "candle".into(), live: 32 * gib, rise: None }],
            by_component: vec![ComponentReading {
                component: Held::Component(Component::Other),
                live: 32 * gib,
                rise: None,
            }],
            top: vec![OwnerBytes {
                owner: "candle_core::…".into(),
                bytes: 32 * gib,
                function: Some("candle_core::tensor::Tensor::ones".into()),
                cell: Some(2),
                line: Some(1),
                ..Default::default()
            }],
            ..Default::default()
        };
        let d = NvmlDevice {
            index: 0,
            uuid: "GPU-0".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            total: 80 * gib,
            free: 47 * gib,
            used: 34 * gib,
            processes: vec![NvmlProcess { pid: 7, used: Some(33 * gib) }, NvmlProcess { pid: 9, used: Some(gib) }],
        };
        let m = oom_message(&e, Some((&d, 7)), false);
        assert_eq!(
            m[0],
            "CUDA out of memory. Tried to allocate 96.00 GiB. GPU 0 has a total capacity of 80.00 GiB of which \
             47.00 GiB is free."
        );
        assert!(m[1].starts_with("Asked by candle through `cuMemAllocAsync` at "), "{}", m[1]);
        assert!(m[1].contains("cell 3:2"), "{}", m[1]);
        assert_eq!(
            m[2],
            "This process has 33.00 GiB in use on GPU 0 (NVML); its allocations: candle 32.00 GiB; other processes \
             1024.00 MiB."
        );
        assert!(m[3].starts_with("Holding the most: ") && m[3].ends_with("(32.00 GiB)."), "{}", m[3]);
        // No NVML, no size read with the event: what is known, nothing made up.
        let bare = OomEvent { requested: 1 << 20, device_total: 0, ..e.clone() };
        let m = oom_message(&bare, None, true);
        assert_eq!(m[0], "CUDA out of memory. Tried to allocate 1024.00 KiB.");
        assert!(m[2].starts_with("This process holds 32.00 GiB on GPU 0 (simulated) (tracked)"), "{}", m[2]);
        assert!(!m.iter().any(|l| l.contains("other processes")), "{m:?}");
    }
}
