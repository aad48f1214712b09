//! What the allocator records as it runs, below the policy that writes it: PyTorch's trace
//! vocabulary and the bounded event ring ([`history`]), and stacks captured as raw return
//! addresses and symbolised only when a snapshot is taken ([`frames`]), and the labels
//! ("cell 3") blocks and events carry ([`labels`]).
//!
//! The policy owns a [`history::History`] and hands it [`frames::Frames`], so this folder sits
//! below `policy/`; snapshots, which read the recorded events back, sit above it.

pub mod cells;
pub(crate) mod component;
pub(crate) mod frames;
pub(crate) mod history;
pub(crate) mod labels;
pub(crate) mod unwind;
