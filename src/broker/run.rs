//! The broker's background work: the timer, and the events of an engine
//! shared with other processes.

use std::collections::HashSet;
use std::time::Duration;

use tokio::sync::mpsc;
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
            let news = News::gather(first, &mut events);
            if let Some(after) = news.due {
                self.alarm.schedule(after);
            }
            if news.resync || news.schedules {
                self.reschedule.notify_one();
            }
            let mut ready = news.ready;
            if news.resync {
                ready.extend(self.waiters.tubes());
            }
            if !ready.is_empty() {
                let tubes: Vec<Tube> = ready.into_iter().collect();
                self.serve(&tubes, true).await;
            }
            if news.closed {
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

/// Everything other processes announced while the last hand-out pass ran,
/// to be served in one pass. One pass per announcement, in turn, fell
/// behind a busy tube's (on a cluster, 160 puts a second through another
/// process): a quiet tube's news waited behind them, and a reviewer saw its
/// job reach the worker blocked for it up to 11 s late.
#[derive(Debug, Default, PartialEq)]
struct News {
    /// Tubes whose waiting connections are to be served, each once.
    ready: HashSet<Tube>,
    /// The earliest due time announced, from now.
    due: Option<Duration>,
    /// Events may have been missed: serve every waiting connection.
    resync: bool,
    /// The schedules changed.
    schedules: bool,
    /// The engine's events ended.
    closed: bool,
}

impl News {
    /// `first`, and every event queued behind it, without waiting for more.
    fn gather(first: Option<StoreEvent>, events: &mut mpsc::Receiver<StoreEvent>) -> News {
        let mut news = News::default();
        let mut next = first;
        loop {
            match next {
                Some(StoreEvent::Ready(tube)) => {
                    news.ready.insert(tube);
                }
                Some(StoreEvent::Due(after)) => {
                    news.due = Some(news.due.map_or(after, |d| d.min(after)));
                }
                Some(StoreEvent::Resync) => news.resync = true,
                Some(StoreEvent::Schedules) => news.schedules = true,
                None => {
                    news.closed = true;
                    return news;
                }
            }
            next = match events.try_recv() {
                Ok(event) => Some(event),
                Err(TryRecvError::Empty) => return news,
                Err(TryRecvError::Disconnected) => None,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tube(name: &str) -> Tube {
        Tube::parse(name.as_bytes()).expect("a valid tube name")
    }

    /// A busy tube's announcements, queued ahead of a quiet tube's, are
    /// one pass's worth of news together with it, not a pass each.
    #[test]
    fn news_queued_behind_a_busy_tubes_is_served_in_the_same_pass() {
        let (tx, mut rx) = mpsc::channel(1_000);
        for _ in 0..500 {
            tx.try_send(StoreEvent::Ready(tube("busy"))).expect("room");
        }
        for event in [
            StoreEvent::Due(Duration::from_secs(7)),
            StoreEvent::Ready(tube("quiet")),
            StoreEvent::Due(Duration::from_secs(3)),
            StoreEvent::Schedules,
            StoreEvent::Ready(tube("busy")),
        ] {
            tx.try_send(event).expect("room");
        }
        let first = rx.try_recv().ok();
        let news = News::gather(first, &mut rx);
        assert_eq!(
            news,
            News {
                ready: [tube("busy"), tube("quiet")].into_iter().collect(),
                due: Some(Duration::from_secs(3)),
                schedules: true,
                ..News::default()
            }
        );
        // Nothing is left for a second pass, and the next news is its own.
        tx.try_send(StoreEvent::Resync).expect("room");
        drop(tx);
        let first = rx.try_recv().ok();
        let news = News::gather(first, &mut rx);
        assert_eq!(
            news,
            News {
                resync: true,
                closed: true,
                ..News::default()
            }
        );
    }
}
