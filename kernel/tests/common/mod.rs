//! What the kernel's headless tests share: a notebook from cells, `gpumem-kernel run` on it,
//! its outputs read back, and a path crate for `:dep`.
#![allow(dead_code)]

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) const CELL_MIME: &str = "application/vnd.gpumem.cell+json";

pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A notebook of code cells, each with its tags.
pub(crate) fn notebook(cells: &[(&str, &[&str])]) -> Value {
    let cells: Vec<Value> = cells
        .iter()
        .map(|(src, tags)| {
            json!({"cell_type": "code", "metadata": {"tags": tags}, "execution_count": null, "outputs": [], "source": src})
        })
        .collect();
    json!({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells})
}

/// An empty directory `name` under the tests' temporary directory.
pub(crate) fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs a notebook headlessly; returns (exit status, executed notebook, stderr).
pub(crate) fn run(name: &str, nb: &Value, extra_env: &[(&str, &str)]) -> (i32, Value, String) {
    let dir = fresh_dir(&format!("nb-{name}"));
    let path = dir.join("in.ipynb");
    std::fs::write(&path, serde_json::to_string(nb).unwrap()).unwrap();
    run_file(&path, &dir, extra_env)
}

/// Runs the notebook file `path` headlessly, writing its outputs into `dir`.
pub(crate) fn run_file(path: &Path, dir: &Path, extra_env: &[(&str, &str)]) -> (i32, Value, String) {
    let out = dir.join("out.ipynb");
    let html = dir.join("out.html");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpumem-kernel"));
    cmd.args(["run", path.to_str().unwrap(), "--output", out.to_str().unwrap(), "--html", html.to_str().unwrap()])
        .env("GPUMEM_NB_DEVICE", "sim:8GiB");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    let executed: Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap_or_else(|e| panic!("{e}\n{stderr}"))).unwrap();
    assert!(std::fs::read_to_string(&html).unwrap().contains("<!DOCTYPE html>"));
    (o.status.code().unwrap_or(-1), executed, stderr)
}

pub(crate) fn outputs(nb: &Value, i: usize) -> &Vec<Value> {
    nb["cells"][i]["outputs"].as_array().unwrap()
}

pub(crate) fn records(nb: &Value, i: usize) -> Vec<&Value> {
    outputs(nb, i).iter().filter_map(|o| o["data"].get(CELL_MIME)).collect()
}

pub(crate) fn result_text(nb: &Value, i: usize) -> String {
    outputs(nb, i)
        .iter()
        .find(|o| o["output_type"] == "execute_result")
        .map(|o| o["data"]["text/plain"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// The cell's errors as `ename: evalue`.
pub(crate) fn errors(nb: &Value, i: usize) -> Vec<String> {
    outputs(nb, i)
        .iter()
        .filter(|o| o["output_type"] == "error")
        .map(|o| format!("{}: {}", o["ename"].as_str().unwrap_or(""), o["evalue"].as_str().unwrap_or("")))
        .collect()
}

/// The plain text of the cell's displays that are not its report (notices, tables).
pub(crate) fn notices(nb: &Value, i: usize) -> Vec<String> {
    outputs(nb, i)
        .iter()
        .filter(|o| o["output_type"] == "display_data" && o["data"].get(CELL_MIME).is_none())
        .filter_map(|o| o["data"]["text/plain"].as_str().map(str::to_string))
        .collect()
}

/// Writes a path crate `dir/name` with `manifest_extra` after its `[package]` and `lib` as its
/// `src/lib.rs`.
pub(crate) fn path_crate(dir: &Path, name: &str, manifest_extra: &str, lib: &str) -> PathBuf {
    let root = dir.join(name);
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(
        root.join("Cargo.toml"),
        format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n{manifest_extra}"),
    )
    .unwrap();
    std::fs::write(root.join("src/lib.rs"), lib).unwrap();
    root
}

/// `gpumem-demo` of this checkout, built as `kernel/tests/children.sh` builds it, in this test's
/// profile and target directory.
pub(crate) fn demo_binary() -> PathBuf {
    let profile = Path::new(env!("CARGO_BIN_EXE_gpumem-kernel")).parent().unwrap();
    let mut cargo = Command::new(env!("CARGO"));
    // The toolchain that built this test, named whole (tests/paths.rs says why).
    let rustc = Path::new(env!("CARGO")).with_file_name("rustc");
    if rustc.is_file() {
        cargo.env("RUSTC", rustc);
    }
    cargo
        .args(["build", "--quiet", "-p", "gpumem-nb", "--bin", "gpumem-demo"])
        .current_dir(repo_root())
        .env("CARGO_TARGET_DIR", profile.parent().unwrap());
    if profile.file_name().is_some_and(|n| n == "release") {
        cargo.arg("--release");
    }
    let out = cargo.output().unwrap();
    assert!(out.status.success(), "building gpumem-demo: {}", String::from_utf8_lossy(&out.stderr));
    profile.join("gpumem-demo")
}
