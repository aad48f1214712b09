//! `%gpumem trim`: what the notebook's process holds cached and unused, given back without
//! touching live data, each cache by its owner's own means and counters:
//! - gpumem-nb's caching allocator on each device it opened: `empty_cache()`, as
//!   `torch.cuda.empty_cache()` (its `memory_reserved()` before and after);
//! - each watched framework with a cleanup of its own (cubecl's pools, which burn allocates
//!   from: watched by `gpumem_nb::frameworks::cubecl::watch`, or in gpumem-kernel with no call
//!   through the session library's reader, `notebook::shims`): `client.memory_cleanup()`, its
//!   own books read before and after;
//! - then each CUDA device's stream-ordered pool, where candle, cudarc and cubecl 0.10 allocate
//!   (`cuMemAllocAsync`; what a framework's cleanup just freed lands there): the context's work
//!   waited for, then `cuMemPoolTrimTo(pool, 0)` (the driver's pool counters before and after),
//!   where the device's primary context is active.
//!
//! A burn notebook whose cubecl nobody reads (the stock kernel without a watch, a burn the
//! kernel's reader does not know) keeps cubecl's pools: their cleanup needs code compiled
//! against the notebook's own cubecl.
#![forbid(unsafe_code)]

use super::protocol::Trimmed;

/// How long a framework's cleanup may take before its trim is said to have no answer.
const FRAMEWORK_TRIM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Trims every cache this process holds and says what each held before and after.
pub(crate) fn trim() -> Vec<Trimmed> {
    let mut out: Vec<Trimmed> = super::registry::opened()
        .iter()
        .map(|a| {
            let device = format!("{}:{}", a.backend_kind().name(), a.device());
            let before = a.memory_reserved();
            let mut t = Trimmed {
                owner: "gpumem-nb".into(),
                device,
                source: "gpumem-nb's allocator: memory_reserved(), memory_allocated()".into(),
                reserved_before: before,
                reserved_after: before,
                in_use: a.memory_allocated(),
                error: None,
            };
            if let Some(lost) = a.lost() {
                t.error = Some(format!("not trimmed: the CUDA context was lost ({lost})"));
                return t;
            }
            if let Err(e) = a.empty_cache() {
                t.error = Some(format!("empty_cache failed: {e}"));
            }
            t.reserved_after = a.memory_reserved();
            t.in_use = a.memory_allocated();
            t
        })
        .collect();
    // Frameworks first: what their cleanup frees with `cuMemFreeAsync` goes to the CUDA pool,
    // which is trimmed after them.
    out.extend(super::watched::trim_all(FRAMEWORK_TRIM_TIMEOUT));
    out.extend(super::gpus::trim_pools());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_given_back_is_before_less_after() {
        let t = Trimmed { reserved_before: 96, reserved_after: 32, ..Default::default() };
        assert_eq!(t.given_back(), 64);
        let grew = Trimmed { reserved_before: 32, reserved_after: 96, ..Default::default() };
        assert_eq!(grew.given_back(), 0, "a reservation that grew meanwhile gave nothing back");
    }
}
