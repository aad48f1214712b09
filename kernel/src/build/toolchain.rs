//! What the kernel needs from the active Rust toolchain, found through `rustc --print sysroot`:
//! the directory of the `libstd-*.so` that evcxr's cells link against, and whether the
//! standard library's sources (rustup's `rust-src` component) are there.
//!
//! evcxr infers the type of a `let` that outlives its cell with rust-analyzer, which needs
//! those sources: without them `let v = vec![1u8];` fails with "Couldn't automatically
//! determine type of variable `v`". The kernel says so once, at the first cell, with the fix.

use std::path::{Path, PathBuf};

/// `rustc --print sysroot` of the `rustc` on `PATH`.
pub fn sysroot() -> Option<PathBuf> {
    let out = std::process::Command::new("rustc").args(["--print", "sysroot"]).output().ok()?;
    out.status.success().then_some(())?;
    let text = String::from_utf8(out.stdout).ok()?;
    Some(PathBuf::from(text.trim()))
}

/// The directory holding `libstd-*.so` under `sysroot`: `lib/rustlib/<host>/lib` (rustup's
/// layout) or `lib`.
pub fn std_lib_dir(sysroot: &Path) -> Option<PathBuf> {
    let has_std = |dir: &Path| {
        std::fs::read_dir(dir).is_ok_and(|rd| {
            rd.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("libstd-") && n.ends_with(".so")))
        })
    };
    let rustlib = sysroot.join("lib").join("rustlib");
    let mut candidates: Vec<PathBuf> =
        std::fs::read_dir(&rustlib).map(|rd| rd.flatten().map(|e| e.path().join("lib")).collect()).unwrap_or_default();
    candidates.sort();
    candidates.push(sysroot.join("lib"));
    candidates.into_iter().find(|d| has_std(d))
}

/// Where rust-analyzer looks for the standard library's sources under `sysroot` (or
/// `RUST_SRC_PATH`, which it honours first).
fn library_dir(sysroot: &Path) -> PathBuf {
    match std::env::var_os("RUST_SRC_PATH") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => sysroot.join("lib").join("rustlib").join("src").join("rust").join("library"),
    }
}

/// A one-paragraph notice when the standard library's sources are missing under `sysroot`,
/// naming where they were looked for and how to add them; `None` when they are there.
pub fn rust_src_notice(sysroot: &Path) -> Option<String> {
    let library = library_dir(sysroot);
    if library.join("core").join("src").join("lib.rs").is_file() {
        return None;
    }
    Some(format!(
        "gpumem-kernel: the Rust standard library's sources are not in {} (rustup's `rust-src` \
         component), so evcxr cannot infer the type of a `let` kept between cells: \
         `let v = vec![1u8];` fails until you run `rustup component add rust-src` and restart the \
         kernel (or annotate the type: `let v: Vec<u8> = …`).",
        library.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notice_names_the_missing_directory_and_goes_once_sources_exist() {
        let root = tempfile::tempdir().unwrap();
        let notice = rust_src_notice(root.path()).expect("an empty sysroot has no sources");
        assert!(notice.contains(&root.path().join("lib/rustlib/src/rust/library").display().to_string()), "{notice}");
        assert!(notice.contains("rustup component add rust-src"), "{notice}");
        let core = root.path().join("lib/rustlib/src/rust/library/core/src");
        std::fs::create_dir_all(&core).unwrap();
        std::fs::write(core.join("lib.rs"), "").unwrap();
        if std::env::var_os("RUST_SRC_PATH").is_none() {
            assert_eq!(rust_src_notice(root.path()), None);
        }
    }

    #[test]
    fn std_is_found_in_rustups_layout() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(std_lib_dir(root.path()), None);
        let lib = root.path().join("lib/rustlib/x86_64-unknown-linux-gnu/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libstd-0123abcd.so"), "").unwrap();
        assert_eq!(std_lib_dir(root.path()), Some(lib));
    }
}
