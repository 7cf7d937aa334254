//! The broker: the one door into the store, and what makes the store a queue
//! server.
//!
//! Every front end reaches the store through a [`Broker`] method, never
//! directly, so whatever must follow a transition happens in one place:
//!
//! * every transition that can make a job ready (put, release, kick, the
//!   timer, unpausing, a connection's reservations returned) is followed by a
//!   hand-out pass for the tubes it touched (`handout.rs`), which gives ready
//!   jobs to the connections blocked in `reserve` (`waiters.rs`);
//! * every transition that creates a due time (a delay, a TTR, a pause) tells
//!   the timer (`timer.rs`), which sleeps until the earliest one; nothing
//!   polls (`run.rs` runs the timer and the events of a shared engine);
//! * the schedules are fired by a task of their own (`schedules.rs`), which
//!   puts each moment's job through the same door.
//!
//! The rules every engine follows alike (the TTR floor) are applied here too.

use std::future::Future;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

mod handout;
mod run;
pub mod schedules;
pub mod timer;
mod waiters;

pub use waiters::{Handout, Look, WaiterId};

use crate::error::StoreResult;
use crate::job::{
    ExportCursor, ExportPage, JobBody, JobState, JobStats, Lifecycle, NewJob, PutOutcome, Released,
    Reserved, StoreStats, TubeStats, WholeJob,
};
use crate::metrics::{Instruments, StoreOp};
use crate::names::{JobId, Tube};
use crate::rules;
use crate::store::{ConnId, Store, TubeList, TubeRef, TubeSettings};
use handout::Passes;
use timer::Alarm;
use waiters::Waiters;

/// The store, the waiting connections and the timer's alarm clock.
pub struct Broker<S> {
    store: S,
    waiters: Waiters,
    /// Held while a hand-out pass runs, so two passes never race for one
    /// waiter.
    serving: tokio::sync::Mutex<()>,
    passes: std::sync::Mutex<Passes>,
    alarm: Alarm,
    /// Wakes the schedules' task to read them again: they changed.
    reschedule: tokio::sync::Notify,
    /// Store call times and the timer's lateness, for `/metrics`.
    instruments: Instruments,
    /// Tubes whose hand-out failed (the store was away): the timer serves
    /// them again shortly (see `handout::PASS_RETRY`).
    retry: std::sync::Mutex<Vec<Tube>>,
}

impl<S: Store> Broker<S> {
    /// A broker over `store`.
    pub fn new(store: S) -> Broker<S> {
        Broker {
            store,
            waiters: Waiters::default(),
            serving: tokio::sync::Mutex::new(()),
            passes: std::sync::Mutex::new(Passes::default()),
            alarm: Alarm::new(),
            reschedule: tokio::sync::Notify::new(),
            instruments: Instruments::default(),
            retry: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// What this broker measures, for `/metrics`.
    pub fn instruments(&self) -> &Instruments {
        &self.instruments
    }

    /// Awaits one store call, timed as `op` once measuring is on: every
    /// call to the store goes through here.
    async fn call<T>(&self, op: StoreOp, call: impl Future<Output = T>) -> T {
        let started = self.instruments.start();
        let out = call.await;
        if let Some(started) = started {
            self.instruments.store_call(op, started);
        }
        if let Some(after) = self.store.windows_begun() {
            self.alarm.schedule(after);
        }
        out
    }

    /// Inserts a job and hands it out or schedules it.
    pub async fn put(&self, mut job: NewJob) -> StoreResult<PutOutcome> {
        job.ttr = rules::ttr(job.ttr);
        let tube = job.tube.clone();
        let (delay, ttl) = (job.delay, job.life.ttl);
        let put = self.call(StoreOp::Put, self.store.put(job)).await?;
        if matches!(put.outcome, PutOutcome::Inserted(_)) {
            if let Some(expires) = put.expires.or(ttl) {
                self.alarm.schedule(expires);
            }
            self.ready_or_later(tube, delay).await;
        }
        Ok(put.outcome)
    }

    /// Every tube that has settings, with them.
    pub async fn all_tube_settings(&self) -> StoreResult<TubeSettings> {
        self.call(StoreOp::AllTubeSettings, self.store.all_tube_settings())
            .await
    }

    /// A page of whole jobs (see [`Store::export`]).
    pub async fn export(&self, from: ExportCursor, max: usize) -> StoreResult<ExportPage> {
        self.call(StoreOp::Export, self.store.export(from, max))
            .await
    }

    /// Inserts a whole job from an export (see [`Store::import`]); a ready
    /// one goes to a waiting worker, a delayed one wakes the timer when due.
    pub async fn import(&self, mut job: WholeJob) -> StoreResult<PutOutcome> {
        job.ttr = rules::ttr(job.ttr);
        let tube = job.tube.clone();
        let (state, left) = (job.state, job.time_left);
        let expires = job.options.ttl.map(|ttl| ttl.saturating_sub(job.age));
        let done = self.call(StoreOp::Import, self.store.import(job)).await?;
        if matches!(done, PutOutcome::Inserted(_)) {
            if let Some(expires) = expires {
                self.alarm.schedule(expires);
            }
            match state {
                JobState::Buried => {}
                JobState::Delayed => self.ready_or_later(tube, left).await,
                JobState::Ready | JobState::Reserved => {
                    self.ready_or_later(tube, Duration::ZERO).await
                }
            }
        }
        Ok(done)
    }

    /// Reserves the best ready job of `tubes`, if any, without waiting.
    pub async fn reserve(&self, conn: ConnId, tubes: &[Tube]) -> StoreResult<Option<Reserved>> {
        let got = self
            .call(StoreOp::Reserve, self.store.reserve(conn, tubes))
            .await?;
        match &got {
            Some(r) => self.alarm.schedule(r.ttr),
            None => self.wake_if_held_back(),
        }
        Ok(got)
    }

    /// After a reserve that took less than it asked for: if a rate limit
    /// held it back, the timer serves the waiting workers when it ends.
    pub(super) fn wake_if_held_back(&self) {
        if let Some(after) = self.store.held_back() {
            self.alarm.schedule(after);
        }
    }

    /// Reserves up to `max` ready jobs of `tubes` at once, without waiting.
    pub async fn reserve_batch(
        &self,
        conn: ConnId,
        tubes: &[Tube],
        max: usize,
    ) -> StoreResult<Vec<Reserved>> {
        let got = self
            .call(
                StoreOp::ReserveBatch,
                self.store.reserve_batch(conn, tubes, max),
            )
            .await?;
        if let Some(ttr) = got.iter().map(|r| r.ttr).min() {
            self.alarm.schedule(ttr);
        }
        if got.len() < max {
            self.wake_if_held_back();
        }
        Ok(got)
    }

    /// Deletes (or with `finish`, finishes) each of `ids`; how many went.
    pub async fn remove_batch(
        &self,
        conn: ConnId,
        ids: &[JobId],
        finish: bool,
    ) -> StoreResult<u64> {
        self.call(
            StoreOp::RemoveBatch,
            self.store.remove_batch(conn, ids, finish),
        )
        .await
    }

    /// Reserves one job by id.
    pub async fn reserve_job(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Reserved>> {
        let got = self
            .call(StoreOp::ReserveJob, self.store.reserve_job(conn, id))
            .await?;
        if let Some(r) = &got {
            self.alarm.schedule(r.ttr);
        }
        Ok(got)
    }

    /// Deletes a job that is not reserved, or is reserved by `conn`;
    /// returns whether it existed.
    pub async fn delete(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        self.call(StoreOp::Delete, self.store.delete(conn, id))
            .await
    }

    /// Deletes a job only if `conn` has it reserved.
    pub async fn finish(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        self.call(StoreOp::Finish, self.store.finish(conn, id))
            .await
    }

    /// Releases a reserved job; says where it went, if `conn` held it.
    pub async fn release(
        &self,
        conn: ConnId,
        id: &JobId,
        pri: u32,
        delay: Duration,
    ) -> StoreResult<Option<Released>> {
        let released = self
            .call(StoreOp::Release, self.store.release(conn, id, pri, delay))
            .await?;
        if let Some(r) = released.as_ref().filter(|r| !r.buried) {
            self.ready_or_later(r.tube.clone(), r.delay).await;
        }
        Ok(released)
    }

    /// Sets a tube's settings as a whole.
    pub async fn set_tube(&self, tube: &Tube, options: Lifecycle) -> StoreResult<()> {
        self.call(StoreOp::SetTube, self.store.set_tube(tube, options))
            .await
    }

    /// A tube's settings.
    pub async fn tube_settings(&self, tube: &Tube) -> StoreResult<Lifecycle> {
        self.call(StoreOp::TubeSettings, self.store.tube_settings(tube))
            .await
    }

    /// Buries a job reserved by `conn`; returns whether it held it.
    pub async fn bury(&self, conn: ConnId, id: &JobId, pri: u32) -> StoreResult<bool> {
        self.call(StoreOp::Bury, self.store.bury(conn, id, pri))
            .await
    }

    /// Restarts a reserved job's TTR; returns the TTR.
    pub async fn touch(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Duration>> {
        let ttr = self
            .call(StoreOp::Touch, self.store.touch(conn, id))
            .await?;
        if let Some(ttr) = ttr {
            self.alarm.schedule(ttr);
        }
        Ok(ttr)
    }

    /// Kicks up to `bound` jobs of `tube`.
    pub async fn kick(&self, tube: &Tube, bound: u64) -> StoreResult<u64> {
        let n = self
            .call(StoreOp::Kick, self.store.kick(tube, bound))
            .await?;
        if n > 0 {
            self.serve(std::slice::from_ref(tube), true).await;
        }
        Ok(n)
    }

    /// Kicks one job; returns whether it was buried or delayed.
    pub async fn kick_job(&self, id: &JobId) -> StoreResult<bool> {
        let Some(tube) = self.call(StoreOp::KickJob, self.store.kick_job(id)).await? else {
            return Ok(false);
        };
        self.serve(&[tube], true).await;
        Ok(true)
    }

    /// Pauses a tube; returns whether it exists.
    pub async fn pause_tube(&self, tube: &Tube, delay: Duration) -> StoreResult<bool> {
        if !self
            .call(StoreOp::PauseTube, self.store.pause_tube(tube, delay))
            .await?
        {
            return Ok(false);
        }
        self.ready_or_later(tube.clone(), delay).await;
        Ok(true)
    }

    /// Returns a departed connection's reservations and hands them on;
    /// `failed`: its worker left them unfinished (see
    /// [`Store::release_all`]).
    pub async fn release_all(&self, conn: ConnId, held: &[JobId], failed: bool) -> StoreResult<()> {
        let tubes = self
            .call(
                StoreOp::ReleaseAll,
                self.store.release_all(conn, held, failed),
            )
            .await?;
        self.serve(&tubes, true).await;
        if failed && !held.is_empty() {
            // Some may have been delayed by their backoff: the timer learns
            // when they are due at its next tick, which comes now (not at
            // every close: on Redis a tick is a call).
            self.alarm.schedule(Duration::ZERO);
        }
        Ok(())
    }

    /// Counts a connection's use or watch of `tube`, creating it if needed.
    pub async fn attach(&self, tube: &Tube, how: TubeRef) -> StoreResult<()> {
        self.call(StoreOp::Attach, self.store.attach(tube, how))
            .await
    }

    /// Counts a new connection's use or watch of `default`, kept even if
    /// the store fails (see [`Store::attach_kept`]).
    pub async fn attach_kept(&self, tube: &Tube, how: TubeRef) -> StoreResult<()> {
        self.call(StoreOp::Attach, self.store.attach_kept(tube, how))
            .await
    }

    /// Undoes one [`Broker::attach`].
    pub async fn detach(&self, tube: &Tube, how: TubeRef) -> StoreResult<()> {
        self.call(StoreOp::Detach, self.store.detach(tube, how))
            .await
    }

    /// Any job, by id.
    pub async fn peek(&self, id: &JobId) -> StoreResult<Option<JobBody>> {
        self.call(StoreOp::Peek, self.store.peek(id)).await
    }

    /// The job `reserve` would take next from `tube`.
    pub async fn peek_ready(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        self.call(StoreOp::PeekReady, self.store.peek_ready(tube))
            .await
    }

    /// The delayed job of `tube` due soonest.
    pub async fn peek_delayed(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        self.call(StoreOp::PeekDelayed, self.store.peek_delayed(tube))
            .await
    }

    /// The buried job of `tube` that `kick` would take first.
    pub async fn peek_buried(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        self.call(StoreOp::PeekBuried, self.store.peek_buried(tube))
            .await
    }

    /// A job's figures.
    pub async fn stats_job(&self, id: &JobId) -> StoreResult<Option<JobStats>> {
        self.call(StoreOp::StatsJob, self.store.stats_job(id)).await
    }

    /// A tube's figures, and how many of this process's connections wait on
    /// it.
    pub async fn stats_tube(&self, tube: &Tube) -> StoreResult<Option<(TubeStats, u64)>> {
        // Read before the store is asked, as the connection counts are: a
        // connection that left had stopped waiting and given its jobs back
        // before it stopped counting, so whatever is seen gone here is seen
        // gone in the store's figures too, however long they take.
        let waiting = self.waiters.waiting_on(tube);
        Ok(self
            .call(StoreOp::StatsTube, self.store.stats_tube(tube))
            .await?
            .map(|s| (s, waiting)))
    }

    /// Server-wide job figures, and how many of this process's connections
    /// wait in `reserve`.
    pub async fn stats(&self) -> StoreResult<(StoreStats, u64)> {
        // Read before the store is asked (see `stats_tube`).
        let waiting = self.waiters.total();
        Ok((
            self.call(StoreOp::Stats, self.store.stats()).await?,
            waiting,
        ))
    }

    /// Tubes that exist, oldest first.
    pub async fn list_tubes(&self) -> StoreResult<TubeList> {
        self.call(StoreOp::ListTubes, self.store.list_tubes()).await
    }

    /// Before a reserve looks at the store for a job of `tubes`: when the
    /// look begins, for [`Broker::register`], and whether it can be spared
    /// because every one of them is known to have nothing to reserve (a
    /// look found nothing, and nothing was made ready since: whatever is,
    /// is handed out to the waiting connections after).
    pub fn look(&self, tubes: &[Tube]) -> (Look, bool) {
        self.waiters.look(tubes)
    }

    /// Queues `conn` on `tubes`, after a reserve's look begun at `looked`
    /// found nothing in them. Also returns whether the caller must then
    /// serve them ([`Broker::serve_waiting`]): unless nothing was made ready
    /// since the look began, a job may have been, and found nobody waiting.
    pub fn register(
        &self,
        conn: ConnId,
        tubes: Arc<[Tube]>,
        looked: Option<Look>,
    ) -> (WaiterId, oneshot::Receiver<Handout>, bool) {
        self.waiters.register(conn, tubes, looked)
    }

    /// Queues `conn` on `tubes`, then serves them if needed:
    /// [`Broker::register`] and [`Broker::serve_waiting`] in one.
    pub async fn wait(
        &self,
        conn: ConnId,
        tubes: Arc<[Tube]>,
        looked: Option<Look>,
    ) -> (WaiterId, oneshot::Receiver<Handout>) {
        let (waiter, rx, serve) = self.register(conn, tubes.clone(), looked);
        if serve {
            self.serve(&tubes, false).await;
        }
        (waiter, rx)
    }

    /// Hands the ready jobs of `tubes` to their waiting connections: the
    /// check after [`Broker::register`] asked for it, which does not by
    /// itself mean anything was made ready.
    pub async fn serve_waiting(&self, tubes: &[Tube]) {
        self.serve(tubes, false).await;
    }

    /// Waits for a hand-out pass under way to finish: a job it reserved
    /// for a connection that stopped waiting meanwhile is ready again after.
    pub async fn settle(&self) {
        drop(self.serving.lock().await);
    }

    /// Tells the processes sharing the storage that this one is stopping
    /// (see [`Store::leave`]).
    pub async fn leave(&self) {
        self.store.leave().await;
    }

    /// How long a command may wait on the store (see [`Store::call_limit`]).
    pub fn call_limit(&self) -> Option<Duration> {
        self.store.call_limit()
    }

    /// Stops waiting; returns `false` if the waiter was already served (a
    /// job is on its way to it).
    pub fn stop_waiting(&self, waiter: WaiterId) -> bool {
        self.waiters.take(waiter).is_some()
    }

    /// Takes in what other processes sharing the store have announced up
    /// to now (see [`Store::catch_up`]); true if a look may now find more.
    pub async fn catch_up(&self) -> bool {
        self.store.catch_up().await
    }

    /// Whether something has fallen due that the timer has not moved yet.
    pub fn timer_behind(&self) -> bool {
        self.alarm.overdue()
    }

    /// Moves what has fallen due and hands it out. Returns the time until
    /// the next due time, if anything is pending.
    pub async fn tick(&self) -> StoreResult<Option<Duration>> {
        let (mut tubes, next) = match self.call(StoreOp::Tick, self.store.tick()).await {
            Ok(tick) => (tick.ready, Ok(tick.next)),
            Err(e) => (Vec::new(), Err(e)),
        };
        // The hand-outs that failed are tried anew, whether or not the tick
        // went through: on a cluster a tick touches every shard this process
        // ticks, and fails while any of their primaries is away, when the
        // waiting workers' jobs may be on others.
        let retry = std::mem::take(&mut *self.retry.lock().unwrap_or_else(PoisonError::into_inner));
        for tube in retry {
            if !tubes.contains(&tube) {
                tubes.push(tube);
            }
        }
        self.serve(&tubes, true).await;
        next
    }

    async fn ready_or_later(&self, tube: Tube, after: Duration) {
        if after.is_zero() {
            self.serve(&[tube], true).await;
        } else {
            self.alarm.schedule(after);
        }
    }
}
