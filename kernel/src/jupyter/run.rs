//! `gpumem-kernel run NOTEBOOK.ipynb [--output OUT.ipynb] [--html OUT.html] [--allow-errors]`:
//! executes a notebook headlessly through the same engine as the kernel (in process, no ZMQ),
//! writes the executed notebook (nbformat 4) and a standalone HTML page.
//!
//! The working directory is the notebook's directory while it runs (as under Jupyter), so
//! `:dep gpumem-nb = { path = ".." }` in `notebooks/tour.ipynb` finds the repository. Cells
//! tagged `raises-exception` may fail; any other failing cell (an error, or a panic) stops the
//! run (unless `--allow-errors`) and makes the exit status 1.

use crate::cell::engine::Engine;
use crate::output::{Output, Sink};
use gpumem_nb::kernel::report::CELL_MIME;
use gpumem_nb::render::escape;
use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// Options of `run`.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The notebook.
    pub notebook: PathBuf,
    /// Where to write the executed notebook.
    pub output: Option<PathBuf>,
    /// Where to write the HTML page.
    pub html: Option<PathBuf>,
    /// Keep going after a failing cell.
    pub allow_errors: bool,
}

/// Collects outputs for the cell being run.
#[derive(Default)]
struct Collect {
    outputs: Mutex<Vec<Output>>,
    /// When the build's progress was last printed (a line every few seconds).
    progress_shown: Mutex<Option<std::time::Instant>>,
}

/// Time between two progress lines on the console.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Sink for Collect {
    fn emit(&self, out: Output) {
        if let Ok(mut o) = self.outputs.lock() {
            o.push(out);
        }
    }

    fn input(&self, prompt: &str, _password: bool) -> String {
        eprintln!("gpumem-kernel run: the notebook asked for input ({prompt:?}); answering with an empty line");
        String::new()
    }

    fn compiling(&self, cell: u64, progress: &crate::output::Progress) {
        let Ok(mut shown) = self.progress_shown.lock() else { return };
        // The first line after two seconds (a short cell build says nothing), then every five.
        let due = match *shown {
            None => progress.elapsed >= std::time::Duration::from_secs(2),
            Some(at) => at.elapsed() >= PROGRESS_EVERY,
        };
        if due {
            eprintln!("      [{cell}] {}", progress.describe());
            *shown = Some(std::time::Instant::now());
        }
    }
}

/// A cell's source as one string (nbformat allows a string or a list of lines).
pub fn source_of(cell: &Value) -> String {
    match cell.get("source") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => String::new(),
    }
}

fn tags_of(cell: &Value) -> Vec<String> {
    cell.pointer("/metadata/tags")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// Engine outputs as nbformat outputs (consecutive streams of one name merged; an update
/// replaces the data of the output shown under its display id, as a frontend does).
pub fn nbformat_outputs(outputs: Vec<Output>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut shown: std::collections::HashMap<String, usize> = Default::default();
    for o in outputs {
        match o {
            Output::ExecuteInput { .. } => {}
            Output::Stream { name, text } => {
                if let Some(last) = out.last_mut()
                    && last["output_type"] == "stream"
                    && last["name"] == name
                {
                    let merged = format!("{}{}", last["text"].as_str().unwrap_or(""), text);
                    last["text"] = Value::String(merged);
                    continue;
                }
                out.push(json!({"output_type": "stream", "name": name, "text": text}));
            }
            Output::ExecuteResult { count, data } => out.push(json!({
                "output_type": "execute_result", "execution_count": count, "data": data, "metadata": {}
            })),
            Output::Display { data } => {
                out.push(json!({"output_type": "display_data", "data": data, "metadata": {}}));
            }
            Output::Updatable { id, data } => {
                shown.insert(id, out.len());
                out.push(json!({"output_type": "display_data", "data": data, "metadata": {}}));
            }
            Output::Update { id, data } => match shown.get(&id) {
                Some(&i) => out[i]["data"] = Value::Object(data),
                None => out.push(json!({"output_type": "display_data", "data": data, "metadata": {}})),
            },
            Output::Error(e) => out.push(json!({
                "output_type": "error", "ename": e.ename, "evalue": e.evalue, "traceback": e.traceback
            })),
        }
    }
    out
}

/// Runs the notebook; returns the process exit status (0: every cell as expected).
pub fn run(opts: &RunOptions) -> anyhow::Result<i32> {
    let cwd = std::env::current_dir()?;
    let abs = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { cwd.join(p) };
    let nb_path = abs(&opts.notebook);
    let text =
        std::fs::read_to_string(&nb_path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", nb_path.display()))?;
    let mut nb: Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{} is not JSON: {e}", nb_path.display()))?;
    if nb.get("nbformat").and_then(Value::as_u64) != Some(4) {
        anyhow::bail!("{} is not an nbformat 4 notebook", nb_path.display());
    }
    let mut output = opts.output.as_deref().map(abs);
    let html = opts.html.as_deref().map(abs);
    if output.is_none() && html.is_none() {
        let stem = nb_path.file_stem().and_then(|s| s.to_str()).unwrap_or("notebook");
        output = Some(nb_path.with_file_name(format!("{stem}.executed.ipynb")));
    }
    if let Some(dir) = nb_path.parent() {
        std::env::set_current_dir(dir)?;
    }

    let sink = Arc::new(Collect::default());
    let started = std::time::Instant::now();
    eprintln!("gpumem-kernel run: starting evcxr…");
    let mut engine = Engine::new(sink.clone(), Arc::new(AtomicBool::new(false)))?;
    let cells = nb.get_mut("cells").and_then(Value::as_array_mut).ok_or_else(|| anyhow::anyhow!("no cells"))?;
    let n_code = cells.iter().filter(|c| c["cell_type"] == "code").count();
    let mut failures: Vec<String> = Vec::new();
    let mut i_code = 0;
    let mut stopped = false;
    for cell in cells.iter_mut() {
        if cell["cell_type"] != "code" {
            continue;
        }
        if stopped {
            cell["outputs"] = json!([]);
            cell["execution_count"] = Value::Null;
            continue;
        }
        i_code += 1;
        let code = source_of(cell);
        let outcome = engine.execute(&code, false, None);
        let outputs = std::mem::take(&mut *sink.outputs.lock().unwrap_or_else(|e| e.into_inner()));
        *sink.progress_shown.lock().unwrap_or_else(|e| e.into_inner()) = None;
        // What the kernel does while Jupyter shows it idle, here between two cells.
        engine.idle_work();
        let expected_error = tags_of(cell).iter().any(|t| t == "raises-exception");
        // What Jupyter's execute_reply says: a panic and a bad magic are errors too.
        let failed = outcome.error.is_some();
        let line = outcome.record.as_ref().map(|r| r.line()).unwrap_or_else(|| "(magics only)".to_string());
        let status = match (failed, expected_error) {
            (false, _) => "ok",
            (true, true) => "error (expected)",
            (true, false) => "FAILED",
        };
        eprintln!("[{i_code}/{n_code}] {status} · {line}");
        if failed && !expected_error {
            let what = outcome.error.as_ref().map(|e| format!("{}: {}", e.ename, e.evalue)).unwrap_or_default();
            let first = code.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
            failures.push(format!("cell [{}] `{first}`: {what}", outcome.count));
            if !opts.allow_errors {
                stopped = true;
            }
        }
        cell["execution_count"] = json!(outcome.count);
        cell["outputs"] = Value::Array(nbformat_outputs(outputs));
    }
    engine.kill_child();
    drop(engine);

    let meta = nb.as_object_mut().and_then(|o| o.get_mut("metadata")).and_then(Value::as_object_mut);
    if let Some(meta) = meta {
        meta.insert(
            "kernelspec".into(),
            json!({"name": crate::jupyter::install::KERNEL_NAME, "display_name": "Rust (gpumem)", "language": "rust"}),
        );
        meta.insert(
            "language_info".into(),
            json!({"name": "Rust", "file_extension": ".rs", "mimetype": "text/rust", "pygments_lexer": "rust", "codemirror_mode": "rust"}),
        );
    }
    if let Some(out) = &output {
        let mut s = serde_json::to_string_pretty(&nb)?;
        s.push('\n');
        std::fs::write(out, s).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", out.display()))?;
        eprintln!("gpumem-kernel run: wrote {}", out.display());
    }
    if let Some(h) = &html {
        let title = nb_path.file_name().and_then(|s| s.to_str()).unwrap_or("notebook");
        std::fs::write(h, to_html(&nb, title)).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", h.display()))?;
        eprintln!("gpumem-kernel run: wrote {}", h.display());
    }
    eprintln!(
        "gpumem-kernel run: {} code cells in {}, {} failed",
        i_code,
        gpumem_nb::kernel::report::format_ms(started.elapsed().as_secs_f64() * 1000.0),
        failures.len()
    );
    for f in &failures {
        eprintln!("  {f}");
    }
    Ok(if failures.is_empty() { 0 } else { 1 })
}

/// The cell a new session starts with, built ahead by [`prebuild`].
pub const PREBUILD_CELL: &str = ":dep gpumem-nb\ngpumem_nb::VERSION";

/// Builds gpumem-nb and its dependencies in the directory the kernel's cells use, exactly as a
/// new session's first `:dep gpumem-nb` cell does, so that cell finds them built (`install`
/// runs it). The build's progress goes to the console; returns how long it took.
pub fn prebuild() -> anyhow::Result<std::time::Duration> {
    let started = std::time::Instant::now();
    let sink = Arc::new(Collect::default());
    let mut engine = Engine::new(sink.clone(), Arc::new(AtomicBool::new(false)))?;
    let outcome = engine.execute(PREBUILD_CELL, false, None);
    engine.kill_child();
    drop(engine);
    if let Some(e) = outcome.error {
        let detail = e.traceback.iter().map(|l| strip_ansi(l)).collect::<Vec<_>>().join("\n");
        anyhow::bail!("building gpumem-nb for notebook cells failed: {}: {}\n{detail}", e.ename, e.evalue);
    }
    Ok(started.elapsed())
}

/// Removes ANSI colour escapes (tracebacks carry them).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\x1b' && it.peek() == Some(&'[') {
            it.next();
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        other => other.to_string(),
    }
}

fn render_data(data: &Map<String, Value>) -> String {
    if let Some(h) = data.get("text/html") {
        let report = data.contains_key(CELL_MIME);
        let class = if report { "output html gpumem" } else { "output html" };
        return format!("<div class=\"{class}\">{}</div>", text_of(h));
    }
    if let Some(svg) = data.get("image/svg+xml") {
        let svg = text_of(svg);
        // Drop an XML prolog; the SVG goes inline.
        let start = svg.find("<svg").unwrap_or(0);
        return format!("<div class=\"output svg\">{}</div>", &svg[start..]);
    }
    for mime in ["image/png", "image/jpeg"] {
        if let Some(b64) = data.get(mime) {
            let b64: String = text_of(b64).split_whitespace().collect();
            return format!("<div class=\"output\"><img src=\"data:{mime};base64,{b64}\"></div>");
        }
    }
    if let Some(t) = data.get("text/plain") {
        return format!("<pre class=\"output\">{}</pre>", escape(&text_of(t)));
    }
    String::new()
}

/// A standalone HTML page of an executed notebook: inline styles, inline SVG, no scripts.
pub fn to_html(nb: &Value, title: &str) -> String {
    let mut body = String::new();
    for cell in nb["cells"].as_array().into_iter().flatten() {
        let src = source_of(cell);
        match cell["cell_type"].as_str() {
            Some("markdown") => {
                let mut html = String::new();
                pulldown_cmark::html::push_html(&mut html, pulldown_cmark::Parser::new(&src));
                body.push_str(&format!("<div class=\"cell md\">{html}</div>\n"));
            }
            Some("code") => {
                let n = cell["execution_count"].as_u64().map_or(" ".to_string(), |n| n.to_string());
                body.push_str(&format!(
                    "<div class=\"cell code\"><div class=\"prompt\">[{n}]</div><pre class=\"input\">{}</pre>",
                    escape(&src)
                ));
                for o in cell["outputs"].as_array().into_iter().flatten() {
                    match o["output_type"].as_str() {
                        Some("stream") => body.push_str(&format!(
                            "<pre class=\"output {}\">{}</pre>",
                            o["name"].as_str().unwrap_or("stdout"),
                            escape(&strip_ansi(&text_of(&o["text"])))
                        )),
                        Some("error") => {
                            let tb: Vec<String> = o["traceback"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(Value::as_str)
                                .map(strip_ansi)
                                .collect();
                            body.push_str(&format!(
                                "<pre class=\"output error\">{}: {}\n{}</pre>",
                                escape(o["ename"].as_str().unwrap_or("")),
                                escape(o["evalue"].as_str().unwrap_or("")),
                                escape(&tb.join("\n"))
                            ));
                        }
                        Some("execute_result" | "display_data") => {
                            if let Some(d) = o["data"].as_object() {
                                body.push_str(&render_data(d));
                            }
                        }
                        _ => {}
                    }
                }
                body.push_str("</div>\n");
            }
            _ => body.push_str(&format!("<pre class=\"cell raw\">{}</pre>\n", escape(&src))),
        }
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head>\
         <body><main>\n{body}<footer>executed by gpumem-kernel {}</footer></main></body></html>\n",
        escape(title),
        env!("CARGO_PKG_VERSION")
    )
}

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;background:#fafafa;color:#222}\
main{max-width:1000px;margin:0 auto;padding:24px}\
.cell{margin:14px 0}.code{position:relative;padding-left:56px}\
.prompt{position:absolute;left:0;top:6px;color:#307fc1;font-family:monospace;font-size:12px}\
pre{white-space:pre-wrap;word-break:break-word;font-size:12.5px;margin:4px 0;padding:6px 8px}\
.input{background:#f3f3f3;border:1px solid #ddd;border-radius:3px}\
.output{overflow-x:auto}.stderr{background:#fdd}.error{background:#fdd;color:#700}\
.gpumem{border-left:3px solid #b7410e;padding-left:8px;margin:6px 0}\
.svg svg{max-width:100%;height:auto}\
table{border-collapse:collapse}footer{color:#888;font-size:12px;margin-top:32px}";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::ErrorInfo;

    #[test]
    fn outputs_become_nbformat() {
        let mut d = Map::new();
        d.insert("text/plain".into(), json!("2"));
        let outs = nbformat_outputs(vec![
            Output::ExecuteInput { code: "x".into(), count: 1 },
            Output::Stream { name: "stdout", text: "a\n".into() },
            Output::Stream { name: "stdout", text: "b\n".into() },
            Output::Stream { name: "stderr", text: "c\n".into() },
            Output::ExecuteResult { count: 1, data: d.clone() },
            Output::Display { data: d.clone() },
            Output::Error(ErrorInfo { ename: "E".into(), evalue: "v".into(), traceback: vec!["t".into()] }),
        ]);
        assert_eq!(outs.len(), 5);
        // A live line and its updates: one output, holding the last data.
        let mut last = Map::new();
        last.insert("text/plain".into(), json!("final"));
        let live = nbformat_outputs(vec![
            Output::Updatable { id: "l".into(), data: d.clone() },
            Output::Stream { name: "stdout", text: "a\n".into() },
            Output::Update { id: "l".into(), data: d.clone() },
            Output::Update { id: "l".into(), data: last },
            Output::Update { id: "unknown".into(), data: d },
        ]);
        assert_eq!(live.len(), 3);
        assert_eq!(live[0]["data"]["text/plain"], "final");
        assert_eq!(live[2]["data"]["text/plain"], "2", "an update of nothing shown is shown");
        assert_eq!(outs[0]["text"], "a\nb\n");
        assert_eq!(outs[1]["name"], "stderr");
        assert_eq!(outs[2]["output_type"], "execute_result");
        assert_eq!(outs[2]["execution_count"], 1);
        assert_eq!(outs[3]["output_type"], "display_data");
        assert_eq!(outs[4]["traceback"][0], "t");
    }

    #[test]
    fn html_page_is_standalone() {
        let nb = json!({
            "nbformat": 4, "nbformat_minor": 5, "metadata": {},
            "cells": [
                {"cell_type": "markdown", "metadata": {}, "source": ["# Title\n", "text <b>"]},
                {"cell_type": "code", "metadata": {}, "execution_count": 1, "source": "1 < 2",
                 "outputs": [
                    {"output_type": "stream", "name": "stderr", "text": "\u{1b}[31mred\u{1b}[0m\n"},
                    {"output_type": "display_data", "metadata": {}, "data": {"image/svg+xml": "<?xml version=\"1.0\"?><svg width=\"1\"></svg>", "text/plain": "chart"}},
                    {"output_type": "display_data", "metadata": {}, "data": {"text/html": "<details>r</details>", "text/plain": "r", CELL_MIME: {}}}
                 ]}
            ]
        });
        let h = to_html(&nb, "t.ipynb");
        assert!(h.contains("<h1>Title</h1>"));
        assert!(h.contains("1 &lt; 2"));
        assert!(h.contains("<pre class=\"output stderr\">red\n</pre>"), "{h}");
        assert!(h.contains("<div class=\"output svg\"><svg width=\"1\"></svg></div>"));
        assert!(h.contains("output html gpumem"));
        assert!(!h.contains("<script"));
        assert!(!h.contains("http://") && !h.contains("https://"), "offline");
    }
}
