//! A cell's error as Jupyter shows it (`ErrorInfo`, from evcxr's errors and from an error the
//! cell's code returned, its message first and its backtrace folded), and what the record keeps
//! of the cell's code (its first line, a hash for re-run detection).

use super::backtrace::{folded, split_backtrace};
use super::panic::{Locate, ReturnedText};
use crate::build::stable_hash::StableHash;
use crate::output::ErrorInfo;

/// evcxr's error as Jupyter's: `held` is what the child held on its devices when it was stopped
/// (the live line's last reading, or the cell's start), released with it.
pub(super) fn error_info(e: &evcxr::Error, code: &str, interrupted: bool, held: Option<u64>) -> ErrorInfo {
    match e {
        evcxr::Error::CompilationErrors(errors) => {
            let mut tb = Vec::new();
            let lines: Vec<&str> = code.lines().collect();
            for err in errors {
                let head = match err.code() {
                    Some(c) => format!("\x1b[1;31m{}[{c}]\x1b[0m: {}", err.level(), err.message()),
                    None => format!("\x1b[1;31m{}\x1b[0m: {}", err.level(), err.message()),
                };
                tb.push(head);
                for sm in err.spanned_messages() {
                    if let Some(span) = sm.span {
                        let src = lines.get(span.start_line.saturating_sub(1)).copied().unwrap_or("");
                        tb.push(format!("  --> cell line {}:{}", span.start_line, span.start_column));
                        tb.push(format!("   | {src}"));
                        let width = if span.end_line == span.start_line {
                            span.end_column.saturating_sub(span.start_column).max(1)
                        } else {
                            1
                        };
                        tb.push(format!(
                            "   | {}{} {}",
                            " ".repeat(span.start_column.saturating_sub(1)),
                            "^".repeat(width),
                            sm.label
                        ));
                    } else if !err.is_from_user_code() {
                        tb.extend(sm.lines.iter().cloned());
                    }
                }
                for h in err.help() {
                    tb.push(format!("   = help: {h}"));
                }
                if let Some(hint) = err.evcxr_extra_hint() {
                    tb.push(format!("   = note: {hint}"));
                }
                if !err.is_from_user_code() && err.spanned_messages().is_empty() {
                    tb.extend(err.rendered().lines().map(str::to_string));
                }
            }
            let evalue = errors.first().map(|e| e.message()).unwrap_or_default();
            ErrorInfo { ename: "CompilationError".into(), evalue, traceback: tb }
        }
        evcxr::Error::SubprocessTerminated(msg) => {
            let ename = if interrupted { "Interrupted" } else { "SubprocessTerminated" };
            // What it held is said once, here: the figure of the last reading (the live line's).
            let released = match held.filter(|&b| b > 0) {
                Some(b) => format!("; the {} it held on the device was released", gpumem_nb::units::iec(b)),
                None => String::new(),
            };
            let evalue = if interrupted {
                format!("the cell's process was stopped and a new one started{released}")
            } else {
                format!("the notebook's process ended and a new one started{released}")
            };
            let mut tb = vec![
                format!("\x1b[1;31m{ename}\x1b[0m: {evalue}"),
                "Variables are lost; gpumem's per-cell history is kept.".to_string(),
            ];
            // What evcxr said (the signal), last: the detail, not the headline.
            tb.extend(msg.lines().map(|l| format!("  ({l})")));
            ErrorInfo { ename: ename.into(), evalue, traceback: tb }
        }
        other => {
            let msg = other.to_string();
            ErrorInfo {
                ename: "Error".into(),
                evalue: msg.lines().next().unwrap_or("").to_string(),
                traceback: msg.lines().map(str::to_string).collect(),
            }
        }
    }
}

/// The error a cell's code returned through `?` (`returned`: its text, as the child printed it:
/// evcxr writes it with `Display`, or `Debug` after `:efmt {:?}`), in cell `cell`; `oom` when the
/// allocator failed for lack of memory in the cell.
///
/// The error's message comes first: `evalue` is its first line and the traceback starts with it
/// whole (an anyhow chain's `Caused by:` lines are part of it), then the backtrace the error
/// carries (candle's `WithBacktrace`, anyhow's `Stack backtrace:`, any std `Backtrace` printed
/// after the message: evcxr's child runs with `RUST_BACKTRACE=1`), folded as a panic's is
/// ([`panic::folded`]). An error without a backtrace is shown as it is. An out-of-memory error is
/// `OutOfMemoryError` (PyTorch's `torch.cuda.OutOfMemoryError`), so is one whose message names
/// cudarc's `CUDA_ERROR_OUT_OF_MEMORY`: the allocator's `CUDA out of memory…` line is the value
/// when there is one, the framework's own text stays in the traceback. When the text is not marked whole (only the last stderr lines before the child's
/// mark are known), the value is the message's last line.
pub(super) fn returned_error(returned: &ReturnedText, oom: bool, cell: u64, locate: Locate<'_>) -> ErrorInfo {
    let (message, backtrace) = split_backtrace(&returned.lines);
    let oom_line = message.iter().position(|l| l.starts_with("CUDA out of memory"));
    // cudarc's driver error for a failed allocation, as candle and cubecl pass it on
    // (`DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")`).
    let oom = oom || message.iter().any(|l| l.contains("CUDA_ERROR_OUT_OF_MEMORY"));
    let at = match oom_line {
        Some(i) => Some(i),
        None if returned.whole => message.iter().position(|l| !l.trim().is_empty()),
        None => message.iter().rposition(|l| !l.trim().is_empty()),
    };
    let ename = if oom || oom_line.is_some() { "OutOfMemoryError" } else { "Error" };
    let evalue = at.map_or_else(|| "the cell returned an error".to_string(), |i| message[i].clone());
    let mut traceback = vec![format!("\x1b[1;31m{ename}\x1b[0m: {evalue}")];
    // The rest of the message (all of it when the value is a later line of it, as the
    // allocator's out-of-memory line under a framework's context); of unmarked text, only the
    // value is known to be the error's.
    if returned.whole {
        let rest = match at {
            Some(i) if message[..i].iter().all(|l| l.trim().is_empty()) => &message[i + 1..],
            _ => &message[..],
        };
        traceback.extend(rest.iter().cloned());
    }
    traceback.push(
        "The cell's code returned this error through `?`: it stopped there, and the variables it \
         defined are not kept."
            .to_string(),
    );
    traceback.extend(folded(&backtrace, "stack backtrace", cell, locate));
    ErrorInfo { ename: ename.into(), evalue, traceback }
}

/// The error a cell's value is (`Err(…)` as the last expression), when it is one.
pub(super) fn value_error(text_plain: Option<&str>) -> Option<ErrorInfo> {
    let text = text_plain?.trim();
    let inner = text.strip_prefix("Err(")?.strip_suffix(')')?;
    let evalue = inner.lines().next().unwrap_or("").to_string();
    Some(ErrorInfo {
        ename: "Error".into(),
        evalue: evalue.clone(),
        traceback: vec![
            format!("\x1b[1;31mError\x1b[0m: {evalue}"),
            "The cell's value is an `Err`: shown above, and the cell counts as failed.".into(),
        ],
    })
}

/// The error of the cell in which the device's CUDA context was lost: the fault's driver name,
/// and what it means, which call noticed it, why it may have been an earlier launch, and what
/// to do.
pub(super) fn context_lost(l: &gpumem_nb::device::LostContext, cell: u64) -> ErrorInfo {
    let evalue = gpumem_nb::kernel::report::lost_message(l, cell);
    ErrorInfo {
        ename: l.fault.code().into(),
        evalue: evalue.clone(),
        traceback: vec![
            format!("\x1b[1;31m{}\x1b[0m: {evalue}", l.fault.code()),
            gpumem_nb::kernel::report::LOST_ASYNC_HINT.into(),
            "`%gpumem restart` starts a fresh notebook process (variables are lost, the history is kept).".into(),
        ],
    }
}

/// What a failing cell after the context was lost in cell `cell` is also told: every call on the
/// device fails (host code runs), and how to go on.
pub(super) fn after_loss_note(l: &gpumem_nb::device::LostContext, cell: u64) -> String {
    format!(
        "The CUDA context was lost in cell {cell} ({}): every call on the device fails from then on; host code \
         runs. `%gpumem restart` starts a fresh notebook process (variables are lost, the history is kept).",
        l.fault.what()
    )
}

pub(super) fn first_code_line(code: &str) -> String {
    let l = code.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with("//")).unwrap_or("");
    if l.chars().count() > 48 { format!("{}…", l.chars().take(47).collect::<String>()) } else { l.to_string() }
}

/// A stable hash of a cell's code (whitespace at line ends and empty lines ignored), hex.
pub(super) fn source_hash(code: &str) -> String {
    let mut h = StableHash::default();
    for line in code.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
        h.write(line.as_bytes()).write(b"\n");
    }
    h.hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: &[&str], whole: bool) -> ReturnedText {
        ReturnedText { lines: v.iter().map(|s| s.to_string()).collect(), whole }
    }

    fn nowhere(_: u32) -> Option<(u64, u32)> {
        None
    }

    #[test]
    fn returned_errors_and_err_values() {
        // Unmarked (the last stderr lines): the last one is the error.
        let e = returned_error(&text(&["a note the cell printed", "my own error"], false), false, 1, &nowhere);
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("Error", "my own error"));
        // Marked whole: the first line, the rest after it.
        let e = returned_error(&text(&["my own error", "with a second line"], true), false, 1, &nowhere);
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("Error", "my own error"));
        assert_eq!(e.traceback[1], "with a second line");
        let oom =
            "CUDA out of memory. Tried to allocate 1024.00 GiB. GPU 0 (simulated) has a total capacity of 80.00 GiB";
        let e = returned_error(&text(&[oom, "  with more"], true), false, 1, &nowhere);
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("OutOfMemoryError", oom));
        assert_eq!(e.traceback[1], "  with more");
        let e = returned_error(&text(&["out of memory, said otherwise"], true), true, 1, &nowhere);
        assert_eq!(e.ename, "OutOfMemoryError");
        assert_eq!(returned_error(&text(&[], true), false, 1, &nowhere).evalue, "the cell returned an error");
        let e = value_error(Some("Err(\"bad input\")")).unwrap();
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("Error", "\"bad input\""));
        assert!(
            value_error(Some("Ok(3)")).is_none()
                && value_error(Some("Errand")).is_none()
                && value_error(None).is_none()
        );
    }

    /// What gpumem-kernel's child printed for an error a cell returned through `?` after
    /// `:efmt {:?}` (anyhow 1.0.105's `Debug`, `RUST_BACKTRACE=1`): `load().context("loading the
    /// model")?` in cell 4, `load` (the cell's lines 2–4) reading a missing file with
    /// `.context("reading the weights")`. evcxr built the cell in `~/.cache/gpumem-kernel/evcxr-2`.
    const CHILD_ANYHOW_DEBUG: &str = include_str!("fixtures/anyhow_debug_error.txt");

    /// candle 0.11's error in an anyhow chain (`{:?}`): candle's `Display` (the message, then
    /// its `WithBacktrace`'s std backtrace) is anyhow's one cause, indented, and anyhow's own
    /// backtrace follows. Made by the same program with an error type whose formats are
    /// candle-core 0.11.1's (`error.rs`: `{inner}\n{backtrace}`, `shape mismatch in {op}, lhs:
    /// {lhs:?}, rhs: {rhs:?}`), its functions renamed as candle's.
    const ANYHOW_CANDLE: &str = include_str!("fixtures/anyhow_chain_with_candle_error.txt");

    /// candle's `Context` (`{context}\n{inner}`) around a `WithBacktrace`, as `Display` writes
    /// it (evcxr's default), from the same program.
    const CANDLE_CONTEXT: &str = include_str!("fixtures/candle_context_display.txt");

    fn whole(s: &str) -> ReturnedText {
        ReturnedText { lines: s.lines().map(str::to_string).collect(), whole: true }
    }

    #[test]
    fn an_anyhow_chain_is_the_message_and_its_backtrace_is_folded() {
        // The kernel knows the build directory (`EVCXR_TMPDIR`): the cell's file as rustc names
        // it relative to it.
        let text = CHILD_ANYHOW_DEBUG.replace("/root/.cache/gpumem-kernel/evcxr-2/", "");
        let (message, backtrace) = split_backtrace(&whole(&text).lines);
        assert_eq!(
            message,
            [
                "loading the model",
                "",
                "Caused by:",
                "    0: reading the weights",
                "    1: No such file or directory (os error 2)"
            ]
        );
        assert!(backtrace[0].starts_with("   0: <E as anyhow::context::ext::StdError>::ext_context"), "{backtrace:?}");
        assert_eq!(backtrace.last().unwrap(), "  32: _start");
        let lines = |l: u32| match l {
            4 => Some((4, 3)),
            130 => Some((4, 5)),
            _ => None,
        };
        let e = returned_error(&whole(&text), false, 4, &lines);
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("Error", "loading the model"));
        assert_eq!(
            e.traceback,
            [
                "\x1b[1;31mError\x1b[0m: loading the model",
                "",
                "Caused by:",
                "    0: reading the weights",
                "    1: No such file or directory (os error 2)",
                "The cell's code returned this error through `?`: it stopped there, and the variables it defined are \
                 not kept.",
                "stack backtrace (innermost first; 31 frames of std, evcxr, gpumem-kernel and the error's making hidden):",
                "   0: load",
                "          at cell [4] line 3",
                "   1: cell [4]",
                "          at cell [4] line 5",
            ]
        );
    }

    #[test]
    fn a_candle_error_inside_an_anyhow_chain_keeps_its_own_backtrace() {
        let (message, backtrace) = split_backtrace(&whole(ANYHOW_CANDLE).lines);
        assert_eq!(
            message,
            ["the forward pass", "", "Caused by:", "    shape mismatch in matmul, lhs: [3, 5], rhs: [3, 5]"]
        );
        // The innermost error's (candle's, where the shapes were compared), not anyhow's.
        assert_eq!(backtrace[0], "       0: candle_core::error::Error::bt");
        let e = returned_error(&whole(ANYHOW_CANDLE), false, 3, &nowhere);
        assert_eq!(e.evalue, "the forward pass");
        let tb = e.traceback.join("\n");
        assert!(tb.contains("    shape mismatch in matmul, lhs: [3, 5], rhs: [3, 5]\n"), "{tb}");
        assert!(tb.contains("   0: candle_core::tensor::Tensor::matmul\n"), "{tb}");
        assert!(!tb.contains("Error::bt") && !tb.contains("ext_context"), "{tb}");
    }

    #[test]
    fn candles_display_puts_the_context_first() {
        let e = returned_error(&whole(CANDLE_CONTEXT), false, 3, &nowhere);
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("Error", "in layer 2"));
        assert_eq!(e.traceback[1], "shape mismatch in matmul, lhs: [3, 5], rhs: [3, 5]");
        assert!(e.traceback.iter().all(|l| !l.contains("_start") && !l.contains("Error::bt")), "{:?}", e.traceback);
        // Not marked whole: the message's last line, never a frame.
        let e = returned_error(&ReturnedText { whole: false, ..whole(CANDLE_CONTEXT) }, false, 3, &nowhere);
        assert_eq!(e.evalue, "shape mismatch in matmul, lhs: [3, 5], rhs: [3, 5]");
    }

    #[test]
    fn text_without_a_backtrace_is_kept_as_it_is() {
        let lines = ["outer", "", "Caused by:", "    0: config::Model failed", "    1: c::d", "       next line"];
        let (message, backtrace) = split_backtrace(&lines.map(String::from));
        assert_eq!(message, lines, "anyhow's numbered causes are not frames");
        assert!(backtrace.is_empty());
        // A lone frame-like line is not a backtrace.
        let one = ["error list:", "   0: only::one"].map(String::from);
        assert_eq!(split_backtrace(&one).0, one);
        // Only frames: no message, and no frame in its place.
        let (message, backtrace) = split_backtrace(&["   0: a::b", "   1: c::d", ""].map(String::from));
        assert!(message.is_empty() && backtrace.len() == 2);
        let e = returned_error(&whole("   0: a::b\n   1: _start\n"), false, 1, &nowhere);
        assert_eq!(e.evalue, "the cell returned an error");
    }

    #[test]
    fn the_framework_text_of_an_out_of_memory_error_stays() {
        // candle's CUDA out-of-memory as a cell printed it on an H100 (the value evcxr showed,
        // a frame, was `24: <unknown>`).
        let e = returned_error(
            &whole("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")\n   0: <unknown>\n   1: <unknown>\n"),
            false,
            1,
            &nowhere,
        );
        assert_eq!(
            (e.ename.as_str(), e.evalue.as_str()),
            ("OutOfMemoryError", "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")")
        );
        // The allocator's line is the value; the framework's context stays in the traceback.
        let oom = "CUDA out of memory. Tried to allocate 1024.00 GiB.";
        let e =
            returned_error(&whole(&format!("loading the weights\n{oom}\n   0: a::b\n   1: c::d")), false, 1, &nowhere);
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("OutOfMemoryError", oom));
        assert_eq!(e.traceback[1..3], ["loading the weights", oom]);
    }

    /// What gpumem-kernel's child printed for candle 0.11's error returned through `?` (evcxr's
    /// `Display`): `let z = x.matmul(&y)?;`, line 3 of cell 3 (`notebooks/errors_candle.ipynb`),
    /// on the CPU. std names no frame of the kernel's own binary here.
    const CHILD_CANDLE: &str = include_str!("fixtures/candle_returned_error.txt");

    #[test]
    fn candles_message_is_the_value_never_a_frame() {
        let text = CHILD_CANDLE.replace("/root/.cache/gpumem-kernel/evcxr/", "");
        let e = returned_error(&whole(&text), false, 3, &|l| (l == 133).then_some((3, 3)));
        assert_eq!(
            (e.ename.as_str(), e.evalue.as_str()),
            ("Error", "shape mismatch in matmul, lhs: [1, 784], rhs: [1, 784]")
        );
        assert_eq!(
            e.traceback[2..],
            [
                "stack backtrace (innermost first; 19 frames hidden: of std, evcxr, gpumem-kernel and the error's making, and 8 std could not name):",
                "   0: candle_core::tensor::Tensor::matmul",
                "   1: cell [3]",
                "          at cell [3] line 3",
            ]
        );
    }

    #[test]
    fn code_helpers() {
        assert_eq!(first_code_line("// %gpumem on\n\n  let x = 1;\nx"), "let x = 1;");
        assert_eq!(source_hash("let x = 1;  \n\nx"), source_hash("let x = 1;\nx\n"));
        assert_ne!(source_hash("a"), source_hash("b"));
    }
}
