//! The servers under test, started and stopped by the bench, and what the
//! bench reads of them from `/proc` and from Redis's `INFO`.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::ports::free_port;

/// What a server is, as far as the comparison goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// beanstalkd without a binlog.
    Beanstalkd,
    /// beanstalkd `-b DIR`: its binlog, synced at most every 50 ms, its
    /// default.
    #[value(name = "beanstalkd-b")]
    BeanstalkdB,
    /// beanstalkd `-b DIR -f 0`: synced at every write.
    #[value(name = "beanstalkd-b-f0")]
    BeanstalkdBF0,
    /// delayq's embedded engine in memory only (`--in-memory`).
    Embedded,
    /// delayq's durable embedded engine as it starts by default: synced
    /// before every reply.
    Durable,
    /// The durable engine with `-f 50`: synced at most every 50 ms.
    #[value(name = "durable-f50")]
    DurableF50,
    /// delayq on a private Redis.
    Redis,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Beanstalkd => "beanstalkd",
            Kind::BeanstalkdB => "beanstalkd -b",
            Kind::BeanstalkdBF0 => "beanstalkd -b -f0",
            Kind::Embedded => "memory",
            Kind::Durable => "durable",
            Kind::DurableF50 => "durable -f50",
            Kind::Redis => "redis",
        }
    }

    /// Whether it keeps jobs in a data directory of its own.
    pub fn keeps_a_dir(self) -> bool {
        matches!(
            self,
            Kind::BeanstalkdB | Kind::BeanstalkdBF0 | Kind::Durable | Kind::DurableF50
        )
    }
}

/// Where the programs are.
#[derive(Clone)]
pub struct Programs {
    pub delayq: PathBuf,
    pub beanstalkd: PathBuf,
    pub redis_server: PathBuf,
}

/// A child process, killed when dropped.
pub struct Proc(Child);

impl Proc {
    /// Starts `cmd`; its output goes nowhere (beanstalkd reports every
    /// connection the bench drops), unless `DELAYQ_BENCH_LOGS` is set.
    fn spawn(cmd: &mut Command) -> Proc {
        let logs = if std::env::var_os("DELAYQ_BENCH_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(logs)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Proc(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILL, and reaped.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until something accepts connections on `addr`.
fn wait_listening(addr: SocketAddr) {
    let until = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < until, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A private `redis-server` on a loopback port, without persistence (like
/// beanstalkd without a binlog), in a directory of its own.
pub struct RedisServer {
    /// Kept for its drop, which stops the server.
    _proc: Proc,
    pub port: u16,
    dir: PathBuf,
}

impl RedisServer {
    pub fn start(program: &PathBuf) -> RedisServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("delayq-load-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for redis-server");
        let proc = Proc::spawn(
            Command::new(program)
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--save", "", "--appendonly", "no", "--dir"])
                .arg(&dir)
                .args(["--maxmemory-policy", "noeviction", "--loglevel", "warning"]),
        );
        wait_listening(SocketAddr::from(([127, 0, 0, 1], port)));
        RedisServer {
            _proc: proc,
            port,
            dir,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A server under test, listening on `addr`.
pub struct Target {
    pub addr: SocketAddr,
    pub server: Proc,
    /// The Redis behind delayq on the Redis engine.
    pub redis: Option<RedisServer>,
    /// The data directory, for the servers that keep one.
    pub dir: Option<tempfile::TempDir>,
    pub kind: Kind,
}

impl Target {
    pub fn start(kind: Kind, programs: &Programs) -> Target {
        let dir = kind
            .keeps_a_dir()
            .then(|| tempfile::tempdir().expect("a data directory"));
        let (addr, server, redis) = Target::spawn(kind, programs, dir.as_ref());
        wait_listening(addr);
        Target {
            addr,
            server,
            redis,
            dir,
            kind,
        }
    }

    /// SIGKILLs the server and starts it again on its data directory (or
    /// its Redis), on a new port; returns once the new one accepts.
    pub fn kill_and_restart(&mut self, programs: &Programs) {
        self.server.kill();
        let (addr, server, _) =
            Target::spawn_on(self.kind, programs, self.dir.as_ref(), self.redis.as_ref());
        wait_listening(addr);
        self.addr = addr;
        self.server = server;
    }

    fn spawn(
        kind: Kind,
        programs: &Programs,
        dir: Option<&tempfile::TempDir>,
    ) -> (SocketAddr, Proc, Option<RedisServer>) {
        let redis = (kind == Kind::Redis).then(|| RedisServer::start(&programs.redis_server));
        let (addr, server, _) = Target::spawn_on(kind, programs, dir, redis.as_ref());
        (addr, server, redis)
    }

    fn spawn_on(
        kind: Kind,
        programs: &Programs,
        dir: Option<&tempfile::TempDir>,
        redis: Option<&RedisServer>,
    ) -> (SocketAddr, Proc, ()) {
        let port = free_port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let port = port.to_string();
        let dir = dir.map(|d| d.path().to_str().expect("a UTF-8 path").to_string());
        let dir = dir.as_deref().unwrap_or_default();
        let listen = ["-l", "127.0.0.1", "-p", &port];
        let delayq = |extra: &[&str]| {
            Proc::spawn(
                Command::new(&programs.delayq)
                    .args(listen)
                    .args(extra)
                    .env("RUST_LOG", "warn"),
            )
        };
        let beanstalkd = |extra: &[&str]| {
            Proc::spawn(Command::new(&programs.beanstalkd).args(listen).args(extra))
        };
        let server = match kind {
            Kind::Beanstalkd => beanstalkd(&[]),
            Kind::BeanstalkdB => beanstalkd(&["-b", dir]),
            Kind::BeanstalkdBF0 => beanstalkd(&["-b", dir, "-f", "0"]),
            Kind::Embedded => delayq(&["--in-memory"]),
            Kind::Durable => delayq(&["-b", dir]),
            Kind::DurableF50 => delayq(&["-b", dir, "-f", "50"]),
            Kind::Redis => {
                let url = redis.expect("a Redis for the Redis engine").url();
                delayq(&["--redis", &url])
            }
        };
        (addr, server, ())
    }
}

impl Target {
    /// What the workloads need to know of this target.
    pub fn probe(&self) -> Probe {
        Probe {
            pid: Some(self.server.pid()),
            redis: self.redis.as_ref().map(|r| r.url()),
        }
    }
}

/// Where a workload reads the server's resource use, when it can.
#[derive(Clone, Default)]
pub struct Probe {
    /// The server's process, for RSS and CPU.
    pub pid: Option<u32>,
    /// The Redis behind it, for `INFO`.
    pub redis: Option<String>,
}

fn status_field(pid: u32, task: Option<&str>, field: &str) -> Option<u64> {
    let path = match task {
        Some(task) => format!("/proc/{pid}/task/{task}/status"),
        None => format!("/proc/{pid}/status"),
    };
    let status = std::fs::read_to_string(path).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Bytes the files of `dir` take: allocated on disk (as `du` counts), and
/// their lengths.
pub fn dir_size(dir: &std::path::Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut sizes = (0, 0);
    for entry in std::fs::read_dir(dir)
        .expect("read a data directory")
        .flatten()
    {
        if let Ok(m) = entry.metadata() {
            sizes.0 += m.blocks() * 512;
            sizes.1 += m.len();
        }
    }
    sizes
}

/// Resident memory, in bytes.
pub fn rss(pid: u32) -> u64 {
    status_field(pid, None, "VmRSS").expect("VmRSS of the server") * 1024
}

/// CPU time used so far (user and system).
pub fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the server's stat");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf only reads a system setting.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_micros(ticks * 1_000_000 / hz)
}

/// Context switches of every thread so far: each is the process going to
/// sleep or being put to sleep, so their rate is the rate it wakes up.
pub fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .map(|task| {
            let task = task.file_name();
            let task = task.to_str();
            status_field(pid, task, "voluntary_ctxt_switches").unwrap_or(0)
                + status_field(pid, task, "nonvoluntary_ctxt_switches").unwrap_or(0)
        })
        .sum()
}

/// A connection to the Redis at `url`.
pub async fn redis_conn(url: &str) -> io::Result<MultiplexedConnection> {
    let client = redis::Client::open(url).map_err(io::Error::other)?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(io::Error::other)
}

/// The fields of Redis's `INFO`.
pub struct Info(Vec<(String, String)>);

impl Info {
    pub async fn read(conn: &mut MultiplexedConnection) -> io::Result<Info> {
        let text: String = redis::cmd("INFO")
            .arg("everything")
            .query_async(conn)
            .await
            .map_err(io::Error::other)?;
        Ok(Info(
            text.lines()
                .filter_map(|line| line.split_once(':'))
                .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
                .collect(),
        ))
    }

    pub fn num(&self, field: &str) -> io::Result<f64> {
        self.0
            .iter()
            .find(|(k, _)| k == field)
            .and_then(|(_, v)| v.parse().ok())
            .ok_or_else(|| io::Error::other(format!("INFO has no number {field}")))
    }
}
