// The `memory_stats()` keys that PyTorch's probe.py records at every
// checkpoint (`key_stats`). Shared by `tests/conformance.rs`, which compares
// against the golden probe JSON, and `examples/gpu_probe.rs`, which writes the
// same JSON from the CUDA backend on a GPU.

/// probe.py's `key_stats` keys.
const KEY_STATS: [&str; 21] = [
    "allocated_bytes.all.current",
    "reserved_bytes.all.current",
    "active_bytes.all.current",
    "requested_bytes.all.current",
    "inactive_split_bytes.all.current",
    "inactive_split.all.current",
    "segment.all.current",
    "allocation.all.current",
    "active.all.current",
    "reserved_bytes.small_pool.current",
    "reserved_bytes.large_pool.current",
    "inactive_split_bytes.small_pool.current",
    "inactive_split_bytes.large_pool.current",
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
    "oversize_allocations.current",
    "oversize_segments.current",
    "max_split_size",
];
