//! Every `gpumem_nb::…` path a user reads resolves: in the READMEs and GUIDE.md (the Slurm recipe's too),
//! HOW_IT_WORKS.md, the notebooks, the examples, and the sources of both crates (their messages,
//! help texts and docs). The paths are written as intra-doc links into a small crate that depends
//! on gpumem-nb, and rustdoc, with broken links denied, resolves them as a user's code would: a
//! module, a function, a type, a method, a variant. A path that names something moved or removed fails here with its file.
//! (CHANGELOG.md names removed paths on purpose and is not read.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files_below(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files_below(&p, ext, out);
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

/// Every `gpumem_nb::a::b` in `text` (up to a generic argument, a call or anything not a path).
fn paths_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("gpumem_nb::") {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &text[i..];
        let mut end = 0;
        let mut segs = 0;
        for (j, seg) in rest.split("::").enumerate() {
            let ident: String = seg.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if ident.is_empty() || !ident.chars().next().unwrap().is_ascii_alphabetic() && !ident.starts_with('_') {
                break;
            }
            end += if j == 0 { ident.len() } else { ident.len() + 2 };
            segs += 1;
            if ident.len() != seg.len() {
                break;
            }
        }
        if segs >= 2 {
            out.push(rest[..end].to_string());
        }
    }
    out
}

#[test]
fn every_gpumem_nb_path_users_read_resolves() {
    let mut sources: Vec<PathBuf> =
        ["README.md", "GUIDE.md", "kernel/README.md", "python/README.md", "lab/README.md", "HOW_IT_WORKS.md"]
            .iter()
            .map(|f| repo().join(f))
            .collect();
    sources.push(repo().join("deploy/slurm/README.md"));
    files_below(&repo().join("examples"), "rs", &mut sources);
    files_below(&repo().join("notebooks"), "ipynb", &mut sources);
    files_below(&repo().join("src"), "rs", &mut sources);
    files_below(&repo().join("kernel/src"), "rs", &mut sources);
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &sources {
        let text = std::fs::read_to_string(f).unwrap();
        // A source file's tests are not what users read (they hold symbol names, not paths).
        let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap();
        for p in paths_in(text) {
            let rel = f.strip_prefix(repo()).unwrap().display().to_string();
            found.entry(p).or_default().insert(rel);
        }
    }
    assert!(found.len() > 40, "the scan found only {} paths: {:?}", found.len(), found.keys());
    assert!(found.contains_key("gpumem_nb::tracking::top"), "the scan reads the README: {:?}", found.keys());

    // A crate whose docs link every path; rustdoc resolves them against gpumem-nb.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("paths-check");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"paths-check\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
             [dependencies]\ngpumem-nb = {{ path = {:?}, features = [\"metrics\", \"cubecl\", \"cubecl010\"] }}\n\n\
             [workspace]\n",
            repo().display().to_string()
        ),
    )
    .unwrap();
    // The workspace's lock, so that the check resolves offline to the versions the project uses.
    std::fs::copy(repo().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let mut lib = String::from("//! Paths users read, each an intra-doc link:\n");
    for (p, files) in &found {
        lib.push_str(&format!("//! - [`{p}`] ({})\n", files.iter().cloned().collect::<Vec<_>>().join(", ")));
    }
    std::fs::write(dir.join("src/lib.rs"), lib).unwrap();
    // The toolchain that built this test, named whole: run outside a rustup proxy (no
    // RUSTUP_TOOLCHAIN), cargo's plain `rustc` is rustup's, which obeys a dependency's own
    // rust-toolchain.toml (convert_case 0.10 pins 1.83.0) in the directory it compiles.
    let cargo = Path::new(env!("CARGO"));
    let mut doc = Command::new(cargo);
    for (var, tool) in [("RUSTC", "rustc"), ("RUSTDOC", "rustdoc")] {
        let beside = cargo.with_file_name(tool);
        if beside.is_file() {
            doc.env(var, beside);
        }
    }
    let out = doc
        .args(["doc", "--no-deps", "--offline", "--quiet"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env("RUSTDOCFLAGS", "-D rustdoc::broken_intra_doc_links")
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo doc runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Each unresolved link, with the files that name it.
    let broken: Vec<String> = stderr
        .lines()
        .filter_map(|l| l.split("unresolved link to `").nth(1)?.split('`').next().map(str::to_string))
        .map(|p| format!("{p} (in {:?})", found.get(&p).map(|f| f.iter().collect::<Vec<_>>()).unwrap_or_default()))
        .collect();
    assert!(broken.is_empty(), "paths that do not resolve:\n{}", broken.join("\n"));
    // A name that is both a module and a function (`snapshot::diff`) resolves, to both: rustdoc
    // calls it ambiguous, which is no failure here. Any other error is.
    let other: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error"))
        .filter(|l| !l.contains(" is both ") && !l.contains("could not document") && !l.contains("previous error"))
        .collect();
    assert!(other.is_empty(), "cargo doc failed:\n{stderr}");
    assert!(out.status.success() || stderr.contains(" is both "), "cargo doc failed:\n{stderr}");
}

#[test]
fn the_scan_reads_paths_as_written() {
    let got = paths_in(
        "use gpumem_nb::{DeviceBuffer}; gpumem_nb::tracking::top(5); \
         gpumem_nb::DeviceBuffer::<f32>::zeros; `gpumem_nb::kernel::oom::describe(&r)`; gpumem_nb::VERSION.",
    );
    assert_eq!(
        got,
        [
            "gpumem_nb::tracking::top",
            "gpumem_nb::DeviceBuffer",
            "gpumem_nb::kernel::oom::describe",
            "gpumem_nb::VERSION"
        ]
    );
}
