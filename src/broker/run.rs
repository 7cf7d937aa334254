//! The broker's background work: the timer, and the events of an engine
//! shared with other processes.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Broker;
use super::timer::PreciseSleep;
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
            let event = tokio::select! {
                event = events.recv() => event,
                () = shutdown.cancelled() => return,
            };
            match event {
                Some(StoreEvent::Ready(tube)) => self.serve(&[tube]).await,
                Some(StoreEvent::Due(after)) => self.alarm.schedule(after),
                Some(StoreEvent::Resync) => {
                    self.reschedule.notify_one();
                    self.serve(&self.waiters.tubes()).await;
                }
                Some(StoreEvent::Schedules) => self.reschedule.notify_one(),
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
