//! A framework that allocates on its own thread after the cell's code returned (a device thread
//! with a batched queue: `gpumem_nb::frameworks::SimQueue`, what cubecl does with burn's work),
//! read as gpumem-kernel reads a cell through the control channel: its memory lands in the cell
//! that queued it (the reading settles the framework first), its site names that cell, and a
//! framework that does not answer is read as it is, within the settle time, and said so.

use gpumem_nb::frameworks::SimQueue;
use gpumem_nb::kernel::protocol::Reply;
use gpumem_nb::kernel::report::CellRecord;
use gpumem_nb::tracking;
use gpumem_nb::units::MIB;
use std::time::{Duration, Instant};

#[path = "common/channel.rs"]
mod channel;
use channel::Channel;

/// Runs a cell between `pre` and `post` as gpumem-kernel does; its record, and the `post` reply.
fn cell(ch: &mut Channel, n: u64, work: impl FnOnce()) -> (CellRecord, Reply) {
    let mut work = Some(work);
    let r = ch.cell(n, &mut || work.take().unwrap()());
    tracking::check().unwrap();
    r
}

#[test]
fn what_a_cell_queues_lands_in_that_cell() {
    // SAFETY: this test binary has a single test, and nothing reads the environment before
    // this line on another thread.
    unsafe { std::env::set_var("GPUMEM_NB_DEVICE", "sim:8GiB") };
    // Readings wait up to 3 s for the queue (1 s by default): on a loaded two-core machine the
    // queue's thread has been starved past 1 s (CI, 2026-11-29), which is the product saying
    // "read as it is" correctly, not what this test is about.
    // SAFETY: as above.
    unsafe { std::env::set_var("GPUMEM_NB_SETTLE_SECS", "3") };
    let alloc = gpumem_nb::current().unwrap();
    let mut ch = Channel::new();
    // A batch of 32 tasks, as cubecl's: a cell that queues fewer runs none of them by itself.
    let q = SimQueue::start("model", 32).unwrap();
    let key = q.watch().unwrap();
    assert_eq!(key, "simqueue model");

    // The model cell queues 36 MiB and returns: nothing is allocated when its code ends.
    let (rec, post) = cell(&mut ch, 3, || {
        q.alloc_later(20);
        q.alloc_later(16);
        assert_eq!(q.held(), 0, "queued, not run");
    });
    assert_eq!(q.held(), 36 * MIB, "the reading settled the queue");
    assert!(post.unsettled.is_none(), "{:?}", post.unsettled);
    let all = rec.all_allocations.as_ref().unwrap();
    assert_eq!(all.delta(), Some(36 * MIB as i64), "the cell's own: {all:?}");
    let fw = &rec.frameworks[0];
    assert_eq!(fw.in_use.delta(), Some(36 * MIB as i64), "{fw:?}");
    let site = all.place.top.iter().find(|t| t.bytes == 36 * MIB).unwrap_or_else(|| panic!("{:?}", all.place.top));
    assert!(site.queued && site.cell == Some(3), "made on the queue's thread, for cell 3: {site:?}");
    assert!(site.site().ends_with("← cell 3"), "{}", site.site());
    // The line keeps the framework's figures within its width; every allocation is in the record.
    let line = rec.line();
    assert!(line.contains("simqueue in use 36.00 MiB (+36.00 MiB") && line.chars().count() <= 120, "{line}");
    assert_eq!(all.delta(), Some(36 * MIB as i64), "{all:?}");

    // The next cell sees it as already there: no change.
    let (rec, _) = cell(&mut ch, 4, || {});
    assert_eq!(rec.all_allocations.as_ref().unwrap().delta(), Some(0));

    // A framework that hangs: each reading (before the cell and after it) waits the settle time
    // at most, reads it as it is and says so; the queued work is then not counted.
    q.stall(true);
    let t = Instant::now();
    let (rec, post) = cell(&mut ch, 5, || q.alloc_later(8));
    // How long the readings waited is a measurement (it depends on the machine's load), printed,
    // never asserted: what is checked is that they returned and said the queue did not answer.
    eprintln!("a cell with a stalled framework: {:?} (settle time 3 s a reading)", t.elapsed());
    let late = post.unsettled.expect("the stalled queue is said");
    // In the reading's words or the queue's: "no answer in 3.0 s: read as it is", "the queue's
    // thread did not answer in 3s", or, when the reading before the cell is still waiting on it,
    // "its previous reading has not answered yet": which speaks depends on the machine's load.
    let said = |e: &str| ["read as it is", "did not answer", "has not answered"].iter().any(|w| e.contains(w));
    assert!(late.iter().any(|s| s.key == key && s.error.as_deref().is_some_and(said)), "{late:?}");
    assert_eq!(rec.all_allocations.as_ref().unwrap().delta(), Some(0));
    q.stall(false);
    q.flush(Duration::from_secs(5)).unwrap();
    q.free_later();
    q.flush(Duration::from_secs(5)).unwrap();
    assert!(q.unwatch());
    alloc.empty_cache().unwrap();
    assert_eq!(q.held(), 0);
}
