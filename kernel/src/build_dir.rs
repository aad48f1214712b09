//! Where evcxr compiles a notebook's cells: a persistent directory, so the crates a notebook
//! loads (gpumem-nb and its dependencies) are compiled once, not at every kernel start.
//!
//! `EVCXR_TMPDIR` wins when it is set. Otherwise a kernel binary inside a cargo target
//! directory (`…/target/release/gpumem-kernel`) uses `…/target/evcxr`, so the README's main
//! command and the test script share one build; an installed kernel uses
//! `$XDG_CACHE_HOME/gpumem-kernel/evcxr` (`~/.cache/…`). A kernel locks the directory while it
//! uses it; a second kernel started meanwhile (two notebooks open at once) gets evcxr's own
//! private temporary directory instead, since two builds cannot share one directory.

use std::fs::File;
use std::path::{Path, PathBuf};

/// A build directory this kernel holds (locked until dropped).
#[derive(Debug)]
pub struct BuildDir {
    /// The directory.
    pub path: PathBuf,
    _lock: File,
}

/// The cargo target directory an executable at `exe` was built into, if it was.
fn target_dir_of(exe: &Path) -> Option<PathBuf> {
    let target = exe.parent()?.parent()?;
    let marked = target.join("CACHEDIR.TAG").is_file() || target.join(".rustc_info.json").is_file();
    marked.then(|| target.to_path_buf())
}

/// The directory to use when `EVCXR_TMPDIR` is not set.
pub fn default_path() -> Option<PathBuf> {
    if let Some(target) = std::env::current_exe().ok().and_then(|e| target_dir_of(&e)) {
        return Some(target.join("evcxr"));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("gpumem-kernel").join("evcxr"))
}

/// Creates and locks `path`; `None` when it cannot be created or another kernel holds it.
pub fn lock(path: &Path) -> Option<BuildDir> {
    std::fs::create_dir_all(path).ok()?;
    let lock = File::options().create(true).truncate(false).write(true).open(path.join(".gpumem-kernel.lock")).ok()?;
    lock.try_lock().ok()?;
    Some(BuildDir { path: path.to_path_buf(), _lock: lock })
}

/// The build directory for this kernel, or `None` (then evcxr picks: `EVCXR_TMPDIR`, or a
/// private temporary directory).
pub fn choose() -> Option<BuildDir> {
    if std::env::var_os("EVCXR_TMPDIR").is_some() {
        return None;
    }
    lock(&default_path()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cargo_target_dir_is_recognised_and_a_held_dir_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let target = base.path().join("target");
        std::fs::create_dir_all(target.join("release")).unwrap();
        let exe = target.join("release").join("gpumem-kernel");
        assert_eq!(target_dir_of(&exe), None, "no cargo marker yet");
        std::fs::write(target.join("CACHEDIR.TAG"), "Signature: 8a477f597d28d172789f06886806bc55").unwrap();
        assert_eq!(target_dir_of(&exe), Some(target.clone()));
        let dir = target.join("evcxr");
        let held = lock(&dir).expect("the first kernel gets it");
        assert!(dir.is_dir());
        assert!(lock(&dir).is_none(), "a second kernel must not share it");
        drop(held);
        assert!(lock(&dir).is_some(), "free again once the first kernel is gone");
    }
}
