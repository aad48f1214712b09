//! cubecl's own books, read through the reader gpumem-kernel compiles into a notebook's session
//! library (`kernel/src/build/books_shim.rs`: C functions built against the notebook's own
//! cubecl), and what the notebook's variables hold by burn's types (the probe of
//! `kernel/src/build/variable_probe.rs`). Found by name among the shared libraries this process
//! has loaded (`libgpumem_deps_*.so`, from `/proc/self/maps`); nothing is loaded that was not
//! already.

use libloading::os::unix::{Library as UnixLib, RTLD_LOCAL, RTLD_NOW};
use std::ffi::OsStr;

type StreamFn = unsafe extern "C" fn() -> u64;
type UsageFn = unsafe extern "C" fn(u32, *mut u64, *mut u8, usize, *mut usize) -> i32;
type CallFn = unsafe extern "C" fn(u32, *mut u8, usize, *mut usize) -> i32;
type ProbeFn = unsafe extern "C" fn(*mut u8, usize, *mut usize) -> u64;

/// The reader of one session library.
pub(crate) struct CubeclBooks {
    stream: StreamFn,
    usage: UsageFn,
    flush: CallFn,
    cleanup: CallFn,
    _lib: libloading::Library,
}

/// cubecl's `MemoryUsage`: live allocations, bytes they use, their padding, bytes reserved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) allocations: u64,
    pub(crate) in_use: u64,
    pub(crate) padding: u64,
    pub(crate) reserved: u64,
}

/// The session libraries (`lib<prefix>….so`) `maps` (`/proc/self/maps`' text) shows loaded,
/// each once, in order.
fn session_libraries<'a>(maps: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
        let name = path.rsplit('/').next().unwrap_or(path);
        let ours = name.strip_prefix("lib").is_some_and(|n| n.starts_with(prefix) && n.ends_with(".so"));
        if ours && !out.contains(&path) {
            out.push(path);
        }
    }
    out
}

/// The first loaded session library (`lib<prefix>….so`: gpumem-kernel's generated crates) with a
/// reader of cubecl's books, if any.
pub(crate) fn find(prefix: &str) -> Option<CubeclBooks> {
    let maps = crate::procfs::read("/proc/self/maps")?;
    session_libraries(&maps, prefix).into_iter().find_map(|p| open(p).ok())
}

fn open(path: &str) -> Result<CubeclBooks, String> {
    let lib = reopen(path)?;
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            // SAFETY: looked up by its C name; `$ty` is the prototype the kernel's generated
            // reader defines for it (`books_shim`, versioned `_v1`). The pointer stays valid
            // while `lib` lives, which is stored beside it and never unloaded.
            unsafe { lib.get::<$ty>($name) }.map(|s| *s).map_err(|e| e.to_string())?
        }};
    }
    let stream = sym!(b"gpumem_books_cubecl_stream_v1", StreamFn);
    let usage = sym!(b"gpumem_books_cubecl_usage_v1", UsageFn);
    let flush = sym!(b"gpumem_books_cubecl_flush_v1", CallFn);
    let cleanup = sym!(b"gpumem_books_cubecl_cleanup_v1", CallFn);
    Ok(CubeclBooks { stream, usage, flush, cleanup, _lib: lib })
}

/// A library this process has already loaded, opened again by its path.
fn reopen(path: &str) -> Result<libloading::Library, String> {
    // SAFETY: `path` is a library this process has already loaded (it is mapped), so opening it
    // again runs no initialiser and only returns a new reference to it; RTLD_LOCAL adds nothing
    // to the global scope.
    Ok(unsafe { UnixLib::open(Some(OsStr::new(path)), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| e.to_string())?.into())
}

/// The probe of the variables a cell ends with, in one session library.
struct VariableProbe {
    probe: ProbeFn,
    _lib: libloading::Library,
}

/// The session libraries last looked at, and the probe found in them.
static PROBE: std::sync::Mutex<(Vec<String>, Option<VariableProbe>)> = std::sync::Mutex::new((Vec::new(), None));

/// The last answer of the variable probe in the loaded session libraries (`lib<prefix>….so`):
/// the number of the cell's probe (0: none yet) and its lines; `None` without a probe. The
/// libraries are looked at again only when the loaded ones change.
pub(crate) fn probe_answer(prefix: &str) -> Option<(u64, String)> {
    let mut found = PROBE.lock().unwrap_or_else(|p| p.into_inner());
    if found.1.is_none() {
        let maps = crate::procfs::read("/proc/self/maps")?;
        let libs: Vec<String> = session_libraries(&maps, prefix).into_iter().map(str::to_owned).collect();
        if libs != found.0 {
            found.1 = libs.iter().find_map(|p| open_probe(p).ok());
            found.0 = libs;
        }
    }
    let probe = found.1.as_ref()?.probe;
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let mut len = 0usize;
        // SAFETY: `buf` has `cap` writable bytes and `len` is one usize; the probe writes at most
        // `cap` bytes and the whole answer's length, and holds its own lock while it does.
        let n = unsafe { probe(buf.as_mut_ptr(), buf.len(), &mut len) };
        if len <= buf.len() {
            return Some((n, String::from_utf8_lossy(&buf[..len]).into_owned()));
        }
        buf.resize(len, 0);
    }
}

fn open_probe(path: &str) -> Result<VariableProbe, String> {
    let lib = reopen(path)?;
    // SAFETY: looked up by its C name; `ProbeFn` is the prototype the kernel's generated probe
    // defines for it (`variable_probe`, versioned `_v1`). The pointer stays valid while `lib`
    // lives, which is stored beside it and never unloaded.
    let probe = unsafe { lib.get::<ProbeFn>(b"gpumem_probe_burn_v1") }.map(|s| *s).map_err(|e| e.to_string())?;
    Ok(VariableProbe { probe, _lib: lib })
}

/// The reader's answer: `Ok` for 0, else its text, said as cubecl's error or its panic.
fn answered(code: i32, message: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(message);
    let text = text.lines().next().unwrap_or("");
    match code {
        0 => Ok(()),
        1 => Err(text.to_string()),
        2 => Err(format!("cubecl panicked: {text}")),
        other => Err(format!("the session library's reader answered {other}")),
    }
}

impl CubeclBooks {
    /// The cubecl stream of the thread that runs the cells (`u64::MAX`: not known).
    pub(crate) fn stream(&self) -> u64 {
        // SAFETY: `fn() -> u64` with no arguments; the reader catches its own panics.
        unsafe { (self.stream)() }
    }

    /// cubecl's books for CUDA device `device`, the cells' stream.
    pub(crate) fn usage(&self, device: u32) -> Result<Usage, String> {
        let mut out = [0u64; 4];
        let mut message = [0u8; 512];
        let mut len = 0usize;
        // SAFETY: `out` has the four u64 the reader writes, `message` `cap` writable bytes and
        // `len` one usize; the reader writes nothing else and catches its own panics.
        let code = unsafe { (self.usage)(device, out.as_mut_ptr(), message.as_mut_ptr(), message.len(), &mut len) };
        answered(code, &message[..len.min(message.len())])?;
        Ok(Usage { allocations: out[0], in_use: out[1], padding: out[2], reserved: out[3] })
    }

    /// Runs what the cells queued on device `device` (cubecl's `flush`).
    pub(crate) fn flush(&self, device: u32) -> Result<(), String> {
        self.call(self.flush, device)
    }

    /// Gives back what cubecl's pools keep cached on device `device` (`memory_cleanup`).
    pub(crate) fn cleanup(&self, device: u32) -> Result<(), String> {
        self.call(self.cleanup, device)
    }

    fn call(&self, f: CallFn, device: u32) -> Result<(), String> {
        let mut message = [0u8; 512];
        let mut len = 0usize;
        // SAFETY: `message` has `cap` writable bytes and `len` is one usize; the reader writes
        // nothing else and catches its own panics.
        let code = unsafe { f(device, message.as_mut_ptr(), message.len(), &mut len) };
        answered(code, &message[..len.min(message.len())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_libraries_are_found_in_the_maps_once_each() {
        let maps = "\
7f00-7f01 r--p 00000000 08:01 11 /home/u/.cache/gpumem-kernel/evcxr/target/debug/deps/libgpumem_deps_ab12.so
7f01-7f02 r-xp 00001000 08:01 11 /home/u/.cache/gpumem-kernel/evcxr/target/debug/deps/libgpumem_deps_ab12.so
7f02-7f03 r--p 00000000 08:01 12 /home/u/.cache/gpumem-kernel/evcxr/target/debug/deps/libcode_3.so
7f03-7f04 rw-p 00000000 00:00 0
7f04-7f05 r--p 00000000 08:01 13 /usr/lib/libgpumem_deps_x.so.bak
7f05-7f06 r--p 00000000 08:01 14 /d/libgpumem_deps_cd34.so
";
        assert_eq!(
            session_libraries(maps, "gpumem_deps_"),
            [
                "/home/u/.cache/gpumem-kernel/evcxr/target/debug/deps/libgpumem_deps_ab12.so",
                "/d/libgpumem_deps_cd34.so"
            ]
        );
    }

    #[test]
    fn answers_are_said_as_cubecl_s_error_or_panic() {
        assert_eq!(answered(0, b""), Ok(()));
        assert_eq!(answered(1, b"Generic { reason: \"x\" }\nmore"), Err("Generic { reason: \"x\" }".to_string()));
        assert_eq!(answered(2, b"boom"), Err("cubecl panicked: boom".to_string()));
        assert_eq!(answered(7, b""), Err("the session library's reader answered 7".to_string()));
    }

    #[test]
    fn a_process_without_a_session_library_has_no_reader() {
        assert!(find("gpumem_deps_").is_none());
        assert!(probe_answer("gpumem_deps_").is_none());
    }
}
