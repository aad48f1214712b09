//! `GPUMEM_NB_TRACK=off` on the simulated device: the driver reports to nobody, so nothing is
//! counted, no stack is taken, and the status says why (what the untracked side of
//! `examples/stack_cost.rs` relies on).

use gpumem_nb::tracking::{self, TrackingStatus};

#[test]
fn tracking_off_counts_nothing() {
    // SAFETY: this test binary has a single test, and nothing reads the environment before
    // these lines on another thread.
    unsafe {
        std::env::set_var("GPUMEM_NB_DEVICE", "sim:1GiB");
        std::env::set_var(tracking::TRACK_VAR, "off");
    }
    let keep = gpumem_nb::mem::driver_alloc_mib(8).unwrap();
    assert_eq!(tracking::status(), TrackingStatus::Off);
    let top = gpumem_nb::tracking::top(5);
    assert!(top.places.is_empty(), "nothing tracked: {top:?}");
    assert_eq!(top.tracking, "off (GPUMEM_NB_TRACK=off)");
    // The simulated device still gave the memory out.
    let (free, total) = gpumem_nb::current().unwrap().mem_get_info().unwrap();
    assert_eq!(total - free, 8 << 20);
    drop(keep);
}
