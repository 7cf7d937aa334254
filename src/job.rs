//! The domain: what a job is, what becomes of it, and the figures kept about
//! jobs and tubes. Shared by the store, the broker and every front end; it
//! knows nothing of wire words or storage layouts.
//!
//! Times here are [`Duration`]s, as precise as the engine keeps them; a front
//! end decides how to show them (the text protocol in whole seconds).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::names::{JobId, Tube};

/// A job as handed to a client: its id, tube and body.
#[derive(Debug, Clone, PartialEq)]
pub struct JobBody {
    /// The job's own id.
    pub id: JobId,
    /// The tube it lives in.
    pub tube: Tube,
    /// Its body.
    pub body: Bytes,
}

/// How long a job that came back waits before it is ready again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    /// The same wait every time.
    Fixed(Duration),
    /// A wait that doubles with every try: the base, then twice it...
    Exponential(Duration),
}

/// What a job's life is allowed beyond beanstalkd's rules: its tries and
/// the wait between them. The same options are a put's (each unset one
/// taken from the tube's) and a tube's settings; all unset is beanstalkd.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lifecycle {
    /// The most reserves in one round before the job is buried.
    pub tries: Option<u32>,
    /// The wait before a job that came back is ready again.
    pub backoff: Option<Backoff>,
    /// The longest an exponential backoff grows to.
    pub backoff_max: Option<Duration>,
    /// Up to this percentage of each wait is taken off.
    pub jitter: Option<u8>,
    /// How long after its put the job is removed if nobody finished it.
    pub ttl: Option<Duration>,
    /// How long its client id stays taken once the job is gone (finished,
    /// deleted or expired), so that a retried put answers `EXISTS`.
    pub unique: Option<Duration>,
    /// A tube's setting only: the most reserves a second from the tube.
    pub rate: Option<u32>,
}

impl Lifecycle {
    /// Whether no option is set (the job behaves as in beanstalkd).
    pub fn is_empty(&self) -> bool {
        *self == Lifecycle::default()
    }

    /// These options as a command carries them: boxed, and only when some
    /// are set (most puts have none). A command is moved a few times on its
    /// way to the store, and the options inline were over half of its 176
    /// bytes.
    pub fn boxed(self) -> Option<Box<Lifecycle>> {
        (!self.is_empty()).then(|| Box::new(self))
    }

    /// These options, each unset one taken from `fallback`.
    pub fn or(self, fallback: Lifecycle) -> Lifecycle {
        Lifecycle {
            tries: self.tries.or(fallback.tries),
            backoff: self.backoff.or(fallback.backoff),
            backoff_max: self.backoff_max.or(fallback.backoff_max),
            jitter: self.jitter.or(fallback.jitter),
            ttl: self.ttl.or(fallback.ttl),
            unique: self.unique.or(fallback.unique),
            // A tube's own limit, not a job's.
            rate: None,
        }
    }
}

/// Where a job with a [`Lifecycle`] is in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LifeStats {
    /// Its options, as fixed at its put.
    pub options: Lifecycle,
    /// Reserves in this round.
    pub tries: u32,
    /// Whether it is buried because it used up its tries.
    pub dead: bool,
}

/// A job to insert.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Where it goes.
    pub tube: Tube,
    /// The client-chosen id, or `None` for a server id.
    pub id: Option<Arc<str>>,
    /// Priority; lower is more urgent.
    pub pri: u32,
    /// Time before it becomes ready.
    pub delay: Duration,
    /// Time a reserver has before it comes back (raised to
    /// [`crate::rules::MIN_TTR`] by the broker).
    pub ttr: Duration,
    /// The body.
    pub body: Bytes,
    /// Its own options; the unset ones come from the tube's settings.
    pub life: Lifecycle,
}

/// A whole job as an export hands it out and an import takes it in: every
/// field, so that a deployment moved from one engine to another keeps its
/// jobs as they were. Times are durations from "now", as everywhere on the
/// store's interface; a front end turns them into wall-clock times.
#[derive(Debug, Clone, PartialEq)]
pub struct WholeJob {
    /// Its id. An import keeps a client id always, and a server id when the
    /// importing store has never handed it out.
    pub id: JobId,
    /// Its tube.
    pub tube: Tube,
    /// Its state; an import makes a reserved job ready (its holder is not
    /// there), as a restart does.
    pub state: JobState,
    /// Its priority.
    pub pri: u32,
    /// Time since it was put.
    pub age: Duration,
    /// When it was put, by the wall clock, where that is what the engine
    /// keeps (Redis) or what it came as (an import line): exact to its
    /// millisecond, where `age` is counted from a moment that passes while
    /// the job travels (a job moved again and again would grow younger).
    pub put_at: Option<std::time::SystemTime>,
    /// The delay it was last given.
    pub delay: Duration,
    /// For a delayed job, time until it is ready.
    pub time_left: Duration,
    /// For a buried job, its place in its tube's burial order (kicks take
    /// the lowest first); an engine's own numbering.
    pub bury_order: u64,
    /// Its TTR.
    pub ttr: Duration,
    /// What happened to it so far.
    pub counters: JobCounters,
    /// Its options, as fixed at its put.
    pub options: Lifecycle,
    /// Reserves in its current round of tries.
    pub tries: u32,
    /// Whether it is buried for having used up its tries.
    pub dead: bool,
    /// Its body.
    pub body: Bytes,
}

/// Where an export goes on: an engine's own position (a slot, a shard and a
/// scan cursor), which a client hands back as it got it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportCursor {
    /// The part of the store (a shard), for an engine that has parts.
    pub part: u64,
    /// The position within it.
    pub at: u64,
}

/// A page of an export.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExportPage {
    /// The jobs of this page.
    pub jobs: Vec<WholeJob>,
    /// Where the next page begins; `None` when the export is complete.
    pub next: Option<ExportCursor>,
}

/// What a `put` did.
#[derive(Debug, Clone, PartialEq)]
pub enum PutOutcome {
    /// Stored under this id.
    Inserted(JobId),
    /// A job with this client id already exists; nothing changed.
    Exists(JobId),
}

/// What a store's put did, with what the timer must know of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Put {
    /// Inserted or found existing.
    pub outcome: PutOutcome,
    /// When the job expires, if it got a time to live the caller may not
    /// know of (its tube's); an engine whose timer wakes by itself within
    /// a second may leave it out.
    pub expires: Option<Duration>,
}

/// A job just reserved, and how long the reserver has.
#[derive(Debug, Clone, PartialEq)]
pub struct Reserved {
    /// The job.
    pub job: JobBody,
    /// Its time to run: the deadline is now plus this.
    pub ttr: Duration,
}

/// The four states of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for its delay to pass.
    Delayed,
    /// Waiting for a worker.
    Ready,
    /// Held by a worker until it finishes or its TTR runs out.
    Reserved,
    /// Set aside until kicked.
    Buried,
}

impl JobState {
    /// The state's name, as `stats-job` prints it and the stores and an
    /// export write it.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Delayed => "delayed",
            JobState::Ready => "ready",
            JobState::Reserved => "reserved",
            JobState::Buried => "buried",
        }
    }

    /// The state [`JobState::name`] names.
    pub fn from_name(name: &str) -> Option<JobState> {
        [
            JobState::Delayed,
            JobState::Ready,
            JobState::Reserved,
            JobState::Buried,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }
}

/// How many times things happened to one job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobCounters {
    /// Times it was reserved.
    pub reserves: u32,
    /// Times its TTR ran out.
    pub timeouts: u32,
    /// Times it was released.
    pub releases: u32,
    /// Times it was buried.
    pub buries: u32,
    /// Times it was kicked.
    pub kicks: u32,
}

/// The figures of one job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobStats {
    /// The job's own id.
    pub id: JobId,
    /// Its tube.
    pub tube: Tube,
    /// Its state.
    pub state: JobState,
    /// Its priority.
    pub pri: u32,
    /// Time since it was put.
    pub age: Duration,
    /// Its delay.
    pub delay: Duration,
    /// Its TTR.
    pub ttr: Duration,
    /// Time until it becomes ready (delayed) or times out (reserved); zero
    /// in the other states.
    pub time_left: Duration,
    /// What happened to it so far.
    pub counters: JobCounters,
    /// Its tries and options, if it has any options.
    pub life: Option<LifeStats>,
}

/// Where a released job went.
#[derive(Debug, Clone, PartialEq)]
pub struct Released {
    /// Its tube.
    pub tube: Tube,
    /// Whether it was buried instead, having used up its tries.
    pub buried: bool,
    /// How long until it is ready: the release's delay, or its backoff.
    pub delay: Duration,
}

/// Job counts by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Ready jobs more urgent than [`crate::rules::URGENT_PRIORITY`].
    pub urgent: u64,
    /// Ready jobs.
    pub ready: u64,
    /// Reserved jobs.
    pub reserved: u64,
    /// Delayed jobs.
    pub delayed: u64,
    /// Buried jobs.
    pub buried: u64,
}

impl Counts {
    /// Jobs in any state.
    pub fn total(&self) -> u64 {
        self.ready + self.reserved + self.delayed + self.buried
    }
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, c: Counts) {
        self.urgent += c.urgent;
        self.ready += c.ready;
        self.reserved += c.reserved;
        self.delayed += c.delayed;
        self.buried += c.buried;
    }
}

/// The figures the store keeps of one tube.
#[derive(Debug, Clone, PartialEq)]
pub struct TubeStats {
    /// The tube.
    pub name: Tube,
    /// Jobs by state.
    pub counts: Counts,
    /// Jobs ever put into it.
    pub total_jobs: u64,
    /// Its jobs removed because their time to live ran out.
    pub expired: u64,
    /// Connections using it.
    pub using: u64,
    /// Connections watching it.
    pub watching: u64,
    /// Successful deletes of its jobs.
    pub cmd_delete: u64,
    /// `pause-tube` commands on it.
    pub cmd_pause_tube: u64,
    /// The length of its current pause (zero if not paused).
    pub pause: Duration,
    /// Time until it unpauses.
    pub pause_time_left: Duration,
}

/// The figures of a durable engine's log, as beanstalkd's `binlog-*` fields
/// show them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// The number of the oldest log file still kept.
    pub oldest_file: u64,
    /// The number of the file being written.
    pub current_file: u64,
    /// Records written since start.
    pub records_written: u64,
    /// Records rewritten by compaction since start.
    pub records_migrated: u64,
    /// Syncs of the log since start (each makes a group of changes safe).
    pub syncs: u64,
    /// How long those syncs took.
    pub sync_times: crate::metrics::HistogramSnapshot,
    /// The size of one log file.
    pub file_size: u64,
}

/// The server-wide figures the store keeps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreStats {
    /// Jobs by state, over all tubes.
    pub counts: Counts,
    /// Times any job's TTR ran out.
    pub job_timeouts: u64,
    /// Jobs removed because their time to live ran out.
    pub expired: u64,
    /// Jobs ever put.
    pub total_jobs: u64,
    /// Tubes that exist now.
    pub tubes: u64,
    /// The log's figures, for an engine that has one.
    pub log: Option<LogStats>,
}
