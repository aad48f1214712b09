//! What the kernel needs from the active Rust toolchain, found through `rustc --print sysroot
//! --print target-libdir`: the directory of the host's `libstd-*.so` that evcxr's cells link
//! against, and whether the standard library's sources (rustup's `rust-src` component) are
//! there.
//!
//! evcxr infers the type of a `let` that outlives its cell with rust-analyzer, which needs
//! those sources: without them `let v = vec![1u8];` fails with "Couldn't automatically
//! determine type of variable `v`". The kernel says so once, at the first cell, with the fix.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The commands that install what cells need, as the notices say them.
pub const RUSTUP_COMMAND: &str =
    "curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --component rust-src";

/// Where the kernel found `cargo` and `rustc`, which compile every cell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Both run from the `PATH` the kernel was given.
    OnPath,
    /// Not on `PATH`, but in rustup's directory (`$CARGO_HOME/bin`, `~/.cargo/bin`): a Jupyter
    /// started from a desktop, a service or another environment often lacks it (evcxr#140).
    InRustup(PathBuf),
    /// Neither.
    Missing,
}

/// Whether `dir` holds an executable file `name`.
fn has_program(dir: &Path, name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(dir.join(name)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// rustup's directory of `cargo` and `rustc` for the environment `var`: `$CARGO_HOME/bin`,
/// else `$HOME/.cargo/bin`.
fn rustup_bin(var: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let dir = |v: &str| var(v).filter(|v| !v.is_empty()).map(PathBuf::from);
    dir("CARGO_HOME").or_else(|| dir("HOME").map(|h| h.join(".cargo"))).map(|d| d.join("bin"))
}

/// Finds `cargo` and `rustc` in the environment `var` (`std::env::var_os` for the kernel's):
/// both in one directory of its `PATH`, else both in rustup's directory. Reads the file system
/// only (no program is started: the kernel's start stays quick).
pub fn find_in(var: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> Found {
    let both = |dir: &Path| has_program(dir, "cargo") && has_program(dir, "rustc");
    let path = var("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| both(&d)) {
        return Found::OnPath;
    }
    match rustup_bin(var) {
        Some(bin) if both(&bin) => Found::InRustup(bin),
        _ => Found::Missing,
    }
}

/// [`find_in`] the kernel's own environment.
pub fn find() -> Found {
    find_in(&|v| std::env::var_os(v))
}

/// What the first cell says about where the toolchain was found, if anything.
pub fn found_notice(found: &Found) -> Option<String> {
    match found {
        Found::OnPath => None,
        Found::InRustup(bin) => Some(format!(
            "gpumem-kernel: `cargo` and `rustc` are not on the PATH Jupyter gave the kernel; cells \
             are compiled with the ones in {}.",
            bin.display()
        )),
        Found::Missing => Some(format!(
            "gpumem-kernel: no Rust toolchain: cells are compiled with `cargo` and `rustc`, and \
             neither is on PATH or in ~/.cargo/bin. Install it with `{RUSTUP_COMMAND}`, then restart \
             the kernel."
        )),
    }
}

/// The notice of this process's toolchain search, until the first cell shows it.
static NOTICE: Mutex<Option<String>> = Mutex::new(None);

/// Keeps `notice` for the first cell ([`take_notice`]).
pub fn keep_notice(notice: Option<String>) {
    if let Ok(mut n) = NOTICE.lock() {
        *n = notice;
    }
}

/// The notice kept by [`keep_notice`], once.
pub fn take_notice() -> Option<String> {
    NOTICE.lock().ok().and_then(|mut n| n.take())
}

/// Where the `rustc` on `PATH` keeps its toolchain, from one `rustc --print sysroot --print
/// target-libdir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirs {
    /// `--print sysroot`.
    pub sysroot: PathBuf,
    /// `--print target-libdir`: the host's libraries (`lib/rustlib/<host>/lib` under rustup),
    /// where its `libstd-*.so` is; another installed target's is not (a cross target's std is
    /// for a machine the cells do not run on).
    pub target_libdir: PathBuf,
}

/// [`Dirs`] of the `rustc` on `PATH`, or why it gave none in one line: rustup's proxy with no
/// toolchain chosen (`rustup could not choose a version of rustc to run…`), say, which evcxr
/// otherwise meets as a bare `No such file or directory`.
pub fn dirs() -> Result<Dirs, String> {
    dirs_of(Path::new("rustc"))
}

/// [`dirs`] of the program `rustc`.
fn dirs_of(rustc: &Path) -> Result<Dirs, String> {
    let what = "`rustc --print sysroot --print target-libdir`";
    let out = std::process::Command::new(rustc)
        .args(["--print", "sysroot", "--print", "target-libdir"])
        .output()
        .map_err(|e| format!("{what} did not start: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let first = stderr.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no message").trim_end_matches('.');
        return Err(format!("{what} failed ({}): {first}", out.status));
    }
    let text = String::from_utf8(out.stdout).map_err(|_| format!("{what} printed no UTF-8 paths"))?;
    let mut lines = text.lines().map(str::trim);
    match (lines.next(), lines.next()) {
        (Some(sysroot), Some(libdir)) if !sysroot.is_empty() && !libdir.is_empty() => {
            Ok(Dirs { sysroot: PathBuf::from(sysroot), target_libdir: PathBuf::from(libdir) })
        }
        _ => Err(format!("{what} printed fewer than two paths")),
    }
}

/// The directory holding the host's `libstd-*.so`: rustc's target-libdir, else the sysroot's
/// `lib` (a distribution's layout). Only the host's: with a cross target installed (`rustup
/// target add aarch64-unknown-linux-gnu`) `rustlib` holds another `libstd-*.so`, and putting it
/// on the library path left every cell's `dlopen` without its std.
pub fn std_lib_dir(dirs: &Dirs) -> Option<PathBuf> {
    let has_std = |dir: &Path| {
        std::fs::read_dir(dir).is_ok_and(|rd| {
            rd.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("libstd-") && n.ends_with(".so")))
        })
    };
    [dirs.target_libdir.clone(), dirs.sysroot.join("lib")].into_iter().find(|d| has_std(d))
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
    fn the_toolchain_is_found_on_path_then_in_rustups_directory() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let (on_path, rustup) = (root.path().join("bin"), root.path().join("home/.cargo/bin"));
        let put = |dir: &Path, name: &str| {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join(name), "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        let env = |path: &Path, home: &Path| {
            let (path, home) = (path.as_os_str().to_owned(), home.as_os_str().to_owned());
            move |v: &str| match v {
                "PATH" => Some(path.clone()),
                "HOME" => Some(home.clone()),
                _ => None,
            }
        };
        let home = root.path().join("home");
        // Nothing anywhere: the notice says what to run.
        let found = find_in(&env(&on_path, &home));
        assert_eq!(found, Found::Missing);
        let notice = found_notice(&found).unwrap();
        assert!(notice.contains(RUSTUP_COMMAND) && notice.contains("restart the kernel"), "{notice}");
        // Only cargo in rustup's directory is not a toolchain; with rustc it is, and is said.
        put(&rustup, "cargo");
        assert_eq!(find_in(&env(&on_path, &home)), Found::Missing);
        put(&rustup, "rustc");
        let found = find_in(&env(&on_path, &home));
        assert_eq!(found, Found::InRustup(rustup.clone()));
        assert!(found_notice(&found).unwrap().contains(&rustup.display().to_string()));
        // On PATH wins, silently; a file without the executable bit is not a program.
        put(&on_path, "cargo");
        put(&on_path, "rustc");
        std::fs::set_permissions(on_path.join("rustc"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(find_in(&env(&on_path, &home)), Found::InRustup(rustup));
        put(&on_path, "rustc");
        assert_eq!(find_in(&env(&on_path, &home)), Found::OnPath);
        assert_eq!(found_notice(&Found::OnPath), None);
    }

    #[test]
    fn std_is_found_in_the_target_libdir_only() {
        let root = tempfile::tempdir().unwrap();
        let host = "x86_64-unknown-linux-gnu";
        let dirs =
            Dirs { sysroot: root.path().into(), target_libdir: root.path().join("lib/rustlib").join(host).join("lib") };
        assert_eq!(std_lib_dir(&dirs), None);
        // A cross target sorts before the host and has its own std: it must not be taken.
        let cross = root.path().join("lib/rustlib/aarch64-unknown-linux-gnu/lib");
        std::fs::create_dir_all(&cross).unwrap();
        std::fs::write(cross.join("libstd-fedcba98.so"), "").unwrap();
        assert_eq!(std_lib_dir(&dirs), None);
        std::fs::create_dir_all(&dirs.target_libdir).unwrap();
        std::fs::write(dirs.target_libdir.join("libstd-0123abcd.so"), "").unwrap();
        assert_eq!(std_lib_dir(&dirs), Some(dirs.target_libdir.clone()));
    }

    #[test]
    fn a_rustc_that_does_not_run_is_said_in_its_own_words() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let proxy = dir.path().join("rustc");
        std::fs::write(&proxy, "#!/bin/sh\necho >&2\necho 'error: no default is configured.' >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&proxy, std::fs::Permissions::from_mode(0o755)).unwrap();
        let why = dirs_of(&proxy).unwrap_err();
        assert_eq!(
            why,
            "`rustc --print sysroot --print target-libdir` failed (exit status: 1): error: no default is configured"
        );
        let why = dirs_of(&dir.path().join("absent")).unwrap_err();
        assert!(why.starts_with("`rustc --print sysroot --print target-libdir` did not start: "), "{why}");
    }

    #[test]
    fn the_real_rustc_names_a_target_libdir_with_std() {
        // The rustc on PATH (tests run under cargo, so there is one).
        let dirs = dirs().expect("rustc --print sysroot --print target-libdir");
        assert!(dirs.target_libdir.starts_with(&dirs.sysroot), "{dirs:?}");
        assert_eq!(std_lib_dir(&dirs), Some(dirs.target_libdir.clone()), "{dirs:?}");
    }
}
