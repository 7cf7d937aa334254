//! A private `redis-server` for one test: its own process, listening only on
//! a Unix socket in its own directory, so no other test or program can touch
//! it. It is killed and its directory removed when dropped.
//!
//! A test may also kill it and start it again on the same directory and
//! socket ([`RedisServer::kill`], [`RedisServer::restart`]), so that with
//! `--appendonly yes` its data outlives the crash.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A `redis-server`, running unless killed.
pub struct RedisServer {
    /// `None` while killed.
    child: Option<Child>,
    dir: PathBuf,
    socket: PathBuf,
    extra: Vec<String>,
    /// The URL delayq connects with.
    pub url: String,
}

impl RedisServer {
    /// Starts a fresh, empty server, with `extra` configuration directives
    /// such as `["--appendonly", "yes"]`.
    pub fn start(extra: &[&str]) -> RedisServer {
        let mut server = RedisServer::new(extra);
        if let Err(status) = server.spawn() {
            panic!("redis-server exited during start-up: {status}");
        }
        server
    }

    /// [`RedisServer::start`], listening on a loopback TCP port as well
    /// (for replicas to follow it), with that port. Another process may
    /// take a free port first: then it tries another.
    pub fn start_on_tcp(extra: &[&str]) -> (RedisServer, u16) {
        let mut exited = None;
        for _ in 0..5 {
            let port = super::ports::free_port();
            let port_arg = port.to_string();
            let mut args = vec!["--port", &port_arg, "--bind", "127.0.0.1"];
            args.extend_from_slice(extra);
            let mut server = RedisServer::new(&args);
            match server.spawn() {
                Ok(()) => return (server, port),
                Err(status) => exited = Some(status),
            }
        }
        panic!("redis-server kept exiting during start-up: {exited:?}");
    }

    fn new(extra: &[&str]) -> RedisServer {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "delayq-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create a directory for redis-server");
        let socket = dir.join("redis.sock");
        RedisServer {
            child: None,
            url: format!("redis+unix://{}", socket.display()),
            dir,
            socket,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Kills the server with SIGKILL (no chance to save or clean up) and
    /// waits for it to be gone. Its directory and socket path stay.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("redis-server is running");
        child.kill().expect("SIGKILL redis-server");
        child.wait().expect("reap redis-server");
    }

    /// Starts the server again on the same directory, socket and settings,
    /// after [`RedisServer::kill`]; it loads whatever it had persisted.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "redis-server is still running");
        if let Err(status) = self.spawn() {
            panic!("redis-server exited during its restart: {status}");
        }
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `sig` to the server (SIGSTOP and SIGCONT freeze and thaw it).
    pub fn signal(&self, sig: libc::c_int) {
        let pid = self.pid().expect("redis-server runs");
        let pid = libc::pid_t::try_from(pid).expect("pid fits");
        // SAFETY: kill(2) on our own child, not reaped yet (only `kill` and
        // drop reap it), so the pid is still ours.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig})");
    }

    /// Starts the process and waits until it answers; its exit status if
    /// it exits first.
    fn spawn(&mut self) -> Result<(), std::process::ExitStatus> {
        let child = Command::new("redis-server")
            .args(["--port", "0", "--save", "", "--appendonly", "no"])
            .arg("--unixsocket")
            .arg(&self.socket)
            .args(["--unixsocketperm", "700", "--dir"])
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}): the Redis tests need it installed \
                     (Debian: apt-get install redis-server); .ci/run installs it"
                )
            });
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), std::process::ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut s) = std::os::unix::net::UnixStream::connect(&self.socket) {
                use std::io::{Read, Write};
                let mut pong = [0u8; 7];
                if s.write_all(b"PING\r\n").is_ok()
                    && s.read_exact(&mut pong).is_ok()
                    && &pong == b"+PONG\r\n"
                {
                    return Ok(());
                }
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok()?) {
                self.child = None;
                return Err(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not come up on {}", self.socket.display());
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
