//! The `delayq` binary as a child process, for the tests that run the real
//! thing: a [`Daemon`] on its own loopback port, killed if still running when
//! dropped.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

pub use super::ports::free_port;
use super::{Client, REPLY_TIMEOUT};

/// The `delayq` binary Cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_delayq");

/// Waits for `child` to exit; kills it and fails if it does not in time.
pub fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("delayq did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `list-tube-used` gets its answer from `addr` within 3 s.
async fn round_trip(addr: SocketAddr) -> bool {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let asked = async {
        let mut stream = BufReader::new(TcpStream::connect(addr).await.ok()?);
        stream
            .get_mut()
            .write_all(b"list-tube-used\r\n")
            .await
            .ok()?;
        let mut line = String::new();
        stream.read_line(&mut line).await.ok()?;
        Some(line == "USING default\r\n")
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(3), asked).await,
        Ok(Some(true))
    )
}

/// A running `delayq` process on its own port; killed if still running
/// when dropped.
pub struct Daemon {
    pub child: Child,
    pub addr: SocketAddr,
    /// Its HTTP listener (`--http`), if it was started with one.
    pub http: Option<SocketAddr>,
    /// The scratch data directory a durable daemon got when its test named
    /// none; removed after the process is gone.
    _dir: Option<tempfile::TempDir>,
}

impl Daemon {
    /// Starts the binary with `args` added and waits until it accepts. On
    /// the embedded engine, durable by default, it gets a scratch data
    /// directory of its own unless `args` name one (or `--in-memory`): the
    /// default, `./delayq-data`, would be shared by every test.
    pub async fn start(args: &[&str]) -> Daemon {
        Daemon::start_with(args, false).await
    }

    /// [`Daemon::start`] with an HTTP listener (`--http`) as well, on a
    /// port of its own, in [`Daemon::http`]: it waits for both to listen.
    pub async fn start_with_http(args: &[&str]) -> Daemon {
        Daemon::start_with(args, true).await
    }

    async fn start_with(args: &[&str], http: bool) -> Daemon {
        let chosen = args.iter().any(|a| {
            [
                "--redis",
                "--redis-cluster",
                "--redis-sentinel",
                "--in-memory",
                "-b",
                "--data-dir",
            ]
            .contains(a)
        });
        if chosen {
            return Daemon::spawn_limited(args, None, Stderr::Away, None, http).await;
        }
        let dir = tempfile::tempdir().expect("a scratch data directory");
        let path = dir.path().to_str().expect("a UTF-8 temp path").to_string();
        let mut with_dir = vec!["-b", &path];
        with_dir.extend_from_slice(args);
        Daemon::spawn_limited(&with_dir, Some(dir), Stderr::Away, None, http).await
    }

    /// Starts the durable engine on the data directory `dir`, which the
    /// test keeps across restarts.
    pub async fn durable(dir: &std::path::Path, args: &[&str]) -> Daemon {
        let path = dir.to_str().expect("a UTF-8 path");
        let mut with_dir = vec!["-b", path];
        with_dir.extend_from_slice(args);
        Daemon::spawn(&with_dir, None).await
    }

    /// [`Daemon::durable`] with an HTTP listener, in a process that may
    /// open at most `files` files (its soft and hard limits both), for a
    /// test of what happens when the descriptors run out.
    pub async fn durable_with_open_files(
        dir: &std::path::Path,
        args: &[&str],
        files: u64,
    ) -> Daemon {
        let path = dir.to_str().expect("a UTF-8 path");
        let mut with_dir = vec!["-b", path];
        with_dir.extend_from_slice(args);
        Daemon::spawn_limited(&with_dir, None, Stderr::Away, Some(files), true).await
    }

    /// [`Daemon::durable`], with the server's standard error written to
    /// `log`, for a test that reads what it says.
    pub async fn durable_logged(
        dir: &std::path::Path,
        args: &[&str],
        log: &std::path::Path,
    ) -> Daemon {
        let path = dir.to_str().expect("a UTF-8 path");
        let mut with_dir = vec!["-b", path];
        with_dir.extend_from_slice(args);
        Daemon::spawn_limited(&with_dir, None, Stderr::File(log), None, false).await
    }

    /// Starts the memory-only engine with its standard error a pipe whose
    /// reader has gone (a `| logger` that died), so that every line it
    /// logs meets a broken pipe.
    pub async fn in_memory_with_closed_stderr() -> Daemon {
        Daemon::spawn_limited(&["--in-memory"], None, Stderr::ClosedPipe, None, false).await
    }

    async fn spawn(args: &[&str], dir: Option<tempfile::TempDir>) -> Daemon {
        Daemon::spawn_limited(args, dir, Stderr::Away, None, false).await
    }

    async fn spawn_limited(
        args: &[&str],
        dir: Option<tempfile::TempDir>,
        stderr: Stderr<'_>,
        open_files: Option<u64>,
        http: bool,
    ) -> Daemon {
        let mut dir = dir;
        // Another test may take a free port first: then try others.
        let mut exited = None;
        for _ in 0..5 {
            let port = free_port();
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let http = http.then(|| SocketAddr::from((Ipv4Addr::LOCALHOST, free_port())));
            let http_arg = http.map(|at| at.to_string());
            let mut command = Command::new(BIN);
            if let Some(files) = open_files {
                let limit = libc::rlimit {
                    rlim_cur: files,
                    rlim_max: files,
                };
                // SAFETY: between fork and exec the closure only calls
                // setrlimit, which is async-signal-safe, on a struct it owns.
                unsafe {
                    command.pre_exec(move || {
                        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                            Ok(())
                        } else {
                            Err(std::io::Error::last_os_error())
                        }
                    });
                }
            }
            let mut child = command
                .args(["-l", "127.0.0.1", "-p", &port.to_string()])
                .args(args)
                .args(http_arg.iter().flat_map(|at| ["--http", at.as_str()]))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(match stderr {
                    Stderr::File(path) => std::fs::File::create(path)
                        .map(Stdio::from)
                        .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display())),
                    Stderr::Away => log_for(port),
                    Stderr::ClosedPipe => Stdio::piped(),
                })
                .spawn()
                .expect("spawn delayq");
            drop(child.stderr.take());
            let mut daemon = Daemon {
                child,
                addr,
                http,
                _dir: dir.take(),
            };
            // Nothing to await but the port opening: poll for it. Whose
            // port it is matters: two tests can be handed the same free
            // port, and a connection would then reach the other's server
            // while this one, failing to bind, exits (two durable tests
            // once put into each other's data directories).
            let start = Instant::now();
            loop {
                let pid = daemon.child.id();
                if listens(pid, port) && http.is_none_or(|at| listens(pid, at.port())) {
                    return daemon;
                }
                if let Some(status) = daemon.child.try_wait().expect("try_wait") {
                    exited = Some(status);
                    dir = daemon._dir.take();
                    break;
                }
                assert!(start.elapsed() < REPLY_TIMEOUT, "delayq never listened");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        panic!(
            "delayq kept exiting during start-up: {}",
            exited.expect("an exit status")
        );
    }

    /// Starts the binary on the Redis engine at `url`.
    pub async fn redis(url: &str) -> Daemon {
        // The port opens before the engine has reached Redis (a connection
        // waits in the backlog meanwhile): a test that breaks Redis at once
        // must not break the start-up instead, which then exits.
        Daemon::on_redis(&["--redis", url]).await
    }

    /// Starts delayq with `args` (naming a Redis or a Redis Cluster) and
    /// waits for a round trip through it. The port opens before the engine
    /// has reached Redis, and a process started while a new cluster still
    /// settles (several tests start theirs at once on two cores) may fail
    /// to reach it in time and exit; and the port may have been another
    /// test's short-lived process's (a start refused), whose connection
    /// then resets. Either way it is started again, three times at most.
    pub async fn on_redis(args: &[&str]) -> Daemon {
        let mut exited = None;
        for _ in 0..3 {
            let mut daemon = Daemon::start(args).await;
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(15) {
                if let Some(status) = daemon.child.try_wait().expect("try_wait") {
                    exited = Some(status);
                    break;
                }
                if round_trip(daemon.addr).await {
                    return daemon;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!("delayq on Redis kept exiting during start-up: {exited:?}");
    }

    /// A new connection to this daemon.
    pub async fn client(&self) -> Client {
        Client::connect(self.addr).await
    }

    /// Sends `sig` to the daemon, without waiting for what it does.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits");
        // SAFETY: sending a signal to our own child process.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig})");
    }

    /// SIGKILL: no shutdown, no clean-up; waits until it is gone.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL delayq");
        self.child.wait().expect("reap delayq");
    }

    /// Waits for the daemon to exit (panics past the reply timeout).
    pub fn wait_exit(&mut self) -> ExitStatus {
        wait_exit(&mut self.child, REPLY_TIMEOUT)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Where a started daemon's standard error goes.
#[derive(Clone, Copy)]
enum Stderr<'a> {
    /// Away, or to `$DELAYQ_TEST_LOGS` (see [`log_for`]).
    Away,
    /// Into this file, for the test to read.
    File(&'a std::path::Path),
    /// Into a pipe whose reading end the test closes at once.
    ClosedPipe,
}

/// Whether process `pid` listens on loopback `port`: the port's listening
/// socket (in `/proc/net/tcp`) is one of the process's open files.
fn listens(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    // Fields: slot, local address (hex IP:port), remote address, state
    // (0A: listening), ..., the socket's inode (the tenth).
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (_, local_port) = fields.get(1)?.split_once(':')?;
            let inode = fields.get(9)?;
            let listening = *fields.get(3)? == "0A";
            (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| format!("socket:[{inode}]"))
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
}

/// Where a started delayq's log goes: to `$DELAYQ_TEST_LOGS/delayq-PORT.log`
/// when that is set (to see what a server did in a failed run), else away.
fn log_for(port: u16) -> Stdio {
    let Some(dir) = std::env::var_os("DELAYQ_TEST_LOGS") else {
        return Stdio::null();
    };
    let path = std::path::Path::new(&dir).join(format!("delayq-{port}.log"));
    std::fs::File::create(&path)
        .map(Stdio::from)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()))
}

/// Starts `delayq args...` with its input closed and its output piped, for
/// a run that ends by itself (a refusal at start, an admin subcommand).
pub fn spawn_piped(args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn delayq")
}

/// Waits for a run started by [`spawn_piped`] to end, within the reply
/// timeout, and returns what it left. The outputs are read after the exit:
/// they are small enough for the pipes' buffers.
pub fn finish_piped(mut child: Child) -> std::process::Output {
    use std::io::Read;
    let status = wait_exit(&mut child, crate::common::REPLY_TIMEOUT);
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    child
        .stdout
        .take()
        .expect("piped stdout")
        .read_to_end(&mut stdout)
        .expect("read stdout");
    child
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_end(&mut stderr)
        .expect("read stderr");
    std::process::Output {
        status,
        stdout,
        stderr,
    }
}
