//! The crate's layer list (the numbered list in `src/lib.rs`) is true: every `crate::` path in
//! non-test code of a folder or root file names itself or something on an earlier line, so the
//! folders have no import cycle. Reads the sources; runs nothing of the crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The unit (top folder or root file, without `.rs`) a source file belongs to.
fn unit_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src()).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.as_str() {
        "bin" | "lib.rs" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Layer of each unit, from the `//! N. …` list in lib.rs: the names in backticks before " — ".
fn layers(lib: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.strip_prefix("//! ") else { continue };
        let Some((num, rest)) = rest.split_once(". ") else { continue };
        let Ok(n) = num.parse::<usize>() else { continue };
        let head = rest.split(" — ").next().unwrap_or("");
        for name in head.split('`').skip(1).step_by(2) {
            out.insert(name.to_string(), n);
        }
    }
    out
}

/// What the root re-exports (`pub use unit::…::{A, B as C}`) resolve to: name → unit.
fn root_names(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let flat: String = lib.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join(" ");
    for stmt in flat.split(';') {
        let Some(path) = stmt.trim().strip_prefix("pub use ") else { continue };
        let unit = path.split("::").next().unwrap_or("").trim().to_string();
        let names = path.rsplit("::").next().unwrap_or("").trim_matches(|c| c == '{' || c == '}' || c == ' ');
        for n in names.split(',') {
            let n = n.split(" as ").last().unwrap_or("").trim();
            if !n.is_empty() {
                out.insert(n.to_string(), unit.clone());
            }
        }
    }
    // `pub type Allocator = CachingAllocator<…>`.
    // Root names are for users: the crate itself names each thing by its own path.
    out
}

/// Non-test code of a file: without `#[cfg(test)] mod tests { … }` at its end and comments.
fn code(text: &str) -> String {
    let body = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    body.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

#[test]
fn every_import_points_to_an_earlier_layer() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let layer = layers(&lib);
    let names = root_names(&lib);
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut units = BTreeSet::new();
    let mut bad = Vec::new();
    let mut edges = 0;
    for f in &files {
        let Some(unit) = unit_of(f) else { continue };
        units.insert(unit.clone());
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = code(&std::fs::read_to_string(f).unwrap());
        for (i, _) in text.match_indices("crate::") {
            let rest = &text[i + 7..];
            // `crate::{a::X, B}`: each item of the group.
            let group: Vec<&str> = match rest.strip_prefix('{') {
                Some(g) => g.split('}').next().unwrap_or("").split(',').collect(),
                None => vec![rest],
            };
            for item in group {
                let name: String = item.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if name.is_empty() {
                    continue;
                }
                let target = if layer.contains_key(&name) {
                    name.clone()
                } else {
                    match names.get(&name) {
                        Some(u) => u.clone(),
                        None => {
                            bad.push(format!("{}: crate::{name} resolves to no unit", f.display()));
                            continue;
                        }
                    }
                };
                if target == unit {
                    continue;
                }
                edges += 1;
                let (Some(&from), Some(&to)) = (layer.get(&unit), layer.get(&target)) else {
                    bad.push(format!("{}: {unit} or {target} is missing from lib.rs's layer list", f.display()));
                    continue;
                };
                if to >= from {
                    bad.push(format!(
                        "{}: {unit} (layer {from}) uses crate::{name} ({target}, layer {to})",
                        f.display()
                    ));
                }
            }
        }
    }
    for u in &units {
        assert!(layer.contains_key(u), "src/{u} is not in lib.rs's layer list");
    }
    assert!(edges > 50, "the scan found only {edges} cross-unit paths: is it reading the sources?");
    bad.sort();
    bad.dedup();
    assert!(bad.is_empty(), "imports against the layer list:\n{}", bad.join("\n"));
}

#[test]
fn the_root_holds_at_most_eight_files_and_no_file_is_long() {
    let root: Vec<String> = std::fs::read_dir(src())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lib.rs")
        .collect();
    assert!(root.len() <= 8, "src/ root holds {} files besides lib.rs: {root:?}", root.len());
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("kernel/src"), &mut files);
    for f in files {
        let n = std::fs::read_to_string(&f).unwrap().lines().count();
        assert!(n <= 900, "{} has {n} lines (at most 900)", f.display());
    }
}

#[test]
fn unsafe_code_is_denied_except_in_the_three_marked_modules() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    assert!(lib.contains("#![deny(unsafe_code)]"));
    let mut allowed = Vec::new();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.contains("allow(unsafe_code)") {
                let next = lines.get(i + 1).copied().unwrap_or("").trim();
                allowed.push(format!("{}: {next}", f.strip_prefix(src()).unwrap().display()));
            }
        }
    }
    allowed.sort();
    assert_eq!(
        allowed,
        ["device/mod.rs: pub mod cuda;", "notebook/mod.rs: pub(crate) mod anchor;", "record/unwind.rs: mod machine;"]
    );
}
