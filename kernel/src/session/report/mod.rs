//! Per-cell records and what is shown from them: the one-line report with its details view,
//! the session history table, the peaks chart, CSV/JSON export.
//!
//! Every number says where it comes from: every allocation of the child (tracked: CUPTI or the
//! simulated driver, exact), the gpumem-nb allocator in the child (exact, over the control
//! channel), the CUDA stream-ordered pool that cudarc's own `CudaSlice` uses (exact, from the
//! driver, through the crate), NVML (this process and the others on the device), or the
//! simulated device.
//!
//! - the record's types ([`CellRecord`] and its parts), [`build_record`], the one-line report,
//!   its details table and the `display_data` bundle are the library's
//!   (`gpumem_nb::kernel::report`): the stock evcxr kernel's in-child reports build the same;
//! - `history`: the session's [`History`].

mod history;

pub use gpumem_nb::kernel::report::{
    AllAllocations, AllocatorPart, CELL_MIME, CellRecord, CrateReading, LiveCost, NvmlPart, PlaceAll, PoolPart,
    Readings, SourceDelta, Sources, Span, TrackedReadings, all_allocations, allocator_absent, build_record,
    device_name, format_ms, framework_parts, line_html, quantity, short_device,
};
pub use history::History;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::nvml::{NvmlDevice, NvmlProcess, NvmlSnapshot};
    use serde_json::Value;

    fn reading(alloc: u64, resv: u64, peak: u64) -> CrateReading {
        CrateReading {
            device: 0,
            backend: gpumem_nb::BackendKind::Simulated,
            allocated: alloc,
            reserved: resv,
            peak_allocated: peak,
            peak_reserved: resv,
            device_free: Some(80 << 30),
            device_total: Some(80 << 30),
            ..Default::default()
        }
    }

    #[test]
    fn simulated_cell_record_and_line() {
        let before = [reading(0, 0, 0)];
        let after = [reading(512 << 20, 512 << 20, 1 << 30)];
        let none = NvmlSnapshot { devices: vec![], error: Some("NVML is unavailable (no driver)".into()) };
        let rec = build_record(
            3,
            &Readings {
                crate_before: Some(&before),
                crate_after: Some(&after),
                tracked_before: None,
                tracked_after: None,
                slot_opened: true,
                nvml_before: &none,
                nvml_after: &none,
                pid_before: Some(10),
                pid_after: Some(10),
            },
        );
        let line = rec.line();
        assert_eq!(
            line,
            "[3] sim · 0 µs · allocated 512.00 MiB (+512.00 MiB, peak 1.00 GiB) · reserved 512.00 MiB (+512.00 MiB) \
             · free 80.00 GiB"
        );
        assert!(line.chars().count() <= 120, "{line}");
        assert!(!rec.restarted);
        let d = rec.display();
        assert!(d["text/html"].as_str().unwrap().contains("<details>"));
        assert_eq!(d[CELL_MIME]["allocator"]["allocated"]["after"], 512 << 20);
        assert_eq!(d[CELL_MIME]["cell"], 3);
        let text = rec.details().to_text();
        assert!(text.contains("allocator: allocated") && text.contains("allocated: blocks"), "{text}");
        // Without NVML it is said once, and the rows that would need it are left out.
        assert_eq!(text.matches("NVML is unavailable").count(), 1, "{text}");
        assert!(!text.contains("other processes") && !text.contains("rest of this process"), "{text}");
    }

    #[test]
    fn the_budget_warns_in_the_cell_that_raised_the_peak_only() {
        let none = NvmlSnapshot::default();
        let mk = |before: u64, after: u64, peak: u64| {
            let (b, a) = ([reading(before, before, before)], [reading(after, after, peak)]);
            build_record(
                5,
                &Readings {
                    crate_before: Some(&b),
                    crate_after: Some(&a),
                    tracked_before: None,
                    tracked_after: None,
                    slot_opened: true,
                    nvml_before: &none,
                    nvml_after: &none,
                    pid_before: Some(1),
                    pid_after: Some(1),
                },
            )
        };
        let h = History { budget: Some(1 << 30), ..Default::default() };
        let mut grew = mk(512 << 20, 2 << 30, 2 << 30);
        h.warn(&mut grew);
        assert_eq!(grew.warnings, vec!["over budget: peak 2.00 GiB > 1.00 GiB".to_string()]);
        let mut idle = mk(2 << 30, 2 << 30, 2 << 30);
        h.warn(&mut idle);
        assert!(idle.warnings.is_empty(), "2 GiB held since an earlier cell: this one allocated nothing");
    }

    #[test]
    fn nvml_only_cell_with_restart_and_warnings() {
        let dev = |used: u64| NvmlDevice {
            index: 0,
            uuid: "GPU-1".into(),
            name: "NVIDIA H100".into(),
            total: 80 << 30,
            free: 4 << 30,
            used: 76 << 30,
            processes: vec![NvmlProcess { pid: 20, used: Some(used) }, NvmlProcess { pid: 99, used: Some(70 << 30) }],
        };
        let b = NvmlSnapshot { devices: vec![dev(1 << 30)], error: None };
        let a = NvmlSnapshot { devices: vec![dev(2 << 30)], error: None };
        let mut rec = build_record(
            4,
            &Readings {
                crate_before: None,
                crate_after: None,
                tracked_before: None,
                tracked_after: None,
                slot_opened: false,
                nvml_before: &b,
                nvml_after: &a,
                pid_before: Some(19),
                pid_after: Some(20),
            },
        );
        assert!(rec.restarted);
        assert_eq!(rec.nvml.process.after, Some(2 << 30));
        assert_eq!(rec.nvml.process.before, None, "not comparable across a restart");
        assert_eq!(rec.nvml.others_after, Some(70 << 30));
        let h = History { budget: Some(1 << 30), ..Default::default() };
        h.warn(&mut rec);
        let line = rec.line();
        assert!(line.starts_with("[4] NVIDIA H100"), "{line}");
        assert!(rec.details().to_text().contains("NVIDIA H100"));
        assert!(line.contains("⟳ restarted"), "{line}");
        assert!(line.contains("over budget: process 2.00 GiB > 1.00 GiB"), "{line}");
        assert!(line.contains("low headroom"), "{line}");
    }

    #[test]
    fn rerun_leak_is_flagged_and_history_renders() {
        let none = NvmlSnapshot::default();
        let mk = |cell, before: u64, after: u64| {
            let b = [reading(before, before, before)];
            let a = [reading(after, after, after)];
            let mut r = build_record(
                cell,
                &Readings {
                    crate_before: Some(&b),
                    crate_after: Some(&a),
                    tracked_before: None,
                    tracked_after: None,
                    slot_opened: true,
                    nvml_before: &none,
                    nvml_after: &none,
                    pid_before: Some(1),
                    pid_after: Some(1),
                },
            );
            r.source_hash = "h".into();
            r.first_line = "v.push(buf)".into();
            r
        };
        let mut h = History::default();
        let mut r1 = mk(1, 0, 2 << 20);
        h.warn(&mut r1);
        assert!(r1.warnings.is_empty());
        h.cells.push(r1);
        let mut r2 = mk(2, 2 << 20, 4 << 20);
        h.warn(&mut r2);
        assert_eq!(r2.warnings, vec!["re-run leak: same code as [1], this run left +2.00 MiB more".to_string()]);
        h.cells.push(r2);
        let mut r3 = mk(3, 4 << 20, 4 << 20);
        h.warn(&mut r3);
        assert!(r3.warnings.is_empty(), "an idempotent re-run is fine");
        h.cells.push(r3);
        let t = h.table().to_text();
        assert!(t.contains("[2]") && t.contains("re-run leak") && t.contains("3 cells"), "{t}");
        let csv = h.to_csv();
        assert_eq!(csv.lines().count(), 4);
        // No tracking in these records: its four columns are empty.
        let row = csv.lines().nth(2).unwrap();
        assert!(row.starts_with("2,ok,sim:0 (simulated),simulated,,,,,2097152,4194304,"), "{row}");
        let json: Value = serde_json::from_str(&h.to_json()).unwrap();
        assert_eq!(json["cells"].as_array().unwrap().len(), 3);
        let plot = h.plot();
        assert!(plot.svg.as_deref().unwrap_or("").contains("<svg"));
    }

    /// burn's re-runs: the allocator saw nothing, cubecl's books say what grew.
    #[test]
    fn rerun_leak_of_a_watched_framework_says_live_tensors_or_pool_reserve() {
        use gpumem_nb::kernel::protocol::{FrameworkPool, FrameworkReading};
        let mib = 1u64 << 20;
        let books = |in_use: u64, reserved: u64| {
            vec![FrameworkReading {
                framework: "cubecl".into(),
                device: "cuda stream 0".into(),
                pools: vec![FrameworkPool { kind: "all pools".into(), in_use, reserved, ..Default::default() }],
                ..Default::default()
            }]
        };
        let mk = |cell, before: (u64, u64), after: (u64, u64)| {
            let r = [reading(0, 0, 0)];
            let none = NvmlSnapshot::default();
            let mut rec = build_record(
                cell,
                &Readings {
                    crate_before: Some(&r),
                    crate_after: Some(&r),
                    tracked_before: None,
                    tracked_after: None,
                    slot_opened: true,
                    nvml_before: &none,
                    nvml_after: &none,
                    pid_before: Some(1),
                    pid_after: Some(1),
                },
            );
            rec.frameworks = framework_parts(Some(&books(before.0, before.1)), Some(&books(after.0, after.1)));
            rec.source_hash = "epoch".into();
            rec
        };
        let mut h = History::default();
        let mut first = mk(1, (0, 64 * mib), (0, 96 * mib));
        h.warn(&mut first);
        assert!(first.warnings.is_empty(), "a first run is no re-run: {:?}", first.warnings);
        assert!(first.line().contains("cubecl in use 0 B (±0 B, cached 96.00 MiB)"), "{}", first.line());
        h.cells.push(first);
        let mut kept = mk(2, (0, 96 * mib), (32 * mib, 96 * mib));
        h.warn(&mut kept);
        assert_eq!(
            kept.warnings,
            ["re-run leak: same code as [1], this run left +32.00 MiB more (cubecl: live tensors +32.00 MiB, pool \
              reserve -32.00 MiB)"]
        );
        h.cells.push(kept);
        let mut grew = mk(3, (32 * mib, 96 * mib), (32 * mib, 160 * mib));
        h.warn(&mut grew);
        assert_eq!(
            grew.warnings,
            ["re-run leak: same code as [2], this run left +64.00 MiB more (cubecl: live tensors ±0 B, pool reserve \
              +64.00 MiB)"]
        );
        let mut steady = mk(4, (32 * mib, 160 * mib), (32 * mib, 160 * mib));
        h.warn(&mut steady);
        assert!(steady.warnings.is_empty(), "{:?}", steady.warnings);
    }

    #[test]
    fn spans_serialize_as_before() {
        let bytes: Span = Span { before: None, after: Some(5) };
        assert_eq!(serde_json::to_string(&bytes).unwrap(), r#"{"before":null,"after":5}"#);
        assert_eq!(bytes.delta(), None);
        assert_eq!(Span { before: Some(7), after: Some(5) }.delta(), Some(-2));
        let flag = Span { before: false, after: true };
        assert_eq!(serde_json::to_string(&flag).unwrap(), r#"{"before":false,"after":true}"#);
        let rec = CellRecord { crate_loaded: flag, ..Default::default() };
        let v = serde_json::to_value(&rec).unwrap();
        assert_eq!(v["crate_loaded"], serde_json::json!({"before": false, "after": true}));
        assert_eq!(serde_json::from_value::<CellRecord>(v).unwrap(), rec);
    }
}
