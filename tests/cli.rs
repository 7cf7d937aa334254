//! The admin subcommands (`delayq stats`, `delayq drain`...): the real
//! binary against a real server, checking what each prints and the exit
//! code a script would test (0 done, 1 nothing, 2 usage, 3 fault).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::Child;
use std::time::{Duration, Instant};

use common::daemon::{Daemon, finish_piped, free_port, spawn_piped};
use serde_json::Value;

/// What a finished `delayq` run left behind.
#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

impl Ran {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Asserts the exit code, showing everything on a mismatch.
    #[track_caller]
    fn expect(self, code: i32) -> Ran {
        assert_eq!(
            self.code,
            code,
            "stdout: {:?}\nstderr: {}",
            self.text(),
            self.stderr
        );
        self
    }
}

/// Starts `delayq args...` with its output piped.
fn spawn(args: &[&str]) -> Child {
    spawn_piped(args)
}

/// Waits for a started run to end, within the reply timeout.
fn finish(child: Child) -> Ran {
    let out = finish_piped(child);
    Ran {
        code: out.status.code().expect("delayq exited, not killed"),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `delayq args...` to its end.
fn delayq(args: &[&str]) -> Ran {
    finish(spawn(args))
}

/// Runs subcommand `args` against `daemon`.
fn admin(daemon: &Daemon, args: &[&str]) -> Ran {
    let server = daemon.addr.to_string();
    let mut all = args.to_vec();
    all.extend(["--server", &server]);
    delayq(&all)
}

/// A memory-only server with a job in tube `orders`: job 1, `hello`.
async fn server_with_a_job() -> Daemon {
    let daemon = Daemon::start(&["--in-memory"]).await;
    let mut c = daemon.client().await;
    assert_eq!(c.cmd("use orders").await, "USING orders");
    assert_eq!(c.put(0, 0, 60, b"hello").await, "INSERTED 1");
    daemon
}

/// A server that answers every line it reads with `reply`, for the faults
/// a real delayq does not produce on demand.
fn fake_server(reply: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a fake server");
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let mut writer = stream.try_clone().expect("clone the socket");
            let mut lines = BufReader::new(stream);
            let mut line = String::new();
            while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
                let _ = writer.write_all(reply);
                line.clear();
            }
        }
    });
    addr
}

#[test]
fn help_shows_the_server_flags_and_the_subcommands() {
    for help in ["--help", "-h"] {
        let out = delayq(&[help]).expect(0);
        let text = out.text();
        for word in [
            "-l",
            "-p",
            "-z",
            "-b",
            "-s",
            "--in-memory",
            "--redis",
            "stats",
            "tubes",
            "peek",
            "peek-job",
            "kick",
            "delete",
            "pause",
            "drain",
        ] {
            assert!(
                text.contains(word),
                "{help} does not mention {word}:\n{text}"
            );
        }
    }
    let text = delayq(&["drain", "--help"]).expect(0).text();
    for word in ["--server", "--timeout", "--include-buried", "Exit 1"] {
        assert!(text.contains(word), "drain --help lacks {word}:\n{text}");
    }
}

#[tokio::test]
async fn flags_without_a_subcommand_still_start_a_server() {
    // Daemon::start runs `delayq -l 127.0.0.1 -p PORT --in-memory`.
    let daemon = Daemon::start(&["--in-memory"]).await;
    let out = admin(&daemon, &["stats", "--json"]).expect(0);
    let stats: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(stats["pid"], u64::from(daemon.child.id()));
}

#[tokio::test]
async fn stats_prints_the_yaml_or_json() {
    let daemon = server_with_a_job().await;
    let out = admin(&daemon, &["stats"]).expect(0);
    let text = out.text();
    assert!(text.starts_with("---\ncurrent-jobs-urgent: 1\n"), "{text}");
    assert!(text.contains("\ncurrent-jobs-ready: 1\n"), "{text}");

    let out = admin(&daemon, &["stats", "--json"]).expect(0);
    let stats: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(stats["current-jobs-ready"], 1);
    assert_eq!(stats["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(stats["draining"], false);
    assert!(stats["id"].is_string(), "{stats}");
    assert!(stats["rusage-utime"].is_f64(), "{stats}");
    // Keys in the server's order.
    let keys: Vec<&String> = stats.as_object().unwrap().keys().take(2).collect();
    assert_eq!(keys, ["current-jobs-urgent", "current-jobs-ready"]);

    let out = admin(&daemon, &["stats", "orders", "--json"]).expect(0);
    let tube: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(tube["name"], "orders");
    assert_eq!(tube["current-jobs-ready"], 1);
    let text = admin(&daemon, &["stats", "orders"]).expect(0).text();
    assert!(text.starts_with("---\nname: orders\n"), "{text}");

    let out = admin(&daemon, &["stats", "nosuchtube"]).expect(1);
    assert!(out.stdout.is_empty());
    assert!(out.stderr.contains("no tube nosuchtube"), "{}", out.stderr);
}

#[tokio::test]
async fn tubes_prints_one_name_a_line() {
    let daemon = server_with_a_job().await;
    assert_eq!(
        admin(&daemon, &["tubes"]).expect(0).text(),
        "default\norders\n"
    );
}

#[tokio::test]
async fn peek_shows_a_job_in_each_state() {
    let daemon = Daemon::start(&["--in-memory"]).await;
    let mut c = daemon.client().await;
    c.cmd("use orders").await;
    let binary = b"two\r\nlines\0";
    assert_eq!(c.put(0, 0, 60, binary).await, "INSERTED 1");
    assert_eq!(c.put(0, 3600, 60, b"later").await, "INSERTED 2");
    assert_eq!(
        c.put_id(5, 0, 60, b"dead", "order:7").await,
        "INSERTED order:7"
    );
    c.cmd("watch orders").await;
    c.cmd("ignore default").await;
    // The lowest priority number comes first: job 1, then order:7.
    assert_eq!(c.reserve_body().await.id, "1");
    assert_eq!(c.reserve_body().await.id, "order:7");
    assert_eq!(c.cmd("bury order:7 0").await, "BURIED");
    assert_eq!(c.cmd("release 1 0 0").await, "RELEASED");

    let mut expected = b"1 11\n".to_vec();
    expected.extend_from_slice(binary);
    expected.push(b'\n');
    assert_eq!(
        admin(&daemon, &["peek", "orders"]).expect(0).stdout,
        expected
    );
    let out = admin(&daemon, &["peek", "orders", "--state", "delayed"]).expect(0);
    assert_eq!(out.text(), "2 5\nlater\n");
    let out = admin(&daemon, &["peek", "orders", "--state", "buried", "--body"]).expect(0);
    assert_eq!(out.text(), "dead");
    let out = admin(&daemon, &["peek-job", "order:7"]).expect(0);
    assert_eq!(out.text(), "order:7 4\ndead\n");
    assert_eq!(
        admin(&daemon, &["peek-job", "1", "--body"])
            .expect(0)
            .stdout,
        binary
    );

    // Nothing to show: exit 1, nothing on stdout, why on stderr.
    let out = admin(&daemon, &["peek", "default"]).expect(1);
    assert!(out.stdout.is_empty());
    assert!(
        out.stderr.contains("no ready job in default"),
        "{}",
        out.stderr
    );
    // An unknown tube holds no jobs: the same answer.
    let out = admin(&daemon, &["peek", "nosuchtube", "--state", "buried"]).expect(1);
    assert!(
        out.stderr.contains("no buried job in nosuchtube"),
        "{}",
        out.stderr
    );
    let out = admin(&daemon, &["peek-job", "99"]).expect(1);
    assert!(out.stderr.contains("no job 99"), "{}", out.stderr);
}

#[tokio::test]
async fn kick_prints_how_many_moved() {
    let daemon = server_with_a_job().await;
    let mut c = daemon.client().await;
    c.cmd("use orders").await;
    assert_eq!(c.put(0, 0, 60, b"two").await, "INSERTED 2");
    assert_eq!(c.put(0, 0, 60, b"three").await, "INSERTED 3");
    c.cmd("watch orders").await;
    for id in 1..=3 {
        assert_eq!(c.reserve_body().await.id, id.to_string());
        assert_eq!(c.cmd(&format!("bury {id} 0")).await, "BURIED");
    }
    assert_eq!(
        admin(&daemon, &["kick", "orders", "2"]).expect(0).text(),
        "2\n"
    );
    assert_eq!(c.stats_tube("orders").await.num("current-jobs-buried"), 1);
    assert_eq!(
        admin(&daemon, &["kick", "orders", "5"]).expect(0).text(),
        "1\n"
    );
    assert_eq!(c.stats_tube("orders").await.num("current-jobs-ready"), 3);
    // Nothing left to kick, or no such tube: 0 moved, exit 1.
    assert_eq!(
        admin(&daemon, &["kick", "orders", "5"]).expect(1).text(),
        "0\n"
    );
    assert_eq!(
        admin(&daemon, &["kick", "nosuchtube", "5"])
            .expect(1)
            .text(),
        "0\n"
    );
}

#[tokio::test]
async fn delete_reports_each_id() {
    let daemon = server_with_a_job().await;
    let mut c = daemon.client().await;
    assert_eq!(
        c.put_id(0, 0, 60, b"mine", "order:1").await,
        "INSERTED order:1"
    );
    assert_eq!(c.put(0, 0, 60, b"held").await, "INSERTED 3");
    assert_eq!(c.cmd("reserve-job 3").await, "RESERVED 3 4");
    c.read_exact(6).await;

    let out = admin(&daemon, &["delete", "1", "order:1"]).expect(0);
    assert_eq!(out.text(), "deleted 1\ndeleted order:1\n");
    // Gone, never there, and reserved by a worker: all "not found".
    let out = admin(&daemon, &["delete", "1", "99", "3"]).expect(1);
    assert_eq!(out.text(), "not found 1\nnot found 99\nnot found 3\n");
    assert_eq!(c.stats().await.num("current-jobs-reserved"), 1);
}

#[tokio::test]
async fn pause_pauses_an_existing_tube() {
    let daemon = server_with_a_job().await;
    let out = admin(&daemon, &["pause", "orders", "60"]).expect(0);
    assert_eq!(out.text(), "paused orders for 60 s\n");
    let mut c = daemon.client().await;
    assert_eq!(c.stats_tube("orders").await.num("pause"), 60);
    let out = admin(&daemon, &["pause", "orders", "0"]).expect(0);
    assert_eq!(out.text(), "unpaused orders\n");
    assert_eq!(c.stats_tube("orders").await.num("pause"), 0);
    let out = admin(&daemon, &["pause", "nosuchtube", "60"]).expect(1);
    assert!(out.stderr.contains("no tube nosuchtube"), "{}", out.stderr);
}

#[tokio::test]
async fn drain_waits_until_the_workers_are_done() {
    let daemon = server_with_a_job().await;
    let mut c = daemon.client().await;
    c.cmd("use orders").await;
    assert_eq!(c.put(0, 1, 60, b"delayed").await, "INSERTED 2");
    c.cmd("watch orders").await;
    assert_eq!(c.reserve_body().await.id, "1");

    let server = daemon.addr.to_string();
    let started = Instant::now();
    let drain = spawn(&["drain", "orders", "--timeout", "10", "--server", &server]);
    // A reserved job and a delayed one: still waiting after a few polls.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.cmd("delete 1").await, "DELETED");
    let job = c.reserved("reserve-with-timeout 5").await;
    assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
    let out = finish(drain).expect(0);
    assert_eq!(out.text(), "drained orders\n");
    // Not a terminal: no progress bar in the output.
    assert_eq!(out.stderr, "");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(500), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");

    // A tube that does not exist holds no jobs.
    let out = admin(&daemon, &["drain", "nosuchtube"]).expect(0);
    assert_eq!(out.text(), "drained nosuchtube\n");
}

#[tokio::test]
async fn drain_times_out_and_leaves_buried_jobs_out_unless_asked() {
    let daemon = server_with_a_job().await;
    let started = Instant::now();
    let out = admin(&daemon, &["drain", "orders", "--timeout", "0.3"]).expect(1);
    let took = started.elapsed();
    assert!(out.stdout.is_empty());
    assert!(
        out.stderr
            .contains("timed out: 1 jobs left in orders (ready 1,"),
        "{}",
        out.stderr
    );
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");

    let mut c = daemon.client().await;
    c.cmd("watch orders").await;
    assert_eq!(c.reserve_body().await.id, "1");
    assert_eq!(c.cmd("bury 1 0").await, "BURIED");
    admin(&daemon, &["drain", "orders"]).expect(0);
    let out = admin(
        &daemon,
        &["drain", "orders", "--include-buried", "--timeout", "0.2"],
    )
    .expect(1);
    assert!(out.stderr.contains("buried 1)"), "{}", out.stderr);
}

#[test]
fn no_server_is_exit_3() {
    let nobody = format!("127.0.0.1:{}", free_port());
    for args in [
        &["stats"][..],
        &["tubes"],
        &["peek", "t"],
        &["peek-job", "1"],
        &["kick", "t", "1"],
        &["delete", "1"],
        &["pause", "t", "1"],
        &["drain", "t"],
    ] {
        let mut all = args.to_vec();
        all.extend(["--server", &nobody]);
        let out = delayq(&all).expect(3);
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(
            out.stderr.contains(&format!("cannot connect to {nobody}")),
            "{args:?}: {}",
            out.stderr
        );
    }
}

#[test]
fn server_errors_are_exit_3() {
    let failing = fake_server(b"INTERNAL_ERROR\r\n").to_string();
    let out = delayq(&["stats", "--server", &failing]).expect(3);
    assert!(out.stderr.contains("INTERNAL_ERROR"), "{}", out.stderr);
    let out = delayq(&["delete", "1", "2", "--server", &failing]).expect(3);
    assert!(out.stdout.is_empty(), "a fault stops the rest");
    // Something that is not delayq at all.
    let stranger = fake_server(b"HTTP/1.1 400 Bad Request\r\n").to_string();
    let out = delayq(&["kick", "t", "1", "--server", &stranger]).expect(3);
    assert!(out.stderr.contains("unexpected reply"), "{}", out.stderr);
}

#[test]
fn bad_arguments_are_exit_2() {
    for args in [
        &["kick", "orders", "many"][..],
        &["kick", "orders"],
        &["delete"],
        &["delete", "-1"],
        &["peek", "-orders"],
        &["peek", "a:b"],
        &["peek", "orders", "--state", "reserved"],
        &["pause", "orders", "4294967296"],
        &["drain", "orders", "--timeout", "soon"],
        &["stats", "--server", "localhost"],
        &["stats", "-p", "11300"],
        &["frobnicate"],
    ] {
        let out = delayq(args).expect(2);
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(out.stderr.contains("error"), "{args:?}: {}", out.stderr);
    }
}

/// Runs `delayq args...` with standard input from `stdin` and standard
/// output into `stdout`, files of the test's, to its end.
fn delayq_files(args: &[&str], stdin: &std::path::Path, stdout: &std::path::Path) -> Ran {
    use std::process::{Command, Stdio};
    let child = Command::new(common::daemon::BIN)
        .args(args)
        .stdin(std::fs::File::open(stdin).expect("open the input"))
        .stdout(std::fs::File::create(stdout).expect("create the output"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn delayq");
    let out = child.wait_with_output().expect("delayq ran");
    Ran {
        code: out.status.code().expect("delayq exited, not killed"),
        stdout: std::fs::read(stdout).expect("read the output"),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The `stats-job` fields an export and import keep (not the times that
/// pass, nor `file`); a reserved job comes back ready.
fn lasting(doc: &common::Yaml) -> Vec<(String, String)> {
    doc.map()
        .into_iter()
        .filter(|(k, _)| !matches!(*k, "age" | "time-left" | "file"))
        .map(|(k, v)| {
            let v = if k == "state" && v == "reserved" {
                "ready"
            } else {
                v
            };
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_from_the_embedded_engine_and_import_into_redis() {
    let from = Daemon::start(&[]).await;
    let mut c = from.client().await;
    assert_eq!(c.cmd("use orders").await, "USING orders");
    assert_eq!(c.cmd("watch orders").await, "WATCHING 2");
    // 1200 jobs in every state, with server and client ids, options and
    // bodies of every byte.
    let mut ids = Vec::new();
    for i in 0..1200u32 {
        let mut body = format!("job {i} ").into_bytes();
        body.extend(
            (0..=255u8)
                .cycle()
                .skip(i as usize % 256)
                .take(i as usize % 300),
        );
        let delay = if i % 5 == 1 { 3600 } else { 0 };
        let (extra, opts) = match i % 4 {
            0 => (format!(" order-close:{i}"), ""),
            1 => (String::new(), " tries=3 ttl=2h"),
            _ => (String::new(), ""),
        };
        let line = format!("put {} {delay} 60 {}{extra}{opts}", i % 7, body.len());
        let mut msg = line.into_bytes();
        msg.extend_from_slice(b"\r\n");
        msg.extend_from_slice(&body);
        msg.extend_from_slice(b"\r\n");
        c.send(&msg).await;
        let reply = c.line().await;
        let id = reply
            .strip_prefix("INSERTED ")
            .unwrap_or_else(|| panic!("{reply}"))
            .to_string();
        if i % 10 == 3 {
            c.reserved(&format!("reserve-job {id}")).await;
            assert_eq!(c.cmd(&format!("bury {id} 5")).await, "BURIED");
        }
        ids.push((id, body));
    }
    // And the tube's settings, which the jobs above do not use (a job's
    // options are fixed at its put).
    assert_eq!(c.cmd("tube-set orders tries=4").await, "SET");
    let mut before = Vec::new();
    for (id, _) in &ids {
        before.push(lasting(&c.stats_job(id).await));
    }
    let dir = tempfile::tempdir().expect("a scratch directory");
    let (file, none) = (dir.path().join("jobs.jsonl"), dir.path().join("none"));
    std::fs::write(&none, b"").expect("an empty input");
    let server = from.addr.to_string();
    let ran = delayq_files(&["export", "--server", &server], &none, &file).expect(0);
    assert!(
        ran.stderr
            .contains("exported 1200 jobs, and 1 tube settings and schedules"),
        "{}",
        ran.stderr
    );
    let text = ran.text();
    assert_eq!(text.lines().count(), 1201);
    // The tube's settings, then server ids, then client ids.
    assert!(text.starts_with(r#"{"kind":"settings","tube":"orders","options":"tries=4"}"#));
    let first_client = text.lines().position(|l| l.contains(r#""id":""#));
    assert_eq!(first_client, Some(901));

    let redis = common::redis::RedisServer::start(&[]);
    let to = Daemon::start(&["--redis", &redis.url]).await;
    let server = to.addr.to_string();
    let out = dir.path().join("out");
    let ran = delayq_files(&["import", "--server", &server], &file, &out).expect(0);
    assert!(
        ran.stderr
            .contains("imported 1200 jobs, 0 were there already, 0 refused; 1 tube settings"),
        "{}",
        ran.stderr
    );
    let mut r = to.client().await;
    assert_eq!(r.yaml("tube-settings orders").await.get("tries"), "4");
    for ((id, body), was) in ids.iter().zip(&before) {
        assert_eq!(&lasting(&r.stats_job(id).await), was, "job {id}");
        assert_eq!(&r.found(&format!("peek {id}")).await.body, body, "job {id}");
    }
    // Run again, it finds every job there and changes nothing.
    let ran = delayq_files(&["import", "--server", &server], &file, &out).expect(0);
    assert!(
        ran.stderr
            .contains("imported 0 jobs, 1200 were there already, 0 refused"),
        "{}",
        ran.stderr
    );
    assert_eq!(r.stats_tube("orders").await.num("total-jobs"), 1200);
}

#[tokio::test]
async fn import_reports_bad_lines_and_exits_3() {
    let daemon = Daemon::start(&["--in-memory"]).await;
    let dir = tempfile::tempdir().expect("a scratch directory");
    let (file, out) = (dir.path().join("jobs.jsonl"), dir.path().join("out"));
    let good = r#"{"id":"a","tube":"t","state":"ready","pri":1,"created":"2026-01-01T00:00:00Z","ttr-ms":1000,"body":"x"}"#;
    std::fs::write(
        &file,
        format!("{good}\nnot json\n\n{}\n", good.replace(r#""a""#, r#""b""#)),
    )
    .expect("write the input");
    let server = daemon.addr.to_string();
    let ran = delayq_files(&["import", "--server", &server], &file, &out).expect(3);
    assert!(ran.stderr.contains("line 2: BAD_FORMAT"), "{}", ran.stderr);
    assert!(
        ran.stderr
            .contains("imported 2 jobs, 0 were there already, 1 refused"),
        "{}",
        ran.stderr
    );
}

#[tokio::test]
async fn export_needs_an_admin_token_without_a_prefix() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "root-admin-token admin\nteam-admin-token admin team-a/\n",
    )
    .expect("write the tokens");
    let daemon = Daemon::start(&["--in-memory", "--tokens", tokens.to_str().unwrap()]).await;
    let (none, out) = (dir.path().join("none"), dir.path().join("out"));
    std::fs::write(&none, b"").expect("an empty input");
    let server = daemon.addr.to_string();
    let run = |token: Option<&str>| {
        let mut args = vec!["export", "--server", &server];
        args.extend(token.map(|t| ["--token", t]).into_iter().flatten());
        delayq_files(&args, &none, &out)
    };
    let ran = run(None).expect(3);
    assert!(ran.stderr.contains("UNAUTHORIZED"), "{}", ran.stderr);
    let ran = run(Some("wrong")).expect(3);
    assert!(ran.stderr.contains("auth: UNAUTHORIZED"), "{}", ran.stderr);
    // A team's admin would see the other teams' jobs in an export.
    let ran = run(Some("team-admin-token")).expect(3);
    assert!(ran.stderr.contains("FORBIDDEN"), "{}", ran.stderr);
    let ran = run(Some("root-admin-token")).expect(0);
    assert!(ran.stderr.contains("exported 0 jobs"), "{}", ran.stderr);
}
