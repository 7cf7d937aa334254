//! `GET /metrics` on every backend: the figures against `stats` and
//! `stats-tube` read at the same quiet moment, the timings, and the cap on
//! tubes. The text is read by the `prometheus-parse` crate; where Debian's
//! packages put them (`.ci/run` installs them), `promtool check metrics`
//! lints Prometheus' text format and the reference OpenMetrics parser
//! (`python3-prometheus-client`) parses what Prometheus itself is sent.

#[macro_use]
#[path = "common/mod.rs"]
mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Backend, Client, TestServer, Yaml};
use delayq::http::metrics::MAX_TUBES;
use prometheus_parse::Value;

/// Debian's `prometheus` package.
const PROMTOOL: &str = "/usr/bin/promtool";
/// Debian's `python3-prometheus-client` package, for Debian's python3.
const PYTHON: &str = "/usr/bin/python3";
const PYTHON_CLIENT: &str = "/usr/lib/python3/dist-packages/prometheus_client";
/// Parses stdin as OpenMetrics with the reference parser: it raises on
/// anything the specification forbids.
const PARSE_OPENMETRICS: &str = "import sys\n\
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\n\
    list(parse(sys.stdin.read()))";

/// What Prometheus sends: OpenMetrics first.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// One scrape, parsed.
struct Scrape(prometheus_parse::Scrape);

/// `GET /metrics` with `accept`, if any; the content type and the text.
async fn get(server: &TestServer, accept: Option<&str>) -> (String, String) {
    let mut request = reqwest::Client::new().get(format!("{}/metrics", server.http_url()));
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    let reply = request.send().await.expect("GET /metrics");
    assert_eq!(reply.status(), 200);
    let kind = reply.headers()["content-type"].to_str().unwrap().to_owned();
    (kind, reply.text().await.expect("a body"))
}

/// Scrapes as `curl` does (Prometheus' text format) and parses it.
async fn scrape(server: &TestServer) -> Scrape {
    let (kind, text) = get(server, None).await;
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    Scrape(prometheus_parse::Scrape::parse(lines).expect("parse the text format"))
}

/// Runs `program` on `input`; panics with what it said unless it succeeds
/// silently.
fn run_on(program: &str, args: &[&str], input: &str) {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().expect("it ends");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "{program} {args:?}: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
}

/// Both formats through the real tools, where they are installed:
/// `promtool check metrics` lints the text format (exit 1: it cannot parse
/// it, 3: lint problems), the reference parser reads the OpenMetrics that
/// Prometheus is sent.
async fn check_with_real_parsers(server: &TestServer) {
    let (_, text) = get(server, None).await;
    if Path::new(PROMTOOL).exists() {
        run_on(PROMTOOL, &["check", "metrics"], &text);
    } else {
        eprintln!("{PROMTOOL} not installed (Debian's prometheus): no lint");
    }
    let (kind, text) = get(server, Some(PROMETHEUS_ACCEPT)).await;
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    assert!(text.ends_with("# EOF\n"));
    if Path::new(PYTHON_CLIENT).exists() {
        run_on(PYTHON, &["-c", PARSE_OPENMETRICS], &text);
    } else {
        eprintln!(
            "{PYTHON_CLIENT} not installed (python3-prometheus-client): no OpenMetrics check"
        );
    }
}

impl Scrape {
    /// The sample `name` with exactly `labels`, as a number (a histogram's
    /// count is its `_count` sample).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let sample = self.0.samples.iter().find(|s| {
            s.metric == name
                && s.labels.len() == labels.len()
                && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
        })?;
        Some(match sample.value {
            Value::Counter(n) | Value::Gauge(n) | Value::Untyped(n) => n,
            ref other => panic!("unexpected value {other:?}"),
        })
    }

    /// Like [`Scrape::get`], for a sample that must be there.
    fn num(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let v = self
            .get(name, labels)
            .unwrap_or_else(|| panic!("no {name}{labels:?}"));
        v as u64
    }

    /// The samples named `name`.
    fn count(&self, name: &str) -> usize {
        self.0.samples.iter().filter(|s| s.metric == name).count()
    }

    /// The values of `label` across the samples named `name`.
    fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        let mut values: Vec<String> = (self.0.samples.iter())
            .filter(|s| s.metric == name)
            .filter_map(|s| s.labels.get(label).map(str::to_owned))
            .collect();
        values.sort();
        values.dedup();
        values
    }
}

/// Two tubes' jobs in every state, then every figure that `stats` and
/// `stats-tube` also show, compared at one quiet moment; the store calls
/// made since the first scrape, and a delayed job's lateness.
async fn figures_match_stats(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    // The first scrape starts the timings.
    let before = scrape(&server).await;
    assert_eq!(
        before.get("delayq_store_call_seconds_count", &[("op", "put")]),
        None
    );
    let mut a = server.client().await;
    let mut b = server.client().await;
    assert_eq!(a.cmd("use alpha").await, "USING alpha");
    assert_eq!(a.cmd("watch alpha").await, "WATCHING 2");
    a.put_ok(0, 0, 60, b"urgent").await;
    a.put_ok(2000, 0, 60, b"ready").await;
    a.put_ok(2000, 100, 60, b"delayed").await;
    let job = a.reserved("reserve-with-timeout 0").await;
    assert_eq!(job.body, b"urgent");
    assert_eq!(b.cmd("use beta").await, "USING beta");
    assert_eq!(b.cmd("watch beta").await, "WATCHING 2");
    b.put_ok(2000, 0, 60, b"one").await;
    b.put_ok(2000, 0, 60, b"two").await;
    let job = b.reserved("reserve-with-timeout 0").await;
    assert_eq!(b.cmd(&format!("delete {}", job.id)).await, "DELETED");
    let job = b.reserved("reserve-with-timeout 0").await;
    assert_eq!(b.cmd(&format!("bury {} 10", job.id)).await, "BURIED");
    b.put_ok(0, 0, 60, b"urgent").await;

    let stats = a.stats().await;
    let tubes = [
        ("alpha", a.stats_tube("alpha").await),
        ("beta", a.stats_tube("beta").await),
    ];
    let m = scrape(&server).await;
    check_against_stats(&m, &stats, &tubes);
    // Every put since the first scrape was timed, whatever the engine.
    assert_eq!(
        m.num("delayq_store_call_seconds_count", &[("op", "put")]),
        6
    );
    assert_eq!(m.num("delayq_store_up", &[]), 1);
    assert_eq!(m.num("delayq_connections", &[]), 2);
    assert_eq!(
        m.num(
            "delayq_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1
    );
    assert_eq!(
        m.get("delayq_log_syncs_total", &[]).is_some(),
        backend == Backend::Durable
    );
    // Each sync is timed before the replies it releases go out, so the
    // puts answered above were timed. A sync is timed before it is
    // counted, and the count is read first: the timings may be ahead of
    // the count, never behind it.
    let timed = m.get("delayq_log_sync_seconds_count", &[]);
    assert_eq!(timed.is_some(), backend == Backend::Durable);
    if let Some(timed) = timed {
        let syncs = m.num("delayq_log_syncs_total", &[]);
        assert!(syncs >= 1, "the puts were synced");
        assert!(timed >= syncs as f64, "{timed} syncs timed of {syncs}");
        assert!(m.get("delayq_log_sync_seconds_sum", &[]).unwrap() > 0.0);
    }

    // A job due in a second, handed to a waiting worker: one lateness.
    assert_eq!(m.num("delayq_due_lateness_seconds_count", &[]), 0);
    let mut worker = server.client().await;
    assert_eq!(worker.cmd("watch gamma").await, "WATCHING 2");
    worker.send_line("reserve-with-timeout 10").await;
    let mut producer = server.client().await;
    producer.cmd("use gamma").await;
    producer.put_ok(0, 1, 60, b"due").await;
    let line = worker.line_within(Duration::from_secs(5)).await;
    assert_eq!(worker.job_after("RESERVED", &line).await.body, b"due");
    // Recorded once the hand-out pass is over, just after the job left.
    let mut lateness = 0;
    for _ in 0..50 {
        lateness = scrape(&server)
            .await
            .num("delayq_due_lateness_seconds_count", &[]);
        if lateness > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(lateness >= 1, "the wake-up for the due job was measured");
    check_with_real_parsers(&server).await;
}

/// The scraped figures against the text protocol's.
fn check_against_stats(m: &Scrape, stats: &Yaml, tubes: &[(&str, Yaml); 2]) {
    let states = ["ready", "reserved", "delayed", "buried"];
    for state in states {
        let key = format!("current-jobs-{state}");
        assert_eq!(
            m.num("delayq_jobs", &[("state", state)]),
            stats.num(&key),
            "{key}"
        );
        for (tube, y) in tubes {
            let labels = [("tube", *tube), ("state", state)];
            assert_eq!(
                m.num("delayq_tube_jobs", &labels),
                y.num(&key),
                "{tube} {key}"
            );
        }
    }
    for (tube, y) in tubes {
        let tube = [("tube", *tube)];
        assert_eq!(
            m.num("delayq_tube_jobs_put_total", &tube),
            y.num("total-jobs")
        );
        assert_eq!(
            m.num("delayq_tube_deletes_total", &tube),
            y.num("cmd-delete")
        );
        let waiting = m.num("delayq_tube_waiting_workers", &tube);
        assert_eq!(waiting, y.num("current-waiting"));
    }
    assert_eq!(
        m.num("delayq_jobs_urgent", &[]),
        stats.num("current-jobs-urgent")
    );
    assert_eq!(m.num("delayq_jobs_put_total", &[]), stats.num("total-jobs"));
    assert_eq!(m.num("delayq_tubes", &[]), stats.num("current-tubes"));
    assert_eq!(
        m.num("delayq_job_timeouts_total", &[]),
        stats.num("job-timeouts")
    );
    for cmd in [
        "put",
        "reserve-with-timeout",
        "delete",
        "bury",
        "use",
        "watch",
    ] {
        let key = format!("cmd-{cmd}");
        let got = m.num("delayq_commands_total", &[("command", cmd)]);
        assert_eq!(got, stats.num(&key), "{key}");
    }
    assert_eq!(m.num("delayq_tubes_unlisted", &[]), 0);
}

/// More tubes than the cap: the first `MAX_TUBES` get series, the rest
/// are counted as left out, and the totals still count their jobs.
async fn tubes_past_the_cap_are_left_out(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let extra = 5;
    let made = MAX_TUBES + extra;
    let mut c: Client = server.client().await;
    // One write, then the replies: pipelined, so quick on every engine.
    let mut burst = String::new();
    for i in 0..made {
        burst.push_str(&format!("use t{i}\r\nput 0 0 60 1\r\nx\r\n"));
    }
    c.send(burst.as_bytes()).await;
    for i in 0..made {
        assert_eq!(c.line().await, format!("USING t{i}"));
        assert!(c.line().await.starts_with("INSERTED "));
    }
    let tubes = c.stats().await.num("current-tubes");
    assert_eq!(tubes as usize, made + 1, "default and t0..t{made}");
    let m = scrape(&server).await;
    let listed = m.label_values("delayq_tube_jobs", "tube");
    assert_eq!(listed.len(), MAX_TUBES, "one tube label per listed tube");
    assert_eq!(
        m.num("delayq_tubes_unlisted", &[]),
        tubes - MAX_TUBES as u64
    );
    assert_eq!(m.num("delayq_tubes", &[]), tubes);
    assert_eq!(m.num("delayq_jobs", &[("state", "ready")]), made as u64);
    for name in [
        "delayq_tube_jobs_put_total",
        "delayq_tube_pause_remaining_seconds",
    ] {
        assert_eq!(m.count(name), MAX_TUBES, "{name}");
    }
    check_with_real_parsers(&server).await;
}

backend_tests!(
    figures_match_stats,
    tubes_past_the_cap_are_left_out,
    with_tokens_a_scrape_needs_a_token_without_a_prefix,
);

/// With tokens on: no token or a wrong one is 401 (a wrong one slowly), a
/// token with a tube prefix 403, any role without a prefix gets the
/// figures, as Prometheus does with `authorization: credentials`.
async fn with_tokens_a_scrape_needs_a_token_without_a_prefix(backend: Backend) {
    let tokens = "work-secret worker\nroot-secret admin\nteam-secret admin team-a/\n";
    let config = delayq::config::Config {
        tokens: Some(std::sync::Arc::new(
            delayq::auth::Tokens::parse(tokens).expect("the test tokens"),
        )),
        ..delayq::config::Config::default()
    };
    let server = TestServer::start_full(backend, config, true).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("auth root-secret").await, "AUTHENTICATED");
    assert_eq!(
        c.cmd("use team-b/secret-tube").await,
        "USING team-b/secret-tube"
    );
    c.put_ok(0, 0, 60, b"x").await;
    let url = format!("{}/metrics", server.http_url());
    let http = reqwest::Client::new();
    let get = async |token: Option<&str>| {
        let mut request = http.get(&url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let (response, took) = common::timed(request.send()).await;
        let response = response.expect("answered");
        let status = response.status();
        let challenge = response.headers().get("www-authenticate").cloned();
        (
            status,
            challenge,
            response.text().await.expect("a body"),
            took,
        )
    };
    let (status, challenge, body, _) = get(None).await;
    assert_eq!(status, 401);
    assert_eq!(challenge.expect("a challenge"), "Bearer");
    assert_eq!(body, r#"{"success":false,"error":"UNAUTHORIZED"}"#);
    let (status, _, body, took) = get(Some("guessed")).await;
    assert_eq!(status, 401);
    assert!(took >= Duration::from_millis(100), "{took:?}");
    assert!(!body.contains("delayq_"), "{body}");
    let (status, _, body, _) = get(Some("team-secret")).await;
    assert_eq!(status, 403);
    assert_eq!(body, r#"{"success":false,"error":"FORBIDDEN"}"#);
    for token in ["work-secret", "root-secret"] {
        let (status, _, body, _) = get(Some(token)).await;
        assert_eq!(status, 200, "{token}");
        let lines = body.lines().map(|l| Ok(l.to_owned()));
        let scrape = Scrape(prometheus_parse::Scrape::parse(lines).expect("parse the text format"));
        assert_eq!(scrape.num("delayq_jobs_put_total", &[]), 1, "{token}");
        assert!(body.contains("team-b/secret-tube"), "{token}");
    }
}
