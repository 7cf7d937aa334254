//! Wire-level behaviour: framing, pipelining, binary bodies, size limits,
//! malformed input, hang-ups and shutdown. Every test runs against every
//! backend through `backend_tests!`.

#[macro_use]
mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Backend, TestServer, every_byte};
use delayq::config::Config;
use serde_json::{Value, json};

const QUIET: Duration = Duration::from_millis(100);

backend_tests!(
    commands_split_byte_by_byte,
    pipelined_commands_answered_in_order,
    pipelined_puts_with_other_commands_between,
    bodies_with_crlf_and_every_byte_value,
    body_that_looks_like_commands_is_data,
    line_of_1024_bytes_is_accepted_1025_is_not,
    line_limit_holds_when_the_line_arrives_in_pieces,
    very_long_line_is_one_bad_format,
    very_long_json_line_is_one_bad_format,
    job_too_big_is_skipped_then_answered,
    huge_body_is_skipped_without_being_kept,
    body_not_followed_by_crlf,
    malformed_numbers_are_bad_format,
    unknown_commands,
    arguments_are_separated_by_single_spaces,
    bare_lf_ends_a_line,
    tube_names_of_200_and_201_bytes,
    quit_closes_even_with_bare_lf,
    json_line_with_a_body_at_the_size_limit,
    json_line_length_limit,
    command_pipelined_behind_a_blocked_reserve,
    hang_up_while_blocked_loses_no_job,
    hang_up_with_a_command_queued_behind_a_blocked_reserve,
    hang_up_behind_more_than_the_read_ahead_of_a_blocked_reserve,
    half_close_still_gets_every_reply,
    partial_put_at_hang_up_stores_nothing,
    many_waiting_workers_each_get_one_job,
    concurrent_producers_and_workers_deliver_each_job_once,
    shutdown_closes_idle_and_blocked_connections,
);

fn small_limit() -> Config {
    Config {
        max_job_size: 100,
        ..Config::default()
    }
}

async fn commands_split_byte_by_byte(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.send_bytewise(b"put 0 0 60 7\r\nab\r\ncd\n\r").await;
    c.expect_silence(QUIET).await;
    c.send_bytewise(b"\n").await;
    assert_eq!(c.line().await, "INSERTED 1");
    c.send_bytewise(b"use tub").await;
    c.expect_silence(QUIET).await;
    c.send_bytewise(b"e\r\nreserve-with-timeout 0\r\n").await;
    assert_eq!(c.line().await, "USING tube");
    let line = c.line().await;
    assert_eq!(c.job_after("RESERVED", &line).await.body, b"ab\r\ncd\n");
    let add = br#"{"command":"add","topic":"t","body":"json"}"#;
    c.send_bytewise(add).await;
    c.expect_silence(QUIET).await;
    c.send_bytewise(b"\r\n").await;
    assert_eq!(c.line().await, r#"{"success":true,"id":"2"}"#);
}

async fn pipelined_commands_answered_in_order(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let n = 100;
    let mut batch = Vec::new();
    for i in 1..=n {
        batch.extend_from_slice(
            format!("put 0 0 60 {}\r\njob {i}\r\n", format!("job {i}").len()).as_bytes(),
        );
    }
    for i in 1..=n {
        batch.extend_from_slice(format!("reserve-with-timeout 0\r\ndelete {i}\r\n").as_bytes());
    }
    batch.extend_from_slice(b"reserve-with-timeout 0\r\nlist-tube-used\r\n");
    c.send(&batch).await;
    for i in 1..=n {
        assert_eq!(c.line().await, format!("INSERTED {i}"));
    }
    for i in 1..=n {
        let line = c.line().await;
        let job = c.job_after("RESERVED", &line).await;
        assert_eq!(
            (job.id, job.body),
            (i.to_string(), format!("job {i}").into_bytes())
        );
        assert_eq!(c.line().await, "DELETED");
    }
    assert_eq!(c.line().await, "TIMED_OUT");
    assert_eq!(c.line().await, "USING default");
    c.expect_silence(QUIET).await;
}

/// Puts pipelined in one write are taken together, but each is answered as
/// if alone, in order, with what came between them applied in between.
async fn pipelined_puts_with_other_commands_between(backend: Backend) {
    let server = TestServer::start_with(backend, small_limit()).await;
    let mut c = server.client().await;
    let mut batch = Vec::new();
    for i in 1..=3 {
        batch.extend_from_slice(format!("put 0 0 60 1\r\n{i}\r\n").as_bytes());
    }
    batch.extend_from_slice(b"use other\r\n");
    batch.extend_from_slice(b"put 0 0 60 1 dup\r\na\r\nput 0 0 60 1 dup\r\nb\r\n");
    batch.extend_from_slice(format!("put 0 0 60 101\r\n{}\r\n", "x".repeat(101)).as_bytes());
    batch.extend_from_slice(b"put 0 0 60 1\r\n5\r\nput 0 0 60 1\r\n6\r\n");
    c.send(&batch).await;
    // On a cluster every put takes its number from the cluster-wide
    // sequence before its shard can say its client id is taken, so the
    // `EXISTS` used one (README, "Redis Cluster and Sentinel").
    let (fifth, sixth) = match backend {
        Backend::Cluster => ("INSERTED 6", "INSERTED 7"),
        _ => ("INSERTED 5", "INSERTED 6"),
    };
    let expected = [
        "INSERTED 1",
        "INSERTED 2",
        "INSERTED 3",
        "USING other",
        "INSERTED dup",
        "EXISTS dup",
        "JOB_TOO_BIG",
        fifth,
        sixth,
    ];
    for want in expected {
        assert_eq!(c.line().await, want);
    }
    c.expect_silence(QUIET).await;
    assert_eq!(c.stats_tube("default").await.num("current-jobs-ready"), 3);
    assert_eq!(c.stats_tube("other").await.num("current-jobs-ready"), 3);
    assert_eq!(c.found("peek dup").await.body, b"a");
}

async fn bodies_with_crlf_and_every_byte_value(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let bodies: Vec<Vec<u8>> = vec![
        every_byte(),
        b"\r\n".to_vec(),
        b"ends with\r\n".to_vec(),
        Vec::new(),
        vec![0; 1000],
        (0..=255u8).rev().cycle().take(5000).collect(),
    ];
    for body in &bodies {
        c.put_ok(0, 0, 60, body).await;
    }
    for (i, body) in bodies.iter().enumerate() {
        let id = i + 1;
        assert_eq!(
            &c.found(&format!("peek {id}")).await.body,
            body,
            "peek {id}"
        );
        let job = c.reserve_body().await;
        assert_eq!(
            (&job.id, &job.body),
            (&id.to_string(), body),
            "reserve {id}"
        );
    }
}

async fn body_that_looks_like_commands_is_data(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let body = b"delete 1\r\nquit\r\nput 0 0 1 1\r\nx\r\n";
    assert_eq!(c.put(0, 0, 60, body).await, "INSERTED 1");
    c.expect_silence(QUIET).await;
    assert_eq!(c.reserve_body().await.body, body);
}

/// `peek` with an id padded by leading zeros to make a line of `len` bytes
/// (ending as `end`).
fn padded_peek(len: usize, end: &str) -> String {
    let digits = len - "peek ".len() - end.len();
    format!("peek {:0>digits$}{end}", 1)
}

async fn line_of_1024_bytes_is_accepted_1025_is_not(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.put_ok(0, 0, 60, b"x").await;
    for end in ["\r\n", "\n"] {
        let ok = padded_peek(1024, end);
        assert_eq!(ok.len(), 1024);
        c.send(ok.as_bytes()).await;
        assert_eq!(
            c.found_line().await,
            "FOUND 1 1",
            "1024 bytes ending {end:?}"
        );
        let long = padded_peek(1025, end);
        assert_eq!(long.len(), 1025);
        c.send(long.as_bytes()).await;
        assert_eq!(c.line().await, "BAD_FORMAT", "1025 bytes ending {end:?}");
        // Exactly one error, and the connection goes on.
        assert_eq!(c.cmd("list-tube-used").await, "USING default");
    }
}

async fn line_limit_holds_when_the_line_arrives_in_pieces(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.put_ok(0, 0, 60, b"x").await;
    let ok = padded_peek(1024, "\r\n");
    c.send(&ok.as_bytes()[..1023]).await;
    c.expect_silence(QUIET).await;
    c.send(b"\n").await;
    assert_eq!(c.found_line().await, "FOUND 1 1");
    let long = padded_peek(1025, "\r\n");
    c.send(&long.as_bytes()[..1024]).await;
    // The line is already too long: answered before its end arrives.
    assert_eq!(c.line().await, "BAD_FORMAT");
    c.send(b"\n").await;
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
    c.expect_silence(QUIET).await;
}

async fn very_long_line_is_one_bad_format(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let junk = vec![b'x'; 100 * 1024];
    for chunk in junk.chunks(8 * 1024) {
        c.send(chunk).await;
    }
    c.send(b"\r\n").await;
    assert_eq!(c.line().await, "BAD_FORMAT");
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
    // A long line in one write, with commands before and after it.
    let mut batch = b"use before\r\n".to_vec();
    batch.extend_from_slice(&junk);
    batch.extend_from_slice(b"\r\nlist-tube-used\r\n");
    c.send(&batch).await;
    assert_eq!(c.line().await, "USING before");
    assert_eq!(c.line().await, "BAD_FORMAT");
    assert_eq!(c.line().await, "USING before");
    c.expect_silence(QUIET).await;
}

async fn very_long_json_line_is_one_bad_format(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // Longer than any JSON line the default 65535-byte limit allows.
    let mut line = br#"{"command":"add","topic":"t","body":""#.to_vec();
    line.extend(std::iter::repeat_n(b'x', 500 * 1024));
    line.extend_from_slice(b"\"}\r\n");
    c.send(&line).await;
    let reply: Value = serde_json::from_str(&c.line().await).unwrap();
    assert_eq!(reply, json!({"success": false, "error": "BAD_FORMAT"}));
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
    assert_eq!(c.stats().await.num("total-jobs"), 0);
}

async fn job_too_big_is_skipped_then_answered(backend: Backend) {
    let server = TestServer::start_with(backend, small_limit()).await;
    let mut c = server.client().await;
    assert_eq!(c.stats().await.num("max-job-size"), 100);
    // The body is made of command lines: none of them may run.
    let body = b"list-tube-used\r\n".repeat(7);
    assert_eq!(body.len(), 112);
    c.send(format!("put 0 0 60 {}\r\n", body.len()).as_bytes())
        .await;
    c.send(&body[..50]).await;
    c.expect_silence(QUIET).await;
    c.send(&body[50..]).await;
    c.expect_silence(QUIET).await;
    c.send(b"\r\n").await;
    assert_eq!(c.line().await, "JOB_TOO_BIG");
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
    // One byte over, and exactly at the limit.
    assert_eq!(c.put(0, 0, 60, &[b'a'; 101]).await, "JOB_TOO_BIG");
    assert_eq!(c.put(0, 0, 60, &[b'a'; 100]).await, "INSERTED 1");
    assert_eq!(c.reserve_body().await.body, vec![b'a'; 100]);
    let s = c.stats().await;
    assert_eq!(s.num("total-jobs"), 1);
    // The puts refused for their size are counted too, as in beanstalkd.
    assert_eq!(s.num("cmd-put"), 3);
}

async fn huge_body_is_skipped_without_being_kept(backend: Backend) {
    let server = TestServer::start_with(backend, small_limit()).await;
    let mut c = server.client().await;
    let size = 8 * 1024 * 1024;
    c.send(format!("put 0 0 60 {size}\r\n").as_bytes()).await;
    let chunk = vec![b'z'; 64 * 1024];
    for _ in 0..size / chunk.len() {
        c.send(&chunk).await;
    }
    c.send(b"\r\nlist-tube-used\r\n").await;
    assert_eq!(c.line().await, "JOB_TOO_BIG");
    assert_eq!(c.line().await, "USING default");
}

async fn body_not_followed_by_crlf(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // The body is 3 bytes; "de" stands where CRLF should be, and what
    // follows is read as the next line (as beanstalkd 1.12 does).
    c.send(b"put 0 0 60 3\r\nabcde\r\nlist-tube-used\r\n").await;
    assert_eq!(c.line().await, "EXPECTED_CRLF");
    assert_eq!(c.line().await, "UNKNOWN_COMMAND");
    assert_eq!(c.line().await, "USING default");
    // A body that is split from its CRLF is fine.
    c.send(b"put 0 0 60 3\r\nabc").await;
    c.expect_silence(QUIET).await;
    c.send(b"\r\n").await;
    assert_eq!(c.line().await, "INSERTED 1");
    assert_eq!(c.stats().await.num("total-jobs"), 1);
}

async fn malformed_numbers_are_bad_format(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = c.put_ok(0, 0, 60, b"x").await;
    c.reserve_body().await;
    let lines = [
        // put: negative, over 32 bits, malformed, and a bad byte count.
        "put -1 0 60 1",
        "put 0 -1 60 1",
        "put 0 0 -1 1",
        "put 0 0 60 -1",
        "put 4294967296 0 60 1",
        "put 0 4294967296 60 1",
        "put 0 0 4294967296 1",
        "put 99999999999999999999 0 60 1",
        "put 0 0 60 18446744073709551616",
        // A byte count over 32 bits, as in beanstalkd: not a body to read.
        "put 0 0 60 4294967296",
        "put 0 0 60 18446744073709551615",
        "put 1x 0 60 1",
        "put +1 0 60 1",
        "put 0x1 0 60 1",
        "put 1.5 0 60 1",
        "put 0 0 60 1e3",
        // Timeouts, bounds, delays, priorities.
        "reserve-with-timeout -1",
        "reserve-with-timeout 1x",
        "reserve-with-timeout 4294967296",
        "kick -1",
        "kick 1x",
        "kick 18446744073709551616",
        "pause-tube default -1",
        "pause-tube default 4294967296",
        "pause-tube default x",
        &format!("release {id} -1 0"),
        &format!("release {id} 0 4294967296"),
        &format!("release {id} 0 1x"),
        &format!("bury {id} 4294967296"),
        &format!("bury {id} -5"),
        // Ids: negative, or all digits beyond 64 bits.
        "peek -1",
        "peek 18446744073709551616",
        "delete 99999999999999999999999",
        "stats-job -1",
        "kick-job -1",
        "touch 18446744073709551616",
    ];
    for line in lines {
        assert_eq!(c.cmd(line).await, "BAD_FORMAT", "{line}");
    }
    // None of the puts is waiting for a body, and the job is untouched.
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
    let s = c.stats_job(id).await;
    assert_eq!(
        (s.get("state"), s.num("pri"), s.num("releases")),
        ("reserved", 0, 0)
    );
    let s = c.stats().await;
    assert_eq!((s.num("total-jobs"), s.num("cmd-put")), (1, 1));
    assert_eq!(s.get("draining"), "false");
    assert_eq!(c.stats_tube("default").await.num("pause"), 0);
}

async fn unknown_commands(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    for line in [
        "foo",
        "PEEK 1",
        "Stats",
        "put",
        "",
        "\t",
        "finsh 1",
        "peek_ready",
        "kick\t1",
        "foo ",
        "deletex 1",
    ] {
        assert_eq!(c.cmd(line).await, "UNKNOWN_COMMAND", "{line:?}");
    }
    c.send(b"\xff\xfe\r\n").await;
    assert_eq!(c.line().await, "UNKNOWN_COMMAND");
    // A NUL byte anywhere in the line is BAD_FORMAT, as beanstalkd 1.12
    // answers it before it looks at the command.
    for line in ["\x00", "foo\x00", "\x00stats", "quit\x00"] {
        assert_eq!(c.cmd(line).await, "BAD_FORMAT", "{line:?}");
    }
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
}

async fn arguments_are_separated_by_single_spaces(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    for line in [
        "use  foo",
        "use foo ",
        "peek 1 ",
        "stats ",
        "kick  1",
        "delete 1  ",
        // Tabs are not separators (beanstalkd reads this as `reserve`
        // followed by junk).
        "reserve-with-timeout\t0",
    ] {
        assert_eq!(c.cmd(line).await, "BAD_FORMAT", "{line:?}");
    }
    c.send(b"put 0 0 60  1\r\nx\r\n").await;
    assert_eq!(c.line().await, "BAD_FORMAT");
    assert_eq!(c.line().await, "UNKNOWN_COMMAND");
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
}

async fn bare_lf_ends_a_line(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.send(b"use lf\nput 0 0 60 2\nab\r\nlist-tube-used\n")
        .await;
    assert_eq!(c.line().await, "USING lf");
    assert_eq!(c.line().await, "INSERTED 1");
    assert_eq!(c.line().await, "USING lf");
    c.send(b"\n").await;
    assert_eq!(c.line().await, "UNKNOWN_COMMAND");
}

async fn tube_names_of_200_and_201_bytes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let ok = "t".repeat(200);
    let long = "t".repeat(201);
    assert_eq!(c.cmd(&format!("use {ok}")).await, format!("USING {ok}"));
    assert_eq!(c.cmd(&format!("watch {ok}")).await, "WATCHING 2");
    assert_eq!(c.stats_tube(&ok).await.get("name"), ok);
    assert_eq!(c.cmd(&format!("pause-tube {ok} 0")).await, "PAUSED");
    assert_eq!(c.put(0, 0, 60, b"x").await, "INSERTED 1");
    assert_eq!(c.stats_job(1).await.get("tube"), ok);
    assert_eq!(c.cmd(&format!("ignore {ok}")).await, "WATCHING 1");
    for cmd in ["use", "watch", "ignore", "stats-tube"] {
        assert_eq!(c.cmd(&format!("{cmd} {long}")).await, "BAD_FORMAT", "{cmd}");
    }
    assert_eq!(c.cmd(&format!("pause-tube {long} 0")).await, "BAD_FORMAT");
    let odd = "Az09-+/;.$_()";
    assert_eq!(c.cmd(&format!("use {odd}")).await, format!("USING {odd}"));
    for bad in ["a:b", "-a", "caf\u{e9}", "a@b", "a*", "a,b"] {
        assert_eq!(c.cmd(&format!("use {bad}")).await, "BAD_FORMAT", "{bad:?}");
    }
    assert_eq!(c.cmd("list-tube-used").await, format!("USING {odd}"));
    assert_eq!(c.tubes().await, ["default", ok.as_str(), odd]);
}

async fn quit_closes_even_with_bare_lf(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.send_bytewise(b"list-tube-used\nqu").await;
    assert_eq!(c.line().await, "USING default");
    c.send(b"it\nlist-tube-used\n").await;
    assert!(c.expect_closed().await.is_empty());
    let mut d = server.client().await;
    let s = d.wait_stat("current-connections", 1).await;
    assert_eq!(s.num("cmd-list-tube-used"), 1);
}

async fn json_line_with_a_body_at_the_size_limit(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let body = "x".repeat(65_535);
    let add = json!({"command": "add", "topic": "big", "body": body});
    assert_eq!(c.json(&add).await, json!({"success": true, "id": "1"}));
    let too_big = json!({"command": "add", "topic": "big", "body": "x".repeat(65_536)});
    assert_eq!(
        c.json(&too_big).await,
        json!({"success": false, "error": "JOB_TOO_BIG"})
    );
    let got = c
        .json(&json!({"command": "pop", "topic": "big", "timeout": 0}))
        .await;
    assert_eq!(got["value"].as_str().map(str::len), Some(65_535));
    assert_eq!(c.stats().await.num("total-jobs"), 1);
}

async fn json_line_length_limit(backend: Backend) {
    let server = TestServer::start_with(backend, small_limit()).await;
    let mut c = server.client().await;
    // Every body byte as a six-byte escape still fits: the line may be
    // 1024 + 6 * 100 bytes, CRLF included.
    let limit = 1024 + 6 * 100;
    let escaped = "\\u0041".repeat(100);
    let line = |len: usize| {
        let head = format!(r#"{{"command":"add","topic":"t","body":"{escaped}""#);
        let pad = len - head.len() - "}\r\n".len();
        format!("{head}{}}}\r\n", " ".repeat(pad))
    };
    let ok = line(limit);
    assert_eq!(ok.len(), limit);
    c.send(ok.as_bytes()).await;
    assert_eq!(c.line().await, r#"{"success":true,"id":"1"}"#);
    assert_eq!(c.reserved("reserve-job 1").await.body, vec![b'A'; 100]);
    let over = line(limit + 1);
    c.send(over.as_bytes()).await;
    assert_eq!(c.line().await, r#"{"success":false,"error":"BAD_FORMAT"}"#);
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
    // 101 decoded bytes are too big, however they are spelled.
    let reply = c
        .json(&json!({"command": "add", "topic": "t", "body": "A".repeat(101)}))
        .await;
    assert_eq!(reply["error"], "JOB_TOO_BIG");
    let s = c.stats().await;
    assert_eq!((s.num("total-jobs"), s.num("cmd-put")), (1, 1));
}

async fn command_pipelined_behind_a_blocked_reserve(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut worker = server.client().await;
    let mut producer = server.client().await;
    worker.send(b"reserve\r\nlist-tube-used\r\nuse x\r\n").await;
    producer.wait_stat("current-waiting", 1).await;
    worker.expect_silence(QUIET).await;
    producer.put_ok(0, 0, 60, b"job").await;
    let line = worker.line().await;
    assert_eq!(worker.job_after("RESERVED", &line).await.body, b"job");
    assert_eq!(worker.line().await, "USING default");
    assert_eq!(worker.line().await, "USING x");
}

async fn hang_up_while_blocked_loses_no_job(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut gone = server.client().await;
    let mut c = server.client().await;
    gone.send_line("reserve").await;
    c.wait_stat("current-waiting", 1).await;
    drop(gone);
    let s = c.wait_stat("current-connections", 1).await;
    assert_eq!(s.num("current-waiting"), 0);
    let id = c.put_ok(0, 0, 60, b"for someone alive").await;
    let s = c.stats_job(id).await;
    assert_eq!((s.get("state"), s.num("reserves")), ("ready", 0));
    assert_eq!(c.reserve_body().await.id, id.to_string());
}

/// beanstalkd 1.12 notices at once a client that hangs up while blocked in
/// `reserve`, even with more commands pipelined behind the reserve.
async fn hang_up_with_a_command_queued_behind_a_blocked_reserve(backend: Backend) {
    a_departed_waiter_is_let_go(backend, b"list-tube-used\r\n").await;
}

/// The same with more pipelined behind the reserve than the server reads
/// ahead while the reserve waits (64 KiB): the hang-up comes behind input
/// nobody reads, and was never seen, so the departed client stayed a
/// waiter for good, holding its buffers, and would have been handed the
/// next job. beanstalkd 1.12 sees it.
async fn hang_up_behind_more_than_the_read_ahead_of_a_blocked_reserve(backend: Backend) {
    // 160,000 bytes: past the read-ahead, and within what the kernel's
    // socket buffers take, so the write completes and the FIN follows it.
    a_departed_waiter_is_let_go(backend, &b"list-tube-used\r\n".repeat(10_000)).await;
}

/// A client blocked in `reserve` sends `behind` and hangs up: the server
/// lets it go, and the next job is not handed to it first.
async fn a_departed_waiter_is_let_go(backend: Backend, behind: &[u8]) {
    let server = TestServer::start(backend).await;
    let mut gone = server.client().await;
    let mut c = server.client().await;
    gone.send(b"reserve\r\n").await;
    c.wait_stat("current-waiting", 1).await;
    gone.send(behind).await;
    gone.hang_up();
    let s = c
        .poll_yaml("stats", |y| y.num("current-connections") == 1)
        .await;
    assert_eq!(s.num("current-waiting"), 0);
    let id = c.put_ok(0, 0, 60, b"x").await;
    let s = c.stats_job(id).await;
    assert_eq!((s.get("state"), s.num("reserves")), ("ready", 0));
}

async fn half_close_still_gets_every_reply(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.send(b"use hc\r\nput 0 0 60 2\r\nhi\r\nlist-tube-used\r\n")
        .await;
    c.close_write().await;
    let rest = c.expect_closed().await;
    assert_eq!(rest, b"USING hc\r\nINSERTED 1\r\nUSING hc\r\n");
}

async fn partial_put_at_hang_up_stores_nothing(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut gone = server.client().await;
    let mut c = server.client().await;
    c.ping().await;
    gone.send(b"put 0 0 60 5\r\nhel").await;
    drop(gone);
    let s = c.wait_stat("current-connections", 1).await;
    assert_eq!(s.num("total-jobs"), 0);
    assert_eq!(s.num("current-jobs-ready"), 0);
}

async fn many_waiting_workers_each_get_one_job(backend: Backend) {
    let server = TestServer::start(backend).await;
    // More than one hand-out round and more than one run of pipelined puts.
    let n = 300;
    let mut workers = Vec::new();
    for _ in 0..n {
        let mut w = server.client().await;
        w.send_line("reserve").await;
        workers.push(w);
    }
    let mut producer = server.client().await;
    producer.wait_stat("current-waiting", n).await;
    let mut batch = Vec::new();
    for i in 0..n {
        batch.extend_from_slice(format!("put 0 0 60 1\r\n{}\r\n", i % 10).as_bytes());
    }
    producer.send(&batch).await;
    for i in 1..=n {
        assert_eq!(producer.line().await, format!("INSERTED {i}"));
    }
    let mut ids = BTreeSet::new();
    for w in &mut workers {
        let line = w.line().await;
        let job = w.job_after("RESERVED", &line).await;
        assert!(
            ids.insert(job.id.clone()),
            "job {} handed out twice",
            job.id
        );
    }
    let want: BTreeSet<String> = (1..=n).map(|i| i.to_string()).collect();
    assert_eq!(ids, want);
    let s = producer.stats().await;
    assert_eq!(
        (s.num("current-jobs-reserved"), s.num("current-waiting")),
        (n, 0)
    );
}

async fn concurrent_producers_and_workers_deliver_each_job_once(backend: Backend) {
    let server = TestServer::start(backend).await;
    let (producers, per_producer, workers) = (4, 50, 4);
    let mut tasks = Vec::new();
    for p in 0..producers {
        let mut c = server.client().await;
        tasks.push(tokio::spawn(async move {
            for i in 0..per_producer {
                c.put_ok(i % 3, 0, 60, format!("{p}/{i}").as_bytes()).await;
            }
        }));
    }
    let mut handles = Vec::new();
    for _ in 0..workers {
        let mut c = server.client().await;
        handles.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let job = c.reserve_body().await;
                assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
                if job.body == b"stop" {
                    return got;
                }
                got.push(String::from_utf8(job.body).unwrap());
            }
        }));
    }
    for t in tasks {
        t.await.expect("producer");
    }
    let mut c = server.client().await;
    c.poll_yaml("stats", |y| {
        y.num("cmd-delete") == (producers * per_producer) as u64
    })
    .await;
    for _ in 0..workers {
        // Least urgent, so every real job goes first.
        c.put_ok(u32::MAX, 0, 60, b"stop").await;
    }
    let mut all = BTreeSet::new();
    for h in handles {
        for body in h.await.expect("worker") {
            assert!(all.insert(body.clone()), "{body} delivered twice");
        }
    }
    assert_eq!(all.len(), (producers * per_producer) as usize);
    let s = c.stats().await;
    assert_eq!(
        s.num("current-jobs-ready") + s.num("current-jobs-reserved"),
        0
    );
    assert_eq!(
        s.num("total-jobs"),
        (producers * per_producer + workers) as u64
    );
}

async fn shutdown_closes_idle_and_blocked_connections(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut idle = server.client().await;
    let mut blocked = server.client().await;
    let mut mid_body = server.client().await;
    idle.ping().await;
    mid_body.send(b"put 0 0 60 10\r\nabc").await;
    blocked.send_line("reserve").await;
    idle.wait_stat("current-waiting", 1).await;
    server.shutdown().await;
    for c in [&mut idle, &mut blocked, &mut mid_body] {
        assert!(c.expect_closed().await.is_empty());
    }
}
