//! The `delayq` binary itself: flags, start-up refusals, signals.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{BIN, Daemon, finish_piped, free_port, spawn_piped};
use common::redis::RedisServer;

/// Runs the binary to its exit, which must come within the reply timeout.
fn run_to_exit(args: &[&str]) -> Output {
    finish_piped(spawn_piped(args))
}

#[test]
fn help_lists_the_flags() {
    for help in ["--help", "-h"] {
        let out = run_to_exit(&[help]);
        assert!(out.status.success(), "{help}: {:?}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        for flag in ["-l", "-p", "-z", "--redis", "--version", "--help"] {
            assert!(
                text.contains(flag),
                "{help} does not mention {flag}:\n{text}"
            );
        }
    }
}

#[test]
fn version_prints_the_crate_version() {
    for flag in ["--version", "-V"] {
        let out = run_to_exit(&[flag]);
        assert!(out.status.success(), "{flag}: {:?}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.trim(),
            format!("delayq {}", env!("CARGO_PKG_VERSION")),
            "{flag}"
        );
    }
}

#[test]
fn unreachable_redis_is_refused_at_start() {
    // Port 0: a port picked free beforehand was taken by another test
    // before this server could listen on it (a CI run), and the start
    // failed on that instead. Nothing listens on port 1 of loopback.
    let out = run_to_exit(&["--redis", "redis://127.0.0.1:1/", "-p", "0"]);
    assert!(!out.status.success(), "{:?}", out.status);
    let text = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        text.contains("cannot connect to redis"),
        "start-up error does not name Redis:\n{text}"
    );
}

#[test]
fn braces_in_the_redis_prefix_are_refused() {
    let out = run_to_exit(&[
        "--redis",
        "redis://127.0.0.1:1/",
        "--redis-prefix",
        "a{b}",
        "-p",
        "0",
    ]);
    assert!(!out.status.success(), "{:?}", out.status);
    assert!(String::from_utf8_lossy(&out.stderr).contains("braces"));
}

#[tokio::test]
async fn jobs_survive_a_restart_on_redis() {
    let redis = RedisServer::start(&[]);
    let mut first = Daemon::redis(&redis.url).await;
    let mut c = first.client().await;
    assert_eq!(c.put(5, 0, 60, b"ready").await, "INSERTED 1");
    assert_eq!(c.put(0, 1, 60, b"later").await, "INSERTED 2");
    assert_eq!(
        c.put_id(0, 0, 60, b"mine", "order-close:4711").await,
        "INSERTED order-close:4711"
    );
    drop(c);
    first.signal(libc::SIGTERM);
    assert!(first.wait_exit().success());

    let second = Daemon::redis(&redis.url).await;
    let mut c = second.client().await;
    let mut got = Vec::new();
    for _ in 0..3 {
        let job = c.reserved("reserve-with-timeout 5").await;
        got.push((job.id, String::from_utf8(job.body).unwrap()));
    }
    got.sort();
    let expected = [("1", "ready"), ("2", "later"), ("order-close:4711", "mine")];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(got, expected);
    // Server ids go on from where the first process left them.
    assert_eq!(c.put(0, 0, 60, b"next").await, "INSERTED 4");
}

#[tokio::test]
async fn a_job_put_on_one_process_reaches_a_worker_blocked_on_another() {
    let redis = RedisServer::start(&[]);
    let a = Daemon::redis(&redis.url).await;
    let b = Daemon::redis(&redis.url).await;
    let mut worker = b.client().await;
    let mut watcher = b.client().await;
    worker.send_line("reserve").await;
    watcher.wait_stat("current-waiting", 1).await;
    let mut producer = a.client().await;
    let put_at = Instant::now();
    assert_eq!(producer.put(0, 0, 60, b"across").await, "INSERTED 1");
    let line = worker.line().await;
    assert_eq!(worker.job_after("RESERVED", &line).await.body, b"across");
    assert!(
        put_at.elapsed() < Duration::from_secs(1),
        "{:?}",
        put_at.elapsed()
    );
}

#[tokio::test]
async fn a_delayed_job_of_a_killed_process_is_delivered_by_another() {
    const JOBS: u32 = 5;
    let redis = RedisServer::start(&[]);
    let mut a = Daemon::redis(&redis.url).await;
    let b = Daemon::redis(&redis.url).await;
    let mut workers = Vec::new();
    for _ in 0..JOBS {
        let mut worker = b.client().await;
        worker.send_line("reserve-with-timeout 10").await;
        workers.push(worker);
    }
    b.client()
        .await
        .wait_stat("current-waiting", u64::from(JOBS))
        .await;
    // One-second delays, put over a second: whatever the phase of B's own
    // once-a-second tick, some job falls due before B's next tick would
    // have seen it.
    let mut producer = a.client().await;
    let mut due = Vec::new();
    for k in 0..JOBS {
        due.push(Instant::now() + Duration::from_secs(1));
        assert_eq!(
            producer.put(0, 1, 60, b"orphan").await,
            format!("INSERTED {}", k + 1)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    a.signal(libc::SIGKILL);
    a.wait_exit();
    // B learns each due time when A puts the job (pub/sub) or at its own
    // next tick, a second at most later and so before the job falls due:
    // each is delivered on time; waiters are served in order.
    for (k, worker) in workers.iter_mut().enumerate() {
        let line = worker.line().await;
        let got = Instant::now();
        assert_eq!(line, format!("RESERVED {} 6", k + 1));
        let late = got.saturating_duration_since(due[k]);
        assert!(
            got + Duration::from_millis(100) >= due[k],
            "job {k} came early"
        );
        assert!(
            late < Duration::from_millis(400),
            "job {k} came {late:?} late"
        );
        assert_eq!(worker.read_exact(8).await, b"orphan\r\n");
    }
}

#[test]
fn bad_flags_are_refused() {
    // Each names a free port, so a flag wrongly accepted cannot collide.
    let port = free_port().to_string();
    for args in [
        &["-p", "notaport"][..],
        &["--no-such-flag", "-p", &port],
        &["-z", "-1", "-p", &port],
        &["-p", "70000"],
    ] {
        let out = run_to_exit(args);
        assert!(!out.status.success(), "{args:?}: {:?}", out.status);
    }
}

#[tokio::test]
async fn put_reserve_delete_round_trip() {
    let daemon = Daemon::start(&[]).await;
    let mut c = daemon.client().await;
    assert_eq!(c.put(0, 0, 60, b"hello").await, "INSERTED 1");
    let job = c.reserve_body().await;
    assert_eq!((job.id.as_str(), &job.body[..]), ("1", &b"hello"[..]));
    assert_eq!(c.cmd("delete 1").await, "DELETED");
    let s = c.stats().await;
    assert_eq!(
        s.get("version"),
        format!("\"{}\"", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(s.num("max-job-size"), 65_535);
    assert_eq!(s.num("pid"), u64::from(daemon.child.id()));
}

#[tokio::test]
async fn sigterm_exits_cleanly_with_a_client_blocked_in_reserve() {
    let mut daemon = Daemon::start(&[]).await;
    let mut blocked = daemon.client().await;
    let mut idle = daemon.client().await;
    blocked.send_line("reserve").await;
    idle.wait_stat("current-waiting", 1).await;
    let stopped_at = Instant::now();
    daemon.signal(libc::SIGTERM);
    let status = daemon.wait_exit();
    assert!(status.success(), "exit status after SIGTERM: {status}");
    assert!(stopped_at.elapsed() < Duration::from_secs(3));
    assert!(blocked.expect_closed().await.is_empty());
    assert!(idle.expect_closed().await.is_empty());
}

#[tokio::test]
async fn sigint_exits_cleanly() {
    let mut daemon = Daemon::start(&[]).await;
    let mut c = daemon.client().await;
    c.ping().await;
    daemon.signal(libc::SIGINT);
    let status = daemon.wait_exit();
    assert!(status.success(), "exit status after SIGINT: {status}");
}

#[tokio::test]
async fn sigusr1_starts_draining() {
    let mut daemon = Daemon::start(&[]).await;
    let mut c = daemon.client().await;
    assert_eq!(c.put(0, 0, 60, b"before").await, "INSERTED 1");
    daemon.signal(libc::SIGUSR1);
    c.poll_yaml("stats", |y| y.get("draining") == "true").await;
    assert_eq!(c.put(0, 0, 60, b"after").await, "DRAINING");
    // Still serving what it has, and still running.
    assert_eq!(c.reserve_body().await.body, b"before");
    assert_eq!(c.cmd("delete 1").await, "DELETED");
    assert!(daemon.child.try_wait().unwrap().is_none());
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait_exit().success());
}

#[tokio::test]
async fn z_flag_limits_the_job_size() {
    let daemon = Daemon::start(&["-z", "10"]).await;
    let mut c = daemon.client().await;
    assert_eq!(c.stats().await.num("max-job-size"), 10);
    assert_eq!(c.put(0, 0, 60, b"01234567890").await, "JOB_TOO_BIG");
    assert_eq!(c.put(0, 0, 60, b"0123456789").await, "INSERTED 1");
    assert_eq!(c.reserve_body().await.body, b"0123456789");
}

#[tokio::test]
async fn z_flag_is_capped_at_beanstalkds_ceiling() {
    // Memory-only: the durable engine sizes its log files to hold the
    // largest job, so at the ceiling it writes two 1 GiB files of zeros
    // at start, which on a busy disk held this `stats` past its 5 s.
    let daemon = Daemon::start(&["-z", "2000000000", "--in-memory"]).await;
    let mut c = daemon.client().await;
    assert_eq!(c.stats().await.num("max-job-size"), 1_073_741_824);
}

#[tokio::test]
async fn max_connections_flag_limits_the_connections() {
    let daemon = Daemon::start(&["--max-connections", "2"]).await;
    let mut a = daemon.client().await;
    // The start-up probe's connection may not be let go of yet.
    a.wait_stat("current-connections", 1).await;
    let mut b = daemon.client().await;
    b.ping().await;
    let mut c = daemon.client().await;
    assert_eq!(c.line().await, "TOO_MANY_CONNECTIONS");
    assert_eq!(c.expect_closed().await, b"");
    a.ping().await;
}

/// An evicting Redis loses jobs when full: delayq must say so loudly at
/// start, and must not with `noeviction`.
#[test]
fn an_evicting_redis_is_warned_about_at_start() {
    use std::io::{BufRead, BufReader};
    for (policy, warned) in [("allkeys-lru", true), ("noeviction", false)] {
        let redis = RedisServer::start(&["--maxmemory-policy", policy]);
        let mut child = Command::new(BIN)
            .args(["-p", "0", "--redis", &redis.url])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn delayq");
        let stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
        let mut before_listening = String::new();
        let mut listening = false;
        for line in stderr.lines() {
            let line = line.expect("read delayq's log");
            if line.contains("listening") {
                listening = true;
                break;
            }
            before_listening.push_str(&line);
            before_listening.push('\n');
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(listening, "delayq never started:\n{before_listening}");
        assert_eq!(
            before_listening.contains("REDIS MAY EVICT KEYS"),
            warned,
            "policy {policy}, log before listening:\n{before_listening}"
        );
    }
}
