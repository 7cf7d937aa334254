//! The storage interface: every method is one whole, atomic state transition,
//! so the Redis engine can run each as a single Lua script and the embedded
//! engine as one critical section.
//!
//! Engines keep their own clock (the embedded one the wall clock, read through
//! a monotonic one; the Redis one the Redis server's), so times cross this
//! interface as durations from "now", never as absolute instants.
//!
//! Only the [`crate::broker::Broker`] calls a store: it is the one door,
//! where what follows a transition (serving waiting workers, waking the
//! timer) happens.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::error::StoreResult;
use crate::job::{
    ExportCursor, ExportPage, JobBody, JobStats, Lifecycle, NewJob, Put, PutOutcome, Released,
    Reserved, StoreStats, TubeStats, WholeJob,
};
use crate::names::{JobId, Tube};

pub mod held;
pub mod log;
pub mod memory;
pub mod redis;

/// Identifies a client connection within one delayq process.
pub type ConnId = u64;

/// Tubes with settings and the settings, in the order of the names. Shared:
/// every export holds it while its first page is sent, and an engine that
/// keeps it hands them all the same one.
pub type TubeSettings = std::sync::Arc<[(Tube, Lifecycle)]>;

/// Tubes that exist, oldest first. Shared for the same reason: a client
/// that asks for `list-tubes` and does not read holds it until it has
/// written every name, and an engine that keeps it hands every such client
/// the same one.
pub type TubeList = std::sync::Arc<[Tube]>;

/// What a timer pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tick {
    /// Tubes that may now have jobs to hand out.
    pub ready: Vec<Tube>,
    /// Time until the next thing falls due, if anything is pending.
    pub next: Option<Duration>,
}

/// How a connection holds on to a tube, which keeps the tube in existence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TubeRef {
    /// Named by `use`.
    Using,
    /// In the watch list.
    Watching,
}

/// Something another process did that this one must react to.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreEvent {
    /// Jobs became ready in this tube: serve its waiting connections.
    Ready(Tube),
    /// Another process created a due time this far from now, earlier than
    /// any it knew of: the timer must wake by then.
    Due(Duration),
    /// Events may have been missed (the engine reconnected): serve every
    /// tube that has waiting connections, and read the schedules again.
    Resync,
    /// Another process registered or removed a schedule.
    Schedules,
}

/// A storage engine. Every method is atomic on its own.
///
/// Methods that take a [`ConnId`] act for that connection: only the
/// connection that reserved a job may release, bury, touch or finish it.
pub trait Store: Send + Sync + 'static {
    /// Inserts a job, ready or delayed.
    fn put(&self, job: NewJob) -> impl Future<Output = StoreResult<Put>> + Send;

    /// Reserves the most urgent ready job of the unpaused `tubes` (lowest
    /// priority, then oldest) for `conn`.
    fn reserve(
        &self,
        conn: ConnId,
        tubes: &[Tube],
    ) -> impl Future<Output = StoreResult<Option<Reserved>>> + Send;

    /// Reserves up to `max` of the most urgent ready jobs of the unpaused
    /// `tubes` for `conn`, in the order `reserve` would take them one by
    /// one, in one atomic step (on a cluster, one per shard it takes from).
    fn reserve_batch(
        &self,
        conn: ConnId,
        tubes: &[Tube],
        max: usize,
    ) -> impl Future<Output = StoreResult<Vec<Reserved>>> + Send;

    /// Reserves one job by id, if it is ready, delayed or buried.
    fn reserve_job(
        &self,
        conn: ConnId,
        id: &JobId,
    ) -> impl Future<Output = StoreResult<Option<Reserved>>> + Send;

    /// Undoes a reservation that never reached its client (the waiting
    /// connection had gone): back to ready, as if it had not happened.
    fn give_back(&self, conn: ConnId, id: &JobId) -> impl Future<Output = StoreResult<()>> + Send;

    /// Deletes a job that is not reserved, or is reserved by `conn`.
    /// Returns whether it existed.
    fn delete(&self, conn: ConnId, id: &JobId) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Deletes a job only if `conn` has it reserved.
    fn finish(&self, conn: ConnId, id: &JobId) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Deletes each of `ids` as [`Store::delete`] would, or with `finish`
    /// as [`Store::finish`] would, in one atomic step (on a cluster, one
    /// per shard); returns how many went.
    fn remove_batch(
        &self,
        conn: ConnId,
        ids: &[JobId],
        finish: bool,
    ) -> impl Future<Output = StoreResult<u64>> + Send;

    /// Puts a job reserved by `conn` back, ready or delayed (by `delay`, or
    /// if that is zero by its backoff), or buried if it used up its tries.
    fn release(
        &self,
        conn: ConnId,
        id: &JobId,
        pri: u32,
        delay: Duration,
    ) -> impl Future<Output = StoreResult<Option<Released>>> + Send;

    /// Buries a job reserved by `conn`.
    fn bury(
        &self,
        conn: ConnId,
        id: &JobId,
        pri: u32,
    ) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Restarts the TTR of a job reserved by `conn`; returns the TTR.
    fn touch(
        &self,
        conn: ConnId,
        id: &JobId,
    ) -> impl Future<Output = StoreResult<Option<Duration>>> + Send;

    /// Kicks up to `bound` buried jobs of `tube`, or if it has none, delayed ones.
    fn kick(&self, tube: &Tube, bound: u64) -> impl Future<Output = StoreResult<u64>> + Send;

    /// Kicks one buried or delayed job; returns its tube.
    fn kick_job(&self, id: &JobId) -> impl Future<Output = StoreResult<Option<Tube>>> + Send;

    /// Any job, by id.
    fn peek(&self, id: &JobId) -> impl Future<Output = StoreResult<Option<JobBody>>> + Send;

    /// The job `reserve` would take next from `tube`, paused or not.
    fn peek_ready(&self, tube: &Tube) -> impl Future<Output = StoreResult<Option<JobBody>>> + Send;

    /// The delayed job of `tube` that is due soonest.
    fn peek_delayed(
        &self,
        tube: &Tube,
    ) -> impl Future<Output = StoreResult<Option<JobBody>>> + Send;

    /// The buried job of `tube` that `kick` would take first.
    fn peek_buried(&self, tube: &Tube)
    -> impl Future<Output = StoreResult<Option<JobBody>>> + Send;

    /// A job's figures.
    fn stats_job(&self, id: &JobId) -> impl Future<Output = StoreResult<Option<JobStats>>> + Send;

    /// A tube's figures, if it exists.
    fn stats_tube(
        &self,
        tube: &Tube,
    ) -> impl Future<Output = StoreResult<Option<TubeStats>>> + Send;

    /// Server-wide job figures.
    fn stats(&self) -> impl Future<Output = StoreResult<StoreStats>> + Send;

    /// Tubes that exist, oldest first.
    fn list_tubes(&self) -> impl Future<Output = StoreResult<TubeList>> + Send;

    /// Stops handing out jobs from an existing tube for `delay` (zero resumes).
    fn pause_tube(
        &self,
        tube: &Tube,
        delay: Duration,
    ) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Sets a tube's settings as a whole (all unset clears them), whether
    /// or not the tube exists.
    fn set_tube(
        &self,
        tube: &Tube,
        options: Lifecycle,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// A tube's settings.
    fn tube_settings(&self, tube: &Tube) -> impl Future<Output = StoreResult<Lifecycle>> + Send;

    /// Every tube that has settings, with them, in the order of the names
    /// (for an export). Shared: every export holds it while its first page
    /// is sent, and an engine that keeps it may hand them all one.
    fn all_tube_settings(&self) -> impl Future<Output = StoreResult<TubeSettings>> + Send;

    /// Registers or replaces the schedule `name`, kept as `encoded` (what
    /// [`crate::schedule::Schedule::encode`] made); refused (`false`) if it
    /// is new and the store has [`crate::schedule::MAX_SCHEDULES`] already.
    /// A shared engine tells the other processes
    /// ([`StoreEvent::Schedules`]).
    fn set_schedule(
        &self,
        name: &str,
        encoded: Bytes,
    ) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Removes a schedule; returns whether there was one.
    fn remove_schedule(&self, name: &str) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Every schedule, encoded, in the order of their names.
    fn schedules(&self) -> impl Future<Output = StoreResult<Vec<Bytes>>> + Send;

    /// Up to about `max` whole jobs, from `from` on (the default cursor: the
    /// beginning). Every job that exists for the whole of an export is in
    /// exactly one page, or (a shared engine, whose scan may repeat itself)
    /// in at least one: a reader drops repeated ids. A job put or moved
    /// during the export may be missed.
    fn export(
        &self,
        from: ExportCursor,
        max: usize,
    ) -> impl Future<Output = StoreResult<ExportPage>> + Send;

    /// Inserts a whole job as an export gave it. A client id that is taken
    /// answers `Exists`; a server id is kept if this store never handed it
    /// out, answers `Exists` if this store holds that very job (same tube,
    /// same put time to the millisecond: the same export imported again),
    /// and is replaced by a new server id otherwise.
    fn import(&self, job: WholeJob) -> impl Future<Output = StoreResult<PutOutcome>> + Send;

    /// Returns every job `conn` has reserved to ready (it disconnected).
    /// `held` lists the jobs the connection believes it holds: an engine that
    /// does not index jobs by holder returns those it still holds (the others
    /// timed out). `failed`: the worker let go of them unfinished (its
    /// connection closed), which counts as a try, as a TTR that runs out
    /// does: a job with `tries` or a backoff is buried once its tries are
    /// used up, else delayed by its backoff (a job without either is ready
    /// at once, as on beanstalkd). Not when the server is stopping.
    /// Returns the tubes that got jobs back ready.
    fn release_all(
        &self,
        conn: ConnId,
        held: &[JobId],
        failed: bool,
    ) -> impl Future<Output = StoreResult<Vec<Tube>>> + Send;

    /// Moves what has fallen due: delayed jobs to ready, reserved jobs past
    /// their TTR back (ready, delayed by their backoff, or buried if they
    /// used up their tries), paused tubes whose pause ran out.
    fn tick(&self) -> impl Future<Output = StoreResult<Tick>> + Send;

    /// Records that a connection uses or watches `tube`, creating it if
    /// needed. A failed one leaves no count: its command is answered as
    /// failed, and the connection goes on without the tube.
    fn attach(&self, tube: &Tube, how: TubeRef) -> impl Future<Output = StoreResult<()>> + Send;

    /// Records a new connection's use and watch of `default`: as
    /// [`Store::attach`], but a failed one is counted all the same (the
    /// connection has `default` whatever the engine answered, and its close
    /// will undo it), for the engine to put right once it can.
    fn attach_kept(
        &self,
        tube: &Tube,
        how: TubeRef,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        self.attach(tube, how)
    }

    /// Undoes one [`Store::attach`]; a tube with no jobs and no users goes away.
    fn detach(&self, tube: &Tube, how: TubeRef) -> impl Future<Output = StoreResult<()>> + Send;

    /// What the engine is and where it keeps the jobs, for the log.
    fn describe(&self) -> String;

    /// Events from other processes sharing the storage, if it is shared.
    /// Called once, when the server starts.
    fn events(&self) -> Option<tokio::sync::mpsc::Receiver<StoreEvent>> {
        None
    }

    /// Takes in what the other processes sharing the storage have announced
    /// up to now, so that a look after it sees what they made ready before
    /// it (`reserve-with-timeout 0`, which must not answer `TIMED_OUT` for a
    /// job another process has put). True if news may have come in; an
    /// engine whose looks do not depend on news: false.
    fn catch_up(&self) -> impl Future<Output = bool> + Send {
        std::future::ready(false)
    }

    /// How soon the timer must look at the store again to free the client
    /// ids of unique windows begun since this was last asked (a delete, a
    /// finish or an expiry began them; nothing else tells the timer), once
    /// they end. An engine that ticks by itself at least every
    /// [`Store::max_sleep`] needs no more.
    fn windows_begun(&self) -> Option<Duration> {
        None
    }

    /// How soon the timer must look at the store again, if a reserve that
    /// found nothing was held back by a rate limit: its waiting workers are
    /// served when the limit's second ends. (A timer that wakes once a
    /// second by itself, [`Store::max_sleep`], is not enough: it wakes
    /// anywhere in the second, not as it begins.)
    fn held_back(&self) -> Option<Duration> {
        None
    }

    /// The longest the timer may sleep even with nothing due. A shared engine
    /// sets this: its tick also tells the other processes this one is alive,
    /// and catches due times another process created and could not announce.
    fn max_sleep(&self) -> Option<Duration> {
        None
    }

    /// The longest a command may wait on this engine before it is answered
    /// `INTERNAL_ERROR` (beyond the wait a `reserve-with-timeout` asks for),
    /// however many calls it makes: an engine across the network sets it,
    /// so a server that stops answering (stopped, hung, cut off) costs each
    /// client one such wait, not one per call.
    fn call_limit(&self) -> Option<Duration> {
        None
    }

    /// Tells the other processes sharing the storage that this one is
    /// stopping, once it has finished with its connections, so that they
    /// take over its share of the work at once rather than once it is
    /// taken for dead.
    fn leave(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
}
