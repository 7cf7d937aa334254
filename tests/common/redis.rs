//! A private `redis-server` for one test: its own process, listening only on
//! a Unix socket in its own directory, so no other test or program can touch
//! it. It is killed and its directory removed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A running `redis-server`.
pub struct RedisServer {
    child: Child,
    dir: PathBuf,
    /// The URL delayq connects with.
    pub url: String,
}

impl RedisServer {
    /// Starts a fresh, empty server, with `extra` configuration directives
    /// such as `["--appendonly", "yes"]`.
    pub fn start(extra: &[&str]) -> RedisServer {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "delayq-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create a directory for redis-server");
        let socket = dir.join("redis.sock");
        let child = Command::new("redis-server")
            .args(["--port", "0", "--save", "", "--appendonly", "no"])
            .arg("--unixsocket")
            .arg(&socket)
            .args(["--unixsocketperm", "700", "--dir"])
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}): the Redis tests need it installed \
                     (Debian: apt-get install redis-server); .ci/run installs it"
                )
            });
        let server = RedisServer {
            child,
            url: format!("redis+unix://{}", socket.display()),
            dir,
        };
        server.wait_ready(&socket);
        server
    }

    fn wait_ready(&self, socket: &std::path::Path) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) {
                use std::io::{Read, Write};
                let mut pong = [0u8; 7];
                if s.write_all(b"PING\r\n").is_ok()
                    && s.read_exact(&mut pong).is_ok()
                    && &pong == b"+PONG\r\n"
                {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not come up on {}", socket.display());
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
