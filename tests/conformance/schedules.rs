//! Periodic jobs (EXTENSION): `schedule` (`every <interval>` and
//! `cron <zone> <expression>`), `unschedule` and `list-schedules`, and their
//! JSON forms. A schedule fires one job per moment, whose id is the
//! schedule's name and the moment in UTC, ready at the moment and not
//! before; a moment whose job is gone is not put again; the moments of a
//! cron expression follow its time zone; refusals (`BAD_SCHEDULE <reason>`,
//! `BAD_FORMAT`, `JOB_TOO_BIG`) come after the body, which is never taken
//! for a command; a store keeps at most 1000 schedules.
//!
//! Real time, on the wall clock the moments are counted in: schedules of
//! one or two seconds; no test takes more than about eight seconds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Europe::Berlin;
use serde_json::{Value, json};

use crate::common::{Backend, Client, TestServer};
use crate::support::SEC;

backend_tests!(
    an_interval_puts_one_job_per_moment_ready_at_its_moment,
    a_cron_fires_at_its_moments_read_in_its_zone,
    list_schedules_shows_them_by_name_and_unschedule_stops_the_firings,
    bad_schedules_are_refused_after_their_body_and_change_nothing,
    a_firing_done_with_is_not_put_again,
    json_schedule_unschedule_and_schedules,
    a_store_keeps_at_most_1000_schedules,
);

/// How much earlier than its moment a firing may seem to arrive: the
/// server counts a delay on its monotonic clock, the moments are on the
/// wall clock, and the two drift apart by a little.
const CLOCK_NOISE: u64 = 15;

/// How long after its moment a firing must have arrived (ms): it is put a
/// second ahead, so only the engine's timer and a loaded machine delay it.
const LATE: u64 = 1500;

const HOUR: u64 = 3_600_000;
const DAY: u64 = 24 * HOUR;

/// Milliseconds since the epoch, by the wall clock.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_millis() as u64
}

/// A moment as the server prints it (`2026-11-27T01:00:00Z`, milliseconds
/// only when it has some), as ms since the epoch.
fn at(moment: &str) -> u64 {
    assert!(moment.ends_with('Z'), "{moment:?} is not in UTC");
    let ms = DateTime::parse_from_rfc3339(moment)
        .unwrap_or_else(|e| panic!("{moment:?} is not a moment: {e}"))
        .timestamp_millis() as u64;
    if ms.is_multiple_of(1000) {
        assert_eq!(
            moment,
            show(ms),
            "a whole second is printed without a fraction"
        );
    }
    ms
}

/// A whole second as the server prints it.
fn show(ms: u64) -> String {
    let t = Utc
        .timestamp_millis_opt(ms as i64)
        .single()
        .expect("a representable moment");
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The moment a schedule registered at `t` should fire first, for a test
/// that knows how to compute it.
type Expected = fn(u64) -> u64;

/// The first multiple of `period` after `t` (ms), where intervals and
/// UTC-aligned cron fields fall.
fn next_multiple(t: u64, period: u64) -> u64 {
    (t / period + 1) * period
}

/// The first 12:00 Berlin time after `t`: 11:00 UTC in winter, 10:00 in
/// summer.
fn next_berlin_noon(t: u64) -> u64 {
    let local = Utc
        .timestamp_millis_opt(t as i64)
        .single()
        .expect("a representable moment")
        .with_timezone(&Berlin);
    let mut day = local.date_naive();
    loop {
        let noon = Berlin
            .from_local_datetime(&day.and_hms_opt(12, 0, 0).expect("noon"))
            .single()
            .expect("noon is never skipped or repeated");
        let ms = noon.timestamp_millis() as u64;
        if ms > t {
            return ms;
        }
        day = day.succ_opt().expect("a next day");
    }
}

/// The moment a firing of schedule `name` was put for, from its id.
fn firing(id: &str, name: &str) -> u64 {
    let moment = id
        .strip_prefix(name)
        .and_then(|m| m.strip_prefix('@'))
        .unwrap_or_else(|| panic!("{id:?} is not a firing of {name:?}"));
    at(moment)
}

/// Checks that the firing `id` of `moment`, which arrived at `got` (wall
/// clock, ms), was ready at its moment: not before, and not much after.
fn assert_ready_at(id: &str, moment: u64, got: u64) {
    assert!(
        got + CLOCK_NOISE >= moment,
        "{id} arrived {} ms before its moment",
        moment - got
    );
    assert!(
        got <= moment + LATE,
        "{id} arrived {} ms after its moment",
        got - moment
    );
}

/// A duration as `stats-job` prints one (`301s`, `301234ms`, `5m`), in ms.
fn millis(d: &str) -> u64 {
    let digits = d.bytes().take_while(u8::is_ascii_digit).count();
    let n: u64 = d[..digits]
        .parse()
        .unwrap_or_else(|_| panic!("{d:?} is not a duration"));
    n * match &d[digits..] {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => HOUR,
        "d" => DAY,
        other => panic!("unknown unit {other:?} in {d:?}"),
    }
}

/// The bytes of `schedule <head> <bytes> <when>` and its body; `when` may
/// be empty, for a line that ends at `<bytes>`.
fn schedule_msg(head: &str, body: &[u8], when: &str) -> Vec<u8> {
    let mut line = format!("schedule {head} {}", body.len());
    if !when.is_empty() {
        line.push(' ');
        line.push_str(when);
    }
    let mut msg = line.into_bytes();
    msg.extend_from_slice(b"\r\n");
    msg.extend_from_slice(body);
    msg.extend_from_slice(b"\r\n");
    msg
}

/// Sends `schedule <head> <bytes> <when>` (`head`: name, tube, pri, ttr)
/// and the body; returns the reply line.
async fn schedule(c: &mut Client, head: &str, body: &[u8], when: &str) -> String {
    c.send(&schedule_msg(head, body, when)).await;
    c.line().await
}

/// A `schedule` that must be registered; returns its first moment.
async fn scheduled(c: &mut Client, head: &str, body: &[u8], when: &str) -> u64 {
    let reply = schedule(c, head, body, when).await;
    let moment = reply
        .strip_prefix("SCHEDULED ")
        .unwrap_or_else(|| panic!("schedule {head} .. {when}: expected SCHEDULED, got {reply:?}"));
    at(moment)
}

/// One schedule of `list-schedules`: its `key: value` lines in order.
type Entry = Vec<(String, String)>;

/// The value of `key` in a schedule's entry; panics if absent.
fn field<'a>(e: &'a Entry, key: &str) -> &'a str {
    e.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no `{key}` in {e:?}"))
}

fn keys(e: &Entry) -> Vec<&str> {
    e.iter().map(|(k, _)| k.as_str()).collect()
}

/// `list-schedules`, as a list of maps (`- name: ...` starts one, the
/// indented lines after it are its other fields).
async fn list(c: &mut Client) -> Vec<Entry> {
    let line = c.cmd("list-schedules").await;
    let len: usize = line
        .strip_prefix("OK ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("list-schedules: expected OK <bytes>, got {line:?}"));
    let mut doc = c.read_exact(len + 2).await;
    assert_eq!(&doc[len..], b"\r\n", "YAML is followed by CRLF");
    doc.truncate(len);
    let doc = String::from_utf8(doc).expect("YAML is UTF-8");
    let mut lines = doc.split('\n');
    assert_eq!(lines.next(), Some("---"), "{doc:?}");
    assert!(doc.ends_with('\n'), "{doc:?}");
    let mut all: Vec<Entry> = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (item, first) = match line.strip_prefix("- ") {
            Some(rest) => (rest, true),
            None => (
                line.strip_prefix("  ")
                    .unwrap_or_else(|| panic!("not a list item's line: {line:?} in {doc:?}")),
                false,
            ),
        };
        let (k, v) = item
            .split_once(": ")
            .unwrap_or_else(|| panic!("not a `key: value` line: {line:?}"));
        if first {
            all.push(Vec::new());
        }
        all.last_mut()
            .unwrap_or_else(|| panic!("a field before the first item: {doc:?}"))
            .push((k.to_string(), v.to_string()));
    }
    all
}

fn names(all: &[Entry]) -> Vec<&str> {
    all.iter().map(|e| field(e, "name")).collect()
}

/// Uses and watches only `tube`.
async fn only(c: &mut Client, tube: &str) {
    assert_eq!(c.cmd(&format!("use {tube}")).await, format!("USING {tube}"));
    assert_eq!(c.cmd(&format!("watch {tube}")).await, "WATCHING 2");
    assert_eq!(c.cmd("ignore default").await, "WATCHING 1");
}

/// Reserves and deletes every ready job of the watched tubes; returns
/// their ids.
async fn drain(c: &mut Client) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        let line = c.cmd("reserve-with-timeout 0").await;
        if line == "TIMED_OUT" {
            return ids;
        }
        let job = c.job_after("RESERVED", &line).await;
        assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
        ids.push(job.id);
    }
}

/// Checks that the only jobs a tube ever got are the `taken` ones and
/// those still waiting in it, and that at most one moment is waiting
/// besides one that came due meanwhile: one job per moment.
async fn assert_one_per_moment(c: &mut Client, tube: &str, taken: u64) {
    let t = c.stats_tube(tube).await;
    let waiting = t.num("current-jobs-ready") + t.num("current-jobs-delayed");
    assert_eq!(t.num("total-jobs"), taken + waiting, "{t:?}");
    assert!(waiting <= 2, "{t:?}");
}

/// `every 1s` puts a job per second into its tube, with the schedule's
/// body, priority and TTR, named after its moment, put ahead as a delayed
/// job and ready at the moment.
async fn an_interval_puts_one_job_per_moment_ready_at_its_moment(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    only(&mut c, "beats").await;
    let before = now_ms();
    let first = scheduled(&mut c, "beat beats 7 42", b"hello", "every 1s").await;
    let after = now_ms();
    // Multiples of the interval since the epoch: the next whole second.
    assert_eq!(first % 1000, 0, "{}", show(first));
    assert!(
        first > before && first <= after + 1000,
        "first moment {first}, registered between {before} and {after}"
    );
    for i in 0..3 {
        let job = c.reserved("reserve-with-timeout 5").await;
        let got = now_ms();
        let moment = firing(&job.id, "beat");
        assert_eq!(moment, first + i * 1000, "firing {i}: {}", job.id);
        assert_eq!(job.id, format!("beat@{}", show(moment)));
        assert_ready_at(&job.id, moment, got);
        assert_eq!(job.body, b"hello");
        let s = c.stats_job(&job.id).await;
        assert_eq!(s.get("id"), format!("\"{}\"", job.id));
        assert_eq!(
            (s.get("tube"), s.get("state"), s.num("pri"), s.num("ttr")),
            ("beats", "reserved", 7, 42),
            "{s:?}"
        );
        // The next moment's job is put as this one comes due, a second
        // ahead: it waits, delayed, well before its moment. (Not looked
        // for when this reserve came too late to see it in time.)
        if i == 0 && got < moment + 500 {
            let next = format!("beat@{}", show(moment + 1000));
            loop {
                let line = c.cmd("peek-delayed").await;
                if line == "NOT_FOUND" {
                    assert!(
                        now_ms() < moment + 900,
                        "{next} was not put ahead of its moment"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                assert_eq!(c.job_after("FOUND", &line).await.id, next);
                let s = c.stats_job(&next).await;
                assert_eq!(s.get("state"), "delayed", "{s:?}");
                assert!(s.num("time-left") <= 1, "{s:?}");
                break;
            }
        }
        assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
    }
    assert_one_per_moment(&mut c, "beats", 3).await;
    assert_eq!(c.stats_tube("default").await.num("total-jobs"), 0);
}

/// A six-field cron expression (seconds first) in UTC fires at its
/// moments only; the moments of an expression in another zone are read in
/// that zone (a whole-hour offset, a half-hour one, daylight saving time).
async fn a_cron_fires_at_its_moments_read_in_its_zone(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    only(&mut c, "even").await;
    let before = now_ms();
    let first = scheduled(&mut c, "even even 3 20", b"tick", "cron UTC */2 * * * * *").await;
    let after = now_ms();
    assert_eq!(first % 2000, 0, "{}", show(first));
    assert!(
        first > before && first <= after + 2000,
        "first moment {first}, registered between {before} and {after}"
    );
    for i in 0..2 {
        let job = c.reserved("reserve-with-timeout 5").await;
        let got = now_ms();
        let moment = firing(&job.id, "even");
        // Consecutive even seconds: no odd one between them.
        assert_eq!(moment, first + i * 2000, "firing {i}: {}", job.id);
        assert_ready_at(&job.id, moment, got);
        assert_eq!(job.body, b"tick");
        let s = c.stats_job(&job.id).await;
        assert_eq!((s.num("pri"), s.num("ttr")), (3, 20), "{s:?}");
        assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
    }
    assert_one_per_moment(&mut c, "even", 2).await;

    // Each expected moment is computed for both ends of the registration,
    // in case a boundary passed in between.
    let zoned: [(&str, &str, Expected); 5] = [
        // 09:00 in Tokyo (UTC+9, no DST) is midnight UTC.
        ("tokyo", "cron Asia/Tokyo 0 9 * * *", |t| {
            next_multiple(t, DAY)
        }),
        // Kolkata is UTC+5:30: its whole hours are half past in UTC.
        ("kolkata", "cron Asia/Kolkata 0 * * * *", |t| {
            next_multiple(t + HOUR / 2, HOUR) - HOUR / 2
        }),
        ("berlin", "cron Europe/Berlin 0 12 * * *", next_berlin_noon),
        ("hourly", "cron UTC @hourly", |t| next_multiple(t, HOUR)),
        ("midnight", "cron UTC 0 0 * * *", |t| next_multiple(t, DAY)),
    ];
    for (name, when, expected) in zoned {
        let before = now_ms();
        let got = scheduled(&mut c, &format!("{name} later 0 60"), b"", when).await;
        let after = now_ms();
        assert!(
            got == expected(before) || got == expected(after),
            "{when}: SCHEDULED {}, expected {}",
            show(got),
            show(expected(before))
        );
    }
}

/// `list-schedules` shows every field of every schedule, by name; a name
/// registered again is replaced; `unschedule` removes one, and once the
/// firing put ahead has come, no more of its jobs arrive.
async fn list_schedules_shows_them_by_name_and_unschedule_stops_the_firings(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert!(list(&mut c).await.is_empty());
    let t0 = now_ms();
    // First, so that it has fired by the time it is removed.
    scheduled(&mut c, "c-fast fast 1 10", b"tick", "every 1s").await;
    let t1 = now_ms();
    let hourly = scheduled(&mut c, "b-every beats 5 30", b"beat", "every 1h").await;
    let then = now_ms();
    assert!(hourly == next_multiple(t1, HOUR) || hourly == next_multiple(then, HOUR));
    scheduled(
        &mut c,
        "a-cron reports 0 600",
        b"report!",
        "cron Europe/Berlin 0 12 * * *",
    )
    .await;
    let t2 = now_ms();
    let all = list(&mut c).await;
    let t3 = now_ms();
    assert_eq!(names(&all), ["a-cron", "b-every", "c-fast"], "{all:?}");

    let registered = |e: &Entry, lo: u64, hi: u64| {
        let r = at(field(e, "registered"));
        assert!(
            lo <= r && r <= hi,
            "registered {r} not in {lo}..={hi}: {e:?}"
        );
        r
    };
    let cron = &all[0];
    assert_eq!(
        keys(cron),
        [
            "name",
            "tube",
            "pri",
            "ttr",
            "cron",
            "zone",
            "next",
            "registered",
            "body-bytes"
        ]
    );
    assert_eq!(
        (
            field(cron, "tube"),
            field(cron, "pri"),
            field(cron, "ttr"),
            field(cron, "cron"),
            field(cron, "zone"),
            field(cron, "body-bytes")
        ),
        (
            "reports",
            "0",
            "600",
            "\"0 12 * * *\"",
            "Europe/Berlin",
            "7"
        )
    );
    let next = at(field(cron, "next"));
    assert!(
        next == next_berlin_noon(t2) || next == next_berlin_noon(t3),
        "{cron:?}"
    );
    registered(cron, t1, t2);

    let every = &all[1];
    let every_keys = [
        "name",
        "tube",
        "pri",
        "ttr",
        "every",
        "next",
        "registered",
        "body-bytes",
    ];
    assert_eq!(keys(every), every_keys);
    assert_eq!(
        (
            field(every, "tube"),
            field(every, "pri"),
            field(every, "ttr"),
            field(every, "every"),
            field(every, "body-bytes")
        ),
        ("beats", "5", "30", "1h", "4")
    );
    let next = at(field(every, "next"));
    assert!(next == next_multiple(t2, HOUR) || next == next_multiple(t3, HOUR));
    let first_registered = registered(every, t1, t2);

    let fast = &all[2];
    assert_eq!(keys(fast), every_keys);
    assert_eq!(
        (
            field(fast, "tube"),
            field(fast, "pri"),
            field(fast, "ttr"),
            field(fast, "every"),
            field(fast, "body-bytes")
        ),
        ("fast", "1", "10", "1s", "4")
    );
    // The next moment as of the listing, not the first one.
    let next = at(field(fast, "next"));
    assert!(next > t2 && next <= t3 + 1000, "{fast:?}");
    registered(fast, t0, t1);

    // Registered again: replaced, every field, and listed once.
    scheduled(&mut c, "b-every beats2 9 15", b"beat-beat", "every 2h").await;
    let all = list(&mut c).await;
    assert_eq!(names(&all), ["a-cron", "b-every", "c-fast"], "{all:?}");
    let every = &all[1];
    assert_eq!(
        (
            field(every, "tube"),
            field(every, "pri"),
            field(every, "ttr"),
            field(every, "every"),
            field(every, "body-bytes")
        ),
        ("beats2", "9", "15", "2h", "9")
    );
    registered(every, first_registered, now_ms());
    // ... even from an interval to a cron expression.
    scheduled(&mut c, "b-every beats2 9 15", b"", "cron UTC 0 0 * * *").await;
    let all = list(&mut c).await;
    assert_eq!(names(&all), ["a-cron", "b-every", "c-fast"], "{all:?}");
    assert_eq!(
        (
            field(&all[1], "cron"),
            field(&all[1], "zone"),
            field(&all[1], "body-bytes")
        ),
        ("\"0 0 * * *\"", "UTC", "0")
    );
    assert!(!keys(&all[1]).contains(&"every"), "{:?}", all[1]);

    // The fast one fires; once removed, it stops.
    only(&mut c, "fast").await;
    let job = c.reserved("reserve-with-timeout 5").await;
    firing(&job.id, "c-fast");
    assert_eq!(job.body, b"tick");
    assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
    assert_eq!(c.cmd("unschedule c-fast").await, "UNSCHEDULED");
    let removed = now_ms();
    assert_eq!(c.cmd("unschedule c-fast").await, "NOT_FOUND");
    assert_eq!(names(&list(&mut c).await), ["a-cron", "b-every"]);
    // A firing already put (up to a second ahead) stays and comes due;
    // nothing is put after the removal.
    tokio::time::sleep(SEC.mul_f32(2.5)).await;
    for id in drain(&mut c).await {
        let moment = firing(&id, "c-fast");
        assert!(
            moment <= removed + 1000,
            "{id} was put after the schedule was removed at {}",
            show(removed)
        );
    }
    assert_eq!(c.cmd("reserve-with-timeout 2").await, "TIMED_OUT");
    let t = c.stats_tube("fast").await;
    assert_eq!(
        (t.num("current-jobs-ready"), t.num("current-jobs-delayed")),
        (0, 0),
        "{t:?}"
    );
}

/// Every refusal of a `schedule` whose line is well formed up to its
/// `<bytes>` comes after its body has been read (the body here would be a
/// command), and registers nothing; a malformed `<bytes>` is refused at
/// once, and its body is read as the next command line.
async fn bad_schedules_are_refused_after_their_body_and_change_nothing(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut cases: Vec<(String, &str, &str)> = [
        ("every 1ms", "BAD_SCHEDULE too-often"),
        ("every 999ms", "BAD_SCHEDULE too-often"),
        ("every 400d", "BAD_SCHEDULE bad-interval"),
        ("every 367d", "BAD_SCHEDULE bad-interval"),
        ("every x", "BAD_SCHEDULE bad-interval"),
        ("every 1w", "BAD_SCHEDULE bad-interval"),
        ("cron UTC 0 0 30 2 *", "BAD_SCHEDULE never-fires"),
        ("cron UTC 61 * * * *", "BAD_SCHEDULE bad-cron"),
        ("cron UTC nonsense", "BAD_SCHEDULE bad-cron"),
        ("cron UTC * * * * * * * *", "BAD_SCHEDULE bad-cron"),
        ("cron Mars/Olympus * * * * *", "BAD_SCHEDULE bad-zone"),
        // The words after `<bytes>`.
        ("weekly 5", "BAD_FORMAT"),
        ("EVERY 1s", "BAD_FORMAT"),
        ("every", "BAD_FORMAT"),
        ("every 1s 2s", "BAD_FORMAT"),
        ("cron", "BAD_FORMAT"),
        ("cron UTC", "BAD_FORMAT"),
        ("", "BAD_FORMAT"),
    ]
    .into_iter()
    .map(|(when, want)| ("n t 0 60".to_string(), when, want))
    .collect();
    // The name, the tube, the numbers.
    let long_name = format!("{} t 0 60", "n".repeat(176));
    let long_tube = format!("n {} 0 60", "t".repeat(201));
    for head in [
        "a:b t 0 60",
        "-x t 0 60",
        &long_name,
        "n -t 0 60",
        "n a:b 0 60",
        &long_tube,
        "n t -1 60",
        "n t 4294967296 60",
        "n t 0 x",
    ] {
        cases.push((head.to_string(), "every 1s", "BAD_FORMAT"));
    }
    for (head, when, want) in &cases {
        assert_eq!(
            schedule(&mut c, head, b"use evil", when).await,
            *want,
            "schedule {head} .. {when}"
        );
        assert_eq!(
            c.cmd("list-tube-used").await,
            "USING default",
            "after schedule {head} .. {when}"
        );
    }

    // A malformed `<bytes>`: refused at once, the body is the next line.
    c.send(b"schedule n t 0 60 x every 1s\r\nlist-tube-used\r\n")
        .await;
    assert_eq!(c.line().await, "BAD_FORMAT");
    assert_eq!(c.line().await, "USING default");
    c.send(b"schedule n t 0 60 -1 every 1s\r\nlist-tube-used\r\n")
        .await;
    assert_eq!(c.line().await, "BAD_FORMAT");
    assert_eq!(c.line().await, "USING default");
    // Too big: read, thrown away, refused.
    let mut body = vec![b'x'; 65_528];
    body.extend_from_slice(b"use evil");
    assert_eq!(
        schedule(&mut c, "big t 0 60", &body, "every 1s").await,
        "JOB_TOO_BIG"
    );
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
    // No CRLF after the body: its bytes and two more are consumed.
    c.send(b"schedule n t 0 60 1 every 1s\r\nxyz\r\n").await;
    assert_eq!(c.line().await, "EXPECTED_CRLF");
    assert_eq!(c.line().await, "UNKNOWN_COMMAND");

    // `unschedule` and `list-schedules` follow the rules of other commands.
    for (line, want) in [
        ("unschedule nothing", "NOT_FOUND"),
        ("unschedule a:b", "BAD_FORMAT"),
        ("unschedule a b", "BAD_FORMAT"),
        ("unschedule", "UNKNOWN_COMMAND"),
        ("schedule", "UNKNOWN_COMMAND"),
        ("list-schedules x", "BAD_FORMAT"),
        ("list-schedulesx", "BAD_FORMAT"),
    ] {
        assert_eq!(c.cmd(line).await, want, "{line}");
    }

    // Nothing was registered, and nothing fires.
    assert!(list(&mut c).await.is_empty());
    let s = c.stats().await;
    assert_eq!(s.num("total-jobs"), 0, "{s:?}");
    assert_eq!(c.tubes().await, ["default"]);

    // Just within the bounds.
    let before = now_ms();
    let second = scheduled(&mut c, "second t 0 60", b"", "every 1000ms").await;
    assert_eq!(second % 1000, 0, "{}", show(second));
    assert!(second > before && second <= now_ms() + 1000);
    let long = scheduled(&mut c, "x+y/z;1.$_(2) t 0 60", b"", "every 366d").await;
    assert_eq!(long % (366 * DAY), 0, "{}", show(long));
    // February 29th comes within five years.
    let leap = show(scheduled(&mut c, "leap t 0 60", b"", "cron UTC 0 0 29 2 *").await);
    assert!(leap.ends_with("-02-29T00:00:00Z"), "{leap}");
    // The longest name, and moments with milliseconds every other time:
    // ids of 200 bytes, the most a client id may have.
    let name175 = "n".repeat(175);
    scheduled(&mut c, &format!("{name175} u 0 60"), b"", "every 1500ms").await;
    let all = list(&mut c).await;
    assert_eq!(
        names(&all),
        ["leap", name175.as_str(), "second", "x+y/z;1.$_(2)"],
        "{all:?}"
    );
    assert_eq!(field(&all[1], "every"), "1500ms");
    assert_eq!(field(&all[2], "every"), "1s");
    assert_eq!(field(&all[3], "every"), "366d");
    only(&mut c, "u").await;
    let first = c.reserved("reserve-with-timeout 5").await;
    let second = c.reserved("reserve-with-timeout 5").await;
    let (m1, m2) = (firing(&first.id, &name175), firing(&second.id, &name175));
    assert_eq!(m2, m1 + 1500);
    let odd = if m1.is_multiple_of(1000) {
        &second.id
    } else {
        &first.id
    };
    assert!(odd.ends_with(".500Z"), "{odd}");
    assert_eq!(odd.len(), 200, "{odd}");
}

/// A firing whose job was deleted, or finished, is not put again: its id
/// stays taken (a unique window, shown by `stats-job`) past the next
/// moment, even when the schedules are read again within its second.
async fn a_firing_done_with_is_not_put_again(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    only(&mut c, "once").await;
    assert_eq!(c.cmd("tube-set once tries=3 ttl=1h").await, "SET");
    scheduled(&mut c, "tick once 0 60", b"x", "every 1s").await;
    let job = c.reserved("reserve-with-timeout 5").await;
    let moment = firing(&job.id, "tick");
    // Until 5 minutes after the next moment, a second later; counted from
    // when it was put, up to a second ahead.
    let s = c.stats_job(&job.id).await;
    let unique = millis(s.get("unique"));
    assert!(
        (299_000..=302_000).contains(&unique),
        "unique {unique} ms: {s:?}"
    );
    // A firing is an ordinary job of its tube: the tube's settings apply.
    assert_eq!((s.get("max-tries"), s.get("ttl")), ("3", "1h"), "{s:?}");
    assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
    // A change of the schedules makes the server read them again and fire
    // the last moment passed, still this one unless a second began.
    scheduled(&mut c, "other elsewhere 0 60", b"y", "every 1d").await;
    assert_eq!(
        c.put_id(0, 0, 60, b"x", &job.id).await,
        format!("EXISTS {}", job.id)
    );

    let second = c.reserved("reserve-with-timeout 5").await;
    assert_eq!(firing(&second.id, "tick"), moment + 1000);
    assert_eq!(c.cmd(&format!("finish {}", second.id)).await, "FINISHED");
    assert_eq!(
        c.put_id(0, 0, 60, b"x", &second.id).await,
        format!("EXISTS {}", second.id)
    );
    // Neither comes back: the next job is the next moment's.
    let third = c.reserved("reserve-with-timeout 5").await;
    assert_eq!(firing(&third.id, "tick"), moment + 2000);
    for id in [&job.id, &second.id] {
        assert_eq!(c.cmd(&format!("peek {id}")).await, "NOT_FOUND");
    }
}

/// JSON `schedule` (with `every` as a string or a number, with `cron` and
/// a `zone` or the default UTC), `schedules`, `unschedule`, and the
/// `reason` of a `BAD_SCHEDULE`.
async fn json_schedule_unschedule_and_schedules(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let before = now_ms();
    let requests = [
        json!({"command": "schedule", "name": "j-fast", "topic": "jf", "every": 1, "body": "tick"}),
        json!({"command": "schedule", "name": "j-every", "topic": "jt", "every": "1h", "body": "b1"}),
        json!({"command": "schedule", "name": "j-num", "topic": "jt", "every": 90, "priority": 3, "ttr": 30}),
        json!({"command": "schedule", "name": "j-cron", "topic": "jt", "cron": "0 9 * * *", "zone": "Asia/Tokyo", "body": "report"}),
        json!({"command": "schedule", "name": "j-utc", "topic": "jt", "cron": "0 0 * * *", "zone": null}),
    ];
    let mut next = Vec::new();
    for request in &requests {
        let reply = c.json(request).await;
        assert_eq!(reply["success"], true, "{request}: {reply}");
        assert_eq!(reply.as_object().map(|o| o.len()), Some(2), "{reply}");
        next.push(at(reply["next"].as_str().expect("next is a string")));
    }
    let after = now_ms();
    // `j-cron` fires at 09:00 in Tokyo, midnight UTC, like `j-utc`.
    for (got, period) in next.into_iter().zip([1000, HOUR, 90_000, DAY, DAY]) {
        assert!(
            got == next_multiple(before, period) || got == next_multiple(after, period),
            "{} is not the first multiple of {period} ms",
            show(got)
        );
    }

    // Its firing pops like any job.
    let pop = c
        .json(&json!({"command": "pop", "topic": "jf", "timeout": 5}))
        .await;
    assert_eq!(pop["success"], true, "{pop}");
    let id = pop["id"].as_str().expect("id is a string");
    firing(id, "j-fast");
    assert_eq!(
        pop,
        json!({"success": true, "id": id, "topic": "jf", "value": "tick"})
    );
    assert_eq!(
        c.json(&json!({"command": "unschedule", "name": "j-fast"}))
            .await,
        json!({"success": true})
    );
    assert_eq!(
        c.json(&json!({"command": "unschedule", "name": "j-fast"}))
            .await,
        json!({"success": false, "error": "NOT_FOUND"})
    );

    let listed = c.json(&json!({"command": "schedules"})).await;
    assert_eq!(listed["success"], true, "{listed}");
    let all = listed["schedules"]
        .as_array()
        .expect("schedules is an array");
    let json_names: Vec<&str> = all.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        json_names,
        ["j-cron", "j-every", "j-num", "j-utc"],
        "{listed}"
    );
    let registered = |s: &Value| {
        let r = at(s["registered"].as_str().expect("registered is a string"));
        assert!(before <= r && r <= after, "{s}");
    };
    let without = |s: &Value, key: &str| {
        let mut s = s.clone();
        s.as_object_mut().expect("an object").remove(key);
        s
    };
    for s in all {
        registered(s);
        assert!(s["next"].is_string(), "{s}");
    }
    assert_eq!(
        without(&without(&all[0], "registered"), "next"),
        json!({"name": "j-cron", "topic": "jt", "priority": 1024, "ttr": 60,
               "cron": "0 9 * * *", "zone": "Asia/Tokyo", "body": "report"})
    );
    assert_eq!(
        without(&without(&all[1], "registered"), "next"),
        json!({"name": "j-every", "topic": "jt", "priority": 1024, "ttr": 60,
               "every": "1h", "body": "b1"})
    );
    assert_eq!(
        without(&without(&all[2], "registered"), "next"),
        json!({"name": "j-num", "topic": "jt", "priority": 3, "ttr": 30,
               "every": "90s", "body": ""})
    );
    assert_eq!(
        without(&without(&all[3], "registered"), "next"),
        json!({"name": "j-utc", "topic": "jt", "priority": 1024, "ttr": 60,
               "cron": "0 0 * * *", "zone": "UTC", "body": ""})
    );
    // The same schedules in text.
    assert_eq!(
        json_names,
        names(&list(&mut c).await),
        "JSON and text list the same"
    );

    for (request, reason) in [
        (json!({"every": "500ms"}), "too-often"),
        (json!({"every": "400d"}), "bad-interval"),
        (json!({"every": "x"}), "bad-interval"),
        (json!({"every": true}), "bad-interval"),
        (json!({"cron": "61 * * * *"}), "bad-cron"),
        (json!({"cron": "0 0 30 2 *"}), "never-fires"),
        (
            json!({"cron": "* * * * *", "zone": "Mars/Olympus"}),
            "bad-zone",
        ),
    ] {
        let mut request = request;
        let fields = request.as_object_mut().expect("an object");
        fields.insert("command".into(), json!("schedule"));
        fields.insert("name".into(), json!("bad"));
        fields.insert("topic".into(), json!("jt"));
        assert_eq!(
            c.json(&request).await,
            json!({"success": false, "error": "BAD_SCHEDULE", "reason": reason}),
            "{request}"
        );
    }
    for request in [
        json!({"command": "schedule", "name": "bad", "topic": "jt"}),
        json!({"command": "schedule", "name": "bad", "topic": "jt", "every": "1s", "cron": "* * * * *"}),
        json!({"command": "schedule", "topic": "jt", "every": "1s"}),
        json!({"command": "schedule", "name": "a:b", "topic": "jt", "every": "1s"}),
        json!({"command": "schedule", "name": "bad", "every": "1s"}),
        json!({"command": "schedule", "name": "bad", "topic": "jt", "every": "1s", "body": 5}),
        json!({"command": "unschedule"}),
        json!({"command": "unschedule", "name": "a:b"}),
    ] {
        assert_eq!(
            c.json(&request).await,
            json!({"success": false, "error": "BAD_FORMAT"}),
            "{request}"
        );
    }
    let big = json!({"command": "schedule", "name": "bad", "topic": "jt", "every": "1s",
                     "body": "x".repeat(65_536)});
    assert_eq!(
        c.json(&big).await,
        json!({"success": false, "error": "JOB_TOO_BIG"})
    );
    assert_eq!(
        names(&list(&mut c).await),
        ["j-cron", "j-every", "j-num", "j-utc"]
    );
}

/// The store keeps 1000 schedules: the 1001st new name is refused with
/// `too-many` (in text and JSON), while one of the 1000 can still be
/// registered again, and a removal makes room.
async fn a_store_keeps_at_most_1000_schedules(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // Pipelined: one write, then the replies in order.
    let mut all = Vec::new();
    for i in 0..1000 {
        all.extend(schedule_msg(&format!("s{i:04} t 0 60"), b"x", "every 1d"));
    }
    c.send(&all).await;
    for i in 0..1000 {
        let reply = c.line().await;
        assert!(reply.starts_with("SCHEDULED "), "s{i:04}: {reply}");
    }
    assert_eq!(
        schedule(&mut c, "s1000 t 0 60", b"use evil", "every 1d").await,
        "BAD_SCHEDULE too-many"
    );
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
    assert_eq!(
        c.json(&json!({"command": "schedule", "name": "s1000", "topic": "t", "every": "1d"}))
            .await,
        json!({"success": false, "error": "BAD_SCHEDULE", "reason": "too-many"})
    );
    scheduled(&mut c, "s0000 t 0 60", b"xy", "every 2d").await;
    let listed = list(&mut c).await;
    assert_eq!(listed.len(), 1000);
    assert_eq!(field(&listed[0], "name"), "s0000");
    assert_eq!(field(&listed[0], "every"), "2d");
    assert_eq!(field(&listed[999], "name"), "s0999");
    assert_eq!(c.cmd("unschedule s0500").await, "UNSCHEDULED");
    scheduled(&mut c, "s1000 t 0 60", b"x", "every 1d").await;
    assert_eq!(
        schedule(&mut c, "s1001 t 0 60", b"x", "every 1d").await,
        "BAD_SCHEDULE too-many"
    );
    let listed = list(&mut c).await;
    assert_eq!(listed.len(), 1000);
    assert_eq!(field(&listed[999], "name"), "s1000");
}
