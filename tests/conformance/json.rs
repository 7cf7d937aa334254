//! JSON-lines mode: `add`, `pop`, `finish` and `delete` as JSON requests.

use std::time::Instant;

use crate::common::{Backend, TestServer, assert_between, timed};
use crate::support::{OID, SEC};
use serde_json::json;

backend_tests!(
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
