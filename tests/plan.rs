//! Will it fit, for a session (`gpumem_nb::plan`): cells run on the simulated device as the
//! kernel runs them (labels from the control channel's `pre`/`post`, history recorded after the
//! first allocation), with driver allocations beside the allocator's; the plan's verdicts per
//! policy and per cell, the smallest devices, and the reserved bytes explained (what it says
//! `empty_cache` returns is what it returns).

use gpumem_nb::kernel::protocol::{Op, RecordRequest};
use gpumem_nb::units::MIB;
use gpumem_nb::{DeviceBuffer, RecordMode, StreamId};

#[path = "common/channel.rs"]
mod channel;
use channel::Channel;

#[inline(never)]
fn load_weights(alloc: &std::sync::Arc<gpumem_nb::Allocator>, mib: u64) -> DeviceBuffer<u8> {
    DeviceBuffer::zeros(alloc, (mib * MIB) as usize, StreamId::DEFAULT).unwrap()
}

#[inline(never)]
fn a_big_activation(alloc: &std::sync::Arc<gpumem_nb::Allocator>, mib: u64) -> DeviceBuffer<u8> {
    DeviceBuffer::zeros(alloc, (mib * MIB) as usize, StreamId::DEFAULT).unwrap()
}

#[test]
fn a_session_is_planned_per_policy_and_per_cell() {
    // SAFETY: this test binary has a single test, and nothing reads the environment before
    // this line on another thread.
    unsafe { std::env::set_var("GPUMEM_NB_DEVICE", "sim:16GiB") };
    let alloc = gpumem_nb::current().unwrap();
    let mut ch = Channel::new();
    let mut cell = |n: u64, f: &mut dyn FnMut()| {
        let pre = ch.ask(Op::Pre { cell: n });
        assert!(pre.devices.unwrap()[0].explain.is_none(), "not computed before a cell: only after it");
        f();
        let post = ch.ask(Op::Post { cell: n });
        // The per-cell record's explanation: it adds up to the reading's reserved bytes.
        let d = &post.devices.unwrap()[0];
        let parts = d.explain.as_ref().expect("post explains the reserved bytes");
        parts.check().unwrap();
        assert_eq!((parts.reserved, parts.allocated()), (d.reserved, d.allocated));
    };

    // Nothing recorded yet: a plan says how to get one.
    let e = gpumem_nb::plan::fit(1 << 30).unwrap_err().to_string();
    assert!(e.contains("%gpumem record on"), "{e}");

    // Made before recording began: shown to the plan by its free in cell 1.
    let early = load_weights(&alloc, 64);
    assert!(
        Channel::new().ask(Op::Record(RecordRequest { enabled: RecordMode::All, max_entries: None, stacks: true })).ok
    );

    let mut keep = Vec::new();
    let mut driver = Vec::new();
    let mut early = Some(early);
    cell(1, &mut || {
        driver.push(gpumem_nb::mem::driver_alloc_mib(100).unwrap());
        keep.push(load_weights(&alloc, 200));
        early.take();
    });
    cell(2, &mut || {
        let tmp = a_big_activation(&alloc, 1024);
        keep.push(load_weights(&alloc, 300));
        drop(tmp);
    });
    cell(3, &mut || {
        drop(a_big_activation(&alloc, 3072));
    });

    let plan = gpumem_nb::plan::fit(2 << 30).unwrap();
    let live_peak = (100 + 200 + 300 + 3072) * MIB;
    assert_eq!(plan.live_peak, live_peak, "the driver's 100 MiB, the kept 500 MiB and cell 3's 3 GiB at once");
    assert_eq!(plan.before_recording, (1, 64 * MIB));
    let names: Vec<&str> = plan.policies.iter().map(|p| p.policy.as_str()).collect();
    assert_eq!(names, ["default", "expandable", "compact"]);
    for p in &plan.policies {
        assert!(!p.fits, "{}: 3 GiB at once does not fit in 2 GiB", p.policy);
        let f = p.first_failure.as_ref().unwrap();
        assert_eq!((f.label.as_deref(), f.size), (Some("cell 3"), 3072 * MIB), "{}", p.policy);
        assert!(
            f.frames.iter().any(|fr| fr.name.contains("a_big_activation")),
            "{}: the failing request's stack names the function: {:?}",
            p.policy,
            f.frames
        );
        assert!(p.min_device_bytes >= live_peak, "{}", p.policy);
        assert!(p.min_device_bytes <= live_peak + (100 << 20), "{}: {} for {live_peak}", p.policy, p.min_device_bytes);
    }
    let cells: Vec<(&str, bool)> =
        plan.cells.iter().map(|c| (c.label.as_str(), c.failures.iter().all(Option::is_none))).collect();
    assert_eq!(cells, [("before recording", true), ("cell 1", true), ("cell 2", true), ("cell 3", false)]);
    let c2 = &plan.cells[2];
    assert!(c2.peak >= (100 + 200 + 1024 + 300) * MIB, "cell 2's peak holds what it needed: {}", c2.peak);
    // On a device of the smallest size found, each policy fits.
    for p in plan.policies.clone() {
        let again = gpumem_nb::plan::fit(p.min_device_bytes).unwrap();
        let same = again.policies.iter().find(|q| q.policy == p.policy).unwrap();
        assert!(same.fits, "{} on {}", p.policy, p.min_device_bytes);
    }
    let text = plan.to_string();
    assert!(text.contains("Not modelled: the CUDA context") && text.contains("cell 3"), "{text}");
    assert_eq!(plan.to_json()["policies"][2]["alloc_conf"], "compact:True");

    // Every reserved byte explained, and what empty_cache returns is what it was said to.
    let view = gpumem_nb::plan::explain(&alloc);
    view.parts.check().unwrap();
    assert_eq!(view.parts.reserved, alloc.memory_reserved());
    assert_eq!(view.parts.requested, 500 * MIB);
    assert!(view.parts.releasable >= 3072 * MIB, "cell 3's segment is whole and free: {:?}", view.parts);
    let before = alloc.memory_reserved();
    alloc.empty_cache().unwrap();
    assert_eq!(before - alloc.memory_reserved(), view.parts.releasable);
    assert!(view.to_string().contains("= reserved"));
    drop((keep, driver));
}
