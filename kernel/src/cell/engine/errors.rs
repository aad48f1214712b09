//! A cell's error as Jupyter shows it (`ErrorInfo`, from evcxr's errors), and what the
//! record keeps of the cell's code (its first line, a hash for re-run detection).

use crate::output::ErrorInfo;

pub(super) fn error_info(e: &evcxr::Error, code: &str, interrupted: bool) -> ErrorInfo {
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
            let mut tb: Vec<String> = msg.lines().map(str::to_string).collect();
            tb.push(if interrupted {
                "The cell was interrupted: the evcxr child was stopped and started again (variables are lost; \
                 gpumem's per-cell history is kept)."
                    .to_string()
            } else {
                "The evcxr child process died and was started again (variables are lost; gpumem's per-cell \
                 history is kept)."
                    .to_string()
            });
            ErrorInfo { ename: ename.into(), evalue: msg.lines().last().unwrap_or("").to_string(), traceback: tb }
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

pub(super) fn first_code_line(code: &str) -> String {
    let l = code.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with("//")).unwrap_or("");
    if l.chars().count() > 48 { format!("{}…", l.chars().take(47).collect::<String>()) } else { l.to_string() }
}

/// A stable hash of a cell's code (whitespace at line ends ignored): FNV-1a, hex.
pub(super) fn source_hash(code: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for line in code.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_helpers() {
        assert_eq!(first_code_line("// %gpumem on\n\n  let x = 1;\nx"), "let x = 1;");
        assert_eq!(source_hash("let x = 1;  \n\nx"), source_hash("let x = 1;\nx\n"));
        assert_ne!(source_hash("a"), source_hash("b"));
    }
}
