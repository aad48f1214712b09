//! The per-cell report: what one cell did to memory, as a record (the
//! `application/vnd.gpumem.cell+json` object) and the one line a notebook shows.
//!
//! Both kernels build it the same way from the same readings (the control protocol's
//! [`protocol::DeviceReading`](super::protocol::DeviceReading) and tracked places, NVML before
//! and after): gpumem-kernel from its hooks in the parent, the stock evcxr kernel from the
//! crate's own hooks in the child (`notebook::stock`).
//!
//! - `record`: the record's types ([`CellRecord`] and its parts) and [`build_record`].
//! - `line`: the one-line report and the `display_data` bundle; `fit`: the line's parts kept by
//!   importance within its width; `details`: the table under the line, every number with its
//!   source, per device.
//! - `deltas`: each component's and owner's bytes over a cell ([`ComponentDelta`],
//!   [`OwnerDelta`]).
//! - `framework`: a watched framework's own numbers in the record ([`FrameworkPart`]), and what
//!   a re-run left behind ([`Growth`]).
//! - `variables`: what the notebook's variables hold by a framework's own types
//!   ([`VariablesPart`]: the session library's probe, burn's parameters and optimizer state).
//! - `oom`: an out-of-memory as the cell's error says it ([`oom_message`]): PyTorch's words, who
//!   asked and where, and what holds the device.
#![forbid(unsafe_code)]

mod deltas;
mod details;
mod fit;
mod framework;
mod line;
mod oom;
mod record;
mod top;
mod variables;

pub use deltas::{ComponentDelta, OwnerDelta};
pub use framework::{FrameworkPart, Growth, PoolKindPart, framework_parts};
pub use line::{
    LINE_WIDTH, LOST_ASYNC_HINT, allocator_absent, format_ms, line_html, lost_message, other_device, quantity,
    short_device,
};
pub use oom::oom_message;
pub use record::{
    AllAllocations, AllocatorPart, CELL_MIME, CellRecord, CellStatus, CrateReading, LiveCost, LocalMemoryPart,
    NvmlPart, PlaceAll, PoolPart, Readings, SourceDelta, Sources, Span, TrackedReadings, all_allocations, build_record,
    device_name,
};
pub use variables::{VariableComponent, VariablesPart, variables_part};
