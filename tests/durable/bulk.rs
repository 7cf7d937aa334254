//! Transitions of many jobs at once, which write more records than the
//! room the keeper prepares ahead (a worker that leaves holding thousands
//! of jobs, their TTRs running out together, a `kick` of thousands): with
//! room on the disk, each is made whole and kept across a restart.

use std::time::{Duration, Instant};

use crate::common::Client;
use crate::common::daemon::Daemon;
use crate::snapshot::stop;

/// Small log files, so that a few thousand records outrun the room.
const FILES: &[&str] = &["-s", "65536"];
const JOBS: usize = 4000;

/// Puts `JOBS` jobs with `options`, pipelined.
async fn put_many(c: &mut Client, ttr: u32, options: &str) {
    put_n(c, JOBS, ttr, options).await;
}

/// Puts `n` (a multiple of 500) jobs with `options`, pipelined.
pub(crate) async fn put_n(c: &mut Client, n: usize, ttr: u32, options: &str) {
    for _ in 0..n / 500 {
        let puts = format!("put 0 0 {ttr} 3 {options}\r\nabc\r\n").repeat(500);
        c.send(puts.as_bytes()).await;
        for _ in 0..500 {
            let line = c.line().await;
            assert!(line.starts_with("INSERTED "), "{line}");
        }
    }
}

/// Reserves every job on a new connection, which it returns.
async fn reserve_every_job(daemon: &Daemon) -> Client {
    reserve_n(daemon, JOBS).await
}

/// Reserves `n` jobs on a new connection, which it returns.
pub(crate) async fn reserve_n(daemon: &Daemon, n: usize) -> Client {
    let mut w = daemon.client().await;
    let mut got = 0;
    while got < n {
        w.send_line("reserve-batch 1000 0").await;
        let line = w.line().await;
        let n: usize = line
            .strip_prefix("RESERVED_BATCH ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        for _ in 0..n {
            let line = w.line().await;
            let bytes: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
            w.read_exact(bytes + 2).await;
        }
        got += n;
    }
    w
}

/// Waits until `stats` counts `n` jobs in `state`.
pub(crate) async fn until_counted(c: &mut Client, state: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = c.stats().await.num(&format!("current-jobs-{state}"));
        if got == n {
            return;
        }
        assert!(Instant::now() < deadline, "{got} jobs {state}, not {n}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks the counts of buried, delayed and ready jobs after a clean stop
/// and a start, then after a SIGKILL and a start.
async fn counted_after_restarts(dir: &std::path::Path, daemon: Daemon, want: (u64, u64, u64)) {
    stop(daemon);
    for restart in ["SIGTERM", "SIGKILL"] {
        let mut daemon = Daemon::durable(dir, FILES).await;
        let mut c = daemon.client().await;
        let stats = c.stats().await;
        let seen = (
            stats.num("current-jobs-buried"),
            stats.num("current-jobs-delayed"),
            stats.num("current-jobs-ready"),
        );
        assert_eq!(seen, want, "(buried, delayed, ready) after {restart}");
        daemon.kill();
    }
}

/// A server on small log files holding `JOBS` dead letters, made by a
/// worker that left holding them on their one try; its directory and a
/// connection.
async fn with_dead_letters() -> (tempfile::TempDir, Daemon, Client) {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), FILES).await;
    let mut c = daemon.client().await;
    put_many(&mut c, 600, "tries=1").await;
    drop(reserve_every_job(&daemon).await);
    until_counted(&mut c, "buried", JOBS as u64).await;
    (dir, daemon, c)
}

/// A worker that leaves holding thousands of jobs on their last try makes
/// them all dead letters, and a restart keeps them buried. It made most of
/// them ready again: the records of the burials beyond the prepared room
/// were skipped, as a reserve's may be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_made_in_bulk_stay_buried_after_a_restart() {
    let (dir, daemon, _c) = with_dead_letters().await;
    counted_after_restarts(dir.path(), daemon, (JOBS as u64, 0, 0)).await;
}

/// The same when their TTRs run out together, and for jobs whose backoff
/// delays them: a restart must not make them ready before it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_in_bulk_keep_their_burials_and_backoffs_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), FILES).await;
    let mut c = daemon.client().await;
    put_many(&mut c, 1, "tries=1").await;
    let w = reserve_every_job(&daemon).await;
    until_counted(&mut c, "buried", JOBS as u64).await;
    drop(w);
    put_many(&mut c, 1, "tries=5 backoff=1h").await;
    let w = reserve_every_job(&daemon).await;
    until_counted(&mut c, "delayed", JOBS as u64).await;
    drop(w);
    counted_after_restarts(dir.path(), daemon, (JOBS as u64, JOBS as u64, 0)).await;
}

/// `kick` of more jobs than the prepared room has records for kicks them
/// all, as beanstalkd and the memory-only engine do: it stopped at the
/// room's end (a reviewer's `kick 200000` answered `KICKED 14888`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kick_of_thousands_kicks_them_all() {
    let (dir, daemon, mut c) = with_dead_letters().await;
    assert_eq!(
        c.cmd(&format!("kick {}", JOBS + 10)).await,
        format!("KICKED {JOBS}")
    );
    counted_after_restarts(dir.path(), daemon, (0, 0, JOBS as u64)).await;
}
