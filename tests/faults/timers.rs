//! Several processes whose timers race over the same jobs.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::common::daemon::Daemon;
use crate::common::redis::RedisServer;
use crate::conn::figure;
use crate::ledger::Ledger;
use crate::load::{job, join, produce, work};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_timers_deliver_each_job_exactly_once() {
    // 3000 keeps CI quick; the soak run (or DELAYQ_TIMER_JOBS=30000) is
    // 10k per process.
    let jobs_wanted = std::env::var("DELAYQ_TIMER_JOBS").ok();
    let jobs_wanted = jobs_wanted.and_then(|n| n.parse().ok());
    let jobs_count: usize = jobs_wanted.unwrap_or(crate::scale(3000, 30_000));
    let started = Instant::now();
    let redis = RedisServer::start(&[]);
    let mut daemons = Vec::new();
    for _ in 0..3 {
        daemons.push(Daemon::redis(&redis.url).await);
    }
    let ledger = Arc::new(Ledger::default());
    let mut senders = Vec::new();
    let mut workers = Vec::new();
    for (p, daemon) in daemons.iter().enumerate() {
        let (tx, endpoint) = watch::channel(Some(daemon.addr));
        senders.push(tx);
        for w in 0..2 {
            let name = format!("worker-{p}.{w}");
            workers.push(tokio::spawn(work(
                name,
                endpoint.clone(),
                ledger.clone(),
                0,
            )));
        }
    }
    let jobs = (0..jobs_count).map(|n| job("timers", n, 30)).collect();
    let endpoint = senders[0].subscribe();
    produce(
        "producer",
        endpoint,
        ledger.clone(),
        jobs,
        100,
        Duration::ZERO,
    )
    .await;
    ledger.done.store(true, Ordering::SeqCst);
    let mut stats = None;
    for (i, w) in workers.into_iter().enumerate() {
        stats = join(&format!("worker {i}"), w, &ledger).await;
    }
    let stats = stats.expect("no process was killed");

    let summary = ledger.check(true);
    eprintln!(
        "three timers racing: {} jobs ledgered, {} lost, {} delivered twice; {summary:?} in {:?}",
        summary.acked,
        summary.lost.len(),
        summary.redelivered,
        started.elapsed()
    );
    assert_eq!(summary.acked, jobs_count, "{summary:?}");
    assert_eq!(summary.deliveries, jobs_count, "{summary:?}");
    assert_eq!(summary.redelivered, 0, "{summary:?}");
    assert_eq!(figure(&stats, "total-jobs"), jobs_count as u64);
    assert_eq!(figure(&stats, "job-timeouts"), 0);
    for p in 0..3 {
        let got: usize = (0..2)
            .map(|w| summary.per_worker.get(&format!("worker-{p}.{w}")))
            .map(|n| n.copied().unwrap_or(0))
            .sum();
        assert!(got > 0, "process {p}'s workers got nothing: {summary:?}");
    }
}
