//! The embedded engine's readings: peeks and figures, none of which change
//! anything.

use std::time::Duration;

use super::state::{St, State, TubeState};
use crate::clock::Micros;
use crate::job::{Counts, JobBody, JobState, JobStats, StoreStats, TubeStats};
use crate::names::{JobId, Tube};

fn span(us: Micros) -> Duration {
    Duration::from_micros(us)
}

impl State {
    /// Any job, by id.
    pub fn peek(&self, id: &JobId) -> Option<JobBody> {
        self.slot_of(id).map(|slot| self.jobs[slot].body())
    }

    /// The body of the job `pick` chooses among `tube`'s.
    fn first_body(&self, tube: &Tube, pick: impl Fn(&TubeState) -> Option<u64>) -> Option<JobBody> {
        let key = pick(self.tubes.get(tube)?)?;
        Some(self.jobs[self.slot(key)?].body())
    }

    /// The job `reserve` would take next from `tube`, paused or not.
    pub fn peek_ready(&self, tube: &Tube) -> Option<JobBody> {
        self.first_body(tube, |ts| ts.ready.first().map(|&(_, k)| k))
    }

    /// The delayed job of `tube` that is due soonest.
    pub fn peek_delayed(&self, tube: &Tube) -> Option<JobBody> {
        self.first_body(tube, |ts| ts.delayed.first().map(|&(_, k)| k))
    }

    /// The buried job of `tube` that `kick` would take first.
    pub fn peek_buried(&self, tube: &Tube) -> Option<JobBody> {
        self.first_body(tube, |ts| ts.buried.first().map(|&(_, k)| k))
    }

    /// A job's figures at `now`.
    pub fn stats_job(&self, id: &JobId, now: Micros) -> Option<JobStats> {
        let job = &self.jobs[self.slot_of(id)?];
        let (state, left) = match job.state {
            St::Ready => (JobState::Ready, 0),
            St::Delayed { due } => (JobState::Delayed, due.saturating_sub(now)),
            St::Reserved { deadline } => (JobState::Reserved, deadline.saturating_sub(now)),
            St::Buried { .. } => (JobState::Buried, 0),
        };
        Some(JobStats {
            id: job.id(),
            tube: job.tube.clone(),
            state,
            pri: job.pri,
            age: span(now.saturating_sub(job.created)),
            delay: span(job.delay),
            ttr: span(job.ttr),
            time_left: span(left),
            counters: job.counters,
            life: job.life_stats(),
        })
    }

    /// A tube's figures at `now`, if it exists.
    pub fn stats_tube(&self, tube: &Tube, now: Micros) -> Option<TubeStats> {
        let ts = self.tubes.get(tube)?;
        let (pause, left) = match ts.pause {
            Some((len, until)) if until > now => (len, until - now),
            _ => (0, 0),
        };
        Some(TubeStats {
            name: tube.clone(),
            counts: ts.counts(),
            total_jobs: ts.total_jobs,
            expired: ts.expired,
            using: ts.using,
            watching: ts.watching,
            cmd_delete: ts.cmd_delete,
            cmd_pause_tube: ts.cmd_pause,
            pause: span(pause),
            pause_time_left: span(left),
        })
    }

    /// Server-wide job figures.
    pub fn stats(&self) -> StoreStats {
        let mut counts = Counts::default();
        for ts in self.tubes.values() {
            counts += ts.counts();
        }
        StoreStats {
            counts,
            job_timeouts: self.timeouts,
            expired: self.expired,
            total_jobs: self.total_jobs,
            tubes: self.tubes.len() as u64,
            log: None,
        }
    }

    /// Tubes that exist, oldest first.
    pub fn list_tubes(&self) -> Vec<Tube> {
        self.tubes.keys().cloned().collect()
    }
}
