//! Command-level conformance: every command and reply word of beanstalkd
//! 1.12's protocol, the delayq extensions (client ids, `finish`, JSON lines,
//! drain mode), and the queue's behaviour over time. Every test runs against
//! every backend through `backend_tests!`.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::{Backend, TestServer, assert_between, every_byte, timed};
use serde_json::json;

const SEC: Duration = Duration::from_secs(1);

/// `stats` fields exactly as beanstalkd 1.12 prints them, in its order
/// (taken from a real beanstalkd 1.12's output).
const BEANSTALKD_STATS: &[&str] = &[
    "current-jobs-urgent",
    "current-jobs-ready",
    "current-jobs-reserved",
    "current-jobs-delayed",
    "current-jobs-buried",
    "cmd-put",
    "cmd-peek",
    "cmd-peek-ready",
    "cmd-peek-delayed",
    "cmd-peek-buried",
    "cmd-reserve",
    "cmd-reserve-with-timeout",
    "cmd-delete",
    "cmd-release",
    "cmd-use",
    "cmd-watch",
    "cmd-ignore",
    "cmd-bury",
    "cmd-kick",
    "cmd-touch",
    "cmd-stats",
    "cmd-stats-job",
    "cmd-stats-tube",
    "cmd-list-tubes",
    "cmd-list-tube-used",
    "cmd-list-tubes-watched",
    "cmd-pause-tube",
    "job-timeouts",
    "total-jobs",
    "max-job-size",
    "current-tubes",
    "current-connections",
    "current-producers",
    "current-workers",
    "current-waiting",
    "total-connections",
    "pid",
    "version",
    "rusage-utime",
    "rusage-stime",
    "uptime",
    "binlog-oldest-index",
    "binlog-current-index",
    "binlog-records-migrated",
    "binlog-records-written",
    "binlog-max-size",
    "draining",
    "id",
    "hostname",
    "os",
    "platform",
];

/// `stats-job` fields as beanstalkd 1.12 prints them.
const BEANSTALKD_STATS_JOB: &[&str] = &[
    "id",
    "tube",
    "state",
    "pri",
    "age",
    "delay",
    "ttr",
    "time-left",
    "file",
    "reserves",
    "timeouts",
    "releases",
    "buries",
    "kicks",
];

/// `stats-tube` fields as beanstalkd 1.12 prints them.
const BEANSTALKD_STATS_TUBE: &[&str] = &[
    "name",
    "current-jobs-urgent",
    "current-jobs-ready",
    "current-jobs-reserved",
    "current-jobs-delayed",
    "current-jobs-buried",
    "total-jobs",
    "current-using",
    "current-watching",
    "current-waiting",
    "cmd-delete",
    "cmd-pause-tube",
    "pause",
    "pause-time-left",
];

backend_tests!(
    put_reserve_delete_round_trip,
    server_ids_start_at_one,
    use_routes_puts_and_reserve_follows_watch_list,
    priorities_lower_first_fifo_within_one,
    priorities_across_watched_tubes,
    released_job_keeps_its_place_by_creation,
    waiting_connections_are_served_first_come_first_served,
    delayed_job_is_not_reservable_before_its_delay,
    reserve_with_timeout_zero_answers_at_once,
    reserve_with_timeout_one_times_out_after_a_second,
    blocked_reserve_is_answered_by_a_put_from_another_connection,
    reserve_with_huge_timeout_still_gets_a_job,
    reserve_job_takes_any_unreserved_job,
    delete_in_every_state,
    release_puts_back_with_new_priority,
    release_with_delay_makes_the_job_delayed,
    release_with_no_delay_resets_the_jobs_delay,
    bury_peek_buried_and_kick,
    kick_takes_buried_before_delayed_up_to_the_bound,
    kick_job_on_buried_and_delayed_only,
    touch_restarts_the_ttr,
    ttr_expiry_puts_the_job_back,
    deadline_soon_when_nothing_else_is_ready,
    deadline_soon_ends_a_blocked_reserve,
    deadline_soon_forgets_jobs_let_go,
    earlier_due_time_wakes_the_timer,
    many_jobs_falling_due_together_all_become_ready,
    disconnect_returns_reservations_at_once,
    watch_and_ignore_counts,
    peek_commands,
    peek_ready_delayed_buried_use_the_used_tube,
    pause_tube_holds_reserves_until_it_ends,
    pause_tube_zero_resumes_a_blocked_reserve,
    pause_tube_unknown_tube_is_not_found,
    tube_lifetime_and_list_order,
    default_tube_always_exists,
    stats_fields_match_beanstalkd,
    stats_job_fields_and_values,
    stats_tube_fields_and_values,
    stats_command_counters,
    stats_job_counts_by_state,
    stats_connection_counters,
    version_is_the_crate_version,
    max_values_are_accepted,
    error_words_for_missing_and_extra_arguments,
    anything_starting_with_quit_closes,
    quit_closes_the_connection,
    drain_mode_refuses_new_jobs,
    client_id_put_and_exists_in_every_state,
    client_ids_are_global_across_tubes,
    invalid_client_ids_are_bad_format,
    client_id_of_200_bytes_and_every_allowed_character,
    every_id_command_takes_a_client_id,
    digit_ids_never_name_client_id_jobs,
    unknown_client_id_is_not_found,
    finish_only_for_a_job_reserved_here,
    json_add_pop_finish,
    json_add_defaults_and_options,
    json_add_existing_id,
    json_pop_times_out,
    json_delete,
    json_errors_keep_the_connection,
    json_and_text_on_one_connection,
    json_popped_job_ttr_runs,
    json_popped_job_returns_when_the_connection_closes,
    json_pop_reads_only_its_topic,
    json_pop_waits_for_a_topic_that_does_not_exist_yet,
    json_pop_deadline_soon,
    json_pop_of_a_binary_body_replaces_invalid_utf8,
    json_unknown_fields_are_ignored,
);

// ---------------------------------------------------------------- basics

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

async fn use_routes_puts_and_reserve_follows_watch_list(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
    assert_eq!(c.cmd("use foo").await, "USING foo");
    assert_eq!(c.cmd("list-tube-used").await, "USING foo");
    let id = c.put_ok(0, 0, 60, b"in foo").await;
    assert_eq!(c.stats_job(id).await.get("tube"), "foo");
    // Watching only default: the job in foo is not ours.
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    assert_eq!(c.cmd("watch foo").await, "WATCHING 2");
    let job = c.reserved("reserve-with-timeout 0").await;
    assert_eq!(job.body, b"in foo");
    assert_eq!(c.cmd("use default").await, "USING default");
    assert_eq!(c.cmd("use default").await, "USING default");
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

// ---------------------------------------------------------------- time

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
    assert_between(
        "delayed delivery",
        put_at.elapsed(),
        SEC.mul_f32(0.9),
        3 * SEC,
    );
    assert_eq!(c.stats_job(id).await.get("state"), "reserved");
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

// ---------------------------------------------------------------- job commands

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

// ---------------------------------------------------------------- tubes

async fn watch_and_ignore_counts(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.yaml("list-tubes-watched").await.items, ["default"]);
    assert_eq!(c.cmd("watch a").await, "WATCHING 2");
    assert_eq!(c.cmd("watch a").await, "WATCHING 2");
    assert_eq!(c.cmd("watch b").await, "WATCHING 3");
    assert_eq!(
        c.yaml("list-tubes-watched").await.items,
        ["default", "a", "b"]
    );
    assert_eq!(c.stats_tube("a").await.num("current-watching"), 1);
    assert_eq!(c.cmd("ignore a").await, "WATCHING 2");
    assert_eq!(c.cmd("ignore not-watched").await, "WATCHING 2");
    assert_eq!(c.cmd("ignore default").await, "WATCHING 1");
    assert_eq!(c.cmd("ignore b").await, "NOT_IGNORED");
    assert_eq!(c.yaml("list-tubes-watched").await.items, ["b"]);
    let s = c.stats().await;
    assert_eq!((s.num("cmd-watch"), s.num("cmd-ignore")), (3, 4));
    assert_eq!(s.num("cmd-list-tubes-watched"), 3);
}

async fn peek_commands(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    for cmd in [
        "peek-ready",
        "peek-delayed",
        "peek-buried",
        "peek 1",
        "peek 0",
    ] {
        assert_eq!(c.cmd(cmd).await, "NOT_FOUND", "{cmd}");
    }
    let r1 = c.put_ok(5, 0, 60, b"ready 5").await;
    let r2 = c.put_ok(2, 0, 60, b"ready 2").await;
    let d1 = c.put_ok(0, 200, 60, b"delayed 200").await;
    let d2 = c.put_ok(0, 100, 60, b"delayed 100").await;
    let b1 = c.put_ok(0, 0, 60, b"buried first").await;
    c.reserved(&format!("reserve-job {b1}")).await;
    c.cmd(&format!("bury {b1} 0")).await;
    let b2 = c.put_ok(0, 0, 60, b"buried second").await;
    c.reserved(&format!("reserve-job {b2}")).await;
    c.cmd(&format!("bury {b2} 0")).await;

    let job = c.found("peek-ready").await;
    assert_eq!((job.id, job.body), (r2.to_string(), b"ready 2".to_vec()));
    let job = c.found("peek-delayed").await;
    assert_eq!(
        (job.id, job.body),
        (d2.to_string(), b"delayed 100".to_vec())
    );
    let job = c.found("peek-buried").await;
    assert_eq!(
        (job.id, job.body),
        (b1.to_string(), b"buried first".to_vec())
    );
    for (id, body) in [(r1, "ready 5"), (d1, "delayed 200"), (b2, "buried second")] {
        let job = c.found(&format!("peek {id}")).await;
        assert_eq!(
            (job.id, job.body),
            (id.to_string(), body.as_bytes().to_vec())
        );
    }
    // peek does not change anything.
    assert_eq!(c.stats_job(r2).await.get("state"), "ready");
    // A reserved job can be peeked by id.
    c.reserved(&format!("reserve-job {r1}")).await;
    assert_eq!(c.found(&format!("peek {r1}")).await.body, b"ready 5");
    let body = every_byte();
    let bin = c.put_ok(0, 0, 60, &body).await;
    assert_eq!(c.found(&format!("peek {bin}")).await.body, body);
    let s = c.stats().await;
    assert_eq!(s.num("cmd-peek"), 7);
    assert_eq!(s.num("cmd-peek-ready"), 2);
    assert_eq!(s.num("cmd-peek-delayed"), 2);
    assert_eq!(s.num("cmd-peek-buried"), 2);
}

async fn peek_ready_delayed_buried_use_the_used_tube(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.cmd("use elsewhere").await;
    c.put_ok(0, 0, 60, b"r").await;
    c.put_ok(0, 100, 60, b"d").await;
    let b = c.put_ok(0, 0, 60, b"b").await;
    c.reserved(&format!("reserve-job {b}")).await;
    c.cmd(&format!("bury {b} 0")).await;
    c.cmd("watch elsewhere").await;
    c.cmd("use default").await;
    for cmd in ["peek-ready", "peek-delayed", "peek-buried"] {
        assert_eq!(c.cmd(cmd).await, "NOT_FOUND", "{cmd} on default");
    }
    c.cmd("use elsewhere").await;
    assert_eq!(c.found("peek-ready").await.body, b"r");
    assert_eq!(c.found("peek-delayed").await.body, b"d");
    assert_eq!(c.found("peek-buried").await.body, b"b");
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

async fn tube_lifetime_and_list_order(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    assert_eq!(a.tubes().await, ["default"]);
    a.cmd("use foo").await;
    b.cmd("watch bar").await;
    assert_eq!(a.tubes().await, ["default", "foo", "bar"]);
    assert_eq!(a.stats().await.num("current-tubes"), 3);
    let s = a.stats_tube("foo").await;
    assert_eq!((s.num("current-using"), s.num("current-watching")), (1, 0));
    // foo holds a job, so it outlives its last user.
    let id = a.put_ok(0, 0, 60, b"x").await;
    a.cmd("use default").await;
    assert_eq!(a.tubes().await, ["default", "foo", "bar"]);
    // bar has nothing left once it is ignored.
    b.cmd("ignore bar").await;
    assert_eq!(a.tubes().await, ["default", "foo"]);
    assert_eq!(a.cmd("stats-tube bar").await, "NOT_FOUND");
    // Deleting the last job lets foo go.
    assert_eq!(a.cmd(&format!("delete {id}")).await, "DELETED");
    assert_eq!(a.tubes().await, ["default"]);
    // A reserved job keeps its tube alive too.
    a.cmd("use jobs").await;
    let id = a.put_ok(0, 0, 60, b"y").await;
    a.cmd("use default").await;
    b.reserved(&format!("reserve-job {id}")).await;
    assert_eq!(a.tubes().await, ["default", "jobs"]);
    // A tube that comes back is new: it goes to the end, counting afresh.
    a.cmd("use bar").await;
    assert_eq!(a.tubes().await, ["default", "jobs", "bar"]);
    b.cmd(&format!("delete {id}")).await;
    assert_eq!(a.tubes().await, ["default", "bar"]);
    // A closed connection lets go of its tubes.
    let mut c = server.client().await;
    c.cmd("use gone").await;
    c.cmd("watch gone-too").await;
    assert_eq!(a.tubes().await, ["default", "bar", "gone", "gone-too"]);
    drop(c);
    let y = a.poll_yaml("list-tubes", |y| y.items.len() == 2).await;
    assert_eq!(y.items, ["default", "bar"]);
    assert_eq!(a.stats().await.num("current-tubes"), 2);
    // foo held a job once; the foo made anew counts from zero.
    a.cmd("use foo").await;
    assert_eq!(a.stats_tube("foo").await.num("total-jobs"), 0);
}

async fn default_tube_always_exists(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    a.cmd("use x").await;
    a.cmd("watch x").await;
    assert_eq!(a.cmd("ignore default").await, "WATCHING 1");
    let s = a.stats_tube("default").await;
    assert_eq!((s.num("current-using"), s.num("current-watching")), (0, 0));
    assert_eq!(a.tubes().await, ["default", "x"]);
    let mut b = server.client().await;
    b.ping().await;
    drop(b);
    a.wait_stat("current-connections", 1).await;
    assert_eq!(a.tubes().await, ["default", "x"]);
}

// ---------------------------------------------------------------- stats

async fn stats_fields_match_beanstalkd(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let s = c.stats().await;
    let keys = s.keys();
    assert!(
        keys.len() >= BEANSTALKD_STATS.len(),
        "too few fields: {keys:?}"
    );
    assert_eq!(&keys[..BEANSTALKD_STATS.len()], BEANSTALKD_STATS);
    assert_eq!(s.get("draining"), "false");
    assert_eq!(s.num("max-job-size"), 65_535);
    assert_eq!(s.num("pid"), u64::from(std::process::id()));
    assert_eq!(s.num("binlog-max-size"), 10_485_760);
    let id = s.get("id");
    assert!(
        id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "id: {id:?}"
    );
    for k in ["rusage-utime", "rusage-stime"] {
        let v = s.get(k);
        let (secs, micros) = v.split_once('.').unwrap_or_else(|| panic!("{k}: {v}"));
        assert!(secs.parse::<u64>().is_ok() && micros.len() == 6, "{k}: {v}");
    }
    // delayq's extra counters come after beanstalkd's fields.
    for k in ["cmd-reserve-job", "cmd-kick-job", "cmd-finish"] {
        assert_eq!(s.num(k), 0, "{k}");
    }
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), keys.len(), "duplicate fields: {keys:?}");
}

async fn stats_job_fields_and_values(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.cmd("use jobs").await;
    let id = c.put_ok(1500, 0, 0, b"x").await;
    let s = c.stats_job(id).await;
    assert_eq!(s.keys(), BEANSTALKD_STATS_JOB);
    let want = [
        ("id", id.to_string()),
        ("tube", "jobs".into()),
        ("state", "ready".into()),
        ("pri", "1500".into()),
        ("age", "0".into()),
        ("delay", "0".into()),
        // beanstalkd raises a TTR of 0 to 1.
        ("ttr", "1".into()),
        ("time-left", "0".into()),
        ("file", "0".into()),
        ("reserves", "0".into()),
        ("timeouts", "0".into()),
        ("releases", "0".into()),
        ("buries", "0".into()),
        ("kicks", "0".into()),
    ];
    for (k, v) in want {
        assert_eq!(s.get(k), v, "{k}");
    }
    let d = c.put_ok(0, 30, 60, b"x").await;
    let s = c.stats_job(d).await;
    assert_eq!((s.get("state"), s.num("delay")), ("delayed", 30));
    assert!((28..=30).contains(&s.num("time-left")), "{s:?}");
    c.cmd("watch jobs").await;
    c.reserved(&format!("reserve-job {id}")).await;
    let s = c.stats_job(id).await;
    assert_eq!((s.get("state"), s.num("reserves")), ("reserved", 1));
    assert!(s.num("time-left") <= 1, "{s:?}");
    assert_eq!(c.cmd("stats-job 999").await, "NOT_FOUND");
    assert_eq!(c.stats().await.num("cmd-stats-job"), 4);
}

async fn stats_tube_fields_and_values(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut w = server.client().await;
    w.ping().await;
    let s = c.stats_tube("default").await;
    assert_eq!(s.keys(), BEANSTALKD_STATS_TUBE);
    for k in &BEANSTALKD_STATS_TUBE[1..] {
        let want = match *k {
            "current-using" | "current-watching" => 2,
            _ => 0,
        };
        assert_eq!(s.num(k), want, "{k}");
    }
    assert_eq!(s.get("name"), "default");
    c.cmd("use t").await;
    c.put_ok(0, 0, 60, b"urgent").await;
    c.put_ok(1024, 0, 60, b"not urgent").await;
    c.put_ok(0, 100, 60, b"delayed").await;
    w.cmd("watch t").await;
    w.reserved("reserve-job 1").await;
    let s = c.stats_tube("t").await;
    let want = [
        ("current-jobs-urgent", 0),
        ("current-jobs-ready", 1),
        ("current-jobs-reserved", 1),
        ("current-jobs-delayed", 1),
        ("current-jobs-buried", 0),
        ("total-jobs", 3),
        ("current-using", 1),
        ("current-watching", 1),
        ("current-waiting", 0),
        ("cmd-delete", 0),
    ];
    for (k, v) in want {
        assert_eq!(s.num(k), v, "{k}");
    }
    w.cmd("delete 1").await;
    w.send_line("reserve-with-timeout 10").await;
    // w gets the ready job at once, then blocks on the next reserve.
    let line = w.line().await;
    w.job_after("RESERVED", &line).await;
    w.send_line("reserve").await;
    let s = c
        .poll_yaml("stats-tube t", |y| y.num("current-waiting") == 1)
        .await;
    assert_eq!(s.num("cmd-delete"), 1);
    assert_eq!(s.num("current-jobs-reserved"), 1);
    assert_eq!(c.stats_tube("default").await.num("current-waiting"), 1);
}

async fn stats_command_counters(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.put(0, 0, 60, b"x").await, "INSERTED 1");
    // One of each command (but `stats`, which comes last), whatever its answer.
    let script = [
        ("peek 1", "FOUND 1 1"),
        ("peek-ready", "FOUND 1 1"),
        ("peek-delayed", "NOT_FOUND"),
        ("peek-buried", "NOT_FOUND"),
        ("reserve", "RESERVED 1 1"),
        ("release 1 0 0", "RELEASED"),
        ("reserve-with-timeout 0", "RESERVED 1 1"),
        ("bury 1 0", "BURIED"),
        ("kick 1", "KICKED 1"),
        ("use t", "USING t"),
        ("watch t", "WATCHING 2"),
        ("ignore t", "WATCHING 1"),
        ("touch 1", "NOT_FOUND"),
        ("kick-job 1", "NOT_FOUND"),
        ("pause-tube default 0", "PAUSED"),
        ("reserve-job 1", "RESERVED 1 1"),
        ("stats-job 1", "OK"),
        ("stats-tube default", "OK"),
        ("list-tubes", "OK"),
        ("list-tube-used", "USING t"),
        ("list-tubes-watched", "OK"),
        ("finish 1", "FINISHED"),
        ("delete 1", "NOT_FOUND"),
    ];
    for (cmd, want) in script {
        assert_eq!(c.reply(cmd).await, want, "{cmd}");
    }
    // Malformed commands are not counted.
    assert_eq!(c.cmd("peek x:").await, "NOT_FOUND");
    assert_eq!(c.cmd("delete -1").await, "BAD_FORMAT");
    let s = c.stats().await;
    for k in BEANSTALKD_STATS.iter().filter(|k| k.starts_with("cmd-")) {
        let want = match *k {
            "cmd-peek" => 2,
            _ => 1,
        };
        assert_eq!(s.num(k), want, "{k}");
    }
    for k in ["cmd-reserve-job", "cmd-kick-job", "cmd-finish"] {
        assert_eq!(s.num(k), 1, "{k}");
    }
    assert_eq!(s.num("total-jobs"), 1);
    assert_eq!(s.num("current-jobs-ready"), 0);
}

async fn stats_job_counts_by_state(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let j1 = c.put_ok(0, 0, 60, b"1").await;
    let _j2 = c.put_ok(2000, 0, 60, b"2").await;
    let _j3 = c.put_ok(0, 100, 60, b"3").await;
    let j4 = c.put_ok(5, 0, 60, b"4").await;
    let _j5 = c.put_ok(10, 0, 60, b"5").await;
    assert_eq!(c.reserve_body().await.id, j1.to_string());
    c.reserved(&format!("reserve-job {j4}")).await;
    assert_eq!(c.cmd(&format!("bury {j4} 0")).await, "BURIED");
    for doc in [c.stats().await, c.stats_tube("default").await] {
        let want = [
            ("current-jobs-urgent", 1),
            ("current-jobs-ready", 2),
            ("current-jobs-reserved", 1),
            ("current-jobs-delayed", 1),
            ("current-jobs-buried", 1),
            ("total-jobs", 5),
        ];
        for (k, v) in want {
            assert_eq!(doc.num(k), v, "{k}");
        }
    }
    for id in 1..=5 {
        assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    }
    let s = c.stats().await;
    for k in [
        "current-jobs-urgent",
        "current-jobs-ready",
        "current-jobs-reserved",
        "current-jobs-delayed",
        "current-jobs-buried",
    ] {
        assert_eq!(s.num(k), 0, "{k}");
    }
    assert_eq!(s.num("total-jobs"), 5);
}

async fn stats_connection_counters(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    let mut c = server.client().await;
    for x in [&mut a, &mut b, &mut c] {
        x.ping().await;
    }
    let s = a.stats().await;
    let want = [
        ("current-connections", 3),
        ("total-connections", 3),
        ("current-producers", 0),
        ("current-workers", 0),
        ("current-waiting", 0),
    ];
    for (k, v) in want {
        assert_eq!(s.num(k), v, "{k}");
    }
    a.put_ok(0, 0, 60, b"x").await;
    a.put_ok(0, 0, 60, b"y").await;
    assert_eq!(b.reply("reserve-with-timeout 0").await, "RESERVED 1 1");
    let s = c.stats().await;
    assert_eq!(
        (s.num("current-producers"), s.num("current-workers")),
        (1, 1)
    );
    assert_eq!(c.reply("reserve-with-timeout 0").await, "RESERVED 2 1");
    c.send_line("reserve").await;
    let s = a.wait_stat("current-waiting", 1).await;
    assert_eq!(s.num("current-workers"), 2);
    drop(c);
    let s = a.wait_stat("current-connections", 2).await;
    assert_eq!(s.num("current-workers"), 1);
    assert_eq!(s.num("current-waiting"), 0);
    assert_eq!(s.num("total-connections"), 3);
    // c's reservation came back when it left.
    assert_eq!(s.num("current-jobs-ready"), 1);
    drop(b);
    let s = a.wait_stat("current-connections", 1).await;
    assert_eq!(
        (s.num("current-workers"), s.num("current-producers")),
        (0, 1)
    );
    let mut d = server.client().await;
    d.ping().await;
    drop(a);
    let s = d.wait_stat("current-connections", 1).await;
    assert_eq!(s.num("current-producers"), 0);
    assert_eq!(s.num("total-connections"), 4);
}

async fn version_is_the_crate_version(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let s = c.stats().await;
    assert_eq!(
        s.get("version"),
        format!("\"{}\"", env!("CARGO_PKG_VERSION"))
    );
}

async fn max_values_are_accepted(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let max = u32::MAX;
    let id = c.put_ok(max, max, max, b"x").await;
    let s = c.stats_job(id).await;
    assert_eq!(
        (s.num("pri"), s.num("delay"), s.num("ttr")),
        (4294967295, 4294967295, 4294967295)
    );
    assert_eq!(s.get("state"), "delayed");
    assert_eq!(c.cmd(&format!("kick-job {id}")).await, "KICKED");
    c.reserve_body().await;
    assert!(c.stats_job(id).await.num("time-left") >= 4_294_967_290);
    assert_eq!(c.cmd(&format!("touch {id}")).await, "TOUCHED");
    assert_eq!(
        c.cmd(&format!("release {id} 4294967295 4294967295")).await,
        "RELEASED"
    );
    assert_eq!(c.cmd("pause-tube default 4294967295").await, "PAUSED");
    assert_eq!(c.cmd("pause-tube default 0").await, "PAUSED");
    assert_eq!(c.cmd("kick 18446744073709551615").await, "KICKED 1");
    assert_eq!(c.cmd("peek 18446744073709551615").await, "NOT_FOUND");
}

// ---------------------------------------------------------------- errors

async fn error_words_for_missing_and_extra_arguments(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // As beanstalkd 1.12 answers each (checked against it).
    let cases = [
        ("put", "UNKNOWN_COMMAND"),
        ("use", "UNKNOWN_COMMAND"),
        ("delete", "UNKNOWN_COMMAND"),
        ("release", "UNKNOWN_COMMAND"),
        ("bury", "UNKNOWN_COMMAND"),
        ("touch", "UNKNOWN_COMMAND"),
        ("watch", "UNKNOWN_COMMAND"),
        ("ignore", "UNKNOWN_COMMAND"),
        ("peek", "UNKNOWN_COMMAND"),
        ("kick", "UNKNOWN_COMMAND"),
        ("kick-job", "UNKNOWN_COMMAND"),
        ("finish", "UNKNOWN_COMMAND"),
        ("reserve-with-timeout", "BAD_FORMAT"),
        ("reserve-job", "BAD_FORMAT"),
        ("stats-job", "BAD_FORMAT"),
        ("stats-tube", "BAD_FORMAT"),
        ("pause-tube", "BAD_FORMAT"),
        // beanstalkd recognises argument-less commands by prefix.
        ("statsx", "BAD_FORMAT"),
        ("reservex", "BAD_FORMAT"),
        ("peek-readyx", "BAD_FORMAT"),
        ("peek-delayedx", "BAD_FORMAT"),
        ("peek-buriedx", "BAD_FORMAT"),
        ("list-tubesx", "BAD_FORMAT"),
        ("list-tube-usedx", "BAD_FORMAT"),
        ("list-tubes-watchedx", "BAD_FORMAT"),
        ("pause-tubex", "BAD_FORMAT"),
        ("stats-jobx", "BAD_FORMAT"),
        ("reserve-jobs 1", "BAD_FORMAT"),
        ("stats-tubes default", "BAD_FORMAT"),
        ("deletex 1", "UNKNOWN_COMMAND"),
        ("foo ", "UNKNOWN_COMMAND"),
        ("put 1", "BAD_FORMAT"),
        ("put 0 0 60", "BAD_FORMAT"),
        ("delete 1 2", "BAD_FORMAT"),
        ("release 1", "BAD_FORMAT"),
        ("release 1 2", "BAD_FORMAT"),
        ("bury 1", "BAD_FORMAT"),
        ("pause-tube x", "BAD_FORMAT"),
        ("stats x", "BAD_FORMAT"),
        ("list-tubes x", "BAD_FORMAT"),
        ("peek-ready x", "BAD_FORMAT"),
        ("use a:b", "BAD_FORMAT"),
        ("use -a", "BAD_FORMAT"),
        ("watch a b", "BAD_FORMAT"),
        ("nonsense", "UNKNOWN_COMMAND"),
        ("PUT 0 0 0 0", "UNKNOWN_COMMAND"),
        ("", "UNKNOWN_COMMAND"),
    ];
    for (cmd, want) in cases {
        assert_eq!(c.cmd(cmd).await, want, "{cmd:?}");
    }
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
}

async fn quit_closes_the_connection(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    b.ping().await;
    // Replies before the quit still arrive; nothing after it runs.
    a.send(b"put 0 0 60 1\r\nx\r\nquit\r\nput 0 0 60 1\r\ny\r\n")
        .await;
    assert_eq!(a.line().await, "INSERTED 1");
    assert!(a.expect_closed().await.is_empty());
    let s = b.wait_stat("current-connections", 1).await;
    assert_eq!(s.num("total-jobs"), 1);
}

async fn anything_starting_with_quit_closes(backend: Backend) {
    let server = TestServer::start(backend).await;
    for line in ["quit x", "quitx", "quit 1 2"] {
        let mut c = server.client().await;
        c.send(format!("list-tube-used\r\n{line}\r\nlist-tube-used\r\n").as_bytes())
            .await;
        assert_eq!(c.line().await, "USING default");
        assert!(c.expect_closed().await.is_empty(), "{line:?}");
    }
}

async fn drain_mode_refuses_new_jobs(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = c.put_ok(0, 0, 60, b"before").await;
    assert_eq!(
        c.put_id(0, 0, 60, b"named", "named:0").await,
        "INSERTED named:0"
    );
    server.set_draining(true);
    assert_eq!(c.put(0, 0, 60, b"during").await, "DRAINING");
    assert_eq!(c.put_id(0, 0, 60, b"during", "named:1").await, "DRAINING");
    // Drain mode is checked before the id.
    assert_eq!(c.put_id(0, 0, 60, b"again", "named:0").await, "DRAINING");
    let reply = c
        .json(&json!({"command": "add", "topic": "default", "body": "during"}))
        .await;
    assert_eq!(reply, json!({"success": false, "error": "DRAINING"}));
    // Size and framing are checked before drain mode.
    c.send(b"put 0 0 60 70000\r\n").await;
    c.send(&vec![b'x'; 70_002]).await;
    assert_eq!(c.line().await, "JOB_TOO_BIG");
    c.send(b"put 0 0 60 1\r\nxyz\r\n").await;
    assert_eq!(c.line().await, "EXPECTED_CRLF");
    assert_eq!(c.line().await, "UNKNOWN_COMMAND");
    let s = c.stats().await;
    assert_eq!(s.get("draining"), "true");
    assert_eq!(s.num("total-jobs"), 2);
    // Refused puts are counted; malformed ones are not.
    assert_eq!(s.num("cmd-put"), 6);
    // Existing work still flows.
    assert_eq!(c.reserve_body().await.id, id.to_string());
    assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    assert_eq!(c.found("peek named:0").await.body, b"named");
    // The switch is read live (SIGUSR1 only ever sets it).
    server.set_draining(false);
    assert_eq!(c.stats().await.get("draining"), "false");
    assert!(c.put_ok(0, 0, 60, b"after").await > id);
}

// ---------------------------------------------------------------- client ids

const OID: &str = "order-close:4711";

async fn client_id_put_and_exists_in_every_state(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let exists = format!("EXISTS {OID}");
    assert_eq!(
        c.put_id(5, 0, 100, b"first", OID).await,
        format!("INSERTED {OID}")
    );
    // ready
    assert_eq!(c.put_id(1, 0, 100, b"second", OID).await, exists);
    // reserved
    let job = c.reserve_body().await;
    assert_eq!((job.id.as_str(), &job.body[..]), (OID, &b"first"[..]));
    assert_eq!(c.put_id(1, 0, 100, b"second", OID).await, exists);
    // delayed
    assert_eq!(c.cmd(&format!("release {OID} 5 100")).await, "RELEASED");
    assert_eq!(c.put_id(1, 0, 100, b"second", OID).await, exists);
    // buried
    c.reserved(&format!("reserve-job {OID}")).await;
    assert_eq!(c.cmd(&format!("bury {OID} 5")).await, "BURIED");
    assert_eq!(c.put_id(1, 0, 100, b"second", OID).await, exists);
    // Nothing changed.
    let job = c.found(&format!("peek {OID}")).await;
    assert_eq!((job.id.as_str(), &job.body[..]), (OID, &b"first"[..]));
    let s = c.stats_job(OID).await;
    assert_eq!(
        (s.get("state"), s.num("pri"), s.num("ttr")),
        ("buried", 5, 100)
    );
    let s = c.stats().await;
    assert_eq!((s.num("total-jobs"), s.num("current-jobs-buried")), (1, 1));
    assert_eq!(
        s.num("current-jobs-ready") + s.num("current-jobs-delayed"),
        0
    );
    // Once the job is gone the id is free again.
    assert_eq!(c.cmd(&format!("delete {OID}")).await, "DELETED");
    assert_eq!(
        c.put_id(1, 0, 100, b"third", OID).await,
        format!("INSERTED {OID}")
    );
    assert_eq!(c.reserve_body().await.body, b"third");
}

async fn client_ids_are_global_across_tubes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    assert_eq!(a.put_id(0, 0, 60, b"x", "job:1").await, "INSERTED job:1");
    b.cmd("use other").await;
    assert_eq!(b.put_id(0, 0, 60, b"y", "job:1").await, "EXISTS job:1");
    assert_eq!(b.stats_job("job:1").await.get("tube"), "default");
    assert!(b.cmd("list-tube-used").await.ends_with("other"));
}

async fn invalid_client_ids_are_bad_format(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let long = "a".repeat(201);
    for id in [
        "-abc",
        "4711",
        "0",
        long.as_str(),
        "a#b",
        "a,b",
        "a\"b",
        "caf\u{e9}",
        "a*",
    ] {
        c.send(format!("put 0 0 60 5 {id}\r\nhello\r\n").as_bytes())
            .await;
        assert_eq!(c.line().await, "BAD_FORMAT", "id {id:?}");
        // As in beanstalkd, the body line is then read as a command.
        assert_eq!(c.line().await, "UNKNOWN_COMMAND", "body after id {id:?}");
    }
    // Two ids, or a trailing space, are malformed too.
    for line in ["put 0 0 60 5 a b", "put 0 0 60 5 a "] {
        c.send(format!("{line}\r\nhello\r\n").as_bytes()).await;
        assert_eq!(c.line().await, "BAD_FORMAT", "{line:?}");
        assert_eq!(c.line().await, "UNKNOWN_COMMAND");
    }
    assert_eq!(c.stats().await.num("total-jobs"), 0);
}

async fn client_id_of_200_bytes_and_every_allowed_character(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let long = "z".repeat(200);
    let odd = "Az09-+/;.$_():@";
    for id in [long.as_str(), odd, "@start", "1a", "a1", "(x)", "007x"] {
        assert_eq!(c.put_id(0, 0, 60, b"x", id).await, format!("INSERTED {id}"));
        let job = c.reserve_body().await;
        assert_eq!(job.id, id);
        assert_eq!(c.stats_job(id).await.get("id"), format!("\"{id}\""));
        assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    }
}

async fn every_id_command_takes_a_client_id(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = OID;
    assert_eq!(
        c.put_id(7, 0, 60, b"body", id).await,
        format!("INSERTED {id}")
    );
    let job = c.found(&format!("peek {id}")).await;
    assert_eq!((job.id.as_str(), &job.body[..]), (id, &b"body"[..]));
    let s = c.stats_job(id).await;
    assert_eq!(s.get("id"), "\"order-close:4711\"");
    assert_eq!(s.map()["tube"], "default");
    assert_eq!(c.found("peek-ready").await.id, id);
    let job = c.reserved(&format!("reserve-job {id}")).await;
    assert_eq!(job.id, id);
    assert_eq!(c.cmd(&format!("touch {id}")).await, "TOUCHED");
    assert_eq!(c.cmd(&format!("release {id} 3 100")).await, "RELEASED");
    assert_eq!(c.found("peek-delayed").await.id, id);
    assert_eq!(c.cmd(&format!("kick-job {id}")).await, "KICKED");
    assert_eq!(c.reserve_body().await.id, id);
    assert_eq!(c.cmd(&format!("bury {id} 2")).await, "BURIED");
    assert_eq!(c.found("peek-buried").await.id, id);
    assert_eq!(c.cmd("kick 1").await, "KICKED 1");
    let s = c.stats_job(id).await;
    let got = (
        s.num("pri"),
        s.num("releases"),
        s.num("buries"),
        s.num("kicks"),
    );
    assert_eq!(got, (2, 1, 1, 2));
    assert_eq!(s.num("reserves"), 2);
    assert_eq!(c.reserve_body().await.id, id);
    assert_eq!(c.cmd(&format!("finish {id}")).await, "FINISHED");
    assert_eq!(
        c.put_id(7, 0, 60, b"body", id).await,
        format!("INSERTED {id}")
    );
    assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    for cmd in [
        "peek",
        "stats-job",
        "delete",
        "kick-job",
        "touch",
        "reserve-job",
        "finish",
    ] {
        assert_eq!(c.cmd(&format!("{cmd} {id}")).await, "NOT_FOUND", "{cmd}");
    }
    assert_eq!(c.cmd(&format!("release {id} 0 0")).await, "NOT_FOUND");
    assert_eq!(c.cmd(&format!("bury {id} 0")).await, "NOT_FOUND");
}

async fn digit_ids_never_name_client_id_jobs(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let named = c.put_id(0, 0, 60, b"named", "n:1").await;
    assert_eq!(named, "INSERTED n:1");
    let n = c.put_ok(0, 0, 60, b"numbered").await;
    // However server ids are counted, no number reaches the named job.
    for id in 0..=n + 1 {
        match c.cmd(&format!("peek {id}")).await.as_str() {
            "NOT_FOUND" => {}
            line => {
                let job = c.job_after("FOUND", line).await;
                assert_eq!((job.id, job.body), (id.to_string(), b"numbered".to_vec()));
            }
        }
    }
}

async fn unknown_client_id_is_not_found(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // beanstalkd says BAD_FORMAT; for delayq `abc` is a valid client id.
    for cmd in [
        "delete abc",
        "delete +1",
        "peek abc",
        "touch abc",
        "kick-job abc",
        "stats-job abc",
        "reserve-job abc",
        "finish abc",
        "release abc 0 0",
        "bury abc 0",
    ] {
        assert_eq!(c.cmd(cmd).await, "NOT_FOUND", "{cmd}");
    }
    for cmd in ["delete a#c", "peek -abc", "touch a.b!", "stats-job a*"] {
        assert_eq!(c.cmd(cmd).await, "BAD_FORMAT", "{cmd}");
    }
}

async fn finish_only_for_a_job_reserved_here(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.put_id(0, 0, 60, b"named", "job:a").await;
    let n = a.put_ok(0, 0, 60, b"numbered").await;
    assert_eq!(a.cmd("finish job:a").await, "NOT_FOUND", "ready");
    assert_eq!(b.reserve_body().await.id, "job:a");
    assert_eq!(
        a.cmd("finish job:a").await,
        "NOT_FOUND",
        "reserved elsewhere"
    );
    assert_eq!(b.cmd("finish job:a").await, "FINISHED");
    assert_eq!(b.cmd("finish job:a").await, "NOT_FOUND", "gone");
    assert_eq!(b.cmd("peek job:a").await, "NOT_FOUND");
    assert_eq!(b.reserve_body().await.id, n.to_string());
    b.cmd(&format!("bury {n} 0")).await;
    assert_eq!(b.cmd(&format!("finish {n}")).await, "NOT_FOUND", "buried");
    b.cmd(&format!("kick-job {n}")).await;
    b.reserve_body().await;
    assert_eq!(b.cmd(&format!("finish {n}")).await, "FINISHED");
    assert_eq!(b.cmd("finish 999").await, "NOT_FOUND");
    let s = a.stats().await;
    assert_eq!(s.num("cmd-finish"), 7);
    // A finish removes the job like a delete does, for the tube's count.
    assert_eq!(a.stats_tube("default").await.num("cmd-delete"), 2);
    assert_eq!(
        s.num("current-jobs-reserved") + s.num("current-jobs-ready"),
        0
    );
    assert_eq!(s.num("current-jobs-buried"), 0);
}

// ---------------------------------------------------------------- JSON lines

async fn json_add_pop_finish(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let add = json!({
        "command": "add", "topic": "orders", "id": OID,
        "delay": 0, "ttr": 30, "priority": 5, "body": "close it",
    });
    assert_eq!(c.json(&add).await, json!({"success": true, "id": OID}));
    let pop = json!({"command": "pop", "topic": "orders", "timeout": 0});
    assert_eq!(
        c.json(&pop).await,
        json!({"success": true, "id": OID, "topic": "orders", "value": "close it"})
    );
    let s = c.stats_job(OID).await;
    assert_eq!(
        (s.get("state"), s.num("pri"), s.num("ttr")),
        ("reserved", 5, 30)
    );
    assert_eq!(
        c.json(&pop).await,
        json!({"success": false, "error": "TIMED_OUT"})
    );
    let finish = json!({"command": "finish", "id": OID});
    assert_eq!(c.json(&finish).await, json!({"success": true, "id": OID}));
    assert_eq!(
        c.json(&finish).await,
        json!({"success": false, "error": "NOT_FOUND"})
    );
    // Server ids travel as strings, and bare numbers are accepted.
    let reply = c
        .json(&json!({"command": "add", "topic": "orders", "body": "b"}))
        .await;
    assert_eq!(reply["success"], true);
    let id = reply["id"].as_str().expect("id is a string").to_string();
    let n: u64 = id.parse().expect("a server id is a number in a string");
    let got = c.json(&pop).await;
    assert_eq!(got["id"], id);
    let reply = c.json(&json!({"command": "finish", "id": n})).await;
    assert_eq!(reply, json!({"success": true, "id": id}));
    let s = c.stats().await;
    assert_eq!((s.num("cmd-put"), s.num("cmd-finish")), (2, 3));
    assert_eq!(
        (s.num("current-producers"), s.num("current-workers")),
        (1, 1)
    );
    assert_eq!(s.num("cmd-reserve-with-timeout"), 3);
}

async fn json_add_defaults_and_options(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let r = c
        .json(&json!({"command": "add", "topic": "t", "body": "x"}))
        .await;
    let s = c.stats_job(r["id"].as_str().unwrap()).await;
    let got = (s.num("pri"), s.num("delay"), s.num("ttr"), s.get("state"));
    assert_eq!(got, (1024, 0, 60, "ready"));
    assert_eq!(s.get("tube"), "t");
    let r = c
        .json(&json!({"command": "add", "topic": "t", "body": "later", "delay": 100, "priority": 0, "ttr": 7}))
        .await;
    let s = c.stats_job(r["id"].as_str().unwrap()).await;
    let got = (s.num("pri"), s.num("delay"), s.num("ttr"), s.get("state"));
    assert_eq!(got, (0, 100, 7, "delayed"));
    // Explicit nulls mean the defaults; a null id means a server id.
    let r = c
        .json(&json!({"command": "add", "topic": "t", "body": "n", "id": null, "delay": null}))
        .await;
    assert_eq!(r, json!({"success": true, "id": "3"}));
    // Non-ASCII text survives the round trip, in both protocols.
    let r = c
        .json(&json!({"command": "add", "topic": "u", "body": "héllo ✓"}))
        .await;
    let id = r["id"].as_str().unwrap().to_string();
    c.cmd("watch u").await;
    let job = c.reserved(&format!("reserve-job {id}")).await;
    assert_eq!(job.body, "héllo ✓".as_bytes());
    c.cmd(&format!("release {id} 0 0")).await;
    let got = c
        .json(&json!({"command": "pop", "topic": "u", "timeout": 0}))
        .await;
    assert_eq!(got["value"], "héllo ✓");
}

async fn json_add_existing_id(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let add = json!({"command": "add", "topic": "t", "id": "dup:1", "body": "one"});
    assert_eq!(c.json(&add).await, json!({"success": true, "id": "dup:1"}));
    let again = json!({"command": "add", "topic": "other", "id": "dup:1", "body": "two"});
    assert_eq!(
        c.json(&again).await,
        json!({"success": false, "error": "EXISTS", "id": "dup:1"})
    );
    assert_eq!(c.put_id(0, 0, 60, b"three", "dup:1").await, "EXISTS dup:1");
    assert_eq!(c.found("peek dup:1").await.body, b"one");
    assert_eq!(c.stats().await.num("total-jobs"), 1);
    assert_eq!(c.tubes().await, ["default", "t"]);
}

async fn json_pop_times_out(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let pop0 = json!({"command": "pop", "topic": "t", "timeout": 0});
    let (reply, took) = timed(c.json(&pop0)).await;
    assert_eq!(reply, json!({"success": false, "error": "TIMED_OUT"}));
    assert!(took < SEC / 2, "took {took:?}");
    let pop1 = json!({"command": "pop", "topic": "t", "timeout": 1});
    let (reply, took) = timed(c.json(&pop1)).await;
    assert_eq!(reply, json!({"success": false, "error": "TIMED_OUT"}));
    assert_between("pop with timeout 1", took, SEC.mul_f32(0.9), 3 * SEC);
}

async fn json_delete(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.json(&json!({"command": "add", "topic": "t", "id": "d:1", "body": "x"}))
        .await;
    let n = c.put_ok(0, 0, 60, b"y").await;
    let del = json!({"command": "delete", "id": "d:1"});
    assert_eq!(c.json(&del).await, json!({"success": true, "id": "d:1"}));
    assert_eq!(
        c.json(&del).await,
        json!({"success": false, "error": "NOT_FOUND"})
    );
    let del = json!({"command": "delete", "id": n.to_string()});
    assert_eq!(
        c.json(&del).await,
        json!({"success": true, "id": n.to_string()})
    );
    assert_eq!(c.stats().await.num("cmd-delete"), 3);
    assert_eq!(c.tubes().await, ["default"]);
}

async fn json_errors_keep_the_connection(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let bad = json!({"success": false, "error": "BAD_FORMAT"});
    let unknown = json!({"success": false, "error": "UNKNOWN_COMMAND"});
    let cases = [
        (r#"{"#, &bad),
        (r#"{"command":"add","topic":"t","body":"x"} trailing"#, &bad),
        (r#"{}"#, &bad),
        (r#"{"command":5}"#, &bad),
        (r#"{"command":"reserve"}"#, &unknown),
        (r#"{"command":"nope","topic":"t"}"#, &unknown),
        (r#"{"command":"add","body":"x"}"#, &bad),
        (r#"{"command":"add","topic":"t"}"#, &bad),
        (r#"{"command":"add","topic":"t","body":7}"#, &bad),
        (r#"{"command":"add","topic":"a:b","body":"x"}"#, &bad),
        (
            r#"{"command":"add","topic":"t","body":"x","id":"123"}"#,
            &bad,
        ),
        (
            r#"{"command":"add","topic":"t","body":"x","id":"-x"}"#,
            &bad,
        ),
        (r#"{"command":"add","topic":"t","body":"x","id":5}"#, &bad),
        (
            r#"{"command":"add","topic":"t","body":"x","delay":-1}"#,
            &bad,
        ),
        (
            r#"{"command":"add","topic":"t","body":"x","delay":1.5}"#,
            &bad,
        ),
        (
            r#"{"command":"add","topic":"t","body":"x","ttr":"5"}"#,
            &bad,
        ),
        (
            r#"{"command":"add","topic":"t","body":"x","priority":4294967296}"#,
            &bad,
        ),
        (r#"{"command":"pop"}"#, &bad),
        (r#"{"command":"pop","topic":"t","timeout":-1}"#, &bad),
        (r#"{"command":"finish"}"#, &bad),
        (r#"{"command":"delete","id":"a b"}"#, &bad),
        (r#"{"command":"delete","id":-1}"#, &bad),
    ];
    for (line, want) in cases {
        assert_eq!(&c.json_raw(line).await, want, "{line}");
    }
    // Not UTF-8: not JSON.
    c.send(b"{\"command\":\"add\",\"topic\":\"t\",\"body\":\"\xff\"}\r\n")
        .await;
    assert_eq!(c.line().await, r#"{"success":false,"error":"BAD_FORMAT"}"#);
    assert_eq!(c.stats().await.num("total-jobs"), 0);
    let ok = c
        .json(&json!({"command": "add", "topic": "t", "body": "fine"}))
        .await;
    assert_eq!(ok, json!({"success": true, "id": "1"}));
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
}

async fn json_and_text_on_one_connection(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // JSON add, text reserve.
    c.json(&json!({"command": "add", "topic": "default", "id": "mix:1", "body": "from json"}))
        .await;
    let job = c.reserve_body().await;
    assert_eq!(
        (job.id.as_str(), &job.body[..]),
        ("mix:1", &b"from json"[..])
    );
    // Text put, JSON pop, text delete.
    let id = c.put_ok(0, 0, 60, b"from text").await;
    let got = c
        .json(&json!({"command": "pop", "topic": "default", "timeout": 0}))
        .await;
    assert_eq!(
        got,
        json!({"success": true, "id": id.to_string(), "topic": "default", "value": "from text"})
    );
    assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    // JSON finish of the job reserved over text.
    let reply = c.json(&json!({"command": "finish", "id": "mix:1"})).await;
    assert_eq!(reply, json!({"success": true, "id": "mix:1"}));
    // Pipelined, mixed, answered in order and each in its own protocol.
    c.send(
        b"{\"command\":\"add\",\"topic\":\"p\",\"body\":\"a\"}\r\nlist-tube-used\r\n\
          {\"command\":\"pop\",\"topic\":\"p\",\"timeout\":0}\nuse p\n",
    )
    .await;
    let added: serde_json::Value = serde_json::from_str(&c.line().await).unwrap();
    assert_eq!(added["success"], true);
    assert_eq!(c.line().await, "USING default");
    let got: serde_json::Value = serde_json::from_str(&c.line().await).unwrap();
    assert_eq!((&got["value"], &got["id"]), (&json!("a"), &added["id"]));
    assert_eq!(c.line().await, "USING p");
}

async fn json_popped_job_ttr_runs(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.json(&json!({"command": "add", "topic": "t", "id": "ttr:1", "ttr": 1, "body": "x"}))
        .await;
    let popped_at = Instant::now();
    let got = a.json(&json!({"command": "pop", "topic": "t"})).await;
    assert_eq!(got["id"], "ttr:1");
    assert_eq!(b.stats_job("ttr:1").await.get("state"), "reserved");
    // The connection holds it: another pop waits for the TTR to run out.
    let got = b
        .json(&json!({"command": "pop", "topic": "t", "timeout": 5}))
        .await;
    assert_eq!(got["id"], "ttr:1");
    assert_between(
        "TTR of a popped job",
        popped_at.elapsed(),
        SEC.mul_f32(0.9),
        3 * SEC,
    );
    let s = b.stats_job("ttr:1").await;
    assert_eq!((s.num("timeouts"), s.num("reserves")), (1, 2));
    let finish = json!({"command": "finish", "id": "ttr:1"});
    assert_eq!(a.json(&finish).await["success"], false);
    assert_eq!(b.json(&finish).await["success"], true);
}

async fn json_popped_job_returns_when_the_connection_closes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.json(&json!({"command": "add", "topic": "t", "id": "held", "ttr": 100, "body": "x"}))
        .await;
    let got = a
        .json(&json!({"command": "pop", "topic": "t", "timeout": 0}))
        .await;
    assert_eq!(got["id"], "held");
    assert_eq!(
        b.json(&json!({"command": "pop", "topic": "t", "timeout": 0}))
            .await["error"],
        "TIMED_OUT"
    );
    b.send_line(&json!({"command": "pop", "topic": "t"}).to_string())
        .await;
    let mut watcher = server.client().await;
    watcher
        .poll_yaml("stats-tube t", |y| y.num("current-waiting") == 1)
        .await;
    let (got, took) = timed(async {
        drop(a);
        b.line().await
    })
    .await;
    assert!(took < SEC, "took {took:?}");
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(got["id"], "held");
    assert_eq!(b.stats_job("held").await.num("timeouts"), 0);
}

async fn json_pop_reads_only_its_topic(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.put_ok(0, 0, 60, b"in default").await;
    c.json(&json!({"command": "add", "topic": "t", "body": "in t", "priority": 9999}))
        .await;
    let got = c
        .json(&json!({"command": "pop", "topic": "t", "timeout": 0}))
        .await;
    assert_eq!(got["value"], "in t");
    let got = c
        .json(&json!({"command": "pop", "topic": "none", "timeout": 0}))
        .await;
    assert_eq!(got["error"], "TIMED_OUT");
    // pop does not change the watch list.
    assert_eq!(c.yaml("list-tubes-watched").await.items, ["default"]);
    assert_eq!(c.reserve_body().await.body, b"in default");
}

async fn json_pop_waits_for_a_topic_that_does_not_exist_yet(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut worker = server.client().await;
    let mut producer = server.client().await;
    worker
        .send_line(&json!({"command": "pop", "topic": "new"}).to_string())
        .await;
    producer.wait_stat("current-waiting", 1).await;
    let add = json!({"command": "add", "topic": "new", "id": "first", "body": "hi"});
    assert_eq!(producer.json(&add).await["success"], true);
    let got: serde_json::Value = serde_json::from_str(&worker.line().await).unwrap();
    assert_eq!(
        got,
        json!({"success": true, "id": "first", "topic": "new", "value": "hi"})
    );
    assert_eq!(producer.stats().await.num("current-waiting"), 0);
}

async fn json_pop_deadline_soon(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.json(&json!({"command": "add", "topic": "t", "ttr": 1, "body": "x"}))
        .await;
    let got = c.json(&json!({"command": "pop", "topic": "t"})).await;
    assert_eq!(got["success"], true);
    for timeout in [json!(null), json!(0), json!(5)] {
        let pop = json!({"command": "pop", "topic": "t", "timeout": timeout});
        assert_eq!(
            c.json(&pop).await,
            json!({"success": false, "error": "DEADLINE_SOON"}),
            "timeout {timeout}"
        );
    }
}

async fn json_pop_of_a_binary_body_replaces_invalid_utf8(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.put_ok(0, 0, 60, b"\xff\xfeok\r\n").await;
    let got = c
        .json(&json!({"command": "pop", "topic": "default", "timeout": 0}))
        .await;
    assert_eq!(got["value"], "\u{fffd}\u{fffd}ok\r\n");
    // The job itself is unchanged.
    assert_eq!(c.found("peek 1").await.body, b"\xff\xfeok\r\n");
}

async fn json_unknown_fields_are_ignored(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let add = json!({"command": "add", "topic": "t", "body": "x", "colour": "blue", "n": [1]});
    assert_eq!(c.json(&add).await, json!({"success": true, "id": "1"}));
    let pop = json!({"command": "pop", "topic": "t", "timeout": 0, "extra": {}});
    assert_eq!(c.json(&pop).await["value"], "x");
}
