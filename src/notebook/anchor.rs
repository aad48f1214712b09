//! The process-wide anchor: one allocator state per process, however many copies of this crate
//! the process has loaded.
//!
//! Under evcxr every notebook cell is compiled into its own shared object, and each links its
//! own copy of every `:dep` crate, statics included (reference/evcxr.md §B): a `static` set in
//! cell 1 is fresh again in cell 2. So the per-process state ([`Shared`]: the device registry
//! and the kernel's control channel) lives in one leaked allocation, and its address is
//! published in the process environment (`GPUMEM_NB_ANCHOR`), the one store every copy shares.
//! A copy reads it once and then keeps the reference in its own `static`.
//!
//! The published value is `<fingerprint>@<pid>@<address>`:
//! - the fingerprint (crate version, features, the layout of [`Shared`]) makes sure only a copy
//!   built from the same crate, with the same layout, ever uses the address;
//! - the pid makes sure a child process, which inherits the environment but not the memory,
//!   never does.
//!
//! This file, `device/cuda/` and `record/unwind/machine.rs` are the only places with `unsafe`
//! code.

use crate::notebook::registry::Registry;
use std::sync::{Mutex, OnceLock};

/// The environment variable holding the anchor.
pub(crate) const ANCHOR_VAR: &str = "GPUMEM_NB_ANCHOR";

/// Everything that must be one per process.
pub(crate) struct Shared {
    /// The device registry (resolved selection, config, the allocators opened).
    pub(crate) registry: Mutex<Option<Registry>>,
    /// Whether the control channel to the gpumem kernel was started in this process.
    pub(crate) control_started: Mutex<bool>,
    /// Every device allocation of the process (`notebook::tracking`).
    pub(crate) tracking: super::tracking::Tracking,
    /// The stock evcxr kernel's per-cell reports (`notebook::stock`).
    pub(crate) reports: super::stock::Switches,
    /// The frameworks whose own books every reading includes (`notebook::frameworks`).
    pub(crate) frameworks: super::frameworks::Watched,
    /// The per-cell records the stock kernel's hooks made, for the metrics endpoint.
    pub(crate) metrics: super::metrics::Exported,
}

/// The reference this copy of the crate uses.
static LOCAL: OnceLock<&'static Shared> = OnceLock::new();

/// Serialises this copy's first lookup (evcxr runs cells one after another, so copies do not
/// race each other in practice; threads of one copy do).
static INIT: Mutex<()> = Mutex::new(());

fn fingerprint() -> String {
    format!(
        "gpumem-nb/{}/cuda={}/size={}/align={}",
        env!("CARGO_PKG_VERSION"),
        cfg!(feature = "cuda"),
        std::mem::size_of::<Shared>(),
        std::mem::align_of::<Shared>()
    )
}

/// The address in a published value, if the value is this process's and this layout's.
fn parse(value: &str) -> Option<usize> {
    let mut parts = value.rsplitn(3, '@');
    let addr = usize::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
    let pid: u32 = parts.next()?.parse().ok()?;
    let fp = parts.next()?;
    let ok =
        fp == fingerprint() && pid == std::process::id() && addr != 0 && addr % std::mem::align_of::<Shared>() == 0;
    ok.then_some(addr)
}

fn lookup() -> Option<&'static Shared> {
    let addr = parse(&std::env::var(ANCHOR_VAR).ok()?)?;
    // SAFETY: the value names this process (pid checked) and was written by `publish` in a copy
    // of this crate with the same version, features and `Shared` layout (fingerprint checked),
    // from a `Box::leak`ed `Shared` that is never freed: the address points to a live,
    // initialised `Shared` for the rest of the process, and `Shared` is `Sync`.
    Some(unsafe { &*(addr as *const Shared) })
}

fn publish(shared: &'static Shared) {
    let value = format!("{}@{}@{:#x}", fingerprint(), std::process::id(), shared as *const Shared as usize);
    // SAFETY: `set_var` is unsafe because another thread may read the environment at the same
    // moment (getenv is not synchronised with setenv). This runs once per process, under
    // `INIT`, on the thread that first touches a device; the variable is new, so no reader can
    // hold a pointer into an old value of it.
    unsafe { std::env::set_var(ANCHOR_VAR, value) };
}

/// The per-process state: found through the environment, or created and published.
pub(crate) fn shared() -> &'static Shared {
    LOCAL.get_or_init(|| {
        let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = lookup() {
            return s;
        }
        let s: &'static Shared = Box::leak(Box::new(Shared {
            registry: Mutex::new(None),
            control_started: Mutex::new(false),
            tracking: super::tracking::Tracking::new(),
            reports: super::stock::Switches::new(),
            frameworks: Default::default(),
            metrics: Default::default(),
        }));
        publish(s);
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_anchor_is_found_again_and_foreign_values_are_refused() {
        let a = shared() as *const Shared;
        assert_eq!(lookup().map(|s| s as *const Shared), Some(a), "the published value resolves to the same state");
        let value = std::env::var(ANCHOR_VAR).unwrap();
        assert!(value.starts_with(&fingerprint()));
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
}
