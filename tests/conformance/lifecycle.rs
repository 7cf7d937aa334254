//! A job's life: `put`, `reserve`, `delete`, `release`, `bury`, `kick`,
//! `touch`; priorities, reserve order and server-assigned ids.

use std::time::{Duration, Instant};

use crate::common::{Backend, TestServer, assert_between, timed};
use crate::support::SEC;

backend_tests!(
    put_reserve_delete_round_trip,
    server_ids_start_at_one,
    priorities_lower_first_fifo_within_one,
    priorities_across_watched_tubes,
    released_job_keeps_its_place_by_creation,
    waiting_connections_are_served_first_come_first_served,
    reserve_job_takes_any_unreserved_job,
    delete_in_every_state,
    release_puts_back_with_new_priority,
    release_with_delay_makes_the_job_delayed,
    release_with_no_delay_resets_the_jobs_delay,
    bury_peek_buried_and_kick,
    kick_takes_buried_before_delayed_up_to_the_bound,
    kick_job_on_buried_and_delayed_only,
    touch_restarts_the_ttr,
    disconnect_returns_reservations_at_once,
);

async fn put_reserve_delete_round_trip(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.put(0, 0, 60, b"hello").await, "INSERTED 1");
    let job = c.reserve_body().await;
    assert_eq!((job.id.as_str(), &job.body[..]), ("1", &b"hello"[..]));
    assert_eq!(c.cmd("delete 1").await, "DELETED");
    assert_eq!(c.cmd("delete 1").await, "NOT_FOUND");
    assert_eq!(c.cmd("peek 1").await, "NOT_FOUND");
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
}

async fn server_ids_start_at_one(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    for want in 1..=3 {
        assert_eq!(c.put_ok(0, 0, 60, b"x").await, want);
    }
    // A second server counts on its own.
    let other = TestServer::start(backend).await;
    let mut d = other.client().await;
    assert_eq!(d.put_ok(0, 0, 60, b"x").await, 1);
    // Ids are not reused after a delete.
    assert_eq!(c.cmd("delete 3").await, "DELETED");
    assert_eq!(c.put_ok(0, 0, 60, b"x").await, 4);
}

async fn priorities_lower_first_fifo_within_one(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    for (pri, body) in [
        (5, "a"),
        (1, "b"),
        (5, "c"),
        (0, "d"),
        (4_294_967_295, "e"),
        (1, "f"),
    ] {
        c.put_ok(pri, 0, 60, body.as_bytes()).await;
    }
    let mut order = String::new();
    for _ in 0..6 {
        let job = c.reserved("reserve-with-timeout 0").await;
        order.push_str(std::str::from_utf8(&job.body).unwrap());
    }
    assert_eq!(order, "dbface");
}

async fn priorities_across_watched_tubes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.cmd("use a").await;
    c.put_ok(10, 0, 60, b"a10").await;
    c.put_ok(3, 0, 60, b"a3").await;
    c.cmd("use b").await;
    c.put_ok(3, 0, 60, b"b3").await;
    c.put_ok(1, 0, 60, b"b1").await;
    c.cmd("watch a").await;
    c.cmd("watch b").await;
    let mut got = vec![];
    for _ in 0..4 {
        got.push(String::from_utf8(c.reserved("reserve-with-timeout 0").await.body).unwrap());
    }
    assert_eq!(got, ["b1", "a3", "b3", "a10"]);
}

async fn released_job_keeps_its_place_by_creation(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let first = c.put_ok(5, 0, 60, b"first").await;
    c.put_ok(5, 0, 60, b"second").await;
    assert_eq!(c.reserve_body().await.id, first.to_string());
    assert_eq!(c.cmd(&format!("release {first} 5 0")).await, "RELEASED");
    assert_eq!(c.reserve_body().await.body, b"first");
    assert_eq!(c.reserve_body().await.body, b"second");
}

async fn waiting_connections_are_served_first_come_first_served(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut first = server.client().await;
    let mut second = server.client().await;
    let mut producer = server.client().await;
    first.send_line("reserve").await;
    producer.wait_stat("current-waiting", 1).await;
    second.send_line("reserve-with-timeout 10").await;
    producer.wait_stat("current-waiting", 2).await;
    producer.put_ok(0, 0, 60, b"one").await;
    let line = first.line().await;
    assert_eq!(first.job_after("RESERVED", &line).await.body, b"one");
    second.expect_silence(Duration::from_millis(100)).await;
    producer.put_ok(0, 0, 60, b"two").await;
    let line = second.line().await;
    assert_eq!(second.job_after("RESERVED", &line).await.body, b"two");
}

async fn reserve_job_takes_any_unreserved_job(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut other = server.client().await;
    let ready = c.put_ok(0, 0, 60, b"ready").await;
    let delayed = c.put_ok(0, 100, 60, b"delayed").await;
    let buried = c.put_ok(0, 0, 60, b"buried").await;
    assert_eq!(
        c.reserved(&format!("reserve-job {buried}")).await.body,
        b"buried"
    );
    assert_eq!(c.cmd(&format!("bury {buried} 0")).await, "BURIED");

    let job = other.reserved(&format!("reserve-job {ready}")).await;
    assert_eq!((job.id, job.body), (ready.to_string(), b"ready".to_vec()));
    // Reserved (by anyone): not available.
    assert_eq!(c.cmd(&format!("reserve-job {ready}")).await, "NOT_FOUND");
    assert_eq!(
        other.cmd(&format!("reserve-job {ready}")).await,
        "NOT_FOUND"
    );
    let job = c.reserved(&format!("reserve-job {delayed}")).await;
    assert_eq!(job.body, b"delayed");
    let job = c.reserved(&format!("reserve-job {buried}")).await;
    assert_eq!(job.body, b"buried");
    assert_eq!(c.cmd("reserve-job 999").await, "NOT_FOUND");
    let s = c.stats_job(delayed).await;
    assert_eq!((s.get("state"), s.num("reserves")), ("reserved", 1));
    let s = c.stats().await;
    assert_eq!(s.num("current-jobs-reserved"), 3);
    assert_eq!(s.num("cmd-reserve-job"), 7);
}

async fn delete_in_every_state(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut other = server.client().await;
    let ready = c.put_ok(0, 0, 60, b"r").await;
    let delayed = c.put_ok(0, 100, 60, b"d").await;
    let buried = c.put_ok(0, 0, 60, b"b").await;
    c.reserved(&format!("reserve-job {buried}")).await;
    c.cmd(&format!("bury {buried} 0")).await;
    let mine = c.put_ok(0, 0, 60, b"mine").await;
    c.reserved(&format!("reserve-job {mine}")).await;
    let theirs = c.put_ok(0, 0, 60, b"theirs").await;
    other.reserved(&format!("reserve-job {theirs}")).await;

    for id in [ready, delayed, buried, mine] {
        assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED", "job {id}");
        assert_eq!(c.cmd(&format!("peek {id}")).await, "NOT_FOUND");
    }
    // Reserved by another connection: not this one's to delete.
    assert_eq!(c.cmd(&format!("delete {theirs}")).await, "NOT_FOUND");
    assert_eq!(other.cmd(&format!("delete {theirs}")).await, "DELETED");
    let s = c.stats().await;
    assert_eq!(s.num("cmd-delete"), 6);
    assert_eq!(s.num("total-jobs"), 5);
    for k in [
        "current-jobs-ready",
        "current-jobs-reserved",
        "current-jobs-delayed",
        "current-jobs-buried",
    ] {
        assert_eq!(s.num(k), 0, "{k}");
    }
    assert_eq!(c.stats_tube("default").await.num("cmd-delete"), 5);
}

async fn release_puts_back_with_new_priority(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut other = server.client().await;
    let id = c.put_ok(100, 0, 60, b"x").await;
    assert_eq!(c.cmd(&format!("release {id} 5 0")).await, "NOT_FOUND");
    c.reserve_body().await;
    assert_eq!(other.cmd(&format!("release {id} 5 0")).await, "NOT_FOUND");
    assert_eq!(c.cmd(&format!("release {id} 5 0")).await, "RELEASED");
    let s = c.stats_job(id).await;
    assert_eq!(s.get("state"), "ready");
    assert_eq!(s.num("pri"), 5);
    assert_eq!(s.num("releases"), 1);
    assert_eq!(c.cmd(&format!("release {id} 5 0")).await, "NOT_FOUND");
    assert_eq!(c.cmd("release 999 0 0").await, "NOT_FOUND");
    // The released job can be reserved again, by anyone.
    assert_eq!(
        other.reserved("reserve-with-timeout 0").await.id,
        id.to_string()
    );
    assert_eq!(c.stats().await.num("cmd-release"), 5);
}

async fn release_with_delay_makes_the_job_delayed(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = c.put_ok(0, 0, 60, b"x").await;
    c.reserve_body().await;
    let released_at = Instant::now();
    assert_eq!(c.cmd(&format!("release {id} 7 1")).await, "RELEASED");
    let s = c.stats_job(id).await;
    assert_eq!(s.get("state"), "delayed");
    assert_eq!((s.num("delay"), s.num("pri")), (1, 7));
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    let job = c.reserved("reserve-with-timeout 5").await;
    assert_eq!(job.id, id.to_string());
    assert_between(
        "release with delay 1",
        released_at.elapsed(),
        SEC.mul_f32(0.9),
        3 * SEC,
    );
}

/// beanstalkd sets a job's `delay` to the release's delay, zero included:
/// after `put 5 3 ...`, `kick-job`, `reserve`, `release <id> 7 0`, its
/// `stats-job` says `delay: 0`.
async fn release_with_no_delay_resets_the_jobs_delay(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = c.put_ok(5, 3, 10, b"x").await;
    assert_eq!(c.cmd(&format!("kick-job {id}")).await, "KICKED");
    c.reserve_body().await;
    assert_eq!(c.cmd(&format!("release {id} 7 0")).await, "RELEASED");
    let s = c.stats_job(id).await;
    assert_eq!((s.get("state"), s.num("pri")), ("ready", 7));
    assert_eq!(s.num("delay"), 0, "beanstalkd 1.12 prints delay: 0 here");
}

async fn bury_peek_buried_and_kick(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = c.put_ok(3, 0, 60, b"to bury").await;
    assert_eq!(c.cmd(&format!("bury {id} 10")).await, "NOT_FOUND");
    assert_eq!(c.cmd("peek-buried").await, "NOT_FOUND");
    c.reserve_body().await;
    assert_eq!(c.cmd(&format!("bury {id} 10")).await, "BURIED");
    assert_eq!(c.cmd(&format!("bury {id} 10")).await, "NOT_FOUND");
    let s = c.stats_job(id).await;
    assert_eq!(s.get("state"), "buried");
    assert_eq!((s.num("pri"), s.num("buries")), (10, 1));
    let job = c.found("peek-buried").await;
    assert_eq!((job.id, job.body), (id.to_string(), b"to bury".to_vec()));
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    assert_eq!(c.cmd("kick 10").await, "KICKED 1");
    let s = c.stats_job(id).await;
    assert_eq!((s.get("state"), s.num("kicks")), ("ready", 1));
    assert_eq!(c.cmd("peek-buried").await, "NOT_FOUND");
    assert_eq!(
        c.reserved("reserve-with-timeout 0").await.id,
        id.to_string()
    );
    assert_eq!(c.cmd("bury 999 1").await, "NOT_FOUND");
    let s = c.stats().await;
    assert_eq!((s.num("cmd-bury"), s.num("cmd-kick")), (4, 1));
}

async fn kick_takes_buried_before_delayed_up_to_the_bound(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // Put out of due order: kick takes those due soonest first.
    let mut delayed = vec![];
    for delay in [300, 100, 200] {
        delayed.push(c.put_ok(0, delay, 60, b"d").await);
    }
    let mut buried = vec![];
    for _ in 0..2 {
        let id = c.put_ok(0, 0, 60, b"b").await;
        c.reserve_body().await;
        c.cmd(&format!("bury {id} 0")).await;
        buried.push(id);
    }
    assert_eq!(c.cmd("kick 1").await, "KICKED 1");
    assert_eq!(c.stats_job(buried[0]).await.get("state"), "ready");
    assert_eq!(c.stats_job(buried[1]).await.get("state"), "buried");
    // Buried jobs remain: only they are kicked, whatever the bound.
    assert_eq!(c.cmd("kick 10").await, "KICKED 1");
    for id in &delayed {
        assert_eq!(c.stats_job(id).await.get("state"), "delayed");
    }
    assert_eq!(c.cmd("kick 2").await, "KICKED 2");
    assert_eq!(c.stats_job(delayed[0]).await.get("state"), "delayed");
    assert_eq!(c.stats_job(delayed[1]).await.get("state"), "ready");
    assert_eq!(c.stats_job(delayed[2]).await.get("state"), "ready");
    assert_eq!(c.cmd("kick 10").await, "KICKED 1");
    assert_eq!(c.cmd("kick 10").await, "KICKED 0");
    assert_eq!(c.cmd("kick 0").await, "KICKED 0");
    let s = c.stats().await;
    assert_eq!(s.num("current-jobs-ready"), 5);
    assert_eq!(s.num("current-jobs-delayed"), 0);
    // kick only touches the used tube.
    c.cmd("use other").await;
    c.put_ok(0, 100, 60, b"o").await;
    c.cmd("use default").await;
    assert_eq!(c.cmd("kick 10").await, "KICKED 0");
}

async fn kick_job_on_buried_and_delayed_only(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let delayed = c.put_ok(0, 100, 60, b"d").await;
    let buried = c.put_ok(0, 0, 60, b"b").await;
    c.reserve_body().await;
    c.cmd(&format!("bury {buried} 0")).await;
    let ready = c.put_ok(0, 0, 60, b"r").await;
    let reserved = c.put_ok(0, 0, 60, b"x").await;
    c.reserved(&format!("reserve-job {reserved}")).await;
    // kick-job works on any tube, not just the used one.
    c.cmd("use elsewhere").await;
    assert_eq!(c.cmd(&format!("kick-job {ready}")).await, "NOT_FOUND");
    assert_eq!(c.cmd(&format!("kick-job {reserved}")).await, "NOT_FOUND");
    assert_eq!(c.cmd("kick-job 999").await, "NOT_FOUND");
    assert_eq!(c.cmd(&format!("kick-job {buried}")).await, "KICKED");
    assert_eq!(c.cmd(&format!("kick-job {delayed}")).await, "KICKED");
    assert_eq!(c.cmd(&format!("kick-job {delayed}")).await, "NOT_FOUND");
    for id in [buried, delayed] {
        let s = c.stats_job(id).await;
        assert_eq!((s.get("state"), s.num("kicks")), ("ready", 1), "job {id}");
    }
}

async fn touch_restarts_the_ttr(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut other = server.client().await;
    let id = c.put_ok(0, 0, 3, b"x").await;
    assert_eq!(c.cmd(&format!("touch {id}")).await, "NOT_FOUND");
    c.reserve_body().await;
    assert_eq!(other.cmd(&format!("touch {id}")).await, "NOT_FOUND");
    tokio::time::sleep(SEC.mul_f32(1.5)).await;
    let before = c.stats_job(id).await.num("time-left");
    assert!(before <= 1, "time-left before touch: {before}");
    assert_eq!(c.cmd(&format!("touch {id}")).await, "TOUCHED");
    let s = c.stats_job(id).await;
    assert!(s.num("time-left") >= 2, "time-left after touch: {s:?}");
    assert_eq!((s.get("state"), s.num("timeouts")), ("reserved", 0));
    assert_eq!(c.cmd("touch 999").await, "NOT_FOUND");
    assert_eq!(c.stats().await.num("cmd-touch"), 4);
}

async fn disconnect_returns_reservations_at_once(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    let mut watcher = server.client().await;
    let id = a.put_ok(0, 0, 100, b"x").await;
    a.put_ok(0, 0, 100, b"y").await;
    a.reserve_body().await;
    a.reserve_body().await;
    b.send_line("reserve").await;
    watcher.wait_stat("current-waiting", 1).await;
    let (line, took) = timed(async {
        drop(a);
        b.line().await
    })
    .await;
    assert!(took < SEC, "requeue took {took:?}");
    let job = b.job_after("RESERVED", &line).await;
    assert_eq!(job.id, id.to_string());
    let s = b.stats().await;
    assert_eq!(s.num("current-jobs-ready"), 1);
    assert_eq!(s.num("current-jobs-reserved"), 1);
    assert_eq!(s.num("job-timeouts"), 0);
}
