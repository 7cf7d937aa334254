//! The broker's background work: the timer, and the events of an engine
//! shared with other processes.

use std::collections::HashSet;
use std::time::Duration;

use tokio::sync::mpsc::error::TryRecvError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Broker;
use super::timer::PreciseSleep;
use crate::names::Tube;
use crate::store::{Store, StoreEvent};

/// How long the timer waits before retrying a tick that failed.
const TICK_RETRY: Duration = Duration::from_secs(1);

impl<S: Store> Broker<S> {
    /// Serves the tubes other processes announce until shutdown (only for
    /// engines shared between processes).
    pub async fn run_events(&self, shutdown: CancellationToken) {
        let Some(mut events) = self.store.events() else {
            return;
        };
        loop {
            let first = tokio::select! {
                event = events.recv() => event,
                () = shutdown.cancelled() => return,
            };
            // Everything announced while the last pass ran is served in one
            // pass. One pass per announcement, in turn, fell behind a busy
            // tube's (on a cluster, 160 puts a second through another
            // process): a quiet tube's news waited behind them, and a reviewer
            // saw its job reach the worker blocked for it up to 11 s late.
            let mut ready: HashSet<Tube> = HashSet::new();
            let mut resync = false;
            let mut closed = false;
            let mut next = first;
            loop {
                match next {
                    Some(StoreEvent::Ready(tube)) => {
                        ready.insert(tube);
                    }
                    Some(StoreEvent::Due(after)) => self.alarm.schedule(after),
                    Some(StoreEvent::Resync) => {
                        self.reschedule.notify_one();
                        resync = true;
                    }
                    Some(StoreEvent::Schedules) => self.reschedule.notify_one(),
                    None => {
                        closed = true;
                        break;
                    }
                }
                next = match events.try_recv() {
                    Ok(event) => Some(event),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => None,
                };
            }
            if resync {
                ready.extend(self.waiters.tubes());
            }
            if !ready.is_empty() {
                let tubes: Vec<Tube> = ready.into_iter().collect();
                self.serve(&tubes, true).await;
            }
            if closed {
                return;
            }
        }
    }

    /// The timer: moves due jobs, hands them out, sleeps until the next due
    /// time or until woken by an earlier one. Returns on shutdown.
    ///
    /// Once measuring is on, each time it wakes for a due time it records
    /// how late delivery was (`delayq_due_lateness_seconds`): from that due
    /// time until the tick that moved what had fallen due, and the hand-out
    /// pass that gave it to the waiting workers, had both finished.
    pub async fn run_timer(&self, shutdown: CancellationToken) {
        let mut clock = PreciseSleep::new();
        // The due time the timer woke for, until what fell due by then has
        // all been moved and handed out.
        let mut late_since: Option<Instant> = None;
        loop {
            self.alarm.forget();
            let next = match self.tick().await {
                Ok(next) => {
                    // A tick that used up its budget (next due: now) left
                    // due work to the next one.
                    if next != Some(Duration::ZERO)
                        && let Some(due) = late_since.take()
                    {
                        self.instruments.late(due.elapsed());
                    }
                    next
                }
                Err(e) => {
                    warn!(error = %e, "timer tick failed; retrying");
                    Some(TICK_RETRY)
                }
            };
            // A shared engine's timer also wakes when nothing is due (a
            // heartbeat), which is no due time to be late for.
            let (next, beat) = match (next, self.store.max_sleep()) {
                (Some(due), Some(most)) if most < due => (Some(most), true),
                (Some(due), _) => (Some(due), false),
                (None, most) => (most, most.is_some()),
            };
            let expected = next.map(|after| self.alarm.expect(after));
            let heartbeat = expected.filter(|_| beat);
            let woke = tokio::select! {
                woke = self.alarm.sleep(&mut clock) => woke,
                () = shutdown.cancelled() => return,
            };
            if let Some(due) = woke.filter(|&due| Some(due) != heartbeat)
                && late_since.is_none()
                && self.instruments.is_on()
            {
                late_since = Some(due);
            }
        }
    }
}
