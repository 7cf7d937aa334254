//! `export` and `import` (EXTENSION): every job of a server as JSON lines,
//! and back into another server with every field it had: id, tube, state
//! (a reserved job comes back ready), priority, delay, TTR, due time,
//! counters, options and where it is in its tries, burial order, and the
//! body byte for byte. An import of a job that is there already answers
//! `EXISTS`, so an import can be run again; a server id is kept unless the
//! importing server handed it out already.
//!
//! Each test moves jobs both ways between the engine under test and a fresh
//! memory-only server, so that the engine's export and its import are both
//! tried, whatever the other end. The cluster engine is shared by all the
//! tests of a run, so the tests work in tubes of their own and look only at
//! their lines.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::common::{Backend, Client, TestServer, Yaml, every_byte};
use crate::support::{SEC, put_with};

backend_tests!(
    every_job_moves_with_every_field_both_ways,
    a_repeated_import_changes_nothing,
    bad_import_lines_are_refused_and_the_connection_goes_on,
    an_imported_delayed_job_keeps_its_due_time,
    a_large_server_id_is_kept_and_its_delayed_job_comes_out_on_time,
    pipelined_imports_are_answered_in_order,
    tube_settings_and_schedules_move_too,
    bad_schedule_lines_are_refused_and_schedules_go_on,
    a_jobs_creation_time_survives_moves_to_the_millisecond,
    each_export_lists_the_settings_as_they_are_then,
    an_export_of_ids_past_2_to_the_47_goes_into_another_server,
);

/// A tube no other test of the run uses.
fn fresh_tube(what: &str) -> String {
    format!("xfer-{what}-{}", fastrand::u32(..))
}

/// The jobs of the scenario, as put into `tube` on `c`, by a name of the
/// test's: their ids and bodies. `c` ends up holding one of them reserved.
async fn make_jobs(c: &mut Client, tube: &str) -> BTreeMap<&'static str, (String, Vec<u8>)> {
    let mut jobs = BTreeMap::new();
    assert_eq!(c.cmd(&format!("use {tube}")).await, format!("USING {tube}"));
    assert!(
        c.cmd(&format!("watch {tube}"))
            .await
            .starts_with("WATCHING")
    );
    let put = |reply: String| -> String {
        reply
            .strip_prefix("INSERTED ")
            .unwrap_or_else(|| panic!("expected INSERTED, got {reply:?}"))
            .to_string()
    };
    let mut add = async |c: &mut Client, name, args: &str, body: Vec<u8>, extra: &str| {
        let id = put(put_with(c, args, &body, extra).await);
        jobs.insert(name, (id.clone(), body));
        id
    };
    add(c, "plain", "5 0 30", b"plain".to_vec(), "").await;
    let client_id = format!("{tube}:order-4711");
    add(c, "client-id", "7 0 30", every_byte(), &client_id).await;
    add(c, "later", "9 3600 45", b"later".to_vec(), "").await;
    for (name, pri) in [("first-buried", 3), ("second-buried", 4)] {
        let id = add(c, name, "100 0 30", name.as_bytes().to_vec(), "").await;
        c.reserved(&format!("reserve-job {id}")).await;
        assert_eq!(c.cmd(&format!("bury {id} {pri}")).await, "BURIED");
    }
    let id = add(
        c,
        "options",
        "11 0 30",
        b"options".to_vec(),
        "tries=3 ttl=1h",
    )
    .await;
    c.reserved(&format!("reserve-job {id}")).await;
    assert_eq!(c.cmd(&format!("release {id} 8 0")).await, "RELEASED");
    let id = add(c, "held", "12 0 600", b"held".to_vec(), "").await;
    c.reserved(&format!("reserve-job {id}")).await;
    jobs
}

/// Every line of `c`'s export that is of `tube`, read in pages of
/// `page` jobs, ids seen twice dropped.
async fn export_tube(c: &mut Client, tube: &str, page: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut cursor = String::from("0");
    for _ in 0..100_000 {
        let reply = c.cmd(&format!("export {cursor} {page}")).await;
        let mut words = reply.split(' ');
        assert_eq!(words.next(), Some("EXPORTED"), "{reply:?}");
        let next = words.next().expect("a cursor").to_string();
        let len: usize = words.next().expect("a length").parse().expect("a number");
        let data = c.read_exact(len + 2).await;
        assert!(data.ends_with(b"\r\n"), "the page ends with CRLF");
        let text = String::from_utf8(data[..len].to_vec()).expect("JSON lines are text");
        for line in text.lines() {
            let job: Value = serde_json::from_str(line).expect("each line is a JSON object");
            // Settings and schedules have no id, and come once.
            if job["tube"] == tube
                && (job["kind"].is_string() || seen.insert(job["id"].to_string()))
            {
                lines.push(line.to_string());
            }
        }
        if next == "0" {
            // As `delayq export` writes them: server ids first, so that
            // client-id jobs, which take new numbers, take none of theirs.
            lines.sort_by_key(|l| {
                let job: Value = serde_json::from_str(l).expect("a JSON line");
                match &job["id"] {
                    Value::Number(_) => 1,
                    Value::String(_) => 2,
                    _ => 0,
                }
            });
            return lines;
        }
        cursor = next;
    }
    panic!("the export never ended");
}

/// Imports `lines` into `c`; returns the id each got, in order.
async fn import_all(c: &mut Client, lines: &[String]) -> Vec<String> {
    let mut ids = Vec::new();
    for line in lines {
        let reply = c.cmd(&format!("import {}\r\n{line}", line.len())).await;
        let id = reply
            .strip_prefix("IMPORTED ")
            .unwrap_or_else(|| panic!("expected IMPORTED for {line}, got {reply:?}"));
        ids.push(id.to_string());
    }
    ids
}

/// The id of an export line, as the text protocol prints it.
fn line_id(line: &str) -> String {
    match &serde_json::from_str::<Value>(line).expect("a JSON line")["id"] {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        other => panic!("an id that is {other}"),
    }
}

/// The `stats-job` fields that must come through an export and import
/// unchanged (all but the id, the times that pass, and `file`).
fn lasting(stats: &Yaml, reserved_becomes_ready: bool) -> BTreeMap<String, String> {
    stats
        .map()
        .into_iter()
        .filter(|(k, _)| !matches!(*k, "id" | "age" | "time-left" | "file"))
        .map(|(k, v)| {
            let v = if k == "state" && v == "reserved" && reserved_becomes_ready {
                "ready"
            } else {
                v
            };
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// Moves the scenario's jobs from `from` to `to` and checks every one.
/// Returns the ids the jobs got.
async fn move_and_check(
    from: &mut Client,
    to: &mut Client,
    tube: &str,
    fresh_ids: bool,
) -> Vec<String> {
    let jobs = make_jobs(from, tube).await;
    let mut before = BTreeMap::new();
    for (name, (id, _)) in &jobs {
        before.insert(*name, from.stats_job(id).await);
    }
    // Pages of two: the scenario spans several.
    let lines = export_tube(from, tube, 2).await;
    assert_eq!(lines.len(), jobs.len(), "one line per job: {lines:#?}");
    let got = import_all(to, &lines).await;
    let moved: BTreeMap<String, String> = lines.iter().map(|l| line_id(l)).zip(got).collect();
    for (name, (id, body)) in &jobs {
        let new_id = &moved[id];
        if !id.chars().all(|c| c.is_ascii_digit()) || fresh_ids {
            assert_eq!(new_id, id, "{name} keeps its id");
        }
        let after = to.stats_job(new_id).await;
        assert_eq!(
            lasting(&after, true),
            lasting(&before[name], true),
            "{name}: every field comes through"
        );
        let (age0, age1) = (before[name].num("age"), after.num("age"));
        assert!(
            age1 >= age0 && age1 <= age0 + 3,
            "{name}: age {age0} then {age1}"
        );
        let found = to.found(&format!("peek {new_id}")).await;
        assert_eq!(&found.body, body, "{name}: the body byte for byte");
    }
    let later = to.stats_job(&moved[&jobs["later"].0]).await;
    let left = later.num("time-left");
    assert!(
        (3590..=3600).contains(&left),
        "due in an hour still: {left}"
    );
    // Buried jobs keep their order: the one buried first is kicked first.
    assert_eq!(
        to.cmd(&format!("use {tube}")).await,
        format!("USING {tube}")
    );
    let first = to.found("peek-buried").await;
    assert_eq!(first.body, b"first-buried");
    // The options' job is where it was in its tries: one used of three.
    let options = to.stats_job(&moved[&jobs["options"].0]).await;
    assert_eq!(options.get("tries"), "1");
    assert_eq!(options.get("max-tries"), "3");
    assert_eq!(options.get("ttl"), "1h");
    moved.into_values().collect()
}

async fn every_job_moves_with_every_field_both_ways(b: Backend) {
    let server = TestServer::start(b).await;
    let memory = TestServer::start(Backend::Memory).await;
    let (mut s, mut m) = (server.client().await, memory.client().await);
    // The engine's export, into a fresh store: every server id is kept.
    let ids = move_and_check(&mut s, &mut m, &fresh_tube("out"), true).await;
    // Its import, from a fresh store into a fresh one (but the shared
    // cluster, which has handed out the low server ids already: there they
    // are new).
    let memory2 = TestServer::start(Backend::Memory).await;
    let server2 = TestServer::start(b).await;
    let (mut m2, mut s2) = (memory2.client().await, server2.client().await);
    let fresh = b != Backend::Cluster;
    move_and_check(&mut m2, &mut s2, &fresh_tube("in"), fresh).await;
    // Into a store whose own jobs hold those ids, they are new ids.
    move_and_check(&mut m2, &mut s, &fresh_tube("taken"), false).await;
    // Server ids are never handed out twice: a new put comes after the
    // ids the import kept.
    let largest = ids.iter().filter_map(|id| id.parse::<u64>().ok()).max();
    let new = m.put_ok(1, 0, 10, b"new").await;
    assert!(Some(new) > largest, "a new id {new} after {largest:?}");
}

async fn a_repeated_import_changes_nothing(b: Backend) {
    let server = TestServer::start(b).await;
    let memory = TestServer::start(Backend::Memory).await;
    let (mut s, mut m) = (server.client().await, memory.client().await);
    let tube = fresh_tube("again");
    let jobs = make_jobs(&mut m, &tube).await;
    let lines = export_tube(&mut m, &tube, 100).await;
    import_all(&mut s, &lines).await;
    let total = s.stats_tube(&tube).await.num("total-jobs");
    assert_eq!(total, jobs.len() as u64);
    for line in &lines {
        let reply = s.cmd(&format!("import {}\r\n{line}", line.len())).await;
        assert_eq!(reply, format!("EXISTS {}", line_id(line)), "{line}");
    }
    let again = s.stats_tube(&tube).await.num("total-jobs");
    assert_eq!(again, total, "nothing was put again");
    // A client id held by another job is not taken over.
    let other = format!("{tube}:other");
    assert_eq!(
        s.put_id(1, 0, 10, b"mine", &other).await,
        format!("INSERTED {other}")
    );
    let mut job: Value = serde_json::from_str(&lines[0]).expect("a JSON line");
    job["id"] = Value::String(other.clone());
    let line = job.to_string();
    let reply = s.cmd(&format!("import {}\r\n{line}", line.len())).await;
    assert_eq!(reply, format!("EXISTS {other}"));
    assert_eq!(s.found(&format!("peek {other}")).await.body, b"mine");
}

async fn bad_import_lines_are_refused_and_the_connection_goes_on(b: Backend) {
    let server = TestServer::start(b).await;
    let mut c = server.client().await;
    let tube = fresh_tube("bad");
    let good = format!(
        r#"{{"id":"{tube}:x","tube":"{tube}","state":"ready","pri":1,"created":"2026-01-01T00:00:00Z","ttr-ms":1000,"body":"x"}}"#
    );
    for bad in [
        "not json".to_string(),
        "{}".to_string(),
        good.replace(r#""state":"ready""#, r#""state":"lost""#),
        good.replace(r#""body":"x""#, r#""body-base64":"!!""#),
        good.replace(&format!(r#""tube":"{tube}""#), r#""tube":"bad tube""#),
        good.replace(r#""pri":1"#, r#""pri":-1"#),
        // An imported server id is 1 to 2^48 - 1.
        good.replace(&format!(r#""id":"{tube}:x""#), r#""id":0"#),
        good.replace(&format!(r#""id":"{tube}:x""#), r#""id":281474976710656"#),
        // Delays and TTRs are at most 2^32 - 1 seconds, as a put's.
        good.replace(r#""ttr-ms":1000"#, r#""ttr-ms":4294967296000"#),
        good.replace(
            r#""ttr-ms":1000"#,
            r#""ttr-ms":1000,"delay-ms":18446744073709551615"#,
        ),
        good.replace(
            r#""state":"ready""#,
            r#""state":"delayed","due":"9999-01-01T00:00:00Z""#,
        ),
    ] {
        let reply = c.cmd(&format!("import {}\r\n{bad}", bad.len())).await;
        assert_eq!(reply, "BAD_FORMAT", "{bad}");
    }
    // A body over the job size limit, and a line longer than any could be:
    // the line is skipped, not taken for commands.
    let big = good.replace(
        r#""body":"x""#,
        &format!(r#""body":"{}""#, "y".repeat(70_000)),
    );
    let reply = c.cmd(&format!("import {}\r\n{big}", big.len())).await;
    assert_eq!(reply, "JOB_TOO_BIG");
    let huge = "put 0 0 1 1\r\nz\r\n".repeat(40_000);
    let reply = c.cmd(&format!("import {}\r\n{huge}", huge.len())).await;
    assert_eq!(reply, "JOB_TOO_BIG");
    // A body line must end where it said.
    c.send(format!("import {}\r\n{good}xx", good.len()).as_bytes())
        .await;
    assert_eq!(c.line().await, "EXPECTED_CRLF");
    for bad in [
        "export",
        "export 0",
        "export x 10",
        "export 0 0",
        "export 1. 5",
        "import x",
    ] {
        let reply = c.cmd(bad).await;
        assert!(
            reply == "BAD_FORMAT" || reply == "UNKNOWN_COMMAND",
            "{bad}: {reply}"
        );
    }
    // Nothing of the above was put, and the connection still works.
    assert_eq!(c.cmd(&format!("stats-tube {tube}")).await, "NOT_FOUND");
    let reply = c.cmd(&format!("import {}\r\n{good}", good.len())).await;
    assert_eq!(reply, format!("IMPORTED {tube}:x"));
}

async fn an_imported_delayed_job_keeps_its_due_time(b: Backend) {
    let server = TestServer::start(b).await;
    let memory = TestServer::start(Backend::Memory).await;
    let (mut s, mut m) = (server.client().await, memory.client().await);
    let tube = fresh_tube("due");
    assert_eq!(m.cmd(&format!("use {tube}")).await, format!("USING {tube}"));
    m.put_ok(1, 3, 10, b"soon").await;
    let lines = export_tube(&mut m, &tube, 10).await;
    assert_eq!(lines.len(), 1);
    // A second of the delay passes between export and import.
    tokio::time::sleep(SEC).await;
    let ids = import_all(&mut s, &lines).await;
    assert_eq!(s.cmd(&format!("watch {tube}")).await, "WATCHING 2");
    let started = tokio::time::Instant::now();
    let job = s.reserved("reserve-with-timeout 5").await;
    let took = started.elapsed();
    assert_eq!(job.body, b"soon");
    assert_eq!(job.id, ids[0]);
    assert!(
        took >= Duration::from_millis(1500) && took <= Duration::from_millis(3000),
        "due when it was due at the exporter, 2 s after the import: {took:?}"
    );
}

/// A server id far up the range an import may bring, due late in a second: on Redis a
/// delayed job's place in its delay bucket is its number times 1000 plus
/// the due time's milliseconds, past what a double holds exactly for such
/// an id (Lua's numbers), where this one rounded onto the next id's place.
/// It comes out when due, under its id.
async fn a_large_server_id_is_kept_and_its_delayed_job_comes_out_on_time(b: Backend) {
    use chrono::{SecondsFormat, Timelike, Utc};
    let server = TestServer::start(b).await;
    let mut c = server.client().await;
    let tube = fresh_tube("big");
    let due = (Utc::now() + chrono::Duration::seconds(2))
        .with_nanosecond(992_000_000)
        .expect("a valid time");
    let line = format!(
        r#"{{"id":72057594037931,"tube":"{tube}","state":"delayed","pri":1,"created":"2026-01-01T00:00:00Z","due":"{}","ttr-ms":60000,"body":"big id"}}"#,
        due.to_rfc3339_opts(SecondsFormat::Millis, true)
    );
    let ids = import_all(&mut c, &[line]).await;
    assert_eq!(c.cmd(&format!("watch {tube}")).await, "WATCHING 2");
    let job = c.reserved("reserve-with-timeout 4").await;
    assert_eq!(
        (job.id.as_str(), job.body.as_slice()),
        (ids[0].as_str(), &b"big id"[..])
    );
    assert!(Utc::now() >= due, "out before it was due");
    assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
    // The jobs put after it are numbered past it, and come out too.
    assert_eq!(c.cmd(&format!("use {tube}")).await, format!("USING {tube}"));
    let next = c.put_ok(0, 1, 60, b"after").await;
    assert_eq!(
        c.reserved("reserve-with-timeout 5").await.id,
        next.to_string()
    );
}

async fn pipelined_imports_are_answered_in_order(b: Backend) {
    let server = TestServer::start(b).await;
    let mut c = server.client().await;
    let tube = fresh_tube("pipe");
    let line = |id: &str| {
        format!(
            r#"{{"id":"{tube}:{id}","tube":"{tube}","state":"ready","pri":1,"created":"2026-01-01T00:00:00Z","ttr-ms":1000,"body":"{id}"}}"#
        )
    };
    // Imports gathered as puts are, with a repeat, a bad line and a put
    // among them: all in one write.
    let mut lines: Vec<String> = (0..50).map(|i| line(&i.to_string())).collect();
    lines.insert(10, line("3"));
    lines.insert(20, "not json".into());
    let mut msg = Vec::new();
    for l in &lines {
        msg.extend_from_slice(format!("import {}\r\n{l}\r\n", l.len()).as_bytes());
    }
    msg.extend_from_slice(format!("use {tube}\r\nput 0 0 10 1\r\nx\r\n").as_bytes());
    c.send(&msg).await;
    let mut n = 0;
    for (i, l) in lines.iter().enumerate() {
        let reply = c.line().await;
        if l == "not json" {
            assert_eq!(reply, "BAD_FORMAT");
            continue;
        }
        let id = line_id(l);
        if i == 10 {
            assert_eq!(reply, format!("EXISTS {id}"));
        } else {
            assert_eq!(reply, format!("IMPORTED {id}"), "reply {n}");
            n += 1;
        }
    }
    assert_eq!(c.line().await, format!("USING {tube}"));
    assert!(c.line().await.starts_with("INSERTED "));
    assert_eq!(n, 50);
    assert_eq!(c.stats_tube(&tube).await.num("current-jobs-ready"), 51);
}

/// Sets `tube`'s settings and registers the schedule `name` into it on
/// `c`, with one job.
async fn settings_and_schedule(c: &mut Client, tube: &str, name: &str) {
    assert_eq!(
        c.cmd(&format!("tube-set {tube} tries=5 backoff=exp:10s"))
            .await,
        "SET"
    );
    // Its moments (multiples of the interval since the epoch) are a year
    // apart: an hourly one fired at the turn of an hour in a CI run, and
    // its job made the export one line longer.
    let line = format!("schedule {name} {tube} 7 30 5 every 366d\r\nhello");
    assert!(c.cmd(&line).await.starts_with("SCHEDULED "));
    assert_eq!(c.cmd(&format!("use {tube}")).await, format!("USING {tube}"));
    c.put_ok(1, 0, 10, b"job").await;
}

/// Checks that `c` has what [`settings_and_schedule`] made.
async fn has_settings_and_schedule(c: &mut Client, tube: &str, name: &str) {
    let settings = c.yaml(&format!("tube-settings {tube}")).await;
    assert_eq!(settings.get("tries"), "5");
    assert_eq!(settings.get("backoff"), "exp:10s");
    let all = c.schedules().await.join("\n");
    assert!(all.contains(name), "{name} in {all}");
    assert_eq!(c.stats_tube(tube).await.num("current-jobs-ready"), 1);
}

async fn tube_settings_and_schedules_move_too(b: Backend) {
    let server = TestServer::start(b).await;
    let memory = TestServer::start(Backend::Memory).await;
    let (mut s, mut m) = (server.client().await, memory.client().await);
    move_settings_and_schedule(&mut s, &mut m, "out").await;
    move_settings_and_schedule(&mut m, &mut s, "in").await;
}

/// The embedded engines keep the list an export gives of the tubes'
/// settings until they change: an export after a `tube-set` has the new
/// settings, and none once they are cleared.
async fn each_export_lists_the_settings_as_they_are_then(b: Backend) {
    let server = TestServer::start(b).await;
    let mut c = server.client().await;
    let tube = fresh_tube("listed");
    for (set, want) in [
        ("tries=5", vec!["tries=5"]),
        ("tries=7 ttl=1h", vec!["tries=7 ttl=1h"]),
        ("", vec![]),
    ] {
        let line = format!("tube-set {tube} {set}");
        assert_eq!(c.cmd(line.trim_end()).await, "SET");
        let listed: Vec<String> = export_tube(&mut c, &tube, 10)
            .await
            .iter()
            .map(|line| {
                let line: Value = serde_json::from_str(line).expect("JSON");
                assert_eq!(line["kind"], "settings", "{line}");
                line["options"].as_str().expect("options").to_string()
            })
            .collect();
        assert_eq!(listed, want, "after tube-set {tube} {set}");
    }
}

/// Makes settings, a schedule and a job on `from`, moves them to `to` and
/// checks them there.
async fn move_settings_and_schedule(from: &mut Client, to: &mut Client, what: &str) {
    let tube = fresh_tube(what);
    let name = format!("{tube}-nightly");
    settings_and_schedule(from, &tube, &name).await;
    let lines = export_tube(from, &tube, 10).await;
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let mut replies = Vec::new();
    for line in &lines {
        replies.push(to.cmd(&format!("import {}\r\n{line}", line.len())).await);
    }
    assert_eq!(
        replies[0],
        format!("IMPORTED settings {tube}"),
        "{replies:?}"
    );
    assert_eq!(
        replies[1],
        format!("IMPORTED schedule {name}"),
        "{replies:?}"
    );
    assert!(replies[2].starts_with("IMPORTED "), "{replies:?}");
    has_settings_and_schedule(to, &tube, &name).await;
    // The cluster engine is shared by every test: leave no schedule.
    for c in [from, to] {
        assert_eq!(c.cmd(&format!("unschedule {name}")).await, "UNSCHEDULED");
    }
}

/// The line of an exported schedule: the fields as the stores keep them
/// (`name`, `tube`, priority, TTR and registration in ms, interval or
/// `cron`, zone, expression, body), base64 in a JSON line.
fn schedule_line(
    name: &str,
    tube: &str,
    ttr_ms: u64,
    since: u64,
    every: &str,
    expr: &str,
) -> String {
    use base64::Engine;
    let (zone, every) = if expr.is_empty() {
        ("", every)
    } else {
        ("UTC", "cron")
    };
    let raw = format!("1\n{name}\n{tube}\n0\n{ttr_ms}\n{since}\n{every}\n{zone}\n{expr}\nbody");
    serde_json::json!({
        "kind": "schedule",
        "name": name,
        "tube": tube,
        "schedule": base64::engine::general_purpose::STANDARD.encode(raw),
    })
    .to_string()
}

/// An import takes no schedule that `schedule` would have refused: an
/// interval under a second (zero stopped every schedule of the server, and
/// its listing), a name a firing's id cannot carry, a TTR or registration
/// out of range, a line whose name is not its schedule's. The schedules
/// then go on: the listing answers and a good line is imported.
async fn bad_schedule_lines_are_refused_and_schedules_go_on(b: Backend) {
    let server = TestServer::start(b).await;
    let mut c = server.client().await;
    let tube = fresh_tube("sched");
    let name = format!("{tube}-good");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let hour = 3_600_000;
    for bad in [
        schedule_line(&name, &tube, 60_000, now, "0", ""),
        schedule_line(&name, &tube, 60_000, now, "1", ""),
        schedule_line(&name, &tube, 60_000, now, "999", ""),
        schedule_line(
            &name,
            &tube,
            60_000,
            now,
            &(400 * 86_400_000u64).to_string(),
            "",
        ),
        schedule_line("a b", &tube, 60_000, now, "1000", ""),
        schedule_line(&"n".repeat(200), &tube, 60_000, now, "1000", ""),
        schedule_line(&name, &tube, u64::MAX, now, "1000", ""),
        schedule_line(&name, &tube, 60_000, now + 2 * hour, "1000", ""),
        schedule_line(&name, &tube, 60_000, u64::MAX, "1000", ""),
        schedule_line(&name, &tube, 60_000, now, "", "not cron"),
        schedule_line(&name, &tube, 60_000, now, "1000", "")
            .replace(&format!(r#""name":"{name}""#), r#""name":"another""#),
    ] {
        let reply = c.cmd(&format!("import {}\r\n{bad}", bad.len())).await;
        assert_eq!(reply, "BAD_FORMAT", "{bad}");
    }
    assert!(c.schedules().await.iter().all(|s| !s.contains(&tube)));
    let good = schedule_line(&name, &tube, 60_000, now, "1000", "");
    let reply = c.cmd(&format!("import {}\r\n{good}", good.len())).await;
    assert_eq!(reply, format!("IMPORTED schedule {name}"));
    // It fires, once a second.
    assert_eq!(c.cmd(&format!("watch {tube}")).await, "WATCHING 2");
    let job = c.reserved("reserve-with-timeout 3").await;
    assert_eq!(job.body, b"body");
    assert!(c.schedules().await.join("\n").contains(&name));
    assert_eq!(c.cmd(&format!("unschedule {name}")).await, "UNSCHEDULED");
}

/// A job's `created` comes out of an export as it went into the import,
/// to the millisecond, move after move (on Redis it was counted from the
/// job's age, and each move made the job a millisecond younger).
async fn a_jobs_creation_time_survives_moves_to_the_millisecond(b: Backend) {
    const CREATED: &str = "2026-01-01T00:00:00.123Z";
    let server = TestServer::start(b).await;
    let mut c = server.client().await;
    for round in 0..5 {
        let tube = fresh_tube("created");
        let line = format!(
            r#"{{"id":"{tube}:job","tube":"{tube}","state":"ready","pri":1,"created":"{CREATED}","ttr-ms":1000,"body":"x"}}"#
        );
        assert_eq!(import_all(&mut c, &[line]).await, [format!("{tube}:job")]);
        let out = export_tube(&mut c, &tube, 10).await;
        assert_eq!(out.len(), 1, "{out:?}");
        let job: Value = serde_json::from_str(&out[0]).expect("a JSON line");
        assert_eq!(job["created"], CREATED, "round {round}: {}", out[0]);
        assert_eq!(c.cmd(&format!("delete {tube}:job")).await, "DELETED");
    }
}

/// A server that imported an id near the old limit of imports (2^47 - 1)
/// hands out ids past it; its export goes into another server all the same.
async fn an_export_of_ids_past_2_to_the_47_goes_into_another_server(b: Backend) {
    let server = TestServer::start(b).await;
    let mut c = server.client().await;
    let tube = fresh_tube("high");
    let top = (1u64 << 47) - 1;
    let line = format!(
        r#"{{"id":{top},"tube":"{tube}","state":"ready","pri":1,"created":"2026-01-01T00:00:00Z","ttr-ms":60000,"body":"top"}}"#
    );
    import_all(&mut c, &[line]).await;
    assert_eq!(c.cmd(&format!("use {tube}")).await, format!("USING {tube}"));
    let next = c.put_ok(1, 0, 60, b"after").await;
    assert!(next > top, "{next} is past {top}");
    let lines = export_tube(&mut c, &tube, 10).await;
    assert_eq!(lines.len(), 2, "{lines:#?}");
    let other = TestServer::start(b).await;
    let mut o = other.client().await;
    let ids = import_all(&mut o, &lines).await;
    // Kept, but on the shared cluster, where they may be taken.
    if b != Backend::Cluster {
        assert_eq!(ids, [top.to_string(), next.to_string()]);
    }
    assert_eq!(o.cmd(&format!("use {tube}")).await, format!("USING {tube}"));
    assert_eq!(o.found("peek-ready").await.body, b"top");
}
