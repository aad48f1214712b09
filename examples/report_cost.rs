//! What naming sites costs a cell's report: the per-cell hooks (`pre` and `post` on the control
//! channel, as gpumem-kernel sends them around every cell) timed around cells that allocate in
//! loops, on the simulated device with tracking and 32-frame stacks (the defaults):
//!
//! - `buffers`: 10,000 `DeviceBuffer` allocations and frees of 1-64 MiB, the cache emptied
//!   every 100 (so the driver sees segments come and go), nothing kept;
//! - `driver_kept`: 2,000 `driver_alloc_mib(1)` kept until the next cell of this kind;
//! - `many_stacks`: 640 allocations kept from 64 different call chains.
//!
//! Prints one JSON object per kind: the hooks' time per cell (first cell, p50, p95, max) in
//! milliseconds. `cargo run --release --example report_cost` (BENCHMARKS.md, "Sites").

use gpumem_nb::kernel::protocol::Op;
use gpumem_nb::{DeviceBuffer, StreamId};
use serde_json::json;
use std::time::Instant;

#[path = "../tests/common/channel.rs"]
mod channel;
use channel::Channel;

const ROUNDS: usize = 20;

#[inline(never)]
fn chain(depth: usize, keep: &mut Vec<gpumem_nb::mem::DriverBuffer>) {
    if depth == 0 {
        keep.push(gpumem_nb::mem::driver_alloc_mib(1).expect("alloc"));
    } else {
        chain(depth - 1, keep);
    }
    std::hint::black_box(depth);
}

fn main() {
    // SAFETY: set before any other thread exists.
    unsafe { std::env::set_var("GPUMEM_NB_DEVICE", "sim:80GiB") };
    let alloc = gpumem_nb::current().expect("device");
    let mut ch = Channel::new();
    let mut cell = 0u64;
    let mut kept: Vec<gpumem_nb::mem::DriverBuffer> = Vec::new();
    let mut run = |kind: &str, body: &mut dyn FnMut()| {
        let mut ms = Vec::new();
        for _ in 0..ROUNDS {
            cell += 1;
            let t = Instant::now();
            assert!(ch.ask(Op::Pre { cell }).ok);
            let pre = t.elapsed();
            body();
            let t = Instant::now();
            let post = ch.ask(Op::Post { cell });
            let hooks = pre + t.elapsed();
            assert!(post.ok);
            ms.push(hooks.as_secs_f64() * 1e3);
        }
        let first = ms[0];
        ms.sort_by(f64::total_cmp);
        let q = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
        println!(
            "{}",
            json!({"cells": kind, "rounds": ROUNDS, "hooks_ms_first": first, "hooks_ms_p50": q(0.5),
                   "hooks_ms_p95": q(0.95), "hooks_ms_max": ms[ms.len() - 1]})
        );
    };
    run("buffers", &mut || {
        for i in 0..10_000usize {
            let b = DeviceBuffer::<u8>::alloc(&alloc, ((i % 64) + 1) << 20, StreamId::DEFAULT).expect("buffer");
            drop(b);
            if i % 100 == 99 {
                alloc.empty_cache().expect("empty_cache");
            }
        }
    });
    run("driver_kept", &mut || {
        kept.clear();
        kept.extend((0..2_000).map(|_| gpumem_nb::mem::driver_alloc_mib(1).expect("alloc")));
    });
    kept.clear();
    run("many_stacks", &mut || {
        kept.clear();
        for i in 0..640 {
            chain(i % 64, &mut kept);
        }
    });
}
