//! What the embedded engine tells a log: one small typed record per change,
//! recording states, not commands (a command's effect depends on the clock
//! and on what came before it; a state does not), so replaying the records
//! in order rebuilds the state, and replaying one twice changes nothing.
//!
//! The transitions write their records through a [`Journal`] while the
//! state is locked, so the log's order is the state's order. The engine's
//! data structures know nothing of files: a [`Log`] (the durable one is in
//! `src/store/log/`) decides what becomes of the records, and
//! [`Volatile`] drops them.

use std::future::Future;

use crate::clock::Micros;
use crate::error::{StoreError, StoreResult};
use crate::job::{JobCounters, Lifecycle, LogStats};

/// A job's state as it is kept: reserved jobs are kept as such only for
/// their counters; after a restart they are ready (their holders are gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Ready.
    Ready,
    /// Delayed until this wall-clock time.
    Delayed(Micros),
    /// Reserved by a connection.
    Reserved,
    /// Buried, with its burial sequence number (the order `kick` follows).
    Buried(u64),
}

/// What changes over a job's life: everything but its name, tube, TTR,
/// creation time and body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// The job's sequence number (its server id, or the key behind its
    /// client id).
    pub key: u64,
    /// Its priority.
    pub pri: u32,
    /// Its last delay, in microseconds.
    pub delay: Micros,
    /// Its state.
    pub state: Stored,
    /// Its counters.
    pub counters: JobCounters,
    /// Where it is in its tries (all zero for a job without options).
    pub round: Round,
}

/// Where a job is in its tries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Its reserves when this round began (its put, or its last kick out
    /// of buried): its tries are its reserves since.
    pub start: u32,
    /// Whether it is buried for having used up its tries.
    pub dead: bool,
}

impl Round {
    /// The round with its latest try uncounted, for a job given back by a
    /// reserve that ended through no fault of the job's: the server
    /// stopped or crashed while a worker held it. `reserves` (the job's
    /// lifetime count) is left as it is, and a round with no try in it is
    /// left alone.
    pub fn given_back(self, reserves: u32) -> Round {
        Round {
            start: (self.start + 1).min(reserves),
            ..self
        }
    }
}

/// A whole job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobImage<'a> {
    /// What changes.
    pub meta: Meta,
    /// Its client-chosen id, if it has one.
    pub name: Option<&'a str>,
    /// Its tube.
    pub tube: &'a str,
    /// Its time to run, in microseconds.
    pub ttr: Micros,
    /// When it was put (wall clock).
    pub created: Micros,
    /// Its body.
    pub body: &'a [u8],
    /// Its options, as fixed at its put.
    pub options: Lifecycle,
}

/// One change, as the log keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// A job as it is now, whole: a put (or a job in a snapshot).
    Job(JobImage<'a>),
    /// A job's metadata as it is now: after a reserve, release, bury, kick,
    /// timeout or give-back.
    Meta(Meta),
    /// A job is gone (deleted or finished).
    Delete(u64),
    /// A tube's pause, as it is now: its length and when it ends (both zero:
    /// not paused).
    Pause {
        /// The tube.
        tube: &'a str,
        /// The pause's length, in microseconds.
        length: Micros,
        /// When it ends (wall clock).
        until: Micros,
    },
    /// A gone job's client id stays taken until `until` (wall clock), its
    /// unique window.
    Taken {
        /// The client id.
        name: &'a str,
        /// Until when.
        until: Micros,
    },
    /// A schedule as the stores keep it (empty: removed).
    Schedule {
        /// Its name.
        name: &'a str,
        /// What [`crate::schedule::Schedule::encode`] made of it.
        encoded: &'a [u8],
    },
    /// A tube's settings, as they are now (none set: cleared).
    Settings {
        /// The tube.
        tube: &'a str,
        /// Its settings.
        options: Lifecycle,
    },
    /// Sequences the jobs alone do not show once deleted jobs are forgotten:
    /// the next server id and burial number (a snapshot ends with it).
    Sequences {
        /// The next job key; keys are never reused.
        next_key: u64,
        /// The last burial sequence number.
        bury_seq: u64,
    },
}

/// Where the transitions write their records, with the state locked.
pub trait Journal {
    /// Records a change that must not be lost. If the log cannot take it
    /// (no room, or it has failed), nothing is written and the change must
    /// not happen: the transition returns the error.
    fn keep(&mut self, record: Record<'_>) -> StoreResult<()>;

    /// Records a change worth keeping that a crash may lose without harm (a
    /// reserve's counter, a timeout that makes the job ready: it is ready
    /// after a restart either way); skipped when room is short.
    fn note(&mut self, record: Record<'_>);

    /// Whether a record like `record` (a little larger, allowing for the
    /// change it will record) would be taken now by [`Journal::keep`]; if
    /// not, the log asks for more room. A transition over many jobs asks
    /// before each move a restart must not undo (a timeout that buries a
    /// job as a dead letter, or delays it by its backoff), and stops where
    /// the answer is no, to go on once there is room: one transition over
    /// thousands of jobs outruns the room prepared ahead, and taking the
    /// deletes' share of it instead would let a full disk refuse a delete.
    fn has_room_for(&mut self, _record: &Record<'_>) -> bool {
        true
    }

    /// Records that `job` is gone. Never refused for want of room: the room
    /// for it was set aside when the job was put.
    fn forget(&mut self, job: &JobImage<'_>);

    /// Tells the log that state which is not a job went by itself (a
    /// client id's unique window ended), with nothing to record: what a
    /// snapshot would copy of it is no longer live.
    fn let_go(&mut self, _record: &Record<'_>) {}

    /// Why the log takes no more changes at all, if it has failed. A change
    /// answered only once it is safe is then refused before it is made:
    /// made in memory with nothing on disk, a restart would undo it, and a
    /// delete (whose record is never refused) would take away a job that
    /// comes back after a restart.
    fn refusing(&self) -> Option<StoreError> {
        None
    }
}

/// A log behind the embedded engine.
pub trait Log: Send + Sync + 'static {
    /// The journal of one transition; holds the log's buffer while it lives.
    type Journal<'a>: Journal + Written
    where
        Self: 'a;

    /// Opens the journal for one transition (the state is locked).
    fn journal(&self) -> Self::Journal<'_>;

    /// Waits until every record up to `written` is as safe as the log
    /// promises before a change is acknowledged (on disk, by default).
    fn settle(&self, written: u64) -> impl Future<Output = StoreResult<()>> + Send;

    /// After a change was refused for want of room in the log: waits until
    /// more room may be there and says whether to try again (`false`: the
    /// room is not coming, the disk is full or the log failed).
    fn wait_for_room(&self) -> impl Future<Output = bool> + Send;

    /// The log's figures, for `stats`.
    fn stats(&self) -> Option<LogStats>;

    /// What the log is and where, for the start-up line.
    fn describe(&self) -> String;
}

/// How far a journal has written: the sequence number of its last record
/// (0 if it wrote none), for [`Log::settle`].
pub trait Written {
    /// The last record's sequence number.
    fn written(&self) -> u64;
}

/// No log: the memory-only engine. Records are dropped.
#[derive(Debug, Default, Clone, Copy)]
pub struct Volatile;

impl Journal for Volatile {
    #[inline]
    fn keep(&mut self, _: Record<'_>) -> StoreResult<()> {
        Ok(())
    }

    #[inline]
    fn note(&mut self, _: Record<'_>) {}

    #[inline]
    fn forget(&mut self, _: &JobImage<'_>) {}
}

impl Written for Volatile {
    fn written(&self) -> u64 {
        0
    }
}

impl Log for Volatile {
    type Journal<'a> = Volatile;

    fn journal(&self) -> Volatile {
        Volatile
    }

    async fn settle(&self, _: u64) -> StoreResult<()> {
        Ok(())
    }

    async fn wait_for_room(&self) -> bool {
        false
    }

    fn stats(&self) -> Option<LogStats> {
        None
    }

    fn describe(&self) -> String {
        "in memory only".into()
    }
}
