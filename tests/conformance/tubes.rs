//! Tubes: `use`, `watch`, `ignore`, tube lifetime, `list-tubes` and the
//! `peek` commands.

use crate::common::{Backend, TestServer, every_byte};

backend_tests!(
    use_routes_puts_and_reserve_follows_watch_list,
    watch_and_ignore_counts,
    peek_commands,
    peek_ready_delayed_buried_use_the_used_tube,
    tube_lifetime_and_list_order,
    default_tube_always_exists,
    a_pause_outlives_the_last_user_of_a_tube_that_holds_jobs,
    a_listing_follows_a_tube_that_goes_as_another_comes,
    a_long_listing_is_whole,
);

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
    // A reserve after an `ignore` no longer takes from the tube ignored.
    assert_eq!(c.cmd("use foo").await, "USING foo");
    c.put_ok(0, 0, 60, b"foo again").await;
    assert_eq!(c.cmd("ignore foo").await, "WATCHING 1");
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    assert_eq!(c.cmd("watch foo").await, "WATCHING 2");
    assert_eq!(
        c.reserved("reserve-with-timeout 0").await.body,
        b"foo again"
    );
}

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

/// A paused tube whose users all leave while it holds jobs lives on by
/// them, and so does its pause: a worker that comes to it during the pause
/// gets none of its jobs.
async fn a_pause_outlives_the_last_user_of_a_tube_that_holds_jobs(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut producer = server.client().await;
    assert_eq!(producer.cmd("use held").await, "USING held");
    producer.put_ok(0, 0, 60, b"held back").await;
    let mut watcher = server.client().await;
    assert_eq!(watcher.cmd("watch held").await, "WATCHING 2");
    assert_eq!(producer.cmd("pause-tube held 60").await, "PAUSED");
    assert_eq!(producer.cmd("use default").await, "USING default");
    drop(watcher);
    producer
        .poll_yaml("stats-tube held", |y| y.num("current-watching") == 0)
        .await;
    let mut worker = server.client().await;
    assert_eq!(worker.cmd("watch held").await, "WATCHING 2");
    assert_eq!(worker.cmd("reserve-with-timeout 1").await, "TIMED_OUT");
    let s = worker.stats_tube("held").await;
    assert_eq!((s.num("pause"), s.num("current-jobs-ready")), (60, 1));
    assert!(s.num("pause-time-left") > 0, "{s:?}");
}

/// A listing after one tube went and another came, the count unchanged, is
/// the new one (an engine that keeps the list must not hand out the old).
async fn a_listing_follows_a_tube_that_goes_as_another_comes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    b.cmd("watch one").await;
    assert_eq!(a.tubes().await, ["default", "one"]);
    b.cmd("watch two").await;
    b.cmd("ignore one").await;
    assert_eq!(a.tubes().await, ["default", "two"]);
    b.cmd("ignore default").await;
    b.cmd("watch three").await;
    b.cmd("ignore two").await;
    assert_eq!(a.tubes().await, ["default", "three"]);
    assert_eq!(b.yaml("list-tubes-watched").await.items, ["three"]);
}

/// A listing of more tubes than are written at a time, with names up to
/// the longest, is every tube, its length as said.
async fn a_long_listing_is_whole(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    let names: Vec<String> = (0..700)
        .map(|i| format!("{i}-{}", "n".repeat(i % 190)))
        .collect();
    for (i, name) in names.iter().enumerate() {
        let watching = format!("WATCHING {}", i + 2);
        assert_eq!(b.cmd(&format!("watch {name}")).await, watching);
    }
    let mut want = vec!["default".to_string()];
    want.extend(names.iter().cloned());
    assert_eq!(a.tubes().await, want);
    let mut watched = want.clone();
    watched.sort();
    let mut got = b.yaml("list-tubes-watched").await.items;
    got.sort();
    assert_eq!(got, watched);
}
