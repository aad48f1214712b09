//! gpumem-kernel: a Jupyter kernel for Rust with per-cell GPU memory reports.
//! Until the kernel lands this binary only reports what it is.
fn main() {
    println!("gpumem-kernel {} (the Jupyter kernel is not built yet)", env!("CARGO_PKG_VERSION"));
}
