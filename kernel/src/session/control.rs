//! The kernel end of the control channel to the gpumem-nb crate in the evcxr child.
//!
//! The kernel makes a private directory (mode 0700) with a Unix stream socket in it (mode
//! 0600) and passes the socket's path to every evcxr child in `GPUMEM_NB_CONTROL`. When the
//! crate is first used in a child it connects and sends `{"hello":1,"pid":P,"version":V}`.
//! A connection is kept only when the peer's credentials (SO_PEERCRED) say it runs as our user
//! and is the current evcxr child, and the hello names the same pid; anything else is dropped.
//! A new child (after a restart) connects again and replaces the old connection.
//!
//! There is no accepting thread: the listener is non-blocking and [`ControlServer::poll`] is
//! called around every cell. A child that connected during a cell has its connection queued
//! by the time the cell finishes, so the post-cell hook always sees it.
//!
//! Requests and replies are single JSON lines: `{"id":n,"op":...}` → `{"id":n,"ok":...}`.

use gpumem_nb::kernel::protocol::{self, Hello, Op, Reply, Request};
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The environment variable the crate reads.
pub use gpumem_nb::kernel::protocol::CONTROL_VAR;

/// How long a connecting child has to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_millis(500);

/// An accepted connection to the crate in one child process.
struct Conn {
    pid: u32,
    version: String,
    writer: UnixStream,
    reader: BufReader<UnixStream>,
}

/// What [`ControlServer::poll`] saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PollResult {
    /// A new child connected (its pid).
    pub connected: Option<u32>,
    /// Peers refused, one line each (why).
    pub refused: Vec<String>,
}

/// The listening socket, and the current child's connection.
pub struct ControlServer {
    dir: PathBuf,
    path: PathBuf,
    listener: UnixListener,
    conn: Option<Conn>,
    next_id: u64,
    uid: u32,
}

impl ControlServer {
    /// Creates `<base>/gpumem-kernel-<pid>` (0700) and binds `control.sock` (0600) in it. `base`:
    /// `$XDG_RUNTIME_DIR` when set, else the temp dir.
    pub fn new() -> std::io::Result<Self> {
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        Self::in_dir(&base.join(format!("gpumem-kernel-{}", std::process::id())))
    }

    /// Creates the private directory `dir` (removing a stale one of ours) and binds in it.
    pub fn in_dir(dir: &Path) -> std::io::Result<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::DirBuilder::new().mode(0o700).create(dir)?;
        // The umask may have taken bits away, never added: set exactly 0700.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let path = dir.join("control.sock");
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        Ok(ControlServer {
            dir: dir.to_path_buf(),
            path,
            listener,
            conn: None,
            next_id: 1,
            uid: nix::unistd::getuid().as_raw(),
        })
    }

    /// The socket's path (what children get in `GPUMEM_NB_CONTROL`).
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// The private directory holding the socket.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The connected child's pid and crate version.
    pub fn connected(&self) -> Option<(u32, &str)> {
        self.conn.as_ref().map(|c| (c.pid, c.version.as_str()))
    }

    /// Accepts every pending connection; keeps one only from `child_pid` (our uid, pid from
    /// SO_PEERCRED and hello agreeing). Drops a kept connection of another pid (a dead child).
    pub fn poll(&mut self, child_pid: Option<u32>) -> PollResult {
        let mut out = PollResult::default();
        if let (Some(c), Some(pid)) = (&self.conn, child_pid)
            && c.pid != pid
        {
            self.conn = None;
        }
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => match self.admit(stream, child_pid) {
                    Ok(conn) => {
                        out.connected = Some(conn.pid);
                        self.conn = Some(conn);
                    }
                    Err(why) => out.refused.push(why),
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    out.refused.push(format!("accept failed: {e}"));
                    break;
                }
            }
        }
        out
    }

    fn admit(&self, stream: UnixStream, child_pid: Option<u32>) -> Result<Conn, String> {
        use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
        let cred = getsockopt(&stream, PeerCredentials).map_err(|e| format!("no peer credentials ({e})"))?;
        let (peer_pid, peer_uid) = (cred.pid() as u32, cred.uid());
        if peer_uid != self.uid {
            return Err(format!("refused pid {peer_pid}: uid {peer_uid} is not ours ({})", self.uid));
        }
        if Some(peer_pid) != child_pid {
            return Err(format!(
                "refused pid {peer_pid}: not the kernel's evcxr child ({})",
                child_pid.map_or("none".to_string(), |p| p.to_string())
            ));
        }
        stream.set_nonblocking(false).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(HELLO_TIMEOUT)).map_err(|e| e.to_string())?;
        let writer = stream.try_clone().map_err(|e| e.to_string())?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).map_err(|e| format!("refused pid {peer_pid}: no hello ({e})"))?;
        let hello: Hello =
            serde_json::from_str(line.trim()).map_err(|e| format!("refused pid {peer_pid}: bad hello ({e})"))?;
        if hello.hello != 1 {
            return Err(format!("refused pid {peer_pid}: not a hello: {}", line.trim()));
        }
        if hello.pid != peer_pid {
            return Err(format!("refused pid {peer_pid}: hello names another pid: {}", line.trim()));
        }
        let version = if hello.version.is_empty() { "?".to_string() } else { hello.version };
        Ok(Conn { pid: peer_pid, version, writer, reader })
    }

    /// Forgets the connection (the child is gone).
    pub fn disconnect(&mut self) {
        self.conn = None;
    }

    /// Sends `op` and waits up to `timeout` for the reply with its id. `Ok` holds a reply with
    /// `ok: true`; `Err` a one-line reason otherwise. A broken connection is dropped.
    pub fn request(&mut self, op: Op, timeout: Duration) -> Result<Reply, String> {
        let Some(conn) = self.conn.as_mut() else { return Err("gpumem-nb is not loaded in the child".into()) };
        let id = self.next_id;
        self.next_id += 1;
        let name = op.name();
        let result = (|| {
            conn.reader.get_ref().set_read_timeout(Some(timeout)).map_err(|e| (true, e.to_string()))?;
            // One write (not one per token of the JSON): the child wakes up once.
            let line = format!("{}\n", protocol::to_line(&Request { id, op }));
            conn.writer.write_all(line.as_bytes()).map_err(|e| (true, e.to_string()))?;
            loop {
                let mut line = String::new();
                match std::io::Read::take(&mut conn.reader, protocol::MAX_LINE as u64).read_line(&mut line) {
                    Ok(0) => return Err((true, "the child closed the control channel".to_string())),
                    Ok(_) if !line.ends_with('\n') && line.len() >= protocol::MAX_LINE => {
                        return Err((true, format!("a reply longer than {} bytes", protocol::MAX_LINE)));
                    }
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        return Err((false, format!("no answer to `{name}` within {} ms", timeout.as_millis())));
                    }
                    Err(e) => return Err((true, e.to_string())),
                }
                let Ok(reply) = serde_json::from_str::<Reply>(line.trim()) else { continue };
                if reply.id != Some(id) {
                    continue; // a late answer to an earlier request that timed out
                }
                return Ok(reply);
            }
        })();
        match result {
            Ok(reply) if reply.ok => Ok(reply),
            Ok(reply) => Err(reply.error.unwrap_or_else(|| "request failed".to_string())),
            Err((broken, why)) => {
                if broken {
                    self.conn = None;
                }
                Err(why)
            }
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn server() -> (tempfile::TempDir, ControlServer) {
        let base = tempfile::tempdir().unwrap();
        let s = ControlServer::in_dir(&base.path().join("k")).unwrap();
        (base, s)
    }

    /// A stand-in for the crate's end: says hello, then answers every request.
    fn fake_child(path: &Path, pid: u32) -> std::thread::JoinHandle<()> {
        let stream = UnixStream::connect(path).unwrap();
        std::thread::spawn(move || {
            let mut w = stream.try_clone().unwrap();
            writeln!(w, "{}", protocol::to_line(&Hello { hello: 1, pid, version: "test".into() })).unwrap();
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { return };
                let req = protocol::parse_request(&line).unwrap();
                let reply = match req.op {
                    Op::Read => Reply {
                        devices: Some(vec![gpumem_nb::kernel::protocol::DeviceReading {
                            allocated: 42,
                            ..Default::default()
                        }]),
                        ..Reply::ok(req.id)
                    },
                    Op::Summary => continue, // plays a child that never answers
                    _ => Reply::error(Some(req.id), "unknown op"),
                };
                if writeln!(w, "{}", protocol::to_line(&reply)).is_err() {
                    return;
                }
            }
        })
    }

    #[test]
    fn directory_and_socket_are_private() {
        let (_base, s) = server();
        assert_eq!(std::fs::metadata(s.dir()).unwrap().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(s.socket_path()).unwrap().mode() & 0o777, 0o600);
        let path = s.socket_path().to_path_buf();
        drop(s);
        assert!(!path.exists(), "the socket is removed with the server");
    }

    #[test]
    fn the_child_is_admitted_and_answers() {
        let (_base, mut s) = server();
        let me = std::process::id();
        let child = fake_child(s.socket_path(), me);
        let r = s.poll(Some(me));
        assert_eq!(r.connected, Some(me), "{r:?}");
        assert_eq!(s.connected(), Some((me, "test")));
        let reply = s.request(Op::Read, Duration::from_secs(2)).unwrap();
        assert_eq!(reply.devices.unwrap()[0].allocated, 42);
        let err = s.request(Op::HistorySvg, Duration::from_secs(2)).unwrap_err();
        assert_eq!(err, "unknown op");
        // A request that gets no answer times out without dropping the connection, and the
        // next request is not confused by anything late.
        let err = s.request(Op::Summary, Duration::from_millis(50)).unwrap_err();
        assert!(err.contains("no answer"), "{err}");
        assert!(s.connected().is_some());
        assert!(s.request(Op::Read, Duration::from_secs(2)).is_ok());
        // The child changed (restart): the old connection is dropped.
        let r = s.poll(Some(me + 1));
        assert_eq!(r.connected, None);
        assert!(s.connected().is_none());
        drop(s);
        child.join().unwrap();
    }

    #[test]
    fn a_peer_that_is_not_the_child_is_refused() {
        let (_base, mut s) = server();
        let me = std::process::id();
        let _child = fake_child(s.socket_path(), me);
        // Our pid is not the child's: refused, no connection.
        let r = s.poll(Some(me.wrapping_add(12345)));
        assert_eq!(r.connected, None);
        assert_eq!(r.refused.len(), 1, "{r:?}");
        assert!(r.refused[0].contains("not the kernel's evcxr child"), "{r:?}");
        assert!(s.connected().is_none());
        // No child at all: refused too.
        let _other = fake_child(s.socket_path(), me);
        assert_eq!(s.poll(None).refused.len(), 1);
        // A hello naming another pid than the peer's credentials: refused.
        let _liar = fake_child(s.socket_path(), me + 1);
        let r = s.poll(Some(me));
        assert!(r.refused[0].contains("another pid"), "{r:?}");
        assert!(s.request(Op::Read, Duration::from_millis(10)).unwrap_err().contains("not loaded"));
    }
}
