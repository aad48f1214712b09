//! A cell whose code returns `Err` (through `?`), seen by the kernel.
//!
//! evcxr wraps a cell's code so that `?` converts any error into its own: the conversion prints
//! the error on the child's stderr and then `EVCXR_ERROR_OCCURRED` on its stdout, a protocol
//! line evcxr's parent reads and keeps to itself (it only forgets the cell's new variables). The
//! cell's reply would be `ok`. So in the child (this same binary, see `main`), a thread sits
//! between the cell's stdout and evcxr: it forwards every byte as it comes and, right after
//! forwarding that protocol line, writes [`MARK`] on stderr, before anything that follows (the
//! end of the cell). The kernel's stderr pump sees the mark after the error's text and before
//! the stderr barrier that ends the cell (`stderr_sync`), so the cell becomes an error, in order.

use std::io::{Read, Write};

/// The line the child writes on stderr when its cell returned `Err`. The control character
/// keeps it from ever being a line a cell printed.
pub const MARK: &str = "\u{1}gpumem-kernel user error";

/// What the patched evcxr's generated code writes on stderr just before the text of an error the
/// cell returned through `?` (`evcxr_internal_runtime::USER_ERROR_BEGINS`, vendor/evcxr
/// PATCHES.md §8): the kernel holds that text back and shows it once, as the cell's error.
pub const BEGINS: &str = "\u{1}EVCXR_USER_ERROR_BEGINS";

/// What evcxr's generated code prints on stdout when `?` returned an error (evcxr 0.22's
/// `evcxr_internal_runtime::USER_ERROR_OCCURRED`).
const EVCXR_MARKER: &[u8] = b"EVCXR_ERROR_OCCURRED";

/// In the evcxr child, before evcxr's runtime takes the main thread: puts a pipe on stdout and
/// forwards it (see the module's documentation). Does nothing in any other process, or when
/// `GPUMEM_KERNEL_STDERR_SYNC` (the kernel that reads the mark) is not set.
pub fn watch_in_child() {
    if std::env::var_os("EVCXR_IS_RUNTIME").is_none() || std::env::var_os(super::stderr_sync::SYNC_VAR).is_none() {
        return;
    }
    let _ = install();
}

fn install() -> std::io::Result<()> {
    use std::os::fd::AsFd;
    let real_out = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let (read, write) = std::io::pipe()?;
    std::thread::Builder::new().name("gpumem-user-error".into()).spawn(move || {
        let _ = forward(read, real_out, std::io::stderr());
    })?;
    nix::unistd::dup2_stdout(&write)?;
    Ok(())
}

/// Copies `from` to `to` as it comes; after a line that is evcxr's marker, writes [`MARK`] to
/// `err` before anything after it is forwarded.
fn forward(mut from: impl Read, mut to: impl Write, mut err: impl Write) -> std::io::Result<()> {
    let mut buf = [0u8; 8192];
    // The current line's start, as far as it can still be the marker.
    let mut line: Vec<u8> = Vec::with_capacity(EVCXR_MARKER.len() + 1);
    let mut long = false;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let mut start = 0;
        for (i, &b) in buf[..n].iter().enumerate() {
            if b == b'\n' {
                let marker = !long && line.strip_suffix(b"\r").unwrap_or(&line) == EVCXR_MARKER;
                line.clear();
                long = false;
                if marker {
                    to.write_all(&buf[start..=i])?;
                    to.flush()?;
                    // One write (shorter than a pipe's atomic size): no other thread's stderr
                    // lands inside the mark.
                    err.write_all(format!("{MARK}\n").as_bytes())?;
                    err.flush()?;
                    start = i + 1;
                }
            } else if !long {
                if line.len() > EVCXR_MARKER.len() {
                    long = true;
                    line.clear();
                } else {
                    line.push(b);
                }
            }
        }
        to.write_all(&buf[start..n])?;
        to.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out its bytes in the given pieces.
    struct Pieces(Vec<Vec<u8>>);

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() {
                return Ok(0);
            }
            let p = self.0.remove(0);
            buf[..p.len()].copy_from_slice(&p);
            Ok(p.len())
        }
    }

    /// Every write: which writer (`o`, `e`) and its bytes, in order.
    type Writes = std::rc::Rc<std::cell::RefCell<Vec<(char, Vec<u8>)>>>;

    /// Records which writer got what, in order.
    #[derive(Clone, Default)]
    struct Log(Writes, char);

    impl Write for Log {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().push((self.1, b.to_vec()));
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn run(pieces: &[&str]) -> (String, Vec<usize>) {
        let log = Log::default();
        let (out, err) = (Log(log.0.clone(), 'o'), Log(log.0.clone(), 'e'));
        forward(Pieces(pieces.iter().map(|p| p.as_bytes().to_vec()).collect()), out, err).unwrap();
        let entries = log.0.borrow();
        let stdout: String =
            entries.iter().filter(|(w, _)| *w == 'o').map(|(_, b)| String::from_utf8_lossy(b)).collect();
        // Where in stdout each mark was written: the number of stdout bytes before it.
        let mut marks = Vec::new();
        let mut seen = 0;
        for (w, b) in entries.iter() {
            match w {
                'o' => seen += b.len(),
                _ => {
                    assert_eq!(String::from_utf8_lossy(b), format!("{MARK}\n"));
                    marks.push(seen);
                }
            }
        }
        (stdout, marks)
    }

    #[test]
    fn the_mark_follows_the_marker_line_and_precedes_the_rest() {
        let all = "hi\nEVCXR_ERROR_OCCURRED\nEVCXR_EXECUTION_COMPLETE\n";
        let (out, marks) = run(&[all]);
        assert_eq!(out, all, "every byte forwarded");
        assert_eq!(marks, vec!["hi\nEVCXR_ERROR_OCCURRED\n".len()]);
        // Split anywhere, even inside the marker.
        let (out, marks) = run(&["hi\nEVCXR_ERR", "OR_OCCURRED", "\nEVCXR_EXECUTION_COMPLETE\n"]);
        assert_eq!(out, all);
        assert_eq!(marks, vec!["hi\nEVCXR_ERROR_OCCURRED\n".len()]);
    }

    #[test]
    fn lines_that_only_look_like_the_marker_pass() {
        let (out, marks) = run(&["xEVCXR_ERROR_OCCURRED\nEVCXR_ERROR_OCCURRED2\n", "partial line without newline"]);
        assert_eq!(out, "xEVCXR_ERROR_OCCURRED\nEVCXR_ERROR_OCCURRED2\npartial line without newline");
        assert!(marks.is_empty());
    }
}
