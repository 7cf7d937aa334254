//! Test harness: a real server on a loopback port per test, and a line-level
//! client over a real TCP socket.
//!
//! Every command-level test is written once as `async fn name(backend: Backend)`
//! and listed in `backend_tests!`, which instantiates it as a `#[tokio::test]`
//! in one module per backend (`memory::name`, ...).
//!
//! Adding a backend: a `module => Variant` line in the `backends!` invocation
//! below (that declares the enum variant and its test module) and its arm in
//! [`TestServer::start_with`].

// Each test binary uses its own part of the harness.
#![allow(dead_code, unused_macros)]

pub mod cluster;
pub mod daemon;
pub mod ports;
pub mod redis;
pub mod sentinel;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use delayq::config::Config;
use delayq::server::{Control, run_with_http};
use delayq::store::memory::MemoryStore;
use delayq::store::redis::RedisStore;
use redis::RedisServer;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long any single reply may take before the test fails instead of hanging.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Declares [`Backend`] and the `backend_tests!` macro from one list, so the
/// two can never disagree. (`$d` is a literal `$`, passed in so the inner
/// macro can have repetitions of its own.)
macro_rules! backends {
    ($d:tt $($module:ident => $variant:ident),+ $(,)?) => {
        /// A storage engine the server can run on.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Backend {
            $(
                #[doc = stringify!($variant)]
                $variant,
            )+
        }

        impl Backend {
            /// Every backend, for tests that want to loop.
            pub const ALL: &'static [Backend] = &[$(Backend::$variant),+];
        }

        /// Instantiates each listed `async fn name(Backend)` as a
        /// `#[tokio::test]` once per backend, in a module named after it.
        macro_rules! backend_tests {
            ($d($d name:ident),+ $d(,)?) => {
                $(
                    mod $module {
                        $d(
                            // Multi-threaded, so the server reads while the
                            // test writes, as it would with a real client.
                            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                            async fn $d name() {
                                super::$d name($crate::common::Backend::$variant).await
                            }
                        )+
                    }
                )+
            };
        }
    };
}

backends!($ memory => Memory, durable => Durable, redis => Redis, cluster => Cluster);

/// What a test server's engine needs kept while it runs.
enum Keep {
    Redis(RedisServer),
    Dir(tempfile::TempDir),
}

/// A server running on the current tokio runtime, on its own port.
/// Dropping it shuts the server down.
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its shutdown and drain switches.
    pub control: Control,
    /// The backend it runs on.
    pub backend: Backend,
    /// Where its HTTP front end listens, if it was started with one.
    pub http: Option<SocketAddr>,
    task: JoinHandle<()>,
    /// What the engine needs (its Redis, its data directory); dropped after
    /// `task` is told to stop.
    keep: Option<Keep>,
}

impl TestServer {
    /// A server with default settings.
    pub async fn start(backend: Backend) -> TestServer {
        TestServer::start_with(backend, Config::default()).await
    }

    /// A server with the given settings.
    pub async fn start_with(backend: Backend, config: Config) -> TestServer {
        TestServer::start_full(backend, config, false).await
    }

    /// A server with default settings and its HTTP front end on a port of
    /// its own ([`TestServer::http`], [`TestServer::http_url`]).
    pub async fn start_http(backend: Backend) -> TestServer {
        TestServer::start_full(backend, Config::default(), true).await
    }

    /// A server with the given settings, and the HTTP front end if `http`.
    pub async fn start_full(backend: Backend, config: Config, http: bool) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let http_listener = match http {
            true => Some(
                TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind a loopback port for HTTP"),
            ),
            false => None,
        };
        let http = http_listener
            .as_ref()
            .map(|l| l.local_addr().expect("local address"));
        let control = Control::default();
        // One server task whichever the engine's type.
        macro_rules! serve {
            ($store:expr) => {
                tokio::spawn(run_with_http(
                    listener,
                    http_listener,
                    $store,
                    config,
                    control.clone(),
                ))
            };
        }
        let (task, keep) = match backend {
            Backend::Memory => {
                let task = serve!(MemoryStore::new());
                (task, None)
            }
            Backend::Durable => {
                let dir = tempfile::tempdir().expect("a scratch data directory");
                let store = delayq::store::log::open(
                    delayq::store::log::Options::new(dir.path()),
                    delayq::clock::Clock::system(),
                )
                .expect("open a fresh data directory");
                let task = serve!(store);
                (task, Some(Keep::Dir(dir)))
            }
            Backend::Redis => {
                let redis = RedisServer::start(&[]);
                let store = RedisStore::connect(&redis.url, "delayq:")
                    .await
                    .expect("connect to the test's redis-server");
                let task = serve!(store);
                (task, Some(Keep::Redis(redis)))
            }
            Backend::Cluster => {
                let store = cluster::shared_store().await;
                let task = serve!(store);
                (task, None)
            }
        };
        TestServer {
            addr,
            control,
            backend,
            http,
            task,
            keep,
        }
    }

    /// The base URL of the HTTP front end (`http://127.0.0.1:PORT`).
    ///
    /// # Panics
    /// If the server was started without it.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.http.expect("a server started with HTTP"))
    }

    /// The URL of the server's own Redis, on the Redis backend.
    pub fn redis_url(&self) -> Option<&str> {
        match &self.keep {
            Some(Keep::Redis(r)) => Some(r.url.as_str()),
            _ => None,
        }
    }

    /// A new client connection.
    pub async fn client(&self) -> Client {
        Client::connect(self.addr).await
    }

    /// Sets or clears drain mode, as SIGUSR1 does.
    pub fn set_draining(&self, on: bool) {
        self.control.draining.store(on, Ordering::SeqCst);
    }

    /// Shuts the server down and waits for `run` to return.
    pub async fn shutdown(mut self) {
        self.control.shutdown.cancel();
        tokio::time::timeout(REPLY_TIMEOUT, &mut self.task)
            .await
            .expect("server stops within the timeout")
            .expect("server task does not panic");
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.control.shutdown.cancel();
    }
}

/// A parsed YAML document of an `OK <bytes>` reply: either a mapping
/// (`key: value`, in order, values raw as printed) or a list (`- item`).
#[derive(Debug, Clone, Default)]
pub struct Yaml {
    /// `key: value` lines in order.
    pub pairs: Vec<(String, String)>,
    /// `- item` lines in order.
    pub items: Vec<String>,
}

impl Yaml {
    /// Parses the simple YAML beanstalkd prints.
    pub fn parse(doc: &str) -> Yaml {
        let mut lines = doc.split('\n');
        assert_eq!(lines.next(), Some("---"), "YAML starts with ---: {doc:?}");
        assert!(doc.ends_with('\n'), "YAML ends with a newline: {doc:?}");
        let mut y = Yaml::default();
        for line in lines.filter(|l| !l.is_empty()) {
            if let Some(item) = line.strip_prefix("- ") {
                y.items.push(item.to_string());
            } else {
                let (k, v) = line
                    .split_once(": ")
                    .unwrap_or_else(|| panic!("not a `key: value` line: {line:?}"));
                y.pairs.push((k.to_string(), v.to_string()));
            }
        }
        assert!(
            y.pairs.is_empty() || y.items.is_empty(),
            "mapping and list mixed: {doc:?}"
        );
        y
    }

    /// The keys, in order.
    pub fn keys(&self) -> Vec<&str> {
        self.pairs.iter().map(|(k, _)| k.as_str()).collect()
    }

    /// A value as printed; panics if absent.
    pub fn get(&self, key: &str) -> &str {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no `{key}` in {:?}", self.keys()))
    }

    /// A numeric value; panics if absent or not a number.
    pub fn num(&self, key: &str) -> u64 {
        let v = self.get(key);
        v.parse()
            .unwrap_or_else(|_| panic!("`{key}` is not a number: {v:?}"))
    }

    /// The mapping as a sorted map.
    pub fn map(&self) -> BTreeMap<&str, &str> {
        self.pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// A job as delivered by `RESERVED` or `FOUND`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Its id as printed.
    pub id: String,
    /// Its body.
    pub body: Vec<u8>,
}

/// The connection ended under a client in its fallible mode: the server
/// process went away.
#[derive(Debug)]
pub struct Gone;

/// A result of the fallible mode.
pub type Io<T> = Result<T, Gone>;

/// Longest any single reply may take in the fallible mode (a blocked
/// `reserve-with-timeout 1` under load included) before the test fails
/// instead of hanging.
const FALLIBLE_LIMIT: Duration = Duration::from_secs(10);

/// One client connection speaking the text protocol over real TCP.
///
/// Its methods panic on anything but the expected reply, for the suites
/// that test one server; the `try_` methods (the fallible mode) return
/// [`Gone`] when the connection ends, for the fault tests whose servers are
/// killed under them.
pub struct Client {
    stream: BufReader<TcpStream>,
}

impl Client {
    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> Client {
        let stream = tokio::time::timeout(REPLY_TIMEOUT, TcpStream::connect(addr))
            .await
            .expect("connect within the timeout")
            .expect("connect");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        Client {
            stream: BufReader::new(stream),
        }
    }

    /// Writes raw bytes.
    pub async fn send(&mut self, bytes: &[u8]) {
        let s = self.stream.get_mut();
        s.write_all(bytes).await.expect("write");
        s.flush().await.expect("flush");
    }

    /// Writes `bytes` one at a time with a pause after each, so the server
    /// sees them in many separate reads.
    pub async fn send_bytewise(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.send(std::slice::from_ref(b)).await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Shuts down the writing half: the server sees end of input.
    pub async fn close_write(&mut self) {
        self.stream
            .get_mut()
            .shutdown()
            .await
            .expect("shutdown(SHUT_WR)");
    }

    /// Hangs up at once, as a client that closes its socket does. Dropping
    /// the client alone does not always: a test that starts a child process
    /// meanwhile (tests run in parallel threads of one process) lends it a
    /// copy of every descriptor until its `exec`, and the socket's FIN
    /// waits for the last copy to go, so the server heard a later command
    /// of this test first (in a run of the suite at eight threads, a few
    /// rounds in fifty of the hang-up test). A shutdown sends the FIN
    /// whoever else holds the socket.
    pub fn hang_up(self) {
        let stream = self.stream.into_inner().into_std().expect("into_std");
        // A server that already closed its end makes this fail: nothing to
        // hang up then.
        let _ = stream.shutdown(std::net::Shutdown::Both);
    }

    /// Writes a command line, adding CRLF.
    pub async fn send_line(&mut self, line: &str) {
        self.send(format!("{line}\r\n").as_bytes()).await;
    }

    /// Reads one CRLF-terminated reply line, without its CRLF.
    pub async fn line(&mut self) -> String {
        self.line_within(REPLY_TIMEOUT).await
    }

    /// Reads one reply line, failing if none arrives within `limit`.
    pub async fn line_within(&mut self, limit: Duration) -> String {
        let mut buf = Vec::new();
        let n = tokio::time::timeout(limit, self.stream.read_until(b'\n', &mut buf))
            .await
            .unwrap_or_else(|_| panic!("no reply line within {limit:?} (got {buf:?})"))
            .expect("read");
        assert!(n > 0, "connection closed while waiting for a reply line");
        let text = String::from_utf8(buf).expect("reply line is UTF-8");
        let line = text
            .strip_suffix("\r\n")
            .unwrap_or_else(|| panic!("reply line not CRLF-terminated: {text:?}"));
        line.to_string()
    }

    /// Reads exactly `n` bytes.
    pub async fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        tokio::time::timeout(REPLY_TIMEOUT, self.stream.read_exact(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{n} bytes did not arrive within {REPLY_TIMEOUT:?}"))
            .expect("read_exact");
        buf
    }

    /// Sends one command line and returns the reply line.
    pub async fn cmd(&mut self, line: &str) -> String {
        self.send_line(line).await;
        self.line().await
    }

    /// Sends one command and returns its reply line, reading past any data
    /// block: `FOUND`/`RESERVED` lines are returned whole, `OK <bytes>` as
    /// just `OK`.
    pub async fn reply(&mut self, line: &str) -> String {
        let reply = self.cmd(line).await;
        let words: Vec<&str> = reply.split(' ').collect();
        // The byte count is the last word of these replies.
        let len = match words[..] {
            ["OK", len] | ["FOUND" | "RESERVED", _, len] => len,
            _ => return reply,
        };
        let len: usize = len
            .parse()
            .unwrap_or_else(|_| panic!("bad byte count in {reply:?}"));
        let block = self.read_exact(len + 2).await;
        assert_eq!(&block[len..], b"\r\n", "data block is followed by CRLF");
        if words[0] == "OK" { "OK".into() } else { reply }
    }

    /// A cheap round trip, to know everything sent before was handled.
    pub async fn ping(&mut self) {
        let reply = self.cmd("list-tube-used").await;
        assert!(reply.starts_with("USING "), "{reply}");
    }

    /// `put` with a server-assigned id; returns the reply line.
    pub async fn put(&mut self, pri: u32, delay: u32, ttr: u32, body: &[u8]) -> String {
        let mut msg = format!("put {pri} {delay} {ttr} {}\r\n", body.len()).into_bytes();
        msg.extend_from_slice(body);
        msg.extend_from_slice(b"\r\n");
        self.send(&msg).await;
        self.line().await
    }

    /// `put` with a client-chosen id; returns the reply line.
    pub async fn put_id(
        &mut self,
        pri: u32,
        delay: u32,
        ttr: u32,
        body: &[u8],
        id: &str,
    ) -> String {
        let mut msg = format!("put {pri} {delay} {ttr} {} {id}\r\n", body.len()).into_bytes();
        msg.extend_from_slice(body);
        msg.extend_from_slice(b"\r\n");
        self.send(&msg).await;
        self.line().await
    }

    /// A `put` that must succeed; returns the server-assigned id.
    pub async fn put_ok(&mut self, pri: u32, delay: u32, ttr: u32, body: &[u8]) -> u64 {
        let reply = self.put(pri, delay, ttr, body).await;
        reply
            .strip_prefix("INSERTED ")
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("expected INSERTED <n>, got {reply:?}"))
    }

    /// Reads the body that follows a `RESERVED` or `FOUND` line (`word`).
    pub async fn job_after(&mut self, word: &str, line: &str) -> Job {
        let rest = line
            .strip_prefix(word)
            .and_then(|r| r.strip_prefix(' '))
            .unwrap_or_else(|| panic!("expected {word} <id> <bytes>, got {line:?}"));
        let (id, len) = rest
            .split_once(' ')
            .unwrap_or_else(|| panic!("expected {word} <id> <bytes>, got {line:?}"));
        let len: usize = len.parse().expect("byte count");
        let mut body = self.read_exact(len + 2).await;
        assert_eq!(&body[len..], b"\r\n", "body is followed by CRLF");
        body.truncate(len);
        Job {
            id: id.to_string(),
            body,
        }
    }

    /// Sends a command that must answer `RESERVED`; returns the job.
    pub async fn reserved(&mut self, cmd: &str) -> Job {
        let line = self.cmd(cmd).await;
        self.job_after("RESERVED", &line).await
    }

    /// `reserve`, which must answer a job within the reply timeout.
    pub async fn reserve_body(&mut self) -> Job {
        self.reserved("reserve").await
    }

    /// Sends a command that must answer `FOUND`; returns the job.
    pub async fn found(&mut self, cmd: &str) -> Job {
        let line = self.cmd(cmd).await;
        self.job_after("FOUND", &line).await
    }

    /// Reads a `FOUND` line and its body; returns the line.
    pub async fn found_line(&mut self) -> String {
        let line = self.line().await;
        self.job_after("FOUND", &line).await;
        line
    }

    /// Reads an `OK <bytes>` reply and its YAML document.
    pub async fn read_yaml(&mut self) -> Yaml {
        let line = self.line().await;
        self.yaml_after(&line).await
    }

    /// Reads the YAML document of the `OK <bytes>` reply `line`, already
    /// read.
    pub async fn yaml_after(&mut self, line: &str) -> Yaml {
        let len: usize = line
            .strip_prefix("OK ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("expected OK <bytes>, got {line:?}"));
        let mut doc = self.read_exact(len + 2).await;
        assert_eq!(&doc[len..], b"\r\n", "YAML is followed by CRLF");
        doc.truncate(len);
        Yaml::parse(&String::from_utf8(doc).expect("YAML is UTF-8"))
    }

    /// Sends a command that must answer with a YAML document.
    pub async fn yaml(&mut self, cmd: &str) -> Yaml {
        self.send_line(cmd).await;
        self.read_yaml().await
    }

    /// `list-schedules`, line by line, less the `next:` lines, which move
    /// with the clock: what must be the same before and after a restart.
    pub async fn schedules(&mut self) -> Vec<String> {
        self.send_line("list-schedules").await;
        let head = self.line().await;
        let n: usize = head
            .strip_prefix("OK ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("list-schedules answered {head:?}"));
        let doc = String::from_utf8(self.read_exact(n + 2).await).expect("YAML is text");
        doc.lines()
            .filter(|l| !l.trim_start().starts_with("next:"))
            .map(String::from)
            .collect()
    }

    /// `stats`.
    pub async fn stats(&mut self) -> Yaml {
        self.yaml("stats").await
    }

    /// `stats-job <id>`.
    pub async fn stats_job(&mut self, id: impl std::fmt::Display) -> Yaml {
        self.yaml(&format!("stats-job {id}")).await
    }

    /// `stats-tube <tube>`.
    pub async fn stats_tube(&mut self, tube: &str) -> Yaml {
        self.yaml(&format!("stats-tube {tube}")).await
    }

    /// `list-tubes`, as a list of names.
    pub async fn tubes(&mut self) -> Vec<String> {
        self.yaml("list-tubes").await.items
    }

    /// Repeats `cmd` until its document satisfies `ok`, for state another
    /// connection changes asynchronously (a hang-up, a blocked reserve).
    pub async fn poll_yaml(&mut self, cmd: &str, ok: impl Fn(&Yaml) -> bool) -> Yaml {
        let start = Instant::now();
        loop {
            let y = self.yaml(cmd).await;
            if ok(&y) {
                return y;
            }
            if start.elapsed() > REPLY_TIMEOUT {
                let last: Vec<String> = y.pairs.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                panic!(
                    "`{cmd}` never reached the expected state; last: {}{:?}",
                    last.join(", "),
                    y.items
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until `stats` shows `key: value`.
    pub async fn wait_stat(&mut self, key: &str, value: u64) -> Yaml {
        self.poll_yaml("stats", |y| y.num(key) == value).await
    }

    /// Sends one JSON line and parses the JSON reply line.
    pub async fn json(&mut self, request: &Value) -> Value {
        self.json_raw(&request.to_string()).await
    }

    /// Sends a raw line (which should start with `{`) and parses the reply.
    pub async fn json_raw(&mut self, line: &str) -> Value {
        let reply = self.cmd(line).await;
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("reply {reply:?} is not JSON: {e}"))
    }

    /// Asserts that nothing arrives for `quiet`, and the connection stays open.
    pub async fn expect_silence(&mut self, quiet: Duration) {
        assert!(
            self.stream.buffer().is_empty(),
            "unexpected data already received: {:?}",
            String::from_utf8_lossy(self.stream.buffer())
        );
        match tokio::time::timeout(quiet, self.stream.fill_buf()).await {
            Err(_) => {}
            Ok(Ok([])) => panic!("connection closed; expected silence"),
            Ok(Ok(data)) => panic!("expected silence, got {:?}", String::from_utf8_lossy(data)),
            Ok(Err(e)) => panic!("read error while expecting silence: {e}"),
        }
    }

    /// Asserts that the server closes the connection (after any replies that
    /// are still unread, which are returned).
    pub async fn expect_closed(&mut self) -> Vec<u8> {
        let mut rest = Vec::new();
        tokio::time::timeout(REPLY_TIMEOUT, self.stream.read_to_end(&mut rest))
            .await
            .expect("the server closes the connection")
            .expect("read to end");
        rest
    }
}

/// Whether this is the long run by hand (`DELAYQ_SOAK` set), for the tests
/// that have a bounded CI form and a long one.
pub fn soak() -> bool {
    std::env::var_os("DELAYQ_SOAK").is_some()
}

/// `ci` normally, `soak` in the long run.
pub fn scale<T>(ci: T, soak: T) -> T {
    if self::soak() { soak } else { ci }
}

/// Runs `f` and returns its result with the time it took.
pub async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, Duration) {
    let start = Instant::now();
    let out = f.await;
    (out, start.elapsed())
}

/// Asserts `lo <= took <= hi`, with a message naming `what`.
pub fn assert_between(what: &str, took: Duration, lo: Duration, hi: Duration) {
    assert!(
        took >= lo && took <= hi,
        "{what} took {took:?}, expected between {lo:?} and {hi:?}"
    );
}

/// A body holding every byte value, CR and LF included.
pub fn every_byte() -> Vec<u8> {
    let mut body: Vec<u8> = (0..=255u8).collect();
    body.extend_from_slice(b"\r\n\r\nend\r\n");
    body
}

/// The fallible mode: EOF and resets are results, not panics.
impl Client {
    /// Connects to `addr`; `Gone` if nothing accepts.
    pub async fn try_connect(addr: SocketAddr) -> Io<Client> {
        let stream = tokio::time::timeout(REPLY_TIMEOUT, TcpStream::connect(addr))
            .await
            .expect("connect within the timeout")
            .map_err(|_| Gone)?;
        stream.set_nodelay(true).map_err(|_| Gone)?;
        Ok(Client {
            stream: BufReader::new(stream),
        })
    }

    /// Sends `bytes`; `Gone` if the server closed the connection.
    pub async fn try_send(&mut self, bytes: &[u8]) -> Io<()> {
        self.stream
            .get_mut()
            .write_all(bytes)
            .await
            .map_err(|_| Gone)
    }

    /// The next line; `Gone` if the server closed the connection first.
    pub async fn try_line(&mut self) -> Io<String> {
        let mut buf = Vec::new();
        let n = tokio::time::timeout(FALLIBLE_LIMIT, self.stream.read_until(b'\n', &mut buf))
            .await
            .unwrap_or_else(|_| panic!("no reply within {FALLIBLE_LIMIT:?} (got {buf:?})"))
            .map_err(|_| Gone)?;
        if n == 0 || !buf.ends_with(b"\r\n") {
            return Err(Gone);
        }
        buf.truncate(buf.len() - 2);
        Ok(String::from_utf8(buf).expect("reply line is UTF-8"))
    }

    async fn try_block(&mut self, len: usize) -> Io<Vec<u8>> {
        let mut buf = vec![0; len + 2];
        tokio::time::timeout(FALLIBLE_LIMIT, self.stream.read_exact(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{len} bytes did not arrive within {FALLIBLE_LIMIT:?}"))
            .map_err(|_| Gone)?;
        assert_eq!(&buf[len..], b"\r\n", "data block is followed by CRLF");
        buf.truncate(len);
        Ok(buf)
    }

    /// Sends `line` and reads its one-line reply, or `Gone`.
    pub async fn try_cmd(&mut self, line: &str) -> Io<String> {
        self.try_send(format!("{line}\r\n").as_bytes()).await?;
        self.try_line().await
    }

    /// The id and body of a job whose `RESERVED <id> <bytes>` line was read.
    pub async fn try_job(&mut self, line: &str) -> Io<(String, Vec<u8>)> {
        let (id, len) = line
            .strip_prefix("RESERVED ")
            .and_then(|rest| rest.split_once(' '))
            .unwrap_or_else(|| panic!("expected RESERVED <id> <bytes>, got {line:?}"));
        let len = len.parse().expect("byte count");
        Ok((id.to_string(), self.try_block(len).await?))
    }

    /// Whether the server's storage answers: `stats` needs it, and is
    /// answered `INTERNAL_ERROR` while it is away.
    pub async fn storage_answers(&mut self) -> Io<bool> {
        let line = self.try_cmd("stats").await?;
        if line == "INTERNAL_ERROR" {
            return Ok(false);
        }
        let len = line
            .strip_prefix("OK ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("expected OK <bytes> to stats, got {line:?}"));
        self.try_block(len).await?;
        Ok(true)
    }

    /// `stats`, as a map of its numeric figures.
    pub async fn try_stats(&mut self) -> Io<std::collections::HashMap<String, u64>> {
        let line = self.try_cmd("stats").await?;
        let len = line
            .strip_prefix("OK ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("expected OK <bytes> to stats, got {line:?}"));
        let doc = String::from_utf8(self.try_block(len).await?).expect("YAML is UTF-8");
        Ok(doc
            .lines()
            .filter_map(|l| l.split_once(": "))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect())
    }
}
