//! The HTTP API (`/v1`) against a real server on every backend, through a
//! real HTTP client: the same commands as the text protocol, their JSON
//! replies and HTTP statuses, the long-poll (served by the broker, not by
//! polling; a client that hangs up leaves nothing behind), and the OpenAPI
//! document against the router's own list of routes.

#[macro_use]
#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Backend, REPLY_TIMEOUT, TestServer, assert_between};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

backend_tests!(
    put_reserve_finish,
    client_ids_and_exists,
    delayed_job_waits_its_delay,
    long_poll_is_served_by_a_put_on_another_connection,
    long_poll_times_out,
    batches_and_bad_timeouts,
    release_bury_kick_touch,
    jobs_that_are_not_there,
    stats_as_json,
    job_options_show_in_job_stats,
    bad_requests_get_json_errors,
    too_big_bodies,
    reservations_come_back_after_their_ttr,
    hang_up_during_a_long_poll_leaves_nothing_behind,
    hang_up_during_a_long_poll_with_a_request_pipelined_behind_it,
    openapi_lists_every_route,
);

/// One second.
const SEC: Duration = Duration::from_secs(1);

/// An HTTP client of one test server's API.
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn new(server: &TestServer) -> Api {
        let http = reqwest::Client::builder()
            .timeout(REPLY_TIMEOUT * 2)
            .build()
            .expect("an HTTP client");
        Api {
            http,
            base: format!("{}/v1", server.http_url()),
        }
    }

    /// Sends a request, with `body` as JSON if given; the status and the
    /// JSON body (every answer of the API is JSON).
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the request is answered");
        let status = response.status();
        let text = response.text().await.expect("a body");
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path}: {status} {text:?} is not JSON: {e}"));
        (status, value)
    }

    /// Sends `body` as it is, as JSON.
    async fn raw(
        &self,
        method: Method,
        path: &str,
        body: impl Into<reqwest::Body>,
    ) -> (StatusCode, Value) {
        let response = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("the request is answered");
        let status = response.status();
        let value = response.json().await.expect("a JSON body");
        (status, value)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    /// A POST without a body.
    async fn act(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::POST, path, None).await
    }

    /// Puts a job that must be inserted; its id.
    async fn add(&self, tube: &str, job: Value) -> String {
        let (status, reply) = self.post(&format!("/tubes/{tube}/jobs"), job).await;
        assert_eq!(status, StatusCode::CREATED, "{reply}");
        reply["id"].as_str().expect("an id").to_string()
    }

    /// A reserve that must get a job at once; the reply.
    async fn reserve(&self, tube: &str) -> Value {
        let (status, reply) = self.act(&format!("/tubes/{tube}/reserve")).await;
        assert_eq!(
            (status, &reply["success"]),
            (StatusCode::OK, &json!(true)),
            "{reply}"
        );
        reply
    }

    /// `stats-job` as JSON.
    async fn job_stats(&self, id: &str) -> Value {
        let (status, reply) = self.get(&format!("/jobs/{id}/stats")).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        reply["stats"].clone()
    }
}

fn timed_out() -> Value {
    json!({"success": false, "error": "TIMED_OUT"})
}

fn not_found() -> Value {
    json!({"success": false, "error": "NOT_FOUND"})
}

async fn put_reserve_finish(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let response = api
        .http
        .post(format!("{}/tubes/emails/jobs", api.base))
        .json(&json!({"body": "hello", "priority": 5, "ttr": 30}))
        .send()
        .await
        .expect("put");
    assert_eq!(response.status(), StatusCode::CREATED);
    let location = response.headers()["location"].to_str().unwrap().to_string();
    let id = response.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(location, format!("/v1/jobs/{id}"));
    let job = api.reserve("emails").await;
    assert_eq!(
        job,
        json!({"success": true, "id": id, "topic": "emails", "value": "hello"})
    );
    assert_eq!(api.job_stats(&id).await["state"], "reserved");
    let (status, reply) = api.act(&format!("/jobs/{id}/finish")).await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"success": true, "id": id}))
    );
    let (status, reply) = api.act("/tubes/emails/reserve?timeout=0").await;
    assert_eq!((status, reply), (StatusCode::OK, timed_out()));
    // The text protocol saw the same job come and go.
    let mut c = server.client().await;
    assert_eq!(c.cmd(&format!("stats-job {id}")).await, "NOT_FOUND");
    let stats = c.stats().await;
    assert_eq!((stats.num("cmd-put"), stats.num("cmd-finish")), (1, 1));
}

async fn client_ids_and_exists(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let job = json!({"id": "refund:88/a", "body": "first"});
    assert_eq!(api.add("refunds", job).await, "refund:88/a");
    let again = json!({"id": "refund:88/a", "body": "second"});
    let (status, reply) = api.post("/tubes/refunds/jobs", again).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        reply,
        json!({"success": false, "error": "EXISTS", "id": "refund:88/a"})
    );
    // A `/` in an id is percent-encoded in a path.
    let (status, reply) = api.get("/jobs/refund:88%2Fa").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply["value"], "first");
    // An all-digit client id is refused, as in JSON lines.
    let digits = json!({"id": "123", "body": "x"});
    let (status, reply) = api.post("/tubes/refunds/jobs", digits).await;
    assert_eq!(
        (status, &reply["error"]),
        (StatusCode::BAD_REQUEST, &json!("BAD_FORMAT"))
    );
    let (status, _) = api.call(Method::DELETE, "/jobs/refund:88%2Fa", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        api.get("/jobs/refund:88%2Fa").await.0,
        StatusCode::NOT_FOUND
    );
}

async fn delayed_job_waits_its_delay(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let put_at = Instant::now();
    let id = api.add("later", json!({"body": "x", "delay": 1})).await;
    let (_, reply) = api.act("/tubes/later/reserve").await;
    assert_eq!(reply, timed_out());
    let (status, reply) = api.get("/tubes/later/delayed").await;
    assert_eq!((status, &reply["id"]), (StatusCode::OK, &json!(id)));
    assert_eq!(api.get("/tubes/later/ready").await.1, not_found());
    let (_, reply) = api.act("/tubes/later/reserve?timeout=5").await;
    assert_eq!(reply["id"], json!(id), "{reply}");
    assert_between("a delay of 1 s", put_at.elapsed(), SEC / 2, SEC * 5 / 2);
}

async fn long_poll_is_served_by_a_put_on_another_connection(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let poll = tokio::spawn(async move {
        let reply = api.act("/tubes/jobs/reserve?timeout=10").await;
        (reply, Instant::now())
    });
    let mut c = server.client().await;
    c.wait_stat("current-waiting", 1).await;
    assert_eq!(c.cmd("use jobs").await, "USING jobs");
    let put_at = Instant::now();
    let id = c.put_ok(0, 0, 60, b"from text").await;
    let ((status, reply), answered_at) = poll.await.expect("the long-poll");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        reply,
        json!({"success": true, "id": id.to_string(), "topic": "jobs", "value": "from text"})
    );
    let took = answered_at - put_at;
    assert!(
        took < Duration::from_millis(500),
        "answered {took:?} after the put"
    );
    assert_eq!(c.stats().await.num("current-waiting"), 0);
}

async fn long_poll_times_out(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let started = Instant::now();
    let (status, reply) = api.act("/tubes/nothing/reserve?timeout=1").await;
    assert_eq!((status, reply), (StatusCode::OK, timed_out()));
    assert_between("a 1 s long-poll", started.elapsed(), SEC, SEC * 3);
    let stats = server.client().await.stats().await;
    assert_eq!(stats.num("current-waiting"), 0);
    assert_eq!(stats.num("cmd-reserve-with-timeout"), 1);
}

async fn batches_and_bad_timeouts(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    for n in 0..3 {
        api.add("batch", json!({"body": format!("job {n}")})).await;
    }
    let (status, reply) = api.act("/tubes/batch/reserve?count=5").await;
    assert_eq!(status, StatusCode::OK);
    let jobs = reply["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 3, "{reply}");
    assert_eq!(jobs[0]["value"], "job 0");
    // In the body as well as the query, but not in both.
    let (status, reply) = api.post("/tubes/batch/reserve", json!({"count": 2})).await;
    assert_eq!((status, reply), (StatusCode::OK, timed_out()));
    let (status, reply) = api
        .post("/tubes/batch/reserve?count=2", json!({"count": 2}))
        .await;
    assert_eq!(
        (status, &reply["error"]),
        (StatusCode::BAD_REQUEST, &json!("BAD_FORMAT"))
    );
    for bad in [
        "timeout=301",
        "timeout=-1",
        "timeout=x",
        "timeout=1&timeout=2",
        "count=0",
        "count=1001",
    ] {
        let (status, reply) = api.act(&format!("/tubes/batch/reserve?{bad}")).await;
        assert_eq!(
            (status, reply),
            (
                StatusCode::BAD_REQUEST,
                json!({"success": false, "error": "BAD_FORMAT"})
            ),
            "{bad}"
        );
    }
}

async fn release_bury_kick_touch(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let id = api.add("work", json!({"body": "x", "priority": 7})).await;
    api.reserve("work").await;
    let (status, reply) = api.act(&format!("/jobs/{id}/touch")).await;
    assert_eq!((status, reply), (StatusCode::OK, json!({"success": true})));
    let release = json!({"priority": 3, "delay": 0});
    let (status, reply) = api.post(&format!("/jobs/{id}/release"), release).await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"success": true, "buried": false}))
    );
    assert_eq!(api.job_stats(&id).await["pri"], 3);
    api.reserve("work").await;
    let (status, reply) = api.act(&format!("/jobs/{id}/bury")).await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"success": true, "buried": true}))
    );
    assert_eq!(
        api.job_stats(&id).await["pri"],
        1024,
        "bury's default priority"
    );
    let (status, reply) = api.get("/tubes/work/buried").await;
    assert_eq!((status, &reply["id"]), (StatusCode::OK, &json!(id)));
    let (status, reply) = api.act(&format!("/jobs/{id}/kick")).await;
    assert_eq!((status, reply), (StatusCode::OK, json!({"success": true})));
    let (_, reply) = api.get("/tubes/work/ready").await;
    assert_eq!(reply["id"], json!(id));
    // A tube's kick, up to a bound.
    api.reserve("work").await;
    api.post(&format!("/jobs/{id}/bury"), json!({"priority": 9}))
        .await;
    let (status, reply) = api.post("/tubes/work/kick", json!({"bound": 10})).await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"success": true, "count": 1}))
    );
    let (status, reply) = api.post("/tubes/work/kick", json!({})).await;
    assert_eq!(
        (status, &reply["error"]),
        (StatusCode::BAD_REQUEST, &json!("BAD_FORMAT"))
    );
    // A paused tube gives nothing until its pause ends.
    let (status, _) = api.post("/tubes/work/pause", json!({"delay": 60})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(api.act("/tubes/work/reserve").await.1, timed_out());
    assert_eq!(
        api.post("/tubes/nope/pause", json!({"delay": 1})).await.1,
        not_found()
    );
}

async fn jobs_that_are_not_there(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    for path in [
        "/jobs/99",
        "/jobs/nope",
        "/jobs/99/stats",
        "/tubes/none/stats",
    ] {
        assert_eq!(
            api.get(path).await,
            (StatusCode::NOT_FOUND, not_found()),
            "{path}"
        );
    }
    for peek in ["ready", "delayed", "buried"] {
        let path = format!("/tubes/none/{peek}");
        assert_eq!(
            api.get(&path).await,
            (StatusCode::NOT_FOUND, not_found()),
            "{path}"
        );
    }
    for act in ["finish", "touch", "bury", "release", "kick"] {
        let path = format!("/jobs/99/{act}");
        assert_eq!(
            api.act(&path).await,
            (StatusCode::NOT_FOUND, not_found()),
            "{path}"
        );
    }
    let deleted = api.call(Method::DELETE, "/jobs/99", None).await;
    assert_eq!(deleted, (StatusCode::NOT_FOUND, not_found()));
    // A job a text connection holds is not HTTP's to finish or release.
    let mut c = server.client().await;
    let id = c.put_ok(0, 0, 60, b"held").await;
    c.reserved("reserve-with-timeout 0").await;
    for act in ["finish", "touch", "bury", "release"] {
        let path = format!("/jobs/{id}/{act}");
        assert_eq!(
            api.act(&path).await,
            (StatusCode::NOT_FOUND, not_found()),
            "{path}"
        );
    }
    assert_eq!(c.cmd(&format!("finish {id}")).await, "FINISHED");
    // No tube was made by asking about one.
    assert_eq!(c.tubes().await, ["default"]);
}

async fn stats_as_json(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let id = api.add("42", json!({"body": "x"})).await;
    let (status, reply) = api.get("/stats").await;
    assert_eq!(status, StatusCode::OK);
    let stats = &reply["stats"];
    assert_eq!(stats["current-jobs-ready"], 1);
    assert_eq!(stats["cmd-put"], 1);
    assert_eq!(stats["draining"], false);
    assert_eq!(stats["version"], env!("CARGO_PKG_VERSION"));
    // An HTTP request is not a connection.
    assert_eq!(stats["current-connections"], 0);
    let (status, reply) = api.get("/tubes").await;
    assert_eq!(status, StatusCode::OK);
    let tubes: BTreeSet<&str> = reply["tubes"]
        .as_array()
        .expect("tubes")
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(tubes.contains("42"), "{reply}");
    let (status, reply) = api.get("/tubes/42/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply["stats"]["name"], "42", "a tube name stays a string");
    assert_eq!(reply["stats"]["current-jobs-ready"], 1);
    assert_eq!(reply["stats"]["current-using"], 0);
    let job = api.job_stats(&id).await;
    assert_eq!(
        (&job["id"], &job["tube"], &job["state"]),
        (&json!(id), &json!("42"), &json!("ready"))
    );
    assert_eq!(job["ttr"], 60);
    // The same figures as the text protocol's.
    let mut c = server.client().await;
    assert_eq!(c.stats_tube("42").await.num("current-jobs-ready"), 1);
}

async fn job_options_show_in_job_stats(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let job =
        json!({"body": "x", "tries": 3, "backoff": "exp:10s", "backoff-max": 600, "ttl": "1h"});
    let id = api.add("retry", job).await;
    let stats = api.job_stats(&id).await;
    assert_eq!(stats["max-tries"], 3);
    assert_eq!(stats["tries"], 0);
    assert_eq!(stats["backoff"], "exp:10s");
    assert_eq!(stats["backoff-max"], "10m");
    assert_eq!(stats["ttl"], "1h");
    assert_eq!(stats["unique"], Value::Null);
    let mut c = server.client().await;
    assert_eq!(c.stats_job(&id).await.get("max-tries"), "3");
    for bad in [
        json!({"tries": 0}),
        json!({"tries": "x"}),
        json!({"rate": 5}),
        json!({"colour": 1, "tries": true}),
    ] {
        let mut job = bad.clone();
        job["body"] = json!("x");
        let (status, reply) = api.post("/tubes/retry/jobs", job).await;
        assert_eq!(
            (status, &reply["error"]),
            (StatusCode::BAD_REQUEST, &json!("BAD_OPTION")),
            "{bad}"
        );
    }
}

async fn bad_requests_get_json_errors(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let bad_format = (
        StatusCode::BAD_REQUEST,
        json!({"success": false, "error": "BAD_FORMAT"}),
    );
    for body in [
        "{",
        "[1]",
        "\"body\"",
        "{\"body\": 5}",
        "{\"priority\": \"1\"}",
    ] {
        let reply = api.raw(Method::POST, "/tubes/t/jobs", body).await;
        assert_eq!(reply, bad_format, "{body}");
    }
    for job in [
        json!({"body": "x", "priority": -1}),
        json!({"body": "x", "delay": 4294967296u64}),
        json!({"body": "x", "ttr": 1.5}),
        json!({"body": "x", "id": 7}),
    ] {
        assert_eq!(
            api.post("/tubes/t/jobs", job.clone()).await,
            bad_format,
            "{job}"
        );
    }
    assert_eq!(
        api.post("/tubes/-t/jobs", json!({"body": "x"})).await,
        bad_format
    );
    assert_eq!(api.get("/tubes/a%20b/stats").await, bad_format);
    assert_eq!(api.get("/jobs/%FF").await, bad_format);
    assert_eq!(
        api.post("/jobs/1/release", json!({"delay": "soon"})).await,
        bad_format
    );
    assert_eq!(
        api.raw(Method::POST, "/jobs/1/touch", "nope").await,
        bad_format
    );
    let unknown = json!({"success": false, "error": "UNKNOWN_COMMAND"});
    assert_eq!(
        api.get("/nope").await,
        (StatusCode::NOT_FOUND, unknown.clone())
    );
    let (status, reply) = api.call(Method::PUT, "/tubes/t/jobs", None).await;
    assert_eq!((status, reply), (StatusCode::METHOD_NOT_ALLOWED, unknown));
    // Refused requests change nothing and count nowhere.
    let stats = server.client().await.stats().await;
    assert_eq!((stats.num("total-jobs"), stats.num("cmd-put")), (0, 0));
}

async fn too_big_bodies(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let too_big = (
        StatusCode::PAYLOAD_TOO_LARGE,
        json!({"success": false, "error": "JOB_TOO_BIG"}),
    );
    // A job body one byte over the limit, in a request the limit allows.
    let job = json!({"body": "x".repeat(65_536)});
    assert_eq!(api.post("/tubes/t/jobs", job).await, too_big);
    // A request larger than any job could make it: read and dropped, so
    // the client, still sending, is not reset before it sees the answer.
    let huge = format!("{{\"body\":\"{}\"}}", "x".repeat(1 << 20));
    assert_eq!(api.raw(Method::POST, "/tubes/t/jobs", huge).await, too_big);
    // The largest job still goes in, escapes and all.
    let largest = json!({"body": "\u{1}".repeat(65_535)});
    assert_eq!(
        api.post("/tubes/t/jobs", largest).await.0,
        StatusCode::CREATED
    );
}

async fn reservations_come_back_after_their_ttr(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let id = api.add("default", json!({"body": "x", "ttr": 1})).await;
    api.reserve("default").await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
    let started = Instant::now();
    let job = c.reserved("reserve-with-timeout 5").await;
    assert_eq!(job.id, id);
    assert_between("a TTR of 1 s", started.elapsed(), SEC / 2, SEC * 3);
    assert_eq!(c.stats_job(&id).await.num("timeouts"), 1);
    // Now the text connection's: HTTP cannot finish it.
    assert_eq!(
        api.act(&format!("/jobs/{id}/finish")).await.0,
        StatusCode::NOT_FOUND
    );
}

async fn hang_up_during_a_long_poll_leaves_nothing_behind(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let mut c = server.client().await;
    let request = api
        .http
        .post(format!("{}/tubes/gone/reserve?timeout=30", api.base));
    let poll = tokio::spawn(request.send());
    c.wait_stat("current-waiting", 1).await;
    // The client gives up on the request, which closes its connection.
    poll.abort();
    assert!(poll.await.is_err_and(|e| e.is_cancelled()));
    c.wait_stat("current-waiting", 0).await;
    assert_eq!(c.cmd("use gone").await, "USING gone");
    assert_eq!(c.cmd("watch gone").await, "WATCHING 2");
    let id = c.put_ok(0, 0, 60, b"for whoever waits").await;
    let job = c.reserved("reserve-with-timeout 0").await;
    assert_eq!(job.id, id.to_string());
    assert_eq!(c.stats_job(id).await.num("reserves"), 1);
}

/// The same with a next request already sent behind the long-poll: hyper
/// holds it unread and reads no further, so it does not see the hang-up
/// behind it. The departed client stayed a waiter until its timeout, and a
/// job put meanwhile was handed to it and stayed reserved until its TTR.
async fn hang_up_during_a_long_poll_with_a_request_pipelined_behind_it(backend: Backend) {
    use tokio::io::AsyncWriteExt;
    let server = TestServer::start_http(backend).await;
    let addr = server.http.expect("an HTTP listener");
    let mut c = server.client().await;
    let mut gone = tokio::net::TcpStream::connect(addr).await.expect("connect");
    gone.write_all(
        b"POST /v1/tubes/gone/reserve?timeout=30 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n\
          GET /v1/stats HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await
    .expect("write");
    c.wait_stat("current-waiting", 1).await;
    // A shutdown sends the FIN whoever else holds the socket (see
    // `Client::hang_up`).
    gone.into_std()
        .expect("into_std")
        .shutdown(std::net::Shutdown::Both)
        .expect("shutdown");
    c.wait_stat("current-waiting", 0).await;
    assert_eq!(c.cmd("use gone").await, "USING gone");
    let id = c.put_ok(0, 0, 60, b"for whoever waits").await;
    let s = c.stats_job(id).await;
    assert_eq!((s.get("state"), s.num("reserves")), ("ready", 0));
}

async fn openapi_lists_every_route(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let api = Api::new(&server);
    let (status, doc) = api.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            let methods = item.as_object().expect("a path item");
            methods.keys().map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    let served: BTreeSet<(String, String)> = delayq::http::api::paths().into_iter().collect();
    assert_eq!(documented, served);
    // Every documented reference resolves.
    let text = doc.to_string();
    for at in text.match_indices("\"#/components/") {
        let rest = &text[at.0 + 2..];
        let pointer = &rest[..rest.find('"').unwrap()];
        assert!(
            doc.pointer(pointer).is_some(),
            "{pointer} is not in the document"
        );
    }
}

/// Sends `request` on a fresh connection to the server's HTTP port and
/// reads what comes back within `limit`: the text, and whether the server
/// closed the connection.
async fn raw_exchange(server: &TestServer, request: &[u8], limit: Duration) -> (String, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = server.http_url().trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    socket.write_all(request).await.expect("send");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match tokio::time::timeout_at(tokio::time::Instant::now() + limit, socket.read(&mut buf))
            .await
        {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

/// A body too big for a job is read and dropped, then answered, and the
/// connection serves the next request; one declared larger than is worth
/// reading is answered before a byte of it comes, and its connection closed.
#[tokio::test]
async fn too_big_bodies_are_answered_and_their_connection_kept_or_closed() {
    let server = TestServer::start_http(Backend::Memory).await;
    let body = format!("{{\"body\":\"{}\"}}", "x".repeat(1 << 20));
    let mut request = format!(
        "POST /v1/tubes/t/jobs HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    request.push_str("GET /v1/stats HTTP/1.1\r\nhost: x\r\n\r\n");
    let (reply, closed) = raw_exchange(&server, request.as_bytes(), SEC).await;
    assert!(reply.starts_with("HTTP/1.1 413 "), "{reply:?}");
    assert_eq!(
        reply.matches("HTTP/1.1 200 ").count(),
        1,
        "the request after the drained body: {reply:?}"
    );
    assert!(!closed, "the connection closed after a drained body");

    let started = Instant::now();
    let (reply, closed) = raw_exchange(
        &server,
        b"POST /v1/tubes/t/jobs HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000000\r\n\r\n{\"bo",
        SEC * 5,
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 413 "), "{reply:?}");
    assert!(
        reply.to_ascii_lowercase().contains("connection: close"),
        "{reply:?}"
    );
    assert!(
        closed,
        "the connection stayed open after a 1 GB declared body"
    );
    assert!(started.elapsed() < SEC * 3, "{:?}", started.elapsed());
}

/// A request whose body never comes is answered 408 once the body's time
/// is up, and its connection closed: it held one of the capped connections
/// for ever.
#[tokio::test]
async fn a_body_that_never_comes_is_answered_in_time() {
    let server = TestServer::start_http(Backend::Memory).await;
    let started = Instant::now();
    let (reply, closed) = raw_exchange(
        &server,
        b"POST /v1/tubes/x/jobs HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"bo",
        Duration::from_secs(15),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 408 "), "{reply:?}");
    assert!(closed, "the connection stayed open after the 408");
    assert_between("the 408", started.elapsed(), SEC * 9, SEC * 13);
}

/// A body declared larger than any job could make it is refused before a
/// byte of it is read (it was waited for).
#[tokio::test]
async fn a_body_declared_too_big_is_refused_at_once() {
    let server = TestServer::start_http(Backend::Memory).await;
    for declared in ["99999999999", "500000"] {
        let request = format!(
            "POST /v1/tubes/x/jobs HTTP/1.1\r\nhost: x\r\ncontent-length: {declared}\r\n\r\n"
        );
        let (reply, _) = raw_exchange(&server, request.as_bytes(), SEC * 2).await;
        assert!(reply.starts_with("HTTP/1.1 413 "), "{declared}: {reply:?}");
        assert!(reply.contains("JOB_TOO_BIG"), "{reply:?}");
    }
}

/// A client that asks for many large jobs and never reads the reply is
/// disconnected once the reply has been stuck for a while, which frees the
/// reply's memory (several times the jobs' size, once escaped; it was held
/// for as long as the client kept the connection). The jobs stay reserved
/// by HTTP until their TTR, as any job reserved over HTTP.
#[tokio::test]
async fn a_reply_left_unread_is_given_up() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start_http(Backend::Memory).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("use big").await, "USING big");
    // Each escapes to about 393 KB of JSON: far more than the sockets'
    // buffers hold.
    let body = vec![1u8; 65_535];
    for _ in 0..40 {
        c.put_ok(0, 0, 300, &body).await;
    }
    let addr = server.http_url().trim_start_matches("http://").to_string();
    let mut reader = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    reader
        .write_all(
            b"POST /v1/tubes/big/reserve?count=40 HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
        )
        .await
        .expect("send");
    c.wait_stat("current-jobs-reserved", 40).await;
    tokio::time::sleep(SEC * 14).await;
    // Read now, the server must have given up: what the sockets held, then
    // the end. (Still open, it would send the rest of the reply and keep
    // the connection for the next request.)
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let ended = loop {
        match tokio::time::timeout(SEC * 5, reader.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => got += n,
            Err(_) => break false,
        }
    };
    assert!(
        ended && got < 40 * 393_000,
        "a reply left unread for 14 s was still being sent ({got} bytes read, ended: {ended})"
    );
    assert_eq!(c.stats().await.num("current-jobs-reserved"), 40);
}

/// Without tokens, a web page of another origin open in a browser on the
/// machine could put, reserve and pause through the API: a form-like
/// `POST` needs no CORS preflight. A browser says where a request comes
/// from (`Sec-Fetch-Site`, `Origin`): from anywhere but the API's own
/// origin, it is refused. Clients that are not browsers send neither.
#[tokio::test]
async fn requests_from_pages_of_other_origins_are_refused() {
    let server = TestServer::start_http(Backend::Memory).await;
    let http = reqwest::Client::new();
    let own = server.http_url();
    let put = |headers: &[(&str, &str)]| {
        let mut r = http
            .post(format!("{own}/v1/tubes/csrf/jobs"))
            .header("content-type", "text/plain")
            .body(r#"{"body":"planted"}"#);
        for (name, value) in headers {
            r = r.header(*name, *value);
        }
        r.send()
    };
    let refused = [
        vec![("origin", "http://localhost:32091")],
        vec![("origin", "null")],
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site"), ("origin", own.as_str())],
    ];
    for headers in &refused {
        let response = put(headers).await.expect("answered");
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{headers:?}");
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body, json!({"success": false, "error": "FORBIDDEN"}));
    }
    let taken = [
        vec![],
        vec![("origin", own.as_str())],
        // Behind a proxy that rewrote `Host`, the browser still says so.
        vec![
            ("sec-fetch-site", "same-origin"),
            ("origin", "https://queue.example"),
        ],
    ];
    for headers in &taken {
        let response = put(headers).await.expect("answered");
        assert_eq!(response.status(), StatusCode::CREATED, "{headers:?}");
    }
    let mut c = server.client().await;
    assert_eq!(c.stats_tube("csrf").await.num("total-jobs"), 3);
}

/// The dashboard may not be framed by another site's page: its requests
/// are its own origin's, so a page that framed it could make a visitor
/// click **kick all** unawares.
#[tokio::test]
async fn the_dashboard_is_not_to_be_framed() {
    let server = TestServer::start_http(Backend::Memory).await;
    let response = reqwest::get(format!("{}/", server.http_url()))
        .await
        .expect("the page");
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers();
    assert_eq!(headers["x-frame-options"], "DENY");
    assert_eq!(headers["content-security-policy"], "frame-ancestors 'none'");
}

/// A large body on a slow link is taken: its time grows with what has come
/// (10 s, and a second more for every 10,000 bytes). It had 10 s in all,
/// and a 240 KB body at 20 KB/s got 408.
#[tokio::test]
async fn a_large_body_on_a_slow_link_is_taken() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start_http(Backend::Memory).await;
    let body = format!("{{\"body\":\"{}\"}}", "\\u0001".repeat(40_000));
    let addr = server.http_url().trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/tubes/slow/jobs HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.expect("send");
    let started = Instant::now();
    for piece in body.as_bytes().chunks(10_000) {
        socket.write_all(piece).await.expect("send");
        tokio::time::sleep(SEC / 2).await;
    }
    assert!(started.elapsed() > SEC * 11, "sent too fast to tell");
    let mut reply = vec![0u8; 12];
    tokio::time::timeout(SEC * 5, socket.read_exact(&mut reply))
        .await
        .expect("answered")
        .expect("read");
    assert_eq!(
        &reply,
        b"HTTP/1.1 201",
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
}
