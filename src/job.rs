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
}

/// What a `put` did.
#[derive(Debug, Clone, PartialEq)]
pub enum PutOutcome {
    /// Stored under this id.
    Inserted(JobId),
    /// A job with this client id already exists; nothing changed.
    Exists(JobId),
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
    /// Jobs ever put.
    pub total_jobs: u64,
    /// Tubes that exist now.
    pub tubes: u64,
    /// The log's figures, for an engine that has one.
    pub log: Option<LogStats>,
}
