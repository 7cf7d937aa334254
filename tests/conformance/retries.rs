//! Tries, backoff and dead letters (EXTENSION): `put` options, what happens
//! when a TTR runs out or a job is released with them, `tube-set` and
//! `tube-settings`, `BAD_OPTION`, and the options of JSON `add`.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{Backend, Client, TestServer, Yaml, assert_between};
use crate::support::{BEANSTALKD_STATS_JOB, SEC, assert_bad_option, put_opts, put_with};

backend_tests!(
    no_options_behave_as_beanstalkd,
    tries_bury_a_dead_letter_and_kick_starts_a_new_round,
    fixed_backoff_delays_a_timed_out_job,
    exponential_backoff_doubles_each_try,
    backoff_max_caps_an_exponential_backoff,
    release_buries_after_the_last_try_and_backs_off,
    bury_of_a_job_with_options_is_buried_because_bury,
    tube_set_gives_jobs_put_afterwards_their_options,
    bad_options_are_refused_and_the_body_is_consumed,
    json_add_takes_the_options,
    jitter_shortens_the_backoff,
    a_worker_that_closes_holding_a_job_uses_a_try,
);

/// The keys a job with options has after beanstalkd's (`buried-because`
/// comes only while it is buried).
const OPTION_KEYS: &[&str] = &[
    "tries",
    "max-tries",
    "backoff",
    "backoff-max",
    "jitter",
    "ttl",
    "unique",
];

/// The keys of a job with options, in order; `buried` adds `buried-because`.
fn keys_with_options(buried: bool) -> Vec<&'static str> {
    let mut keys = BEANSTALKD_STATS_JOB.to_vec();
    keys.extend_from_slice(OPTION_KEYS);
    if buried {
        keys.push("buried-because");
    }
    keys
}

/// Polls `stats-job` until the job is no longer in `state` (its TTR ran
/// out, its backoff ended); returns the first document that shows another.
async fn wait_leaves(c: &mut Client, id: impl std::fmt::Display, state: &str) -> Yaml {
    c.poll_yaml(&format!("stats-job {id}"), |y| y.get("state") != state)
        .await
}

/// Reserves job `id` with `reserve-with-timeout 0` (it must be the one
/// handed out).
async fn reserve_now(c: &mut Client, id: u64) {
    let job = c.reserved("reserve-with-timeout 0").await;
    assert_eq!(job.id, id.to_string());
}

/// With no option, a job whose TTR runs out is ready again at once, may be
/// reserved and released any number of times, and its `stats-job` is
/// beanstalkd's, key for key, in every state.
async fn no_options_behave_as_beanstalkd(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = c.put_ok(0, 0, 1, b"plain").await;
    assert_eq!(c.stats_job(id).await.keys(), BEANSTALKD_STATS_JOB);
    for _ in 0..3 {
        reserve_now(&mut c, id).await;
        assert_eq!(c.stats_job(id).await.keys(), BEANSTALKD_STATS_JOB);
        assert_eq!(c.cmd(&format!("release {id} 0 0")).await, "RELEASED");
    }
    let s = c.stats_job(id).await;
    assert_eq!(s.keys(), BEANSTALKD_STATS_JOB);
    assert_eq!(s.get("state"), "ready");
    // Its TTR runs out, twice: ready again at once each time.
    for timeouts in 1..=2 {
        reserve_now(&mut c, id).await;
        let reserved_at = Instant::now();
        let s = wait_leaves(&mut c, id, "reserved").await;
        assert_between(
            "TTR of 1 s without options",
            reserved_at.elapsed(),
            SEC.mul_f32(0.9),
            3 * SEC,
        );
        assert_eq!(s.get("state"), "ready", "{s:?}");
        assert_eq!(s.num("timeouts"), timeouts);
        assert_eq!(s.keys(), BEANSTALKD_STATS_JOB);
    }
    // Buried and delayed: still beanstalkd's document.
    reserve_now(&mut c, id).await;
    assert_eq!(c.cmd(&format!("bury {id} 0")).await, "BURIED");
    let s = c.stats_job(id).await;
    assert_eq!(s.get("state"), "buried");
    assert_eq!(s.keys(), BEANSTALKD_STATS_JOB);
    let later = c.put_ok(0, 100, 1, b"later").await;
    assert_eq!(c.stats_job(later).await.keys(), BEANSTALKD_STATS_JOB);
    // The default tube has no settings.
    let t = c.yaml("tube-settings default").await;
    assert!(t.pairs.is_empty() && t.items.is_empty(), "{t:?}");
}

/// `tries=2`: the first timeout makes it ready again, the second buries it
/// as a dead letter; a kick gives it a fresh round of two tries.
async fn tries_bury_a_dead_letter_and_kick_starts_a_new_round(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("use work").await, "USING work");
    assert_eq!(c.cmd("watch work").await, "WATCHING 2");
    assert_eq!(c.cmd("ignore default").await, "WATCHING 1");
    let id = put_opts(&mut c, "0 0 1", b"abc", "tries=2").await;
    let s = c.stats_job(id).await;
    assert_eq!(s.keys(), keys_with_options(false));
    assert_eq!(
        (
            s.get("state"),
            s.num("tries"),
            s.get("max-tries"),
            s.get("backoff"),
            s.get("backoff-max"),
            s.num("jitter"),
            s.get("ttl"),
        ),
        ("ready", 0, "2", "none", "none", 0, "none")
    );

    for round in 0..2u64 {
        // First try: its TTR runs out, it is ready again at once (no backoff).
        reserve_now(&mut c, id).await;
        assert_eq!(c.stats_job(id).await.num("tries"), 1);
        let reserved_at = Instant::now();
        let s = wait_leaves(&mut c, id, "reserved").await;
        assert_between(
            "first TTR with tries=2",
            reserved_at.elapsed(),
            SEC.mul_f32(0.9),
            3 * SEC,
        );
        assert_eq!(s.get("state"), "ready", "round {round}: {s:?}");
        assert_eq!(s.num("timeouts"), 2 * round + 1, "{s:?}");
        assert_eq!(s.num("tries"), 1, "{s:?}");
        assert_eq!(s.keys(), keys_with_options(false));
        // Second try: its TTR runs out, it is buried because of its tries.
        reserve_now(&mut c, id).await;
        assert_eq!(c.stats_job(id).await.num("tries"), 2);
        let s = wait_leaves(&mut c, id, "reserved").await;
        assert_eq!(s.get("state"), "buried", "round {round}: {s:?}");
        assert_eq!(s.get("buried-because"), "tries");
        assert_eq!((s.num("tries"), s.get("max-tries")), (2, "2"));
        assert_eq!(s.num("timeouts"), 2 * round + 2, "{s:?}");
        assert_eq!(s.keys(), keys_with_options(true));
        assert_eq!(c.found("peek-buried").await.id, id.to_string());
        assert_eq!(c.stats_tube("work").await.num("current-jobs-buried"), 1);
        assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
        if round == 0 {
            // A kick starts a fresh round with both tries again.
            assert_eq!(c.cmd("kick 1").await, "KICKED 1");
            let s = c.stats_job(id).await;
            assert_eq!((s.get("state"), s.num("tries")), ("ready", 0), "{s:?}");
            assert_eq!(s.num("kicks"), 1);
            assert_eq!(s.keys(), keys_with_options(false));
        }
    }
}

/// `tries=3 backoff=2s`: a timed-out job waits 2 s, delayed, before it is
/// ready again. Kicking it out of its backoff does not start a new round.
async fn fixed_backoff_delays_a_timed_out_job(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = put_opts(&mut c, "0 0 1", b"abc", "tries=3 backoff=2s").await;
    let s = c.stats_job(id).await;
    assert_eq!((s.get("max-tries"), s.get("backoff")), ("3", "2s"));
    reserve_now(&mut c, id).await;
    let s = wait_leaves(&mut c, id, "reserved").await;
    let timed_out_at = Instant::now();
    assert_eq!(s.get("state"), "delayed", "{s:?}");
    assert!((1..=2).contains(&s.num("time-left")), "{s:?}");
    assert_eq!((s.num("timeouts"), s.num("tries")), (1, 1), "{s:?}");
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    assert_eq!(c.found("peek-delayed").await.id, id.to_string());
    let job = c.reserved("reserve-with-timeout 5").await;
    assert_eq!(job.id, id.to_string());
    assert_between(
        "backoff of 2 s",
        timed_out_at.elapsed(),
        SEC.mul_f32(1.9),
        4 * SEC,
    );
    // Second try: times out into its backoff again; a kick-job brings it
    // back at once, but it keeps the tries of this round.
    let s = wait_leaves(&mut c, id, "reserved").await;
    assert_eq!(s.get("state"), "delayed", "{s:?}");
    assert_eq!((s.num("timeouts"), s.num("tries")), (2, 2), "{s:?}");
    assert_eq!(c.cmd(&format!("kick-job {id}")).await, "KICKED");
    let s = c.stats_job(id).await;
    assert_eq!((s.get("state"), s.num("tries")), ("ready", 2), "{s:?}");
    // Third and last try: buried when it times out.
    reserve_now(&mut c, id).await;
    let s = wait_leaves(&mut c, id, "reserved").await;
    assert_eq!(s.get("state"), "buried", "{s:?}");
    assert_eq!(s.get("buried-because"), "tries");
    assert_eq!((s.num("timeouts"), s.num("tries")), (3, 3), "{s:?}");
}

/// Reserves job `id` (which must become ready within 5 s) and lets its TTR
/// run out into a backoff; returns how long that backoff took, from when
/// the job was seen delayed to when it could be reserved again.
async fn time_one_backoff(c: &mut Client, id: u64, timeouts: u64) -> Duration {
    let s = wait_leaves(c, id, "reserved").await;
    let timed_out_at = Instant::now();
    assert_eq!(s.get("state"), "delayed", "{s:?}");
    assert_eq!(s.num("timeouts"), timeouts, "{s:?}");
    let job = c.reserved("reserve-with-timeout 5").await;
    assert_eq!(job.id, id.to_string());
    timed_out_at.elapsed()
}

/// `tries=4 backoff=exp:1s`: waits of 1 s, then 2 s.
async fn exponential_backoff_doubles_each_try(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = put_opts(&mut c, "0 0 1", b"abc", "tries=4 backoff=exp:1s").await;
    let s = c.stats_job(id).await;
    assert_eq!(
        (s.get("max-tries"), s.get("backoff"), s.get("backoff-max")),
        ("4", "exp:1s", "none")
    );
    reserve_now(&mut c, id).await;
    let first = time_one_backoff(&mut c, id, 1).await;
    assert_between(
        "first exp:1s backoff",
        first,
        SEC.mul_f32(0.9),
        SEC.mul_f32(1.7),
    );
    let second = time_one_backoff(&mut c, id, 2).await;
    assert_between(
        "second exp:1s backoff",
        second,
        SEC.mul_f32(1.8),
        SEC.mul_f32(3.5),
    );
    assert_eq!(c.stats_job(id).await.num("tries"), 3);
}

/// `backoff-max=1s` keeps `exp:1s` at 1 s.
async fn backoff_max_caps_an_exponential_backoff(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = put_opts(
        &mut c,
        "0 0 1",
        b"abc",
        "tries=4 backoff=exp:1s backoff-max=1s",
    )
    .await;
    let s = c.stats_job(id).await;
    assert_eq!((s.get("backoff"), s.get("backoff-max")), ("exp:1s", "1s"));
    reserve_now(&mut c, id).await;
    for n in 1..=2 {
        let took = time_one_backoff(&mut c, id, n).await;
        assert_between(
            &format!("capped backoff {n}"),
            took,
            SEC.mul_f32(0.9),
            SEC.mul_f32(1.7),
        );
    }
}

/// `release` of a job that used up its tries buries it (`BURIED`); one with
/// tries left is delayed by its backoff when released with delay 0, and
/// keeps a delay it is released with.
async fn release_buries_after_the_last_try_and_backs_off(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // tries=1: the first release is the end of it, whatever its delay.
    for delay in [0, 5] {
        let id = put_opts(&mut c, "0 0 60", b"once", "tries=1").await;
        reserve_now(&mut c, id).await;
        assert_eq!(c.cmd(&format!("release {id} 0 {delay}")).await, "BURIED");
        let s = c.stats_job(id).await;
        assert_eq!(s.get("state"), "buried", "{s:?}");
        assert_eq!(s.get("buried-because"), "tries");
        assert_eq!(s.num("tries"), 1);
        assert_eq!(s.keys(), keys_with_options(true));
        assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    }

    // tries=3 backoff=2s.
    let id = put_opts(&mut c, "0 0 60", b"thrice", "tries=3 backoff=2s").await;
    reserve_now(&mut c, id).await;
    assert_eq!(c.cmd(&format!("release {id} 0 0")).await, "RELEASED");
    let s = c.stats_job(id).await;
    assert_eq!(s.get("state"), "delayed", "{s:?}");
    assert!((1..=2).contains(&s.num("time-left")), "{s:?}");
    assert_eq!((s.num("tries"), s.num("releases")), (1, 1), "{s:?}");
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    // reserve-job takes it out of its backoff: a second try.
    assert_eq!(
        c.reserved(&format!("reserve-job {id}")).await.id,
        id.to_string()
    );
    assert_eq!(c.stats_job(id).await.num("tries"), 2);
    // A release with a delay keeps that delay.
    assert_eq!(c.cmd(&format!("release {id} 0 5")).await, "RELEASED");
    let s = c.stats_job(id).await;
    assert_eq!(s.get("state"), "delayed", "{s:?}");
    assert_eq!(s.num("delay"), 5, "{s:?}");
    assert!((4..=5).contains(&s.num("time-left")), "{s:?}");
    // The third try is the last: the release buries it.
    c.reserved(&format!("reserve-job {id}")).await;
    assert_eq!(c.stats_job(id).await.num("tries"), 3);
    assert_eq!(c.cmd(&format!("release {id} 0 0")).await, "BURIED");
    let s = c.stats_job(id).await;
    assert_eq!(
        (s.get("state"), s.get("buried-because")),
        ("buried", "tries")
    );
    // kick-job starts a fresh round.
    assert_eq!(c.cmd(&format!("kick-job {id}")).await, "KICKED");
    let s = c.stats_job(id).await;
    assert_eq!((s.get("state"), s.num("tries")), ("ready", 0), "{s:?}");
    assert_eq!(s.keys(), keys_with_options(false));
    reserve_now(&mut c, id).await;
    assert_eq!(c.cmd(&format!("release {id} 0 0")).await, "RELEASED");
}

/// `bury` of a job with options: buried because of the bury, not a try.
async fn bury_of_a_job_with_options_is_buried_because_bury(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = put_opts(&mut c, "0 0 60", b"abc", "tries=2 backoff=1s").await;
    reserve_now(&mut c, id).await;
    assert_eq!(c.cmd(&format!("bury {id} 0")).await, "BURIED");
    let s = c.stats_job(id).await;
    assert_eq!(s.get("state"), "buried", "{s:?}");
    assert_eq!(s.get("buried-because"), "bury");
    assert_eq!((s.num("tries"), s.num("buries")), (1, 1), "{s:?}");
    assert_eq!(s.keys(), keys_with_options(true));
    assert_eq!(c.cmd("kick 1").await, "KICKED 1");
    let s = c.stats_job(id).await;
    assert_eq!((s.get("state"), s.num("tries")), ("ready", 0), "{s:?}");
    assert_eq!(s.keys(), keys_with_options(false));
}

/// `tube-set` and `tube-settings`: jobs put into the tube afterwards take
/// its settings where they have no option of their own; clearing them
/// changes only jobs put later.
async fn tube_set_gives_jobs_put_afterwards_their_options(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let t = c.yaml("tube-settings refunds").await;
    assert!(t.pairs.is_empty() && t.items.is_empty(), "{t:?}");
    assert_eq!(c.cmd("use refunds").await, "USING refunds");
    let before = c.put_ok(0, 0, 60, b"before").await;

    assert_eq!(c.cmd("tube-set refunds tries=2 backoff=1s").await, "SET");
    let t = c.yaml("tube-settings refunds").await;
    assert!(t.items.is_empty(), "{t:?}");
    assert_eq!(
        t.map(),
        [("tries", "2"), ("backoff", "1s")].into_iter().collect()
    );
    // Another tube is not touched.
    let d = c.yaml("tube-settings default").await;
    assert!(d.pairs.is_empty(), "{d:?}");

    let plain = c.put_ok(0, 0, 60, b"plain").await;
    let s = c.stats_job(plain).await;
    assert_eq!(s.keys(), keys_with_options(false));
    assert_eq!(
        (
            s.num("tries"),
            s.get("max-tries"),
            s.get("backoff"),
            s.get("backoff-max"),
            s.num("jitter"),
        ),
        (0, "2", "1s", "none", 0)
    );
    // A job put before the settings has none.
    assert_eq!(c.stats_job(before).await.keys(), BEANSTALKD_STATS_JOB);
    // A job's own option wins; the others still come from the tube.
    let own = put_opts(&mut c, "0 0 60", b"own", "tries=5").await;
    let s = c.stats_job(own).await;
    assert_eq!((s.get("max-tries"), s.get("backoff")), ("5", "1s"));
    let own_backoff = put_opts(&mut c, "0 0 60", b"own", "backoff=exp:2s jitter=10").await;
    let s = c.stats_job(own_backoff).await;
    assert_eq!(
        (s.get("max-tries"), s.get("backoff"), s.num("jitter")),
        ("2", "exp:2s", 10)
    );
    // The tube's tries are really used: its second release buries a job.
    let two = c.put_ok(0, 0, 60, b"two").await;
    for (n, reply) in [(1, "RELEASED"), (2, "BURIED")] {
        assert_eq!(
            c.reserved(&format!("reserve-job {two}")).await.id,
            two.to_string()
        );
        assert_eq!(c.cmd(&format!("release {two} 0 0")).await, reply, "try {n}");
    }
    assert_eq!(c.stats_job(two).await.get("buried-because"), "tries");

    // Cleared: no keys, and jobs put afterwards are beanstalkd's again.
    assert_eq!(c.cmd("tube-set refunds").await, "SET");
    let t = c.yaml("tube-settings refunds").await;
    assert!(t.pairs.is_empty() && t.items.is_empty(), "{t:?}");
    let after = c.put_ok(0, 0, 60, b"after").await;
    assert_eq!(c.stats_job(after).await.keys(), BEANSTALKD_STATS_JOB);
    // Jobs put while the settings held keep them.
    let s = c.stats_job(plain).await;
    assert_eq!((s.get("max-tries"), s.get("backoff")), ("2", "1s"));
    let s = c.stats_job(own).await;
    assert_eq!((s.get("max-tries"), s.get("backoff")), ("5", "1s"));

    // A new tube-set replaces the settings as a whole.
    assert_eq!(c.cmd("tube-set refunds jitter=20").await, "SET");
    assert_eq!(c.cmd("tube-set refunds tries=3").await, "SET");
    let t = c.yaml("tube-settings refunds").await;
    assert_eq!(t.map(), [("tries", "3")].into_iter().collect());
}

/// Bad options get `BAD_OPTION` after the body is read; nothing is stored
/// and the connection goes on.
async fn bad_options_are_refused_and_the_body_is_consumed(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // A body that is itself a command: were it read as one, the next reply
    // would be `USING evil`.
    let body = b"use evil";
    for options in [
        "tries=0",
        "tries=10001",
        "tries=1000000000000",
        "tries=x",
        "tries=-1",
        "backoff=0",
        "backoff=0ms",
        "backoff=31d",
        "backoff=5w",
        "backoff=exp:",
        "backoff=exp:0s",
        "backoff-max=31d",
        "jitter=101",
        "colour=red",
        "tries=2 tries=3",
        "backoff=1s backoff=1s",
        "tries=2 jitter=101",
    ] {
        assert_bad_option(&mut c, options).await;
    }
    // With a client id too: refused, and the id is not taken.
    assert_eq!(
        put_with(&mut c, "0 0 60", body, "order-close:2 tries=0").await,
        "BAD_OPTION"
    );
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
    assert_eq!(c.cmd("peek order-close:2").await, "NOT_FOUND");
    assert_eq!(c.cmd("peek-ready").await, "NOT_FOUND");
    let s = c.stats().await;
    assert_eq!(
        (s.num("total-jobs"), s.num("current-jobs-ready")),
        (0, 0),
        "{s:?}"
    );
    assert_eq!(c.tubes().await, ["default"]);

    // The bounds themselves are good.
    let id = put_opts(
        &mut c,
        "0 0 60",
        b"max",
        "tries=10000 backoff=30d jitter=100",
    )
    .await;
    let s = c.stats_job(id).await;
    assert_eq!((s.get("max-tries"), s.num("jitter")), ("10000", 100));
    put_opts(
        &mut c,
        "0 0 60",
        b"min",
        "tries=1 backoff=exp:1ms backoff-max=30d jitter=0",
    )
    .await;
    put_opts(&mut c, "0 0 60", b"units", "backoff=500ms backoff-max=5m").await;
    put_opts(&mut c, "0 0 60", b"units", "backoff=exp:10 backoff-max=1h").await;
    // A client id, then an option.
    assert_eq!(
        put_with(&mut c, "0 0 60", b"close", "order-close:1 tries=2").await,
        "INSERTED order-close:1"
    );
    let s = c.stats_job("order-close:1").await;
    assert_eq!(s.get("id"), "\"order-close:1\"");
    assert_eq!((s.get("max-tries"), s.num("tries")), ("2", 0));

    // tube-set: the same checks, and nothing changes.
    assert_eq!(c.cmd("tube-set t tries=3").await, "SET");
    for options in ["tries=0", "colour=red", "jitter=101", "tries=2 tries=2"] {
        assert_eq!(
            c.cmd(&format!("tube-set t {options}")).await,
            "BAD_OPTION",
            "tube-set t {options}"
        );
    }
    let t = c.yaml("tube-settings t").await;
    assert_eq!(t.map(), [("tries", "3")].into_iter().collect());
    assert_eq!(c.cmd("tube-set u tries=0").await, "BAD_OPTION");
    let t = c.yaml("tube-settings u").await;
    assert!(t.pairs.is_empty(), "{t:?}");
}

/// JSON `add` takes the options as fields.
async fn json_add_takes_the_options(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let add = json!({
        "command": "add", "topic": "jobs", "body": "x",
        "ttr": 1, "tries": 1, "backoff": "1s",
    });
    let reply = c.json(&add).await;
    assert_eq!(reply["success"], true, "{reply}");
    let id = reply["id"].as_str().expect("id is a string").to_string();
    let s = c.stats_job(&id).await;
    assert_eq!(
        (s.get("max-tries"), s.get("backoff"), s.num("tries")),
        ("1", "1s", 0)
    );
    let pop = json!({"command": "pop", "topic": "jobs", "timeout": 0});
    let got = c.json(&pop).await;
    assert_eq!(got["id"], id.as_str(), "{got}");
    // Its one TTR runs out: a dead letter.
    let s = wait_leaves(&mut c, &id, "reserved").await;
    assert_eq!(s.get("state"), "buried", "{s:?}");
    assert_eq!(s.get("buried-because"), "tries");
    assert_eq!(s.num("tries"), 1);
    assert_eq!(
        c.json(&pop).await,
        json!({"success": false, "error": "TIMED_OUT"})
    );

    // Backoffs as numbers of seconds, and the jitter.
    let reply = c
        .json(&json!({
            "command": "add", "topic": "jobs", "body": "y",
            "tries": 3, "backoff": 2, "backoff-max": 10, "jitter": 20,
        }))
        .await;
    assert_eq!(reply["success"], true, "{reply}");
    let s = c.stats_job(reply["id"].as_str().unwrap()).await;
    assert_eq!(
        (
            s.get("max-tries"),
            s.get("backoff"),
            s.get("backoff-max"),
            s.num("jitter")
        ),
        ("3", "2s", "10s", 20)
    );

    // Bad options.
    for bad in [
        json!({"tries": 0}),
        json!({"tries": 10001}),
        json!({"backoff": "exp:"}),
        json!({"backoff": 0}),
        json!({"jitter": 101}),
    ] {
        let mut add = json!({"command": "add", "topic": "bad", "body": "z"});
        for (k, v) in bad.as_object().unwrap() {
            add[k] = v.clone();
        }
        assert_eq!(
            c.json(&add).await,
            json!({"success": false, "error": "BAD_OPTION"}),
            "{add}"
        );
    }
    let bad_pop = json!({"command": "pop", "topic": "bad", "timeout": 0});
    assert_eq!(
        c.json(&bad_pop).await,
        json!({"success": false, "error": "TIMED_OUT"})
    );
    // Only the job "y" is ready: none of the bad adds was stored.
    assert_eq!(c.stats().await.num("current-jobs-ready"), 1);

    // A topic's settings apply to JSON adds.
    assert_eq!(c.cmd("tube-set jobs tries=7").await, "SET");
    let reply = c
        .json(&json!({"command": "add", "topic": "jobs", "body": "w"}))
        .await;
    let s = c.stats_job(reply["id"].as_str().unwrap()).await;
    assert_eq!(s.get("max-tries"), "7");
}

/// `jitter=50` on `backoff=2s`: each wait is between 1 s and 2 s, and jobs
/// that time out together do not all come back together.
async fn jitter_shortens_the_backoff(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut holder = server.client().await;
    let mut worker = server.client().await;
    let n = 6;
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(put_opts(&mut holder, "0 0 1", b"j", "tries=10 backoff=2s jitter=50").await);
    }
    assert_eq!(holder.stats_job(ids[0]).await.num("jitter"), 50);
    let mut reserved_at = std::collections::HashMap::new();
    for id in &ids {
        // Taken before the reserve is sent: the TTR starts no sooner. (By
        // id: a plain reserve would get DEADLINE_SOON.)
        let before = Instant::now();
        let job = holder.reserved(&format!("reserve-job {id}")).await;
        reserved_at.insert(job.id, before);
    }
    let s = wait_leaves(&mut worker, ids[0], "reserved").await;
    assert_eq!(s.get("state"), "delayed", "{s:?}");
    assert!(s.num("time-left") <= 2, "{s:?}");
    let mut totals = Vec::new();
    for _ in 0..n {
        let job = worker.reserved("reserve-with-timeout 5").await;
        // From the reserve: a TTR of 1 s, then a wait of 1 s to 2 s.
        let total = reserved_at[&job.id].elapsed();
        assert_between(
            &format!("TTR and jittered backoff of job {}", job.id),
            total,
            SEC.mul_f32(1.95),
            SEC.mul_f32(3.5),
        );
        totals.push(total);
        // Let go of it, or the next reserve answers DEADLINE_SOON.
        assert_eq!(worker.cmd(&format!("delete {}", job.id)).await, "DELETED");
    }
    let (min, max) = (*totals.iter().min().unwrap(), *totals.iter().max().unwrap());
    assert!(
        min < SEC.mul_f32(2.9),
        "no wait was shortened by the jitter: {totals:?}"
    );
    assert!(
        max - min >= Duration::from_millis(100),
        "jobs that timed out together came back together: {totals:?}"
    );
}

/// A worker whose connection closes while it holds a job (its process
/// crashed, say) failed it, as one whose TTR ran out: with `tries` and a
/// backoff the job waits its backoff, then is buried once its tries are
/// used up, so a job that crashes its worker ends a dead letter instead of
/// coming back at once for ever. A job without options is ready again at
/// once, as on beanstalkd.
async fn a_worker_that_closes_holding_a_job_uses_a_try(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let plain = c.put_ok(0, 0, 60, b"plain").await;
    let id = put_opts(&mut c, "0 0 60", b"poison", "tries=2 backoff=1s").await;
    // The first worker takes both and dies.
    let mut worker = server.client().await;
    assert_eq!(
        worker.reserved("reserve-with-timeout 0").await.id,
        plain.to_string()
    );
    assert_eq!(
        worker.reserved("reserve-with-timeout 0").await.id,
        id.to_string()
    );
    drop(worker);
    let s = c
        .poll_yaml(&format!("stats-job {plain}"), |y| {
            y.get("state") != "reserved"
        })
        .await;
    assert_eq!(
        s.get("state"),
        "ready",
        "without options, ready at once: {s:?}"
    );
    let s = wait_leaves(&mut c, id, "reserved").await;
    assert_eq!(s.get("state"), "delayed", "its backoff first: {s:?}");
    assert_eq!((s.num("tries"), s.num("timeouts")), (1, 0), "{s:?}");
    assert_eq!(c.cmd(&format!("delete {plain}")).await, "DELETED");
    // Ready once its backoff is over; the second worker dies as well.
    let mut worker = server.client().await;
    let job = worker.reserved("reserve-with-timeout 5").await;
    assert_eq!(job.id, id.to_string());
    assert_eq!(worker.stats_job(id).await.num("tries"), 2);
    drop(worker);
    let s = wait_leaves(&mut c, id, "reserved").await;
    assert_eq!(s.get("state"), "buried", "its tries used up: {s:?}");
    assert_eq!(s.get("buried-because"), "tries");
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
}
