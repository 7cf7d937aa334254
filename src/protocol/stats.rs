//! Server-wide counters and the YAML documents of `stats`, `stats-job`,
//! `stats-tube` and the `list-*` commands, field for field as beanstalkd 1.12
//! prints them (client libraries and exporters read them by name).

use std::fmt::Write;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use std::time::Duration;

use super::command::Command;
use super::options;
use crate::job::{JobState, JobStats, LogStats, StoreStats, TubeStats};
use crate::names::JobId;

/// Commands counted in `stats`, in the order beanstalkd prints them, followed
/// by delayq's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Cmd {
    /// `put` and JSON `add`.
    Put,
    /// `peek`.
    Peek,
    /// `peek-ready`.
    PeekReady,
    /// `peek-delayed`.
    PeekDelayed,
    /// `peek-buried`.
    PeekBuried,
    /// `reserve` and JSON `pop` without a timeout.
    Reserve,
    /// `reserve-with-timeout` and JSON `pop` with one.
    ReserveWithTimeout,
    /// `delete`, text or JSON.
    Delete,
    /// `release`.
    Release,
    /// `use`.
    Use,
    /// `watch`.
    Watch,
    /// `ignore`.
    Ignore,
    /// `bury`.
    Bury,
    /// `kick`.
    Kick,
    /// `touch`.
    Touch,
    /// `stats`.
    Stats,
    /// `stats-job`.
    StatsJob,
    /// `stats-tube`.
    StatsTube,
    /// `list-tubes`.
    ListTubes,
    /// `list-tube-used`.
    ListTubeUsed,
    /// `list-tubes-watched`.
    ListTubesWatched,
    /// `pause-tube`.
    PauseTube,
    /// `reserve-job` (not printed by beanstalkd; an extra field here).
    ReserveJob,
    /// `kick-job` (likewise).
    KickJob,
    /// `finish` (extension).
    Finish,
}

impl Cmd {
    /// The counter a command goes into; `quit` has none.
    pub fn of(cmd: &Command) -> Option<Cmd> {
        Some(match cmd {
            Command::Put { .. } => Cmd::Put,
            Command::Use(_) => Cmd::Use,
            Command::Reserve { timeout: None, .. } => Cmd::Reserve,
            Command::Reserve {
                timeout: Some(_), ..
            } => Cmd::ReserveWithTimeout,
            Command::ReserveBatch { timeout: None, .. } => Cmd::Reserve,
            Command::ReserveBatch {
                timeout: Some(_), ..
            } => Cmd::ReserveWithTimeout,
            Command::ReserveJob(_) => Cmd::ReserveJob,
            Command::RemoveBatch { finish: true, .. } => Cmd::Finish,
            Command::RemoveBatch { finish: false, .. } => Cmd::Delete,
            Command::Delete(_) => Cmd::Delete,
            Command::Finish(_) => Cmd::Finish,
            Command::Release { .. } => Cmd::Release,
            Command::Bury { .. } => Cmd::Bury,
            Command::Touch(_) => Cmd::Touch,
            Command::Watch(_) => Cmd::Watch,
            Command::Ignore(_) => Cmd::Ignore,
            Command::Peek(_) => Cmd::Peek,
            Command::PeekReady => Cmd::PeekReady,
            Command::PeekDelayed => Cmd::PeekDelayed,
            Command::PeekBuried => Cmd::PeekBuried,
            Command::Kick(_) => Cmd::Kick,
            Command::KickJob(_) => Cmd::KickJob,
            Command::StatsJob(_) => Cmd::StatsJob,
            Command::StatsTube(_) => Cmd::StatsTube,
            Command::Stats => Cmd::Stats,
            Command::ListTubes => Cmd::ListTubes,
            Command::ListTubeUsed => Cmd::ListTubeUsed,
            Command::ListTubesWatched => Cmd::ListTubesWatched,
            Command::PauseTube(..) => Cmd::PauseTube,
            // Extensions without a beanstalkd counter, so that `stats`
            // stays beanstalkd's document.
            Command::TubeSet(..)
            | Command::TubeSettings(_)
            | Command::Schedule(_)
            | Command::Unschedule(_)
            | Command::ListSchedules
            | Command::Export { .. }
            | Command::Import(_)
            | Command::ImportSettings(..)
            | Command::ImportSchedule(_)
            | Command::Auth(_)
            | Command::Quit => return None,
        })
    }
}

const CMD_NAMES: [&str; 25] = [
    "cmd-put",
    "cmd-peek",
    "cmd-peek-ready",
    "cmd-peek-delayed",
    "cmd-peek-buried",
    "cmd-reserve",
    "cmd-reserve-with-timeout",
    "cmd-delete",
    "cmd-release",
    "cmd-use",
    "cmd-watch",
    "cmd-ignore",
    "cmd-bury",
    "cmd-kick",
    "cmd-touch",
    "cmd-stats",
    "cmd-stats-job",
    "cmd-stats-tube",
    "cmd-list-tubes",
    "cmd-list-tube-used",
    "cmd-list-tubes-watched",
    "cmd-pause-tube",
    "cmd-reserve-job",
    "cmd-kick-job",
    "cmd-finish",
];

/// Where beanstalkd's own counters end and the extra ones begin.
const BEANSTALKD_CMDS: usize = 22;

/// Counters kept by this process (with the Redis engine, per process).
pub struct ServerStats {
    cmds: [AtomicU64; CMD_NAMES.len()],
    /// Connections open now.
    pub connections: AtomicU64,
    /// Connections ever accepted.
    pub total_connections: AtomicU64,
    /// Open connections that have put a job.
    pub producers: AtomicU64,
    /// Open connections that have reserved.
    pub workers: AtomicU64,
    /// Connections whose clients have gone (or quit) and that are still
    /// letting go of their jobs and tubes (see [`ServerStats::after_hangups`]).
    closing: AtomicU64,
    /// Told when `closing` comes down to none.
    all_closed: tokio::sync::Notify,
    /// Set by SIGUSR1: `put` answers `DRAINING`.
    draining: Arc<AtomicBool>,
    started: Instant,
    instance: u64,
}

impl ServerStats {
    /// Fresh counters; `draining` is the flag the signal handler sets.
    pub fn new(draining: Arc<AtomicBool>) -> Self {
        ServerStats {
            cmds: std::array::from_fn(|_| AtomicU64::new(0)),
            connections: AtomicU64::new(0),
            total_connections: AtomicU64::new(0),
            producers: AtomicU64::new(0),
            workers: AtomicU64::new(0),
            closing: AtomicU64::new(0),
            all_closed: tokio::sync::Notify::new(),
            draining,
            started: Instant::now(),
            // A random id for this server instance, as beanstalkd's `id`.
            instance: RandomState::new().hash_one(std::process::id()),
        }
    }
}

fn get(n: &AtomicU64) -> u64 {
    n.load(Ordering::Relaxed)
}

/// Longest a command that looks at the server's state waits for the
/// connections still closing: their closes are store calls, milliseconds on
/// Redis, and a store in trouble must not hold the command for long.
const HANGUP_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

impl ServerStats {
    /// A connection whose client hung up (or quit) begins letting go of
    /// its jobs and tubes.
    pub fn begin_close(&self) {
        self.closing.fetch_add(1, Ordering::AcqRel);
    }

    /// A connection has let go of everything and is counted out.
    pub fn end_close(&self) {
        if self.closing.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.all_closed.notify_waiters();
        }
    }

    /// Lets the connections whose clients hung up before this command came
    /// finish closing, so that what it sees (the connection counts, the
    /// jobs they held, back in their tubes) is what the client that hung
    /// up expects, as on beanstalkd, which handles one event at a time.
    ///
    /// Without it, a hang-up followed by `stats` on another connection
    /// still counted the gone connection as open in 298 of 300 tries on Redis
    /// (the close waits for Redis; the `stats` did not), and pheanstalk's
    /// own `testDisconnect` failed. The yield first puts this command behind
    /// the tasks woken with it, a hang-up among them, so that a close has
    /// begun (and is counted in `closing`) before it looks.
    pub async fn after_hangups(&self) {
        tokio::task::yield_now().await;
        let closed = async {
            loop {
                // Registered before the look, so that a close ending in
                // between still wakes it.
                let ended = self.all_closed.notified();
                if self.closing.load(Ordering::Acquire) == 0 {
                    return;
                }
                ended.await;
            }
        };
        let _ = tokio::time::timeout(HANGUP_WAIT, closed).await;
    }

    /// Counts one command.
    pub fn count(&self, cmd: Cmd) {
        self.cmds[cmd as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the server is refusing new jobs.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Every command counter, named as `stats` names it less its `cmd-`
    /// (`put`, `reserve-with-timeout`, ...), in `stats`' order.
    pub fn commands(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        CMD_NAMES
            .iter()
            .zip(&self.cmds)
            .map(|(name, n)| (name.trim_start_matches("cmd-"), get(n)))
    }

    /// How long the server has been up.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The connection counts now, to be read before the store's figures
    /// are asked for (see [`crate::broker::Broker::stats`]).
    pub fn connections_now(&self) -> [u64; 4] {
        [
            get(&self.connections),
            get(&self.producers),
            get(&self.workers),
            get(&self.total_connections),
        ]
    }

    /// The `stats` document; `conns` is what [`ServerStats::connections_now`]
    /// read before the store was asked.
    pub fn render(
        &self,
        conns: [u64; 4],
        store: &StoreStats,
        waiting: u64,
        max_job_size: usize,
    ) -> String {
        let [connections, producers, workers, total_connections] = conns;
        let c = &store.counts;
        let mut y = String::with_capacity(1200);
        y.push_str("---\n");
        field(&mut y, "current-jobs-urgent", c.urgent);
        field(&mut y, "current-jobs-ready", c.ready);
        field(&mut y, "current-jobs-reserved", c.reserved);
        field(&mut y, "current-jobs-delayed", c.delayed);
        field(&mut y, "current-jobs-buried", c.buried);
        for (name, n) in CMD_NAMES.iter().zip(&self.cmds).take(BEANSTALKD_CMDS) {
            field(&mut y, name, get(n));
        }
        field(&mut y, "job-timeouts", store.job_timeouts);
        field(&mut y, "total-jobs", store.total_jobs);
        field(&mut y, "max-job-size", max_job_size);
        field(&mut y, "current-tubes", store.tubes);
        field(&mut y, "current-connections", connections);
        field(&mut y, "current-producers", producers);
        field(&mut y, "current-workers", workers);
        field(&mut y, "current-waiting", waiting);
        field(&mut y, "total-connections", total_connections);
        field(&mut y, "pid", std::process::id());
        field(
            &mut y,
            "version",
            format_args!("\"{}\"", env!("CARGO_PKG_VERSION")),
        );
        let (user, system) = rusage();
        field(&mut y, "rusage-utime", user);
        field(&mut y, "rusage-stime", system);
        field(&mut y, "uptime", self.started.elapsed().as_secs());
        // Without a log, these stay at what beanstalkd prints without one.
        let log = store.log.unwrap_or(LogStats {
            file_size: 10_485_760,
            ..LogStats::default()
        });
        field(&mut y, "binlog-oldest-index", log.oldest_file);
        field(&mut y, "binlog-current-index", log.current_file);
        field(&mut y, "binlog-records-migrated", log.records_migrated);
        field(&mut y, "binlog-records-written", log.records_written);
        field(&mut y, "binlog-max-size", log.file_size);
        field(&mut y, "draining", self.is_draining());
        field(&mut y, "id", format_args!("{:016x}", self.instance));
        let host = host();
        field(&mut y, "hostname", &host.hostname);
        field(&mut y, "os", &host.os);
        field(&mut y, "platform", &host.platform);
        for (name, n) in CMD_NAMES.iter().zip(&self.cmds).skip(BEANSTALKD_CMDS) {
            field(&mut y, name, get(n));
        }
        field(&mut y, "total-jobs-expired", store.expired);
        y
    }
}

fn field(y: &mut String, name: &str, value: impl std::fmt::Display) {
    // Writing into a String cannot fail.
    let _ = writeln!(y, "{name}: {value}");
}

/// An id as a YAML scalar: server ids bare (clients parse them as integers),
/// client ids quoted (they may start with `@`, which YAML reserves).
fn yaml_id(id: &JobId) -> String {
    match id {
        JobId::Server(n) => n.to_string(),
        JobId::Client(name) => format!("\"{name}\""),
    }
}

/// Whole seconds of a time, as beanstalkd shows an age or a length.
fn secs(d: Duration) -> u64 {
    d.as_secs()
}

/// Whole seconds of a time left, as beanstalkd shows them. beanstalkd
/// measures in nanoseconds, so a 10 s time already shows 9 right after it is
/// set; an engine that keeps milliseconds or microseconds would still read
/// exactly 10 s then, so one microsecond is taken off before rounding down.
fn secs_left(d: Duration) -> u64 {
    d.as_micros().saturating_sub(1) as u64 / 1_000_000
}

/// The `stats-job` document.
pub fn render_job(j: &JobStats) -> String {
    let mut y = String::with_capacity(200);
    y.push_str("---\n");
    field(&mut y, "id", yaml_id(&j.id));
    field(&mut y, "tube", &j.tube);
    field(&mut y, "state", j.state.name());
    field(&mut y, "pri", j.pri);
    field(&mut y, "age", secs(j.age));
    field(&mut y, "delay", secs(j.delay));
    field(&mut y, "ttr", secs(j.ttr));
    field(&mut y, "time-left", secs_left(j.time_left));
    field(&mut y, "file", 0);
    let c = &j.counters;
    field(&mut y, "reserves", c.reserves);
    field(&mut y, "timeouts", c.timeouts);
    field(&mut y, "releases", c.releases);
    field(&mut y, "buries", c.buries);
    field(&mut y, "kicks", c.kicks);
    if let Some(life) = &j.life {
        let o = &life.options;
        field(&mut y, "tries", life.tries);
        let or_none = |v: Option<String>| v.unwrap_or_else(|| "none".into());
        field(&mut y, "max-tries", or_none(o.tries.map(|n| n.to_string())));
        field(
            &mut y,
            "backoff",
            or_none(o.backoff.map(options::show_backoff)),
        );
        let show = |d: Option<std::time::Duration>| or_none(d.map(options::show_duration));
        field(&mut y, "backoff-max", show(o.backoff_max));
        field(&mut y, "jitter", o.jitter.unwrap_or(0));
        field(&mut y, "ttl", show(o.ttl));
        field(&mut y, "unique", show(o.unique));
        if j.state == JobState::Buried {
            let why = if life.dead { "tries" } else { "bury" };
            field(&mut y, "buried-because", why);
        }
    }
    y
}

/// The `stats-tube` document; `waiting` comes from this process's waiters.
pub fn render_tube(t: &TubeStats, waiting: u64) -> String {
    let c = &t.counts;
    let mut y = String::with_capacity(300);
    y.push_str("---\n");
    field(&mut y, "name", &t.name);
    field(&mut y, "current-jobs-urgent", c.urgent);
    field(&mut y, "current-jobs-ready", c.ready);
    field(&mut y, "current-jobs-reserved", c.reserved);
    field(&mut y, "current-jobs-delayed", c.delayed);
    field(&mut y, "current-jobs-buried", c.buried);
    field(&mut y, "total-jobs", t.total_jobs);
    field(&mut y, "current-using", t.using);
    field(&mut y, "current-watching", t.watching);
    field(&mut y, "current-waiting", waiting);
    field(&mut y, "cmd-delete", t.cmd_delete);
    field(&mut y, "cmd-pause-tube", t.cmd_pause_tube);
    field(&mut y, "pause", secs(t.pause));
    field(&mut y, "pause-time-left", secs_left(t.pause_time_left));
    // Only once a job of the tube has expired, so that a tube that uses no
    // time to live shows beanstalkd's document.
    if t.expired > 0 {
        field(&mut y, "total-jobs-expired", t.expired);
    }
    y
}

/// Fields of the documents above that hold names or words: strings
/// whatever they look like (a tube may be named `42`).
const TEXT_FIELDS: &[&str] = &[
    "id",
    "name",
    "tube",
    "state",
    "version",
    "hostname",
    "os",
    "platform",
    "buried-because",
    "backoff",
    "backoff-max",
    "ttl",
    "unique",
];

/// Fields of `stats-job` that print `none` when the job has no such option.
const OPTIONAL_FIELDS: &[&str] = &["max-tries", "backoff", "backoff-max", "ttl", "unique"];

/// One of the YAML documents above as JSON, for the HTTP API: the mapping
/// as an object, in the same order. Numbers are JSON numbers, `true` and
/// `false` booleans, an option's `none` null, and a quoted value (a client
/// id, the version) is the string inside the quotes. (A list of tubes is a
/// reply of its own, `Reply::Tubes`, with its own JSON.)
pub fn document_json(doc: &str) -> serde_json::Value {
    let mut fields = serde_json::Map::new();
    for line in doc.lines().filter(|l| *l != "---") {
        if let Some((key, raw)) = line.split_once(": ") {
            fields.insert(key.to_string(), field_json(key, raw));
        }
    }
    serde_json::Value::Object(fields)
}

/// One `key: value` of a document as a JSON value (see [`document_json`]).
fn field_json(key: &str, raw: &str) -> serde_json::Value {
    use serde_json::Value;
    let raw = match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) => inner,
        None => raw,
    };
    if raw == "none" && OPTIONAL_FIELDS.contains(&key) {
        return Value::Null;
    }
    if TEXT_FIELDS.contains(&key) {
        return Value::String(raw.to_string());
    }
    if let Ok(b) = raw.parse::<bool>() {
        return Value::Bool(b);
    }
    if let Ok(n) = raw.parse::<u64>() {
        return Value::from(n);
    }
    // `rusage-utime` and `rusage-stime`: seconds with a fraction.
    match raw.parse::<f64>() {
        Ok(x) if x.is_finite() => Value::from(x),
        _ => Value::String(raw.to_string()),
    }
}

/// CPU time used by this process, user and system, as `seconds.micros`.
fn rusage() -> (String, String) {
    // SAFETY: getrusage writes a plain C struct we own; zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to that struct and a valid `who`.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| format!("{}.{:06}", t.tv_sec, t.tv_usec);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

struct Host {
    hostname: String,
    os: String,
    platform: String,
}

/// The host's name and `uname` version and machine, as beanstalkd prints them.
fn host() -> Host {
    // SAFETY: uname fills a plain C struct we own; zeroed is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to that struct.
    let ok = unsafe { libc::uname(&mut u) } == 0;
    let text = |field: &[libc::c_char]| -> String {
        let bytes: Vec<u8> = field
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    if !ok {
        return Host {
            hostname: String::new(),
            os: String::new(),
            platform: String::new(),
        };
    }
    Host {
        hostname: text(&u.nodename),
        os: text(&u.version),
        platform: text(&u.machine),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::Tube;

    #[test]
    fn times_show_as_beanstalkd_shows_them() {
        let ms = Duration::from_millis;
        assert_eq!(secs_left(ms(10_000)), 9, "a 10 s time just set");
        assert_eq!(secs_left(ms(10_001)), 10);
        assert_eq!(secs_left(Duration::from_micros(1)), 0);
        assert_eq!(secs_left(Duration::ZERO), 0);
        assert_eq!(secs(ms(59_999)), 59);
    }

    /// Checks that every field of `doc` comes out as its kind: a string
    /// exactly for the text fields, `null` only for an option that is not
    /// set; returns the object.
    fn typed_fields(doc: &str) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::Value;
        let Value::Object(fields) = document_json(doc) else {
            panic!("not an object: {doc}")
        };
        assert_eq!(fields.len(), doc.lines().count() - 1, "every field");
        for (key, value) in &fields {
            let text = TEXT_FIELDS.contains(&key.as_str());
            match value {
                Value::String(_) => assert!(text, "{key} should be a number: {value}"),
                Value::Number(_) | Value::Bool(_) => assert!(!text, "{key}: {value}"),
                Value::Null => assert!(OPTIONAL_FIELDS.contains(&key.as_str()), "{key}"),
                _ => panic!("{key}: {value}"),
            }
        }
        fields
    }

    #[test]
    fn documents_as_json_keep_names_as_strings_and_numbers_as_numbers() {
        use serde_json::json;
        let doc =
            ServerStats::new(Arc::default()).render([1, 0, 0, 2], &StoreStats::default(), 0, 65535);
        let stats = typed_fields(&doc);
        assert_eq!(stats["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(stats["current-connections"], 1);
        assert_eq!(stats["draining"], false);
        assert!(stats["rusage-utime"].is_f64());

        let tube = Tube::parse(b"42").expect("a tube name");
        let tube_stats = TubeStats {
            name: tube.clone(),
            counts: Default::default(),
            total_jobs: 3,
            expired: 1,
            using: 0,
            watching: 0,
            cmd_delete: 0,
            cmd_pause_tube: 0,
            pause: Duration::ZERO,
            pause_time_left: Duration::ZERO,
        };
        let fields = typed_fields(&render_tube(&tube_stats, 2));
        assert_eq!(
            (&fields["name"], &fields["current-waiting"]),
            (&json!("42"), &json!(2))
        );

        let life = crate::job::LifeStats {
            options: crate::job::Lifecycle {
                tries: Some(3),
                ttl: Some(Duration::from_secs(86_400)),
                ..Default::default()
            },
            tries: 3,
            dead: true,
        };
        let job = JobStats {
            id: JobId::Client("order:7".into()),
            tube,
            state: JobState::Buried,
            pri: 5,
            age: Duration::ZERO,
            delay: Duration::ZERO,
            ttr: Duration::from_secs(60),
            time_left: Duration::ZERO,
            counters: Default::default(),
            life: Some(life),
        };
        let fields = typed_fields(&render_job(&job));
        assert_eq!(fields["id"], "order:7");
        assert_eq!(fields["tube"], "42");
        assert_eq!(
            (&fields["max-tries"], &fields["tries"]),
            (&json!(3), &json!(3))
        );
        assert_eq!(
            (&fields["ttl"], &fields["unique"]),
            (&json!("1d"), &json!(null))
        );
        assert_eq!(fields["buried-because"], "tries");
        let job = JobStats {
            id: JobId::Server(7),
            life: None,
            ..job
        };
        assert_eq!(typed_fields(&render_job(&job))["id"], "7");
    }

    #[test]
    fn stats_has_every_beanstalkd_field() {
        let doc = ServerStats::new(Arc::default()).render([0; 4], &StoreStats::default(), 0, 65535);
        let keys: Vec<&str> = doc
            .lines()
            .skip(1)
            .map(|l| l.split(':').next().unwrap())
            .collect();
        let expected = "current-jobs-urgent current-jobs-ready current-jobs-reserved \
            current-jobs-delayed current-jobs-buried cmd-put cmd-peek cmd-peek-ready \
            cmd-peek-delayed cmd-peek-buried cmd-reserve cmd-reserve-with-timeout cmd-delete \
            cmd-release cmd-use cmd-watch cmd-ignore cmd-bury cmd-kick cmd-touch cmd-stats \
            cmd-stats-job cmd-stats-tube cmd-list-tubes cmd-list-tube-used \
            cmd-list-tubes-watched cmd-pause-tube job-timeouts total-jobs max-job-size \
            current-tubes current-connections current-producers current-workers \
            current-waiting total-connections pid version rusage-utime rusage-stime uptime \
            binlog-oldest-index binlog-current-index binlog-records-migrated \
            binlog-records-written binlog-max-size draining id hostname os platform";
        let expected: Vec<&str> = expected.split_whitespace().collect();
        assert_eq!(&keys[..expected.len()], &expected[..]);
        let version = format!("version: \"{}\"\n", env!("CARGO_PKG_VERSION"));
        assert!(doc.contains(&version), "{doc}");
    }
}
