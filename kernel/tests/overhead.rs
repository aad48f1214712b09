//! What the per-cell hooks cost the kernel, measured with the real pieces: kernel-side NVML
//! (`nvml::read`) and the control channel's `pre` and `post` round trips, answered by the
//! gpumem-nb crate's own serving loop (`gpumem_nb::notebook::control::serve`) over a Unix socket, with a
//! device open (CUDA when there is one, else simulated).
//!
//! A measurement, not a timed test: `cargo test --release -p gpumem-kernel --test overhead --
//! --ignored --nocapture` prints one JSON line.

use gpumem_kernel::control::ControlServer;
use gpumem_nb::notebook::protocol::Op;
use serde_json::json;
use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[test]
#[ignore = "a measurement; run with --ignored --nocapture"]
fn hook_overhead() {
    let alloc = gpumem_nb::current().expect("a device (CUDA or simulated)");
    let base = tempfile::tempdir().unwrap();
    let mut server = ControlServer::in_dir(&base.path().join("k")).unwrap();
    let stream = UnixStream::connect(server.socket_path()).unwrap();
    let mut w = stream.try_clone().unwrap();
    writeln!(w, "{}", json!({"hello": 1, "pid": std::process::id(), "version": "bench"})).unwrap();
    // GPUMEM_BENCH_BUFFERED=1: the crate's loop writing through a BufWriter (one write per
    // reply) instead of the raw socket, to see what per-token writes cost.
    if std::env::var_os("GPUMEM_BENCH_BUFFERED").is_some() {
        std::thread::spawn(move || {
            gpumem_nb::notebook::control::serve(BufReader::new(stream), std::io::BufWriter::new(w))
        });
    } else {
        std::thread::spawn(move || gpumem_nb::notebook::control::serve(BufReader::new(stream), w));
    }
    assert!(server.poll(Some(std::process::id())).connected.is_some());

    let n = 2000;
    let (mut nvml_us, mut pre_us, mut post_us, mut total_us) = (vec![], vec![], vec![], vec![]);
    for cell in 0..n {
        let t0 = Instant::now();
        let _ = server.poll(Some(std::process::id()));
        let t1 = Instant::now();
        let snap = gpumem_kernel::nvml::read();
        let t2 = Instant::now();
        server.request(Op::Pre { cell }, Duration::from_secs(5)).unwrap();
        let t3 = Instant::now();
        let _ = server.poll(Some(std::process::id()));
        let _ = gpumem_kernel::nvml::read();
        let t4 = Instant::now();
        server.request(Op::Post { cell }, Duration::from_secs(5)).unwrap();
        let t5 = Instant::now();
        nvml_us.push((t2 - t1).as_secs_f64() * 1e6);
        pre_us.push((t3 - t2).as_secs_f64() * 1e6);
        post_us.push((t5 - t4).as_secs_f64() * 1e6);
        total_us.push((t5 - t0).as_secs_f64() * 1e6);
        std::hint::black_box(snap);
    }
    let nvml = gpumem_kernel::nvml::read();
    println!(
        "{}",
        json!({
            "backend": alloc.backend_kind().name(),
            "nvml_devices": nvml.devices.len(),
            "nvml_error": nvml.error,
            "cells": n,
            "nvml_read_us": {"median": percentile(&mut nvml_us, 0.5), "p99": percentile(&mut nvml_us, 0.99)},
            "pre_request_us": {"median": percentile(&mut pre_us, 0.5), "p99": percentile(&mut pre_us, 0.99)},
            "post_request_us": {"median": percentile(&mut post_us, 0.5), "p99": percentile(&mut post_us, 0.99)},
            "per_cell_total_us": {"median": percentile(&mut total_us, 0.5), "p99": percentile(&mut total_us, 0.99)},
        })
    );
}
