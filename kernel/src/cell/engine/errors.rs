//! A cell's error as Jupyter shows it (`ErrorInfo`, from evcxr's errors), and what the
//! record keeps of the cell's code (its first line, a hash for re-run detection).

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

/// The error a cell's code returned through `?`: `lines` are the last stderr lines before the
/// child's mark (the error's text is last), `oom` the allocator's out-of-memory failure in the
/// cell when it had one. An out-of-memory error is `OutOfMemoryError` (PyTorch's
/// `torch.cuda.OutOfMemoryError`) with its first line as the value; any other is `Error` with
/// the error's last line.
pub(super) fn returned_error(lines: &[String], oom: bool) -> ErrorInfo {
    let oom_line = lines.iter().rev().find(|l| l.starts_with("CUDA out of memory"));
    let (ename, evalue) = match oom_line {
        Some(l) => ("OutOfMemoryError", l.clone()),
        None if oom => ("OutOfMemoryError", last_line(lines)),
        None => ("Error", last_line(lines)),
    };
    let traceback = vec![
        format!("\x1b[1;31m{ename}\x1b[0m: {evalue}"),
        "The cell's code returned this error through `?`: it stopped there, and the variables it \
         defined are not kept."
            .to_string(),
    ];
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

fn last_line(lines: &[String]) -> String {
    lines.iter().rev().find(|l| !l.trim().is_empty()).cloned().unwrap_or_else(|| "the cell returned an error".into())
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

    #[test]
    fn returned_errors_and_err_values() {
        let lines = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = returned_error(&lines(&["a note the cell printed", "my own error"]), false);
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("Error", "my own error"));
        let oom =
            "CUDA out of memory. Tried to allocate 1024.00 GiB. GPU 0 (simulated) has a total capacity of 80.00 GiB";
        let e = returned_error(&lines(&[oom, "  with more"]), false);
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("OutOfMemoryError", oom));
        let e = returned_error(&lines(&["out of memory, said otherwise"]), true);
        assert_eq!(e.ename, "OutOfMemoryError");
        assert_eq!(returned_error(&[], false).evalue, "the cell returned an error");
        let e = value_error(Some("Err(\"bad input\")")).unwrap();
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("Error", "\"bad input\""));
        assert!(
            value_error(Some("Ok(3)")).is_none()
                && value_error(Some("Errand")).is_none()
                && value_error(None).is_none()
        );
    }

    #[test]
    fn code_helpers() {
        assert_eq!(first_code_line("// %gpumem on\n\n  let x = 1;\nx"), "let x = 1;");
        assert_eq!(source_hash("let x = 1;  \n\nx"), source_hash("let x = 1;\nx\n"));
        assert_ne!(source_hash("a"), source_hash("b"));
    }
}
