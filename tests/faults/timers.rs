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

/// Members of the `taken` sets (client ids whose unique window has not
/// been freed) under `prefix`: one set on one Redis, one per shard on a
/// cluster.
async fn taken_ids(redis: &str, cluster: bool, prefix: &str) -> u64 {
    if !cluster {
        let client = redis::Client::open(redis).expect("a Redis URL");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("Redis answers");
        let key = format!("{{{prefix}}}taken");
        return redis::cmd("ZCARD")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("ZCARD");
    }
    let seeds: Vec<&str> = redis.split(',').collect();
    let client = redis::cluster::ClusterClient::new(seeds).expect("cluster seeds");
    let mut conn = client
        .get_async_connection()
        .await
        .expect("the cluster answers");
    let mut n = 0;
    for k in 0..delayq::store::redis::SHARDS {
        let key = format!("{}taken", delayq::store::redis::shard_tag(prefix, k));
        let got: u64 = redis::cmd("ZCARD")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("ZCARD");
        n += got;
    }
    n
}

/// The client ids of deleted jobs stay taken while their unique window
/// lasts; once it has ended they are freed by the timer, within a second
/// or two, even with nothing else due (on Redis they were freed only
/// while something else fell due, 250 a second; on a cluster, never in a
/// shard with nothing else due; the embedded engines have a unit test).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ended_unique_windows_are_freed_with_nothing_else_due() {
    const JOBS: usize = 2000;
    let single = RedisServer::start(&[]);
    let seeds = crate::common::cluster::RedisCluster::shared();
    let prefix = crate::common::cluster::unique_prefix();
    for (redis, cluster) in [(single.url.as_str(), false), (seeds, true)] {
        let daemon = if cluster {
            Daemon::start(&["--redis-cluster", redis, "--redis-prefix", &prefix]).await
        } else {
            Daemon::start(&["--redis", redis, "--redis-prefix", &prefix]).await
        };
        let mut c = daemon.client().await;
        for n in 0..JOBS {
            let put = format!("put 0 0 60 1 once:{n} unique=15s\r\nx");
            assert_eq!(c.cmd(&put).await, format!("INSERTED once:{n}"));
            assert_eq!(c.cmd(&format!("delete once:{n}")).await, "DELETED");
        }
        let taken = taken_ids(redis, cluster, &prefix).await;
        assert_eq!(
            taken, JOBS as u64,
            "cluster {cluster}: each id taken for its window"
        );
        // The last id's window holds: it began a moment ago. (Windows are
        // long, as every one must still hold once the 2,000 puts and
        // deletes are done: a CI run on a loaded machine took longer than
        // 3 s for them, and another longer than 6 s.)
        let last = JOBS - 1;
        let again = format!("put 0 0 60 1 once:{last} unique=15s\r\nx");
        assert_eq!(
            c.cmd(&again).await,
            format!("EXISTS once:{last}"),
            "the window holds"
        );
        let put = "put 0 0 60 1 once:0 unique=15s\r\nx";
        let ended = Instant::now() + Duration::from_secs(15);
        let mut left = taken;
        while left > 0 && Instant::now() < ended + Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            left = taken_ids(redis, cluster, &prefix).await;
        }
        assert_eq!(
            left, 0,
            "cluster {cluster}: {left} of {JOBS} ids still kept 5 s after their windows ended"
        );
        assert_eq!(c.cmd(put).await, "INSERTED once:0");
    }
}
