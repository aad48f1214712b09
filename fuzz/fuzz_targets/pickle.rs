//! Snapshot pickles (what `torch.cuda.memory._dump_snapshot` writes): any bytes are read into a
//! snapshot or refused with a one-line error, never a panic or a hang; an accepted snapshot's
//! traces are refused in one line or replayed to a consistent allocator state.
#![no_main]

use gpumem_nb::replay::{ReplayOptions, TraceStart, from_snapshot, replay};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let one_line = |m: String| assert!(!m.is_empty() && !m.contains('\n'), "{m:?}");
    match gpumem_nb::snapshot::from_bytes(data) {
        Ok(snap) => match from_snapshot(&snap, "fuzz.pickle", TraceStart::Strict) {
            Ok(rec) => {
                for d in &rec.devices {
                    let opts = ReplayOptions { device_total: 1 << 36, ..ReplayOptions::default() };
                    match replay(&d.events, &opts, "fuzz.pickle") {
                        Ok(report) => report.check_invariants().expect("invariants after a replay"),
                        Err(e) => one_line(e.to_string()),
                    }
                }
            }
            Err(e) => one_line(e.to_string()),
        },
        Err(e) => one_line(e.to_string()),
    }
});
