//! Device selection and the per-process registry: one [`Allocator`] per device. It only selects
//! and opens devices; what opening the first one starts is `notebook::session`'s.
//!
//! `GPUMEM_NB_DEVICE` chooses the backend:
//!
//! | value | device |
//! | --- | --- |
//! | `auto` (default, also when unset or empty) | CUDA when the CUDA probe (`backend::cuda::probe`) finds a GPU, else simulated with 80 GiB |
//! | `cuda` | CUDA; an error value ([`Error::NoCuda`]) when there is no usable GPU |
//! | `sim` | the simulated device with 80 GiB ([`DEFAULT_CAPACITY`]) |
//! | `sim:SIZE` | the simulated device with SIZE bytes (`sim:24GiB`, `sim:512MiB`, `sim:1.5TiB`) |
//!
//! The allocator configuration comes from `GPUMEM_NB_ALLOC_CONF` (same syntax as
//! `PYTORCH_CUDA_ALLOC_CONF`). Both are read once, when the first device is opened; a malformed
//! value is an error value and nothing is cached, so a corrected environment is picked up by the
//! next call.
#![forbid(unsafe_code)]

use crate::allocator::Allocator;
use crate::allocator::CachingAllocator;
use crate::device::any::AnyBackend;
use crate::device::sim::{DEFAULT_CAPACITY, SimBackend};
use crate::device::{Backend, DriverSink};
use crate::error::{Error, Result};
use crate::policy::config::AllocatorConfig;
use crate::sync::lock;
use crate::units::{GIB, MIB, parse_size};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// The environment variable that selects the device backend.
pub(crate) const ENV_VAR: &str = "GPUMEM_NB_DEVICE";

/// What `GPUMEM_NB_DEVICE` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeviceSelection {
    /// CUDA when a usable GPU is there, otherwise simulated with 80 GiB.
    Auto,
    /// CUDA, or an error.
    Cuda,
    /// Simulated devices: the capacity of each in bytes, and how many (`sim:2x24GiB`: two).
    Sim(u64, usize),
}

impl fmt::Display for DeviceSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelection::Auto => f.write_str("auto"),
            DeviceSelection::Cuda => f.write_str("cuda"),
            DeviceSelection::Sim(c, n) => {
                let many = if *n > 1 { format!("{n}x") } else { String::new() };
                match *c {
                    c if c % GIB == 0 => write!(f, "sim:{many}{}GiB", c / GIB),
                    c if c % MIB == 0 => write!(f, "sim:{many}{}MiB", c / MIB),
                    c => write!(f, "sim:{many}{c}"),
                }
            }
        }
    }
}

/// Parses a `GPUMEM_NB_DEVICE` value (case-insensitive; surrounding blanks ignored; empty means
/// `auto`). A malformed value is [`Error::Setting`], one line naming it.
pub(crate) fn parse_selection(value: &str) -> Result<DeviceSelection> {
    let v = value.trim();
    let bad = |why: &str| {
        Error::Setting(format!(
            "{ENV_VAR}: invalid value {value:?}{why}; expected auto|cuda|sim|sim:SIZE|sim:NxSIZE (e.g. sim:24GiB, \
             sim:2x24GiB)"
        ))
    };
    let lower = v.to_ascii_lowercase();
    match lower.as_str() {
        "" | "auto" => Ok(DeviceSelection::Auto),
        "cuda" => Ok(DeviceSelection::Cuda),
        "sim" => Ok(DeviceSelection::Sim(DEFAULT_CAPACITY, 1)),
        _ => {
            let Some(size) = lower.strip_prefix("sim:") else {
                return Err(bad(""));
            };
            // `2x24GiB`: several simulated devices of one size.
            let (count, size) = match size.split_once('x') {
                Some((n, size)) if !n.trim().is_empty() && n.trim().bytes().all(|b| b.is_ascii_digit()) => {
                    match n.trim().parse::<usize>() {
                        Ok(n @ 1..=64) => (n, size),
                        _ => return Err(bad(&format!(" ({} simulated devices: from 1 to 64)", n.trim()))),
                    }
                }
                _ => (1, size),
            };
            match parse_size(size) {
                Some(0) => Err(bad(" (the simulated device needs a capacity above 0)")),
                Some(c) => Ok(DeviceSelection::Sim(c, count)),
                None => Err(bad(&format!(" ({:?} is not a size)", size.trim()))),
            }
        }
    }
}

/// The parsed `GPUMEM_NB_DEVICE` of the environment now (for reports; the registry itself reads
/// it once, when the first device is opened).
pub(crate) fn selection() -> Result<DeviceSelection> {
    match std::env::var(ENV_VAR) {
        Ok(v) => parse_selection(&v),
        Err(std::env::VarError::NotPresent) => Ok(DeviceSelection::Auto),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(Error::Setting(format!("{ENV_VAR}: invalid value {v:?} (not UTF-8); expected auto|cuda|sim|sim:SIZE")))
        }
    }
}

/// What a [`DeviceSelection`] came to on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// CUDA with this many visible devices.
    Cuda {
        /// Number of CUDA devices.
        devices: usize,
    },
    /// Simulated devices (index 0 and up).
    Simulated {
        /// Capacity of each, in bytes.
        capacity: u64,
        /// How many.
        count: usize,
        /// Why `auto` fell back to the simulated device (the CUDA probe's answer); `None` when
        /// the simulated device was asked for.
        fallback_reason: Option<String>,
    },
}

impl Resolved {
    /// How many devices there are.
    pub(crate) fn device_count(&self) -> usize {
        match self {
            Resolved::Cuda { devices } => *devices,
            Resolved::Simulated { count, .. } => *count,
        }
    }
}

/// Resolves a selection on this machine: probes CUDA for `auto` and `cuda`.
pub(crate) fn resolve(selection: DeviceSelection) -> Result<Resolved> {
    match selection {
        DeviceSelection::Sim(capacity, count) => Ok(Resolved::Simulated { capacity, count, fallback_reason: None }),
        DeviceSelection::Cuda => probe_cuda().map(|devices| Resolved::Cuda { devices }).map_err(Error::NoCuda),
        DeviceSelection::Auto => Ok(match probe_cuda() {
            Ok(devices) => Resolved::Cuda { devices },
            Err(reason) => Resolved::Simulated { capacity: DEFAULT_CAPACITY, count: 1, fallback_reason: Some(reason) },
        }),
    }
}

#[cfg(feature = "cuda")]
fn probe_cuda() -> std::result::Result<usize, String> {
    crate::device::cuda::probe().map_err(|e| e.to_string())
}

#[cfg(not(feature = "cuda"))]
fn probe_cuda() -> std::result::Result<usize, String> {
    Err("gpumem-nb was built without the `cuda` feature".into())
}

/// A backend for device `index` as `resolved` says (checks the index).
pub(crate) fn open_backend(resolved: &Resolved, index: usize) -> Result<AnyBackend> {
    let count = resolved.device_count();
    if index >= count {
        let what = match resolved {
            Resolved::Cuda { .. } => format!("{count} CUDA device(s)"),
            Resolved::Simulated { count: 1, .. } => "1 simulated device (index 0)".to_string(),
            Resolved::Simulated { count, .. } => format!("{count} simulated devices (index 0 to {})", count - 1),
        };
        return Err(Error::InvalidArgument(format!("device index {index} is out of range: there is {what}")));
    }
    match resolved {
        Resolved::Simulated { capacity, .. } => {
            // The process's own device: listed in the simulated process table, as NVML lists a
            // process with a context on a GPU.
            let mut sim = SimBackend::new(index as i32, *capacity);
            sim.publish_usage();
            Ok(AnyBackend::Sim(sim))
        }
        #[cfg(feature = "cuda")]
        Resolved::Cuda { .. } => match crate::device::cuda::CudaBackend::new(index) {
            Ok(b) => Ok(AnyBackend::Cuda(b)),
            Err(crate::device::DeviceError::Unavailable(why)) => Err(Error::NoCuda(why)),
            Err(e) => Err(e.into()),
        },
        #[cfg(not(feature = "cuda"))]
        Resolved::Cuda { .. } => Err(Error::NoCuda("gpumem-nb was built without the `cuda` feature".into())),
    }
}

/// The registry's state: the resolved selection and config, read once, and the devices opened.
pub(crate) struct Registry {
    resolved: Resolved,
    config: AllocatorConfig,
    devices: Vec<Option<Arc<Allocator>>>,
}

impl Registry {
    fn from_env() -> Result<Self> {
        let resolved = resolve(selection()?)?;
        let config = AllocatorConfig::from_env()?;
        let devices = vec![None; resolved.device_count()];
        Ok(Registry { resolved, config, devices })
    }
}

/// The process's registry, one per process (under evcxr every cell links its own copy of this
/// crate, and all copies reach this one state through [`super::anchor`]).
fn registry() -> MutexGuard<'static, Option<Registry>> {
    // A panic while the lock was held cannot leave `Registry` half-updated (each update is one
    // assignment), so a poisoned lock is recovered.
    lock(super::anchor::per_process!("registry", Mutex<Option<Registry>>, || Mutex::new(None)))
}

/// The allocator of device `index` in this process, and whether this call opened it: created on
/// first use, then the same `Arc`. Before a device is opened, `prepare` is told what the
/// selection resolved to and gives the sink the new backend reports its driver events to (see
/// `notebook::session`, which starts tracking there). Thread-safe; errors (a malformed setting,
/// no GPU for `cuda`, an index out of range) are values and leave nothing cached.
pub(crate) fn open(
    index: usize,
    prepare: impl FnOnce(&Resolved) -> Option<DriverSink>,
) -> Result<(Arc<Allocator>, bool)> {
    let mut guard = registry();
    let reg = match guard.as_mut() {
        Some(reg) => reg,
        None => guard.insert(Registry::from_env()?),
    };
    if let Some(Some(a)) = reg.devices.get(index) {
        return Ok((Arc::clone(a), false));
    }
    let sink = prepare(&reg.resolved);
    let mut backend = open_backend(&reg.resolved, index)?;
    if let Some(sink) = sink {
        Backend::set_driver_sink(&mut backend, sink);
    }
    let alloc = Arc::new(CachingAllocator::new(backend, reg.config.clone()));
    reg.devices[index] = Some(Arc::clone(&alloc));
    Ok((alloc, true))
}

/// The allocators opened so far in this process, by device index.
pub fn opened() -> Vec<Arc<Allocator>> {
    registry().as_ref().map(|r| r.devices.iter().flatten().cloned().collect()).unwrap_or_default()
}

/// What the registry resolved the selection to, once a device has been opened (`None` before).
pub(crate) fn resolved() -> Option<Resolved> {
    registry().as_ref().map(|r| r.resolved.clone())
}

/// The device a notebook will use before the crate has opened one: the simulated one where
/// `GPUMEM_NB_DEVICE` asks for it, the first GPU NVML lists, else none.
pub fn device_before_use(nvml: &crate::device::nvml::NvmlSnapshot) -> String {
    match (selection(), nvml.devices.first()) {
        (Ok(DeviceSelection::Sim(..)), _) => "sim:0 (simulated)".into(),
        (_, Some(d)) => format!("cuda:0 {} (not used yet)", d.name),
        (Ok(DeviceSelection::Auto), None) => "sim:0 (simulated)".into(),
        _ => "device n/a".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::TIB;

    #[test]
    fn parses_every_form() {
        assert_eq!(parse_selection("").unwrap(), DeviceSelection::Auto);
        assert_eq!(parse_selection("auto").unwrap(), DeviceSelection::Auto);
        assert_eq!(parse_selection(" AUTO ").unwrap(), DeviceSelection::Auto);
        assert_eq!(parse_selection("cuda").unwrap(), DeviceSelection::Cuda);
        assert_eq!(parse_selection("Cuda").unwrap(), DeviceSelection::Cuda);
        assert_eq!(parse_selection("sim").unwrap(), DeviceSelection::Sim(80 * GIB, 1));
        assert_eq!(parse_selection("sim:24GiB").unwrap(), DeviceSelection::Sim(24 * GIB, 1));
        assert_eq!(parse_selection("sim:24 GiB").unwrap(), DeviceSelection::Sim(24 * GIB, 1));
        assert_eq!(parse_selection("SIM:512MiB").unwrap(), DeviceSelection::Sim(512 * MIB, 1));
        assert_eq!(parse_selection("sim:1.5TiB").unwrap(), DeviceSelection::Sim(TIB * 3 / 2, 1));
        assert_eq!(parse_selection("sim:4096").unwrap(), DeviceSelection::Sim(4096, 1));
        assert_eq!(parse_selection("sim:2x24GiB").unwrap(), DeviceSelection::Sim(24 * GIB, 2));
        assert_eq!(parse_selection(" SIM:8X512MiB ").unwrap(), DeviceSelection::Sim(512 * MIB, 8));
    }

    #[test]
    fn malformed_values_are_one_line_errors_naming_the_value() {
        for bad in [
            "gpu0",
            "sim:",
            "sim:lots",
            "sim:0",
            "sim:-1GiB",
            "simulated:4GiB",
            "cuda:0",
            "sim 4GiB",
            "sim:0x4GiB",
            "sim:2x",
        ] {
            let err = parse_selection(bad).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, Error::Setting(_)), "{bad}: {msg}");
            assert!(msg.starts_with("GPUMEM_NB_DEVICE: invalid value"), "{msg}");
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
            assert!(msg.contains("expected auto|cuda|sim|sim:SIZE"), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in [
            DeviceSelection::Auto,
            DeviceSelection::Cuda,
            DeviceSelection::Sim(24 * GIB, 1),
            DeviceSelection::Sim(1536 * MIB, 1),
            DeviceSelection::Sim(12345, 1),
            DeviceSelection::Sim(24 * GIB, 2),
        ] {
            assert_eq!(parse_selection(&s.to_string()).unwrap(), s);
        }
    }

    #[test]
    fn resolve_and_open_check_the_index() {
        let r = resolve(DeviceSelection::Sim(GIB, 1)).unwrap();
        assert_eq!(r, Resolved::Simulated { capacity: GIB, count: 1, fallback_reason: None });
        assert_eq!(r.device_count(), 1);
        let b = open_backend(&r, 0).unwrap();
        assert_eq!(crate::device::Backend::total_memory(&b), GIB);
        let err = open_backend(&r, 1).unwrap_err().to_string();
        assert!(err.contains("device index 1") && err.contains("1 simulated device"), "{err}");
        // Two simulated devices: each its own backend, numbered as CUDA numbers GPUs.
        let two = resolve(DeviceSelection::Sim(GIB, 2)).unwrap();
        assert_eq!(two.device_count(), 2);
        assert_eq!(crate::device::Backend::device_index(&open_backend(&two, 1).unwrap()), 1);
        let err = open_backend(&two, 2).unwrap_err().to_string();
        assert!(err.contains("2 simulated devices (index 0 to 1)"), "{err}");
        // `auto` always gives something; `cuda` agrees with the probe.
        let auto = resolve(DeviceSelection::Auto).unwrap();
        match (auto, resolve(DeviceSelection::Cuda)) {
            (Resolved::Cuda { devices }, Ok(Resolved::Cuda { devices: d })) => {
                assert_eq!(devices, d)
            }
            (Resolved::Simulated { capacity, fallback_reason: Some(why), .. }, Err(Error::NoCuda(r))) => {
                assert_eq!(capacity, DEFAULT_CAPACITY);
                assert_eq!(why, r);
            }
            other => panic!("auto and cuda disagree: {other:?}"),
        }
    }
}
