//! Batch commands (EXTENSION): `reserve-batch`, `delete-batch`,
//! `finish-batch`, and JSON `pop` with `count` and `finish`/`delete` with
//! `ids`.

use std::time::Instant;

use serde_json::json;

use crate::common::{Backend, Client, Job, TestServer, assert_between, timed};
use crate::support::SEC;

backend_tests!(
    reserve_batch_takes_jobs_in_reserve_order,
    reserve_batch_keeps_to_priority_over_a_backlog,
    reserve_batch_jobs_each_run_on_their_own_ttr,
    blocked_reserve_batch_is_answered_by_a_put,
    reserve_batch_with_nothing_ready_times_out,
    reserve_batch_takes_from_every_watched_tube,
    reserve_batch_answers_deadline_soon,
    closing_returns_batch_reserved_jobs,
    finish_batch_finishes_only_what_the_connection_holds,
    delete_batch_deletes_all_but_what_others_hold,
    batch_lines_may_hold_a_thousand_long_ids,
    batch_bad_formats_keep_the_connection,
    json_pop_count_and_finish_ids,
    batch_commands_count_once_in_stats,
    batch_reserved_jobs_count_their_tries,
);

/// Reads the jobs of a `RESERVED_BATCH <n>` reply whose first line is
/// `line`: `n` jobs, each `RESERVED <id> <bytes>` and its body.
async fn read_batch(c: &mut Client, line: &str) -> Vec<Job> {
    let n: usize = line
        .strip_prefix("RESERVED_BATCH ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("expected RESERVED_BATCH <n>, got {line:?}"));
    assert!(n > 0, "a batch is never empty: {line:?}");
    let mut jobs = Vec::with_capacity(n);
    for _ in 0..n {
        let job_line = c.line().await;
        jobs.push(c.job_after("RESERVED", &job_line).await);
    }
    jobs
}

/// Sends a `reserve-batch` that must answer `RESERVED_BATCH`; its jobs.
async fn batch(c: &mut Client, cmd: &str) -> Vec<Job> {
    let line = c.cmd(cmd).await;
    read_batch(c, &line).await
}

/// The ids of `jobs`, as printed.
fn ids(jobs: &[Job]) -> Vec<String> {
    jobs.iter().map(|j| j.id.clone()).collect()
}

/// Makes `c` use and watch only `tube`.
async fn only(c: &mut Client, tube: &str) {
    assert_eq!(c.cmd(&format!("use {tube}")).await, format!("USING {tube}"));
    assert_eq!(c.cmd(&format!("watch {tube}")).await, "WATCHING 2");
    assert_eq!(c.cmd("ignore default").await, "WATCHING 1");
}

/// A job's state, as `stats-job` shows it (`NOT_FOUND` if it is gone).
async fn state(c: &mut Client, id: &str) -> String {
    c.send_line(&format!("stats-job {id}")).await;
    let line = c.line().await;
    if line == "NOT_FOUND" {
        return line;
    }
    let len: usize = line
        .strip_prefix("OK ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("stats-job {id}: {line:?}"));
    let doc = c.read_exact(len + 2).await;
    let doc = String::from_utf8(doc[..len].to_vec()).expect("YAML is UTF-8");
    crate::common::Yaml::parse(&doc).get("state").to_string()
}

/// Over a backlog larger than a cluster has shards (so that a shard holds
/// several ready jobs, of different priorities), `reserve-batch` still
/// takes the most urgent jobs, in priority order, oldest first within a
/// priority (on a cluster: oldest first within a priority per shard, as
/// `reserve` itself).
async fn reserve_batch_keeps_to_priority_over_a_backlog(backend: Backend) {
    const JOBS: u32 = 150;
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("use backlog").await, "USING backlog");
    assert_eq!(c.cmd("watch backlog").await, "WATCHING 2");
    assert_eq!(c.cmd("ignore default").await, "WATCHING 1");
    let mut pri_of = std::collections::HashMap::new();
    for n in 0..JOBS {
        let pri = [2, 0, 1][n as usize % 3];
        let id = c.put_ok(pri, 0, 60, format!("job {n}").as_bytes()).await;
        pri_of.insert(id.to_string(), (pri, id));
    }
    let line = c.cmd("reserve-batch 100").await;
    let got: Vec<(u32, u64)> = read_batch(&mut c, &line)
        .await
        .iter()
        .map(|job| pri_of[&job.id])
        .collect();
    assert_eq!(got.len(), 100, "{line}");
    let pris: Vec<u32> = got.iter().map(|g| g.0).collect();
    assert!(
        pris.windows(2).all(|w| w[0] <= w[1]),
        "priority order: {pris:?}"
    );
    // The 50 jobs of priority 0 and the 50 of priority 1, none of 2.
    assert_eq!(pris.iter().filter(|&&p| p == 0).count(), 50, "{pris:?}");
    assert_eq!(pris.iter().filter(|&&p| p == 1).count(), 50, "{pris:?}");
    if backend != Backend::Cluster {
        let mut want = got.clone();
        want.sort_unstable();
        assert_eq!(got, want, "oldest first within a priority");
    }
    // The rest, the 50 of priority 2, in a second batch.
    let line = c.cmd("reserve-batch 100").await;
    let rest = read_batch(&mut c, &line).await;
    assert_eq!(rest.len(), 50, "{line}");
    assert!(rest.iter().all(|job| pri_of[&job.id].0 == 2));
}

/// `reserve-batch 3` takes the three most urgent of five ready jobs in
/// `reserve`'s order (priority, then oldest), the next takes the other two,
/// and a third times out; each is reserved once, with its own TTR.
async fn reserve_batch_takes_jobs_in_reserve_order(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // (priority, TTR): all TTRs over a second, so that no DEADLINE_SOON
    // comes in the way.
    let spec = [(5, 11), (1, 12), (5, 13), (0, 14), (9, 15)];
    let mut put = Vec::new();
    for (i, (pri, ttr)) in spec.iter().enumerate() {
        let body = format!("job {i}");
        let id = c.put_ok(*pri, 0, *ttr, body.as_bytes()).await;
        put.push((id.to_string(), body, *ttr));
    }
    let first = batch(&mut c, "reserve-batch 3").await;
    let want =
        |order: &[usize]| -> Vec<String> { order.iter().map(|&i| put[i].0.clone()).collect() };
    assert_eq!(ids(&first), want(&[3, 1, 0]), "most urgent, then oldest");
    for (job, &i) in first.iter().zip(&[3, 1, 0]) {
        assert_eq!(job.body, put[i].1.as_bytes(), "body of job {}", job.id);
    }
    let second = batch(&mut c, "reserve-batch 10 0").await;
    assert_eq!(ids(&second), want(&[2, 4]), "the rest, in order");
    assert_eq!(c.cmd("reserve-batch 10 0").await, "TIMED_OUT");
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    for (id, _, ttr) in &put {
        let s = c.stats_job(id).await;
        assert_eq!(
            (s.get("state"), s.num("reserves"), s.num("ttr")),
            ("reserved", 1, u64::from(*ttr)),
            "job {id}: {s:?}"
        );
        assert!(s.num("time-left") <= u64::from(*ttr), "{s:?}");
        assert!(s.num("time-left") + 3 >= u64::from(*ttr), "{s:?}");
    }
    let s = c.stats().await;
    assert_eq!(
        (s.num("current-jobs-reserved"), s.num("current-jobs-ready")),
        (5, 0)
    );
}

/// In one batch, a job with TTR 1 comes back after about a second while
/// one with TTR 60 stays reserved.
async fn reserve_batch_jobs_each_run_on_their_own_ttr(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    only(&mut c, "ttr").await;
    let short = c.put_ok(0, 0, 1, b"short").await.to_string();
    let long = c.put_ok(1, 0, 60, b"long").await.to_string();
    let got = batch(&mut c, "reserve-batch 2 0").await;
    let reserved_at = Instant::now();
    assert_eq!(ids(&got), [short.clone(), long.clone()]);
    // Watch from another connection: this one holds a job in its last
    // second, which has nothing to do with stats but keeps things apart.
    let mut w = server.client().await;
    let s = w
        .poll_yaml(&format!("stats-job {short}"), |y| {
            y.get("state") != "reserved"
        })
        .await;
    assert_between(
        "TTR 1 of a batch-reserved job",
        reserved_at.elapsed(),
        SEC.mul_f32(0.9),
        3 * SEC,
    );
    assert_eq!((s.get("state"), s.num("timeouts")), ("ready", 1), "{s:?}");
    let s = w.stats_job(&long).await;
    assert_eq!(
        (s.get("state"), s.num("timeouts")),
        ("reserved", 0),
        "{s:?}"
    );
    assert_eq!(w.stats().await.num("job-timeouts"), 1);
    // The job that came back can be reserved by anyone.
    only(&mut w, "ttr").await;
    assert_eq!(ids(&batch(&mut w, "reserve-batch 5 0").await), [short]);
}

/// A `reserve-batch 5 5` blocked with nothing ready is answered by a put
/// from another connection, with at least that job.
async fn blocked_reserve_batch_is_answered_by_a_put(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut worker = server.client().await;
    let mut producer = server.client().await;
    for cmd in ["reserve-batch 5 5", "reserve-batch 5"] {
        worker.send_line(cmd).await;
        producer.wait_stat("current-waiting", 1).await;
        let id = producer.put_ok(0, 0, 60, b"wake up").await;
        let put_at = Instant::now();
        let line = worker.line_within(2 * SEC).await;
        assert!(put_at.elapsed() < SEC, "{cmd}: took {:?}", put_at.elapsed());
        let got = read_batch(&mut worker, &line).await;
        assert!(
            ids(&got).contains(&id.to_string()),
            "{cmd}: {:?} includes {id}",
            ids(&got)
        );
        assert_eq!(state(&mut producer, &id.to_string()).await, "reserved");
        producer.wait_stat("current-waiting", 0).await;
    }
}

/// `reserve-batch 2 1` with nothing ready times out after about a second.
async fn reserve_batch_with_nothing_ready_times_out(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.put_ok(0, 100, 60, b"delayed").await;
    let (reply, took) = timed(c.cmd("reserve-batch 2 1")).await;
    assert_eq!(reply, "TIMED_OUT");
    assert_between("reserve-batch 2 1", took, SEC.mul_f32(0.9), 3 * SEC);
    let (reply, took) = timed(c.cmd("reserve-batch 2 0")).await;
    assert_eq!(reply, "TIMED_OUT");
    assert!(took < SEC / 2, "reserve-batch 2 0 took {took:?}");
    c.ping().await;
}

/// With two tubes watched, a batch takes from both, in `reserve`'s order
/// across them, and nothing from a tube not watched.
async fn reserve_batch_takes_from_every_watched_tube(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let plan = [("a", 2), ("b", 1), ("a", 3), ("b", 3), ("c", 0)];
    let mut id = Vec::new();
    for (tube, pri) in plan {
        assert_eq!(c.cmd(&format!("use {tube}")).await, format!("USING {tube}"));
        id.push(c.put_ok(pri, 0, 60, tube.as_bytes()).await.to_string());
    }
    assert_eq!(c.cmd("watch a").await, "WATCHING 2");
    assert_eq!(c.cmd("watch b").await, "WATCHING 3");
    assert_eq!(c.cmd("ignore default").await, "WATCHING 2");
    let got = batch(&mut c, "reserve-batch 10 0").await;
    let want = [&id[1], &id[0], &id[2], &id[3]];
    assert_eq!(ids(&got), want.map(String::clone), "across both tubes");
    let bodies: Vec<&[u8]> = got.iter().map(|j| j.body.as_slice()).collect();
    assert_eq!(bodies, [b"b", b"a", b"a", b"b"]);
    assert_eq!(
        state(&mut c, &id[4]).await,
        "ready",
        "tube c is not watched"
    );
    assert_eq!(c.cmd("reserve-batch 10 0").await, "TIMED_OUT");
    for (tube, reserved) in [("a", 2), ("b", 2), ("c", 0)] {
        let s = c.stats_tube(tube).await;
        assert_eq!(s.num("current-jobs-reserved"), reserved, "tube {tube}");
    }
}

/// Holding a job in its last second, `reserve-batch` answers
/// `DEADLINE_SOON` rather than wait; a batch-reserved job entering its last
/// second ends a blocked `reserve-batch` so too.
async fn reserve_batch_answers_deadline_soon(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let held = c.put_ok(0, 0, 1, b"short").await;
    assert_eq!(c.reserve_body().await.id, held.to_string());
    let (reply, took) = timed(c.cmd("reserve-batch 5 3")).await;
    assert_eq!(reply, "DEADLINE_SOON");
    assert!(took < SEC + SEC / 5, "DEADLINE_SOON took {took:?}");
    // A ready job is handed out regardless, in a batch.
    let other = c.put_ok(0, 0, 60, b"other").await;
    let got = batch(&mut c, "reserve-batch 5 3").await;
    assert_eq!(ids(&got), [other.to_string()]);
    assert_eq!(c.cmd(&format!("delete {held}")).await, "DELETED");
    assert_eq!(c.cmd(&format!("delete {other}")).await, "DELETED");

    // Batch-reserved jobs with TTR 2: a blocked batch ends with
    // DEADLINE_SOON once they enter their last second.
    c.put_ok(0, 0, 2, b"x").await;
    c.put_ok(0, 0, 2, b"y").await;
    assert_eq!(batch(&mut c, "reserve-batch 5 0").await.len(), 2);
    let (reply, took) = timed(c.cmd("reserve-batch 5 5")).await;
    assert_eq!(reply, "DEADLINE_SOON");
    assert_between(
        "DEADLINE_SOON of a batch with TTR 2",
        took,
        SEC.mul_f32(0.5),
        3 * SEC,
    );
}

/// When a connection closes, every job it batch-reserved is ready again.
async fn closing_returns_batch_reserved_jobs(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut other = server.client().await;
    let mut put = Vec::new();
    for pri in [3, 1, 2, 0] {
        put.push(other.put_ok(pri, 0, 60, b"job").await.to_string());
    }
    {
        let mut c = server.client().await;
        assert_eq!(batch(&mut c, "reserve-batch 10 0").await.len(), 4);
        other.wait_stat("current-jobs-reserved", 4).await;
        c.send_line("quit").await;
        c.expect_closed().await;
    }
    let s = other.wait_stat("current-jobs-ready", 4).await;
    assert_eq!(s.num("current-jobs-reserved"), 0);
    let mut c = server.client().await;
    assert_eq!(batch(&mut c, "reserve-batch 10 0").await.len(), 4);
    // Dropped without quit: the same.
    drop(c);
    other.wait_stat("current-jobs-ready", 4).await;
    let got = batch(&mut other, "reserve-batch 10 0").await;
    let want = [&put[3], &put[1], &put[2], &put[0]].map(String::clone);
    assert_eq!(ids(&got), want, "back in their places");
}

/// `finish-batch` finishes the jobs the connection holds and counts them;
/// jobs not held, unknown ids and another connection's jobs are skipped,
/// not counted and not removed.
async fn finish_batch_finishes_only_what_the_connection_holds(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut d = server.client().await;
    let a = c.put_ok(0, 0, 60, b"a").await.to_string();
    let b = c.put_id(1, 0, 60, b"b", "held:b").await;
    assert_eq!(b, "INSERTED held:b");
    let b = "held:b".to_string();
    let theirs = c.put_ok(2, 0, 60, b"theirs").await.to_string();
    assert_eq!(
        ids(&batch(&mut c, "reserve-batch 2 0").await),
        [&a, &b].map(String::clone)
    );
    assert_eq!(d.reserve_body().await.id, theirs);
    let ready = c.put_ok(3, 0, 60, b"ready").await.to_string();
    let delayed = c.put_ok(3, 100, 60, b"delayed").await.to_string();
    let line = format!("finish-batch {theirs} {a} 99999999 {ready} no-such:job {b} {delayed}");
    assert_eq!(c.cmd(&line).await, "FINISHED 2");
    for id in [&a, &b] {
        assert_eq!(state(&mut c, id).await, "NOT_FOUND", "{id} finished");
    }
    assert_eq!(state(&mut c, &theirs).await, "reserved");
    assert_eq!(state(&mut c, &ready).await, "ready");
    assert_eq!(state(&mut c, &delayed).await, "delayed");
    // Nothing left that this connection holds.
    assert_eq!(c.cmd(&line).await, "FINISHED 0");
    assert_eq!(c.cmd(&format!("finish-batch {a}")).await, "FINISHED 0");
    // The other connection finishes its own.
    assert_eq!(
        d.cmd(&format!("finish-batch {theirs} {a}")).await,
        "FINISHED 1"
    );
    assert_eq!(state(&mut c, &theirs).await, "NOT_FOUND");
    let s = c.stats().await;
    assert_eq!(
        (
            s.num("current-jobs-ready"),
            s.num("current-jobs-delayed"),
            s.num("current-jobs-reserved")
        ),
        (1, 1, 0)
    );
}

/// `delete-batch` deletes ready, delayed, buried and own reserved jobs,
/// but not another connection's reserved job.
async fn delete_batch_deletes_all_but_what_others_hold(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut d = server.client().await;
    let buried = c.put_ok(0, 0, 60, b"buried").await.to_string();
    assert_eq!(c.reserve_body().await.id, buried);
    assert_eq!(c.cmd(&format!("bury {buried} 0")).await, "BURIED");
    let own = c.put_ok(0, 0, 60, b"own").await.to_string();
    let theirs = c.put_ok(1, 0, 60, b"theirs").await.to_string();
    assert_eq!(
        ids(&batch(&mut c, "reserve-batch 1 0").await),
        std::slice::from_ref(&own)
    );
    assert_eq!(d.reserve_body().await.id, theirs);
    let ready = c.put_ok(5, 0, 60, b"ready").await.to_string();
    let delayed = c.put_id(5, 100, 60, b"delayed", "later:1").await;
    assert_eq!(delayed, "INSERTED later:1");
    let delayed = "later:1".to_string();
    let line = format!("delete-batch {ready} {theirs} {delayed} 99999999 {buried} {own}");
    assert_eq!(c.cmd(&line).await, "DELETED 4");
    for id in [&ready, &delayed, &buried, &own] {
        assert_eq!(state(&mut c, id).await, "NOT_FOUND", "{id} deleted");
    }
    assert_eq!(state(&mut c, &theirs).await, "reserved");
    assert_eq!(c.cmd(&line).await, "DELETED 0");
    // Its holder may delete it.
    assert_eq!(d.cmd(&format!("delete-batch {theirs}")).await, "DELETED 1");
    let s = c.stats().await;
    let total: u64 = [
        "current-jobs-ready",
        "current-jobs-reserved",
        "current-jobs-delayed",
        "current-jobs-buried",
    ]
    .iter()
    .map(|k| s.num(k))
    .sum();
    assert_eq!(total, 0, "no job left");
}

/// A client-chosen id of `len` bytes, unique by `i`.
fn long_id(prefix: &str, i: usize, len: usize) -> String {
    let head = format!("{prefix}-{i}-");
    format!("{head}{}", "x".repeat(len - head.len()))
}

/// A `finish-batch` of 1000 client ids of 150 bytes, a line far over the
/// usual 1024 bytes, finishes all 1000; with 1001 ids it is `BAD_FORMAT`
/// and removes nothing. 1000 ids of the longest kind (200 bytes) still fit.
async fn batch_lines_may_hold_a_thousand_long_ids(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let max = delayq::rules::MAX_BATCH;
    let names: Vec<String> = (0..max).map(|i| long_id("job", i, 150)).collect();
    // Pipelined: every put first, then every reply.
    let mut msg = Vec::new();
    for name in &names {
        msg.extend_from_slice(format!("put 0 0 60 1 {name}\r\nx\r\n").as_bytes());
    }
    c.send(&msg).await;
    for name in &names {
        assert_eq!(c.line().await, format!("INSERTED {name}"));
    }
    let got = batch(&mut c, &format!("reserve-batch {max} 0")).await;
    assert_eq!(got.len(), max);
    let mut got_ids = ids(&got);
    got_ids.sort();
    let mut want = names.clone();
    want.sort();
    assert_eq!(got_ids, want, "every job, once");

    // 1001 ids: BAD_FORMAT, nothing removed, the connection goes on.
    let all = names.join(" ");
    let over = format!("{all} {}", long_id("extra", 0, 150));
    for cmd in ["finish-batch", "delete-batch"] {
        let line = format!("{cmd} {over}");
        assert!(line.len() > 150_000);
        assert_eq!(c.cmd(&line).await, "BAD_FORMAT", "{cmd} of 1001 ids");
        c.ping().await;
    }
    let s = c.stats().await;
    assert_eq!(
        s.num("current-jobs-reserved"),
        max as u64,
        "nothing removed"
    );

    // 1000 ids: all finished.
    let line = format!("finish-batch {all}");
    assert!(line.len() > 150_000);
    assert_eq!(c.cmd(&line).await, format!("FINISHED {max}"));
    let s = c.stats().await;
    assert_eq!(s.num("current-jobs-reserved"), 0);
    assert_eq!(state(&mut c, &names[0]).await, "NOT_FOUND");
    assert_eq!(state(&mut c, &names[max - 1]).await, "NOT_FOUND");

    // 1000 ids of 200 bytes, the longest line allowed: parsed, nothing there.
    let longest: Vec<String> = (0..max).map(|i| long_id("gone", i, 200)).collect();
    let line = format!("delete-batch {}", longest.join(" "));
    assert!(line.len() + 2 <= 201_016, "{}", line.len());
    assert_eq!(c.cmd(&line).await, "DELETED 0");
    // One more id: over the line limit, one BAD_FORMAT, the connection goes on.
    let line = format!("{line} {}", long_id("gone", max, 200));
    assert!(line.len() + 2 > 201_016);
    assert_eq!(c.cmd(&line).await, "BAD_FORMAT");
    c.ping().await;
    let id = c.put_ok(0, 0, 60, b"after").await;
    assert_eq!(c.cmd(&format!("delete-batch {id}")).await, "DELETED 1");
}

/// A count of 0 or over 1000, or not a number, is `BAD_FORMAT`, and the
/// connection goes on; so is an id that is not one.
async fn batch_bad_formats_keep_the_connection(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = c.put_ok(0, 0, 60, b"still here").await;
    for line in [
        "reserve-batch 0",
        "reserve-batch 1001",
        "reserve-batch 1000000000",
        "reserve-batch x",
        "reserve-batch -1",
        "reserve-batch 5 x",
        "reserve-batch 5 1 1",
        "reserve-batch 5 4294967296",
        "reserve-batch  5",
        "reserve-batch 5 ",
        "finish-batch 1 -2",
        "delete-batch 1  2",
        "delete-batch 1 ",
        "finish-batch -x",
    ] {
        assert_eq!(c.cmd(line).await, "BAD_FORMAT", "{line:?}");
    }
    // Nothing was reserved or removed; the connection still works.
    assert_eq!(state(&mut c, &id.to_string()).await, "ready");
    let got = batch(&mut c, "reserve-batch 1000 0").await;
    assert_eq!(ids(&got), [id.to_string()]);
    assert_eq!(c.cmd(&format!("finish-batch {id}")).await, "FINISHED 1");
    let s = c.stats().await;
    assert_eq!(s.num("cmd-finish"), 1, "BAD_FORMAT lines are not counted");
}

/// JSON `pop` with `count` takes up to that many jobs of its topic, and
/// `finish`/`delete` with `ids` remove them as the batch commands do.
async fn json_pop_count_and_finish_ids(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut d = server.client().await;
    let mut id = Vec::new();
    for (pri, body) in [(5, "e"), (1, "b"), (3, "c"), (9, "z")] {
        let add = json!({"command": "add", "topic": "t", "body": body, "priority": pri});
        let reply = c.json(&add).await;
        assert_eq!(reply["success"], true, "{reply}");
        id.push(reply["id"].as_str().expect("a string id").to_string());
    }
    // A job of another topic is never popped from t.
    let add = json!({"command": "add", "topic": "u", "body": "elsewhere", "priority": 0});
    assert_eq!(c.json(&add).await["success"], true);

    let pop = json!({"command": "pop", "topic": "t", "count": 3, "timeout": 0});
    assert_eq!(
        c.json(&pop).await,
        json!({"success": true, "jobs": [
            {"id": id[1], "topic": "t", "value": "b"},
            {"id": id[2], "topic": "t", "value": "c"},
            {"id": id[0], "topic": "t", "value": "e"},
        ]})
    );
    for i in [0, 1, 2] {
        assert_eq!(state(&mut c, &id[i]).await, "reserved");
    }
    // Another connection's finish of them counts nothing.
    let finish = json!({"command": "finish", "ids": [id[1], id[2]]});
    assert_eq!(d.json(&finish).await, json!({"success": true, "count": 0}));
    // Held, held, not held (ready), unknown: two go.
    let finish = json!({"command": "finish", "ids": [id[1], id[2], id[3], "no-such:job"]});
    assert_eq!(c.json(&finish).await, json!({"success": true, "count": 2}));
    assert_eq!(state(&mut c, &id[3]).await, "ready");
    // A count larger than what is ready takes what there is.
    let pop = json!({"command": "pop", "topic": "t", "count": 10, "timeout": 0});
    assert_eq!(
        c.json(&pop).await,
        json!({"success": true, "jobs": [{"id": id[3], "topic": "t", "value": "z"}]})
    );
    assert_eq!(
        c.json(&pop).await,
        json!({"success": false, "error": "TIMED_OUT"})
    );
    for count in [json!(0), json!(1001), json!(-1), json!("3"), json!(1.5)] {
        let pop = json!({"command": "pop", "topic": "t", "count": count, "timeout": 0});
        assert_eq!(
            c.json(&pop).await,
            json!({"success": false, "error": "BAD_FORMAT"}),
            "count {count}"
        );
    }
    let too_many: Vec<String> = (1..=1001).map(|i| i.to_string()).collect();
    for command in ["finish", "delete"] {
        let req = json!({"command": command, "ids": too_many});
        assert_eq!(
            c.json(&req).await,
            json!({"success": false, "error": "BAD_FORMAT"}),
            "{command} of 1001 ids"
        );
    }
    assert_eq!(state(&mut c, &id[0]).await, "reserved", "nothing removed");
    // delete with ids: the popped job and the other topic's job.
    let u = {
        let pop = json!({"command": "pop", "topic": "u", "timeout": 0});
        let got = d.json(&pop).await;
        got["id"].as_str().expect("popped from u").to_string()
    };
    let delete = json!({"command": "delete", "ids": [id[0], id[3], u]});
    assert_eq!(c.json(&delete).await, json!({"success": true, "count": 2}));
    assert_eq!(state(&mut c, &u).await, "reserved", "d holds it");
    let delete = json!({"command": "delete", "ids": [u]});
    assert_eq!(d.json(&delete).await, json!({"success": true, "count": 1}));
}

/// A `reserve-batch` with a timeout counts once in
/// `cmd-reserve-with-timeout`, without one once in `cmd-reserve`; a
/// `finish-batch` once in `cmd-finish`, however many jobs it finishes.
async fn batch_commands_count_once_in_stats(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    for _ in 0..6 {
        c.put_ok(0, 0, 60, b"job").await;
    }
    let before = c.stats().await;
    let got = batch(&mut c, "reserve-batch 3 0").await;
    assert_eq!(got.len(), 3);
    let s = c.stats().await;
    let diff = |s: &crate::common::Yaml, key: &str| s.num(key) - before.num(key);
    assert_eq!(diff(&s, "cmd-reserve-with-timeout"), 1);
    assert_eq!(diff(&s, "cmd-reserve"), 0);
    let line = format!("finish-batch {}", ids(&got).join(" "));
    assert_eq!(c.cmd(&line).await, "FINISHED 3");
    let s = c.stats().await;
    assert_eq!(diff(&s, "cmd-finish"), 1);
    assert_eq!(diff(&s, "cmd-reserve-with-timeout"), 1);
    // Without a timeout: cmd-reserve.
    let got = batch(&mut c, "reserve-batch 2").await;
    assert_eq!(got.len(), 2);
    let s = c.stats().await;
    assert_eq!(diff(&s, "cmd-reserve"), 1);
    assert_eq!(diff(&s, "cmd-reserve-with-timeout"), 1);
    // A batch that times out still counts.
    let line = format!("finish-batch {}", ids(&got).join(" "));
    assert_eq!(c.cmd(&line).await, "FINISHED 2");
    batch(&mut c, "reserve-batch 5 0").await;
    assert_eq!(c.cmd("reserve-batch 5 0").await, "TIMED_OUT");
    let s = c.stats().await;
    assert_eq!(diff(&s, "cmd-reserve-with-timeout"), 3);
    assert_eq!(diff(&s, "cmd-finish"), 2);
    assert!(s.num("current-workers") >= 1);
    // JSON pop with a count and a timeout: cmd-reserve-with-timeout.
    let pop = json!({"command": "pop", "topic": "default", "count": 2, "timeout": 0});
    assert_eq!(c.json(&pop).await["error"], "TIMED_OUT");
    let s = c.stats().await;
    assert_eq!(diff(&s, "cmd-reserve-with-timeout"), 4);
}

/// A batch-reserved job put with `tries=1` is buried when its TTR runs
/// out: each job of a batch counts its own try.
async fn batch_reserved_jobs_count_their_tries(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut put = Vec::new();
    for (body, extra) in [("a", "tries=1"), ("b", "tries=1"), ("c", "tries=2")] {
        c.send(format!("put 0 0 1 1 {extra}\r\n{body}\r\n").as_bytes())
            .await;
        let reply = c.line().await;
        let id = reply
            .strip_prefix("INSERTED ")
            .unwrap_or_else(|| panic!("put with {extra}: {reply:?}"))
            .to_string();
        put.push(id);
    }
    let got = batch(&mut c, "reserve-batch 3 0").await;
    let reserved_at = Instant::now();
    assert_eq!(ids(&got), put);
    for id in &put {
        let s = c.stats_job(id).await;
        assert_eq!((s.get("state"), s.num("tries")), ("reserved", 1), "{s:?}");
    }
    let mut w = server.client().await;
    for id in &put[..2] {
        let s = w
            .poll_yaml(&format!("stats-job {id}"), |y| y.get("state") != "reserved")
            .await;
        assert_eq!(s.get("state"), "buried", "{id}: {s:?}");
        assert_eq!(s.get("buried-because"), "tries");
        assert_eq!((s.num("tries"), s.num("timeouts")), (1, 1), "{s:?}");
    }
    assert!(reserved_at.elapsed() >= SEC.mul_f32(0.9));
    // The one with two tries is ready again for its second.
    let s = w
        .poll_yaml(&format!("stats-job {}", put[2]), |y| {
            y.get("state") != "reserved"
        })
        .await;
    assert_eq!((s.get("state"), s.num("tries")), ("ready", 1), "{s:?}");
    drop(c);
    let got = batch(&mut w, "reserve-batch 3 0").await;
    assert_eq!(ids(&got), std::slice::from_ref(&put[2]));
    let s = w.stats_job(&put[2]).await;
    assert_eq!(s.num("tries"), 2);
}
