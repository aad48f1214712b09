//! The `%gpumem` / `%%gpumem` parser of gpumem-kernel, compiled from the kernel's own source
//! file (it needs only std and `gpumem_nb::units`, so the fuzz build leaves evcxr out): never
//! panics, keeps every line (so compiler errors point at the right line), passes non-magic
//! lines through unchanged, and a bad magic is a one-line error.
#![no_main]

#[allow(dead_code, unreachable_pub)]
#[path = "../../kernel/src/cell/magic.rs"]
mod magic;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(cell) = std::str::from_utf8(data) else { return };
    let (magics, code) = magic::parse(cell);
    assert_eq!(code.matches('\n').count(), cell.matches('\n').count(), "line count changed");
    for (line, out) in cell.split('\n').zip(code.split('\n')) {
        let t = line.trim();
        if !t.starts_with("%gpumem") && !t.starts_with("%%gpumem") {
            assert_eq!(line, out, "a code line changed");
        }
    }
    for m in magics {
        if let magic::Magic::Bad { error, .. } = m {
            assert!(!error.is_empty() && !error.contains('\n'), "{error:?}");
        }
    }
    let _ = magic::has_code(&code);
});
