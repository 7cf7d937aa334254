//! The servers under test, started and stopped by the bench, and what the
//! bench reads of them from `/proc` and from Redis's `INFO`.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::ports::free_port;
use crate::secure::{Access, Endpoint, Secrets, arg_value};

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
    #[value(name = "delayq-memory", alias = "embedded", alias = "memory")]
    Memory,
    /// delayq's durable embedded engine as it starts by default (on a
    /// scratch `-b DIR`): synced before every reply.
    #[value(name = "delayq-durable", alias = "durable")]
    Durable,
    /// The durable engine with `-f 50`: synced at most every 50 ms.
    #[value(name = "delayq-f50", alias = "durable-f50")]
    DurableF50,
    /// delayq on a private Redis.
    #[value(name = "delayq-redis", alias = "redis")]
    Redis,
}

impl Kind {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Beanstalkd => "beanstalkd",
            Kind::BeanstalkdB => "beanstalkd-b",
            Kind::BeanstalkdBF0 => "beanstalkd-b-f0",
            Kind::Memory => "delayq-memory",
            Kind::Durable => "delayq-durable",
            Kind::DurableF50 => "delayq-f50",
            Kind::Redis => "delayq-redis",
        }
    }

    /// Whether it keeps jobs in a data directory of its own.
    pub fn keeps_a_dir(self) -> bool {
        matches!(
            self,
            Kind::BeanstalkdB | Kind::BeanstalkdBF0 | Kind::Durable | Kind::DurableF50
        )
    }

    /// Whether its jobs outlive its process (a data directory or a Redis).
    pub fn keeps_jobs(self) -> bool {
        self.keeps_a_dir() || self == Kind::Redis
    }

    /// Whether this target is beanstalkd (any of its flag sets), not delayq.
    pub fn is_beanstalkd(self) -> bool {
        matches!(
            self,
            Kind::Beanstalkd | Kind::BeanstalkdB | Kind::BeanstalkdBF0
        )
    }
}

/// A server to start: a [`Kind`], and arguments added to its command line.
/// Written `KIND` or `KIND:ARGS`, the arguments split at spaces (as in
/// `delayq-durable:-s 1048576`).
///
/// Two arguments are the bench's own, for a delayq, and are not passed on:
/// `--secure` (a fresh self-signed certificate and tokens file, with
/// `--tls-cert`, `--tls-key` and `--tokens` for them, and the HTTP listener
/// on) and `--scrape SECS` (the HTTP listener on, and `GET /metrics` asked
/// every SECS seconds while a workload runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub kind: Kind,
    pub args: Vec<String>,
}

impl Spec {
    /// Whether the bench makes a certificate and a tokens file for it.
    pub fn secure(&self) -> bool {
        self.args.iter().any(|a| a == "--secure")
    }

    /// How often the bench scrapes its `/metrics`, if it does.
    pub fn scrape(&self) -> Option<Duration> {
        let secs: f64 = arg_value(&self.args, "--scrape")?.parse().ok()?;
        Some(Duration::from_secs_f64(secs))
    }

    /// Its arguments without the bench's own.
    fn server_args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(self.args.len());
        let mut words = self.args.iter();
        while let Some(a) = words.next() {
            match a.as_str() {
                "--secure" => {}
                "--scrape" => {
                    words.next();
                }
                _ if a.starts_with("--scrape=") => {}
                _ => args.push(a.clone()),
            }
        }
        args
    }

    /// How tables name it: the kind, and its added arguments.
    pub fn label(&self) -> String {
        if self.args.is_empty() {
            self.kind.name().into()
        } else {
            format!("{} {}", self.kind.name(), self.args.join(" "))
        }
    }
}

impl std::str::FromStr for Spec {
    type Err = String;

    fn from_str(s: &str) -> Result<Spec, String> {
        use clap::ValueEnum;
        let (name, args) = s.split_once(':').unwrap_or((s, ""));
        let kind = Kind::from_str(name.trim(), true).map_err(|_| {
            let names: Vec<&str> = Kind::value_variants().iter().map(|k| k.name()).collect();
            format!("unknown server {name:?}; one of {}", names.join(", "))
        })?;
        let spec = Spec {
            kind,
            args: args.split_whitespace().map(String::from).collect(),
        };
        let scrape = arg_value(&spec.args, "--scrape");
        if let Some(s) = scrape.filter(|s| !s.parse::<f64>().is_ok_and(|s| s > 0.0)) {
            return Err(format!("--scrape takes seconds (more than 0), not {s:?}"));
        }
        if kind.is_beanstalkd() && (spec.secure() || scrape.is_some()) {
            return Err(format!("--secure and --scrape are for delayq, not {name}"));
        }
        Ok(spec)
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

    /// The process id, for reading its CPU time and memory from `/proc`.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Sends `signal` and waits until the process is gone, SIGKILLing it
    /// if it is still there after a minute; returns how long it took.
    pub fn stop(&mut self, signal: Stop) -> Duration {
        let start = Instant::now();
        let pid = libc::pid_t::try_from(self.pid()).expect("a pid");
        // SAFETY: kill only sends a signal, to our own unreaped child.
        unsafe { libc::kill(pid, signal.number()) };
        let until = start + Duration::from_secs(60);
        while matches!(self.0.try_wait(), Ok(None)) {
            if Instant::now() >= until {
                eprintln!("load: pid {pid} ignored {signal:?} for a minute; SIGKILL");
                let _ = self.0.kill();
                let _ = self.0.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        start.elapsed()
    }
}

/// How a server is stopped before a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stop {
    /// SIGTERM: a clean stop (delayq shuts down gracefully; beanstalkd,
    /// unless it is PID 1, just dies).
    Term,
    /// SIGKILL: a crash.
    Kill,
}

impl Stop {
    fn number(self) -> libc::c_int {
        match self {
            Stop::Term => libc::SIGTERM,
            Stop::Kill => libc::SIGKILL,
        }
    }

    /// The signal's name, as the reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Term => "SIGTERM",
            Stop::Kill => "SIGKILL",
        }
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
    /// Starts `program` (a `redis-server`) on a free loopback port, with a
    /// directory of its own and no persistence, and waits until it answers.
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

    /// The URL delayq's `--redis` takes for this server.
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
    /// delayq's HTTP listener (`--http`), when the workload needs it or
    /// the spec's arguments turn it on.
    pub http: Option<SocketAddr>,
    pub server: Proc,
    /// The Redis behind delayq on the Redis engine.
    pub redis: Option<RedisServer>,
    /// The data directory (a fresh temporary one), for the servers that
    /// keep one.
    pub dir: Option<tempfile::TempDir>,
    pub spec: Spec,
    /// The server's command-line arguments from the spec: without the
    /// bench's own, with what `--secure` made.
    args: Vec<String>,
    /// What its connections need (a token, TLS), if anything.
    pub access: Option<Arc<Access>>,
    /// The files `--secure` made, kept until the server is gone.
    _secrets: Option<Secrets>,
}

impl Target {
    /// Starts the server `spec` says, on fresh data, and waits until it
    /// accepts connections. With `http`, a delayq also gets
    /// `--http 127.0.0.1:PORT` on a free port (unless its arguments have a
    /// `--http` already); only then, or with `--secure` or `--scrape`, so
    /// that the text workloads measure the server as it runs by default.
    pub fn start(spec: &Spec, programs: &Programs, http: bool) -> io::Result<Target> {
        let secrets = spec.secure().then(Secrets::make).transpose()?;
        let mut args = spec.server_args();
        args.extend(secrets.iter().flat_map(Secrets::args));
        let access = Access::from_args(&args)
            .map_err(|e| io::Error::other(format!("{}: {e}", spec.label())))?;
        let http = http || spec.secure() || spec.scrape().is_some();
        let dir = spec
            .kind
            .keeps_a_dir()
            .then(|| tempfile::tempdir().expect("a data directory"));
        let redis = (spec.kind == Kind::Redis).then(|| RedisServer::start(&programs.redis_server));
        let (addr, http, server) = spawn(
            spec.kind,
            &args,
            programs,
            dir.as_ref(),
            redis.as_ref(),
            http,
        );
        wait_listening(addr);
        if let Some(http) = http {
            wait_listening(http);
        }
        Ok(Target {
            addr,
            http,
            server,
            redis,
            dir,
            spec: spec.clone(),
            args,
            access,
            _secrets: secrets,
        })
    }

    /// Its text port, for the workloads' connections.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            addr: self.addr,
            access: self.access.clone(),
        }
    }

    /// Its HTTP listener, if it has one on.
    pub fn http_endpoint(&self) -> Option<Endpoint> {
        self.http.map(|addr| Endpoint {
            addr,
            access: self.access.clone(),
        })
    }

    /// Stops the server with `signal` and returns how long it took to go.
    pub fn stop(&mut self, signal: Stop) -> Duration {
        self.server.stop(signal)
    }

    /// Starts the server again on its data directory (or its Redis), on a
    /// new port, without waiting for it: the caller times its start.
    pub fn respawn(&mut self, programs: &Programs) {
        let (addr, http, server) = spawn(
            self.spec.kind,
            &self.args,
            programs,
            self.dir.as_ref(),
            self.redis.as_ref(),
            self.http.is_some(),
        );
        self.addr = addr;
        self.http = http;
        self.server = server;
    }
}

/// Starts a server of `kind` with `args` on a free loopback port; with
/// `http` (and a delayq), its HTTP listener on another. Returns both
/// addresses.
fn spawn(
    kind: Kind,
    args: &[String],
    programs: &Programs,
    dir: Option<&tempfile::TempDir>,
    redis: Option<&RedisServer>,
    http: bool,
) -> (SocketAddr, Option<SocketAddr>, Proc) {
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let port = port.to_string();
    // A `--http` the spec gives is used as it is: twice would be refused.
    let given = arg_value(args, "--http").and_then(|a| a.parse::<SocketAddr>().ok());
    let http = match (kind.is_beanstalkd(), given) {
        (true, _) => None,
        (false, Some(given)) => Some(given),
        (false, None) => http.then(|| SocketAddr::from(([127, 0, 0, 1], free_port()))),
    };
    let http_arg = http
        .filter(|_| given.is_none())
        .map(|a| vec!["--http".to_string(), a.to_string()])
        .unwrap_or_default();
    let dir = dir.map(|d| d.path().to_str().expect("a UTF-8 path").to_string());
    let dir = dir.as_deref().unwrap_or_default();
    let listen = ["-l", "127.0.0.1", "-p", &port];
    let delayq = |extra: &[&str]| {
        Proc::spawn(
            Command::new(&programs.delayq)
                .args(listen)
                .args(extra)
                .args(&http_arg)
                .args(args)
                .env("RUST_LOG", "warn"),
        )
    };
    let beanstalkd = |extra: &[&str]| {
        Proc::spawn(
            Command::new(&programs.beanstalkd)
                .args(listen)
                .args(extra)
                .args(args),
        )
    };
    let server = match kind {
        Kind::Beanstalkd => beanstalkd(&[]),
        Kind::BeanstalkdB => beanstalkd(&["-b", dir]),
        Kind::BeanstalkdBF0 => beanstalkd(&["-b", dir, "-f", "0"]),
        Kind::Memory => delayq(&["--in-memory"]),
        Kind::Durable => delayq(&["-b", dir]),
        Kind::DurableF50 => delayq(&["-b", dir, "-f", "50"]),
        Kind::Redis => {
            let url = redis.expect("a Redis for the Redis engine").url();
            delayq(&["--redis", &url])
        }
    };
    (addr, http, server)
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
    /// The Redis behind it, for `INFO`: on a cluster, every primary's
    /// URL, comma-separated.
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

/// Bytes the files under `dir` take, as `du` counts them (blocks
/// allocated) and as `du --apparent-size` does (their lengths).
pub fn dir_size(dir: &std::path::Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut sizes = (0, 0);
    // A file may go (compaction) between the listing and its metadata.
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(m) = entry.metadata() else { continue };
        if m.is_dir() {
            let (allocated, lengths) = dir_size(&entry.path());
            sizes.0 += allocated;
            sizes.1 += lengths;
        } else {
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

/// The machine's CPU time so far, in ticks of all CPUs: the whole, and the
/// part stolen (a virtual machine's CPUs kept waiting by the host for its
/// other guests). `None` where `/proc/stat` has no such line.
pub fn machine_cpu() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    // user nice system idle iowait irq softirq steal (guest time is
    // counted in user already).
    let ticks: Vec<u64> = (line.split_whitespace().skip(1).take(8))
        .map(|t| t.parse().unwrap_or(0))
        .collect();
    Some((ticks.iter().sum(), *ticks.get(7)?))
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
    /// Reads every section of `INFO` from `conn`.
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

    /// A field's text, if INFO has it.
    pub fn text(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == field)
            .map(|(_, v)| v.as_str())
    }

    /// `field` as a number; an error if it is missing or not a number.
    pub fn num(&self, field: &str) -> io::Result<f64> {
        self.text(field)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| io::Error::other(format!("INFO has no number {field}")))
    }
}
