//! The queue over time: delays, reserve timeouts, TTR expiry,
//! `DEADLINE_SOON`, `pause-tube` and the timer.

use std::time::{Duration, Instant};

use crate::common::{Backend, TestServer, assert_between, timed};
use crate::support::SEC;

backend_tests!(
    delayed_job_is_not_reservable_before_its_delay,
    delayed_jobs_are_never_early_by_a_fraction_of_a_millisecond,
    reserve_with_timeout_zero_answers_at_once,
    reserve_with_timeout_one_times_out_after_a_second,
    blocked_reserve_is_answered_by_a_put_from_another_connection,
    reserve_with_huge_timeout_still_gets_a_job,
    ttr_expiry_puts_the_job_back,
    deadline_soon_when_nothing_else_is_ready,
    deadline_soon_ends_a_blocked_reserve,
    deadline_soon_forgets_jobs_let_go,
    earlier_due_time_wakes_the_timer,
    many_jobs_falling_due_together_all_become_ready,
    pause_tube_holds_reserves_until_it_ends,
    pause_tube_zero_resumes_a_blocked_reserve,
    pause_tube_unknown_tube_is_not_found,
    job_due_just_before_a_reserve_times_out_is_delivered,
    time_left_just_after_it_is_set_rounds_down,
);

async fn delayed_job_is_not_reservable_before_its_delay(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let put_at = Instant::now();
    let id = c.put_ok(0, 1, 60, b"later").await;
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    let s = c.stats_job(id).await;
    assert_eq!(s.get("state"), "delayed");
    assert_eq!(s.num("delay"), 1);
    assert!(s.num("time-left") <= 1, "{s:?}");
    assert_eq!(c.found("peek-delayed").await.id, id.to_string());
    assert_eq!(c.cmd("peek-ready").await, "NOT_FOUND");
    let job = c.reserved("reserve-with-timeout 5").await;
    assert_eq!(job.body, b"later");
    // Never early, not even by a fraction of a millisecond: `put_at` was
    // taken before the put was sent.
    assert_between("delayed delivery", put_at.elapsed(), SEC, 3 * SEC);
    assert_eq!(c.stats_job(id).await.get("state"), "reserved");
}

/// Jobs put at odd fractions of a millisecond each come out no sooner than
/// their whole delay after their put was sent: an engine that rounds the
/// instant of a put down to its clock's tick would hand most of them out
/// early.
async fn delayed_jobs_are_never_early_by_a_fraction_of_a_millisecond(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut producer = server.client().await;
    let mut worker = server.client().await;
    let mut sent = std::collections::HashMap::new();
    for k in 0..20u64 {
        let at = Instant::now();
        let id = producer.put_ok(0, 1, 60, b"due").await;
        sent.insert(id.to_string(), at);
        tokio::time::sleep(Duration::from_micros(137 * (k % 7))).await;
    }
    for _ in 0..20 {
        let job = worker.reserved("reserve-with-timeout 5").await;
        let early = sent[&job.id] + SEC;
        let now = Instant::now();
        assert!(
            now >= early,
            "job {} came {:?} before its delay was up",
            job.id,
            early - now
        );
        assert_eq!(worker.cmd(&format!("delete {}", job.id)).await, "DELETED");
    }
}

async fn reserve_with_timeout_zero_answers_at_once(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let (reply, took) = timed(c.cmd("reserve-with-timeout 0")).await;
    assert_eq!(reply, "TIMED_OUT");
    assert!(took < SEC / 2, "took {took:?}");
    c.put_ok(0, 0, 60, b"x").await;
    assert_eq!(c.reserved("reserve-with-timeout 0").await.body, b"x");
}

async fn reserve_with_timeout_one_times_out_after_a_second(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let (reply, took) = timed(c.cmd("reserve-with-timeout 1")).await;
    assert_eq!(reply, "TIMED_OUT");
    assert_between("reserve-with-timeout 1", took, SEC.mul_f32(0.9), 3 * SEC);
    // The connection is usable afterwards and no longer waiting.
    assert_eq!(c.stats().await.num("current-waiting"), 0);
}

async fn blocked_reserve_is_answered_by_a_put_from_another_connection(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut worker = server.client().await;
    let mut producer = server.client().await;
    worker.send_line("reserve").await;
    let s = producer.wait_stat("current-waiting", 1).await;
    assert_eq!(s.num("current-workers"), 1);
    assert_eq!(
        producer.stats_tube("default").await.num("current-waiting"),
        1
    );
    worker.expect_silence(Duration::from_millis(100)).await;
    let id = producer.put_ok(0, 0, 60, b"wake up").await;
    let line = worker.line().await;
    let job = worker.job_after("RESERVED", &line).await;
    assert_eq!((job.id, job.body), (id.to_string(), b"wake up".to_vec()));
    let s = producer.stats().await;
    assert_eq!(s.num("current-waiting"), 0);
    assert_eq!(s.num("current-jobs-reserved"), 1);
}

async fn reserve_with_huge_timeout_still_gets_a_job(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut worker = server.client().await;
    let mut producer = server.client().await;
    worker.send_line("reserve-with-timeout 4294967295").await;
    producer.wait_stat("current-waiting", 1).await;
    producer.put_ok(0, 0, 60, b"x").await;
    let line = worker.line().await;
    assert_eq!(worker.job_after("RESERVED", &line).await.body, b"x");
}

async fn ttr_expiry_puts_the_job_back(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    let id = a.put_ok(0, 0, 1, b"slow").await;
    let reserved_at = Instant::now();
    a.reserve_body().await;
    let job = b.reserved("reserve-with-timeout 5").await;
    assert_eq!(job.id, id.to_string());
    assert_between(
        "TTR expiry",
        reserved_at.elapsed(),
        SEC.mul_f32(0.9),
        3 * SEC,
    );
    let s = b.stats_job(id).await;
    assert_eq!(s.num("timeouts"), 1);
    assert_eq!(s.num("reserves"), 2);
    assert_eq!(b.stats().await.num("job-timeouts"), 1);
    // The first worker lost it.
    assert_eq!(a.cmd(&format!("delete {id}")).await, "NOT_FOUND");
    assert_eq!(a.cmd(&format!("touch {id}")).await, "NOT_FOUND");
    assert_eq!(b.cmd(&format!("delete {id}")).await, "DELETED");
}

async fn deadline_soon_when_nothing_else_is_ready(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.put_ok(10, 0, 1, b"short ttr").await;
    c.reserve_body().await;
    let (reply, took) = timed(c.cmd("reserve")).await;
    assert_eq!(reply, "DEADLINE_SOON");
    assert!(took < SEC / 2, "DEADLINE_SOON took {took:?}");
    assert_eq!(c.cmd("reserve-with-timeout 5").await, "DEADLINE_SOON");
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "DEADLINE_SOON");
    // Another ready job is handed out regardless.
    let other = c.put_ok(0, 0, 60, b"other").await;
    assert_eq!(c.reserve_body().await.id, other.to_string());
}

async fn deadline_soon_ends_a_blocked_reserve(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.put_ok(0, 0, 2, b"x").await;
    c.reserve_body().await;
    let (reply, took) = timed(c.cmd("reserve")).await;
    assert_eq!(reply, "DEADLINE_SOON");
    assert_between("DEADLINE_SOON for ttr 2", took, SEC.mul_f32(0.5), 3 * SEC);
}

async fn deadline_soon_forgets_jobs_let_go(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    for let_go in ["delete", "finish", "release", "bury"] {
        let id = c.put_ok(0, 0, 1, b"x").await;
        c.reserve_body().await;
        let cmd = match let_go {
            "release" => format!("release {id} 0 100"),
            "bury" => format!("bury {id} 0"),
            _ => format!("{let_go} {id}"),
        };
        let reply = c.cmd(&cmd).await;
        assert!(!reply.starts_with("NOT_FOUND"), "{cmd}: {reply}");
        assert_eq!(
            c.cmd("reserve-with-timeout 0").await,
            "TIMED_OUT",
            "after {let_go}"
        );
    }
}

async fn earlier_due_time_wakes_the_timer(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // The timer first sleeps towards the later job, then must wake earlier.
    c.put_ok(0, 3, 60, b"later").await;
    let put_at = Instant::now();
    c.put_ok(0, 1, 60, b"sooner").await;
    let job = c.reserved("reserve-with-timeout 5").await;
    assert_eq!(job.body, b"sooner");
    assert_between(
        "delay 1 behind delay 3",
        put_at.elapsed(),
        SEC.mul_f32(0.9),
        SEC.mul_f32(2.5),
    );
}

async fn many_jobs_falling_due_together_all_become_ready(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // More than one timer pass moves at once.
    let (batches, per_batch) = (12, 1000);
    for _ in 0..batches {
        c.send(&b"put 0 1 60 1\r\nx\r\n".repeat(per_batch)).await;
        for _ in 0..per_batch {
            assert!(c.line().await.starts_with("INSERTED "));
        }
    }
    let total = (batches * per_batch) as u64;
    let s = c
        .poll_yaml("stats", |y| y.num("current-jobs-ready") == total)
        .await;
    assert_eq!(s.num("current-jobs-delayed"), 0);
}

async fn pause_tube_holds_reserves_until_it_ends(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let paused_at = Instant::now();
    assert_eq!(c.cmd("pause-tube default 1").await, "PAUSED");
    let s = c.stats_tube("default").await;
    assert_eq!(s.num("pause"), 1);
    assert!(s.num("pause-time-left") <= 1, "{s:?}");
    assert_eq!(s.num("cmd-pause-tube"), 1);
    let id = c.put_ok(0, 0, 60, b"x").await;
    // The job is ready, and peekable, but not handed out.
    assert_eq!(c.found("peek-ready").await.id, id.to_string());
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    let job = c.reserved("reserve-with-timeout 5").await;
    assert_eq!(job.id, id.to_string());
    assert_between(
        "pause of 1 second",
        paused_at.elapsed(),
        SEC.mul_f32(0.9),
        3 * SEC,
    );
    let s = c.stats_tube("default").await;
    assert_eq!((s.num("pause"), s.num("pause-time-left")), (0, 0));
    assert_eq!(c.stats().await.num("cmd-pause-tube"), 1);
}

async fn pause_tube_zero_resumes_a_blocked_reserve(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut worker = server.client().await;
    let mut admin = server.client().await;
    assert_eq!(admin.cmd("pause-tube default 100").await, "PAUSED");
    let s = admin.stats_tube("default").await;
    assert_eq!(s.num("pause"), 100);
    assert!((98..=100).contains(&s.num("pause-time-left")), "{s:?}");
    let held = admin.put_ok(0, 0, 60, b"held").await;
    // reserve-job ignores the pause.
    assert_eq!(
        admin.reserved(&format!("reserve-job {held}")).await.body,
        b"held"
    );
    admin.cmd(&format!("delete {held}")).await;
    admin.put_ok(0, 0, 60, b"x").await;
    worker.send_line("reserve").await;
    admin.wait_stat("current-waiting", 1).await;
    worker.expect_silence(Duration::from_millis(100)).await;
    let (line, took) = timed(async {
        assert_eq!(admin.cmd("pause-tube default 0").await, "PAUSED");
        worker.line().await
    })
    .await;
    assert!(took < SEC, "unpausing took {took:?}");
    assert_eq!(worker.job_after("RESERVED", &line).await.body, b"x");
    let s = admin.stats_tube("default").await;
    assert_eq!((s.num("pause"), s.num("pause-time-left")), (0, 0));
    assert_eq!(s.num("cmd-pause-tube"), 2);
}

async fn pause_tube_unknown_tube_is_not_found(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("pause-tube nosuch 1").await, "NOT_FOUND");
    assert_eq!(c.cmd("stats-tube nosuch").await, "NOT_FOUND");
    assert_eq!(c.tubes().await, ["default"]);
}

/// A job that falls due a millisecond or so before a blocked reserve's
/// timeout must be delivered, not missed because the timer had not run yet
/// (greenstalk's own test suite does exactly this).
async fn job_due_just_before_a_reserve_times_out_is_delivered(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    for _ in 0..3 {
        let id = c.put_ok(1024, 0, 120, b"delayed").await;
        assert_eq!(c.reserved("reserve").await.id, id.to_string());
        assert_eq!(c.cmd(&format!("release {id} 1024 2")).await, "RELEASED");
        assert_eq!(c.cmd("reserve-with-timeout 1").await, "TIMED_OUT");
        let job = c.reserved("reserve-with-timeout 1").await;
        assert_eq!(job.id, id.to_string());
        assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    }
}

/// beanstalkd measures in nanoseconds, so a TTR or delay just set already
/// shows a second less; clients' test suites (pheanstalk's) expect that.
async fn time_left_just_after_it_is_set_rounds_down(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = c.put_ok(1, 0, 10, b"x").await;
    assert_eq!(c.reserved("reserve").await.id, id.to_string());
    assert_eq!(c.stats_job(id).await.num("time-left"), 9);
    let later = c.put_ok(1, 5, 10, b"y").await;
    assert_eq!(c.stats_job(later).await.num("time-left"), 4);
    assert_eq!(c.cmd("pause-tube default 7").await, "PAUSED");
    assert_eq!(c.stats_tube("default").await.num("pause-time-left"), 6);
}
