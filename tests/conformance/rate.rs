//! Rate limits (`tube-set <tube> rate=N`, EXTENSION): at most N reserves a
//! second from a tube; a worker held back waits (it is not refused) and is
//! served when the next second begins, and takes from its other tubes
//! meanwhile.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{Backend, TestServer};
use crate::support::BEANSTALKD_STATS_JOB;

backend_tests!(
    a_rate_spreads_reserves_over_seconds_and_held_back_workers_wait,
    a_held_back_worker_takes_from_its_other_tubes,
    a_held_back_worker_is_served_as_the_next_second_begins,
    a_worker_a_hand_out_held_back_is_served_as_the_next_second_begins,
    rate_is_a_tube_setting_only,
);

async fn a_rate_spreads_reserves_over_seconds_and_held_back_workers_wait(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("tube-set sms rate=5").await, "SET");
    c.cmd("use sms").await;
    assert_eq!(c.cmd("watch sms").await, "WATCHING 2");
    for _ in 0..12 {
        c.put_ok(0, 0, 60, b"text").await;
    }
    let start = Instant::now();
    let mut at = Vec::new();
    for _ in 0..12 {
        c.reserved("reserve-with-timeout 10").await;
        at.push(start.elapsed());
    }
    // Five in the first second, five in the next, two in the third: the
    // first five come at once; the last only after two seconds began, and
    // each held-back reserve is served as its second begins, not when its
    // timeout runs out. (On a cluster each of the tube's shards allows one
    // a second, the rate's share rounded up: the spread is not held.)
    assert!(at[4] < Duration::from_millis(500), "{at:?}");
    if backend != Backend::Cluster {
        assert!(at[11] - at[0] > Duration::from_secs(1), "{at:?}");
    }
    assert!(at[11] < Duration::from_millis(3500), "{at:?}");
    let s = c.stats_tube("sms").await;
    assert_eq!(s.num("current-jobs-reserved"), 12);
    assert_eq!(c.yaml("tube-settings sms").await.get("rate"), "5");
}

/// The wall-clock second a moment falls in, and how far into it.
fn second_of(t: SystemTime) -> (u64, Duration) {
    let since = t.duration_since(UNIX_EPOCH).expect("after 1970");
    (
        since.as_secs(),
        Duration::from_nanos(u64::from(since.subsec_nanos())),
    )
}

/// A worker held back by a rate is served as the next second begins, not
/// anywhere in it. (On one Redis it waited for the timer's idle tick, 0.8
/// to 0.95 s into the second.)
async fn a_held_back_worker_is_served_as_the_next_second_begins(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("tube-set paced rate=1").await, "SET");
    c.cmd("use paced").await;
    assert_eq!(c.cmd("watch paced").await, "WATCHING 2");
    for _ in 0..4 {
        c.put_ok(0, 0, 60, b"paced").await;
    }
    let mut held_back = 0;
    for _ in 0..3 {
        let asked = second_of(SystemTime::now());
        c.reserved("reserve-with-timeout 5").await;
        let (second, into) = second_of(SystemTime::now());
        // On a cluster each of the tube's shards allows the rate's share:
        // a reserve may be served from another shard at once.
        if second == asked.0 {
            continue;
        }
        held_back += 1;
        assert!(
            into < Duration::from_millis(300),
            "served {into:?} into the second after the one it was held back in"
        );
    }
    if backend != Backend::Cluster {
        assert!(
            held_back >= 2,
            "the rate held back {held_back} of 3 reserves"
        );
    }
}

/// Two workers wait when a rate's second ends: the hand-out pass then
/// serves one and holds the other back, and that one too is served as a
/// second begins, not anywhere in it.
async fn a_worker_a_hand_out_held_back_is_served_as_the_next_second_begins(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("tube-set paced rate=1").await, "SET");
    c.cmd("use paced").await;
    for _ in 0..3 {
        c.put_ok(0, 0, 60, b"paced").await;
    }
    let mut workers = Vec::new();
    for _ in 0..2 {
        let mut w = server.client().await;
        assert_eq!(w.cmd("watch paced").await, "WATCHING 2");
        assert_eq!(w.cmd("ignore default").await, "WATCHING 1");
        workers.push(w);
    }
    // This second's reserve is used up here, so both workers wait.
    assert_eq!(c.cmd("watch paced").await, "WATCHING 2");
    c.reserved("reserve-with-timeout 5").await;
    let asked = second_of(SystemTime::now());
    for w in &mut workers {
        w.send_line("reserve-with-timeout 5").await;
    }
    let mut held_back = 0;
    for w in &mut workers {
        let line = w.line_within(Duration::from_secs(6)).await;
        let (second, into) = second_of(SystemTime::now());
        assert_eq!(w.job_after("RESERVED", &line).await.body, b"paced");
        if second == asked.0 {
            continue;
        }
        held_back += 1;
        assert!(
            into < Duration::from_millis(300),
            "served {into:?} into a later second than the one it was held back in"
        );
    }
    if backend != Backend::Cluster {
        assert!(held_back >= 1, "the rate held back neither worker");
    }
}

async fn a_held_back_worker_takes_from_its_other_tubes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("tube-set sms rate=1").await, "SET");
    for tube in ["sms", "mail"] {
        c.cmd(&format!("use {tube}")).await;
        c.put_ok(0, 0, 60, tube.as_bytes()).await;
        c.put_ok(0, 0, 60, tube.as_bytes()).await;
        c.cmd(&format!("watch {tube}")).await;
    }
    c.cmd("ignore default").await;
    let mut bodies = Vec::new();
    for _ in 0..3 {
        bodies.push(c.reserved("reserve-with-timeout 0").await.body);
    }
    bodies.sort();
    // One from `sms` (its rate), both from `mail`, all at once; unless a
    // second began in between, which lets one more `sms` through.
    let sms = bodies.iter().filter(|b| b.as_slice() == b"sms").count();
    assert!((1..=2).contains(&sms), "{bodies:?}");
    assert!(bodies.iter().any(|b| b.as_slice() == b"mail"), "{bodies:?}");
}

async fn rate_is_a_tube_setting_only(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.send(b"put 0 0 60 1 rate=5\r\nx\r\n").await;
    assert_eq!(c.line().await, "BAD_OPTION");
    for bad in ["rate=0", "rate=1000001", "rate=x", "rate=1 rate=2"] {
        assert_eq!(
            c.cmd(&format!("tube-set t {bad}")).await,
            "BAD_OPTION",
            "{bad}"
        );
    }
    assert_eq!(c.cmd("tube-set t rate=1000000 tries=3").await, "SET");
    let settings = c.yaml("tube-settings t").await;
    assert_eq!(
        (settings.get("rate"), settings.get("tries")),
        ("1000000", "3")
    );
    let reply = c
        .json(&serde_json::json!({"command": "add", "topic": "t", "body": "x", "rate": 5}))
        .await;
    assert_eq!(reply["error"], "BAD_OPTION");
    // A job put into a tube with a rate does not carry it.
    c.cmd("use t").await;
    let id = c.put_ok(0, 0, 60, b"x").await;
    let s = c.stats_job(id).await;
    assert_eq!(s.get("max-tries"), "3");
    assert!(!s.keys().contains(&"rate"), "{:?}", s.keys());
    assert_eq!(c.stats().await.num("current-jobs-ready"), 1);
    // A tube with only a rate gives its jobs no options at all: their
    // `stats-job` is beanstalkd's.
    assert_eq!(c.cmd("tube-set only-rate rate=10").await, "SET");
    c.cmd("use only-rate").await;
    let id = c.put_ok(0, 0, 60, b"x").await;
    assert_eq!(c.stats_job(id).await.keys(), BEANSTALKD_STATS_JOB);
}
