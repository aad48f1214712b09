//! The process-wide anchor: one value per name per process, however many copies of this crate
//! the process has loaded.
//!
//! Under evcxr every notebook cell is compiled into its own shared object, and each links its
//! own copy of every `:dep` crate, statics included (evcxr issue #331): a `static` set in cell 1 is fresh again in cell 2. So what must be one per
//! process (the device registry, tracking, the control channel, …) lives in leaked
//! allocations, found through one map whose address is published in the process environment
//! (`GPUMEM_NB_ANCHOR`), the one store every copy shares. The anchor knows no room: a room asks
//! for its own slot by name with [`per_process!`], which also keeps the reference in the calling
//! copy's own `static`, so a slot costs a map lookup once per copy of the crate.
//!
//! The published value is `<fingerprint>@<pid>@<address>`:
//! - the fingerprint (crate version, features, the layout of the map) makes sure only a copy
//!   built from the same crate, with the same layout, ever uses the address;
//! - the pid makes sure a child process, which inherits the environment but not the memory,
//!   never does.
//!
//! Each slot carries a fingerprint of its own (crate version, features, the slot's type name,
//! size and alignment): a copy finds a slot only where the value there has the type it expects.
//!
//! This file, `device/cuda/` and `record/unwind/machine.rs` are the only places with `unsafe`
//! code.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The environment variable holding the anchor.
pub(crate) const ANCHOR_VAR: &str = "GPUMEM_NB_ANCHOR";

/// Every per-process value, by name: its fingerprint and the address of its leaked value.
struct Slots {
    map: Mutex<HashMap<String, (String, Leaked)>>,
}

/// The address of a slot's leaked value, kept as a pointer (not an integer), so that the value
/// stays reachable for tools that look for leaks (Miri).
#[derive(Clone, Copy)]
struct Leaked(*const ());

// SAFETY: a `Leaked` points at a `Box::leak`ed value that is never freed and whose type is
// `Send + Sync` (`slot`'s bound); the map only stores and returns the address.
unsafe impl Send for Leaked {}

/// The map this copy of the crate uses.
static LOCAL: OnceLock<&'static Slots> = OnceLock::new();

/// Serialises this copy's first lookup (evcxr runs cells one after another, so copies do not
/// race each other in practice; threads of one copy do).
static INIT: Mutex<()> = Mutex::new(());

/// What every copy that shares state must have in common: the crate's version, the features
/// that change what its state holds, and the compiler that laid its types out (`build.rs`):
/// gpumem-kernel's own copy in the notebook's process and the copy a `:dep gpumem-nb` builds may
/// come from different compilers (a wheel's kernel and the user's toolchain).
pub(crate) fn build_fingerprint() -> String {
    format!(
        "gpumem-nb/{}/cuda={}/cubecl={}/cubecl010={}/{}",
        env!("CARGO_PKG_VERSION"),
        cfg!(feature = "cuda"),
        cfg!(feature = "cubecl"),
        cfg!(feature = "cubecl010"),
        env!("GPUMEM_NB_RUSTC")
    )
}

/// What a copy must agree on with the one that published the map.
fn fingerprint() -> String {
    format!("{}/size={}/align={}", build_fingerprint(), std::mem::size_of::<Slots>(), std::mem::align_of::<Slots>())
}

/// What a copy must agree on with the one that created the slot `name` holding a `T`.
fn slot_fingerprint<T>(name: &str) -> String {
    format!(
        "{name}/{}/{}/size={}/align={}",
        build_fingerprint(),
        std::any::type_name::<T>(),
        std::mem::size_of::<T>(),
        std::mem::align_of::<T>()
    )
}

/// The address in a published value, if the value is this process's and this layout's.
fn parse(value: &str) -> Option<usize> {
    let mut parts = value.rsplitn(3, '@');
    let addr = usize::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
    let pid: u32 = parts.next()?.parse().ok()?;
    let fp = parts.next()?;
    let ok = fp == fingerprint() && pid == std::process::id() && addr != 0 && addr % std::mem::align_of::<Slots>() == 0;
    ok.then_some(addr)
}

fn lookup() -> Option<&'static Slots> {
    let addr = parse(&std::env::var(ANCHOR_VAR).ok()?)?;
    // SAFETY: the value names this process (pid checked) and was written by `publish` in a copy
    // of this crate with the same version, features and `Slots` layout (fingerprint checked),
    // from a `Box::leak`ed `Slots` that is never freed: the address points to a live,
    // initialised `Slots` for the rest of the process, and `Slots` is `Sync`.
    Some(unsafe { &*(addr as *const Slots) })
}

fn publish(slots: &'static Slots) {
    let value = format!("{}@{}@{:#x}", fingerprint(), std::process::id(), slots as *const Slots as usize);
    // SAFETY: `set_var` is unsafe because another thread may read the environment at the same
    // moment (getenv is not synchronised with setenv). This runs once per process, under
    // `INIT`, on the thread that first asks for a slot; the variable is new, so no reader can
    // hold a pointer into an old value of it.
    unsafe { std::env::set_var(ANCHOR_VAR, value) };
}

/// Publishes `name=value` in the process environment for every copy of the crate, once per
/// process: the tracker's announcement (`tracking::TRACKER_VAR`), made by gpumem-kernel's copy
/// as the notebook's process starts.
pub(crate) fn publish_var(name: &str, value: &str) {
    if std::env::var_os(name).is_some_and(|v| v == value) {
        return;
    }
    let _guard = crate::sync::lock(&INIT);
    // SAFETY: as in `publish`: `set_var` races with readers of the environment on other threads.
    // Its one caller (`session::watch_from_start`) runs on the notebook process's main thread
    // before gpumem-kernel starts any other thread there: no other thread can read the
    // environment meanwhile.
    unsafe { std::env::set_var(name, value) };
}

/// The per-process map: found through the environment, or created and published.
fn slots() -> &'static Slots {
    LOCAL.get_or_init(|| {
        let _guard = crate::sync::lock(&INIT);
        if let Some(s) = lookup() {
            return s;
        }
        let s: &'static Slots = Box::leak(Box::new(Slots { map: Mutex::new(HashMap::new()) }));
        publish(s);
        s
    })
}

/// The one `T` of this process named `name`: the value an earlier call (from any copy of the
/// crate) made, or `init()`'s, leaked and kept for the rest of the process. A slot whose
/// fingerprint differs (another version of the crate made it, or another type) is never read:
/// this copy then gets a value of its own under a name that says so. `init` runs under the
/// map's lock, so it must not ask for a slot itself. Use [`per_process!`], which keeps the
/// reference in the calling copy's own `static`.
pub(crate) fn slot<T: Send + Sync + 'static>(name: &str, init: impl FnOnce() -> T) -> &'static T {
    let fp = slot_fingerprint::<T>(name);
    let mut map = crate::sync::lock(&slots().map);
    let key = match map.get(name) {
        Some((f, _)) if *f != fp => fp.clone(),
        _ => name.to_string(),
    };
    if let Some((f, addr)) = map.get(&key)
        && *f == fp
    {
        // SAFETY: `addr` was stored below by a copy of this crate for a slot with the same
        // fingerprint: the same crate version and features and a type of the same name, size
        // and alignment, i.e. the same `T` compiled from the same source. It is the address of
        // a `Box::leak`ed `T` that is never freed, and `T: Sync`, so sharing `&'static T`
        // across threads and copies is sound.
        return unsafe { &*addr.0.cast::<T>() };
    }
    let value: &'static T = Box::leak(Box::new(init()));
    map.insert(key, (fp, Leaked((value as *const T).cast())));
    value
}

/// `per_process!("name", Type, init)`: the process's one `Type` named "name" (see [`slot`]), kept
/// in a `static` of the calling copy of the crate after the first lookup.
macro_rules! per_process {
    ($name:literal, $ty:ty, $init:expr) => {{
        static LOCAL: std::sync::OnceLock<&'static $ty> = std::sync::OnceLock::new();
        *LOCAL.get_or_init(|| $crate::notebook::anchor::slot::<$ty>($name, $init))
    }};
}
pub(crate) use per_process;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn published_anchor_is_found_again_and_foreign_values_are_refused() {
        let a = slots() as *const Slots;
        assert_eq!(lookup().map(|s| s as *const Slots), Some(a), "the published value resolves to the same map");
        let value = std::env::var(ANCHOR_VAR).unwrap();
        assert!(value.starts_with(&fingerprint()));
        // The compiler is part of it: a copy built by another never reads this map.
        assert!(fingerprint().contains(env!("GPUMEM_NB_RUSTC")) && env!("GPUMEM_NB_RUSTC").starts_with("rustc "));
        assert!(value.contains(&format!("@{}@", std::process::id())));
        // What `lookup` refuses: another process's anchor, another layout, garbage.
        for bad in [
            format!("{}@{}@{:#x}", fingerprint(), std::process::id() + 1, a as usize),
            format!("gpumem-nb/0.0.0/cuda=false/size=1/align=1@{}@{:#x}", std::process::id(), a as usize),
            "garbage".to_string(),
            format!("{}@{}@0x0", fingerprint(), std::process::id()),
        ] {
            assert!(parse(&bad).is_none(), "{bad}");
        }
        assert_eq!(parse(&value), Some(a as usize));
    }

    #[test]
    fn a_slot_is_made_once_and_found_by_name() {
        let a: &'static AtomicUsize = slot("test-counter", || AtomicUsize::new(7));
        a.fetch_add(1, Ordering::Relaxed);
        let b: &'static AtomicUsize = slot("test-counter", || AtomicUsize::new(0));
        assert!(std::ptr::eq(a, b), "the second lookup finds the first value");
        assert_eq!(b.load(Ordering::Relaxed), 8);
        let other: &'static AtomicUsize = slot("test-other", || AtomicUsize::new(0));
        assert!(!std::ptr::eq(a, other));
        // Through the macro: the same slot, kept in a static of this copy.
        let c = per_process!("test-counter", AtomicUsize, || AtomicUsize::new(0));
        assert!(std::ptr::eq(a, c));
    }

    #[test]
    fn a_slot_of_another_type_is_never_read_as_this_one() {
        let n: &'static AtomicUsize = slot("test-typed", || AtomicUsize::new(42));
        let s: &'static Mutex<String> = slot("test-typed", || Mutex::new("mine".into()));
        assert_eq!(*s.lock().unwrap(), "mine", "another type under the same name gets its own value");
        assert_eq!(n.load(Ordering::Relaxed), 42);
        let again: &'static Mutex<String> = slot("test-typed", || Mutex::new("not made".into()));
        assert!(std::ptr::eq(s, again));
    }
}
