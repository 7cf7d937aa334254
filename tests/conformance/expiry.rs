//! A job's time to live (`ttl`, EXTENSION): a job nobody finished or
//! deleted by then is removed in whatever state it is in (ready, delayed,
//! buried) and counted in `total-jobs-expired`; a job a worker holds is not
//! taken from it, and goes when the worker lets go of it. Also `tube-set`
//! with a `ttl`, the option's bounds, and JSON `add`.
//!
//! Real time: TTLs of one or two seconds; no test takes more than about
//! six seconds.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{Backend, Client, TestServer, Yaml, assert_between};
use crate::support::{SEC, assert_bad_option, put_opts};

backend_tests!(
    a_ready_job_expires_and_is_counted,
    delayed_buried_and_paused_jobs_expire,
    a_reserved_job_past_its_ttl_stays_with_its_worker,
    a_reserved_job_past_its_ttl_goes_when_released_or_buried,
    a_reserved_job_past_its_ttl_goes_when_its_ttr_runs_out,
    a_reserved_job_past_its_ttl_goes_when_its_worker_disconnects,
    tube_set_ttl_gives_jobs_put_afterwards_a_time_to_live,
    a_long_ttl_is_kept_and_bad_ttls_are_refused,
    json_add_ttl_expires_and_a_blocked_reserve_never_gets_the_job,
);

/// The stats key of the feature, in `stats` and `stats-tube`.
const EXPIRED: &str = "total-jobs-expired";

/// Longest a job may take to be removed after its time to live: the timer
/// may wake up to a second late on some engines, and a loaded machine adds
/// some more.
const GRACE: Duration = Duration::from_secs(2);

/// Whether `stats-job <id>` finds the job (its document is read and
/// dropped).
async fn exists(c: &mut Client, id: impl std::fmt::Display) -> bool {
    match c.reply(&format!("stats-job {id}")).await.as_str() {
        "OK" => true,
        "NOT_FOUND" => false,
        other => panic!("stats-job {id}: {other:?}"),
    }
}

/// Polls `stats-job` until the job is gone; fails if it is still there
/// `limit` after `since`. Returns the time from `since` to when it was
/// first seen gone.
async fn wait_gone(
    c: &mut Client,
    id: impl std::fmt::Display,
    since: Instant,
    limit: Duration,
) -> Duration {
    loop {
        if !exists(c, &id).await {
            return since.elapsed();
        }
        assert!(
            since.elapsed() <= limit,
            "job {id} still there {:?} after it was put (limit {limit:?})",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `total-jobs-expired` of `stats`, which is always there.
async fn expired_total(c: &mut Client) -> u64 {
    c.stats().await.num(EXPIRED)
}

/// `total-jobs-expired` of `stats-tube <tube>`, or `None` where the key is
/// not shown.
fn tube_expired(s: &Yaml) -> Option<u64> {
    s.keys().contains(&EXPIRED).then(|| s.num(EXPIRED))
}

/// Checks that `stats-tube <tube>` shows `total-jobs-expired: n` as its
/// last key, or (for 0) no such key at all.
async fn check_tube_expired(c: &mut Client, tube: &str, n: u64) {
    let s = c.stats_tube(tube).await;
    if n == 0 {
        assert_eq!(tube_expired(&s), None, "stats-tube {tube}: {s:?}");
    } else {
        assert_eq!(tube_expired(&s), Some(n), "stats-tube {tube}: {s:?}");
        assert_eq!(
            s.keys().last(),
            Some(&EXPIRED),
            "stats-tube {tube}: {EXPIRED} comes last"
        );
    }
}

/// Uses and watches only `tube`.
async fn only(c: &mut Client, tube: &str) {
    assert_eq!(c.cmd(&format!("use {tube}")).await, format!("USING {tube}"));
    assert_eq!(c.cmd(&format!("watch {tube}")).await, "WATCHING 2");
    assert_eq!(c.cmd("ignore default").await, "WATCHING 1");
}

/// A ready job with `ttl=1s` is gone a second after its put, counted in
/// `stats` and in its tube's `stats-tube`; a tube without expiries shows
/// no `total-jobs-expired`.
async fn a_ready_job_expires_and_is_counted(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // Always there in `stats`, after `cmd-finish`, even at 0.
    let s = c.stats().await;
    assert_eq!(s.num(EXPIRED), 0);
    let keys = s.keys();
    let at = keys.iter().position(|k| *k == EXPIRED).unwrap();
    assert_eq!(keys[at - 1], "cmd-finish", "{keys:?}");
    assert_eq!(at, keys.len() - 1, "{EXPIRED} is the last key: {keys:?}");
    // A tube with a job and no expiry.
    let plain = c.put_ok(0, 0, 60, b"plain").await;

    assert_eq!(c.cmd("use t").await, "USING t");
    let put_at = Instant::now();
    let id = put_opts(&mut c, "0 0 60", b"short-lived", "ttl=1s").await;
    let s = c.stats_job(id).await;
    assert_eq!((s.get("state"), s.get("ttl")), ("ready", "1s"), "{s:?}");
    check_tube_expired(&mut c, "t", 0).await;
    let took = wait_gone(&mut c, id, put_at, 3 * SEC).await;
    assert_between("ttl=1s", took, SEC.mul_f32(0.9), 3 * SEC);
    assert_eq!(c.cmd(&format!("peek {id}")).await, "NOT_FOUND");
    assert_eq!(c.cmd("peek-ready").await, "NOT_FOUND");
    assert_eq!(c.cmd(&format!("delete {id}")).await, "NOT_FOUND");
    let s = c.stats().await;
    assert_eq!(
        (
            s.num(EXPIRED),
            s.num("current-jobs-ready"),
            s.num("cmd-delete")
        ),
        (1, 1, 1),
        "{s:?}"
    );
    check_tube_expired(&mut c, "t", 1).await;
    let t = c.stats_tube("t").await;
    assert_eq!(
        (
            t.num("current-jobs-ready"),
            t.num("total-jobs"),
            t.num("cmd-delete")
        ),
        (0, 1, 0),
        "{t:?}"
    );
    // The tube with no expiry: beanstalkd's document, and its job is there.
    check_tube_expired(&mut c, "default", 0).await;
    assert_eq!(c.stats_job(plain).await.get("state"), "ready");
}

/// A delayed job (its delay longer than its ttl), a buried one and one in a
/// paused tube expire too.
async fn delayed_buried_and_paused_jobs_expire(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    only(&mut c, "t").await;
    let put_at = Instant::now();
    let delayed = put_opts(&mut c, "0 10 60", b"later", "ttl=1s").await;
    let buried = put_opts(&mut c, "0 0 60", b"dead", "ttl=1s").await;
    assert_eq!(
        c.reserved(&format!("reserve-job {buried}")).await.id,
        buried.to_string()
    );
    assert_eq!(c.cmd(&format!("bury {buried} 0")).await, "BURIED");
    let s = c.stats_job(delayed).await;
    assert_eq!((s.get("state"), s.get("ttl")), ("delayed", "1s"), "{s:?}");
    let s = c.stats_job(buried).await;
    assert_eq!((s.get("state"), s.get("ttl")), ("buried", "1s"), "{s:?}");
    let t = c.stats_tube("t").await;
    assert_eq!(
        (t.num("current-jobs-delayed"), t.num("current-jobs-buried")),
        (1, 1)
    );
    for id in [delayed, buried] {
        let took = wait_gone(&mut c, id, put_at, 3 * SEC).await;
        assert_between(
            &format!("ttl=1s of job {id}"),
            took,
            SEC.mul_f32(0.9),
            3 * SEC,
        );
    }
    assert_eq!(c.cmd("peek-delayed").await, "NOT_FOUND");
    assert_eq!(c.cmd("peek-buried").await, "NOT_FOUND");
    assert_eq!(c.cmd("kick 10").await, "KICKED 0");
    let t = c.stats_tube("t").await;
    assert_eq!(
        (t.num("current-jobs-delayed"), t.num("current-jobs-buried")),
        (0, 0),
        "{t:?}"
    );
    check_tube_expired(&mut c, "t", 2).await;
    assert_eq!(expired_total(&mut c).await, 2);

    // A ready job in a paused tube expires too.
    assert_eq!(c.cmd("use p").await, "USING p");
    let put_at = Instant::now();
    let paused = put_opts(&mut c, "0 0 60", b"paused", "ttl=1s").await;
    assert_eq!(c.cmd("pause-tube p 10").await, "PAUSED");
    let took = wait_gone(&mut c, paused, put_at, 3 * SEC).await;
    assert_between("ttl=1s in a paused tube", took, SEC.mul_f32(0.9), 3 * SEC);
    check_tube_expired(&mut c, "p", 1).await;
    assert_eq!(expired_total(&mut c).await, 3);
}

/// Puts two `ttl=1s` jobs, reserves both on `worker` and waits until two
/// seconds after the put, so that their time to live has run out (and the
/// timer has seen it) while the worker holds them; returns their ids.
async fn held_past_ttl(c: &mut Client, worker: &mut Client) -> (u64, u64) {
    let put_at = Instant::now();
    let first = put_opts(c, "0 0 60", b"first", "ttl=1s").await;
    let second = put_opts(c, "0 0 60", b"second", "ttl=1s").await;
    for id in [first, second] {
        let job = worker.reserved(&format!("reserve-job {id}")).await;
        assert_eq!(job.id, id.to_string());
    }
    tokio::time::sleep((2 * SEC).saturating_sub(put_at.elapsed())).await;
    (first, second)
}

/// A reserved job whose time to live runs out stays with its worker: still
/// reserved, it can be touched, deleted or finished, and is not counted as
/// expired.
async fn a_reserved_job_past_its_ttl_stays_with_its_worker(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut worker = server.client().await;
    let (first, second) = held_past_ttl(&mut c, &mut worker).await;
    for id in [first, second] {
        let s = c.stats_job(id).await;
        assert_eq!((s.get("state"), s.get("ttl")), ("reserved", "1s"), "{s:?}");
        assert_eq!(worker.cmd(&format!("touch {id}")).await, "TOUCHED");
    }
    assert_eq!(c.stats().await.num("current-jobs-reserved"), 2);
    assert_eq!(
        worker.cmd(&format!("delete {first}")).await,
        "DELETED",
        "delete of a held job past its ttl"
    );
    assert_eq!(
        worker.cmd(&format!("finish {second}")).await,
        "FINISHED",
        "finish of a held job past its ttl"
    );
    for id in [first, second] {
        assert!(!exists(&mut c, id).await, "job {id}");
    }
    let s = c.stats().await;
    assert_eq!(
        (
            s.num(EXPIRED),
            s.num("cmd-delete"),
            s.num("cmd-finish"),
            s.num("current-jobs-reserved")
        ),
        (0, 1, 1, 0),
        "{s:?}"
    );
    check_tube_expired(&mut c, "default", 0).await;
    assert_eq!(c.stats_tube("default").await.num("cmd-delete"), 2);
}

/// A held job past its time to live goes when its worker releases it
/// (`RELEASED`) or buries it (`BURIED`), and is counted then.
async fn a_reserved_job_past_its_ttl_goes_when_released_or_buried(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut worker = server.client().await;
    // On its last try: a release would bury it as a dead letter.
    let last_try = put_opts(&mut c, "0 0 60", b"last try", "tries=1 ttl=1s").await;
    worker.reserved(&format!("reserve-job {last_try}")).await;
    let (first, second) = held_past_ttl(&mut c, &mut worker).await;
    assert_eq!(c.stats_job(first).await.get("state"), "reserved");
    assert_eq!(expired_total(&mut c).await, 0, "not counted while held");

    assert_eq!(
        worker.cmd(&format!("release {last_try} 0 0")).await,
        "RELEASED",
        "release of a job on its last try, past its ttl"
    );
    assert!(!exists(&mut c, last_try).await, "gone, not buried");
    assert_eq!(expired_total(&mut c).await, 1);

    assert_eq!(
        worker.cmd(&format!("release {first} 0 0")).await,
        "RELEASED"
    );
    assert!(!exists(&mut c, first).await, "released past its ttl: gone");
    assert_eq!(c.cmd(&format!("peek {first}")).await, "NOT_FOUND");
    assert_eq!(expired_total(&mut c).await, 2);
    check_tube_expired(&mut c, "default", 2).await;

    assert_eq!(worker.cmd(&format!("bury {second} 0")).await, "BURIED");
    assert!(!exists(&mut c, second).await, "buried past its ttl: gone");
    assert_eq!(c.cmd("peek-buried").await, "NOT_FOUND");
    assert_eq!(c.cmd("peek-ready").await, "NOT_FOUND");
    let s = c.stats().await;
    assert_eq!(
        (
            s.num(EXPIRED),
            s.num("current-jobs-ready"),
            s.num("current-jobs-reserved"),
            s.num("current-jobs-buried")
        ),
        (3, 0, 0, 0),
        "{s:?}"
    );
    check_tube_expired(&mut c, "default", 3).await;
    assert_eq!(
        worker.cmd("reserve-with-timeout 0").await,
        "TIMED_OUT",
        "neither came back"
    );
}

/// A held job past its time to live goes when its TTR runs out: it does
/// not come back to ready.
async fn a_reserved_job_past_its_ttl_goes_when_its_ttr_runs_out(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut worker = server.client().await;
    let mut other = server.client().await;
    let put_at = Instant::now();
    // TTR 3 s: still held when its ttl of 1 s has run out.
    let id = put_opts(&mut c, "0 0 3", b"slow", "ttl=1s").await;
    worker.reserved(&format!("reserve-job {id}")).await;
    tokio::time::sleep((2 * SEC).saturating_sub(put_at.elapsed())).await;
    let s = c.stats_job(id).await;
    assert_eq!(s.get("state"), "reserved", "held past its ttl: {s:?}");
    assert_eq!(expired_total(&mut c).await, 0);
    let took = wait_gone(&mut c, id, put_at, 3 * SEC + GRACE).await;
    assert_between(
        "gone when its TTR of 3 s ran out",
        took,
        SEC.mul_f32(2.9),
        3 * SEC + GRACE,
    );
    assert_eq!(other.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    assert_eq!(c.cmd("peek-ready").await, "NOT_FOUND");
    let s = c.stats().await;
    assert_eq!(
        (
            s.num(EXPIRED),
            s.num("current-jobs-ready"),
            s.num("current-jobs-reserved")
        ),
        (1, 0, 0),
        "{s:?}"
    );
    check_tube_expired(&mut c, "default", 1).await;
    assert_eq!(
        worker.cmd(&format!("delete {id}")).await,
        "NOT_FOUND",
        "its worker lost it"
    );
}

/// A held job past its time to live goes when its worker's connection
/// closes.
async fn a_reserved_job_past_its_ttl_goes_when_its_worker_disconnects(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut worker = server.client().await;
    let (first, second) = held_past_ttl(&mut c, &mut worker).await;
    assert_eq!(c.stats().await.num("current-jobs-reserved"), 2);
    worker.send_line("quit").await;
    worker.expect_closed().await;
    drop(worker);
    let since = Instant::now();
    for id in [first, second] {
        wait_gone(&mut c, id, since, GRACE).await;
    }
    let s = c.stats().await;
    assert_eq!(
        (
            s.num(EXPIRED),
            s.num("current-jobs-ready"),
            s.num("current-jobs-reserved")
        ),
        (2, 0, 0),
        "{s:?}"
    );
    check_tube_expired(&mut c, "default", 2).await;
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
}

/// `tube-set t ttl=1s`: a job put into `t` afterwards without options
/// expires, and shows `ttl: 1s`; one put before, or with its own ttl, or
/// into another tube, does not.
async fn tube_set_ttl_gives_jobs_put_afterwards_a_time_to_live(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    only(&mut c, "t").await;
    let before = c.put_ok(0, 0, 60, b"before").await;
    assert_eq!(c.cmd("tube-set t ttl=1s").await, "SET");
    let t = c.yaml("tube-settings t").await;
    assert_eq!(t.map(), [("ttl", "1s")].into_iter().collect());
    let put_at = Instant::now();
    let plain = c.put_ok(0, 0, 60, b"plain").await;
    let own = put_opts(&mut c, "0 0 60", b"own", "ttl=1h").await;
    let s = c.stats_job(plain).await;
    assert_eq!(
        (
            s.get("state"),
            s.get("ttl"),
            s.get("max-tries"),
            s.get("backoff")
        ),
        ("ready", "1s", "none", "none"),
        "{s:?}"
    );
    assert_eq!(c.stats_job(own).await.get("ttl"), "1h");
    assert!(
        !c.stats_job(before).await.keys().contains(&"ttl"),
        "a job put before the settings has no options"
    );
    // Another tube.
    assert_eq!(c.cmd("use u").await, "USING u");
    let elsewhere = c.put_ok(0, 0, 60, b"elsewhere").await;

    let took = wait_gone(&mut c, plain, put_at, 3 * SEC).await;
    assert_between("the tube's ttl=1s", took, SEC.mul_f32(0.9), 3 * SEC);
    check_tube_expired(&mut c, "t", 1).await;
    assert_eq!(expired_total(&mut c).await, 1);
    for id in [before, own, elsewhere] {
        assert_eq!(c.stats_job(id).await.get("state"), "ready", "job {id}");
    }
    check_tube_expired(&mut c, "u", 0).await;
    // Jobs put after the settings are cleared do not expire.
    assert_eq!(c.cmd("tube-set t").await, "SET");
    assert_eq!(c.cmd("use t").await, "USING t");
    let after = c.put_ok(0, 0, 60, b"after").await;
    assert!(!c.stats_job(after).await.keys().contains(&"ttl"));
}

/// A job with a long time to live is untouched; `ttl` takes a duration up
/// to 365 days (beyond the 30 days of the other options), and anything
/// else gets `BAD_OPTION` with nothing stored.
async fn a_long_ttl_is_kept_and_bad_ttls_are_refused(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let put_at = Instant::now();
    let long = put_opts(&mut c, "0 0 60", b"long", "ttl=1h").await;
    let short = put_opts(&mut c, "0 0 60", b"short", "ttl=1s").await;
    // The bounds, and over the other options' 30 days.
    for (option, shown) in [
        ("ttl=365d", "365d"),
        ("ttl=31d", "31d"),
        ("ttl=90", "90s"),
        ("ttl=1500ms", "1500ms"),
    ] {
        let id = put_opts(&mut c, "0 100 60", b"bound", option).await;
        let s = c.stats_job(id).await;
        assert_eq!(s.get("ttl"), shown, "put .. {option}");
        assert_eq!(s.get("state"), "delayed", "put .. {option}");
    }
    // The least: taken (and gone at once).
    put_opts(&mut c, "0 100 60", b"bound", "ttl=1ms").await;
    let stored = c.stats().await.num("total-jobs");
    // A body that is itself a command: were it read as one, the next reply
    // would be `USING evil`.
    for options in [
        "ttl=0",
        "ttl=0ms",
        "ttl=0s",
        "ttl=366d",
        "ttl=8761h",
        "ttl=31536001",
        "ttl=x",
        "ttl=-1",
        "ttl=1w",
        "ttl=",
        "ttl=1s ttl=1s",
        "ttl=1s ttl=2s",
    ] {
        assert_bad_option(&mut c, options).await;
        assert_eq!(
            c.cmd(&format!("tube-set t {options}")).await,
            "BAD_OPTION",
            "tube-set t {options}"
        );
    }
    assert_eq!(c.stats().await.num("total-jobs"), stored, "none was stored");
    let t = c.yaml("tube-settings t").await;
    assert!(t.pairs.is_empty(), "{t:?}");
    assert_eq!(c.cmd("tube-set t ttl=365d").await, "SET");
    let t = c.yaml("tube-settings t").await;
    assert_eq!(t.map(), [("ttl", "365d")].into_iter().collect());

    // The short one goes; the long one stays, untouched.
    wait_gone(&mut c, short, put_at, 3 * SEC).await;
    let s = c.stats_job(long).await;
    assert_eq!(
        (s.get("state"), s.get("ttl"), s.num("reserves")),
        ("ready", "1h", 0),
        "{s:?}"
    );
    assert_eq!(
        c.reserved("reserve-with-timeout 0").await.id,
        long.to_string()
    );
    assert_eq!(c.cmd(&format!("release {long} 0 0")).await, "RELEASED");
    assert_eq!(c.stats_job(long).await.get("state"), "ready");
    // Only the short one expired (ttl=1ms and 1500ms too, by now).
    c.wait_stat(EXPIRED, 3).await;
    assert_eq!(c.stats_job(long).await.get("state"), "ready");
}

/// JSON `add` takes `"ttl"`; a job that expires before it is ready never
/// reaches a connection blocked in a reserve on its tube.
async fn json_add_ttl_expires_and_a_blocked_reserve_never_gets_the_job(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut worker = server.client().await;
    only(&mut worker, "w").await;
    // Blocked before the job is put; the job's delay (3 s) is longer than
    // its ttl, so it never becomes ready.
    worker.send_line("reserve-with-timeout 5").await;
    let blocked_at = Instant::now();
    c.poll_yaml("stats", |y| y.num("current-waiting") == 1)
        .await;

    let put_at = Instant::now();
    let reply = c
        .json(&json!({"command": "add", "topic": "j", "body": "x", "ttl": "1s"}))
        .await;
    assert_eq!(reply["success"], true, "{reply}");
    let ready = reply["id"].as_str().expect("id is a string").to_string();
    let reply = c
        .json(&json!({
            "command": "add", "topic": "w", "body": "y", "ttl": "1s", "delay": 3,
        }))
        .await;
    assert_eq!(reply["success"], true, "{reply}");
    let delayed = reply["id"].as_str().expect("id is a string").to_string();
    let s = c.stats_job(&ready).await;
    assert_eq!((s.get("state"), s.get("ttl")), ("ready", "1s"), "{s:?}");
    let s = c.stats_job(&delayed).await;
    assert_eq!((s.get("state"), s.get("ttl")), ("delayed", "1s"), "{s:?}");

    // Bad ones.
    for bad in [
        json!("0"),
        json!("366d"),
        json!("x"),
        json!(-1),
        json!(true),
    ] {
        let add = json!({"command": "add", "topic": "bad", "body": "z", "ttl": bad});
        assert_eq!(
            c.json(&add).await,
            json!({"success": false, "error": "BAD_OPTION"}),
            "{add}"
        );
    }

    for id in [&ready, &delayed] {
        let took = wait_gone(&mut c, id, put_at, 3 * SEC).await;
        assert_between(
            &format!("ttl \"1s\" of job {id}"),
            took,
            SEC.mul_f32(0.9),
            3 * SEC,
        );
    }
    assert_eq!(expired_total(&mut c).await, 2);
    check_tube_expired(&mut c, "w", 1).await;
    let pop = json!({"command": "pop", "topic": "j", "timeout": 0});
    assert_eq!(
        c.json(&pop).await,
        json!({"success": false, "error": "TIMED_OUT"})
    );
    // The blocked reserve times out: the job never became ready.
    let line = worker.line_within(7 * SEC).await;
    assert_eq!(line, "TIMED_OUT", "the blocked reserve");
    assert_between(
        "reserve-with-timeout 5",
        blocked_at.elapsed(),
        SEC.mul_f32(4.5),
        7 * SEC,
    );
}
