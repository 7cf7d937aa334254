//! A real Redis Cluster for one test: `redis-server` processes in cluster
//! mode on loopback ports, joined by `redis-cli --cluster create`, each node
//! in its own directory under one temporary directory. Dropping it kills the
//! processes and removes the directory.
//!
//! Tests break it on purpose: kill a node and start it again on its own
//! `nodes.conf` ([`RedisCluster::kill`], [`RedisCluster::restart`]), freeze
//! one ([`RedisCluster::stop`], [`RedisCluster::cont`]), and wait for a
//! replica to take over ([`RedisCluster::wait_for_failover`]).
//!
//! Also the pieces [`super::sentinel`] shares: [`Node`] (one `redis-server`
//! process), [`reserve_ports`], [`query`] (one command over RESP, bounded in
//! time) and [`redis_cli`].
//!
//! Everything here blocks the calling thread while it waits.

use std::collections::BTreeSet;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a topology may take to form, or to heal after a fault, before
/// the test fails instead of hanging.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// How long one command to one node may take. A SIGSTOPped node still
/// accepts connections (the kernel does that) but never answers, so
/// without a limit asking it would hang the test.
pub const QUERY_LIMIT: Duration = Duration::from_secs(2);

/// How long a `redis-cli` run may take.
const CLI_LIMIT: Duration = Duration::from_secs(10);

/// How long one process may take to answer after it is started.
const UP_LIMIT: Duration = Duration::from_secs(10);

/// How many times a topology is started over on fresh ports when one of its
/// ports was taken by another process between the check and the bind.
const START_ATTEMPTS: usize = 5;

/// Where a cluster node's bus listens, above its port (fixed by Redis).
const BUS_OFFSET: u16 = 10_000;

/// The number of hash slots.
const SLOTS: u32 = 16_384;

/// Ports this process has handed out and not yet got back. Tests run on
/// many threads: without this two of them could pick the same free port
/// before either binds it, or pick the port of a node that is killed for
/// now but will be restarted on it.
static RESERVED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The range ports are drawn from: below the kernel's ephemeral range
/// together with their bus ports, so no outgoing connection of any process
/// is ever given one; and the data range lies below the bus range, so one
/// cluster's bus port is never another's data port. Other processes (other
/// test binaries) draw at random from the same range, and a collision that
/// slips past the bind check makes the start try again.
fn port_range() -> RangeInclusive<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let bus = u32::from(BUS_OFFSET);
    if ephemeral_low >= 2 * bus + 1024 {
        let low = ephemeral_low - 2 * bus;
        (low as u16)..=((ephemeral_low - bus - 1) as u16)
    } else {
        // An unusual kernel setting: no such gap, so rely on the bind
        // check and the retries alone.
        1024..=(u16::MAX - BUS_OFFSET)
    }
}

/// Whether nothing listens on loopback `port` right now.
fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A port (and, for a cluster node, its bus port) reserved in this process
/// until dropped.
pub struct PortGuard {
    /// The port.
    pub port: u16,
    bus: bool,
}

impl Drop for PortGuard {
    fn drop(&mut self) {
        let mut reserved = RESERVED.lock().unwrap_or_else(|e| e.into_inner());
        reserved.remove(&self.port);
        if self.bus {
            reserved.remove(&(self.port + BUS_OFFSET));
        }
    }
}

/// Reserves `n` loopback ports nobody listens on now, and with `bus` also
/// their cluster bus ports (port + 10000). Another process may still take
/// one before its server binds it: the caller then starts over on new ports.
pub fn reserve_ports(n: usize, bus: bool) -> Vec<PortGuard> {
    let range = port_range();
    let mut reserved = RESERVED.lock().unwrap_or_else(|e| e.into_inner());
    let mut guards = Vec::with_capacity(n);
    let mut tries = 0;
    while guards.len() < n {
        tries += 1;
        assert!(tries < 100_000, "no free loopback ports in {range:?}");
        let port = fastrand::u16(range.clone());
        let taken = |p: u16| reserved.contains(&p) || !bindable(p);
        if taken(port) || (bus && taken(port + BUS_OFFSET)) {
            continue;
        }
        reserved.insert(port);
        if bus {
            reserved.insert(port + BUS_OFFSET);
        }
        guards.push(PortGuard { port, bus });
    }
    guards
}

/// A reply as RESP2 sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+...`
    Status(String),
    /// `-...`
    Error(String),
    /// `:...`
    Int(i64),
    /// `$...` (`None` for the null bulk string); bytes that are not UTF-8
    /// are replaced, as nothing asked here is binary.
    Bulk(Option<String>),
    /// `*...` (`None` for the null array).
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The text of a status or bulk reply; panics on anything else.
    pub fn text(&self) -> &str {
        match self {
            Reply::Status(s) | Reply::Bulk(Some(s)) => s,
            other => panic!("expected a string reply, got {other:?}"),
        }
    }

    /// An integer, or a string holding one; panics on anything else.
    pub fn int(&self) -> i64 {
        match self {
            Reply::Int(n) => *n,
            Reply::Status(s) | Reply::Bulk(Some(s)) => s
                .parse()
                .unwrap_or_else(|_| panic!("expected an integer, got {s:?}")),
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }

    /// The elements of an array (none for the null array); panics on
    /// anything else.
    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(Some(items)) => items,
            Reply::Array(None) => &[],
            other => panic!("expected an array reply, got {other:?}"),
        }
    }

    /// In a flat `[key, value, ...]` array (what RESP2 makes of a map),
    /// the value of `key`.
    pub fn field(&self, key: &str) -> Option<&Reply> {
        self.items()
            .chunks(2)
            .find(|kv| matches!(&kv[0], Reply::Bulk(Some(k)) | Reply::Status(k) if k == key))
            .and_then(|kv| kv.get(1))
    }
}

/// Reads one reply.
fn read_reply(r: &mut impl BufRead) -> io::Result<Reply> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    if line.is_empty() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let line = line
        .strip_suffix(b"\r\n")
        .ok_or_else(|| bad("reply line without CRLF"))?;
    let (kind, rest) = line.split_first().ok_or_else(|| bad("empty reply line"))?;
    let rest = String::from_utf8_lossy(rest).into_owned();
    let number = |s: &str| s.parse::<i64>().map_err(|_| bad("bad number in a reply"));
    Ok(match kind {
        b'+' => Reply::Status(rest),
        b'-' => Reply::Error(rest),
        b':' => Reply::Int(number(&rest)?),
        b'$' => match usize::try_from(number(&rest)?) {
            Err(_) => Reply::Bulk(None),
            Ok(len) => {
                let mut buf = vec![0; len + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(len);
                Reply::Bulk(Some(String::from_utf8_lossy(&buf).into_owned()))
            }
        },
        b'*' => match usize::try_from(number(&rest)?) {
            Err(_) => Reply::Array(None),
            Ok(len) => Reply::Array(Some(
                (0..len).map(|_| read_reply(r)).collect::<io::Result<_>>()?,
            )),
        },
        _ => return Err(bad("unknown reply type")),
    })
}

/// Sends one command to the server on loopback `port` over a fresh
/// connection and reads its reply, giving up after `limit`. An error reply
/// is an `Ok(Reply::Error(..))`: whether it is wrong is the caller's call.
pub fn query_within(port: u16, args: &[&str], limit: Duration) -> io::Result<Reply> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, limit)?;
    stream.set_read_timeout(Some(limit))?;
    stream.set_write_timeout(Some(limit))?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    let mut stream = BufReader::new(stream);
    stream.get_mut().write_all(&request)?;
    read_reply(&mut stream)
}

/// [`query_within`] the usual [`QUERY_LIMIT`].
pub fn query(port: u16, args: &[&str]) -> io::Result<Reply> {
    query_within(port, args, QUERY_LIMIT)
}

/// The text of a command's reply, or why there is none: for the polls
/// that retry until a topology settles.
fn ask(port: u16, args: &[&str]) -> Result<String, String> {
    match query(port, args) {
        Ok(Reply::Status(s) | Reply::Bulk(Some(s))) => Ok(s),
        Ok(other) => Err(format!("{args:?} on port {port}: {other:?}")),
        Err(e) => Err(format!("{args:?} on port {port}: {e}")),
    }
}

/// Runs `cmd`, failing the test if it takes longer than `limit`: a
/// `redis-cli` talking to a stopped server waits forever.
fn run(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {cmd:?} ({e}): the Redis tests need redis-server and redis-cli \
                 (Debian: apt-get install redis-server redis-tools)"
            )
        });
    // Drained on their own threads, so a chatty child never blocks on a
    // full pipe while this one waits for it to exit.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut out);
            }
            out
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for a child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?} (is its server stopped?)");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// Runs `redis-cli -h 127.0.0.1 -p PORT args...` and returns what it
/// prints (not a terminal, so raw: `OK\n`, `1\n`, a value and `\n`).
/// Panics if it fails or takes more than 10 s.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args);
    let out = run(&mut cmd, CLI_LIMIT);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `check` until it gives a value, failing the test with `what` and
/// the last reason it gave after `limit`.
pub fn wait_until<T>(what: &str, limit: Duration, check: impl FnMut() -> Result<T, String>) -> T {
    try_wait_until(what, limit, check).unwrap_or_else(|why| panic!("{why}"))
}

/// [`wait_until`], giving the failure back rather than failing the test,
/// for a caller that has more to say about it.
pub fn try_wait_until<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + limit;
    loop {
        match check() {
            Ok(v) => return Ok(v),
            Err(why) if Instant::now() > deadline => {
                return Err(format!("waited {limit:?} for {what}; still: {why}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Why a process did not come up.
pub enum StartError {
    /// Its port (or bus port) was taken by another process after it was
    /// reserved: start over on other ports.
    PortTaken(String),
    /// Anything else, with the end of its log.
    Failed(String),
}

/// One `redis-server` process of a topology, on its own loopback port and
/// in its own directory, logging to `redis.log` there. Killed when
/// dropped, and its port given back.
pub struct Node {
    /// `None` while killed. Declared first: the process goes before its
    /// port is given back.
    child: Option<Child>,
    /// What it is started with, after the program name.
    args: Vec<String>,
    /// Its working directory.
    dir: PathBuf,
    /// Set while SIGSTOPped: it is then not asked anything, as it would
    /// not answer.
    stopped: AtomicBool,
    guard: PortGuard,
}

impl Node {
    /// Starts `redis-server args...` on the reserved port (which `args`
    /// must name) and waits until it answers.
    pub fn start(guard: PortGuard, dir: &Path, args: Vec<String>) -> Result<Node, StartError> {
        let mut node = Node {
            child: None,
            args,
            dir: dir.to_path_buf(),
            stopped: AtomicBool::new(false),
            guard,
        };
        node.spawn()?;
        Ok(node)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.guard.port
    }

    /// Its working directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its process id, unless killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it can be asked something: neither killed nor stopped.
    pub fn running(&self) -> bool {
        self.child.is_some() && !self.stopped.load(Ordering::SeqCst)
    }

    /// One command to it; see [`query`].
    pub fn query(&self, args: &[&str]) -> io::Result<Reply> {
        query(self.port(), args)
    }

    /// Kills it with SIGKILL (no chance to save or say goodbye) and reaps
    /// it. Its directory and port stay for [`Node::restart`].
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("the node is running");
        child.kill().expect("SIGKILL redis-server");
        child.wait().expect("reap redis-server");
        self.stopped.store(false, Ordering::SeqCst);
    }

    /// Freezes it with SIGSTOP: its connections stay open and its peers
    /// see it go silent, as with a long pause or a partition.
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
        self.stopped.store(true, Ordering::SeqCst);
    }

    /// Lets it run again after [`Node::stop`].
    pub fn cont(&self) {
        self.signal(libc::SIGCONT);
        self.stopped.store(false, Ordering::SeqCst);
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = self.pid().expect("the node is not killed");
        // SAFETY: kill(2) on our own child, which is not reaped yet (only
        // `kill` and drop reap it), so the pid is still ours.
        let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}): {}",
            io::Error::last_os_error()
        );
    }

    /// Starts it again on the same port, directory and arguments after
    /// [`Node::kill`], and waits until it answers.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the node is still running");
        if let Err(StartError::PortTaken(why) | StartError::Failed(why)) = self.spawn() {
            panic!(
                "redis-server on port {} did not come back: {why}",
                self.port()
            );
        }
    }

    fn log(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// The last lines of its log file.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    fn spawn(&mut self) -> Result<(), StartError> {
        let mut cmd = Command::new("redis-server");
        if DIE_WITH_THREAD.get() {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe and touches no memory of
            // the parent.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let child = cmd
            .args(&self.args)
            .arg("--logfile")
            .arg(self.log())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}): the Redis tests need it installed \
                     (Debian: apt-get install redis-server redis-tools)"
                )
            });
        self.child = Some(child);
        self.wait_up()
    }

    /// Waits until the process answers on its port. It must be this
    /// process that answers, not another test's server that won the port.
    fn wait_up(&mut self) -> Result<(), StartError> {
        let port = self.port();
        let deadline = Instant::now() + UP_LIMIT;
        loop {
            let child = self.child.as_mut().expect("just spawned");
            if let Some(status) = child.try_wait().expect("try_wait redis-server") {
                self.child = None;
                let log = self.log_tail();
                let why = format!("redis-server on port {port} exited ({status}):\n{log}");
                return Err(if log.contains("Address already in use") {
                    StartError::PortTaken(why)
                } else {
                    StartError::Failed(why)
                });
            }
            let pid = child.id();
            if let Ok(Reply::Bulk(Some(info))) = self.query(&["INFO", "server"])
                && info.contains(&format!("process_id:{pid}\r\n"))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = self.log_tail();
                return Err(StartError::Failed(format!(
                    "redis-server on port {port} did not answer within {UP_LIMIT:?}:\n{log}"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL ends a stopped process too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One range of CLUSTER SLOTS, by port: `(first, last, primary, replicas)`,
/// the replicas sorted (nodes list them in their own order).
type SlotRange = (u16, u16, u16, Vec<u16>);

/// A running Redis Cluster on loopback ports. Nodes are named by their
/// index, in the order they were given to `redis-cli --cluster create`;
/// which are primaries changes with failovers, so it is always asked live.
pub struct RedisCluster {
    nodes: Vec<Node>,
    /// Each node's primary when last asked (`None`: a primary itself): once
    /// a primary is gone, this is how its former replicas are known.
    last_seen: Mutex<Vec<Option<usize>>>,
    /// Declared after `nodes`: removed once their processes are gone.
    _dir: tempfile::TempDir,
}

thread_local! {
    /// Whether nodes started on this thread die with it (see
    /// [`RedisCluster::shared`]).
    static DIE_WITH_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// delayq's Redis engine on the shared cluster (see
/// [`RedisCluster::shared`]), under a key prefix of its own, so that what
/// one test stores no other sees.
pub async fn shared_store() -> delayq::store::redis::RedisStore {
    let seeds = tokio::task::spawn_blocking(RedisCluster::shared)
        .await
        .expect("start the shared cluster");
    let target =
        delayq::store::redis::Target::Cluster(seeds.split(',').map(String::from).collect());
    let options = delayq::store::redis::Options {
        prefix: unique_prefix(),
        spread: Some(delayq::store::redis::SHARDS),
        whole_tubes: Vec::new(),
        wait: None,
    };
    delayq::store::redis::RedisStore::open(target, options)
        .await
        .expect("connect to the shared cluster")
}

/// The arguments every data node of a test topology (a cluster's node,
/// a Sentinel-watched primary or replica) starts with: its port on
/// loopback, its directory, and no persistence.
pub fn data_node_args(port: u16, dir: &str) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--dir",
        dir,
        "--save",
        "",
        "--appendonly",
        "no",
        // A replica's first sync would otherwise wait 5 s for others to
        // share the transfer: there are none to wait for.
        "--repl-diskless-sync-delay",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

/// A topology shared between a test and the blocking tasks that break it.
pub type Shared<T> = std::sync::Arc<Mutex<T>>;

/// Starts a topology (`f`: [`RedisCluster::start`], `RedisSentinel::start`)
/// off the runtime's threads: the harness waits by sleeping.
pub async fn start_shared<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Shared<T> {
    let started = tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    std::sync::Arc::new(Mutex::new(started))
}

/// Runs `f` on a shared topology on a blocking thread.
pub async fn blocking<S, T>(shared: &Shared<S>, f: impl FnOnce(&mut S) -> T + Send + 'static) -> T
where
    S: Send + 'static,
    T: Send + 'static,
{
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || f(&mut shared.lock().unwrap_or_else(|e| e.into_inner())))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// The shared cluster's directory (see [`RedisCluster::shared`]).
static SHARED_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Removes the shared cluster's directory as the test process exits.
extern "C" fn remove_shared_dir() {
    if let Some(dir) = SHARED_DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

impl RedisCluster {
    /// The seeds of one 3-primary cluster (no replicas) shared by every test
    /// of this test binary that asks, each under a key prefix of its own
    /// ([`unique_prefix`]), so that a suite of hundreds of tests does not
    /// start hundreds of clusters. Its nodes are started on a thread that
    /// lives as long as the test binary and die with it (`PR_SET_PDEATHSIG`),
    /// since a static is never dropped.
    pub fn shared() -> &'static str {
        static SEEDS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        SEEDS.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                DIE_WITH_THREAD.set(true);
                let cluster = RedisCluster::start(3, 0);
                // Never dropped: its nodes die with the process, and its
                // directory goes when the process exits.
                let _ = SHARED_DIR.set(cluster._dir.path().to_path_buf());
                // SAFETY: registers a plain function with no captured state.
                unsafe { libc::atexit(remove_shared_dir) };
                tx.send(cluster.seeds())
                    .expect("the test waits for the seeds");
                loop {
                    std::thread::park();
                }
            });
            rx.recv().expect("the shared cluster starts")
        })
    }

    /// Starts `masters` primaries (at least 3, as `redis-cli --cluster
    /// create` wants) with `replicas_per_master` replicas each, and waits
    /// until the cluster is whole: every node `cluster_state:ok`, every
    /// replica's link up, and every node with the same slot map.
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        RedisCluster::start_with(masters, replicas_per_master, &[])
    }

    /// [`RedisCluster::start`] with `extra` arguments for every node, such
    /// as `["--appendonly", "yes"]`, after (so overriding) the harness's.
    pub fn start_with(masters: usize, replicas_per_master: usize, extra: &[&str]) -> RedisCluster {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters, not {masters}"
        );
        let count = masters * (1 + replicas_per_master);
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            match RedisCluster::spawn_all(count, extra) {
                Ok(cluster) => {
                    cluster.create(replicas_per_master);
                    wait_until("the new cluster to settle", SETTLE_LIMIT, || {
                        cluster.settled(true)
                    });
                    cluster.observe();
                    return cluster;
                }
                Err(why) => last = why,
            }
        }
        panic!("could not start a cluster in {START_ATTEMPTS} attempts; last: {last}");
    }

    /// Starts `count` unjoined nodes; `Err` if a port was taken under them.
    fn spawn_all(count: usize, extra: &[&str]) -> Result<RedisCluster, String> {
        let root = tempfile::Builder::new()
            .prefix("delayq-cluster-")
            .tempdir()
            .expect("a directory for the cluster");
        let mut nodes = Vec::with_capacity(count);
        for guard in reserve_ports(count, true) {
            let dir = root.path().join(guard.port.to_string());
            std::fs::create_dir(&dir).expect("a directory for a node");
            let dir_arg = dir.to_str().expect("a UTF-8 temp path").to_string();
            let mut args = data_node_args(guard.port, &dir_arg);
            args.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &format!("{dir_arg}/nodes.conf"),
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-replica-validity-factor",
                    "0",
                ]
                .map(String::from),
            );
            args.extend(extra.iter().map(|s| s.to_string()));
            match Node::start(guard, &dir, args) {
                Ok(node) => nodes.push(node),
                Err(StartError::PortTaken(why)) => return Err(why),
                Err(StartError::Failed(why)) => panic!("a cluster node did not start: {why}"),
            }
        }
        Ok(RedisCluster {
            last_seen: Mutex::new(vec![None; nodes.len()]),
            nodes,
            _dir: root,
        })
    }

    /// Joins the nodes and assigns the slots.
    fn create(&self, replicas_per_master: usize) {
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        cmd.args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())));
        cmd.args([
            "--cluster-replicas",
            &replicas_per_master.to_string(),
            "--cluster-yes",
        ]);
        let out = run(&mut cmd, SETTLE_LIMIT);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("[OK] All 16384 slots covered"),
            "{cmd:?} failed ({}):\n{text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The nodes that can be asked something: neither killed nor stopped.
    fn live(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes.iter().enumerate().filter(|(_, n)| n.running())
    }

    /// The node listening on `port`.
    fn index_of(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// A node's role and, for a replica, its primary's port.
    fn role(&self, node: usize) -> Result<(String, Option<u16>), String> {
        let port = self.nodes[node].port();
        let reply = query(port, &["ROLE"]).map_err(|e| format!("ROLE on node {node}: {e}"))?;
        let items = match &reply {
            Reply::Array(Some(items)) if !items.is_empty() => items,
            other => return Err(format!("ROLE on node {node}: {other:?}")),
        };
        let role = items[0].text().to_string();
        let primary = match (role.as_str(), items.get(2)) {
            ("slave", Some(p)) => Some(p.int() as u16),
            _ => None,
        };
        Ok((role, primary))
    }

    /// A node's CLUSTER SLOTS, sorted; `with_replicas: false` leaves the
    /// replicas out (a killed replica leaves the lists at a different
    /// moment on each node).
    fn slot_map(&self, node: usize, with_replicas: bool) -> Result<Vec<SlotRange>, String> {
        let reply = self.nodes[node]
            .query(&["CLUSTER", "SLOTS"])
            .map_err(|e| format!("CLUSTER SLOTS on node {node}: {e}"))?;
        if !matches!(reply, Reply::Array(_)) {
            return Err(format!("CLUSTER SLOTS on node {node}: {reply:?}"));
        }
        let mut map: Vec<SlotRange> = reply
            .items()
            .iter()
            .map(|range| {
                let r = range.items();
                let port = |n: &Reply| n.items()[1].int() as u16;
                let mut replicas: Vec<u16> = if with_replicas {
                    r[3..].iter().map(port).collect()
                } else {
                    Vec::new()
                };
                replicas.sort_unstable();
                (r[0].int() as u16, r[1].int() as u16, port(&r[2]), replicas)
            })
            .collect();
        map.sort();
        Ok(map)
    }

    /// Whether every live node is `cluster_state:ok` and sees the same
    /// slot map, and (`whole`) every replica's link is up and the maps
    /// agree on the replicas too.
    fn settled(&self, whole: bool) -> Result<(), String> {
        let mut first: Option<(usize, Vec<SlotRange>)> = None;
        for (i, node) in self.live() {
            let info = ask(node.port(), &["CLUSTER", "INFO"])?;
            if !info.contains("cluster_state:ok") {
                return Err(format!("node {i} is not cluster_state:ok"));
            }
            if whole && self.role(i)?.0 == "slave" {
                let info = ask(node.port(), &["INFO", "replication"])?;
                if !info.contains("master_link_status:up") {
                    return Err(format!("replica {i}'s link is not up"));
                }
            }
            let map = self.slot_map(i, whole)?;
            let covered: u32 = map.iter().map(|r| u32::from(r.1 - r.0) + 1).sum();
            if whole && covered != SLOTS {
                return Err(format!("node {i} sees {covered} of {SLOTS} slots served"));
            }
            match &first {
                None => first = Some((i, map)),
                Some((j, seen)) if *seen != map => {
                    return Err(format!(
                        "nodes {j} and {i} disagree on the slot map: {seen:?} vs {map:?}"
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Notes each live node's primary, for [`RedisCluster::wait_for_failover`].
    fn observe(&self) {
        let mut seen = self.last_seen.lock().unwrap_or_else(|e| e.into_inner());
        for (i, _) in self.live() {
            if let Ok((role, primary)) = self.role(i) {
                seen[i] = match role.as_str() {
                    "slave" => primary.and_then(|p| self.index_of(p)),
                    _ => None,
                };
            }
        }
    }

    /// `redis://127.0.0.1:P` of every node, comma-separated: what delayq
    /// is given to find the cluster.
    pub fn seeds(&self) -> String {
        self.urls().join(",")
    }

    /// `redis://127.0.0.1:P` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// Every node's port, by index.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(Node::port).collect()
    }

    /// The process id of a node, unless killed.
    pub fn pid(&self, node: usize) -> Option<u32> {
        self.nodes[node].pid()
    }

    /// Runs `redis-cli -p PORT args...` against a node and returns what it
    /// prints (raw: `OK\n`, a value and `\n`). With `-c` first in `args` it
    /// follows redirections to other nodes.
    pub fn cli(&self, node: usize, args: &[&str]) -> String {
        redis_cli(self.nodes[node].port(), args)
    }

    /// The nodes that are primaries now, asked each live node.
    pub fn masters(&self) -> Vec<usize> {
        self.live()
            .filter(|&(i, _)| {
                let (role, _) = self.role(i).unwrap_or_else(|e| panic!("{e}"));
                role == "master"
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// The live nodes that replicate `master` now.
    pub fn replicas_of(&self, master: usize) -> Vec<usize> {
        let port = self.nodes[master].port();
        self.live()
            .filter(|&(i, _)| {
                let (_, primary) = self.role(i).unwrap_or_else(|e| panic!("{e}"));
                primary == Some(port)
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// The primary serving `slot` now, as the first live node that answers
    /// sees it.
    pub fn slot_owner(&self, slot: u16) -> usize {
        let (i, map) = self
            .live()
            .find_map(|(i, _)| Some((i, self.slot_map(i, false).ok()?)))
            .expect("some node answers CLUSTER SLOTS");
        let &(_, _, port, _) = map
            .iter()
            .find(|(first, last, _, _)| (*first..=*last).contains(&slot))
            .unwrap_or_else(|| panic!("node {i} sees nobody serving slot {slot}: {map:?}"));
        self.index_of(port)
            .unwrap_or_else(|| panic!("slot {slot} is served from unknown port {port}"))
    }

    /// Kills a node with SIGKILL and reaps it; its directory, port and
    /// `nodes.conf` stay for [`RedisCluster::restart`].
    pub fn kill(&mut self, node: usize) {
        self.observe();
        self.nodes[node].kill();
    }

    /// Freezes a node with SIGSTOP; to the others it goes silent.
    pub fn stop(&self, node: usize) {
        self.observe();
        self.nodes[node].stop();
    }

    /// Lets a stopped node run again.
    pub fn cont(&self, node: usize) {
        self.nodes[node].cont();
    }

    /// Starts a killed node again on its directory, port and `nodes.conf`,
    /// and waits until it is back in the cluster: `cluster_state:ok`, its
    /// replication link up if it is a replica (as a former primary that
    /// lost its slots comes back), and the same slot map as the others.
    pub fn restart(&mut self, node: usize) {
        self.nodes[node].restart();
        wait_until(
            &format!("node {node} to rejoin the cluster"),
            SETTLE_LIMIT,
            || {
                let port = self.nodes[node].port();
                if !ask(port, &["CLUSTER", "INFO"])?.contains("cluster_state:ok") {
                    return Err(format!("node {node} is not cluster_state:ok"));
                }
                if self.role(node)?.0 == "slave"
                    && !ask(port, &["INFO", "replication"])?.contains("master_link_status:up")
                {
                    return Err(format!("node {node}'s replication link is not up"));
                }
                self.settled(false)
            },
        );
        self.observe();
    }

    /// Waits until one of `old_master`'s replicas (as last seen before it
    /// was killed or stopped) is a primary and every live node is
    /// `cluster_state:ok` with the same slot map, and returns that replica.
    pub fn wait_for_failover(&self, old_master: usize) -> usize {
        let candidates: Vec<usize> = {
            let seen = self.last_seen.lock().unwrap_or_else(|e| e.into_inner());
            (0..seen.len())
                .filter(|&i| seen[i] == Some(old_master))
                .collect()
        };
        assert!(
            !candidates.is_empty(),
            "node {old_master} had no replicas when last seen: nobody can take over"
        );
        let new = wait_until(
            &format!("a replica of node {old_master} ({candidates:?}) to take over"),
            SETTLE_LIMIT,
            || {
                let new = candidates
                    .iter()
                    .copied()
                    .find(|&c| {
                        self.nodes[c].running()
                            && self.role(c).is_ok_and(|(role, _)| role == "master")
                    })
                    .ok_or_else(|| "no former replica is a primary yet".to_string())?;
                self.settled(false)?;
                Ok(new)
            },
        );
        self.observe();
        new
    }

    /// How many times a node has run `command` (lower case, such as
    /// `"fcall"`) since it started or its stats were reset: `calls=` of
    /// `cmdstat_<command>` in INFO commandstats, 0 if it never ran it.
    pub fn commands(&self, node: usize, command: &str) -> u64 {
        let info = ask(self.nodes[node].port(), &["INFO", "commandstats"])
            .unwrap_or_else(|e| panic!("{e}"));
        let prefix = format!("cmdstat_{}:calls=", command.to_lowercase());
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|rest| {
                let calls = rest.split(',').next().unwrap_or(rest);
                calls
                    .parse()
                    .unwrap_or_else(|_| panic!("bad calls= in {rest:?}"))
            })
            .unwrap_or(0)
    }

    /// CONFIG RESETSTAT on every live node, so [`RedisCluster::commands`]
    /// counts from now.
    pub fn reset_stats(&self) {
        for (i, node) in self.live() {
            let reply = node.query(&["CONFIG", "RESETSTAT"]);
            assert!(
                matches!(&reply, Ok(Reply::Status(s)) if s == "OK"),
                "CONFIG RESETSTAT on node {i}: {reply:?}"
            );
        }
    }
}

/// A key prefix no other test of this process uses, for a test on the
/// shared cluster.
pub fn unique_prefix() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "t{}-{}:",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}
