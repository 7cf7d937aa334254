//! The broker: the store plus what makes it a queue server — handing ready
//! jobs to blocked connections and waking the timer.
//!
//! Every transition that can make a job ready (put, release, kick, the timer,
//! unpausing, a connection's reservations returned) is followed by
//! [`Broker::serve`] for the tubes it touched. Every transition that creates
//! a due time (a delay, a TTR, a pause) tells the timer, which sleeps until
//! the earliest one; nothing polls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

use crate::error::StoreResult;
use crate::names::{JobId, Tube};
use crate::store::{ConnId, NewJob, PutOutcome, Reserved, Store, StoreEvent};
use crate::waiters::{WaiterId, Waiters};

/// How long the timer waits before retrying a tick that failed.
const TICK_RETRY: Duration = Duration::from_secs(1);

/// The store, the waiting connections and the timer's alarm clock.
pub struct Broker<S> {
    /// The storage engine, for transitions that need no follow-up.
    pub store: S,
    /// Connections blocked in `reserve`.
    pub waiters: Waiters,
    /// Held while handing out jobs, so two hand-offs never race for one waiter.
    serving: tokio::sync::Mutex<()>,
    alarm: Alarm,
}

/// When the timer should next wake, shared by everyone who creates due times.
struct Alarm {
    epoch: Instant,
    /// Milliseconds since `epoch`; `u64::MAX` while unknown (mid-tick).
    next: AtomicU64,
    notify: Notify,
}

impl Alarm {
    fn at(&self, after: Duration) -> u64 {
        u64::try_from((Instant::now() + after - self.epoch).as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Something falls due `after` from now: wake the timer if that is earlier
    /// than what it sleeps towards.
    fn schedule(&self, after: Duration) {
        let at = self.at(after);
        if self.next.fetch_min(at, Ordering::AcqRel) > at {
            self.notify.notify_one();
        }
    }
}

impl<S: Store> Broker<S> {
    /// A broker over `store`.
    pub fn new(store: S) -> Broker<S> {
        Broker {
            store,
            waiters: Waiters::default(),
            serving: tokio::sync::Mutex::new(()),
            alarm: Alarm {
                epoch: Instant::now(),
                next: AtomicU64::new(u64::MAX),
                notify: Notify::new(),
            },
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
    pub async fn serve(&self, tubes: &[Tube]) {
        for tube in tubes {
            if !self.waiters.any(tube) {
                continue;
            }
            let _serving = self.serving.lock().await;
            while let Some(head) = self.waiters.head(tube) {
                let got = match self.store.reserve(head.conn, &head.tubes).await {
                    Ok(Some(got)) => got,
                    Ok(None) => break,
                    Err(e) => {
                        warn!(%tube, error = %e, "cannot hand out jobs");
                        break;
                    }
                };
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
            }
        }
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
        loop {
            // While the tick runs, any new due time must wake us again, since
            // the tick may not have seen it.
            self.alarm.next.store(u64::MAX, Ordering::Release);
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
                self.alarm
                    .next
                    .fetch_min(self.alarm.at(after), Ordering::AcqRel);
            }
            let at = self.alarm.next.load(Ordering::Acquire);
            let sleep = async {
                if at == u64::MAX {
                    std::future::pending::<()>().await;
                } else {
                    tokio::time::sleep_until(self.alarm.epoch + Duration::from_millis(at)).await;
                }
            };
            tokio::select! {
                () = sleep => {}
                () = self.alarm.notify.notified() => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}
