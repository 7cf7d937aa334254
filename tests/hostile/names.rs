//! Tube names and client-chosen ids with every byte value in them, through
//! every command that takes one, in text and JSON. Each is accepted exactly
//! when the protocol's character rules allow it, and on Redis every key
//! delayq writes afterwards is one of its own.

use serde_json::{Value, json};

use crate::common::{Backend, Client, TestServer};

backend_tests!(
    every_byte_in_tube_names_and_ids,
    every_character_in_json_topics_and_ids,
    names_that_look_like_keys_or_patterns,
);

/// The bytes a tube name may hold (beanstalkd's rule).
fn tube_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-+/;.$_()".contains(&b)
}

/// The bytes a client-chosen id may hold: a tube's, and `:` and `@`.
fn id_byte(b: u8) -> bool {
    tube_byte(b) || b == b':' || b == b'@'
}

/// `a<b>z` as raw bytes, and printed as the server would echo it.
fn name_with(b: u8) -> (Vec<u8>, String) {
    let raw = vec![b'a', b, b'z'];
    let shown = String::from_utf8_lossy(&raw).into_owned();
    (raw, shown)
}

/// Sends `word <raw name><tail>` and returns the reply line.
async fn with_name(c: &mut Client, word: &str, raw: &[u8], tail: &str) -> String {
    let mut line = format!("{word} ").into_bytes();
    line.extend_from_slice(raw);
    line.extend_from_slice(tail.as_bytes());
    line.extend_from_slice(b"\r\n");
    c.send(&line).await;
    c.line().await
}

async fn every_byte_in_tube_names_and_ids(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut tubes_made = 0;
    let mut ids_made = 0;
    for b in 0..=255u8 {
        // LF ends a line wherever it is (tests/wire.rs covers that), so a
        // name cannot hold one.
        if b == b'\n' {
            continue;
        }
        let (raw, shown) = name_with(b);
        let what = format!("byte {b:#04x}");

        let reply = with_name(&mut c, "use", &raw, "").await;
        if tube_byte(b) {
            assert_eq!(reply, format!("USING {shown}"), "{what}");
            tubes_made += 1;
        } else {
            assert_eq!(reply, "BAD_FORMAT", "use with {what}");
        }
        let reply = with_name(&mut c, "watch", &raw, "").await;
        let want = if tube_byte(b) {
            "WATCHING 2"
        } else {
            "BAD_FORMAT"
        };
        assert_eq!(reply, want, "watch with {what}");
        if tube_byte(b) {
            assert_eq!(with_name(&mut c, "ignore", &raw, "").await, "WATCHING 1");
        }
        let reply = with_name(&mut c, "stats-tube", &raw, "").await;
        if tube_byte(b) {
            assert!(reply.starts_with("OK "), "stats-tube with {what}: {reply}");
            let len: usize = reply[3..].parse().expect("byte count");
            c.read_exact(len + 2).await;
        } else {
            assert_eq!(reply, "BAD_FORMAT", "stats-tube with {what}");
        }
        let reply = with_name(&mut c, "pause-tube", &raw, " 0").await;
        let want = if tube_byte(b) { "PAUSED" } else { "BAD_FORMAT" };
        assert_eq!(reply, want, "pause-tube with {what}");
        c.cmd("use default").await;

        // A put whose id is refused is answered at once: the server does
        // not wait for a body it will not store.
        let reply = if id_byte(b) {
            c.send(&[b"put 0 0 60 1 a".as_slice(), &[b], b"z\r\n"].concat())
                .await;
            c.cmd("x").await
        } else if b == b'=' {
            // A word with `=` is an option, not an id: refused once its
            // body is read, so the body is not taken for a command.
            let reply = with_name(&mut c, "put 0 0 60 1", &raw, "\r\nx").await;
            assert_eq!(reply, "BAD_OPTION", "put with {what}");
            "BAD_FORMAT".to_string()
        } else {
            with_name(&mut c, "put 0 0 60 1", &raw, "").await
        };
        if id_byte(b) {
            assert_eq!(reply, format!("INSERTED {shown}"), "put with {what}");
            ids_made += 1;
            let job = c.found(&format!("peek {shown}")).await;
            assert_eq!(job.id, shown);
            let stats = c.stats_job(&shown).await;
            assert_eq!(stats.get("id"), format!("\"{shown}\""));
        } else {
            assert_eq!(reply, "BAD_FORMAT", "put with {what}");
        }
        for (word, tail, ok) in [
            ("peek", "", "FOUND"),
            ("kick-job", "", "NOT_FOUND"),
            ("touch", "", "NOT_FOUND"),
            ("release", " 0 0", "NOT_FOUND"),
            ("bury", " 0", "NOT_FOUND"),
        ] {
            let reply = with_name(&mut c, word, &raw, tail).await;
            if id_byte(b) {
                assert!(reply.starts_with(ok), "{word} with {what}: {reply}");
                if ok == "FOUND" {
                    c.job_after("FOUND", &reply).await;
                }
            } else {
                assert_eq!(reply, "BAD_FORMAT", "{word} with {what}");
            }
        }
    }
    // Every accepted id names a job that is still there, and none other.
    let stats = c.stats().await;
    assert_eq!(stats.num("current-jobs-ready"), ids_made);
    for b in (0..=255u8).filter(|&b| id_byte(b)) {
        let (_, shown) = name_with(b);
        assert_eq!(c.cmd(&format!("delete {shown}")).await, "DELETED");
    }
    println!(
        "{backend:?}: 255 byte values tried in tube names and ids; \
         {tubes_made} tube names and {ids_made} ids accepted, the rest BAD_FORMAT"
    );
    if let Some(url) = server.redis_url() {
        assert_keys_are_delayqs(url).await;
    }
}

/// Fields of an `add` that must be refused, whatever character is in them.
async fn every_character_in_json_topics_and_ids(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // Every character a JSON string can carry below U+0100, then some that
    // are far outside ASCII.
    let chars = (0..=0xffu32)
        .chain([0x2028, 0xfeff, 0xffff, 0x1f600])
        .filter_map(char::from_u32);
    let mut tried = 0;
    for ch in chars {
        tried += 1;
        let name = format!("a{ch}z");
        let ascii = ch.is_ascii();
        let byte = ch as u8;
        let reply = c
            .json(&json!({"command": "add", "topic": name, "body": "x"}))
            .await;
        if ascii && tube_byte(byte) {
            assert_eq!(reply["success"], true, "topic {name:?}: {reply}");
            let id = reply["id"].as_str().expect("id").to_string();
            let pop = c
                .json(&json!({"command": "pop", "topic": name, "timeout": 0}))
                .await;
            assert_eq!(pop["topic"], Value::from(name.clone()), "{pop}");
            let done = c.json(&json!({"command": "finish", "id": id})).await;
            assert_eq!(done["success"], true, "{done}");
        } else {
            assert_eq!(reply["error"], "BAD_FORMAT", "topic {name:?}: {reply}");
        }
        let reply = c
            .json(&json!({"command": "add", "topic": "t", "body": "x", "id": name}))
            .await;
        if ascii && id_byte(byte) {
            assert_eq!(reply["id"], Value::from(name.clone()), "id {name:?}");
            let done = c.json(&json!({"command": "delete", "id": name})).await;
            assert_eq!(done["success"], true, "{done}");
        } else {
            assert_eq!(reply["error"], "BAD_FORMAT", "id {name:?}: {reply}");
        }
        let reply = c.json(&json!({"command": "delete", "id": name})).await;
        let want = if ascii && id_byte(byte) {
            "NOT_FOUND"
        } else {
            "BAD_FORMAT"
        };
        assert_eq!(reply["error"], want, "delete {name:?}: {reply}");
    }
    assert_eq!(c.stats().await.num("current-jobs-ready"), 0);
    println!("{backend:?}: {tried} characters tried in JSON topics and ids");
    if let Some(url) = server.redis_url() {
        assert_keys_are_delayqs(url).await;
    }
}

/// Names shaped like what delayq puts in its Redis keys, or like Redis
/// patterns and Lua syntax: the legal ones are just names.
async fn names_that_look_like_keys_or_patterns(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    for bad in [
        "{delayq:}jobs",
        "{x}",
        "delayq:}x",
        "#000000000001",
        "a*",
        "a?",
        "[ab]",
        "a b",
        "a\tb",
        "a\0b",
        "a\\b",
        "a'b",
        "a\"b",
        "a%b",
        "-a",
        "a,b",
        "a=b",
        "a|b",
    ] {
        let reply = c.cmd(&format!("use {bad}")).await;
        assert_eq!(reply, "BAD_FORMAT", "use {bad:?}");
        if bad.contains('=') {
            // A word with `=` is an option, not an id: refused once its
            // body is read, so the body is not taken for a command.
            c.send(format!("put 0 0 60 1 {bad}\r\nx\r\n").as_bytes())
                .await;
            assert_eq!(c.line().await, "BAD_OPTION", "put with option {bad:?}");
        } else {
            c.send(format!("put 0 0 60 1 {bad}\r\n").as_bytes()).await;
            assert_eq!(c.line().await, "BAD_FORMAT", "put with id {bad:?}");
        }
        assert_eq!(c.cmd(&format!("delete {bad}")).await, "BAD_FORMAT");
    }
    // Legal names that read like key parts, Lua or numbers in disguise.
    let odd = [
        "..", "$", "()", "a:b:c", "@1", "1.0", "+1", "ready:x", "seq",
    ];
    for name in odd {
        let reply = c.put_id(0, 0, 60, name.as_bytes(), name).await;
        assert_eq!(reply, format!("INSERTED {name}"), "put with id {name:?}");
        if tube_byte(name.as_bytes()[0]) && !name.contains([':', '@']) {
            assert_eq!(c.cmd(&format!("use {name}")).await, format!("USING {name}"));
            assert!(c.put_ok(0, 0, 60, b"x").await > 0);
            c.cmd("use default").await;
        }
    }
    for name in odd {
        let job = c.found(&format!("peek {name}")).await;
        assert_eq!(job.body, name.as_bytes(), "job {name:?} kept its own body");
        assert_eq!(c.cmd(&format!("delete {name}")).await, "DELETED");
    }
    if let Some(url) = server.redis_url() {
        assert_keys_are_delayqs(url).await;
    }
}

/// Every key in the server's Redis starts with delayq's `{delayq:}` prefix
/// and holds only name characters after it.
async fn assert_keys_are_delayqs(url: &str) {
    let client = ::redis::Client::open(url).expect("redis URL");
    let mut r = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test's redis");
    let keys: Vec<Vec<u8>> = ::redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut r)
        .await
        .expect("KEYS *");
    assert!(!keys.is_empty(), "delayq wrote no keys at all");
    for key in &keys {
        let shown = String::from_utf8_lossy(key);
        let rest = key
            .strip_prefix(b"{delayq:}")
            .unwrap_or_else(|| panic!("key {shown:?} is outside delayq's prefix"));
        assert!(
            rest.iter().all(|&b| id_byte(b)),
            "key {shown:?} holds a byte no name may"
        );
    }
    println!("  {} Redis keys, all under {{delayq:}}", keys.len());
}
