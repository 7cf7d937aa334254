//! Restarts: every state and every field of a job comes back after SIGKILL,
//! after a second SIGKILL right after the recovery, and after SIGTERM.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::daemon::Daemon;
use crate::common::{Client, every_byte};

/// What `stats-job` says of each job, less what moves with the clock (age,
/// time left) or the log's layout (file).
async fn image(c: &mut Client, ids: &[String]) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for id in ids {
        let stats = c.stats_job(id).await;
        let fields = stats
            .map()
            .into_iter()
            .filter(|(k, _)| !["age", "time-left", "file"].contains(k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        out.insert(id.clone(), fields);
    }
    out
}

fn inserted(reply: &str) -> String {
    reply
        .strip_prefix("INSERTED ")
        .unwrap_or_else(|| panic!("expected INSERTED, got {reply:?}"))
        .to_string()
}

/// Jobs in every state, in two tubes, with client ids and every byte in a
/// body, and their counters moved; returns the ids and which was reserved.
async fn populate(c: &mut Client, worker: &mut Client) -> (Vec<String>, String) {
    let mut ids = Vec::new();
    c.cmd("use mail").await;
    // Ready, same priority: their order must survive.
    for n in 0..3 {
        ids.push(inserted(
            &c.put(7, 0, 60, format!("fifo {n}").as_bytes()).await,
        ));
    }
    // Delayed for an hour, with every byte in its body, and one by its own id.
    ids.push(inserted(&c.put(3, 3600, 30, &every_byte()).await));
    ids.push(inserted(
        &c.put_id(5, 3600, 30, b"close it", "order-close:4711").await,
    ));
    c.cmd("use default").await;
    // Three buried in a chosen order (b, c, a), each reserved first.
    let mut buried = Vec::new();
    for name in ["a", "b", "c"] {
        buried.push(inserted(&c.put(99, 0, 60, name.as_bytes()).await));
    }
    for &n in &[1usize, 2, 0] {
        let job = worker.reserved(&format!("reserve-job {}", buried[n])).await;
        assert_eq!(worker.cmd(&format!("bury {} 42", job.id)).await, "BURIED");
    }
    // One released (counted), kicked back from burial (counted), then held.
    let held = inserted(&c.put(1, 0, 120, b"held").await);
    worker.reserved(&format!("reserve-job {held}")).await;
    assert_eq!(worker.cmd(&format!("release {held} 1 0")).await, "RELEASED");
    worker.reserved(&format!("reserve-job {held}")).await;
    assert_eq!(worker.cmd(&format!("bury {held} 1")).await, "BURIED");
    assert_eq!(c.cmd(&format!("kick-job {held}")).await, "KICKED");
    worker.reserved(&format!("reserve-job {held}")).await;
    // A reserve's record is not waited on (README, "What an acknowledgment
    // means"): a kill right after it may lose its count. A synced change
    // made after it is logged after it, so once that is answered the
    // reserve is on disk too, and the counts are the test's to check.
    let scratch = inserted(&c.put(0, 0, 60, b"barrier").await);
    assert_eq!(c.cmd(&format!("delete {scratch}")).await, "DELETED");
    ids.extend(buried);
    ids.push(held.clone());
    (ids, held)
}

/// After SIGKILL every job is back with every field; the held one is ready
/// again; then a second SIGKILL right after the recovery changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_and_field_survives_sigkill_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let mut worker = daemon.client().await;
    let (ids, held) = populate(&mut c, &mut worker).await;
    let before = image(&mut c, &ids).await;
    let tubes = c.tubes().await;
    let max_before: u64 = ids.iter().filter_map(|i| i.parse().ok()).max().unwrap();
    daemon.kill();

    let mut expected = before.clone();
    // Its worker's connection died with the process: ready again, as in
    // beanstalkd, its counters kept.
    expected
        .get_mut(&held)
        .unwrap()
        .insert("state".into(), "ready".into());
    for round in ["first", "second"] {
        let daemon_now = Daemon::durable(dir.path(), &[]).await;
        let mut c = daemon_now.client().await;
        assert_eq!(
            image(&mut c, &ids).await,
            expected,
            "after the {round} SIGKILL"
        );
        let mut now_tubes = c.tubes().await;
        now_tubes.sort();
        let mut want = tubes.clone();
        want.sort();
        assert_eq!(now_tubes, want, "tubes after the {round} SIGKILL");
        let mut dead = daemon_now;
        dead.kill();
    }

    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    // Client ids still answer EXISTS; server ids go on above the old ones.
    assert_eq!(
        c.put_id(5, 0, 30, b"again", "order-close:4711").await,
        "EXISTS order-close:4711"
    );
    let next: u64 = inserted(&c.put(0, 0, 30, b"new").await).parse().unwrap();
    assert!(next > max_before, "id {next} reused (had {max_before})");
    // Buried in the order they were buried.
    for want in [&ids[6], &ids[7], &ids[5]] {
        let found = c.found("peek-buried").await;
        assert_eq!(&found.id, want);
        assert_eq!(c.cmd(&format!("kick-job {want}")).await, "KICKED");
    }
    // The every-byte body, byte for byte.
    let found = c.found(&format!("peek {}", ids[3])).await;
    assert_eq!(found.body, every_byte());
    // FIFO within a priority: the three equal-priority jobs in put order.
    c.cmd("watch mail").await;
    c.cmd("ignore default").await;
    for (n, id) in ids[..3].iter().enumerate() {
        let job = c.reserved("reserve-with-timeout 0").await;
        assert_eq!((&job.id, job.body), (id, format!("fifo {n}").into_bytes()));
    }
}

/// A graceful stop (SIGTERM) keeps everything too, and gives the held job
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), &["-f", "1000"]).await;
    let mut c = daemon.client().await;
    let mut worker = daemon.client().await;
    let (ids, held) = populate(&mut c, &mut worker).await;
    let mut expected = image(&mut c, &ids).await;
    expected
        .get_mut(&held)
        .unwrap()
        .insert("state".into(), "ready".into());
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait_exit().success());
    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    assert_eq!(image(&mut c, &ids).await, expected);
}

/// Due times are wall-clock times: a job due in 2 s, with the server down
/// for 3 s, is ready as soon as it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_due_during_an_outage_is_ready_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let id = inserted(&c.put(0, 2, 30, b"due soon").await);
    let later = inserted(&c.put(0, 3600, 30, b"due later").await);
    let put_at = Instant::now();
    daemon.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let job = c.reserved("reserve-with-timeout 0").await;
    assert_eq!(job.id, id);
    assert!(put_at.elapsed() >= Duration::from_secs(3));
    let stats = c.stats_job(&later).await;
    assert_eq!(stats.get("state"), "delayed");
    let left = stats.num("time-left");
    assert!((3590..=3597).contains(&left), "time-left {left}");
}

/// Sends `put <args> <bytes> <options>` and the body; returns the new id.
async fn put_with_options(c: &mut Client, args: &str, body: &[u8], options: &str) -> String {
    let mut msg = format!("put {args} {} {options}\r\n", body.len()).into_bytes();
    msg.extend_from_slice(body);
    msg.extend_from_slice(b"\r\n");
    c.send(&msg).await;
    inserted(&c.line().await)
}

/// Checks the tries-and-backoff fields of a job's `stats-job`, and its
/// state and counters: `want` lists `field: value` pairs.
async fn check_job_fields(c: &mut Client, id: &str, want: &[(&str, &str)], when: &str) {
    let stats = c.stats_job(id).await;
    let got: Vec<(&str, &str)> = want.iter().map(|(k, _)| (*k, stats.get(k))).collect();
    assert_eq!(got, want, "job {id} {when}");
}

/// Every job's options, its tries in this round, why it is buried and its
/// state come back after SIGKILL and after a second SIGKILL right after the
/// recovery; so do a tube's settings, which a job put after each restart
/// still takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tries_backoff_and_tube_settings_survive_sigkill_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let mut worker = daemon.client().await;
    assert_eq!(c.cmd("tube-set refunds tries=3 backoff=1m").await, "SET");
    // Untouched: ready, with every option of its own.
    let fresh = put_with_options(&mut c, "0 0 1", b"abc", "tries=2 backoff=exp:5s jitter=10").await;
    let capped = put_with_options(
        &mut c,
        "4 0 60",
        b"capped",
        "tries=7 backoff=exp:90s backoff-max=1h jitter=0",
    )
    .await;
    // A dead letter: its one try's TTR ran out.
    let dead = put_with_options(&mut c, "0 0 1", b"dead", "tries=1").await;
    // On its second try: reserved once, its TTR ran out, waiting out the
    // backoff of its tube's settings.
    assert_eq!(c.cmd("use refunds").await, "USING refunds");
    let second = inserted(&c.put(0, 0, 1, b"refund 1").await);
    // Buried by its worker, not for its tries.
    let buried = put_with_options(&mut c, "0 0 60", b"buried", "tries=5 backoff=10s").await;
    // A dead letter kicked into a fresh round: its tries start again.
    let kicked = put_with_options(&mut c, "0 0 60", b"kicked", "tries=1 backoff=2m").await;
    worker.reserved(&format!("reserve-job {dead}")).await;
    worker.reserved(&format!("reserve-job {second}")).await;
    worker.reserved(&format!("reserve-job {buried}")).await;
    assert_eq!(worker.cmd(&format!("bury {buried} 9")).await, "BURIED");
    worker.reserved(&format!("reserve-job {kicked}")).await;
    assert_eq!(worker.cmd(&format!("release {kicked} 0 0")).await, "BURIED");
    assert_eq!(c.cmd(&format!("kick-job {kicked}")).await, "KICKED");
    // The two TTRs of one second run out.
    c.poll_yaml(&format!("stats-job {dead}"), |y| y.get("state") == "buried")
        .await;
    c.poll_yaml(&format!("stats-job {second}"), |y| {
        y.get("state") == "delayed"
    })
    .await;
    // The timer's changes have no reply that waits for their sync; a change
    // made after them that does is synced only once they are.
    let barrier = c.put_ok(0, 0, 60, b"barrier").await;
    assert_eq!(c.cmd(&format!("delete {barrier}")).await, "DELETED");
    let mut ids = vec![
        fresh.clone(),
        capped.clone(),
        dead.clone(),
        second.clone(),
        buried.clone(),
        kicked.clone(),
    ];
    let mut expected = image(&mut c, &ids).await;
    let settings = c.yaml("tube-settings refunds").await.pairs;
    daemon.kill();
    let killed_at = Instant::now();

    let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(settings, pairs(&[("tries", "3"), ("backoff", "1m")]));
    for round in ["first", "second"] {
        let when = format!("after the {round} SIGKILL");
        let mut daemon = Daemon::durable(dir.path(), &[]).await;
        let mut c = daemon.client().await;
        assert_eq!(image(&mut c, &ids).await, expected, "{when}");
        // The same, field by field, for what this feature added.
        let options = |tries, max, backoff, backoff_max, jitter| {
            vec![
                ("tries", tries),
                ("max-tries", max),
                ("backoff", backoff),
                ("backoff-max", backoff_max),
                ("jitter", jitter),
            ]
        };
        let mut want = vec![("state", "ready")];
        want.extend(options("0", "2", "exp:5s", "none", "10"));
        check_job_fields(&mut c, &fresh, &want, &when).await;
        let stats = c.stats_job(&fresh).await;
        assert!(!stats.keys().contains(&"buried-because"), "{when}");
        let mut want = vec![("state", "ready")];
        want.extend(options("0", "7", "exp:90s", "1h", "0"));
        check_job_fields(&mut c, &capped, &want, &when).await;
        let mut want = vec![("state", "buried"), ("timeouts", "1"), ("buries", "1")];
        want.extend(options("1", "1", "none", "none", "0"));
        want.push(("buried-because", "tries"));
        check_job_fields(&mut c, &dead, &want, &when).await;
        let mut want = vec![("state", "delayed"), ("delay", "60"), ("timeouts", "1")];
        want.extend(options("1", "3", "1m", "none", "0"));
        check_job_fields(&mut c, &second, &want, &when).await;
        let left = c.stats_job(&second).await.num("time-left");
        let gone = killed_at.elapsed().as_secs();
        assert!(
            (55_u64.saturating_sub(gone)..=59).contains(&left),
            "{when}: time-left {left}, {gone} s since the kill"
        );
        let mut want = vec![("state", "buried"), ("pri", "9"), ("buries", "1")];
        want.extend(options("1", "5", "10s", "none", "0"));
        want.push(("buried-because", "bury"));
        check_job_fields(&mut c, &buried, &want, &when).await;
        let mut want = vec![("state", "ready"), ("reserves", "1"), ("kicks", "1")];
        want.extend(options("0", "1", "2m", "none", "0"));
        check_job_fields(&mut c, &kicked, &want, &when).await;
        let now = c.yaml("tube-settings refunds").await.pairs;
        assert_eq!(now, settings, "tube-settings {when}");
        // A job put into the tube now takes its settings.
        assert_eq!(c.cmd("use refunds").await, "USING refunds");
        let later = inserted(&c.put(0, 0, 60, b"refund later").await);
        let mut want = vec![("tube", "refunds"), ("state", "ready")];
        want.extend(options("0", "3", "1m", "none", "0"));
        check_job_fields(&mut c, &later, &want, &when).await;
        ids.push(later);
        expected = image(&mut c, &ids).await;
        daemon.kill();
    }

    // Still a round of one try: the kicked job's reserve is its last.
    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    assert_eq!(
        image(&mut c, &ids).await,
        expected,
        "after the last restart"
    );
    c.reserved(&format!("reserve-job {kicked}")).await;
    assert_eq!(c.cmd(&format!("release {kicked} 0 0")).await, "BURIED");
    let stats = c.stats_job(&kicked).await;
    assert_eq!(
        (stats.get("tries"), stats.get("buried-because")),
        ("1", "tries")
    );
}

/// A job's time to live is kept across SIGKILL and counted in wall-clock
/// time: a job with `ttl=3s`, with the server down past those 3 s, is gone
/// after the restart (counted at its first timer pass); a job with
/// `ttl=1h` is back with its time to live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_that_runs_out_during_an_outage_expires_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let put_at = Instant::now();
    let short = put_with_options(&mut c, "0 0 60", b"short", "ttl=3s").await;
    let long = put_with_options(&mut c, "0 0 60", b"long", "ttl=1h").await;
    for (id, ttl) in [(&short, "3s"), (&long, "1h")] {
        let stats = c.stats_job(id).await;
        assert_eq!((stats.get("state"), stats.get("ttl")), ("ready", ttl));
    }
    daemon.kill();
    let wait = Duration::from_millis(3_300).saturating_sub(put_at.elapsed());
    tokio::time::sleep(wait).await;

    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let stats = c.wait_stat("total-jobs-expired", 1).await;
    assert_eq!(
        (
            stats.num("current-jobs-ready"),
            stats.num("total-jobs-expired")
        ),
        (1, 1),
        "after the restart: {stats:?}"
    );
    assert_eq!(c.cmd(&format!("stats-job {short}")).await, "NOT_FOUND");
    assert_eq!(c.cmd(&format!("peek {short}")).await, "NOT_FOUND");
    let stats = c.stats_job(&long).await;
    assert_eq!(
        (stats.get("state"), stats.get("ttl")),
        ("ready", "1h"),
        "the long-lived job after the restart"
    );
    let tube = c.stats_tube("default").await;
    assert_eq!(tube.num("total-jobs-expired"), 1, "{tube:?}");
    let job = c.reserved("reserve-with-timeout 0").await;
    assert_eq!((job.id, job.body), (long, b"long".to_vec()));
}

/// Schedules are kept like jobs: registered, replaced and removed ones come
/// back as they were after SIGKILL, also once compaction has moved them
/// into a snapshot and dropped the log files they were first written to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_survive_sigkill_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["-s", "70000"];
    let mut daemon = Daemon::durable(dir.path(), &args).await;
    let mut c = daemon.client().await;
    let body = every_byte();
    let line = format!(
        "schedule nightly-report reports 7 600 {} cron Europe/Berlin 0 2 * * MON-FRI",
        body.len()
    );
    c.send(format!("{line}\r\n").as_bytes()).await;
    c.send(&body).await;
    c.send(b"\r\n").await;
    assert!(c.line().await.starts_with("SCHEDULED "));
    for cmd in [
        "schedule heartbeat beats 0 60 4 every 300d\r\nbeat\r\n",
        // Replaced: only the second one counts.
        "schedule cleanup default 1 30 3 every 250d\r\nold\r\n",
        "schedule cleanup default 2 40 3 every 366d\r\nnew\r\n",
        "schedule gone default 0 60 1 every 200d\r\nx\r\n",
    ] {
        c.send(cmd.as_bytes()).await;
        assert!(c.line().await.starts_with("SCHEDULED "), "{cmd}");
    }
    assert_eq!(c.cmd("unschedule gone").await, "UNSCHEDULED");
    let before = c.schedules().await;
    assert_eq!(
        before.iter().filter(|l| l.starts_with("- name:")).count(),
        3,
        "{before:?}"
    );
    assert!(before.contains(&"  every: 366d".to_string()), "{before:?}");

    daemon.kill();
    let mut daemon = Daemon::durable(dir.path(), &args).await;
    let mut c = daemon.client().await;
    assert_eq!(c.schedules().await, before, "after the first SIGKILL");

    // Churn far more than a log file holds, so that compaction writes a
    // snapshot and the files with the schedules' records go.
    let first_files = crate::log_files(dir.path());
    assert!(!first_files.is_empty(), "no log files in {:?}", dir.path());
    let filler = "f".repeat(700);
    for _ in 0..20 {
        let mut puts = String::new();
        for _ in 0..50 {
            puts.push_str(&format!("put 0 0 60 {}\r\n{filler}\r\n", filler.len()));
        }
        c.send(puts.as_bytes()).await;
        let mut ids = Vec::new();
        for _ in 0..50 {
            ids.push(inserted(&c.line().await));
        }
        for id in ids {
            assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while crate::log_files(dir.path())
        .iter()
        .any(|f| first_files.contains(f))
    {
        assert!(
            Instant::now() < deadline,
            "compaction never dropped the first log files"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(c.schedules().await, before, "after compaction");
    daemon.kill();
    let mut daemon = Daemon::durable(dir.path(), &args).await;
    let mut c = daemon.client().await;
    assert_eq!(c.schedules().await, before, "after compaction and SIGKILL");
    let all = c.json(&serde_json::json!({"command": "schedules"})).await;
    let report = &all["schedules"][2];
    assert_eq!(report["name"], "nightly-report");
    assert_eq!(report["zone"], "Europe/Berlin");
    assert_eq!(
        report["body"].as_str().map(str::len),
        Some(String::from_utf8_lossy(&body).len())
    );
    daemon.kill();
}

/// A pause goes with its tube when the tube's last user leaves (as in
/// beanstalkd): a restart does not bring it back onto the tube's next jobs.
/// A paused tube that holds jobs keeps its pause across the restart; one
/// that holds none goes at the restart, its users gone with the process,
/// as after a clean stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_that_went_with_its_tube_does_not_come_back_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    assert_eq!(c.cmd("use gone").await, "USING gone");
    assert_eq!(c.cmd("pause-tube gone 100").await, "PAUSED");
    assert_eq!(c.cmd("use kept").await, "USING kept");
    assert_eq!(c.cmd("stats-tube gone").await, "NOT_FOUND");
    c.put_ok(0, 0, 60, b"in a paused tube").await;
    assert_eq!(c.cmd("pause-tube kept 100").await, "PAUSED");
    assert_eq!(c.cmd("use gone").await, "USING gone");
    c.put_ok(0, 0, 60, b"after the pause went").await;
    assert_eq!(c.cmd("use empty").await, "USING empty");
    assert_eq!(c.cmd("pause-tube empty 100").await, "PAUSED");
    daemon.kill();

    let mut daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    assert_eq!(c.stats_tube("gone").await.num("pause"), 0);
    assert_eq!(c.stats_tube("kept").await.num("pause"), 100);
    assert_eq!(c.cmd("stats-tube empty").await, "NOT_FOUND");
    assert_eq!(c.cmd("use empty").await, "USING empty");
    c.put_ok(0, 0, 60, b"in the tube made anew").await;
    assert_eq!(c.stats_tube("empty").await.num("pause"), 0);
    assert_eq!(c.cmd("watch gone").await, "WATCHING 2");
    assert_eq!(c.cmd("watch kept").await, "WATCHING 3");
    let job = c.reserved("reserve-with-timeout 0").await;
    assert_eq!(job.body, b"after the pause went");
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    // Nor does a second restart bring the pause back onto its new job.
    daemon.kill();
    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    assert_eq!(c.stats_tube("empty").await.num("pause"), 0);
    assert_eq!(c.cmd("watch empty").await, "WATCHING 2");
    let job = c.reserved("reserve-with-timeout 0").await;
    assert_eq!(job.body, b"in the tube made anew");
}

/// `PAUSED` is an acknowledgment, a pause's end (`pause-tube T 0`) too: a
/// SIGKILL right after it keeps it. A reviewer's kills at the reply undid
/// up to a third of them when it was answered before its record was
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_answered_survives_a_kill_right_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    assert_eq!(c.cmd("use p").await, "USING p");
    c.put_ok(0, 0, 60, b"keeps the tube").await;
    for round in 1..=20u64 {
        let secs = if round % 2 == 0 { 0 } else { 1000 + round };
        assert_eq!(c.cmd(&format!("pause-tube p {secs}")).await, "PAUSED");
        daemon.kill();
        daemon = Daemon::durable(dir.path(), &[]).await;
        c = daemon.client().await;
        assert_eq!(c.stats_tube("p").await.num("pause"), secs, "round {round}");
    }
}

/// `total-jobs` counts the jobs created since the server started, as in
/// beanstalkd after it reads its binlog back: the jobs a restart brings
/// back are there, not counted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn total_jobs_counts_from_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let first = c.put_ok(0, 0, 60, b"x").await;
    c.put_ok(0, 0, 60, b"y").await;
    c.put_ok(0, 0, 60, b"z").await;
    assert_eq!(c.cmd(&format!("delete {first}")).await, "DELETED");
    assert_eq!(c.stats().await.num("total-jobs"), 3);
    daemon.kill();

    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let s = c.stats().await;
    assert_eq!((s.num("total-jobs"), s.num("current-jobs-ready")), (0, 2));
    assert_eq!(c.stats_tube("default").await.num("total-jobs"), 0);
    c.put_ok(0, 0, 60, b"after").await;
    assert_eq!(c.stats().await.num("total-jobs"), 1);
    assert_eq!(c.stats_tube("default").await.num("total-jobs"), 1);
}

/// A job held on its last try when the server goes, killed or stopped,
/// gets back the try its reserve counted (the server failed, not the job):
/// after the restart it is reserved once more, not twice, before its
/// release makes it a dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_held_on_its_last_try_gets_its_try_back_after_a_restart() {
    for signal in [libc::SIGKILL, libc::SIGTERM] {
        let dir = tempfile::tempdir().unwrap();
        let mut daemon = Daemon::durable(dir.path(), &[]).await;
        let mut c = daemon.client().await;
        let mut worker = daemon.client().await;
        let id = put_with_options(&mut c, "0 0 60", b"last try", "tries=2").await;
        worker.reserved(&format!("reserve-job {id}")).await;
        assert_eq!(worker.cmd(&format!("release {id} 0 0")).await, "RELEASED");
        worker.reserved(&format!("reserve-job {id}")).await;
        let want = [("state", "reserved"), ("reserves", "2"), ("tries", "2")];
        check_job_fields(&mut c, &id, &want, "on its last try").await;
        // A reserve's record is not waited for: a change after it that is
        // waited for is synced only once it is.
        let barrier = c.put_ok(0, 0, 60, b"barrier").await;
        assert_eq!(c.cmd(&format!("delete {barrier}")).await, "DELETED");
        daemon.signal(signal);
        daemon.wait_exit();
        let daemon = Daemon::durable(dir.path(), &[]).await;
        let mut c = daemon.client().await;
        let when = format!("after signal {signal}");
        let want = [("state", "ready"), ("reserves", "2"), ("tries", "1")];
        check_job_fields(&mut c, &id, &want, &when).await;
        c.reserved(&format!("reserve-job {id}")).await;
        let want = [("state", "reserved"), ("reserves", "3"), ("tries", "2")];
        check_job_fields(&mut c, &id, &want, &when).await;
        assert_eq!(c.cmd(&format!("release {id} 0 0")).await, "BURIED");
        assert_eq!(c.stats_job(&id).await.get("buried-because"), "tries");
    }
}

/// `-s` below what the largest job and a header need is raised, and the
/// log says so rather than leaving the files larger than asked in silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_file_size_too_small_is_raised_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let log = scratch.path().join("delayq.log");
    let daemon = Daemon::durable_logged(dir.path(), &["-s", "1000"], &log).await;
    let mut c = daemon.client().await;
    c.put_ok(0, 0, 60, b"fits").await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("-s is too small"), "{said}");
}
