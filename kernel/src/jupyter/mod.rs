//! The kernel as Jupyter meets it: the wire protocol and the kernel loop (jupyter-zmq-client +
//! jupyter-protocol), the answer to `usage_request`, the kernelspec `install` writes, and
//! headless `run` of a notebook file through the same engine.
//!
//! ## Layers
//! 1. `install`, `usage` — the kernelspec (`gpumem-kernel install`); the answer to Jupyter's
//!    `usage_request` (CPU, memory, GPU memory).
//! 2. `kernel`, `run` — the Jupyter kernel over ZMQ; a notebook executed headlessly, written
//!    back with its outputs (and an HTML page).

pub mod install;
pub mod usage;

pub mod kernel;
pub mod run;
