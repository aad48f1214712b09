//! Names the compiler that builds this copy of gpumem-nb (`GPUMEM_NB_RUSTC`, `rustc -V`'s line).
//!
//! gpumem-kernel's own copy of the crate and the copy a notebook's `:dep gpumem-nb` builds share
//! one process: they share its state (`notebook::anchor`) only where the two were compiled from
//! the same source by the same compiler, since a type's layout is the compiler's choice.
fn main() {
    println!("cargo:rerun-if-env-changed=RUSTC");
    println!("cargo:rerun-if-changed=build.rs");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("-V")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown rustc".into());
    println!("cargo:rustc-env=GPUMEM_NB_RUSTC={version}");
}
