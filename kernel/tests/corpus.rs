//! The notebooks written as the frameworks' own docs write them (issue 43), on the CPU: every
//! cell runs as written in gpumem-kernel. candle's `VarBuilder` model bound at the top level in
//! three cells, a loss closure, AdamW; burn's derives, `init` and training steps that hand the
//! model to the optimizer and take it back. The first run builds candle and burn where the kernel
//! builds cells (minutes); later runs reuse it. The stock kernel's count for the same notebooks is
//! `scripts/corpus.sh`'s (BENCHMARKS.md, "Framework code as its docs write it").

mod common;

use common::{errors, fresh_dir, notices, records, repo_root, result_text, run_file};
use serde_json::Value;

/// Runs `notebooks/NAME.ipynb` headlessly; every code cell must end without an error. Returns
/// the executed notebook and the index of each code cell among all cells.
fn run_as_written(name: &str) -> (Value, Vec<usize>) {
    let path = repo_root().join("notebooks").join(format!("{name}.ipynb"));
    let dir = fresh_dir(&format!("corpus-{name}"));
    let (status, out, stderr) = run_file(&path, &dir, &[]);
    let code: Vec<usize> = out["cells"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, c)| c["cell_type"] == "code")
        .map(|(i, _)| i)
        .collect();
    for &i in &code {
        assert!(errors(&out, i).is_empty(), "{name}, cell {i}: {:?}\n{}", errors(&out, i), &stderr);
    }
    assert_eq!(status, 0, "{stderr}");
    (out, code)
}

/// The index among all cells of the code cell whose source starts with `start`.
fn cell_starting(out: &Value, start: &str) -> usize {
    out["cells"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| {
            let src = match &c["source"] {
                Value::String(s) => s.clone(),
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => String::new(),
            };
            c["cell_type"] == "code" && src.starts_with(start)
        })
        .unwrap_or_else(|| panic!("no cell starts with {start:?}"))
}

#[test]
fn candle_as_its_book_writes_it() {
    let (out, _) = run_as_written("candle_book");
    // The `VarBuilder` cell: the classifier's parameters, 784·128 + 128 + 128·10 + 10.
    let vb = cell_starting(&out, "let varmap = VarMap::new();");
    assert_eq!(result_text(&out, vb), (784 * 128 + 128 + 128 * 10 + 10).to_string());
    assert!(notices(&out, vb).is_empty(), "every variable kept: {:?}", notices(&out, vb));
    // Training with the loss closure lowers the loss; the regression learns y = 3·x₀ + x₁ − 2.
    assert_eq!(result_text(&out, cell_starting(&out, "let mut opt = AdamW::new")), "true");
    let first = cell_starting(&out, "let first = &learned[..1];");
    assert_eq!(result_text(&out, first), "true");
    assert_eq!(
        notices(&out, first),
        ["`first` borrows `learned`: kept for this cell only; write `let first = learned[..1].to_vec();`"]
    );
    assert_eq!(result_text(&out, first + 1), "2", "`learned` is kept");
    assert_eq!(result_text(&out, cell_starting(&out, "errors.fold")), "true");
}

#[test]
fn burn_as_its_book_writes_it() {
    let (out, _) = run_as_written("burn_book");
    // `model = optim.step(lr, model, grads)` in a loop: the model is kept, trained.
    let params = cell_starting(&out, "type MyBackend");
    let n = result_text(&out, params);
    assert!(n.parse::<u64>().is_ok_and(|n| n == 28 * 28 * 256 + 256 + 256 * 10 + 10), "{n}");
    let step = cell_starting(&out, "let mut optim = AdamConfig::new().init();");
    assert_eq!(result_text(&out, step), "true");
    assert_eq!(result_text(&out, cell_starting(&out, "model.num_params()")), n);
    // What the variables hold, by burn's own types, with no call of ours (the session library's
    // probe): the model's parameters are its `num_params` f32s; after the steps, Adam's two
    // moments per parameter.
    let n: u64 = n.parse().unwrap();
    let held = |i: usize| {
        let r = records(&out, i);
        assert_eq!(r.len(), 1, "cell {i}: one record");
        let v = &r[0]["variables"];
        assert_eq!(v["framework"], "burn", "cell {i}: {v}");
        let of = |name: &str| v["variables"].as_array().unwrap().iter().find(|x| x["name"] == name).cloned();
        (v.clone(), of("model"), of("optim"))
    };
    let (v, model, optim) = held(params);
    let model = model.unwrap_or_else(|| panic!("no `model` in {v}"));
    assert_eq!((model["component"].as_str(), model["bytes"].as_u64()), (Some("parameter"), Some(n * 4)), "{v}");
    assert!(optim.is_none(), "{v}");
    let (v, model, optim) = held(step);
    assert_eq!(model.map(|m| m["bytes"].as_u64()), Some(Some(n * 4)), "{v}");
    let optim = optim.unwrap_or_else(|| panic!("no `optim` in {v}"));
    assert_eq!(
        (optim["component"].as_str(), optim["bytes"].as_u64()),
        (Some("optimizer_state"), Some(2 * n * 4)),
        "{v}"
    );
    let adam = v["components"].as_array().unwrap().iter().find(|c| c["component"] == "optimizer_state").unwrap();
    assert_eq!((adam["before"].as_u64(), adam["after"].as_u64()), (Some(0), Some(2 * n * 4)), "{v}");
}

/// candle's error as its book shows one ("Error management": a `matmul` of two `(1, 784)`
/// tensors), on the CPU: candle's message is the cell's error value, never a frame of the
/// backtrace `RUST_BACKTRACE=1` gives it; the backtrace is folded to candle's frame and the
/// cell's; the session goes on.
#[test]
fn candles_error_is_its_message() {
    let path = repo_root().join("notebooks").join("errors_candle.ipynb");
    let dir = fresh_dir("corpus-errors_candle");
    let (status, out, stderr) = run_file(&path, &dir, &[]);
    assert_eq!(status, 0, "{stderr}");
    let failing =
        cell_starting(&out, "let x = Tensor::zeros((1, 784), DType::F32, &device)?;\nlet y = Tensor::zeros((1, 784)");
    assert_eq!(errors(&out, failing), ["Error: shape mismatch in matmul, lhs: [1, 784], rhs: [1, 784]"]);
    let error =
        out["cells"][failing]["outputs"].as_array().unwrap().iter().find(|o| o["output_type"] == "error").unwrap();
    let tb: Vec<&str> = error["traceback"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    let tb = tb.join("\n");
    assert!(tb.contains("candle_core::tensor::Tensor::matmul") && tb.contains("line 3"), "{tb}");
    for hidden in ["_start", "Error::bt", "load_and_run", "<unknown>"] {
        assert!(!tb.contains(hidden), "{hidden}: {tb}");
    }
    let next =
        cell_starting(&out, "let x = Tensor::zeros((1, 784), DType::F32, &device)?;\nlet y = Tensor::zeros((784, 10)");
    assert_eq!(result_text(&out, next), "[1, 10]");
}
