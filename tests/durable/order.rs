//! Acknowledged means synced, as the system calls show it: delayq runs
//! under `strace`, and every `INSERTED` it writes to a client must come
//! after an `fdatasync` that finished after the `pwrite` of that job's
//! record. Tried one put at a time, with puts pipelined, with puts and
//! deletes pipelined together (the replies then held until one sync covers
//! them all), and with a put followed by more replies than the write buffer
//! holds. And a connection's pipelined puts keep their order, in ids and in
//! their tube, while the log's files switch under them.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::daemon::{BIN, Daemon, free_port, wait_exit};
use crate::common::{Client, Job, REPLY_TIMEOUT};

/// The job bodies of the puts, in the order they were sent on the one
/// connection; each is a marker that can be found in the traced `pwrite`s.
fn body(kind: &str, n: usize) -> String {
    format!("order-{kind}-{n:04}")
}

#[tokio::test]
async fn every_insert_is_answered_only_after_its_record_is_synced() {
    assert!(
        Command::new("strace").arg("-V").output().is_ok(),
        "this test needs strace (apt-get install strace; .ci/test installs it)"
    );
    let dir = tempfile::tempdir().expect("a data directory");
    let trace = dir.path().join("trace");
    let data = dir.path().join("data");
    let (mut strace, addr) = (0..5)
        .find_map(|_| traced(&trace, &data))
        .expect("delayq kept failing to start under strace");
    let mut c = Client::connect(addr).await;

    let mut sent = Vec::new();
    // One at a time.
    for n in 0..5 {
        let b = body("single", n);
        c.put_ok(0, 0, 60, b.as_bytes()).await;
        sent.push(b);
    }
    // Puts pipelined: one write, then the replies.
    let mut wire = String::new();
    for n in 0..30 {
        let b = body("piped", n);
        wire += &format!("put 0 0 60 {}\r\n{b}\r\n", b.len());
        sent.push(b);
    }
    c.send(wire.as_bytes()).await;
    let mut ids = Vec::new();
    for _ in 0..30 {
        let line = c.line().await;
        let id = line.strip_prefix("INSERTED ").expect("INSERTED");
        ids.push(id.to_string());
    }
    // Deletes and puts pipelined together.
    let mut wire = String::new();
    for (n, id) in ids.iter().enumerate() {
        let b = body("mixed", n);
        wire += &format!("delete {id}\r\nput 0 0 60 {}\r\n{b}\r\n", b.len());
        sent.push(b);
    }
    c.send(wire.as_bytes()).await;
    for _ in &ids {
        assert_eq!(c.line().await, "DELETED");
        assert!(c.line().await.starts_with("INSERTED "));
    }
    // A put followed by enough peeks that their replies outgrow the
    // connection's write buffer: the buffer is written out before the
    // last reply is queued, and that write must wait for the put's sync.
    let big = format!("{}{}", body("big", 0), "x".repeat(1000));
    let mut wire = format!("use big\r\nput 0 0 60 {}\r\n{big}\r\n", big.len());
    for _ in 0..20 {
        wire += "peek-ready\r\n";
    }
    sent.push(body("big", 0));
    c.send(wire.as_bytes()).await;
    assert_eq!(c.line().await, "USING big");
    let inserted = c.line().await;
    let id = inserted.strip_prefix("INSERTED ").expect("INSERTED");
    for _ in 0..20 {
        assert_eq!(c.line().await, format!("FOUND {id} {}", big.len()));
        assert_eq!(
            c.read_exact(big.len() + 2).await,
            format!("{big}\r\n").as_bytes()
        );
    }
    drop(c);
    // delayq is strace's child; stopped, it ends the trace too.
    let children = format!("/proc/{}/task/{}/children", strace.id(), strace.id());
    let delayq: libc::pid_t = std::fs::read_to_string(children)
        .expect("strace's children")
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("delayq's pid");
    // SAFETY: signalling the process this test started (through strace).
    unsafe { libc::kill(delayq, libc::SIGTERM) };
    wait_exit(&mut strace, REPLY_TIMEOUT * 3);

    let trace = std::fs::read_to_string(&trace).expect("the trace");
    let checked = check_order(&trace, &sent);
    assert_eq!(
        checked,
        sent.len(),
        "every put's reply was found in the trace"
    );
}

/// Starts delayq under strace on a free port, and returns once delayq
/// says it listens (its own log, not a connection: another test's server
/// may have taken the port); `None` if it exited first.
fn traced(trace: &Path, data: &Path) -> Option<(Child, SocketAddr)> {
    let port = free_port();
    let mut strace = Command::new("strace")
        .args(["-f", "-qq", "-s", "1048576", "-o"])
        .arg(trace)
        .args(["-e", "trace=pwrite64,fdatasync,write,writev,sendto,sendmsg"])
        .arg(BIN)
        .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-b"])
        .arg(data)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn strace");
    let stderr = strace.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    // Read to the end, so that delayq never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("delayq listening") {
                let _ = tx.send(());
            }
        }
    });
    let limit = Instant::now() + REPLY_TIMEOUT * 3;
    loop {
        if rx.recv_timeout(Duration::from_millis(20)).is_ok() {
            return Some((strace, SocketAddr::from(([127, 0, 0, 1], port))));
        }
        if strace.try_wait().expect("try_wait").is_some() {
            return None;
        }
        assert!(Instant::now() < limit, "delayq never listened under strace");
    }
}

/// Checks, line by line, that each `INSERTED` written to a client follows
/// a finished `fdatasync` that follows the `pwrite` holding the body of the
/// put it answers (the `n`th `INSERTED` answers the `n`th of `sent`).
/// Returns how many replies it checked.
fn check_order(trace: &str, sent: &[String]) -> usize {
    let mut written: HashMap<&str, usize> = HashMap::new();
    let mut last_sync = None;
    let mut replies = 0;
    for (at, line) in trace.lines().enumerate() {
        // After the pid, which strace pads to a width.
        let call = line
            .split_once(' ')
            .map_or(line, |(_, rest)| rest.trim_start());
        if call.starts_with("pwrite64(") {
            for b in sent {
                if call.contains(b.as_str()) {
                    written.entry(b.as_str()).or_insert(at);
                }
            }
        } else if (call.starts_with("fdatasync(") || call.starts_with("<... fdatasync resumed>"))
            && call.trim_end().ends_with("= 0")
        {
            last_sync = Some(at);
        } else if ["write(", "writev(", "sendto(", "sendmsg("]
            .iter()
            .any(|w| call.starts_with(w))
        {
            for _ in 0..call.matches("INSERTED ").count() {
                let b = sent.get(replies).expect("no more INSERTED than puts");
                let record = *written
                    .get(b.as_str())
                    .unwrap_or_else(|| panic!("{b} answered before its record was written"));
                let synced = last_sync.unwrap_or(0);
                assert!(
                    synced > record,
                    "{b}: written at line {record}, answered at line {at}, \
                     with no fdatasync finished in between (last at {synced})"
                );
                replies += 1;
            }
        }
    }
    replies
}

/// A connection's pipelined puts run side by side, and while log files
/// switch under them some wait for room in the next file: they must still
/// get their ids in the order they were sent, and after a crash come out
/// of their tube in that order. (They did not: those that waited were
/// woken in another order, and puts behind them could overtake.)
#[tokio::test]
async fn pipelined_puts_keep_their_order_while_files_switch() {
    const PUTS: usize = 6000;
    const BATCH: usize = 500;
    let dir = tempfile::tempdir().expect("a data directory");
    // Small files, so that a batch's bodies span several switches.
    let mut daemon = Daemon::durable(dir.path(), &["-s", "65536"]).await;
    let mut c = daemon.client().await;
    let body = |n: usize| format!("{n:08}{}", "x".repeat(4000));
    let mut ids = Vec::new();
    for start in (0..PUTS).step_by(BATCH) {
        let mut wire = Vec::new();
        for n in start..start + BATCH {
            let b = body(n);
            wire.extend_from_slice(format!("put 100 0 60 {}\r\n{b}\r\n", b.len()).as_bytes());
        }
        c.send(&wire).await;
        for _ in 0..BATCH {
            let line = c.line().await;
            let id: u64 = line
                .strip_prefix("INSERTED ")
                .and_then(|id| id.parse().ok())
                .unwrap_or_else(|| panic!("a put answered {line:?}"));
            ids.push(id);
        }
    }
    let misplaced: Vec<_> = (1..PUTS).filter(|&n| ids[n] <= ids[n - 1]).collect();
    assert!(
        misplaced.is_empty(),
        "{} puts got an id below the one sent before them, the first at put {:?}",
        misplaced.len(),
        misplaced.first()
    );
    let order = |jobs: Vec<Job>| -> Vec<usize> {
        jobs.iter()
            .map(|j| std::str::from_utf8(&j.body[..8]).unwrap().parse().unwrap())
            .collect()
    };
    let sent: Vec<usize> = (0..PUTS).collect();
    // Taken after a crash, in the order they were sent.
    daemon.kill();
    let daemon = Daemon::durable(dir.path(), &["-s", "65536"]).await;
    let mut c = daemon.client().await;
    assert_eq!(order(crate::reserve_all(&mut c).await), sent);
}
