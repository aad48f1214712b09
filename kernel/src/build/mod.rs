//! The cell crate's build: where evcxr compiles the cells and with which toolchain, what a
//! `:dep` line loads (`:dep gpumem-nb` is the kernel's own crate; every `:dep` crate once for the
//! session), the trait that shows a cell's value in one compile, a cell built without cargo
//! when only the cell changed, line tables in the cells' own code, how far a build has come,
//! and where a cell's time goes. Nothing here runs a cell or answers the user: the running
//! side (`crate::cell`) uses this room, never the other way round.
//!
//! ## Layers
//! 1. `build_dir`, `toolchain`, `timings`, `dep`, `display`, `progress`, `stable_hash`,
//!    `books_shim` — where evcxr compiles the cells (outside any cargo workspace); what the
//!    kernel needs from the Rust toolchain; where a cell's time goes (for the cell benchmark);
//!    `:dep gpumem-nb` is the crate the kernel was built with; a cell's value shown in one
//!    compile; how far a cell's build has come; the one stable hash of what the kernel keeps on
//!    disk; a reader of cubecl's own books for the session library.
//! 2. `quick_build`, `variable_probe` — a cell built without cargo when only the cell changed
//!    (evcxr's cargo wrapper); a probe of what the variables hold by burn's types, for the
//!    session library.
//! 3. `cell_lines`, `session_deps` — line tables in the cells' own code (the cell crate's rustc,
//!    timed when asked, its command kept for a build without cargo); one copy of every `:dep`
//!    crate for the session, beside the build directory.

pub mod books_shim;
pub mod build_dir;
pub mod dep;
pub mod display;
pub mod progress;
pub mod stable_hash;
pub mod timings;
pub mod toolchain;

pub mod quick_build;
pub mod variable_probe;

pub mod cell_lines;
pub mod session_deps;
