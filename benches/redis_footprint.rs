//! What a delayed backlog costs on the Redis engine: Redis bytes per job, put
//! rate, and what delayq and Redis do while the backlog just waits.
//!
//! ```text
//! cargo bench --bench redis_footprint
//! cargo bench --bench redis_footprint -- --jobs 200000 --idle-secs 20
//! cargo bench --bench redis_footprint -- --redis-opt "hash-max-listpack-entries 512"
//! ```
//!
//! The bench starts its own `redis-server` (Unix socket only, in a temporary
//! directory, no persistence), runs delayq in this process on 127.0.0.1:0 on
//! the Redis engine, and talks to it over TCP like any client:
//!
//! 1. `backlog`: N jobs (default 100 000) with 100-byte bodies and delays
//!    spread over 1–3600 s, written pipelined in chunks; Redis `used_memory`
//!    before and after gives bytes per job. The same for 10 000 ready jobs.
//! 2. `idle`: with the backlog in place and no client traffic, the commands
//!    Redis runs and the CPU this process (that is, delayq: the bench only
//!    sleeps) uses over 10 s.
//! 3. `keys`: `MEMORY USAGE`, type, size and encoding of every delayq key.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use delayq::config::Config;
use delayq::server::{Control, run};
use delayq::store::redis::RedisStore;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// delayq's key prefix; the keys are `{delayq:}...`.
const PREFIX: &str = "delayq:";
const BODY_LEN: usize = 100;
/// Tube of the delayed backlog.
const BACKLOG_TUBE: &str = "backlog";
/// Tube of the ready set.
const READY_TUBE: &str = "ready-set";
/// The longest any one reply may take before the bench gives up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
const USAGE: &str = "usage: cargo bench --bench redis_footprint -- [--jobs N] [--ready N] \
                     [--idle-secs S] [--chunk K] [--conns C] [--redis-opt 'name value']...";

struct Args {
    /// Delayed jobs in the backlog.
    jobs: u64,
    /// Ready (delay 0) jobs in the second set.
    ready: u64,
    /// Length of the idle window.
    idle: Duration,
    /// Puts written before their replies are read.
    chunk: u64,
    /// Client connections the puts are shared among.
    conns: u64,
    /// Extra `redis-server` directives, each as `--name value...`.
    redis_opts: Vec<String>,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let mut args = Args {
            jobs: 100_000,
            ready: 10_000,
            idle: Duration::from_secs(10),
            chunk: 1000,
            conns: 1,
            redis_opts: Vec::new(),
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            // `cargo bench` passes `--bench` to every harness-less bench.
            if flag == "--bench" {
                continue;
            }
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            let mut number = |min: u64| -> Result<u64, String> {
                let v = value()?;
                match v.replace('_', "").parse::<u64>() {
                    Ok(n) if n >= min => Ok(n),
                    _ => Err(format!(
                        "{flag}: expected a whole number >= {min}, got {v:?}"
                    )),
                }
            };
            match flag.as_str() {
                "--jobs" => args.jobs = number(1)?,
                "--ready" => args.ready = number(0)?,
                "--idle-secs" => args.idle = Duration::from_secs(number(1)?),
                "--chunk" => args.chunk = number(1)?,
                "--conns" => args.conns = number(1)?,
                "--redis-opt" => {
                    let v = value()?;
                    let mut words = v.split_whitespace();
                    let name = words.next().ok_or("--redis-opt needs 'name value'")?;
                    args.redis_opts
                        .push(format!("--{}", name.trim_start_matches('-')));
                    args.redis_opts.extend(words.map(str::to_owned));
                }
                "-h" | "--help" => return Err(USAGE.to_owned()),
                _ => return Err(format!("unknown argument {flag:?}\n{USAGE}")),
            }
        }
        Ok(args)
    }
}

/// A private `redis-server`, killed and its directory removed on drop.
struct RedisServer {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl RedisServer {
    fn start(extra: &[String]) -> RedisServer {
        let dir = std::env::temp_dir().join(format!("delayq-bench-{}", std::process::id()));
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
            .unwrap_or_else(|e| panic!("cannot start redis-server ({e}); is it installed?"));
        let server = RedisServer {
            child,
            url: format!("redis+unix://{}", socket.display()),
            dir,
        };
        server.wait_ready(&socket);
        server
    }

    fn wait_ready(&self, socket: &Path) {
        use std::io::{Read, Write};
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) {
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

/// One `INFO` reply as `field -> value`.
struct Info(Vec<(String, String)>);

impl Info {
    async fn read(redis: &mut MultiplexedConnection, sections: &[&str]) -> Info {
        let text: String = redis::cmd("INFO")
            .arg(sections)
            .query_async(redis)
            .await
            .expect("INFO");
        Info(
            text.lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
                .collect(),
        )
    }

    fn get(&self, field: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == field)
            .map_or_else(|| panic!("INFO has no {field}"), |(_, v)| v.as_str())
    }

    fn num(&self, field: &str) -> f64 {
        self.get(field).parse().expect("a number in INFO")
    }

    /// `cmdstat_<name>` calls, from the `commandstats` section.
    fn command_calls(&self) -> Vec<(String, u64)> {
        self.0
            .iter()
            .filter_map(|(k, v)| {
                let name = k.strip_prefix("cmdstat_")?;
                let calls = v.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
                Some((name.to_owned(), calls.parse().ok()?))
            })
            .collect()
    }
}

async fn used_memory(redis: &mut MultiplexedConnection) -> i64 {
    Info::read(redis, &["memory"]).await.num("used_memory") as i64
}

/// User plus system CPU time of this whole process so far.
fn process_cpu() -> Duration {
    // SAFETY: `rusage` is plain data, so all-zero is a valid value, and
    // getrusage only writes through the pointer it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage failed");
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A beanstalkd client connection that has `use`d one tube.
struct Client {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    line: String,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr, tube: &str) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect to delayq");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let (r, w) = stream.into_split();
        let mut client = Client {
            reader: BufReader::with_capacity(1 << 16, r),
            writer: w,
            line: String::new(),
        };
        client
            .writer
            .write_all(format!("use {tube}\r\n").as_bytes())
            .await
            .expect("write use");
        let reply = client.reply().await;
        assert_eq!(reply, format!("USING {tube}"), "reply to use");
        client
    }

    async fn reply(&mut self) -> String {
        self.line.clear();
        let n = tokio::time::timeout(REPLY_TIMEOUT, self.reader.read_line(&mut self.line))
            .await
            .expect("no reply from delayq within the timeout")
            .expect("read a reply");
        assert!(n > 0, "delayq closed the connection");
        self.line.trim_end().to_owned()
    }

    /// Puts `count` jobs, `chunk` at a time written before any reply is read;
    /// `delay(i)` is job i's delay in seconds. Panics on any reply other than
    /// `INSERTED`.
    async fn put_all(&mut self, first: u64, count: u64, chunk: u64, delay: impl Fn(u64) -> u64) {
        let mut buf = Vec::with_capacity(chunk as usize * (BODY_LEN + 32));
        let mut i = first;
        let end = first + count;
        while i < end {
            let n = chunk.min(end - i);
            buf.clear();
            for j in i..i + n {
                buf.extend_from_slice(
                    format!("put 1024 {} 60 {BODY_LEN}\r\n", delay(j)).as_bytes(),
                );
                buf.extend_from_slice(&body(j));
                buf.extend_from_slice(b"\r\n");
            }
            self.writer.write_all(&buf).await.expect("write puts");
            for _ in 0..n {
                let reply = self.reply().await;
                assert!(reply.starts_with("INSERTED "), "put answered {reply:?}");
            }
            i += n;
        }
    }
}

/// A 100-byte body that differs from job to job.
fn body(i: u64) -> [u8; BODY_LEN] {
    let mut b = [b'.'; BODY_LEN];
    let tag = format!("job-{i:012}-");
    b[..tag.len()].copy_from_slice(tag.as_bytes());
    b
}

/// Job i's delay: 1..=3600 s, scattered (a fixed LCG, so runs compare).
fn backlog_delay(i: u64) -> u64 {
    let x = i
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    1 + (x >> 33) % 3600
}

/// Puts `count` jobs over `conns` connections to `tube`; returns the jobs/s.
async fn put_set(
    addr: std::net::SocketAddr,
    tube: &str,
    count: u64,
    args: &Args,
    delay: fn(u64) -> u64,
) -> f64 {
    let mut clients = Vec::new();
    for _ in 0..args.conns {
        clients.push(Client::connect(addr, tube).await);
    }
    let share = count.div_ceil(args.conns);
    let chunk = args.chunk;
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, mut client)| {
            let first = c as u64 * share;
            let n = share.min(count.saturating_sub(first));
            tokio::spawn(async move { client.put_all(first, n, chunk, delay).await })
        })
        .collect();
    for task in tasks {
        task.await.expect("a put task panicked");
    }
    count as f64 / started.elapsed().as_secs_f64()
}

struct SetFootprint {
    jobs: u64,
    rate: f64,
    bytes: i64,
}

impl SetFootprint {
    fn per_job(&self) -> f64 {
        self.bytes as f64 / self.jobs as f64
    }

    fn print(&self, what: &str) {
        println!(
            "  {what}: {} jobs, {:.0} puts/s, Redis +{} bytes = {:.1} bytes/job, \
             overhead {:.1} bytes/job beyond the {BODY_LEN}-byte body",
            self.jobs,
            self.rate,
            self.bytes,
            self.per_job(),
            self.per_job() - BODY_LEN as f64,
        );
    }
}

struct Idle {
    secs: f64,
    /// Every command Redis ran, including those run inside scripts (as
    /// `total_commands_processed` counts them).
    commands: u64,
    /// Script calls (`EVALSHA` and kin): one per delayq store operation.
    scripts: u64,
    by_command: Vec<(String, u64)>,
    delayq_cpu: Duration,
    redis_cpu: f64,
    became_ready: i64,
}

async fn zcard(redis: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(redis)
        .await
        .expect("ZCARD")
}

async fn measure_idle(redis: &mut MultiplexedConnection, window: Duration) -> Idle {
    let ready_key = format!("{{{PREFIX}}}ready:{BACKLOG_TUBE}");
    let ready_before = zcard(redis, &ready_key).await;
    // Everything the bench itself sends lies outside the window except the
    // first INFO, which the second one counts: INFO is left out below.
    let before = Info::read(redis, &["stats", "commandstats", "cpu"]).await;
    let cpu_before = process_cpu();
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let cpu_after = process_cpu();
    let secs = started.elapsed().as_secs_f64();
    let after = Info::read(redis, &["stats", "commandstats", "cpu"]).await;
    let ready_after = zcard(redis, &ready_key).await;

    let old = before.command_calls();
    let mut by_command: Vec<(String, u64)> = after
        .command_calls()
        .into_iter()
        .filter(|(name, _)| name != "info")
        .map(|(name, calls)| {
            let was = old.iter().find(|(n, _)| *n == name).map_or(0, |(_, c)| *c);
            (name, calls - was)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    by_command.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let commands = by_command.iter().map(|(_, n)| n).sum();
    let total = after.num("total_commands_processed") - before.num("total_commands_processed");
    // The one INFO in the window is the only command of ours it counts.
    if commands + 1 != total as u64 {
        println!("  (note: total_commands_processed grew by {total}, commandstats by {commands})");
    }
    let redis_cpu = |i: &Info| i.num("used_cpu_user") + i.num("used_cpu_sys");
    Idle {
        secs,
        commands,
        scripts: by_command
            .iter()
            .filter(|(name, _)| {
                ["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"].contains(&name.as_str())
            })
            .map(|(_, n)| n)
            .sum(),
        by_command,
        delayq_cpu: cpu_after - cpu_before,
        redis_cpu: redis_cpu(&after) - redis_cpu(&before),
        became_ready: ready_after - ready_before,
    }
}

/// Every key under the prefix with its type, size, encoding and memory.
async fn print_keys(redis: &mut MultiplexedConnection) {
    let mut keys: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{{{PREFIX}}}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(redis)
            .await
            .expect("SCAN");
        keys.extend(batch);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let mut rows = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(redis)
            .await
            .expect("TYPE");
        let size_cmd = match kind.as_str() {
            "hash" => Some("HLEN"),
            "zset" => Some("ZCARD"),
            "set" => Some("SCARD"),
            _ => None,
        };
        let size: i64 = match size_cmd {
            Some(c) => redis::cmd(c)
                .arg(&key)
                .query_async(redis)
                .await
                .expect("size"),
            None => 1,
        };
        let encoding: Option<String> = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(&key)
            .query_async(redis)
            .await
            .expect("OBJECT ENCODING");
        // SAMPLES 0: every element, so the big hashes are counted exactly.
        let bytes: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(redis)
            .await
            .expect("MEMORY USAGE");
        // Delay buckets come and go as their jobs fall due; skip one that
        // went between the listing and these calls.
        if let (Some(encoding), Some(bytes)) = (encoding, bytes) {
            rows.push((key, kind, size, encoding, bytes));
        }
    }
    rows.sort_by(|a, b| b.4.cmp(&a.4).then_with(|| a.0.cmp(&b.0)));
    let total: i64 = rows.iter().map(|r| r.4).sum();
    println!(
        "  {:<28} {:<5} {:>8} {:<10} {:>12} {:>9}",
        "key", "type", "size", "encoding", "MEMORY USAGE", "per entry"
    );
    for (key, kind, size, encoding, bytes) in &rows {
        println!(
            "  {key:<28} {kind:<5} {size:>8} {encoding:<10} {bytes:>12} {:>9.1}",
            *bytes as f64 / (*size).max(1) as f64
        );
    }
    println!(
        "  {:<28} {:<5} {:>8} {:<10} {total:>12}",
        "(sum)", "", "", ""
    );
    let keyspace = Info::read(redis, &["keyspace"]).await;
    for (db, v) in &keyspace.0 {
        println!("  INFO keyspace {db}: {v}");
    }
    let config: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("*-max-listpack-*")
        .query_async(redis)
        .await
        .expect("CONFIG GET");
    let settings: Vec<String> = config.chunks(2).map(|kv| kv.join(" ")).collect();
    println!("  {}", settings.join(", "));
}

async fn bench(args: Args) {
    let server = RedisServer::start(&args.redis_opts);
    let client = redis::Client::open(server.url.as_str()).expect("redis URL");
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the bench's redis-server");
    let store = RedisStore::connect(&server.url, PREFIX)
        .await
        .expect("delayq connects to the bench's redis-server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let control = Control::default();
    let delayq = tokio::spawn(run(listener, store, Config::default(), control.clone()));

    println!(
        "redis_footprint: {} delayed + {} ready jobs, {BODY_LEN}-byte bodies, \
         chunks of {}, {} connection(s){}",
        args.jobs,
        args.ready,
        args.chunk,
        args.conns,
        if args.redis_opts.is_empty() {
            String::new()
        } else {
            format!(", redis-server {}", args.redis_opts.join(" "))
        }
    );

    // Warm up: have Redis load the put and delete scripts, so the baseline
    // already holds its script cache.
    for tube in [BACKLOG_TUBE, READY_TUBE] {
        let mut c = Client::connect(addr, tube).await;
        let mut put = format!("put 1024 0 60 {BODY_LEN}\r\n").into_bytes();
        put.extend_from_slice(&body(0));
        put.extend_from_slice(b"\r\n");
        c.writer.write_all(&put).await.expect("write put");
        let inserted = c.reply().await;
        let id = inserted
            .strip_prefix("INSERTED ")
            .unwrap_or_else(|| panic!("put answered {inserted:?}"));
        c.writer
            .write_all(format!("delete {id}\r\n").as_bytes())
            .await
            .expect("write delete");
        assert_eq!(c.reply().await, "DELETED");
    }
    // Let the warm-up connections' closing reach Redis.
    tokio::time::sleep(Duration::from_millis(200)).await;

    println!("\nbacklog");
    let base = used_memory(&mut redis).await;
    let rate = put_set(addr, BACKLOG_TUBE, args.jobs, &args, backlog_delay).await;
    let after_delayed = used_memory(&mut redis).await;
    let delayed = SetFootprint {
        jobs: args.jobs,
        rate,
        bytes: after_delayed - base,
    };
    delayed.print("delayed (1-3600 s)");
    let ready = if args.ready > 0 {
        let rate = put_set(addr, READY_TUBE, args.ready, &args, |_| 0).await;
        let after_ready = used_memory(&mut redis).await;
        let ready = SetFootprint {
            jobs: args.ready,
            rate,
            bytes: after_ready - after_delayed,
        };
        ready.print("ready (delay 0)");
        Some(ready)
    } else {
        None
    };

    println!(
        "\nidle: {:.0} s with the backlog in place, no client traffic",
        args.idle.as_secs_f64()
    );
    let idle = measure_idle(&mut redis, args.idle).await;
    let shown: Vec<String> = idle
        .by_command
        .iter()
        .map(|(name, n)| format!("{name} {:.1}/s", *n as f64 / idle.secs))
        .collect();
    println!(
        "  Redis ran {} commands ({:.1}/s) counting those inside scripts; \
         {} script calls ({:.1}/s)",
        idle.commands,
        idle.commands as f64 / idle.secs,
        idle.scripts,
        idle.scripts as f64 / idle.secs
    );
    println!("  by command: {}", shown.join(", "));
    println!(
        "  {} backlog jobs fell due and became ready meanwhile",
        idle.became_ready
    );
    let delayq_cpu = 100.0 * idle.delayq_cpu.as_secs_f64() / idle.secs;
    let redis_cpu = 100.0 * idle.redis_cpu / idle.secs;
    println!(
        "  delayq CPU {:.3} s = {delayq_cpu:.2}% of one core; redis-server CPU {:.3} s = \
         {redis_cpu:.2}% of one core",
        idle.delayq_cpu.as_secs_f64(),
        idle.redis_cpu
    );

    println!("\nkeys (after the idle window)");
    print_keys(&mut redis).await;
    let mem = Info::read(&mut redis, &["memory"]).await;
    println!(
        "  used_memory {}, used_memory_dataset {}, used_memory_rss {}, used_memory_scripts {}",
        mem.get("used_memory"),
        mem.get("used_memory_dataset"),
        mem.get("used_memory_rss"),
        mem.get("used_memory_scripts"),
    );

    println!("\nsummary");
    println!(
        "  {:<26} {:>10} {:>12} {:>14} {:>14}",
        "set", "jobs", "puts/s", "Redis B/job", "overhead B/job"
    );
    let mut sets = vec![("delayed backlog", &delayed)];
    if let Some(r) = &ready {
        sets.push(("ready set", r));
    }
    for (name, s) in sets {
        println!(
            "  {name:<26} {:>10} {:>12.0} {:>14.1} {:>14.1}",
            s.jobs,
            s.rate,
            s.per_job(),
            s.per_job() - BODY_LEN as f64
        );
    }
    println!(
        "  {:<26} {:.1} Redis commands/s ({:.1} script calls/s), delayq CPU {delayq_cpu:.2}%, \
         redis-server CPU {redis_cpu:.2}%",
        "idle backlog",
        idle.commands as f64 / idle.secs,
        idle.scripts as f64 / idle.secs,
    );

    control.shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), delayq).await;
    drop(redis);
    drop(server);
}

fn main() {
    let args = match Args::parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(bench(args));
}
