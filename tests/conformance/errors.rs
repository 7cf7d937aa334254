//! Error words, maximum argument values, `quit` and drain mode.

use crate::common::{Backend, TestServer};
use serde_json::json;

backend_tests!(
    max_values_are_accepted,
    error_words_for_missing_and_extra_arguments,
    anything_starting_with_quit_closes,
    quit_closes_the_connection,
    drain_mode_refuses_new_jobs,
);

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
    // Refused puts are counted (as in beanstalkd, those refused for their
    // body too); malformed ones are not.
    assert_eq!(s.num("cmd-put"), 8);
    // Existing work still flows.
    assert_eq!(c.reserve_body().await.id, id.to_string());
    assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    assert_eq!(c.found("peek named:0").await.body, b"named");
    // The switch is read live (SIGUSR1 only ever sets it).
    server.set_draining(false);
    assert_eq!(c.stats().await.get("draining"), "false");
    assert!(c.put_ok(0, 0, 60, b"after").await > id);
}
