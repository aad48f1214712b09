//! Where evcxr compiles a notebook's cells: a persistent directory, so the crates a notebook
//! loads (gpumem-nb and its dependencies) are compiled once, not at every kernel start.
//!
//! evcxr writes the cells' crate (`Cargo.toml`, `src/lib.rs`) into that directory and runs
//! cargo there. Cargo looks for a workspace above every package it builds: if a `Cargo.toml`
//! with `[workspace]` encloses the directory (a clone's own `target/`, say) and does not exclude
//! it, cargo refuses the cells' crate ("current package believes it's in a workspace when it's
//! not"). So the directory is never chosen inside a workspace:
//!
//! - `EVCXR_TMPDIR` wins when it is set and no workspace claims it;
//! - otherwise `$XDG_CACHE_HOME/gpumem-kernel/evcxr` (`~/.cache/gpumem-kernel/evcxr`), the same
//!   for every clone and every way the kernel is started (the README's main command, Jupyter,
//!   the tests), so the first build is shared;
//! - when that one is held by another kernel (two notebooks open at once: two builds cannot
//!   share a directory), the first free of `evcxr-2` … `evcxr-8` beside it, kept too; the
//!   first time one is used, it is seeded with a copy of the shared directory's build (its
//!   units, not rustc's incremental state or old cells' libraries), and at every later use it
//!   takes what the shared one built since (a new gpumem-nb), so the second notebook's first
//!   `:dep gpumem-nb` starts warm instead of building every dependency;
//! - when none of those can be used (a workspace claims it, it cannot be created, all are held),
//!   a private temporary directory, removed when the kernel exits.
//!
//! Every fallback is said once ([`Choice::notice`]): on the console, and in the first cell as a
//! short display message.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The crate evcxr builds each cell as.
pub const CELL_CRATE: &str = "ctx";

/// The notice of this process's choice, until the first cell shows it.
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

/// A build directory this kernel holds until it is dropped: locked, or private to it.
#[derive(Debug)]
pub struct BuildDir {
    /// The directory (evcxr's `EVCXR_TMPDIR`: the cells' crate is written here).
    pub path: PathBuf,
    _lock: Option<File>,
    _private: Option<tempfile::TempDir>,
}

/// The directory picked for this kernel, and why it is not the usual one (when it is not).
#[derive(Debug)]
pub struct Choice {
    /// The directory; `None` only when not even a temporary directory could be made (then
    /// evcxr picks its own).
    pub dir: Option<BuildDir>,
    /// A one-line explanation when the kernel had to fall back, for the console and the first
    /// cell.
    pub notice: Option<String>,
}

/// The shared directory when `EVCXR_TMPDIR` is not set: `$XDG_CACHE_HOME/gpumem-kernel/evcxr`,
/// or `$HOME/.cache/gpumem-kernel/evcxr`.
pub fn default_path() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("gpumem-kernel").join("evcxr"))
}

/// The manifest of the cargo workspace that would claim a package at `dir` (its `Cargo.toml`
/// in `dir` itself), if any: the nearest `Cargo.toml` above `dir` with a `[workspace]` table
/// whose `exclude` does not cover `dir`, as cargo searches. A manifest that cannot be read or
/// parsed is skipped (cargo would fail on it too, with its own message).
pub fn claiming_workspace(dir: &Path) -> Option<PathBuf> {
    let dir = absolute(dir);
    for ancestor in dir.ancestors().skip(1) {
        let manifest = ancestor.join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else { continue };
        let Ok(doc) = text.parse::<toml::Table>() else { continue };
        let Some(ws) = doc.get("workspace").and_then(toml::Value::as_table) else { continue };
        let excluded = ws
            .get("exclude")
            .and_then(toml::Value::as_array)
            .is_some_and(|ex| ex.iter().filter_map(toml::Value::as_str).any(|e| dir.starts_with(ancestor.join(e))));
        if !excluded {
            return Some(manifest);
        }
    }
    None
}

/// `p` made absolute against the working directory, with `.` and `..` resolved textually
/// (the directory may not exist yet).
fn absolute(p: &Path) -> PathBuf {
    let joined = if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir().unwrap_or_default().join(p) };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// How many build directories kernels running at the same time get before falling back to a
/// private one: the shared one and `evcxr-2` … `evcxr-8`.
const SLOTS: usize = 8;

/// The `n`th build directory beside the shared `first` (`n` from 2: `evcxr-2`).
fn slot_path(first: &Path, n: usize) -> PathBuf {
    let name = first.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    first.with_file_name(format!("{name}-{n}"))
}

/// What [`seed`] leaves out of a target directory: rustc's incremental state (`incremental/`:
/// only used to recompile a crate that changed, and the larger part of a directory used for a
/// while: 2.0 of 3.1 GiB in a CI machine's shared one, one copy per gpumem-nb version and cell
/// crate) and the libraries evcxr copies each cell's build to (`libcode_N.so`, rewritten by the
/// next session). A unit whose outputs and fingerprint are copied is fresh without them.
fn not_seeded(name: &std::ffi::OsStr, is_dir: bool) -> bool {
    let name = name.to_string_lossy();
    if is_dir {
        name == "incremental"
    } else {
        name.strip_prefix("libcode_").and_then(|n| n.strip_suffix(".so")).is_some_and(|n| n.parse::<u64>().is_ok())
    }
}

/// Copies `from` (a cargo target directory) to `to`, file by file: what `to` lacks, and what
/// `from` has built since (a newer modification time; a file `to` built itself later stays),
/// less what is [`not_seeded`]. What fails is left out (cargo rebuilds what is missing or
/// stale). Returns the bytes copied.
fn seed(from: &Path, to: &Path) -> u64 {
    let mut bytes = 0;
    let Ok(entries) = std::fs::read_dir(from) else { return 0 };
    if std::fs::create_dir_all(to).is_err() {
        return 0;
    }
    for e in entries.flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let kind = e.file_type();
        if kind.as_ref().is_ok_and(|t| not_seeded(&e.file_name(), t.is_dir())) {
            continue;
        }
        match kind {
            Ok(t) if t.is_dir() => bytes += seed(&src, &dst),
            Ok(t) if t.is_file() => {
                let newer = |m: std::io::Result<std::fs::Metadata>| m.and_then(|m| m.modified()).ok();
                if let (Some(ours), Some(theirs)) = (newer(std::fs::metadata(&dst)), newer(e.metadata()))
                    && ours >= theirs
                {
                    continue;
                }
                if let Ok(n) = std::fs::copy(&src, &dst) {
                    bytes += n;
                    // Cargo decides freshness by modification times: keep the source's.
                    if let Ok(m) = e.metadata().and_then(|m| m.modified()) {
                        let _ = File::options().write(true).open(&dst).and_then(|f| f.set_modified(m));
                    }
                }
            }
            Ok(t) if t.is_symlink() => {
                if let Ok(target) = std::fs::read_link(&src) {
                    let _ = std::os::unix::fs::symlink(target, &dst);
                }
            }
            _ => {}
        }
    }
    bytes
}

/// The first free build directory beside the shared `first`, seeded from it the first time it
/// is used; the directory and a notice saying so.
fn beside(first: &Path) -> Option<(BuildDir, String)> {
    for n in 2..=SLOTS {
        let path = slot_path(first, n);
        if claiming_workspace(&path).is_some() {
            return None;
        }
        let fresh = !path.join("target").exists();
        let Some(held) = lock(&path) else { continue };
        // Seeded the first time; later, brought up to date with what the shared one built since
        // (a new gpumem-nb, a dependency another notebook added).
        let t = std::time::Instant::now();
        let bytes = seed(&first.join("target"), &path.join("target"));
        let how = match (bytes, fresh) {
            (0, _) => String::new(),
            (_, true) => format!(
                ", prepared from the shared one ({} of builds copied in {:.1} s)",
                gpumem_nb::units::iec(bytes),
                t.elapsed().as_secs_f64()
            ),
            (_, false) => format!(
                ", updated from the shared one ({} of newer builds copied in {:.1} s)",
                gpumem_nb::units::iec(bytes),
                t.elapsed().as_secs_f64()
            ),
        };
        let notice = format!(
            "another gpumem kernel is using {}: this one compiles cells in {}{how}",
            first.display(),
            path.display()
        );
        return Some((held, notice));
    }
    None
}

/// Creates and locks `path`; `None` when it cannot be created or another kernel holds it.
pub fn lock(path: &Path) -> Option<BuildDir> {
    std::fs::create_dir_all(path).ok()?;
    let lock = File::options().create(true).truncate(false).write(true).open(path.join(".gpumem-kernel.lock")).ok()?;
    lock.try_lock().ok()?;
    Some(BuildDir { path: path.to_path_buf(), _lock: Some(lock), _private: None })
}

/// A private directory under the system's temporary directory, removed when dropped.
fn private() -> Option<BuildDir> {
    let tmp = tempfile::Builder::new().prefix("gpumem-kernel-evcxr-").tempdir().ok()?;
    if claiming_workspace(tmp.path()).is_some() {
        return None;
    }
    Some(BuildDir { path: tmp.path().to_path_buf(), _lock: None, _private: Some(tmp) })
}

/// Picks the build directory for this kernel (see the module's documentation).
pub fn choose() -> Choice {
    choose_from(std::env::var_os("EVCXR_TMPDIR").map(PathBuf::from), default_path())
}

fn choose_from(requested: Option<PathBuf>, default: Option<PathBuf>) -> Choice {
    let (wanted, what) = match requested {
        Some(dir) if !dir.as_os_str().is_empty() => (Some(dir), "EVCXR_TMPDIR"),
        _ => (default, "the build directory"),
    };
    let why = match &wanted {
        None => "there is no home or cache directory to keep notebook builds in".to_string(),
        Some(dir) => {
            let dir_shown = dir.display();
            match claiming_workspace(dir) {
                Some(ws) => format!(
                    "{what} {dir_shown} is inside the cargo workspace of {}, where cargo refuses the cells' crate",
                    ws.display()
                ),
                None => match lock(dir) {
                    Some(held) => return Choice { dir: Some(held), notice: None },
                    None if dir.is_dir() => match beside(dir) {
                        Some((held, notice)) => return Choice { dir: Some(held), notice: Some(notice) },
                        None => {
                            format!("{what} {dir_shown} and the {SLOTS} beside it are in use by other gpumem kernels")
                        }
                    },
                    None => format!("{what} {dir_shown} cannot be created"),
                },
            }
        }
    };
    let notice =
        format!("{why}: compiling notebook cells in a private temporary directory instead (built from scratch)");
    Choice { dir: private(), notice: Some(notice) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_above_the_directory_claims_it_unless_it_excludes_it() {
        let base = tempfile::tempdir().unwrap();
        let clone = base.path().join("clone");
        std::fs::create_dir_all(clone.join("target")).unwrap();
        let cells = clone.join("target").join("evcxr");
        assert_eq!(claiming_workspace(&cells), None, "no manifest yet");
        // A package without [workspace] does not claim anything.
        std::fs::write(clone.join("Cargo.toml"), "[package]\nname = \"x\"\nversion = \"0.1.0\"\n").unwrap();
        assert_eq!(claiming_workspace(&cells), None);
        std::fs::write(clone.join("Cargo.toml"), "[workspace]\nmembers = [\".\"]\n[package]\nname = \"x\"\n").unwrap();
        assert_eq!(claiming_workspace(&cells), Some(clone.join("Cargo.toml")));
        // Relative paths and `..` are resolved as cargo would.
        assert_eq!(claiming_workspace(&cells.join("..").join("evcxr")), Some(clone.join("Cargo.toml")));
        std::fs::write(clone.join("Cargo.toml"), "[workspace]\nexclude = [\"target\"]\n").unwrap();
        assert_eq!(claiming_workspace(&cells), None, "excluded");
        // The directory's own Cargo.toml (the cells' crate) is not an enclosing workspace.
        std::fs::create_dir_all(&cells).unwrap();
        std::fs::write(cells.join("Cargo.toml"), "[workspace]\n").unwrap();
        assert_eq!(claiming_workspace(&cells), None);
    }

    #[test]
    fn a_claimed_or_held_directory_falls_back_to_a_private_one_with_a_notice() {
        let base = tempfile::tempdir().unwrap();
        let clone = base.path().join("clone");
        std::fs::create_dir_all(&clone).unwrap();
        std::fs::write(clone.join("Cargo.toml"), "[workspace]\nmembers = [\".\"]\n").unwrap();

        // EVCXR_TMPDIR inside the workspace: refused, said, and a private directory used.
        let inside = clone.join("target").join("evcxr");
        let c = choose_from(Some(inside.clone()), None);
        let dir = c.dir.expect("a private directory");
        assert!(dir.path.is_dir() && !dir.path.starts_with(&clone));
        let notice = c.notice.expect("the fallback is said");
        assert!(notice.contains("EVCXR_TMPDIR") && notice.contains(&inside.display().to_string()), "{notice}");
        assert!(notice.contains(&clone.join("Cargo.toml").display().to_string()), "{notice}");
        let private_path = dir.path.clone();
        drop(dir);
        assert!(!private_path.exists(), "a private directory goes with the kernel");

        // The default directory, free: used and locked; a second kernel takes the one beside it,
        // seeded with the first's build (modification times kept, for cargo).
        let shared = base.path().join("cache").join("gpumem-kernel").join("evcxr");
        let first = choose_from(None, Some(shared.clone()));
        assert!(first.notice.is_none());
        assert_eq!(first.dir.as_ref().map(|d| d.path.clone()), Some(shared.clone()));
        let built = shared.join("target").join("debug").join("deps");
        std::fs::create_dir_all(&built).unwrap();
        std::fs::write(built.join("libdep.rlib"), b"built").unwrap();
        let incremental = shared.join("target").join("debug").join("incremental").join("gpumem_nb-1a2b").join("s-1");
        std::fs::create_dir_all(&incremental).unwrap();
        std::fs::write(incremental.join("dep-graph.bin"), b"state").unwrap();
        for cell in ["libcode_7.so", "libcode_x.so"] {
            std::fs::write(shared.join("target").join("debug").join(cell), b"a cell").unwrap();
        }
        let when = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        File::options().write(true).open(built.join("libdep.rlib")).unwrap().set_modified(when).unwrap();
        let second = choose_from(None, Some(shared.clone()));
        let notice = second.notice.clone().expect("said");
        assert!(
            notice.starts_with("another gpumem kernel is using") && notice.contains("prepared from the shared one"),
            "{notice}"
        );
        let dir2 = second.dir.as_ref().map(|d| d.path.clone()).unwrap();
        assert_eq!(dir2, slot_path(&shared, 2));
        let copy = dir2.join("target").join("debug").join("deps").join("libdep.rlib");
        assert_eq!(std::fs::read(&copy).unwrap(), b"built");
        for left_out in ["incremental/gpumem_nb-1a2b/s-1/dep-graph.bin", "libcode_7.so"] {
            assert!(!dir2.join("target").join("debug").join(left_out).exists(), "{left_out} is not copied");
        }
        assert!(
            dir2.join("target").join("debug").join("libcode_x.so").is_file(),
            "only evcxr's cell libraries are left out"
        );
        assert_eq!(std::fs::metadata(&copy).unwrap().modified().unwrap(), when);
        // A third takes the next; the second's, once free, is used again as it is.
        let third = choose_from(None, Some(shared.clone()));
        assert_eq!(third.dir.as_ref().map(|d| d.path.clone()), Some(slot_path(&shared, 3)));
        drop(second);
        let again = choose_from(None, Some(shared.clone()));
        assert_eq!(again.dir.as_ref().map(|d| d.path.clone()), Some(dir2.clone()));
        assert!(!again.notice.as_deref().unwrap().contains("prepared"), "already seeded");
        assert!(!again.notice.as_deref().unwrap().contains("updated"), "nothing newer: {:?}", again.notice);
        drop(again);
        // The shared one builds a new version of a crate; the slot built one of its own since:
        // the next use of the slot takes the shared one's newer file and keeps its own.
        let later = when + std::time::Duration::from_secs(60);
        std::fs::write(built.join("libdep.rlib"), b"rebuilt").unwrap();
        File::options().write(true).open(built.join("libdep.rlib")).unwrap().set_modified(later).unwrap();
        let own = dir2.join("target").join("debug").join("deps").join("libown.rlib");
        std::fs::write(&own, b"the slot's").unwrap();
        std::fs::write(built.join("libown.rlib"), b"the shared one's, older").unwrap();
        File::options().write(true).open(built.join("libown.rlib")).unwrap().set_modified(when).unwrap();
        let again = choose_from(None, Some(shared.clone()));
        assert!(again.notice.as_deref().unwrap().contains("updated from the shared one"), "{:?}", again.notice);
        assert_eq!(std::fs::read(&copy).unwrap(), b"rebuilt");
        assert_eq!(std::fs::read(&own).unwrap(), b"the slot's");
        drop((third, again));
        drop(first);
        let third = choose_from(Some(PathBuf::new()), Some(shared.clone()));
        assert_eq!(third.dir.map(|d| d.path), Some(shared), "free again; an empty EVCXR_TMPDIR is unset");
    }
}
