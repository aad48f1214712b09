//! The CUDA devices the notebook's process sees, for its readings: each one's UUID (how the
//! kernel matches it with NVML's figures), and, where its primary context is active, what no
//! allocation tracker sees there: the kernels' stacks, the stream-ordered pool's cache, the
//! device's free memory. Nothing here makes a context, and nothing starts CUDA before the
//! process allocated on a device.
#![forbid(unsafe_code)]

use super::protocol::CudaDevice;
#[cfg(feature = "cuda")]
use super::tracking::{self, TrackingStatus};
#[cfg(feature = "cuda")]
use crate::sync::lock;
use crate::track::Place;
#[cfg(feature = "cuda")]
use std::collections::BTreeMap;

/// Fills in each tracked place's UUID ([`place_uuid`]).
pub(crate) fn name_places(places: &mut [super::protocol::PlaceReading]) {
    for p in places {
        p.uuid = place_uuid(p.device);
    }
}

/// The NVML form (`GPU-…`) of a tracked CUDA device's UUID, read once per device: how the
/// kernel matches each place with NVML's figures for that device (`CUDA_VISIBLE_DEVICES`
/// renumbers ordinals, a UUID is the device). `None` for the host, on the simulated device, and
/// where the driver does not answer.
pub(crate) fn place_uuid(place: Place) -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        let device = place?;
        if !matches!(tracking::status(), TrackingStatus::Cupti { .. }) {
            return None;
        }
        static UUIDS: std::sync::Mutex<BTreeMap<i32, Option<String>>> = std::sync::Mutex::new(BTreeMap::new());
        let mut uuids = lock(&UUIDS);
        uuids
            .entry(device)
            .or_insert_with(|| {
                let ordinal = usize::try_from(device).ok()?;
                crate::device::cuda::device_uuid(ordinal).ok().map(|u| crate::device::nvml::uuid_string("GPU", u))
            })
            .clone()
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = place;
        None
    }
}

/// How many CUDA devices the process sees, read only while CUPTI tracks and the process has
/// touched a device; 0 before (a notebook that has not touched the GPU, a simulated session):
/// the driver is not started for it.
#[cfg(feature = "cuda")]
fn devices_in_use() -> usize {
    let touched = tracking::touched_a_device() || crate::device::cuda::cupti::context_seen();
    if !matches!(tracking::status(), TrackingStatus::Cupti { .. }) || !touched {
        return 0;
    }
    crate::device::cuda::probe().unwrap_or(0)
}

/// Every CUDA device the process sees, with its UUID (read once: [`place_uuid`]) and, where its primary context
/// is active, the local memory the driver holds for kernels' stacks there (read each time),
/// while CUPTI tracks (the driver is then loaded: nothing here starts CUDA in a simulated
/// session).
pub(crate) fn cuda_devices() -> Vec<CudaDevice> {
    #[cfg(feature = "cuda")]
    {
        let count = i32::try_from(devices_in_use()).unwrap_or(0);
        (0..count)
            .filter_map(|ordinal| {
                let l = crate::device::cuda::primary_local_memory(ordinal as usize).ok().flatten();
                Some(CudaDevice {
                    ordinal,
                    uuid: place_uuid(Some(ordinal))?,
                    stack_bytes: l.map(|l| l.stack_bytes),
                    resident_threads: l.map(|l| l.resident_threads),
                    pool_used: l.and_then(|l| l.pool).map(|p| p.0),
                    pool_reserved: l.and_then(|l| l.pool).map(|p| p.1),
                    pool_reserved_high: l.and_then(|l| l.pool_reserved_high),
                    mem_total: l.and_then(|l| l.free_total).map(|(_, total)| total),
                })
            })
            .collect()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Vec::new()
    }
}

/// Starts the reservation high-water mark of every active primary context's stream-ordered pool
/// again, before a cell (`crate::device::cuda::reset_primary_pool_high`), while CUPTI tracks and
/// the process has touched a device: nothing here starts CUDA or makes a context. A device whose
/// mark could not be reset reads its mark from earlier, a figure no smaller than the cell's.
pub(crate) fn reset_pool_high_water() {
    #[cfg(feature = "cuda")]
    for ordinal in 0..devices_in_use() {
        let _ = crate::device::cuda::reset_primary_pool_high(ordinal);
    }
}

/// Trims the stream-ordered pool of every CUDA device whose primary context is active
/// (`crate::device::cuda::trim_primary_pool`), while CUPTI tracks and the process has touched a
/// device (nothing here starts CUDA in a simulated session or makes a context): what each pool
/// reserved before and after, by the driver's counters.
pub(crate) fn trim_pools() -> Vec<super::protocol::Trimmed> {
    #[cfg(feature = "cuda")]
    {
        (0..devices_in_use())
            .filter_map(|ordinal| {
                let source = "the driver's pool counters (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, USED_MEM_CURRENT)";
                let t = super::protocol::Trimmed {
                    owner: "CUDA pool".into(),
                    device: format!("cuda:{ordinal}"),
                    source: source.into(),
                    ..Default::default()
                };
                match crate::device::cuda::trim_primary_pool(ordinal) {
                    Ok(None) => None,
                    Ok(Some(p)) => Some(super::protocol::Trimmed {
                        reserved_before: p.before.1,
                        reserved_after: p.after.1,
                        in_use: p.after.0,
                        ..t
                    }),
                    Err(e) => Some(super::protocol::Trimmed { error: Some(format!("not trimmed: {e}")), ..t }),
                }
            })
            .collect()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Vec::new()
    }
}

/// A device's free and total memory now: gpumem-nb's allocator's reading where one is open on
/// it, else the driver's in the device's primary context (where one is active: none is made).
pub(crate) fn device_memory(place: Place) -> Option<(u64, u64)> {
    let device = place?;
    if let Some(a) = super::registry::opened().into_iter().find(|a| a.device() == device) {
        return a.with_state(|_, b| crate::device::Backend::mem_get_info(b).ok());
    }
    #[cfg(feature = "cuda")]
    if matches!(tracking::status(), TrackingStatus::Cupti { .. }) {
        let ordinal = usize::try_from(device).ok()?;
        return crate::device::cuda::primary_local_memory(ordinal).ok().flatten()?.free_total;
    }
    None
}
