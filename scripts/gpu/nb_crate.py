#!/usr/bin/env python3
"""Writes a notebook's code as one Rust crate, to compile it without Jupyter or a GPU.

    nb_crate.py NOTEBOOK.ipynb DIR        # then: cd DIR && cargo check

The crate's [dependencies] are the notebook's `:dep` lines (a `path` is taken relative to the
notebook's folder, as the kernels take it); its main() runs every code cell's statements in
order, its items (use, type, struct, trait, impl, fn) stand at the top level, and a cell's final
expression is printed. `%` magics and other `:` commands are left out. DIR must lie outside any
cargo workspace. What `cargo check` of it says is what the notebook's cells would meet on their
first build: a missing dependency (an offline vendor directory without it), a crate that does not
build, or an API that moved.
"""
import json
import os
import re
import sys

ITEM = re.compile(r"^(pub(\([a-z]+\))?\s+)?(use|type|struct|enum|trait|impl|fn|mod|const|static|#\[|///|//!)")


def chunks(lines):
    """Top-level statements and items: a chunk ends where brackets balance at a `;` or `}`, or
    before a line that starts again at column 0."""
    i, out = 0, []
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        start, depth = i, 0
        while i < len(lines):
            line = lines[i]
            depth += sum(line.count(c) for c in "{([") - sum(line.count(c) for c in "})]")
            i += 1
            ends = line.rstrip().endswith((";", "}")) or i == len(lines) or not lines[i].startswith((" ", ")", "}", "]"))
            if depth == 0 and ends and not line.lstrip().startswith(("#[", "///")):
                break
        out.append("\n".join(lines[start:i]))
    return out


def main():
    nb_path, out = sys.argv[1], sys.argv[2]
    nb = json.load(open(nb_path))
    nb_dir = os.path.dirname(os.path.abspath(nb_path))
    deps, items, body = [], [], []
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        lines = "".join(c["source"]).splitlines()
        for l in lines:
            if l.startswith(":dep "):
                name, _, spec = l[5:].partition("=")
                spec = spec.strip() or '"*"'
                spec = re.sub(r'path\s*=\s*"([^"]*)"', lambda m: f'path = "{os.path.normpath(os.path.join(nb_dir, m.group(1)))}"', spec)
                deps.append(f"{name.strip()} = {spec}")
        code = [l for l in lines if not l.startswith((":", "%"))]
        parts = chunks(code)
        for n, ch in enumerate(parts):
            if ITEM.match(ch.lstrip()):
                items.append(ch)
            elif n == len(parts) - 1 and not ch.rstrip().endswith((";", "}")):
                body.append(f'println!("{{:?}}", {{ {ch} }});')
            else:
                body.append(ch)
    os.makedirs(os.path.join(out, "src"), exist_ok=True)
    name = re.sub(r"[^a-z0-9_]", "_", os.path.basename(nb_path).removesuffix(".ipynb").lower())
    with open(os.path.join(out, "Cargo.toml"), "w") as f:
        f.write(f'[package]\nname = "nb_{name}"\nversion = "0.0.0"\nedition = "2024"\npublish = false\n\n')
        f.write("[dependencies]\n" + "\n".join(deps) + "\n\n[workspace]\n")
    with open(os.path.join(out, "src", "main.rs"), "w") as f:
        f.write(f"//! {os.path.basename(nb_path)}'s code cells, written by scripts/gpu/nb_crate.py.\n#![allow(unused)]\n\n")
        f.write("\n\n".join(items))
        f.write("\n\nfn main() -> Result<(), Box<dyn std::error::Error>> {\n")
        for b in body:
            f.write("    " + b.replace("\n", "\n    ") + "\n")
        f.write("    Ok(())\n}\n")
    print(f"{out}: {len(deps)} dependencies, {len(items)} items, {len(body)} statements")


if __name__ == "__main__":
    main()
