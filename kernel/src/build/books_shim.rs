//! A reader of a framework's own books, compiled into the session library.
//!
//! cubecl (burn's GPU backends) keeps device memory in pools of its own: tracking sees the pages
//! it takes from the driver, never what inside them its tensors use. Only code compiled against
//! the notebook's own cubecl can ask it (`ComputeClient::memory_usage`), and the notebook never
//! has to: when a generation of the session library adds burn 0.21 or cubecl 0.10 with CUDA,
//! it also gets the module below, built against that same cubecl (one copy for the session, so
//! the same device servers and pools as the cells' tensors). Its functions have C names; the
//! notebook's process finds them once tracking has seen cubecl allocate on a device
//! (`gpumem_nb`'s `notebook::shims`), so a notebook that never touches the GPU makes no CUDA
//! context through them. A spec this does not know (another burn, no `cuda` feature) gets no
//! module: its pages are still tracked, without cubecl's own figures.
//!
//! The functions (all `extern "C"`; none unwinds, a panic is an answer of its own):
//! - `gpumem_books_cubecl_stream_v1() -> u64`: the cubecl stream of the thread that loaded the
//!   library (evcxr's child loads each cell's library on the thread that runs the cells: the
//!   stream the notebook's tensors live on; cubecl 0.10 keeps pools per stream).
//! - `gpumem_books_cubecl_usage_v1(device, out, message, cap, len) -> i32`: `out` gets live
//!   allocations, bytes in use, padding and bytes reserved (`MemoryUsage`), in that order.
//! - `gpumem_books_cubecl_flush_v1(device, message, cap, len) -> i32`: runs what was queued.
//! - `gpumem_books_cubecl_cleanup_v1(device, message, cap, len) -> i32`: gives back what the
//!   pools keep cached (`memory_cleanup`).
//!
//! Each returns 0 when it answered, 1 with cubecl's error and 2 with a panic's message; the text
//! goes into `message` (at most `cap` bytes, no NUL), its length into `len`.

/// What a generation adding `deps` (key, TOML spec) gets for the reader: the dependency line to
/// add to its manifest, if any, and the code to add to its `lib.rs`; `None` when no dependency
/// is one the reader knows. Where the generation has cubecl 0.10 itself the reader uses it under
/// the notebook's key (cargo refuses one package under two names in one manifest); for burn it
/// adds cubecl under a name of its own, which never meets a notebook's key.
pub fn for_deps(deps: &[(String, String)]) -> Option<(Option<String>, String)> {
    let known: Vec<(&str, Known)> = deps.iter().filter_map(|(k, s)| Some((k.as_str(), known(k, s)?))).collect();
    if let Some((key, _)) = known.iter().find(|(_, k)| *k == Known::Cubecl) {
        let alias = format!("\nextern crate {} as gpumem_books_cubecl;\n", key.replace('-', "_"));
        return Some((None, alias + CUBECL010_MODULE));
    }
    (!known.is_empty()).then(|| (Some(CUBECL010_DEP.to_string()), CUBECL010_MODULE.to_string()))
}

/// The dependencies the reader knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    /// burn 0.21 with its `cuda` feature (cubecl 0.10 underneath).
    Burn,
    /// cubecl 0.10 with its `cuda` feature.
    Cubecl,
}

/// cubecl 0.10 as burn-cuda 0.21 asks for it (no default features, CUDA): adds no feature the
/// notebook's burn did not turn on.
const CUBECL010_DEP: &str = "gpumem_books_cubecl = { package = \"cubecl\", version = \"0.10.0\", default-features = false, features = [\"cuda\"] }";

/// Which known dependency `key = spec` is, if any: burn 0.21 or cubecl 0.10, with `cuda`.
fn known(key: &str, spec: &str) -> Option<Known> {
    let doc = format!("d = {spec}").parse::<toml::Table>().ok()?;
    let (version, features, package) = match &doc["d"] {
        toml::Value::String(v) => (v.as_str(), Vec::new(), None),
        toml::Value::Table(t) => (
            t.get("version").and_then(|v| v.as_str()).unwrap_or(""),
            t.get("features")
                .and_then(|f| f.as_array())
                .map(|a| a.iter().filter_map(|f| f.as_str()).collect())
                .unwrap_or_default(),
            t.get("package").and_then(|p| p.as_str()),
        ),
        _ => return None,
    };
    let (which, minor) = match package.unwrap_or(key) {
        "burn" => (Known::Burn, "0.21"),
        "cubecl" => (Known::Cubecl, "0.10"),
        _ => return None,
    };
    (features.contains(&"cuda") && same_minor(version, minor)).then_some(which)
}

/// Whether a Cargo version requirement (`0.21`, `^0.21.0`, `=0.21.0`, `~0.21`) picks from
/// `minor` (`0.21`) and nothing else.
pub(crate) fn same_minor(req: &str, minor: &str) -> bool {
    let v = req.trim().trim_start_matches(['^', '=', '~']).trim();
    v == minor || v.strip_prefix(minor).is_some_and(|rest| rest.starts_with('.') && !rest.contains(['*', 'x', ',']))
}

/// The module, against cubecl 0.10's CUDA runtime.
const CUBECL010_MODULE: &str = r#"
/// gpumem-kernel's reader of cubecl's own books (cubecl 0.10, CUDA): the notebook's process calls
/// these by name once it has seen cubecl allocate on a device. Not for the notebook's code.
#[doc(hidden)]
pub mod __gpumem_books {
    use gpumem_books_cubecl::Runtime as _;
    use gpumem_books_cubecl::cuda::{CudaDevice, CudaRuntime};
    use gpumem_books_cubecl::stream_id::StreamId;
    use std::sync::atomic::{AtomicU64, Ordering};

    static STREAM: AtomicU64 = AtomicU64::new(u64::MAX);

    extern "C" fn note_stream() {
        let _ = std::panic::catch_unwind(|| STREAM.store(StreamId::current().value, Ordering::Relaxed));
    }

    // Runs when the library is loaded, on the thread that loads it: the one that runs the cells.
    #[cfg(target_os = "linux")]
    #[used]
    #[link_section = ".init_array"]
    static NOTE_STREAM: extern "C" fn() = note_stream;

    /// The answer's code, its text written into `message` (at most `cap` bytes) and its length
    /// into `len`.
    fn answer(
        f: impl FnOnce() -> Result<(), String> + std::panic::UnwindSafe,
        message: *mut u8,
        cap: usize,
        len: *mut usize,
    ) -> i32 {
        let (code, text) = match std::panic::catch_unwind(f) {
            Ok(Ok(())) => (0, String::new()),
            Ok(Err(e)) => (1, e),
            Err(p) => (
                2,
                p.downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".to_string()),
            ),
        };
        let n = text.len().min(cap);
        if !message.is_null() && !len.is_null() {
            // SAFETY: the caller gives `cap` writable bytes at `message` and a writable `len`.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), message, n);
                *len = n;
            }
        }
        code
    }

    /// `f` on the device's client, on the notebook thread's stream.
    fn on_stream<T>(
        device: u32,
        f: impl FnOnce(&gpumem_books_cubecl::client::ComputeClient<CudaRuntime>) -> T,
    ) -> Result<T, String> {
        let value = STREAM.load(Ordering::Relaxed);
        if value == u64::MAX {
            return Err("the notebook thread's cubecl stream is not known".to_string());
        }
        let client = CudaRuntime::client(&CudaDevice { index: device as usize });
        Ok(StreamId { value }.executes(|| f(&client)))
    }

    #[no_mangle]
    pub extern "C" fn gpumem_books_cubecl_stream_v1() -> u64 {
        STREAM.load(Ordering::Relaxed)
    }

    #[no_mangle]
    pub extern "C" fn gpumem_books_cubecl_usage_v1(
        device: u32,
        out: *mut u64,
        message: *mut u8,
        cap: usize,
        len: *mut usize,
    ) -> i32 {
        let out = out as usize;
        answer(
            move || {
                let u = on_stream(device, |c| c.memory_usage())?.map_err(|e| format!("{e:?}"))?;
                let values = [u.number_allocs, u.bytes_in_use, u.bytes_padding, u.bytes_reserved];
                // SAFETY: the caller gives four writable u64 at `out`.
                unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), out as *mut u64, 4) };
                Ok(())
            },
            message,
            cap,
            len,
        )
    }

    #[no_mangle]
    pub extern "C" fn gpumem_books_cubecl_flush_v1(device: u32, message: *mut u8, cap: usize, len: *mut usize) -> i32 {
        answer(move || on_stream(device, |c| c.flush())?.map_err(|e| format!("{e:?}")), message, cap, len)
    }

    #[no_mangle]
    pub extern "C" fn gpumem_books_cubecl_cleanup_v1(device: u32, message: *mut u8, cap: usize, len: *mut usize) -> i32 {
        answer(move || on_stream(device, |c| c.memory_cleanup()), message, cap, len)
    }
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(k: &str, s: &str) -> Vec<(String, String)> {
        vec![(k.to_string(), s.to_string())]
    }

    #[test]
    fn burn_0_21_and_cubecl_0_10_with_cuda_get_the_reader_and_nothing_else_does() {
        for (k, s) in [
            ("burn", r#"{ version = "0.21", default-features = false, features = ["std", "cuda", "autodiff"] }"#),
            ("burn", r#"{ version = "^0.21.0", features = ["cuda"] }"#),
            ("burn", r#"{ version = "=0.21.0", features = ["cuda"] }"#),
            ("cubecl", r#"{ version = "0.10", features = ["cuda"] }"#),
            ("b", r#"{ package = "burn", version = "0.21", features = ["cuda"] }"#),
        ] {
            let (d, module) = for_deps(&dep(k, s)).unwrap_or_else(|| panic!("{k} = {s}: no reader"));
            assert!(module.contains("gpumem_books_cubecl_usage_v1"));
            match k {
                // cubecl itself: used under the notebook's key, no second name for one package.
                "cubecl" => {
                    assert_eq!(d, None);
                    assert!(module.starts_with("\nextern crate cubecl as gpumem_books_cubecl;\n"), "{module}");
                }
                _ => {
                    let d = d.unwrap_or_default();
                    assert!(d.starts_with("gpumem_books_cubecl = { package = \"cubecl\", version = \"0.10.0\""), "{d}");
                }
            }
        }
        // burn and cubecl in one generation: the notebook's cubecl, no extra dependency.
        let both = [
            dep("burn", r#"{ version = "0.21", features = ["cuda"] }"#),
            dep("cubecl", r#"{ version = "0.10.0", features = ["cuda"] }"#),
        ]
        .concat();
        assert_eq!(for_deps(&both).map(|(d, _)| d), Some(None));
        for (k, s) in [
            ("burn", r#""0.21""#),
            ("burn", r#"{ version = "0.21", features = ["wgpu"] }"#),
            ("burn", r#"{ version = "0.22", features = ["cuda"] }"#),
            ("burn", r#"{ version = "0.2", features = ["cuda"] }"#),
            ("burn", r#"{ version = "0.210", features = ["cuda"] }"#),
            ("burn", r#"{ version = ">=0.21, <0.23", features = ["cuda"] }"#),
            ("burn", r#"{ version = "*", features = ["cuda"] }"#),
            ("cubecl", r#"{ version = "0.11", features = ["cuda"] }"#),
            ("candle-core", r#"{ version = "0.10", features = ["cuda"] }"#),
            ("burn", "not toml ["),
        ] {
            assert!(for_deps(&dep(k, s)).is_none(), "{k} = {s}: a reader for a spec it does not know");
        }
    }
}
