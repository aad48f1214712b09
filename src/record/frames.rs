//! Stack frames for allocator history: captured cheaply, symbolised late.
//!
//! [`capture`] walks the stack and keeps raw instruction pointers only (no symbol lookup),
//! so recording an event with frames costs a stack walk. [`Symbolizer`] turns them into
//! PyTorch's frame dicts (`name`, `filename`, `line`) when a snapshot is taken, caching each
//! address, and drops the frames of gpumem-nb itself and of the unwinder so the caller's code is
//! on top (innermost first, as PyTorch lists them).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Raw return addresses of one stack, innermost first.
pub(crate) type Frames = Arc<[usize]>;

/// The most frames a stack may keep ([`set_depth`]).
pub(crate) const MAX_FRAMES: usize = 64;

/// Frames walked per stack unless [`set_depth`] says otherwise. Walking costs about 150 ns a
/// frame (DWARF unwinding), and the innermost few are gpumem-nb's own, so 12 keeps the
/// caller's innermost frames at about 1 µs per event (BENCHMARKS.md).
pub(crate) const DEFAULT_DEPTH: usize = 12;

static DEPTH: AtomicUsize = AtomicUsize::new(DEFAULT_DEPTH);

/// Sets how many frames each recorded stack walks (1 ..= [`MAX_FRAMES`]; clamped).
pub fn set_depth(frames: usize) {
    DEPTH.store(frames.clamp(1, MAX_FRAMES), Ordering::Relaxed);
}

/// How many frames each recorded stack walks.
pub(crate) fn depth() -> usize {
    DEPTH.load(Ordering::Relaxed)
}

/// Captures the current stack as raw instruction pointers.
#[inline(never)]
pub(crate) fn capture() -> Frames {
    capture_depth(depth())
}

/// Captures at most `limit` frames (clamped to 1 ..= [`MAX_FRAMES`]).
#[inline(never)]
pub(crate) fn capture_depth(limit: usize) -> Frames {
    let limit = limit.clamp(1, MAX_FRAMES);
    let mut ips = [0usize; MAX_FRAMES];
    let mut n = 0;
    backtrace::trace(|f| {
        ips[n] = f.ip() as usize;
        n += 1;
        n < limit
    });
    Arc::from(&ips[..n])
}

/// One symbolised frame, PyTorch's frame dict.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Frame {
    /// Function name (demangled, without the hash suffix).
    pub name: String,
    /// Source file, or "??" when unknown.
    pub filename: String,
    /// Line, or 0 when unknown.
    pub line: u32,
}

/// Resolves raw frames to [`Frame`]s, caching per address.
#[derive(Default)]
pub(crate) struct Symbolizer {
    cache: HashMap<usize, Arc<[Frame]>>,
}

/// Frames that belong to the allocator or the unwinder, never to the user.
fn is_internal(name: &str) -> bool {
    const PREFIXES: [&str; 4] = ["gpumem_nb::", "<gpumem_nb::", "backtrace::", "<backtrace::"];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Runtime frames below `main` (or below a test harness or a thread's start) that say nothing
/// about the user's code.
fn is_runtime(name: &str) -> bool {
    const PREFIXES: [&str; 13] = [
        "std::rt::",
        "std::sys::",
        "std::thread::",
        "std::panicking::",
        "std::panic::",
        "core::ops::function::",
        "core::panic::",
        "alloc::boxed::",
        "__libc_start",
        "_start",
        "start_thread",
        "clone",
        "test::",
    ];
    let n = name.trim_start_matches('<');
    PREFIXES.iter().any(|p| n.starts_with(p)) || name == "main" || name.starts_with("0x")
}

impl Symbolizer {
    /// A new, empty cache.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn resolve_ip(&mut self, ip: usize) -> Arc<[Frame]> {
        self.cache
            .entry(ip)
            .or_insert_with(|| {
                let mut out = Vec::new();
                // Return addresses point after the call; look up the call instruction.
                backtrace::resolve((ip.saturating_sub(1)) as *mut std::ffi::c_void, |sym| {
                    let name = sym.name().map(|n| format!("{n:#}")).unwrap_or_else(|| format!("{ip:#x}"));
                    let filename = sym.filename().map(|f| f.display().to_string()).unwrap_or_else(|| "??".into());
                    out.push(Frame { name, filename, line: sym.lineno().unwrap_or(0) });
                });
                if out.is_empty() {
                    out.push(Frame { name: format!("{ip:#x}"), filename: "??".into(), line: 0 });
                }
                out.into()
            })
            .clone()
    }

    /// Every frame of a captured stack, innermost first (inlined frames expanded).
    pub(crate) fn symbolize_all(&mut self, frames: &[usize]) -> Vec<Frame> {
        frames.iter().flat_map(|&ip| self.resolve_ip(ip).iter().cloned().collect::<Vec<_>>()).collect()
    }

    /// The user's frames of a captured stack, innermost first.
    pub(crate) fn symbolize(&mut self, frames: &[usize]) -> Vec<Frame> {
        let mut all: Vec<Frame> = Vec::new();
        for &ip in frames {
            all.extend(self.resolve_ip(ip).iter().cloned());
        }
        keep_user(all)
    }
}

/// Standard-library frames (closure shims, iterator adapters) that can sit between our own.
fn is_std(name: &str) -> bool {
    const PREFIXES: [&str; 6] = ["core::", "<core::", "std::", "<std::", "alloc::", "<alloc::"];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Drops the leading (innermost) frames of gpumem-nb, the unwinder and the standard library
/// glue between them, and the trailing runtime frames below the program's own code.
fn keep_user(mut all: Vec<Frame>) -> Vec<Frame> {
    let start = all.iter().position(|f| !is_internal(&f.name) && !is_std(&f.name)).unwrap_or(all.len());
    let mut user = all.split_off(start);
    while user.last().is_some_and(|f| is_runtime(&f.name)) {
        user.pop();
    }
    user
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str) -> Frame {
        Frame { name: name.into(), filename: "x.rs".into(), line: 1 }
    }

    #[test]
    fn user_code_ends_up_on_top() {
        let all = vec![
            f("backtrace::backtrace::trace"),
            f("gpumem_nb::frames::capture"),
            f("core::ops::function::FnOnce::call_once"),
            f("gpumem_nb::allocator::CachingAllocator<B>::malloc"),
            f("my_notebook::train_step"),
            f("gpumem_nb::scope::scope"), // the user's closure ran inside our scope: kept
            f("my_notebook::main"),
            f("std::rt::lang_start_internal"),
            f("main"),
        ];
        let names: Vec<String> = keep_user(all).into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["my_notebook::train_step", "gpumem_nb::scope::scope", "my_notebook::main"]);
    }

    #[test]
    fn capture_walks_the_stack_and_symbolizes() {
        let raw = capture();
        assert!(raw.len() >= 3, "a test runs several frames deep, got {}", raw.len());
        let mut s = Symbolizer::new();
        let all: Vec<Frame> = raw.iter().flat_map(|&ip| s.resolve_ip(ip).to_vec()).collect();
        assert!(all.iter().any(|fr| fr.name.contains("capture_walks_the_stack")), "{all:?}");
    }
}
