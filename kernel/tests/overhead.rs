//! What the per-cell hooks cost the kernel, measured with the real pieces: kernel-side NVML
//! (`nvml::snapshot`) and the control channel's `pre` and `post` round trips, answered by the
//! gpumem-nb crate's own serving loop (`gpumem_nb::kernel::control::serve`) over a Unix socket, with a
//! device open (CUDA when there is one, else simulated).
//!
//! `live_line_overhead`: what the live line costs over a long cell.
//!
//! A measurement, not a timed test: `cargo test --release -p gpumem-kernel --test overhead --
//! --ignored --nocapture` prints one JSON line per measurement.

use gpumem_kernel::session::control::ControlServer;
use gpumem_nb::kernel::protocol::Op;
use serde_json::json;
use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// A measurement's figures with what they were measured on: the backend and NVML's devices.
fn with_machine(alloc: &gpumem_nb::Allocator, mut figures: serde_json::Value) -> serde_json::Value {
    let nvml = gpumem_nb::device::nvml::snapshot();
    figures["backend"] = json!(alloc.backend_kind().name());
    figures["nvml_devices"] = json!(nvml.devices.len());
    figures["nvml_error"] = json!(nvml.error);
    figures
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
            gpumem_nb::kernel::control::serve(BufReader::new(stream), std::io::BufWriter::new(w))
        });
    } else {
        std::thread::spawn(move || gpumem_nb::kernel::control::serve(BufReader::new(stream), w));
    }
    assert!(server.poll(Some(std::process::id())).connected.is_some());

    let n = 2000;
    let (mut nvml_us, mut pre_us, mut post_us, mut total_us) = (vec![], vec![], vec![], vec![]);
    for cell in 0..n {
        let t0 = Instant::now();
        let _ = server.poll(Some(std::process::id()));
        let t1 = Instant::now();
        let snap = gpumem_nb::device::nvml::snapshot();
        let t2 = Instant::now();
        server.request(Op::Pre { cell }, Duration::from_secs(5)).unwrap();
        let t3 = Instant::now();
        let _ = server.poll(Some(std::process::id()));
        let _ = gpumem_nb::device::nvml::snapshot();
        let t4 = Instant::now();
        server.request(Op::Post { cell }, Duration::from_secs(5)).unwrap();
        let t5 = Instant::now();
        nvml_us.push((t2 - t1).as_secs_f64() * 1e6);
        pre_us.push((t3 - t2).as_secs_f64() * 1e6);
        post_us.push((t5 - t4).as_secs_f64() * 1e6);
        total_us.push((t5 - t0).as_secs_f64() * 1e6);
        std::hint::black_box(snap);
    }
    println!(
        "{}",
        with_machine(
            &alloc,
            json!({
                "cells": n,
                "nvml_read_us": {"median": percentile(&mut nvml_us, 0.5), "p99": percentile(&mut nvml_us, 0.99)},
                "pre_request_us": {"median": percentile(&mut pre_us, 0.5), "p99": percentile(&mut pre_us, 0.99)},
                "post_request_us": {"median": percentile(&mut post_us, 0.5), "p99": percentile(&mut post_us, 0.99)},
                "per_cell_total_us": {"median": percentile(&mut total_us, 0.5), "p99": percentile(&mut total_us, 0.99)},
            })
        )
    );
}

/// Collects what the live line shows, counting lines.
#[derive(Default)]
struct Lines(std::sync::Mutex<u32>);

impl gpumem_kernel::output::Sink for Lines {
    fn emit(&self, _out: gpumem_kernel::output::Output) {
        *self.0.lock().unwrap() += 1;
    }

    fn input(&self, _prompt: &str, _password: bool) -> String {
        String::new()
    }

    fn updates_in_place(&self) -> bool {
        true
    }
}

/// A control server in `dir` with the crate's serving loop connected to it on a thread of its
/// own, a cell open (`pre`); the receiver gets that thread's CPU time once the server is
/// dropped.
fn serving(dir: &std::path::Path) -> (gpumem_kernel::cell::hooks::SharedControl, std::sync::mpsc::Receiver<Duration>) {
    let mut server = ControlServer::in_dir(dir).unwrap();
    let stream = UnixStream::connect(server.socket_path()).unwrap();
    let mut w = stream.try_clone().unwrap();
    writeln!(w, "{}", json!({"hello": 1, "pid": std::process::id(), "version": "bench"})).unwrap();
    let (cpu_tx, cpu_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        gpumem_nb::kernel::control::serve(BufReader::new(stream), w);
        let _ = cpu_tx.send(gpumem_kernel::cell::live::thread_cpu());
    });
    assert!(server.poll(Some(std::process::id())).connected.is_some());
    server.request(Op::Pre { cell: 1 }, Duration::from_secs(5)).unwrap();
    (std::sync::Arc::new(std::sync::Mutex::new(server)), cpu_rx)
}

/// What the live line costs over one long cell: the sampler thread's CPU time (its own clock,
/// `CLOCK_THREAD_CPUTIME_ID`) over a cell of `GPUMEM_BENCH_LIVE_SECS` seconds (default 60),
/// NVML read and the crate's serving loop asked for `live` every tick, and that serving
/// thread's CPU time; then one tick's reading alone, timed 2000 times (another connection).
///
/// `cargo test --release -p gpumem-kernel --test overhead live_line -- --ignored --nocapture`
#[test]
#[ignore = "a measurement; run with --ignored --nocapture"]
fn live_line_overhead() {
    use gpumem_kernel::cell::live;
    use std::sync::Arc;
    let secs: u64 = std::env::var("GPUMEM_BENCH_LIVE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let alloc = gpumem_nb::current().expect("a device (CUDA or simulated)");
    let keep = alloc.malloc(64 << 20, gpumem_nb::StreamId::DEFAULT).unwrap();
    let base = tempfile::tempdir().unwrap();
    let me = Some(std::process::id());

    let (control, serve_cpu) = serving(&base.path().join("cell"));
    let sink = Arc::new(Lines::default());
    let started = Instant::now();
    let sampler =
        live::Sampler::start(1, started, me, live::Baseline::default(), control.clone(), None, sink.clone()).unwrap();
    std::thread::sleep(Duration::from_secs(secs));
    let finished = sampler.stop();
    let cell_s = started.elapsed().as_secs_f64();
    let line = live::line(1, started.elapsed(), &live::read(&control), &live::Baseline::default(), me);
    drop(control);
    let serve_cpu = serve_cpu.recv_timeout(Duration::from_secs(10)).unwrap_or_default();

    let (control, _) = serving(&base.path().join("ticks"));
    let mut tick_us: Vec<f64> = (0..2000)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(live::read(&control));
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    alloc.free(keep.block.unwrap()).unwrap();
    let cost = &finished.cost;
    println!(
        "{}",
        with_machine(
            &alloc,
            json!({
                "cell_s": cell_s,
                "lines_shown": cost.updates,
                "sink_outputs": *sink.0.lock().unwrap(),
                "sampler_cpu_ms": cost.cpu_us as f64 / 1e3,
                "sampler_percent_of_a_core": cost.cpu_us as f64 / 1e6 / cell_s * 100.0,
                "crate_serving_thread_cpu_ms": serve_cpu.as_secs_f64() * 1e3,
                "crate_serving_percent_of_a_core": serve_cpu.as_secs_f64() / cell_s * 100.0,
                "one_tick_reading_us": {"median": percentile(&mut tick_us, 0.5), "p99": percentile(&mut tick_us, 0.99)},
                "line": line,
            })
        )
    );
}
