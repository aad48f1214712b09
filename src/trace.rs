//! Replay of recorded PyTorch allocator traces (placeholder, filled in below).
