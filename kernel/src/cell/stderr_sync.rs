//! A barrier on the evcxr child's stderr, so that everything a cell wrote there (a panic's
//! message and backtrace above all) is in the kernel's hands before the cell's result, error and
//! report go out.
//!
//! evcxr reads the child's stdout and stderr through two pipes on two threads. The end of a cell
//! comes on stdout (`EVCXR_EXECUTION_COMPLETE`), and a panic's text, written to stderr before it,
//! may still be in the other pipe then: without a barrier the report lands inside or above the
//! backtrace, at a different place on each run. So the child (this same binary, see `main`)
//! keeps a connection to a socket of the kernel's, and answers each token it reads there with a
//! marker line on its stderr. The kernel sends a token after the cell ended and waits for the
//! marker in the stderr stream: whatever the cell wrote to stderr is before it in the pipe.
//!
//! The socket lives in the kernel's private directory (mode 0700, next to the control socket);
//! its path reaches the child in [`SYNC_VAR`]. A restarted child connects again; the newest
//! connection is the one used.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// The environment variable that gives the child the socket's path.
pub const SYNC_VAR: &str = "GPUMEM_KERNEL_STDERR_SYNC";

/// The start of a marker line (the token follows). The control character keeps it from ever
/// being a line a cell printed.
pub const MARK: &str = "\u{1}gpumem-kernel stderr sync ";

/// In the evcxr child, before evcxr's runtime takes the main thread: when [`SYNC_VAR`] names a
/// socket, a thread connects to it and answers every token line with a marker on stderr. Does
/// nothing in any other process.
pub fn serve_in_child() {
    let Some(path) = std::env::var_os(SYNC_VAR) else { return };
    if std::env::var_os("EVCXR_IS_RUNTIME").is_none() {
        return;
    }
    let Ok(stream) = UnixStream::connect(&path) else { return };
    let _ = std::thread::Builder::new().name("gpumem-stderr-sync".into()).spawn(move || {
        for token in BufReader::new(stream).lines() {
            let Ok(token) = token else { return };
            let mut err = std::io::stderr().lock();
            if writeln!(err, "{MARK}{token}").and_then(|()| err.flush()).is_err() {
                return;
            }
        }
    });
}

/// The kernel's end: the listening socket and the newest child's connection.
pub struct StderrSync {
    listener: UnixListener,
    conn: Option<UnixStream>,
    next: u64,
}

impl StderrSync {
    /// Binds `path` (in a private directory the caller made).
    pub fn bind(path: &Path) -> std::io::Result<StderrSync> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        Ok(StderrSync { listener, conn: None, next: 0 })
    }

    /// Asks the current child for a marker; returns the line to wait for on stderr, or `None`
    /// when no child is connected (or the connection broke: the child is gone).
    pub fn request(&mut self) -> Option<String> {
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    if s.set_nonblocking(false).is_ok() {
                        self.conn = Some(s);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.next += 1;
        let token = self.next.to_string();
        let conn = self.conn.as_mut()?;
        if writeln!(conn, "{token}").and_then(|()| conn.flush()).is_err() {
            self.conn = None;
            return None;
        }
        Some(format!("{MARK}{token}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_comes_back_as_a_marker() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let mut sync = StderrSync::bind(&path).unwrap();
        assert_eq!(sync.request(), None, "no child yet");
        let child = UnixStream::connect(&path).unwrap();
        let want = sync.request().expect("connected");
        assert_eq!(want, format!("{MARK}2"));
        let mut line = String::new();
        BufReader::new(child).read_line(&mut line).unwrap();
        assert_eq!(line, "2\n");
    }
}
