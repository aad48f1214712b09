//! Several devices in one notebook (issue 46), on two simulated devices (`sim:2x8GiB`): each
//! cell's record has every device's numbers, the line names the other device's change, the
//! history and the plot show the devices apart, through `gpumem-kernel run` with real evcxr.

mod common;

use common::{outputs, records, result_text, run};
use serde_json::Value;

#[test]
fn a_cell_on_two_devices_reports_each() {
    let nb = common::notebook(&[
        (":dep gpumem-nb", &[]),
        (
            "use gpumem_nb::{DeviceBuffer, StreamId};\n\
             let a = DeviceBuffer::<u8>::zeros(&gpumem_nb::current()?, 64 << 20, StreamId::DEFAULT)?;\n\
             let b = DeviceBuffer::<u8>::zeros(&gpumem_nb::device(1)?, 256 << 20, StreamId::DEFAULT)?;\n\
             gpumem_nb::device(1)?.memory_reserved()",
            &[],
        ),
        ("drop(b);\ngpumem_nb::device(1)?.memory_allocated()", &[]),
        ("%gpumem history", &[]),
        ("%gpumem plot", &[]),
    ]);
    let (code, out, stderr) = run("two-devices", &nb, &[("GPUMEM_NB_DEVICE", "sim:2x8GiB")]);
    assert_eq!(code, 0, "{stderr}");
    let mib = 1u64 << 20;
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("not a byte count: {v}"));
    let place = |i: usize, d: u64| -> Value {
        let r = &records(&out, i)[0]["all_allocations"];
        r["devices"].as_array().unwrap().iter().find(|p| p["device"] == d).cloned().unwrap_or_else(|| panic!("{r}"))
    };
    // What device 1's allocator says it holds (the cell's value) is what the record says every
    // allocation there came to, and the cell's change.
    let held: u64 = result_text(&out, 1).trim().parse().unwrap();
    let one = place(1, 1);
    assert_eq!(held, 256 * mib);
    assert_eq!((n(&one["after"]), n(&one["after"]) - n(&one["before"])), (held, held), "{one}");
    let zero = place(1, 0);
    assert_eq!(n(&zero["after"]) - n(&zero["before"]), 64 * mib, "{zero}");
    // Each device the crate opened is in the record.
    let devices: Vec<u64> =
        records(&out, 1)[0]["devices_after"].as_array().unwrap().iter().map(|d| n(&d["device"])).collect();
    assert_eq!(devices, [0, 1]);
    // The line names device 1's change; the next cell's, its fall (the allocator keeps the
    // segment cached: every allocation there is still 256 MiB, none of it allocated).
    let line = |i: usize| -> String {
        outputs(&out, i)
            .iter()
            .find_map(|o| o["data"]["text/plain"].as_str().filter(|t| t.starts_with('[')).map(str::to_string))
            .unwrap_or_default()
    };
    assert!(
        line(1).contains("sim:1 +256 MiB") || line(1).contains("device 1 all allocations 256 MiB (+256 MiB"),
        "{}",
        line(1)
    );
    assert!(line(1).chars().count() <= 120, "{}", line(1));
    assert_eq!(result_text(&out, 2).trim(), "0");
    // The history has device 1's columns; the plot its series.
    let history = outputs(&out, 3).iter().filter_map(|o| o["data"]["text/plain"].as_str()).collect::<String>();
    assert!(history.contains("Δ all sim:1") && history.contains("peak all sim:1"), "{history}");
    let plot = outputs(&out, 4).iter().filter_map(|o| o["data"]["image/svg+xml"].as_str()).collect::<String>();
    assert!(plot.contains("sim:1 all allocations peak"), "{}", &plot[..plot.len().min(400)]);
}
