//! redis-server killed under load and restarted on its own data: with
//! `appendfsync always` no acknowledged job may be lost; with `everysec` the
//! test measures what is (the window the README states).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::common::daemon::Daemon;
use crate::common::redis::RedisServer;
use crate::conn::figure;
use crate::ledger::{Ledger, Summary};
use crate::load::{join, named_job, produce, wait_until, work};

/// What a run of [`crash_redis_under_load`] went through.
struct Crashes {
    summary: Summary,
    /// When each crash was dealt.
    at: Vec<Instant>,
    /// `total-jobs` at the end, as delayq reports it.
    total_jobs: u64,
}

/// Two delayq processes on one Redis, each with a producer and a worker;
/// Redis is killed with SIGKILL `crashes` times while they work, stays down
/// for `down` each time, and comes back on its append-only file.
async fn crash_redis_under_load(fsync: &str, crashes: usize, down: Duration) -> Crashes {
    let jobs = 200 * crashes;
    let mut redis = RedisServer::start(&["--appendonly", "yes", "--appendfsync", fsync]);
    let a = Daemon::redis(&redis.url).await;
    let b = Daemon::redis(&redis.url).await;
    let (_tx_a, endpoint_a) = watch::channel(Some(a.addr));
    let (_tx_b, endpoint_b) = watch::channel(Some(b.addr));
    let ledger = Arc::new(Ledger::default());
    let pace = Duration::from_millis(5);
    let mut producers = Vec::new();
    for (name, endpoint, range) in [
        ("producer-a", &endpoint_a, 0..jobs / 2),
        ("producer-b", &endpoint_b, jobs / 2..jobs),
    ] {
        let puts = range.map(|n| named_job(fsync, n, 3)).collect();
        let (endpoint, ledger) = (endpoint.clone(), ledger.clone());
        producers.push(tokio::spawn(async move {
            produce(name, endpoint, ledger, puts, 4, pace).await;
        }));
    }
    let worker_a = tokio::spawn(work("worker-a".into(), endpoint_a, ledger.clone(), 3));
    let worker_b = tokio::spawn(work("worker-b".into(), endpoint_b, ledger.clone(), 3));

    let mut at = Vec::new();
    for k in 1..=crashes {
        let enough = k * jobs / (crashes + 1);
        wait_until("jobs put", Duration::from_secs(30), || {
            ledger.sent_count() >= enough
        })
        .await;
        at.push(Instant::now());
        redis.kill();
        tokio::time::sleep(down).await;
        redis.restart();
    }
    for (i, p) in producers.into_iter().enumerate() {
        join(&format!("producer {i}"), p, &ledger).await;
    }
    ledger.done.store(true, Ordering::SeqCst);
    let stats = join("worker-a", worker_a, &ledger)
        .await
        .expect("worker-a's process lives on");
    join("worker-b", worker_b, &ledger)
        .await
        .expect("worker-b's process lives on");
    let summary = ledger.check_with(false, fsync != "always");
    Crashes {
        summary,
        at,
        total_jobs: figure(&stats, "total-jobs"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_load_with_appendfsync_always_loses_nothing() {
    let started = Instant::now();
    let crashes = crate::scale(2, 10);
    let down = Duration::from_secs(crate::scale(1, 10) as u64);
    let run = crash_redis_under_load("always", crashes, down).await;
    let summary = &run.summary;
    eprintln!(
        "redis-server SIGKILLed {crashes} times under load (appendfsync always, down {down:?} \
         each): {} jobs ledgered, {} lost, {} in doubt; {summary:?} in {:?}",
        summary.acked,
        summary.lost.len(),
        summary.in_doubt,
        started.elapsed()
    );
    assert!(summary.lost.is_empty(), "{summary:?}");
    // The outages were felt: some puts were refused or cut off meanwhile.
    assert!(summary.in_doubt > 0, "no put met a dead Redis: {summary:?}");
    assert_eq!(
        run.total_jobs,
        (summary.acked + summary.in_doubt_stored) as u64,
        "every job stored was acknowledged or in doubt"
    );
}

/// With `appendfsync everysec`, Redis may answer before a write is on disk.
/// A crash of the Redis process alone still loses nothing the kernel was
/// given (only a crash of the host loses what was not yet fsynced), but
/// Redis may hold writes back for up to 2 s while a slow fsync runs. The
/// test measures what a crash of the process costs and checks it against
/// that window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_load_with_appendfsync_everysec_loses_at_most_its_window() {
    const WINDOW: Duration = Duration::from_secs(2);
    let started = Instant::now();
    let crashes = crate::scale(2, 10);
    let run = crash_redis_under_load("everysec", crashes, Duration::from_millis(500)).await;
    let summary = &run.summary;
    let mut oldest_lost = Duration::ZERO;
    for (id, acked) in &summary.lost {
        // The crash that lost it is the first dealt after its acknowledgment.
        let crash =
            run.at.iter().find(|at| *at >= acked).unwrap_or_else(|| {
                panic!("job {id} lost though acknowledged after the last crash")
            });
        let before = *crash - *acked;
        assert!(
            before <= WINDOW,
            "job {id} acknowledged {before:?} before a crash was lost"
        );
        oldest_lost = oldest_lost.max(before);
    }
    eprintln!(
        "redis-server SIGKILLed {crashes} times under load (appendfsync everysec): \
         {} jobs ledgered, {} lost (acknowledged at most {oldest_lost:?} before the crash); \
         {summary:?} in {:?}",
        summary.acked,
        summary.lost.len(),
        started.elapsed()
    );
}
