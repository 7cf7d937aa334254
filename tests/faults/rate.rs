//! A rate limit is the store's, not a process's: two delayq processes on
//! one Redis, each with workers of its own, reserve together at most the
//! tube's rate a second, and both get jobs.

use std::time::{Duration, Instant};

use crate::common::daemon::Daemon;
use crate::common::redis::RedisServer;

/// Reserves from `sms` until `until`, returning how long after `start`
/// each reserve was answered.
async fn work(daemon: &Daemon, start: Instant, until: Instant) -> Vec<Duration> {
    let mut c = daemon.client().await;
    assert_eq!(c.cmd("watch sms").await, "WATCHING 2");
    let mut got = Vec::new();
    while Instant::now() < until {
        let reply = c.cmd("reserve-with-timeout 1").await;
        if reply == "TIMED_OUT" {
            continue;
        }
        assert!(reply.starts_with("RESERVED "), "{reply}");
        got.push(start.elapsed());
        c.line().await; // the body
        let id = reply.split(' ').nth(1).expect("an id").to_string();
        assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_holds_across_two_processes_on_one_redis() {
    const RATE: usize = 10;
    let redis = RedisServer::start(&[]);
    let a = Daemon::redis(&redis.url).await;
    let b = Daemon::redis(&redis.url).await;
    let mut c = a.client().await;
    assert_eq!(c.cmd(&format!("tube-set sms rate={RATE}")).await, "SET");
    c.cmd("use sms").await;
    for _ in 0..100 {
        c.put_ok(0, 0, 60, b"text").await;
    }
    let start = Instant::now();
    let until = start + Duration::from_millis(3500);
    let (a1, a2, b1, b2) = tokio::join!(
        work(&a, start, until),
        work(&a, start, until),
        work(&b, start, until),
        work(&b, start, until)
    );
    let elapsed = start.elapsed();
    let on_a = a1.len() + a2.len();
    let on_b = b1.len() + b2.len();
    let mut all: Vec<Duration> = [a1, a2, b1, b2].concat();
    all.sort();
    // Seconds of Redis's clock the workers reserved in, at most: each
    // allows RATE. Without a shared limit all 100 go in the first moments.
    let seconds = elapsed.as_secs() as usize + 2;
    assert!(
        all.len() <= RATE * seconds,
        "{} reserves in {elapsed:?} at {RATE} a second: {all:?}",
        all.len()
    );
    // Nor does the limit starve anyone: both processes' workers are served,
    // and the tube is drained at its rate, not slower.
    assert!(on_a > 0 && on_b > 0, "a got {on_a}, b got {on_b}");
    assert!(all.len() >= RATE * 3, "only {} in {elapsed:?}", all.len());
    // Any one second of the test holds at most the rate, give or take the
    // reserves that straddle a boundary of Redis's second and the test's.
    for w in all.windows(RATE * 2 + 1) {
        assert!(
            w[RATE * 2] - w[0] >= Duration::from_millis(900),
            "{} reserves within {:?}",
            RATE * 2 + 1,
            w[RATE * 2] - w[0]
        );
    }
}
