//! The broker: the store plus what makes it a queue server — handing ready
//! jobs to blocked connections and waking the timer.
//!
//! Every transition that can make a job ready (put, release, kick, the timer,
//! unpausing, a connection's reservations returned) is followed by
//! [`Broker::serve`] for the tubes it touched. Every transition that creates
//! a due time (a delay, a TTR, a pause) tells the timer, which sleeps until
//! the earliest one; nothing polls.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

use crate::error::StoreResult;
use crate::names::{JobId, Tube};
use crate::store::{ConnId, NewJob, PutOutcome, Reserved, Store, StoreEvent};
use crate::timer::{Alarm, PreciseSleep};
use crate::waiters::{Head, WaiterId, Waiters};

/// How long the timer waits before retrying a tick that failed.
const TICK_RETRY: Duration = Duration::from_secs(1);

/// Waiting connections the first round of a hand-out pass reserves for.
const FIRST_ROUND: usize = 8;
/// The most waiting connections one round reserves for.
const MAX_ROUND: usize = 1024;

/// Which tubes are due a hand-out pass, and which `serve` calls are done.
#[derive(Default)]
struct Passes {
    /// Tubes marked since the last pass began.
    marked: Vec<Tube>,
    /// `serve` calls so far: each takes the next number as its ticket.
    requested: u64,
    /// Every ticket up to this one was served by a pass that has finished.
    covered: u64,
}

/// The tubes of a pass that has not finished: marked again if it is dropped.
struct Unfinished<'a> {
    passes: &'a Mutex<Passes>,
    tubes: Vec<Tube>,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.tubes.is_empty() {
            return;
        }
        let mut passes = self.passes.lock().unwrap_or_else(PoisonError::into_inner);
        for tube in self.tubes.drain(..) {
            if !passes.marked.contains(&tube) {
                passes.marked.push(tube);
            }
        }
    }
}

/// The store, the waiting connections and the timer's alarm clock.
pub struct Broker<S> {
    /// The storage engine, for transitions that need no follow-up.
    pub store: S,
    /// Connections blocked in `reserve`.
    pub waiters: Waiters,
    /// Held while a hand-out pass runs, so two passes never race for one
    /// waiter.
    serving: tokio::sync::Mutex<()>,
    passes: Mutex<Passes>,
    alarm: Alarm,
}

impl<S: Store> Broker<S> {
    /// A broker over `store`.
    pub fn new(store: S) -> Broker<S> {
        Broker {
            store,
            waiters: Waiters::default(),
            serving: tokio::sync::Mutex::new(()),
            passes: Mutex::new(Passes::default()),
            alarm: Alarm::new(),
        }
    }

    /// Inserts a job and hands it out or schedules it.
    pub async fn put(&self, job: NewJob) -> StoreResult<PutOutcome> {
        let tube = job.tube.clone();
        let delay = job.delay;
        let outcome = self.store.put(job).await?;
        if matches!(outcome, PutOutcome::Inserted(_)) {
            self.ready_or_later(tube, delay).await;
        }
        Ok(outcome)
    }

    /// Reserves the best ready job of `tubes`, if any, without waiting.
    pub async fn reserve(&self, conn: ConnId, tubes: &[Tube]) -> StoreResult<Option<Reserved>> {
        let got = self.store.reserve(conn, tubes).await?;
        if let Some(r) = &got {
            self.alarm.schedule(r.ttr);
        }
        Ok(got)
    }

    /// Reserves one job by id.
    pub async fn reserve_job(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Reserved>> {
        let got = self.store.reserve_job(conn, id).await?;
        if let Some(r) = &got {
            self.alarm.schedule(r.ttr);
        }
        Ok(got)
    }

    /// Releases a reserved job; returns whether `conn` held it.
    pub async fn release(
        &self,
        conn: ConnId,
        id: &JobId,
        pri: u32,
        delay: Duration,
    ) -> StoreResult<bool> {
        let Some(tube) = self.store.release(conn, id, pri, delay).await? else {
            return Ok(false);
        };
        self.ready_or_later(tube, delay).await;
        Ok(true)
    }

    /// Restarts a reserved job's TTR; returns the TTR.
    pub async fn touch(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Duration>> {
        let ttr = self.store.touch(conn, id).await?;
        if let Some(ttr) = ttr {
            self.alarm.schedule(ttr);
        }
        Ok(ttr)
    }

    /// Kicks up to `bound` jobs of `tube`.
    pub async fn kick(&self, tube: &Tube, bound: u64) -> StoreResult<u64> {
        let n = self.store.kick(tube, bound).await?;
        if n > 0 {
            self.serve(std::slice::from_ref(tube)).await;
        }
        Ok(n)
    }

    /// Kicks one job; returns whether it was buried or delayed.
    pub async fn kick_job(&self, id: &JobId) -> StoreResult<bool> {
        let Some(tube) = self.store.kick_job(id).await? else {
            return Ok(false);
        };
        self.serve(&[tube]).await;
        Ok(true)
    }

    /// Pauses a tube; returns whether it exists.
    pub async fn pause_tube(&self, tube: &Tube, delay: Duration) -> StoreResult<bool> {
        if !self.store.pause_tube(tube, delay).await? {
            return Ok(false);
        }
        self.ready_or_later(tube.clone(), delay).await;
        Ok(true)
    }

    /// Returns a departed connection's reservations and hands them on.
    pub async fn release_all(&self, conn: ConnId, held: &[JobId]) -> StoreResult<()> {
        let tubes = self.store.release_all(conn, held).await?;
        self.serve(&tubes).await;
        Ok(())
    }

    /// Queues `conn` on `tubes`, then serves them, so that a job made ready
    /// between the caller's failed reserve and this registration is not missed.
    pub async fn wait(
        &self,
        conn: ConnId,
        tubes: Arc<[Tube]>,
    ) -> (WaiterId, oneshot::Receiver<Reserved>) {
        let registered = self.waiters.register(conn, tubes.clone());
        self.serve(&tubes).await;
        registered
    }

    async fn ready_or_later(&self, tube: Tube, after: Duration) {
        if after.is_zero() {
            self.serve(&[tube]).await;
        } else {
            self.alarm.schedule(after);
        }
    }

    /// Hands ready jobs of `tubes` to the connections waiting on them, longest
    /// waiting first. A job whose waiter has gone is given back, never lost.
    ///
    /// Returns once a hand-out pass that began after this call has finished,
    /// so the caller's jobs are handed out by then. Concurrent calls share
    /// passes: while one runs, the others mark their tubes and wait, and the
    /// next pass serves all they marked at once, so a burst of puts costs a
    /// few passes, not one each.
    pub async fn serve(&self, tubes: &[Tube]) {
        let ticket = {
            let mut passes = self.passes.lock().unwrap_or_else(PoisonError::into_inner);
            let mut wanted = false;
            for tube in tubes {
                if self.waiters.any(tube) {
                    wanted = true;
                    if !passes.marked.contains(tube) {
                        passes.marked.push(tube.clone());
                    }
                }
            }
            if !wanted {
                return;
            }
            passes.requested += 1;
            passes.requested
        };
        let _serving = self.serving.lock().await;
        let (tubes, upto) = {
            let mut passes = self.passes.lock().unwrap_or_else(PoisonError::into_inner);
            if passes.covered >= ticket {
                return;
            }
            (std::mem::take(&mut passes.marked), passes.requested)
        };
        // Were this pass dropped half way, its tubes are marked again for
        // the next.
        let mut unfinished = Unfinished {
            passes: &self.passes,
            tubes,
        };
        self.pass(&unfinished.tubes).await;
        unfinished.tubes.clear();
        self.passes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .covered = upto;
    }

    /// One hand-out pass over `tubes`. Each round reserves for several
    /// waiting connections at once (on Redis, one call), twice as many as
    /// the round before while every one of them got a job.
    async fn pass(&self, tubes: &[Tube]) {
        for tube in tubes {
            let mut round = FIRST_ROUND;
            loop {
                let heads = self.waiters.heads(tube, round);
                if heads.is_empty() {
                    break;
                }
                let full = heads.len() == round;
                let got =
                    join_all(heads.iter().map(|h| self.store.reserve(h.conn, &h.tubes))).await;
                let (mut all, mut gave_back) = (full, false);
                for (head, got) in heads.into_iter().zip(got) {
                    match got {
                        Ok(Some(got)) => gave_back |= !self.hand(head, got).await,
                        Ok(None) => all = false,
                        Err(e) => {
                            warn!(%tube, error = %e, "cannot hand out jobs");
                            all = false;
                        }
                    }
                }
                // A job given back is ready again for the others waiting.
                if !all && !gave_back {
                    break;
                }
                if all {
                    round = (round * 2).min(MAX_ROUND);
                }
            }
        }
    }

    /// Hands `got` to the waiter `head`; if it has gone, gives the job back.
    /// Returns whether the waiter got it.
    async fn hand(&self, head: Head, got: Reserved) -> bool {
        self.alarm.schedule(got.ttr);
        let id = got.job.id.clone();
        let handed = match self.waiters.take(head.id) {
            Some(tx) => tx.send(got).is_ok(),
            None => false,
        };
        if !handed && let Err(e) = self.store.give_back(head.conn, &id).await {
            // The job stays reserved by a closed connection; its TTR
            // brings it back.
            error!(job = %id, error = %e, "cannot give back a job");
        }
        handed
    }

    /// Moves what has fallen due and hands it out. Returns the time until
    /// the next due time, if anything is pending.
    pub async fn tick(&self) -> StoreResult<Option<Duration>> {
        let tick = self.store.tick().await?;
        self.serve(&tick.ready).await;
        Ok(tick.next)
    }

    /// Serves the tubes other processes announce until shutdown (only for
    /// engines shared between processes).
    pub async fn run_events(&self, shutdown: CancellationToken) {
        let Some(mut events) = self.store.events() else {
            return;
        };
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                () = shutdown.cancelled() => return,
            };
            match event {
                Some(StoreEvent::Ready(tube)) => self.serve(&[tube]).await,
                Some(StoreEvent::Due(after)) => self.alarm.schedule(after),
                Some(StoreEvent::Resync) => self.serve(&self.waiters.tubes()).await,
                None => return,
            }
        }
    }

    /// The timer: moves due jobs, hands them out, sleeps until the next due
    /// time or until woken by an earlier one. Returns on shutdown.
    pub async fn run_timer(&self, shutdown: CancellationToken) {
        let mut clock = PreciseSleep::new();
        loop {
            self.alarm.forget();
            let next = match self.tick().await {
                Ok(next) => next,
                Err(e) => {
                    warn!(error = %e, "timer tick failed; retrying");
                    Some(TICK_RETRY)
                }
            };
            let next = match (next, self.store.max_sleep()) {
                (Some(due), Some(most)) => Some(due.min(most)),
                (due, most) => due.or(most),
            };
            if let Some(after) = next {
                self.alarm.expect(after);
            }
            tokio::select! {
                () = self.alarm.sleep(&mut clock) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}
