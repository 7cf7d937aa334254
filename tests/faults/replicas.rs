//! `--redis-wait` on one Redis: a put is acknowledged only once a replica
//! has it; without one it is answered `INTERNAL_ERROR` (the job may be
//! there), and what is not a put does not wait.

use std::time::{Duration, Instant};

use crate::common::daemon::Daemon;
use crate::common::redis::RedisServer;

/// How long delayq is told to wait for a replica, in ms.
const WAIT_MS: u64 = 300;

/// Waits until the primary at `url` has a replica online and caught up.
fn wait_for_replica(url: &str) {
    let client = redis::Client::open(url).expect("the primary's URL");
    let mut conn = client
        .get_connection()
        .expect("a connection to the primary");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut conn)
            .expect("INFO replication");
        if info.contains("connected_slaves:1") && info.contains("state=online") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never came online:\n{info}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// delayq on the Redis at `url`, acknowledging puts once a replica has
/// them, waiting `ms` for it.
async fn waiting_for_a_replica(url: &str, ms: u64) -> Daemon {
    let timeout = ms.to_string();
    Daemon::start(&[
        "--redis",
        url,
        "--redis-wait",
        "1",
        "--redis-wait-timeout",
        &timeout,
    ])
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_wait_acknowledges_a_put_only_once_a_replica_has_it() {
    let (primary, port) = RedisServer::start_on_tcp(&[]);
    let port = port.to_string();
    let server = waiting_for_a_replica(&primary.url, WAIT_MS).await;
    let mut c = server.client().await;

    // No replica: the put runs, but nothing confirms it would survive a
    // failover, so it is not acknowledged; WAIT gave up after its timeout.
    let start = Instant::now();
    assert_eq!(c.put(0, 0, 60, b"unconfirmed").await, "INTERNAL_ERROR");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(WAIT_MS) && took < Duration::from_secs(2),
        "the unconfirmed put was answered after {took:?}"
    );
    // The reply said the job may be there, and it is.
    let job = c.found("peek-ready").await;
    assert_eq!(job.body, b"unconfirmed");
    // A reserve and a delete are not puts: answered at once, as usual.
    let start = Instant::now();
    let reserved = c.reserved("reserve-with-timeout 0").await;
    assert_eq!(reserved.id, job.id);
    assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
    assert!(
        start.elapsed() < Duration::from_millis(WAIT_MS),
        "a reserve and a delete waited for replicas: {:?}",
        start.elapsed()
    );

    // With a replica online, puts are acknowledged, one at a time and
    // pipelined together (several puts in one call and its one WAIT).
    let _replica = RedisServer::start(&["--replicaof", "127.0.0.1", &port]);
    wait_for_replica(&primary.url);
    let reply = c.put(0, 0, 60, b"confirmed").await;
    assert!(reply.starts_with("INSERTED "), "{reply}");
    let mut burst = Vec::new();
    for n in 0..20 {
        let body = format!("burst-{n}");
        burst.extend_from_slice(format!("put 0 0 60 {}\r\n{body}\r\n", body.len()).as_bytes());
    }
    c.send(&burst).await;
    for n in 0..20 {
        let reply = c.line().await;
        assert!(
            reply.starts_with("INSERTED "),
            "put {n} of the burst: {reply}"
        );
    }
}

/// A put waiting for a replica that is not there holds up nobody else:
/// `WAIT` holds its connection inside Redis for its whole timeout, and
/// every other command used to wait behind it on the one shared
/// connection (reads, reserves and the timer's ticks took 2 s each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_waiting_for_a_replica_holds_up_no_other_command() {
    const LONG_WAIT_MS: u64 = 1500;
    let primary = RedisServer::start(&[]);
    let server = waiting_for_a_replica(&primary.url, LONG_WAIT_MS).await;
    let mut other = server.client().await;
    assert_eq!(other.put(0, 0, 60, b"first").await, "INTERNAL_ERROR");
    let mut producer = server.client().await;
    for round in 0..3 {
        producer.send(b"put 0 0 60 4\r\nwait\r\n").await;
        // The put's call and its WAIT are on their way.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let start = Instant::now();
        other.found("peek-ready").await;
        let stats = other.stats_tube("default").await;
        assert!(stats.num("current-jobs-ready") >= 1);
        let job = other.reserved("reserve-with-timeout 0").await;
        assert_eq!(
            other.cmd(&format!("release {} 0 0", job.id)).await,
            "RELEASED"
        );
        let took = start.elapsed();
        assert!(
            took < Duration::from_millis(LONG_WAIT_MS / 2),
            "round {round}: a peek, a stats-tube, a reserve and a release took {took:?} \
             while a put waited for a replica"
        );
        assert_eq!(producer.line().await, "INTERNAL_ERROR");
    }
}
