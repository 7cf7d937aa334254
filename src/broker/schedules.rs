//! Periodic jobs: registering schedules in the store, and firing them.
//!
//! Every process fires every schedule: a firing is a put whose client id is
//! the schedule's name and moment, so of several processes (or a process
//! and its restarted self) one inserts the job and the others are answered
//! `EXISTS`; the firing's unique window keeps the id taken after the job is
//! gone. Nothing is elected, so nothing is lost when a process dies.
//!
//! A moment is put [`LEAD`] ahead, as a job delayed until the moment: the
//! engine's timer makes it ready, as punctually as any delayed job, however
//! late this task wakes within the lead.
//!
//! The task sleeps until the next moment; a change of the schedules (here,
//! or announced by another process) wakes it to read them again.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::Broker;
use crate::error::StoreResult;
use crate::job::{Lifecycle, NewJob, PutOutcome};
use crate::metrics::StoreOp;
use crate::schedule::{Schedule, now_ms};
use crate::store::Store;

/// How long before its moment a firing is put.
pub const LEAD: Duration = Duration::from_secs(1);

/// How long the task waits after the store failed it.
const RETRY: Duration = Duration::from_secs(1);

/// The longest the task sleeps without looking at the wall clock again:
/// a sleep is measured on a monotonic clock, which a clock step or a
/// suspended machine leaves behind.
const MAX_NAP: Duration = Duration::from_secs(600);

/// A schedule and the next moment this process fires it for.
struct Planned {
    schedule: Schedule,
    moment: u64,
}

impl Planned {
    /// On (re)reading the schedules: the moment missed last, if the
    /// schedule is older (fired once for any number missed; if it did fire,
    /// the put changes nothing), else the next one.
    fn new(schedule: Schedule, now: u64) -> Option<Planned> {
        let moment = match schedule.missed(now) {
            Some(m) => m,
            None => schedule.when.next_after(now)?,
        };
        Some(Planned { schedule, moment })
    }

    /// After firing: the next moment, or if this process fell behind (it
    /// was stopped, or the store was away) the last one passed.
    fn advance(&mut self, now: u64) -> bool {
        let Some(next) = self.schedule.when.next_after(self.moment) else {
            return false;
        };
        self.moment = match self.schedule.when.latest_by(now) {
            Some(last) if next <= now => last.max(next),
            _ => next,
        };
        true
    }
}

/// The plan for `all` the schedules read at `now`: one this process
/// already planned, unchanged, keeps its next moment (so a change of
/// another schedule does not make every schedule put its last moment
/// again); a new or changed one starts as new.
fn replan(old: Vec<Planned>, all: Vec<Schedule>, now: u64) -> Vec<Planned> {
    let mut old: std::collections::HashMap<_, _> = old
        .into_iter()
        .map(|p| (p.schedule.name.clone(), p))
        .collect();
    all.into_iter()
        .filter_map(|s| match old.remove(&s.name) {
            Some(p) if p.schedule == s => Some(p),
            _ => Planned::new(s, now),
        })
        .collect()
}

impl<S: Store> Broker<S> {
    /// Registers or replaces a schedule; `false` if the store has too many.
    pub async fn set_schedule(&self, schedule: &Schedule) -> StoreResult<bool> {
        let encoded = schedule.encode().into();
        let set = self
            .call(
                StoreOp::SetSchedule,
                self.store.set_schedule(&schedule.name, encoded),
            )
            .await?;
        self.reschedule.notify_one();
        Ok(set)
    }

    /// Removes a schedule; returns whether there was one.
    pub async fn remove_schedule(&self, name: &str) -> StoreResult<bool> {
        let gone = self
            .call(StoreOp::RemoveSchedule, self.store.remove_schedule(name))
            .await?;
        self.reschedule.notify_one();
        Ok(gone)
    }

    /// Every schedule, by name.
    pub async fn schedules(&self) -> StoreResult<Vec<Schedule>> {
        let mut all: Vec<Schedule> = self
            .call(StoreOp::Schedules, self.store.schedules())
            .await?
            .iter()
            .filter_map(|raw| {
                let s = Schedule::decode(raw);
                if s.is_none() {
                    warn!("a stored schedule could not be read; skipped");
                }
                s
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// Fires the schedules until shutdown.
    pub async fn run_schedules(&self, shutdown: CancellationToken) {
        let mut plan: Vec<Planned> = Vec::new();
        let mut stale = true;
        loop {
            let mut nap = MAX_NAP;
            if stale {
                match self.schedules().await {
                    Ok(all) => {
                        plan = replan(std::mem::take(&mut plan), all, now_ms());
                        stale = false;
                    }
                    Err(e) => {
                        warn!(error = %e, "could not read the schedules; retrying");
                        nap = RETRY;
                    }
                }
            }
            if !stale {
                match self.fire_due(&mut plan).await {
                    Ok(next) => nap = nap.min(next),
                    Err(e) => {
                        // What was not fired is fired once the store is
                        // back: the schedules are read again, with what
                        // was missed meanwhile.
                        warn!(error = %e, "could not fire a schedule; retrying");
                        stale = true;
                        nap = RETRY;
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(nap) => {}
                () = self.reschedule.notified() => stale = true,
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Fires every moment within [`LEAD`] of now; returns how long until
    /// the next one is to be fired.
    async fn fire_due(&self, plan: &mut Vec<Planned>) -> StoreResult<Duration> {
        let lead = LEAD.as_millis() as u64;
        let mut i = 0;
        while i < plan.len() {
            let now = now_ms();
            if plan[i].moment > now + lead {
                i += 1;
                continue;
            }
            self.fire(&plan[i].schedule, plan[i].moment, now).await?;
            if plan[i].advance(now_ms()) {
                // It may be due again at once (an interval of a second).
                continue;
            }
            plan.swap_remove(i);
        }
        let now = now_ms() + lead;
        let soonest = plan.iter().map(|p| p.moment.saturating_sub(now)).min();
        Ok(soonest.map_or(MAX_NAP, Duration::from_millis))
    }

    async fn fire(&self, s: &Schedule, moment: u64, now: u64) -> StoreResult<()> {
        let job = NewJob {
            tube: s.tube.clone(),
            id: Some(s.job_id(moment)),
            pri: s.pri,
            delay: Duration::from_millis(moment.saturating_sub(now)),
            ttr: s.ttr,
            body: s.body.clone(),
            life: Lifecycle {
                unique: Some(s.fired_window(moment, now)),
                ..Lifecycle::default()
            },
        };
        let id = job.id.clone();
        match self.put(job).await? {
            PutOutcome::Inserted(_) => debug!(schedule = %s.name, id = ?id, "fired"),
            PutOutcome::Exists(_) => debug!(schedule = %s.name, id = ?id, "fired already"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::names::Tube;
    use crate::schedule::When;

    fn every(secs: u64, since: u64) -> Schedule {
        Schedule {
            name: Arc::from("beat"),
            when: When::every(Duration::from_secs(secs)).unwrap(),
            tube: Tube::default_tube(),
            pri: 0,
            ttr: Duration::from_secs(1),
            body: Bytes::new(),
            since,
        }
    }

    #[test]
    fn a_new_schedule_waits_for_its_first_moment() {
        let p = Planned::new(every(30, 7_000), 7_000).unwrap();
        assert_eq!(p.moment, 30_000);
    }

    #[test]
    fn reading_the_schedules_again_keeps_what_did_not_change() {
        let plan = vec![Planned::new(every(30, 7_000), 7_000).unwrap()];
        let mut changed = every(60, 7_000);
        changed.name = Arc::from("other");
        // At 95 s the kept one still waits for 30 s (not fired yet: the
        // store was away); the new one starts from its last moment.
        let plan = replan(plan, vec![every(30, 7_000), changed.clone()], 95_000);
        assert_eq!(
            plan.iter().map(|p| p.moment).collect::<Vec<_>>(),
            vec![30_000, 60_000]
        );
        let plan = replan(plan, vec![changed], 95_000);
        assert_eq!(plan.len(), 1);
    }

    #[test]
    fn an_outage_is_made_up_for_once() {
        // Registered at 7 s; back at 205 s: 30 s ... 180 s were missed.
        let mut p = Planned::new(every(30, 7_000), 205_000).unwrap();
        assert_eq!(p.moment, 180_000);
        assert!(p.advance(205_000));
        assert_eq!(p.moment, 210_000);
        // Fired 210 s but only got on at 275 s: 240 s and 270 s were
        // passed; 270 s is fired, once.
        assert!(p.advance(275_000));
        assert_eq!(p.moment, 270_000);
        assert!(p.advance(275_000));
        assert_eq!(p.moment, 300_000);
    }
}
