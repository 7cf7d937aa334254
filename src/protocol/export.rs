//! The line format of `export` and `import`: one JSON object per job, with
//! every field, so that `delayq export > jobs.jsonl` on one engine and
//! `delayq import < jobs.jsonl` on another move a deployment whole.
//!
//! ```text
//! {"id":"order-close:4711","tube":"orders","state":"delayed","pri":1024,
//!  "created":"2026-11-26T06:40:00.123Z","delay-ms":1800000,"ttr-ms":60000,
//!  "due":"2026-11-26T07:10:00.123Z","reserves":0,"timeouts":0,"releases":0,
//!  "buries":0,"kicks":0,"body":"close 4711"}
//! ```
//!
//! Times are wall-clock times (RFC 3339, UTC, to the millisecond), so a job
//! due in 5 minutes when it was exported is due at once if the file is
//! imported an hour later, as after a restart. A server id is a number, a
//! client id a string. A body that is not UTF-8 is `body-base64` instead of
//! `body`. `options` is a job's options as a `put` line writes them, with
//! `tries-used` and `dead` (where it is in them); `bury-order` is a buried
//! job's place in its tube's burial order (the exporting engine's own
//! numbering: buried jobs keep their order among themselves).
//!
//! An export's first page also carries what a deployment needs besides its
//! jobs: each tube's settings, `{"kind":"settings","tube":...,"options":
//! "tries=5 backoff=exp:10s"}`, and each schedule, `{"kind":"schedule",
//! "name":...,"tube":...,"schedule":BASE64}` (the schedule as the stores
//! keep it, its registration time included, so that its catch-up is what
//! it would have been). A line without `kind` is a job.

use std::cell::Cell;
use std::io::Write;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Map, Value, json};

use super::ClientError;
use super::options;
use crate::job::{ExportCursor, JobCounters, JobState, Lifecycle, WholeJob};
use crate::names::{JobId, Tube};
use crate::schedule::{FIRED_MARGIN, Schedule};
use crate::store::TubeSettings;

/// The longest delay or TTR an import takes, in milliseconds: what 32-bit
/// seconds allow on the wire.
const MAX_SPAN_MS: u64 = u32::MAX as u64 * 1000;

/// Most jobs one `export` page holds.
pub const MAX_PAGE: usize = 1000;

/// Most bytes of job bodies one page may hold at the largest job size: a
/// page is built whole in memory, so its size is bounded by this rather
/// than by [`MAX_PAGE`] times a large `-z`.
pub const PAGE_BYTES: usize = 8 << 20;

/// How many jobs a page asked for `asked` holds at most, with bodies of up
/// to `max_job_size` bytes.
pub fn page_size(asked: usize, max_job_size: usize) -> usize {
    asked
        .min(MAX_PAGE)
        .min(PAGE_BYTES / max_job_size.max(1))
        .max(1)
}

/// A cursor as a client sends it back: `0` for the beginning, `AT` or
/// `PART.AT`.
pub fn parse_cursor(raw: &[u8]) -> Option<ExportCursor> {
    let raw = std::str::from_utf8(raw).ok()?;
    let number = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match raw.split_once('.') {
        Some((part, at)) => Some(ExportCursor {
            part: number(part)?,
            at: number(at)?,
        }),
        None => Some(ExportCursor {
            part: 0,
            at: number(raw)?,
        }),
    }
}

/// A cursor as a reply shows it; `0` when the export is complete.
pub fn show_cursor(next: Option<ExportCursor>) -> String {
    match next {
        None => "0".into(),
        Some(ExportCursor { part: 0, at }) => at.to_string(),
        Some(ExportCursor { part, at }) => format!("{part}.{at}"),
    }
}

fn wall(now: SystemTime, offset: Duration, ahead: bool) -> String {
    let at = if ahead {
        now.checked_add(offset)
    } else {
        now.checked_sub(offset)
    }
    .unwrap_or(now);
    DateTime::<Utc>::from(at).to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// One page of an export, kept as what its lines are made from rather than
/// as the lines: they are written as the connection sends them, so that a
/// page costs its reply a line's room at a time (a first page carries every
/// schedule and tube setting: 1,000 schedules with 64 KiB bodies made one of
/// 87.5 MB, held whole for as long as its client took to read it).
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    settings: TubeSettings,
    schedules: Vec<Schedule>,
    jobs: Vec<WholeJob>,
    /// The wall clock the jobs' times are counted from: the same for the
    /// count of the bytes as for the lines sent.
    now: SystemTime,
    /// The lines' bytes, which the text protocol says before them: counted
    /// a line at a time too ([`Page::count`]), as the reply is written.
    bytes: Cell<usize>,
}

impl Page {
    /// A page of these settings, schedules (both only on a first page) and
    /// jobs, their times counted from `now`.
    pub fn new(
        settings: TubeSettings,
        schedules: Vec<Schedule>,
        jobs: Vec<WholeJob>,
        now: SystemTime,
    ) -> Page {
        Page {
            settings,
            schedules,
            jobs,
            now,
            bytes: Cell::new(0),
        }
    }

    /// How many lines it has.
    pub fn lines(&self) -> usize {
        self.settings.len() + self.schedules.len() + self.jobs.len()
    }

    /// Adds line `i`'s bytes to [`Page::bytes`], and returns them; line 0
    /// begins the count anew.
    pub fn count(&self, i: usize) -> usize {
        let mut counted = Counted(0);
        self.write(i, &mut counted);
        let before = if i == 0 { 0 } else { self.bytes.get() };
        self.bytes.set(before + counted.0);
        counted.0
    }

    /// The bytes of the lines counted so far: of them all once each has
    /// been.
    pub fn bytes(&self) -> usize {
        self.bytes.get()
    }

    /// Writes line `i` (with its `\n`); nothing past the last.
    pub fn write(&self, i: usize, out: &mut impl Write) {
        let (settings, schedules) = (self.settings.len(), self.schedules.len());
        if let Some((tube, options)) = self.settings.get(i) {
            write_settings(tube, options, out);
        } else if let Some(schedule) = self.schedules.get(i - settings) {
            write_schedule(schedule, out);
        } else if let Some(job) = self.jobs.get(i - settings - schedules) {
            write_line(job, self.now, out);
        }
    }
}

/// A writer that counts what it is given and keeps none of it.
struct Counted(usize);

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes `job` as one line (with its `\n`) onto `out`; `now` is the wall
/// clock the job's times are counted from.
pub fn write_line(job: &WholeJob, now: SystemTime, out: &mut impl Write) {
    let id = match &job.id {
        JobId::Server(n) => json!(n),
        JobId::Client(name) => json!(&**name),
    };
    let mut obj = Map::new();
    obj.insert("id".into(), id);
    obj.insert("tube".into(), json!(job.tube.as_str()));
    obj.insert("state".into(), json!(job.state.name()));
    obj.insert("pri".into(), json!(job.pri));
    let created = match job.put_at {
        Some(at) => wall(at, Duration::ZERO, false),
        None => wall(now, job.age, false),
    };
    obj.insert("created".into(), json!(created));
    obj.insert("delay-ms".into(), json!(job.delay.as_millis() as u64));
    obj.insert("ttr-ms".into(), json!(job.ttr.as_millis() as u64));
    match job.state {
        JobState::Delayed => {
            obj.insert("due".into(), json!(wall(now, job.time_left, true)));
        }
        JobState::Buried => {
            obj.insert("bury-order".into(), json!(job.bury_order));
        }
        JobState::Ready | JobState::Reserved => {}
    }
    let c = job.counters;
    for (name, n) in [
        ("reserves", c.reserves),
        ("timeouts", c.timeouts),
        ("releases", c.releases),
        ("buries", c.buries),
        ("kicks", c.kicks),
    ] {
        obj.insert(name.into(), json!(n));
    }
    if !job.options.is_empty() {
        obj.insert("options".into(), json!(options::words(&job.options)));
        obj.insert("tries-used".into(), json!(job.tries));
        obj.insert("dead".into(), json!(job.dead));
    }
    match std::str::from_utf8(&job.body) {
        Ok(text) => obj.insert("body".into(), json!(text)),
        Err(_) => obj.insert("body-base64".into(), json!(BASE64.encode(&job.body))),
    };
    // Serialising a map of plain values cannot fail.
    // Writing into memory, or counting, cannot fail either.
    let _ = serde_json::to_writer(&mut *out, &Value::Object(obj));
    let _ = out.write_all(b"\n");
}

/// What one line of an export holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// A job.
    Job(Box<WholeJob>),
    /// A tube's settings.
    Settings(Tube, Lifecycle),
    /// A schedule.
    Schedule(Box<Schedule>),
}

/// Writes a tube's settings as one line.
fn write_settings(tube: &Tube, settings: &Lifecycle, out: &mut impl Write) {
    let line =
        json!({"kind": "settings", "tube": tube.as_str(), "options": options::words(settings)});
    let _ = serde_json::to_writer(&mut *out, &line);
    let _ = out.write_all(b"\n");
}

/// Writes a schedule as one line.
fn write_schedule(schedule: &Schedule, out: &mut impl Write) {
    let line = json!({
        "kind": "schedule",
        "name": &*schedule.name,
        "tube": schedule.tube.as_str(),
        "schedule": BASE64.encode(schedule.encode()),
    });
    let _ = serde_json::to_writer(&mut *out, &line);
    let _ = out.write_all(b"\n");
}

/// Reads one line of an export: a job (see [`read_line`]), a tube's
/// settings or a schedule.
pub fn read_any(line: &[u8], now: SystemTime, max_job_size: usize) -> Result<Line, ClientError> {
    let bad = || ClientError::BadFormat;
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(line) else {
        return Err(bad());
    };
    match obj.get("kind").map(|k| k.as_str()) {
        None => read_line(line, now, max_job_size).map(|job| Line::Job(Box::new(job))),
        Some(Some("settings")) => {
            let tube = obj.get("tube").and_then(Value::as_str).ok_or_else(bad)?;
            let tube = Tube::parse(tube.as_bytes()).ok_or_else(bad)?;
            let words = obj.get("options").and_then(Value::as_str).ok_or_else(bad)?;
            let words: Vec<&[u8]> = words
                .split(' ')
                .filter(|w| !w.is_empty())
                .map(str::as_bytes)
                .collect();
            Ok(Line::Settings(tube, options::parse(&words)?))
        }
        Some(Some("schedule")) => {
            let raw = obj
                .get("schedule")
                .and_then(Value::as_str)
                .ok_or_else(bad)?;
            let raw = Bytes::from(BASE64.decode(raw).map_err(|_| bad())?);
            let schedule = Schedule::decode(&raw).ok_or_else(bad)?;
            // The line's own name and tube, if given, are the schedule's:
            // a line that says otherwise was edited by hand, and wrongly.
            let said = |field: &str, is: &str| {
                obj.get(field)
                    .is_none_or(|v| v.as_str().is_some_and(|v| v == is))
            };
            if !said("name", &schedule.name) || !said("tube", schedule.tube.as_str()) {
                return Err(bad());
            }
            // Registered in the future, it would fire for moments before
            // its registration; a clock a little ahead is allowed for.
            let now_ms = now
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            if schedule.since > now_ms.saturating_add(FIRED_MARGIN.as_millis() as u64) {
                return Err(bad());
            }
            if schedule.body.len() > max_job_size {
                return Err(ClientError::JobTooBig);
            }
            Ok(Line::Schedule(Box::new(schedule)))
        }
        Some(_) => Err(bad()),
    }
}

/// Reads one line written by [`write_line`] (its line ending stripped or
/// not); `now` is the wall clock its times are counted to. A body over
/// `max_job_size` is `JOB_TOO_BIG`; anything else wrong is `BAD_FORMAT`.
pub fn read_line(
    line: &[u8],
    now: SystemTime,
    max_job_size: usize,
) -> Result<WholeJob, ClientError> {
    let bad = || ClientError::BadFormat;
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(line) else {
        return Err(bad());
    };
    let text = |name: &str| obj.get(name).and_then(Value::as_str);
    let count = |name: &str| -> Result<u64, ClientError> {
        match obj.get(name) {
            None => Ok(0),
            Some(v) => v.as_u64().ok_or_else(bad),
        }
    };
    let small =
        |name: &str| -> Result<u32, ClientError> { u32::try_from(count(name)?).map_err(|_| bad()) };
    // Delays and TTRs are seconds in 32 bits on the wire, here milliseconds:
    // an import takes no more than a put could have made.
    let span = |name: &str| -> Result<Duration, ClientError> {
        let ms = count(name)?;
        (ms <= MAX_SPAN_MS)
            .then(|| Duration::from_millis(ms))
            .ok_or_else(bad)
    };
    let time = |name: &str| -> Result<SystemTime, ClientError> {
        let raw = text(name).ok_or_else(bad)?;
        let at = DateTime::parse_from_rfc3339(raw).map_err(|_| bad())?;
        Ok(SystemTime::from(at.with_timezone(&Utc)))
    };
    let id = match obj.get("id") {
        Some(Value::Number(n)) => JobId::Server(
            n.as_u64()
                .filter(|&n| (1..=crate::names::MAX_IMPORTED_ID).contains(&n))
                .ok_or_else(bad)?,
        ),
        Some(Value::String(s)) => {
            JobId::Client(crate::names::client_id(s.as_bytes()).ok_or_else(bad)?)
        }
        _ => return Err(bad()),
    };
    let tube = Tube::parse(text("tube").ok_or_else(bad)?.as_bytes()).ok_or_else(bad)?;
    let state = JobState::from_name(text("state").ok_or_else(bad)?).ok_or_else(bad)?;
    let created = time("created")?;
    let time_left = match state {
        JobState::Delayed => time("due")?.duration_since(now).unwrap_or_default(),
        _ => Duration::ZERO,
    };
    if time_left.as_millis() > u128::from(MAX_SPAN_MS) {
        return Err(bad());
    }
    let options = match text("options") {
        None => Default::default(),
        Some(words) => {
            let words: Vec<&[u8]> = words
                .split(' ')
                .filter(|w| !w.is_empty())
                .map(str::as_bytes)
                .collect();
            options::parse_job(&words)?
        }
    };
    let body = match (obj.get("body"), text("body-base64")) {
        (Some(Value::String(s)), None) => Bytes::copy_from_slice(s.as_bytes()),
        (None, Some(b64)) => Bytes::from(BASE64.decode(b64).map_err(|_| bad())?),
        _ => return Err(bad()),
    };
    if body.len() > max_job_size {
        return Err(ClientError::JobTooBig);
    }
    Ok(WholeJob {
        id,
        tube,
        state,
        pri: small("pri")?,
        age: now.duration_since(created).unwrap_or_default(),
        put_at: Some(created),
        delay: span("delay-ms")?,
        time_left,
        bury_order: count("bury-order")?,
        ttr: span("ttr-ms")?,
        counters: JobCounters {
            reserves: small("reserves")?,
            timeouts: small("timeouts")?,
            releases: small("releases")?,
            buries: small("buries")?,
            kicks: small("kicks")?,
        },
        options,
        tries: small("tries-used")?,
        dead: match obj.get("dead") {
            None => false,
            Some(v) => v.as_bool().ok_or_else(bad)?,
        },
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Backoff, Lifecycle};

    fn job(id: JobId, body: &[u8]) -> WholeJob {
        WholeJob {
            id,
            tube: Tube::parse(b"orders").unwrap(),
            state: JobState::Delayed,
            pri: 7,
            age: Duration::from_secs(90),
            put_at: None,
            delay: Duration::from_secs(120),
            time_left: Duration::from_secs(30),
            bury_order: 0,
            ttr: Duration::from_millis(1500),
            counters: JobCounters {
                reserves: 3,
                timeouts: 1,
                releases: 1,
                buries: 0,
                kicks: 0,
            },
            options: Lifecycle {
                tries: Some(5),
                backoff: Some(Backoff::Exponential(Duration::from_secs(10))),
                ttl: Some(Duration::from_secs(3600)),
                ..Default::default()
            },
            tries: 2,
            dead: false,
            body: Bytes::copy_from_slice(body),
        }
    }

    #[test]
    fn a_page_written_a_line_at_a_time_is_the_page_whole() {
        use crate::protocol::reply::Reply;
        use crate::schedule::When;
        use bytes::BytesMut;

        let tube = Tube::parse(b"orders").unwrap();
        let settings = vec![(
            tube.clone(),
            Lifecycle {
                tries: Some(3),
                ..Default::default()
            },
        )];
        let schedule = Schedule {
            name: std::sync::Arc::from("beat"),
            when: When::every(Duration::from_secs(60)).unwrap(),
            tube,
            pri: 1,
            ttr: Duration::from_secs(30),
            body: Bytes::from_static(b"\x01\xff\"x"),
            since: 1_764_125_340_000,
        };
        let jobs = vec![
            job(JobId::Server(1), b"plain"),
            job(JobId::Client("c:1".into()), b"\x00\xfe\xff"),
            job(JobId::Server(2), "é😀\u{1}\"".as_bytes()),
        ];
        let now = SystemTime::now();
        let page = Page::new(
            settings.clone().into(),
            vec![schedule.clone()],
            jobs.clone(),
            now,
        );
        let mut whole = Vec::new();
        write_settings(&settings[0].0, &settings[0].1, &mut whole);
        write_schedule(&schedule, &mut whole);
        for job in &jobs {
            write_line(job, now, &mut whole);
        }
        assert_eq!(page.lines(), 5);
        for i in 0..5 {
            page.count(i);
        }
        assert_eq!(page.bytes(), whole.len());
        // Counted again from its first line, as a second reply would.
        page.count(0);
        assert!(page.bytes() < whole.len());

        let reply = Reply::Exported {
            next: "7".into(),
            page,
        };
        // What each piece made, written or counted: the lines twice.
        let response = crate::protocol::reply::Response {
            mode: crate::protocol::reply::Mode::Text,
            reply: reply.clone(),
        };
        let mut text = BytesMut::new();
        let made: usize = (0..response.pieces())
            .map(|piece| response.encode_piece(piece, &mut text))
            .sum();
        assert_eq!(made, text.len() + whole.len());
        let mut text = BytesMut::new();
        reply.encode_text(&mut text);
        let mut want = format!("EXPORTED 7 {}\r\n", whole.len()).into_bytes();
        want.extend_from_slice(&whole);
        want.extend_from_slice(b"\r\n");
        assert_eq!(&text[..], &want[..]);

        let mut json = BytesMut::new();
        reply.encode_json(&mut json);
        let data = String::from_utf8(whole).unwrap();
        let mut want =
            serde_json::to_vec(&json!({"success": true, "next": "7", "data": data})).unwrap();
        want.extend_from_slice(b"\r\n");
        assert_eq!(
            String::from_utf8_lossy(&json),
            String::from_utf8_lossy(&want)
        );
        let mut back = data.lines();
        assert!(matches!(
            read_any(back.next().unwrap().as_bytes(), now, 100),
            Ok(Line::Settings(..))
        ));
        assert_eq!(
            read_any(back.next().unwrap().as_bytes(), now, 100),
            Ok(Line::Schedule(Box::new(schedule)))
        );
    }

    #[test]
    fn a_line_reads_back_as_the_job_it_was() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        for (id, body) in [
            (JobId::Server(42), &b"close order 4711"[..]),
            (
                JobId::Client("order-close:4711".into()),
                &b"\xff\x00 binary\r\n"[..],
            ),
        ] {
            let job = job(id, body);
            let mut line = Vec::new();
            write_line(&job, now, &mut line);
            assert_eq!(line.last(), Some(&b'\n'));
            // A line read back knows when the job was put, to the ms.
            let put_at = now - job.age;
            assert_eq!(
                read_line(&line, now, 1 << 16),
                Ok(WholeJob {
                    put_at: Some(put_at),
                    ..job.clone()
                })
            );
            // And writes that time again, whatever the clock says now.
            let back = read_line(&line, now, 1 << 16).unwrap();
            let mut again = Vec::new();
            write_line(&back, now + Duration::from_millis(1500), &mut again);
            let created = |l: &[u8]| serde_json::from_slice::<Value>(l).unwrap()["created"].clone();
            assert_eq!(created(&again), created(&line));
        }
    }

    #[test]
    fn times_are_wall_clock_times() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut line = Vec::new();
        write_line(&job(JobId::Server(1), b"x"), now, &mut line);
        let text = String::from_utf8(line.clone()).unwrap();
        assert!(
            text.contains(r#""due":"2027-01-15T08:00:30.000Z""#),
            "{text}"
        );
        // Read an hour later, the job is due at once and an hour older.
        let later = now + Duration::from_secs(3600);
        let back = read_line(&line, later, 1 << 16).unwrap();
        assert_eq!(back.time_left, Duration::ZERO);
        assert_eq!(back.age, Duration::from_secs(3690));
    }

    #[test]
    fn bad_lines_are_refused() {
        let now = SystemTime::now();
        for bad in [
            &br#"{"#[..],
            br#"[]"#,
            br#"{"id":0,"tube":"t","state":"ready","created":"2026-01-01T00:00:00Z","body":""}"#,
            br#"{"id":1,"tube":"bad tube","state":"ready","created":"2026-01-01T00:00:00Z","body":""}"#,
            br#"{"id":1,"tube":"t","state":"gone","created":"2026-01-01T00:00:00Z","body":""}"#,
            br#"{"id":1,"tube":"t","state":"ready","created":"yesterday","body":""}"#,
            br#"{"id":1,"tube":"t","state":"delayed","created":"2026-01-01T00:00:00Z","body":""}"#,
            br#"{"id":1,"tube":"t","state":"ready","created":"2026-01-01T00:00:00Z"}"#,
            br#"{"id":1,"tube":"t","state":"ready","created":"2026-01-01T00:00:00Z","body":"","pri":-1}"#,
        ] {
            assert_eq!(
                read_line(bad, now, 100),
                Err(ClientError::BadFormat),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A tube's own option is not a job's.
        let rate = br#"{"id":1,"tube":"t","state":"ready","created":"2026-01-01T00:00:00Z","body":"","options":"rate=5"}"#;
        assert_eq!(read_line(rate, now, 100), Err(ClientError::BadOption));
        let big = br#"{"id":1,"tube":"t","state":"ready","created":"2026-01-01T00:00:00Z","body":"0123456789"}"#;
        assert_eq!(read_line(big, now, 9), Err(ClientError::JobTooBig));
    }

    #[test]
    fn cursors_read_back() {
        for c in [
            None,
            Some(ExportCursor { part: 0, at: 17 }),
            Some(ExportCursor { part: 3, at: 99 }),
        ] {
            let shown = show_cursor(c);
            let read = parse_cursor(shown.as_bytes()).unwrap();
            assert_eq!(read, c.unwrap_or_default());
        }
        assert_eq!(parse_cursor(b"x"), None);
        assert_eq!(parse_cursor(b"1."), None);
        assert_eq!(parse_cursor(b"-1"), None);
    }
}
