//! Access tokens (`--tokens`) against a real server on every backend: the
//! text protocol's `auth`, roles, tube prefixes (two teams on one server),
//! JSON lines (an `auth` command, or a `token` on any command), the HTTP
//! API's bearer tokens, and the OpenAPI document's word on them. That the
//! stock protocol is untouched with tokens off is the other suites'
//! business; `/metrics` and the dashboard are checked in their own suites.

#[macro_use]
#[path = "common/mod.rs"]
mod common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{Backend, Client, TestServer, timed};
use delayq::auth::Tokens;
use delayq::config::Config;
use reqwest::Method;
use reqwest::StatusCode;
use serde_json::{Value, json};

backend_tests!(
    nothing_but_auth_before_authenticating,
    a_wrong_token_is_slowed_down_and_logged,
    producers_put_and_workers_reserve,
    admins_kick_and_delete_any_job,
    a_prefix_keeps_teams_apart,
    json_lines_authenticate_too,
    json_commands_carry_their_token,
    a_wrong_token_on_a_json_command_runs_nothing,
    http_needs_a_bearer_token,
    wrong_http_tokens_on_one_connection_wait_longer_each_time,
    with_tokens_off_auth_is_accepted,
    with_tokens_off_a_json_token_is_ignored,
);

const TOKENS: &str = "\
# token          roles            prefix
prod-secret      producer
work-secret      worker
both-secret      producer,worker
root-secret      admin
team-a-secret    producer,worker  team-a/
team-b-secret    admin            team-b/
";

async fn server(backend: Backend, http: bool) -> TestServer {
    let config = Config {
        tokens: Some(Arc::new(Tokens::parse(TOKENS).expect("the test tokens"))),
        ..Config::default()
    };
    TestServer::start_full(backend, config, http).await
}

/// A client authenticated with `token`.
async fn as_(server: &TestServer, token: &str) -> Client {
    let mut c = server.client().await;
    assert_eq!(c.cmd(&format!("auth {token}")).await, "AUTHENTICATED");
    c
}

async fn nothing_but_auth_before_authenticating(backend: Backend) {
    let server = server(backend, false).await;
    let mut c = server.client().await;
    for cmd in [
        "stats",
        "list-tubes",
        "use a",
        "reserve-with-timeout 0",
        "peek 1",
    ] {
        assert_eq!(c.cmd(cmd).await, "UNAUTHORIZED", "{cmd}");
    }
    // A put's body is read, not taken for a command.
    assert_eq!(c.put(0, 0, 10, b"stats").await, "UNAUTHORIZED");
    assert_eq!(c.cmd("auth work-secret").await, "AUTHENTICATED");
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    assert_eq!(c.reply("stats").await, "OK");
    // Nothing was put by the refused one.
    assert_eq!(c.stats().await.num("total-jobs"), 0);
}

/// What the server logs, for the tests that read the log.
#[derive(Clone)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The log of every server in this test binary, from the first call on.
fn log() -> &'static Log {
    static LOG: OnceLock<Log> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Log(Arc::default());
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .init();
        log
    })
}

async fn a_wrong_token_is_slowed_down_and_logged(backend: Backend) {
    let log = log();
    let server = server(backend, false).await;
    let mut c = server.client().await;
    let (reply, took) = timed(c.cmd("auth guessed-secret")).await;
    assert_eq!(reply, "UNAUTHORIZED");
    assert!(took >= Duration::from_millis(100), "{took:?}");
    let (reply, took) = timed(c.cmd("auth guessed-again")).await;
    assert_eq!(reply, "UNAUTHORIZED");
    assert!(
        took >= Duration::from_millis(200),
        "the second waits longer: {took:?}"
    );
    assert_eq!(c.cmd("stats").await, "UNAUTHORIZED");
    // A right token is answered at once, and resets the count: not held
    // for the 400 ms a third failure would wait (a bound with room for a
    // loaded machine, where a durable backend's sync alone can take tens of
    // milliseconds).
    let (reply, took) = timed(c.cmd("auth prod-secret")).await;
    assert_eq!(reply, "AUTHENTICATED");
    assert!(took < Duration::from_millis(400), "{took:?}");
    let text = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    assert!(text.contains("authentication failed"), "{text}");
    assert!(!text.contains("guessed"), "a token is never logged: {text}");
}

async fn producers_put_and_workers_reserve(backend: Backend) {
    let server = server(backend, false).await;
    let mut producer = as_(&server, "prod-secret").await;
    let mut worker = as_(&server, "work-secret").await;
    let id = producer.put_ok(0, 0, 60, b"job").await;
    assert_eq!(producer.cmd("reserve-with-timeout 0").await, "FORBIDDEN");
    assert_eq!(producer.cmd(&format!("delete {id}")).await, "FORBIDDEN");
    assert_eq!(producer.cmd("kick 1").await, "FORBIDDEN");
    assert_eq!(worker.put(0, 0, 60, b"no").await, "FORBIDDEN");
    // A worker may delete what it reserved, not another job.
    let other = producer.put_ok(5, 0, 60, b"other").await;
    let job = worker.reserved("reserve-with-timeout 0").await;
    assert_eq!(job.id, id.to_string());
    assert_eq!(worker.cmd(&format!("delete {other}")).await, "FORBIDDEN");
    assert_eq!(worker.cmd(&format!("delete {id}")).await, "DELETED");
    let job = worker.reserved("reserve-with-timeout 0").await;
    assert_eq!(worker.cmd(&format!("finish {}", job.id)).await, "FINISHED");
    // Both roles in one token.
    let mut both = as_(&server, "both-secret").await;
    let id = both.put_ok(0, 0, 60, b"mine").await;
    assert_eq!(
        both.reserved("reserve-with-timeout 0").await.id,
        id.to_string()
    );
    assert_eq!(both.cmd("kick 1").await, "FORBIDDEN");
    assert_eq!(both.cmd("list-schedules").await, "FORBIDDEN");
}

async fn admins_kick_and_delete_any_job(backend: Backend) {
    let server = server(backend, false).await;
    let mut root = as_(&server, "root-secret").await;
    let id = root.put_ok(0, 0, 60, b"x").await;
    let job = root.reserved("reserve-with-timeout 0").await;
    assert_eq!(root.cmd(&format!("bury {} 0", job.id)).await, "BURIED");
    assert_eq!(root.cmd("kick 10").await, "KICKED 1");
    assert_eq!(root.cmd("pause-tube default 0").await, "PAUSED");
    let mut other = as_(&server, "root-secret").await;
    assert_eq!(other.cmd(&format!("delete {id}")).await, "DELETED");
    assert_eq!(root.reply("list-schedules").await, "OK");
}

async fn a_prefix_keeps_teams_apart(backend: Backend) {
    let server = server(backend, false).await;
    let mut b = as_(&server, "team-b-secret").await;
    assert_eq!(b.cmd("use team-b/mail").await, "USING team-b/mail");
    let theirs = b.put_ok(0, 0, 60, b"b's").await;
    let buried = b.put_ok(0, 0, 60, b"b's buried").await;
    assert_eq!(b.cmd("watch team-b/mail").await, "WATCHING 2");
    let job = b.reserved("reserve-with-timeout 0").await;
    assert_eq!(b.cmd(&format!("bury {} 0", job.id)).await, "BURIED");
    assert_eq!(job.id, theirs.to_string());

    let mut a = as_(&server, "team-a-secret").await;
    // Tubes by name: FORBIDDEN, including `default`, where it starts.
    assert_eq!(a.put(0, 0, 60, b"x").await, "FORBIDDEN");
    assert_eq!(a.cmd("use team-b/mail").await, "FORBIDDEN");
    assert_eq!(a.cmd("watch team-b/mail").await, "FORBIDDEN");
    assert_eq!(a.cmd("stats-tube team-b/mail").await, "FORBIDDEN");
    assert_eq!(a.cmd("peek-ready").await, "FORBIDDEN");
    // Only `default` is watched, which it may not reserve from.
    assert_eq!(a.cmd("reserve-with-timeout 0").await, "FORBIDDEN");
    // Jobs by id: NOT_FOUND, as if they were not there.
    for cmd in [
        format!("peek {theirs}"),
        format!("stats-job {theirs}"),
        format!("finish {buried}"),
        format!("reserve-job {buried}"),
        format!("touch {theirs}"),
        format!("release {theirs} 0 0"),
    ] {
        assert_eq!(a.cmd(&cmd).await, "NOT_FOUND", "{cmd}");
    }
    // Deleting a job it does not hold needs the admin role, checked first.
    assert_eq!(a.cmd(&format!("delete {theirs}")).await, "FORBIDDEN");
    assert_eq!(
        a.cmd(&format!("delete-batch {theirs} {buried}")).await,
        "FORBIDDEN"
    );
    // Its own tubes work, and `default` need not be ignored.
    assert_eq!(a.cmd("use team-a/mail").await, "USING team-a/mail");
    let mine = a.put_ok(0, 0, 60, b"a's").await;
    assert_eq!(a.cmd("watch team-a/mail").await, "WATCHING 2");
    assert_eq!(
        a.reserved("reserve-with-timeout 0").await.id,
        mine.to_string()
    );
    assert_eq!(a.cmd(&format!("finish {mine}")).await, "FINISHED");
    let listed = a.tubes().await;
    assert!(
        listed.iter().all(|t| t.starts_with("team-a/")),
        "{listed:?}"
    );
    // Team b's admin sees only its own jobs too.
    assert_eq!(b.cmd(&format!("delete {mine}")).await, "NOT_FOUND");
    assert_eq!(b.cmd("kick-job 999999").await, "NOT_FOUND");
    assert_eq!(b.cmd("list-schedules").await, "FORBIDDEN");
    assert_eq!(b.cmd(&format!("kick-job {buried}")).await, "NOT_FOUND");
    assert_eq!(b.cmd(&format!("kick-job {theirs}")).await, "KICKED");
    assert_eq!(
        b.cmd(&format!("delete-batch {theirs} {buried}")).await,
        "DELETED 2"
    );
}

async fn json_lines_authenticate_too(backend: Backend) {
    let server = server(backend, false).await;
    let mut c = server.client().await;
    let add = json!({"command": "add", "topic": "t", "body": "x"});
    let refused = c.json(&add).await;
    assert_eq!(refused, json!({"success": false, "error": "UNAUTHORIZED"}));
    let wrong = c.json(&json!({"command": "auth", "token": "nope"})).await;
    assert_eq!(wrong, json!({"success": false, "error": "UNAUTHORIZED"}));
    let ok = c
        .json(&json!({"command": "auth", "token": "prod-secret"}))
        .await;
    assert_eq!(ok, json!({"success": true}));
    assert_eq!(c.json(&add).await["success"], Value::Bool(true));
    let pop = c
        .json(&json!({"command": "pop", "topic": "t", "timeout": 0}))
        .await;
    assert_eq!(pop, json!({"success": false, "error": "FORBIDDEN"}));
}

async fn http_needs_a_bearer_token(backend: Backend) {
    let server = server(backend, true).await;
    let http = reqwest::Client::new();
    let base = format!("{}/v1", server.http_url());
    let add = |token: Option<&str>| {
        let mut r = http
            .post(format!("{base}/tubes/team-a%2Fx/jobs"))
            .json(&json!({"body": "hi"}));
        if let Some(token) = token {
            r = r.bearer_auth(token);
        }
        r
    };
    for token in [None, Some("wrong")] {
        let response = add(token).send().await.expect("answered");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body, json!({"success": false, "error": "UNAUTHORIZED"}));
    }
    let response = add(Some("team-a-secret")).send().await.expect("answered");
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.expect("JSON");
    let id = body["id"].as_str().expect("an id").to_string();
    // The scheme's name in any case, as HTTP has it.
    for scheme in ["bearer", "BEARER"] {
        let response = http
            .post(format!("{base}/tubes/team-a%2Fx/jobs"))
            .header("authorization", format!("{scheme} team-a-secret"))
            .json(&json!({"body": "hi"}))
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status(), StatusCode::CREATED, "{scheme}");
    }
    // Another team's token: the tube is forbidden, the job not there.
    let response = http
        .post(format!("{base}/tubes/team-a%2Fx/reserve"))
        .bearer_auth("team-b-secret")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let response = http
        .get(format!("{base}/jobs/{id}"))
        .bearer_auth("team-b-secret")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = http
        .post(format!("{base}/tubes/team-a%2Fx/reserve"))
        .bearer_auth("team-a-secret")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::OK);
    let response = http
        .post(format!("{base}/jobs/{id}/finish"))
        .bearer_auth("team-a-secret")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::OK);
}

async fn with_tokens_off_auth_is_accepted(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("auth anything").await, "AUTHENTICATED");
    c.put_ok(0, 0, 60, b"x").await;
    assert!(
        c.cmd("reserve-with-timeout 0")
            .await
            .starts_with("RESERVED")
    );
}

async fn json_commands_carry_their_token(backend: Backend) {
    let server = server(backend, false).await;
    let mut c = server.client().await;
    // No `auth` first: the token on the command is enough.
    let added = c
        .json(&json!({"command": "add", "topic": "t", "body": "x", "token": "prod-secret"}))
        .await;
    assert_eq!(added["success"], Value::Bool(true), "{added}");
    let id = added["id"].as_str().expect("an id").to_string();
    // The connection stays authenticated as that token, as after `auth`:
    // a producer may not reserve (FORBIDDEN, not UNAUTHORIZED).
    let pop = json!({"command": "pop", "topic": "t", "timeout": 0});
    assert_eq!(
        c.json(&pop).await,
        json!({"success": false, "error": "FORBIDDEN"})
    );
    // Another token on the next command switches to it.
    let mut as_worker = pop.clone();
    as_worker["token"] = json!("work-secret");
    let popped = c.json(&as_worker).await;
    assert_eq!(popped["id"], Value::String(id.clone()), "{popped}");
    // One reply per command, none for the `auth` the token stands for:
    // two pipelined commands with tokens get exactly two replies.
    let finish = json!({"command": "finish", "id": id, "token": "work-secret"});
    let stats = json!({"command": "schedules", "token": "root-secret"});
    c.send(format!("{finish}\r\n{stats}\r\n").as_bytes()).await;
    let first: Value = serde_json::from_str(&c.line().await).expect("JSON");
    assert_eq!(first["success"], Value::Bool(true), "{first}");
    let second: Value = serde_json::from_str(&c.line().await).expect("JSON");
    assert_eq!(second["success"], Value::Bool(true), "{second}");
    c.expect_silence(Duration::from_millis(200)).await;
    // A token that is not a string is a bad command, and nothing else.
    let bad = c.json(&json!({"command": "schedules", "token": 7})).await;
    assert_eq!(bad, json!({"success": false, "error": "BAD_FORMAT"}));
    c.expect_silence(Duration::from_millis(200)).await;
    let mut root = as_(&server, "root-secret").await;
    assert_eq!(root.stats().await.num("cmd-finish"), 1);
}

async fn a_wrong_token_on_a_json_command_runs_nothing(backend: Backend) {
    let server = server(backend, false).await;
    let mut root = as_(&server, "root-secret").await;
    let id = root.put_ok(0, 0, 60, b"keep me").await;
    let mut c = server.client().await;
    // Even a connection that had a good token: a wrong one drops it, as a
    // failed `auth` does, and is answered as one (slowly).
    assert_eq!(c.cmd("auth root-secret").await, "AUTHENTICATED");
    let (reply, took) = timed(c.json(&json!({
        "command": "delete", "id": id.to_string(), "token": "guessed"
    })))
    .await;
    assert_eq!(reply, json!({"success": false, "error": "UNAUTHORIZED"}));
    assert!(took >= Duration::from_millis(100), "{took:?}");
    assert_eq!(root.stats_job(id).await.get("state"), "ready");
    assert_eq!(c.cmd("stats").await, "UNAUTHORIZED");
    // A right token afterwards works at once: not held for the 200 ms a
    // second failure would wait.
    let (reply, took) = timed(c.json(&json!({
        "command": "delete", "id": id.to_string(), "token": "root-secret"
    })))
    .await;
    assert_eq!(reply["success"], Value::Bool(true), "{reply}");
    assert!(took < Duration::from_millis(200), "{took:?}");
    assert_eq!(root.cmd(&format!("peek {id}")).await, "NOT_FOUND");
}

async fn with_tokens_off_a_json_token_is_ignored(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let added = c
        .json(&json!({"command": "add", "topic": "t", "body": "x", "token": "anything"}))
        .await;
    assert_eq!(added["success"], Value::Bool(true), "{added}");
    let popped = c
        .json(&json!({"command": "pop", "topic": "t", "timeout": 0, "token": "else"}))
        .await;
    assert_eq!(popped["id"], added["id"], "{popped}");
    c.expect_silence(Duration::from_millis(200)).await;
}

/// Every route the OpenAPI document lists answers 401 without a token, as
/// the document says; and the routes that answer 403 to a token without the
/// role or the tube are exactly those it lists 403 for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_lists_every_refusal() {
    let server = server(Backend::Memory, true).await;
    let base = format!("{}/v1", server.http_url());
    let http = reqwest::Client::new();
    let doc: Value = http
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .expect("answered")
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        doc["components"]["securitySchemes"]["bearerAuth"]["scheme"],
        "bearer"
    );
    let mut root = as_(&server, "root-secret").await;
    assert_eq!(root.cmd("use team-a/x").await, "USING team-a/x");
    let job = root.put_ok(0, 0, 60, b"x").await;
    for (method, path) in delayq::http::api::paths() {
        let responses = &doc["paths"][&path][&method]["responses"];
        let listed = |status: &str| responses.get(status).is_some();
        let body = match path.rsplit('/').next() {
            Some("jobs") => json!({"body": "x"}),
            Some("kick") if path.contains("{tube}") => json!({"bound": 1}),
            Some("pause") => json!({"delay": 0}),
            _ => json!({}),
        };
        // A producer on a tube it may name, and a prefix token on a tube
        // it may not: between them every refusal the roles and prefixes
        // make.
        let mut seen = Vec::new();
        for (token, tube) in [
            (None, "x"),
            (Some("prod-secret"), "x"),
            (Some("team-a-secret"), "team-b%2Fx"),
        ] {
            let url = base.clone()
                + &path
                    .trim_start_matches("/v1")
                    .replace("{tube}", tube)
                    .replace("{id}", &job.to_string());
            let mut request = http.request(
                Method::from_bytes(method.to_uppercase().as_bytes()).unwrap(),
                url,
            );
            if method != "get" {
                request = request.json(&body);
            }
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            seen.push(request.send().await.expect("answered").status());
        }
        if path == "/v1/openapi.json" {
            assert!(seen.iter().all(|s| s.is_success()), "{path}: {seen:?}");
            assert!(!listed("401") && !listed("403"), "{method} {path}");
            continue;
        }
        assert_eq!(seen[0], StatusCode::UNAUTHORIZED, "{method} {path}");
        assert!(listed("401"), "{method} {path} does not list 401");
        let forbidden = seen.contains(&StatusCode::FORBIDDEN);
        assert_eq!(
            listed("403"),
            forbidden,
            "{method} {path}: 403 listed {}, answered {seen:?}",
            listed("403")
        );
    }
}

/// Sends one request with `token` on `socket` (kept alive): a put, or with
/// `metrics` a scrape. Returns its status and how long the answer took.
async fn timed_request(
    socket: &mut tokio::io::BufReader<tokio::net::TcpStream>,
    token: &str,
    metrics: bool,
) -> (u16, Duration) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let body = r#"{"body":"hi"}"#;
    let request = if metrics {
        format!("GET /metrics HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\r\n")
    } else {
        format!(
            "POST /v1/tubes/team-a%2Fx/jobs HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let asked = std::time::Instant::now();
    socket
        .get_mut()
        .write_all(request.as_bytes())
        .await
        .expect("send");
    let mut status = String::new();
    socket.read_line(&mut status).await.expect("a status line");
    let mut length = 0;
    loop {
        let mut line = String::new();
        socket.read_line(&mut line).await.expect("a header line");
        if line == "\r\n" {
            break;
        }
        if let Some(n) = line.to_ascii_lowercase().strip_prefix("content-length: ") {
            length = n.trim().parse().expect("a length");
        }
    }
    let mut rest = vec![0; length];
    socket.read_exact(&mut rest).await.expect("the body");
    let code = status
        .split(' ')
        .nth(1)
        .expect("a status")
        .parse()
        .expect("a number");
    (code, asked.elapsed())
}

/// Wrong tokens over HTTP wait longer each time on one connection, as
/// `auth` does on a text connection (each request was a session of its
/// own, which started counting afresh: every guess waited 0.1 s); on the
/// API and on `/metrics` alike.
async fn wrong_http_tokens_on_one_connection_wait_longer_each_time(backend: Backend) {
    let server = server(backend, true).await;
    let addr = server.http_url().trim_start_matches("http://").to_string();
    for (metrics, right) in [(false, "team-a-secret"), (true, "root-secret")] {
        let mut socket = tokio::io::BufReader::new(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
        let mut took = Vec::new();
        for _ in 0..4 {
            let (status, time) = timed_request(&mut socket, "guess", metrics).await;
            assert_eq!(status, 401);
            took.push(time);
        }
        // 0.1, 0.2, 0.4 and 0.8 s.
        assert!(
            took[3] >= Duration::from_millis(700),
            "the fourth wrong token in a row waited {:?} ({took:?}; metrics: {metrics})",
            took[3]
        );
        // A right one is let in, and starts the count again.
        let (status, _) = timed_request(&mut socket, right, metrics).await;
        assert!(status == 200 || status == 201, "{status}");
        let (status, time) = timed_request(&mut socket, "guess", metrics).await;
        assert_eq!(status, 401);
        assert!(time < Duration::from_millis(400), "{time:?}");
    }
}
