//! Trace files (`action addr size stream time_us` lines): a malformed one is a one-line error
//! with its line number; an accepted one replays to a consistent allocator state, or stops
//! with a one-line error (a free of an address never allocated, …).
#![no_main]

use gpumem_nb::replay::{ReplayOptions, parse_trace, replay};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let one_line = |m: String| assert!(!m.is_empty() && !m.contains('\n'), "{m:?}");
    match parse_trace(data, "fuzz.tsv") {
        Ok(events) => {
            let opts = ReplayOptions { device_total: 1 << 36, ..ReplayOptions::default() };
            match replay(&events, &opts, "fuzz.tsv") {
                Ok(report) => report.check_invariants().expect("invariants after a replay"),
                Err(e) => one_line(e.to_string()),
            }
        }
        Err(e) => one_line(e.to_string()),
    }
});
