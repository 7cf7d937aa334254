//! Hostile HTTP clients, on every backend: malformed JSON of every kind,
//! bodies far over the limit (declared and chunked), clients that trickle
//! their headers, thousands of long-polls at once, more connections than
//! the cap, and bytes that are not HTTP at all. Each is answered with a
//! clear error or cut off, memory stays bounded, nothing is lost, and the
//! server goes on serving.
//!
//! Raw TCP where an HTTP client would never send such input; reqwest
//! otherwise. The tests that watch memory run the real binary, whose RSS
//! is its own; the rest run in-process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use delayq::config::Config;
use delayq::http::HEADER_TIMEOUT;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::daemon::Daemon;
use crate::common::redis::RedisServer;
use crate::common::{Backend, Client, REPLY_TIMEOUT, TestServer};

backend_tests!(
    malformed_json_gets_400_and_the_server_goes_on,
    bodies_over_the_limit_are_refused_unread,
    slow_headers_are_cut_off_while_others_are_served,
    thousands_of_long_polls_at_once,
    beyond_the_connection_cap_a_client_is_refused,
    garbage_on_the_http_port_is_closed,
);

/// An HTTP client of one server's API.
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn new(addr: SocketAddr) -> Api {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client");
        Api {
            http,
            base: format!("http://{addr}/v1"),
        }
    }

    /// POSTs `body` as it is, labelled JSON; the status and the JSON body.
    async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        answer(response).await
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        answer(response).await
    }

    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .delete(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("DELETE {path}: {e}"));
        answer(response).await
    }

    /// A job put the ordinary way is accepted: the server is still fine.
    async fn put_ok(&self, tube: &str) -> String {
        let (status, reply) = self
            .post(&format!("/tubes/{tube}/jobs"), r#"{"body":"fine"}"#)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{reply}");
        reply["id"].as_str().expect("an id").to_string()
    }
}

async fn answer(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let value = response.json().await.expect("a JSON body");
    (status, value)
}

/// The real binary on `backend` with its HTTP front end, for the tests
/// that watch its memory; the Redis it runs on, if any, is kept with it.
async fn daemon(backend: Backend) -> (Daemon, SocketAddr, Option<RedisServer>) {
    let mut redis = None;
    let daemon = match backend {
        Backend::Memory => Daemon::start_with_http(&["--in-memory"]).await,
        Backend::Durable => Daemon::start_with_http(&[]).await,
        Backend::Redis => {
            let r = RedisServer::start(&[]);
            let d = Daemon::start_with_http(&["--redis", &r.url]).await;
            redis = Some(r);
            d
        }
        Backend::Cluster => {
            let seeds = tokio::task::spawn_blocking(crate::common::cluster::RedisCluster::shared)
                .await
                .expect("start the shared cluster");
            let prefix = crate::common::cluster::unique_prefix();
            Daemon::start_with_http(&["--redis-cluster", seeds, "--redis-prefix", &prefix]).await
        }
    };
    let http = daemon.http.expect("an HTTP listener");
    (daemon, http, redis)
}

/// Reads what the server sends until it closes the connection (an orderly
/// end or a reset); fails if it is still open after `limit`.
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while let Ok(k @ 1..) = s.read(&mut buf).await {
            got.extend_from_slice(&buf[..k]);
        }
    };
    tokio::time::timeout(limit, read)
        .await
        .unwrap_or_else(|_| panic!("still open after {limit:?}"));
    got
}

/// Reads one whole response (its head, and a body of its
/// `content-length`) off a kept-alive connection.
async fn read_response(s: &mut TcpStream) -> (u16, Vec<u8>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().expect("a length"));
            if got.len() >= end + 4 + len {
                let status = head[9..12].parse().expect("a status");
                return (status, got[end + 4..end + 4 + len].to_vec());
            }
        }
        let k = tokio::time::timeout(REPLY_TIMEOUT, s.read(&mut buf))
            .await
            .expect("a response in time")
            .expect("read");
        assert!(k > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..k]);
    }
}

const GET_STATS: &[u8] = b"GET /v1/stats HTTP/1.1\r\nhost: delayq\r\n\r\n";

/// Every kind of body that is not a job's JSON object is 400 with a JSON
/// error, and the next ordinary request is served.
async fn malformed_json_gets_400_and_the_server_goes_on(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(server.http.expect("HTTP"));
    let deep_array = "[".repeat(100_000);
    let deep_object = r#"{"a":"#.repeat(50_000);
    let deep_in_body = format!(r#"{{"body":{}"#, "[".repeat(100_000));
    let huge_digits = format!(r#"{{"body":"x","priority":{}}}"#, "9".repeat(10_000));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not JSON", b"hello there".to_vec()),
        ("a text command", b"put 0 0 60 1\r\nx\r\n".to_vec()),
        ("truncated", br#"{"body": "abc"#.to_vec()),
        ("truncated after a key", br#"{"body""#.to_vec()),
        ("a lone brace", b"{".to_vec()),
        ("an array", br#"["body","x"]"#.to_vec()),
        ("a string", br#""body""#.to_vec()),
        ("a number", b"42".to_vec()),
        ("null", b"null".to_vec()),
        ("two objects", br#"{"body":"x"}{"body":"y"}"#.to_vec()),
        ("trailing comma", br#"{"body":"x",}"#.to_vec()),
        ("body a number", br#"{"body":5}"#.to_vec()),
        ("body an object", br#"{"body":{"x":1}}"#.to_vec()),
        (
            "priority a string",
            br#"{"body":"x","priority":"high"}"#.to_vec(),
        ),
        (
            "priority negative",
            br#"{"body":"x","priority":-1}"#.to_vec(),
        ),
        (
            "priority a fraction",
            br#"{"body":"x","priority":1.5}"#.to_vec(),
        ),
        ("ttr an array", br#"{"body":"x","ttr":[30]}"#.to_vec()),
        ("delay true", br#"{"body":"x","delay":true}"#.to_vec()),
        (
            "priority 2^64",
            br#"{"body":"x","priority":18446744073709551616}"#.to_vec(),
        ),
        (
            "priority 1e400",
            br#"{"body":"x","priority":1e400}"#.to_vec(),
        ),
        ("ten thousand digits", huge_digits.into_bytes()),
        ("100,000 [", deep_array.into_bytes()),
        ("50,000 nested objects", deep_object.into_bytes()),
        ("100,000 [ as the body", deep_in_body.into_bytes()),
        ("invalid UTF-8", b"{\"body\":\"\xff\xfe\xc0\x80\"}".to_vec()),
        ("invalid UTF-8 key", b"{\"\xff\":\"x\"}".to_vec()),
        ("a lone surrogate", br#"{"body":"\udc00"}"#.to_vec()),
        ("a bad escape", br#"{"body":"\q"}"#.to_vec()),
        ("a NUL", b"{\"body\":\"x\0\"}".to_vec()),
        (
            "a byte-order mark",
            b"\xef\xbb\xbf{\"body\":\"x\"}".to_vec(),
        ),
    ];
    let mut accepted = 0u64;
    for (what, body) in &cases {
        // A reserve takes no job fields, so only what is no JSON object at
        // all is wrong for it too.
        let syntax = serde_json::from_slice::<serde_json::Map<String, Value>>(body).is_err();
        let paths = match syntax {
            true => &["/tubes/t/jobs", "/tubes/t/reserve"][..],
            false => &["/tubes/t/jobs"][..],
        };
        for path in paths {
            let (status, reply) = api.post(path, body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{what} to {path}: {reply}");
            assert_eq!(reply["success"], Value::Bool(false), "{what}: {reply}");
            assert!(reply["error"].is_string(), "{what}: {reply}");
        }
        // The server goes on: the next ordinary request is served.
        api.put_ok("t").await;
        accepted += 1;
    }
    let mut c = server.client().await;
    let stats = c.stats_tube("t").await;
    assert_eq!(stats.num("current-jobs-ready"), accepted);
    println!(
        "{backend:?}: {} malformed bodies each refused 400",
        cases.len()
    );
}

/// A 100 MB body, declared or chunked, is refused 413 after the first few
/// hundred kilobytes: the server neither reads nor keeps the rest.
async fn bodies_over_the_limit_are_refused_unread(backend: Backend) {
    const DECLARED: usize = 100 << 20;
    const CLIENTS: usize = 8;
    let (daemon, http, _redis) = daemon(backend).await;
    let api = Api::new(http);
    api.put_ok("t").await;
    let pid = daemon.child.id();
    let rss_before = crate::rss_bytes(pid);
    let peak = Arc::new(AtomicU64::new(rss_before));
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (peak, watching) = (peak.clone(), watching.clone());
        tokio::spawn(async move {
            while watching.load(Ordering::SeqCst) {
                peak.fetch_max(crate::rss_bytes(pid), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let start = Instant::now();
    let mut clients = Vec::new();
    for n in 0..2 * CLIENTS {
        let chunked = n % 2 == 1;
        clients.push(tokio::spawn(async move {
            let s = TcpStream::connect(http).await.expect("connect");
            let (mut rx, mut tx) = s.into_split();
            let head = match chunked {
                true => "POST /v1/tubes/t/jobs HTTP/1.1\r\nhost: delayq\r\n\
                         content-type: application/json\r\n\
                         transfer-encoding: chunked\r\n\r\n"
                    .to_string(),
                false => format!(
                    "POST /v1/tubes/t/jobs HTTP/1.1\r\nhost: delayq\r\n\
                     content-type: application/json\r\ncontent-length: {DECLARED}\r\n\r\n"
                ),
            };
            let writer = tokio::spawn(async move {
                let mut sent = 0usize;
                if tx.write_all(head.as_bytes()).await.is_err() {
                    return sent;
                }
                let chunk = vec![b'a'; 1 << 20];
                while sent < DECLARED {
                    let framed = match chunked {
                        true => {
                            tx.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                                .await
                        }
                        false => Ok(()),
                    };
                    if framed.is_err() || tx.write_all(&chunk).await.is_err() {
                        break;
                    }
                    sent += chunk.len();
                    if chunked && tx.write_all(b"\r\n").await.is_err() {
                        break;
                    }
                }
                sent
            });
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            let read = async {
                while let Ok(k @ 1..) = rx.read(&mut buf).await {
                    got.extend_from_slice(&buf[..k]);
                }
            };
            tokio::time::timeout(REPLY_TIMEOUT * 2, read)
                .await
                .expect("an answer and a close in time");
            let sent = writer.await.expect("writer");
            (got, sent)
        }));
    }
    let mut most_sent = 0;
    for c in clients {
        let (got, sent) = c.await.expect("a client");
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 413"), "answered {text:?}");
        assert!(text.contains("JOB_TOO_BIG"), "answered {text:?}");
        assert!(sent < DECLARED, "the server read all {sent} bytes");
        most_sent = most_sent.max(sent);
    }
    let took = start.elapsed();
    watching.store(false, Ordering::SeqCst);
    watcher.await.expect("watcher");
    let grew = peak.load(Ordering::SeqCst).saturating_sub(rss_before);
    // Each refusal may hold one body's worth (about 400 KB at the default
    // job size) while it reads up to the limit; 100 MB each would be 1.6 GB.
    assert!(grew < 64 << 20, "RSS grew by {} MB", grew >> 20);
    api.put_ok("t").await;
    println!(
        "{backend:?}: {} clients offering 100 MB each refused 413 in {took:.1?}; \
         at most {} MB left the client before the close; RSS peak +{} KB",
        2 * CLIENTS,
        most_sent >> 20,
        grew >> 10
    );
}

/// Clients that send their headers a byte every 100 ms, one that sends
/// nothing, and one that idles after a request, are cut off once
/// [`HEADER_TIMEOUT`] has passed; meanwhile another client is served as
/// usual.
async fn slow_headers_are_cut_off_while_others_are_served(backend: Backend) {
    const SLOW: usize = 20;
    let server = TestServer::start_http(backend).await;
    let http = server.http.expect("HTTP");
    let api = Api::new(http);
    let mut slow = Vec::new();
    for n in 0..SLOW + 2 {
        slow.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(http).await.expect("connect");
            let start = Instant::now();
            if n == SLOW {
                // Says nothing at all.
                read_until_closed(&mut s, HEADER_TIMEOUT + REPLY_TIMEOUT).await;
                return start.elapsed();
            }
            if n == SLOW + 1 {
                // Asks once, then keeps the connection idle.
                s.write_all(GET_STATS).await.expect("write");
                assert_eq!(read_response(&mut s).await.0, 200);
                let answered = Instant::now();
                read_until_closed(&mut s, HEADER_TIMEOUT + REPLY_TIMEOUT).await;
                return answered.elapsed();
            }
            // A header that never ends, a byte at a time.
            let head = b"GET /v1/stats HTTP/1.1\r\nhost: delayq\r\nx-slow: ";
            let tail = std::iter::repeat(b'a');
            for b in head.iter().copied().chain(tail) {
                if s.write_all(&[b]).await.is_err() {
                    break;
                }
                assert!(
                    start.elapsed() < HEADER_TIMEOUT + REPLY_TIMEOUT,
                    "a slow client was never cut off"
                );
                // A closed connection shows when read returns, not written.
                let mut probe = [0u8; 256];
                match tokio::time::timeout(Duration::from_millis(100), s.read(&mut probe)).await {
                    Err(_) => {}
                    Ok(Ok(0) | Err(_)) => break,
                    Ok(Ok(_)) => {
                        read_until_closed(&mut s, REPLY_TIMEOUT).await;
                        break;
                    }
                }
            }
            start.elapsed()
        }));
    }
    let start = Instant::now();
    let mut served = 0u64;
    let mut slowest = Duration::ZERO;
    while slow.iter().any(|t| !t.is_finished()) {
        let t = Instant::now();
        let (status, _) = api.get("/stats").await;
        assert_eq!(status, StatusCode::OK);
        slowest = slowest.max(t.elapsed());
        served += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = start.elapsed();
    let mut cut = Vec::new();
    for t in slow {
        let after = t.await.expect("a slow client");
        assert!(
            after >= HEADER_TIMEOUT - Duration::from_millis(500)
                && after < HEADER_TIMEOUT + Duration::from_secs(3),
            "cut off after {after:?}, not about {HEADER_TIMEOUT:?}"
        );
        cut.push(after);
    }
    assert!(served > 100, "only {served} requests served in {took:?}");
    assert!(
        slowest < Duration::from_secs(1),
        "a request took {slowest:?}"
    );
    api.put_ok("t").await;
    println!(
        "{backend:?}: {SLOW} clients trickling headers, one silent and one idle cut off after \
         {:.1?} to {:.1?}; meanwhile {served} requests served, slowest {slowest:?}",
        cut.iter().min().expect("some"),
        cut.iter().max().expect("some"),
    );
}

/// Thousands of long-polls at once: the ones a put serves get their job at
/// once, the rest are answered `TIMED_OUT` on time, memory stays bounded,
/// and nothing is left behind: no waiter, no job reserved by nobody.
async fn thousands_of_long_polls_at_once(backend: Backend) {
    // One backend at a time, and not beside the text protocol's ten
    // thousand: each long-poll is a socket at both ends.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_AT_A_TIME.lock().await;
    const WAIT: u64 = 5;
    let fds = delayq::server::raise_fd_limit();
    // The test holds one socket per long-poll; leave room for the rest.
    let n = crate::scale(2_000, 10_000).min(fds.saturating_sub(200));
    if n < 2_000 {
        println!("open-file limit {fds}: trying {n} long-polls, not 2,000");
    }
    let jobs = n / 10;
    let (daemon, http, _redis) = daemon(backend).await;
    let pid = daemon.child.id();
    let rss_before = crate::rss_bytes(pid);
    let mut c = daemon.client().await;
    c.cmd("use t").await;

    let api = Arc::new(Api::new(http));
    let start = Instant::now();
    let mut polls = Vec::with_capacity(n);
    for _ in 0..n {
        let api = api.clone();
        polls.push(tokio::spawn(async move {
            let asked = Instant::now();
            let answer = api
                .post(&format!("/tubes/t/reserve?timeout={WAIT}"), "")
                .await;
            (answer, asked, Instant::now())
        }));
    }
    crate::eventually(
        "every long-poll is waiting",
        Duration::from_secs(WAIT - 1),
        async || c.stats().await.num("current-waiting") == n as u64,
    )
    .await;
    let all_waiting = start.elapsed();
    let rss_waiting = crate::rss_bytes(pid);

    let put_at = Instant::now();
    let mut batch = Vec::new();
    for _ in 0..jobs {
        batch.extend_from_slice(b"put 0 0 120 1\r\nj\r\n");
    }
    c.send(&batch).await;
    let mut put = std::collections::BTreeSet::new();
    for _ in 0..jobs {
        let line = c.line().await;
        let id = line.strip_prefix("INSERTED ").expect("INSERTED");
        put.insert(id.to_string());
    }
    let mut delivered = std::collections::BTreeSet::new();
    let mut timed_out = 0;
    let mut latest = Duration::ZERO;
    let mut slowest_served = Duration::ZERO;
    for p in polls {
        let ((status, reply), asked, answered) = p.await.expect("a long-poll");
        let took = answered - asked;
        assert_eq!(status, StatusCode::OK, "{reply}");
        if reply["success"] == Value::Bool(true) {
            let after_put = answered.saturating_duration_since(put_at);
            assert!(
                after_put < Duration::from_secs(2),
                "a served long-poll was answered {after_put:?} after the put"
            );
            slowest_served = slowest_served.max(after_put);
            assert!(delivered.insert(reply["id"].as_str().expect("an id").to_string()));
        } else {
            assert_eq!(reply["error"], "TIMED_OUT", "{reply}");
            assert!(
                took >= Duration::from_secs(WAIT) - Duration::from_millis(100)
                    && took < Duration::from_secs(WAIT + 3),
                "a long-poll timed out after {took:?}"
            );
            latest = latest.max(took);
            timed_out += 1;
        }
    }
    assert_eq!(delivered, put, "every job went to exactly one long-poll");
    assert_eq!(timed_out, n - jobs);
    let stats = c.stats().await;
    assert_eq!(stats.num("current-waiting"), 0);
    assert_eq!(stats.num("current-jobs-ready"), 0);
    assert_eq!(stats.num("current-jobs-reserved"), jobs as u64);
    for id in &delivered {
        let (status, reply) = api.delete(&format!("/jobs/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
    }

    // No waiter is left over to swallow a job: the next put goes to the
    // next long-poll, at once.
    let next = {
        let api = api.clone();
        tokio::spawn(async move { api.post("/tubes/t/reserve?timeout=5", "").await })
    };
    c.wait_stat("current-waiting", 1).await;
    let t = Instant::now();
    let id = c.put_ok(0, 0, 120, b"last").await;
    let (status, reply) = next.await.expect("the last long-poll");
    let handed = t.elapsed();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply["id"], id.to_string(), "{reply}");
    assert!(
        handed < Duration::from_secs(1),
        "handed over after {handed:?}"
    );
    assert_eq!(api.delete(&format!("/jobs/{id}")).await.0, StatusCode::OK);
    let stats = c.stats().await;
    assert_eq!(stats.num("current-jobs-reserved"), 0);
    assert_eq!(stats.num("current-waiting"), 0);

    let per_poll = rss_waiting.saturating_sub(rss_before) / n as u64;
    // A long-poll is a socket, a hyper connection and a waiter: a few
    // kilobytes. A leak of its buffers would be tens.
    assert!(per_poll < 64 << 10, "{per_poll} bytes of RSS per long-poll");
    println!(
        "{backend:?}: {n} long-polls waiting after {all_waiting:.1?}, {per_poll} bytes of \
         RSS each; {jobs} served by puts (the last {slowest_served:.2?} after the put began), \
         {timed_out} timed out, the last after {latest:.2?}; \
         a later put handed over in {handed:?}"
    );
}

/// Past the cap (here 10) an HTTP connection is answered 503
/// `TOO_MANY_CONNECTIONS` at once and closed, not left waiting; the held
/// ones and the text protocol are unaffected, and a freed place is offered
/// again.
async fn beyond_the_connection_cap_a_client_is_refused(backend: Backend) {
    let limit = 10;
    let config = Config {
        max_connections: limit,
        ..Config::default()
    };
    let server = TestServer::start_full(backend, config, true).await;
    let http = server.http.expect("HTTP");
    let mut held = Vec::new();
    for _ in 0..limit {
        let mut s = TcpStream::connect(http).await.expect("connect");
        s.write_all(GET_STATS).await.expect("write");
        assert_eq!(read_response(&mut s).await.0, 200);
        held.push(s);
    }
    // One over, raw: told why, then closed.
    let mut extra = TcpStream::connect(http).await.expect("connect");
    extra.write_all(GET_STATS).await.expect("write");
    let got = read_until_closed(&mut extra, REPLY_TIMEOUT).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 503"), "{text:?}");
    let body = text.split("\r\n\r\n").nth(1).expect("a body");
    let reply: Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(reply["error"], "TOO_MANY_CONNECTIONS");
    // One over, through an HTTP client that sends its request first.
    let api = Api::new(http);
    let (status, reply) = api.get("/stats").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply["error"], "TOO_MANY_CONNECTIONS");
    // The text protocol has a cap of its own.
    let mut text = server.client().await;
    text.ping().await;

    for s in &mut held {
        s.write_all(GET_STATS).await.expect("write");
        assert_eq!(read_response(s).await.0, 200);
    }
    drop(held.pop());
    let fresh = Api::new(http);
    crate::eventually(
        "a freed place is offered again",
        REPLY_TIMEOUT,
        async || fresh.get("/stats").await.0 == StatusCode::OK,
    )
    .await;
    // The client keeps that connection: the cap is full again.
    let (status, _) = Api::new(http).get("/stats").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    drop(fresh);
    drop(held);
    crate::eventually("every place is free again", REPLY_TIMEOUT, async || {
        Api::new(http).get("/stats").await.0 == StatusCode::OK
    })
    .await;
    Api::new(http).put_ok("t").await;
}

/// Bytes that are not HTTP (binary noise, a text-protocol command, a TLS
/// hello, a megabyte with no line end) get at most a 4xx and a close; a
/// hundred such connections at once leave the server serving.
async fn garbage_on_the_http_port_is_closed(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let http = server.http.expect("HTTP");
    let mut noise = vec![0u8; 4096];
    fastrand::fill(&mut noise);
    noise[0] = 0;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("binary noise", noise),
        ("a text command", b"put 0 0 60 1\r\nx\r\n".to_vec()),
        ("stats", b"stats\r\n".to_vec()),
        ("a bare method", b"GET\r\n\r\n".to_vec()),
        ("a bad version", b"GET / HTTP/9.9\r\n\r\n".to_vec()),
        (
            "a TLS hello",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\x00\x00\x00\x00".to_vec(),
        ),
        ("a megabyte, no line end", vec![b'a'; 1 << 20]),
        (
            "a megabyte header",
            [&b"GET / HTTP/1.1\r\nx: "[..], &vec![b'a'; 1 << 20]].concat(),
        ),
        (
            "a bad chunk size",
            b"POST /v1/tubes/t/jobs HTTP/1.1\r\nhost: d\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"
                .to_vec(),
        ),
        (
            "two lengths",
            b"POST /v1/tubes/t/jobs HTTP/1.1\r\nhost: d\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nxx"
                .to_vec(),
        ),
    ];
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        for (what, bytes) in cases.clone() {
            tasks.push(tokio::spawn(async move {
                let mut s = TcpStream::connect(http).await.expect("connect");
                // The server may close before it has all of it.
                let _ = s.write_all(&bytes).await;
                let got = read_until_closed(&mut s, REPLY_TIMEOUT).await;
                assert!(
                    got.is_empty() || got.starts_with(b"HTTP/1.1 4"),
                    "{what}: answered {:?}",
                    String::from_utf8_lossy(&got)
                );
            }));
        }
    }
    for t in tasks {
        t.await.expect("a garbage client");
    }
    let took = start.elapsed();
    let api = Api::new(http);
    api.put_ok("t").await;
    let mut c = Client::connect(server.addr).await;
    assert_eq!(c.stats_tube("t").await.num("current-jobs-ready"), 1);
    println!(
        "{backend:?}: {} garbage connections closed in {took:.1?}",
        10 * cases.len()
    );
}
