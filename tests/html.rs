//! The offline HTML page (`trace_plot.html`) rendered by a real browser: a scripted workload on
//! the simulated device, written with `Snapshot::save`, loaded in headless Chromium with
//! networking off, checked on the rendered DOM and saved as a screenshot.
//!
//! Needs Chromium (`/usr/bin/chromium`, or `$CHROMIUM`); `scripts/test.sh` installs Debian's
//! package when it is missing. Without it the browser test fails with that hint.

use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::snapshot::Snapshot;
use gpumem_nb::{AllocatorConfig, CachingAllocator, HistoryOptions, StreamId};
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

/// A scripted notebook-like session: weights that stay, activations that come and go (some in
/// the small pool), a labelled cell, and blocks live at the end.
fn scripted_snapshot() -> Snapshot {
    let alloc = CachingAllocator::new(SimBackend::new(0, 8 << 30), AllocatorConfig::default());
    alloc.record_memory_history_with(HistoryOptions::default());
    let s = StreamId::DEFAULT;
    let m = |n: u64| alloc.malloc(n, s).expect("malloc on the simulated device");
    let free = |a: gpumem_nb::blocks::Allocation| alloc.free(a.block.expect("a block")).expect("free");

    alloc.set_label(Some("cell 1"));
    let weights = m(64 * MIB);
    let bias = m(300 * 1024);
    alloc.set_label(Some("cell 2"));
    for step in 0..3u64 {
        let a = m(24 * MIB + step * MIB);
        let b = m(40 * MIB);
        let small = m(4096 + step);
        free(a);
        let c = m(16 * MIB);
        free(small);
        free(b);
        free(c);
    }
    alloc.set_label(Some("cell 3"));
    let grads = m(64 * MIB);
    let tmp = m(12 * MIB);
    let keep_small = m(700_000);
    free(tmp);
    alloc.set_label(None);
    let _live = (weights, bias, grads, keep_small);
    alloc.snapshot()
}

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn out_dir(name: &str) -> PathBuf {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let dir = base.join(format!("gpumem-html-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// Runs headless Chromium on `page` with networking off and a fresh profile.
fn browser(chrome: &Path, profile: &Path, page: &Path, extra: &[&str]) -> std::process::Output {
    let url = format!("file://{}", page.display());
    Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            // No network: every host resolves to nothing and any proxy use goes nowhere.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--proxy-server=127.0.0.1:9",
            "--proxy-bypass-list=<-loopback>",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("running chromium")
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn trace_plot_renders_in_headless_chromium() {
    let snap = scripted_snapshot();
    let dir = out_dir("browser");
    let files = snap.save(&dir).expect("Snapshot::save");
    let page = std::fs::read_to_string(&files.html).expect("trace_plot.html");
    // Self-contained: nothing to fetch (the SVG namespace is a name, not a fetch).
    let without_ns = page.replace("http://www.w3.org/2000/svg", "");
    for fetch in ["http://", "https://", "<link", "@import", "src=", "url("] {
        assert!(!without_ns.contains(fetch), "the page must be self-contained, found {fetch:?}");
    }

    let trace = &snap.device_traces[0];
    let allocs = trace.iter().filter(|e| e.action == "alloc").count();
    assert!(allocs >= 10, "the script makes allocations: {allocs}");

    let Some(chrome) = chromium() else {
        panic!(
            "Chromium is needed to render trace_plot.html and was not found (/usr/bin/chromium or $CHROMIUM). \
             Install it with `apt-get install -y chromium` (scripts/test.sh does this when it is missing)."
        );
    };

    let profile = dir.join("profile");
    let dom = browser(&chrome, &profile, &files.html, &["--dump-dom"]);
    assert!(dom.status.success(), "chromium --dump-dom failed: {}", String::from_utf8_lossy(&dom.stderr));
    let dom = String::from_utf8_lossy(&dom.stdout).into_owned();
    std::fs::write(dir.join("dom.html"), &dom).expect("saving the DOM");

    assert!(dom.contains("<svg class=\"timeline\""), "the timeline <svg> is in the DOM");
    assert_eq!(count(&dom, "class=\"band\""), allocs, "one band per alloc event of the script");
    assert_eq!(count(&dom, "class=\"agg\""), 0, "a small trace is not downsampled");
    assert_eq!(count(&dom, "class=\"segment\""), snap.segments.len(), "one segment row per segment");
    let blocks: usize = snap.segments.iter().map(|s| s.blocks.len()).sum();
    assert_eq!(count(&dom, "class=\"block\""), blocks, "one rectangle per block");
    assert!(dom.contains("label: cell 3"), "the labelled cell shows in a band's hover text");
    assert!(
        dom.contains("allocator snapshot, device 0 (simulated device)"),
        "the page names the source of its numbers"
    );
    assert!(dom.contains("allocator snapshot, device 0"), "the header names the source");
    assert!(dom.contains("MiB"), "IEC units on screen");

    // The optional hover script: a band's hover text lands in the info panel.
    let hover = dir.join("hover.html");
    let probe =
        "<script>document.querySelector('.band').dispatchEvent(new MouseEvent('mouseover',{bubbles:true}));</script>";
    std::fs::write(&hover, page.replace("</body>", &format!("{probe}</body>"))).expect("hover page");
    let out = browser(&chrome, &dir.join("profile3"), &hover, &["--dump-dom"]);
    let hovered = String::from_utf8_lossy(&out.stdout);
    let info = hovered.split("<pre class=\"info\">").nth(1).and_then(|s| s.split("</pre>").next()).unwrap_or("");
    assert!(
        info.contains("requested") && info.contains("address 0x"),
        "hovering a band fills the info panel: {info:?}"
    );

    let png = dir.join("trace_plot.png");
    let shot = browser(
        &chrome,
        &dir.join("profile2"),
        &files.html,
        &["--window-size=1400,1000", &format!("--screenshot={}", png.display())],
    );
    assert!(shot.status.success(), "chromium --screenshot failed: {}", String::from_utf8_lossy(&shot.stderr));
    let bytes = std::fs::read(&png).expect("the screenshot was written");
    assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000, "a real screenshot: {} bytes", bytes.len());
    eprintln!("screenshot: {}", png.display());
    let _ = std::fs::remove_dir_all(&profile);
    let _ = std::fs::remove_dir_all(dir.join("profile2"));
    let _ = std::fs::remove_dir_all(dir.join("profile3"));
}

fn gpt2_snapshot() -> Snapshot {
    use gpumem_nb::replay::{ReplayOptions, read_trace, replay};
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/traces/gpt2_train.trace.tsv.gz"));
    let events = read_trace(path).expect("the shipped GPT-2 trace");
    let opts = ReplayOptions { keep_history: true, ..ReplayOptions::default() };
    replay(&events, &opts, &path.display().to_string()).expect("replay").snapshot()
}

#[test]
fn real_trace_page_is_downsampled_and_renders() {
    let snap = gpt2_snapshot();
    let allocs = snap.device_traces[0].iter().filter(|e| e.action == "alloc").count();
    let dir = out_dir("gpt2");
    let files = snap.save(&dir).expect("Snapshot::save");
    let page = std::fs::read_to_string(&files.html).expect("trace_plot.html");
    let max = gpumem_nb::render::trace_plot::DEFAULT_MAX_BANDS;
    assert!(allocs > max, "the GPT-2 trace has more allocations ({allocs}) than the band limit");
    assert_eq!(count(&page, "class=\"band\""), max);
    assert_eq!(count(&page, "class=\"agg\""), 1);
    assert!(page.contains(&format!("the other {} allocations are merged", group(allocs - max))));
    let Some(chrome) = chromium() else {
        panic!("Chromium was not found: `apt-get install -y chromium` (scripts/test.sh does this when it is missing).");
    };
    let png = dir.join("trace_plot.png");
    let shot = browser(
        &chrome,
        &dir.join("profile"),
        &files.html,
        &["--window-size=1400,1000", &format!("--screenshot={}", png.display())],
    );
    assert!(shot.status.success(), "chromium --screenshot failed: {}", String::from_utf8_lossy(&shot.stderr));
    assert!(std::fs::read(&png).expect("screenshot").starts_with(b"\x89PNG"));
    eprintln!("screenshot: {}", png.display());
    let _ = std::fs::remove_dir_all(dir.join("profile"));
}

fn group(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A training-like workload of about a million events: persistent weights, then steps of
/// forward activations freed in a shuffled order, gradients and temporaries.
fn million_event_snapshot() -> Snapshot {
    use gpumem_nb::{RecordMode, StackContext};
    let alloc = CachingAllocator::new(SimBackend::new(0, 80 << 30), AllocatorConfig::default());
    alloc.record_memory_history_with(HistoryOptions {
        enabled: RecordMode::All,
        context: StackContext::None,
        max_entries: usize::MAX,
    });
    let s = StreamId::DEFAULT;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut weights = Vec::new();
    for _ in 0..300 {
        weights.push(alloc.malloc(1 + rnd(32 * MIB), s).expect("weights"));
    }
    let mut step = 0;
    while alloc.history().len() < 1_000_000 {
        alloc.set_label(Some(&format!("step {step}")));
        let mut acts = Vec::new();
        for _ in 0..400 {
            let max = if rnd(4) == 0 { 64 * MIB } else { 512 * 1024 };
            acts.push(alloc.malloc(1 + rnd(max), s).expect("activation"));
            if rnd(3) == 0 {
                let t = alloc.malloc(1 + rnd(4 * MIB), s).expect("temporary");
                alloc.free(t.block.expect("block")).expect("free");
            }
        }
        // Backward: frees in a shuffled order, so bands keep dropping onto the ones below.
        while !acts.is_empty() {
            let a = acts.swap_remove(rnd(acts.len() as u64) as usize);
            let g = alloc.malloc(1 + rnd(8 * MIB), s).expect("gradient");
            alloc.free(a.block.expect("block")).expect("free");
            alloc.free(g.block.expect("block")).expect("free");
        }
        step += 1;
    }
    alloc.set_label(None);
    drop(weights);
    alloc.snapshot()
}

/// Measurement, not a check of speed: `cargo test --release --test html -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement: run with --release --ignored --nocapture"]
fn million_event_page_size_and_time() {
    let t0 = std::time::Instant::now();
    let snap = million_event_snapshot();
    let events = snap.device_traces[0].len();
    let allocs = snap.device_traces[0].iter().filter(|e| e.action == "alloc").count();
    eprintln!("workload: {events} events, {allocs} allocations, built in {:.2?}", t0.elapsed());
    let mut times = Vec::new();
    let mut page = String::new();
    for _ in 0..3 {
        let t = std::time::Instant::now();
        page = gpumem_nb::render::trace_plot::render(&snap);
        times.push(t.elapsed());
    }
    eprintln!("render: {times:.2?}; page {:.2} MiB", page.len() as f64 / MIB as f64);
    assert!(events >= 1_000_000);
    assert!(page.len() < 16 * MIB as usize, "the page stays small: {} bytes", page.len());
    let dir = out_dir("million");
    let path = dir.join("trace_plot.html");
    std::fs::write(&path, &page).expect("writing the page");
    eprintln!("page: {}", path.display());
}
